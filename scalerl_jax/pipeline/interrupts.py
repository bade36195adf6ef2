"""Stopping a run cleanly. SIGINT (Ctrl-C) and SIGTERM (preemption: Slurm, Kubernetes, a TPU VM maintenance
event) both ask for a checkpoint at the next step boundary and a clean exit; a second signal aborts at once,
except inside a `critical()` section (a checkpoint being written), where the abort waits until the section ends,
so no temporary checkpoint directory is left half-written."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Optional

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
  """The run's stop flag and the handlers that set it."""

  def __init__(self):
    self.flag = threading.Event()
    self.signum: Optional[int] = None  # the first signal received
    self._critical = 0
    self._abort_pending = False

  def is_set(self) -> bool:
    return self.flag.is_set()

  @property
  def exit_code(self) -> int:
    """128 + the signal number (130 for Ctrl-C, 143 for SIGTERM), 0 when none came."""
    return 128 + self.signum if self.signum is not None else 0

  def _handler(self, signum, frame):
    name = signal.Signals(signum).name
    if not self.flag.is_set():
      self.signum = signum
      self.flag.set()
      log.warning(f"{name}: checkpointing at the next step boundary, then stopping (send it again to abort)")
      return
    if self._critical:
      self._abort_pending = True
      log.warning(f"{name}: a checkpoint is being written; aborting as soon as it is complete")
      return
    raise KeyboardInterrupt

  @contextlib.contextmanager
  def installed(self):
    """Handlers on while inside (main thread only; elsewhere signals cannot be handled and this does nothing)."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    previous = {s: signal.signal(s, self._handler) for s in SIGNALS}
    try:
      yield self
    finally:
      for s, handler in previous.items():
        if handler is not None:  # None: the previous handler was not installed from Python
          signal.signal(s, handler)

  @contextlib.contextmanager
  def critical(self):
    """A section a second signal must not cut short (it aborts right after instead)."""
    self._critical += 1
    try:
      yield
    finally:
      self._critical -= 1
      if not self._critical and self._abort_pending:
        self._abort_pending = False
        raise KeyboardInterrupt
