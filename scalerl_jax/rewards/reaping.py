"""Reaping what a sandboxed run leaves: bubblewrap's reaper (the sandbox's PID 1) outlives bubblewrap by a moment.

    with Subreaper():                 # this process adopts orphans while a run is in flight
      ...
      usage = reap(child_pid)         # waits for the reaper once it is ours, reaps it: its resource usage

bubblewrap returns as soon as the program's main process exits; its reaper, SIGKILLed by --die-with-parent then
(with whatever the program left running), would be orphaned to the machine's init, which may never reap it (a
zombie still counts against RLIMIT_NPROC). So a run makes its process a child subreaper and reaps the reaper
itself, after its PID namespace is gone. Also `parent_of` and `pidfd_wait`, which sandbox.py uses to signal the
reaper safely.
"""

from __future__ import annotations

import math
import os
import resource
import select
import signal
import threading
from typing import Optional

KILL_WAIT_S = 10.0  # after SIGKILL to the sandbox: how long bubblewrap gets to reap it before it is killed itself

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_reaper_lock = threading.Lock()
_reaper_users = 0
_reaper_was = 0


class Subreaper:
  """While at least one run is in flight, this process is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so
  bubblewrap's reaper, orphaned when bubblewrap exits, becomes this process's child and is reaped by run() instead
  of lingering as a zombie of the machine's init (a zombie still counts against RLIMIT_NPROC). The previous
  setting comes back when the last run ends."""

  def __enter__(self):
    global _reaper_users, _reaper_was
    import ctypes

    with _reaper_lock:
      if _reaper_users == 0:
        was = ctypes.c_int(0)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
        _reaper_was = was.value
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
          from scalerl_jax.rewards.sandbox import SandboxUnavailable  # (sandbox.py imports this module)

          raise SandboxUnavailable(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")
      _reaper_users += 1
    return self

  def __exit__(self, *exc):
    global _reaper_users
    import ctypes

    with _reaper_lock:
      _reaper_users -= 1
      if _reaper_users == 0 and not _reaper_was:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def parent_of(pid: int) -> int:
  with open(f"/proc/{pid}/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[1])


def pidfd_wait(fd: int, timeout: float) -> bool:
  poller = select.poll()
  poller.register(fd, select.POLLIN)
  return bool(poller.poll(max(0, int(math.ceil(timeout * 1000)))))


def reap(child: object) -> Optional[resource.struct_rusage]:
  """Waits for bubblewrap's reaper `child` when it has become this process's child (it exits, taking its PID
  namespace down, once SIGKILLed by --die-with-parent after bubblewrap returned) and reaps it; its resource usage
  (which includes the program's: the reaper waited for it), or None when it was not ours to reap."""
  if not isinstance(child, int) or child <= 0:
    return None
  try:
    fd = os.pidfd_open(child)
  except OSError:  # already gone
    return None
  try:
    try:
      if parent_of(child) != os.getpid():
        return None
    except (OSError, ValueError, IndexError):
      return None
    if not pidfd_wait(fd, KILL_WAIT_S):
      signal.pidfd_send_signal(fd, signal.SIGKILL)
    try:
      return os.wait4(child, 0)[2]
    except ChildProcessError:
      return None
  finally:
    os.close(fd)
