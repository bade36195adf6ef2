"""A frozen reference policy in the objective: a KL term to it (loss.kl_*) and on-policy distillation from a teacher
(loss.distill_*). Pure functions of log-prob arrays; the frozen forwards that produce them live in
train/reference.py and run once per step (their FLOPs in the compute meter).

Per loss token, with log pi_theta the trainer's log-probs (at the sampling temperature), log pi_ref the frozen
reference's, log pi_T the teacher's, all of the sampled token y_t, and d = clamp(log pi_theta - log pi_ref, -c, c):

  loss.kl_estimator   k[b,t] (estimates KL(pi_theta || pi_ref) with y ~ pi_theta)   d k / d log pi_theta
  k1                  d                                                           1
  k2                  d^2 / 2                                                     d
  k3                  exp(-d) + d - 1   (= r - 1 - log r with r = pi_ref/pi_theta) 1 - exp(-d)
(Schulman's estimators; k3 is GRPO's, always >= 0, unbiased; k2 is biased with low variance; k1 unbiased, signed.)

loss.kl_mode says where k goes, weighted by beta = loss.kl_coef:
  loss     a differentiable loss term added to the policy loss with the loss's own aggregation weights:
             loss += beta * sum_{b,t} token_weights[b,t] * k[b,t]          (GRPO's form; additive over micro-batches)
           Its gradient is the table's last column: k1's is beta * grad log pi_theta, which is zero in expectation
           under pi_theta (the sampled tokens' mean score), so k1 as a LOSS barely pulls toward the reference; use
           k2 / k3 for the loss, k1 for the reward (as the reward-shaping literature does).
  reward   a stop-gradient penalty on each token's advantage, which the policy loss then weights like the task's:
             A[b,t] = A_b - beta * sg(k[b,t])                              (per token; no return-to-go sum)
Distillation (Agarwal et al. 2024's on-policy distillation; Thinking Machines' "on-policy distillation", 2025): the
per-token advantage is the negative per-token reverse KL to the teacher on the student's own samples,
    A[b,t] = gamma * sg(log pi_T(y_t) - log pi_theta(y_t))    (+ A_b with loss.distill_task_reward=true)
gamma = loss.distill_coef; its expectation under pi_theta is -gamma KL(pi_theta || pi_T) per token, so the policy
gradient of this advantage descends the reverse KL. A teacher identical to the student gives A = 0 exactly.
Both add up: A[b,t] = [A_b] - beta sg(k) + gamma sg(log pi_T - log pi_theta). A per-token advantage needs a token
loss (gspo's is per sequence: refused by the config).

Where log pi_theta is used inside sg(...) above it is the trainer's own log-probs of the params this step starts
from (the step takes one optimizer update per batch), not the sampler's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import LossConfig


def kl_estimate(logp_BT, ref_logp_BT, estimator: str, clamp: float):
  """k[b,t] of `estimator` (k1 | k2 | k3, module table) from d = clamp(log pi_theta - log pi_ref, -c, c); clamped
  before k3's exp so it stays finite. Differentiable in `logp_BT`."""
  d_BT = jnp.clip(logp_BT - ref_logp_BT, -clamp, clamp)
  if estimator == "k1":
    return d_BT
  if estimator == "k2":
    return 0.5 * d_BT**2
  return jnp.exp(-d_BT) + d_BT - 1.0  # k3


def need_logprobs(cfg: LossConfig, ref_logp_BT, teacher_logp_BT) -> None:
  """ValueError when the config asks for a frozen policy whose log-probs the batch lacks (never silently off)."""
  if cfg.kl_coef > 0 and ref_logp_BT is None:
    raise ValueError("loss.kl_coef > 0 needs the reference's log-probs in batch.ref_logprobs (train/reference.py)")
  if cfg.distill_teacher and teacher_logp_BT is None:
    raise ValueError("loss.distill_teacher needs the teacher's log-probs in batch.teacher_logprobs "
                     "(train/reference.py)")


def kl_loss(logp_BT, ref_logp_BT, token_w_BT, cfg: LossConfig):
  """(beta * sum token_weights * k, sum over loss tokens of sg(k)): loss.kl_mode=loss's term and its metric sum."""
  k_BT = kl_estimate(logp_BT, ref_logp_BT, cfg.kl_estimator, cfg.log_ratio_clamp)
  return cfg.kl_coef * jnp.sum(token_w_BT * k_BT), jnp.sum((token_w_BT > 0) * jax.lax.stop_gradient(k_BT))


def token_advantages(adv_B, logp_BT, live_BT, cfg: LossConfig, ref_logp_BT=None, teacher_logp_BT=None):
  """(advantage per token [B, T] or per sample [B, 1], metric sums): the module's A[b,t].

  Returns `adv_B[:, None]` unchanged (the default path, bit-identical) when neither loss.kl_mode=reward nor
  distillation is on. Metric sums over the loss tokens `live_BT`: `kl_sum` of sg(k) (reward mode; the loss mode
  reports its own in `kl_loss`), `distill_rkl_sum` of sg(log pi_theta - log pi_T) (the reverse KL's estimate).
  """
  sg = jax.lax.stop_gradient
  kl_reward = cfg.kl_coef > 0 and cfg.kl_mode == "reward"
  distill = bool(cfg.distill_teacher)
  need_logprobs(cfg, ref_logp_BT, teacher_logp_BT)
  if not kl_reward and not distill:
    return adv_B[:, None], {}
  f_BT = live_BT.astype(jnp.float32)
  adv_BT = jnp.broadcast_to(adv_B[:, None], logp_BT.shape) if not distill or cfg.distill_task_reward else 0.0
  sums = {}
  if kl_reward:
    k_BT = sg(kl_estimate(logp_BT, ref_logp_BT, cfg.kl_estimator, cfg.log_ratio_clamp))
    adv_BT = adv_BT - cfg.kl_coef * k_BT
    sums["kl_sum"] = jnp.sum(f_BT * k_BT)
  if distill:
    gap_BT = sg(teacher_logp_BT - logp_BT)  # log pi_T - log pi_theta: the negative per-token reverse KL
    adv_BT = adv_BT + cfg.distill_coef * gap_BT
    sums["distill_rkl_sum"] = -jnp.sum(f_BT * gap_BT)
  return adv_BT, sums
