"""Meshes and layouts.

`--mesh data=1,fsdp=4,tensor=2,expert=1` (one axis may be -1, inferred from the device count) builds a
`jax.sharding.Mesh`. Layouts are data: a rule table maps each *logical* axis name (the model's parameter metadata,
and 'batch' for activations) to a mesh axis, one table for training (FSDP + tensor + expert parallel) and one for
rollout (no FSDP: generators hold whole layers, sharded only over tensor/expert). `logical_to_sharding` turns a
tree of logical axes into NamedShardings; the model never names a mesh axis.

Axis types: meshes are built with `AxisType.Auto` on purpose. The model carries no per-op sharding annotations;
XLA's sharding propagation from the parameter and batch shardings (GSPMD) places the activations. jax 0.10's
`jax.make_mesh` defaults to Explicit axes, which would require sharding-in-types annotations on every op.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from scalerl_jax.errors import UserError

TRAIN_AXES = ("data", "fsdp", "tensor", "expert")
ROLLOUT_AXES = ("data", "tensor", "expert")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated)
TRAIN_RULES: Mapping[str, Any] = {
    "batch": ("data", "fsdp"),
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "expert": "expert",
}
# The rollout layout is the training layout without FSDP: generators hold whole layers (no all-gather per decode
# step) and shard decode slots over "data" only.
ROLLOUT_RULES: Mapping[str, Any] = {**TRAIN_RULES, "batch": "data", "embed": None}


class MeshError(UserError, ValueError):
  """A --mesh spec or device split that cannot be built; the message names the key and the devices."""


@dataclasses.dataclass(frozen=True)
class Layout:
  """A mesh and the rule table that maps logical axes onto it: everything needed to place params and batches."""
  mesh: Mesh
  rules: Mapping[str, Any]

  @property
  def devices(self) -> list:
    return list(self.mesh.devices.flat)

  def shardings(self, axes_tree: Any, shapes_tree: Any) -> Any:
    return logical_to_sharding(axes_tree, shapes_tree, self.mesh, self.rules)

  def batch(self, ndim: int, batch_size: Optional[int] = None) -> NamedSharding:
    return batch_sharding(self.mesh, self.rules, ndim, batch_size)


def parse_mesh_spec(spec: str, num_devices: int, allowed: Sequence[str] = TRAIN_AXES) -> dict[str, int]:
  """'data=2,fsdp=-1,tensor=2' -> {'data': 2, 'fsdp': n, 'tensor': 2, ...} (absent allowed axes get 1)."""
  sizes: dict[str, int] = {}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, sep, value = part.partition("=")
    name = name.strip()
    if not sep or name not in allowed:
      raise MeshError(f"mesh spec {spec!r}: bad entry {part!r}; use name=size with names from {', '.join(allowed)}")
    if name in sizes:
      raise MeshError(f"mesh spec {spec!r}: axis {name!r} given twice")
    try:
      sizes[name] = int(value)
    except ValueError:
      raise MeshError(f"mesh spec {spec!r}: size of {name!r} is not an integer: {value!r}") from None
    if sizes[name] == 0 or sizes[name] < -1:
      raise MeshError(f"mesh spec {spec!r}: size of {name!r} must be positive or -1 (inferred)")
  inferred = [n for n, s in sizes.items() if s == -1]
  if len(inferred) > 1:
    raise MeshError(f"mesh spec {spec!r}: only one axis may be -1, got {inferred}")
  known = math.prod(s for s in sizes.values() if s != -1)
  if inferred:
    if num_devices % known:
      raise MeshError(f"mesh spec {spec!r}: {num_devices} devices are not divisible by the fixed axes' product {known}")
    sizes[inferred[0]] = num_devices // known
  total = math.prod(sizes.values())
  if total != num_devices:
    raise MeshError(f"mesh spec {spec!r}: axis sizes multiply to {total} but {num_devices} devices are available")
  return {name: sizes.get(name, 1) for name in allowed}


def make_mesh(spec: str, devices: Optional[Sequence[jax.Device]] = None, allowed: Sequence[str] = TRAIN_AXES) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  sizes = parse_mesh_spec(spec, len(devices), allowed)
  shape = tuple(sizes[a] for a in allowed)
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # non-TPU or irregular device sets: plain row-major order
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, tuple(allowed), axis_types=(AxisType.Auto,) * len(allowed))


def split_devices(generator_devices: int, devices: Optional[Sequence[jax.Device]] = None):
  """(trainer devices, generator devices). 0 generator devices = colocated (both get all devices)."""
  devices = list(jax.devices() if devices is None else devices)
  if generator_devices == 0:
    return devices, devices
  if generator_devices >= len(devices):
    raise MeshError(f"mesh.generator_devices={generator_devices} leaves no trainer device out of {len(devices)}")
  return devices[:-generator_devices], devices[-generator_devices:]


def logical_to_spec(axes: Sequence[Optional[str]], shape: Sequence[int], mesh: Mesh, rules: Mapping[str, Any]) -> P:
  """PartitionSpec for one array. A dim is sharded only if its size divides by the mesh axes' product, and a
  mesh axis is used at most once per array; otherwise that dim stays replicated."""
  used: set[str] = set()
  out = []
  for name, dim in zip(axes, shape):
    if name is not None and name not in rules:
      raise MeshError(f"logical axis {name!r} has no rule; known: {', '.join(sorted(rules))}")
    target = rules.get(name) if name is not None else None
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    targets = tuple(t for t in targets if t in mesh.shape and mesh.shape[t] > 1 and t not in used)
    if targets and dim % math.prod(mesh.shape[t] for t in targets) == 0:
      used.update(targets)
      out.append(targets[0] if len(targets) == 1 else targets)
    else:
      out.append(None)
  return P(*out)


def logical_to_sharding(axes_tree: Any, shapes_tree: Any, mesh: Mesh, rules: Mapping[str, Any]) -> Any:
  """Tree of logical-axis tuples + matching tree of shapes (arrays or ShapeDtypeStructs) -> NamedShardings."""
  is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
  return jax.tree.map(lambda axes, s: NamedSharding(mesh, logical_to_spec(axes, s.shape, mesh, rules)),
                      axes_tree, shapes_tree, is_leaf=is_axes)


def batch_sharding(mesh: Mesh, rules: Mapping[str, Any], ndim: int, batch_size: Optional[int] = None) -> NamedSharding:
  """Sharding of an activation/batch array: leading dim over the 'batch' rule, the rest replicated."""
  shape = (batch_size if batch_size is not None else 0,) + (1,) * (ndim - 1)
  spec = logical_to_spec(("batch",) + (None,) * (ndim - 1), shape, mesh, rules)
  return NamedSharding(mesh, spec)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
