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
import typing
from typing import Literal, Optional, Tuple


from scalerl_jax.errors import UserError


class ConfigError(UserError, ValueError):
  """A configuration problem; the message names every offending dotted key."""


# Names chosen by one key each: OmegaConf rejects any other value (YAML and overrides keep these spellings).
ModelFamily = Literal["dense", "moe"]  # moe: mixture-of-experts MLPs (the model.num_experts keys)
MoEDispatch = Literal["ragged", "dense"]  # ragged: sorted tokens + grouped matmul; dense: one-hot, tiny tests
DType = Literal["float32", "bfloat16"]
KVCacheDType = Literal["model", "float32", "bfloat16"]  # model: the compute dtype (model.dtype)
RopeScaling = Literal["default", "llama3"]  # "llama3": Llama-3.1 frequency scaling (transformers' rope_type llama3)
LossName = Literal["cispo", "reinforce", "grpo", "ppo", "dapo", "gspo"]
Aggregation = Literal["prompt", "sample", "token", "seq_mean_token_sum"]
AdvNorm = Literal["batch", "prompt", "none"]
# the policy the loss's importance ratio divides by (rl/mismatch.py): the sampler's recorded log-probs, or the
# trainer's own log-probs of the pre-update params (exact and free in this one-update-per-batch trainer)
Behavior = Literal["sampler", "trainer"]
# the sampler-trainer mismatch correction on the policy-gradient term (rl/mismatch.py)
Mismatch = Literal["none", "tis", "mask", "seq_mask"]
# a KL term to a frozen reference policy (rl/reference.py): Schulman's estimators of KL(pi_theta || pi_ref), and
# where the term goes: a differentiable loss term, or a stop-gradient penalty on each token's advantage
KLEstimator = Literal["k1", "k2", "k3"]
KLMode = Literal["loss", "reward"]
# mixed: addition + code; word_problems: English arithmetic for a pretrained instruct model
TaskName = Literal["addition", "countdown", "code", "word_problems", "mixed", "file"]
TaskMix = Literal["shuffled", "ratio"]  # how data.task=mixed fills batches
LongPrompts = Literal["error", "truncate", "skip"]
RewardScale = Literal["01", "pm1"]  # rewards in {0, 1} or {-1, +1}
NPRHistory = Literal["last", "cumulative"]
# lockstep: PipelineRL with k = 0, the generator thread waiting for every new version (not the reference loop
# without threads, launch/train.py --reference-loop)
PipelineMode = Literal["pipeline", "ppo_offpolicy", "lockstep"]
# the compute axes scaling.io reads: generator_flops is the sampling compute alone (scaling.io.X_AXES)
CurveX = Literal["accelerator_seconds", "accelerator_hours", "flops", "generator_flops", "steps"]


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
  # a Hugging Face checkpoint directory (config.json + safetensors) or a GGUF file: when set, its config.json (the
  # GGUF's metadata) decides the architecture keys below (they are overwritten) and its weights are the initial
  # params (no warm start)
  pretrained: str = ""
  family: ModelFamily = "dense"
  vocab_size: int = 32
  hidden: int = 128
  intermediate: int = 384
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int = 32  # independent of hidden / num_heads
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling = "default"  # llama3: the four rope_* keys below rescale the RoPE frequencies
  rope_factor: float = 1.0  # llama3: frequencies of wavelengths > original_max / low_freq_factor are divided by it
  rope_low_freq_factor: float = 1.0  # llama3
  rope_high_freq_factor: float = 4.0  # llama3: wavelengths < original_max / high_freq_factor stay unchanged
  rope_original_max_positions: int = 8192  # llama3: the pre-training context (original_max_position_embeddings)
  qkv_bias: bool = False  # biases on the q/k/v projections (Qwen2 / Qwen2.5)
  qk_norm: bool = False  # RMSNorm over the head dim of q and k before RoPE (Qwen3)
  tie_embeddings: bool = True
  norm_eps: float = 1e-6
  dtype: DType = "float32"  # compute dtype
  param_dtype: DType = "float32"
  fp32_lm_head: bool = True  # LM-head matmul accumulates and returns fp32 in trainer and sampler
  max_seq_len: int = 32  # RoPE / KV-cache capacity: holds rollout.max_prefill_len + rollout.max_new_tokens
  # mixture of experts (model.family=moe; scalerl_jax/model/moe.py)
  num_experts: int = 0  # E routed experts per MoE layer (0 with the dense family)
  experts_per_token: int = 2  # k: top-k routing
  moe_intermediate: int = 0  # each expert's SwiGLU width (0: model.intermediate)
  # renormalise the k gate weights to sum 1 (Qwen3-MoE norm_topk_prob, Mixtral); with experts_per_token=1 every
  # gate is then 1 and the router learns only from the auxiliary losses
  norm_topk_prob: bool = True
  shared_expert_intermediate: int = 0  # width of an always-on shared SwiGLU expert per MoE layer (0: none)
  decoder_sparse_step: int = 1  # layer i is MoE when (i + 1) % step == 0 and i is not in mlp_only_layers
  mlp_only_layers: Tuple[int, ...] = ()  # layers kept dense (their MLP has model.intermediate)
  moe_dispatch: MoEDispatch = "ragged"

  @property
  def moe_layers(self) -> tuple[int, ...]:
    """The layers whose MLP is a mixture of experts, in order (none with the dense family)."""
    if self.family != "moe":
      return ()
    step = max(self.decoder_sparse_step, 1)
    return tuple(i for i in range(self.num_layers) if (i + 1) % step == 0 and i not in self.mlp_only_layers)

  @property
  def expert_width(self) -> int:
    """Each routed expert's SwiGLU width."""
    return self.moe_intermediate or self.intermediate


# the projections a low-rank adapter can target, by the name of their param (model/layers.py, model/moe.py)
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Low-rank adapters (scalerl_jax/model/lora.py): with rank > 0 the model's weights are frozen and each targeted
  projection W trains an adapter, y = x W + (alpha / rank) (x A) B, B starting at zero (the first step's model is the
  base). MoE layers adapt each expert's gate / up / down with its own adapter; the router is never adapted."""
  rank: int = 0  # 0 = off: every weight trains
  alpha: float = 16.0  # the adapters' output scale is alpha / rank
  dropout: float = 0.0  # dropout on the adapters' input: must be 0 (it would perturb the RL ratios; validate.py)
  targets: Tuple[str, ...] = LORA_TARGETS  # the projections adapted


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  # Trainer mesh, e.g. "data=1,fsdp=4,tensor=2,expert=1"; one axis may be -1 (inferred from the device count).
  spec: str = "data=1,fsdp=-1,tensor=1,expert=1"
  # Devices split off (from the end of jax.devices()) for the generators. 0 = colocated: generators share the
  # trainer's devices and the two alternate.
  generator_devices: int = 0
  # Generator (rollout) mesh over those devices; no FSDP axis in the rollout layout. In a multi-process run each
  # process's generator is its own slice over its local devices (the last generator_devices of them, or all).
  generator_spec: str = "data=-1,tensor=1"
  # Multi-process runs: 0 = colocated (every process trains and generates); n > 0 = disaggregated (the last n
  # processes only generate, the others only train; weights and rollouts cross between them).
  generator_processes: int = 0
  # CPU only: split the host into this many XLA devices before jax starts (launch/train.py; one per core of the
  # 2-core target: decode splits its slots over them and the trainer its batch; measured 0.28 -> 0.24 s per RL
  # step of the CPU default). XLA_FLAGS' --xla_force_host_platform_device_count, when set, wins; 0: jax's default.
  cpu_devices: int = 2


@dataclasses.dataclass(frozen=True)
class InterruptionConfig:
  enabled: bool = True
  think_budget_min: int = 6  # per-sample thinking budget ~ U[min, max] tokens
  think_budget_max: int = 8
  answer_budget: int = 5  # tokens allowed after the inserted phrase
  phrase: str = "|"  # end-of-thinking phrase inserted when the budget is hit (its tokens carry no loss)
  end_marker: str = "|"  # the model's own end-of-thinking marker


@dataclasses.dataclass(frozen=True)
class RolloutConfig(_Choices):
  max_slots: int = 512  # concurrent decode slots
  # the decode KV cache's storage dtype: bfloat16 halves the bytes each decode step streams (attention casts on
  # write and on read; the log-prob error against float32 is in benchmarks/RESULTS.md "Rollout engine")
  kv_cache_dtype: KVCacheDType = "model"
  # budgets sized to the addition task (configs/cpu_default.yaml says why and what other tasks need)
  max_prefill_len: int = 10
  prefill_buckets: Tuple[int, ...] = (10,)
  max_new_tokens: int = 14  # think budget (<= 8) + inserted phrase (1) + answer budget (5)
  decode_chunk: int = 12  # decode steps fused into one jitted call
  temperature: float = 1.0  # the sampler's and the trainer's (the loss's log-probs are at it too)
  # the sampler's temperature when it differs from the trainer's: a sampler-trainer mismatch on purpose, the kind an
  # inference engine with its own sampling settings causes (null = rollout.temperature, no mismatch). For measuring
  # the corrections of loss.mismatch (benchmarks/mismatch.py); the sampler's log-probs are at this temperature.
  sampler_temperature: Optional[float] = None
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
  # Sampler-trainer mismatch (rl/mismatch.py has the formulas). w = pi_trainer / pi_sampler per token.
  behavior: Behavior = "sampler"  # sampler: ratio to the sampler's log-probs (ScaleRL); trainer: decoupled
  mismatch: Mismatch = "none"  # tis: min(w, cap); mask: keep low <= w <= high (IcePop); seq_mask: geometric mean
  mismatch_cap: float = 2.0  # tis cap C (verl's rollout_is_threshold, slime's tis_clip)
  mismatch_low: float = 0.5  # mask: a token is kept when mismatch_low <= w <= mismatch_high (IcePop's 0.5 / 5)
  mismatch_high: float = 5.0
  # seq_mask: a sequence is kept when its geometric-mean ratio exp(mean_t log w) lies in [seq_low, seq_high]
  mismatch_seq_low: float = 0.999  # verl's geometric rejection preset (1.001 and its reciprocal)
  mismatch_seq_high: float = 1.001
  # A frozen reference policy and on-policy distillation (rl/reference.py has the formulas; train/reference.py the
  # frozen forwards, once per step, counted in compute). Both off by default.
  kl_coef: float = 0.0  # beta; 0 = no KL term and no reference forward
  kl_estimator: KLEstimator = "k3"  # k1: d; k2: d^2/2; k3: exp(-d) + d - 1, d = log pi_theta - log pi_ref (GRPO's)
  kl_mode: KLMode = "loss"  # loss: + beta sum w k (differentiable); reward: A[b,t] -= beta sg(k)
  reference: str = "initial"  # initial: the run's starting params; else a checkpoint load_pretrained reads
  distill_teacher: str = ""  # a checkpoint load_pretrained reads; empty = no distillation
  distill_coef: float = 1.0  # gamma in A[b,t] = gamma sg(log pi_teacher - log pi_theta)
  distill_task_reward: bool = False  # true: the task's advantage A_b is added; false: the teacher's signal alone
  zero_variance_filter: bool = True
  # truncated samples stay in the loss on the CPU default's tiny budget (the 8B recipe excludes them)
  exclude_truncated: bool = False
  # the reward of a sample the length budget cut off, whatever its verifier says (null = the verifier's score). 0
  # keeps it in the loss as a failure, so running into the budget is never a way out of a negative advantage, as it
  # is when truncated samples are excluded (configs/smollm2_cpu.yaml: the seed that learned to ramble)
  truncated_reward: Optional[float] = None
  length_penalty: bool = False  # DAPO overlong penalty (the paper's loo-lp), added to correct samples only
  length_penalty_max: int = 24  # L_max
  length_penalty_cache: int = 4  # L_cache
  adv_eps: float = 1e-6
  # MoE router losses (model.family=moe), added to the policy loss: load balance (1 under uniform routing) and
  # router z-loss (mean squared log-partition of the router logits)
  router_aux_coef: float = 1e-3  # Qwen3-MoE's router_aux_loss_coef
  router_z_coef: float = 1e-3  # ST-MoE's z-loss coefficient


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
  eval_path: str = ""  # task=file: the held-out split's own file (same fields); empty: data.num_eval rows of path
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
  # mixed tasks: a row's task (math | code) chooses its verifier and its per-task metrics; task=file reads it from
  # this field (rows without it are math); code rows hold their tests in the answer field (README: code datasets)
  task_field: str = "task"
  code_fraction: float = 0.5  # data.task=mixed: the share of code prompts
  code_digits: int = 2  # the built-in code task's knob (digits of f(0)); addition's is data.digits
  # shuffled: one pool, code rows drawn with probability code_fraction; ratio: every batch holds exactly
  # round(code_fraction * prompts_per_step) code prompts
  task_mix: TaskMix = "shuffled"
  npr: NPRConfig = dataclasses.field(default_factory=NPRConfig)


@dataclasses.dataclass(frozen=True)
class RewardConfig(_Choices):
  """How completions are scored (scalerl_jax/rewards/runner.py): by the task's own verifier or `fn`, each call
  bounded in time, a failed call scored `on_failure`, on one scale."""
  fn: str = ""  # dotted path; empty = the task's own verifier
  timeout_s: float = 5.0  # per call; a call past it is killed (its worker process replaced) and scored a failure
  workers: int = 2  # processes that run verifiers which can hang (a user's reward.fn, math-verify)
  # the score of a call that raised, timed out or returned no finite number, on the reward scale; null = the
  # scale's lowest reward (0 under 01, -1 under pm1), so a failed verification never beats a wrong answer
  on_failure: Optional[float] = None
  scale: RewardScale = "01"
  # data.task=word_problems (rewards.verifiers.boxed_answer_reward; a right boxed answer earns 1): what a right
  # final answer left unboxed earns, and what a boxed wrong number earns
  unboxed_reward: float = 0.5
  boxed_wrong_reward: float = 0.0


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Where code rewards run the model's programs: bubblewrap (namespaces: mount, PID, IPC, UTS, network; no
  network at all) plus resource limits. scalerl_jax/rewards/sandbox.py says what each limit does."""
  python: str = "/usr/bin/python3"  # the interpreter inside the sandbox (its prefix is bound read-only)
  cpu_s: float = 2.0  # CPU seconds per test run (RLIMIT_CPU)
  wall_s: float = 4.0  # wall-clock seconds per test run, enforced from outside (the whole process tree is killed)
  memory_mb: int = 512  # address space per process (RLIMIT_AS); with tmp_mb, the whole run's memory (memory_cgroup)
  max_procs: int = 16  # processes and threads (RLIMIT_NPROC, as an unprivileged user)
  file_kb: int = 1024  # largest file it may write (RLIMIT_FSIZE), its stdout/stderr included
  open_files: int = 64  # RLIMIT_NOFILE
  output_kb: int = 64  # bytes of stdout / stderr read back
  tmp_mb: int = 16  # its private writable /tmp (tmpfs)
  tmp_files: int = 4096  # files and directories its /tmp may hold (tmpfs nr_inodes; needs a root trainer: tmpfs.py)
  partial_credit: bool = False  # reward = fraction of tests passed (else 1 only when all pass)
  marker: str = "|"  # without a fenced block, the program is the text after the last marker (up to '$')
  # one memory bound per run over all its processes (rewards/memory.py): "auto" (this process's cgroup v2 when
  # delegated, else one address space: no new processes), "off" (one address space) or the directory of a cgroup
  # (v2, or a v1 memory cgroup) to make each run's cgroup in
  memory_cgroup: str = "auto"


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
  # XLA's temporaries of a compiled train step (activations, attention scores, logits: they grow with the rows of a
  # micro-batch, the model and the batch widths), in MiB per device (on CPU: of all the host's trainer devices): a
  # step that needs more runs in more micro-batches of whole groups (the fewest that fit, a multiple of
  # micro_batches; same loss and gradient), recompiled once. 0: no limit.
  max_step_memory_mb: int = 4096
  # Groups the filters removed (zero variance: every sample scored the same) carry no loss and no gradient, and
  # are not run through the model: the step batch is cut to the smallest of this many sizes (about
  # prompts_per_step * j / batch_buckets groups, j = 1..batch_buckets) that holds the kept groups. Same loss,
  # gradient and loss metrics; one compiled step per size used. 1: always the whole batch. MoE policies always
  # train on the whole batch (their router losses count every token).
  batch_buckets: int = 4
  # the trainer computes each prompt once per group instead of once per sample (same loss and gradient)
  shared_prompt: bool = True
  # a step whose loss or gradients are not finite is skipped (params and optimizer state untouched) and counted;
  # this many in a row stop the run with the last good checkpoint
  max_skipped_steps: int = 10
  # MoE: the generator records each token's top-k experts per MoE layer; on, the trainer's forward routes through
  # those experts (its own router still sets the gate weights) instead of its own top-k
  routing_replay: bool = True


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  enabled: bool = True
  lr: float = 3e-3
  batch_size: int = 128
  max_steps: int = 2000
  eval_every: int = 10
  # stop once the mean P(reference completion) at temperature 1 on the warm-start validation split (a lower bound
  # on its expected mean@n, computed without sampling) reaches this (0.75: cpu_default.yaml says why)
  target_pass_rate: float = 0.75
  eps: float = 1e-8  # SFT settings, not the RL recipe's: eps 1e-15 + clipping sat on the plateau ~2x longer
  grad_clip: float = 0.0
  cache_dir: str = "~/.cache/scalerl_jax/warmstart"


@dataclasses.dataclass(frozen=True)
class PipelineConfig(_Choices):
  mode: PipelineMode = "pipeline"  # PipelineRL-k | PPO-off-policy-k | lockstep: PipelineRL with k = 0
  max_lag: int = 0  # k (0 on 2 shared CPU cores; the 8B recipe uses 8)
  steps: int = 300
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
  # multi-process runs: every process, not only process 0, writes its own metrics (metrics.process<i>.jsonl; a
  # disaggregated generator: weights.process<i>.jsonl, the checksum of every weight version it received) and the
  # trainer logs pipeline/weight_checksum, to compare what each process computed
  every_process: bool = False


@dataclasses.dataclass(frozen=True)
class CurveFitConfig(_Choices):
  # the compute axis (launch/fit_curve.py --x takes its default from here). The CPU default's is the sampling
  # compute: its trainer FLOPs per step fall 2.4x over a run as the zero-variance filter drops solved groups, which
  # bends the curve against a sigmoid; fitted on generator FLOPs its first half predicts its end within 0.03
  # (benchmarks/RESULTS.md, "Calibration on real runs")
  x: CurveX = "generator_flops"
  fit_upto: float = 0.5
  c_min: float = 0.0
  bayes: bool = True
  # early-stop advice at every evaluation (predict/... metrics, pipeline/step_metrics.py TargetAdvisor): the
  # probability that the run's ceiling exceeds this pass rate and the compute at which it is reached; null = off
  target: Optional[float] = None
  # the predictive bands' calibration and the NumPyro fit's shape prior (scalerl_jax/scaling/calibration.py): a
  # file written by `python benchmarks/calibration.py RUNS --write-calibration FILE` on finished runs of your task;
  # "" = the shipped one (fitted on the project's studies; the end-of-run report names which it used)
  calibration: str = ""


@dataclasses.dataclass(frozen=True)
class RunConfig:
  run_dir: str = "runs/cpu_default"
  seed: int = 0
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
  sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)
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
# Spellings a config no longer takes: a file or override that uses one is refused with where it went (load.py
# checks every source before merging it), never read as something else. A checkpoint written before a move still
# resumes: its fingerprint's keys are read through MOVED (train/checkpoint.py).
MOVED = {  # old key -> its new key
    "pipeline.micro_batches": "trainer.micro_batches",
    "pipeline.shared_prompt": "trainer.shared_prompt",
    "data.reward_fn": "reward.fn",
    "data.reward_timeout_s": "reward.timeout_s",
    "data.reward_workers": "reward.workers",
    "data.failure_reward": "reward.on_failure",
    "data.reward_scale": "reward.scale",
    "rollout.routing_replay": "trainer.routing_replay",
}
REMOVED: dict[str, str] = {}  # old key -> why it went
RENAMED_VALUES = {  # (key, old value) -> (its new name, what it is)
    ("pipeline.mode", "sync"): ("lockstep", "PipelineRL with k = 0; the reference loop without threads is "
                                "launch/train.py --reference-loop"),
}

__all__ = [
    "AdvNorm",
    "Aggregation",
    "Behavior",
    "CHOICES",
    "CONFIG_GROUPS",
    "CheckpointConfig",
    "ConfigError",
    "CurveFitConfig",
    "CurveX",
    "DType",
    "DataConfig",
    "InterruptionConfig",
    "KVCacheDType",
    "LORA_TARGETS",
    "LoraConfig",
    "LoggingConfig",
    "LongPrompts",
    "LossConfig",
    "LossName",
    "MeshConfig",
    "Mismatch",
    "ModelConfig",
    "ModelFamily",
    "SandboxConfig",
    "TaskMix",
    "MoEDispatch",
    "NPRConfig",
    "NPRHistory",
    "OptimizerConfig",
    "PipelineConfig",
    "PipelineMode",
    "RewardConfig",
    "RewardScale",
    "RolloutConfig",
    "RunConfig",
    "TaskName",
    "TrainerConfig",
    "WarmStartConfig",
]
