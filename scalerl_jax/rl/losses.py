"""Policy losses as settings of one importance-weighted surrogate family (paper §3.2, our §4-5).

By default every loss uses the generator's per-token log-probabilities recorded at sampling time as the behaviour
policy, rho[b,t] = exp(clamp(log pi_theta - log pi_gen, -c, c)); nothing recomputes an "old" policy, so rho absorbs
both staleness and sampler/trainer kernel mismatch (paper §4). loss.behavior=trainer makes the behaviour the
trainer's own pre-update log-probs (rho = exp(log pi_theta - sg(log pi_theta)), value 1), and loss.mismatch adds a
stop-gradient correction factor f on each token's (gspo: sequence's) loss for the sampler-trainer gap: mismatch.py.
A = advantages[b] (one per sample). sg = stop-gradient.

  loss.name   family          per-token loss l[b,t] (minimised)                     settings
  cispo       truncated IS    -sg(min(rho, eps_max)) * A * log pi_theta             eps_max (absolute cap)
  reinforce   truncated IS    same as cispo (PipelineRL's form)                     eps_max
  grpo, ppo   clipped         -min(rho A, clip(rho, 1-eps, 1+eps) A)                eps = eps_low both sides
  dapo        clipped         -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)       eps_low, eps_high
  gspo        sequence clip   -min(s A, clip(s, 1-e_lo, 1+e_hi) A),                 gspo_eps_low, gspo_eps_high
                              s_b = exp(mean_t (log pi_theta - log pi_gen))
  clipped family, optional dual clip (loss.dual_clip = c > 1): for A < 0 the objective is max(min(...), c A).
A KL term to a frozen reference policy (loss.kl_coef > 0: a loss term or a per-token reward penalty, estimators
k1/k2/k3) and on-policy distillation from a teacher (loss.distill_teacher: A[b,t] from the per-token reverse KL) are
in reference.py; both are off by default (as in ScaleRL and DAPO, which have no KL term). With a per-token advantage
A[b,t] (reward-mode KL, distillation) the token losses above read A[b,t] for A.

The loss name picks the surrogate only; advantages (loss.adv_norm), aggregation (loss.aggregation) and filters are
separate keys. So grpo and ppo are the same surrogate; GRPO the recipe is
  loss.name=grpo loss.adv_norm=prompt loss.aggregation=sample
and Dr.GRPO (Liu et al. 2025, 2503.20783: no std normalisation, no 1/|y| length normalisation) is
  loss.name=grpo loss.adv_norm=none loss.aggregation=seq_mean_token_sum
which is Dr.GRPO's (1/G) sum_i sum_t times its constant normaliser L_max (TRL's dr_grpo divides by
B * max_completion_length): a constant factor, i.e. a learning-rate rescaling. loss.aggregation=token is the
other common reading (verl). DAPO the recipe is loss.name=dapo loss.adv_norm=prompt loss.aggregation=prompt
loss.length_penalty=true; ScaleRL is the default (cispo, batch, prompt, zero-variance filter).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import LossConfig
from scalerl_jax.rl import diagnostics as metrics_lib
from scalerl_jax.rl import mismatch as mismatch_lib
from scalerl_jax.rl import reference as reference_lib
from scalerl_jax.types import TrainBatch


def log_ratio(logp_BT, gen_logp_BT, clamp: float):
  """log rho = clip(log pi_theta - log pi_gen, -c, c): clamped BEFORE exp so rho is always finite."""
  return jnp.clip(logp_BT - gen_logp_BT, -clamp, clamp)


def truncated_is_loss(logp_BT, log_ratio_BT, adv_B1, cap: float):
  """CISPO / truncated-IS REINFORCE; returns (per-token loss, capped indicator).

      l = -sg(min(rho, eps_max)) * A * log pi_theta        grad = -min(rho, eps_max) * A * grad log pi_theta

  ScaleRL's form (v1 Eq. 4): eps_max is an ABSOLUTE cap on rho and there is no lower bound (weight in [0, eps_max])
  and no gradient through the weight. Departs from MiniMax-M1's CISPO, which clips to [1 - eps_low, 1 + eps_high]
  (eps_high undisclosed), and from PipelineRL's code, which caps at 1 + eps_high; PipelineRL's paper caps at 5.
  With the same cap `reinforce` and `cispo` are the same function (ScaleRL itself calls CISPO "truncated-IS
  REINFORCE"); both names are kept so runs carry their source's label. Beware TRL's trap: its CISPO caps at
  1 + epsilon_high = 1.2 when epsilon_high is unset; here the cap is loss.eps_max (default 4).
  """
  rho_BT = jnp.exp(log_ratio_BT)
  w_BT = jax.lax.stop_gradient(jnp.minimum(rho_BT, cap))
  return -w_BT * adv_B1 * logp_BT, rho_BT > cap


def clipped_surrogate_loss(log_ratio_BT, adv_B1, eps_low: float, eps_high: float, dual_clip=None):
  """PPO / GRPO / DAPO clipped surrogate; returns (per-token loss, upper-clipped, lower-clipped, dual-clipped).

      J = min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A);  with dual clip c and A < 0: J = max(J, c A);  l = -J

  A token is "upper-clipped" when A > 0 and rho > 1 + eps_high, "lower-clipped" when A < 0 and rho < 1 - eps_low
  (its gradient is zero: the tokens CISPO keeps), "dual-clipped" when A < 0 and rho > c. PPO (Schulman 2017) and
  GRPO (DeepSeekMath) use eps_low = eps_high = 0.2; DAPO's clip-higher uses 0.2 / 0.28; dual clip is Ye et al.
  2020. Departs from PPO/GRPO in the denominator of rho: the generator's recorded log-probs, not pi_theta_old
  recomputed by the trainer, and from GRPO in having no KL term.
  """
  rho_BT = jnp.exp(log_ratio_BT)
  clipped_BT = jnp.clip(rho_BT, 1.0 - eps_low, 1.0 + eps_high)
  obj_BT = jnp.minimum(rho_BT * adv_B1, clipped_BT * adv_B1)
  upper_BT = (adv_B1 > 0) & (rho_BT > 1.0 + eps_high)
  lower_BT = (adv_B1 < 0) & (rho_BT < 1.0 - eps_low)
  if dual_clip is None:
    dual_BT = jnp.zeros_like(upper_BT)
  else:
    obj_BT = jnp.where(adv_B1 < 0, jnp.maximum(obj_BT, dual_clip * adv_B1), obj_BT)
    dual_BT = (adv_B1 < 0) & (rho_BT > dual_clip)
  return -obj_BT, upper_BT, lower_BT, dual_BT


def gspo_sequence_loss(log_ratio_BT, mask_BT, adv_B, eps_low: float, eps_high: float, clamp: float):
  """GSPO's sequence-level clipped loss; returns (per-sequence loss, s_B, upper-clipped_B, lower-clipped_B).

      s_b = exp(clamp(sum_t m log rho / |y_b|, -c, c)),   l_b = -min(s_b A_b, clip(s_b, 1 - e_lo, 1 + e_hi) A_b)

  The length-normalised ratio of the GSPO paper (2507.18071); ScaleRL's text omits the 1/|y| exponent but its
  1e-3 clip scale only makes sense with it (paper ambiguity 17.13). Weighted by sample_weights w_b = sum_t w[b,t],
  autodiff gives d l_b / d log pi_t = -(w_b / |y_b|) s_b A_b when unclipped: exactly the token gradient of
  GSPO-token's stop-gradient trick s_{b,t} = sg(s_b) pi_t / sg(pi_t) with per-token weight w[b,t] = w_b / |y_b|
  (tests check this). Departs from the paper's clip ranges (3e-4 / 4e-4): ScaleRL found 1e-3 scale better and
  uses lower 3e-3 / upper 5e-3 (our defaults); the ratio's denominator is the generator's log-probs.
  """
  m_BT = jnp.asarray(mask_BT, jnp.float32)
  len_B = jnp.sum(m_BT, axis=1)
  mean_log_ratio_B = jnp.sum(m_BT * log_ratio_BT, axis=1) / jnp.maximum(len_B, 1.0)
  s_B = jnp.exp(jnp.clip(mean_log_ratio_B, -clamp, clamp))
  clipped_B = jnp.clip(s_B, 1.0 - eps_low, 1.0 + eps_high)
  obj_B = jnp.minimum(s_B * adv_B, clipped_B * adv_B)
  upper_B = (adv_B > 0) & (s_B > 1.0 + eps_high)
  lower_B = (adv_B < 0) & (s_B < 1.0 - eps_low)
  return -obj_B, s_B, upper_B, lower_B


def policy_loss(logp_BT, batch: TrainBatch, cfg: LossConfig):
  """The loss of one (micro-)batch and its metric sums: `loss, metrics = policy_loss(logp_BT, batch, cfg)`.

      token losses:  loss = sum_{b,t} token_weights[b,t] * f[b,t] * l[b,t]
      gspo:          loss = sum_b sample_weights[b] * f_b * l_b
      loss.kl_coef > 0, kl_mode=loss:  loss += kl_coef * sum_{b,t} token_weights[b,t] * k[b,t]   (reference.py)
  with f the mismatch correction factor (mismatch.py; 1, and not multiplied in at all, with loss.mismatch=none).
  The reference's and teacher's log-probs come in `batch.ref_logprobs` / `batch.teacher_logprobs` (None when off).

  `logp_BT` are the trainer's log-probs of `batch.tokens` (aligned as in `scalerl_jax.types`). The weights from
  `prepare` are normalised by whole-step counts, so for any split of the rows into micro-batches the losses add
  up to the full-batch loss and so do the metric sums (combine them with `accumulate_metrics`, turn them into
  means with `finalize_metrics`). Positions with loss_mask 0 are replaced by 0 before any arithmetic, so padding
  can hold any value (even NaN) without touching the loss or its gradient. `cfg` is static under jit.
  """
  mask_BT = jnp.asarray(batch.loss_mask) > 0
  token_w_BT = jnp.asarray(batch.token_weights, jnp.float32)
  sample_w_B = jnp.asarray(batch.sample_weights, jnp.float32)
  logp_BT = jnp.where(mask_BT, logp_BT.astype(jnp.float32), 0.0)
  gen_BT = jnp.where(mask_BT, jnp.asarray(batch.gen_logprobs, jnp.float32), 0.0)
  adv_B = jnp.asarray(batch.advantages, jnp.float32)
  log_w_BT = log_ratio(logp_BT, gen_BT, cfg.log_ratio_clamp)  # log w, trainer over sampler: the sampler's rho
  if cfg.behavior == "trainer":  # the pre-update params' log-probs ARE sg(logp) in this one-update trainer
    lr_BT = log_ratio(logp_BT, jax.lax.stop_gradient(logp_BT), cfg.log_ratio_clamp)
  else:
    lr_BT = log_w_BT
  live_BT = token_w_BT > 0
  live_B = sample_w_B > 0
  masked = lambda x_BT: None if x_BT is None else jnp.where(mask_BT, jnp.asarray(x_BT, jnp.float32), 0.0)
  ref_BT, teacher_BT = masked(batch.ref_logprobs), masked(batch.teacher_logprobs)
  adv_BT, extra = reference_lib.token_advantages(adv_B, logp_BT, live_BT, cfg, ref_BT, teacher_BT)
  factor = mismatch_lib.correction_factor(log_w_BT, mask_BT, cfg, per_sequence=cfg.name == "gspo")
  factor_BT = factor if factor is None or cfg.name != "gspo" else jnp.broadcast_to(factor[:, None], mask_BT.shape)
  corrected = (lambda w: w) if factor is None else (lambda w: w * factor)  # weights times f

  clip_live = dual = None  # metrics defaults: clips counted over loss tokens, no dual clip
  if cfg.name in ("cispo", "reinforce"):
    l_BT, upper = truncated_is_loss(logp_BT, lr_BT, adv_BT, cfg.eps_max)
    lower = None  # no lower bound on the weight
    loss = jnp.sum(corrected(token_w_BT) * l_BT)
  elif cfg.name == "gspo":
    l_B, _, upper, lower = gspo_sequence_loss(lr_BT, mask_BT, adv_B, cfg.gspo_eps_low, cfg.gspo_eps_high,
                                              cfg.log_ratio_clamp)
    clip_live = live_B  # GSPO clips whole sequences
    loss = jnp.sum(corrected(sample_w_B) * l_B)
  else:
    eps_high = cfg.eps_high if cfg.name == "dapo" else cfg.eps_low
    l_BT, upper, lower, dual = clipped_surrogate_loss(lr_BT, adv_BT, cfg.eps_low, eps_high, cfg.dual_clip)
    dual = None if cfg.dual_clip is None else dual
    loss = jnp.sum(corrected(token_w_BT) * l_BT)
  if cfg.kl_coef > 0 and cfg.kl_mode == "loss":
    kl_term, extra["kl_sum"] = reference_lib.kl_loss(logp_BT, ref_BT, token_w_BT, cfg)
    loss = loss + kl_term

  metrics = metrics_lib.loss_metrics(
      loss=loss, logp_BT=logp_BT, gen_logp_BT=gen_BT, log_ratio_BT=log_w_BT, live_BT=live_BT, live_B=live_B,
      clip_upper=upper, mask_BT=mask_BT, cfg=cfg, clip_lower=lower, clip_live=clip_live, dual_clip=dual,
      factor_BT=factor_BT)
  return loss, {**metrics, **extra}
