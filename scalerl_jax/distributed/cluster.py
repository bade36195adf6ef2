"""Start-up and failure of a many-process run: jax's multi-controller runtime, the abort record and its Watchdog,
and the check that every process runs the same config and code.

Start-up (`initialize`): `launch/train.py` calls `jax.distributed.initialize` when it runs as one process of many,
explicitly (`--coordinator HOST:PORT --num-processes N --process-id I`) or as jax's own cluster detection finds it
(TPU VM pod slices, GKE, Slurm). On CPU the collectives are gloo. A `Watchdog` thread then waits on the
coordination service's key-value store for an abort record: a process that fails writes its traceback there
(`abort`) and every other process prints it and exits, even one blocked in a collective, so nothing hangs on a
peer that is gone (a process killed outright is caught by jax's heartbeat instead).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pathlib
import sys
import threading
import time
from typing import Optional

import jax

from scalerl_jax.distributed.collectives import gather_json
from scalerl_jax.distributed.keys import _POLL_MS, ABORT_KEY, _client, _has_key
from scalerl_jax.errors import UserError


class DistributedError(UserError, RuntimeError):
  """Multi-process set-up that cannot work (flags, roles, mismatched processes); the message names the process."""


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
               process_id: Optional[int] = None, *, heartbeat_timeout_s: int = 100, init_timeout_s: int = 300) -> bool:
  """Starts jax's multi-controller runtime when this is one process of many; returns whether it did.

  Explicit: all of `coordinator`, `num_processes`, `process_id`. Otherwise jax's cluster detection decides (it is
  asked only whether more than one process is there). Must run before anything touches a jax backend."""
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
  # shutdown: a process that finished waits for the others (process 0 may still write the report and checkpoint)
  jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=init_timeout_s,
                             heartbeat_timeout_seconds=heartbeat_timeout_s, shutdown_timeout_seconds=3600)
  Watchdog().start()
  return True


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


class Watchdog(threading.Thread):
  """Waits for an abort record; on one, prints it and exits this process with the failed one's status. Stopped (and
  joined) at interpreter exit, before jax shuts its client down: a thread still inside a key-value wait then would
  abort."""

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
  """sha256 of the package's source files (all of scalerl_jax/): processes running different code must not share a
  run."""
  digest = hashlib.sha256()
  root = pathlib.Path(__file__).resolve().parents[1]
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
