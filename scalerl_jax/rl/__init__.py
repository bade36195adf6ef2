"""The RL objective: advantages, filters, aggregation, policy losses, metrics — pure functions of arrays.

No model call happens here. Two entry points, both chosen by `LossConfig` (one key per choice; the names are the
config's Literal types, checked when the config is loaded or built, never again here):

  prepare(rewards_PG, loss_mask_BT, truncated_PG, cfg, *, lengths_PG=None, correct_PG=None)
      -> Prepared(advantages_B, token_weights_BT, sample_weights_B, metrics)
      once per step on the whole batch: length penalty, truncation exclusion, zero-variance filter, advantage
      normalisation, aggregation weights normalised by whole-step counts.
  policy_loss(logp_BT, batch, cfg) -> (loss, metric_sums)
      once per micro-batch inside the jitted step; losses and metric sums add up over micro-batches exactly.
      Combine sums with `accumulate_metrics` (from `empty_metrics()`), finish with `finalize_metrics` on the host.

  key                       choices (default first)                  what it selects
  loss.name                 cispo | reinforce | grpo | ppo | dapo | gspo   surrogate (losses.py)
  loss.aggregation          prompt | sample | token | seq_mean_token_sum   normaliser (aggregation.py)
  loss.adv_norm             batch | prompt | none                    advantage scale (advantages.py)
  loss.zero_variance_filter / exclude_truncated / length_penalty / leave_one_out   filters, shaping
  loss.behavior             sampler | trainer                        the ratio's behaviour policy (mismatch.py)
  loss.mismatch             none | tis | mask | seq_mask             sampler-trainer correction (mismatch.py)
  loss.kl_coef / kl_estimator (k3 | k1 | k2) / kl_mode (loss | reward) / reference    KL to a frozen reference
  loss.distill_teacher / distill_coef / distill_task_reward          on-policy distillation (reference.py)

Recipes as keys:
  ScaleRL   defaults: cispo, adv_norm=batch, aggregation=prompt, zero_variance_filter; loss.exclude_truncated=true
            as in configs/scalerl_8b.yaml (the CPU default keeps truncated samples, see cpu_default.yaml)
  GRPO      loss.name=grpo loss.adv_norm=prompt loss.aggregation=sample
  Dr.GRPO   loss.name=grpo loss.adv_norm=none loss.aggregation=seq_mean_token_sum   (see losses.py: equal to
            Dr.GRPO's constant-normaliser loss up to the constant L_max; aggregation=token is verl's reading)
  DAPO      loss.name=dapo loss.adv_norm=prompt loss.aggregation=prompt loss.length_penalty=true
  GSPO      loss.name=gspo loss.adv_norm=prompt loss.aggregation=sample
  PPO clip  loss.name=ppo (same surrogate as grpo)
No-Positive-Resampling is a data-side filter and lives in `scalerl_jax.data`.
"""

from scalerl_jax.rl.advantages import centred_rewards, normalize_advantages
from scalerl_jax.rl.aggregation import aggregate, aggregation_weights
from scalerl_jax.rl.filters import group_stats, kept_groups, length_penalty, loss_token_mask, valid_samples
from scalerl_jax.rl.losses import (clipped_surrogate_loss, gspo_sequence_loss, log_ratio, policy_loss,
                                   truncated_is_loss)
from scalerl_jax.rl.diagnostics import (METRIC_KEYS, OPTIONAL_METRIC_KEYS, accumulate_metrics, empty_metrics,
                                       finalize_metrics, loss_metrics)
from scalerl_jax.rl.mismatch import correction_factor, geometric_mean_ratio, sequence_log_ratio
from scalerl_jax.rl.prepare import Prepared, prepare
from scalerl_jax.rl.reference import kl_estimate, kl_loss, token_advantages

__all__ = [
    "METRIC_KEYS", "OPTIONAL_METRIC_KEYS", "Prepared", "accumulate_metrics", "aggregate", "aggregation_weights",
    "centred_rewards", "clipped_surrogate_loss", "correction_factor", "empty_metrics", "finalize_metrics",
    "geometric_mean_ratio", "group_stats", "gspo_sequence_loss", "kept_groups", "kl_estimate", "kl_loss",
    "length_penalty", "log_ratio", "loss_metrics", "loss_token_mask", "normalize_advantages", "policy_loss", "prepare",
    "sequence_log_ratio", "token_advantages", "truncated_is_loss", "valid_samples",
]
