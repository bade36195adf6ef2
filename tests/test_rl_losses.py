"""Policy losses on a hand-checked 2-prompt x 2-sample x 3-token example, gradients, invariances, metrics.

The example (position 0 is the prompt token and never carries loss; `.` is padding holding NaN log-probs):

  row  prompt  reward  A (adv_norm=none)  loss tokens  rho per loss token     logp per loss token
  b0   p0      1       +0.5               3            1.0, 1.25, 5.0         -1 each
  b1   p0      0       -0.5               2 + .        0.5, 1.0               -1 each
  b2   p1      0       -0.5               1 + . .      4.5                    -1
  b3   p1      1       +0.5               3            1.0, 0.9, 1.1          -1 each

A = r - mean_g r = +-0.5. Token weights (aggregation.py): prompt 1/(P_kept T_p): T_p0 = 3+2 = 5 -> 1/10,
T_p1 = 1+3 = 4 -> 1/8; sample 1/(N_s |y|) = 1/12, 1/8, 1/4, 1/12; token 1/N_tok = 1/9; seq_mean_token_sum 1/N_s = 1/4.
Since logp = -1, a truncated-IS token loss -w A logp is w A.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import rl
from scalerl_jax.config import ConfigError, LossConfig
from scalerl_jax.types import TrainBatch

ROWS_MASK = np.array([[0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1]], np.float32)
ROWS_RHO = np.array([[1, 1.0, 1.25, 5.0], [1, 0.5, 1.0, 1], [1, 4.5, 1, 1], [1, 1.0, 0.9, 1.1]], np.float32)
REWARDS = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
NO_TRUNC = np.zeros((2, 2), bool)

value_and_grad = jax.jit(jax.value_and_grad(rl.policy_loss, has_aux=True), static_argnames="cfg")
eager_value_and_grad = jax.value_and_grad(rl.policy_loss, has_aux=True)  # many configs: cheaper than compiling each
# The invariance tests share these configs (batch normalization, prompt aggregation) so that each (config, shape)
# compiles once per module.
INVARIANCE_CFGS = {name: LossConfig(name=name) for name in ("cispo", "dapo", "gspo")}


def example(pad_cols=0):
  """(logp_BT, loss_mask_BT, gen_logprobs_BT); padding holds NaN (trainer) and +7 (sampler) log-probs."""
  mask = np.pad(ROWS_MASK, ((0, 0), (0, pad_cols)))
  rho = np.pad(ROWS_RHO, ((0, 0), (0, pad_cols)), constant_values=1.0)
  logp = np.where(mask > 0, -1.0, np.nan).astype(np.float32)
  gen = np.where(mask > 0, -1.0 - np.log(rho), 7.0).astype(np.float32)
  return logp, mask, gen


def make_batch(cfg, mask, gen, rewards=REWARDS, truncated=NO_TRUNC):
  prep = rl.prepare(rewards, mask, truncated, cfg)
  B, T = mask.shape
  return TrainBatch(tokens=np.zeros((B, T), np.int32), loss_mask=mask, gen_logprobs=gen,
                    advantages=prep.advantages, token_weights=prep.token_weights,
                    sample_weights=prep.sample_weights)


# Per-row loss sums (per-token losses in brackets), A = +-0.5, logp = -1:
#   cispo/reinforce, w = min(rho, 4):  b0 [0.5, 0.625, 4*0.5=2.0] = 3.125   b1 [-0.25, -0.5] = -0.75
#                                      b2 [4*-0.5 = -2.0] = -2.0             b3 [0.5, 0.45, 0.55] = 1.5
#   grpo/ppo, -min(rho A, clip(rho, 0.8, 1.2) A):
#     b0 [-0.5, -min(0.625, 0.6) = -0.6, -min(2.5, 0.6) = -0.6] = -1.7
#     b1 [-min(-0.25, 0.8*-0.5 = -0.4) = 0.4, 0.5] = 0.9
#     b2 [-min(4.5*-0.5 = -2.25, 1.2*-0.5 = -0.6) = 2.25]         b3 [-0.5, -0.45, -0.55] = -1.5
#   dapo, clip(rho, 0.8, 1.28): b0 [-0.5, -0.625 (1.25 < 1.28: unclipped), -1.28*0.5 = -0.64] = -1.765
#     b1 0.9, b2 2.25 (-min(-2.25, -0.64)), b3 -1.5
# Aggregated: prompt = (b0 + b1)/10 + (b2 + b3)/8; sample = b0/12 + b1/8 + b2/4 + b3/12;
#             token = (b0 + b1 + b2 + b3)/9; seq_mean_token_sum = (b0 + b1 + b2 + b3)/4.
# gspo, s_b = (prod rho)^(1/|y|), clip(s, 0.997, 1.005), per-row loss l_b = -min(s A, clip(s) A):
#   b0 s = 6.25^(1/3) = 1.8420 -> -min(0.9210, 0.5025) = -0.5025
#   b1 s = 0.5^(1/2) = 0.70711 -> -min(-0.35355, -0.4985) = 0.4985
#   b2 s = 4.5 -> -min(-2.25, -0.5025) = 2.25
#   b3 s = 0.99^(1/3) = 0.996655 -> -min(0.4983277, 0.4985) = -0.4983277
#   sequence weights = |y_b| * token weight: prompt 0.3, 0.2, 0.125, 0.375; sample 1/4 each;
#   token 3/9, 2/9, 1/9, 3/9; seq_mean_token_sum 3/4, 2/4, 1/4, 3/4.
EXPECTED = {
    # cispo: 3.125/10 - 0.75/10 - 2/8 + 1.5/8 = 0.3125 - 0.075 - 0.25 + 0.1875
    ("cispo", "prompt"): 0.175,
    # 3.125/12 - 0.75/8 - 2/4 + 1.5/12 = (25 - 9 - 48 + 12)/96 = -20/96
    ("cispo", "sample"): -5 / 24,
    # (3.125 - 0.75 - 2 + 1.5) = 1.875
    ("cispo", "token"): 1.875 / 9,
    ("cispo", "seq_mean_token_sum"): 1.875 / 4,
    # grpo: (-1.7 + 0.9)/10 + (2.25 - 1.5)/8 = -0.08 + 0.09375
    ("grpo", "prompt"): 0.01375,
    # -1.7/12 + 0.9/8 + 2.25/4 - 1.5/12 = -0.141667 + 0.1125 + 0.5625 - 0.125
    ("grpo", "sample"): 0.4083333,
    # -1.7 + 0.9 + 2.25 - 1.5 = -0.05
    ("grpo", "token"): -0.05 / 9,
    ("grpo", "seq_mean_token_sum"): -0.05 / 4,
    # dapo: (-1.765 + 0.9)/10 + 0.75/8 = -0.0865 + 0.09375
    ("dapo", "prompt"): 0.00725,
    # -1.765/12 + 0.1125 + 0.5625 - 0.125 = -0.1470833 + 0.55
    ("dapo", "sample"): 0.4029167,
    # -1.765 + 0.9 + 2.25 - 1.5 = -0.115
    ("dapo", "token"): -0.115 / 9,
    ("dapo", "seq_mean_token_sum"): -0.115 / 4,
    # gspo: 0.3*-0.5025 + 0.2*0.4985 + 0.125*2.25 + 0.375*-0.4983277 = -0.15075 + 0.0997 + 0.28125 - 0.1868729
    ("gspo", "prompt"): 0.0433271,
    # (-0.5025 + 0.4985 + 2.25 - 0.4983277)/4 = 1.7476723/4
    ("gspo", "sample"): 0.4369181,
    # (3*-0.5025 + 2*0.4985 + 2.25 + 3*-0.4983277)/9 = 0.2445169/9
    ("gspo", "token"): 0.0271685,
    ("gspo", "seq_mean_token_sum"): 0.2445169 / 4,
}
SAME_AS = {"reinforce": "cispo", "ppo": "grpo"}
NAMES = ("cispo", "reinforce", "grpo", "ppo", "dapo", "gspo")
AGGS = ("prompt", "sample", "token", "seq_mean_token_sum")


@pytest.mark.parametrize("agg", AGGS)
def test_every_loss_and_aggregation_on_the_hand_example(agg):
  logp, mask, gen = example()
  for name in NAMES:
    cfg = LossConfig(name=name, aggregation=agg, adv_norm="none")
    loss, metrics = rl.policy_loss(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
    want = EXPECTED[(SAME_AS.get(name, name), agg)]
    np.testing.assert_allclose(float(loss), want, rtol=2e-6, atol=1e-7, err_msg=f"{name}/{agg}")
    assert float(metrics["loss_sum"]) == float(loss)


def test_cispo_gradient_is_the_stopped_weight_times_the_advantage():
  logp, mask, gen = example()
  cfg = LossConfig(name="cispo", adv_norm="none")
  (_, _), grad = value_and_grad(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
  # d loss / d logp = -tw * min(rho, 4) * A (prompt weights 1/10 for p0, 1/8 for p1):
  #   b0: -0.1*0.5*[1, 1.25, 4] = [-0.05, -0.0625, -0.2];   b1: +0.1*0.5*[0.5, 1] = [0.025, 0.05]
  #   b2: +0.125*0.5*4 = 0.25;                              b3: -0.125*0.5*[1, 0.9, 1.1] = [-0.0625, -0.05625, -0.06875]
  want = np.array([[0, -0.05, -0.0625, -0.2], [0, 0.025, 0.05, 0], [0, 0.25, 0, 0], [0, -0.0625, -0.05625, -0.06875]])
  np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6, atol=1e-8)
  # A gradient through the weight would add -tw*A*rho*logp where rho < 4: with logp = -1 it cancels the first
  # term, so the uncapped tokens would get 0. Ours is different from that everywhere the weight is not capped.
  rho = ROWS_RHO
  through_w = want + np.where((ROWS_MASK > 0) & (rho < 4), want / np.minimum(rho, 4) * rho * -1.0, 0.0)
  uncapped = (ROWS_MASK > 0) & (rho < 4)
  np.testing.assert_allclose(through_w[uncapped], 0.0, atol=1e-7)
  assert np.all(np.abs(np.asarray(grad)[uncapped]) > 1e-3)


def test_at_rho_one_cispo_equals_reinforce_equals_pg_and_dapo_equals_grpo():
  _, mask, _ = example()
  logp = np.where(mask > 0, -0.7, np.nan).astype(np.float32)
  gen = np.where(mask > 0, -0.7, 3.0).astype(np.float32)  # rho = 1 on every loss token
  out = {}
  for name in NAMES:
    cfg = LossConfig(name=name, adv_norm="none")
    (loss, _), grad = eager_value_and_grad(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
    out[name] = (float(loss), np.asarray(grad))
  # Plain policy gradient: loss = -sum tw A logp, so grad = -tw * A with tw * A = 0.1*0.5 = 0.05 (b0),
  # 0.1*-0.5 = -0.05 (b1), 0.125*-0.5 = -0.0625 (b2), 0.125*0.5 = 0.0625 (b3).
  tw_A = np.array([[0, 0.05, 0.05, 0.05], [0, -0.05, -0.05, 0], [0, -0.0625, 0, 0], [0, 0.0625, 0.0625, 0.0625]])
  np.testing.assert_allclose(out["cispo"][1], -tw_A, atol=1e-8)
  np.testing.assert_allclose(out["reinforce"][1], out["cispo"][1], atol=0)
  np.testing.assert_allclose(out["dapo"][0], out["grpo"][0], atol=0)
  np.testing.assert_allclose(out["dapo"][1], out["grpo"][1], atol=0)
  # ...and on policy every surrogate has the policy-gradient gradient.
  for name in ("grpo", "gspo"):
    np.testing.assert_allclose(out[name][1], -tw_A, atol=1e-7)
  # They were computed differently: off policy (the main example) dapo and grpo disagree.
  assert EXPECTED[("dapo", "prompt")] != EXPECTED[("grpo", "prompt")]


def test_gspo_gradient_equals_the_gspo_token_stop_gradient_form():
  _, mask, _ = example()
  rng = np.random.default_rng(0)
  logp = np.where(mask > 0, rng.uniform(-2, -0.5, mask.shape), np.nan).astype(np.float32)
  # log-ratios of order 1e-3, so some sequences are inside GSPO's [1-3e-3, 1+5e-3] band and some are clipped.
  gen = np.where(mask > 0, logp - rng.uniform(-4e-3, 6e-3, mask.shape), 0.0).astype(np.float32)
  cfg = LossConfig(name="gspo", adv_norm="none", aggregation="prompt")
  batch = make_batch(cfg, mask, gen)
  (loss, _), grad = value_and_grad(jnp.asarray(logp), batch, cfg)

  def gspo_token(lp):  # GSPO-token (2507.18071 §4.3): s_bt = sg(s_b) * pi_t / sg(pi_t), token weights
    m = jnp.asarray(mask)
    lp = jnp.where(m > 0, lp, 0.0)
    s_B = jnp.exp(jnp.sum(m * (lp - gen), 1) / jnp.sum(m, 1))
    s_BT = jax.lax.stop_gradient(s_B)[:, None] * jnp.exp(lp - jax.lax.stop_gradient(lp))
    a = batch.advantages[:, None]
    l_BT = -jnp.minimum(s_BT * a, jnp.clip(s_BT, 1 - 3e-3, 1 + 5e-3) * a)
    return jnp.sum(batch.token_weights * l_BT)

  ref_loss, ref_grad = jax.value_and_grad(gspo_token)(jnp.asarray(logp))
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(ref_grad), rtol=1e-5, atol=1e-9)
  assert np.count_nonzero(np.asarray(grad)) > 0  # some sequence is unclipped: the test is not 0 == 0


def test_dual_clip_caps_the_negative_advantage_loss():
  logp, mask, gen = example()
  cfg = LossConfig(name="dapo", adv_norm="none", dual_clip=3.0)
  loss, metrics = rl.policy_loss(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
  # Only b2 (A = -0.5, rho = 4.5 > c = 3) changes: max(-2.25, 3*-0.5 = -1.5) -> loss 1.5 instead of 2.25.
  # prompt: (-1.765 + 0.9)/10 + (1.5 - 1.5)/8 = -0.0865
  np.testing.assert_allclose(float(loss), -0.0865, rtol=1e-6)
  assert float(metrics["dual_clip_sum"]) == 1.0


def test_metrics_on_the_hand_example():
  logp, mask, gen = example()
  cfg = LossConfig(name="grpo", adv_norm="none")
  _, m = rl.policy_loss(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
  f = rl.finalize_metrics(m)
  # 9 loss tokens. Upper-clipped (A > 0, rho > 1.2): b0's 1.25 and 5.0 -> 2/9; lower (A < 0, rho < 0.8): b1's 0.5.
  assert (f["tokens"], f["samples"]) == (9.0, 4.0)
  np.testing.assert_allclose([f["clip_frac_upper"], f["clip_frac_lower"]], [2 / 9, 1 / 9])
  # sum rho = 1 + 1.25 + 5 + 0.5 + 1 + 4.5 + 1 + 0.9 + 1.1 = 16.25; sum rho^2 = 52.0825
  # ess = 16.25^2 / (9 * 52.0825) = 264.0625 / 468.7425 = 0.563342
  np.testing.assert_allclose([f["ratio_mean"], f["ratio_min"], f["ratio_max"], f["ess"]],
                             [16.25 / 9, 0.5, 5.0, 0.5633423], rtol=1e-6)
  # entropy estimate -mean logp = 1; gap = mean ln rho = ln(1.25*5*0.5*4.5*0.9*1.1)/9 = ln(13.921875)/9
  np.testing.assert_allclose([f["entropy"], f["logp_gap"]], [1.0, np.log(13.921875) / 9], rtol=1e-6)
  cispo = LossConfig(name="cispo", adv_norm="none")
  f = rl.finalize_metrics(rl.policy_loss(jnp.asarray(logp), make_batch(cispo, mask, gen), cispo)[1])
  # capped CISPO weights (rho > 4): 5.0 and 4.5 -> 2/9
  np.testing.assert_allclose([f["clip_frac_upper"], f["clip_frac_lower"]], [2 / 9, 0.0])
  gspo = LossConfig(name="gspo", adv_norm="none")
  f = rl.finalize_metrics(rl.policy_loss(jnp.asarray(logp), make_batch(gspo, mask, gen), gspo)[1])
  # per sequence: b0 (A > 0, s = 1.84) upper, b1 (A < 0, s = 0.707) lower, b2 b3 not -> 1/4 each
  np.testing.assert_allclose([f["clip_frac_upper"], f["clip_frac_lower"]], [0.25, 0.25])


@pytest.mark.parametrize("name", INVARIANCE_CFGS)
def test_padding_invariance(name):
  cfg = INVARIANCE_CFGS[name]
  logp, mask, gen = example()
  logp_p, mask_p, gen_p = example(pad_cols=3)
  (loss, m), grad = value_and_grad(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
  (loss_p, m_p), grad_p = value_and_grad(jnp.asarray(logp_p), make_batch(cfg, mask_p, gen_p), cfg)
  assert logp_p.shape != logp.shape and np.isfinite(float(loss))
  np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad_p)[:, :4], np.asarray(grad), rtol=1e-6)
  assert np.all(np.asarray(grad_p)[:, 4:] == 0)
  np.testing.assert_allclose(float(m_p["ratio_sum"]), float(m["ratio_sum"]), rtol=1e-6)


def two_micro_batches(value_and_grad_fn, logp, batch, cfg):
  """The batch of `example()` run as two micro-batches of one prompt each: (their losses, their gradient rows, their
  accumulated metric sums), to compare with the whole batch."""
  acc, parts, grads = rl.empty_metrics(), [], []
  for rows in (slice(0, 2), slice(2, 4)):
    (l, mm), g = value_and_grad_fn(jnp.asarray(logp[rows]), jax.tree.map(lambda x: x[rows], batch), cfg)
    parts.append(float(l))
    grads.append(np.asarray(g))
    acc = rl.accumulate_metrics(acc, mm)
  return parts, grads, acc


@pytest.mark.parametrize("name", INVARIANCE_CFGS)
def test_micro_batch_invariance(name):
  cfg = INVARIANCE_CFGS[name]
  logp, mask, gen = example()
  batch = make_batch(cfg, mask, gen)
  (loss, m), grad = value_and_grad(jnp.asarray(logp), batch, cfg)
  parts, grads, acc = two_micro_batches(value_and_grad, logp, batch, cfg)
  assert all(abs(p) > 1e-4 for p in parts)  # both parts contribute
  np.testing.assert_allclose(sum(parts), float(loss), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.concatenate(grads), np.asarray(grad), rtol=1e-6)
  full, split = rl.finalize_metrics(m), rl.finalize_metrics(acc)
  for k in full:
    np.testing.assert_allclose(split[k], full[k], rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("name", INVARIANCE_CFGS)
def test_prompt_permutation_invariance(name):
  cfg = INVARIANCE_CFGS[name]
  logp, mask, gen = example()
  perm = np.array([2, 3, 0, 1])  # swap the two prompts (rows stay prompt-major)
  (loss, m), grad = value_and_grad(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
  (loss_p, m_p), grad_p = value_and_grad(
      jnp.asarray(logp[perm]), make_batch(cfg, mask[perm], gen[perm], rewards=REWARDS[::-1]), cfg)
  np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad_p), np.asarray(grad)[perm], rtol=1e-6)
  np.testing.assert_allclose(rl.finalize_metrics(m_p)["ess"], rl.finalize_metrics(m)["ess"], rtol=1e-6)


def test_every_group_filtered_gives_zero_loss_not_nan():
  logp, mask, gen = example()
  cfg = INVARIANCE_CFGS["cispo"]
  rewards = np.array([[1.0, 1.0], [0.0, 0.0]], np.float32)  # both groups zero-variance
  batch = make_batch(cfg, mask, gen, rewards=rewards)
  (loss, m), grad = value_and_grad(jnp.asarray(logp), batch, cfg)
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0)
  f = rl.finalize_metrics(m)
  assert f["tokens"] == 0.0 and np.isnan(f["ratio_mean"])


def test_jit_matches_eager():
  logp, mask, gen = example()
  cfg = INVARIANCE_CFGS["dapo"]
  batch = make_batch(cfg, mask, gen)
  eager, _ = rl.policy_loss(jnp.asarray(logp), batch, cfg)
  (jitted, _), _ = value_and_grad(jnp.asarray(logp), batch, cfg)
  # the loss (0.0145) is a sum of terms of either sign whose sizes add up to 1.47: float32 ulps of that, not of it
  np.testing.assert_allclose(float(jitted), float(eager), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("key,field", [("loss.name", "name"), ("loss.aggregation", "aggregation"),
                                       ("loss.adv_norm", "adv_norm")])
def test_unknown_names_raise_naming_the_key(key, field):
  # the config type checks its names when it is built, so prepare / policy_loss never see an unknown one
  with pytest.raises(ConfigError, match=f"{key}: unknown 'foo'; choose one of"):
    dataclasses.replace(LossConfig(), **{field: "foo"})


def test_micro_batches_accumulate_inside_a_jitted_scan():
  cfg = INVARIANCE_CFGS["gspo"]
  logp, mask, gen = example()
  batch = make_batch(cfg, mask, gen)
  stacked = jax.tree.map(lambda x: x.reshape(2, 2, *x.shape[1:]), batch)  # 2 micro-batches of one prompt

  @jax.jit
  def step(logp_MBT, micro):
    def body(carry, xs):
      loss, acc = carry
      l, m = rl.policy_loss(xs[0], xs[1], cfg)
      return (loss + l, rl.accumulate_metrics(acc, m)), None
    return jax.lax.scan(body, (jnp.float32(0.0), rl.empty_metrics()), (logp_MBT, micro))[0]

  loss, acc = step(jnp.asarray(logp).reshape(2, 2, -1), stacked)
  full_loss, full = rl.policy_loss(jnp.asarray(logp), batch, cfg)
  np.testing.assert_allclose(float(loss), float(full_loss), rtol=1e-6, atol=1e-7)
  f_scan, f_full = rl.finalize_metrics(acc), rl.finalize_metrics(full)
  for k in f_full:
    np.testing.assert_allclose(f_scan[k], f_full[k], rtol=1e-6, atol=1e-7, err_msg=k)
