"""The RL job: set-up on the parts run/build.py makes, then the step's cadence (train, publish, log, evaluate and
checkpoint on schedule); how a run starts and ends: run/lifecycle.py. The pipeline and its admission rule:
pipeline/orchestrator.py; weight sync and its ordering contract: pipeline/weight_sync.py; what crosses processes, in
which order: run/exchange.py.

    RLJob(cfg).run()       PipelineRL-k / PPO-off-policy-k with a generator thread (the product)
    RLJob(cfg).run_sync()  the synchronous reference loop: generate a batch, train on it, repeat (no threads)

Threads: the trainer is the caller's thread; `run()` adds the generator thread (what both touch, and why that is
safe: run/build.py). `version` (the Trainer's) is the one policy-version counter on the host, the optimizer steps
taken (= state.step): step s trains on batch s and turns version s into s + 1.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from scalerl_jax import faults, types
from scalerl_jax.config import RunConfig, to_yaml
from scalerl_jax.pipeline import step_metrics
from scalerl_jax.pipeline.batching import warm_prepare
from scalerl_jax.pipeline.interrupts import Interrupts, Stopped
from scalerl_jax.pipeline.orchestrator import GeneratorStats, GeneratorThread
from scalerl_jax.run import build
from scalerl_jax.run.lifecycle import Lifecycle
from scalerl_jax.run.trainer import Trainer
from scalerl_jax.train.checkpoint import config_fingerprint
from scalerl_jax.train.run_lock import RunLock


class RLJob(Lifecycle):
  """One run on this process: set-up from the built parts, then one `consume` per step."""

  def __init__(self, cfg: RunConfig, progress: Optional[bool] = None, transfer_host: Optional[str] = None):
    self.interrupts = Interrupts()  # SIGINT / SIGTERM: the stop flag every long phase checks (interrupts.py)
    self.parts = p = build.build(build.resolve_config(cfg), between=self._raise_if_stopped,
                                 transfer_host=transfer_host)
    self.cfg, self.run_dir, self.exchange, self.trainer = p.cfg, p.run_dir, p.exchange, Trainer(p)
    # the parts callers read most (all of them: `parts`)
    self.tokenizer, self.task, self.policy, self.optimizer = p.tokenizer, p.task, p.policy, p.optimizer
    self.engine, self.driver, self.cursor, self.rewards = p.engine, p.driver, p.cursor, p.rewards
    self.evaluator, self.admission = p.evaluator, p.admission
    self.trainer_layout, self.generator_layout, self.shapes = p.trainer_layout, p.generator_layout, p.shapes
    self.ckpt, self.meter = p.ckpt, p.meter
    self.progress = p.cfg.logging.progress if progress is None else progress
    self.start_step = 0
    self.log: Optional[step_metrics.StepLog] = None  # holds the last step's metrics, read one step late
    self.generator: Optional[GeneratorThread] = None  # the generator thread of `run()` on this process
    self.generator_stats = GeneratorStats()  # its stats, the synchronous loop's, or a remote generator's
    self.observers: list[Callable[[types.StepRecord], None]] = []  # called with each step's record when held
    self.summary: dict = {}
    self._last_eval_step = -1
    self.base: Optional[dict] = None  # lora: RunMeta.base, the frozen base the adapters train on
    self._lock: Optional[RunLock] = None  # taken by setup()

  @property
  def version(self) -> int:
    return self.trainer.version

  @property
  def state(self):
    return self.trainer.state

  @property
  def weights(self):
    """The WeightBox the generators read."""
    return self.exchange.sync.box

  # ---- set-up ----
  def setup(self) -> None:
    """Take the run directory (one live run per directory), then resume from its latest intact checkpoint or
    start a fresh run; compile the step."""
    self._lock = RunLock(self.run_dir).acquire() if self.exchange.is_main else None
    try:
      self.parts.ckpt.remove_orphans()  # temporary directories of a write a kill cut short (only we write here now)
      self._setup()
    except BaseException:
      self.release()
      raise

  def _setup(self) -> None:
    p, main = self.parts, self.exchange.is_main
    self.trainer.state, meta = build.initial_state(p, self._stop_now, self.progress and main, self.summary)
    if meta is not None:
      self.exchange.restore(meta, p.cursor, p.rewards)
      p.meter.load_state(meta.compute)
      self.start_step, self._last_eval_step = meta.step, meta.last_eval_step
      self.summary.update(meta.summary)
      self.summary["resumed_from"] = self.start_step
    elif main:
      (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))
    self.trainer.version = self.start_step
    # adapters: checkpoints hold them alone and name the frozen base they train on (build.checkpointed)
    self.base = (build.base_record(self.cfg, p.policy.split_trainable(self.state.params)[1])
                 if p.policy.lora is not None else None)
    self.trainer.frozen = build.frozen_policies(p, self.trainer.state, meta is not None, self._stop_now,
                                                self.progress and main)
    # samples of batch b draw from keys derived from their admission number: continue the numbering on resume
    p.driver.first_uid = self.start_step * p.prompts_here
    if self._stop_now():  # a compilation cannot be interrupted: do not start one after a signal
      raise Stopped("before compiling the train step")
    self.trainer.step_for(p.buckets[-1])  # the whole batch's step compiles here, before the loop
    warm_prepare(p.shapes, self.cfg.loss)
    self.log = build.step_log(p, self.start_step, meta is not None, self.progress, self.evaluate)
    self.exchange.start_weights(p.engine.param_shardings, self.state.params, self.version, p.policy)

  # ---- one step (trainer thread; `score` is also called by the generator thread) ----
  def score(self, groups):
    return self.parts.rewards.score_groups(groups, self.parts.tokenizer.decode)

  def consume(self, batch: types.ScoredBatch, wait_s: float = 0.0) -> bool:
    """Train step `batch.index` on a complete batch; publish weights; log; evaluate and checkpoint on schedule. The
    exchange's calls are the step's collectives, in run/exchange.py's order: keep every one unconditional."""
    t0, cfg, p, ex = time.perf_counter(), self.cfg, self.parts, self.exchange
    got = ex.gather(batch, p.rewards, p.cursor)
    if got.generator_stats is not None:
      self.generator_stats = got.generator_stats
    done = self.trainer.train_on(got.batch)
    step, version, publishes = done.step, self.version, p.admission.publishes(self.version)
    # NPR hears of this step before the new version is published: a generator that may then draw batch
    # step + 1 + k (and filter a new epoch as of step + 1) must find this step's solves recorded
    data_metrics = {**ex.record(p.cursor, step, done.packed.prompt_ids, [g.pass_rate for g in got.batch.groups],
                                publishes), **got.data_metrics}
    sync_s, sync_metrics = ex.publish(self.state.params, version, publishes, cfg.logging.every_process)
    self._flush()  # the previous step's device metrics are ready by now: read them one step late
    host = step_metrics.host_metrics(got.batch, done.packed, done.prepare_metrics, data_metrics, sync_s, wait_s,
                                     version)
    host.update(sync_metrics)
    # totals: calls, errors, timeouts, killed workers, failure rate (of every process that scores)
    host.update(step_metrics.merge_counters(got.reward_metrics) if got.reward_metrics is not None
                else p.rewards.metrics())
    host["train/groups"] = done.groups
    p.meter.count_tokens(host["rollout/tokens"], done.trained_tokens, p.flops_per_token)
    p.meter.train_flops += done.frozen_flops  # the reference's / teacher's forward (train/reference.py)
    record = types.StepRecord(step, done.device_metrics, host, done.trained_tokens / done.train_s,
                              time.perf_counter() - t0 - done.compile_s + wait_s, wait_s)
    self.log.hold(record, self.generator_stats)
    p.meter.train_busy_s += time.perf_counter() - t0 - done.compile_s
    self.log.logger.write_prompts(step, list(done.packed.prompt_ids))
    for observe in self.observers:
      observe(record)
    if self._evaluation_due(version):
      self._flush(evaluate=True)
    if version % cfg.checkpoint.every_steps == 0:
      self._flush()  # the metrics of every step a checkpoint covers are written before it
      self.checkpoint()
    faults.point("step_end")
    stop = self._stop_now()  # a signal that reached some processes stops them all at this step
    error = self.trainer.skip_error(step)
    if error is not None:
      self._flush()
      if p.ckpt.latest_step() != version:  # the params are those before the skipped steps: usable
        self.checkpoint()
      raise error
    return not stop

  def _stop_now(self) -> bool:
    """Whether a signal asked the run to stop; with several trainer processes a vote (a collective)."""
    return self.exchange.vote_stop(self.interrupts.is_set())

  def _raise_if_stopped(self) -> None:
    """An evaluation's check between decode steps (one trainer process only)."""
    if self.interrupts.is_set():
      raise Stopped(f"during the evaluation at step {self.version}")

  def interrupted(self) -> bool:
    """The loop's check before each step (run/exchange.py `stop_before_step`)."""
    return self.exchange.stop_before_step(self.interrupts.is_set())

  def _flush(self, evaluate: bool = False) -> None:
    self.log.flush(self.generator_stats, evaluate)

  def evaluate(self) -> dict:
    """Held-out mean@n at the eval temperature and greedy pass@1 of the published params (time excluded from
    compute)."""
    faults.point("evaluate")
    params, published = self.weights.latest()
    if published != self.version:  # PPO-off-policy-k publishes every k steps: score the trainer's own params
      params = self.exchange.rollout_copy(self.state.params, self.parts.engine.param_shardings)
    out = self.exchange.evaluate(self.parts.evaluator, params, self.version)
    self._last_eval_step = self.version
    self.parts.meter.exclude(out["eval/seconds"])
    return out

  def checkpoint(self) -> None:
    """The TrainState of `version` plus everything a resume needs to continue the same data order."""
    t0, step, p = time.perf_counter(), self.version, self.parts
    data_state, npr_state = p.cursor.state_before(step)
    data_states, reward_states = self.exchange.checkpoint_states(data_state, p.rewards)
    meta = types.RunMeta(step, self.cfg.seed, data_states, npr_state, p.meter.state(),
                         config_fingerprint(self.cfg), p.rewards.state(), reward_states, self._last_eval_step,
                         {k: v for k, v in self.summary.items() if isinstance(v, (int, float, str))}, self.base)
    faults.point("checkpoint_save")
    with self.interrupts.critical():  # a second Ctrl-C waits for the write to complete
      p.ckpt.save(step, build.checkpointed(p.policy, self.state), meta.to_json())
    p.meter.exclude(time.perf_counter() - t0)
