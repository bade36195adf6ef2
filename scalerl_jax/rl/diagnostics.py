"""Loss metrics as additive sums and counts, so micro-batches combine exactly (paper §10-12 diagnostics).

`policy_loss` returns a dict with the fixed keys `METRIC_KEYS`. Combine micro-batches with `accumulate_metrics`
(keys ending in `_min` combine by min, `_max` by max, every other key by +; start a scan from `empty_metrics()`),
then call `finalize_metrics` once on the host. All token statistics run over the tokens IN the loss
(token_weights > 0): completion tokens, not forced, of valid samples of kept groups; each token counts once,
whatever the aggregation.

  final key        formula (over loss tokens unless said)                 meaning
  loss             sum of micro-batch losses                              the optimised loss
  clip_frac_upper  #upper-clipped / clip_count                            cispo/reinforce: fraction of capped IS
                                                                          weights (rho > eps_max); clipped family:
                                                                          A > 0, rho > 1 + eps_high; gspo: per seq
  clip_frac_lower  #lower-clipped / clip_count                            A < 0, rho < 1 - eps_low (0 for cispo)
  dual_clip_frac   #dual-clipped / clip_count                             A < 0, rho > c
  ratio_mean/min/max   of rho = exp(clamped log pi_theta - log pi_gen)    importance ratio
  ess              (sum rho)^2 / (N sum rho^2)                            normalised effective sample size (Kong)
  entropy          -mean log pi_theta(y_t)                                Monte Carlo entropy estimate from the
                                                                          sampled tokens (no full logits here); off
                                                                          policy it is the cross-entropy H(gen, theta)
  logp_gap         mean (log pi_theta - log pi_gen)                       trainer-vs-sampler gap (signed)
  logp_abs_gap     mean |log pi_theta - log pi_gen|
  mismatch_kl      mean (rho - 1 - log rho)                               k3 estimate of KL(pi_gen || pi_theta)
  tokens, samples  counts of loss tokens / samples with weight > 0
  kl               mean sg(k) of loss.kl_estimator (rl/reference.py)     KL(pi_theta || pi_ref) estimate; only with
                                                                          loss.kl_coef > 0
  distill_reverse_kl   mean (log pi_theta - log pi_teacher)               the per-token reverse KL to the teacher;
                                                                          only with loss.distill_teacher
The ratio statistics (ratio_*, ess, mismatch_kl) are of w = pi_theta / pi_gen (mismatch.py) under either
loss.behavior: with behavior=trainer the loss's own ratio is 1 by construction and w is what is left to watch.

Sampler-trainer mismatch (mismatch.py), logged every step whatever loss.mismatch is, with its configured bounds (so
a run without correction shows what each correction would do); W_b = exp(clamp(L_b)) with L_b = sum_t log w over
sequence b's loss tokens is the sequence's importance weight, g_b its geometric mean per token:
  mismatch_truncated_frac   #(w > mismatch_cap) / tokens                 what tis truncates
  mismatch_masked_frac      #(w outside [mismatch_low, mismatch_high]) / tokens    what mask drops
  mismatch_ess              (sum f)^2 / (N sum f^2) of the factors f the loss multiplies in (1 with none)
  mismatch_seq_kl           mean_b (W_b - 1 - L_b), L_b clamped          k3 estimate of the sequence-level KL
  mismatch_seq_masked_frac  #(g_b outside [mismatch_seq_low, mismatch_seq_high]) / samples   what seq_mask drops
  mismatch_seq_ess          (sum W)^2 / (S sum W^2)                      ESS of the sequence-level weights
  mismatch_seq_max          max_b g_b                                    the largest geometric-mean ratio
  (per token: mismatch_kl above, ratio_max is the largest w, ess the ESS of the raw token weights w)
clip_count is the number of loss tokens, or of loss samples for gspo (its clip is per sequence). A mean with a
zero count is NaN (e.g. a step where every group was filtered). Whole-batch statistics (zero-variance fraction,
advantage statistics, kept prompts) come from `prepare`'s metrics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.rl import mismatch as mismatch_lib

METRIC_KEYS = ("loss_sum", "tokens", "samples", "clip_count", "clip_upper_sum", "clip_lower_sum", "dual_clip_sum",
               "ratio_sum", "ratio_sq_sum", "ratio_min", "ratio_max", "neg_logp_sum", "logp_gap_sum",
               "logp_abs_gap_sum", "mismatch_kl_sum", "mismatch_trunc_sum", "mismatch_masked_sum",
               "mismatch_factor_sum", "mismatch_factor_sq_sum", "seq_kl_sum", "seq_masked_sum", "seq_weight_sum",
               "seq_weight_sq_sum", "seq_ratio_max")
OPTIONAL_METRIC_KEYS = ("kl_sum", "distill_rkl_sum")  # only with a KL term / distillation (rl/reference.py)


def loss_metrics(*, loss, logp_BT, gen_logp_BT, log_ratio_BT, live_BT, live_B, clip_upper, mask_BT, cfg,
                 clip_lower=None, clip_live=None, dual_clip=None, factor_BT=None):
  """The metric sums of one micro-batch (keys `METRIC_KEYS`), all float32 scalars without gradient.

  `log_ratio_BT` is the clamped log w = log pi_theta - log pi_gen; `mask_BT` the loss mask (sequence statistics
  run over it); `cfg` the LossConfig (the mismatch bounds); `factor_BT` the mismatch correction factor per token
  (a sequence's on each of its tokens; None: 1). `clip_live` (default `live_BT`) says where the clip indicators are
  counted; `clip_lower` and `dual_clip` default to "none" and are reported as exact zeros without a pass over the
  batch (on CPU every full-size reduction is a pass over memory, and these sums cost more than the loss itself).
  """
  sg = jax.lax.stop_gradient
  zero = jnp.float32(0.0)
  # Materialise the few per-token inputs once. Without the barrier XLA (CPU) re-derives them from the raw
  # log-prob arrays inside every one of the ~14 reductions: 4-5x slower at 48x16x1024 tokens (benchmarks/).
  f_BT, rho_BT, lr_BT, gap_BT, logp_BT = jax.lax.optimization_barrier(
      (live_BT.astype(jnp.float32), jnp.exp(sg(log_ratio_BT)), sg(log_ratio_BT), sg(logp_BT - gen_logp_BT),
       sg(logp_BT)))
  tokens = jnp.sum(f_BT)
  if clip_live is None:
    clip_live, clip_count = live_BT, tokens
  else:
    clip_count = jnp.sum(clip_live.astype(jnp.float32))
  count = lambda x: jnp.sum((clip_live & x).astype(jnp.float32))
  total = lambda x_BT: jnp.sum(f_BT * x_BT)
  mismatch = _mismatch_sums(f_BT, rho_BT, lr_BT, tokens, mask_BT, live_B, factor_BT, cfg)
  return {
      "loss_sum": sg(loss).astype(jnp.float32),
      "tokens": tokens,
      "samples": jnp.sum(live_B.astype(jnp.float32)),
      "clip_count": clip_count,
      "clip_upper_sum": count(clip_upper),
      "clip_lower_sum": zero if clip_lower is None else count(clip_lower),
      "dual_clip_sum": zero if dual_clip is None else count(dual_clip),
      "ratio_sum": total(rho_BT),
      "ratio_sq_sum": total(rho_BT**2),
      "ratio_min": jnp.min(jnp.where(f_BT > 0, rho_BT, jnp.inf)),
      "ratio_max": jnp.max(jnp.where(f_BT > 0, rho_BT, -jnp.inf)),
      "neg_logp_sum": -total(logp_BT),
      "logp_gap_sum": total(gap_BT),
      "logp_abs_gap_sum": total(jnp.abs(gap_BT)),
      "mismatch_kl_sum": total(rho_BT - 1.0 - lr_BT),
      **mismatch,
  }


def _mismatch_sums(f_BT, w_BT, lw_BT, tokens, mask_BT, live_B, factor_BT, cfg):
  """The mismatch sums (module table) from loss_metrics' materialised loss-token indicator f_BT, w, log w."""
  sg = jax.lax.stop_gradient
  out_of_band_BT = (w_BT < cfg.mismatch_low) | (w_BT > cfg.mismatch_high)
  if factor_BT is None:  # f = 1: its sums are the token count, no pass over the batch
    factor_sum = factor_sq_sum = tokens
  else:
    factor_BT = sg(factor_BT)
    factor_sum, factor_sq_sum = jnp.sum(f_BT * factor_BT), jnp.sum(f_BT * factor_BT**2)
  sum_B, len_B = mismatch_lib.sequence_log_ratio(lw_BT, mask_BT)
  c = cfg.log_ratio_clamp
  seq_lw_B = jnp.clip(sum_B, -c, c)
  seq_w_B = jnp.exp(seq_lw_B)
  g_B = jnp.exp(jnp.clip(sum_B / jnp.maximum(len_B, 1.0), -c, c))
  s_B = live_B.astype(jnp.float32)
  return {
      "mismatch_trunc_sum": jnp.sum(f_BT * (w_BT > cfg.mismatch_cap)),
      "mismatch_masked_sum": jnp.sum(f_BT * out_of_band_BT),
      "mismatch_factor_sum": factor_sum,
      "mismatch_factor_sq_sum": factor_sq_sum,
      "seq_kl_sum": jnp.sum(s_B * (seq_w_B - 1.0 - seq_lw_B)),
      "seq_masked_sum": jnp.sum(s_B * ((g_B < cfg.mismatch_seq_low) | (g_B > cfg.mismatch_seq_high))),
      "seq_weight_sum": jnp.sum(s_B * seq_w_B),
      "seq_weight_sq_sum": jnp.sum(s_B * seq_w_B**2),
      "seq_ratio_max": jnp.max(jnp.where(live_B, g_B, -jnp.inf)),
  }


def empty_metrics():
  """The identity of `accumulate_metrics`: 0 for sums and counts, +inf for `_min`, -inf for `_max`."""
  def init(key):
    return jnp.float32(jnp.inf if key.endswith("_min") else -jnp.inf if key.endswith("_max") else 0.0)
  return {k: init(k) for k in METRIC_KEYS}


def accumulate_metrics(acc, new):
  """Combines two metric dicts of `policy_loss` (jit-safe): min for `_min` keys, max for `_max`, + otherwise."""
  def combine(key):
    if key.endswith("_min"):
      return jnp.minimum(acc[key], new[key])
    if key.endswith("_max"):
      return jnp.maximum(acc[key], new[key])
    return acc[key] + new[key]
  return {k: combine(k) for k in new}


def finalize_metrics(summed) -> dict:
  """Host side: metric sums over all micro-batches of a step -> dict of python floats (see the module table)."""
  s = {k: float(np.asarray(v)) for k, v in summed.items()}

  def div(num, den):
    return num / den if den > 0 else float("nan")

  tokens, samples, clip_count = s["tokens"], s["samples"], s["clip_count"]
  return {
      "loss": s["loss_sum"],
      "clip_frac_upper": div(s["clip_upper_sum"], clip_count),
      "clip_frac_lower": div(s["clip_lower_sum"], clip_count),
      "dual_clip_frac": div(s["dual_clip_sum"], clip_count),
      "ratio_mean": div(s["ratio_sum"], tokens),
      "ratio_min": s["ratio_min"] if tokens > 0 else float("nan"),
      "ratio_max": s["ratio_max"] if tokens > 0 else float("nan"),
      "ess": div(s["ratio_sum"]**2, tokens * s["ratio_sq_sum"]),
      "entropy": div(s["neg_logp_sum"], tokens),
      "logp_gap": div(s["logp_gap_sum"], tokens),
      "logp_abs_gap": div(s["logp_abs_gap_sum"], tokens),
      "mismatch_kl": div(s["mismatch_kl_sum"], tokens),
      "mismatch_truncated_frac": div(s["mismatch_trunc_sum"], tokens),
      "mismatch_masked_frac": div(s["mismatch_masked_sum"], tokens),
      "mismatch_ess": div(s["mismatch_factor_sum"]**2, tokens * s["mismatch_factor_sq_sum"]),
      "mismatch_seq_kl": div(s["seq_kl_sum"], samples),
      "mismatch_seq_masked_frac": div(s["seq_masked_sum"], samples),
      "mismatch_seq_ess": div(s["seq_weight_sum"]**2, samples * s["seq_weight_sq_sum"]),
      "mismatch_seq_max": s["seq_ratio_max"] if samples > 0 else float("nan"),
      "tokens": tokens,
      "samples": samples,
      **({"kl": div(s["kl_sum"], tokens)} if "kl_sum" in s else {}),
      **({"distill_reverse_kl": div(s["distill_rkl_sum"], tokens)} if "distill_rkl_sum" in s else {}),
  }
