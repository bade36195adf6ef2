"""The recipe study: its file, the runner (continues an interrupted study without rerunning finished runs) and the
report (P(A_i > A_j), crossover compute, fixed-A comparison) on run directories with known curves."""

from __future__ import annotations

import json
import pathlib
import zlib

import numpy as np
import pytest

from scalerl_jax.scaling import study
from scalerl_jax.scaling.curves import SigmoidParams
from scalerl_jax.scaling.fit import fit_fixed_a
from scalerl_jax.scaling.points import CurvePoints
from scalerl_jax.scaling.synthetic import synthetic_run, write_run_dir
from tests.pipeline_helpers import TINY, read_consumed

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _write_study(tmp_path, recipes: dict, *, steps: int, seeds=(0,), overrides=(), name="s") -> pathlib.Path:
  path = tmp_path / f"{name}.yaml"
  path.write_text(json.dumps({  # JSON is YAML
      "name": name, "dir": str(tmp_path / name), "base": str(ROOT / "configs" / "cpu_default.yaml"),
      "seeds": list(seeds), "steps": steps, "overrides": list(overrides), "recipes": recipes,
      "fit": {"x": "accelerator_hours", "fit_upto": 1.0}}))
  return path


def test_the_shipped_study_file_loads_with_every_ablation():
  spec = study.load_study(ROOT / "configs" / "studies" / "loo_cpu.yaml")
  runs = spec.plan()
  assert len(runs) == len(spec.recipes) * len(spec.seeds) and len(spec.seeds) >= 2
  assert spec.recipes["scalerl"] == ()
  assert "loss.name=dapo" in spec.recipes["loo_dapo"]
  assert "rollout.interruption.enabled=false" in spec.recipes["loo_lp"]  # nested keys flattened
  assert "loss.length_penalty=true" in spec.recipes["loo_lp"]
  assert not any(o.startswith(("base=", "run_dir=")) for r in spec.recipes.values() for o in r)
  from scalerl_jax.config import load_config

  for run in runs[::2]:  # every recipe's overrides make a valid run config
    load_config(spec.base, list(run.overrides))


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.pop("steps"), "`steps` is missing"),
    (lambda d: d.update(colour="red"), "unknown key(s) colour"),
    (lambda d: d.update(seeds=[]), "`seeds` must be a non-empty list"),
    (lambda d: d["recipes"].update(bad={"ablation": "nope.yaml"}), "nope.yaml: cannot read the ablation"),
    (lambda d: d["recipes"].update(bad={"overrides": ["lr"]}), "recipes.bad.overrides must be key=value"),
    (lambda d: d.update(fit={"fit_uptoo": 0.5}), "unknown `fit` key(s) fit_uptoo"),
])
def test_a_bad_study_file_names_its_key(tmp_path, edit, needle):
  path = _write_study(tmp_path, {"a": {}}, steps=3)
  raw = json.loads(path.read_text())
  edit(raw)
  path.write_text(json.dumps(raw))
  with pytest.raises(study.StudyError) as info:
    study.load_study(path)
  assert needle in str(info.value) and str(path) in str(info.value)


def test_an_interrupted_study_continues_without_rerunning_finished_runs(tmp_path, monkeypatch):
  from launch.study import run_study

  monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the runs' reward function lives in tests/
  common = [*TINY, "pipeline.eval_every=1", "reward.fn=tests.pipeline_helpers.reward_digit_one"]
  broken = _write_study(tmp_path, {"a": {}, "b": {"overrides": ["optimizer.lr=-1"]}}, steps=2, overrides=common)
  spec = study.load_study(broken)
  env_ok = pathlib.Path(spec.dir / "a" / "seed0" / "metrics.jsonl")
  with pytest.raises(Exception) as info:  # recipe b fails: the study stops there, saying which run
    run_study(spec, progress=False)
  assert "run b/seed0 failed" in str(info.value) and "optimizer.lr" in str(info.value)
  assert study.run_finished(spec.plan()[0], 2) and env_ok.is_file()
  before = env_ok.stat().st_mtime_ns

  fixed = study.load_study(_write_study(tmp_path, {"a": {}, "b": {"overrides": ["optimizer.lr=1e-2"]}}, steps=2,
                                        overrides=common))
  records = run_study(fixed, progress=False)
  assert [r["status"] for r in records] == ["skipped (finished)", "new"]
  assert env_ok.stat().st_mtime_ns == before  # recipe a was not run again
  assert all(study.run_finished(r, 2) for r in fixed.plan())


def _recipe_dirs(root: pathlib.Path, name: str, params: SigmoidParams, seeds=(0, 1), c_max=300.0):
  """Synthetic run directories (noise seeded by the recipe's name and the seed: the same data in every run)."""
  for s in seeds:
    pts = synthetic_run(params, c_max, n_evals=12, n_prompts=200, samples_per_prompt=8,
                        seed=10 * s + zlib.crc32(name.encode()) % 7)
    write_run_dir(pts, root / name / f"seed{s}", steps_per_eval=10)


@pytest.fixture(scope="module")
def study_report(tmp_path_factory):
  """Four recipes with known curves: `high` (A 0.85), `low` (A 0.55, faster: it leads early, so the two cross),
  `twin` (the curve of `high`, other noise), `split` (seed 0 on the curve of `high`, seed 1 on that of `low`)."""
  tmp = tmp_path_factory.mktemp("study")
  _recipe_dirs(tmp / "s", "high", SigmoidParams(A=0.85, B=1.2, C_mid=30.0, R0=0.2))
  _recipe_dirs(tmp / "s", "low", SigmoidParams(A=0.55, B=3.0, C_mid=4.0, R0=0.2))
  _recipe_dirs(tmp / "s", "twin", SigmoidParams(A=0.85, B=1.2, C_mid=30.0, R0=0.2), seeds=(2, 3))
  _recipe_dirs(tmp / "s", "split", SigmoidParams(A=0.85, B=1.2, C_mid=30.0, R0=0.2), seeds=(0,))
  _recipe_dirs(tmp / "s", "split", SigmoidParams(A=0.55, B=3.0, C_mid=4.0, R0=0.2), seeds=(1,))
  path = _write_study(tmp, {"high": {}, "low": {}, "twin": {}, "split": {}}, steps=120, seeds=(0, 1))
  spec = study.load_study(path)
  for s_old, s_new in ((2, 0), (3, 1)):  # twin's runs were written as seeds 2, 3: move them to 0, 1
    (tmp / "s" / "twin" / f"seed{s_old}").rename(tmp / "s" / "twin" / f"seed{s_new}")
  return spec, study.report(spec, num_warmup=300, num_samples=600)


def test_the_report_tells_which_ceiling_is_higher_and_when_curves_cross(study_report):
  spec, out = study_report
  rows = {r["recipe"]: r for r in out["recipes"]}
  assert rows["high"]["A"]["median"] == pytest.approx(0.85, abs=0.04)  # (a 90 % interval misses 1 time in 10)
  assert rows["low"]["A"]["median"] == pytest.approx(0.55, abs=0.02)
  assert rows["low"]["A"]["hi"] < rows["high"]["A"]["lo"]
  pairs = {tuple(p["recipes"]): p for p in out["pairs"]}
  assert pairs[("high", "low")]["p_A1_greater"] > 0.99
  assert 0.1 < pairs[("high", "twin")]["p_A1_greater"] < 0.9  # the same curve: not resolved
  x = pairs[("high", "low")]["crossover"]
  truth = _crossing(SigmoidParams(A=0.85, B=1.2, C_mid=30.0, R0=0.2), SigmoidParams(A=0.55, B=3.0, C_mid=4.0, R0=0.2),
                    x["range"][0])
  assert x["p_cross_in_range"] > 0.9 and x["lo"] < truth < x["hi"]
  assert out["fixed_a"]["B"]["low"] != out["fixed_a"]["B"]["high"]
  md = (spec.dir / "study_report.md").read_text()
  assert "| high vs low | 1.00 | yes |" in md and "| high vs twin |" in md
  assert (spec.dir / "study_curves.png").stat().st_size > 10_000 and (spec.dir / "study_fixed_a.png").is_file()


def test_a_recipe_whose_seeds_disagree_is_not_given_one_ceiling(study_report):
  """The per-seed check: fitted alone, a seed of `split` has an interval on A that excludes the recipe's shared A,
  so the report refuses that recipe's ceiling; the seeds of `high` agree with one A, and its ceiling stands."""
  _, out = study_report
  rows = {r["recipe"]: r for r in out["recipes"]}
  alone = rows["split"]["seeds_alone"]
  assert alone["split/seed1"]["A"]["hi"] < 0.6 < 0.8 < alone["split/seed0"]["A"]["lo"]
  assert not rows["split"]["ceiling_identified"]
  assert rows["split"]["ceiling_why_not"].startswith("one A does not describe every seed")
  assert all(v["agrees"] for v in rows["high"]["seeds_alone"].values()) and rows["high"]["ceiling_identified"]


def test_a_pair_is_resolved_only_when_its_ceilings_are_identified_or_apart():
  """A ceiling that is not identified is a lower bound at best: it can be shown above an identified ceiling whose
  interval lies below its own, never below another, whatever P(A_1 > A_2) says."""
  rows = [{"recipe": r, "ceiling_identified": ok, "A": {"lo": lo, "hi": hi}}
          for r, ok, lo, hi in (("a", True, 0.8, 0.9), ("b", False, 0.85, 1.0), ("c", False, 0.5, 0.6),
                                ("d", True, 0.6, 0.7))]
  assert study.resolved({"recipes": ["a", "d"], "p_A1_greater": 0.99}, rows) == "yes"
  assert study.resolved({"recipes": ["a", "d"], "p_A1_greater": 0.5}, rows) == "no"
  assert study.resolved({"recipes": ["a", "b"], "p_A1_greater": 0.05}, rows) == "no (a ceiling not identified)"
  assert study.resolved({"recipes": ["b", "d"], "p_A1_greater": 1.0}, rows) == \
      "yes (the lower ceiling identified, intervals on A apart)"
  assert study.resolved({"recipes": ["d", "b"], "p_A1_greater": 0.0}, rows) == \
      "yes (the lower ceiling identified, intervals on A apart)"
  assert study.resolved({"recipes": ["a", "c"], "p_A1_greater": 1.0}, rows) == "no (a ceiling not identified)"


def test_the_pair_threshold_resolves_both_sides_alike():
  rows = [{"recipe": r, "ceiling_identified": True, "A": {"lo": lo, "hi": hi}} for r, lo, hi in (("a", 0.8, 0.9),
                                                                                                  ("d", 0.6, 0.7))]
  for prob in (0.9, 0.1, 0.95, 0.05):  # P(A_1 > A_2) >= 0.9 and <= 0.1 both resolve
    assert study.resolved({"recipes": ["a", "d"], "p_A1_greater": prob}, rows) == "yes", prob
  for prob in (0.89, 0.11):
    assert study.resolved({"recipes": ["a", "d"], "p_A1_greater": prob}, rows) == "no", prob
  assert study.resolved({"recipes": ["a", "d"], "p_A1_greater": 0.3}, rows, p_min=0.7) == "yes"


def test_the_fixed_a_comparison_fits_every_seeds_points_on_equal_computes():
  """With curve_fit.x=steps every seed evaluates at the same computes: the least squares at the common A pools all
  of them, not the first seed's alone."""
  steps = np.arange(10.0, 130.0, 10.0)
  seeds = [SigmoidParams(A=0.8, B=b, C_mid=40.0, R0=0.2)(steps) for b in (1.0, 2.0)]
  points = [CurvePoints(steps, r, name=f"r/seed{k}") for k, r in enumerate(seeds)]
  fit = study.RecipeFit("r", points, [0.2, 0.2], post=None)
  got = study.fixed_a_comparison([fit], a=0.8)["B"]["r"]
  pooled = fit_fixed_a(np.concatenate([steps, steps]), np.concatenate(seeds), 0.2, 0.8).params.B
  first = fit_fixed_a(steps, seeds[0], 0.2, 0.8).params.B
  assert first == pytest.approx(1.0, rel=1e-3) and 1.1 < pooled < 1.9  # the two fits differ
  assert got == pytest.approx(pooled, rel=1e-6)


def _crossing(p1: SigmoidParams, p2: SigmoidParams, c_lo: float) -> float:
  """The true curves' first crossing above c_lo (the report's range starts at the smallest fitted compute)."""
  grid = np.geomspace(c_lo, 1e4, 200_000)
  d = p1(grid) - p2(grid)
  return float(grid[np.flatnonzero(np.sign(d[:-1]) != np.sign(d[1:]))[0]])


def test_the_report_leaves_out_unfinished_runs_and_says_so(study_report, tmp_path):
  spec, _ = study_report
  partial = tmp_path / "partial"
  (partial / "high").mkdir(parents=True)
  import shutil
  shutil.copytree(spec.dir / "high" / "seed0", partial / "high" / "seed0")
  spec2 = study.StudySpec("p", partial, spec.base, (0, 1), spec.steps, (), spec.fit, {"high": ()})
  out = study.report(spec2, num_warmup=200, num_samples=300, plot=False)
  assert out["unfinished"] == {"high": [1]} and out["recipes"][0]["seeds"] == 1
  assert "Unfinished runs (left out): high: seeds [1]" in (partial / "study_report.md").read_text()


def test_a_typo_in_a_recipe_stops_the_study_when_it_loads(tmp_path, capsys):
  """Every run's whole config is checked before the first run (and by --dry-run), naming the file, run and key."""
  from launch.study import main
  path = _write_study(tmp_path, {"a": {}, "b": {"overrides": ["optimizer.lrr=1e-2"]}}, steps=2)
  assert main([str(path), "--dry-run"]) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and err[0].startswith(f"study.py: error: {path}: run b/seed0: optimizer.lrr"), err
  assert not (tmp_path / "s").exists()  # nothing ran


def test_a_signal_stops_the_study_after_its_run_checkpoints(tmp_path):
  """SIGTERM to the study: passed on to the run in progress, which checkpoints at its next step boundary and exits;
  then the study stops (exit 143) and prints the command that continues it."""
  import os
  import signal
  import subprocess
  import sys
  import time
  from tests.fault_helpers import child_env

  common = [*TINY, "pipeline.eval_every=0", "checkpoint.every_steps=100000"]
  path = _write_study(tmp_path, {"a": {}}, steps=100000, overrides=common)
  run_dir = tmp_path / "s" / "a" / "seed0"
  err_path = tmp_path / "stderr.txt"
  with open(err_path, "wb") as err:
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch" / "study.py"), str(path), "--no-plot"], cwd=tmp_path,
                            env=child_env(None), stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
  try:
    hang_guard = time.time() + 600  # only so that a broken run fails instead of hanging the suite
    while len(read_consumed(run_dir, missing_ok=True)) < 2:  # the run is a few steps in
      assert proc.poll() is None and time.time() < hang_guard, err_path.read_text()[-3000:]
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
    info = run_dir / ".run.lock.json"  # a run the study left behind (it must not): its pid
    if info.exists():
      try:
        os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
      except (ProcessLookupError, ValueError, KeyError):
        pass
  err = err_path.read_text()
  consumed = len(read_consumed(run_dir, missing_ok=True))
  assert code == 143, err[-3000:]
  assert (f"study.py: study stopped by SIGTERM: run a/seed0 stopped (exit 143; its latest checkpoint is step "
          f"{consumed}); continue the study with: python ") in err, err[-3000:]
  assert err.rstrip().endswith(f"launch/study.py {path} --no-plot"), err[-500:]
  assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == [consumed]
  assert not (run_dir / ".run.lock.json").exists()  # the run has ended
