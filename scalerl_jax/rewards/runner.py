"""RewardRunner: makes any reward function safe to call from a training run.

A reward function is `fn(completion: str, answer: str) -> float | bool`, returning a correctness score in [0, 1].
`RewardRunner` maps it to the configured scale (`01`: r, `pm1`: 2r - 1, the paper's +-1). A sample succeeds (pass
rates, No-Positive-Resampling, held-out evaluation, the length penalty's "correct") when it solved its item: the
full score 1, or what a verifier returning a `Scored` says (the code reward: every test passed, also under partial
credit); a failed call never succeeds. A call that raises, returns something that is not a finite number, or runs
past `timeout_s` is scored with `failure_reward` and counted.
`failure_reward` is a value ON THE CONFIGURED SCALE, used as given and never rescaled (make_reward_runner's default,
reward.on_failure=null, is the scale's lowest reward: 0 under 01, -1 under pm1, so a failed verification never
scores above a wrong answer).

Where the function runs (`isolation`, chosen by make_reward_runner):
  "inline"   on the calling thread, with no time bound: only for the built-in verifiers that are pure and cannot
             hang (verifiers.PURE_VERIFIERS: exact match, countdown); the CPU default's speed depends on it.
  "process"  in a VerifierPool (pool.py): `workers` processes (reward.workers) started lazily on the first
             call, calls batched into chunks, a call past `timeout_s` killed together with its worker (which is
             replaced). The function travels by reference (its dotted path), never pickled with state. The time
             bound of one batch is stated in pool.py. Used for a user's reward.fn and math-verify.
Call `close()` (or use the runner as a context manager) to stop the workers; a later call starts them again.

Failures are reported, not only counted:
  - every batch keeps its first error text (`score_batch(...).first_error`); the totals keep the first and the
    latest (`first_error`, `last_error`); `metrics()` gives calls, errors, timeouts, killed workers, failure rate;
  - the first time each distinct error text appears (up to MAX_WARNED texts) a warning goes to the logger
    `scalerl_jax.rewards`, with the failure count so far;
  - a batch in which every call failed raises RewardError (a UserError: the run stops with its one-line message
    naming the function and quoting the first error) - the verifier is broken, not the policy.
A function that cannot be called as fn(completion, answer) is refused when the runner is built (ConfigError).

Causes: a function may return a `Scored` (worker.py: a float that carries a short `cause` name, as the code reward
does); the runner counts the calls per cause. Code rewards (`sandbox=` a SandboxConfig) run in the pool only: every
worker calls code.configure(sandbox) when it starts, and `start()` first proves a sandbox works here
(sandbox.Sandbox.check_available: SandboxUnavailable, a UserError saying how to fix it, stops the run before its
first step).

Metrics (`metrics()`; totals over the run, restored on resume, except the two latest-batch gauges):
  reward/calls, reward/errors, reward/timeouts, reward/killed_workers, reward/failure_rate
  reward/cause/<cause>   calls whose verifier returned that cause (only causes seen; code: sandbox.CAUSES and
                         code.CAUSES)
  reward/score_s         wall seconds the latest batch took to score
  reward/queue           calls queued in the pool when the latest batch was scheduled (its own and other
                         threads'; 0 inline): a pool much smaller than its queue is the bottleneck
  reward/sandbox_memory_cgroup  code rewards, after start(): 1 when each run's memory is bounded by a cgroup, 0
                         when by one address space (sandbox/memory.py; start() logs which and why)
A run with one verifier per task (make_reward_runner with tagged tasks; routing.TaskRewards) reports the same keys
summed over tasks and, per task, reward/<task>/<key> (for example reward/code/cause/timeout_wall).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from scalerl_jax import types
from scalerl_jax.config import ConfigError
from scalerl_jax.errors import UserError
from scalerl_jax.rewards import worker
from scalerl_jax.rewards.pool import VerifierPool
from scalerl_jax.rewards.routing import TaskRewards
from scalerl_jax.rewards.verifiers import (PRELOAD, PURE_VERIFIERS, SANDBOXED_VERIFIERS, boxed_answer_reward,
                                          configure_boxed, qualified_name, verifier)

RewardFn = Callable[[str, str], float]
ISOLATIONS = ("process", "inline")
MAX_WARNED = 10  # distinct error texts logged; later new texts are counted, not logged
MAX_CAUSES = 32  # distinct cause names counted; later new names are counted under "other"
CONFIGURE_SANDBOX = "scalerl_jax.rewards.code:configure"
CONFIGURE_BOXED = "scalerl_jax.rewards.verifiers:configure_boxed"

logger = logging.getLogger("scalerl_jax.rewards")


class RewardError(UserError):
  """Every call of a batch failed: the reward function is broken (not the policy), so the run stops."""


def load_reward_fn(dotted: str) -> RewardFn:
  """`package.module.function` or `package.module:function` -> the function."""
  module_name, sep, attr = dotted.partition(":")
  if not sep:
    module_name, _, attr = dotted.rpartition(".")
  if not module_name or not attr:
    raise ConfigError(f"reward.fn: {dotted!r} is not a dotted path like 'package.module.function'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as exc:
    raise ConfigError(f"reward.fn: cannot import module {module_name!r} ({exc})") from None
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ConfigError(f"reward.fn: {module_name!r} has no function {attr!r}")
  return fn


def check_signature(fn: Callable, name: str) -> None:
  """ConfigError unless `fn(completion, answer)` binds (a function without an inspectable signature passes)."""
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return
  try:
    signature.bind("completion", "answer")
  except TypeError as exc:
    raise ConfigError(f"reward.fn: {name}{signature} cannot be called as fn(completion: str, answer: str) "
                      f"({exc})") from None


def reference_of(fn: Callable) -> str:
  """'package.module:Qual.name' that imports back to `fn` in a worker; ConfigError for a lambda, a nested
  function or a callable object (their state would have to be pickled)."""
  name = qualified_name(fn)
  ref = f"{fn.__module__}:{fn.__qualname__}" if name else ""
  try:
    found = worker.resolve(ref) if ref and "<" not in ref else None
  except Exception:
    found = None
  if found is not fn:
    raise ConfigError(f"reward.fn: {fn!r} cannot run in a reward worker process: it must be a module-level "
                      "function that its dotted path imports")
  return ref


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  """One scored batch: rewards float32[n] on the configured scale; which calls solved their item (the verifier's
  verdict: every test passed, or the full score; never a failed call); which calls failed (scored failure_reward)
  and which of those timed out; the first error's text (None when nothing failed); each call's cause (the
  verifier's `Scored.cause`; None for a plain float or a failed call)."""
  rewards: np.ndarray
  failed: np.ndarray
  timed_out: np.ndarray
  first_error: Optional[str]
  success: np.ndarray
  causes: tuple[Optional[str], ...] = ()


class RewardRunner:
  """Scores batches with `fn`; see the module docstring. Thread-safe: two threads may score at once (PipelineRL's
  generator while the trainer evaluates); each call has its own state and the totals are updated under a lock.

  fn              the reward function, fn(completion, answer) -> score in [0, 1]
  timeout_s       per call, enforced under isolation="process" (a call past it is killed and scored a failure)
  failure_reward  what a failed call scores, on the configured scale (not rescaled)
  scale           "01" or "pm1"
  isolation       "process" (default; bounded) or "inline" (pure verifiers only: no time bound)
  workers         worker processes under isolation="process"
  name            how messages name the function (default: its qualified name)
  ref             how workers import it (default: derived from fn; make_reward_runner passes reward.fn)
  sandbox         a SandboxConfig: fn runs programs in the sandbox (isolation "process" only); workers are
                  configured with it and start() checks that the sandbox works
  """

  def __init__(self, fn: RewardFn, timeout_s: float = 5.0, failure_reward: float = 0.0, scale: str = "01", *,
               isolation: str = "process", workers: int = 2, name: str = "", ref: str = "", sandbox=None,
               setup: Sequence[tuple[str, tuple]] = ()):
    if scale not in ("01", "pm1"):
      raise ValueError(f"reward.scale must be 01 or pm1, got {scale!r}")
    if timeout_s <= 0:
      raise ValueError(f"reward.timeout_s must be positive, got {timeout_s}")
    if isolation not in ISOLATIONS:
      raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if sandbox is not None and isolation != "process":
      raise ValueError("a reward that runs programs in the sandbox must run in worker processes (isolation "
                       f"'process'), not {isolation!r}")
    self.fn = fn
    self.name = name or qualified_name(fn) or repr(fn)
    check_signature(fn, self.name)
    self.timeout_s = float(timeout_s)
    self.failure_reward = float(failure_reward)
    self.scale = scale
    self.isolation = isolation
    self.sandbox = sandbox
    self._pool: Optional[VerifierPool] = None
    if isolation == "process":
      setup = (*(((CONFIGURE_SANDBOX, (sandbox,)),) if sandbox is not None else ()), *setup)
      self._pool = VerifierPool(ref or reference_of(fn), workers, self.timeout_s,
                                PRELOAD.get(qualified_name(fn), ()), setup)
    self._totals = threading.Lock()
    self.calls = 0
    self.errors = 0  # failed calls that did not time out (raised, bad value, dead worker)
    self.timeouts = 0
    self.killed_workers = 0
    self.first_error: Optional[str] = None
    self.last_error: Optional[str] = None  # the latest failing batch's first error
    self.causes: dict[str, int] = {}
    self.score_s = 0.0  # the latest batch's wall seconds
    self.queue = 0  # calls queued in the pool when the latest batch was scheduled
    self._warned: set[str] = set()
    self._capped = False
    self.memory_cgroup: Optional[bool] = None  # code rewards, once started: whether runs are bounded by a cgroup

  # --- lifetime -------------------------------------------------------------------------------------------------
  def start(self) -> None:
    """Checks the sandbox (a code reward: SandboxUnavailable when it does not work here), then starts the worker
    processes now rather than on the first call (no-op for inline verifiers)."""
    if self.sandbox is not None:
      from scalerl_jax.rewards.sandbox import Sandbox

      box = Sandbox(self.sandbox)
      box.check_available()
      self.memory_cgroup = box.memory_bound().cgroup
    if self._pool is not None:
      self._pool.start()

  def close(self) -> None:
    """Stops the worker processes (idempotent). Call it once no other thread is scoring."""
    if self._pool is not None:
      self._pool.close()

  def __enter__(self) -> RewardRunner:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # --- scoring --------------------------------------------------------------------------------------------------
  def score_batch(self, completions: Sequence[str], answers: Sequence[str]) -> RewardBatch:
    """Scores one batch. Raises RewardError when every call of a non-empty batch failed."""
    n = len(completions)
    if len(answers) != n:
      raise ValueError(f"{n} completions but {len(answers)} answers")
    if n == 0:
      return RewardBatch(np.zeros(0, np.float32), np.zeros(0, bool), np.zeros(0, bool), None, np.zeros(0, bool))
    t0 = time.perf_counter()
    if self._pool is None:
      out = [worker.call(self.fn, c, a) for c, a in zip(completions, answers)]
      values = np.array([v for v, _, _, _ in out], np.float64)
      errors, causes = [e for _, e, _, _ in out], [c for _, _, c, _ in out]
      success = np.array([s for _, _, _, s in out], bool)
      timed_out, killed, queued = np.zeros(n, bool), 0, 0
    else:
      result = self._pool.score(list(completions), list(answers))
      values, errors, timed_out, killed = result.values, result.errors, result.timed_out, result.killed_workers
      causes, queued, success = result.causes, result.queued, result.success
    ok = np.array([e is None for e in errors])
    raw = np.where(ok, values, 0.0)
    scaled = raw if self.scale == "01" else 2.0 * raw - 1.0
    rewards = np.where(ok, scaled, self.failure_reward).astype(np.float32)
    first = next((e for e in errors if e is not None), None)
    self._record(n, ok, timed_out, killed, errors, first)
    self._record_causes([c for c, e in zip(causes, errors) if e is None and c is not None],
                        time.perf_counter() - t0, queued)
    if not ok.any():
      raise RewardError(f"reward function {self.name} failed on every one of the {n} calls of a batch; "
                        f"first error: {first}")
    return RewardBatch(rewards, ~ok, timed_out, first, success & ok,
                       tuple(c if e is None else None for c, e in zip(causes, errors)))

  def _record(self, n: int, ok: np.ndarray, timed_out: np.ndarray, killed: int, errors: list, first) -> None:
    new_texts, too_many = [], False
    with self._totals:
      timeouts = int(timed_out.sum())
      self.calls += n
      self.timeouts += timeouts
      self.errors += int((~ok).sum()) - timeouts
      self.killed_workers += killed
      if first is not None:
        self.first_error = self.first_error or first
        self.last_error = first
        for text in dict.fromkeys(e for e in errors if e is not None):
          if text in self._warned:
            continue
          if len(self._warned) >= MAX_WARNED:
            too_many, self._capped = not self._capped, True
            break
          self._warned.add(text)
          new_texts.append(text)
      failed, calls = self.errors + self.timeouts, self.calls
    for text in new_texts:
      logger.warning("reward function %s failed: %s (%d of %d calls failed so far)", self.name, text, failed, calls)
    if too_many:
      logger.warning("reward function %s: further distinct error texts are counted, not logged", self.name)

  def _record_causes(self, causes: list[str], seconds: float, queued: int) -> None:
    with self._totals:
      self.score_s, self.queue = seconds, queued
      for cause in causes:
        if cause not in self.causes and len(self.causes) >= MAX_CAUSES:
          cause = "other"
        self.causes[cause] = self.causes.get(cause, 0) + 1

  def score(self, completions: Sequence[str], answers: Sequence[str]) -> tuple[np.ndarray, int]:
    """Rewards float32[n] on the configured scale, and how many calls failed (raised, bad value or timed out)."""
    rewards, failed = self.score_each(completions, answers)
    return rewards, int(failed.sum())

  def score_each(self, completions: Sequence[str], answers: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Rewards float32[n] on the configured scale, and bool[n]: which calls failed (scored `failure_reward`)."""
    batch = self.score_batch(completions, answers)
    return batch.rewards, batch.failed

  def score_groups(self, groups: Sequence[types.RolloutGroup],
                   decode: Callable[[np.ndarray], str]) -> list[types.ScoredGroup]:
    """Every sample of these groups scored in one batch (a handful of worker round trips, not one per group);
    success is the verifier's verdict (RewardBatch.success), carried here, once, to the advantages' filters,
    No-Positive-Resampling and evaluation alike. RewardError (every call failed) propagates: the caller lets it
    stop the run."""
    texts = [decode(s.tokens) for g in groups for s in g.samples]
    answers = [g.prompt.answer for g in groups for _ in g.samples]
    batch = self.score_batch(texts, answers)
    out, start = [], 0
    for g in groups:
      end = start + len(g.samples)
      out.append(types.ScoredGroup(g.prompt, g.samples, batch.rewards[start:end], batch.success[start:end],
                                   int(batch.failed[start:end].sum()), batch.causes[start:end]))
      start = end
    return out

  def state(self) -> dict:
    """The totals, JSON-able (a checkpoint keeps them so the run's counters continue across a resume)."""
    with self._totals:
      return {"calls": self.calls, "errors": self.errors, "timeouts": self.timeouts,
              "killed_workers": self.killed_workers, "first_error": self.first_error, "causes": dict(self.causes)}

  def load_state(self, state: dict) -> None:
    with self._totals:
      self.calls, self.errors, self.timeouts = int(state["calls"]), int(state["errors"]), int(state["timeouts"])
      self.killed_workers, self.first_error = int(state["killed_workers"]), state.get("first_error")
      self.causes = {str(k): int(v) for k, v in state.get("causes", {}).items()}  # absent before causes existed

  def metrics(self) -> dict[str, float]:
    """See the module docstring (keys); error texts are in `first_error` / `last_error`."""
    with self._totals:
      failed = self.errors + self.timeouts
      return {"reward/calls": self.calls, "reward/errors": self.errors, "reward/timeouts": self.timeouts,
              "reward/killed_workers": self.killed_workers,
              "reward/failure_rate": failed / self.calls if self.calls else 0.0,
              "reward/score_s": self.score_s, "reward/queue": self.queue,
              **({} if self.memory_cgroup is None else {"reward/sandbox_memory_cgroup": float(self.memory_cgroup)}),
              **{f"reward/cause/{cause}": count for cause, count in sorted(self.causes.items())}}


def make_reward_runner(cfg, verifiers: Mapping[str, str], *, sandbox=None) -> RewardRunner | TaskRewards:
  """From a RewardConfig and a task's `verifiers` ({a prompt's task: the name of its verifier}, each looked up by
  verifiers.verifier): {"": name}, prompts that carry no task, gives one RewardRunner; tagged tasks a TaskRewards
  (each group scored by the verifier of its prompt's task). `reward.fn` (dotted path), if set, replaces them all:
  one function for every task. Pure built-in verifiers run inline; anything else in `reward.workers` worker
  processes (per task). A code verifier (the "code" task's, or one named in verifiers.SANDBOXED_VERIFIERS) runs
  programs in the sandbox: pass `sandbox` (the run's SandboxConfig, cfg.sandbox); its workers are configured with
  it, and start() checks that the sandbox works."""
  if cfg.fn:
    return _runner(cfg, load_reward_fn(cfg.fn), "", sandbox, name=cfg.fn, ref=cfg.fn)
  if not verifiers or ("" in verifiers and len(verifiers) > 1):
    raise ValueError(f"make_reward_runner: verifiers must be {{'': name}} or {{task: name}} per task, got {verifiers}")
  if "" in verifiers:
    return _runner(cfg, verifier(verifiers[""]), "", sandbox)
  return TaskRewards({task: _runner(cfg, verifier(name), task, sandbox) for task, name in verifiers.items()})


def _runner(cfg, fn: RewardFn, task: str, sandbox, name: str = "", ref: str = "") -> RewardRunner:
  sandboxed = task == "code" or qualified_name(fn) in SANDBOXED_VERIFIERS
  if sandboxed and sandbox is None:
    raise ValueError(f"make_reward_runner: {name or qualified_name(fn) or repr(fn)} runs programs in the sandbox: "
                     "pass sandbox=cfg.sandbox")
  isolation = "inline" if qualified_name(fn) in PURE_VERIFIERS and not sandboxed else "process"
  setup = ()
  if fn is boxed_answer_reward:  # its table of partial rewards, here (inline) and in its workers
    setup = ((CONFIGURE_BOXED, (cfg.unboxed_reward, cfg.boxed_wrong_reward)),)
    configure_boxed(cfg.unboxed_reward, cfg.boxed_wrong_reward)
  failure = cfg.on_failure if cfg.on_failure is not None else lowest_reward(cfg.scale)
  return RewardRunner(fn, cfg.timeout_s, failure, cfg.scale, isolation=isolation, workers=cfg.workers, name=name,
                      ref=ref, sandbox=sandbox if sandboxed else None, setup=setup)


def lowest_reward(scale: str) -> float:
  """The lowest reward of a scale: what a failed verification scores unless reward.on_failure says otherwise."""
  return 0.0 if scale == "01" else -1.0
