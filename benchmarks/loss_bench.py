"""Loss + gradient time of every `loss.name` on a paper-sized step batch (no model: log-prob arrays only).

    python benchmarks/loss_bench.py                      # 48 prompts x 16 samples x 1024 completion tokens
    python benchmarks/loss_bench.py --prompts 8 --repeats 3

Times jax.jit(jax.value_and_grad(policy_loss w.r.t. logp_BT)) (metrics included, as the train step computes
them) and jax.jit(prepare), median of --repeats runs after one warm-up call; prints a table and writes JSON with
the date, the machine and the command to --out.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import rl
from scalerl_jax.config import CHOICES, LossConfig
from scalerl_jax.types import TrainBatch

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)


def make_inputs(P: int, G: int, T: int, seed: int = 0):
  """Random rollouts: lengths U[T/4, T], 0/1 rewards (~30% groups zero-variance), 3% truncated, small gaps."""
  rng = np.random.default_rng(seed)
  B = P * G
  lengths_B = rng.integers(T // 4, T + 1, B)
  mask_BT = (np.arange(T)[None, :] < lengths_B[:, None]).astype(np.float32)
  mask_BT[:, 0] = 0.0
  pass_P = rng.choice([0.0, 0.3, 0.6, 1.0], P, p=[0.15, 0.35, 0.35, 0.15])
  rewards_PG = (rng.random((P, G)) < pass_P[:, None]).astype(np.float32)
  truncated_PG = rng.random((P, G)) < 0.03
  gen_BT = np.log(rng.uniform(0.05, 1.0, (B, T))).astype(np.float32)
  logp_BT = (gen_BT + rng.normal(0.0, 0.05, (B, T))).astype(np.float32)
  return logp_BT, mask_BT, gen_BT, rewards_PG, truncated_PG, lengths_B.reshape(P, G)


def timed(fn, *args, repeats: int):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  runs = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    runs.append(time.perf_counter() - t0)
  return first, statistics.median(runs), runs


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--prompts", type=int, default=48)
  ap.add_argument("--samples", type=int, default=16)
  ap.add_argument("--tokens", type=int, default=1024)
  ap.add_argument("--repeats", type=int, default=20)
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "loss_bench.json"))
  args = ap.parse_args(argv)
  P, G, T = args.prompts, args.samples, args.tokens
  load_before = os.getloadavg()
  logp_BT, mask_BT, gen_BT, rewards_PG, truncated_PG, lengths_PG = make_inputs(P, G, T)

  base = LossConfig()
  prepare = jax.jit(rl.prepare, static_argnames="cfg")
  prep_first, prep_median, _ = timed(lambda: prepare(rewards_PG, mask_BT, truncated_PG, base), repeats=args.repeats)
  prep = prepare(rewards_PG, mask_BT, truncated_PG, base)
  batch = TrainBatch(tokens=jnp.zeros((P * G, T), jnp.int32), loss_mask=jnp.asarray(mask_BT),
                     gen_logprobs=jnp.asarray(gen_BT), advantages=prep.advantages,
                     token_weights=prep.token_weights, sample_weights=prep.sample_weights)
  logp = jnp.asarray(logp_BT)
  step = jax.jit(jax.value_and_grad(rl.policy_loss, has_aux=True), static_argnames="cfg")

  rows = [{"name": "prepare", "first_call_s": prep_first, "median_s": prep_median}]
  for name in CHOICES["loss.name"]:
    cfg = LossConfig(name=name)
    first, median, runs = timed(lambda: step(logp, batch, cfg), repeats=args.repeats)
    rows.append({"name": name, "first_call_s": first, "median_s": median, "runs_s": runs})

  tokens = float(np.sum(mask_BT))
  print(f"loss+grad, {P} prompts x {G} samples x {T} tokens ({tokens:.0f} loss tokens), "
        f"{jax.devices()[0].platform} x{jax.device_count()}, median of {args.repeats}")
  print(f"{'name':<14}{'first call (s)':>16}{'median (ms)':>14}{'Mtok/s':>10}")
  for r in rows:
    print(f"{r['name']:<14}{r['first_call_s']:>16.3f}{1e3 * r['median_s']:>14.2f}{tokens / r['median_s'] / 1e6:>10.1f}")

  result = {
      "jax": {"version": jax.__version__, "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
              # other jobs on the machine inflate and scatter the timings: compare with care when > cpu_count
              "load_avg_before_after": [load_before, os.getloadavg()]},
      "shape": {"prompts": P, "samples": G, "tokens": T, "loss_tokens": tokens},
      "repeats": args.repeats,
      "results": rows,
  }
  save_result(args.out, result)
  return result


if __name__ == "__main__":
  main()
