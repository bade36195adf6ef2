"""The spine of the data flow: one frozen record per stage boundary, and the one shape legend of the package.

    data.PromptStream ──Prompt──► rollout.RolloutDriver ──RolloutGroup──► rewards.RewardRunner ──ScoredGroup──►
    ScoredBatch (the P groups of one step) ──pipeline.batching──► PackedRows ──rl.prepare──► TrainBatch
    ──train step──► StepRecord (metrics, read one step late)

Shape legend (array names carry their shape as a suffix, `x_BTD`; einsum strings use the same letters):
  P  prompts: the groups of one step, or the prompts of one prefill call
  G  samples per prompt (group size)
  B  rows: P * G sample rows of a step, or the decode slots of the engine
  T  tokens of a row (prompt + completion, right-padded), or query tokens of one forward call
  L  prompt tokens (Lb: a prefill bucket's width)
  N  new tokens: a completion, or the decode steps of one generate call
  S  key/value positions (cache length)
  M  inserts in one prefill-insert call
  D  hidden       F  MLP width      V  vocabulary    E  experts
  Q  query heads  K  key/value heads  R = Q // K query heads per key/value head   H  head dim (independent of D/Q)
Local letters (a merged batch inside one function, say) are defined where they are used.

Token alignment: in a row, `tokens[t]` is predicted from `tokens[:t]`. Every per-token array of a TrainBatch is
aligned with `tokens`: `gen_logprobs[b, t]` is the sampler's log-probability of `tokens[b, t]`, and `loss_mask[b, t]`
says whether `tokens[b, t]` carries loss. Position 0 never carries loss.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One prompt as the data pipeline hands it over."""
  prompt_id: str  # stable id (NPR history, resume checks)
  text: str
  answer: str  # reference answer for the verifier (a code prompt: its tests, see scalerl_jax/rewards/code.py)
  tokens: np.ndarray  # int32[L]
  task: str = ""  # mixed tasks: "math" | "code" chooses the verifier and the per-task metrics ("": the run's task)


@dataclasses.dataclass(frozen=True)
class Sample:
  """One finished completion, as the rollout engine returns it (host numpy)."""
  prompt_id: str
  prompt_tokens: np.ndarray  # int32[L]
  tokens: np.ndarray  # int32[N] generated tokens (forced-interruption tokens included)
  logprobs: np.ndarray  # float32[N] log-prob of each token under the sampling distribution used
  versions: np.ndarray  # int32[N] policy version that produced each token (-1 for forced tokens)
  forced: np.ndarray  # bool[N] True for tokens inserted by forced interruption (no loss)
  truncated: bool  # ran out of budget without a stop token
  interrupted: bool  # the thinking budget was hit and the phrase inserted
  # MoE: int16[L + N - 1, X, k] the generator's top-k experts of every position it ran through the model (the
  # prompt's but its last from prefill, then each fed token from decode), per MoE layer X; None for a dense policy
  routes: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class RolloutGroup:
  """All G samples of one prompt, unscored (rewards come next)."""
  prompt: Prompt
  samples: tuple[Sample, ...]  # G samples, in sample-index order
  uid: int = -1  # admission number within its driver (submission order; keys the samples' random streams)


@dataclasses.dataclass(frozen=True)
class ScoredGroup:
  """The G samples of one prompt with their rewards, scored once: `success` serves both the advantages' filters
  and No-Positive-Resampling."""
  prompt: Prompt
  samples: tuple[Sample, ...]
  rewards: np.ndarray  # float32[G] on the configured reward scale
  success: np.ndarray  # bool[G] solved the item, as its verifier says (RewardBatch.success: not a partial score)
  reward_failures: int = 0  # reward calls that raised or timed out (scored with the failure reward)
  causes: tuple[Optional[str], ...] = ()  # per sample: the verifier's cause (rewards.Scored), None without one

  @property
  def pass_rate(self) -> float:
    return float(np.mean(self.success))


@dataclasses.dataclass(frozen=True)
class ScoredBatch:
  """The P scored groups of batch `index`, in data order; consumed by optimizer step `index`."""
  index: int
  groups: tuple[ScoredGroup, ...]


@dataclasses.dataclass(frozen=True)
class PackedRows:
  """A step's groups as prompt-major host arrays (row b = p * G + g), before advantages are computed."""
  prompt_ids: tuple[str, ...]  # [P]
  tokens_BT: np.ndarray  # int32 prompt + completion, right-padded with the pad id
  loss_mask_BT: np.ndarray  # float32 1 on sampled completion tokens (forced ones excluded)
  gen_logprobs_BT: np.ndarray  # float32 sampler log-probs aligned with tokens
  versions_BT: np.ndarray  # int32 policy version per token (-1 where none); host-side only (lag metrics)
  prompt_lengths_B: np.ndarray  # int32
  rewards_PG: np.ndarray  # float32
  success_PG: np.ndarray  # bool
  truncated_PG: np.ndarray  # bool
  lengths_PG: np.ndarray  # int32 completion tokens
  routes_BTXk: Optional[np.ndarray] = None  # int16 MoE: the samples' recorded experts, -1 where none (Sample.routes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainBatch:
  """Fixed-shape, padded arrays for one optimizer step (B = P*G rows, grouped prompt-major)."""
  tokens: Any  # int32[B, T]
  loss_mask: Any  # float32[B, T] 1 on completion tokens that carry loss
  gen_logprobs: Any  # float32[B, T] behaviour (sampler) log-probs, aligned with tokens
  advantages: Any  # float32[B]
  token_weights: Any  # float32[B, T] aggregation weights: loss = sum(token_weights * per_token_loss)
  sample_weights: Any  # float32[B] sequence-level aggregation weights (GSPO): loss = sum(w_b * seq_loss_b)
  prompt_lengths: Any = None  # int32[B] prompt tokens at the start of each row (shared-prompt trainer)
  routes: Optional[Any] = None  # int16[B, T, X, k] MoE: the generator's experts per token and MoE layer (-1: none)
  # float32[B, T] the frozen reference's / teacher's log-probs of tokens (train/reference.py), None when off
  ref_logprobs: Optional[Any] = None
  teacher_logprobs: Optional[Any] = None

  # Which fields are per row [B] and which per token [B, T] (the layout every builder below follows).
  ROW_FIELDS = ("advantages", "sample_weights", "prompt_lengths")
  TOKEN_FIELDS = ("tokens", "loss_mask", "gen_logprobs", "token_weights")
  DTYPES = {"tokens": np.int32, "prompt_lengths": np.int32}  # float32 otherwise

  @classmethod
  def of(cls, rows: Any, tokens: Any, routes: Any = None) -> "TrainBatch":
    """The batch whose row fields are `rows` and whose token fields are `tokens` (shardings, specs, ...); `routes`
    for an MoE policy's recorded experts."""
    return cls(**{f: rows for f in cls.ROW_FIELDS}, **{f: tokens for f in cls.TOKEN_FIELDS}, routes=routes)

  @classmethod
  def abstract(cls, B: int, T: int, shardings: Optional["TrainBatch"] = None,
               routes_Xk: Optional[tuple[int, int]] = None) -> "TrainBatch":
    """ShapeDtypeStructs of a [B, T] batch (with `shardings`, a TrainBatch of shardings, attached); `routes_Xk`:
    (MoE layers, experts per token) of the routes field."""
    def spec(name: str):
      shape = (B,) if name in cls.ROW_FIELDS else (B, T)
      sh = None if shardings is None else getattr(shardings, name)
      return jax.ShapeDtypeStruct(shape, cls.DTYPES.get(name, np.float32), sharding=sh)
    routes = None if routes_Xk is None else jax.ShapeDtypeStruct(
        (B, T) + tuple(routes_Xk), np.int16, sharding=None if shardings is None else shardings.routes)
    return cls(**{f: spec(f) for f in cls.ROW_FIELDS + cls.TOKEN_FIELDS}, routes=routes)


@dataclasses.dataclass(frozen=True)
class StepShapes:
  """The shapes of one RL step on this process, derived once from the config (see `from_config`)."""
  P: int  # prompts per step on this process
  G: int  # samples per prompt
  L: int  # prompt width (rollout.max_prefill_len)
  N: int  # completion width (rollout.max_new_tokens)
  processes: int = 1  # every process holds P of the step's prompts

  @property
  def B(self) -> int:
    """Rows of the step on this process (host-local)."""
    return self.P * self.G

  @property
  def global_B(self) -> int:
    """Rows of the step over all processes: the leading dim of the train step's global arrays."""
    return self.B * self.processes

  @property
  def T(self) -> int:
    return self.L + self.N

  @classmethod
  def from_config(cls, cfg, process_count: int = 1) -> "StepShapes":
    return cls(P=cfg.data.prompts_per_step // process_count, G=cfg.data.samples_per_prompt,
               L=cfg.rollout.max_prefill_len, N=cfg.rollout.max_new_tokens, processes=process_count)


@dataclasses.dataclass(frozen=True)
class StepRecord:
  """What one optimizer step leaves to be logged; its device metrics are read one step late, so the host never
  waits for the step it just dispatched."""
  step: int  # the optimizer step (its params become version step + 1)
  device_metrics: Any  # dict of device scalars (sums from rl.policy_loss, grad/update norms)
  host_metrics: dict  # already-final host numbers, keyed `group/name`
  train_tokens_per_s: float
  step_s: float  # wall time of the step, trainer wait included
  wait_s: float  # of which the trainer waited for its batch


# ---- what crosses a process boundary or the disk (run/exchange.py, run/generator.py, run/job.py) ------------------
@dataclasses.dataclass(frozen=True)
class StartMsg:
  """The lead trainer -> each generator process, once, after the initial weights: where the run starts."""
  step: int  # the first step (the checkpoint's on a resume)
  npr: dict  # NPR state (NPRState.state_dict)
  data_state: Optional[dict] = None  # this generator's prompt-stream state from the checkpoint (None: a fresh run)
  reward_state: Optional[dict] = None  # its reward totals from the checkpoint (None: start at zero)


@dataclasses.dataclass(frozen=True)
class BatchMsg:
  """A generator process -> every trainer, per step: its share of batch `step` and what a checkpoint and the logs
  need from it."""
  groups: tuple[ScoredGroup, ...]  # its groups of the batch, in data order
  data_state: dict  # its prompt-stream state before the next batch (what a checkpoint after this step stores)
  data_metrics: dict  # data/... counters of its stream
  reward_metrics: dict  # reward/... counters of its scoring
  reward_state: dict  # its reward totals (RewardRunner.state)
  stats: dict  # its GeneratorStats as a dict
  weight_recv_s: float  # seconds its latest weight transfer took, measured where it ended


@dataclasses.dataclass(frozen=True)
class ControlMsg:
  """The lead trainer -> each generator process after step `step`: the NPR record every process makes, and whether
  version step + 1 is published (then its weights follow)."""
  step: int
  prompt_ids: tuple[str, ...]  # [P] the step's prompts, in batch order
  pass_rates: tuple[float, ...]  # [P]
  publishes: bool


@dataclasses.dataclass(frozen=True)
class RunMeta:
  """A checkpoint's metadata beside the TrainState: what a resume needs to continue the same data order and
  compute count. Written as JSON by `to_json`; read back by `from_json`, which alone knows older layouts."""
  step: int  # optimizer steps taken (= the policy version)
  seed: int
  data_states: list  # every prompt-reading process's stream state before batch `step`, in process order
  npr: dict
  compute: dict  # ComputeMeter.state
  fingerprint: dict  # config_fingerprint: what a resume must not change
  rewards: Optional[dict] = None  # this (main) process's reward totals
  reward_states: Optional[list] = None  # every scoring process's totals (None in one process: `rewards`)
  last_eval_step: int = -1
  summary: dict = dataclasses.field(default_factory=dict)  # numbers and strings of the run's summary so far
  # lora.rank > 0: the checkpoint holds the adapters alone; the frozen base they were trained on, by its source
  # (model.pretrained, the warm start or the seed's init) and its params_checksum, which a resume must match
  base: Optional[dict] = None

  def to_json(self) -> dict:
    return {"step": self.step, "version": self.step, "seed": self.seed, "data_states": self.data_states,
            "npr": self.npr, "compute": self.compute, "rewards": self.rewards, "reward_states": self.reward_states,
            "last_eval_step": self.last_eval_step, "fingerprint": self.fingerprint, "summary": self.summary,
            "base": self.base}

  @classmethod
  def from_json(cls, meta: dict) -> "RunMeta":
    """The record of a checkpoint's JSON metadata, from any layout this code ever wrote."""
    # remove after 2027-06: checkpoints written before per-process data states hold one state under "data"
    data_states = meta.get("data_states") or [meta["data"]]
    return cls(step=int(meta["step"]), seed=meta.get("seed", 0), data_states=list(data_states), npr=meta["npr"],
               compute=meta["compute"], fingerprint=meta.get("fingerprint", {}),
               # remove after 2027-06: checkpoints of one process held only "rewards", without "reward_states"
               rewards=meta.get("rewards"), reward_states=meta.get("reward_states"),
               last_eval_step=meta.get("last_eval_step", -1), summary=meta.get("summary", {}),
               base=meta.get("base"))
