"""Stopping a run cleanly. SIGINT (Ctrl-C) and SIGTERM (preemption: Slurm, Kubernetes, a TPU VM maintenance
event) both set one stop flag that the whole run checks: the RL loop at each step boundary (checkpoint, then a
clean exit), the warm start after each of its steps, the job before compiling and before the step-0 evaluation,
an evaluation between its decode steps (the last three raise `Stopped`). A preempted VM gives about 30 s, so no
phase may run on for long after the flag is set.

A second signal aborts (`Aborted`, a KeyboardInterrupt: the entry point prints one line and exits 128 + the
signal), except inside a `critical()` section (a checkpoint being written), where the abort waits until the
section ends, so no temporary checkpoint directory is left half-written. Python runs signal handlers on the main
thread between bytecodes only, so a main thread inside a long C call (an XLA compilation) would not see the
second signal until the call returns: a watcher thread that sees every signal at once (`signal.set_wakeup_fd`)
ends the process itself, with the same line, when an abort has not ended it within ABORT_GRACE_S."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Optional

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
ABORT_GRACE_S = 5.0  # the orderly abort (unwinding, reward workers stopped) gets this long before the watcher exits


class Stopped(Exception):
  """A long phase gave up at the stop flag's request; the message says where (`the warm start ...`)."""


class Aborted(KeyboardInterrupt):
  """A second signal: stop at once, without a checkpoint."""

  def __init__(self, signum: int):
    super().__init__(abort_message(signum))
    self.signum = signum

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


def abort_message(signum: int) -> str:
  return (f"{signal.Signals(signum).name} again: stopped at once, without a checkpoint (the same command resumes "
          "from the latest one, if any)")


class Interrupts:
  """The run's stop flag and the handlers that set it."""

  def __init__(self):
    self.flag = threading.Event()
    self.signum: Optional[int] = None  # the first signal received
    self._critical = 0
    self._abort_pending: Optional[int] = None  # a second signal that came during a critical section

  def is_set(self) -> bool:
    return self.flag.is_set()

  @property
  def name(self) -> str:
    """The first signal's name (SIGTERM), '' when none came."""
    return signal.Signals(self.signum).name if self.signum is not None else ""

  @property
  def exit_code(self) -> int:
    """128 + the signal number (130 for Ctrl-C, 143 for SIGTERM), 0 when none came."""
    return 128 + self.signum if self.signum is not None else 0

  def _handler(self, signum, frame):
    self.receive(signum)

  def receive(self, signum: int) -> None:
    """What a delivered signal does (the handler's body; tests call it to stand for a signal at a chosen point)."""
    name = signal.Signals(signum).name
    if not self.flag.is_set():
      self.signum = signum
      self.flag.set()
      log.warning(f"{name}: checkpointing at the next step boundary, then stopping (a warm start or an evaluation "
                  "stops at once; send it again to abort)")
      return
    if self._critical:
      self._abort_pending = signum
      log.warning(f"{name}: a checkpoint is being written; aborting as soon as it is complete")
      return
    raise Aborted(signum)

  @contextlib.contextmanager
  def installed(self):
    """Handlers (and the watcher thread) on while inside (main thread only; elsewhere signals cannot be handled and
    this does nothing)."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    previous = {s: signal.signal(s, self._handler) for s in SIGNALS}
    watcher = _Watcher(self)
    try:
      yield self
    finally:
      watcher.close()
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
      if not self._critical and self._abort_pending is not None:
        signum, self._abort_pending = self._abort_pending, None
        raise Aborted(signum)


class _Watcher:
  """The backstop of a second signal: every signal's number is written to a pipe by the C-level handler the moment
  it arrives (`signal.set_wakeup_fd`), whatever the main thread is doing; this thread reads them and, from the
  second one on, once no checkpoint is being written, gives the orderly abort ABORT_GRACE_S and then prints the
  abort line and exits the process itself."""

  def __init__(self, interrupts: Interrupts):
    self.interrupts = interrupts
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self._closed = False
    self._thread = threading.Thread(target=self._run, name="signal-watcher", daemon=True)
    self._thread.start()

  def _run(self) -> None:
    seen = 0
    while True:
      try:
        data = os.read(self._read, 64)
      except OSError:
        return
      if not data or self._closed:
        return
      for signum in data:
        if signum not in SIGNALS:
          continue
        seen += 1
        if seen == 2:
          threading.Thread(target=self._abort_later, args=(signum,), name="signal-abort", daemon=True).start()

  def _abort_later(self, signum: int) -> None:
    deadline = time.monotonic() + ABORT_GRACE_S
    while time.monotonic() < deadline or self.interrupts._critical:  # a checkpoint write is never cut short
      time.sleep(0.05)
      if self._closed:
        return
    with contextlib.suppress(Exception):
      sys.stderr.write(f"{os.path.basename(sys.argv[0]) or 'python'}: {abort_message(signum)}\n")
      sys.stderr.flush()
    os._exit(128 + signum)

  def close(self) -> None:
    self._closed = True
    signal.set_wakeup_fd(self._previous)
    os.close(self._write)  # the reader sees end of file
    self._thread.join(timeout=1.0)
    os.close(self._read)
