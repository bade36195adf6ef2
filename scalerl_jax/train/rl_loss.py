"""The RL loss the train step runs: the policy's log-probs of a TrainBatch's tokens (at the sampling temperature)
fed to the configured policy loss from `scalerl_jax.rl`. Everything that is a function of params lives here; the
pure objective of arrays lives in `rl/`. The MoE auxiliary losses and a KL reference join this file.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax.numpy as jnp

from scalerl_jax import rl, types
from scalerl_jax.config import LossConfig
from scalerl_jax.model import Policy, completion_logprobs, token_logprobs


@dataclasses.dataclass(frozen=True)
class PromptLayout:
  """How the trainer may compute each prompt once per group: rows come in groups of `group_size` sharing a prompt
  of at most `prompt_width` tokens, followed by at most `completion_width` completion tokens."""
  group_size: int
  prompt_width: int
  completion_width: int

  def trained_tokens(self, rows: int) -> int:
    """Token positions the model runs through for `rows` rows: each prompt once per group, every completion."""
    return rows // self.group_size * self.prompt_width + rows * self.completion_width


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
                          ref_logprobs=take(batch.ref_logprobs))


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
