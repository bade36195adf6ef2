"""Hugging Face checkpoints out: our params -> safetensors with transformers' tensor names, a `config.json` that
transformers 5 loads for the family (llama / qwen2 / qwen3; qwen3_moe / mixtral for model.family=moe), and the
tokenizer files of the checkpoint it came from.

The names, transposes and reshapes are `hf.hf_name_map` run backwards (one table for both directions): our param
is `stored.reshape(split).transpose(perm)`, so the stored tensor is `ours.transpose(argsort(perm))
.reshape(stored_shape)` (an expert weight [E, ...]: one tensor per expert, `ours[e]` each). Experts are written in
the per-expert layout of the Hub checkpoints (`mlp.experts.{e}.gate_proj` / `up_proj` / `down_proj` for qwen3_moe,
`block_sparse_moe.experts.{e}.w1` / `w3` / `w2` for mixtral), what transformers' save_pretrained writes and every
other tool loads, never transformers 5's fused in-memory layout. `load_pretrained(export_pretrained(params, ...))`
gives back the same params bit for bit (fp32 on disk; a bf16 / fp16 export is the params rounded to nearest even).

config.json is written in transformers 5's spelling (what `save_pretrained` writes; the fixtures' config.json):
rope in `rope_parameters` (with `rope_theta` inside, no top-level `rope_theta` / `rope_scaling`), `dtype`, and
`num_local_experts` for the expert count of both MoE families. Differences from what transformers writes for the
same model: no `transformers_version`; bos / eos / pad ids only when the source checkpoint's config.json has them;
`head_dim` for qwen2 only when it is not hidden / heads; transformers' training-only MoE keys
(`router_aux_loss_coef`, `router_jitter_noise`) are the source's, else transformers' defaults.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
from typing import Any, Optional

import jax
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from scalerl_jax.config import ModelConfig
from scalerl_jax.errors import UserError
from scalerl_jax.model.hf import FAMILIES, MOE_FAMILIES, hf_model_config, hf_name_map, read_json

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16"}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
# what each family's transformers class computes, as our ModelConfig's keys (check_family)
REQUIRES: dict[str, tuple[tuple[str, Any], ...]] = {
    "llama": (("family", "dense"), ("qkv_bias", False), ("qk_norm", False)),
    "qwen2": (("family", "dense"), ("qkv_bias", True), ("qk_norm", False)),
    "qwen3": (("family", "dense"), ("qkv_bias", False), ("qk_norm", True)),
    "qwen3_moe": (("family", "moe"), ("qkv_bias", False), ("qk_norm", True), ("shared_expert_intermediate", 0)),
    "mixtral": (("family", "moe"), ("qkv_bias", False), ("qk_norm", False), ("shared_expert_intermediate", 0),
                ("norm_topk_prob", True), ("decoder_sparse_step", 1), ("mlp_only_layers", ())),
}
# transformers' defaults for its training-only MoE keys (kept from the source config.json when it has them)
MOE_TRAINING_KEYS = {"qwen3_moe": {"router_aux_loss_coef": 0.001},
                     "mixtral": {"router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0}}
# copied from source_dir when present (the tokenizer, its chat template, generation defaults)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                   "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt")
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
MAX_SHARD_BYTES = 4 << 30


class HFExportError(UserError, ValueError):
  """Params we cannot export as the requested Hugging Face family; the message names the setting."""


def export_dtype(dtype: str) -> str:
  """The canonical name of an export dtype (float32 / bfloat16 / float16; fp32, bf16, fp16 accepted)."""
  name = DTYPE_ALIASES.get(dtype, dtype)
  if name not in DTYPES:
    raise HFExportError(f"dtype={dtype!r} is not an export dtype (choose float32, bfloat16 or float16)")
  return name


def check_family(cfg: ModelConfig, family: str) -> None:
  """HFExportError unless `family`'s transformers class computes exactly the model `cfg` describes."""
  if family not in FAMILIES + MOE_FAMILIES:
    raise HFExportError(f"family={family!r} is not a Hugging Face family we export "
                        f"(choose {', '.join(FAMILIES + MOE_FAMILIES)})")
  fits = [f for f, req in REQUIRES.items() if all(getattr(cfg, k) == v for k, v in req)]
  for key, want in REQUIRES[family]:
    have = getattr(cfg, key)
    if have != want:
      raise HFExportError(f"model.{key}={have} but {family} has {key}={want}"
                          + (f" (this model exports as {fits[0]})" if fits else " (no family we export fits)"))


def check_out_dir(out: str | os.PathLike, protected: dict[str, Any], key: str = "out_dir") -> None:
  """HFExportError naming `key` and the path when `out` is, or holds, one of `protected` ({what: path or None}):
  an export there would overwrite it (the source checkpoint's fp32 weights with bf16 ones, silently)."""
  o = pathlib.Path(out).expanduser().resolve()
  for what, path in protected.items():
    if path is None:
      continue
    p = pathlib.Path(path).expanduser().resolve()
    if o == p or o in p.parents:
      raise HFExportError(f"{key} {out} {'is' if o == p else 'holds'} {what} {path}: an export there would "
                          "overwrite it; write to another directory")


def _file_mode() -> int:
  """The mode a new file gets here (0o666 less the umask): safetensors writes its files 0600."""
  umask = os.umask(0)
  os.umask(umask)
  return 0o666 & ~umask


def hf_config(cfg: ModelConfig, family: str, *, dtype: str = "float32",
              source: Optional[dict] = None) -> dict[str, Any]:
  """The config.json dict for `cfg` as `family` (transformers 5 spelling). `source`: the config.json of the
  checkpoint the params came from (its special ids and max_position_embeddings are kept)."""
  check_family(cfg, family)
  source = source or {}
  rope: dict[str, Any] = {"rope_theta": float(cfg.rope_theta), "rope_type": "default"}
  if cfg.rope_scaling == "llama3":
    rope.update(rope_type="llama3", factor=float(cfg.rope_factor), low_freq_factor=float(cfg.rope_low_freq_factor),
                high_freq_factor=float(cfg.rope_high_freq_factor),
                original_max_position_embeddings=int(cfg.rope_original_max_positions))
  out: dict[str, Any] = {
      "architectures": [ARCHITECTURES[family]], "model_type": family, "attention_dropout": 0.0,
      "dtype": export_dtype(dtype), "hidden_act": "silu", "hidden_size": cfg.hidden, "initializer_range": 0.02,
      "intermediate_size": cfg.intermediate,
      "max_position_embeddings": int(source.get("max_position_embeddings") or cfg.max_seq_len),
      "num_attention_heads": cfg.num_heads, "num_hidden_layers": cfg.num_layers,
      "num_key_value_heads": cfg.num_kv_heads, "rms_norm_eps": float(cfg.norm_eps), "rope_parameters": rope,
      "tie_word_embeddings": bool(cfg.tie_embeddings), "use_cache": True, "vocab_size": cfg.vocab_size,
      "head_dim": cfg.head_dim}
  if family in MOE_FAMILIES:
    out.update(num_experts_per_tok=cfg.experts_per_token, num_local_experts=cfg.num_experts,
               output_router_logits=False, sliding_window=None,
               **{k: source.get(k, v) for k, v in MOE_TRAINING_KEYS[family].items()})
  if family == "mixtral":  # every layer MoE: intermediate_size is the experts' width
    out.update(intermediate_size=cfg.expert_width)
  elif family == "qwen3_moe":
    out.update(attention_bias=False, decoder_sparse_step=cfg.decoder_sparse_step,
               mlp_only_layers=list(cfg.mlp_only_layers), moe_intermediate_size=cfg.expert_width,
               norm_topk_prob=bool(cfg.norm_topk_prob), use_sliding_window=False)
  elif family == "llama":
    out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
  else:  # Qwen2 / Qwen3: full attention in every layer
    out.update(layer_types=["full_attention"] * cfg.num_layers, max_window_layers=28, sliding_window=None,
               use_sliding_window=False)
    if family == "qwen3":
      out["attention_bias"] = False
    elif cfg.head_dim * cfg.num_heads == cfg.hidden:
      del out["head_dim"]  # Qwen2Config has no head_dim key; hidden / heads is its default
  out.update({k: source[k] for k in SPECIAL_IDS if source.get(k) is not None})
  return out


def _host(x) -> np.ndarray:
  """The whole array on this host (every process takes part when it is spread over several)."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _check_source(cfg: ModelConfig, source: dict, where: pathlib.Path) -> None:
  theirs = hf_model_config(source)
  keys = ("family", "vocab_size", "hidden", "intermediate", "num_layers", "num_heads", "num_kv_heads", "head_dim",
          "tie_embeddings", "num_experts", "experts_per_token", "expert_width", "moe_layers")
  if cfg.family == theirs.family == "moe" and len(cfg.moe_layers) == cfg.num_layers:
    keys = tuple(k for k in keys if k != "intermediate")  # no dense layer uses it (mixtral writes the expert width)
  diff = [f"{k}: {getattr(theirs, k)} there, {getattr(cfg, k)} here" for k in keys
          if getattr(theirs, k) != getattr(cfg, k)]
  if diff:
    raise HFExportError(f"{where}: does not describe these params ({'; '.join(diff)})")


def export_pretrained(params: Any, model_cfg: ModelConfig, out_dir: str | os.PathLike, *, dtype: str = "float32",
                      family: Optional[str] = None, source_dir: Optional[str | os.PathLike] = None,
                      max_shard_bytes: int = MAX_SHARD_BYTES, source_config: Optional[dict] = None) -> pathlib.Path:
  """Write `params` (the tree `make_policy(model_cfg).param_shapes` describes; host or device arrays, sharded or
  not) as a Hugging Face checkpoint directory `out_dir` that transformers and `load_pretrained` read.

  `family`: llama, qwen2, qwen3, qwen3_moe or mixtral (default: source_dir's model_type). `dtype`: the weights'
  dtype on disk. `source_dir`: the checkpoint the params were imported from; its tokenizer files are copied.
  Weights go into model.safetensors, or model-0000i-of-0000N.safetensors + model.safetensors.index.json past
  `max_shard_bytes`, every file with the mode the umask gives. `out_dir` may not be (or hold) `source_dir`.
  `source_config`: the source's config.json as a dict when there is no source_dir (a GGUF file's metadata,
  model/gguf_convert.py), used as source_dir's would be. Each tensor is gathered to host numpy on its own; process 0
  writes. Returns `out_dir`."""
  dtype = export_dtype(dtype)
  out = pathlib.Path(out_dir)
  source, src = {}, None
  if source_dir is not None:
    src = pathlib.Path(source_dir)
    if not src.is_dir():
      raise HFExportError(f"{src}: no such source checkpoint directory")
    check_out_dir(out, {"the source checkpoint": src})
    source = read_json(src / "config.json")
    _check_source(model_cfg, source, src / "config.json")
  elif source_config is not None:
    source = dict(source_config)
    _check_source(model_cfg, source, "source_config")
  if family is None:
    if not source:
      raise HFExportError(f"the Hugging Face family is unknown: pass family= ({', '.join(FAMILIES + MOE_FAMILIES)}) "
                          "or source_dir=")
    family = source.get("model_type")
  elif source and source.get("model_type") != family:
    raise HFExportError(f"family={family!r} but {src / 'config.json' if src else 'source_config'} has "
                        f"model_type={source.get('model_type')!r}")
  config = hf_config(model_cfg, family, dtype=dtype, source=source)
  names = hf_name_map(model_cfg, family)
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  keys = [jax.tree_util.keystr(p) for p, _ in leaves]
  if sorted(keys) != sorted(names):
    missing, extra = sorted(set(names) - set(keys)), sorted(set(keys) - set(names))
    raise HFExportError(f"params do not match model_cfg: missing {missing[:3]}, unexpected {extra[:3]}")
  itemsize = np.dtype(DTYPES[dtype]).itemsize
  files, size = [[]], 0  # plan the shards from the shapes, so every file's name knows N
  for key, x in zip(keys, (x for _, x in leaves)):
    nbytes = math.prod(x.shape) * itemsize
    if files[-1] and size + nbytes > max_shard_bytes:
      files.append([])
      size = 0
    files[-1].append((key, x))
    size += nbytes
  writer = jax.process_index() == 0
  if writer:
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
      old.unlink(missing_ok=True)  # an earlier export's weights (a stale index would name them)
  n = len(files)
  weight_map, total = {}, 0
  for i, group in enumerate(files):
    fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    tensors = {}
    for key, x in group:
      spec = names[key]
      if tuple(x.shape) != spec.shape:
        raise HFExportError(f"param {key} has shape {list(x.shape)}, model_cfg implies {list(spec.shape)}")
      host = _host(x)
      for name, ours in zip(spec.names, host if spec.experts else [host]):  # an expert weight: one tensor each
        stored = ours.transpose(np.argsort(spec.perm)).reshape(spec.stored_shape)
        tensors[name] = np.ascontiguousarray(stored.astype(DTYPES[dtype]))
        weight_map[name] = fname
        total += tensors[name].nbytes
    if writer:
      save_file(tensors, str(out / fname), metadata={"format": "pt"})
      os.chmod(out / fname, _file_mode())  # as readable as config.json and the tokenizer files
  if not writer:
    return out
  if n > 1:
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
  (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
  if src is not None:
    for name in TOKENIZER_FILES:
      if (src / name).is_file() and (src / name).resolve() != (out / name).resolve():
        shutil.copyfile(src / name, out / name)
  return out
