"""Group-relative advantages with prompt-, batch- or no normalization (paper §4, §7).

Selected by `loss.adv_norm` (prompt | batch | none) and `loss.leave_one_out`. Shapes: P prompts x G samples.
"""

from __future__ import annotations

import jax.numpy as jnp

from scalerl_jax.config import AdvNorm


def centred_rewards(rewards_PG, valid_PG, mean_P, n_P, leave_one_out: bool):
  """Group-centred reward over the valid samples of each group; 0 for invalid samples.

      plain:          A_pi = r_pi - mean_g r_pg
      leave-one-out:  A_pi = r_pi - mean_{g != i} r_pg = n_p / (n_p - 1) * (r_pi - mean_g r_pg)

  Leave-one-out (RLOO, Ahmadian et al. 2024) makes the baseline independent of the sample; for n_p <= 1 it is
  defined as 0. Both forms sum to zero within a group, so the batch mean of the advantages is exactly zero.
  """
  r_PG = jnp.asarray(rewards_PG, jnp.float32)
  v_PG = jnp.asarray(valid_PG, bool)
  a_PG = jnp.where(v_PG, r_PG - mean_P[:, None], 0.0)
  if leave_one_out:
    scale_P = jnp.where(n_P > 1, n_P / jnp.maximum(n_P - 1.0, 1.0), 0.0)
    a_PG = a_PG * scale_P[:, None]
  return a_PG


def normalize_advantages(centred_PG, std_P, in_loss_PG, adv_norm: AdvNorm, eps: float):
  """Divides the centred advantages by the chosen scale; returns (advantages_PG, scale).

      prompt (GRPO):        A_pi / (std_g r_pg + eps)      std over the group's valid samples, ddof=0
      batch  (ScaleRL):     A_pi / (std_{(q,j) in loss} A_qj + eps)
      none   (Dr.GRPO):     A_pi

  The batch std is taken over the samples that carry loss: the valid samples of KEPT groups, i.e. AFTER the
  zero-variance filter when it is on (paper ambiguity 17.5; before filtering, the zero advantages of solved or
  hopeless groups would deflate the std). With the filter off it runs over every valid sample. It is the std of
  the advantages themselves (their mean is subtracted; it is zero by construction). Departures: eps is added to
  the batch std too (the paper does not say; REINFORCE++ does the same); std uses ddof=0. `scale` is the batch
  divisor (std + eps) for `batch`, 1 otherwise; it is reported as a metric. A zero divisor (zero-variance
  group, or nothing in the loss, with eps = 0) is replaced by 1: the centred advantages there are all 0 anyway.
  """
  m_PG = jnp.asarray(in_loss_PG, bool)
  if adv_norm == "prompt":
    return centred_PG / _nonzero(std_P + eps)[:, None], jnp.float32(1.0)
  if adv_norm == "batch":
    n = jnp.maximum(jnp.sum(m_PG), 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(m_PG, centred_PG, 0.0)) / n
    std = jnp.sqrt(jnp.sum(jnp.where(m_PG, (centred_PG - mean)**2, 0.0)) / n)
    scale = _nonzero(std + eps)
    return centred_PG / scale, scale
  return centred_PG, jnp.float32(1.0)


def _nonzero(x):
  return jnp.where(x > 0, x, 1.0)
