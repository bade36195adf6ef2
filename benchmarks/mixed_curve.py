"""Learning curve of mixed math + code on CPU (`configs/mixed_cpu.yaml`): one held-out curve per task.

Runs the main job with the mixed config in a fresh process (fresh warm-start cache), then prints, per evaluation,
the step, the compute (accelerator-seconds) and each task's held-out mean@n, and at the end each task's fitted
curve (the run's own end-of-run per-task fit, `scaling_fit_tasks.json`) and the code reward's scoring numbers
(sandboxed programs scored, their causes, programs per second of scoring time). Writes
benchmarks/results/mixed_curve.json (date, machine, command, the curves) and the run's per-task plot next to it.

    python benchmarks/mixed_curve.py [--seed 0] [--steps N] [key=value ...]
"""

import argparse
import json
import pathlib
import shutil
import tempfile

from learning_curve import run_seed  # the same fresh-process run as the CPU default's benchmark
from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TASKS = ("math", "code")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mixed_curve.json"))
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    run = run_seed(args.seed, args.steps, ["--config", str(ROOT / "configs" / "mixed_cpu.yaml"), *args.overrides],
                   pathlib.Path(tmp))
    run_dir = pathlib.Path(tmp) / f"seed{args.seed}"
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("eval/pass_rate") is not None]
    fits_path = run_dir / "scaling_fit_tasks.json"
    fits = json.loads(fits_path.read_text()) if fits_path.is_file() else {}
    plot = run_dir / "scaling_curve_tasks.png"
    if plot.is_file():
      shutil.copy(plot, pathlib.Path(args.out).with_suffix(".png"))
  curve = [{"step": r["step"], "accelerator_seconds": r.get("compute/accelerator_seconds"), "t_s": c["t_s"],
            **{task: r.get(f"eval/{task}/pass_rate") for task in TASKS},
            **{f"{task}_greedy": r.get(f"eval/{task}/greedy_pass_at_1") for task in TASKS}}
           for r, c in zip(evals, run["curve"])]
  print(f"{'step':>5} {'acc-s':>8} {'t (s)':>7} {'math':>6} {'code':>6}  (held-out mean@n per task)")
  for c in curve:
    print(f"{c['step']:>5} {c['accelerator_seconds']:>8.1f} {c['t_s']:>7.1f} {c['math']:>6.3f} {c['code']:>6.3f}")
  last = rows[-1]
  causes = {k.rsplit("/", 1)[1]: v for k, v in last.items() if k.startswith("reward/code/cause/")}
  scoring = {"programs": last.get("reward/code/calls"), "causes": causes,
             "last_batch_score_s": last.get("reward/code/score_s"), "queue_at_last_batch": last.get("reward/code/queue")}
  print(f"code programs scored: {scoring['programs']} ({causes})")
  for task, fit in fits.items():
    lsq = fit.get("lsq", fit)
    print(f"{task}: fitted A={lsq.get('A')} B={lsq.get('B')} C_mid={lsq.get('C_mid')}")
  print(f"total {run['total_s']} s")
  save_result(args.out, {"seed": args.seed, "total_s": run["total_s"], "curve": curve, "fits": fits,
                         "code_scoring": scoring, "report": run["report"]})


if __name__ == "__main__":
  main()
