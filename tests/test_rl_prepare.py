"""prepare(): advantage normalization, leave-one-out, filters, length penalty, aggregation weights (hand-checked)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import rl
from scalerl_jax.config import ConfigError, LossConfig, load_config
from scalerl_jax.types import TrainBatch


def uniform_mask(P, G, T=3):
  """Every row: position 0 is the prompt, then T - 1 loss tokens."""
  mask = np.ones((P * G, T), np.float32)
  mask[:, 0] = 0
  return mask


def prep(rewards, cfg, truncated=None, mask=None, **kw):
  rewards = np.asarray(rewards, np.float32)
  P, G = rewards.shape
  truncated = np.zeros((P, G), bool) if truncated is None else np.asarray(truncated)
  return rl.prepare(rewards, uniform_mask(P, G) if mask is None else mask, truncated, cfg, **kw)


# p0 = [1, 0, 0, 0]: mean 0.25, centred [0.75, -0.25, -0.25, -0.25], std sqrt((0.5625 + 3*0.0625)/4) = sqrt(0.1875)
# p1 = [1, 1, 0, 0]: mean 0.5,  centred [0.5, 0.5, -0.5, -0.5],      std 0.5
TWO_GROUPS = [[1, 0, 0, 0], [1, 1, 0, 0]]


def test_prompt_vs_batch_vs_no_normalization():
  none = prep(TWO_GROUPS, LossConfig(adv_norm="none", adv_eps=0.0)).advantages
  np.testing.assert_allclose(none, [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5], rtol=1e-6)
  prompt = prep(TWO_GROUPS, LossConfig(adv_norm="prompt", adv_eps=0.0)).advantages
  # p0 / 0.4330127 = [1.7320508, -0.5773503 x3]; p1 / 0.5 = [1, 1, -1, -1]
  np.testing.assert_allclose(prompt, [1.7320508, -0.5773503, -0.5773503, -0.5773503, 1, 1, -1, -1], rtol=1e-6)
  out = prep(TWO_GROUPS, LossConfig(adv_norm="batch", adv_eps=0.0))
  # batch std over all 8 centred values: sqrt((0.5625 + 3*0.0625 + 4*0.25)/8) = sqrt(0.21875) = 0.4677072
  # p0: 0.75/0.4677072 = 1.6035675, -0.25/0.4677072 = -0.5345225; p1: 0.5/0.4677072 = 1.0690450
  np.testing.assert_allclose(out.advantages, [1.6035675, -0.5345225, -0.5345225, -0.5345225,
                                              1.0690450, 1.0690450, -1.0690450, -1.0690450], rtol=1e-6)
  np.testing.assert_allclose(float(out.metrics["adv_scale"]), 0.4677072, rtol=1e-6)
  np.testing.assert_allclose(float(out.metrics["adv_std"]), 1.0, rtol=1e-6)
  # As the formulas say: batch/prompt = std_p / std_batch per group, 0.4330127/0.4677072 and 0.5/0.4677072.
  ratio = np.asarray(out.advantages) / np.asarray(prompt)
  np.testing.assert_allclose(ratio, [0.9258201] * 4 + [1.0690450] * 4, rtol=1e-6)


def test_default_eps_is_added_to_the_std():
  prompt = prep(TWO_GROUPS, LossConfig(adv_norm="prompt", adv_eps=1e-3)).advantages
  np.testing.assert_allclose(prompt[4], 0.5 / 0.501, rtol=1e-6)  # 0.5 / (0.5 + 1e-3)


def test_leave_one_out_baseline():
  out = prep(TWO_GROUPS, LossConfig(adv_norm="none", leave_one_out=True))
  # p0: 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3.  p1: 1 - mean(1, 0, 0) = 2/3; 0 - mean(1, 1, 0) = -2/3.
  # (= G/(G-1) = 4/3 times the plain centred values)
  np.testing.assert_allclose(out.advantages, [1, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3], rtol=1e-6)


def test_batch_std_is_taken_after_zero_variance_filtering():
  three = TWO_GROUPS + [[1, 1, 1, 1]]  # p2 has zero variance
  on = prep(three, LossConfig(adv_norm="batch", adv_eps=0.0))
  # filter on: p2 is dropped, the std is over p0, p1 only (0.4677072) and p2 gets 0 advantages and 0 weights
  np.testing.assert_allclose(on.advantages[:8], prep(TWO_GROUPS, LossConfig(adv_eps=0.0)).advantages, rtol=1e-6)
  assert np.all(np.asarray(on.advantages[8:]) == 0) and np.all(np.asarray(on.token_weights[8:]) == 0)
  assert float(on.metrics["kept_prompts"]) == 2.0
  off = prep(three, LossConfig(adv_norm="batch", adv_eps=0.0, zero_variance_filter=False))
  # filter off ("loo-batch"): p2's four zeros join the std: sqrt(1.75/12) = 0.3818813; 0.75/0.3818813 = 1.9639610
  np.testing.assert_allclose(off.advantages[0], 1.9639610, rtol=1e-6)
  assert float(off.metrics["kept_prompts"]) == 3.0 and float(np.sum(off.token_weights[8:])) > 0


def test_zero_variance_filter_uses_exact_equality_and_counts_groups():
  # +-1 rewards: p0 all +1, p1 all -1 -> zero variance; p2 mixed; p3 differs by one float32 ulp -> has variance
  rewards = np.array([[1, 1], [-1, -1], [1, -1], [0.5, np.nextafter(np.float32(0.5), np.float32(1))]], np.float32)
  out = prep(rewards, LossConfig())
  assert float(out.metrics["zero_variance_frac"]) == 0.5  # 2 of 4 groups
  assert float(out.metrics["kept_prompts"]) == 2.0
  w = np.asarray(out.token_weights)
  assert np.all(w[:4] == 0) and np.all(np.asarray(out.advantages[:4]) == 0)
  # prompt average over the 2 kept prompts, 2 samples x 2 tokens each: 1/(2*4) per loss token
  np.testing.assert_allclose(w[4:, 1:], 0.125)
  assert np.all(w[:, 0] == 0)


def test_zero_variance_groups_contribute_exactly_zero_to_the_loss():
  cfg = LossConfig(name="cispo")
  rng = np.random.default_rng(1)
  mask = uniform_mask(3, 2)
  logp = rng.uniform(-2, -0.1, mask.shape).astype(np.float32)
  gen = (logp + rng.normal(0, 0.3, mask.shape)).astype(np.float32)

  def loss_of(rewards, rows):
    p = rl.prepare(np.asarray(rewards, np.float32), mask[rows], np.zeros((len(rewards), 2), bool), cfg)
    b = TrainBatch(tokens=mask[rows].astype(np.int32), loss_mask=mask[rows], gen_logprobs=gen[rows],
                   advantages=p.advantages, token_weights=p.token_weights, sample_weights=p.sample_weights)
    return float(rl.policy_loss(jnp.asarray(logp[rows]), b, cfg)[0])

  with_zv = loss_of([[1, 0], [1, 1], [0, 1]], slice(0, 6))  # middle group solved
  without = loss_of([[1, 0], [0, 1]], np.array([0, 1, 4, 5]))
  assert with_zv != 0.0
  np.testing.assert_allclose(with_zv, without, rtol=1e-6)


def test_truncated_samples_are_excluded_from_group_stats_and_loss():
  rewards = [[1, 0, 0], [1, 1, 0]]
  truncated = [[False, False, True], [False, False, True]]
  out = prep(rewards, LossConfig(adv_norm="none", exclude_truncated=True), truncated=truncated)
  # p0 over valid [1, 0]: mean 0.5 -> [0.5, -0.5, 0]; p1 valid [1, 1] -> zero variance -> filtered
  np.testing.assert_allclose(out.advantages, [0.5, -0.5, 0, 0, 0, 0], atol=1e-7)
  w = np.asarray(out.token_weights)
  np.testing.assert_allclose(w[:2, 1:], 0.25)  # prompt average: 1 kept prompt, T_p = 2 samples x 2 tokens
  assert np.all(w[2:] == 0)
  assert float(out.metrics["truncated_frac"]) == pytest.approx(2 / 6)
  kept = prep(rewards, LossConfig(adv_norm="none", exclude_truncated=False), truncated=truncated)
  # every sample counts: p0 mean 1/3 -> [2/3, -1/3, -1/3]; p1 mean 2/3 -> [1/3, 1/3, -2/3]
  np.testing.assert_allclose(kept.advantages, [2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3], rtol=1e-6)


def test_truncated_reward_scores_truncated_samples_and_keeps_them_in_the_loss():
  rewards = [[1, 0.5, 0.5], [0.5, 0.5, 0.5]]  # a verifier's fallback paid two truncated samples 0.5
  truncated = [[False, False, True], [False, True, False]]
  out = prep(rewards, LossConfig(adv_norm="none", truncated_reward=0.0), truncated=truncated)
  # p0 [1, 0.5, 0] mean 0.5 -> [0.5, 0, -0.5]; p1 [0.5, 0, 0.5] (zero variance before the override) mean 1/3
  np.testing.assert_allclose(out.advantages, [0.5, 0, -0.5, 1 / 6, -1 / 3, 1 / 6], atol=1e-6)
  assert np.all(np.asarray(out.token_weights)[[2, 4], 1:] > 0)  # in the loss, with a negative advantage
  assert float(out.metrics["reward_mean"]) == pytest.approx((1.5 + 1.0) / 6)
  plain = prep(rewards, LossConfig(adv_norm="none"), truncated=truncated)  # default: the verifier's score
  np.testing.assert_allclose(plain.advantages, [1 / 3, -1 / 6, -1 / 6, 0, 0, 0], atol=1e-6)
  with pytest.raises(ConfigError, match="loss.truncated_reward"):
    load_config(overrides=["loss.truncated_reward=0", "loss.exclude_truncated=true"])


def test_length_penalty_formula():
  # L_max = 24, L_cache = 4: (24 - |y|)/4 - 1 clipped to [-1, 0]
  #   18 -> 0.5 -> 0;  20 -> 0;  21 -> -0.25;  22 -> -0.5;  24 -> -1;  30 -> -2.5 -> -1
  lengths = np.array([[18, 20, 21, 22, 24, 30]])
  pen = rl.length_penalty(lengths, np.ones_like(lengths, bool), 24, 4)
  np.testing.assert_allclose(pen, [[0, 0, -0.25, -0.5, -1, -1]])
  assert np.all(np.asarray(rl.length_penalty(lengths, np.zeros_like(lengths, bool), 24, 4)) == 0)


def test_length_penalty_in_prepare_is_added_to_correct_samples_only():
  cfg = LossConfig(adv_norm="none", length_penalty=True, length_penalty_max=24, length_penalty_cache=4)
  # p0: both correct, lengths 20 and 22 -> rewards [1 + 0, 1 - 0.5] = [1, 0.5]: no longer zero-variance,
  #     advantages [0.25, -0.25].  p1: both wrong, lengths 30 and 30 -> no penalty -> [0, 0]: filtered.
  out = prep([[1, 1], [0, 0]], cfg, lengths_PG=[[20, 22], [30, 30]], correct_PG=[[True, True], [False, False]])
  np.testing.assert_allclose(out.advantages, [0.25, -0.25, 0, 0], atol=1e-7)
  np.testing.assert_allclose(float(out.metrics["length_penalty_mean"]), -0.5 / 4)
  assert float(out.metrics["kept_prompts"]) == 1.0
  with pytest.raises(ValueError, match="loss.length_penalty"):
    prep([[1, 1], [0, 0]], cfg)


# The 2-prompt x 2-sample example of test_rl_losses: loss tokens per row 3, 2, 1, 3.
HAND_MASK = np.array([[0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1]], np.float32)


@pytest.mark.parametrize("agg,row_weights", [
    ("prompt", [1 / 10, 1 / 10, 1 / 8, 1 / 8]),  # 1/(P_kept T_p): T_p0 = 3 + 2, T_p1 = 1 + 3, P_kept = 2
    ("sample", [1 / 12, 1 / 8, 1 / 4, 1 / 12]),  # 1/(N_s |y|): N_s = 4, |y| = 3, 2, 1, 3
    ("token", [1 / 9] * 4),  # 1/N_tok, N_tok = 9
    ("seq_mean_token_sum", [1 / 4] * 4),  # 1/N_s
])
def test_aggregation_weights(agg, row_weights):
  out = rl.prepare(np.array([[1, 0], [0, 1]], np.float32), HAND_MASK, np.zeros((2, 2), bool),
                   LossConfig(aggregation=agg))
  np.testing.assert_allclose(out.token_weights, HAND_MASK * np.array(row_weights)[:, None], rtol=1e-6)
  np.testing.assert_allclose(out.sample_weights, np.array(row_weights) * [3, 2, 1, 3], rtol=1e-6)
  # prompt, sample and token averages are means: their weights sum to 1
  if agg != "seq_mean_token_sum":
    np.testing.assert_allclose(float(jnp.sum(out.token_weights)), 1.0, rtol=1e-6)


def test_everything_filtered_gives_zero_weights_and_finite_metrics():
  out = prep([[1, 1], [0, 0]], LossConfig())
  assert np.all(np.asarray(out.token_weights) == 0) and np.all(np.asarray(out.advantages) == 0)
  assert all(np.isfinite(float(v)) for v in out.metrics.values())
  assert float(out.metrics["zero_variance_frac"]) == 1.0


def test_forced_tokens_carry_no_loss():
  completion = np.array([[0, 1, 1, 1, 1]], bool)
  forced = np.array([[0, 0, 1, 1, 0]], bool)  # the inserted end-of-thinking phrase
  np.testing.assert_array_equal(rl.loss_token_mask(completion, forced), [[0, 1, 0, 0, 1]])


def test_prepare_under_jit_matches_eager():
  cfg = LossConfig(leave_one_out=True, length_penalty=True, exclude_truncated=True)
  kw = dict(lengths_PG=np.array([[20, 23, 9, 9]] * 2), correct_PG=np.array([[1, 1, 0, 0]] * 2, bool))
  mask, trunc = uniform_mask(2, 4), np.array([[0, 0, 0, 1], [0] * 4], bool)
  rewards = np.array(TWO_GROUPS, np.float32)
  eager = rl.prepare(rewards, mask, trunc, cfg, **kw)
  jitted = jax.jit(rl.prepare, static_argnames="cfg")(rewards, mask, trunc, cfg, **kw)
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_row_count_mismatch_is_reported():
  with pytest.raises(ValueError, match="P\\*G"):
    rl.prepare(np.zeros((2, 2), np.float32), np.ones((3, 4), np.float32), np.zeros((2, 2), bool), LossConfig())
