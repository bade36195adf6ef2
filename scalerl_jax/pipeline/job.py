"""The RL job: builds every part from a RunConfig and runs the ScaleRL loop (see orchestrator.py for the
pipeline and its ordering contract).

    RLJob(cfg).run()       PipelineRL-k / PPO-off-policy-k with a generator thread (the product)
    RLJob(cfg).run_sync()  the synchronous reference loop: generate a batch, train on it, repeat (no threads)
"""

from __future__ import annotations

import logging
import pathlib
import signal
import threading
import time
from typing import Any, Optional, Sequence

import jax
import numpy as np

from scalerl_jax import rl, types
from scalerl_jax.config import ConfigError, RunConfig, to_yaml
from scalerl_jax.data.evaluation import is_success
from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.pipeline import PromptPipeline, encode_records
from scalerl_jax.data.rewards import make_reward_runner
from scalerl_jax.data.tasks import make_task
from scalerl_jax.data.tokenizer import make_tokenizer
from scalerl_jax.mesh import ROLLOUT_AXES, TRAIN_RULES, batch_sharding, make_mesh, split_devices
from scalerl_jax.model import Policy, flops_per_token
from scalerl_jax.pipeline.batching import PromptLayout, build_train_batch, make_rl_loss, warm_prepare
from scalerl_jax.pipeline.evaluate import Evaluator
from scalerl_jax.pipeline.metrics import ComputeMeter, MetricsLogger
from scalerl_jax.pipeline.orchestrator import (AdmissionPolicy, BatchBuffer, GeneratorThread, PipelineError,
                                               ScoredBatch, WeightBox, run_pipeline)
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine
from scalerl_jax.train.checkpoint import RunCheckpointer, abstract_like, config_fingerprint
from scalerl_jax.train.state import TrainState, init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step
from scalerl_jax.train.warmstart import warm_start

log = logging.getLogger(__name__)


class RLJob:

  def __init__(self, cfg: RunConfig, progress: Optional[bool] = None):
    self.cfg = cfg
    self.progress = cfg.logging.progress if progress is None else progress
    self.run_dir = pathlib.Path(cfg.run_dir)
    self.run_dir.mkdir(parents=True, exist_ok=True)
    trainer_devices, gen_devices = split_devices(cfg.mesh.generator_devices)
    self.colocated = cfg.mesh.generator_devices == 0
    self.train_mesh = make_mesh(cfg.mesh.spec, trainer_devices)
    self.gen_mesh = make_mesh(cfg.mesh.generator_spec, gen_devices, ROLLOUT_AXES)
    self.policy = Policy(cfg.model)

    d, r = cfg.data, cfg.rollout
    self.tokenizer = make_tokenizer(d)
    if self.tokenizer.vocab_size > cfg.model.vocab_size:
      raise ConfigError(f"model.vocab_size: {cfg.model.vocab_size} is smaller than the tokenizer's "
                        f"{self.tokenizer.vocab_size} tokens")
    self.task = make_task(d)
    self.npr = NPRState(d.npr)
    self.data = PromptPipeline(self.task.train_records(), d, self.tokenizer, r.max_prefill_len,
                               process_index=jax.process_index(), process_count=jax.process_count(), npr=self.npr)
    self.data_lock = threading.Lock()  # data pipeline (generator thread) and NPR updates (trainer) share state
    self._data_states: dict[int, dict] = {}
    self.rewards = make_reward_runner(d, self.task.reward)
    it = r.interruption
    self.engine = Engine(self.policy, r, self.gen_mesh, stop_ids=[self.tokenizer.eos_id],
                         phrase_ids=self.tokenizer.encode(it.phrase), end_marker_ids=self.tokenizer.encode(it.end_marker))
    self.driver = RolloutDriver(self.engine, seed=cfg.seed)
    self.evaluator = Evaluator(self.driver, self.tokenizer, self.rewards, d.reward_scale, seed=cfg.seed + 1)
    self.eval_prompts, _ = encode_records(self.task.eval_records(), self.tokenizer, r.max_prefill_len, d.long_prompts)

    self.optimizer = make_optimizer(cfg.optimizer)
    self.state_sh = state_shardings(self.policy, self.optimizer, self.train_mesh, TRAIN_RULES)
    B = d.prompts_per_step * d.samples_per_prompt // jax.process_count()
    rows, cols = batch_sharding(self.train_mesh, TRAIN_RULES, 1, B), batch_sharding(self.train_mesh, TRAIN_RULES, 2, B)
    self.batch_sh = types.TrainBatch(tokens=cols, loss_mask=cols, gen_logprobs=cols, advantages=rows,
                                     token_weights=cols, sample_weights=rows, versions=cols, ref_logprobs=None,
                                     prompt_lengths=rows)
    G = d.samples_per_prompt
    self.layout = PromptLayout(G, r.max_prefill_len, r.max_new_tokens) if cfg.pipeline.shared_prompt else None
    self.train_step = make_train_step(make_rl_loss(self.policy, cfg.loss, r.temperature, self.layout),
                                      self.optimizer, cfg.pipeline.micro_batches, self.state_sh, self.batch_sh,
                                      metrics_init=rl.empty_metrics, metrics_combine=rl.accumulate_metrics,
                                      micro_batch_block=G if self.layout else 1)
    self._copy_to_generator = jax.jit(lambda p: jax.tree.map(lambda x: x.copy(), p),
                                      out_shardings=self.engine.param_shardings)
    self.admission = AdmissionPolicy.from_config(cfg.pipeline.mode, cfg.pipeline.max_lag)
    self.row_len = r.max_prefill_len + r.max_new_tokens
    self.ckpt = RunCheckpointer(self.run_dir / "checkpoints", cfg.checkpoint.keep)
    self.meter = ComputeMeter(len(gen_devices), len(trainer_devices), self.colocated)
    self.state: Optional[TrainState] = None
    self.start_step = 0
    self.weights: Optional[WeightBox] = None
    self.logger: Optional[MetricsLogger] = None
    self._pending: Optional[tuple] = None  # metrics of the last step, read one step late
    self._interrupt = threading.Event()
    self._last_eval_step = -1
    self._bar = None
    self._generator: Optional[GeneratorThread] = None
    self.summary: dict[str, Any] = {}

  @property
  def interrupted(self) -> bool:
    return self._interrupt.is_set()

  # ---- set-up ------------------------------------------------------------------------------------------
  def to_generator(self, params: Any) -> Any:
    """Copy params into the rollout layout (a fresh buffer: the train state is donated to the next step)."""
    if self.colocated:
      return self._copy_to_generator(params)
    return jax.device_put(params, self.engine.param_shardings)

  def _warm_started_state(self) -> tuple[TrainState, dict]:
    if not self.cfg.warm_start.enabled or self.cfg.data.task == "file":
      return init_train_state(self.policy, self.optimizer, self.train_mesh, TRAIN_RULES, self.cfg.seed), {}
    params, info = warm_start(self.cfg, self.policy, self.train_mesh, TRAIN_RULES, self.task, self.tokenizer,
                              progress=self.progress)
    return init_train_state(self.policy, self.optimizer, self.train_mesh, TRAIN_RULES, self.cfg.seed, params), info

  def setup(self) -> None:
    """Resume from the run directory's latest checkpoint, or warm-start a fresh run."""
    latest = self.ckpt.latest_step() if self.cfg.checkpoint.resume else None
    if latest is not None:
      abstract = jax.eval_shape(lambda: TrainState(self.policy.param_shapes, self.optimizer.init(
          self.policy.param_shapes), np.int32(0)))
      self.state, meta = self.ckpt.restore(abstract_like(abstract, self.state_sh), self.cfg, latest)
      self.npr.load_state_dict(meta["npr"])
      self.data.set_state(meta["data"])
      self.meter = ComputeMeter(self.meter.gen_devices, self.meter.train_devices, self.colocated, meta["compute"])
      self.start_step = int(meta["step"])
      self.summary.update(meta.get("summary", {}))
      self._last_eval_step = meta.get("last_eval_step", -1)
      info = {"resumed_from": self.start_step}
    else:
      self.state, info = self._warm_started_state()
      (self.run_dir / "config.yaml").write_text(to_yaml(self.cfg))
    self.summary.update(info)
    # samples of batch b draw from keys derived from their admission number: continue the numbering on resume
    self.driver.first_uid = self.start_step * self.cfg.data.prompts_per_step
    self._compile_train_step()
    self.logger = MetricsLogger(self.run_dir, self.cfg.logging.tensorboard,
                                resume_step=self.start_step if latest is not None else None)
    self.weights = WeightBox(self.to_generator(self.state.params), self.start_step)

  def _compile_train_step(self) -> None:
    """Compile the train step ahead of the loop, so the first step does not stall the pipeline."""
    B = self.cfg.data.prompts_per_step * self.cfg.data.samples_per_prompt // jax.process_count()
    shapes = types.TrainBatch(
        tokens=((B, self.row_len), np.int32), loss_mask=((B, self.row_len), np.float32),
        gen_logprobs=((B, self.row_len), np.float32), advantages=((B,), np.float32),
        token_weights=((B, self.row_len), np.float32), sample_weights=((B,), np.float32),
        versions=((B, self.row_len), np.int32), ref_logprobs=None, prompt_lengths=((B,), np.int32))
    is_spec = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)
    abstract = jax.tree.map(lambda spec, sh: jax.ShapeDtypeStruct(spec[0], spec[1], sharding=sh), shapes,
                            self.batch_sh, is_leaf=is_spec)
    self._step_fn = self.train_step.lower(self.state, abstract).compile()
    P, G = self.cfg.data.prompts_per_step // jax.process_count(), self.cfg.data.samples_per_prompt
    warm_prepare(P, G, self.row_len, self.cfg.loss)

  def trained_tokens(self, rows: int) -> int:
    """Token positions the train step runs through the model for `rows` rows (each prompt once per group with
    the shared-prompt loss)."""
    if self.layout is None:
      return rows * self.row_len
    return rows // self.layout.group_size * self.layout.prompt_width + rows * self.layout.completion_width

  # ---- one step ----------------------------------------------------------------------------------------
  def next_prompts(self, batch_index: int) -> list[types.Prompt]:
    with self.data_lock:
      self._data_states[batch_index] = self.data.get_state()
      return self.data.next_batch()

  def score(self, rollout_groups: Sequence) -> list[types.Group]:
    """Rewards for every sample of these groups in one reward batch (one worker hand-off, not one per group)."""
    texts = [self.tokenizer.decode(s.tokens) for g in rollout_groups for s in g.samples]
    answers = [g.prompt.answer for g in rollout_groups for _ in g.samples]
    rewards, failed = self.rewards.score_each(texts, answers)
    out, start = [], 0
    for g in rollout_groups:
      end = start + len(g.samples)
      out.append(types.Group(g.prompt, g.samples, rewards[start:end], int(failed[start:end].sum())))
      start = end
    return out

  def consume(self, batch: ScoredBatch, wait_s: float = 0.0) -> bool:
    """Train step `batch.index` on a complete batch; publish weights; log; evaluate and checkpoint on schedule."""
    t0 = time.perf_counter()
    cfg, step = self.cfg, batch.index
    versions = np.concatenate([s.versions[s.versions >= 0] for g in batch.groups for s in g.samples])
    if versions.size and versions.min() < self.admission.oldest_allowed(step):
      raise PipelineError(f"step {step}: batch holds tokens of version {versions.min()}, older than the bound "
                          f"{self.admission.oldest_allowed(step)} (mode {cfg.pipeline.mode}, k={self.admission.k})")
    train_batch, host_metrics = build_train_batch(batch.groups, cfg.loss, self.row_len, self.tokenizer.pad_id,
                                                  cfg.data.reward_scale, self.layout)
    t_train = time.perf_counter()
    self.state, device_metrics = self._step_fn(self.state, jax.device_put(train_batch, self.batch_sh))
    jax.block_until_ready(self.state.params)  # dispatch is asynchronous: wait, so train time is the step's own
    train_s = time.perf_counter() - t_train
    version = step + 1
    t_sync = time.perf_counter()
    if self.admission.publishes(version):
      self.weights.publish(jax.block_until_ready(self.to_generator(self.state.params)), version)
    sync_s = time.perf_counter() - t_sync
    with self.data_lock:
      pass_rates = [float(np.mean(is_success(g.rewards, cfg.data.reward_scale))) for g in batch.groups]
      self.npr.update([g.prompt.prompt_id for g in batch.groups], pass_rates)
      data_metrics = self.data.metrics()
    self._flush_pending()  # the previous step's device metrics are ready by now: read them one step late
    samples = [s for g in batch.groups for s in g.samples]
    gen_tokens = sum(len(s.tokens) for s in samples)
    lag = step - versions if versions.size else np.zeros(1)
    self.meter.gen_flops += gen_tokens * flops_per_token(cfg.model, self.row_len // 2)
    train_tokens = self.trained_tokens(train_batch.tokens.shape[0])
    self.meter.train_flops += train_tokens * flops_per_token(cfg.model, self.row_len // 2, backward=True)
    host = {
        **{f"train/{k}": v for k, v in host_metrics.items()},
        **{f"data/{k}": v for k, v in data_metrics.items()}, "data/npr_removed": self.npr.num_removed,
        "rollout/truncation_rate": float(np.mean([s.truncated for s in samples])),
        "rollout/interruption_rate": float(np.mean([s.interrupted for s in samples])),
        "rollout/tokens": gen_tokens, "rollout/reward_failures": sum(g.reward_failures for g in batch.groups),
        "pipeline/lag_min": float(lag.min()), "pipeline/lag_mean": float(lag.mean()), "pipeline/lag_max": float(lag.max()),
        "pipeline/weight_sync_s": sync_s, "pipeline/trainer_wait_s": wait_s, "pipeline/version": version,
    }
    self._pending = (step, device_metrics, host, train_tokens / train_s, time.perf_counter() - t0 + wait_s, wait_s)
    self.meter.train_busy_s += time.perf_counter() - t0
    self.logger.write_prompts(step, [g.prompt.prompt_id for g in batch.groups])
    if cfg.pipeline.eval_every and version % cfg.pipeline.eval_every == 0:
      self._flush_pending(evaluate=True)
    if version % cfg.checkpoint.every_steps == 0:
      self._flush_pending()  # the metrics of every step a checkpoint covers are written before it
      self.checkpoint(version)
    return not self._interrupt.is_set()

  def _flush_pending(self, evaluate: bool = False) -> None:
    if self._pending is None:
      return
    step, device_metrics, host, train_tokens_per_s, step_s, wait_s = self._pending
    self._pending = None
    self.meter.tick()
    gen = self._generator.stats if self._generator is not None else None
    out = {**host, **{f"train/{k}": v for k, v in rl.finalize_metrics(
        {k: v for k, v in jax.device_get(device_metrics).items() if k in rl.METRIC_KEYS}).items()}}
    for k in ("grad_norm", "update_norm"):
      out[f"train/{k}"] = float(device_metrics[k])
    out["pipeline/trainer_wait_frac"] = wait_s / max(step_s, 1e-9)
    out["train/tokens_per_s"] = train_tokens_per_s
    out["rollout/tokens_per_s"] = host["rollout/tokens"] / max(step_s, 1e-9)
    if gen is not None:
      self.meter.gen_busy_s = gen.busy_s
      out["pipeline/generator_idle_frac"] = gen.idle_s / max(gen.idle_s + gen.busy_s, 1e-9)
      out["pipeline/in_flight_weight_updates"] = gen.in_flight_updates
    if evaluate:
      out.update(self.evaluate(step + 1))
    out.update(self.meter.metrics())
    self.logger.write(step + 1, out)
    if self._bar is not None:
      self._bar.update(1)
      post = {"reward": f"{out.get('train/reward_mean', 0):.3f}"}
      if "eval/pass_rate" in out:
        post["held_out"] = f"{out['eval/pass_rate']:.3f}"
      self._bar.set_postfix(post)

  def evaluate(self, version: int) -> dict:
    """Held-out mean@n at the eval temperature and greedy pass@1 (time excluded from compute)."""
    t0 = time.perf_counter()
    params, _ = self.weights.latest()
    p = self.cfg.pipeline
    out = self.evaluator.evaluate(params, version, self.eval_prompts, p.eval_samples, p.eval_temperature)
    self._last_eval_step = version
    dt = time.perf_counter() - t0
    self.meter.exclude(dt)
    out["eval/seconds"] = dt
    return out

  def checkpoint(self, step: int) -> None:
    t0 = time.perf_counter()
    with self.data_lock:
      data_state = self._data_states.get(step) or self.data.get_state()
      meta = {"step": step, "version": step, "seed": self.cfg.seed, "data": data_state,
              "npr": self.npr.state_dict(), "compute": self.meter.state(), "last_eval_step": self._last_eval_step,
              "fingerprint": config_fingerprint(self.cfg), "summary": {k: v for k, v in self.summary.items()
                                                                        if isinstance(v, (int, float, str))}}
      for b in [b for b in self._data_states if b < step]:
        del self._data_states[b]
    self.ckpt.save(step, self.state, meta)
    self.meter.exclude(time.perf_counter() - t0)

  # ---- loops -------------------------------------------------------------------------------------------
  def _begin(self) -> None:
    self.setup()
    self._bar = None
    if self.progress:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=self.cfg.pipeline.steps, initial=self.start_step, desc=f"RL ({self.cfg.pipeline.mode})",
                       unit="step")
    if self.start_step == 0 and self.cfg.pipeline.eval_every:
      self.logger.write(0, {**self.evaluate(0), **self.meter.metrics()})  # R0: the curve's starting point
    self.meter.start()

  def _finish(self, steps_done: int) -> dict:
    self._flush_pending(evaluate=self._last_eval_step != self.start_step + steps_done)
    end = self.start_step + steps_done
    if steps_done and self.ckpt.latest_step() != end:
      self.checkpoint(end)
    if self._bar is not None:
      self._bar.close()
    self.logger.close()
    self.summary.update({"steps": end, "run_dir": str(self.run_dir)})
    return self.summary

  def run(self) -> dict:
    """PipelineRL-k / PPO-off-policy-k with the generator on its own thread."""
    self._begin()
    stop = threading.Event()
    self._generator = GeneratorThread(
        driver=self.driver, next_prompts=self.next_prompts, score=self.score, weights=self.weights,
        policy=self.admission, samples=self.cfg.data.samples_per_prompt, start=self.start_step,
        end=self.cfg.pipeline.steps, out=BatchBuffer(stop), stop=stop)
    waits = {"t": time.perf_counter()}

    def consume(batch: ScoredBatch) -> bool:
      wait = time.perf_counter() - waits["t"]
      ok = self.consume(batch, wait_s=wait)
      waits["t"] = time.perf_counter()
      return ok

    previous = _install_sigint(self._interrupt)
    try:
      done = run_pipeline(generator=self._generator, consume=consume, start=self.start_step, end=self.cfg.pipeline.steps,
                          interrupted=self._interrupt.is_set)
    finally:
      if previous is not None:
        signal.signal(signal.SIGINT, previous)
    return self._finish(done)

  def run_sync(self) -> dict:
    """The synchronous reference loop (no threads): generate batch s with params v = s, train, repeat."""
    self._begin()
    self._generator = None
    done = 0
    for step in range(self.start_step, self.cfg.pipeline.steps):
      params, version = self.weights.latest()
      uids = {}
      for pos, prompt in enumerate(self.next_prompts(step)):
        uids[self.driver.submit(prompt, self.cfg.data.samples_per_prompt)] = pos
      groups: list = [None] * len(uids)
      while self.driver.busy or self.driver.queued_prompts:
        finished = self.driver.step(params, version)
        for rg, group in zip(finished, self.score(finished)):
          groups[uids[rg.uid]] = group
      done += 1
      if not self.consume(ScoredBatch(step, groups)):
        break
    return self._finish(done)


def _install_sigint(flag: threading.Event):
  """First Ctrl-C: checkpoint at the next step boundary and stop; a second one interrupts at once."""
  if threading.current_thread() is not threading.main_thread():
    return None

  def handler(signum, frame):
    if flag.is_set():
      raise KeyboardInterrupt
    flag.set()
    log.warning("interrupt: checkpointing at the next step boundary (Ctrl-C again to abort)")

  return signal.signal(signal.SIGINT, handler)
