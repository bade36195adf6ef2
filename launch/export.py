"""Export a run's policy as a Hugging Face checkpoint (safetensors + config.json + tokenizer files).

  python launch/export.py RUN_DIR --out DIR [--step N] [--dtype float32|bfloat16|float16] [--source HF_DIR]
                          [--family llama|qwen2|qwen3] [--adapter]

Reads RUN_DIR/config.yaml, restores the params of the latest intact checkpoint (or exactly checkpoint --step N) on
one device and writes them with `scalerl_jax.model.hf_export.export_pretrained`. The Hugging Face checkpoint the
run's model was imported from (--source, default the run's model.pretrained) gives the family, special ids and
tokenizer files (a GGUF source: its metadata, and the tokenizer files built from its vocabulary as launch/convert.py
writes them); a run whose model was not imported needs --family. --out may not be (or hold) the source
checkpoint or RUN_DIR. An export without a tokenizer.json (a character-tokenizer run) says so, and why, in a
warning line. A user error prints as `export.py: error: ...` and exits 2.

A run that trained adapters (lora.rank > 0) exports its model with the adapters merged into the base (W + scale A B),
the base rebuilt as the run built it (model.pretrained, or the seed's init; a warm-started base is not rebuilt here)
and checked against the checkpoint's record of it; or, with --adapter, the adapters alone as a PEFT adapter directory
(adapter_config.json + adapter_model.safetensors, scalerl_jax/model/lora_export.py), which needs no base.
"""

import argparse
import logging
import pathlib
import sys

from scalerl_jax.errors import UserError
from scalerl_jax.logs import setup_logging

PROG = "export.py"
log = logging.getLogger("scalerl_jax.launch.export")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog=PROG)
  p.add_argument("run_dir", metavar="RUN_DIR")
  p.add_argument("--out", required=True, metavar="DIR", help="the Hugging Face checkpoint directory to write")
  p.add_argument("--step", type=int, help="export exactly this checkpoint (default: the latest intact one)")
  p.add_argument("--dtype", default="float32", help="weights' dtype on disk: float32, bfloat16 (bf16) or float16")
  p.add_argument("--source", metavar="HF_DIR", help="the Hugging Face checkpoint the run's model was imported from "
                 "(default: the run's model.pretrained)")
  p.add_argument("--family", help="llama, qwen2 or qwen3 (default: --source's model_type)")
  p.add_argument("--adapter", action="store_true", help="a run with adapters (lora.rank > 0): write them alone as "
                 "a PEFT adapter directory instead of the merged model")
  p.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs (jax, orbax, ...)")
  return p.parse_args(argv)


def fail(message: str) -> None:
  sys.stderr.write(f"{PROG}: error: {message}\n")
  raise SystemExit(2)


def run_config(run_dir: pathlib.Path):
  from scalerl_jax.config import load_config
  if not (run_dir / "config.yaml").is_file():
    raise UserError(f"{run_dir / 'config.yaml'}: no such file (is {run_dir} a run directory?)")
  return load_config(run_dir / "config.yaml")


def restore_params(run_dir: pathlib.Path, cfg, step=None, adapters_only: bool = False, source=None):
  """(step, params, policy) of the run's checkpoint, restored on one device. A run with adapters: its adapters on
  their rebuilt base, read from `source` when given (a moved model.pretrained), or, `adapters_only`, the adapters
  alone (None at the base's leaves)."""
  import jax

  from scalerl_jax.mesh import TRAIN_RULES, Layout, make_mesh
  from scalerl_jax.model import lora, make_policy
  from scalerl_jax.run.build import base_record, check_base, checkpointed
  from scalerl_jax.train.checkpoint import RunCheckpointer
  from scalerl_jax.train.state import make_optimizer, restore_target, state_shardings
  from scalerl_jax.types import RunMeta

  ckpt_dir = run_dir / "checkpoints"
  if not ckpt_dir.is_dir() or not any(p.name.isdigit() for p in ckpt_dir.iterdir()):
    raise UserError(f"no checkpoint in {ckpt_dir}")
  policy, optimizer = make_policy(cfg.model, cfg.lora), make_optimizer(cfg.optimizer)
  layout = Layout(make_mesh("data=1,fsdp=1,tensor=1,expert=1", jax.devices()[:1]), TRAIN_RULES)
  target = checkpointed(policy, restore_target(policy, optimizer, state_shardings(policy, optimizer, layout)))
  ckpt = RunCheckpointer(ckpt_dir, cfg.checkpoint.keep)
  try:
    if step is None:
      found = ckpt.restore_latest_intact(target, cfg)
      if found is None:
        raise UserError(f"no checkpoint in {ckpt_dir}")
      step, state, meta = found
    else:
      if step not in ckpt.all_steps():
        raise UserError(f"no checkpoint {step} in {ckpt_dir} (there are: {', '.join(map(str, ckpt.all_steps()))})")
      state, meta = ckpt.restore(target, cfg, step)
  finally:
    ckpt.close()
  if policy.lora is None or adapters_only:
    return step, state.params, policy
  base = rebuilt_base(cfg, layout, source)
  check_base(RunMeta.from_json(meta).base, base_record(cfg, base), ckpt_dir / str(step))
  return step, lora.attach(base, state.params), policy


def rebuilt_base(cfg, layout, source=None):
  """The frozen base a run with adapters trained on, rebuilt as the run built it: model.pretrained's weights (read
  from `source` when given: the checksum check that follows refuses other weights) or the seed's init (a warm
  start is not rerun here: export such a run with --adapter)."""
  import jax

  from scalerl_jax.model import make_policy
  if cfg.model.pretrained:
    from scalerl_jax.model.hf import load_pretrained
    m = cfg.model
    return load_pretrained(source or m.pretrained, dtype=m.param_dtype, mesh=layout.mesh, rules=layout.rules,
                           max_seq_len=m.max_seq_len).params
  if cfg.warm_start.enabled and cfg.data.task != "file":
    raise UserError("the run's adapters sit on its warm start, which export does not rerun: pass --adapter for the "
                    "adapters alone (a PEFT directory)")
  base = make_policy(cfg.model)
  return jax.jit(base.init, out_shardings=layout.shardings(base.logical_axes, base.param_shapes))(
      jax.random.key(cfg.seed))


def main(argv=None) -> int:
  args = parse_args(argv)
  setup_logging(args.verbose)
  from scalerl_jax.model.hf_export import FAMILIES as DENSE, MOE_FAMILIES, check_family, check_out_dir, export_dtype
  from scalerl_jax.model.hf_export import export_pretrained
  from scalerl_jax.data.gguf_vocab import read_vocab
  from scalerl_jax.model.gguf import gguf_path
  from scalerl_jax.model.gguf_convert import export_with_gguf_source
  FAMILIES = DENSE + MOE_FAMILIES
  try:
    dtype = export_dtype(args.dtype)
    if args.family is not None and args.family not in FAMILIES:
      raise UserError(f"--family {args.family!r} is not a family we export (choose {', '.join(FAMILIES)})")
    cfg = run_config(pathlib.Path(args.run_dir))
    source, imported = args.source, cfg.model.pretrained
    if source is None and imported:
      if pathlib.Path(imported).is_dir() or gguf_path(imported) is not None:  # a checkpoint directory or GGUF file
        source = imported
      elif args.family is None:
        raise UserError(f"the run's model.pretrained={imported!r} is not a directory (moved?): pass --source HF_DIR "
                        f"(the checkpoint it was imported from) or --family ({' | '.join(FAMILIES)})")
      else:
        log.warning("model.pretrained=%r is not a directory: no tokenizer files or special ids are exported", imported)
    if args.family is None and source is None:
      raise UserError("the run's model was not imported from a Hugging Face checkpoint (no model.pretrained): pass "
                      f"--family ({' | '.join(FAMILIES)}) or --source HF_DIR")
    if args.family is not None:
      check_family(cfg.model, args.family)  # before the restore: a refusal costs nothing
    check_out_dir(args.out, {"the source checkpoint": source, "the run directory": args.run_dir}, "--out")
    gguf = gguf_path(source) if source is not None else None
    if gguf is not None:  # the tokenizer first: an unsupported one is refused before the restore
      read_vocab(gguf)
    if args.adapter and cfg.lora.rank == 0:
      raise UserError("--adapter: the run trained no adapters (lora.rank = 0)")
    step, params, policy = restore_params(pathlib.Path(args.run_dir), cfg, args.step, adapters_only=args.adapter,
                                          source=source)
    if args.adapter:
      from scalerl_jax.model.lora_export import export_peft
      out = export_peft(params, policy, args.out, base_name=source or cfg.model.pretrained, dtype=dtype,
                        family=args.family or family_of_source(source))
      print(f"exported the adapters of checkpoint {step} of {args.run_dir} to {out} (PEFT, {dtype})")
      return 0
    if policy.lora is not None:
      from scalerl_jax.model.lora_export import merge
      params = merge(params, policy)
    if gguf is not None:
      out = export_with_gguf_source(params, cfg.model, args.out, gguf, dtype=dtype, family=args.family)
    else:
      out = export_pretrained(params, cfg.model, args.out, dtype=dtype, family=args.family, source_dir=source)
  except UserError as e:
    fail(str(e))
  except OSError as e:
    fail(f"cannot write {args.out}: {e.strerror or e}")
  print(f"exported checkpoint {step} of {args.run_dir} to {out} ({dtype})")
  if not (out / "tokenizer.json").is_file():
    print(f"warning: no Hugging Face tokenizer was exported: {no_tokenizer_reason(cfg, source)}")
  return 0


def family_of_source(source):
  """The Hugging Face model_type of a source checkpoint directory (None for none, or a GGUF file: llama)."""
  if source is None or not pathlib.Path(source).is_dir():
    return None
  from scalerl_jax.model.hf import read_json
  return read_json(pathlib.Path(source) / "config.json").get("model_type")


def no_tokenizer_reason(cfg, source) -> str:
  """Why an export holds no tokenizer.json, and what its token ids are."""
  if cfg.data.tokenizer == "char":
    return ("the run used the built-in character tokenizer (data.tokenizer=char), which has no Hugging Face form; "
            "the model's token ids are that vocabulary's (scalerl_jax/data/tokenizer.py), transformers cannot "
            "tokenize for it")
  if source is None and cfg.model.pretrained:
    return f"model.pretrained={cfg.model.pretrained!r} is not a directory (moved?): pass --source HF_DIR"
  if source is None:
    return (f"the run's model was not imported from a checkpoint (no --source): copy its tokenizer "
            f"(data.tokenizer={cfg.data.tokenizer}) beside the weights")
  return f"the source checkpoint {source} holds no tokenizer.json"


if __name__ == "__main__":
  sys.exit(main())
