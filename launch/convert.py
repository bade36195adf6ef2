"""Convert a GGUF checkpoint (llama.cpp's format) into a Hugging Face checkpoint directory.

  python launch/convert.py IN.gguf --out DIR [--dtype float32|bfloat16|float16]

Dequantizes every tensor (F32, F16, BF16, Q8_0, Q5_0/1, Q4_0/1, Q2_K..Q6_K; llama's Q/K rows un-permuted) and writes
config.json, model.safetensors, tokenizer.json, tokenizer_config.json (with the chat template) and
generation_config.json (`scalerl_jax.model.gguf_convert.convert_gguf`): a directory that model.pretrained,
data.tokenizer and transformers read. (model.pretrained and data.tokenizer also take the .gguf file itself.)
A user error prints as `convert.py: error: ...` and exits 2.
"""

import argparse
import sys

from scalerl_jax.errors import UserError

PROG = "convert.py"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog=PROG)
  p.add_argument("gguf", metavar="IN.gguf", help="the GGUF file (or a directory holding exactly one)")
  p.add_argument("--out", required=True, metavar="DIR", help="the Hugging Face checkpoint directory to write")
  p.add_argument("--dtype", default="float32", help="weights' dtype on disk: float32 (exact), bfloat16 or float16")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  from scalerl_jax.model.gguf_convert import convert_gguf
  try:
    out = convert_gguf(args.gguf, args.out, dtype=args.dtype)
  except UserError as e:
    sys.stderr.write(f"{PROG}: error: {e}\n")
    return 2
  except OSError as e:
    sys.stderr.write(f"{PROG}: error: cannot write {args.out}: {e.strerror or e}\n")
    return 2
  print(f"converted {args.gguf} to {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
