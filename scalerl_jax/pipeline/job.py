"""The RL job: the composition root. Builds every part from a RunConfig, then runs the ScaleRL loop (the pipeline
and its admission rule: orchestrator.py; weight sync and its ordering contract: weight_sync.py).

    RLJob(cfg).run()       PipelineRL-k / PPO-off-policy-k with a generator thread (the product)
    RLJob(cfg).run_sync()  the synchronous reference loop: generate a batch, train on it, repeat (no threads)

Threads: the trainer is the caller's thread; `run()` adds the generator thread, which drives `self.driver` and
calls `cursor.next_batch` and `score`. What both threads touch, and why that is safe:
  DataCursor      prompt stream + NPR (the generator draws batches; the trainer records pass rates, checkpoints
                  the stream): one lock
  WeightBox       (inside WeightSync) the trainer publishes, the generator reads between decode chunks: one lock
  BatchBuffer     the generator puts scored batches, the trainer takes them in order: one condition + stop event
  RewardRunner    both score at once (evaluation while the generator runs on): every call has its own state and
                  the runner's totals are locked
  Engine          jitted calls on explicit arguments; its cached version scalars are per call
  tokenizer       read-only
  GeneratorStats  plain counters the generator writes and the trainer reads for metrics (a stale read is fine)
Evaluation has its own RolloutDriver on the same engine, so it never touches the generator's decode slots.
Everything else on `self` belongs to the trainer thread.

Versions: `self.version` is the one policy-version counter on the host: the optimizer steps taken (= state.step),
set on setup and advanced by `consume`. Step s trains on batch s and turns version s into s + 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import pathlib
import threading
import time
from typing import Any, Callable, Optional, Sequence

import jax

from scalerl_jax import distributed, faults, rl, types
from scalerl_jax.config import ConfigError, RunConfig, absolute_paths, to_yaml, validate, validate_with_tokenizer
from scalerl_jax.errors import UserError
from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.prompt_stream import PromptsExhausted, encode_records, make_prompt_stream
from scalerl_jax.data.tasks import make_task
from scalerl_jax.data.tokenizer import make_tokenizer
from scalerl_jax.mesh import ROLLOUT_AXES, ROLLOUT_RULES, TRAIN_RULES, Layout, make_mesh
from scalerl_jax.model import flops_per_token, make_policy
from scalerl_jax.pipeline import step_metrics
from scalerl_jax.pipeline.batching import build_train_batch, compact_groups, group_buckets, pack_groups, warm_prepare
from scalerl_jax.pipeline.compute import ComputeMeter
from scalerl_jax.pipeline.data_cursor import DataCursor
from scalerl_jax.pipeline.held_out import Evaluator
from scalerl_jax.pipeline.interrupts import Interrupts, Stopped
from scalerl_jax.pipeline.orchestrator import (AdmissionPolicy, BatchBuffer, GeneratorStats, GeneratorThread,
                                               PipelineError, run_pipeline, run_synchronous)
from scalerl_jax.pipeline.sinks import MetricsLogger, ProgressBar
from scalerl_jax.pipeline.weight_sync import WeightSync, local_replica, place, to_rollout_layout
from scalerl_jax.rewards import make_reward_runner
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine
from scalerl_jax.train.checkpoint import ResumeError, RunCheckpointer, config_fingerprint, params_checksum
from scalerl_jax.train.rl_loss import PromptLayout, make_rl_loss
from scalerl_jax.train.run_lock import RunLock
from scalerl_jax.train.state import TrainState, init_train_state, make_optimizer, restore_target, state_shardings
from scalerl_jax.train.step import NonFiniteError, make_train_step, micro_batches_within, temp_bytes
from scalerl_jax.train.warmstart import warm_start

log = logging.getLogger(__name__)


class RLJob:

  def __init__(self, cfg: RunConfig, progress: Optional[bool] = None, transfer_host: Optional[str] = None):
    cfg = absolute_paths(cfg)  # config.yaml and the checkpoints' fingerprints name the files from any directory
    if cfg.model.pretrained:  # the architecture is the checkpoint's: read it from its config.json
      from scalerl_jax.model.hf import hf_model_config, pretrained_dir
      m = cfg.model  # the dtypes stay the user's: params and optimizer state in param_dtype, compute in dtype
      arch = hf_model_config(pretrained_dir(m.pretrained), dtype=m.dtype, param_dtype=m.param_dtype,
                             max_seq_len=m.max_seq_len)
      cfg = validate(dataclasses.replace(cfg, model=dataclasses.replace(
          arch, pretrained=m.pretrained, fp32_lm_head=m.fp32_lm_head)))
    self.cfg, d, r = cfg, cfg.data, cfg.rollout
    self._interrupt = Interrupts()  # SIGINT / SIGTERM: the stop flag every long phase checks (interrupts.py)
    self.progress = cfg.logging.progress if progress is None else progress
    self.run_dir = pathlib.Path(cfg.run_dir)
    try:
      self.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
      raise ConfigError(f"run_dir: cannot create {self.run_dir} ({exc.strerror or exc})") from None
    # processes: who trains, who generates (one process: both); every process must run the same config and code
    self.topology = topo = distributed.Topology.current(cfg.mesh.generator_processes)
    self.is_main = jax.process_index() == 0  # logs, metrics, progress, config.yaml, the run-directory lock
    if topo.process_count > 1:
      distributed.check_same_everywhere({"config": to_yaml(cfg), "code": distributed.code_version()})
    trainer_devices, gen_devices = distributed.split_for(topo, cfg.mesh.generator_devices)
    self.trainer_layout = Layout(make_mesh(cfg.mesh.spec, trainer_devices), TRAIN_RULES)
    self.generator_layout = Layout(make_mesh(cfg.mesh.generator_spec, gen_devices, ROLLOUT_AXES), ROLLOUT_RULES)
    self.shapes = s = types.StepShapes.from_config(cfg)  # the whole step batch: every trainer process holds it
    # this process's shard of the prompt stream (a disaggregated trainer draws none; its cursor keeps NPR only)
    shard = ((topo.generators.index(topo.process_index), len(topo.generators)) if topo.generates else (0, 1))
    self.policy = make_policy(cfg.model)
    # prompts -> rollouts -> rewards
    self.tokenizer = make_tokenizer(d, vocab_size=cfg.model.vocab_size)
    validate_with_tokenizer(cfg, self.tokenizer)
    self.task = make_task(d)
    npr = NPRState(d.npr)
    self.cursor = DataCursor(make_prompt_stream(self.task, d, self.tokenizer, s.L, npr=npr,
                                                process_index=shard[0], process_count=shard[1]), npr,
                             max_lag=AdmissionPolicy.from_config(cfg.pipeline.mode, cfg.pipeline.max_lag).k)
    self.rewards = make_reward_runner(cfg.reward, self.task.verifiers, sandbox=cfg.sandbox)
    it = r.interruption
    self.engine = Engine(self.policy, r, self.generator_layout.mesh, rules=self.generator_layout.rules,
                         stop_ids=list(self.tokenizer.eos_ids), phrase_ids=self.tokenizer.encode(it.phrase),
                         end_marker_ids=self.tokenizer.encode(it.end_marker))
    # a sample's random stream is keyed by its prompt's position in the whole stream (uid), whichever process
    # generates it: a run gives the same rollouts on any number of processes
    self.driver = RolloutDriver(self.engine, seed=cfg.seed, uid_stride=shard[1], uid_offset=shard[0])
    self._prompts_here = d.prompts_per_step // shard[1]
    p = cfg.pipeline
    self.evaluator = Evaluator(RolloutDriver(self.engine, seed=cfg.seed), self.tokenizer, self.rewards,
                               encode_records(self.task.eval_records(), self.tokenizer, s.L, d.long_prompts)[0],
                               p.eval_samples, p.eval_temperature, seed=cfg.seed + 1,
                               shard=(topo.trainers.index(topo.process_index), len(topo.trainers))
                               if topo.trains else (0, 1),
                               gather=lambda record: distributed.allgather(record, topo.trainers),
                               # one trainer process: an evaluation stops between decode steps at a signal (with
                               # several, each one's share ends at a different step; they stop at the step's end)
                               between=self._raise_if_stopped if len(topo.trainers) == 1 else None)
    # loss -> update
    self.optimizer = make_optimizer(cfg.optimizer)
    self.state_sh = state_shardings(self.policy, self.optimizer, self.trainer_layout)
    self.batch_sh = types.TrainBatch.of(
        rows=self.trainer_layout.batch(1, s.global_B), tokens=self.trainer_layout.batch(2, s.global_B),
        routes=self.trainer_layout.batch(4, s.global_B) if self.engine.routes_Xk else None)
    self.prompt_layout = PromptLayout(s.G, s.L, s.N) if cfg.trainer.shared_prompt else None
    self._train_steps: dict[int, Callable] = {}  # the jitted train step per micro-batch count
    # the group counts a step batch may be cut to (trainer.batch_buckets): whole micro-batches of whole groups,
    # rows a multiple of the batch's shards; an MoE policy always trains on the whole batch
    shards = s.global_B // self.batch_sh.tokens.shard_shape((s.global_B, s.T))[0]
    unit = math.lcm(cfg.trainer.micro_batches, shards // math.gcd(shards, s.G))
    self.buckets = (group_buckets(s.global_B // s.G, cfg.trainer.batch_buckets, unit)
                    if not cfg.model.moe_layers else (s.global_B // s.G,))
    self._step_fns: dict[int, Callable] = {}  # compiled train step per group count
    self.micro_batches: dict[int, int] = {}  # its micro-batch count per group count (trainer.max_step_memory_mb)
    self._flops_per_token = lambda backward: flops_per_token(cfg.model, s.T // 2, backward=backward)
    self.admission = AdmissionPolicy.from_config(cfg.pipeline.mode, cfg.pipeline.max_lag)
    self.ckpt = (RunCheckpointer(self.run_dir / "checkpoints", cfg.checkpoint.keep,
                                 topo.trainers if topo.disaggregated else None) if topo.trains else None)
    self.meter = ComputeMeter(len(gen_devices) * len(topo.generators), len(trainer_devices),
                              cfg.mesh.generator_devices == 0 and not topo.disaggregated)
    # disaggregated: messages between the trainers and the generators (through a transfer server on
    # `transfer_host`, --transfer-host), what the generators last reported
    self.channel = distributed.Channel(transfer_host or distributed.default_transfer_host()) \
        if topo.disaggregated else None
    self.remote: dict[str, Any] = {}
    self.on_record: Optional[Callable[[int, Sequence[str], Sequence[float], bool], None]] = None
    self.state: Optional[TrainState] = None
    self.start_step = self.version = 0
    self.sync: Optional[WeightSync] = None
    self.log: Optional[step_metrics.StepLog] = None  # holds the last step's metrics, read one step late
    self._last_eval_step = -1
    self._skipped_in_a_row = 0  # steps whose update was not applied (non-finite loss or gradient)
    self._generator: Optional[GeneratorThread] = None
    self._gen_stats = GeneratorStats()  # the generator thread's own, or the synchronous loop's
    self._lock: Optional[RunLock] = None  # taken by setup()
    self.summary: dict[str, Any] = {}

  @property
  def exit_code(self) -> int:
    """0, or 128 + the signal that stopped the run (130 Ctrl-C, 143 SIGTERM)."""
    return self._interrupt.exit_code

  @property
  def weights(self):
    """The WeightBox the generators read."""
    return self.sync.box

  def trained_tokens(self, rows: int) -> int:
    """Token positions a step of `rows` rows runs through the model (each prompt once per group with the
    shared-prompt loss)."""
    return self.prompt_layout.trained_tokens(rows) if self.prompt_layout else rows * self.shapes.T

  def _train_step(self, micro_batches: int) -> Callable:
    """The jitted train step over `micro_batches` micro-batches of whole groups."""
    if micro_batches not in self._train_steps:
      cfg, r = self.cfg, self.cfg.rollout
      loss_fn = make_rl_loss(self.policy, cfg.loss, r.temperature, self.prompt_layout,
                             replay=cfg.trainer.routing_replay, micro_batches=micro_batches)
      self._train_steps[micro_batches] = make_train_step(
          loss_fn, self.optimizer, micro_batches, self.state_sh, self.batch_sh, metrics_init=rl.empty_metrics,
          metrics_combine=rl.accumulate_metrics, micro_batch_block=self.shapes.G if self.prompt_layout else 1)
    return self._train_steps[micro_batches]

  def _step_for(self, groups: int) -> Callable:
    """The train step compiled for a batch of `groups` groups (the whole batch's is compiled in setup; a smaller
    bucket's on its first use, its compile time excluded from compute like any compilation). It runs in
    trainer.micro_batches micro-batches unless XLA's temporaries for them, which grow with the model, the rows and
    the widths (rollout.max_prefill_len + max_new_tokens), exceed trainer.max_step_memory_mb: then in the fewest
    that fit (recompiled; math_hf.yaml's 32 x 8 rows of 1,536 tokens needed 39 GB in one on the tiny Qwen3)."""
    if groups not in self._step_fns:
      abstract = types.TrainBatch.abstract(groups * self.shapes.G, self.shapes.T, self.batch_sh, self.engine.routes_Xk)
      budget, m = self.cfg.trainer.max_step_memory_mb << 20, self.cfg.trainer.micro_batches
      compiled = self._train_step(m).lower(self.state, abstract).compile()
      fit = micro_batches_within(groups, m, self._step_memory(compiled), budget)
      if fit != m:
        log.info("train step of %d groups: %d MiB of temporaries in %d micro-batch(es) > trainer.max_step_memory_mb"
                 "=%d: %d micro-batches", groups, self._step_memory(compiled) >> 20, m, budget >> 20, fit)
        m, compiled = fit, self._train_step(fit).lower(self.state, abstract).compile()
      if budget and self._step_memory(compiled) > budget:
        log.warning("train step of %d groups: %d MiB of temporaries in %d micro-batches, above "
                    "trainer.max_step_memory_mb=%d", groups, self._step_memory(compiled) >> 20, m, budget >> 20)
      self._step_fns[groups], self.micro_batches[groups] = compiled, m
    return self._step_fns[groups]

  def _step_memory(self, compiled) -> int:
    """Bytes of XLA temporaries a compiled step needs per device; on CPU, whose devices share the host's memory,
    on all of this process's trainer devices."""
    mesh = self.trainer_layout.mesh
    return temp_bytes(compiled) * (len(mesh.local_devices) if mesh.devices.flat[0].platform == "cpu" else 1)

  # ---- set-up ------------------------------------------------------------------------------------------
  def setup(self) -> None:
    """Take the run directory (one live run per directory), then resume from its latest intact checkpoint or
    warm-start a fresh run; compile the step."""
    self._lock = RunLock(self.run_dir).acquire() if self.is_main else None
    try:
      self.ckpt.remove_orphans()  # temporary directories of a write a kill cut short (only we write here now)
      self._setup()
    except BaseException:
      if self._lock is not None:
        self._lock.release()
      raise

  def _setup(self) -> None:
    found = None
    if self.cfg.checkpoint.resume:  # a damaged latest checkpoint falls back to the previous one, with a warning
      found = self.ckpt.restore_latest_intact(restore_target(self.policy, self.optimizer, self.state_sh), self.cfg)
    latest = found[0] if found is not None else None
    if found is not None:
      _, self.state, meta = found
      data_states = meta.get("data_states") or [meta["data"]]  # "data": written before per-process states
      readers = len(self.topology.generators)
      if len(data_states) != readers:
        raise ResumeError(f"checkpoint {latest} holds the data state of {len(data_states)} prompt-reading processes; "
                          f"this run has {readers}: resume with as many processes (and mesh.generator_processes) "
                          "as wrote it")
      if self.topology.disaggregated:  # the generators read the prompts: their states go to them at start
        self.remote["data_states"] = data_states
        self.cursor.npr.load_state_dict(meta["npr"])
      else:
        self.cursor.restore(data_states[jax.process_index()], meta["npr"])
      states = meta.get("reward_states")  # one per scoring process (older checkpoints: process 0's only)
      if states and len(states) == self.topology.process_count and not self.topology.disaggregated:
        self.rewards.load_state(states[jax.process_index()])
      else:
        self.rewards.load_state(meta.get("rewards", self.rewards.state()))
      if self.topology.disaggregated:
        self.remote["reward_states"] = states[len(self.topology.trainers):] if states else None
      self.meter.load_state(meta["compute"])
      self.start_step = int(meta["step"])
      self.summary.update(meta.get("summary", {}))
      self._last_eval_step = meta.get("last_eval_step", -1)
      self.summary["resumed_from"] = self.start_step
    else:
      params = None
      if self.cfg.model.pretrained:
        from scalerl_jax.model.hf import load_pretrained
        m = self.cfg.model
        params = load_pretrained(m.pretrained, dtype=m.param_dtype, mesh=self.trainer_layout.mesh,
                                 rules=self.trainer_layout.rules, max_seq_len=m.max_seq_len).params
      elif self.cfg.warm_start.enabled and self.cfg.data.task != "file":
        stop = self._stop_now
        if len(self.topology.trainers) > 1:  # a vote is a collective that waits for the step: at validations only
          every, calls = self.cfg.warm_start.eval_every, itertools.count(1)
          stop = lambda: next(calls) % every == 0 and self._stop_now()  # noqa: E731
        params, info = warm_start(self.cfg, self.policy, self.trainer_layout, self.task, self.tokenizer,
                                  progress=self.progress and self.is_main, stop=stop)
        self.summary.update(info)
        if info.get("warm_start/stopped"):
          n = info["warm_start/steps"]
          raise Stopped(f"during the warm start ({n} supervised step{'s' * (n != 1)} taken, not cached: the next "
                        "start warms up afresh)")
      self.state = init_train_state(self.policy, self.optimizer, self.trainer_layout, self.cfg.seed, params)
      if self.is_main:
        (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))
    self.version = self.start_step
    # samples of batch b draw from keys derived from their admission number: continue the numbering on resume
    self.driver.first_uid = self.start_step * self._prompts_here
    if self._stop_now():  # a compilation cannot be interrupted: do not start one after a signal
      raise Stopped("before compiling the train step")
    self._step_for(self.buckets[-1])  # the whole batch's step compiles here, before the loop
    warm_prepare(self.shapes, self.cfg.loss)
    every = self.cfg.logging.every_process
    logger = MetricsLogger(self.run_dir, self.cfg.logging.tensorboard and self.is_main,
                           resume_step=self.start_step if latest is not None else None,
                           enabled=self.is_main or every, suffix="" if self.is_main else f".process{jax.process_index()}")
    bar = ProgressBar(self.progress and self.is_main, self.cfg.pipeline.steps, self.start_step,
                      f"RL ({self.cfg.pipeline.mode})")
    advise = (step_metrics.TargetAdvisor(self.cfg.curve_fit, self.run_dir)
              if self.cfg.curve_fit.target is not None and self.is_main else None)
    self.log = step_metrics.StepLog(logger, bar, self.meter, self.evaluate, advise)
    topo = self.topology
    self.sync = WeightSync(
        self.engine.param_shardings, self.state.params, self.version,
        trainer_mesh=self.trainer_layout.mesh if topo.process_count > 1 else None, channel=self.channel,
        send_to=topo.generators if topo.disaggregated and self.is_main else ())

  # ---- one step (trainer thread; `score` is also called by the generator thread) --------------------------
  def score(self, groups: Sequence[types.RolloutGroup]) -> list[types.ScoredGroup]:
    return self.rewards.score_groups(groups, self.tokenizer.decode)

  def consume(self, batch: types.ScoredBatch, wait_s: float = 0.0) -> bool:
    """Train step `batch.index` on a complete batch; publish weights; log; evaluate and checkpoint on schedule."""
    t0 = time.perf_counter()
    cfg, step = self.cfg, batch.index
    if self.topology.process_count > 1 and not self.topology.disaggregated:  # every process's groups, in order
      parts = distributed.allgather((batch.groups, self.rewards.metrics(), self.cursor.stream.metrics()))
      batch = types.ScoredBatch(step, tuple(g for groups, _, _ in parts for g in groups))
      self.remote.update(reward_metrics=[r for _, r, _ in parts],
                         data_metrics=step_metrics.merge_counters([d for _, _, d in parts]))
    packed = pack_groups(batch.groups, self.shapes.T, self.tokenizer.pad_id)
    self.admission.check(step, packed.versions_BT)
    train_batch, prepare_metrics = build_train_batch(packed, cfg.loss, self.prompt_layout)
    train_batch, groups = compact_groups(train_batch, self.shapes.G, self.buckets)
    trained_tokens = self.trained_tokens(groups * self.shapes.G)
    t_compile = time.perf_counter()
    step_fn = self._step_for(groups)  # a bucket's first use compiles: not the step's time
    t_train = time.perf_counter()
    compile_s = t_train - t_compile
    faults.point("train_step")
    self.state, device_metrics = step_fn(self.state, distributed.from_global(train_batch, self.batch_sh))
    jax.block_until_ready(self.state.params)  # dispatch is asynchronous: wait, so train time is the step's own
    train_s = time.perf_counter() - t_train
    self.version = step + 1
    skipped = int(device_metrics["skipped"])  # the step has finished (blocked on above): a cheap read
    self._skipped_in_a_row = self._skipped_in_a_row + 1 if skipped else 0
    # NPR hears of this step before the new version is published: a generator that may then draw batch
    # step + 1 + k (and filter a new epoch as of step + 1) must find this step's solves recorded
    pass_rates = [g.pass_rate for g in batch.groups]
    data_metrics = {**self.cursor.record(step, packed.prompt_ids, pass_rates), **self.remote.get("data_metrics", {})}
    if self.on_record is not None:  # disaggregated: the generators record the same, then take the new weights
      self.on_record(step, packed.prompt_ids, pass_rates, self.admission.publishes(self.version))
    if self.admission.publishes(self.version):
      faults.point("weight_sync")
      self.sync.publish(self.state.params, self.version)
    sync_s = self.sync.last_seconds if self.admission.publishes(self.version) else 0.0
    self._flush()  # the previous step's device metrics are ready by now: read them one step late
    host = step_metrics.host_metrics(batch, packed, prepare_metrics, data_metrics, sync_s, wait_s, self.version)
    if self.topology.process_count > 1:
      host["pipeline/weight_sync_bytes"] = self.sync.last_bytes if self.admission.publishes(self.version) else 0
      if cfg.logging.every_process:
        host["pipeline/weight_checksum"] = params_checksum(self.state.params)
    # totals: calls, errors, timeouts, killed workers, failure rate (of every process that scores)
    host.update(step_metrics.merge_counters(self.remote["reward_metrics"]) if "reward_metrics" in self.remote
                else self.rewards.metrics())
    host["train/groups"] = groups
    self.meter.count_tokens(host["rollout/tokens"], trained_tokens, self._flops_per_token)
    self.log.hold(types.StepRecord(step, device_metrics, host, trained_tokens / train_s,
                                   time.perf_counter() - t0 - compile_s + wait_s, wait_s), self._gen_stats)
    self.meter.train_busy_s += time.perf_counter() - t0 - compile_s
    self.log.logger.write_prompts(step, list(packed.prompt_ids))
    if self._evaluation_due(self.version):
      self._flush(evaluate=True)
    if self.version % cfg.checkpoint.every_steps == 0:
      self._flush()  # the metrics of every step a checkpoint covers are written before it
      self.checkpoint()
    faults.point("step_end")
    stop = self._stop_now()  # a signal that reached some processes stops them all at this step
    if self._skipped_in_a_row >= cfg.trainer.max_skipped_steps:
      self._flush()
      if self.ckpt.latest_step() != self.version:  # the params are those before the skipped steps: usable
        self.checkpoint()
      raise NonFiniteError(
          f"{self._skipped_in_a_row} steps in a row (up to step {step}) had a non-finite loss or gradient and were "
          f"skipped (trainer.max_skipped_steps={cfg.trainer.max_skipped_steps}); the run stopped with a checkpoint "
          f"of the last good params at step {self.version}. Lower optimizer.lr, check the rewards (metrics.jsonl "
          f"train/skipped), then resume")
    return not stop

  def _stop_now(self) -> bool:
    """Whether a signal asked the run to stop; with several trainer processes every one decides the same (a
    collective: call it at the same point on each)."""
    stop = self._interrupt.is_set()
    if len(self.topology.trainers) > 1:
      stop = any(distributed.allgather(stop, self.topology.trainers))
    return stop

  def _raise_if_stopped(self) -> None:
    """An evaluation's check between decode steps (one trainer process only)."""
    if self._interrupt.is_set():
      raise Stopped(f"during the evaluation at step {self.version}")

  def _interrupted(self) -> bool:
    """The loop's check before each step. Several trainer processes decide together, at the end of each step
    (`consume`), so that a signal reaching some of them stops all at the same step."""
    return self._interrupt.is_set() if len(self.topology.trainers) == 1 else False

  def _flush(self, evaluate: bool = False) -> None:
    self.log.flush(self._gen_stats, evaluate)

  def evaluate(self) -> dict:
    """Held-out mean@n at the eval temperature and greedy pass@1 of the published params (time excluded from
    compute)."""
    faults.point("evaluate")
    params, published = self.weights.latest()
    if published != self.version:  # PPO-off-policy-k publishes every k steps: score the trainer's own params
      params = self._rollout_copy(self.state.params)
    out = self.evaluator.evaluate(params, self.version)
    self._last_eval_step = self.version
    self.meter.exclude(out["eval/seconds"])
    return out

  def _reward_states(self) -> Optional[list]:
    """Every scoring process's reward totals (colocated: gathered; disaggregated: the trainers' own, then each
    generator's as sent with its latest batch); None in one process (`rewards` holds them)."""
    if self.topology.process_count == 1:
      return None
    if not self.topology.disaggregated:
      return distributed.gather_json(self.rewards.state())
    return (distributed.gather_json(self.rewards.state(), self.topology.trainers) +
            list(self.remote.get("reward_states") or [{} for _ in self.topology.generators]))

  def _rollout_copy(self, params: Any) -> Any:
    if self.topology.process_count == 1:
      return to_rollout_layout(params, self.engine.param_shardings)
    return place(local_replica(params, self.trainer_layout.mesh), self.engine.param_shardings)

  def checkpoint(self) -> None:
    """The TrainState of `self.version` plus everything a resume needs to continue the same data order."""
    t0, step = time.perf_counter(), self.version
    data_state, npr_state = self.cursor.state_before(step)
    data_states = (self.remote["data_states"] if self.topology.disaggregated  # as of batch `step`, from each
                   else distributed.gather_json(data_state))                 # generator with its batch step - 1
    meta = {"step": step, "version": step, "seed": self.cfg.seed, "data_states": data_states,
            "npr": npr_state, "compute": self.meter.state(), "rewards": self.rewards.state(),
            "reward_states": self._reward_states(),
            "last_eval_step": self._last_eval_step,
            "fingerprint": config_fingerprint(self.cfg),
            "summary": {k: v for k, v in self.summary.items() if isinstance(v, (int, float, str))}}
    faults.point("checkpoint_save")
    with self._interrupt.critical():  # a second Ctrl-C waits for the write to complete
      self.ckpt.save(step, self.state, meta)
    self.meter.exclude(time.perf_counter() - t0)

  # ---- loops -------------------------------------------------------------------------------------------
  def _begin(self) -> None:
    self.setup()
    self.rewards.start()  # the reward workers' start-up is a restart cost, not compute
    # R0, the curve's starting point; on resume, an evaluation a signal cut short at the checkpoint's step
    if self._evaluation_due(self.start_step) and self._last_eval_step != self.start_step:
      if self._stop_now():
        raise Stopped(f"before the step-{self.start_step} evaluation")
      self.log.logger.write(self.start_step, {**self.evaluate(), **self.meter.metrics()})
    self.meter.start()

  def _evaluation_due(self, version: int) -> bool:
    p = self.cfg.pipeline
    return version == p.steps or bool(p.eval_every and version % p.eval_every == 0)

  def _finish(self, stopped: Optional[Stopped] = None) -> dict:
    """The last step's metrics (with an evaluation unless a signal stopped the run), a checkpoint of the steps
    taken, the summary (naming the signal and where it stopped the run, if one did)."""
    if self.log is not None:  # (a signal during set-up stops the run before the metrics sinks exist)
      self._flush(evaluate=self._last_eval_step != self.version and not self._interrupt.is_set())
    if self.version > self.start_step and self.ckpt.latest_step() != self.version:
      self.checkpoint()
    if self.log is not None:
      self.log.close()
    self.summary.update({"steps": self.version, "run_dir": str(self.run_dir)})
    if self._interrupt.is_set():
      latest = self.ckpt.latest_step() if self.ckpt is not None else None
      where = f", {stopped}" if stopped is not None else ""
      self.summary["stopped"] = (
          f"stopped by {self._interrupt.name} after {self.version} steps{where}; the same command " +
          (f"resumes from the checkpoint of step {latest}" if latest else "starts the run again"))
    return self.summary

  def run(self) -> dict:
    """PipelineRL-k / PPO-off-policy-k with the generator on its own thread (disaggregated processes:
    pipeline/disaggregated.py)."""
    if self.topology.disaggregated:
      from scalerl_jax.pipeline import disaggregated
      return disaggregated.run_trainer(self) if self.topology.trains else disaggregated.run_generator(self)

    def loop():
      stop = threading.Event()
      self._generator = GeneratorThread(
          driver=self.driver, next_prompts=self.cursor.next_batch, score=self.score, weights=self.weights,
          policy=self.admission, samples=self.shapes.G, start=self.start_step, end=self.cfg.pipeline.steps,
          out=BatchBuffer(stop), stop=stop)
      self._gen_stats = self._generator.stats
      run_pipeline(generator=self._generator, consume=self.consume, start=self.start_step,
                   end=self.cfg.pipeline.steps, interrupted=self._interrupted)
    return self._run(loop)

  def run_sync(self) -> dict:
    """The synchronous reference loop (no threads): generate batch s with params v = s, train, repeat."""
    if self.topology.disaggregated:
      raise distributed.DistributedError("--reference-loop runs generation and training in turn on the same "
                                         "processes; with mesh.generator_processes use pipeline.mode=lockstep "
                                         "(k = 0) instead")
    return self._run(lambda: run_synchronous(
        driver=self.driver, next_prompts=self.cursor.next_batch, score=self.score, weights=self.weights,
        samples=self.shapes.G, start=self.start_step, end=self.cfg.pipeline.steps, consume=self.consume,
        interrupted=self._interrupted, stats=self._gen_stats))

  def _run(self, loop) -> dict:
    """Set up, run `loop`, finish. A user error (a reward batch that failed whole, NPR leaving no prompt,
    non-finite steps), raised here or in the generator thread, stops the run with a checkpoint of the work done."""
    with self._running():
      try:
        self._begin()
        self._loop(loop)
      except Stopped as exc:  # a signal ended a long phase (warm start, evaluation) or came before one
        if self.topology.disaggregated and jax.process_index() == self.topology.trainers[0]:
          distributed.request_stop()  # the generators may still wait for the first weights
        return self._finish(exc)
      return self._finish()

  def _loop(self, loop) -> None:
    try:
      with self.meter.count_compilation():
        loop()
    except PipelineError as exc:
      if isinstance(exc.__cause__, UserError) and self._stops_alone:
        self._stop_on(exc.__cause__)
      raise
    except UserError as exc:
      if not self._stops_alone:  # a failing shard may be on this process only: no collective checkpoint
        raise
      self._stop_on(exc)

  @property
  def _stops_alone(self) -> bool:
    """Whether a user error may stop the run with a checkpoint: in one process, or when every trainer raised it at
    the same step (non-finite steps: the loss is global). Otherwise another process's error or a shard's reward
    failure could leave the processes in different collectives, so the error ends every process instead, and the
    run resumes from its latest checkpoint."""
    return self.topology.process_count == 1

  @contextlib.contextmanager
  def _running(self):
    """Signal handlers on; the reward workers and the run-directory lock are given back however the run ends."""
    with self._interrupt.installed(), self.rewards:
      try:
        yield
      finally:
        if self._lock is not None:
          self._lock.release()

  def _stop_on(self, error: UserError) -> None:
    """A user error ended the loop (not a bug): keep the work done, with a checkpoint, then say what happened."""
    self._flush()
    if self.version > self.start_step and self.ckpt.latest_step() != self.version:
      self.checkpoint()
    self.log.close()
    done = f"stopped at step {self.version} with a checkpoint" if self.version else "stopped before the first step"
    if isinstance(error, PromptsExhausted):
      raise PromptsExhausted(f"{error}; {done}. Continue with data.npr.enabled=false or a higher "
                             "data.npr.threshold (NPR settings may change on resume)") from None
    error.args = (f"{error} ({done})",)
    raise error from None
