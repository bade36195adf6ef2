"""Typed, frozen records at the stage boundaries of the data flow.

    prompts (data) ──PromptBatch──► rollout engine ──Rollout(s)──► rewards/filters ──TrainBatch──► train step

Shape legend (used in field comments and in array names across the package):
  P prompts in a step, G samples per prompt, B = P*G sample rows, T tokens per row (prompt + completion,
  right-padded), L prompt length, N new tokens.

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
  answer: str  # reference answer for the verifier
  tokens: np.ndarray  # int32[L]


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
  text: str = ""  # decoded completion (filled by the caller that owns the tokenizer)


@dataclasses.dataclass(frozen=True)
class Group:
  """The G samples of one prompt, scored."""
  prompt: Prompt
  samples: tuple[Sample, ...]
  rewards: np.ndarray  # float32[G]
  reward_failures: int = 0  # reward calls that raised or timed out (scored with the failure reward)


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
  versions: Any  # int32[B, T] policy version per token (-1 where none)
  ref_logprobs: Optional[Any] = None  # float32[B, T], only when a KL penalty is on
  prompt_lengths: Optional[Any] = None  # int32[B] prompt tokens at the start of each row (shared-prompt trainer)
