"""Before a job is built: the CPU device count, the processes of a multi-process run, and the run directory.

Many processes (TPU pod slices, GPU clusters): the same command on every process, which then calls
`jax.distributed.initialize`: explicitly with a coordinator, a process count and an id, or as jax detects the
cluster (TPU VMs, GKE, Slurm). Process 0 prepares the run directory (run/run_dir.py) while the others wait; a
failure in any process ends all of them with its message or traceback (`stop_peers`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from scalerl_jax.errors import UserError
from scalerl_jax.run.run_dir import prepare_run_dir

log = logging.getLogger(__name__)


def set_cpu_devices(count: int) -> None:
  """mesh.cpu_devices: how many XLA devices the CPU platform shows (before any jax backend starts); an explicit
  --xla_force_host_platform_device_count in XLA_FLAGS is left alone."""
  if count and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    import jax
    try:
      jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as exc:  # jax already started in this process (main() called from Python): keep its devices
      log.warning("mesh.cpu_devices=%d not applied: %s", count, exc)


def start_processes(coordinator: Optional[str], num_processes: Optional[int], process_id: Optional[int],
                    heartbeat_timeout_s: int, single_process: bool) -> bool:
  """jax.distributed for a multi-process run (before any backend starts), when the flags ask for one or jax's
  cluster detection finds one; returns whether it is one. Processes other than 0 log warnings only."""
  from scalerl_jax import distributed

  explicit = coordinator or num_processes or process_id is not None
  if not explicit and (single_process or distributed.detected_process_count() <= 1):
    return False
  multi = distributed.initialize(coordinator, num_processes, process_id, heartbeat_timeout_s=heartbeat_timeout_s)
  if multi:
    import jax
    if jax.process_index() != 0:
      logging.getLogger("scalerl_jax").setLevel(logging.WARNING)
    log.info("process %d of %d (%d local devices of %d)", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
  return multi


def prepare(cfg, overwrite: bool, multi: bool) -> bool:
  """Process 0 checks and creates the run directory (raises UserError with a one-line reason) while every other
  process waits for it; returns whether this is the main process."""
  main_process = not multi or _process_index() == 0
  problem = prepare_run_dir(cfg, overwrite) if main_process else None
  if problem:
    raise UserError(problem)
  if multi:
    from scalerl_jax import distributed
    distributed.barrier("scalerl_jax/run_dir_ready")
  return main_process


def _process_index() -> int:
  import jax
  return jax.process_index()


def stop_peers(text: str, code: int) -> None:
  """In a multi-process run: record `text` for the other processes (they print it and stop) and exit `code`
  without waiting on them; otherwise return."""
  if "jax" in sys.modules:
    import jax
    if jax.distributed.is_initialized():  # (never starts a backend)
      from scalerl_jax import distributed
      distributed.abort(text, code)
