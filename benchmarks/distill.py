"""Does on-policy distillation pay? A finished CPU-default run is the teacher; a fresh warm-started student of the
same size learns from RL alone, from the teacher alone, or from both, over the same seeds (issue 31 item 4).

  teacher   `python launch/train.py seed=TEACHER_SEED ...` for --teacher-steps RL steps, exported with
            launch/export.py --family llama (or --teacher DIR: an exported checkpoint to reuse)
  rl        the CPU default: the task's reward alone
  distill   loss.distill_teacher=TEACHER, loss.zero_variance_filter=false: the per-token advantage is the
            teacher's log-prob minus the student's (the negative per-token reverse KL), no task reward
  both      ... and loss.distill_task_reward=true: the task's advantage plus the teacher's signal

For each run: the held-out mean@n (temperature 1) against RL steps and against compute (compute/flops: the
generator's and the trainer's, the teacher's forward included), the first step and FLOPs at which it reached
--target, the best and final values, greedy pass@1. Prints medians over seeds (min-max beside) and writes
benchmarks/results/distill.json (date, machine, command, every run's curve).

    python benchmarks/distill.py [--seeds 0 1 2] [--steps 150] [--teacher DIR | --teacher-seed 100]
                                 [--teacher-steps 300] [--target 0.9] [key=value ...]
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

from learning_curve import ROOT, run_seed, spread  # benchmarks/ (this script's folder is on sys.path)
from record import save_result


def make_teacher(workdir: pathlib.Path, seed: int, steps: int, extra: list[str]) -> tuple[pathlib.Path, dict]:
  """Trains the CPU default on `seed` for `steps` RL steps and exports it; (its directory, its run summary)."""
  run = run_seed(seed, steps, extra, workdir, name="teacher_")
  out = workdir / "teacher_hf"
  cmd = [sys.executable, str(ROOT / "launch" / "export.py"), str(workdir / f"teacher_seed{seed}"), "--out", str(out),
         "--family", "llama"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"export of the teacher failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
  return out, {k: run[k] for k in ("seed", "final", "best", "greedy_final", "total_s")}


def conditions(teacher: pathlib.Path) -> dict[str, list[str]]:
  distill = [f"loss.distill_teacher={teacher}"]
  return {"rl": [], "distill": [*distill, "loss.zero_variance_filter=false"],
          "both": [*distill, "loss.distill_task_reward=true"]}


def reached(curve: list[dict], target: float):
  """(step, FLOPs) of the first evaluation at or above `target`, or (None, None)."""
  for c in curve:
    if c["pass_rate"] >= target:
      return c["step"], c["flops"]
  return None, None


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--teacher", default=None, help="an exported teacher checkpoint (default: train one)")
  parser.add_argument("--teacher-seed", type=int, default=100)
  parser.add_argument("--teacher-steps", type=int, default=300)
  parser.add_argument("--target", type=float, default=0.9)
  parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "distill.json"))
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  runs: dict[str, list[dict]] = {}
  with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(tmp)
    teacher_info = {"path": args.teacher}
    teacher = pathlib.Path(args.teacher) if args.teacher else None
    if teacher is None:
      teacher, teacher_info = make_teacher(work, args.teacher_seed, args.teacher_steps, args.overrides)
      print(f"teacher: seed {args.teacher_seed}, {args.teacher_steps} steps, held-out final "
            f"{teacher_info['final']:.3f} (best {teacher_info['best']:.3f}), greedy {teacher_info['greedy_final']:.3f}",
            flush=True)
    todo = conditions(teacher)
    for seed in args.seeds:  # seed-major: each seed's warm start is made once and shared by its conditions
      for name, overrides in todo.items():
        r = run_seed(seed, args.steps, [*overrides, *args.overrides], work, target=args.target, name=f"{name}_")
        step, flops = reached(r["curve"], args.target)
        run = {"seed": seed, "start": r["curve"][0]["pass_rate"], "best": r["best"], "final": r["final"],
               "greedy_final": r["greedy_final"], "target_step": step, "target_flops": flops,
               "flops_final": r["curve"][-1]["flops"], "total_s": r["total_s"], "curve": r["curve"]}
        runs.setdefault(name, []).append(run)
        print(f"seed {seed} {name:8s} start {run['start']:.3f} best {run['best']:.3f} final {run['final']:.3f} "
              f"greedy {run['greedy_final']:.3f} | {args.target} at step {step} ({flops and f'{flops:.3g}'} FLOPs) "
              f"| {run['flops_final']:.3g} FLOPs in all | {run['total_s']} s", flush=True)
  summary = {}
  for name, rs in runs.items():
    at = {}
    for c in rs[0]["curve"]:  # the pass rate at each evaluated step, over seeds
      vals = [next((x["pass_rate"] for x in r["curve"] if x["step"] == c["step"]), None) for r in rs]
      at[c["step"]] = spread(vals)
    summary[name] = {"final": spread([r["final"] for r in rs]), "best": spread([r["best"] for r in rs]),
                     "greedy_final": spread([r["greedy_final"] for r in rs]),
                     "reached": sum(r["target_step"] is not None for r in rs),
                     "target_step": spread([r["target_step"] for r in rs]),
                     "target_flops": spread([r["target_flops"] for r in rs]),
                     "flops_final": spread([r["flops_final"] for r in rs]), "by_step": at}
  print(f"\nmedian over seeds {args.seeds} [min-max]; held-out mean@n at T=1; {args.steps} RL steps")
  for name, s in summary.items():
    band = lambda v: "-" if v is None else f"{v[1]:.3g} [{v[0]:.3g}-{v[2]:.3g}]"  # noqa: E731
    print(f"{name:8s} final {band(s['final'])} | best {band(s['best'])} | {args.target} reached by {s['reached']}/"
          f"{len(args.seeds)} at step {band(s['target_step'])}, {band(s['target_flops'])} FLOPs | "
          f"{band(s['flops_final'])} FLOPs in all")
  save_result(args.out, {"seeds": args.seeds, "steps": args.steps, "target": args.target, "teacher": teacher_info,
                         "conditions": conditions(pathlib.Path("TEACHER")),
                         "summary": summary, "runs": runs})


if __name__ == "__main__":
  main()
