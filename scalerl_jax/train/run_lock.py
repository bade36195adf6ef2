"""One run per run directory: an OS file lock, taken without waiting, held for the whole run.

Two processes writing one run directory interleave metrics.jsonl and consumed_prompts.jsonl and overwrite each
other's checkpoints, so the second one is refused with the first one's pid, host and start time (kept in a small
JSON file next to the lock). The lock is `filelock.FileLock` (flock on POSIX): the kernel drops it when the holding
process dies, so a SIGKILLed run never leaves it stuck, and filelock closes the descriptor in forked children, so
a worker process that outlives its killed parent does not keep it either. Network filesystems without flock make
filelock fall back to a marker file, which a killed process can leave behind.

    with RunLock(run_dir):
      ...  # the run
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import socket
import sys
from typing import Optional

import filelock

from scalerl_jax.errors import UserError

LOCK_NAME = ".run.lock"
INFO_NAME = ".run.lock.json"


class RunDirBusyError(UserError, RuntimeError):
  """Another live process holds the run directory."""


class RunLock:
  """The lock of one run directory; `acquire()` raises RunDirBusyError at once if another process holds it."""

  def __init__(self, run_dir: str | os.PathLike):
    self.run_dir = pathlib.Path(run_dir).absolute()
    self.lock_path = self.run_dir / LOCK_NAME
    self.info_path = self.run_dir / INFO_NAME
    self._lock: Optional[filelock.FileLock] = None

  @property
  def held(self) -> bool:
    return self._lock is not None

  def acquire(self) -> "RunLock":
    if self._lock is not None:
      return self
    if self.run_dir.exists() and not self.run_dir.is_dir():
      raise UserError(f"run_dir {self.run_dir} is a file, not a directory")
    self.run_dir.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(self.lock_path))
    try:
      lock.acquire(timeout=0)
    except filelock.Timeout:
      raise RunDirBusyError(f"run_dir {self.run_dir} is in use by another run ({self._holder()}); wait for it "
                            f"to finish or stop it, or choose another run_dir") from None
    self._lock = lock
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
    tmp = self.info_path.with_name(f"{INFO_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, self.info_path)
    return self

  def _holder(self) -> str:
    try:
      info = json.loads(self.info_path.read_text())
      return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
      return f"holder unknown: {self.info_path} is missing or unreadable"

  def release(self) -> None:
    """Releases the lock; a no-op when not held (safe to call twice)."""
    lock, self._lock = self._lock, None
    if lock is None:
      return
    try:
      self.info_path.unlink(missing_ok=True)
    finally:
      lock.release()

  def __enter__(self) -> "RunLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()
