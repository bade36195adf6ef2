"""Rollout throughput: the engine (KV cache, fused multi-step decode, continuous batching) against a naive
generation loop that re-runs the full forward over the whole sequence for every new token.

  tiny  : the Qwen3-shaped 118k-param config (vocab 300, hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV
          heads, head_dim 32, tied embeddings, QK-norm), 4 prompts x 8 samples x 32 new tokens; tokens/s.
  cpu_default: the embedded CPU run's shapes (default model and rollout config), 512 prompts x 8 samples.
  36m   : a ~36M-param config at 64 concurrent slots with a 512-token cache. Decode on this CPU is bandwidth-
          bound, so it is reported against the bandwidth bound: bytes read per decode step (weights + the whole
          KV cache, which dense decode attention reads every step) over the read bandwidth measured in this run.

    python benchmarks/rollout_throughput.py [--only tiny|cpu_default|36m] [--out ...json]

Prints a table and writes JSON. Timings are the best of several repeats (other processes share the 2 cores).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.record import save_result  # noqa: E402
from scalerl_jax import mesh as mesh_lib, types  # noqa: E402
from scalerl_jax.config import InterruptionConfig, ModelConfig, RolloutConfig  # noqa: E402
from scalerl_jax.model.policy import Policy, param_count  # noqa: E402
from scalerl_jax.rollout.driver import RolloutDriver  # noqa: E402
from scalerl_jax.rollout.engine import Engine  # noqa: E402
from scalerl_jax.rollout.sampling import SamplingParams  # noqa: E402

TINY = ModelConfig(vocab_size=300, hidden=64, intermediate=128, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=32, rope_theta=1e6, qk_norm=True, tie_embeddings=True, max_seq_len=64)
BIG = ModelConfig(vocab_size=16384, hidden=512, intermediate=1536, num_layers=8, num_heads=8, num_kv_heads=8,
                  head_dim=64, rope_theta=1e6, qk_norm=True, tie_embeddings=True, max_seq_len=512)
NO_INTERRUPT = InterruptionConfig(enabled=False)


def best_of(fn, repeats: int) -> float:
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def make_engine(cfg: ModelConfig, rollout: RolloutConfig):
  mesh = mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES)
  engine = Engine(Policy(cfg), rollout, mesh)  # no stop tokens: every sample generates max_new_tokens
  return engine, engine.init_params(0)


def naive_generate(policy: Policy, params, prompts_BL: np.ndarray, new_tokens: int, sp: SamplingParams):
  """No cache: each step runs the full forward over the padded sequence and samples at the last position."""
  B, L = prompts_BL.shape
  T = L + new_tokens

  @jax.jit
  def step(params, tokens_BT, t, key):
    logits_BTV = policy.logits(params, policy.forward(params, tokens_BT)[0])
    logits_BV = jax.lax.dynamic_index_in_dim(logits_BTV, t - 1, axis=1, keepdims=False) / sp.temperature
    nxt_B = jax.random.categorical(jax.random.fold_in(key, t), logits_BV).astype(jnp.int32)
    return tokens_BT.at[:, t].set(nxt_B)

  def run():
    tokens_BT = jnp.zeros((B, T), jnp.int32).at[:, :L].set(prompts_BL)
    for t in range(L, T):
      tokens_BT = step(params, tokens_BT, t, jax.random.key(0))
    return jax.block_until_ready(tokens_BT)
  return run


def bench_tiny(repeats: int) -> dict:
  n_prompts, n_samples, new = 4, 8, 32
  rollout = RolloutConfig(max_slots=n_prompts * n_samples, max_prefill_len=16, prefill_buckets=(16,),
                          max_new_tokens=new, decode_chunk=new, interruption=NO_INTERRUPT)
  engine, params = make_engine(TINY, rollout)
  rng = np.random.default_rng(0)
  prompts = [types.Prompt(str(i), "", "", rng.integers(1, TINY.vocab_size, 12).astype(np.int32))
             for i in range(n_prompts)]
  driver = RolloutDriver(engine, seed=0)
  out = {"params": param_count(TINY), "prompts": n_prompts, "samples": n_samples, "new_tokens": new}
  for chunk in (new, 8):
    run = lambda: driver.generate_all(params, 0, prompts, n_samples, steps=chunk)
    groups = run()  # compile
    tokens = sum(len(s.tokens) for g in groups for s in g.samples)
    assert tokens == n_prompts * n_samples * new, tokens
    out[f"engine_tok_s_chunk{chunk}"] = tokens / best_of(run, repeats)
  naive = naive_generate(engine.policy, params, np.stack([p.tokens for p in prompts for _ in range(n_samples)]),
                         new, engine.default_sampling)
  naive()
  out["naive_tok_s"] = n_prompts * n_samples * new / best_of(naive, max(2, repeats // 4))
  return out


def bench_cpu_default(repeats: int) -> dict:
  """The embedded CPU run's shape: default model and rollout config, char-task-like prompts, an evaluation pass
  of 512 prompts x 8 samples (random init: completions run into the interruption / length limits)."""
  cfg, rollout = ModelConfig(), RolloutConfig()
  mesh = mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES)
  engine = Engine(Policy(cfg), rollout, mesh, stop_ids=[18], phrase_ids=[17], end_marker_ids=[17])  # '$', '|'
  params = engine.init_params(0)
  rng = np.random.default_rng(0)
  prompts = [types.Prompt(str(i), "", "", np.concatenate([[1], rng.integers(2, 12, 3), [12], rng.integers(2, 12, 3),
                                                          [16]]).astype(np.int32)) for i in range(512)]
  driver = RolloutDriver(engine, seed=0)
  driver.generate_all(params, 0, prompts[:64], 8)  # compile
  tokens = 0

  def run():
    nonlocal tokens
    tokens = sum(len(s.tokens) for g in driver.generate_all(params, 0, prompts, 8) for s in g.samples)
  t = best_of(run, repeats)
  return {"slots": rollout.max_slots, "decode_chunk": rollout.decode_chunk, "samples": 512 * 8,
          "mean_tokens_per_sample": tokens / (512 * 8), "engine_tok_s": tokens / t, "seconds": t}


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
  """Bytes/s of a jitted full reduction over a large array (a pure streaming read)."""
  x = jnp.ones((int(gib * 2 ** 30) // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  t = best_of(lambda: total(x).block_until_ready(), repeats)
  del x
  return gib * 2 ** 30 / t


def matmul_flops_rate(rows: int, shapes, repeats: int = 10) -> float:
  """FLOP/s of jitted fp32 [rows, k] x [k, n] dots (decode's weight matmuls at `rows` slots), over `shapes`."""
  flops = seconds = 0.0
  for k, n in shapes:
    a, b = jnp.ones((rows, k), jnp.float32), jnp.ones((k, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    seconds += best_of(lambda: dot(a, b).block_until_ready(), repeats)
    flops += 2.0 * rows * k * n
  return flops / seconds


def bench_36m(repeats: int) -> dict:
  slots, cache, prompt_len, chunk = 64, 512, 64, 8
  rollout = RolloutConfig(max_slots=slots, max_prefill_len=prompt_len, prefill_buckets=(prompt_len,),
                          max_new_tokens=cache - prompt_len, decode_chunk=chunk, interruption=NO_INTERRUPT)
  engine, params = make_engine(BIG, rollout)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, BIG.vocab_size, prompt_len).astype(np.int32) for _ in range(slots)]
  state = engine.init_decode_state()
  state = engine.prefill_insert(params, state, prompts, range(slots), range(slots), range(slots), [0] * slots,
                                jax.random.key(0))
  state, res = engine.generate(params, state, 0)  # compile
  jax.block_until_ready(res)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    state, res = engine.generate(params, state, 0)
    jax.block_until_ready(res)
    times.append(time.perf_counter() - t)
  assert bool(np.asarray(res.valid_BN).all())
  step_s = min(times) / chunk
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  kv_bytes = sum(x.nbytes for x in jax.tree.leaves(state.cache))
  bw = read_bandwidth()
  bound_s = (weight_bytes + kv_bytes) / bw
  out = {"params": param_count(BIG), "slots": slots, "cache_len": cache, "decode_chunk": chunk,
         "step_ms": step_s * 1e3, "engine_tok_s": slots / step_s, "weight_mb": weight_bytes / 1e6,
         "kv_cache_mb": kv_bytes / 1e6, "read_gb_s": bw / 1e9, "bound_step_ms": bound_s * 1e3,
         "fraction_of_bandwidth_bound": bound_s / step_s,
         "flops_per_step_g": 2 * param_count(BIG) * slots / 1e9}
  # At 64 slots the weight matmuls are compute-bound on this CPU, not bandwidth-bound: their FLOPs at the rate
  # measured for the same dot shapes take about as long as the whole bandwidth bound. XLA:CPU runs ops one after
  # another, so the matmuls and the KV-cache stream do not overlap: compute + KV time is the floor of this design.
  D, F, V = BIG.hidden, BIG.intermediate, BIG.vocab_size
  rate = matmul_flops_rate(slots, [(D, BIG.num_heads * BIG.head_dim), (D, F), (F, D), (D, V)])
  compute_s = 2 * param_count(BIG) * slots / rate
  out.update({"matmul_gflop_s": rate / 1e9, "compute_bound_step_ms": compute_s * 1e3,
              "kv_stream_ms": kv_bytes / bw * 1e3, "sequential_floor_step_ms": (compute_s + kv_bytes / bw) * 1e3,
              "fraction_of_sequential_floor": (compute_s + kv_bytes / bw) / step_s})
  del state
  # Naive baseline: full forward over the whole (prompt + generated) sequence per token; a few steps only.
  naive_new = 4
  naive = naive_generate(engine.policy, params, np.stack(prompts), naive_new, engine.default_sampling)
  naive()
  out["naive_tok_s_at_len_64"] = slots * naive_new / best_of(naive, 2)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", choices=("tiny", "cpu_default", "36m"))
  ap.add_argument("--repeats", type=int, default=20)
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "rollout_throughput.json"))
  args = ap.parse_args()
  results = {"jax": jax.__version__, "backend": jax.default_backend(), "devices": jax.device_count(),
             "load_average_at_start": os.getloadavg()[0]}  # other processes on the same cores slow every number
  if args.only in (None, "tiny"):
    results["tiny"] = bench_tiny(args.repeats)
  if args.only in (None, "cpu_default"):
    results["cpu_default"] = bench_cpu_default(max(2, args.repeats // 10))
  if args.only in (None, "36m"):
    results["36m"] = bench_36m(max(3, args.repeats // 5))
  print(f"{'config':11} {'metric':32} {'value':>14}")
  for name in ("tiny", "cpu_default", "36m"):
    for k, v in results.get(name, {}).items():
      print(f"{name:11} {k:32} {v:14.4g}" if isinstance(v, float) else f"{name:11} {k:32} {v:>14}")
  goals = {"tiny engine_tok_s >= 100k": results.get("tiny", {}).get("engine_tok_s_chunk32", 0) >= 1e5,
           "36m fraction_of_bandwidth_bound >= 0.85":
           results.get("36m", {}).get("fraction_of_bandwidth_bound", 0) >= 0.85}
  for goal, met in goals.items():
    print(f"goal {goal}: {'met' if met else 'NOT met'}")
  results["goals_met"] = goals
  results["load_average_at_end"] = os.getloadavg()[0]
  print(f"load average (1 min) at start {results['load_average_at_start']:.1f}, at end "
        f"{results['load_average_at_end']:.1f} on {os.cpu_count()} cores")
  save_result(args.out, results)


if __name__ == "__main__":
  main()
