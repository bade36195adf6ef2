"""Train-step MFU: tokens/s and achieved FLOP/s of the project's jitted RL train step, against the matmul peak
measured in the same process.

    python benchmarks/mfu.py                                  # 36m, 134m, moe on this machine (fp32)
    python benchmarks/mfu.py --configs 36m --steps 5
    python benchmarks/mfu.py --configs 0.5b,moe --dtype bfloat16 --decode   # the GPU script's rows

What runs is the trainer's step (`train.step.make_train_step` over `train.rl_loss.make_rl_loss` with the default
CISPO loss, AdamW from `train.state.make_optimizer`, the state donated) on a TrainBatch built as the trainer's is:
P prompts x G samples, each row a shared prompt of T/4 tokens and a completion of random length up to the rest,
loss weights normalised over the batch. Rows run whole (trainer.shared_prompt=False: every one of B x T token
positions goes through the model); `--shared-prompt` times the trainer's default path instead (each prompt once
per group), whose FLOPs are counted over the positions it runs.

FLOPs (`model.flops_per_token`, the model's analytic count): 3 x forward, forward = 2 x active matmul params (LM
head included) + 4 x layers x Q x H x T/2 per token (QK^T and PV over the mean causal context); elementwise work
and the optimizer are not counted. MFU = achieved / the peak of a 2048^3 jnp.dot in the compute dtype (median of
3, measured after every timed step, median over all). Step time: median of --steps steps after one compile step.

`--decode` adds decode tokens/s of the same configs through the project's Engine (prefill + fused decode of
--decode-slots x --decode-new tokens, no stop tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import statistics
import subprocess
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import mesh as mesh_lib, rl, types
from scalerl_jax.config import InterruptionConfig, LossConfig, ModelConfig, OptimizerConfig, RolloutConfig
from scalerl_jax.model import flops_per_token, make_policy, param_count
from scalerl_jax.train.rl_loss import PromptLayout, make_rl_loss
from scalerl_jax.train.state import init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step

try:
  from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)
except ImportError:  # python -m benchmarks.mfu
  from benchmarks.record import save_result

ROOT = pathlib.Path(__file__).resolve().parents[1]

_DENSE_36M = ModelConfig(vocab_size=8192, hidden=512, intermediate=1536, num_layers=8, num_heads=8, num_kv_heads=8,
                         head_dim=64, rope_theta=1e4, tie_embeddings=False, max_seq_len=512)
# name -> (model, prompts P, samples G, row tokens T): B = P * G rows of T tokens
CONFIGS = {
    "tiny": (ModelConfig(vocab_size=256, hidden=64, intermediate=192, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=16, tie_embeddings=False, max_seq_len=64), 2, 2, 64),
    "tiny_moe": (ModelConfig(family="moe", vocab_size=256, hidden=64, intermediate=192, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=16, tie_embeddings=False, max_seq_len=64, num_experts=4,
                             experts_per_token=2, moe_intermediate=96), 2, 2, 64),
    "36m": (_DENSE_36M, 2, 8, 512),  # 35.7M params, 16 x 512 tokens
    "134m": (ModelConfig(vocab_size=32000, hidden=768, intermediate=2048, num_layers=12, num_heads=12,
                         num_kv_heads=12, head_dim=64, rope_theta=1e4, tie_embeddings=False, max_seq_len=512),
             1, 8, 512),  # 134.1M params, 8 x 512 tokens
    # the 36m's shape with every MLP an MoE of 8 experts of width 768, top-2: active params = the 36m's + router
    "moe": (dataclasses.replace(_DENSE_36M, family="moe", num_experts=8, experts_per_token=2, moe_intermediate=768),
            1, 8, 512),
    # Qwen2.5-0.5B's shape (494M params, tied 151936 vocab, 14 query / 2 KV heads, q/k/v biases): GPU
    "0.5b": (ModelConfig(vocab_size=151936, hidden=896, intermediate=4864, num_layers=24, num_heads=14,
                         num_kv_heads=2, head_dim=64, rope_theta=1e6, qkv_bias=True, tie_embeddings=True,
                         max_seq_len=1024), 2, 8, 512),
}


def machine() -> dict:
  cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
             "unknown")
  dev = jax.devices()[0]
  return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": cpu, "jax": jax.__version__,
          "backend": jax.default_backend(), "device": getattr(dev, "device_kind", str(dev)),
          "devices": jax.device_count(),
          "matmul_precision": str(getattr(jax.config, "jax_default_matmul_precision", "unknown"))}


def uptime() -> str:
  return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def matmul_peak(dtype, n: int = 2048, repeats: int = 7) -> float:
  """FLOP/s of one jitted n^3 jnp.dot in `dtype` (fp32 accumulation for bf16), median of `repeats` (a chain of
  8 dots per timing on accelerators, so launch overhead does not count)."""
  chain = 1 if jax.default_backend() == "cpu" else 8
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype) / n ** 0.5

  @jax.jit
  def run(a, b):
    for _ in range(chain):
      a = jnp.dot(a, b, preferred_element_type=jnp.float32).astype(dtype)
    return a

  jax.block_until_ready(run(a, b))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(run(a, b))
    times.append(time.perf_counter() - t)
  return 2.0 * n ** 3 * chain / statistics.median(times)


def rl_batch(cfg: ModelConfig, P: int, G: int, T: int, seed: int = 0,
             prompt_width: Optional[int] = None) -> tuple[types.TrainBatch, int, int]:
  """A TrainBatch as the trainer builds one, (batch, prompt width L, completion width N): P groups of G rows
  sharing a prompt of up to L tokens (`prompt_width`, default T/4), completions of random length up to N = T - L,
  CISPO inputs (sampler log-probs, advantages, token weights normalised over the batch), MoE routes unrecorded
  (-1)."""
  rng = np.random.default_rng(seed)
  B, L = P * G, prompt_width or T // 4
  N = T - L
  prompt_len = np.repeat(rng.integers(L // 2, L + 1, P), G).astype(np.int32)
  tokens = rng.integers(1, cfg.vocab_size, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  for b in range(B):
    tokens[b, :prompt_len[b]] = tokens[b - b % G, :prompt_len[b]]
    mask[b, prompt_len[b]:prompt_len[b] + rng.integers(N // 2, N + 1)] = 1
  gen = np.where(mask > 0, -rng.uniform(0.5, 3.0, (B, T)), 0).astype(np.float32)
  X = len(cfg.moe_layers)
  routes = np.full((B, T, X, cfg.experts_per_token), -1, np.int16) if X else None
  batch = types.TrainBatch(tokens=tokens, loss_mask=mask, gen_logprobs=gen,
                           advantages=rng.normal(size=B).astype(np.float32), token_weights=mask / mask.sum(),
                           sample_weights=np.full(B, 1 / B, np.float32), prompt_lengths=prompt_len, routes=routes)
  return batch, L, N


def build(cfg: ModelConfig, P: int, G: int, T: int, shared_prompt: bool = False, *, mesh_spec: str = "data=1",
          devices: Optional[Sequence[jax.Device]] = None, params=None, micro_batches: int = 1,
          prompt_width: Optional[int] = None, lora=None):
  """(step, state, batch, positions): the trainer's jitted step on a `mesh_spec` mesh over `devices` (default: one
  device), its initial state (random, or around `params`: a checkpoint's) and a batch on device (`rl_batch`);
  `positions`: token positions the step runs through the model per step. `lora` (a LoraConfig with rank > 0): the
  step trains adapters on the frozen `params` (fresh ones, B = 0, as a run starts), as the job does."""
  policy = make_policy(cfg, lora)
  optimizer = make_optimizer(OptimizerConfig())
  layout = mesh_lib.Layout(mesh_lib.make_mesh(mesh_spec, devices or jax.devices()[:1]), mesh_lib.TRAIN_RULES)
  batch, L, N = rl_batch(cfg, P, G, T, prompt_width=prompt_width)
  B = P * G
  prompt = PromptLayout(G, L, N) if shared_prompt else None
  loss_fn = make_rl_loss(policy, LossConfig(), temperature=1.0, layout=prompt, micro_batches=micro_batches)
  batch_sh = types.TrainBatch.of(rows=layout.batch(1, B), tokens=layout.batch(2, B),
                                 routes=layout.batch(4, B) if batch.routes is not None else None)
  step = make_train_step(loss_fn, optimizer, micro_batches, state_shardings(policy, optimizer, layout), batch_sh,
                         metrics_init=rl.empty_metrics, metrics_combine=rl.accumulate_metrics,
                         micro_batch_block=G if prompt else 1, policy=policy)
  if params is not None and policy.lora is not None:
    params = policy.attach_adapters(params, 0)
  state = init_train_state(policy, optimizer, layout, seed=0, params=params)
  batch = jax.device_put(batch, batch_sh)
  return step, state, batch, prompt.trained_tokens(B) if prompt else B * T


def time_steps(step, state, batch, steps: int, between=None) -> tuple[list[float], float, dict]:
  """Seconds of each of `steps` steps after one compile step, the compile step's seconds, last metrics;
  `between()` runs after each timed step (the peak measurement, so it sees the same machine state)."""
  t = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - t
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t)
    if between is not None:
      between()
  return times, first, jax.device_get(metrics)


def decode_tok_s(cfg: ModelConfig, slots: int, new: int, prompt: int = 64, repeats: int = 3) -> dict:
  """Decode tokens/s of the project's Engine + RolloutDriver: `slots` samples (slots / 8 prompts x 8) of `new`
  tokens after a `prompt`-token prefill, best of `repeats` after a compile run."""
  from scalerl_jax.rollout.driver import RolloutDriver
  from scalerl_jax.rollout.engine import Engine
  cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, prompt + new))
  rollout = RolloutConfig(max_slots=slots, max_prefill_len=prompt, prefill_buckets=(prompt,), max_new_tokens=new,
                          decode_chunk=new, interruption=InterruptionConfig(enabled=False))
  engine = Engine(make_policy(cfg), rollout, mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES))
  params = engine.init_params(0)
  rng = np.random.default_rng(0)
  G = min(8, slots)
  prompts = [types.Prompt(str(i), "", "", rng.integers(1, cfg.vocab_size, prompt - 1).astype(np.int32))
             for i in range(slots // G)]
  driver = RolloutDriver(engine, seed=0)
  run = lambda: driver.generate_all(params, 0, prompts, G)
  groups = run()  # compile
  tokens = sum(len(s.tokens) for g in groups for s in g.samples)
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    run()
    best = min(best, time.perf_counter() - t)
  return {"slots": len(prompts) * G, "prompt_tokens": prompt, "new_tokens": new, "tokens": tokens,
          "best_s": best, "tok_s": tokens / best}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--configs", default="36m,134m,moe", help=f"comma-separated, of {', '.join(CONFIGS)}")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                  help="compute dtype (model.dtype; params stay fp32, the LM head fp32)")
  ap.add_argument("--steps", type=int, default=5, help="timed steps per config after the compile step")
  ap.add_argument("--shared-prompt", action="store_true", help="the trainer's shared-prompt path instead of rows")
  ap.add_argument("--peak-n", type=int, default=2048, help="matrix size of the peak matmul (GPU: 8192)")
  ap.add_argument("--decode", action="store_true", help="also decode tokens/s through the Engine")
  ap.add_argument("--decode-slots", type=int, default=64)
  ap.add_argument("--decode-new", type=int, default=128)
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mfu.json"))
  args = ap.parse_args()
  names = [n.strip() for n in args.configs.split(",") if n.strip()]
  unknown = [n for n in names if n not in CONFIGS]
  if unknown:
    ap.error(f"unknown config(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
  result = {"machine_detail": machine(), "uptime_at_start": uptime(), "dtype": args.dtype, "steps": args.steps,
            "shared_prompt": args.shared_prompt, "flops_convention": "3 x (2 x active matmul params incl. LM head "
            "+ 4 x layers x Q x H x T/2) per token position (model.flops_per_token)", "configs": {}}
  print(f"{result['uptime_at_start']}\n{result['machine_detail']}")
  peaks = [matmul_peak(dtype, args.peak_n)]
  for name in names:
    cfg, P, G, T = CONFIGS[name]
    cfg = dataclasses.replace(cfg, dtype=args.dtype)
    step, state, batch, positions = build(cfg, P, G, T, args.shared_prompt)
    # a peak after every step: the machine's speed drifts with other jobs on its cores
    times, first, metrics = time_steps(step, state, batch, args.steps,
                                       between=lambda: peaks.append(matmul_peak(dtype, args.peak_n, 3)))
    del state  # donated into the steps
    sec = statistics.median(times)
    flops = positions * flops_per_token(cfg, T // 2, backward=True)
    row = {"params": param_count(cfg), "active_params": param_count(cfg, active=True), "rows": P * G,
           "row_tokens": T, "token_positions": positions, "flops_per_step": flops, "step_s_median": sec,
           "step_s_all": times, "compile_step_s": first, "tok_s": P * G * T / sec, "flop_s": flops / sec,
           "loss": float(metrics["loss"]), "skipped": int(metrics["skipped"])}
    if args.decode:
      row["decode"] = decode_tok_s(cfg, args.decode_slots, args.decode_new)
    result["configs"][name] = row
    print(f"  {name}: {sec:.3f} s/step, {row['flop_s'] / 1e9:.1f} GFLOP/s (peak now {peaks[-1] / 1e9:.1f})",
          flush=True)
  peak = statistics.median(peaks)
  result["peak_flop_s"] = {"median": peak, "all": peaks, "matmul": f"{args.peak_n}^3 jnp.dot, {args.dtype}"}
  for row in result["configs"].values():
    row["mfu"] = row["flop_s"] / peak
  result["uptime_at_end"] = uptime()
  print(f"\ntrain step ({'shared prompt' if args.shared_prompt else 'whole rows'}, {args.dtype}); median of "
        f"{args.steps} steps; peak {peak / 1e9:.1f} GFLOP/s (median of {len(peaks)} {args.peak_n}^3 dots between "
        "the steps)")
  print(f"{'config':<9} {'params':>8} {'rows x T':>10} {'step s':>8} {'tok/s':>9} {'GFLOP/s':>9} {'MFU':>7}"
        + (f" {'decode tok/s':>13}" if args.decode else ""))
  for name, r in result["configs"].items():
    dec = f" {r['decode']['tok_s']:>13.0f}" if args.decode else ""
    print(f"{name:<9} {r['params'] / 1e6:>7.1f}M {r['rows']:>4} x {r['row_tokens']:<4} {r['step_s_median']:>8.3f} "
          f"{r['tok_s']:>9.0f} {r['flop_s'] / 1e9:>9.1f} {r['mfu']:>7.1%}{dec}")
  print(f"load: start [{result['uptime_at_start']}] end [{result['uptime_at_end']}]")
  save_result(args.out, result)


if __name__ == "__main__":
  main()
