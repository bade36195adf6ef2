"""PipelineRL-k and PPO-off-policy-k: one controller process, a generator thread and the trainer (main thread).

    ┌──────────────── generator thread (generator mesh) ─────────────────┐
    │ admit batch b  iff  policy.may_admit(b, v_gen)                     │   prompts: DataCursor, in order
    │ driver.step(params_gen, v_gen): refill slots, N fused decode steps │◄── WeightBox: latest (params, v)
    │ finished group -> reward -> slot of batch b; batch b complete ──┐  │    read between decode chunks
    └─────────────────────────────────────────────────────────────────┼──┘
                                                  BatchBuffer (by index)│
    ┌──────────────── trainer (main thread, trainer mesh) ────────────▼──┐
    │ step s: wait for batch s; check oldest token version >= s - k      │
    │ TrainBatch (rl.prepare) -> jitted step -> params v = s + 1         │
    │ weight sync: copy params into the rollout layout, publish (., v) ──┼──► WeightBox
    │ every N steps: held-out eval; every M steps: checkpoint            │
    └────────────────────────────────────────────────────────────────────┘

The one staleness number is k = pipeline.max_lag. Batch b is the b-th group of `prompts_per_step` prompts in
data order and is consumed by optimizer step b, which turns params of version b into version b + 1.

Weight sync (copy into the rollout layout, publish, what a generator sees) has its own module and ordering
contract: scalerl_jax/pipeline/weight_sync.py. Admission is this module's part:
  PipelineRL-k admits batch b only while v_gen >= b - k. Versions only grow, so every token of batch b has
  version >= b - k when step b consumes it: the bound holds by construction and no finished work is ever thrown
  away. The trainer still checks it and fails loudly if it were ever violated.
  PPO-off-policy-k admits batch b only once v_gen >= floor(b / k) * k and publishes weights only every k steps:
  k batches are generated with frozen params, then k optimizer steps are taken.
  k = 0 (pipeline.mode=lockstep forces it) generates batch b entirely by params of version b, as the reference
  loop without threads (run_synchronous, launch/train.py --reference-loop) does.

Failure: an exception in the generator thread (or the reward code it calls) stops the run; the trainer re-raises
it with the generator's traceback. Waits poll a stop event, so nothing hangs. Ctrl-C sets a flag; the trainer
checkpoints at the next step boundary and exits.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from typing import Callable, Optional, Sequence

from scalerl_jax import faults, types
from scalerl_jax.pipeline.weight_sync import WeightBox


class PipelineError(RuntimeError):
  pass


@dataclasses.dataclass(frozen=True)
class AdmissionPolicy:
  mode: str  # pipeline | ppo_offpolicy | lockstep (k = 0)
  k: int

  @classmethod
  def from_config(cls, mode: str, max_lag: int) -> "AdmissionPolicy":
    return cls(mode, 0 if mode == "lockstep" else max_lag)

  def may_admit(self, batch: int, version: int) -> bool:
    if self.mode == "ppo_offpolicy":
      return version >= (batch // self.k) * self.k
    return version >= batch - self.k

  def publishes(self, version: int) -> bool:
    """Whether params of this version go to the generators."""
    return self.mode != "ppo_offpolicy" or version % self.k == 0

  def oldest_allowed(self, step: int) -> int:
    """The oldest token version step `step` may consume."""
    if self.mode == "ppo_offpolicy":
      return (step // self.k) * self.k
    return step - self.k

  def check(self, step: int, versions_BT) -> None:
    """Raises PipelineError if step `step`'s tokens (their versions, -1 where none) include one older than the
    bound (admission makes that impossible; the trainer checks anyway, so a bug never trains silently
    off-policy)."""
    sampled = versions_BT[versions_BT >= 0]
    if sampled.size and sampled.min() < self.oldest_allowed(step):
      raise PipelineError(f"step {step}: batch holds tokens of version {sampled.min()}, older than the bound "
                          f"{self.oldest_allowed(step)} (mode {self.mode}, k={self.k})")


class BatchBuffer:
  """Completed batches by index; `get(b)` waits for batch b, polling the stop event."""

  def __init__(self, stop: threading.Event):
    self._cond = threading.Condition()
    self._batches: dict[int, types.ScoredBatch] = {}
    self._stop = stop

  def put(self, batch: types.ScoredBatch) -> None:
    with self._cond:
      self._batches[batch.index] = batch
      self._cond.notify_all()

  def ready(self, index: int) -> bool:
    """Whether batch `index` is complete and not yet taken."""
    with self._cond:
      return index in self._batches

  def get(self, index: int, poll: float = 0.1) -> Optional[types.ScoredBatch]:
    with self._cond:
      while index not in self._batches:
        if self._stop.is_set():
          return None
        self._cond.wait(poll)
      return self._batches.pop(index)


@dataclasses.dataclass
class GeneratorStats:
  idle_s: float = 0.0  # waiting for weights with nothing in flight (admission paced by the staleness bound)
  busy_s: float = 0.0
  weight_updates: int = 0  # new versions picked up between decode chunks
  in_flight_updates: int = 0  # ... of which arrived while sequences were in flight (no drain)
  waits_for_weights: int = 0  # times it had nothing to do until new weights came


class GeneratorThread(threading.Thread):
  """Streams batches [start, end) through the rollout driver; see the module docstring."""

  def __init__(self, *, driver, next_prompts: Callable[[int], Sequence[types.Prompt]],
               score: Callable[[list], list[types.ScoredGroup]], weights: WeightBox, policy: AdmissionPolicy, samples: int,
               start: int, end: int, out: BatchBuffer, stop: threading.Event):
    super().__init__(name="generator", daemon=True)
    self.driver, self.next_prompts, self.score = driver, next_prompts, score
    self.weights, self.policy, self.samples = weights, policy, samples
    self.start_batch, self.end, self.out, self.stop_event = start, end, out, stop
    self.stats = GeneratorStats()
    self.error: Optional[BaseException] = None
    self.error_text = ""

  def run(self) -> None:
    try:
      self._loop()
    except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which re-raises it
      self.error, self.error_text = exc, traceback.format_exc()
      self.stop_event.set()

  def _loop(self) -> None:
    driver, stats = self.driver, self.stats
    next_batch = self.start_batch
    where: dict[int, tuple[int, int]] = {}  # driver uid -> (batch, position)
    pending: dict[int, list] = {}  # batch -> groups (None until scored)
    last_version = None
    while not self.stop_event.is_set():
      params, version = self.weights.latest()
      if last_version is not None and version != last_version:
        stats.weight_updates += 1
        stats.in_flight_updates += int(driver.busy)
      last_version = version
      while next_batch < self.end and self.policy.may_admit(next_batch, version):
        prompts = list(self.next_prompts(next_batch))
        pending[next_batch] = [None] * len(prompts)
        for pos, prompt in enumerate(prompts):
          where[driver.submit(prompt, self.samples)] = (next_batch, pos)
        next_batch += 1
      if not (driver.busy or driver.queued_prompts):
        if next_batch >= self.end:
          return
        t = time.perf_counter()
        stats.waits_for_weights += 1
        self.weights.wait_newer(version, timeout=0.05)
        stats.idle_s += time.perf_counter() - t
        continue
      t = time.perf_counter()
      faults.point("rollout_step")
      finished = driver.step(params, version)
      complete = []
      for rollout_group, group in zip(finished, self.score(finished)):
        b, pos = where.pop(rollout_group.uid)
        pending[b][pos] = group
        if all(g is not None for g in pending[b]):
          complete.append(types.ScoredBatch(b, tuple(pending.pop(b))))
      stats.busy_s += time.perf_counter() - t  # before the put: a consumer that reads it sees this batch's time
      for batch in complete:
        self.out.put(batch)


def run_pipeline(*, generator: GeneratorThread, consume: Callable[[types.ScoredBatch, float], bool], start: int,
                 end: int,
                 interrupted: Callable[[], bool], join_timeout: float = 30.0) -> int:
  """Runs the generator thread and feeds batches start..end-1 to `consume` on this thread in order.

  `consume(batch, wait_s)` trains one step (`wait_s`: how long the trainer waited for that batch) and returns False
  to stop early. Returns the number of steps consumed.
  Raises PipelineError (chained to the generator's exception) when the generator thread failed.
  """
  stop = generator.stop_event
  generator.start()
  done = 0
  try:
    for step in range(start, end):
      if interrupted():
        break
      t0 = time.perf_counter()
      batch = generator.out.get(step)
      if batch is None:  # stopped: the generator failed (or someone else stopped the run)
        break
      done += 1
      if not consume(batch, time.perf_counter() - t0):
        break
  finally:
    stop.set()
    generator.join(timeout=join_timeout)
  if generator.error is not None:
    raise PipelineError(f"generator thread failed:\n{generator.error_text}") from generator.error
  if generator.is_alive():
    raise PipelineError(f"generator thread did not stop within {join_timeout:.0f} s")
  return done


def run_synchronous(*, driver, next_prompts: Callable[[int], Sequence[types.Prompt]],
                    score: Callable[[list], list[types.ScoredGroup]], weights: WeightBox, samples: int, start: int,
                    end: int, consume: Callable[[types.ScoredBatch], bool], interrupted: Callable[[], bool],
                    stats: GeneratorStats) -> None:
  """The reference loop, no threads: batch s is generated entirely by the params of version s, then step s trains
  on it. PipelineRL-0 (`run_pipeline` with k = 0) must equal it bit for bit. Generation time goes to `stats.busy_s`
  (the compute meter splits a shared device's time by it)."""
  for step in range(start, end):
    if interrupted():
      return
    t = time.perf_counter()
    params, version = weights.latest()
    uids = {driver.submit(prompt, samples): pos for pos, prompt in enumerate(next_prompts(step))}
    groups: list = [None] * len(uids)
    while driver.busy or driver.queued_prompts:
      faults.point("rollout_step")
      finished = driver.step(params, version)
      for rollout_group, group in zip(finished, score(finished)):
        groups[uids[rollout_group.uid]] = group
    stats.busy_s += time.perf_counter() - t
    if not consume(types.ScoredBatch(step, tuple(groups))):
      return
