"""benchmarks/calibration.py across tasks: transfer judges each task with the other tasks' runs only, and
--write-calibration writes a file the fit reads (one command to refit the bands and the prior on a new task)."""

import pathlib
import sys

import numpy as np
import pytest

from scalerl_jax.scaling import calibration as calibration_lib
from scalerl_jax.scaling.curves import SigmoidParams
from scalerl_jax.scaling.synthetic import synthetic_run, write_run_dir
ROOT = pathlib.Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT / "benchmarks"))
import calibration as bench  # noqa: E402  (benchmarks/calibration.py)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
  root = tmp_path_factory.mktemp("studies")
  rng = np.random.default_rng(0)
  for task, n_recipes in (("study_a", 3), ("study_b", 2)):
    for r in range(n_recipes):
      truth = SigmoidParams(A=rng.uniform(0.75, 0.9), B=rng.uniform(1.2, 2.0), C_mid=rng.uniform(40.0, 80.0), R0=0.3)
      pts = synthetic_run(truth, 300.0, n_evals=16, n_prompts=64, samples_per_prompt=4, prompt_phi=5.0, seed=r)
      write_run_dir(pts, root / task / f"recipe{r}" / "seed0", steps_per_eval=10)
  cal_path = root / "cal.json"
  out = bench.main([str(root / "*" / "*" / "seed0"), "--fracs", "0.5", "--variants", "free/iid", "--prior",
                    "--num-warmup", "60", "--num-samples", "60", "--out", str(root / "out.json"),
                    "--write-calibration", str(cal_path)])
  return out, cal_path


def test_transfer_judges_each_task_with_the_other_tasks_runs_alone(measured):
  out, _ = measured
  rows = [r for r in out["rows"] if r["fitter"] == "numpyro_free_r0_iid"]
  for task, others in (("study_a", 2), ("study_b", 3)):
    transfer = [r for r in rows if r["mode"] == "transfer" and r["task"] == task]
    assert len(transfer) == 5 - others and all(r["discrepancy"]["scores"] == others for r in transfer)
    # leaving one recipe out stays inside the task: the same task's other recipes only
    loo = [r for r in rows if r["mode"] == "conformal, leave-one-out" and r["task"] == task]
    assert all(r["discrepancy"]["scores"] == 5 - others - 1 for r in loo)
  priors = out["priors"]
  a_run = next(p for p in priors if "study_a" in p and "recipe0" in p)
  assert priors[a_run]["transfer"]["n_runs"] == 2 and priors[a_run]["within"]["n_runs"] == 2
  assert priors[a_run]["transfer"]["source"] == "tasks other than study_a"


def test_write_calibration_writes_what_the_fit_reads(measured):
  _, path = measured
  cal = calibration_lib.load(path)
  assert cal.name.startswith("5 runs of 5 recipes on 2 task(s) (study_a, study_b)")
  assert len(cal.discrepancy["numpyro"].scores) == 5 and len(cal.discrepancy["paper"].scores) == 5
  assert set(cal.cut_scores["numpyro"]) == {0.5}
  assert cal.prior is not None and cal.prior.n_runs == 5 and not cal.use_prior
  assert "calibration.py" in cal.provenance["command"] and len(cal.provenance["runs"]) == 5
  alt = calibration_lib.load(path.with_name("cal_with_prior.json"))  # the alternative: the prior on
  assert alt.use_prior and alt.shape_prior == alt.prior and alt.provenance["fitter"].endswith("+prior_transfer")
  assert alt.discrepancy["paper"] == cal.discrepancy["paper"]  # only the NumPyro fit takes the prior


def test_training_rate_pools_windows_with_their_counts_and_merges_only_up_to_the_cut(tmp_path):
  import json
  (tmp_path / "config.yaml").write_text("data:\n  prompts_per_step: 4\n  samples_per_prompt: 2\n")
  lines = [{"step": 0, "compute/generator_flops": 0.0, "eval/pass_rate": 0.2, "eval/n_correct": 2, "eval/n_total": 10}]
  for step in range(1, 21):
    lines.append({"step": step, "compute/generator_flops": 10.0 * step, "train/pass_rate": 0.25 if step <= 5 else 0.5})
    if step % 5 == 0:
      lines.append({"step": step, "compute/generator_flops": 10.0 * step, "eval/pass_rate": 0.3, "eval/n_correct": 3,
                    "eval/n_total": 10})
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
  train = bench.training_rate(tmp_path, "generator_flops", 5)
  assert train.compute.tolist() == [30.0, 80.0, 130.0, 180.0]  # the mean compute of steps 1-5, 6-10, ...
  assert train.n_total.tolist() == [40] * 4 and train.n_correct.tolist() == [10, 20, 20, 20]
  held = bench.load_points(tmp_path, x="generator_flops")
  both = bench.with_training(held, train, c_cut=100.0)
  assert both.compute.tolist() == [0.0, 30.0, 50.0, 80.0, 100.0, 150.0, 200.0]  # training points up to the cut only
  assert both.n_total.tolist() == [10, 40, 10, 40, 10, 10, 10] and both.compute[-1] == held.compute[-1]
