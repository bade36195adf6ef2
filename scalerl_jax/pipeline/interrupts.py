"""Stopping a run cleanly: the first Ctrl-C asks for a checkpoint at the next step boundary; a second one
interrupts at once."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stop_on_interrupt(flag: threading.Event):
  """While inside, SIGINT sets `flag` (the trainer checks it between steps); a second SIGINT raises
  KeyboardInterrupt. Off the main thread (where signals cannot be handled) this does nothing."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    if flag.is_set():
      raise KeyboardInterrupt
    flag.set()
    log.warning("interrupt: checkpointing at the next step boundary (Ctrl-C again to abort)")

  previous = signal.signal(signal.SIGINT, handler)
  try:
    yield
  finally:
    if previous is not None:  # None: the previous handler was not installed from Python
      signal.signal(signal.SIGINT, previous)
