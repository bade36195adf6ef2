"""Sampler vs trainer log-probs of the same tokens, per matmul precision: the gap the importance ratio sees.

    python benchmarks/logprob_gap.py                        # 36m shape, fp32, precisions default and highest
    python benchmarks/logprob_gap.py --config tiny --precisions default,highest,bf16_3x

The Engine (prefill + fused decode, KV cache) samples completions and records each token's log-prob; the trainer's
`token_logprobs` (one full forward over prompt + completion) then scores the same tokens. Both are traced under
`jax.default_matmul_precision(p)` for each p. On CPU every fp32 dot is exact fp32 whatever p; on GPU "default" may
run fp32 dots in TF32 (and the two sides then disagree by more than their different op order), "highest" in fp32.
The LM head is fp32 at HIGHEST in both (model.fp32_lm_head). Prints max / mean |difference| over the sampled
tokens and writes JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

import mfu  # benchmarks/mfu.py: the configs, machine()
from record import save_result
from scalerl_jax import mesh as mesh_lib, types
from scalerl_jax.config import InterruptionConfig, RolloutConfig
from scalerl_jax.model import make_policy, token_logprobs
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine

ROOT = pathlib.Path(__file__).resolve().parents[1]


def gap(cfg, precision: str, prompts: int, samples: int, prompt_len: int, new: int) -> dict:
  cfg = dataclasses.replace(cfg, dtype="float32", max_seq_len=max(cfg.max_seq_len, prompt_len + new))
  rollout = RolloutConfig(max_slots=prompts * samples, max_prefill_len=prompt_len, prefill_buckets=(prompt_len,),
                          max_new_tokens=new, decode_chunk=new, interruption=InterruptionConfig(enabled=False))
  with jax.default_matmul_precision(precision):
    engine = Engine(make_policy(cfg), rollout, mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES))
    params = engine.init_params(0)
    rng = np.random.default_rng(0)
    ps = [types.Prompt(str(i), "", "", rng.integers(1, cfg.vocab_size, prompt_len).astype(np.int32))
          for i in range(prompts)]
    groups = RolloutDriver(engine, seed=0).generate_all(params, 0, ps, samples)
    rows = [(s.prompt_tokens, s.tokens, s.logprobs) for g in groups for s in g.samples]
    tokens = np.stack([np.concatenate([p, t]) for p, t, _ in rows]).astype(np.int32)
    trainer = jax.jit(lambda p, t: token_logprobs(engine.policy, p, t))(params, jnp.asarray(tokens))
  trainer = np.asarray(trainer)[:, prompt_len:]
  sampler = np.stack([lp for _, _, lp in rows])
  diff = np.abs(trainer - sampler)
  return {"precision": precision, "tokens": int(diff.size), "max_abs": float(diff.max()),
          "mean_abs": float(diff.mean()), "mean_sampler_logprob": float(sampler.mean())}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", default="36m", help=f"one of {', '.join(mfu.CONFIGS)} (run in fp32)")
  ap.add_argument("--precisions", default="default,highest")
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--samples", type=int, default=4)
  ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--new", type=int, default=64)
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "logprob_gap.json"))
  args = ap.parse_args()
  cfg = mfu.CONFIGS[args.config][0]
  result = {"machine_detail": mfu.machine(), "config": args.config, "rows": []}
  print(f"sampler (Engine decode) vs trainer (token_logprobs) log-probs, {args.config}, fp32 compute; "
        f"{args.prompts} x {args.samples} samples of {args.new} tokens")
  print(f"{'precision':<10} {'tokens':>7} {'max |diff|':>12} {'mean |diff|':>12}")
  for p in args.precisions.split(","):
    row = gap(cfg, p, args.prompts, args.samples, args.prompt_len, args.new)
    result["rows"].append(row)
    print(f"{p:<10} {row['tokens']:>7} {row['max_abs']:>12.3e} {row['mean_abs']:>12.3e}", flush=True)
  save_result(args.out, result)


if __name__ == "__main__":
  main()
