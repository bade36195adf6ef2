"""Sampler-trainer mismatch: the behaviour policy of the loss's ratio and a correction factor on the policy gradient.

The sampler's log-probs (recorded at sampling time) and the trainer's log-probs of the same tokens differ: bf16 or
another kernel on either side, a different inference engine, or tokens sampled by older params (k > 0). Per loss
token, with the trainer's log-probs log pi_theta of the params this step starts from,

    w[b,t] = exp(clamp(sg(log pi_theta) - log pi_sampler, -c, c))        (trainer-behaviour over sampler)

loss.behavior picks the ratio rho the policy loss sees (losses.py):
  sampler   rho = exp(clamp(log pi_theta - log pi_sampler))    today's and ScaleRL's: rho carries w, so the PPO-style
                                                               clip (or CISPO's cap) acts on the mismatch as well
  trainer   rho = exp(log pi_theta - sg(log pi_theta))         value 1, gradient of log pi_theta: the clip acts only
                                                               on this step's own move, and the mismatch is left to
                                                               the correction factor below (decoupled PPO, Hilton
                                                               et al. 2021; verl's "decoupled" mode)
behavior=trainer needs the trainer's log-probs of the pre-update params for the batch's tokens. This trainer takes
exactly ONE optimizer update per batch (train/step.py: micro-batches only accumulate gradients, then one
optimizer.update; pipeline.mode=ppo_offpolicy takes its k updates on k different batches), so those log-probs are
exactly the ones the step's own forward computes, before the update: sg(log pi_theta). No extra forward runs, and
the compute meter counts nothing extra because nothing extra happens. A trainer that took several updates per
batch (PPO epochs) would need them recomputed once before the first update, an extra forward to count.
So with behavior=trainer rho = 1 at every token and no clip or cap binds: cispo, reinforce, grpo, ppo and dapo all
take the gradient -f A grad log pi_theta (their values differ: f A (-log pi_theta) for cispo/reinforce, -f A for
the clipped family), and gspo's is -(f_b A_b / |y_b|) sum_t grad log pi_theta. pipeline.mode=ppo_offpolicy's j-th
update on a batch sampled j versions back then clips nothing and leaves the staleness to f (its w includes it).

loss.mismatch picks the factor f (stop-gradient) that multiplies each token's loss (gspo: each sequence's loss).
Every correction makes the token's total importance weight a bounded version of w; with behavior=sampler the ratio
already carries w, so f is the bound alone:

  loss.mismatch   bounded weight                        f, behavior=trainer      f, behavior=sampler
  none            (w through rho, or 1)                 1                        1
  tis             min(w, C)                             min(w, C)                refused: rho already weights by w,
                                                                                 tis would weight twice (cispo's
                                                                                 loss.eps_max is that truncation)
  mask            w * 1[low <= w <= high]               w * 1[low <= w <= high]  1[low <= w <= high]
  seq_mask        w * 1[s_low <= g_b <= s_high]         w * 1[...]               1[s_low <= g_b <= s_high]
  with g_b = exp(clamp(sum_t m log w / |y_b|)) the geometric-mean ratio of sequence b over its loss tokens.

`mask` is IcePop's operator M(k) = k 1[alpha <= k <= beta] (Ring-1T, 2510.18855): out-of-band tokens are dropped, the
rest importance-weighted; `seq_mask` is verl's geometric rejection. gspo (a sequence loss) takes none or seq_mask
only: its ratio is the geometric mean itself, so w above reads g_b there. `none` with behavior=trainer ignores the
sampler altogether (plain on-policy PG of the trainer's params): a baseline, biased when the sampler differs.

Defaults (schema.LossConfig), from the trainers that ship these: C = 2 (verl rollout_is_threshold, slime tis_clip,
open-instruct's cap), [0.5, 5] (the IcePop paper's alpha/beta; AReaL's and rllm's defaults), [0.999, 1.001] (verl's
geometric-rejection preset: the geometric mean over many tokens moves little, so its band is tight).

Departure from verl's mask mode: the loss's normalisers are not recomputed without the masked tokens (masked tokens
stay in the aggregation counts, as in IcePop, slime and prime-rl), so the loss of a micro-batch stays its share of
the step's loss and masking is exactly a multiplicative, micro-batch-additive weight.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import ConfigError, LossConfig


def sequence_log_ratio(log_w_BT, mask_BT):
  """(sum_t m log w, |y_b|) per sequence over its loss tokens: log of the sequence's importance weight, and length."""
  m_BT = jnp.asarray(mask_BT, jnp.float32)
  return jnp.sum(m_BT * log_w_BT, axis=1), jnp.sum(m_BT, axis=1)


def geometric_mean_ratio(log_w_BT, mask_BT, clamp: float):
  """g_b = exp(clamp(sum_t m log w / |y_b|, -c, c)): the per-token geometric mean of w over sequence b's loss tokens
  (1 for a sequence without any)."""
  sum_B, len_B = sequence_log_ratio(log_w_BT, mask_BT)
  return jnp.exp(jnp.clip(sum_B / jnp.maximum(len_B, 1.0), -clamp, clamp))


def correction_factor(log_w_BT, mask_BT, cfg: LossConfig, per_sequence: bool = False):
  """The stop-gradient factor f of `loss.mismatch` (module table): float32[B, T] for a token loss, float32[B] for a
  sequence loss (`per_sequence`, gspo), None for mismatch=none. `log_w_BT` is the clamped log w."""
  if cfg.mismatch == "none":
    return None
  if per_sequence and cfg.mismatch != "seq_mask":
    raise ConfigError(f"loss.mismatch: {cfg.mismatch} is per token; loss.name={cfg.name} is a sequence loss: "
                      "use none or seq_mask")
  if cfg.mismatch == "tis" and cfg.behavior != "trainer":
    raise ConfigError("loss.mismatch: tis needs loss.behavior=trainer (with the sampler as behaviour the ratio "
                      "already weights by w)")
  log_w_BT = jax.lax.stop_gradient(log_w_BT)
  trainer = cfg.behavior == "trainer"
  if cfg.mismatch == "seq_mask":
    g_B = geometric_mean_ratio(log_w_BT, mask_BT, cfg.log_ratio_clamp)
    keep_B = ((g_B >= cfg.mismatch_seq_low) & (g_B <= cfg.mismatch_seq_high)).astype(jnp.float32)
    if per_sequence:
      return g_B * keep_B if trainer else keep_B
    return (jnp.exp(log_w_BT) if trainer else 1.0) * keep_B[:, None]
  w_BT = jnp.exp(log_w_BT)
  if cfg.mismatch == "tis":
    return jnp.minimum(w_BT, cfg.mismatch_cap)
  keep_BT = ((w_BT >= cfg.mismatch_low) & (w_BT <= cfg.mismatch_high)).astype(jnp.float32)  # mask
  return w_BT * keep_BT if trainer else keep_BT
