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
(a copy on the same devices, or a transfer to the generator mesh).

Across processes (the generator mesh is process-local: one inference slice per process):
  colocated      one jitted identity gathers the params to replicated on the trainer mesh (an all-gather among
                 the trainer processes, XLA's collectives), then each process copies its local replica into its
                 generator's rollout shardings;
  disaggregated  the same gather among the trainer processes, then trainer process 0 sends the replica from its
                 first device to each generator process's first device (`distributed.Channel`:
                 jax.experimental.transfer), where `WeightReceiver` lays it out in the rollout shardings and publishes it.
Each sync's seconds and bytes are kept (`last_seconds`, `last_bytes`) and logged per step.

Adapters (lora.rank > 0): only the adapters train, so the first sync moves the whole tree and every later one the
adapters alone (`Partial`): the generator keeps the frozen base it received first and joins each sync's adapters
to it, applying them in its forward (factored, as the trainer does: no merged copy of the base is made).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence

import jax

from scalerl_jax import distributed


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


def local_replica(params: Any, mesh) -> list:
  """The leaves of `params` gathered to replicated on `mesh` (a collective among the processes that own its
  devices: each of them calls this, in the same order), as this process's single-device copies."""
  full = distributed.replicate_fn(mesh)(params)
  return [x.addressable_data(0) for x in jax.tree.leaves(full)]


def place(leaves: Sequence[Any], shardings: Any) -> Any:
  """Single-device leaves -> the tree of `shardings` laid out in them (a fresh copy, complete on return)."""
  tree = jax.tree.unflatten(jax.tree.structure(shardings), list(leaves))
  return jax.block_until_ready(jax.device_put(tree, shardings, may_alias=False))


def _nbytes(tree: Any) -> int:
  return int(sum(x.nbytes for x in jax.tree.leaves(tree)))


class Partial:
  """Syncs of the trainable part only, for a policy whose base is frozen (`policy.split_trainable` /
  `join_trainable`): the first sync's whole tree is kept as the source of the frozen part (`keep`); later syncs
  send `outgoing(params)` (laid out in `shardings`, the trainable part's) and the receiver rebuilds the whole tree
  with `incoming`."""

  def __init__(self, policy, shardings: Any):
    self.policy = policy
    self.shardings = None if shardings is None else policy.split_trainable(shardings)[0]
    self.frozen: Any = None

  @classmethod
  def of(cls, policy, shardings: Any) -> Optional["Partial"]:
    """None when every param trains (no policy given, or one without adapters)."""
    return None if policy is None or getattr(policy, "lora", None) is None else cls(policy, shardings)

  def keep(self, whole: Any) -> Any:
    if whole is not None:
      self.frozen = self.policy.split_trainable(whole)[1]
    return whole

  def outgoing(self, params: Any) -> Any:
    return self.policy.split_trainable(params)[0]

  def incoming(self, part: Any) -> Any:
    return None if part is None else self.policy.join_trainable(part, self.frozen)


class WeightSync:
  """Copies trainer params into the rollout `shardings` and publishes them to a WeightBox, timing each sync.

  Multi-process: `trainer_mesh` (spanning processes) makes the copy go through `local_replica`; with a `channel`,
  the replica is also sent to each process in `send_to` (disaggregated generators)."""

  def __init__(self, shardings: Any, params: Any, version: int, *, trainer_mesh=None, channel=None,
               send_to: Sequence[int] = (), policy=None):
    self.shardings, self.trainer_mesh, self.channel, self.send_to = shardings, trainer_mesh, channel, list(send_to)
    self.last_seconds = 0.0  # wall time of the latest sync (copy + publish)
    self.last_bytes = 0  # bytes that sync moved to a generator (the rollout copy's own size in one process)
    self.syncs = 0
    self.partial = Partial.of(policy, shardings)  # adapters: later syncs move them alone
    first = self._copy(params, shardings)
    self.box = WeightBox(first if self.partial is None else self.partial.keep(first), version)

  def _copy(self, params: Any, shardings: Any) -> Any:
    if self.trainer_mesh is None:
      out = to_rollout_layout(params, shardings)
      self.last_bytes = _nbytes(out)
      return out
    leaves = local_replica(params, self.trainer_mesh)
    self.last_bytes = 0
    for dst in self.send_to:
      self.channel.send(dst, "weights", leaves)
      self.last_bytes += self.channel.last["bytes"]
    return place(leaves, shardings) if shardings is not None else None

  def publish(self, params: Any, version: int) -> None:
    t0 = time.perf_counter()
    if self.partial is None:
      new = self._copy(params, self.shardings)
    else:
      new = self.partial.incoming(self._copy(self.partial.outgoing(params), self.partial.shardings))
    self.box.publish(new, version)
    self.last_seconds = time.perf_counter() - t0
    self.syncs += 1


class WeightReceiver:
  """A disaggregated generator's end of the weight sync: receives each sync from trainer process `src` and
  publishes it, laid out in the rollout `shardings`, to its WeightBox."""

  def __init__(self, shardings: Any, channel, src: int, policy=None):
    self.shardings, self.channel, self.src = shardings, channel, src
    self.box: Optional[WeightBox] = None
    self.last_seconds, self.last_bytes, self.syncs = 0.0, 0, 0
    self.partial = Partial.of(policy, shardings)  # adapters: after the first sync, they alone arrive

  def fetch(self) -> Any:
    """The next sync's params, laid out in the rollout shardings (not yet published)."""
    t0 = time.perf_counter()
    first = self.syncs == 0 or self.partial is None
    leaves = self.channel.recv(self.src, "weights")
    if first:
      params = place(leaves, self.shardings)
      if self.partial is not None:
        self.partial.keep(params)
    else:
      params = self.partial.incoming(place(leaves, self.partial.shardings))
    self.last_bytes, self.last_seconds = self.channel.last["bytes"], time.perf_counter() - t0
    self.syncs += 1
    return params

  def receive(self, version: int) -> None:
    """The next sync, published to the box as `version`."""
    self.box.publish(self.fetch(), version)
