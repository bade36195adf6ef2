"""Trainer forward + backward on one RL step batch: full rows against each prompt computed once per group.

    python benchmarks/train_step.py                 # the CPU default's shapes: 64 prompts x 8 samples, 10 + 14 tokens
    python benchmarks/train_step.py --config configs/cpu_default.yaml --repeats 21

Times jax.jit(jax.grad(sum(weights * log-probs))) for `token_logprobs` (every row runs prompt + completion) and for
`completion_logprobs` (the prompt runs once per group, the completions attend to its KV): the two paths the train
step chooses between with `trainer.shared_prompt`. Median of --repeats after a warm-up call; prints a table and
writes JSON with the date, the machine and the command to --out.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import load_config
from scalerl_jax.model import Policy, completion_logprobs, token_logprobs

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def median_seconds(fn, repeats: int) -> float:
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default=str(ROOT / "configs" / "cpu_default.yaml"))
  parser.add_argument("--repeats", type=int, default=11)
  parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_step.json"))
  args = parser.parse_args()
  cfg = load_config(args.config, [])
  P, G = cfg.data.prompts_per_step, cfg.data.samples_per_prompt
  width, N = cfg.rollout.max_prefill_len, cfg.rollout.max_new_tokens
  B, T = P * G, width + N
  policy = Policy(cfg.model)
  params = jax.jit(policy.init)(jax.random.key(0))
  rng = np.random.default_rng(0)
  prompt_len = np.full(B, width - 1, np.int32)  # the addition prompt: BOS + 8 characters
  tokens = rng.integers(2, cfg.model.vocab_size, (B, T)).astype(np.int32)
  for b in range(B):
    tokens[b, :prompt_len[b]] = tokens[b - b % G, :prompt_len[b]]
  cols = prompt_len[:, None] + np.arange(N)
  w_cols = np.where(cols < T, 1.0 / (B * N), 0.0).astype(np.float32)
  w_rows = np.zeros((B, T), np.float32)
  for b in range(B):
    inside = cols[b] < T
    w_rows[b, cols[b][inside]] = w_cols[b][inside]
  tokens, w_rows, w_cols = jnp.asarray(tokens), jnp.asarray(w_rows), jnp.asarray(w_cols)

  full = jax.jit(jax.grad(lambda p: jnp.sum(token_logprobs(policy, p, tokens) * w_rows)))
  shared = jax.jit(jax.grad(lambda p: jnp.sum(
      completion_logprobs(policy, p, tokens, prompt_len, G, width, N)[0] * w_cols)))
  result = {"shape": {"prompts": P, "samples": G, "prompt_width": width, "completion_width": N,
                      "params": sum(x.size for x in jax.tree.leaves(params))},
            "token_positions": {"full_rows": B * T, "shared_prompt": P * width + B * N},
            "seconds_median": {"full_rows": median_seconds(lambda: full(params), args.repeats),
                               "shared_prompt": median_seconds(lambda: shared(params), args.repeats)},
            "repeats": args.repeats}
  sec = result["seconds_median"]
  result["speedup"] = sec["full_rows"] / sec["shared_prompt"]
  print(f"trainer forward + backward, {P} prompts x {G} samples, prompt {width} + completion {N} tokens "
        f"(median of {args.repeats})")
  for name in ("full_rows", "shared_prompt"):
    print(f"  {name:<14} {result['token_positions'][name]:>7} token positions  {sec[name] * 1e3:8.1f} ms")
  print(f"  speed-up {result['speedup']:.2f}x")
  save_result(args.out, result)


if __name__ == "__main__":
  main()
