"""The trainer's half of a step: a complete scored batch in, one optimizer step out.

    ScoredBatch ──pack──► PackedRows ──admission check──► ──rl.prepare──► TrainBatch ──compact to a bucket──►
    [frozen reference / teacher log-probs: one forward each, train/reference.py, when loss.kl_coef or
    loss.distill_teacher is on] ──► the step compiled for that many groups (micro-batched to fit
    trainer.max_step_memory_mb) ──► new TrainState

`Trainer.train_on` does only that (and counts non-finite steps, whose update the jitted step does not apply); the
job logs, evaluates, checkpoints and talks to other processes. It runs on the trainer thread only.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

import jax

from scalerl_jax import distributed, faults, rl, types
from scalerl_jax.pipeline.batching import build_train_batch, compact_groups, pack_groups
from scalerl_jax.train import reference
from scalerl_jax.train.rl_loss import make_rl_loss
from scalerl_jax.train.step import NonFiniteError, make_train_step, micro_batches_within, temp_bytes

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Trained:
  """What `train_on` leaves for the logs: the step's device metrics (read one step late) and its host numbers."""
  step: int
  device_metrics: Any  # dict of device scalars of the jitted step
  packed: types.PackedRows
  prepare_metrics: dict  # rl.prepare's host metrics (train/...)
  groups: int  # the bucket the batch was compacted to
  trained_tokens: int  # token positions the step ran through the model
  train_s: float  # the step's own seconds (its compilation excluded)
  compile_s: float  # seconds spent compiling a bucket's first step
  frozen_flops: float = 0.0  # analytic FLOPs of the step's frozen forwards (reference, teacher): forward only


class Trainer:
  """Owns the TrainState and the compiled steps of a run (`parts`: run/build.py's Parts)."""

  def __init__(self, parts):
    self.parts, self.cfg, self.shapes = parts, parts.cfg, parts.shapes
    self.state = None  # the TrainState, set by the job (run/build.py initial_state)
    self.version = 0  # the policy version the state holds: the optimizer steps taken (= state.step)
    self.skipped_in_a_row = 0  # steps whose update was not applied (non-finite loss or gradient)
    self.micro_batches: dict[int, int] = {}  # the micro-batch count per group count (trainer.max_step_memory_mb)
    self._train_steps: dict[int, Callable] = {}  # the jitted train step per micro-batch count
    self._step_fns: dict[int, Callable] = {}  # the compiled train step per group count
    self.frozen: list = []  # the loss's frozen policies (train/reference.py Frozen), set by the job
    self._frozen_fns: dict[int, Callable] = {}  # their log-prob forward per micro-batch count

  def trained_tokens(self, rows: int) -> int:
    """Token positions a step of `rows` rows runs through the model (each prompt once per group with the
    shared-prompt loss)."""
    layout = self.parts.prompt_layout
    return layout.trained_tokens(rows) if layout else rows * self.shapes.T

  def _train_step(self, micro_batches: int) -> Callable:
    """The jitted train step over `micro_batches` micro-batches of whole groups."""
    if micro_batches not in self._train_steps:
      p, r = self.parts, self.cfg.rollout
      loss_fn = make_rl_loss(p.policy, self.cfg.loss, r.temperature, p.prompt_layout,
                             replay=self.cfg.trainer.routing_replay,
                             micro_batches=micro_batches)
      self._train_steps[micro_batches] = make_train_step(
          loss_fn, p.optimizer, micro_batches, p.state_sh, p.batch_sh, metrics_init=rl.empty_metrics,
          metrics_combine=rl.accumulate_metrics, micro_batch_block=self.shapes.G if p.prompt_layout else 1,
          policy=p.policy)
    return self._train_steps[micro_batches]

  def step_for(self, groups: int) -> Callable:
    """The train step compiled for a batch of `groups` groups (the whole batch's is compiled in set-up; a smaller
    bucket's on its first use, its compile time excluded from compute like any compilation). It runs in
    trainer.micro_batches micro-batches unless XLA's temporaries for them, which grow with the model, the rows and
    the widths (rollout.max_prefill_len + max_new_tokens), exceed trainer.max_step_memory_mb: then in the fewest
    that fit (recompiled; math_hf.yaml's 32 x 8 rows of 1,536 tokens needed 39 GB in one on the tiny Qwen3)."""
    if groups not in self._step_fns:
      p = self.parts
      abstract = types.TrainBatch.abstract(groups * self.shapes.G, self.shapes.T, p.batch_sh, p.engine.routes_Xk)
      abstract = reference.with_frozen_fields(abstract, self.frozen)
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
    mesh = self.parts.trainer_layout.mesh
    return temp_bytes(compiled) * (len(mesh.local_devices) if mesh.devices.flat[0].platform == "cpu" else 1)

  def train_on(self, batch: types.ScoredBatch) -> Trained:
    """Optimizer step `batch.index` on the whole step batch (every process's groups): version index -> index + 1.
    Raises PipelineError if a token is staler than the admission rule allows."""
    p, step = self.parts, batch.index
    packed = pack_groups(batch.groups, self.shapes.T, p.tokenizer.pad_id)
    p.admission.check(step, packed.versions_BT)
    train_batch, prepare_metrics = build_train_batch(packed, self.cfg.loss, p.prompt_layout)
    train_batch, groups = compact_groups(train_batch, self.shapes.G, p.buckets)
    t_compile = time.perf_counter()
    step_fn = self.step_for(groups)  # a bucket's first use compiles: not the step's time
    t_train = time.perf_counter()
    faults.point("train_step")
    device_batch = distributed.from_global(train_batch, p.batch_sh)
    if self.frozen:
      device_batch = self._frozen_fn(self.micro_batches[groups])(device_batch)
    self.state, device_metrics = step_fn(self.state, device_batch)
    jax.block_until_ready(self.state.params)  # dispatch is asynchronous: wait, so train time is the step's own
    train_s = time.perf_counter() - t_train
    self.version = step + 1
    skipped = int(device_metrics["skipped"])  # the step has finished (blocked on above): a cheap read
    self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
    frozen_flops = reference.frozen_flops(self.frozen, groups * self.shapes.G * self.shapes.T, self.shapes.T // 2)
    return Trained(step, device_metrics, packed, prepare_metrics, groups, self.trained_tokens(groups * self.shapes.G),
                   train_s, t_train - t_compile, frozen_flops)

  def _frozen_fn(self, micro_batches: int) -> Callable:
    """`fill(batch) -> batch` with the frozen policies' log-probs, split like the step's `micro_batches`."""
    if micro_batches not in self._frozen_fns:
      p = self.parts
      self._frozen_fns[micro_batches] = reference.make_reference_fn(
          self.frozen, self.cfg.rollout.temperature, micro_batches, self.shapes.G if p.prompt_layout else 1,
          p.batch_sh)
    return self._frozen_fns[micro_batches]

  def skip_error(self, step: int) -> NonFiniteError | None:
    """The error that ends the run once trainer.max_skipped_steps steps in a row were skipped (after step `step`),
    or None. The params are those before the skipped steps: the job checkpoints them first."""
    limit = self.cfg.trainer.max_skipped_steps
    if self.skipped_in_a_row < limit:
      return None
    return NonFiniteError(
        f"{self.skipped_in_a_row} steps in a row (up to step {step}) had a non-finite loss or gradient and were "
        f"skipped (trainer.max_skipped_steps={limit}); the run stopped with a checkpoint of the last good params at "
        f"step {self.version}. Lower optimizer.lr, check the rewards (metrics.jsonl train/skipped), then resume")
