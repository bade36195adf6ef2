"""Hugging Face checkpoints in: `config.json` -> `ModelConfig`, and safetensors weights (one file or sharded with
`model.safetensors.index.json`; fp32 / bf16 / fp16 on disk) read slice by slice straight into the target shardings.
A GGUF file (llama.cpp's format) takes the same way: model/gguf.py turns its metadata into a config.json dict and
serves its tensors, dequantized, under the Hugging Face names below.

Families (`model_type`): llama (Llama 2/3/3.1/3.2), qwen2 (Qwen2 / Qwen2.5: q/k/v biases) and qwen3 (QK-norm), the
dense ones (`FAMILIES`); qwen3_moe (Qwen3-MoE: QK-norm, dense layers where `mlp_only_layers` / `decoder_sparse_step`
say) and mixtral (every layer MoE), loaded as model.family=moe (`MOE_FAMILIES`). The name mapping and the
transposes / reshapes follow the param tree documented in `transformer.py`. Each of our params is
`stored.reshape(split).transpose(perm)` of one stored tensor (an expert weight: of one tensor per expert, stacked,
or one part of a fused tensor); a device's block of it is read with `safe_open(...).get_slice`, taking from every
stored dim only the rows of the outermost factor the block needs (inner factors, e.g. head_dim inside q_proj's
rows, are read whole and sliced on the host), so a tensor the layout shards is never read whole by any device's
callback (nor an expert a device does not hold).

MoE layers (`L.` = `model.layers.{i}.`; our params under `blocks[i].moe`, E experts of width F):

  ours            qwen3_moe (per-expert: the Hub's    mixtral (per-expert)               fused (transformers 5,
                  layout, what the exporter writes)                                      both families)
  router [D, E]   L.mlp.gate.weight [E, D] .T         L.block_sparse_moe.gate.weight     L.mlp.gate.weight
  gate [E, D, F]  L.mlp.experts.{e}.gate_proj.weight  L.block_sparse_moe.experts.{e}.w1  L.mlp.experts.gate_up_proj
                  [F, D] .T, stacked over e             .weight (shapes as qwen3_moe)    [E, 2F, D] rows :F, .T
  up [E, D, F]    L.mlp.experts.{e}.up_proj.weight      ... .experts.{e}.w3.weight       gate_up_proj rows F:, .T
  down [E, F, D]  L.mlp.experts.{e}.down_proj.weight    ... .experts.{e}.w2.weight       L.mlp.experts.down_proj
                  [D, F] .T                                                              [E, D, F] .T

The fused layout is how transformers 5 holds experts in memory; its `save_pretrained` converts back to the
per-expert layout (5.18 does), but writes the fused names with `save_original_format=False`. Both families spell it
the same (Mixtral's block_sparse_moe becomes mlp); a checkpoint is read as fused when it holds
`*.mlp.experts.gate_up_proj`. Routing is softmax(fp32 logits) -> top-k -> the probs at the chosen experts, divided by
their sum when `norm_topk_prob` (Qwen3-MoE's key, transformers' default False; Mixtral always: its softmax over the
top-k logits is the same). `router_aux_loss_coef`, `output_router_logits` and `router_jitter_noise` are training
settings of transformers and are not read (the trainer's are loss.router_*).

Anything we cannot represent exactly (other rope types, sliding windows, o_proj / MLP biases, partial rotary,
Qwen2-MoE's sigmoid-gated shared expert) is an `HFCheckpointError` naming the file, key and value: never a silently
different model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from safetensors import safe_open

from scalerl_jax.config import ConfigError, ModelConfig
from scalerl_jax.errors import UserError
from scalerl_jax.mesh import TRAIN_RULES, logical_to_sharding
from scalerl_jax.model.policy import Params, Policy, make_policy

FAMILIES = ("llama", "qwen2", "qwen3")  # dense
MOE_FAMILIES = ("qwen3_moe", "mixtral")  # model.family=moe
_NP_DTYPES = {"float32": np.float32, "bfloat16": jnp.bfloat16}
_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")  # safetensors' names of the weight dtypes we read (cast to dtype=)


class HFCheckpointError(UserError, ValueError):
  """A Hugging Face checkpoint we cannot load; the message names the file and the key or tensor."""


def read_json(path: pathlib.Path, *, optional: bool = False) -> Any:
  """A checkpoint's JSON file (config.json, tokenizer_config.json, ...), read by one rule for the loader, the
  exporter and the checkpoint's tokenizer (data/tokenizer.py): HFCheckpointError naming the file when it is missing
  (with `optional`: {} instead) or not readable JSON."""
  if optional and not path.is_file():
    return {}
  if not path.is_file():
    raise HFCheckpointError(f"{path}: no such file (a Hugging Face checkpoint directory holds config.json)")
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise HFCheckpointError(f"{path}: not readable JSON: {e}") from None


def pretrained_dir(path: str | os.PathLike, key: str = "model.pretrained") -> pathlib.Path:
  """`path` (the value of config key `key`) as a checkpoint: a directory, or a GGUF file (`*.gguf`); a missing path
  or another file is a ConfigError naming the key (not the JSON error of reading a binary file as config.json)."""
  p = pathlib.Path(path).expanduser()
  expected = ("a Hugging Face checkpoint directory (config.json + model.safetensors or its sharded index) or a GGUF "
              "file (*.gguf) is expected")
  if not p.exists():
    raise ConfigError(f"{key}: {path}: no such directory; {expected} (set {key}=PATH/TO/CHECKPOINT)")
  if not p.is_dir() and p.suffix.lower() != ".gguf":
    raise ConfigError(f"{key}: {path} is a file, not a checkpoint directory; {expected}")
  return p


def _rope(hf: dict, where: str) -> dict:
  """Our rope_* keys from transformers 5's `rope_parameters` or transformers 4's `rope_theta` + `rope_scaling`."""
  if hf.get("rope_parameters") is not None:
    key, rp = "rope_parameters", dict(hf["rope_parameters"])
    theta = rp.get("rope_theta", hf.get("rope_theta", 10000.0))
  else:
    key, rp = "rope_scaling", dict(hf.get("rope_scaling") or {})
    theta = hf.get("rope_theta", 10000.0)
  nested = sorted(k for k, v in rp.items() if isinstance(v, dict))
  if nested:  # transformers 5 spells per-layer-type rope as {layer type: parameters}
    raise HFCheckpointError(f"{where}: {key} holds per-layer-type parameters {nested}: not supported")
  rope_type = rp.get("rope_type", rp.get("type", "default"))
  out: dict[str, Any] = {"rope_theta": float(theta)}
  if rope_type == "llama3":
    try:
      out.update(rope_scaling="llama3", rope_factor=float(rp["factor"]),
                 rope_low_freq_factor=float(rp["low_freq_factor"]), rope_high_freq_factor=float(rp["high_freq_factor"]),
                 rope_original_max_positions=int(rp["original_max_position_embeddings"]))
    except KeyError as e:
      raise HFCheckpointError(f"{where}: {key} of rope_type 'llama3' lacks {e.args[0]!r}") from None
  elif rope_type != "default":
    raise HFCheckpointError(f"{where}: {key}.rope_type={rope_type!r} is not supported (supported: default, llama3)")
  for name, val in ((key + ".partial_rotary_factor", rp.get("partial_rotary_factor")),
                    ("partial_rotary_factor", hf.get("partial_rotary_factor"))):
    if val is not None and float(val) < 1:
      raise HFCheckpointError(f"{where}: {name}={val!r} (partial rotary embeddings) is not supported")
  return out


def _moe_fields(hf: dict, family: str, where: str, num_layers: int) -> dict[str, Any]:
  """Our MoE keys (model.family=moe) for a qwen3_moe or mixtral config.json."""
  given = {k: hf[k] for k in ("num_experts", "num_local_experts") if hf.get(k) is not None}
  if len(set(given.values())) > 1:
    raise HFCheckpointError(f"{where}: num_experts={given['num_experts']!r} and num_local_experts="
                            f"{given['num_local_experts']!r} disagree")
  if not given:  # transformers 5 writes num_local_experts for both families; Qwen3-MoE's Hub configs num_experts
    raise HFCheckpointError(f"{where}: lacks the key 'num_local_experts' (or 'num_experts')")
  E = int(next(iter(given.values())))
  out: dict[str, Any] = dict(family="moe", num_experts=E, experts_per_token=int(hf["num_experts_per_tok"]))
  if family == "mixtral":  # every layer MoE; intermediate_size is each expert's width
    out.update(moe_intermediate=int(hf["intermediate_size"]), norm_topk_prob=True)
  else:
    for key in ("shared_expert_intermediate_size", "shared_expert_gate"):
      if hf.get(key):
        raise HFCheckpointError(f"{where}: {key}={hf[key]!r}: a shared expert with a sigmoid gate (Qwen2-MoE's "
                                "shared_expert_gate) is not supported")
    mlp_only = hf.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) and 0 <= i < num_layers for i in mlp_only):
      raise HFCheckpointError(f"{where}: mlp_only_layers={mlp_only!r} must list layers in [0, {num_layers})")
    out.update(moe_intermediate=int(hf["moe_intermediate_size"]), mlp_only_layers=tuple(mlp_only),
               norm_topk_prob=bool(hf.get("norm_topk_prob", False)),  # absent: Qwen3MoeConfig's default
               decoder_sparse_step=int(hf.get("decoder_sparse_step", 1)))
    if out["decoder_sparse_step"] < 1:
      raise HFCheckpointError(f"{where}: decoder_sparse_step={out['decoder_sparse_step']} must be >= 1")
  if E < 2:
    raise HFCheckpointError(f"{where}: {next(iter(given))}={E}: a mixture of experts needs at least 2 experts")
  if not 1 <= out["experts_per_token"] <= E:
    raise HFCheckpointError(f"{where}: num_experts_per_tok={out['experts_per_token']} must be in [1, {E}]")
  if out["moe_intermediate"] < 1:
    raise HFCheckpointError(f"{where}: {'intermediate_size' if family == 'mixtral' else 'moe_intermediate_size'}="
                            f"{out['moe_intermediate']} must be positive")
  if family == "qwen3_moe" and not any((i + 1) % out["decoder_sparse_step"] == 0 and i not in out["mlp_only_layers"]
                                       for i in range(num_layers)):
    raise HFCheckpointError(f"{where}: decoder_sparse_step={out['decoder_sparse_step']} and mlp_only_layers="
                            f"{list(out['mlp_only_layers'])} leave no MoE layer (a dense model: not supported as "
                            "qwen3_moe)")
  return out


def hf_model_config(path_or_dict: str | os.PathLike | Mapping, *, dtype: str = "float32",
                    param_dtype: Optional[str] = None, max_seq_len: Optional[int] = None) -> ModelConfig:
  """Our `ModelConfig` for a Hugging Face `config.json` (a checkpoint directory, the file, or its dict), or a GGUF
  file's metadata (model/gguf.py). `max_seq_len` defaults to `max_position_embeddings`; `dtype` is the compute
  dtype, `param_dtype` (default: `dtype`) the params' and so the optimizer state's (fp32 master weights under bf16
  compute)."""
  if isinstance(path_or_dict, Mapping):
    hf, where = dict(path_or_dict), "config.json"
  else:
    from scalerl_jax.model.gguf import gguf_model_config, gguf_path
    if gguf_path(path_or_dict) is not None:  # a GGUF file's metadata (model/gguf.py)
      return dataclasses.replace(gguf_model_config(gguf_path(path_or_dict), dtype=dtype, max_seq_len=max_seq_len),
                                 param_dtype=param_dtype or dtype)
    p = pathlib.Path(path_or_dict)
    p = p / "config.json" if p.is_dir() else p
    hf, where = read_json(p), str(p)
  family = hf.get("model_type")
  if family not in FAMILIES + MOE_FAMILIES:
    raise HFCheckpointError(f"{where}: model_type={family!r} is not a supported family "
                            f"(supported: {', '.join(FAMILIES + MOE_FAMILIES)})")
  if hf.get("hidden_act", "silu") != "silu":
    raise HFCheckpointError(f"{where}: hidden_act={hf['hidden_act']!r} is not supported (only silu)")
  if hf.get("use_sliding_window"):
    raise HFCheckpointError(f"{where}: use_sliding_window={hf['use_sliding_window']!r}: sliding-window attention "
                            "is not supported")
  other_layers = sorted({t for t in hf.get("layer_types") or () if t != "full_attention"})
  if other_layers:
    raise HFCheckpointError(f"{where}: layer_types holds {other_layers}: only full_attention layers are supported")
  if family in ("llama", "qwen3", "qwen3_moe") and hf.get("attention_bias"):
    raise HFCheckpointError(f"{where}: attention_bias={hf['attention_bias']!r}: projection biases on o_proj are "
                            "not supported")
  if hf.get("mlp_bias"):
    raise HFCheckpointError(f"{where}: mlp_bias={hf['mlp_bias']!r}: MLP biases are not supported")
  try:
    D, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    fields = dict(vocab_size=int(hf["vocab_size"]), hidden=D, intermediate=int(hf["intermediate_size"]),
                  num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
                  num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                  head_dim=int(hf.get("head_dim") or D // heads),
                  norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                  # absent: transformers' default for all five families (False)
                  tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                  max_seq_len=int(max_seq_len or hf["max_position_embeddings"]))
    if family in MOE_FAMILIES:
      fields.update(_moe_fields(hf, family, where, fields["num_layers"]))
  except KeyError as e:
    raise HFCheckpointError(f"{where}: lacks the key {e.args[0]!r}") from None
  # Mixtral (Mistral's attention) uses a sliding window whenever sliding_window is set; it changes nothing while
  # every sequence fits in the window
  window = hf.get("sliding_window") if family == "mixtral" else None
  if window is not None and int(window) < fields["max_seq_len"]:
    raise HFCheckpointError(f"{where}: sliding_window={window!r}: sliding-window attention is not supported (it "
                            f"changes the model past {window} positions; max_seq_len={fields['max_seq_len']}: "
                            f"load with max_seq_len <= {window} for the same model on shorter sequences)")
  if fields["head_dim"] % 2:
    raise HFCheckpointError(f"{where}: head_dim={fields['head_dim']} is odd: rotary embeddings need an even one")
  if fields["num_heads"] % fields["num_kv_heads"]:
    raise HFCheckpointError(f"{where}: num_attention_heads={heads} is not a multiple of "
                            f"num_key_value_heads={fields['num_kv_heads']}")
  fields.setdefault("family", "dense")
  return ModelConfig(qkv_bias=family == "qwen2", qk_norm=family in ("qwen3", "qwen3_moe"), dtype=dtype,
                     param_dtype=param_dtype or dtype, **fields, **_rope(hf, where))


@dataclasses.dataclass(frozen=True)
class _Map:
  """Our param = stored.reshape(split)[take].transpose(perm); `split` splits each stored dim into contiguous factors.

  `take` (split dim j, index t): only part t of split dim j (dropped; `perm` orders the remaining split dims), e.g.
  the gate half of a fused gate_up_proj. `experts` > 0: `name` holds `{e}`, one tensor per expert, and our param is
  [experts, ...] stacking each expert's map."""
  name: str
  split: tuple[int, ...]
  perm: tuple[int, ...]
  groups: tuple[int, ...]  # how many split dims each stored dim becomes
  take: Optional[tuple[int, int]] = None
  experts: int = 0

  @property
  def stored_shape(self) -> tuple[int, ...]:
    """The shape of the stored tensor (of each expert's, with `experts`)."""
    out, i = [], 0
    for g in self.groups:
      out.append(math.prod(self.split[i:i + g]))
      i += g
    return tuple(out)

  @property
  def names(self) -> tuple[str, ...]:
    """The stored tensors this param is read from (each expert's, in expert order)."""
    return tuple(self.name.format(e=e) for e in range(self.experts)) if self.experts else (self.name,)

  @property
  def kept(self) -> tuple[int, ...]:
    """The split dims our param keeps (all but `take`'s), in split order."""
    return tuple(j for j in range(len(self.split)) if self.take is None or j != self.take[0])

  @property
  def shape(self) -> tuple[int, ...]:
    return (self.experts,) * bool(self.experts) + tuple(self.split[self.kept[p]] for p in self.perm)


def hf_name_map(cfg: ModelConfig, model_type: Optional[str] = None, *,
                fused_experts: bool = False) -> dict[str, _Map]:
  """{our param key (weights.flatten_params spelling): how it is read from the Hugging Face tensor(s)}.

  `model_type` (qwen3_moe or mixtral) names the MoE layers' tensors, in the per-expert layout or, with
  `fused_experts`, transformers 5's fused one (the module docstring's table); dense layers are named alike in every
  family."""
  D, F, Q, K, H, V = cfg.hidden, cfg.intermediate, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size
  sparse = set(cfg.moe_layers)
  if sparse and model_type not in MOE_FAMILIES:
    raise ValueError(f"hf_name_map: model.family=moe needs model_type ({' or '.join(MOE_FAMILIES)}), "
                     f"got {model_type!r}")
  E, FE = cfg.num_experts, cfg.expert_width
  same = lambda n, *s: _Map(n, s, tuple(range(len(s))), (1,) * len(s))
  linear_t = lambda n, out, inn, **kw: _Map(n, (out, inn), (1, 0), (1, 1), **kw)  # torch [out, in] -> [in, out]
  m = {"['embed']": same("model.embed_tokens.weight", V, D), "['final_norm']['scale']": same("model.norm.weight", D)}
  if not cfg.tie_embeddings:
    m["['lm_head']"] = linear_t("lm_head.weight", V, D)
  for i in range(cfg.num_layers):
    b, L = f"['blocks'][{i}]", f"model.layers.{i}."
    m[b + "['attn_norm']['scale']"] = same(L + "input_layernorm.weight", D)
    m[b + "['mlp_norm']['scale']"] = same(L + "post_attention_layernorm.weight", D)
    for p, heads in (("q", Q), ("k", K), ("v", K)):  # [A*H, D] -> [A, H, D] -> [D, A, H]
      m[b + f"['attn']['{p}']"] = _Map(L + f"self_attn.{p}_proj.weight", (heads, H, D), (2, 0, 1), (2, 1))
      if cfg.qkv_bias:
        m[b + f"['attn']['{p}_bias']"] = _Map(L + f"self_attn.{p}_proj.bias", (heads, H), (0, 1), (2,))
    m[b + "['attn']['o']"] = _Map(L + "self_attn.o_proj.weight", (D, Q, H), (1, 2, 0), (1, 2))  # [D, Q*H] -> [Q, H, D]
    if cfg.qk_norm:
      m[b + "['attn']['q_norm']['scale']"] = same(L + "self_attn.q_norm.weight", H)
      m[b + "['attn']['k_norm']['scale']"] = same(L + "self_attn.k_norm.weight", H)
    if i not in sparse:
      m[b + "['mlp']['gate']"] = linear_t(L + "mlp.gate_proj.weight", F, D)
      m[b + "['mlp']['up']"] = linear_t(L + "mlp.up_proj.weight", F, D)
      m[b + "['mlp']['down']"] = linear_t(L + "mlp.down_proj.weight", D, F)
      continue
    moe = b + "['moe']"
    if fused_experts:  # gate_up_proj [E, 2F, D] -> [E, 2, F, D], part 0 / 1 -> [E, D, F]; down_proj [E, D, F]
      m[moe + "['router']"] = linear_t(L + "mlp.gate.weight", E, D)
      for part, p in enumerate(("gate", "up")):
        m[moe + f"['{p}']"] = _Map(L + "mlp.experts.gate_up_proj", (E, 2, FE, D), (0, 2, 1), (1, 2, 1),
                                   take=(1, part))
      m[moe + "['down']"] = _Map(L + "mlp.experts.down_proj", (E, D, FE), (0, 2, 1), (1, 1, 1))
    else:
      prefix, names = {"qwen3_moe": ("mlp.", ("gate_proj", "up_proj", "down_proj")),
                       "mixtral": ("block_sparse_moe.", ("w1", "w3", "w2"))}[model_type]
      m[moe + "['router']"] = linear_t(L + prefix + "gate.weight", E, D)
      gate, up, down = (L + prefix + "experts.{e}." + n + ".weight" for n in names)
      m[moe + "['gate']"] = linear_t(gate, FE, D, experts=E)
      m[moe + "['up']"] = linear_t(up, FE, D, experts=E)
      m[moe + "['down']"] = linear_t(down, D, FE, experts=E)
  return m


def _weight_files(d: pathlib.Path) -> dict[str, pathlib.Path]:
  """{tensor name: the safetensors file that holds it} (read from the index, or the one file's header)."""
  index = d / "model.safetensors.index.json"
  if index.is_file():
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise HFCheckpointError(f"{index}: lacks the key 'weight_map'")
    files = {n: d / f for n, f in weight_map.items()}
    for f in sorted(set(files.values())):
      if not f.is_file():
        raise HFCheckpointError(f"{f}: no such file (named by {index.name})")
    return files
  single = d / "model.safetensors"
  if not single.is_file():
    raise HFCheckpointError(f"{single}: no such file (and no model.safetensors.index.json in {d})")
  with _open(single) as st:
    return {n: single for n in st.keys()}


def _open(path: pathlib.Path):
  try:
    return safe_open(str(path), framework="numpy")
  except Exception as e:  # safetensors raises its own SafetensorError (truncated header or data, bad JSON, ...)
    raise HFCheckpointError(f"{path}: not a readable safetensors file: {e}") from None


def _read_block(handle, path: pathlib.Path, name: str, spec: _Map, index: tuple[slice, ...]) -> np.ndarray:
  """The block `index` (slices of our shape, less the experts dim) of our param from the stored tensor `name`."""
  split_slices: list[tuple[int, int]] = [(0, 0)] * len(spec.split)
  for d, p in enumerate(spec.perm):  # our dim d is split dim kept[p]
    j = spec.kept[p]
    split_slices[j] = index[d].indices(spec.split[j])[:2]
  if spec.take is not None:
    split_slices[spec.take[0]] = (spec.take[1], spec.take[1] + 1)
  stored, local, shape, j = [], [], [], 0
  for g in spec.groups:  # the outer factor of each stored dim picks rows; inner factors are read whole
    inner = spec.split[j + 1:j + g]
    a, b = split_slices[j]
    stored.append(slice(a * math.prod(inner), b * math.prod(inner)))
    shape += [b - a, *inner]
    local += [slice(None)] + [slice(*split_slices[k]) for k in range(j + 1, j + g)]
    j += g
  try:
    block = handle.get_slice(name)[tuple(stored)]
  except Exception as e:
    raise HFCheckpointError(f"{path}: tensor {name!r} could not be read: {e}") from None
  block = np.asarray(block).reshape(shape)[tuple(local)]
  if spec.take is not None:
    block = block.squeeze(spec.take[0])
  return block.transpose(spec.perm)


def _block_reader(sources, spec: _Map, dtype):
  """callback(index) -> our param's block at `index` (a tuple of slices of our shape), read with get_slice.
  `sources`: (handle, path, tensor name) of each stored tensor (one per expert with `spec.experts`)."""

  def read(index):
    index = tuple(index) + (slice(None),) * (len(spec.shape) - len(index))
    if spec.experts:  # only the experts this block holds
      a, b = index[0].indices(spec.experts)[:2]
      block = np.stack([_read_block(*sources[e], spec, index[1:]) for e in range(a, b)])
    else:
      block = _read_block(*sources[0], spec, index)
    return np.ascontiguousarray(block.astype(dtype))

  return read


@dataclasses.dataclass
class Pretrained:
  """A loaded checkpoint: `policy` (the rollout engine's and train step's `Policy`), `params` (placed in the
  requested shardings), `cfg`, the checkpoint's special ids (`special_ids`: the ones its tokenizer reads), and
  `logits(token_ids)`. Unpacks as (policy, params)."""
  policy: Policy
  params: Params
  cfg: ModelConfig
  path: pathlib.Path
  bos_id: Optional[int] = None
  eos_ids: tuple[int, ...] = ()
  pad_id: Optional[int] = None

  def __iter__(self):
    return iter((self.policy, self.params))

  def logits(self, token_ids) -> jax.Array:
    """fp32 [B, T, V] logits of int token ids [B, T] at positions 0..T-1 (causal: right padding needs no mask)."""
    if not hasattr(self, "_logits_fn"):
      policy = self.policy
      self._logits_fn = jax.jit(lambda p, t: policy.logits(p, policy.forward(p, t)[0]).astype(jnp.float32))
    return self._logits_fn(self.params, jnp.asarray(token_ids, jnp.int32))


def _ids(v) -> tuple[int, ...]:
  return () if v is None else tuple(int(x) for x in (v if isinstance(v, (list, tuple)) else [v]))


ID_CONFIGS = ("generation_config.json", "config.json")  # transformers' generate takes generation_config's ids


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """A checkpoint's special ids: `bos_id` (None: no BOS, as in Qwen), `eos_ids` (every id that ends a sequence,
  () when none is named), `pad_id` (None when unnamed)."""
  bos_id: Optional[int]
  eos_ids: tuple[int, ...]
  pad_id: Optional[int]


def special_ids(directory: str | os.PathLike, token_id: Optional[Callable[[str], Optional[int]]] = None, *,
                vocab: Optional[tuple[int, str]] = None) -> SpecialIds:
  """The one rule for a checkpoint's BOS / EOS / PAD ids, shared by its tokenizer (data/tokenizer.py) and
  load_pretrained, so the trainer and the loaded model stop on the same ids: each `*_token_id` (an int or a list)
  from generation_config.json, else config.json (the order of transformers' generate: Qwen's config.json names one
  EOS id, its generation_config.json two), else tokenizer_config.json's token name (`bos_token`, ...) looked up
  with `token_id`; tokenizer_config.json's `eos_token` is added to the EOS ids as well. `vocab` = (size, what):
  every config id must lie below size. HFCheckpointError names the file and key. A GGUF file (or a directory
  holding one and no config.json): its tokenizer.ggml.*_token_id keys (model/gguf.py special_ids)."""
  from scalerl_jax.model import gguf
  g = gguf.gguf_path(directory)
  if g is not None:
    meta = gguf.read_metadata(g)[1]
    tokens = meta.get("tokenizer.ggml.tokens")
    return gguf.special_ids(meta, g, len(tokens) if isinstance(tokens, list) else None)
  d = pathlib.Path(directory)
  configs = [(d / n, read_json(d / n)) for n in ID_CONFIGS if (d / n).is_file()]
  tok_file = d / "tokenizer_config.json"
  tok_cfg = read_json(tok_file, optional=True)
  for f, cfg in configs + [(tok_file, tok_cfg)]:
    if not isinstance(cfg, dict):
      raise HFCheckpointError(f"{f}: not a JSON object")

  def from_configs(key: str) -> tuple[int, ...]:
    for f, cfg in configs:
      try:
        ids = _ids(cfg.get(key))
      except (TypeError, ValueError):
        raise HFCheckpointError(f"{f}: {key}={cfg.get(key)!r} is not an id or a list of ids") from None
      bad = [i for i in ids if vocab is not None and not 0 <= i < vocab[0]]
      if bad:
        raise HFCheckpointError(f"{f}: {key} {bad[0]} is not an id of {vocab[1]} ({vocab[0]} tokens)")
      if ids:
        return ids
    return ()

  def named(key: str) -> tuple[int, ...]:
    name = tok_cfg.get(key)
    name = name.get("content") if isinstance(name, dict) else name  # a string or an AddedToken dict
    if not isinstance(name, str) or not name or token_id is None:
      return ()
    tid = token_id(name)
    if tid is None:
      raise HFCheckpointError(f"{tok_file}: {key} {name!r} is not in the vocabulary of {d / 'tokenizer.json'}")
    return (tid,)

  bos = from_configs("bos_token_id") or named("bos_token")
  pad = from_configs("pad_token_id") or named("pad_token")
  eos = tuple(dict.fromkeys(from_configs("eos_token_id") + named("eos_token")))
  return SpecialIds(bos[0] if bos else None, eos, pad[0] if pad else None)


def _token_lookup(d: pathlib.Path) -> Callable[[str], Optional[int]]:
  """token -> id in the checkpoint's tokenizer.json (read on the first call; None without one)."""
  cache: list = []

  def lookup(token: str) -> Optional[int]:
    f = d / "tokenizer.json"
    if not cache:
      if not f.is_file():
        return None
      from tokenizers import Tokenizer  # imported here: only a named special token needs it
      try:
        cache.append(Tokenizer.from_file(str(f)))
      except Exception as exc:  # tokenizers raises a bare Exception for bad JSON, unknown models, bad encodings
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise HFCheckpointError(f"{f}: not a readable tokenizer.json ({reason})") from None
    return cache[0].token_to_id(token)

  return lookup


def _place(policy: Policy, specs, dtype: str, mesh: Optional[Mesh], rules: Mapping[str, Any]) -> Params:
  """Our params from `specs` ((_Map, sources) per leaf of `policy.param_shapes`, in tree order): each placed in the
  sharding `rules` give its logical axes on `mesh` (without: the default device), every device's block read on its
  own (`jax.make_array_from_callback`)."""
  leaves = jax.tree_util.tree_flatten_with_path(policy.param_shapes)[0]
  if mesh is None:
    shardings = [SingleDeviceSharding(jax.devices()[0]) for _ in leaves]
  else:
    shardings = jax.tree.leaves(logical_to_sharding(policy.logical_axes, policy.param_shapes, mesh, rules),
                                is_leaf=lambda x: isinstance(x, NamedSharding))
  out = [jax.make_array_from_callback(shape.shape, sharding, _block_reader(sources, spec, _NP_DTYPES[dtype]))
         for (_, shape), sharding, (spec, sources) in zip(leaves, shardings, specs)]
  return jax.tree.unflatten(jax.tree.structure(policy.param_shapes), out)


def _load_gguf(path: pathlib.Path, dtype: str, mesh: Optional[Mesh], rules: Mapping[str, Any],
               max_seq_len: Optional[int]) -> Pretrained:
  from scalerl_jax.model.gguf import open_gguf
  ckpt = open_gguf(path, dtype=dtype, max_seq_len=max_seq_len)
  policy = make_policy(ckpt.cfg)
  names = hf_name_map(ckpt.cfg, ckpt.model_type)
  specs = []  # every tensor and shape is checked (the table only) before any tensor is dequantized
  for key_path, _ in jax.tree_util.tree_flatten_with_path(policy.param_shapes)[0]:
    spec = names[jax.tree_util.keystr(key_path)]
    specs.append((spec, [ckpt.sources(name, spec.stored_shape) for name in spec.names]))
  try:
    params = _place(policy, specs, dtype, mesh, rules)
  finally:
    ckpt.close()
  return Pretrained(policy, params, ckpt.cfg, path, ckpt.ids.bos_id, ckpt.ids.eos_ids, ckpt.ids.pad_id)


def load_pretrained(path: str | os.PathLike, *, dtype: str = "float32", mesh: Optional[Mesh] = None,
                    rules: Mapping[str, Any] = TRAIN_RULES, max_seq_len: Optional[int] = None) -> Pretrained:
  """Read a Hugging Face checkpoint directory (config.json + model.safetensors or a sharded index), or a GGUF file
  (a `*.gguf`, or a directory holding one and no config.json: model/gguf.py), into our policy.

  With `mesh`, each param is placed in the sharding `rules` give its logical axes, every device's block read from
  disk on its own (`jax.make_array_from_callback`); without, on the default device. Weights are cast to `dtype`
  (float32 or bfloat16) whatever their float dtype on disk (an integer tensor is refused; a GGUF's quantized tensors
  are dequantized to float32 first). `max_seq_len` defaults to max_position_embeddings (a GGUF's context_length)."""
  if dtype not in _NP_DTYPES:
    raise HFCheckpointError(f"load_pretrained: dtype={dtype!r} is not supported (choose float32 or bfloat16)")
  from scalerl_jax.model.gguf import gguf_path
  g = gguf_path(path)
  if g is not None:
    return _load_gguf(g, dtype, mesh, rules, max_seq_len)
  d = pathlib.Path(path)
  if not d.is_dir():
    raise HFCheckpointError(f"{d}: no such checkpoint directory")
  hf = read_json(d / "config.json")
  cfg = hf_model_config(d / "config.json", dtype=dtype, max_seq_len=max_seq_len)
  policy = make_policy(cfg)
  files = _weight_files(d)
  fused = any(n.endswith(".mlp.experts.gate_up_proj") for n in files)  # transformers 5's in-memory expert layout
  names = hf_name_map(cfg, hf["model_type"], fused_experts=fused)
  wanted = {n for m in names.values() for n in m.names}
  # rotary_emb.inv_freq: a buffer some older Llama checkpoints saved; it is recomputed from the config
  extra = sorted(n for n in set(files) - wanted if not n.endswith(".rotary_emb.inv_freq"))
  if extra:
    shown = ", ".join(f"{n!r} ({files[n]})" for n in extra[:3])
    shown += f" and {len(extra) - 3} more" if len(extra) > 3 else ""
    hint = " (config.json has tie_word_embeddings=true: the head is the embedding)" if (
        "lm_head.weight" in extra and cfg.tie_embeddings) else ""
    if any(".shared_expert" in n for n in extra):
      hint = " (a shared expert with a sigmoid gate, Qwen2-MoE's shared_expert / shared_expert_gate, is not supported)"
    raise HFCheckpointError(f"{d}: unexpected tensor(s) this {hf['model_type']} config does not use: {shown}{hint}")
  leaves = jax.tree_util.tree_flatten_with_path(policy.param_shapes)[0]
  index = d / "model.safetensors.index.json"
  handles: dict[pathlib.Path, Any] = {}
  try:
    specs = []  # every name and shape is checked (headers only) before any tensor data is read
    for key_path, _ in leaves:
      spec = names[jax.tree_util.keystr(key_path)]
      sources = []
      for name in spec.names:
        f = files.get(name)
        if f is None:
          raise HFCheckpointError(f"{index if index.is_file() else d / 'model.safetensors'}: "
                                  f"missing tensor {name!r}")
        if f not in handles:
          handles[f] = _open(f).__enter__()
        try:
          got = tuple(handles[f].get_slice(name).get_shape())
        except Exception as e:
          raise HFCheckpointError(f"{f}: missing tensor {name!r} ({e})") from None
        if got != spec.stored_shape:
          raise HFCheckpointError(f"{f}: tensor {name!r} has shape {list(got)}, config.json implies "
                                  f"{list(spec.stored_shape)}")
        stored = handles[f].get_slice(name).get_dtype()
        if stored not in _FLOAT_DTYPES:  # an integer (quantized?) tensor would be cast to float silently
          raise HFCheckpointError(f"{f}: tensor {name!r} is stored as {stored}, not a floating-point weight "
                                  f"({', '.join(_FLOAT_DTYPES)}); quantized checkpoints are not supported")
        sources.append((handles[f], f, name))
      specs.append((spec, sources))
    params = _place(policy, specs, dtype, mesh, rules)
  finally:
    for h in handles.values():
      h.__exit__(None, None, None)
  ids = special_ids(d, _token_lookup(d), vocab=(cfg.vocab_size, f"the embedding ({d / 'config.json'} vocab_size)"))
  return Pretrained(policy, params, cfg, d, ids.bos_id, ids.eos_ids, ids.pad_id)
