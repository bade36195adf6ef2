"""GGUF checkpoints in (llama.cpp's one-file format): the metadata -> a config.json dict -> `ModelConfig`, the tensors
dequantized to float32 under their Hugging Face names (what `hf.load_pretrained` places), and the special ids.

Architectures (`general.architecture`): llama (Llama 2 / 3, SmolLM / SmolLM2, ...), qwen2 (q/k/v biases) and qwen3
(QK-norm), the dense families hf.py loads; anything else, a MoE (`<arch>.expert_count`), a rope scaling type or
Llama 3.1's per-dimension rope factors (`rope_freqs.weight`) is a GGUFError naming the file and the key or tensor.

Tensor types (`TYPES`), dequantized by the gguf package (`gguf.quants.dequantize`, llama.cpp's own reference code
in numpy): F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0, Q4_1 and the k-quants Q2_K .. Q6_K. Others (IQ*, TQ*, MXFP4,
integer and F64 tensors) are refused naming the tensor and its type.

Layout. GGML's ne0 is the fastest dim, so a weight of ne = [in, out] reads as numpy [out, in], torch's nn.Linear
layout: every tensor has its Hugging Face shape. llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel) permutes
the rows of the llama architecture's attn_q / attn_k within each head, from the rotate-half order that transformers
rotates (dims i and i + H/2 form a pair) to adjacent pairs (2i, 2i + 1) that GGML's "normal" rope mode rotates:
row 2i + s of a head is Hugging Face row s * H/2 + i (`permute`; `unpermute` undoes it). qwen2 / qwen3 use GGML's
NeoX rope mode, which is rotate-half: their rows are stored unpermuted.

  GGUF tensor                    Hugging Face tensor (L. = model.layers.{i}.)
  token_embd.weight              model.embed_tokens.weight
  output_norm.weight             model.norm.weight
  output.weight                  lm_head.weight (absent: tied embeddings)
  blk.{i}.attn_norm.weight       L.input_layernorm.weight
  blk.{i}.attn_q|k|v.weight      L.self_attn.q|k|v_proj.weight (q, k un-permuted for llama)
  blk.{i}.attn_q|k|v.bias        L.self_attn.q|k|v_proj.bias (qwen2)
  blk.{i}.attn_q|k_norm.weight   L.self_attn.q|k_norm.weight (qwen3)
  blk.{i}.attn_output.weight     L.self_attn.o_proj.weight
  blk.{i}.ffn_norm.weight        L.post_attention_layernorm.weight
  blk.{i}.ffn_gate|up|down.weight  L.mlp.gate|up|down_proj.weight

Hyperparameters (`<arch>.` keys): block_count, embedding_length, feed_forward_length, attention.head_count(_kv),
attention.key_length (head_dim; default embedding_length / head_count), rope.dimension_count (must be head_dim),
rope.freq_base, attention.layer_norm_rms_epsilon, context_length (max_position_embeddings); the vocabulary size is
the token list's length (`tokenizer.ggml.tokens`; `<arch>.vocab_size` must agree when present). Special ids:
tokenizer.ggml.bos_token_id, eos_token_id (+ eot / eom ids as further EOS ids), padding_token_id.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from typing import Any, Optional

import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.model.hf import HFCheckpointError, SpecialIds, hf_model_config

ARCHITECTURES = ("llama", "qwen2", "qwen3")
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
BLOCK_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
               "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
               "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
               "attn_v.bias": "self_attn.v_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
               "attn_k_norm.weight": "self_attn.k_norm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
               "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
_REQUIRED = object()


class GGUFError(HFCheckpointError):
  """A GGUF file we cannot load; the message names the file and the key, tensor or value."""


def gguf_path(path: str | os.PathLike) -> Optional[pathlib.Path]:
  """`path` as a GGUF file: a `*.gguf` file, or a directory without config.json holding exactly one (several:
  GGUFError listing them); None for anything else (a Hugging Face checkpoint directory)."""
  p = pathlib.Path(path).expanduser()
  if p.is_file():
    return p if p.suffix.lower() == ".gguf" else None
  if not p.is_dir() or (p / "config.json").exists():
    return None
  found = sorted(p.glob("*.gguf"))
  if len(found) > 1:
    raise GGUFError(f"{p}: holds {len(found)} GGUF files ({', '.join(f.name for f in found)}): name the one to load")
  return found[0] if found else None


def permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's row order of a llama attn_q / attn_k (rows [heads * H, ...]) from the Hugging Face order: within a
  head, row 2i + s takes row s * H/2 + i (the converter's direction; tools/make_gguf_fixture.py writes with it)."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """The Hugging Face row order of a llama attn_q / attn_k read from a GGUF: `permute` undone."""
  return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Slice:
  """The part of safetensors' `get_slice` that hf.py's block reader uses: indexing the whole stored tensor."""

  def __init__(self, read):
    self._read = read

  def __getitem__(self, index):
    return self._read()[index]


@dataclasses.dataclass
class GGUFCheckpoint:
  """An open GGUF file: `meta` (every metadata key), `config` (config.json's keys in transformers' spelling, what
  the converter writes), `cfg`, `ids` and the tensors by Hugging Face name. `get_slice(hf_name)` serves
  hf.load_pretrained's block reader; each tensor is dequantized (and un-permuted) once, kept until `close`."""
  path: pathlib.Path
  arch: str
  meta: dict[str, Any]
  config: dict[str, Any]
  cfg: ModelConfig
  ids: SpecialIds
  tensors: dict[str, Any]  # Hugging Face name -> gguf ReaderTensor
  gguf_names: dict[str, str]  # Hugging Face name -> GGUF name
  _cache: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  @property
  def model_type(self) -> str:
    return self.arch

  def array(self, hf_name: str) -> np.ndarray:
    """The float32 tensor `hf_name` in the Hugging Face layout (dequantized; llama's q / k rows un-permuted)."""
    if hf_name not in self._cache:
      t = self.tensors[hf_name]
      import gguf
      try:
        x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
      except Exception as e:  # a short file, a bad block
        raise GGUFError(f"{self.path}: tensor {t.name!r} ({t.tensor_type.name}) could not be read: {e}") from None
      x = x.reshape(self.shape(hf_name))
      if self.arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        x = unpermute(x, self.cfg.num_heads if "q_proj" in hf_name else self.cfg.num_kv_heads)
      self._cache[hf_name] = x
    return self._cache[hf_name]

  def shape(self, hf_name: str) -> tuple[int, ...]:
    """The Hugging Face shape of tensor `hf_name` (GGML's ne reversed)."""
    return tuple(int(n) for n in reversed(self.tensors[hf_name].shape.tolist()))

  def get_slice(self, hf_name: str) -> _Slice:
    return _Slice(lambda: self.array(hf_name))

  def sources(self, hf_name: str, implied: tuple[int, ...]) -> tuple["GGUFCheckpoint", pathlib.Path, str]:
    """(handle, path, name) of tensor `hf_name` for hf.py's block reader; missing or mis-shaped: GGUFError naming
    the GGUF tensor."""
    gname = _gguf_name(hf_name)
    if hf_name not in self.tensors:
      raise GGUFError(f"{self.path}: missing tensor {gname!r} (a {self.arch} model with this metadata needs it)")
    got = self.shape(hf_name)
    if got != tuple(implied):
      raise GGUFError(f"{self.path}: tensor {gname!r} has shape {list(got)} (GGML ne {list(reversed(got))}), the "
                      f"metadata implies {list(implied)}")
    return self, self.path, hf_name

  def close(self) -> None:
    self._cache.clear()


def _gguf_name(hf_name: str) -> str:
  for g, h in GLOBAL_NAMES.items():
    if h == hf_name:
      return g
  _, _, i, rest = hf_name.split(".", 3)
  return next(f"blk.{i}.{g}" for g, h in BLOCK_NAMES.items() if h == rest)


def _hf_name(name: str) -> Optional[str]:
  if name in GLOBAL_NAMES:
    return GLOBAL_NAMES[name]
  parts = name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in BLOCK_NAMES:
    return f"model.layers.{int(parts[1])}.{BLOCK_NAMES[parts[2]]}"
  return None


def read_metadata(path: str | os.PathLike):
  """(gguf.GGUFReader, {key: value}) of a GGUF file; an unreadable one is a GGUFError naming it. The last two files
  read are kept (by path, size and modification time): a run reads one file's header four times (architecture,
  tokenizer, special ids, weights), and parsing SmolLM2's 49152 tokens and 48900 merges takes seconds."""
  p = pathlib.Path(path)
  try:
    st = p.stat()
  except OSError as e:
    raise GGUFError(f"{path}: not a readable GGUF file ({e.strerror or e})") from None
  return _read_metadata(str(p.resolve()), st.st_size, st.st_mtime_ns, str(path))


@functools.lru_cache(maxsize=2)
def _read_metadata(path: str, size: int, mtime_ns: int, shown: str):
  import gguf
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # bad magic or version, a file cut short (numpy's memmap / reshape errors)
    raise GGUFError(f"{shown}: not a readable GGUF file ({type(e).__name__}: {e})") from None
  meta = {}
  for key, field in reader.fields.items():
    if not key.startswith("GGUF."):
      try:
        meta[key] = field.contents()
      except Exception as e:
        raise GGUFError(f"{shown}: metadata key {key!r} could not be read ({e})") from None
  return reader, meta


def _float(meta: dict, key: str, where: pathlib.Path, default: Any = _REQUIRED) -> float:
  """A float32 key as the shortest decimal that rounds to it (1e-05, not 9.999999747378752e-06): the value the
  converter's config.json held."""
  v = _get(meta, key, where, default)
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    raise GGUFError(f"{where}: {key}={v!r} is not a number")
  return float(str(np.float32(v)))


def _get(meta: dict, key: str, where: pathlib.Path, default: Any = _REQUIRED) -> Any:
  if key not in meta:
    if default is _REQUIRED:
      raise GGUFError(f"{where}: lacks the metadata key {key!r}")
    return default
  return meta[key]


def _int(meta: dict, key: str, where: pathlib.Path, default: Any = _REQUIRED) -> int:
  """An integer key; a per-layer list (some GGUFs write head counts per layer) only when every layer agrees."""
  v = _get(meta, key, where, default)
  if isinstance(v, list):
    if not v or len(set(v)) != 1:
      raise GGUFError(f"{where}: {key}={v!r} differs between layers: not supported")
    v = v[0]
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
    raise GGUFError(f"{where}: {key}={v!r} is not an integer")
  return int(v)


def special_ids(meta: dict, where: pathlib.Path, vocab_size: Optional[int] = None) -> SpecialIds:
  """BOS / EOS / PAD ids from tokenizer.ggml.*: eos_token_id, then eot_token_id and eom_token_id (llama.cpp also
  stops on those) as further EOS ids. An id outside the vocabulary is a GGUFError."""
  def ids(*keys):
    out = []
    for key in keys:
      v = meta.get(f"tokenizer.ggml.{key}")
      if v is None:
        continue
      if isinstance(v, bool) or not isinstance(v, int) or (vocab_size is not None and not 0 <= v < vocab_size):
        raise GGUFError(f"{where}: tokenizer.ggml.{key}={v!r} is not an id of the vocabulary ({vocab_size} tokens)")
      out.append(v)
    return tuple(dict.fromkeys(out))
  bos, pad = ids("bos_token_id"), ids("padding_token_id")
  return SpecialIds(bos[0] if bos else None, ids("eos_token_id", "eot_token_id", "eom_token_id"),
                    pad[0] if pad else None)


def config_json(meta: dict, tensor_names, where: pathlib.Path) -> dict[str, Any]:
  """The config.json (transformers' spelling) the metadata describes; unsupported settings are a GGUFError."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise GGUFError(f"{where}: general.architecture={arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
  A = arch + "."
  if _int(meta, A + "expert_count", where, 0):
    raise GGUFError(f"{where}: {A}expert_count={meta[A + 'expert_count']!r}: a mixture-of-experts GGUF is not "
                    "supported")
  scaling = meta.get(A + "rope.scaling.type", "none")
  if scaling != "none":
    raise GGUFError(f"{where}: {A}rope.scaling.type={scaling!r} is not supported (only unscaled rope)")
  if "rope_freqs.weight" in tensor_names:
    raise GGUFError(f"{where}: tensor 'rope_freqs.weight' (per-dimension rope factors, Llama 3.1's rope scaling) is "
                    "not supported")
  D, heads = _int(meta, A + "embedding_length", where), _int(meta, A + "attention.head_count", where)
  head_dim = _int(meta, A + "attention.key_length", where, D // heads)
  if _int(meta, A + "attention.value_length", where, head_dim) != head_dim:
    raise GGUFError(f"{where}: {A}attention.value_length={meta[A + 'attention.value_length']!r} differs from "
                    f"key_length {head_dim}: not supported")
  rope_dim = _int(meta, A + "rope.dimension_count", where, head_dim)
  if rope_dim != head_dim:
    raise GGUFError(f"{where}: {A}rope.dimension_count={rope_dim} is not the head dim {head_dim} (partial rotary "
                    "embeddings are not supported)")
  tokens = meta.get("tokenizer.ggml.tokens")
  vocab = len(tokens) if isinstance(tokens, list) else _int(meta, A + "vocab_size", where)
  if A + "vocab_size" in meta and _int(meta, A + "vocab_size", where) != vocab:
    raise GGUFError(f"{where}: {A}vocab_size={meta[A + 'vocab_size']!r} but tokenizer.ggml.tokens holds {vocab} tokens")
  ids = special_ids(meta, where, vocab)
  out = {"model_type": arch, "hidden_act": "silu", "hidden_size": D, "num_attention_heads": heads,
         "num_key_value_heads": _int(meta, A + "attention.head_count_kv", where, heads), "head_dim": head_dim,
         "intermediate_size": _int(meta, A + "feed_forward_length", where),
         "num_hidden_layers": _int(meta, A + "block_count", where),
         "rms_norm_eps": _float(meta, A + "attention.layer_norm_rms_epsilon", where),
         "rope_theta": _float(meta, A + "rope.freq_base", where, 10000.0),
         "max_position_embeddings": _int(meta, A + "context_length", where), "vocab_size": vocab,
         "tie_word_embeddings": "output.weight" not in tensor_names}
  if ids.bos_id is not None:
    out["bos_token_id"] = ids.bos_id
  if ids.eos_ids:
    out["eos_token_id"] = ids.eos_ids[0] if len(ids.eos_ids) == 1 else list(ids.eos_ids)
  if ids.pad_id is not None:
    out["pad_token_id"] = ids.pad_id
  return out


def gguf_model_config(path: str | os.PathLike, *, dtype: str = "float32",
                      max_seq_len: Optional[int] = None) -> ModelConfig:
  """Our `ModelConfig` for a GGUF file's metadata (hf.hf_model_config of `config_json`)."""
  return open_gguf(path, dtype=dtype, max_seq_len=max_seq_len).cfg


def open_gguf(path: str | os.PathLike, *, dtype: str = "float32", max_seq_len: Optional[int] = None) -> GGUFCheckpoint:
  """Read a GGUF file's metadata and tensor table (no tensor data yet). Every tensor must map to a Hugging Face
  name the architecture uses and be of a type in TYPES; each refusal names the file and the tensor or key."""
  where = pathlib.Path(path)
  reader, meta = read_metadata(where)
  names = [t.name for t in reader.tensors]
  config = config_json(meta, names, where)
  try:
    cfg = hf_model_config(config, dtype=dtype, max_seq_len=max_seq_len)
  except HFCheckpointError as e:  # the same check as a config.json's, named after the GGUF file
    raise GGUFError(f"{where}: {str(e).removeprefix('config.json: ')}") from None
  from scalerl_jax.model.hf import hf_name_map
  wanted = {n for m in hf_name_map(cfg, config["model_type"]).values() for n in m.names}
  tensors, gguf_names = {}, {}
  for t in reader.tensors:
    hf_name = _hf_name(t.name)
    if hf_name is None or hf_name not in wanted:
      hint = " (a mixture-of-experts tensor)" if "_exps" in t.name or "_inp" in t.name else ""
      raise GGUFError(f"{where}: unexpected tensor {t.name!r} that a {config['model_type']} model with this metadata "
                      f"does not use{hint}")
    if t.tensor_type.name not in TYPES:
      raise GGUFError(f"{where}: tensor {t.name!r} is stored as {t.tensor_type.name}, a type this loader does not "
                      f"dequantize (supported: {', '.join(TYPES)})")
    tensors[hf_name], gguf_names[hf_name] = t, t.name
  return GGUFCheckpoint(where, config["model_type"], meta, config, cfg,
                        special_ids(meta, where, cfg.vocab_size), tensors, gguf_names)
