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
clip_count is the number of loss tokens, or of loss samples for gspo (its clip is per sequence). A mean with a
zero count is NaN (e.g. a step where every group was filtered). Whole-batch statistics (zero-variance fraction,
advantage statistics, kept prompts) come from `prepare`'s metrics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

METRIC_KEYS = ("loss_sum", "tokens", "samples", "clip_count", "clip_upper_sum", "clip_lower_sum", "dual_clip_sum",
               "ratio_sum", "ratio_sq_sum", "ratio_min", "ratio_max", "neg_logp_sum", "logp_gap_sum",
               "logp_abs_gap_sum", "mismatch_kl_sum")


def loss_metrics(*, loss, logp_BT, gen_logp_BT, log_ratio_BT, live_BT, live_B, clip_upper, clip_lower=None,
                 clip_live=None, dual_clip=None):
  """The metric sums of one micro-batch (keys `METRIC_KEYS`), all float32 scalars without gradient.

  `clip_live` (default `live_BT`) says where the clip indicators are counted; `clip_lower` and `dual_clip` default
  to "none" and are reported as exact zeros without a pass over the batch (on CPU every full-size reduction is a
  pass over memory, and these sums cost more than the loss itself).
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

  tokens, clip_count = s["tokens"], s["clip_count"]
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
      "tokens": tokens,
      "samples": s["samples"],
  }
