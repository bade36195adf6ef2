"""Rollout throughput: the engine (KV cache, fused multi-step decode, continuous batching) against a naive
generation loop that re-runs the full forward over the whole sequence for every new token.

  tiny  : the Qwen3-shaped 118k-param config (vocab 300, hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV
          heads, head_dim 32, tied embeddings, QK-norm), 4 prompts x 8 samples x 32 new tokens; tokens/s.
  cpu_default: the embedded CPU run's shapes (default model and rollout config), 512 prompts x 8 samples.
  36m   : a ~36M-param config at 64 concurrent slots with a 512-token cache. At 64 slots decode on this CPU is
          not bandwidth-bound: its weight matmuls take about as long as the whole bandwidth bound, and XLA:CPU runs
          a device's ops one after another. So the step is reported against the sequential floor measured in the
          same run (weight matmuls at the GEMM time measured for exactly those shapes + the KV cache's bytes at
          the measured streaming bandwidth), for an fp32 and a bf16 KV cache (rollout.kv_cache_dtype), with the
          bf16 cache's log-prob error against the fp32 one on the same tokens and a profile of where a step goes.

    python benchmarks/rollout_throughput.py [--only tiny|cpu_default|36m] [--no-profile] [--out ...json]

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
from scalerl_jax.model.layers import LayerCache  # noqa: E402
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


def read_seconds(devices, gib: float = 1.0, repeats: int = 5) -> list[float]:
  """Seconds of each of `repeats` jitted full reductions over a `gib` GiB fp32 array split across `devices` (a pure
  streaming read; with several devices each core streams its own part), after one warm-up call."""
  mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
  x = jax.device_put(jnp.ones((int(gib * 2 ** 30) // 4,), jnp.float32),
                     jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  times = [best_of(lambda: total(x).block_until_ready(), 1) for _ in range(repeats)]
  del x
  return times


def read_bandwidth(devices, gib: float = 1.0, repeats: int = 5) -> float:
  """Bytes/s of the fastest of `read_seconds`' reductions."""
  return gib * 2 ** 30 / min(read_seconds(devices, gib, repeats))


def matmul_seconds(devices, rows: int, k: int, n: int, repeats: int = 5, inner: int = 16) -> float:
  """Best seconds of one jitted fp32 [rows, k] x [k, n] dot (a decode weight matmul at `rows` slots), with the
  rows split across `devices` as the engine splits its slots. Each call runs `inner` dots in a loop, so dispatch
  (about 0.3 ms on a 2-device CPU mesh) does not count."""
  mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
  on = lambda *spec: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
  a = jax.device_put(jnp.ones((rows, k), jnp.float32), on("data"))
  b = jax.device_put(jnp.ones((k, n), jnp.float32), on())
  dots = jax.jit(lambda a, b: jax.lax.fori_loop(0, inner, lambda i, acc: acc + jnp.dot(a + acc[:, :1], b)[:, :1],
                                                jnp.zeros((rows, 1), jnp.float32)))
  dots(a, b).block_until_ready()
  return best_of(lambda: dots(a, b).block_until_ready(), repeats) / inner


def weight_matmuls(cfg: ModelConfig) -> dict:
  """{(k, n): count} of the weight matmuls of one decode step of a dense model (q, k, v, o, gate, up, down per
  layer, then the LM head)."""
  D, F, V, L = cfg.hidden, cfg.intermediate, cfg.vocab_size, cfg.num_layers
  QH, KH = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  counts = {}
  for shape, n in (((D, QH), L), ((D, KH), 2 * L), ((QH, D), L), ((D, F), 2 * L), ((F, D), L), ((D, V), 1)):
    counts[shape] = counts.get(shape, 0) + n
  return counts


SLOTS_36M, CACHE_36M, PROMPT_36M, CHUNK_36M = 64, 512, 64, 8


def decode_engine(data: int, kv_cache_dtype: str = "model"):
  """The 36M config's engine with 64 slots (a 512-token cache) split over `data` devices, its params, the 64-token
  prompts and a decode state holding them, compiled (one generate call has run)."""
  rollout = RolloutConfig(max_slots=SLOTS_36M, max_prefill_len=PROMPT_36M, prefill_buckets=(PROMPT_36M,),
                          max_new_tokens=CACHE_36M - PROMPT_36M, decode_chunk=CHUNK_36M, interruption=NO_INTERRUPT,
                          kv_cache_dtype=kv_cache_dtype)
  engine, params = make_engine(BIG, rollout, data)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, BIG.vocab_size, PROMPT_36M).astype(np.int32) for _ in range(SLOTS_36M)]
  slots = range(SLOTS_36M)
  state = engine.prefill_insert(params, engine.init_decode_state(), prompts, slots, slots, slots, [0] * SLOTS_36M,
                                jax.random.key(0))
  state, res = engine.generate(params, state, 0)  # compile
  jax.block_until_ready(res)
  return engine, params, prompts, state, res


def decode_step_times(variants: dict, rounds: int) -> dict:
  """({name: [seconds per decode step, one per round]}, {name: its decode state now}) of `variants` ({name:
  decode_engine(...) tuple}), timed in interleaved rounds of one `generate` call (8 steps) each, so drifts in the
  machine's speed hit them alike."""
  states = {name: v[3] for name, v in variants.items()}
  times = {name: [] for name in variants}
  for _ in range(rounds):
    for name, (engine, params, *_rest) in variants.items():
      t = time.perf_counter()
      states[name], res = engine.generate(params, states[name], 0)
      jax.block_until_ready(res)
      times[name].append((time.perf_counter() - t) / CHUNK_36M)
      assert bool(np.asarray(res.valid_BN).all())
  return times, states


def cached_logprobs(policy: Policy, params, tokens_BT, prompt_len: int, kv_cache_dtype: str):
  """log p(tokens[:, t] | tokens[:, :t]) for t >= prompt_len, decoding one token per step through a KV cache
  stored in `kv_cache_dtype`: the engine's decode path (prefill, cache write and read, fp32 LM head) with the
  tokens given instead of sampled, so two cache dtypes score the same tokens."""
  B, T = tokens_BT.shape
  L = prompt_len - 1  # the prefill holds the KV of positions < L; the last prompt token is decode's first input
  _, prefix = policy.forward(params, tokens_BT[:, :L])
  cache = [LayerCache(c.k_BKHS.at[..., :L].set(p.k_BKHS.astype(c.k_BKHS.dtype)),
                      c.v_BKSH.at[:, :, :L].set(p.v_BKSH.astype(c.v_BKSH.dtype)))
           for c, p in zip(policy.init_cache(B, T, kv_cache_dtype), prefix)]

  def step(cache, t):
    h_B1D, cache = policy.forward(params, tokens_BT[:, t][:, None], jnp.full((B, 1), t, jnp.int32), cache)
    logp_BV = jax.nn.log_softmax(policy.logits(params, h_B1D)[:, 0].astype(jnp.float32), axis=-1)
    return cache, jnp.take_along_axis(logp_BV, tokens_BT[:, t + 1][:, None], axis=-1)[:, 0]
  _, logp_TB = jax.lax.scan(step, cache, jnp.arange(L, T - 1))
  return logp_TB.T


def bf16_cache_logprob_error(engine: Engine, params, prompts, new_tokens: int = 64) -> dict:
  """Log-prob error of a bf16 KV cache against the fp32 one on the same tokens: `new_tokens` tokens per slot
  sampled by `engine` (fp32 cache, temperature 1), scored by `cached_logprobs` with each cache dtype."""
  slots = range(len(prompts))
  state = engine.prefill_insert(params, engine.init_decode_state(), prompts, slots, slots, slots,
                                [1] * len(prompts), jax.random.key(1))
  tokens, logprobs = [], []
  for _ in range(min(new_tokens, engine.cfg.max_new_tokens) // engine.cfg.decode_chunk):
    state, res = engine.generate(params, state, 0)
    res = jax.device_get(res)
    assert res.valid_BN.all()
    tokens.append(res.tokens_BN)
    logprobs.append(res.logprobs_BN)
  tokens_BT = jnp.asarray(np.concatenate([np.stack(prompts)] + tokens, axis=1))
  one = jax.devices()[0]
  score = jax.jit(cached_logprobs, static_argnums=(0, 3, 4))
  p1 = jax.device_put(params, one)
  fp32, bf16 = (np.asarray(score(engine.policy, p1, jax.device_put(tokens_BT, one), len(prompts[0]), dt))
                for dt in ("float32", "bfloat16"))
  err = np.abs(bf16 - fp32)
  return {"logprob_tokens": int(err.size), "bf16_cache_logprob_err_max": float(err.max()),
          "bf16_cache_logprob_err_mean": float(err.mean()),
          "fp32_scorer_vs_engine_err_max": float(np.abs(fp32 - np.concatenate(logprobs, axis=1)).max()),
          "mean_logprob": float(fp32.mean())}


def _op_categories(hlo: str) -> dict:
  """{HLO instruction name: where its time goes} for a compiled module's text. Read off the structure, since
  layout passes can drop the metadata of the attention dots: a batched `dot` (or one named by attention's einsum)
  is attention (one [J, H] x [H, S] or [J, S] x [S, H] per row and KV head: the cache read), another fusion
  holding a dot is a weight matmul (the LM head's is fused with log-softmax's max), one holding a scatter is the
  cache update; the rest by their jax op name."""
  import re
  bodies = dict(re.findall(r"\n(%[\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, flags=re.S))
  out = {}
  for m in re.finditer(r"\n\s*(?:ROOT )?%([\w.\-]+) = \S+ ([\w\-]+)\(([^\n]*)", hlo):
    name, opcode, rest = m.groups()
    op_name = (re.search(r'op_name="([^"]*)"', rest) or re.search("", "")).group(1) if "op_name" in rest else ""
    calls = re.search(r"calls=(%[\w.\-]+)", rest)
    body = bodies.get(calls.group(1), "") if calls else ""
    if (opcode == "dot" and "lhs_batch_dims" in rest) or "CJH,CHS->CJS" in op_name or "CJS,CSH->CJH" in op_name:
      out[name] = "attention dots (QK and PV: the cache read)"
    elif " scatter(" in body or opcode == "scatter":
      out[name] = "cache update scatter"
    elif " dot(" in body or opcode == "dot":
      out[name] = "sampling" if "_inverse_cdf" in op_name or "sampling" in op_name else "weight matmuls (incl. LM head)"
    elif any(k in op_name for k in ("uniform", "threefry", "fold_in")):
      out[name] = "random numbers (once per call)"
    elif any(k in op_name for k in ("log_softmax", "_pad", "take_along_axis", "_inverse_cdf", "sampling")):
      out[name] = "sampling"
    elif any(k in op_name for k in ("softmax", "_where", "reduce_max", "exp")):
      out[name] = "attention softmax / mask"
    elif opcode not in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional"):
      out[name] = "other (norms, RoPE, residuals, bookkeeping)"
  return out


def decode_profile(engine: Engine, params, state, calls: int = 3) -> dict:
  """ms per decode step by category, from a jax.profiler trace of `calls` generate calls (op events summed over
  threads; tracing inflates small ops, so compare shares, not the sum with the untraced step time)."""
  import collections
  import glob
  import tempfile
  hlo = engine._generate.lower(params, state, np.int32(0), steps=engine.cfg.decode_chunk,
                               sampling=engine.default_sampling).compile().as_text()
  category = _op_categories(hlo)
  with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d)
    for _ in range(calls):
      state, res = engine.generate(params, state, 0)
      jax.block_until_ready(res)
    jax.profiler.stop_trace()
    trace = jax.profiler.ProfileData.from_file(glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
  ns = collections.Counter()
  for plane in trace.planes:
    for line in plane.lines:
      for ev in line.events:
        if ev.name in category:
          ns[category[ev.name]] += ev.duration_ns
  steps = calls * engine.cfg.decode_chunk
  return {f"profile_ms_{k}": v / steps / 1e6 for k, v in ns.most_common()}, state


def bench_36m(repeats: int, profile: bool = True) -> dict:
  """Decode step time of the 36M config (64 slots, 512-token cache) against the sequential floor measured in the
  same run: the weight matmuls at the GEMM time measured for exactly those shapes (64 rows on one device, or split
  over the devices as the engine splits its slots: the faster) + the KV cache's bytes over the streaming read
  bandwidth (one device or all: the faster). XLA:CPU runs a device's ops one after another, so matmuls and the
  cache stream add up. fp32 and bf16 caches, on a mesh of one device per core and on one device, interleaved."""
  cores = min(os.cpu_count(), jax.device_count())
  variants = {f"{dt}_data{d}": decode_engine(d, dt) for dt in ("float32", "bfloat16") for d in sorted({cores, 1})}
  times, states = decode_step_times(variants, repeats)
  engine, params, prompts = variants[f"float32_data{cores}"][:3]
  out = {"params": param_count(BIG), "slots": SLOTS_36M, "cache_len": CACHE_36M, "decode_chunk": CHUNK_36M,
         "generator_mesh": f"data={cores}", "rounds": repeats}
  bw_one, bw_all = read_bandwidth(jax.devices()[:1]), read_bandwidth(jax.devices()[:cores])
  bw = max(bw_one, bw_all)
  compute_s = 0.0
  for (k, n), count in weight_matmuls(BIG).items():
    t = min(matmul_seconds(jax.devices()[:d], SLOTS_36M, k, n) for d in sorted({1, cores}))
    compute_s += count * t
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  out.update({"weight_mb": weight_bytes / 1e6, "read_gb_s_one_device": bw_one / 1e9,
              "read_gb_s_all_devices": bw_all / 1e9, "weight_matmul_ms": compute_s * 1e3,
              "weight_matmul_gflop_s": 2 * param_count(BIG) * SLOTS_36M / compute_s / 1e9})
  for name, v in variants.items():
    kv_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(v[0].init_decode_state).cache))
    step, median = min(times[name]), float(np.median(times[name]))
    floor = compute_s + kv_bytes / bw
    out.update({f"{name}_step_ms": step * 1e3, f"{name}_median_step_ms": median * 1e3,
                f"{name}_kv_cache_mb": kv_bytes / 1e6, f"{name}_kv_stream_ms": kv_bytes / bw * 1e3,
                f"{name}_sequential_floor_ms": floor * 1e3, f"{name}_fraction_of_floor": floor / step,
                f"{name}_fraction_of_floor_median": floor / median,
                f"{name}_fraction_of_bandwidth_bound": (weight_bytes + kv_bytes) / bw / step,
                f"{name}_tok_s": SLOTS_36M / step})
  out.update(bf16_cache_logprob_error(engine, params, prompts))
  if profile:  # where a step's time goes, for the headline fp32 engine and on one device
    for name in sorted({f"float32_data{cores}", "float32_data1"}):
      e, p, _pr, _s, _r = variants[name]
      prof, states[name] = decode_profile(e, p, states[name])
      out.update({f"{name}_{k}": v for k, v in prof.items()})
  # Naive baseline: full forward over the whole (prompt + generated) sequence per token; a few steps only.
  naive_new = 4
  naive = naive_generate(engine.policy, jax.device_put(params, jax.devices()[0]), np.stack(prompts), naive_new,
                         engine.default_sampling)
  naive()
  out["naive_tok_s_at_len_64"] = SLOTS_36M * naive_new / best_of(naive, 2)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", choices=("tiny", "cpu_default", "36m"))
  ap.add_argument("--repeats", type=int, default=20)
  ap.add_argument("--no-profile", action="store_true", help="skip the 36m decode profile (jax.profiler trace)")
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
    results["36m"] = bench_36m(max(3, args.repeats), profile=not args.no_profile)
  print(f"{'config':11} {'metric':56} {'value':>14}")
  for name in ("tiny", "cpu_default", "36m"):
    for k, v in results.get(name, {}).items():
      print(f"{name:11} {k:56} {v:14.4g}" if isinstance(v, float) else f"{name:11} {k:56} {v:>14}")
  headline = f"float32_data{min(os.cpu_count(), jax.device_count())}"
  goals = {"tiny engine_tok_s >= 250k": results.get("tiny", {}).get("engine_tok_s_chunk32", 0) >= 2.5e5,
           "36m fraction_of_sequential_floor >= 0.85":
           results.get("36m", {}).get(f"{headline}_fraction_of_floor", 0) >= 0.85}
  for goal, met in goals.items():
    print(f"goal {goal}: {'met' if met else 'NOT met'}")
  results["goals_met"] = goals
  results["load_average_at_end"] = os.getloadavg()[0]
  print(f"load average (1 min) at start {results['load_average_at_start']:.1f}, at end "
        f"{results['load_average_at_end']:.1f} on {os.cpu_count()} cores")
  save_result(args.out, results)


if __name__ == "__main__":
  main()
