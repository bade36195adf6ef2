"""The run directory before a job is built: created, writable, and never an earlier run overwritten by accident.

checkpoint.resume=false into a directory that holds an earlier run is refused (the fresh run would replace its
metrics.jsonl and mix its checkpoints with the old ones) unless the caller passes `overwrite`, which deletes those
parts first, under the run lock, so a live run's files are never deleted.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import tempfile
from typing import Optional

from scalerl_jax.errors import UserError
from scalerl_jax.train.run_lock import RunLock

# what a run writes into its run directory and a fresh run (checkpoint.resume=false) would replace
PREVIOUS_RUN = ("metrics.jsonl", "consumed_prompts.jsonl", "checkpoints", "tensorboard")
log = logging.getLogger(__name__)


def previous_run(run_dir: pathlib.Path) -> list[str]:
  """The parts of an earlier run in `run_dir` (non-empty files and folders of PREVIOUS_RUN)."""
  found = []
  for name in PREVIOUS_RUN:
    p = run_dir / name
    if (p.is_file() and p.stat().st_size > 0) or (p.is_dir() and any(p.iterdir())):
      found.append(name + ("/" if p.is_dir() else ""))
  return found


def unwritable(run_dir: pathlib.Path) -> Optional[str]:
  """Why the run could not write run_dir or its checkpoints/ folder, found now with a real file rather than at the
  first checkpoint (a read-only mount, permissions, a file where the folder belongs); None when it can."""
  ckpt = run_dir / "checkpoints"
  if ckpt.exists() and not ckpt.is_dir():
    return f"run_dir {run_dir}: checkpoints is a file; the run keeps its checkpoints in a folder of that name"
  for folder in (run_dir, ckpt) if ckpt.is_dir() else (run_dir,):
    try:
      with tempfile.TemporaryFile(dir=folder):
        pass
    except OSError as exc:
      return f"run_dir {run_dir}: cannot write in {folder} ({exc.strerror or exc})"
  return None


def prepare_run_dir(cfg, overwrite: bool) -> Optional[str]:
  """Checks and creates cfg.run_dir before the job is built; returns a one-line error, or None when fine."""
  run_dir = pathlib.Path(cfg.run_dir)  # as RLJob reads it
  if run_dir.exists() and not run_dir.is_dir():
    return f"run_dir {run_dir}: is a file"
  try:
    run_dir.mkdir(parents=True, exist_ok=True)
  except OSError as exc:
    return f"run_dir {run_dir}: cannot create it ({exc.strerror or exc})"
  problem = unwritable(run_dir)
  if problem:
    return problem
  previous = previous_run(run_dir)
  if not previous:
    return None
  if cfg.checkpoint.resume:
    if overwrite:
      log.warning("--overwrite does nothing without checkpoint.resume=false (%s is resumed, not replaced)", run_dir)
    if "checkpoints/" not in previous and "metrics.jsonl" in previous:
      log.warning("%s holds metrics.jsonl but no checkpoint: this run starts afresh and replaces it", run_dir)
    return None
  if not overwrite:
    return (f"run_dir {run_dir} holds an earlier run ({', '.join(previous)}) that checkpoint.resume=false would "
            "overwrite: pass --overwrite to delete it, choose another run_dir, or drop checkpoint.resume=false to "
            "continue it")
  try:
    with RunLock(run_dir):  # a live run holds the lock: never delete what it writes
      log.warning("--overwrite: deleting the earlier run's %s in %s", ", ".join(previous), run_dir)
      for name in previous:
        p = run_dir / name.rstrip("/")
        shutil.rmtree(p) if p.is_dir() else p.unlink()
  except UserError as exc:  # RunDirBusyError
    return str(exc)
  except OSError as exc:
    return f"run_dir {run_dir}: cannot delete the earlier run ({exc.strerror or exc}: {exc.filename})"
  return None
