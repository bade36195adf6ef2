"""Loss aggregation as global per-token weights (paper §3.2, our §6), chosen by `loss.aggregation`.

Every aggregation is a weighted sum  loss = sum_{b,t} w[b,t] * l[b,t]  whose weights are normalised by counts over
the WHOLE step batch. So the loss of a micro-batch (any subset of rows) is its share of the full-batch loss, the
sum over micro-batches is the full-batch loss, and padding (w = 0) changes nothing.

With m[b,t] the loss mask of samples that carry loss, |y_b| = sum_t m[b,t], T_p = sum_{b in p} |y_b|,
P_kept = #{p : T_p > 0}, N_s = #{b : |y_b| > 0}, N_tok = sum_{b,t} m[b,t]:

  name                 w[b,t] (for m[b,t] = 1)    formula                                   source
  prompt               1 / (P_kept * T_p)          (1/P) sum_p (1/T_p) sum_{i,t} l           ScaleRL, DAPO as written
  sample               1 / (N_s * |y_b|)           (1/(PG)) sum_{p,i} (1/|y_i|) sum_t l      GRPO
  token                1 / N_tok                   (1/sum_p T_p) sum_{p,i,t} l               verl token-mean
  seq_mean_token_sum   1 / N_s                     (1/(PG)) sum_{p,i} sum_t l                verl, Dr.GRPO (x L_max)

Departures: counts exclude filtered groups and excluded (truncated) samples, so "P" and "PG" above are the kept
numbers, not the sampled ones; a sample with no loss token is not counted in N_s.
"""

from __future__ import annotations

import jax.numpy as jnp

from scalerl_jax.config import Aggregation


def aggregation_weights(loss_mask_BT, in_loss_B, group_size: int, aggregation: Aggregation):
  """Per-token and per-sequence weights of one aggregation; returns (token_weights_BT, sample_weights_B, counts).

  `loss_mask_BT` marks tokens that may carry loss, `in_loss_B` the samples that do (valid samples of kept
  groups); rows are prompt-major groups of `group_size`. `sample_weights_B = sum_t token_weights_BT` is the total
  weight of a sequence, so a sequence-level loss (GSPO) weighted by it equals the token-level form whose per-token
  value is the sequence's value. `counts` holds P_kept, N_s and N_tok as float32 scalars. When nothing carries
  loss every weight is 0 (never NaN).
  """
  m_BT = jnp.asarray(loss_mask_BT, jnp.float32) * jnp.asarray(in_loss_B, jnp.float32)[:, None]
  len_B = jnp.sum(m_BT, axis=1)
  tokens_P = jnp.sum(len_B.reshape(-1, group_size), axis=1)
  tokens_B = jnp.repeat(tokens_P, group_size)
  kept_prompts = jnp.sum(tokens_P > 0).astype(jnp.float32)
  samples = jnp.sum(len_B > 0).astype(jnp.float32)
  tokens = jnp.sum(len_B)
  if aggregation == "prompt":
    row_B = 1.0 / (jnp.maximum(kept_prompts, 1.0) * jnp.maximum(tokens_B, 1.0))
  elif aggregation == "sample":
    row_B = 1.0 / (jnp.maximum(samples, 1.0) * jnp.maximum(len_B, 1.0))
  elif aggregation == "token":
    row_B = jnp.full_like(len_B, 1.0) / jnp.maximum(tokens, 1.0)
  else:  # seq_mean_token_sum
    row_B = jnp.full_like(len_B, 1.0) / jnp.maximum(samples, 1.0)
  token_weights_BT = m_BT * row_B[:, None]
  sample_weights_B = jnp.sum(token_weights_BT, axis=1)
  counts = {"kept_prompts": kept_prompts, "samples_in_loss": samples, "tokens_in_loss": tokens}
  return token_weights_BT, sample_weights_B, counts


def aggregate(values_BT, token_weights_BT):
  """The aggregated loss of per-token values: sum_{b,t} w[b,t] * l[b,t] (additive over rows)."""
  return jnp.sum(jnp.asarray(token_weights_BT, jnp.float32) * values_BT)
