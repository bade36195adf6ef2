"""Host-local <-> global arrays and per-process state, in one place.

Every process reads its own shard of the prompt stream, so a step's rows on this process are host-local numpy
arrays: rows [i * B_local, (i + 1) * B_local) of the global batch on process i. `to_global` assembles them into
global `jax.Array`s with the trainer's batch shardings (`jax.make_array_from_process_local_data`: each process
supplies the rows its devices hold; with one process that is the whole batch). `gather_json` collects a small JSON
record from every process (the data iterators' states for a checkpoint), so that process 0 can write them all and
each process restores its own on resume.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np


def to_global(local_tree: Any, shardings: Any) -> Any:
  """Host-local numpy leaves (this process's rows) -> global arrays with `shardings` (same tree structure; None
  leaves stay None). The global leading dim is the local one times the process count."""
  count = jax.process_count()

  def one(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_process_local_data(sharding, x, (x.shape[0] * count,) + x.shape[1:])

  return jax.tree.map(one, local_tree, shardings)


def gather_json(record: Any) -> list[Any]:
  """[record of process 0, record of process 1, ...]: every process gets every process's JSON-able record."""
  if jax.process_count() == 1:
    return [record]
  from jax.experimental import multihost_utils

  blob = np.frombuffer(json.dumps(record, sort_keys=True).encode(), np.uint8)
  lengths = multihost_utils.process_allgather(np.array([blob.size], np.int64)).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:blob.size] = blob
  blobs = multihost_utils.process_allgather(padded).reshape(len(lengths), -1)
  return [json.loads(bytes(b[:n]).decode()) for b, n in zip(blobs, lengths)]
