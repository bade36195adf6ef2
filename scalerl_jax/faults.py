"""Failpoints for the fault-injection tests: named places in the code where a test can make the process die.

Off unless the environment variable SCALERL_FAULTS is set, and then a dictionary lookup per call. Its value is a
comma-separated list of `NAME@N` (SIGKILL this process the N-th time `point(NAME)` is reached) or
`NAME@N+MS` (the N-th time, arm a timer that SIGKILLs it MS milliseconds later, wherever it then is: a kill *during*
the work that follows the point, e.g. inside a checkpoint write), or `NAME@N!` (the N-th time, raise
InjectedFault there: a bug in that place, as the multi-process tests need), or `NAME@N~` (the N-th time, print
`failpoint NAME holding` to stderr and sleep there for good: a phase that never ends by itself, where a test sends
its signals). A test chooses N and MS from a seed.

The points (grep `faults.point`): warm_start_step, rollout_step, train_step, weight_sync, checkpoint_save,
evaluate, step_end.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import threading
import time

ENV = "SCALERL_FAULTS"
RAISE, HOLD = -1.0, -2.0


class InjectedFault(RuntimeError):
  """Raised by a `NAME@N!` failpoint."""


def _parse(spec: str) -> dict[str, tuple[int, float]]:
  """{name: (count, delay in s)}; delay RAISE = raise instead of kill, HOLD = sleep for good."""
  out = {}
  for item in filter(None, (s.strip() for s in spec.split(","))):
    name, _, when = item.partition("@")
    if when.endswith(("!", "~")):
      out[name] = (int(when[:-1] or 1), RAISE if when.endswith("!") else HOLD)
      continue
    count, _, delay = when.partition("+")
    out[name] = (int(count or 1), float(delay) / 1000.0 if delay else 0.0)
  return out


_PLAN = _parse(os.environ.get(ENV, ""))
_HITS: collections.Counter = collections.Counter()
_LOCK = threading.Lock()


def _kill() -> None:
  os.kill(os.getpid(), signal.SIGKILL)


def point(name: str) -> None:
  """A failpoint; does nothing unless SCALERL_FAULTS names it."""
  if not _PLAN or name not in _PLAN:
    return
  with _LOCK:
    _HITS[name] += 1
    hit = _HITS[name]
  count, delay = _PLAN[name]
  if hit != count:
    return
  if delay == RAISE:
    raise InjectedFault(f"failpoint {name} (hit {hit}, {ENV})")
  if delay == HOLD:
    sys.stderr.write(f"failpoint {name} holding (hit {hit}, {ENV})\n")
    sys.stderr.flush()
    while True:  # signal handlers run between the sleeps (and may raise out of here)
      time.sleep(0.1)
  if delay == 0:
    _kill()
  timer = threading.Timer(delay, _kill)
  timer.daemon = True
  timer.start()
