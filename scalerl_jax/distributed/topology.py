"""Roles: which processes train and which generate, and which devices each mesh gets.

With `mesh.generator_processes = 0` every process trains and generates (colocated: the trainer mesh spans every
process's devices; each process's generator is an inference slice on its own devices, because continuous batching
makes host-side decisions per slice). With n > 0 the last n processes only generate and the others only train
(disaggregated: the two meshes are disjoint sets of processes' devices).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax

from scalerl_jax.distributed.cluster import DistributedError


@dataclasses.dataclass(frozen=True)
class Topology:
  """Who trains and who generates. `generator_processes` = 0: every process does both (colocated); n > 0: the last
  n processes generate, the others train (disaggregated)."""
  process_index: int = 0
  process_count: int = 1
  generator_processes: int = 0

  @classmethod
  def current(cls, generator_processes: int = 0) -> "Topology":
    n = jax.process_count()
    if generator_processes and n == 1:
      raise DistributedError(f"mesh.generator_processes={generator_processes} needs a multi-process run (this is "
                             "one process); use mesh.generator_devices to split one process's devices")
    if generator_processes >= n:
      raise DistributedError(f"mesh.generator_processes={generator_processes} leaves no trainer among {n} processes")
    return cls(jax.process_index(), n, generator_processes)

  @property
  def disaggregated(self) -> bool:
    return self.generator_processes > 0

  @property
  def trainers(self) -> list[int]:
    return list(range(self.process_count - self.generator_processes))

  @property
  def generators(self) -> list[int]:
    return list(range(self.process_count - self.generator_processes, self.process_count)) if self.disaggregated \
        else list(range(self.process_count))

  @property
  def trains(self) -> bool:
    return self.process_index in self.trainers

  @property
  def generates(self) -> bool:
    return self.process_index in self.generators

  def devices_of(self, processes: Sequence[int]) -> list:
    return [d for d in jax.devices() if d.process_index in set(processes)]


def split_for(topology: Topology, generator_devices: int) -> tuple[list, list]:
  """(trainer devices: global, generator devices: this process's). One process: `mesh.split_devices`. Colocated:
  the trainer mesh spans every process (less each one's last `generator_devices`), each generator its own
  process's devices (those last ones, or all of them, shared). Disaggregated: the trainer processes' devices, and
  this process's own (a generator's slice; on a trainer, its evaluation engine)."""
  from scalerl_jax.mesh import MeshError, split_devices

  if topology.process_count == 1:
    return split_devices(generator_devices)
  local = jax.local_devices()
  if topology.disaggregated:
    if generator_devices:
      raise MeshError(f"mesh.generator_devices={generator_devices} splits each process's devices; with "
                      "mesh.generator_processes the generators are whole processes: leave it 0")
    return topology.devices_of(topology.trainers), local
  if generator_devices == 0:
    return list(jax.devices()), local
  if generator_devices >= len(local):
    raise MeshError(f"mesh.generator_devices={generator_devices} leaves no trainer device out of this process's "
                    f"{len(local)}")
  trainer = [d for p in range(topology.process_count) for d in topology.devices_of([p])[:-generator_devices]]
  return trainer, local[-generator_devices:]
