"""Weight sync: the trainer's params, copied into the rollout layout and published to the generators.

    trainer (TRAIN layout, trainer mesh)                      generator (ROLLOUT layout, generator mesh)
    state.params v ──copy──► fresh buffer in rollout layout ──publish(., v)──► WeightBox ──latest()──► decode chunk

Ordering contract:
  1. the trainer finishes step s and copies the new params into the generator's layout. The copy is a fresh buffer
     (never an alias), because the train state is donated to the next step; it is complete (blocked on) before it
     is published, so the generator can never read a half-written tree;
  2. it publishes (params, s + 1). The generator reads the box between decode chunks, so every token generated from
     then on records version s + 1. Sequences in flight continue on the new params with the KV cache their earlier
     tokens got from older params (PipelineRL); nothing is drained or recomputed;
  3. versions only grow, and the box holds exactly one (params, version) pair: a reader gets a consistent pair.
  Admission under the staleness bound (which batch may start with which version) is the orchestrator's part.

Same process, colocated or disjoint devices: `jax.device_put(..., may_alias=False)` into the rollout shardings
(a copy on the same devices, or a transfer to the generator mesh). Across processes, multi-host weight sync extends
this module.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jax


def to_rollout_layout(params: Any, shardings: Any) -> Any:
  """A fresh copy of `params` in `shardings` (the rollout layout), complete when this returns."""
  return jax.block_until_ready(jax.device_put(params, shardings, may_alias=False))


class WeightBox:
  """The latest published (params, version); the generator reads it between decode chunks."""

  def __init__(self, params: Any, version: int):
    self._cond = threading.Condition()
    self._params, self._version = params, version

  def publish(self, params: Any, version: int) -> None:
    with self._cond:
      if version < self._version:
        raise ValueError(f"weight sync: version {version} published after {self._version} (versions only grow)")
      self._params, self._version = params, version
      self._cond.notify_all()

  def latest(self) -> tuple[Any, int]:
    with self._cond:
      return self._params, self._version

  def wait_newer(self, version: int, timeout: float) -> None:
    with self._cond:
      self._cond.wait_for(lambda: self._version > version, timeout=timeout)


class WeightSync:
  """Copies trainer params into the rollout `shardings` and publishes them to a WeightBox, timing each sync."""

  def __init__(self, shardings: Any, params: Any, version: int):
    self.shardings = shardings
    self.box = WeightBox(to_rollout_layout(params, shardings), version)
    self.last_seconds = 0.0  # wall time of the latest sync (copy + publish)
    self.syncs = 0

  def publish(self, params: Any, version: int) -> None:
    t0 = time.perf_counter()
    self.box.publish(to_rollout_layout(params, self.shardings), version)
    self.last_seconds = time.perf_counter() - t0
    self.syncs += 1
