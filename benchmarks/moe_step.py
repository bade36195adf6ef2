"""MoE against the dense model of the same active size, on CPU: decode tokens/s, train-step tokens/s, and the
expert FFN alone, for both dispatches (model.moe_dispatch = ragged | dense).

    python benchmarks/moe_step.py                      # the default small shape, ~2 minutes on 2 cores
    python benchmarks/moe_step.py --rounds 11 --out /tmp/moe_step.json

Variants (one shape: vocab 512, hidden 128, 2 layers, 4 heads / 2 KV heads of 32, tied embeddings):
  dense        SwiGLU of width k * F = 512
  moe_ragged   E = 8 experts of width F = 256, top-k = 2, model.moe_dispatch=ragged (sort + jax.lax.ragged_dot)
  moe_dense    the same MoE, model.moe_dispatch=dense (every expert on every token, one-hot combine)
The MoE's active parameters equal the dense model's plus its router (D * E per layer).

  decode : `RolloutDriver.generate_all` on an `Engine` over one device (prefill, insert, one fused 32-step decode
           call, host collection), 4 prompts x 8 samples x 32 new tokens, as benchmarks/rollout_throughput.py.
  train  : jax.jit(jax.grad(sum(weights * token_logprobs))) on 32 rows x 48 tokens, as benchmarks/train_step.py.
  ffn    : the expert layer alone (`moe.dispatch_ragged` / `moe.dispatch_dense` / a dense SwiGLU of width k * F)
           on 2048 tokens at E = 4, 8, 16 (k = 2): forward time, and the FLOPs XLA's cost analysis counts in the
           compiled program, over the active expert FLOPs 2 * 3 * U * k * D * F.

Each measurement runs its variants in interleaved rounds (A B C A B C ...), so a slow spell of the shared machine
hits them alike; the first round is a warm-up and is discarded; medians are reported, with ratios to dense.

On CPU, jax lowers `jax.lax.ragged_dot` with its generic rule (`_ragged_dot_general_impl`; the grouped-GEMM
lowerings are registered for GPU and TPU only): the [A, D] rows are masked into an [E, A, D] array and contracted
over (E, D) by one dense dot, so every assignment is multiplied by all E experts' weights. The ragged path then
costs E times the active expert FLOPs (k times the dense one-hot dispatch, which costs E / k times); the `ffn`
rows test that prediction against XLA's FLOP count and against the clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import pathlib
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import mesh as mesh_lib, types
from scalerl_jax.config import InterruptionConfig, ModelConfig, RolloutConfig
from scalerl_jax.model import flops_per_token, make_policy, param_count, token_logprobs
from scalerl_jax.model.moe import dispatch_dense, dispatch_ragged
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine

try:
  from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)
except ImportError:  # python -m benchmarks.moe_step
  from benchmarks.record import save_result

ROOT = pathlib.Path(__file__).resolve().parents[1]
E, K, F = 8, 2, 256
BASE = ModelConfig(vocab_size=512, hidden=128, intermediate=K * F, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=32, rope_theta=1e4, tie_embeddings=True, max_seq_len=64)
MOE = dataclasses.replace(BASE, family="moe", num_experts=E, experts_per_token=K, moe_intermediate=F)
VARIANTS = {"dense": BASE, "moe_ragged": dataclasses.replace(MOE, moe_dispatch="ragged"),
            "moe_dense": dataclasses.replace(MOE, moe_dispatch="dense")}


def machine() -> dict:
  model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown")
  return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model, "jax": jax.__version__,
          "backend": jax.default_backend(), "devices": jax.device_count()}


def uptime() -> str:
  return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def interleaved(runs: dict, rounds: int) -> dict:
  """Seconds of each run per round, rounds interleaved across runs; round 0 (warm-up) is dropped."""
  seconds = {name: [] for name in runs}
  for r in range(rounds + 1):
    for name, run in runs.items():
      t = time.perf_counter()
      run()
      if r:
        seconds[name].append(time.perf_counter() - t)
  return seconds


def summary(seconds: dict, work: float, unit: str) -> dict:
  """Median per run, `work / median` as `unit`, and each run's speed over dense's."""
  med = {name: statistics.median(s) for name, s in seconds.items()}
  out = {name: {"median_s": m, unit: work / m, "min_s": min(seconds[name]), "max_s": max(seconds[name])}
         for name, m in med.items()}
  for name in out:
    out[name]["speed_vs_dense"] = med["dense"] / med[name]
  return out


def decode_runs(n_prompts: int = 4, n_samples: int = 8, new: int = 32) -> tuple[dict, int]:
  rollout = RolloutConfig(max_slots=n_prompts * n_samples, max_prefill_len=16, prefill_buckets=(16,),
                          max_new_tokens=new, decode_chunk=new, interruption=InterruptionConfig(enabled=False))
  mesh = mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES)
  rng = np.random.default_rng(0)
  prompts = [types.Prompt(str(i), "", "", rng.integers(1, BASE.vocab_size, 12).astype(np.int32))
             for i in range(n_prompts)]
  runs = {}
  for name, cfg in VARIANTS.items():
    engine = Engine(make_policy(cfg), rollout, mesh)  # no stop tokens: every sample runs to max_new_tokens
    params = engine.init_params(0)
    run = functools.partial(RolloutDriver(engine, seed=0).generate_all, params, 0, prompts, n_samples)
    groups = run()  # compile
    assert sum(len(s.tokens) for g in groups for s in g.samples) == n_prompts * n_samples * new, name
    runs[name] = run
  return runs, n_prompts * n_samples * new


def train_runs(rows: int = 32, width: int = 48) -> tuple[dict, int, dict]:
  """Runs, token positions per run, and XLA's FLOPs of each compiled step over dense's."""
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(1, BASE.vocab_size, (rows, width)).astype(np.int32))
  w = jnp.asarray(rng.normal(size=(rows, width)).astype(np.float32) / (rows * width))
  runs, flops = {}, {}
  for name, cfg in VARIANTS.items():
    policy = make_policy(cfg)
    params = jax.jit(policy.init)(jax.random.key(0))
    grad = jax.jit(jax.grad(lambda p, policy=policy: jnp.sum(token_logprobs(policy, p, tokens) * w)))
    compiled = grad.lower(params).compile()
    cost = compiled.cost_analysis()
    flops[name] = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
    jax.block_until_ready(compiled(params))
    runs[name] = lambda compiled=compiled, params=params: jax.block_until_ready(compiled(params))
  return runs, rows * width, {name: f / flops["dense"] for name, f in flops.items()}


def ffn_runs(experts: int, tokens: int = 2048) -> tuple[dict, dict]:
  """The expert layer alone at E = `experts`: runs, and XLA's FLOPs per run over the active expert FLOPs."""
  D = BASE.hidden
  rng = np.random.default_rng(experts)
  x = jnp.asarray(rng.normal(size=(tokens, D)).astype(np.float32))
  ids = jnp.asarray(np.stack([rng.permutation(experts)[:K] for _ in range(tokens)]).astype(np.int32))
  gates = jnp.full((tokens, K), 1.0 / K, jnp.float32)
  gate, up = (jnp.asarray(rng.normal(size=(experts, D, F)).astype(np.float32) * D ** -0.5) for _ in range(2))
  down = jnp.asarray(rng.normal(size=(experts, F, D)).astype(np.float32) * F ** -0.5)
  wg, wu = (jnp.asarray(rng.normal(size=(D, K * F)).astype(np.float32) * D ** -0.5) for _ in range(2))
  wd = jnp.asarray(rng.normal(size=(K * F, D)).astype(np.float32) * F ** -0.5)

  def swiglu(x, wg, wu, wd):
    return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd

  calls = {"dense": (swiglu, (x, wg, wu, wd)),
           "moe_ragged": (dispatch_ragged, (x, ids, gates, gate, up, down)),
           "moe_dense": (dispatch_dense, (x, ids, gates, gate, up, down))}
  active = 2.0 * 3 * tokens * K * D * F
  runs, flops = {}, {}
  for name, (fn, args) in calls.items():
    compiled = jax.jit(fn).lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops[name] = float(cost["flops"]) / active
    jax.block_until_ready(compiled(*args))
    runs[name] = lambda compiled=compiled, args=args: jax.block_until_ready(compiled(*args))
  np.testing.assert_allclose(np.asarray(calls["moe_ragged"][0](*calls["moe_ragged"][1])),
                             np.asarray(calls["moe_dense"][0](*calls["moe_dense"][1])), rtol=2e-4, atol=2e-4)
  return runs, flops


def ragged_dot_lowering() -> dict:
  """How this backend lowers one `jax.lax.ragged_dot` ([A, D] rows in E groups times [E, D, F]): whether a
  ragged-dot op survives into StableHLO, and the dot_general lines it becomes."""
  A, D, n = 16, 8, 4
  text = jax.jit(jax.lax.ragged_dot).lower(jnp.ones((A, D)), jnp.ones((n, D, 6)),
                                           jnp.full((n,), A // n, jnp.int32)).as_text()
  dots = [line.split("=", 1)[1].strip() for line in text.splitlines() if "dot_general" in line]
  return {"groups": n, "rows": A, "ragged_dot_op_in_stablehlo": "chlo.ragged_dot" in text, "dot_generals": dots}


def flops_bound_speed(context: int) -> dict:
  """Speed over dense if time followed matmul FLOPs: the analytic forward FLOPs per token (`flops_per_token`,
  active experts only) with the expert matmuls 2 * 3 * D * k * F per MoE layer multiplied by what each dispatch
  runs on CPU: E for ragged (masked dot over all experts), E / k for the one-hot dispatch."""
  dense = flops_per_token(BASE, context)
  expert = 2.0 * 3 * BASE.hidden * K * F * BASE.num_layers
  router = 2.0 * BASE.hidden * E * BASE.num_layers
  return {"dense": 1.0, "moe_ragged": dense / (dense + router + (E - 1) * expert),
          "moe_dense": dense / (dense + router + (E / K - 1) * expert)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=21, help="timed rounds per measurement (after one warm-up)")
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "moe_step.json"))
  args = ap.parse_args()
  t0 = time.perf_counter()
  result = {"machine_detail": machine(), "uptime_at_start": uptime(), "rounds": args.rounds,
            "shape": {"dense": dataclasses.asdict(BASE), "experts": E, "experts_per_token": K, "expert_width": F,
                      "params": {n: param_count(c) for n, c in VARIANTS.items()},
                      "active_params": {n: param_count(c, active=True) for n, c in VARIANTS.items()}}}
  print(f"{uptime()}\n{result['machine_detail']}")
  runs, work = decode_runs()
  result["decode"] = summary(interleaved(runs, args.rounds), work, "tok_s")
  for name, speed in flops_bound_speed(12 + 16).items():  # mean context: 12 prompt tokens + half of 32 new
    result["decode"][name]["flops_bound_speed"] = speed
  runs, work, xla = train_runs()
  result["train"] = summary(interleaved(runs, args.rounds), work, "tok_s")
  for name, speed in flops_bound_speed(24).items():  # 48-token rows: mean context 24
    result["train"][name].update(flops_bound_speed=speed, xla_flops_over_dense=xla[name])
  result["ffn"] = {}
  for experts in (4, 8, 16):
    runs, flops = ffn_runs(experts)
    out = summary(interleaved(runs, args.rounds), 2048, "tok_s")
    for name in out:
      out[name]["xla_flops_over_active"] = flops[name]
    out["predicted_ragged_over_dense_time"] = experts  # E x the active expert FLOPs, if the FLOPs set the time
    result["ffn"][f"E{experts}"] = out
  result["ragged_dot_lowering"] = lowering = ragged_dot_lowering()
  # the claim to test (scalerl_jax/model/moe.py's docstring): on CPU the ragged path costs E / k x the expert FLOPs
  per_e = {key: t["moe_ragged"]["xla_flops_over_active"] / t["predicted_ragged_over_dense_time"]
           for key, t in result["ffn"].items()}  # ~1 when the cost is E x, ~1/k when it is E / k x
  time_per_e = {key: t["moe_ragged"]["median_s"] / t["dense"]["median_s"] / t["predicted_ragged_over_dense_time"]
                for key, t in result["ffn"].items()}
  result["claim_ragged_costs_E_over_k"] = {
      "xla_flops_over_E_times_active": per_e, "time_over_E_times_dense": time_per_e,
      "verdict": ("refuted: the ragged path costs E x the active expert FLOPs (k x the one-hot dispatch)"
                  if all(abs(v - 1) < abs(v - 1 / K) for v in per_e.values()) else
                  "confirmed: E / k x" if all(abs(v - 1 / K) < abs(v - 1) for v in per_e.values()) else "mixed")}
  result["uptime_at_end"] = uptime()
  result["seconds_total"] = time.perf_counter() - t0

  print(f"\nmedian of {args.rounds} interleaved rounds (warm-up discarded); speed = dense median / variant median;\n"
        "FLOPs-bound speed: what the speed would be if time followed the matmul FLOPs each path runs on CPU "
        "(decode, train: analytic; ffn: XLA's count);\nXLA FLOPs ratio: XLA's cost analysis of the compiled "
        "program, over the dense model's step (train) or over the active expert FLOPs 6 U k D F (ffn)")
  print(f"{'measure':<10} {'variant':<11} {'median ms':>10} {'tok/s':>10} {'speed vs dense':>15} "
        f"{'FLOPs-bound speed':>18} {'XLA FLOPs ratio':>19}")
  rows = [("decode", result["decode"]), ("train", result["train"])]
  rows += [(f"ffn {k}", v) for k, v in result["ffn"].items()]
  for measure, table in rows:
    for name in VARIANTS:
      r = table[name]
      bound = (table["dense"]["xla_flops_over_active"] / r["xla_flops_over_active"] if "xla_flops_over_active" in r
               else r["flops_bound_speed"])
      xla = r.get("xla_flops_over_active", r.get("xla_flops_over_dense"))
      extra = f" {bound:>18.3f}" + (f" {xla:>19.2f}" if xla is not None else "")
      print(f"{measure:<10} {name:<11} {r['median_s'] * 1e3:>10.2f} {r['tok_s']:>10.0f} "
            f"{r['speed_vs_dense']:>15.3f}{extra}")
  for key, table in result["ffn"].items():
    e = table["predicted_ragged_over_dense_time"]
    measured = table["moe_ragged"]["median_s"] / table["dense"]["median_s"]
    print(f"ffn {key}: ragged / dense SwiGLU time {measured:.2f} (E = {e}: FLOPs predict {e}); "
          f"XLA counts {table['moe_ragged']['xla_flops_over_active']:.2f}x the active FLOPs for ragged, "
          f"{table['moe_dense']['xla_flops_over_active']:.2f}x for the one-hot dispatch (E / k = {e / K:g})")
  print(f"ragged_dot lowering on {jax.default_backend()}: ragged-dot op in StableHLO: "
        f"{lowering['ragged_dot_op_in_stablehlo']}; {lowering['rows']} rows x {lowering['groups']} groups become "
        f"{'; '.join(lowering['dot_generals'])}")
  claim = result["claim_ragged_costs_E_over_k"]
  print("claim: XLA:CPU lowers jax.lax.ragged_dot to a masked dense dot over all E experts, so the ragged path "
        f"costs about E / k x the expert FLOPs -> {claim['verdict']}; XLA FLOPs / (E x active) = "
        + ", ".join(f"{k} {v:.2f}" for k, v in claim["xla_flops_over_E_times_active"].items())
        + "; time / (E x dense SwiGLU time) = "
        + ", ".join(f"{k} {v:.2f}" for k, v in claim["time_over_E_times_dense"].items()))
  print(f"load: start [{result['uptime_at_start']}] end [{result['uptime_at_end']}]; "
        f"{result['seconds_total']:.0f} s in all")
  save_result(args.out, result)


if __name__ == "__main__":
  main()
