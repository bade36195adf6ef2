"""Interleaved A/B of the train step: the code at a git revision (A) against the working tree (B), one process.

    python benchmarks/mfu_ab.py --rev HEAD~1 --patch scalerl_jax/model/layers.py:Attention.__call__ --configs 36m

Each --patch FILE:QUALNAME takes QUALNAME from FILE as it was at --rev (the file executed as a module of its own)
and sets it on the live module while variant A is built and compiled; B is the tree as it is. Then the steps run
in interleaved rounds (A B A B ...), a 2048^3 matmul peak between rounds, and the medians, ratio and MFU are
printed and written as JSON. The step is `benchmarks/mfu.py`'s (the trainer's RL step on an RL batch).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import pathlib
import statistics
import subprocess
import time
import types

import jax

import mfu  # benchmarks/mfu.py (this script's folder is on sys.path)
from record import save_result

ROOT = pathlib.Path(__file__).resolve().parents[1]


def old_module(rev: str, path: str) -> types.ModuleType:
  src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True,
                       check=True).stdout
  mod = types.ModuleType(f"at_{rev}_{path}")
  exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
  return mod


@contextlib.contextmanager
def patched(rev: str, specs: list[str]):
  undo = []
  try:
    for spec in specs:
      path, qualname = spec.split(":")
      live = importlib.import_module(path.removesuffix(".py").replace("/", "."))
      old = old_module(rev, path)
      *owner_names, attr = qualname.split(".")
      owner, old_value = live, old
      for name in owner_names:
        owner, old_value = getattr(owner, name), getattr(old_value, name)
      undo.append((owner, attr, getattr(owner, attr)))
      setattr(owner, attr, getattr(old_value, attr))
    yield
  finally:
    for owner, attr, value in reversed(undo):
      setattr(owner, attr, value)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rev", required=True)
  ap.add_argument("--patch", action="append", required=True, help="FILE:QUALNAME taken from --rev for variant A")
  ap.add_argument("--configs", default="36m")
  ap.add_argument("--rows", type=int, default=0, help="prompts P instead of the config's (G rows each)")
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--rounds", type=int, default=4)
  ap.add_argument("--shared-prompt", action="store_true")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  result = {"rev": args.rev, "patch": args.patch, "machine_detail": mfu.machine(), "uptime_at_start": mfu.uptime(),
            "configs": {}}
  for name in args.configs.split(","):
    cfg, P, G, T = mfu.CONFIGS[name]
    cfg, P = dataclasses.replace(cfg, dtype=args.dtype), args.rows or P
    runs = {}
    for variant in ("A", "B"):
      with patched(args.rev, args.patch) if variant == "A" else contextlib.nullcontext():
        step, state, batch, positions = mfu.build(cfg, P, G, T, args.shared_prompt)
        state, metrics = step(state, batch)  # compile (A under the patch)
        jax.block_until_ready(metrics)
      runs[variant] = [step, state, batch, float(metrics["loss"])]
    flops = positions * mfu.flops_per_token(cfg, T // 2, backward=True)
    seconds, peaks = {"A": [], "B": []}, []
    for _ in range(args.rounds):
      for variant, run in runs.items():
        t = time.perf_counter()
        run[1], metrics = run[0](run[1], run[2])
        jax.block_until_ready(metrics)
        seconds[variant].append(time.perf_counter() - t)
      peaks.append(mfu.matmul_peak(mfu.jnp.float32 if args.dtype == "float32" else mfu.jnp.bfloat16, repeats=3))
    peak = statistics.median(peaks)
    row = {"rows": P * G, "row_tokens": T, "flops_per_step": flops, "peak_flop_s": peak, "peaks": peaks,
           "first_loss": {v: r[3] for v, r in runs.items()}}
    for variant, s in seconds.items():
      med = statistics.median(s)
      row[variant] = {"step_s_median": med, "step_s_all": s, "mfu": flops / med / peak}
    row["speedup_B_over_A"] = row["A"]["step_s_median"] / row["B"]["step_s_median"]
    result["configs"][name] = row
    print(f"{name} {P * G} x {T}: A {row['A']['step_s_median']:.3f} s ({row['A']['mfu']:.1%})  "
          f"B {row['B']['step_s_median']:.3f} s ({row['B']['mfu']:.1%})  B/A speed-up {row['speedup_B_over_A']:.3f}"
          f"  peak {peak / 1e9:.0f} GFLOP/s; first losses {row['first_loss']}", flush=True)
  result["uptime_at_end"] = mfu.uptime()
  print(f"load: start [{result['uptime_at_start']}] end [{result['uptime_at_end']}]")
  if args.out:
    save_result(args.out, result)


if __name__ == "__main__":
  main()
