"""RewardRunner: makes any reward function safe to call from a training run.

A reward function is `fn(completion: str, answer: str) -> float | bool`, returning a correctness score in [0, 1].
`RewardRunner` maps it to the configured scale (`01`: r, `pm1`: 2r - 1, the paper's +-1) and guarantees that a
call never raises and never hangs the run: a call that raises, returns something that is not a finite number, or
runs past `timeout_s` is scored with `failure_reward` (used as configured, not rescaled) and counted.

How time is bounded: the batch is scored in order on one daemon worker thread while the caller watches the clock of
the current call. When a call overruns, the caller scores it as a failure, abandons that worker (it is a daemon, so a
call that never returns cannot block interpreter exit) and starts a fresh worker on the next completion. Python
cannot kill a thread, so an abandoned call keeps running in the background until it returns; `abandoned_threads`
counts them. Threads, not processes, because math-verify's own `signal.alarm` timeouts only work on the main thread
and forking a process that holds a JAX runtime is unsafe; we call math-verify with its timeouts off.
"""

from __future__ import annotations

import importlib
import math
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np

from scalerl_jax import types
from scalerl_jax.config import ConfigError
from scalerl_jax.rewards.pass_rates import is_success

RewardFn = Callable[[str, str], float]


def load_reward_fn(dotted: str) -> RewardFn:
  """`package.module.function` or `package.module:function` -> the function."""
  module_name, sep, attr = dotted.partition(":")
  if not sep:
    module_name, _, attr = dotted.rpartition(".")
  if not module_name or not attr:
    raise ConfigError(f"data.reward_fn: {dotted!r} is not a dotted path like 'package.module.function'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as exc:
    raise ConfigError(f"data.reward_fn: cannot import module {module_name!r} ({exc})") from None
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ConfigError(f"data.reward_fn: {module_name!r} has no function {attr!r}")
  return fn


class _Batch:
  """Shared between the caller and the worker threads of one `score` call (guarded by `cond`)."""

  def __init__(self, n: int):
    self.cond = threading.Condition()
    self.next = 0  # index of the call in progress (or next to start)
    self.started = time.monotonic()  # when call `next` started
    self.generation = 0  # bumped when a worker is abandoned; a stale worker exits without writing
    self.values = np.zeros(n, np.float64)
    self.ok = np.zeros(n, bool)
    self.timed_out = np.zeros(n, bool)
    self.first_error: Optional[str] = None


class RewardRunner:
  """Scores batches with `fn`; never raises, never waits more than about `timeout_s` on one call.

  One worker thread runs a whole batch's calls in order and wakes the caller once, at the end; the caller sleeps
  until then or until the call in progress has run `timeout_s`, in which case that call is scored as a timeout,
  its worker is abandoned (it exits without writing when the call returns) and a fresh worker continues with the
  next call. Waking the caller per call instead costs a thread hand-off per completion, which on a busy 2-core
  host made scoring slower than generating.
  """

  def __init__(self, fn: RewardFn, timeout_s: float = 5.0, failure_reward: float = 0.0, scale: str = "01"):
    if scale not in ("01", "pm1"):
      raise ValueError(f"data.reward_scale must be 01 or pm1, got {scale!r}")
    if timeout_s <= 0:
      raise ValueError(f"data.reward_timeout_s must be positive, got {timeout_s}")
    self.fn = fn
    self.timeout_s = float(timeout_s)
    self.failure_reward = float(failure_reward)
    self.scale = scale
    # Totals since construction, for metrics. Two threads may score at once (PipelineRL's generator while the
    # trainer evaluates): each call has its own _Batch, and the totals are updated under this lock.
    self._totals = threading.Lock()
    self.calls = 0
    self.errors = 0
    self.timeouts = 0
    self.abandoned_threads = 0
    self.last_error: Optional[str] = None

  def _work(self, batch: _Batch, generation: int, completions: Sequence[str], answers: Sequence[str]) -> None:
    n = len(completions)
    with batch.cond:
      if batch.generation != generation:
        return
      i = batch.next
    while i < n:
      value, error = math.nan, None
      try:
        raw = self.fn(completions[i], answers[i])
        value = float(raw) if isinstance(raw, (bool, int, float, np.number)) else math.nan
        if not math.isfinite(value):
          error = f"reward returned {raw!r}, not a finite number"
      except Exception as exc:  # any failure of user code is scored, never raised
        error = f"{type(exc).__name__}: {exc}"
      with batch.cond:
        if batch.generation != generation:
          return  # abandoned after a timeout: the caller already scored this call
        batch.values[i] = value
        batch.ok[i] = error is None
        if error is not None and batch.first_error is None:
          batch.first_error = error
        i = batch.next = i + 1
        batch.started = time.monotonic()
        if i == n:
          batch.cond.notify_all()

  def _spawn(self, batch: _Batch, completions, answers) -> None:
    threading.Thread(target=self._work, args=(batch, batch.generation, completions, answers), daemon=True,
                     name="reward-worker").start()

  def score(self, completions: Sequence[str], answers: Sequence[str]) -> tuple[np.ndarray, int]:
    """Rewards float32[n] on the configured scale, and how many calls failed (raised, bad value or timed out)."""
    rewards, failed = self.score_each(completions, answers)
    return rewards, int(failed.sum())

  def score_each(self, completions: Sequence[str], answers: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Rewards float32[n] on the configured scale, and bool[n]: which calls failed (scored `failure_reward`)."""
    n = len(completions)
    if len(answers) != n:
      raise ValueError(f"{n} completions but {len(answers)} answers")
    if n == 0:
      return np.zeros(0, np.float32), np.zeros(0, bool)
    batch = _Batch(n)
    with batch.cond:
      self._spawn(batch, completions, answers)
      while batch.next < n:
        left = batch.started + self.timeout_s - time.monotonic()
        if left > 0:
          batch.cond.wait(left)
          continue
        batch.timed_out[batch.next] = True
        batch.next += 1
        batch.generation += 1
        batch.started = time.monotonic()
        with self._totals:
          self.abandoned_threads += 1
        if batch.next < n:
          self._spawn(batch, completions, answers)
    raw = np.where(batch.ok, batch.values, 0.0)
    scaled = raw if self.scale == "01" else 2.0 * raw - 1.0
    rewards = np.where(batch.ok, scaled, self.failure_reward).astype(np.float32)
    timeouts = int(batch.timed_out.sum())
    failures = int((~batch.ok).sum())
    with self._totals:
      self.calls += n
      self.timeouts += timeouts
      self.errors += failures - timeouts
      if batch.first_error is not None:
        self.last_error = batch.first_error
    return rewards, ~batch.ok

  def score_groups(self, groups: Sequence[types.RolloutGroup],
                   decode: Callable[[np.ndarray], str]) -> list[types.ScoredGroup]:
    """Every sample of these groups scored in one batch (one worker hand-off, not one per group); success is
    decided here, once, for the advantages' filters, No-Positive-Resampling and evaluation alike."""
    texts = [decode(s.tokens) for g in groups for s in g.samples]
    answers = [g.prompt.answer for g in groups for _ in g.samples]
    rewards, failed = self.score_each(texts, answers)
    success = is_success(rewards, self.scale)
    out, start = [], 0
    for g in groups:
      end = start + len(g.samples)
      out.append(types.ScoredGroup(g.prompt, g.samples, rewards[start:end], success[start:end],
                                   int(failed[start:end].sum())))
      start = end
    return out

  def metrics(self) -> dict[str, float]:
    return {"reward/calls": self.calls, "reward/errors": self.errors, "reward/timeouts": self.timeouts,
            "reward/abandoned_threads": self.abandoned_threads}


def make_reward_runner(cfg, task_reward: RewardFn) -> RewardRunner:
  """From a DataConfig: `data.reward_fn` (dotted path) if set, else the task's own verifier."""
  fn = load_reward_fn(cfg.reward_fn) if cfg.reward_fn else task_reward
  failure = cfg.failure_reward if cfg.failure_reward is not None else lowest_reward(cfg.reward_scale)
  return RewardRunner(fn, cfg.reward_timeout_s, failure, cfg.reward_scale)


def lowest_reward(scale: str) -> float:
  """The lowest reward of a scale: what a failed verification scores unless data.failure_reward says otherwise."""
  return 0.0 if scale == "01" else -1.0
