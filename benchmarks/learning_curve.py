"""Learning-curve benchmark of the embedded CPU default (`python launch/train.py` with no arguments).

For each seed, runs the main job in a fresh process and a fresh warm-start cache, then reports, counted from
process start (imports, compilation and warm start included): the held-out mean@n after the warm start, when it
first rose by +0.20 and +0.40, the best and final values (a collapse shows as final << best), greedy pass@1, and the
total wall time. Prints a table and writes benchmarks/results/learning_curve.json (date, machine, command, the
per-evaluation curve against step and compute).

    python benchmarks/learning_curve.py [--seeds 0 1 ... 9] [--steps N] [--target 0.85] [key=value ...]
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def measured_run(cmd: list[str], what: str) -> tuple[subprocess.CompletedProcess, float | None]:
  """(the finished process, its peak RSS in GiB: None without GNU time) of `cmd` run from the project root;
  RuntimeError naming `what`, with the output's tail, when it fails."""
  timer = [t, "-f", "peak_rss_kb=%M"] if (t := shutil.which("time")) else []  # GNU time: the run's peak RSS
  proc = subprocess.run([*timer, *cmd], cwd=ROOT, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{what} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
  rss = [l for l in proc.stderr.splitlines() if l.startswith("peak_rss_kb=")]
  return proc, round(int(rss[-1].split("=")[1]) / 2 ** 20, 3) if rss else None


def run_seed(seed: int, steps, extra, workdir: pathlib.Path, target: float = 0.9, name: str = "") -> dict:
  """One run of the main job in `workdir`/{name}seed{seed}, its warm start cached in `workdir`/ws_cache (shared by
  the runs of a seed whatever `name`: the warm start does not depend on the RL keys)."""
  run_dir = workdir / f"{name}seed{seed}"
  cmd = [sys.executable, str(ROOT / "launch" / "train.py"), f"run_dir={run_dir}", f"seed={seed}", f"data.seed={seed}",
         f"warm_start.cache_dir={workdir / 'ws_cache'}", "logging.progress=false", *extra]
  if steps:
    cmd.append(f"pipeline.steps={steps}")
  start = time.time()
  proc, peak_rss_gb = measured_run(cmd, f"seed {seed}")
  total = time.time() - start
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in rows if r.get("eval/pass_rate") is not None]
  r0 = evals[0]["eval/pass_rate"]

  def first_time(gain):
    for r in evals:
      if r["eval/pass_rate"] >= r0 + gain:
        return round(r["time/unix"] - start, 1), r["step"]
    return None, None

  t20, s20 = first_time(0.20)
  t40, s40 = first_time(0.40)
  t_target, s_target = first_time(target - r0)
  best = max(evals, key=lambda r: r["eval/pass_rate"])
  after = [r["eval/pass_rate"] for r in evals if s_target is not None and r["step"] >= s_target]
  return {
      "seed": seed, "warm_start_pass_rate": r0, "rl_start_s": round(evals[0]["time/unix"] - start, 1),
      "t_plus_0.20_s": t20, "step_plus_0.20": s20, "t_plus_0.40_s": t40, "step_plus_0.40": s40,
      "target": target, "t_target_s": t_target, "step_target": s_target, "min_after_target": min(after, default=None),
      "steps_per_s_median": _steps_per_s(rows),
      "best": best["eval/pass_rate"], "best_step": best["step"], "final": evals[-1]["eval/pass_rate"],
      "greedy_start": evals[0].get("eval/greedy_pass_at_1"), "greedy_final": evals[-1].get("eval/greedy_pass_at_1"),
      "total_s": round(total, 1), "report": proc.stdout.strip().splitlines()[-8:],
      "peak_rss_gb": peak_rss_gb,
      "curve": [{"step": r["step"], "pass_rate": r["eval/pass_rate"], "greedy": r.get("eval/greedy_pass_at_1"),
                 "accelerator_seconds": r.get("compute/accelerator_seconds"), "flops": r.get("compute/flops"),
                 "t_s": round(r["time/unix"] - start, 1)} for r in evals],
  }


def _steps_per_s(rows) -> float:
  """1 / the median wall time between consecutive training steps (evaluation steps included)."""
  t = sorted(r["time/unix"] for r in rows if "train/loss" in r)
  gaps = sorted(b - a for a, b in zip(t, t[1:]))
  return round(1 / gaps[len(gaps) // 2], 2) if gaps else None


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
  parser.add_argument("--steps", type=int, default=None)
  parser.add_argument("--target", type=float, default=0.85, help="report when held-out mean@n first reached this")
  parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "learning_curve.json"))
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for seed in args.seeds:
      results.append(run_seed(seed, args.steps, args.overrides, pathlib.Path(tmp), args.target))
      r = results[-1]
      print(f"seed {seed}: warm start {r['warm_start_pass_rate']:.3f} (RL from {r['rl_start_s']} s) | +0.20 at "
            f"{r['t_plus_0.20_s']} s | +0.40 at {r['t_plus_0.40_s']} s (step {r['step_plus_0.40']}) | "
            f"{args.target} at {r['t_target_s']} s (step {r['step_target']}, min after {r['min_after_target']}) | "
            f"median step {1 / r['steps_per_s_median']:.3f} s | best "
            f"{r['best']:.3f} @ step {r['best_step']} | final {r['final']:.3f} | greedy {r['greedy_start']:.3f} -> "
            f"{r['greedy_final']:.3f} | total {r['total_s']} s", flush=True)
  summary = summarize(results, args.target)
  print(f"\n{len(results)} seeds: held-out mean@n reached {args.target} on {summary['reached']} of {len(results)}; "
        f"median time to it {summary['t_target_median_s']} s (a seed that never reached it counts as never); "
        f"final min/median/max {summary['final']}; best {summary['best']}; warm start {summary['warm_start']}; "
        f"RL start {summary['rl_start_s']} s; total {summary['total_s']} s")
  save_result(args.out, {"summary": summary, "results": results})


def spread(values, digits: int = 4):
  """[min, median, max] of the values that are not None, rounded (None when there are none)."""
  v = sorted(x for x in values if x is not None)
  return [round(v[0], digits), round(float(np.median(v)), digits), round(v[-1], digits)] if v else None


def summarize(results: list[dict], target: float) -> dict:
  """The spread over seeds: how many reached the target, the median time to it, min/median/max of the rest."""
  def of(key):
    return spread([r[key] for r in results], 3)

  times = sorted(r["t_target_s"] if r["t_target_s"] is not None else float("inf") for r in results)
  median_t = float(np.median(times))
  return {"target": target, "seeds": [r["seed"] for r in results],
          "reached": sum(r["t_target_s"] is not None for r in results),
          "t_target_median_s": round(median_t, 1) if np.isfinite(median_t) else None,
          "step_target": [r["step_target"] for r in results],
          "final": of("final"), "best": of("best"), "warm_start": of("warm_start_pass_rate"),
          "rl_start_s": of("rl_start_s"), "total_s": of("total_s")}


if __name__ == "__main__":
  main()
