"""A GGUF file -> a Hugging Face checkpoint directory (launch/convert.py): the weights dequantized (llama's Q/K rows
un-permuted) and written by hf_export.export_pretrained (config.json as transformers 5 writes it, model.safetensors),
the vocabulary as tokenizer.json (data/gguf_vocab.py), tokenizer_config.json with the chat template and the special
tokens, and generation_config.json with the special ids. `load_pretrained` and `tokenizer_from_pretrained` read the
directory back as they read the GGUF: the same params bit for bit (float32 on disk), special ids, token ids and
chat template. `export_with_gguf_source` is the same export for a run whose model.pretrained was a GGUF file
(launch/export.py).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Optional

import jax

from scalerl_jax.model.gguf import GGUFError, gguf_path, open_gguf
from scalerl_jax.model.hf import load_pretrained
from scalerl_jax.model.hf_export import check_out_dir, export_dtype, export_pretrained


def _write_json(path: pathlib.Path, value) -> None:
  path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def export_with_gguf_source(params, model_cfg, out_dir: str | os.PathLike, source: str | os.PathLike, *,
                            dtype: str = "float32", family: Optional[str] = None) -> pathlib.Path:
  """export_pretrained of `params` (a `model_cfg` policy's) whose source checkpoint is GGUF file `source`: its
  metadata stands for the source's config.json (family, special ids, max_position_embeddings; checked against
  `model_cfg`) and its vocabulary gives the tokenizer files. The tokenizer is read before anything is written, so
  an unsupported one is refused first."""
  from scalerl_jax.data.gguf_vocab import read_vocab, tokenizer_json

  g = gguf_path(source)
  if g is None:
    raise GGUFError(f"{source}: not a GGUF file (a *.gguf file, or a directory holding one, is expected)")
  check_out_dir(out_dir, {"the GGUF file": g}, "--out")
  ckpt = open_gguf(g)
  vocab = read_vocab(g, ckpt.meta)
  out = export_pretrained(params, model_cfg, out_dir, dtype=export_dtype(dtype), family=family or ckpt.model_type,
                          source_config=ckpt.config)
  if jax.process_index() == 0:
    (out / "tokenizer.json").write_text(tokenizer_json(vocab), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", vocab.tokenizer_config())
    _write_json(out / "generation_config.json",
                {k: ckpt.config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in ckpt.config})
  return out


def convert_gguf(path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = "float32") -> pathlib.Path:
  """Write GGUF file `path` (or the one GGUF of a directory) as a Hugging Face checkpoint `out_dir` with weights in
  `dtype` (float32 keeps every dequantized value; bfloat16 / float16 round them). Unsupported tokenizers and an
  `out_dir` that is or holds the GGUF file are refused before any weight is dequantized."""
  from scalerl_jax.data.gguf_vocab import read_vocab

  dtype = export_dtype(dtype)
  g = gguf_path(path)
  if g is None:
    raise GGUFError(f"{path}: not a GGUF file (a *.gguf file, or a directory holding one, is expected)")
  check_out_dir(out_dir, {"the GGUF file": g}, "--out")
  read_vocab(g)  # refusals first
  model = load_pretrained(g)
  return export_with_gguf_source(model.params, model.cfg, out_dir, g, dtype=dtype)
