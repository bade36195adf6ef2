"""The one seam that knows the process topology: what a trainer process exchanges with the others in a step.

    Local          one process: trains and generates (a generator thread, or the synchronous loop)
    Colocated      several processes, each trains and generates its shard; the trainer mesh spans them all
    Disaggregated  a trainer process of mesh.generator_processes=n > 0: BatchMsg in, ControlMsg and weights out
                   to the generator processes (diagram: run/generator.py)
    GeneratorEnd   a disaggregated generator process: it runs run/generator.py's loop, not the job's

Per step every trainer process makes these calls, each a collective among the trainer processes (or a message
exchange with the generators), in this order:
  1. gather      the step's groups and every scoring process's reward and data counters (colocated: an allgather;
                 disaggregated: each generator's BatchMsg, received by every trainer). The jitted step then runs
                 SPMD over the global batch on the trainer mesh.
  2. record      NPR hears of the step, the same on every process (disaggregated: the lead trainer sends ControlMsg)
                 before version step + 1 is published
  3. publish     the new params replicated on the trainer mesh while they are published (an all-gather; to the
                 generator processes: a transfer); with logging.every_process the params' checksum. Skipped by
                 every process alike when the mode does not publish this version.
  4. evaluate    the evaluator's allgather of its shares (when an evaluation is due; several trainers only)
  5. checkpoint  gather_json of the data and reward states, then orbax's save (when a checkpoint is due)
  6. vote_stop   whether a signal reached any trainer process
Every process makes the same calls in the same order: wrapping one in `if is_main`, or skipping it on one process,
leaves the others waiting in it and deadlocks the pod (tests/test_exchange.py checks the order).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Optional

from scalerl_jax import distributed, faults, types
from scalerl_jax.pipeline import step_metrics
from scalerl_jax.pipeline.orchestrator import (BatchBuffer, GeneratorStats, GeneratorThread, run_pipeline,
                                               run_synchronous)
from scalerl_jax.pipeline.weight_sync import WeightSync, local_replica, place, to_rollout_layout
from scalerl_jax.train.checkpoint import ResumeError, params_checksum

COLLECTIVE_ORDER = ("gather", "record", "publish", "evaluate", "checkpoint", "vote_stop")


@dataclasses.dataclass(frozen=True)
class Gathered:
  """Step `batch.index` as every trainer process sees it after `gather`."""
  batch: types.ScoredBatch  # every process's groups, in data order
  reward_metrics: Optional[list]  # every scoring process's reward counters (None: this process's, read when logged)
  data_metrics: dict  # other processes' data counters, merged ({} in one process)
  generator_stats: Optional[GeneratorStats] = None  # a remote generator's (None: this process's generator)


class Local:
  """One process. Also the defaults of the others."""

  def __init__(self, topology: distributed.Topology, trainer_mesh, channel: Optional[distributed.Channel] = None):
    self.topology, self.trainer_mesh, self.channel = topology, trainer_mesh, channel
    self.is_main = topology.process_index == 0  # logs, metrics, progress, config.yaml, the run-directory lock
    self.trainers = topology.trainers
    self.alone = topology.process_count == 1  # a user error may stop the run with a checkpoint (no peer waits)
    self.votes = len(self.trainers) > 1  # a stop is decided by all trainers together, at a step's end
    self.sync: Optional[WeightSync] = None

  def restore(self, meta: types.RunMeta, cursor, rewards) -> None:
    """This process's prompt stream, NPR and reward totals from a checkpoint's metadata."""
    self._check_readers(meta)
    pi, states = self.topology.process_index, meta.reward_states
    cursor.restore(meta.data_states[pi], meta.npr)
    own = states[pi] if states and len(states) == self.topology.process_count else meta.rewards
    rewards.load_state(own if own is not None else rewards.state())

  def _check_readers(self, meta: types.RunMeta) -> None:
    readers = len(self.topology.generators)
    if len(meta.data_states) != readers:
      raise ResumeError(f"checkpoint {meta.step} holds the data state of {len(meta.data_states)} prompt-reading "
                        f"processes; this run has {readers}: resume with as many processes (and "
                        "mesh.generator_processes) as wrote it")

  def start_weights(self, shardings: Any, params: Any, version: int, policy=None) -> None:
    """The weight sync, with the initial params published (disaggregated: also sent to the generators); with a
    `policy` that has adapters, later syncs move the adapters alone (weight_sync.Partial)."""
    self.sync = WeightSync(shardings, params, version, policy=policy)

  # ---- one step, in COLLECTIVE_ORDER ----
  def gather(self, batch: types.ScoredBatch, rewards, cursor) -> Gathered:
    return Gathered(batch, None, {})

  def record(self, cursor, step: int, prompt_ids, pass_rates, publishes: bool) -> dict:
    """NPR update with step `step` on every process; returns the data metrics after it."""
    return cursor.record(step, prompt_ids, pass_rates)

  def publish(self, params: Any, version: int, publishes: bool, checksum: bool) -> tuple[float, dict]:
    """Publishes `params` as `version` if `publishes`; returns (the sync's seconds, its other metrics)."""
    if publishes:
      faults.point("weight_sync")
      self.sync.publish(params, version)
    return (self.sync.last_seconds if publishes else 0.0), {"pipeline/weight_sync_bytes":
                                                            self.sync.last_bytes if publishes else 0}

  def evaluate(self, evaluator, params: Any, version: int) -> dict:
    """The held-out evaluation of `params`: each trainer process scores its share, then `eval_gather`."""
    return evaluator.evaluate(params, version)

  def eval_gather(self, record: Any) -> list:
    """Every trainer process's share of an evaluation (the evaluator calls it when there are several)."""
    return distributed.allgather(record, self.trainers)

  def checkpoint_states(self, data_state: dict, rewards) -> tuple[list, Optional[list]]:
    """(every prompt reader's stream state, given this process's `data_state`; every scoring process's reward
    totals, or None in one process)."""
    return distributed.gather_json(data_state), None

  def vote_stop(self, stop: bool) -> bool:
    """Whether any trainer process wants to stop (each decides the same)."""
    return any(distributed.allgather(stop, self.trainers)) if self.votes else stop

  def stop_before_step(self, stop: bool) -> bool:
    """The loop's check before each step (no collective): one trainer process stops at once; several at the end of
    a step (`vote_stop`), so that a signal reaching some of them stops all at one step."""
    return stop and not self.votes

  def rollout_copy(self, params: Any, shardings: Any) -> Any:
    """A copy of the trainer's params in the rollout layout (to evaluate params that were not published)."""
    return to_rollout_layout(params, shardings)

  def run(self, job, sync: bool) -> dict:
    """This process's part of the run (a trainer's: the job's lifecycle around `loop`)."""
    return job.run_loop(lambda: self.loop(job, sync))

  def loop(self, job, sync: bool) -> None:
    """Steps job.start_step .. the end from this process's own generation (a thread, or in turn with `sync`)."""
    p, end = job.parts, job.cfg.pipeline.steps
    if sync:
      run_synchronous(driver=p.driver, next_prompts=p.cursor.next_batch, score=job.score, weights=job.weights,
                      samples=p.shapes.G, start=job.start_step, end=end, consume=job.consume,
                      interrupted=job.interrupted, stats=job.generator_stats)
      return
    stop = threading.Event()
    job.generator = GeneratorThread(
        driver=p.driver, next_prompts=p.cursor.next_batch, score=job.score, weights=job.weights,
        policy=p.admission, samples=p.shapes.G, start=job.start_step, end=end, out=BatchBuffer(stop), stop=stop)
    job.generator_stats = job.generator.stats
    run_pipeline(generator=job.generator, consume=job.consume, start=job.start_step, end=end,
                 interrupted=job.interrupted)

  def end_early(self) -> None:
    """A signal stopped the trainer before its loop (or in it): nothing waits on this process here."""


class Colocated(Local):
  """Every process trains and generates its shard of the prompts; the trainer mesh spans all of them."""

  def start_weights(self, shardings, params, version, policy=None) -> None:
    self.sync = WeightSync(shardings, params, version, trainer_mesh=self.trainer_mesh, policy=policy)

  def gather(self, batch, rewards, cursor) -> Gathered:
    parts = distributed.allgather((batch.groups, rewards.metrics(), cursor.stream.metrics()))
    return Gathered(types.ScoredBatch(batch.index, tuple(g for groups, _, _ in parts for g in groups)),
                    [r for _, r, _ in parts], step_metrics.merge_counters([d for _, _, d in parts]))

  def publish(self, params, version, publishes, checksum):
    sync_s, out = super().publish(params, version, publishes, checksum)
    if checksum:  # a reduction over the sharded params: a collective too
      out["pipeline/weight_checksum"] = params_checksum(params)
    return sync_s, out

  def checkpoint_states(self, data_state, rewards):
    return distributed.gather_json(data_state), distributed.gather_json(rewards.state())

  def rollout_copy(self, params, shardings):
    return place(local_replica(params, self.trainer_mesh), shardings)


class Disaggregated(Colocated):
  """A trainer process of a disaggregated run: the steps' batches come from the generator processes."""

  def __init__(self, topology, trainer_mesh, channel):
    super().__init__(topology, trainer_mesh, channel)
    self.lead = topology.process_index == self.trainers[0]  # sends the start, control and weight messages
    self.data_states: Optional[list] = None  # each generator's stream state as of the latest batch (or checkpoint)
    self.reward_states: Optional[list] = None  # each generator's reward totals, likewise
    self._last: list[types.BatchMsg] = []  # the latest step's messages

  def restore(self, meta, cursor, rewards) -> None:
    """NPR and this process's reward totals; the generators' stream and reward states go to them at start."""
    self._check_readers(meta)
    self.data_states = meta.data_states
    cursor.npr.load_state_dict(meta.npr)
    rewards.load_state(meta.rewards if meta.rewards is not None else rewards.state())
    self.reward_states = meta.reward_states[len(self.trainers):] if meta.reward_states else None

  def start_weights(self, shardings, params, version, policy=None) -> None:
    self.sync = WeightSync(shardings, params, version, trainer_mesh=self.trainer_mesh, channel=self.channel,
                           send_to=self.topology.generators if self.is_main else (), policy=policy)

  def gather(self, batch, rewards, cursor) -> Gathered:
    parts = self._last  # received in `loop`, before the step
    data = {**step_metrics.merge_counters([m.data_metrics for m in parts]),
            "pipeline/weight_recv_s": parts[0].weight_recv_s}
    return Gathered(batch, [rewards.metrics()] + [m.reward_metrics for m in parts], data,
                    GeneratorStats(**parts[0].stats))

  def record(self, cursor, step, prompt_ids, pass_rates, publishes) -> dict:
    out = cursor.record(step, prompt_ids, pass_rates)
    if self.lead:  # the generators record the same, then take the new weights
      msg = types.ControlMsg(step, tuple(prompt_ids), tuple(float(r) for r in pass_rates), publishes)
      for g in self.topology.generators:
        self.channel.send_obj(g, "control", msg)
    return out

  def checkpoint_states(self, data_state, rewards):  # the generators' states as sent with batch `step` - 1
    own = distributed.gather_json(rewards.state(), self.trainers)
    return self.data_states, own + list(self.reward_states or [{} for _ in self.topology.generators])

  def run(self, job, sync: bool) -> dict:
    if sync:
      raise distributed.DistributedError("--reference-loop runs generation and training in turn on the same "
                                         "processes; with mesh.generator_processes use pipeline.mode=lockstep")
    return super().run(job, sync)

  def loop(self, job, sync: bool) -> None:
    """Receive batch s from every generator, train step s (`job.consume` sends control s and weights s + 1)."""
    generators = self.topology.generators
    if self.lead:  # the initial weights went out with start_weights
      for i, g in enumerate(generators):
        self.channel.send_obj(g, "start", types.StartMsg(
            job.start_step, job.parts.cursor.npr.state_dict(), self.data_states[i] if self.data_states else None,
            (self.reward_states[i] or None) if self.reward_states else None))
    try:
      for step in range(job.start_step, job.cfg.pipeline.steps):
        t0 = time.perf_counter()
        self._last = [self.channel.recv_obj(g, "batch") for g in generators]
        self.data_states = [m.data_state for m in self._last]
        self.reward_states = [m.reward_state for m in self._last]
        batch = types.ScoredBatch(step, tuple(g for m in self._last for g in m.groups))
        if not job.consume(batch, time.perf_counter() - t0):
          break
    finally:
      self.end_early()

  def end_early(self) -> None:
    if self.lead:
      distributed.request_stop()  # the generators may still wait for weights or a control message


class GeneratorEnd(Local):
  """A generator process of a disaggregated run: run/generator.py's loop instead of the job's."""

  def run(self, job, sync: bool) -> dict:
    from scalerl_jax.run.generator import serve
    return serve(job, self)
