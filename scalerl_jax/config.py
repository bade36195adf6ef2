"""Typed, frozen configuration for a whole run.

One root (`RunConfig`) composes one small frozen dataclass per concern. Files in `configs/*.yaml` and dotted
command-line overrides (`loss.name=dapo`) are merged by OmegaConf against these dataclasses, so unknown keys, wrong
types and names outside a choice (the `Literal` types below) are rejected with the full dotted key before anything
compiles (a config built in code checks its choices on construction); `validate` then checks ranges and cross-field
constraints and raises one `ConfigError` that lists every offending key.

The defaults ARE one named recipe, `cpu_default`: the embedded CPU run of `python launch/train.py` with no arguments
(a ~0.4M-parameter policy learns 3-digit addition on 2 CPU cores). configs/cpu_default.yaml spells out the same
values with the measurements behind them; tests/test_config_recipes.py keeps the two equal and every shipped YAML
equal to its reviewed snapshot. The paper's 8B recipe is configs/scalerl_8b.yaml.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import typing
from typing import Any, Literal, Optional, Sequence, Tuple

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from scalerl_jax.errors import UserError


class ConfigError(UserError, ValueError):
  """A configuration problem; the message names every offending dotted key."""


# Names chosen by one key each: OmegaConf rejects any other value (YAML and overrides keep these spellings).
ModelFamily = Literal["dense"]  # moe lands with its own issue
DType = Literal["float32", "bfloat16"]
LossName = Literal["cispo", "reinforce", "grpo", "ppo", "dapo", "gspo"]
Aggregation = Literal["prompt", "sample", "token", "seq_mean_token_sum"]
AdvNorm = Literal["batch", "prompt", "none"]
KLEstimator = Literal["k1", "k3"]
TaskName = Literal["addition", "countdown", "file"]
LongPrompts = Literal["error", "truncate", "skip"]
RewardScale = Literal["01", "pm1"]  # rewards in {0, 1} or {-1, +1}
NPRHistory = Literal["last", "cumulative"]
PipelineMode = Literal["pipeline", "ppo_offpolicy", "sync"]
CurveX = Literal["accelerator_seconds", "accelerator_hours", "flops"]  # the compute axes scaling.io reads


class _Choices:
  """Checks a config built in code against its Literal fields (OmegaConf checks the ones read from YAML)."""

  def __post_init__(self) -> None:
    for name, options in _literal_fields(type(self)):
      value = getattr(self, name)
      if value not in options:
        key = _GROUP_KEYS.get(type(self), type(self).__name__) + "." + name
        raise ConfigError(f"{key}: unknown {value!r}; choose one of {', '.join(options)}")


@functools.cache
def _literal_fields(cls: type) -> tuple[tuple[str, tuple], ...]:
  hints = typing.get_type_hints(cls)
  return tuple((f.name, typing.get_args(hints[f.name])) for f in dataclasses.fields(cls)
               if typing.get_origin(hints[f.name]) is Literal)


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Choices):
  family: ModelFamily = "dense"
  vocab_size: int = 32
  hidden: int = 128
  intermediate: int = 384
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int = 32  # independent of hidden / num_heads
  rope_theta: float = 10000.0
  qk_norm: bool = False
  tie_embeddings: bool = True
  norm_eps: float = 1e-6
  dtype: DType = "float32"  # compute dtype
  param_dtype: DType = "float32"
  fp32_lm_head: bool = True  # LM-head matmul accumulates and returns fp32 in trainer and sampler
  max_seq_len: int = 32  # RoPE / KV-cache capacity: holds rollout.max_prefill_len + rollout.max_new_tokens


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  # Trainer mesh, e.g. "data=1,fsdp=4,tensor=2,expert=1"; one axis may be -1 (inferred from the device count).
  spec: str = "data=1,fsdp=-1,tensor=1,expert=1"
  # Devices split off (from the end of jax.devices()) for the generators. 0 = colocated: generators share the
  # trainer's devices and the two alternate.
  generator_devices: int = 0
  # Generator (rollout) mesh over those devices; no FSDP axis in the rollout layout.
  generator_spec: str = "data=-1,tensor=1"


@dataclasses.dataclass(frozen=True)
class InterruptionConfig:
  enabled: bool = True
  think_budget_min: int = 6  # per-sample thinking budget ~ U[min, max] tokens
  think_budget_max: int = 8
  answer_budget: int = 5  # tokens allowed after the inserted phrase
  phrase: str = "|"  # end-of-thinking phrase inserted when the budget is hit (its tokens carry no loss)
  end_marker: str = "|"  # the model's own end-of-thinking marker


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  max_slots: int = 512  # concurrent decode slots
  # budgets sized to the addition task (configs/cpu_default.yaml says why and what other tasks need)
  max_prefill_len: int = 10
  prefill_buckets: Tuple[int, ...] = (10,)
  max_new_tokens: int = 14  # think budget (<= 8) + inserted phrase (1) + answer budget (5)
  decode_chunk: int = 12  # decode steps fused into one jitted call
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0  # 0 = off
  interruption: InterruptionConfig = dataclasses.field(default_factory=InterruptionConfig)


@dataclasses.dataclass(frozen=True)
class LossConfig(_Choices):
  name: LossName = "cispo"
  aggregation: Aggregation = "prompt"
  adv_norm: AdvNorm = "batch"
  leave_one_out: bool = False
  eps_max: float = 4.0  # CISPO / REINFORCE absolute cap on the importance ratio
  eps_low: float = 0.2  # PPO / GRPO / DAPO lower clip
  eps_high: float = 0.28  # DAPO upper clip (grpo/ppo use eps_low for both sides)
  dual_clip: Optional[float] = None  # DAPO/PPO dual-clip constant c (> 1) for negative advantages
  gspo_eps_low: float = 3e-3
  gspo_eps_high: float = 5e-3
  log_ratio_clamp: float = 20.0  # |log pi - log pi_gen| clamped before exp
  kl_coef: float = 0.0  # must stay 0 until a reference policy fills TrainBatch.ref_logprobs
  kl_estimator: KLEstimator = "k3"
  zero_variance_filter: bool = True
  # truncated samples stay in the loss on the CPU default's tiny budget (the 8B recipe excludes them)
  exclude_truncated: bool = False
  length_penalty: bool = False  # DAPO overlong penalty (the paper's loo-lp), added to correct samples only
  length_penalty_max: int = 24  # L_max
  length_penalty_cache: int = 4  # L_cache
  adv_eps: float = 1e-6


@dataclasses.dataclass(frozen=True)
class NPRConfig(_Choices):
  enabled: bool = True
  threshold: float = 0.9
  min_observations: int = 1
  history: NPRHistory = "last"


@dataclasses.dataclass(frozen=True)
class DataConfig(_Choices):
  task: TaskName = "addition"
  path: str = ""  # JSONL or Parquet, for task=file
  prompt_field: str = "prompt"
  answer_field: str = "answer"
  id_field: str = ""  # empty: a stable id is derived from the row's content
  tokenizer: str = "char"  # char | path to a tokenizer.json
  eos_token: str = ""  # a tokenizer.json's end-of-sequence token when it has none of the usual names
  chat_template: str = ""
  digits: int = 3  # built-in tasks' difficulty knob
  num_train: int = 20000  # built-in tasks: training pool size
  num_eval: int = 512  # held-out prompts
  prompts_per_step: int = 64
  samples_per_prompt: int = 8
  seed: int = 0
  skip_bad_rows: bool = False
  long_prompts: LongPrompts = "error"
  reward_fn: str = ""  # dotted path; empty = the task's own verifier
  reward_timeout_s: float = 5.0  # per call; a call past it is killed (its worker process replaced) and scored a failure
  reward_workers: int = 2  # processes that run verifiers which can hang (a user's reward_fn, math-verify)
  # the score of a call that raised, timed out or returned no finite number, on the reward scale; null = the
  # scale's lowest reward (0 under 01, -1 under pm1), so a failed verification never beats a wrong answer
  failure_reward: Optional[float] = None
  reward_scale: RewardScale = "01"
  npr: NPRConfig = dataclasses.field(default_factory=NPRConfig)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  lr: float = 5e-4
  warmup_steps: int = 10
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-15
  grad_clip: float = 1.0  # global-norm clip; 0 = off


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """How the trainer computes one optimizer step (the objective is `loss`, the update `optimizer`)."""
  micro_batches: int = 1  # the step batch runs in this many slices of whole groups (gradients accumulated)
  # the trainer computes each prompt once per group instead of once per sample (same loss and gradient)
  shared_prompt: bool = True
  # a step whose loss or gradients are not finite is skipped (params and optimizer state untouched) and counted;
  # this many in a row stop the run with the last good checkpoint
  max_skipped_steps: int = 10


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  enabled: bool = True
  lr: float = 3e-3
  batch_size: int = 128
  max_steps: int = 1000
  eval_every: int = 10
  # stop once the mean P(reference completion) at temperature 1 on the warm-start validation split (a lower bound
  # on its expected mean@n, computed without sampling) reaches this
  target_pass_rate: float = 0.3
  eps: float = 1e-8  # SFT settings, not the RL recipe's: eps 1e-15 + clipping sat on the plateau ~2x longer
  grad_clip: float = 0.0
  cache_dir: str = "~/.cache/scalerl_jax/warmstart"


@dataclasses.dataclass(frozen=True)
class PipelineConfig(_Choices):
  mode: PipelineMode = "pipeline"  # PipelineRL-k | PPO-off-policy-k | the synchronous reference loop
  max_lag: int = 0  # k (0 on 2 shared CPU cores; the 8B recipe uses 8)
  steps: int = 500
  eval_every: int = 10
  eval_samples: int = 4  # n in mean@n
  eval_temperature: float = 1.0


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  every_steps: int = 40
  keep: int = 2
  resume: bool = True


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
  tensorboard: bool = True
  progress: bool = True


@dataclasses.dataclass(frozen=True)
class CurveFitConfig(_Choices):
  x: CurveX = "accelerator_seconds"  # the compute axis (launch/fit_curve.py --x takes its default from here)
  fit_upto: float = 0.5
  c_min: float = 0.0
  bayes: bool = True


@dataclasses.dataclass(frozen=True)
class RunConfig:
  run_dir: str = "runs/cpu_default"
  seed: int = 0
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
  warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
  pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
  curve_fit: CurveFitConfig = dataclasses.field(default_factory=CurveFitConfig)


CONFIG_GROUPS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name not in ("run_dir", "seed"))


def _group_keys(cls: type, prefix: str = "") -> dict:
  out = {}
  for f in dataclasses.fields(cls):
    sub = typing.get_type_hints(cls)[f.name]
    if dataclasses.is_dataclass(sub):
      out[sub] = prefix + f.name
      out.update(_group_keys(sub, prefix + f.name + "."))
  return out


_GROUP_KEYS = _group_keys(RunConfig)  # LossConfig -> "loss", NPRConfig -> "data.npr", ...
# Every name-valued key and its options, read off the Literal types (a view for help texts and benchmarks).
CHOICES = {f"{key}.{name}": options for cls, key in _GROUP_KEYS.items() for name, options in _literal_fields(cls)}
# Keys that moved to another group: an old file or override that uses one is told where it went.
_MOVED = {"pipeline.micro_batches": "trainer.micro_batches", "pipeline.shared_prompt": "trainer.shared_prompt"}


def validate(cfg: RunConfig) -> RunConfig:
  """Checks values that types cannot; raises one ConfigError naming every bad key."""
  errors: list[str] = []

  def need(ok: bool, key: str, msg: str) -> None:
    if not ok:
      errors.append(f"{key}: {msg} (got {functools.reduce(getattr, key.split('.'), cfg)!r})")

  m = cfg.model
  for key in ("vocab_size", "hidden", "intermediate", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "max_seq_len"):
    need(getattr(m, key) > 0, f"model.{key}", "must be positive")
  need(m.num_kv_heads > 0 and m.num_heads % max(m.num_kv_heads, 1) == 0, "model.num_kv_heads",
       f"must divide model.num_heads={m.num_heads}")
  need(m.head_dim % 2 == 0, "model.head_dim", "must be even (RoPE rotates pairs)")
  need(m.rope_theta > 0, "model.rope_theta", "must be positive")
  r = cfg.rollout
  need(r.max_slots > 0, "rollout.max_slots", "must be positive")
  need(r.temperature >= 0, "rollout.temperature", "must be >= 0 (0 = greedy)")
  need(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
  need(r.top_k >= 0, "rollout.top_k", "must be >= 0 (0 = off)")
  need(r.decode_chunk > 0, "rollout.decode_chunk", "must be positive")
  need(r.max_new_tokens > 0, "rollout.max_new_tokens", "must be positive")
  need(len(r.prefill_buckets) > 0 and list(r.prefill_buckets) == sorted(r.prefill_buckets)
       and r.prefill_buckets[-1] == r.max_prefill_len, "rollout.prefill_buckets",
       f"must be increasing and end at rollout.max_prefill_len={r.max_prefill_len}")
  need(r.max_prefill_len + r.max_new_tokens <= m.max_seq_len, "model.max_seq_len",
       f"must hold rollout.max_prefill_len + rollout.max_new_tokens = {r.max_prefill_len + r.max_new_tokens}")
  it = r.interruption
  need(0 < it.think_budget_min <= it.think_budget_max, "rollout.interruption.think_budget_min",
       f"must be in [1, think_budget_max={it.think_budget_max}]")
  need(it.answer_budget > 0, "rollout.interruption.answer_budget", "must be positive")
  l = cfg.loss
  need(l.eps_max > 0, "loss.eps_max", "must be positive (absolute cap on the ratio)")
  need(0 < l.eps_low < 1, "loss.eps_low", "must be in (0, 1)")
  need(l.eps_high > 0, "loss.eps_high", "must be positive")
  need(l.dual_clip is None or l.dual_clip > 1, "loss.dual_clip", "must be > 1 or null")
  need(l.log_ratio_clamp > 0, "loss.log_ratio_clamp", "must be positive")
  need(l.kl_coef == 0, "loss.kl_coef", "must be 0: a KL penalty needs a reference policy, which is not implemented "
       "yet (nothing fills TrainBatch.ref_logprobs)")
  need(0 < l.length_penalty_cache < l.length_penalty_max, "loss.length_penalty_cache",
       f"must be in (0, loss.length_penalty_max={l.length_penalty_max})")
  d = cfg.data
  need(d.prompts_per_step > 0, "data.prompts_per_step", "must be positive")
  need(d.samples_per_prompt > 1, "data.samples_per_prompt", "must be >= 2 (advantages are group-relative)")
  need(d.task != "file" or bool(d.path), "data.path", "is required when data.task=file")
  need(d.reward_timeout_s > 0, "data.reward_timeout_s", "must be positive")
  need(d.reward_workers >= 1, "data.reward_workers", "must be >= 1")
  lowest = 0.0 if d.reward_scale == "01" else -1.0
  need(d.failure_reward is None or d.failure_reward <= lowest, "data.failure_reward",
       f"must be at most the lowest reward of data.reward_scale={d.reward_scale} ({lowest:g}) or null, so a failed "
       "verification never scores above a wrong answer")
  need(d.num_eval > 0, "data.num_eval", "must be positive (the held-out set the curve is measured on)")
  need(d.task == "file" or d.num_train > 0, "data.num_train", "must be positive")
  need(0 < d.npr.threshold <= 1, "data.npr.threshold", "must be in (0, 1]")
  need(d.npr.min_observations >= 1, "data.npr.min_observations", "must be >= 1")
  o = cfg.optimizer
  need(o.lr > 0, "optimizer.lr", "must be positive")
  need(o.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
  need(o.eps > 0, "optimizer.eps", "must be positive")
  need(o.grad_clip >= 0, "optimizer.grad_clip", "must be >= 0 (0 = off)")
  p = cfg.pipeline
  need(p.max_lag >= 0, "pipeline.max_lag", "must be >= 0")
  need(p.mode != "ppo_offpolicy" or p.max_lag >= 1, "pipeline.max_lag", "must be >= 1 for ppo_offpolicy")
  need(p.steps > 0, "pipeline.steps", "must be positive")
  need(cfg.trainer.micro_batches > 0 and d.prompts_per_step % cfg.trainer.micro_batches == 0,
       "trainer.micro_batches", f"must divide data.prompts_per_step={d.prompts_per_step}")
  need(p.eval_samples > 0, "pipeline.eval_samples", "must be positive")
  need(0 < cfg.curve_fit.fit_upto <= 1, "curve_fit.fit_upto", "must be in (0, 1]")
  need(cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
  need(cfg.checkpoint.every_steps > 0, "checkpoint.every_steps", "must be positive")
  need(p.eval_every >= 0, "pipeline.eval_every", "must be >= 0 (0 = no periodic evaluation)")
  need(cfg.trainer.max_skipped_steps >= 1, "trainer.max_skipped_steps", "must be >= 1")
  w = cfg.warm_start
  if w.enabled:
    need(w.max_steps > 0, "warm_start.max_steps", "must be positive (or warm_start.enabled=false)")
    need(w.eval_every > 0, "warm_start.eval_every", "must be positive")
    need(w.batch_size > 0, "warm_start.batch_size", "must be positive")
    need(d.task == "file" or w.batch_size <= d.num_train, "warm_start.batch_size",
         f"must be at most the training pool, data.num_train={d.num_train}")
    need(w.lr > 0, "warm_start.lr", "must be positive")
  need(cfg.mesh.generator_devices >= 0, "mesh.generator_devices", "must be >= 0")
  for key, value in _floats(cfg):
    if not math.isfinite(value):
      errors.append(f"{key}: must be a finite number (got {value!r})")
  if errors:
    raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
  return cfg


def _floats(cfg: Any, prefix: str = "") -> list[tuple[str, float]]:
  """Every float-valued key of a config (nested groups included), with its dotted name."""
  out = []
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    if dataclasses.is_dataclass(value):
      out += _floats(value, f"{prefix}{f.name}.")
    elif isinstance(value, float):
      out.append((prefix + f.name, value))
  return out


def _clean(exc: OmegaConfBaseException, source: str) -> ConfigError:
  key = getattr(exc, "full_key", None)
  msg = str(exc).splitlines()[0]
  if key in _MOVED:
    msg += f" (moved to {_MOVED[key]})"
  where = f" in {source}" if source else ""
  return ConfigError(f"{key}: {msg}{where}" if key else f"{msg}{where}")


def _file_chain(path: Optional[str | pathlib.Path]) -> list[pathlib.Path]:
  """[root base, ..., path]: a file may name `base: other.yaml` (relative to itself) to inherit from."""
  chain: list[pathlib.Path] = []
  while path is not None:
    path = pathlib.Path(path)
    if not path.is_file():
      raise ConfigError(f"config file not found: {path}")
    if path.resolve() in [p.resolve() for p in chain]:
      raise ConfigError(f"{path}: base chain loops")
    chain.insert(0, path)
    base = _load_yaml(path).get("base")
    path = (path.parent / base) if base else None
  return chain


def _load_yaml(path: pathlib.Path):
  """One YAML file through OmegaConf (yaml.safe_load rules: tags such as !!python/... are refused, never run);
  syntax errors, tabs, duplicate keys and bad encodings become a ConfigError naming the file and line."""
  try:
    return OmegaConf.load(path)
  except OmegaConfBaseException as exc:
    raise _clean(exc, str(path)) from None
  except yaml.YAMLError as exc:
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    raise ConfigError(f"{where}: not valid YAML: {problem}") from None
  except UnicodeDecodeError as exc:
    raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
  except OSError as exc:
    raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _override(item: str) -> Any:
  """One `key=value`; a name-valued key takes its text as written (`data.reward_scale=01` is "01", not 1)."""
  key, _, value = (s.strip() for s in item.partition("="))
  if key not in CHOICES:
    return OmegaConf.from_dotlist([item])
  unquoted = value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value
  return OmegaConf.from_dotlist([f"{key}={json.dumps(unquoted)}"])


def load_config(path: Optional[str | pathlib.Path] = None, overrides: Sequence[str] = ()) -> RunConfig:
  """Defaults <- YAML file (and the files it names as `base:`) <- dotted overrides (`loss.name=dapo`), typed and
  validated.

  Raises ConfigError naming the offending key (and the file or override it came from).
  """
  merged = OmegaConf.structured(RunConfig)
  for file in _file_chain(path):
    loaded = _load_yaml(file)
    try:
      loaded.pop("base", None)
      merged = OmegaConf.merge(merged, loaded)
    except OmegaConfBaseException as exc:
      raise _clean(exc, str(file)) from None
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r} is not of the form key=value")
    try:
      merged = OmegaConf.merge(merged, _override(item))
    except OmegaConfBaseException as exc:
      raise _clean(exc, f"override {item!r}") from None
  try:
    cfg = OmegaConf.to_object(merged)
  except OmegaConfBaseException as exc:
    raise _clean(exc, "") from None
  return validate(cfg)


def to_yaml(cfg: RunConfig) -> str:
  return OmegaConf.to_yaml(OmegaConf.structured(cfg))
