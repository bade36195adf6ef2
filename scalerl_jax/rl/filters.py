"""Reward shaping and sample/group filters: length penalty, truncated samples' reward, truncation exclusion,
zero-variance filter.

All functions are pure and shape-preserving: a filtered sample or group is never dropped from the arrays, it gets
a False in a mask (and later zero loss weight), so every batch keeps its fixed shapes under jit.
Shape letters as in `scalerl_jax.types`: P prompts, G samples per prompt, B = P*G rows, T tokens per row.
"""

from __future__ import annotations

import jax.numpy as jnp


def length_penalty(lengths_PG, correct_PG, max_len: int, cache: int):
  """DAPO's soft overlong punishment, added to correct samples only (the paper's "loo-lp", v1 Eq. 9).

      R_len(y) = clip((L_max - |y|) / L_cache - 1, -1, 0)          (0 up to L_max - L_cache, -1 from L_max on)
      penalty  = R_len(y) if y is correct else 0

  `lengths_PG` is the completion length |y| in tokens as the caller counts it (forced-interruption tokens
  included, prompt excluded). Departs from DAPO (2503.14476), which adds R_len to every sample: ScaleRL adds it
  only to correct traces, so a wrong-and-long answer is not punished twice.
  """
  lengths_PG = jnp.asarray(lengths_PG, jnp.float32)
  r_len_PG = jnp.clip((max_len - lengths_PG) / cache - 1.0, -1.0, 0.0)
  return jnp.where(jnp.asarray(correct_PG, bool), r_len_PG, 0.0)


def truncated_rewards(rewards_PG, truncated_PG, value):
  """r with every truncated sample's reward set to `value` (loss.truncated_reward; None: r unchanged).

  A truncated completion has no final answer of its own (the budget cut it), whatever a verifier's fallback reads
  in its last words; scored `value` (0: a failure) it stays in the loss, so a policy under negative advantages
  cannot escape them by running into the budget, as it can when truncated samples are excluded.
  """
  if value is None:
    return rewards_PG
  return jnp.where(jnp.asarray(truncated_PG, bool), jnp.float32(value), rewards_PG)


def valid_samples(truncated_PG, exclude_truncated: bool):
  """Samples that take part in the step at all: `not truncated` when `exclude_truncated`, else every sample.

  An excluded sample is treated as if it had never been drawn: it carries no loss and is left out of its group's
  mean, std and zero-variance test (see `group_stats`). This is our reading of the paper's "effective batch size
  (after excluding truncated samples)" (v1 A.15); the paper does not say how the group baseline treats them.
  """
  truncated_PG = jnp.asarray(truncated_PG, bool)
  return ~truncated_PG if exclude_truncated else jnp.ones_like(truncated_PG)


def group_stats(rewards_PG, valid_PG):
  """Per-group count, mean, population std and zero-variance flag over the valid samples of each group.

      n_p = sum_i v_pi,  mean_p = sum_i v_pi r_pi / n_p,  std_p = sqrt(sum_i v_pi (r_pi - mean_p)^2 / n_p)
      zero_var_p = (max_i r_pi == min_i r_pi over valid i)      (exact float equality; True when n_p <= 1)

  The zero-variance test is exact equality, never a threshold on std, so 0/1 and +-1 rewards behave alike and a
  length-penalised correct sample (reward 1 - 0.25) is not "equal" to an unpenalised one. Groups with no valid
  sample report mean 0, std 0, zero_var True. std uses ddof=0 (DeepSeekMath does not say; TRL uses ddof=1).
  """
  r_PG = jnp.asarray(rewards_PG, jnp.float32)
  v_PG = jnp.asarray(valid_PG, bool)
  n_P = jnp.sum(v_PG, axis=1).astype(jnp.float32)
  safe_n_P = jnp.maximum(n_P, 1.0)
  mean_P = jnp.sum(jnp.where(v_PG, r_PG, 0.0), axis=1) / safe_n_P
  centred_PG = jnp.where(v_PG, r_PG - mean_P[:, None], 0.0)
  std_P = jnp.sqrt(jnp.sum(centred_PG**2, axis=1) / safe_n_P)
  hi_P = jnp.max(jnp.where(v_PG, r_PG, -jnp.inf), axis=1)
  lo_P = jnp.min(jnp.where(v_PG, r_PG, jnp.inf), axis=1)
  zero_var_P = hi_P <= lo_P  # n_p = 0 gives -inf <= inf: True
  return n_P, mean_P, std_P, zero_var_P


def kept_groups(n_P, zero_var_P, tokens_P, zero_variance_filter: bool):
  """Groups that enter the loss (the "effective batch", paper §3.2 / our §8).

      keep_p = (n_p > 0) and (T_p > 0) and (not zero_var_p  if zero_variance_filter)

  T_p is the number of loss tokens of the group's valid samples. A group with no valid sample or no loss token is
  always dropped (it has nothing to train on and would make the prompt average divide by zero). With the filter
  off ("loo-batch"), zero-variance groups stay in and count in the normaliser while contributing zero gradient.
  Departs from DAPO's dynamic sampling, which refills the batch: like ScaleRL we only drop.
  """
  keep_P = (n_P > 0) & (tokens_P > 0)
  if zero_variance_filter:
    keep_P = keep_P & ~zero_var_P
  return keep_P


def loss_token_mask(completion_BT, forced_BT):
  """Tokens that may carry loss: completion tokens that the model itself sampled.

      mask[b, t] = completion[b, t] and not forced[b, t]

  Forced-interruption tokens (the inserted end-of-thinking phrase) were not sampled from the policy, so they carry
  no loss and are excluded from every token count (T_p, |y|, GSPO's length normalisation). The paper does not say
  whether they are trained on; TRL's ScaleRL loop masks them too.
  """
  return (jnp.asarray(completion_BT, bool) & ~jnp.asarray(forced_BT, bool)).astype(jnp.float32)
