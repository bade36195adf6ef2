"""From scored groups to the loss inputs of a TrainBatch: advantages, token weights, sample weights.

    rewards_PG ─► + length penalty (correct samples) ─► truncated samples' reward (loss.truncated_reward)
      ─► valid = not truncated ─► group stats over valid samples
      ─► keep = non-zero-variance groups with loss tokens ─► centred (or leave-one-out) advantages
      ─► prompt | batch | no normalization ─► aggregation weights over the kept samples (global counts)

Runs once per optimizer step on the whole step batch (host numpy or inside jit with `cfg` static), before the
batch is cut into micro-batches.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from scalerl_jax.config import LossConfig
from scalerl_jax.rl import advantages as adv_lib
from scalerl_jax.rl import aggregation, filters


class Prepared(NamedTuple):
  advantages: Any  # float32[B] 0 for samples outside the loss
  token_weights: Any  # float32[B, T] loss = sum(token_weights * per_token_loss)
  sample_weights: Any  # float32[B] sum_t token_weights; GSPO's sequence weights
  metrics: dict  # float32 scalars, final values for the whole step (no further division needed)


def prepare(rewards_PG, loss_mask_BT, truncated_PG, cfg: LossConfig, *, lengths_PG=None,
            correct_PG=None) -> Prepared:
  """Advantages and aggregation weights for one step batch of P prompts x G samples (rows prompt-major).

  Inputs: `rewards_PG` float rewards (0/1 or +-1, any floats work); `loss_mask_BT` tokens that may carry loss
  (completion tokens not forced by interruption, see `filters.loss_token_mask`); `truncated_PG` bool;
  `lengths_PG` completion lengths and `correct_PG` bool, needed only when `cfg.length_penalty`.

  Steps, in this order:
    1. r' = r + correct * clip((L_max - |y|)/L_cache - 1, -1, 0)           if loss.length_penalty
       r' = loss.truncated_reward where truncated                          if set (not with exclude_truncated)
    2. valid = not truncated                                               if loss.exclude_truncated
    3. per group over valid samples: n_p, mean, std, zero-variance (exact equality of r')
    4. keep_p = n_p > 0, T_p > 0, and not zero-variance                    if loss.zero_variance_filter
    5. A = r' - mean_p (leave-one-out: n/(n-1) times that), divided by the group std (prompt), by the std over
       in-loss samples (batch, i.e. after filtering), or by 1 (none)
    6. in_loss = valid and keep_p; advantages = A * in_loss; weights from `aggregation.aggregation_weights`.
  Shapes never change: filtered rows get zero weights. If every group is filtered every weight is 0, so the loss
  is exactly 0 (not NaN).

  Returns `Prepared(advantages_B, token_weights_BT, sample_weights_B, metrics)`; metrics are whole-batch values:
  reward_mean (after shaping), length_penalty_mean, zero_variance_frac (groups whose valid rewards are all equal,
  over all P), kept_prompts, samples_in_loss, tokens_in_loss, truncated_frac, adv_mean/std/min/max/abs_mean over
  in-loss samples, adv_scale (the batch-normalization divisor, 1 for prompt/none).
  """
  r_PG = jnp.asarray(rewards_PG, jnp.float32)
  P, G = r_PG.shape
  mask_BT = jnp.asarray(loss_mask_BT, jnp.float32)
  if mask_BT.shape[0] != P * G:
    raise ValueError(f"loss_mask_BT has {mask_BT.shape[0]} rows; rewards_PG says P*G = {P}*{G} = {P * G}")
  truncated_PG = jnp.asarray(truncated_PG, bool)

  penalty_PG = jnp.zeros_like(r_PG)
  if cfg.length_penalty:
    if lengths_PG is None or correct_PG is None:
      raise ValueError("loss.length_penalty: prepare() needs lengths_PG and correct_PG")
    penalty_PG = filters.length_penalty(lengths_PG, correct_PG, cfg.length_penalty_max, cfg.length_penalty_cache)
  shaped_PG = filters.truncated_rewards(r_PG + penalty_PG, truncated_PG, cfg.truncated_reward)

  valid_PG = filters.valid_samples(truncated_PG, cfg.exclude_truncated)
  n_P, mean_P, std_P, zero_var_P = filters.group_stats(shaped_PG, valid_PG)
  len_PG = jnp.sum(mask_BT, axis=1).reshape(P, G)
  tokens_P = jnp.sum(jnp.where(valid_PG, len_PG, 0.0), axis=1)
  keep_P = filters.kept_groups(n_P, zero_var_P, tokens_P, cfg.zero_variance_filter)
  in_loss_PG = valid_PG & keep_P[:, None]

  centred_PG = adv_lib.centred_rewards(shaped_PG, valid_PG, mean_P, n_P, cfg.leave_one_out)
  adv_PG, scale = adv_lib.normalize_advantages(centred_PG, std_P, in_loss_PG, cfg.adv_norm, cfg.adv_eps)
  adv_PG = jnp.where(in_loss_PG, adv_PG, 0.0)

  token_weights_BT, sample_weights_B, counts = aggregation.aggregation_weights(
      mask_BT, in_loss_PG.reshape(-1), G, cfg.aggregation)

  n_in = jnp.maximum(jnp.sum(in_loss_PG), 1).astype(jnp.float32)
  adv_mean = jnp.sum(adv_PG) / n_in
  any_in = jnp.any(in_loss_PG)
  metrics = {
      "reward_mean": jnp.mean(shaped_PG),
      "length_penalty_mean": jnp.mean(penalty_PG),
      "zero_variance_frac": jnp.mean(zero_var_P.astype(jnp.float32)),
      "truncated_frac": jnp.mean(truncated_PG.astype(jnp.float32)),
      "adv_mean": adv_mean,
      "adv_std": jnp.sqrt(jnp.sum(jnp.where(in_loss_PG, (adv_PG - adv_mean)**2, 0.0)) / n_in),
      "adv_min": jnp.where(any_in, jnp.min(jnp.where(in_loss_PG, adv_PG, jnp.inf)), 0.0),
      "adv_max": jnp.where(any_in, jnp.max(jnp.where(in_loss_PG, adv_PG, -jnp.inf)), 0.0),
      "adv_abs_mean": jnp.sum(jnp.abs(adv_PG)) / n_in,
      "adv_scale": jnp.asarray(scale, jnp.float32),
      **counts,
  }
  return Prepared(adv_PG.reshape(-1), token_weights_BT, sample_weights_B, metrics)

