"""VerifierPool: a reward function run in a bounded pool of worker processes (pebble), where a hung call is killed.

Why processes: Python cannot stop a thread, so a hung verifier on a thread is abandoned, not stopped (a leaked
thread per hang, and the run waits `timeout_s` per hanging call one after another). A worker process can be killed
and replaced. Workers are started by the 'forkserver' context ('spawn' where there is none), never by fork: the
trainer holds a JAX runtime and its threads, which a forked child would inherit in an undefined state.

The function travels by reference ('package.module:qual.name', see worker.resolve), never as pickled state; workers
import it (worker.init), with the trainer's sys.path sent along explicitly, so whatever imports in the trainer
imports in a worker (PYTHONPATH needs no setting beyond what the trainer itself needed). What else to know:
  - multiprocessing imports the trainer's main script in every worker (as `__mp_main__`): entry points must keep
    their work under `if __name__ == "__main__":` (launch/train.py, tests/golden/run.py and benchmarks/ do);
  - the forkserver, and so every worker, has the environment the trainer had when the process's first pool
    started; later changes to os.environ are not seen by workers;
  - starting the workers costs about a second on the first call (and a fresh worker after each kill).

How one batch is scored:
  1. The batch is cut into chunks of at most MAX_CHUNK calls, at least two chunks per worker, and smaller when calls
     are slow (sized to take about timeout_s / 8 at a slowly decaying maximum of the measured time per call), so a
     step's hundreds of calls cost a handful of round trips. All chunks are scheduled at once; `workers` run in
     parallel.
  2. A chunk of several calls must finish within timeout_s / 2 (a chunk of one call: timeout_s). Past that, pebble
     kills its worker (SIGTERM, SIGKILL 3 s later) and starts a new one, and every call of the chunk is rerun
     alone, each with the full `timeout_s` (so only a call that hangs on its own is scored as a timeout). The same
     happens when a worker dies (a verifier that exits or crashes the interpreter).
Time bound: a batch with h hanging calls takes at most about its normal work (about work / workers), plus
1.5 * timeout_s per hang (0.5 for its chunk, 1 for its own rerun; hangs on different workers overlap), plus the
rerun of the other calls of the chunks that overran, plus at most 3 s per kill of a worker that ignores SIGTERM.
So 512 calls with one hang and the 5 s default cost about 7.5 s more than without it, not 512 * 5 s.
A function that hangs on everything does not cost timeout_s per call: once 2 * workers calls in a row timed out on
their own and no call of the batch succeeded, the rest of the batch is not run (RewardError follows), so such a
batch costs about (chunks / workers) * timeout_s / 2 + 2 * timeout_s (512 calls, 2 workers, 5 s: about 20 s, not
the 21 minutes of 512 calls * 5 s / 2 workers).
A pool that stops answering (never expected: pebble times every task) is given up on after a generous deadline:
the calls still waiting fail with that text and the next call starts a fresh pool.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import multiprocessing
import sys
import threading
import weakref
from concurrent.futures.process import BrokenProcessPool
from typing import Optional, Sequence

import numpy as np
from pebble import ProcessExpired, ProcessPool

from scalerl_jax.rewards import worker

MAX_CHUNK = 64
_KILL_S = 5.0  # pebble's SIGTERM grace (3 s) and its 0.1 s polling, with room to spare
_STUCK = "the reward worker pool stopped answering"


def _context():
  methods = multiprocessing.get_all_start_methods()
  return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _stop(pool: ProcessPool) -> None:
  try:
    pool.stop()
    pool.join()
  except Exception:  # already stopped or broken: nothing left to release
    pass


class PoolResult:
  """One batch from the pool: values float64[n] (nan where failed), errors (text or None per call), causes (what
  a verifier that returns a Scored said, else None), success bool[n] (solved the item: worker.check; False where
  failed), which calls timed out, how many workers were killed for overrunning, and how many calls were queued in
  the pool when the batch was scheduled (its own included)."""

  def __init__(self, n: int):
    self.values = np.full(n, math.nan)
    self.errors: list[Optional[str]] = [None] * n
    self.causes: list[Optional[str]] = [None] * n
    self.success = np.zeros(n, bool)
    self.timed_out = np.zeros(n, bool)
    self.killed_workers = 0
    self.succeeded = 0
    self.queued = 0

  def put(self, chunk: list[int], outcomes) -> None:
    for i, (value, error, cause, success) in zip(chunk, outcomes):
      self.values[i], self.errors[i], self.causes[i], self.success[i] = value, error, cause, success
      self.succeeded += error is None


class VerifierPool:
  """Scores (completion, answer) pairs with the function at `ref` in `workers` processes; see the module docstring.

  Thread-safe: two threads may score at once (their chunks share the workers). The pool starts on the first call
  and is stopped by `close()` (idempotent; a later call starts a new one) or when this object is collected.
  """

  def __init__(self, ref: str, workers: int, timeout_s: float, preload: Sequence[str] = (),
               setup: Sequence[tuple[str, tuple]] = ()):
    if workers < 1:
      raise ValueError(f"reward.workers must be >= 1, got {workers}")
    self.ref, self.workers, self.timeout_s, self.preload = ref, int(workers), float(timeout_s), tuple(preload)
    self.setup = tuple(setup)  # (function reference, args) each worker calls once at start (worker.init)
    self._lock = threading.Lock()
    self._pool: Optional[ProcessPool] = None
    self._finalizer: Optional[weakref.finalize] = None
    self._call_s = 0.0  # slowest recent seconds per call, for chunk sizes
    self._pending = 0  # tasks scheduled and not finished, over all threads
    self._pending_calls = 0  # the calls of those tasks

  @property
  def started(self) -> bool:
    return self._pool is not None

  def _get(self) -> ProcessPool:
    with self._lock:
      if self._pool is None:
        self._pool = ProcessPool(max_workers=self.workers, initializer=worker.init,
                                 initargs=(list(sys.path), self.ref, self.preload, self.setup),
                                 context=_context())
        self._finalizer = weakref.finalize(self, _stop, self._pool)
      return self._pool

  def _discard(self, pool: ProcessPool) -> None:
    with self._lock:
      if self._pool is pool:
        self._pool = None
        self._finalizer.detach()
    _stop(pool)

  def start(self) -> None:
    """Starts every worker now (each imports the verifier) instead of on the first call: a run does this before
    its compute clock starts, so a restart's start-up is not booked as compute."""
    pool = self._get()
    for future in [pool.schedule(worker.ready, timeout=max(self.timeout_s, 60.0)) for _ in range(self.workers)]:
      future.result()

  def close(self) -> None:
    with self._lock:
      pool, self._pool = self._pool, None
      if self._finalizer is not None:
        self._finalizer.detach()
    if pool is not None:
      _stop(pool)

  def _schedule(self, completions: list[str], answers: list[str], timeout: float):
    pool = self._get()
    try:
      future = pool.schedule(worker.score_chunk, args=(completions, answers), timeout=timeout)
    except RuntimeError:  # the pool broke (pebble refuses new tasks): start a fresh one, once
      self._discard(pool)
      future = self._get().schedule(worker.score_chunk, args=(completions, answers), timeout=timeout)
    with self._lock:
      self._pending += 1
      self._pending_calls += len(completions)
    future.add_done_callback(lambda _future, calls=len(completions): self._task_done(calls))
    return future

  def _task_done(self, calls: int) -> None:
    with self._lock:
      self._pending -= 1
      self._pending_calls -= calls

  @property
  def queued_calls(self) -> int:
    """Calls scheduled in the pool and not finished (every thread's)."""
    with self._lock:
      return self._pending_calls

  def chunk_size(self, n: int) -> int:
    size = min(MAX_CHUNK, -(-n // (2 * self.workers)))
    if self._call_s > 0:
      size = min(size, int(self.timeout_s / (8 * self._call_s)))
    return max(1, size)

  def score(self, completions: Sequence[str], answers: Sequence[str]) -> PoolResult:
    n = len(completions)
    result = PoolResult(n)
    result.queued = self.queued_calls + n
    size = self.chunk_size(n)
    chunks = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    overran = self._run(chunks, completions, answers, result, window=len(chunks))
    singles = [[i] for chunk in overran for i in chunk]
    self._run(singles, completions, answers, result, window=2 * self.workers, give_up=True)
    return result

  def _run(self, chunks: list[list[int]], completions, answers, result: PoolResult, window: int,
           give_up: bool = False) -> list[list[int]]:
    """Runs `chunks`, at most `window` at a time, and writes what they scored into `result`; returns the chunks of
    several calls that overran or lost their worker (to be rerun call by call). A chunk of one call that failed is
    scored as failed. `give_up`: once `window` calls in a row timed out alone and no call of the batch has
    succeeded, the function hangs on everything: the rest is not run (the batch fails as a whole, RewardError)."""
    todo, running, overran, timeouts = collections.deque(chunks), collections.deque(), [], 0
    while todo or running:
      while todo and len(running) < window:
        chunk = todo.popleft()
        timeout = self.timeout_s if len(chunk) == 1 else self.timeout_s / 2
        running.append((chunk, self._schedule([completions[i] for i in chunk], [answers[i] for i in chunk],
                                              timeout)))
      chunk, future = running.popleft()
      error, timed_out = self._wait(future)
      if error is None:
        outcomes, seconds = future.result()
        self._call_s = max(seconds / len(chunk), 0.9 * self._call_s)
        result.put(chunk, outcomes)
        continue
      result.killed_workers += timed_out  # (an overrun says nothing about normal calls: the reruns measure them)
      if error == _STUCK:  # the other tasks of that pool will not answer either
        for i in (i for rest in (chunk, *(c for c, _ in running), *todo) for i in rest):
          result.errors[i] = error
        return []
      if len(chunk) > 1:
        overran.append(chunk)
        continue
      result.errors[chunk[0]], result.timed_out[chunk[0]] = error, timed_out
      timeouts = timeouts + 1 if timed_out else 0
      if give_up and timeouts >= window and not result.succeeded:
        self._give_up(running, todo, result, f"not run: {timeouts} calls in a row timed out and none succeeded")
        return overran
    return overran

  def _give_up(self, running, todo, result: PoolResult, error: str) -> None:
    for chunk, future in running:
      was_running = future.running()
      if not future.cancel() and future.exception() is None:  # it returned in the meantime
        result.put(chunk, future.result()[0])
        continue
      result.killed_workers += was_running  # pebble stops the worker of a cancelled running task
      for i in chunk:
        result.errors[i] = error
    for i in (i for chunk in todo for i in chunk):
      result.errors[i] = error

  def _wait(self, future) -> tuple[Optional[str], bool]:
    """Waits for one task: (None, False) when it returned, else (why it failed, whether it timed out)."""
    with self._lock:  # every task queued in the pool (other threads' too) may run before this one
      waves = -(-self._pending // self.workers)
    done, _ = concurrent.futures.wait([future], timeout=2 * waves * (self.timeout_s + _KILL_S) + 60.0)
    if not done:  # never expected (pebble times every task): give this pool up, the next task starts a new one
      future.cancel()
      self._discard_current()
      return _STUCK, False
    if future.cancelled():
      return "the reward worker pool was closed during the call", False
    exc = future.exception()
    if isinstance(exc, TimeoutError):  # pebble's per-task timeout: the worker was killed (and is replaced)
      return f"timed out after {self.timeout_s:g} s", True
    return (None if exc is None else _describe(exc)), False

  def _discard_current(self) -> None:
    pool = self._pool
    if pool is not None:
      self._discard(pool)


def _describe(exc: BaseException) -> str:
  if isinstance(exc, ProcessExpired):
    return f"the reward worker process died (exit code {exc.exitcode})"
  if isinstance(exc, BrokenProcessPool):
    return ("the reward workers could not start or all died (is the entry point's work under "
            f"`if __name__ == '__main__':`?): {worker.error_text(exc)}")
  return f"reward worker pool: {worker.error_text(exc)}"
