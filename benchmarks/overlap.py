"""Generator/trainer overlap on this machine: PipelineRL-k (k = 1, 2, 4, 8) with the generator and the trainer on
their own CPU devices, against lockstep (pipeline.mode=lockstep: k = 0) and PPO-off-policy-k, from the same warm
start.

    python benchmarks/overlap.py [--steps 150] [--variants NAME ...] [override ...]

Each variant is an ordinary `launch/train.py` run in a fresh process (the CPU default plus the variant's overrides
and yours). "2dev" variants give XLA two CPU devices (`--xla_force_host_platform_device_count=2`), the generator
one (`mesh.generator_devices=1`) and the trainer the other, each running its ops on one thread
(`--xla_cpu_multi_thread_eigen=false`), so each has one of the two cores; "shared" is the default: one device
whose ops use both cores, the generator and trainer threads taking turns. The warm start is computed once (the
first run) and read from a shared cache by the others, so every variant starts RL from the same params; times
count from the step-0 evaluation (RL start).

Per variant: the medians over steps of the generator's idle fraction, the trainer's wait fraction, the step time
and rollout tokens/s; held-out mean@n against wall time and against accelerator-seconds; and when each first
reached the synchronous default's final pass rate. Writes benchmarks/results/overlap.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TWO_DEVICES = "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false"
DISJOINT = ["mesh.generator_devices=1"]
VARIANTS = {  # name: (XLA_FLAGS, overrides)
    "shared_k0": ("", ["pipeline.max_lag=0"]),
    "2dev_lockstep": (TWO_DEVICES, DISJOINT + ["pipeline.mode=lockstep"]),
    "2dev_k0": (TWO_DEVICES, DISJOINT + ["pipeline.max_lag=0"]),
    **{f"2dev_k{k}": (TWO_DEVICES, DISJOINT + [f"pipeline.max_lag={k}"]) for k in (1, 2, 4, 8)},
    **{f"2dev_ppo{k}": (TWO_DEVICES, DISJOINT + ["pipeline.mode=ppo_offpolicy", f"pipeline.max_lag={k}"])
       for k in (2, 4)},
}
REFERENCE = "shared_k0"


def run_variant(name: str, steps: int, extra: list[str], workdir: pathlib.Path) -> dict:
  flags, overrides = VARIANTS[name]
  run_dir = workdir / name
  env = {**os.environ, "XLA_FLAGS": flags} if flags else {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  cmd = [sys.executable, str(ROOT / "launch" / "train.py"), f"run_dir={run_dir}", f"pipeline.steps={steps}",
         f"warm_start.cache_dir={workdir / 'ws_cache'}", "logging.progress=false", "curve_fit.bayes=false",
         *overrides, *extra]
  start = time.time()
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if "train/loss" in r][5:]  # the first steps compile
  evals = [r for r in rows if r.get("eval/pass_rate") is not None]
  t0 = evals[0]["time/unix"]
  med = lambda key: float(np.median([r[key] for r in train if key in r]))
  t = sorted(r["time/unix"] for r in train)
  return {
      "name": name, "xla_flags": flags, "overrides": overrides + extra,
      "generator_idle_frac": med("pipeline/generator_idle_frac"), "trainer_wait_frac": med("pipeline/trainer_wait_frac"),
      "step_s": float(np.median(np.diff(t))), "rollout_tokens_per_s": med("rollout/tokens_per_s"),
      "lag_mean": med("pipeline/lag_mean"), "rl_wall_s": round(evals[-1]["time/unix"] - t0, 1),
      "total_s": round(time.time() - start, 1),
      "curve": [{"step": r["step"], "pass_rate": r["eval/pass_rate"], "wall_s": round(r["time/unix"] - t0, 1),
                 "accelerator_seconds": r.get("compute/accelerator_seconds", 0.0)} for r in evals],
  }


def first_reach(curve: list[dict], level: float, key: str):
  return next((c[key] for c in curve if c["pass_rate"] >= level), None)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "overlap.json"))
  parser.add_argument("overrides", nargs="*", help="dotted config overrides for every variant")
  args = parser.parse_args()
  names = [REFERENCE] + [n for n in args.variants if n != REFERENCE]  # the reference computes the warm start
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in names:
      results.append(run_variant(name, args.steps, args.overrides, pathlib.Path(tmp)))
      print(f"{name}: done in {results[-1]['total_s']} s", flush=True)
  level = results[0]["curve"][-1]["pass_rate"]  # the synchronous default's final pass rate
  print(f"\n{args.steps} RL steps each; 'reach' = first evaluation at or above {REFERENCE}'s final {level:.3f}")
  head = (f"{'variant':11s} {'gen idle':>8s} {'tr wait':>8s} {'step s':>7s} {'tok/s':>7s} {'lag':>5s} "
          f"{'final':>6s} {'RL wall s':>9s} {'reach wall s':>12s} {'reach acc-s':>11s}")
  print(head)
  for r in results:
    r["reach_wall_s"] = first_reach(r["curve"], level, "wall_s")
    r["reach_accelerator_s"] = first_reach(r["curve"], level, "accelerator_seconds")
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    print(f"{r['name']:11s} {r['generator_idle_frac']:8.2f} {r['trainer_wait_frac']:8.2f} {r['step_s']:7.3f} "
          f"{r['rollout_tokens_per_s']:7.0f} {r['lag_mean']:5.2f} {r['curve'][-1]['pass_rate']:6.3f} "
          f"{r['rl_wall_s']:9.1f} {fmt(r['reach_wall_s']):>12s} {fmt(r['reach_accelerator_s']):>11s}")
  save_result(args.out, {"steps": args.steps, "reference": REFERENCE, "reach_level": level, "results": results})


if __name__ == "__main__":
  main()
