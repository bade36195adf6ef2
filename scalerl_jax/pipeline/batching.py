"""Scored groups -> a fixed-shape TrainBatch (host numpy), and the RL loss the train step runs on it."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import rl, types
from scalerl_jax.config import LossConfig
from scalerl_jax.data.evaluation import is_success
from scalerl_jax.model import Policy, completion_logprobs, token_logprobs


@dataclasses.dataclass(frozen=True)
class PromptLayout:
  """How the trainer may compute each prompt once per group: rows come in groups of `group_size` sharing a prompt
  of at most `prompt_width` tokens, followed by at most `completion_width` completion tokens."""
  group_size: int
  prompt_width: int
  completion_width: int


def pack_groups(groups: Sequence[types.Group], row_len: int, pad_id: int) -> dict:
  """Prompt-major rows (P*G) of prompt + completion tokens padded to `row_len`, with the per-token arrays
  aligned to `tokens` (see scalerl_jax.types), each row's prompt length, and per-sample flags as [P, G]."""
  P, G = len(groups), len(groups[0].samples)
  B = P * G
  tokens = np.full((B, row_len), pad_id, np.int32)
  mask = np.zeros((B, row_len), np.float32)
  gen_logp = np.zeros((B, row_len), np.float32)
  versions = np.full((B, row_len), -1, np.int32)
  truncated = np.zeros((P, G), bool)
  lengths = np.zeros((P, G), np.int32)
  prompt_lengths = np.zeros(B, np.int32)
  for p, group in enumerate(groups):
    if len(group.samples) != G:
      raise ValueError(f"group {p} ({group.prompt.prompt_id}) has {len(group.samples)} samples, expected {G}")
    for g, s in enumerate(group.samples):
      b, L, N = p * G + g, len(s.prompt_tokens), len(s.tokens)
      if L + N > row_len:
        raise ValueError(f"prompt {s.prompt_id}: {L} prompt + {N} completion tokens exceed the row length {row_len}")
      tokens[b, :L] = s.prompt_tokens
      tokens[b, L:L + N] = s.tokens
      mask[b, L:L + N] = ~s.forced  # forced-interruption tokens carry no loss
      gen_logp[b, L:L + N] = s.logprobs
      versions[b, L:L + N] = s.versions
      truncated[p, g], lengths[p, g], prompt_lengths[b] = s.truncated, N, L
  rewards = np.stack([np.asarray(g.rewards, np.float32) for g in groups])
  return {"tokens": tokens, "loss_mask": mask, "gen_logprobs": gen_logp, "versions": versions,
          "prompt_lengths": prompt_lengths, "truncated": truncated, "lengths": lengths, "rewards": rewards}


@functools.partial(jax.jit, static_argnames=("cfg",))
def _prepare(rewards_PG, loss_mask_BT, truncated_PG, lengths_PG, correct_PG, cfg: LossConfig):
  return rl.prepare(rewards_PG, loss_mask_BT, truncated_PG, cfg, lengths_PG=lengths_PG, correct_PG=correct_PG)


def warm_prepare(P: int, G: int, row_len: int, cfg: LossConfig) -> None:
  """Compile `rl.prepare` for this batch shape before the loop starts."""
  zeros = lambda shape, dtype: np.zeros(shape, dtype)
  jax.block_until_ready(_prepare(zeros((P, G), np.float32), zeros((P * G, row_len), np.float32),
                                 zeros((P, G), bool), zeros((P, G), np.int32), zeros((P, G), bool), cfg))


def build_train_batch(groups: Sequence[types.Group], cfg: LossConfig, row_len: int, pad_id: int,
                      reward_scale: str, layout: Optional[PromptLayout] = None) -> tuple[types.TrainBatch, dict]:
  """Advantages, filters and aggregation weights for the whole step batch (rl.prepare), then a TrainBatch.
  With a `layout` (the shared-prompt loss), every prompt and completion must fit its width."""
  packed = pack_groups(groups, row_len, pad_id)
  if layout is not None:
    for name, lengths, width in (("prompt", packed["prompt_lengths"], layout.prompt_width),
                                 ("completion", packed["lengths"].reshape(-1), layout.completion_width)):
      if lengths.max() > width:
        b = int(np.argmax(lengths))
        raise ValueError(f"prompt {groups[b // len(groups[0].samples)].prompt.prompt_id}: {lengths[b]} {name} "
                         f"tokens exceed the trainer's {name} width {width}")
  correct = is_success(packed["rewards"], reward_scale)
  prep = _prepare(packed["rewards"], packed["loss_mask"], packed["truncated"], packed["lengths"], correct, cfg)
  batch = types.TrainBatch(tokens=packed["tokens"], loss_mask=packed["loss_mask"],
                           gen_logprobs=packed["gen_logprobs"], advantages=np.asarray(prep.advantages),
                           token_weights=np.asarray(prep.token_weights), sample_weights=np.asarray(prep.sample_weights),
                           versions=packed["versions"], prompt_lengths=packed["prompt_lengths"])
  metrics = {k: float(v) for k, v in jax.device_get(prep.metrics).items()}
  metrics["pass_rate"] = float(np.mean(correct))
  return batch, metrics


def completion_view(batch: types.TrainBatch, cols_BN) -> types.TrainBatch:
  """The batch's per-token arrays read at columns `cols_BN` (each row's completion), loss off past the row."""
  T = batch.tokens.shape[1]
  inside_BN = cols_BN < T
  take = lambda x_BT: None if x_BT is None else jnp.take_along_axis(jnp.asarray(x_BT), jnp.minimum(cols_BN, T - 1),
                                                                    axis=1)
  off = lambda x_BN: jnp.where(inside_BN, x_BN, 0)
  return types.TrainBatch(tokens=take(batch.tokens), loss_mask=off(take(batch.loss_mask)),
                          gen_logprobs=take(batch.gen_logprobs), advantages=batch.advantages,
                          token_weights=off(take(batch.token_weights)), sample_weights=batch.sample_weights,
                          versions=take(batch.versions), ref_logprobs=take(batch.ref_logprobs))


def make_rl_loss(policy: Policy, cfg: LossConfig, temperature: float, layout: Optional[PromptLayout] = None):
  """loss_fn(params, micro_batch) for the train step: trainer log-probs at the sampling temperature, then the
  configured policy loss (additive over micro-batches).

  With a `layout`, each prompt runs through the model once per group (`completion_logprobs`) and the loss reads
  the batch in completion columns: the same loss and gradient (the weights are 0 on prompt tokens), with the
  model's work divided by about (prompt + completion) / (prompt / G + completion). Micro-batches must then hold
  whole groups.
  """
  t = temperature if temperature > 0 else 1.0

  def loss_fn(params, batch: types.TrainBatch):
    if layout is None:
      return rl.policy_loss(token_logprobs(policy, params, batch.tokens, temperature=t), batch, cfg)
    logp_BN, cols_BN = completion_logprobs(policy, params, batch.tokens, batch.prompt_lengths, layout.group_size,
                                           layout.prompt_width, layout.completion_width, temperature=t)
    return rl.policy_loss(logp_BN, completion_view(batch, cols_BN), cfg)

  return loss_fn
