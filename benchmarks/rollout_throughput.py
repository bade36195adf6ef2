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
import functools
import os
import pathlib
import time

# One XLA CPU device per core (before jax is imported), so a generator mesh can put one data shard of the decode
# slots on each core: XLA:CPU runs the small ops of a decode step on one thread, so one device uses one core.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={os.cpu_count()}").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax import mesh as mesh_lib, types  # noqa: E402
from scalerl_jax.config import InterruptionConfig, ModelConfig, RolloutConfig  # noqa: E402
from scalerl_jax.model.policy import Policy, param_count  # noqa: E402
from scalerl_jax.rollout.driver import RolloutDriver  # noqa: E402
from scalerl_jax.rollout.engine import Engine  # noqa: E402
from scalerl_jax.rollout.sampling import SamplingParams  # noqa: E402

from record import save_result  # noqa: E402  benchmarks/record.py (this script's folder is on sys.path)

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


def make_engine(cfg: ModelConfig, rollout: RolloutConfig, data: int = 1):
  """An engine whose decode slots are split over `data` devices (one data shard each)."""
  mesh = mesh_lib.make_mesh(f"data={data}", jax.devices()[:data], mesh_lib.ROLLOUT_AXES)
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
  """Tokens/s of `generate_all` (prefill, insert, fused decode, host collection) on a generator mesh of one
  device per core (the headline) and on one device. Configurations are timed in interleaved rounds, so drifts
  in the machine's speed hit them alike; each keeps its best round (the median round is reported too)."""
  n_prompts, n_samples, new = 4, 8, 32
  rollout = RolloutConfig(max_slots=n_prompts * n_samples, max_prefill_len=16, prefill_buckets=(16,),
                          max_new_tokens=new, decode_chunk=new, interruption=NO_INTERRUPT)
  rng = np.random.default_rng(0)
  prompts = [types.Prompt(str(i), "", "", rng.integers(1, TINY.vocab_size, 12).astype(np.int32))
             for i in range(n_prompts)]
  cores = min(os.cpu_count(), jax.device_count())
  out = {"params": param_count(TINY), "prompts": n_prompts, "samples": n_samples, "new_tokens": new,
         "generator_mesh": f"data={cores}"}
  runs, reference = {}, None
  for data in sorted({1, cores}):
    engine, params = make_engine(TINY, rollout, data)
    driver = RolloutDriver(engine, seed=0)
    for chunk in (new, 8):
      run = functools.partial(driver.generate_all, params, 0, prompts, n_samples, steps=chunk)
      tokens = [s.tokens for g in run() for s in g.samples]  # compile
      assert sum(map(len, tokens)) == n_prompts * n_samples * new
      reference = tokens if reference is None else reference  # every mesh and chunking samples the same tokens
      assert all(np.array_equal(a, b) for a, b in zip(tokens, reference)), (data, chunk)
      runs[(data, chunk)] = run
  seconds = {key: [] for key in runs}
  for _ in range(repeats):
    for key, run in runs.items():
      seconds[key].append(best_of(run, 1))
  for (data, chunk), times in seconds.items():
    suffix = "" if data == cores else f"_data{data}"
    out[f"engine_tok_s_chunk{chunk}{suffix}"] = n_prompts * n_samples * new / min(times)
    out[f"median_round_tok_s_chunk{chunk}{suffix}"] = n_prompts * n_samples * new / float(np.median(times))
  naive = naive_generate(engine.policy, jax.device_put(params, jax.devices()[0]),
                         np.stack([p.tokens for p in prompts for _ in range(n_samples)]), new, engine.default_sampling)
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


def read_bandwidth(devices, gib: float = 1.0, repeats: int = 5) -> float:
  """Bytes/s of a jitted full reduction over a large array split across `devices` (a pure streaming read; with
  several devices each core streams its own part)."""
  mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
  x = jax.device_put(jnp.ones((int(gib * 2 ** 30) // 4,), jnp.float32),
                     jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  t = best_of(lambda: total(x).block_until_ready(), repeats)
  del x
  return gib * 2 ** 30 / t


def matmul_flops_rate(devices, rows: int, shapes, repeats: int = 5, inner: int = 16) -> float:
  """FLOP/s of jitted fp32 [rows, k] x [k, n] dots (decode's weight matmuls at `rows` slots), over `shapes`,
  with the rows split across `devices` as the engine splits its slots. Each call runs `inner` dots in a loop,
  so dispatch (about 0.3 ms on a 2-device CPU mesh) does not count."""
  mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  flops = seconds = 0.0
  for k, n in shapes:
    a = jax.device_put(jnp.ones((rows, k), jnp.float32), split)
    b = jax.device_put(jnp.ones((k, n), jnp.float32), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    dots = jax.jit(lambda a, b: jax.lax.fori_loop(0, inner, lambda i, acc: acc + jnp.dot(a + acc[:, :1], b)[:, :1],
                                                  jnp.zeros((rows, 1), jnp.float32)))
    dots(a, b).block_until_ready()
    seconds += best_of(lambda: dots(a, b).block_until_ready(), repeats) / inner
    flops += 2.0 * rows * k * n
  return flops / seconds


def decode_step_seconds(data: int, repeats: int):
  """Best time of one decode step of the 36M config with its 64 slots split over `data` devices, and the bytes of
  one weight replica and of the whole KV cache."""
  slots, cache, prompt_len, chunk = 64, 512, 64, 8
  rollout = RolloutConfig(max_slots=slots, max_prefill_len=prompt_len, prefill_buckets=(prompt_len,),
                          max_new_tokens=cache - prompt_len, decode_chunk=chunk, interruption=NO_INTERRUPT)
  engine, params = make_engine(BIG, rollout, data)
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
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  kv_bytes = sum(x.nbytes for x in jax.tree.leaves(state.cache))
  return min(times) / chunk, weight_bytes, kv_bytes, (engine, params, prompts)


def bench_36m(repeats: int) -> dict:
  """Decode step time on a mesh of one device per core (the headline) and on one device, against the bandwidth
  bound: (one weight replica + the whole KV cache) / the best read bandwidth measured here, on one device or on
  all (the larger, so the bound is the stricter one)."""
  cores = min(os.cpu_count(), jax.device_count())
  slots, cache, chunk = 64, 512, 8
  step_s, weight_bytes, kv_bytes, (engine, params, prompts) = decode_step_seconds(cores, repeats)
  step_one = decode_step_seconds(1, repeats)[0] if cores > 1 else step_s
  bw_one, bw_all = read_bandwidth(jax.devices()[:1]), read_bandwidth(jax.devices()[:cores])
  bw = max(bw_one, bw_all)
  bound_s = (weight_bytes + kv_bytes) / bw
  out = {"params": param_count(BIG), "slots": slots, "cache_len": cache, "decode_chunk": chunk,
         "generator_mesh": f"data={cores}", "step_ms": step_s * 1e3, "step_ms_data1": step_one * 1e3,
         "engine_tok_s": slots / step_s, "weight_mb": weight_bytes / 1e6, "kv_cache_mb": kv_bytes / 1e6,
         "read_gb_s_one_device": bw_one / 1e9, "read_gb_s_all_devices": bw_all / 1e9,
         "bound_step_ms": bound_s * 1e3, "fraction_of_bandwidth_bound": bound_s / step_s,
         "fraction_of_bandwidth_bound_data1": bound_s / step_one,
         "flops_per_step_g": 2 * param_count(BIG) * slots / 1e9}
  # At 64 slots the weight matmuls are compute-bound on this CPU, not bandwidth-bound: their FLOPs at the best
  # rate measured for the same dot shapes (all 64 rows on one device, where XLA:CPU's GEMM uses every core, or the
  # rows split across the devices as the engine splits its slots) take about as long as the whole bandwidth
  # bound. XLA:CPU runs a device's ops one after another, so its matmuls and its KV-cache stream do not overlap:
  # compute + KV time is the floor of this design.
  D, F, V = BIG.hidden, BIG.intermediate, BIG.vocab_size
  shapes = [(D, BIG.num_heads * BIG.head_dim), (D, F), (F, D), (D, V)]
  rate_one, rate_all = (matmul_flops_rate(jax.devices()[:n], slots, shapes) for n in (1, cores))
  rate = max(rate_one, rate_all)
  compute_s = 2 * param_count(BIG) * slots / rate
  out.update({"matmul_gflop_s_one_device": rate_one / 1e9, "matmul_gflop_s_rows_split": rate_all / 1e9,
              "compute_bound_step_ms": compute_s * 1e3,
              "kv_stream_ms": kv_bytes / bw * 1e3, "sequential_floor_step_ms": (compute_s + kv_bytes / bw) * 1e3,
              "fraction_of_sequential_floor": (compute_s + kv_bytes / bw) / step_s})
  # Naive baseline: full forward over the whole (prompt + generated) sequence per token; a few steps only.
  naive_new = 4
  naive = naive_generate(engine.policy, jax.device_put(params, jax.devices()[0]), np.stack(prompts), naive_new,
                         engine.default_sampling)
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
    # ~15 ms a round: 200 rounds (~12 s) outlast this VM's slow spells, which last seconds
    results["tiny"] = bench_tiny(10 * args.repeats)
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
