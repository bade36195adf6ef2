"""Many processes, one run: start-up, roles, host-local <-> global arrays, and the messages between processes.

Start-up (`initialize`): `launch/train.py` calls `jax.distributed.initialize` when it runs as one process of many,
explicitly (`--coordinator HOST:PORT --num-processes N --process-id I`) or as jax's own cluster detection finds it
(TPU VM pod slices, GKE, Slurm). On CPU the collectives are gloo. A `Watchdog` thread then waits on the
coordination service's key-value store for an abort record: a process that fails writes its traceback there
(`abort`) and every other process prints it and exits, even one blocked in a collective, so nothing hangs on a
peer that is gone (a process killed outright is caught by jax's heartbeat instead).

Roles (`Topology`): with `mesh.generator_processes = 0` every process trains and generates (colocated: the trainer
mesh spans every process's devices; each process's generator is an inference slice on its own devices, because
continuous batching makes host-side decisions per slice). With n > 0 the last n processes only generate and the
others only train (disaggregated: the two meshes are disjoint sets of processes' devices).

Arrays: every process reads its own shard of the prompt stream and generates its rollouts. The scored groups of a
step are then gathered to every trainer process (`allgather`: rl.prepare normalizes advantages and weights over
the whole step batch, and NPR must decide the same on every process), and `from_global` builds the global batch
arrays with each process supplying only its own devices' shards (`jax.make_array_from_callback`). `gather_json`
collects small records (data-iterator states for a checkpoint). Both gather among any subset of processes with
one jitted all-gather on a mesh of their first devices.

Messages between processes (`Channel`, disaggregated runs): point-to-point transfers of trees of arrays between
two processes' first devices through `jax.experimental.transfer` servers (one per process; the sender schedules a
message under its id, the receiver pulls it), with each message's header (id, shapes, dtypes) in the key-value
store, so the receiver waits for a sender that is still busy in bounded polls that also watch the abort record.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import logging
import os
import pathlib
import pickle
import sys
import threading
import time
from typing import Any, Optional, Sequence

import jax
import numpy as np

from scalerl_jax.errors import UserError

log = logging.getLogger(__name__)
ABORT_KEY = "scalerl_jax/abort"
STOP_KEY = "scalerl_jax/stop"  # set by the trainers when a disaggregated run ends early: generators stop waiting
_POLL_MS = 500


class DistributedError(UserError, RuntimeError):
  """Multi-process set-up that cannot work (flags, roles, mismatched processes); the message names the process."""


class Stopped(Exception):
  """The trainers ended the run (STOP_KEY) while this process waited for a message."""


def stop_requested() -> bool:
  try:
    _client().key_value_try_get(STOP_KEY)
    return True
  except Exception:  # noqa: BLE001 (NOT_FOUND)
    return False


def request_stop() -> None:
  """Tells every process waiting in `wait_for_key` that the run is over (idempotent)."""
  try:
    _client().key_value_set(STOP_KEY, "stop")
  except Exception:  # noqa: BLE001 (already set)
    pass


# ---- start-up ------------------------------------------------------------------------------------------------
def detected_process_count() -> int:
  """How many processes jax's cluster detection sees here (TPU VM pod, GKE, Slurm, ...); 1 when none."""
  from jax._src.clusters import ClusterEnv

  for env in ClusterEnv._cluster_types:
    try:
      if not env.opt_in_only_method and env.is_env_present():
        return int(env.get_process_count())
    except Exception:  # noqa: BLE001 (a detector that cannot answer: not that cluster)
      continue
  return 1


def initialize(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, *, transfer_address: Optional[str] = None,
               heartbeat_timeout_s: int = 100, init_timeout_s: int = 300) -> bool:
  """Starts jax's multi-controller runtime when this is one process of many; returns whether it did.

  Explicit: all of `coordinator`, `num_processes`, `process_id`. Otherwise jax's cluster detection decides (it is
  asked only whether more than one process is there). `transfer_address`: the host other processes reach this
  one's transfer server at (disaggregated runs; default `transfer_host()`). Must run before anything touches a
  jax backend."""
  given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
  if any(v is not None for v in given.values()):
    missing = [k for k, v in given.items() if v is None]
    if missing:
      raise DistributedError(f"multi-process: {', '.join(missing)} missing (give --coordinator, --num-processes and "
                             "--process-id together, or none of them on a cluster jax detects)")
    if not 0 <= process_id < num_processes:
      raise DistributedError(f"--process-id {process_id} is not in [0, --num-processes={num_processes})")
    if num_processes == 1:
      return False
  elif detected_process_count() <= 1:
    return False
  if jax.config.jax_platforms in (None, "", "cpu") or "cpu" in str(jax.config.jax_platforms):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  global _TRANSFER_HOST
  _TRANSFER_HOST = transfer_address
  # shutdown: a process that finished waits for the others (process 0 may still write the report and checkpoint)
  jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=init_timeout_s,
                             heartbeat_timeout_seconds=heartbeat_timeout_s, shutdown_timeout_seconds=3600)
  Watchdog().start()
  return True


def _client():
  from jax._src import distributed as jax_distributed

  return jax_distributed.global_state.client


def abort(text: str, code: int = 1) -> None:
  """Records this process's failure for the others (their Watchdog prints `text` and exits), then exits `code`
  without waiting for jax's shutdown barrier (the peers may be blocked in a collective). Process 0 holds the
  coordination service: it first gives the others a few seconds to exit (a peer that outlives the service is
  killed by jax with SIGABRT instead of its own status)."""
  if jax.process_count() > 1:
    try:
      _client().key_value_set(ABORT_KEY, f"{code}\nprocess {jax.process_index()}: {text}")
    except Exception:  # noqa: BLE001 (another process aborted first: the key is set)
      pass
  sys.stderr.write(text if text.endswith("\n") else text + "\n")
  sys.stderr.flush()
  _exit_after_peers(code)


def _exit_after_peers(code: int, wait_s: float = 5.0) -> None:
  """os._exit(code); a process other than 0 first says it is leaving, process 0 waits (bounded) for them all."""
  if jax.process_count() > 1:
    try:
      client, me = _client(), jax.process_index()
      client.key_value_set(f"{ABORT_KEY}/exited/{me}", "1", allow_overwrite=True)
      if me == 0:
        deadline = time.monotonic() + wait_s
        for i in range(1, jax.process_count()):
          while not _has_key(client, f"{ABORT_KEY}/exited/{i}") and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 (the service is gone or the key absent: nothing left to wait for)
      pass
  os._exit(code)


def _has_key(client, key: str) -> bool:
  try:
    client.key_value_try_get(key)
    return True
  except Exception:  # noqa: BLE001 (NOT_FOUND)
    return False


def aborted() -> Optional[str]:
  """The abort record ("status\nprocess i: text") when some process has failed, else None (one key-value read)."""
  try:
    return _client().key_value_try_get(ABORT_KEY)
  except Exception:  # noqa: BLE001 (NOT_FOUND)
    return None


class Watchdog(threading.Thread):
  """Waits for an abort record; on one, prints it and exits this process with the failed one's status. Stopped (and joined) at
  interpreter exit, before jax shuts its client down: a thread still inside a key-value wait then would abort."""

  def __init__(self):
    super().__init__(name="scalerl-watchdog", daemon=True)
    self._done = threading.Event()

  def start(self) -> None:
    super().start()
    atexit.register(self.stop)

  def stop(self) -> None:
    self._done.set()
    self.join(timeout=5)

  def run(self) -> None:
    client = _client()
    while not self._done.is_set():
      try:
        text = client.blocking_key_value_get(ABORT_KEY, _POLL_MS)
      except Exception as exc:  # noqa: BLE001
        if "DEADLINE_EXCEEDED" in str(exc):
          continue
        return  # the coordination service is gone: jax's own error handling ends the process
      code, _, text = text.partition("\n")
      sys.stderr.write(f"stopping process {jax.process_index()}: another process failed.\n{text}\n")
      sys.stderr.flush()
      _exit_after_peers(int(code) if code.isdigit() else 1)


def code_version() -> str:
  """sha256 of the package's source files: processes running different code must not share a run."""
  digest = hashlib.sha256()
  root = pathlib.Path(__file__).resolve().parent
  for path in sorted(root.rglob("*.py")):
    digest.update(str(path.relative_to(root)).encode())
    digest.update(path.read_bytes())
  return digest.hexdigest()[:16]


def check_same_everywhere(record: dict[str, str]) -> None:
  """Every process must hold the same `record` (the config as YAML, the code version); otherwise DistributedError
  names each process and what differs from process 0's (for text, the first differing lines)."""
  records = gather_json(record)
  bad = []
  for i, r in enumerate(records):
    for k in record:
      mine, first = str(r.get(k)), str(records[0].get(k))
      if mine != first:
        lines = [f"{a.strip()!r} vs {b.strip()!r}" for a, b in zip(first.splitlines(), mine.splitlines()) if a != b]
        bad.append(f"process {i}: {k} differs from process 0's ({'; '.join(lines[:3]) or 'lengths differ'})")
  if bad:
    raise DistributedError("processes disagree (the same config, overrides and code on every process?): " +
                           "; ".join(bad))


# ---- roles -----------------------------------------------------------------------------------------------------
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


# ---- arrays ----------------------------------------------------------------------------------------------------
def from_global(tree: Any, shardings: Any) -> Any:
  """Host numpy leaves holding the whole array (the same on every process that calls this) -> global arrays with
  `shardings`, each process supplying only the shards its own devices hold (None leaves stay None)."""
  def one(x, sharding):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(one, tree, shardings)


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


def _allgather_bytes(blob: bytes, processes: Sequence[int]) -> list[bytes]:
  data = np.frombuffer(blob, np.uint8)
  lengths = _allgather_array(np.array([data.size], np.int64), processes).reshape(-1)
  size = 1 << max(int(lengths.max()) - 1, 0).bit_length()  # a power of two: few distinct shapes to compile
  padded = np.zeros(size, np.uint8)
  padded[:data.size] = data
  blobs = _allgather_array(padded, processes)
  return [bytes(b[:n]) for b, n in zip(blobs, lengths)]


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


# ---- messages between processes ------------------------------------------------------------------------------
class Channel:
  """Ordered point-to-point messages between processes: `send(dst, tag, tree)` / `recv(src, tag)` with trees of
  numpy or jax arrays (`send_obj` / `recv_obj`: any picklable object). Both sides call in the same order per
  (src, dst, tag); other processes take no part. Each process runs a `jax.experimental.transfer` server: the sender
  schedules its arrays under a message id (`await_pull`) and writes the header (id, shapes, dtypes) to the
  key-value store; the receiver waits for the header in bounded polls and pulls. `last` holds the latest message's
  bytes and seconds (the receiver's seconds include the transfer; the sender's only the scheduling)."""

  def __init__(self, prefix: str = "scalerl_jax/msg", host: Optional[str] = None):
    from jax.experimental import transfer

    self.prefix = prefix
    self._seq: dict[tuple[int, int, str], int] = {}
    self._device = jax.local_devices()[0]
    self._server = transfer.start_transfer_server(self._device.client, f"{host or transfer_host()}:0",
                                                  [f"{host or transfer_host()}:0"])
    self._connections: dict[int, Any] = {}
    _client().key_value_set(f"{prefix}/address/{jax.process_index()}", self._server.address())
    self.last = {"bytes": 0, "seconds": 0.0}

  def _key(self, src: int, dst: int, tag: str) -> tuple[str, int]:
    n = self._seq.get((src, dst, tag), 0)
    self._seq[(src, dst, tag)] = n + 1
    key = f"{self.prefix}/{src}-{dst}/{tag}/{n}"
    return key, int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")

  def send(self, dst: int, tag: str, tree: Any) -> None:
    key, uuid = self._key(jax.process_index(), dst, tag)
    t0 = time.perf_counter()
    leaves = [jax.device_put(x, self._device) for x in jax.tree.leaves(tree)]
    self._server.await_pull(uuid, leaves)
    header = {"uuid": uuid, "shapes": [list(x.shape) for x in leaves], "dtypes": [str(x.dtype) for x in leaves]}
    _client().key_value_set(key, json.dumps(header))
    self.last = {"bytes": int(sum(x.nbytes for x in leaves)), "seconds": time.perf_counter() - t0}

  def recv(self, src: int, tag: str) -> list:
    """The leaves of the message, as arrays on this process's first device."""
    from jax.sharding import SingleDeviceSharding

    key, _ = self._key(src, jax.process_index(), tag)
    header = json.loads(wait_for_key(key))
    t0 = time.perf_counter()
    if src not in self._connections:
      self._connections[src] = self._server.connect(wait_for_key(f"{self.prefix}/address/{src}"))
    specs = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d), sharding=SingleDeviceSharding(self._device))
             for s, d in zip(header["shapes"], header["dtypes"])]
    out = jax.block_until_ready(self._connections[src].pull(header["uuid"], specs)) if specs else []
    _client().key_value_delete(key)
    self.last = {"bytes": int(sum(x.nbytes for x in out)), "seconds": time.perf_counter() - t0}
    return list(out)

  def send_obj(self, dst: int, tag: str, obj: Any) -> None:
    self.send(dst, tag, [np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)])

  def recv_obj(self, src: int, tag: str) -> Any:
    (blob,) = self.recv(src, tag)
    return pickle.loads(np.asarray(blob).tobytes())


_TRANSFER_HOST: Optional[str] = None


def transfer_host() -> str:
  """The address other processes reach this one at for transfers: --transfer-address, else this host's address
  on the route to the coordinator (127.0.0.1 when the coordinator is local)."""
  if _TRANSFER_HOST:
    return _TRANSFER_HOST
  import socket

  from jax._src import distributed as jax_distributed

  host = (jax_distributed.global_state.coordinator_address or "127.0.0.1:0").rsplit(":", 1)[0].strip("[]")
  if host in ("localhost", "127.0.0.1", "::1"):
    return "127.0.0.1"
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent: the route's own address
    probe.connect((host, 9))
    return probe.getsockname()[0]


def wait_for_key(key: str) -> str:
  """The value of `key` once some process sets it. Waits as long as it takes (a peer may be busy for minutes),
  but in bounded polls: a failed process's abort record ends the wait (the Watchdog exits this process), and the
  trainers' stop record raises Stopped."""
  client = _client()
  while True:
    try:
      return client.blocking_key_value_get(key, _POLL_MS)
    except Exception as exc:  # noqa: BLE001
      if "DEADLINE_EXCEEDED" not in str(exc):
        raise
    if stop_requested():
      raise Stopped(key)
    if aborted() is not None:
      time.sleep(5)  # the Watchdog is exiting this process


def barrier(name: str, timeout_s: int = 600) -> None:
  """Every process waits here until all have arrived (the coordination service's barrier)."""
  if jax.process_count() > 1:
    _client().wait_at_barrier(name, timeout_s * 1000)
