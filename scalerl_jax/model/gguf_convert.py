"""A GGUF file -> a Hugging Face checkpoint directory (launch/convert.py): the weights dequantized (llama's Q/K rows
un-permuted) and written by hf_export.export_pretrained (config.json as transformers 5 writes it, model.safetensors),
the vocabulary as tokenizer.json (data/gguf_vocab.py), tokenizer_config.json with the chat template and the special
tokens, and generation_config.json with the special ids. `load_pretrained` and `tokenizer_from_pretrained` read the
directory back as they read the GGUF: the same params bit for bit (float32 on disk), special ids, token ids and
chat template.
"""

from __future__ import annotations

import json
import os
import pathlib

from scalerl_jax.model.gguf import GGUFError, gguf_path, open_gguf
from scalerl_jax.model.hf import load_pretrained
from scalerl_jax.model.hf_export import check_out_dir, export_dtype, export_pretrained

CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "generation_config.json")


def _write_json(path: pathlib.Path, value) -> None:
  path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = "float32") -> pathlib.Path:
  """Write GGUF file `path` (or the one GGUF of a directory) as a Hugging Face checkpoint `out_dir` with weights in
  `dtype` (float32 keeps every dequantized value; bfloat16 / float16 round them). The tokenizer is read first, so
  an unsupported one is refused before any weight is dequantized; `out_dir` may not be or hold the GGUF file."""
  from scalerl_jax.data.gguf_vocab import read_vocab, tokenizer_json

  dtype = export_dtype(dtype)
  g = gguf_path(path)
  if g is None:
    raise GGUFError(f"{path}: not a GGUF file (a *.gguf file, or a directory holding one, is expected)")
  check_out_dir(out_dir, {"the GGUF file": g}, "--out")
  ckpt = open_gguf(g)
  vocab = read_vocab(g, ckpt.meta)
  model = load_pretrained(g)
  out = export_pretrained(model.params, model.cfg, out_dir, dtype=dtype, family=ckpt.model_type,
                          source_config=ckpt.config)
  (out / "tokenizer.json").write_text(tokenizer_json(vocab), encoding="utf-8")
  _write_json(out / "tokenizer_config.json", vocab.tokenizer_config())
  ids = {k: ckpt.config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in ckpt.config}
  _write_json(out / "generation_config.json", ids)
  return out
