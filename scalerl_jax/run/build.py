"""Every part of a run, built once from its RunConfig: the one place that knows how they fit together.

    resolve_config(cfg)           absolute paths; a pretrained checkpoint's architecture read from its config.json
    build(cfg)            -> Parts   layouts, policy, tokenizer, task, prompt cursor, rewards, engine, drivers,
                                     evaluator, optimizer, shardings, buckets, admission, checkpointer, compute meter,
                                     and the Exchange of this process's topology (run/exchange.py)
    initial_state(parts, ...)     the TrainState to start from and, on a resume, the checkpoint's RunMeta: resume
                                  from the latest intact checkpoint, else load the pretrained params, else warm-start
                                  (or initialise) a fresh policy

The parts the trainer thread and the generator thread (`RLJob.run`) both touch, and why that is safe:
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
Everything else belongs to the trainer thread.

Benchmarks and tests build parts here (or through run/job.py's RLJob) rather than reaching into a job.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
from typing import Any, Callable, Optional

import jax

from scalerl_jax import distributed, types
from scalerl_jax.config import ConfigError, RunConfig, absolute_paths, to_yaml, validate, validate_with_tokenizer
from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.prompt_stream import encode_records, make_prompt_stream
from scalerl_jax.data.tasks import make_task
from scalerl_jax.data.tokenizer import make_tokenizer
from scalerl_jax.mesh import ROLLOUT_AXES, ROLLOUT_RULES, TRAIN_RULES, Layout, make_mesh
from scalerl_jax.model import flops_per_token, lora, make_policy
from scalerl_jax.pipeline.batching import group_buckets
from scalerl_jax.pipeline.compute import ComputeMeter
from scalerl_jax.pipeline.data_cursor import DataCursor
from scalerl_jax.pipeline.held_out import Evaluator
from scalerl_jax.pipeline.interrupts import Stopped
from scalerl_jax.pipeline.orchestrator import AdmissionPolicy
from scalerl_jax.pipeline.sinks import MetricsLogger, ProgressBar
from scalerl_jax.pipeline.step_metrics import StepLog, TargetAdvisor
from scalerl_jax.rewards import make_reward_runner
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine
from scalerl_jax.run import exchange as exchange_lib
from scalerl_jax.train.checkpoint import ResumeError, RunCheckpointer, params_checksum
from scalerl_jax.train.rl_loss import PromptLayout
from scalerl_jax.train.state import TrainState, init_train_state, make_optimizer, restore_target, state_shardings
from scalerl_jax.train.warmstart import warm_start


@dataclasses.dataclass
class Parts:
  """The built parts of a run (see the module docstring); shared by the trainer thread and the generator."""
  cfg: RunConfig
  run_dir: pathlib.Path
  exchange: exchange_lib.Local  # this process's topology: Local, Colocated, Disaggregated or GeneratorEnd
  trainer_layout: Layout
  generator_layout: Layout
  shapes: types.StepShapes  # the whole step batch: every trainer process holds it
  policy: Any
  tokenizer: Any
  task: Any
  cursor: DataCursor
  rewards: Any  # RewardRunner
  engine: Engine
  driver: RolloutDriver  # the generator's (evaluation has its own on the same engine)
  prompts_here: int  # prompts per step this process draws
  evaluator: Evaluator
  optimizer: Any
  state_sh: Any  # TrainState of shardings
  batch_sh: types.TrainBatch  # TrainBatch of shardings
  prompt_layout: Optional[PromptLayout]  # the shared-prompt loss's layout (trainer.shared_prompt)
  buckets: tuple[int, ...]  # the group counts a step batch may be compacted to
  admission: AdmissionPolicy
  ckpt: Optional[RunCheckpointer]  # None on a generator process
  meter: ComputeMeter

  def flops_per_token(self, backward: bool) -> float:
    """Analytic FLOPs per token (active params, adapters included) at the mean context, forward or forward +
    backward."""
    return flops_per_token(self.cfg.model, self.shapes.T // 2, backward=backward, lora=self.cfg.lora)


def resolve_config(cfg: RunConfig) -> RunConfig:
  """Paths made absolute (config.yaml and the checkpoints' fingerprints name the files from any directory); with
  model.pretrained, the architecture is the checkpoint's (the dtypes stay the user's: params and optimizer state in
  param_dtype, compute in dtype)."""
  cfg = absolute_paths(cfg)
  if not cfg.model.pretrained:
    return cfg
  from scalerl_jax.model.hf import hf_model_config, pretrained_dir
  m = cfg.model
  arch = hf_model_config(pretrained_dir(m.pretrained), dtype=m.dtype, param_dtype=m.param_dtype,
                         max_seq_len=m.max_seq_len)
  return validate(dataclasses.replace(cfg, model=dataclasses.replace(
      arch, pretrained=m.pretrained, fp32_lm_head=m.fp32_lm_head)))


def make_exchange(topo: distributed.Topology, trainer_mesh, transfer_host: Optional[str] = None) -> exchange_lib.Local:
  if topo.process_count == 1:
    return exchange_lib.Local(topo, trainer_mesh)
  if not topo.disaggregated:
    return exchange_lib.Colocated(topo, trainer_mesh)
  kind = exchange_lib.Disaggregated if topo.trains else exchange_lib.GeneratorEnd
  # messages between the trainers and the generators go through a transfer server on `transfer_host`
  return kind(topo, trainer_mesh, distributed.Channel(transfer_host or distributed.default_transfer_host()))


def build(cfg: RunConfig, between: Optional[Callable[[], None]] = None, transfer_host: Optional[str] = None) -> Parts:
  """Every part of a run of (resolved) `cfg` on this process. `between`: what an evaluation calls between decode
  steps to stop at a signal (used with one trainer process only: with several, each one's share ends at a
  different step, so they stop at the step's end). `transfer_host`: the address other processes reach this one's
  transfer server at (disaggregated runs; --transfer-host)."""
  d, r, p = cfg.data, cfg.rollout, cfg.pipeline
  run_dir = pathlib.Path(cfg.run_dir)
  try:
    run_dir.mkdir(parents=True, exist_ok=True)
  except OSError as exc:
    raise ConfigError(f"run_dir: cannot create {run_dir} ({exc.strerror or exc})") from None
  # processes: who trains, who generates (one process: both); every process must run the same config and code
  topo = distributed.Topology.current(cfg.mesh.generator_processes)
  if topo.process_count > 1:
    distributed.check_same_everywhere({"config": to_yaml(cfg), "code": distributed.code_version()})
  trainer_devices, gen_devices = distributed.split_for(topo, cfg.mesh.generator_devices)
  trainer_layout = Layout(make_mesh(cfg.mesh.spec, trainer_devices), TRAIN_RULES)
  generator_layout = Layout(make_mesh(cfg.mesh.generator_spec, gen_devices, ROLLOUT_AXES), ROLLOUT_RULES)
  exchange = make_exchange(topo, trainer_layout.mesh, transfer_host)
  s = types.StepShapes.from_config(cfg)
  # this process's shard of the prompt stream (a disaggregated trainer draws none; its cursor keeps NPR only)
  shard = (topo.generators.index(topo.process_index), len(topo.generators)) if topo.generates else (0, 1)
  policy = make_policy(cfg.model, cfg.lora)  # with lora.rank > 0: adapters beside the weights, which stay frozen
  tokenizer = make_tokenizer(d, vocab_size=cfg.model.vocab_size)
  validate_with_tokenizer(cfg, tokenizer)
  task = make_task(d)
  npr = NPRState(d.npr)
  admission = AdmissionPolicy.from_config(p.mode, p.max_lag)
  cursor = DataCursor(make_prompt_stream(task, d, tokenizer, s.L, npr=npr, process_index=shard[0],
                                         process_count=shard[1]), npr, max_lag=admission.k)
  rewards = make_reward_runner(cfg.reward, task.verifiers, sandbox=cfg.sandbox)
  it = r.interruption
  engine = Engine(policy, r, generator_layout.mesh, rules=generator_layout.rules, stop_ids=list(tokenizer.eos_ids),
                  phrase_ids=tokenizer.encode(it.phrase), end_marker_ids=tokenizer.encode(it.end_marker))
  # a sample's random stream is keyed by its prompt's position in the whole stream (uid), whichever process
  # generates it: a run gives the same rollouts on any number of processes
  driver = RolloutDriver(engine, seed=cfg.seed, uid_stride=shard[1], uid_offset=shard[0])
  evaluator = Evaluator(RolloutDriver(engine, seed=cfg.seed), tokenizer, rewards,
                        encode_records(task.eval_records(), tokenizer, s.L, d.long_prompts)[0],
                        p.eval_samples, p.eval_temperature, seed=cfg.seed + 1,
                        shard=(topo.trainers.index(topo.process_index), len(topo.trainers)) if topo.trains else (0, 1),
                        gather=exchange.eval_gather, between=None if exchange.votes else between)
  optimizer = make_optimizer(cfg.optimizer)
  state_sh = state_shardings(policy, optimizer, trainer_layout)
  batch_sh = types.TrainBatch.of(rows=trainer_layout.batch(1, s.global_B), tokens=trainer_layout.batch(2, s.global_B),
                                 routes=trainer_layout.batch(4, s.global_B) if engine.routes_Xk else None)
  # the group counts a step batch may be cut to (trainer.batch_buckets): whole micro-batches of whole groups,
  # rows a multiple of the batch's shards; an MoE policy always trains on the whole batch
  shards = s.global_B // batch_sh.tokens.shard_shape((s.global_B, s.T))[0]
  unit = math.lcm(cfg.trainer.micro_batches, shards // math.gcd(shards, s.G))
  buckets = (group_buckets(s.global_B // s.G, cfg.trainer.batch_buckets, unit)
             if not cfg.model.moe_layers else (s.global_B // s.G,))
  ckpt = (RunCheckpointer(run_dir / "checkpoints", cfg.checkpoint.keep, topo.trainers if topo.disaggregated else None)
          if topo.trains else None)
  meter = ComputeMeter(len(gen_devices) * len(topo.generators), len(trainer_devices),
                       cfg.mesh.generator_devices == 0 and not topo.disaggregated)
  return Parts(cfg, run_dir, exchange, trainer_layout, generator_layout, s, policy, tokenizer, task, cursor, rewards,
               engine, driver, d.prompts_per_step // shard[1], evaluator, optimizer, state_sh, batch_sh,
               PromptLayout(s.G, s.L, s.N) if cfg.trainer.shared_prompt else None, buckets, admission, ckpt, meter)


def initial_state(parts: Parts, stop: Callable[[], bool], progress: bool, summary: dict
                  ) -> tuple[TrainState, Optional[types.RunMeta]]:
  """(the TrainState to start from, the checkpoint's RunMeta on a resume or None); the warm start's numbers go to
  `summary`. A damaged latest checkpoint falls back to the previous one, with a warning. `stop`: whether a signal
  asks the run to stop (a vote among the trainer processes: the warm start asks at its validations only). Raises
  Stopped if a signal cut the warm start short. With adapters, a checkpoint holds them alone (`checkpointed`): a
  resume rebuilds the frozen base as a fresh run does and refuses one whose checksum differs from the record."""
  cfg, layout, policy = parts.cfg, parts.trainer_layout, parts.policy
  if cfg.checkpoint.resume:
    target = restore_target(policy, parts.optimizer, parts.state_sh)
    found = parts.ckpt.restore_latest_intact(checkpointed(policy, target), cfg)
    if found is not None:
      state, meta = found[1], types.RunMeta.from_json(found[2])
      if policy.lora is not None:
        base = base_params(parts, stop, progress, {})
        check_base(meta.base, base_record(cfg, base), parts.ckpt.directory / str(found[0]))
        state = dataclasses.replace(state, params=lora.attach(base, state.params))
      return state, meta
  params = start_params(parts, stop, progress, summary)
  return init_train_state(policy, parts.optimizer, layout, cfg.seed, params), None


def checkpointed(policy, state: TrainState) -> TrainState:
  """What a checkpoint holds of `state` (or of its abstract target): all of it, or with adapters the adapters, their
  optimizer state and the step (the frozen base is referenced by RunMeta.base, not copied)."""
  return state if policy.lora is None else dataclasses.replace(state, params=policy.split_trainable(state.params)[0])


def base_record(cfg: RunConfig, base: Any) -> dict:
  """RunMeta.base of a run whose frozen base params are `base` (the tree without adapters)."""
  source = cfg.model.pretrained or ("the warm start" if cfg.warm_start.enabled and cfg.data.task != "file"
                                    else f"the init of seed {cfg.seed}")
  return {"source": source, "checksum": params_checksum(base)}


def check_base(saved: Optional[dict], now: dict, where) -> None:
  """ResumeError naming both bases when the adapters of checkpoint `where` were trained on another base."""
  if saved is None:
    raise ResumeError(f"{where}: the checkpoint holds the whole model, this run trains adapters (lora.rank > 0); "
                      "start over with a new run_dir or checkpoint.resume=false")
  if saved["checksum"] != now["checksum"]:
    raise ResumeError(f"{where}: its adapters were trained on the base {saved['source']} (checksum "
                      f"{saved['checksum']}), but this run's base {now['source']} has checksum {now['checksum']}: the "
                      "adapters would apply to other weights; resume with the same base, or start over with a new "
                      "run_dir or checkpoint.resume=false")


def start_params(parts: Parts, stop: Callable[[], bool], progress: bool, summary: dict) -> Any:
  """The params a fresh run starts from on the trainer mesh (`base_params`; with adapters, that base with fresh
  adapters beside it), or None for the seed's init (init_train_state)."""
  cfg, layout, policy = parts.cfg, parts.trainer_layout, parts.policy
  params = base_params(parts, stop, progress, summary)
  if policy.lora is not None:
    shardings = layout.shardings(policy.logical_axes, policy.param_shapes)
    params = policy.attach_adapters(params, cfg.seed, shardings)
  return params


def base_params(parts: Parts, stop: Callable[[], bool], progress: bool, summary: dict) -> Any:
  """The params of the model without adapters a fresh run starts from, on the trainer mesh: model.pretrained's, or
  the warm start's (from its cache when there), or None for the seed's init (with adapters: that init, here)."""
  cfg, layout = parts.cfg, parts.trainer_layout
  base = make_policy(cfg.model)  # the model without adapters: what the warm start trains
  params = None
  if cfg.model.pretrained:
    from scalerl_jax.model.hf import load_pretrained
    m = cfg.model
    params = load_pretrained(m.pretrained, dtype=m.param_dtype, mesh=layout.mesh, rules=layout.rules,
                             max_seq_len=m.max_seq_len).params
  elif cfg.warm_start.enabled and cfg.data.task != "file":
    if parts.exchange.votes:  # a vote is a collective that waits for the step: at validations only
      every, calls, vote = cfg.warm_start.eval_every, itertools.count(1), stop
      stop = lambda: next(calls) % every == 0 and vote()  # noqa: E731
    params, info = warm_start(cfg, base, layout, parts.task, parts.tokenizer, progress=progress, stop=stop)
    summary.update(info)
    # host arrays (trained, or read from the cache): onto the trainer mesh, where a resume's base and a KL
    # reference copy must be too (a multi-process step refuses host arrays)
    params = jax.device_put(params, layout.shardings(base.logical_axes, base.param_shapes))
    if info.get("warm_start/stopped"):
      n = info["warm_start/steps"]
      raise Stopped(f"during the warm start ({n} supervised step{'s' * (n != 1)} taken, not cached: the next "
                    "start warms up afresh)")
  elif parts.policy.lora is not None:  # the seed's init of the base (the adapters are drawn by start_params)
    params = jax.jit(base.init, out_shardings=layout.shardings(base.logical_axes, base.param_shapes))(
        jax.random.key(cfg.seed))
  return params


def frozen_policies(parts: Parts, state: TrainState, resumed: bool, stop: Callable[[], bool], progress: bool
                    ) -> list:
  """The frozen policies of the loss (train/reference.py), on the trainer mesh: the KL reference when
  loss.kl_coef > 0 (loss.reference=initial: a copy of `state`'s params on a fresh run; on a resume the start params
  rebuilt as a fresh run builds them), the teacher when loss.distill_teacher is set."""
  from scalerl_jax.train import reference as ref
  cfg, layout, l = parts.cfg, parts.trainer_layout, parts.cfg.loss
  student = cfg.model.pretrained or f"data.tokenizer={cfg.data.tokenizer}"
  out = []
  if l.kl_coef > 0 and l.reference == "initial":
    params = state.params
    if resumed:
      params = start_params(parts, stop, progress, {})
      params = params if params is not None else init_train_state(parts.policy, parts.optimizer, layout,
                                                                 cfg.seed).params
    out.append(ref.Frozen("ref_logprobs", "loss.reference=initial", parts.policy, ref.copy_params(params)))
  elif l.kl_coef > 0:
    out.append(ref.load_frozen("ref_logprobs", "loss.reference", l.reference, layout, parts.tokenizer, student))
  if l.distill_teacher:
    out.append(ref.load_frozen("teacher_logprobs", "loss.distill_teacher", l.distill_teacher, layout,
                               parts.tokenizer, student))
  return out


def step_log(parts: Parts, start_step: int, resumed: bool, progress: bool, evaluate: Callable[[], dict]) -> StepLog:
  """The metric sinks of the trainer: metrics.jsonl (and TensorBoard, the progress bar and early-stop advice) on the
  main process; metrics.process<i>.jsonl on the others with logging.every_process."""
  cfg, main = parts.cfg, parts.exchange.is_main
  logger = MetricsLogger(parts.run_dir, cfg.logging.tensorboard and main, resume_step=start_step if resumed else None,
                         enabled=main or cfg.logging.every_process,
                         suffix="" if main else f".process{parts.exchange.topology.process_index}")
  bar = ProgressBar(progress and main, cfg.pipeline.steps, start_step, f"RL ({cfg.pipeline.mode})")
  advise = TargetAdvisor(cfg.curve_fit, parts.run_dir) if cfg.curve_fit.target is not None and main else None
  return StepLog(logger, bar, parts.meter, evaluate, advise)
