"""Adapters out (and back in): merged into their base weights, or as a PEFT adapter directory.

`merge`: W' = W + (alpha / r) A B for every adapted projection (A [*in, r], B [r, *out]: the tensordot has W's
shape; an MoE's per-expert adapters expert by expert) -> the tree of the model without adapters, which
`export_pretrained` writes as a Hugging Face checkpoint transformers loads.

`export_peft`: `adapter_config.json` + `adapter_model.safetensors` as PEFT writes them for a LoRA on a
`*ForCausalLM`: tensor `base_model.model.<the base weight's name without .weight>.lora_A.weight` [r, in] and
`.lora_B.weight` [out, r], where in / out are the torch Linear's dims (our A [*in, r] flattened and transposed; B
[r, *out] likewise). The base weight's name and its in / out flattening are model/hf.py's `hf_name_map` (Q and K rows
in transformers' head order, as the base export writes them); MoE experts by their per-expert names
(`mlp.experts.{e}.gate_proj`, Mixtral's `w1` / `w3` / `w2`). PEFT scales by lora_alpha / r, as here.
`read_peft` reads such a directory back into the adapters of a policy (round trip exact).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from scalerl_jax.model import lora
from scalerl_jax.model.hf import HFCheckpointError, hf_name_map
from scalerl_jax.model.hf_export import DTYPES, HFExportError, export_dtype

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."


def _adapters(params: Any) -> dict[str, tuple[str, dict]]:
  """{the adapted weight's key (hf_name_map spelling): (its adapter's key, the adapter {a, b})}."""
  out = {}
  for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
    if lora.is_adapter(path) and path[-1].key == "a":
      module = path[:-2]
      target = path[-2].key[:-len("_lora")]
      node = params
      for k in module:
        node = node[k.key if hasattr(k, "key") else k.idx]
      key = jax.tree_util.keystr((*module, jax.tree_util.DictKey(target)))
      out[key] = (jax.tree_util.keystr(path[:-1]), node[path[-2].key])
  return out


def _delta(a, b, w_ndim: int):
  """scale-free A B in W's shape (float32): A [*in, r] . B [r, *out], or for an expert adapter (A [E, *in, r],
  B [E, r, *out], W [E, *in, *out]) each expert's product."""
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  if a.ndim + b.ndim - 2 == w_ndim:
    return jnp.tensordot(a, b, axes=1)
  return jax.vmap(lambda x, y: jnp.tensordot(x, y, axes=1))(a, b)


def merge(params: Any, policy) -> Any:
  """The tree of `policy`'s model without adapters, each adapted weight W + scale A B (in W's dtype)."""
  spec = policy.lora
  if spec is None:
    return params
  base = _adapters(params)
  flat = jax.tree_util.tree_flatten_with_path(policy.split_trainable(params)[1])[0]
  merged = {}
  for path, w in flat:
    key = jax.tree_util.keystr(path)
    if key in base:
      ad = base[key][1]
      # at least fp32: a bf16 base would round much of a small update away before the export casts once
      w = (jnp.asarray(w, jnp.float32) + spec.scale * _delta(ad["a"], ad["b"], w.ndim)).astype(
          jnp.promote_types(w.dtype, jnp.float32))
    merged[path] = w
  # rebuild the nested dict without the adapters' (now empty) entries
  out: dict = {}
  for path, w in merged.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k.key if hasattr(k, "key") else k.idx, {})
    node[path[-1].key if hasattr(path[-1], "key") else path[-1].idx] = w
  return out


def _names(model_cfg, family: Optional[str]) -> dict:
  return hf_name_map(model_cfg, family if model_cfg.moe_layers else None)


def peft_tensors(params: Any, policy, family: Optional[str] = None) -> dict[str, np.ndarray]:
  """{PEFT tensor name: float32 array} of `params`' adapters (module docstring)."""
  names = _names(policy.cfg, family)
  out = {}
  for key, (_, ad) in sorted(_adapters(params).items()):
    a, b = np.asarray(jax.device_get(ad["a"]), np.float32), np.asarray(jax.device_get(ad["b"]), np.float32)
    if key not in names:
      raise HFExportError(f"the adapted weight {key} has no Hugging Face tensor in family {family or 'dense'}")
    m = names[key]
    stacked = [(a[e], b[e]) for e in range(m.experts)] if m.experts else [(a, b)]
    for name, (ae, be) in zip(m.names, stacked):
      r = ae.shape[-1]
      stem = _PREFIX + name[:-len(".weight")]
      out[stem + ".lora_A.weight"] = np.ascontiguousarray(ae.reshape(-1, r).T)
      out[stem + ".lora_B.weight"] = np.ascontiguousarray(be.reshape(r, -1).T)
  return out


def peft_config(policy, base_name: str, names: dict[str, np.ndarray]) -> dict:
  """adapter_config.json of `policy`'s adapters (PEFT's LoraConfig fields)."""
  spec = policy.lora
  modules = sorted({n.rsplit(".lora_", 1)[0].rsplit(".", 1)[1] for n in names})
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_name, "r": spec.rank,
          "lora_alpha": spec.alpha, "lora_dropout": 0.0, "target_modules": modules, "bias": "none",
          "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
          "inference_mode": True, "modules_to_save": None, "layers_to_transform": None}


def export_peft(params: Any, policy, out_dir: str | os.PathLike, *, base_name: str = "", dtype: str = "float32",
                family: Optional[str] = None) -> pathlib.Path:
  """Writes `params`' adapters as a PEFT adapter directory `out_dir`; returns it. `base_name`: the base checkpoint
  PEFT should load them onto (adapter_config's base_model_name_or_path)."""
  if policy.lora is None:
    raise HFExportError("the run trains no adapters (lora.rank = 0): export the whole model instead")
  dtype = export_dtype(dtype)
  tensors = peft_tensors(params, policy, family)
  out = pathlib.Path(out_dir)
  if jax.process_index() == 0:
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.astype(DTYPES[dtype]) for k, v in tensors.items()}, str(out / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    (out / ADAPTER_CONFIG).write_text(json.dumps(peft_config(policy, base_name, tensors), indent=2) + "\n")
  return out


def read_peft(adapter_dir: str | os.PathLike, policy, family: Optional[str] = None) -> Any:
  """The adapters a PEFT directory holds, as `policy`'s adapter tree (None at base leaves; `lora.attach` puts them
  on a base). Its r, lora_alpha and tensors must be what `policy`'s lora.* keys describe: a mismatch is refused by
  name."""
  d = pathlib.Path(adapter_dir)
  for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
    if not (d / f).is_file():
      raise HFCheckpointError(f"{d / f}: no such file (not a PEFT adapter directory?)")
  config = json.loads((d / ADAPTER_CONFIG).read_text())
  spec = policy.lora
  for key, ours in (("r", spec.rank if spec else 0), ("lora_alpha", spec.alpha if spec else 0)):
    if config.get(key) != ours:
      raise HFCheckpointError(f"{d / ADAPTER_CONFIG}: {key} = {config.get(key)!r}, the policy's lora keys give {ours!r}")
  # variants whose output is not x W + (alpha / r) x A B with A, B as stored: another scale, a magnitude vector,
  # transposed layers, per-module ranks
  for key in ("use_rslora", "use_dora", "fan_in_fan_out"):
    if config.get(key):
      raise HFCheckpointError(f"{d / ADAPTER_CONFIG}: {key} = {config[key]!r}; only plain LoRA adapters are read")
  for key in ("rank_pattern", "alpha_pattern"):
    if config.get(key):
      raise HFCheckpointError(f"{d / ADAPTER_CONFIG}: {key} = {config[key]!r}; one rank and alpha for every module "
                              "are read")
  stored = load_file(str(d / ADAPTER_WEIGHTS))
  names = _names(policy.cfg, family)
  template = policy.split_trainable(policy.param_shapes)[0]
  want, used = {}, set()
  for key, (ad_key, ad) in _adapters(template).items():
    m = names[key]
    parts = []
    for name in m.names:
      stem = _PREFIX + name[:-len(".weight")]
      try:
        a, b = stored[stem + ".lora_A.weight"], stored[stem + ".lora_B.weight"]
      except KeyError as e:
        raise HFCheckpointError(f"{d / ADAPTER_WEIGHTS}: lacks the tensor {e.args[0]}") from None
      a_shape = ad["a"].shape[1:] if m.experts else ad["a"].shape
      b_shape = ad["b"].shape[1:] if m.experts else ad["b"].shape
      parts.append((a.T.reshape(a_shape), b.T.reshape(b_shape)))
    a = np.stack([p[0] for p in parts]) if m.experts else parts[0][0]
    b = np.stack([p[1] for p in parts]) if m.experts else parts[0][1]
    want[ad_key] = {"a": a.astype(ad["a"].dtype), "b": b.astype(ad["b"].dtype)}
    used.update(_PREFIX + name[:-len(".weight")] + f".lora_{x}.weight" for name in m.names for x in "AB")
  extra = sorted(set(stored) - used)
  if extra:
    raise HFCheckpointError(f"{d / ADAPTER_WEIGHTS}: holds {len(extra)} tensor(s) the policy's lora.targets do not "
                            f"adapt, e.g. {extra[0]} (lora.targets = {list(spec.targets) if spec else []})")
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: None if leaf is None else jnp.asarray(want[jax.tree_util.keystr(path[:-1])][path[-1].key]),
      template, is_leaf=lambda x: x is None)
