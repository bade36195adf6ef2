"""Export a run's policy as a Hugging Face checkpoint (safetensors + config.json + tokenizer files).

  python launch/export.py RUN_DIR --out DIR [--step N] [--dtype float32|bfloat16|float16] [--source HF_DIR]
                          [--family llama|qwen2|qwen3]

Reads RUN_DIR/config.yaml, restores the params of the latest intact checkpoint (or exactly checkpoint --step N) on
one device and writes them with `scalerl_jax.model.hf_export.export_pretrained`. The Hugging Face checkpoint the
run's model was imported from (--source, default the run's model.pretrained) gives the family, special ids and
tokenizer files (a GGUF source: its metadata, and the tokenizer files built from its vocabulary as launch/convert.py
writes them); a run whose model was not imported needs --family. --out may not be (or hold) the source
checkpoint or RUN_DIR. An export without a tokenizer.json (a character-tokenizer run) says so, and why, in a
warning line. A user error prints as `export.py: error: ...` and exits 2.
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


def restore_params(run_dir: pathlib.Path, cfg, step=None):
  """(step, params) of the run's checkpoint, restored on one device."""
  import jax

  from scalerl_jax.mesh import TRAIN_RULES, Layout, make_mesh
  from scalerl_jax.model import make_policy
  from scalerl_jax.train.checkpoint import RunCheckpointer
  from scalerl_jax.train.state import make_optimizer, restore_target, state_shardings

  ckpt_dir = run_dir / "checkpoints"
  if not ckpt_dir.is_dir() or not any(p.name.isdigit() for p in ckpt_dir.iterdir()):
    raise UserError(f"no checkpoint in {ckpt_dir}")
  policy, optimizer = make_policy(cfg.model), make_optimizer(cfg.optimizer)
  layout = Layout(make_mesh("data=1,fsdp=1,tensor=1,expert=1", jax.devices()[:1]), TRAIN_RULES)
  target = restore_target(policy, optimizer, state_shardings(policy, optimizer, layout))
  ckpt = RunCheckpointer(ckpt_dir, cfg.checkpoint.keep)
  try:
    if step is None:
      found = ckpt.restore_latest_intact(target, cfg)
      if found is None:
        raise UserError(f"no checkpoint in {ckpt_dir}")
      step, state, _ = found
    else:
      if step not in ckpt.all_steps():
        raise UserError(f"no checkpoint {step} in {ckpt_dir} (there are: {', '.join(map(str, ckpt.all_steps()))})")
      state, _ = ckpt.restore(target, cfg, step)
  finally:
    ckpt.close()
  return step, state.params


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
    step, params = restore_params(pathlib.Path(args.run_dir), cfg, args.step)
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
