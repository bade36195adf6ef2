"""A policy's params as flat, named host arrays, and safetensors files of them.

A key is the param's path in the nested dict as `jax.tree_util.keystr` spells it (`"['blocks'][0]['attn']['q']"`),
so a file round-trips exactly into the tree `Policy.param_shapes` describes. (Importers of other checkpoint
formats, a Hugging Face loader for instance, map their names onto these keys and live beside this file.)
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from scalerl_jax.model.policy import Params, Policy


def flatten_params(params: Params) -> dict[str, np.ndarray]:
  """{path key: host array} for every leaf of `params` (device arrays are copied to the host)."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return {jax.tree_util.keystr(path): np.asarray(x) for path, x in leaves}


def unflatten_params(policy: Policy, flat: dict[str, Any]) -> Params:
  """The params tree of `policy` with each leaf taken from `flat` by its path key (extra keys are ignored).
  ValueError naming the missing keys when `flat` lacks any."""
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(policy.param_shapes)[0]]
  missing = [k for k in paths if k not in flat]
  if missing:
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    raise ValueError(f"params lack {len(missing)} of the model's {len(paths)} keys: {shown}")
  return jax.tree.unflatten(jax.tree.structure(policy.param_shapes), [flat[k] for k in paths])


def save_params(params: Params, path: str | os.PathLike) -> None:
  """Write `params` to a safetensors file at `path`."""
  save_file(flatten_params(params), str(path))


def load_params(policy: Policy, path: str | os.PathLike) -> Params:
  """Params of `policy` read from the safetensors file at `path` (host numpy leaves)."""
  try:
    return unflatten_params(policy, load_file(str(path)))
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
