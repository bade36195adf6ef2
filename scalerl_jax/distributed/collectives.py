"""Collectives between processes: host data -> global arrays, global arrays -> host, and gathers of any picklable
record among any subset of processes.

Every process reads its own shard of the prompt stream and generates its rollouts. The scored groups of a step are
then gathered to every trainer process (`allgather`: rl.prepare normalizes advantages and weights over the whole
step batch, and NPR must decide the same on every process), and `from_global` builds the global batch arrays with
each process supplying only its own devices' shards (`jax.make_array_from_callback`). `gather_json` collects small
records (data-iterator states for a checkpoint). Both gather among any subset of processes with one jitted
all-gather on a mesh of their first devices (`replicate_fn`).
"""

from __future__ import annotations

import functools
import json
import pickle
from typing import Any, Optional, Sequence

import jax
import numpy as np


def from_global(tree: Any, shardings: Any) -> Any:
  """Host numpy leaves holding the whole array (the same on every process that calls this) -> global arrays with
  `shardings`, each process supplying only the shards its own devices hold (None leaves stay None)."""
  def one(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(one, tree, shardings)


@functools.lru_cache(maxsize=16)
def replicate_fn(mesh):
  """A jitted identity whose outputs are replicated on `mesh`: an all-gather among the processes that own its
  devices (each of them calls it, in the same order)."""
  from jax.sharding import NamedSharding, PartitionSpec

  return jax.jit(lambda tree: tree, out_shardings=NamedSharding(mesh, PartitionSpec()))


def to_host(tree: Any) -> Any:
  """numpy copies of a tree of arrays on every process that holds a part of them (jax.device_get, which cannot
  read arrays spanning other processes' devices, after one gather on their mesh when they do)."""
  leaves = jax.tree.leaves(tree)
  if all(x.is_fully_addressable for x in leaves):
    return jax.device_get(tree)
  full = replicate_fn(leaves[0].sharding.mesh)(tree)
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), full)


def allgather(record: Any, processes: Optional[Sequence[int]] = None) -> list[Any]:
  """[record of each process in `processes` (default: all), in order] for any picklable record: a collective
  among those processes (each calls it, in the same order)."""
  processes = list(range(jax.process_count())) if processes is None else list(processes)
  if len(processes) == 1:
    return [record]
  blobs = _allgather_bytes(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL), processes)
  return [pickle.loads(b) for b in blobs]


def gather_json(record: Any, processes: Optional[Sequence[int]] = None) -> list[Any]:
  """`allgather` of a JSON-able record, each process's as read back from JSON (as a checkpoint stores them)."""
  texts = allgather(json.dumps(record, sort_keys=True), processes)
  return [record] if len(texts) == 1 else [json.loads(t) for t in texts]


def _first_devices(processes: Sequence[int]) -> list:
  first = {}
  for d in jax.devices():
    first.setdefault(d.process_index, d)
  return [first[p] for p in processes]


def _allgather_array(x: np.ndarray, processes: Sequence[int]) -> np.ndarray:
  """[len(processes), *x.shape]: each listed process's `x` (same shape everywhere), through one jitted gather on
  a mesh of their first devices."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  mesh = Mesh(np.array(_first_devices(processes)), ("p",))
  stacked = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("p")), x[None],
                                                   (len(processes),) + x.shape)
  out = replicate_fn(mesh)(stacked)
  return np.asarray(out.addressable_data(0))


def _allgather_bytes(blob: bytes, processes: Sequence[int]) -> list[bytes]:
  data = np.frombuffer(blob, np.uint8)
  lengths = _allgather_array(np.array([data.size], np.int64), processes).reshape(-1)
  size = 1 << max(int(lengths.max()) - 1, 0).bit_length()  # a power of two: few distinct shapes to compile
  padded = np.zeros(size, np.uint8)
  padded[:data.size] = data
  blobs = _allgather_array(padded, processes)
  return [bytes(b[:n]) for b, n in zip(blobs, lengths)]
