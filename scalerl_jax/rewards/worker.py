"""What runs inside a reward worker process, and the call-and-check that the inline path shares with it.

A worker is a pebble worker process (pool.py) started by the 'forkserver' (else 'spawn') multiprocessing context;
`init` runs once per worker before its first task, `score_chunk` per task. This module imports nothing heavy, so a
worker that replaces a killed one is ready quickly (the reward function's own module is imported by `init`, before
the worker takes a task: imports never count against `timeout_s`).

What a worker does at start (`init`):
  - stdout and stderr (file descriptors 1 and 2, so C code and subprocesses too) go to /dev/null: a verifier that
    prints megabytes cannot flood the trainer's log;
  - on Linux it asks for SIGKILL when its parent (the forkserver, which then exits with the trainer) dies, so a
    worker stuck in a hanging call never outlives a trainer that was killed (see _die_with_the_forkserver);
  - the trainer's sys.path (sent explicitly) is put in front of its own, so any dotted path that imports in the
    trainer imports here (multiprocessing also copies sys.path, but only for the modules it imports itself);
  - it imports `preload` (e.g. math_verify), calls each `setup` function (by reference, with its arguments: e.g.
    the code reward's `configure(sandbox config)`) and resolves the reward function from its reference
    'package.module:qual.name'. A failure there is kept as text and every call of this worker reports it (an
    initializer that raised would make pebble restart the worker forever).
What comes back per call is small by construction: (value, error text or None, cause or None, success), the text
at most MAX_TEXT characters (a returned object is never sent back, only a bounded repr of it in the error), the
cause a short name (a verifier that returns a `Scored` says why it scored what it did; see `check`), success
whether the completion solved the item (the verifier's own verdict, else the full score 1; see `check`).
"""

from __future__ import annotations

import importlib
import math
import os
import re
import reprlib
import signal
import sys
import time
from typing import Any, Callable, Optional, Sequence

MAX_TEXT = 300  # characters of an error text
CAUSE = re.compile(r"[a-z][a-z0-9_]{0,31}")  # what a cause may be: a short lowercase name (a metric key's tail)
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60

_fn: Optional[Callable[[str, str], Any]] = None
_init_error = "reward worker not initialised"


def resolve(ref: str) -> Any:
  """'package.module:qual.name' (or 'package.module.name') -> the object, by import and getattr only."""
  module_name, sep, qualname = ref.partition(":")
  if not sep:
    module_name, _, qualname = ref.rpartition(".")
  obj = importlib.import_module(module_name)
  for part in qualname.split("."):
    obj = getattr(obj, part)
  return obj


def _short(text: str) -> str:
  return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


def error_text(exc: BaseException) -> str:
  """'Type: message', bounded."""
  try:
    message = str(exc)
  except Exception:  # a user exception whose __str__ fails
    message = "<unprintable>"
  return _short(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


class Scored(float):
  """A score that says why: the float is the score, `cause` a short lowercase name (e.g. the code reward's "ok",
  "timeout_wall", "no_program"), counted by the runner per cause (RewardRunner.metrics: reward/cause/<cause>).
  `success`: whether the completion solved the item, when the score alone does not say it (the code reward with
  partial credit: 2 of 3 tests passed scores 0.67 and is not solved); None: solved means the full score 1."""

  def __new__(cls, value: float, cause: str, success: Optional[bool] = None):
    self = super().__new__(cls, value)
    self.cause = cause
    self.success = success
    return self

  def __reduce__(self):
    return Scored, (float(self), self.cause, self.success)

  def __repr__(self) -> str:
    return f"Scored({float(self)!r}, {self.cause!r}, success={self.success!r})"


# (value or nan, error text or None, cause or None, success: solved the item; False for a failed call)
Outcome = tuple[float, Optional[str], Optional[str], bool]


def check(raw: Any) -> Outcome:
  """A reward function's return value -> (float, None, cause or None, success), or (nan, why it is not a score,
  None, False). Success is the verifier's own verdict (`Scored.success`), else the full score: value >= 1."""
  np = sys.modules.get("numpy")  # a numpy scalar can only exist if numpy is imported
  cause, success = None, None
  if isinstance(raw, Scored):
    cause, success = raw.cause, raw.success
    if not (isinstance(cause, str) and CAUSE.fullmatch(cause)):
      return math.nan, _short(f"returned a Scored whose cause {_repr.repr(cause)} is not a short lowercase name "
                              "(letters, digits, _; at most 32)"), None, False
    if success is not None and not isinstance(success, bool):
      return math.nan, _short(f"returned a Scored whose success {_repr.repr(success)} is not a bool or None"), None, \
          False
  if isinstance(raw, (bool, int, float)) or (np is not None and isinstance(raw, (np.number, np.bool_))):
    value = float(raw)
    if math.isfinite(value):
      return value, None, cause, value >= 1.0 if success is None else success
    return math.nan, _short(f"returned {_repr.repr(raw)}, not a finite number"), None, False
  return math.nan, _short(f"returned {_repr.repr(raw)}, not a number"), None, False


def call(fn: Callable[[str, str], Any], completion: str, answer: str,
         catch: type[BaseException] = Exception) -> Outcome:
  """One scored call: (value, None, cause, success) or (nan, error text, None, False). Workers catch BaseException
  (a verifier's sys.exit is a failed call, not a dead worker); the inline path only Exception (Ctrl-C must still
  reach the trainer)."""
  try:
    return check(fn(completion, answer))
  except catch as exc:
    return math.nan, error_text(exc), None, False


def _silence_output() -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:
      pass
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 1)
  os.dup2(null, 2)
  os.close(null)


def _die_with_the_forkserver() -> None:
  """SIGKILL this worker when its parent, the forkserver, exits. The forkserver exits once no client holds its
  'alive' pipe; every child it forks inherits a copy of that pipe (so children could fork through it too), so a
  hung worker would keep the forkserver, and so itself, alive for good after the trainer died. A worker starts no
  processes: it closes its copy, and the forkserver ends with the trainer."""
  if not sys.platform.startswith("linux"):
    return
  try:
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None:
      os.close(alive_fd)
      server._forkserver_alive_fd = None
  except Exception:
    pass
  try:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
  except Exception:
    return
  if os.getppid() == 1:  # the forkserver was already gone before the request took effect
    os._exit(1)


def init(sys_path: Sequence[str], ref: str, preload: Sequence[str] = (),
         setup: Sequence[tuple[str, tuple]] = ()) -> None:
  """pebble's initializer: runs once in each new worker. Never raises (see the module docstring)."""
  global _fn, _init_error
  try:
    _silence_output()
    _die_with_the_forkserver()
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    for name in preload:
      try:
        importlib.import_module(name)
      except Exception:
        pass  # the first call reports the problem with its own text
    for setup_ref, args in setup:
      resolve(setup_ref)(*args)
    _fn = resolve(ref)
    if not callable(_fn):
      _fn, _init_error = None, _short(f"{ref} is not callable in the worker")
  except BaseException as exc:
    _fn, _init_error = None, _short(f"cannot load {ref} in a reward worker: {error_text(exc)}")


def score_chunk(completions: Sequence[str], answers: Sequence[str]) -> tuple[list[Outcome], float]:
  """pebble's task: every call of a chunk in order -> ([(value, error or None, cause or None, success)], seconds
  the chunk took)."""
  t0 = time.perf_counter()
  if _fn is None:
    return [(math.nan, _init_error, None, False)] * len(completions), 0.0
  out = [call(_fn, c, a, BaseException) for c, a in zip(completions, answers)]
  return out, time.perf_counter() - t0


def ready() -> int:
  """A no-op task: returns once this worker has started (imported the verifier); its pid."""
  return os.getpid()
