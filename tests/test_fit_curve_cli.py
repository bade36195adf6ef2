"""launch/fit_curve.py: fits, JSON, plots, comparisons, and clear errors for bad inputs."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax import scaling
import scalerl_jax.scaling.calibration  # noqa: F401  (scaling.calibration below)
from scalerl_jax.scaling import synthetic
from tests.cli_helpers import exit_error

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "fit_curve.py"


def _load_cli():
  spec = importlib.util.spec_from_file_location("fit_curve_cli", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


cli = _load_cli()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  a = synthetic.synthetic_run(synthetic.table1("ScaleRL", r0=0.3), 16000.0, n_evals=40, seed=1)
  b = synthetic.synthetic_run(synthetic.table1("ScaleRL-Scout", r0=0.3), 16000.0, n_evals=40, seed=2)
  return synthetic.write_run_dir(a, root / "scalerl").parent, synthetic.write_run_dir(b, root / "scout").parent


def _csv(path, rows, header="compute,reward"):
  path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
  return path


def _error(capsys, argv) -> str:
  return exit_error(capsys, cli.main, argv)


def test_two_runs_json_and_comparison_plot(runs, tmp_path, capsys):
  out, png = tmp_path / "fits.json", tmp_path / "cmp.png"
  assert cli.main([str(runs[0]), str(runs[1]), "--json", str(out), "--plot", str(png)]) == 0
  printed = capsys.readouterr().out
  assert printed.count("curve fit [") == 2 and "posterior" not in printed
  assert "scalerl vs" in printed and "curves cross" in printed
  data = json.loads(out.read_text())
  assert data["x"] == cli.parse_args([str(runs[0])])[1].x and data["fit_upto"] == 0.5  # the default axis
  first, second = data["runs"]
  for run in data["runs"]:
    assert {"A", "B", "C_mid", "R0", "residual", "extrapolation"} <= set(run)
    assert "bayes" not in run
  assert abs(first["A"] - 0.610) <= 0.02 and abs(second["A"] - 0.710) <= 0.02
  assert first["n_fit"] == 20 and first["n_held_out"] == 20
  assert data["comparisons"][0]["B_rule"]["comparable"] is False  # A differs by ~0.1
  assert png.stat().st_size > 10_000


def test_bayes_quantiles_and_band_in_json(runs, tmp_path):
  out = tmp_path / "fit.json"
  png = tmp_path / "fit.png"
  assert cli.main([str(runs[0]), "--bayes", "--samples", "400", "--json", str(out), "--plot", str(png)]) == 0
  run = json.loads(out.read_text())["runs"][0]
  q = run["bayes"]
  assert q["A"]["q05"] < q["A"]["q50"] < q["A"]["q95"] and q["B"]["q05"] < q["B"]["q50"] < q["B"]["q95"]
  assert q["A"]["q05"] <= 0.610 <= q["A"]["q95"]
  band = q["predicted_last"]
  assert band["lo"] < band["median"] < band["hi"]
  assert q["likelihood"] == "binomial"
  assert png.exists()


def test_flops_axis_and_csv_input(tmp_path, runs):
  out = tmp_path / "f.json"
  assert cli.main([str(runs[0]), "--x", "flops", "--fit-upto", "1.0", "--json", str(out)]) == 0
  run = json.loads(out.read_text())["runs"][0]
  assert run["C_mid"] == pytest.approx(2542 * 1e18, rel=0.1)  # write_run_dir: 1e18 FLOPs per hour
  assert run["extrapolation"]["covered"] is None  # nothing held out
  c = np.linspace(0, 16000, 21)
  rows = list(zip(c, np.round(synthetic.table1("ScaleRL", r0=0.3)(c), 5)))
  csv = _csv(tmp_path / "run.csv", rows)
  assert cli.main([str(csv), "--json", str(out), "--c-min", "1500"]) == 0
  run = json.loads(out.read_text())["runs"][0]
  assert abs(run["A"] - 0.61) <= 0.005 and run["c_min"] == 1500


def test_the_sampling_compute_and_step_axes(runs):
  """--x generator_flops reads the sampling compute (write_run_dir: half of all FLOPs), --x steps the optimizer
  step of each evaluation; a sigmoid's fit does not depend on the unit, so both give the same A and B."""
  flops, gen, steps = (scaling.load_points(runs[0], x=x) for x in ("flops", "generator_flops", "steps"))
  np.testing.assert_allclose(gen.compute, flops.compute / 2)
  np.testing.assert_array_equal(steps.compute, 100 * np.arange(len(steps)))  # write_run_dir: 100 steps per eval
  a, b = scaling.analyse(gen).lsq.params, scaling.analyse(flops).lsq.params
  assert (a.A, a.B) == pytest.approx((b.A, b.B), rel=1e-6) and a.C_mid == pytest.approx(b.C_mid / 2, rel=1e-6)


def test_the_trainer_advice_reads_the_step_axis(tmp_path):
  """curve_fit.x=steps: the advisor reads the step the flush passes with the record (metrics.jsonl gets it later)."""
  from scalerl_jax.config import CurveFitConfig
  from scalerl_jax.pipeline.step_metrics import TargetAdvisor
  run = synthetic.synthetic_run(synthetic.table1("ScaleRL", r0=0.3), 16000.0, n_evals=12, seed=5)
  advise = TargetAdvisor(CurveFitConfig(target=0.58, x="steps", bayes=False), tmp_path)
  for i, r in enumerate(run.reward):
    out = advise({"step": 10 * i, "eval/pass_rate": float(r)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
      f.write(json.dumps({"step": 10 * i, "eval/pass_rate": float(r), **out}) + "\n")
  assert 0.0 <= out["predict/p_target"] <= 1.0


def test_fewer_than_four_points(tmp_path, capsys):
  csv = _csv(tmp_path / "short.csv", [(0, 0.3), (1, 0.4), (2, 0.45), (3, 0.5), (4, 0.52)])
  err = _error(capsys, [str(csv), "--fit-upto", "0.5"])
  assert "only 2 usable point(s) to fit (need >= 4)" in err


def test_non_increasing_compute(tmp_path, capsys):
  csv = _csv(tmp_path / "bad.csv", [(0, 0.3), (2, 0.4), (1, 0.45), (3, 0.5), (4, 0.52)])
  assert "compute must increase strictly, but point 2 has compute 1 after 2" in _error(capsys, [str(csv)])


def test_nan_reward(tmp_path, capsys):
  csv = _csv(tmp_path / "nan.csv", [(0, 0.3), (1, "nan"), (2, 0.45), (3, 0.5), (4, 0.52)])
  assert "reward is NaN or infinite at point(s) [1]" in _error(capsys, [str(csv)])


def test_unreadable_and_missing_inputs(tmp_path, capsys):
  bad = tmp_path / "run"
  bad.mkdir()
  (bad / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage")
  assert "cannot read" in _error(capsys, [str(bad)])
  assert "no such file or directory" in _error(capsys, [str(tmp_path / "nope.csv")])
  no_cols = _csv(tmp_path / "cols.csv", [(0, 0.3)], header="gpu_hours,score")
  assert "need a header with columns compute,reward" in _error(capsys, [str(no_cols)])
  no_evals = tmp_path / "noeval"
  no_evals.mkdir()
  (no_evals / "metrics.jsonl").write_text('{"step": 0, "compute/accelerator_seconds": 0.0}\n')
  assert "no evaluation lines" in _error(capsys, [str(no_evals)])


def test_script_runs_standalone(tmp_path):
  c = np.linspace(0, 10, 11)
  csv = _csv(tmp_path / "run.csv", list(zip(c, np.round(0.2 + 0.4 / (1 + (3 / np.maximum(c, 1e-9)) ** 2), 6))))
  proc = subprocess.run([sys.executable, str(SCRIPT), str(csv), "--fit-upto", "1"], capture_output=True, text=True,
                        cwd=tmp_path, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "A=0.600 B=2.00" in proc.stdout
  proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing")], capture_output=True, text=True,
                        cwd=tmp_path, timeout=120)
  assert proc.returncode == 2 and "fit_curve.py: error:" in proc.stderr


def _run_copy(runs, tmp_path, edit):
  """A copy of the first synthetic run whose metrics.jsonl lines went through `edit(lines) -> lines`."""
  run = tmp_path / "edited"
  run.mkdir()
  lines = (runs[0] / "metrics.jsonl").read_text().splitlines()
  (run / "metrics.jsonl").write_text("\n".join(edit(lines)) + "\n")
  return run


def _set(line, **values):
  return json.dumps({**json.loads(line), **{k.replace("__", "/"): v for k, v in values.items()}})


@pytest.mark.parametrize("key, value, message", [
    ("eval__n_correct", "12", "eval/n_correct is not an integer: '12'"),
    ("eval__n_total", 2.5, "eval/n_total is not an integer: 2.5"),
    ("eval__n_correct", True, "eval/n_correct is not an integer: True"),
    ("compute__generator_flops", "1e5", "compute/generator_flops is not a number: '1e5'"),
    ("compute__generator_flops", [1], "compute/generator_flops is not a number: [1]"),
    ("compute__generator_flops", 10**400, "compute/generator_flops is too large for a float"),
    ("eval__pass_rate", {"v": 1}, "eval/pass_rate is not a number: {'v': 1}"),
])
def test_non_numeric_values_name_file_line_and_key(runs, tmp_path, capsys, key, value, message):
  line = 1 + next(i for i, l in enumerate((runs[0] / "metrics.jsonl").read_text().splitlines())
                  if "eval/pass_rate" in l and i > 5)
  run = _run_copy(runs, tmp_path, lambda ls: [_set(l, **{key: value}) if i == line - 1 else l
                                              for i, l in enumerate(ls)])
  err = _error(capsys, [str(run)])
  assert err.startswith(f"fit_curve.py: error: {run / 'metrics.jsonl'}:{line}: {message}") and err.count("\n") == 1


def test_non_numeric_per_prompt_counts_name_the_line(runs, tmp_path, capsys):
  def edit(lines):
    out = []
    for l in lines:
      rec = json.loads(l)
      if "eval/pass_rate" in rec:
        rec.update({"eval/per_prompt_correct": [1, 2], "eval/samples_per_prompt": 4})
      out.append(json.dumps(rec))
    first_eval = next(i for i, r in enumerate(out) if "eval/pass_rate" in r)
    out[first_eval] = _set(out[first_eval], eval__per_prompt_correct=[1, "x"])
    return out
  run = _run_copy(runs, tmp_path, edit)
  assert "metrics.jsonl:1: eval/per_prompt_correct[1] is not an integer: 'x'" in _error(capsys, [str(run)])


def test_csv_counts_must_be_whole_numbers(tmp_path, capsys):
  csv = _csv(tmp_path / "c.csv", [(0, 0.3, 3, 10), (1, 0.4, "4.5", 10)], header="compute,reward,n_correct,n_total")
  assert f"{csv}:3: column n_correct is not an integer count: '4.5'" in _error(capsys, [str(csv)])
  csv = _csv(tmp_path / "d.csv", [(0, 0.3, 3, 10), (1, 0.4, "four", 10)], header="compute,reward,n_correct,n_total")
  assert f"{csv}:3: column n_correct is not a number: 'four'" in _error(capsys, [str(csv)])


def test_curve_points_reject_non_numbers_as_curve_data_errors():
  from scalerl_jax.scaling.points import CurveDataError, CurvePoints
  with pytest.raises(CurveDataError, match="run: n_correct holds a value that is not a number"):
    CurvePoints([0, 1], [0.1, 0.2], n_correct=["a", 1], n_total=[4, 4], name="run")
  with pytest.raises(CurveDataError, match="compute holds a value that is not a number"):
    CurvePoints(["x", 1], [0.1, 0.2])
  with pytest.raises(CurveDataError, match="n_correct and n_total must be whole counts"):
    CurvePoints([0, 1], [0.1, 0.2], n_correct=[1.5, 1], n_total=[4, 4])


def test_a_last_line_cut_by_a_kill_is_skipped_with_a_warning(runs, tmp_path, capsys, caplog):
  cut = _run_copy(runs, tmp_path, lambda ls: ls + [ls[-1][:25]])
  (cut / "metrics.jsonl").write_text((cut / "metrics.jsonl").read_text().rstrip("\n"))  # a kill: no newline
  with caplog.at_level("WARNING", logger="scalerl_jax.scaling.io"):
    assert cli.main([str(cut)]) == 0
  n = len((runs[0] / "metrics.jsonl").read_text().splitlines()) + 1
  assert any(f"metrics.jsonl:{n}: skipping the last line, cut off" in r.getMessage() for r in caplog.records)
  assert capsys.readouterr().out.count("curve fit [") == 1


def test_a_broken_line_before_the_last_is_an_error_naming_it(runs, tmp_path, capsys):
  broken = _run_copy(runs, tmp_path, lambda ls: ls[:3] + [ls[3][:25]] + ls[3:])
  err = _error(capsys, [str(broken)])
  assert f"{broken / 'metrics.jsonl'}:4: not a JSON line (Unterminated string" in err


def test_unwritable_outputs_are_one_line_errors_before_the_fit(runs, tmp_path, capsys):
  a_file = tmp_path / "file.txt"
  a_file.write_text("x")
  for argv, message in (
      (["--plot", str(a_file / "fit.png")], f"cannot write --plot {a_file / 'fit.png'}: {a_file} is not a directory"),
      (["--json", str(a_file / "sub" / "f.json")], f"cannot write --json {a_file / 'sub' / 'f.json'}: {a_file} is not"),
      (["--json", str(tmp_path)], f"cannot write --json {tmp_path}: is a directory"),
      (["--plot", str(tmp_path / "fit.xyz")], "cannot write --plot " + str(tmp_path / "fit.xyz") + ": unknown image "
       "format '.xyz'"),
      (["--samples", "0"], "--samples must be positive, got 0")):
    err = _error(capsys, [str(runs[0]), *argv])
    assert err.startswith("fit_curve.py: error: " + message) and err.count("\n") == 1, err


def test_a_write_that_fails_after_the_fit_is_one_line(runs, tmp_path, capsys, monkeypatch):
  from scalerl_jax.scaling import plots

  def refuse(fig, path):
    raise PermissionError(13, "Permission denied", str(path))
  monkeypatch.setattr(plots, "save", refuse)
  err = _error(capsys, [str(runs[0]), "--plot", str(tmp_path / "fit.png")])
  assert err == f"fit_curve.py: error: cannot write --plot {tmp_path / 'fit.png'}: Permission denied\n"


def test_target_advice_on_a_run_with_a_known_ceiling(tmp_path, capsys):
  """Synthetic run with A = 0.61 (Table 1's ScaleRL), fitted on its first half: a target well below A is predicted
  to be reached, before the run's end, and one above A almost never."""
  from scalerl_jax.scaling.advice import target_advice
  true = synthetic.table1("ScaleRL", r0=0.3)
  run = synthetic.synthetic_run(true, 16000.0, n_evals=40, seed=3)
  fitted = scaling.analyse(scaling.CurvePoints(run.compute[:21], run.reward[:21], name="half"), fit_upto=1.0)
  low = float(run.reward[:21].max()) + 0.01  # above everything the first half measured, below the ceiling
  assert low < true.A - 0.02
  near = target_advice(fitted, low)
  assert near["source"] == "laplace" and near["reached"] is None and near["p_reach"] > 0.9
  c_true = true.C_mid / ((true.A - true.R0) / (near["target"] - true.R0) - 1) ** (1 / true.B)
  assert near["c_target"]["lo"] < c_true < near["c_target"]["hi"]
  assert target_advice(fitted, true.A + 0.15)["p_reach"] < 0.1
  measured = target_advice(fitted, float(run.reward[5]))
  assert measured["reached"] is not None and measured["p_reach"] == 1.0
  d = synthetic.write_run_dir(run, tmp_path / "r").parent
  assert cli.main([str(d), "--target", "0.5", "--json", str(tmp_path / "a.json")]) == 0
  printed = capsys.readouterr().out
  assert "target 0.500: P(ceiling > target) = " in printed or "target 0.500: reached at C=" in printed
  assert json.loads((tmp_path / "a.json").read_text())["runs"][0]["advice"]["target"] == 0.5
  assert _error(capsys, [str(d), "--target", "1.5"]).endswith("target must be a pass rate in (0, 1), got 1.5\n")


def test_a_fit_before_the_bend_says_its_ceiling_is_not_identified(capsys):
  from scalerl_jax.scaling.advice import ceiling_status, target_advice
  true = synthetic.table1("ScaleRL", r0=0.3)  # C_mid 2542
  run = synthetic.synthetic_run(true, 16000.0, n_evals=120, seed=4)
  early = run.compute <= 1200.0  # the first points: all well before the midpoint
  before = scaling.analyse(scaling.CurvePoints(run.compute[early], run.reward[early], name="early"), fit_upto=1.0)
  whole = scaling.analyse(run, fit_upto=0.6)
  assert whole.window.c_cut > true.C_mid and ceiling_status(whole) == (True, "")
  identified, why = ceiling_status(before)
  assert before.lsq.params.C_mid > before.window.c_cut and not identified and why.startswith("not bent yet")
  s = scaling.summary(before)
  assert s["ceiling"] == {"identified": False, "why_not": why}
  assert "ceiling not identified: not bent yet" in scaling.format_report(s)
  assert target_advice(before, 0.58)["caveat"] == why


def test_the_trainer_logs_advice_at_every_evaluation_once_enough_points_exist(tmp_path):
  """TargetAdvisor on a run directory filling up evaluation by evaluation (a synthetic run's metrics lines)."""
  from scalerl_jax.config import CurveFitConfig
  from scalerl_jax.pipeline.step_metrics import TargetAdvisor
  true = synthetic.table1("ScaleRL", r0=0.3)
  run = synthetic.synthetic_run(true, 16000.0, n_evals=30, seed=5)
  advise = TargetAdvisor(CurveFitConfig(target=0.58), tmp_path)
  logged = []
  for c, r in zip(run.compute, run.reward):
    line = {"compute/generator_flops": float(c), "eval/pass_rate": float(r)}  # the default axis
    line.update(advise(line))
    logged.append(line)
    with open(tmp_path / "metrics.jsonl", "a") as f:
      f.write(json.dumps({"step": len(logged), **line}) + "\n")
  assert all("predict/p_target" not in l for l in logged[:TargetAdvisor.MIN_POINTS - 1])
  late = [l for l in logged if "predict/p_target" in l]
  assert len(late) >= 20 and all(0 <= l["predict/p_target"] <= 1 for l in late)
  final = late[-1]
  assert final["predict/target"] == 0.58 and abs(final["predict/A"] - true.A) < 0.05
  assert final["predict/reached"] == int(run.reward.max() >= 0.58)
  if not final["predict/reached"]:
    assert final["predict/c_target_lo"] <= final["predict/c_target"] <= final["predict/c_target_hi"]


def test_calibration_file_is_named_in_the_report_and_a_bad_one_is_a_clear_error(runs, tmp_path, capsys):
  shipped = scaling.calibration.load()
  mine = tmp_path / "mine.json"
  scaling.calibration.save(scaling.calibration.Calibration("my own runs", shipped.discrepancy), mine)
  assert cli.main([str(runs[0]), "--calibration", str(mine)]) == 0
  n = len(shipped.discrepancy["numpyro"].scores)
  assert f"bands calibrated on my own runs ({n} conformal scores; {mine})" in capsys.readouterr().out
  assert cli.main([str(runs[0])]) == 0
  assert "shipped default" in capsys.readouterr().out
  assert "no such calibration file" in _error(capsys, [str(runs[0]), "--calibration", str(tmp_path / "none.json")])
  (tmp_path / "bad.json").write_text('{"name": "x"}')
  assert "a discrepancy for each of" in _error(capsys, [str(runs[0]), "--calibration", str(tmp_path / "bad.json")])
