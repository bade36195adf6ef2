"""Sampler-trainer mismatch (rl/mismatch.py): behaviour policy, tis / mask / seq_mask factors, their diagnostics.

The hand example of tests/test_rl_losses.py: 2 prompts x 2 samples, logp = -1 on every loss token, and the
sampler's log-probs set so that w = pi_theta / pi_sampler per loss token is

  row  A      w per loss token      |y|   geometric mean g_b            L_b = sum log w = log prod w
  b0   +0.5   1.0, 1.25, 5.0        3     6.25^(1/3) = 1.8420157     ln 6.25 = 1.8325815
  b1   -0.5   0.5, 1.0              2     0.5^(1/2)  = 0.7071068     ln 0.5  = -0.6931472
  b2   -0.5   4.5                   1     4.5                        ln 4.5  = 1.5040774
  b3   +0.5   1.0, 0.9, 1.1         3     0.99^(1/3) = 0.9966555     ln 0.99 = -0.0100503

Bounds used below (away from every w, so float rounding cannot move a token across one): tis cap C = 2; mask keeps
0.6 <= w <= 4 (drops b0's 5.0, b1's 0.5, b2's 4.5); seq_mask keeps 0.7 <= g_b <= 2 (drops b2).

With behavior=trainer rho = exp(logp - sg(logp)) = 1, so every token loss has the plain policy gradient
d l / d logp = -A, times the factor f: d loss / d logp[b,t] = -tw[b,t] f[b,t] A_b. Its value is f A (cispo:
-f A logp with logp = -1) or -f A (clipped family: -f min(rho A, clip(rho) A) = -f A). Aggregating per-row sums R_b
(hand formulas of aggregation.py): prompt (R0 + R1)/10 + (R2 + R3)/8; sample R0/12 + R1/8 + R2/4 + R3/12;
token sum R / 9; seq_mean_token_sum sum R / 4. Token weights per row: TW_ROW below.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import rl
from scalerl_jax.config import ConfigError, LossConfig, RunConfig, validate
from tests.test_rl_losses import AGGS, ROWS_MASK, example, make_batch, two_micro_batches

eager_value_and_grad = jax.value_and_grad(rl.policy_loss, has_aux=True)
A = np.array([0.5, -0.5, -0.5, 0.5])
TW_ROW = {"prompt": [1 / 10, 1 / 10, 1 / 8, 1 / 8], "sample": [1 / 12, 1 / 8, 1 / 4, 1 / 12],
          "token": [1 / 9] * 4, "seq_mean_token_sum": [1 / 4] * 4}
BOUNDS = dict(mismatch_cap=2.0, mismatch_low=0.6, mismatch_high=4.0, mismatch_seq_low=0.7, mismatch_seq_high=2.0)


def cfg_of(name, agg="prompt", **kw):
  return LossConfig(name=name, aggregation=agg, adv_norm="none", **{**BOUNDS, **kw})


def aggregate_rows(R, agg):
  """The hand formulas of the module docstring."""
  return {"prompt": (R[0] + R[1]) / 10 + (R[2] + R[3]) / 8, "sample": R[0] / 12 + R[1] / 8 + R[2] / 4 + R[3] / 12,
          "token": sum(R) / 9, "seq_mean_token_sum": sum(R) / 4}[agg]


def run(cfg, logp=None, gen=None, mask=None):
  lp, m, g = example()
  logp, gen, mask = (lp if logp is None else logp), (g if gen is None else gen), (m if mask is None else mask)
  (loss, metrics), grad = eager_value_and_grad(jnp.asarray(logp), make_batch(cfg, mask, gen), cfg)
  return float(loss), metrics, np.asarray(grad)


def token_grad(F, agg):
  """-tw f A on the loss tokens (column 0 is the prompt token)."""
  return -np.asarray(TW_ROW[agg])[:, None] * np.asarray(F) * A[:, None] * ROWS_MASK


# Factors f per token of behavior=trainer (columns: prompt token, then the loss tokens; 0 off the loss):
F_TIS = [[0, 1, 1.25, 2], [0, 0.5, 1, 0], [0, 2, 0, 0], [0, 1, 0.9, 1.1]]  # min(w, 2)
F_MASK = [[0, 1, 1.25, 0], [0, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0.9, 1.1]]  # w * 1[0.6 <= w <= 4]
F_SEQ = [[0, 1, 1.25, 5], [0, 0.5, 1, 0], [0, 0, 0, 0], [0, 1, 0.9, 1.1]]  # w * 1[0.7 <= g_b <= 2]: b2 dropped
# Per-row sums R_b = A_b sum_t f (the cispo value; the clipped family's is -R_b):
#   tis:      b0 0.5 (1 + 1.25 + 2) = 2.125   b1 -0.5 (0.5 + 1) = -0.75   b2 -0.5 * 2 = -1   b3 0.5 * 3 = 1.5
#   mask:     b0 0.5 * 2.25 = 1.125           b1 -0.5 * 1 = -0.5          b2 0               b3 1.5
#   seq_mask: b0 0.5 * 7.25 = 3.625           b1 -0.75                    b2 0               b3 1.5
R_TRAINER = {"tis": (2.125, -0.75, -1.0, 1.5), "mask": (1.125, -0.5, 0.0, 1.5), "seq_mask": (3.625, -0.75, 0.0, 1.5)}
F_TRAINER = {"tis": F_TIS, "mask": F_MASK, "seq_mask": F_SEQ}
# e.g. tis/prompt: (2.125 - 0.75)/10 + (-1 + 1.5)/8 = 0.1375 + 0.0625 = 0.2; mask/sample: 1.125/12 - 0.5/8 + 1.5/12
# = 0.09375 - 0.0625 + 0.125 = 0.15625; seq_mask/token: (3.625 - 0.75 + 1.5)/9 = 4.375/9.
SPOT = {("tis", "prompt"): 0.2, ("mask", "sample"): 0.15625, ("seq_mask", "token"): 4.375 / 9}


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mismatch", ["tis", "mask", "seq_mask"])
def test_trainer_behaviour_factor_values_and_gradients(mismatch, agg):
  want_R = aggregate_rows(R_TRAINER[mismatch], agg)
  if (mismatch, agg) in SPOT:
    np.testing.assert_allclose(want_R, SPOT[(mismatch, agg)], rtol=1e-12)  # the formula is the arithmetic above
  want_grad = token_grad(F_TRAINER[mismatch], agg)
  for name, sign in (("cispo", 1.0), ("grpo", -1.0), ("dapo", -1.0)):
    loss, _, grad = run(cfg_of(name, agg, behavior="trainer", mismatch=mismatch))
    np.testing.assert_allclose(loss, sign * want_R, rtol=2e-6, atol=1e-7, err_msg=f"{name}/{mismatch}/{agg}")
    np.testing.assert_allclose(grad, want_grad, rtol=2e-6, atol=1e-8, err_msg=f"{name}/{mismatch}/{agg}")


# behavior=sampler: the ratio already carries w, the factor is the bound alone (mask: 1[0.6 <= w <= 4]; seq_mask:
# 1[0.7 <= g_b <= 2]). cispo's per-token value is min(w, 4) A (logp = -1), its gradient -tw min(w, 4) A:
#   mask:      b0 [0.5, 0.625, dropped] = 1.125   b1 [dropped, -0.5] = -0.5   b2 dropped 0   b3 [0.5, 0.45, 0.55] = 1.5
#              -- the same rows as trainer+mask: IcePop's M(w) = w 1[band] either way, since min(w, 4) = w in the band
#   seq_mask:  b0 [0.5, 0.625, 4 * 0.5 = 2] = 3.125   b1 [-0.25, -0.5] = -0.75   b2 dropped 0   b3 1.5
#              -- here b0's 5.0 is capped at eps_max = 4 (trainer+seq_mask weights it by the full w = 5)
R_SAMPLER_CISPO = {"mask": (1.125, -0.5, 0.0, 1.5), "seq_mask": (3.125, -0.75, 0.0, 1.5)}
F_SAMPLER_CISPO = {"mask": F_MASK, "seq_mask": [[0, 1, 1.25, 4], [0, 0.5, 1, 0], [0, 0, 0, 0], [0, 1, 0.9, 1.1]]}


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mismatch", ["mask", "seq_mask"])
def test_sampler_behaviour_masks_on_cispo(mismatch, agg):
  loss, _, grad = run(cfg_of("cispo", agg, mismatch=mismatch))
  np.testing.assert_allclose(loss, aggregate_rows(R_SAMPLER_CISPO[mismatch], agg), rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(grad, token_grad(F_SAMPLER_CISPO[mismatch], agg), rtol=2e-6, atol=1e-8)
  plain, _, _ = run(cfg_of("cispo", agg))  # computed differently: without the mask the loss is another number
  assert abs(plain - loss) > 1e-3


def test_sampler_behaviour_mask_on_dapo():
  # dapo, clip(rho, 0.8, 1.28), value -min(rho A, clip(rho) A); mask keeps 0.6 <= w <= 4:
  #   b0 [-0.5, -0.625, dropped] = -1.125   b1 [dropped, -min(-0.5, -0.4) = 0.5]   b2 dropped   b3 -1.5
  #   prompt: (-1.125 + 0.5)/10 - 1.5/8 = -0.0625 - 0.1875 = -0.25
  # gradient -tw A rho where unclipped: b0 -0.1*0.5*[1, 1.25]; b1's w = 1: +0.1*0.5; b3 -0.125*0.5*[1, 0.9, 1.1]
  loss, _, grad = run(cfg_of("dapo", mismatch="mask"))
  np.testing.assert_allclose(loss, -0.25, rtol=2e-6)
  want = [[0, -0.05, -0.0625, 0], [0, 0, 0.05, 0], [0, 0, 0, 0], [0, -0.0625, -0.05625, -0.06875]]
  np.testing.assert_allclose(grad, want, rtol=2e-6, atol=1e-8)


def test_behaviour_decides_whether_the_clip_sees_the_mismatch():
  """dapo with mismatched tokens: under the sampler, b0's w = 5 (A > 0) and b1's w = 0.5 (A < 0) are clipped to a
  zero gradient; under the trainer the ratio is 1 and both carry the policy gradient -tw A (times tis's min(w, 2))."""
  _, m_s, g_sampler = run(cfg_of("dapo"))
  _, m_t, g_trainer = run(cfg_of("dapo", behavior="trainer"))
  _, _, g_tis = run(cfg_of("dapo", behavior="trainer", mismatch="tis"))
  assert g_sampler[0, 3] == 0 and g_sampler[1, 1] == 0
  # trainer, no correction: -0.1 * 0.5 = -0.05 (b0, 3rd token), -0.1 * -0.5 = +0.05 (b1, 1st)
  np.testing.assert_allclose([g_trainer[0, 3], g_trainer[1, 1]], [-0.05, 0.05], rtol=1e-6)
  # trainer + tis: times min(5, 2) = 2 and min(0.5, 2) = 0.5
  np.testing.assert_allclose([g_tis[0, 3], g_tis[1, 1]], [-0.1, 0.025], rtol=1e-6)
  # the sampler's clip fractions count those tokens; the trainer's ratio never leaves the clip band
  f_s, f_t = rl.finalize_metrics(m_s), rl.finalize_metrics(m_t)
  np.testing.assert_allclose([f_s["clip_frac_upper"], f_s["clip_frac_lower"]], [1 / 9, 1 / 9])
  assert (f_t["clip_frac_upper"], f_t["clip_frac_lower"]) == (0.0, 0.0)


# gspo, sequence weights sw_b = |y_b| * token weight: prompt 0.3, 0.2, 0.125, 0.375; sample 1/4 each;
# token 3/9, 2/9, 1/9, 3/9; seq_mean_token_sum 3/4, 2/4, 1/4, 3/4.
SEQ_W = {"prompt": [0.3, 0.2, 0.125, 0.375], "sample": [0.25] * 4, "token": [3 / 9, 2 / 9, 1 / 9, 3 / 9],
         "seq_mean_token_sum": [0.75, 0.5, 0.25, 0.75]}
LEN = np.array([3, 2, 1, 3])
# seq_mask keeps b0, b1, b3 (g = 1.842, 0.707, 0.997), drops b2 (g = 4.5).
# trainer: s_b = 1, l_b = -A_b, f_b = g_b keep_b; loss = sum sw f (-A), d loss / d logp_t = -sw_b f_b A_b / |y_b|
#   prompt: -0.3*1.8420157*0.5 + 0.2*0.7071068*0.5 - 0.375*0.9966555*0.5 = -0.2763024 + 0.0707107 - 0.1868729
F_GSPO_TRAINER = np.array([1.8420157, 0.7071068, 0.0, 0.9966555])
# sampler: f_b = keep_b on the per-row losses of test_rl_losses: -0.5025, 0.4985, (2.25 dropped), -0.4983277
L_GSPO_SAMPLER = np.array([-0.5025, 0.4985, 0.0, -0.4983277])


@pytest.mark.parametrize("agg", AGGS)
def test_gspo_sequence_mask_under_both_behaviours(agg):
  sw = np.asarray(SEQ_W[agg])
  loss, _, grad = run(cfg_of("gspo", agg, behavior="trainer", mismatch="seq_mask"))
  want = float(np.sum(sw * F_GSPO_TRAINER * -A))
  if agg == "prompt":
    np.testing.assert_allclose(want, -0.2763024 + 0.0707107 - 0.1868729, rtol=1e-6)
  np.testing.assert_allclose(loss, want, rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(grad, (-sw * F_GSPO_TRAINER * A / LEN)[:, None] * ROWS_MASK, rtol=2e-6, atol=1e-8)
  loss_s, _, _ = run(cfg_of("gspo", agg, mismatch="seq_mask"))
  np.testing.assert_allclose(loss_s, float(np.sum(sw * L_GSPO_SAMPLER)), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("overrides,key", [
    (dict(name="gspo", behavior="trainer", mismatch="tis"), "loss.mismatch"),
    (dict(name="gspo", mismatch="mask"), "loss.mismatch"),
    (dict(mismatch="tis"), "loss.mismatch"),  # tis with behavior=sampler would weight by w twice
    (dict(mismatch_cap=0.5), "loss.mismatch_cap"),
    (dict(mismatch_low=1.0), "loss.mismatch_low"),
    (dict(mismatch_high=1.0), "loss.mismatch_high"),
    (dict(mismatch_seq_low=-0.1), "loss.mismatch_seq_low"),
    (dict(mismatch_seq_high=0.99), "loss.mismatch_seq_high"),
])
def test_refused_settings_name_their_key(overrides, key):
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    validate(RunConfig(loss=LossConfig(**overrides)))


def test_accepted_settings_pass_validation():
  for kw in (dict(name="gspo", mismatch="seq_mask"), dict(behavior="trainer", mismatch="tis"),
             dict(mismatch="mask"), dict(name="dapo", behavior="trainer", mismatch="seq_mask")):
    validate(RunConfig(loss=LossConfig(**kw)))


def test_policy_loss_refuses_a_token_correction_on_gspo_and_tis_without_trainer():
  with pytest.raises(ConfigError, match="loss.mismatch: mask is per token"):
    run(cfg_of("gspo", behavior="trainer", mismatch="mask"))
  with pytest.raises(ConfigError, match="loss.behavior=trainer"):
    run(cfg_of("cispo", mismatch="tis"))


@pytest.mark.parametrize("mismatch,ess", [
    # tis f = min(w, 2) = [1, 1.25, 2, 0.5, 1, 2, 1, 0.9, 1.1]: sum 10.75, sum f^2 = 1 + 1.5625 + 4 + 0.25 + 1 + 4
    # + 1 + 0.81 + 1.21 = 14.8325 -> 10.75^2 / (9 * 14.8325) = 115.5625 / 133.4925
    ("tis", 115.5625 / 133.4925),
    # mask f = w 1[band] = [1, 1.25, 0, 0, 1, 0, 1, 0.9, 1.1]: sum 6.25, sum f^2 = 1 + 1.5625 + 1 + 1 + 0.81 + 1.21
    # = 6.5825 -> 39.0625 / (9 * 6.5825) = 39.0625 / 59.2425
    ("mask", 39.0625 / 59.2425),
    ("none", 1.0),  # f = 1
])
def test_diagnostics_by_hand(mismatch, ess):
  _, m, _ = run(cfg_of("grpo", behavior="trainer", mismatch=mismatch))
  f = rl.finalize_metrics(m)
  # The same whatever the correction (bounds C = 2, [0.6, 4], [0.7, 2]):
  #   truncated (w > 2): 5.0 and 4.5 -> 2/9; masked (w outside [0.6, 4]): 5.0, 0.5, 4.5 -> 3/9
  #   k3 per sequence W - 1 - L: b0 6.25 - 1 - 1.8325815 = 3.4174185, b1 0.5 - 1 + 0.6931472 = 0.1931472,
  #     b2 4.5 - 1 - 1.5040774 = 1.9959226, b3 0.99 - 1 + 0.0100503 = 0.0000503; mean 5.6065386 / 4
  #   sequences masked (g outside [0.7, 2]): b2 -> 1/4; largest g: 4.5
  #   sequence ESS: sum W = 6.25 + 0.5 + 4.5 + 0.99 = 12.24, sum W^2 = 39.0625 + 0.25 + 20.25 + 0.9801 = 60.5426
  #     -> 12.24^2 / (4 * 60.5426) = 149.8176 / 242.1704
  #   per-token k3 (test_rl_losses: its ratios): sum (w - 1 - ln w) = 16.25 - 9 - ln 13.921875
  want = {"mismatch_truncated_frac": 2 / 9, "mismatch_masked_frac": 3 / 9, "mismatch_ess": ess,
          "mismatch_seq_kl": 5.6065386 / 4, "mismatch_seq_masked_frac": 0.25, "mismatch_seq_max": 4.5,
          "mismatch_seq_ess": 149.8176 / 242.1704, "mismatch_kl": (16.25 - 9 - np.log(13.921875)) / 9,
          "ratio_max": 5.0}
  for k, v in want.items():
    np.testing.assert_allclose(f[k], v, rtol=2e-6, atol=1e-7, err_msg=k)


def test_diagnostics_follow_their_own_bounds():
  _, m, _ = run(cfg_of("cispo", mismatch_cap=1.2, mismatch_high=4.8, mismatch_seq_low=0.75, mismatch_seq_high=1.9))
  f = rl.finalize_metrics(m)
  # w > 1.2: 1.25, 5.0, 4.5 -> 3/9; outside [0.6, 4.8]: 5.0, 0.5 -> 2/9; g outside [0.75, 1.9]: b1 0.707, b2 4.5 -> 2/4
  np.testing.assert_allclose([f["mismatch_truncated_frac"], f["mismatch_masked_frac"], f["mismatch_seq_masked_frac"]],
                             [3 / 9, 2 / 9, 0.5], rtol=1e-6)


def test_sampler_mask_ess_is_the_kept_fraction():
  _, m, _ = run(cfg_of("cispo", mismatch="mask"))
  # f = 1[band]: 6 of 9 tokens kept -> 6^2 / (9 * 6) = 2/3
  np.testing.assert_allclose(rl.finalize_metrics(m)["mismatch_ess"], 2 / 3, rtol=1e-6)


MICRO_CFGS = {"grpo-trainer-tis": cfg_of("grpo", behavior="trainer", mismatch="tis"),
              "cispo-sampler-mask": cfg_of("cispo", mismatch="mask"),
              "dapo-trainer-seq_mask": cfg_of("dapo", "token", behavior="trainer", mismatch="seq_mask"),
              "gspo-trainer-seq_mask": cfg_of("gspo", "sample", behavior="trainer", mismatch="seq_mask")}


@pytest.mark.parametrize("key", MICRO_CFGS)
def test_micro_batches_add_up(key):
  cfg = MICRO_CFGS[key]
  logp, mask, gen = example()
  batch = make_batch(cfg, mask, gen)
  (loss, m), grad = eager_value_and_grad(jnp.asarray(logp), batch, cfg)
  parts, grads, acc = two_micro_batches(eager_value_and_grad, logp, batch, cfg)
  uncorrected = dataclasses.replace(cfg, mismatch="none")
  assert abs(float(rl.policy_loss(jnp.asarray(logp), batch, uncorrected)[0]) - float(loss)) > 1e-3  # f acts
  assert all(abs(p) > 1e-4 for p in parts)  # both micro-batches contribute
  np.testing.assert_allclose(sum(parts), float(loss), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.concatenate(grads), np.asarray(grad), rtol=1e-6, atol=1e-9)
  full, split = rl.finalize_metrics(m), rl.finalize_metrics(acc)
  assert set(full) >= {"mismatch_seq_kl", "mismatch_seq_max", "mismatch_ess"}
  for k in full:
    np.testing.assert_allclose(split[k], full[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_jitted_scan_over_micro_batches_matches_the_full_batch():
  cfg = MICRO_CFGS["dapo-trainer-seq_mask"]
  logp, mask, gen = example()
  batch = make_batch(cfg, mask, gen)
  stacked = jax.tree.map(lambda x: x.reshape(2, 2, *x.shape[1:]), batch)

  @jax.jit
  def step(logp_MBT, micro):
    def body(carry, xs):
      (l, m), g = eager_value_and_grad(xs[0], xs[1], cfg)
      return (carry[0] + l, rl.accumulate_metrics(carry[1], m)), g
    return jax.lax.scan(body, (jnp.float32(0.0), rl.empty_metrics()), (logp_MBT, micro))

  (loss, acc), g_M = step(jnp.asarray(logp).reshape(2, 2, -1), stacked)
  # dapo trainer + seq_mask, token aggregation: value -sum R / 9 with R = (3.625, -0.75, 0, 1.5)
  np.testing.assert_allclose(float(loss), -4.375 / 9, rtol=2e-6)
  np.testing.assert_allclose(np.asarray(g_M).reshape(4, -1), token_grad(F_SEQ, "token"), rtol=2e-6, atol=1e-8)
  np.testing.assert_allclose(rl.finalize_metrics(acc)["mismatch_seq_masked_frac"], 0.25)


def test_trainer_behaviour_equals_an_explicit_recompute_of_the_pre_update_policy():
  """behavior=trainer takes pi_old as sg of the step's own forward (no extra forward). That is exactly the decoupled
  loss with pi_old recomputed by a separate forward of the pre-update params, as a trainer with several updates per
  batch would have to: same loss and gradient on a real policy; and the micro-batched step accumulates it exactly."""
  from scalerl_jax.config import ModelConfig
  from scalerl_jax.model import Policy, token_logprobs
  from scalerl_jax.train.rl_loss import make_rl_loss
  from scalerl_jax.train.step import accumulate_gradients
  from tests.model_helpers import rl_batch

  policy = Policy(ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2,
                              head_dim=8, max_seq_len=16))
  params = policy.init(0)
  batch = rl_batch(4, 2, 5, 6, 32)
  old_BT = token_logprobs(policy, params, batch.tokens)  # the explicit recompute: a second forward
  u_BT = np.random.default_rng(1).uniform(-1.2, 1.2, old_BT.shape)
  m_BT = np.asarray(batch.loss_mask)
  batch = dataclasses.replace(batch, gen_logprobs=np.where(m_BT > 0, old_BT - u_BT, 0).astype(np.float32))
  cfg = LossConfig(name="dapo", behavior="trainer", mismatch="mask")  # keeps 0.5 <= w <= 5 (w = e^u in [0.3, 3.3])

  def decoupled(p):
    logp_BT = jnp.where(m_BT > 0, token_logprobs(policy, p, batch.tokens), 0.0)
    old = jnp.where(m_BT > 0, old_BT, 0.0)
    rho_BT, w_BT = jnp.exp(logp_BT - old), jnp.exp(old - batch.gen_logprobs)
    f_BT = w_BT * ((w_BT >= 0.5) & (w_BT <= 5.0))
    a_B1 = batch.advantages[:, None]
    j_BT = jnp.minimum(rho_BT * a_B1, jnp.clip(rho_BT, 0.8, 1.28) * a_B1)
    return jnp.sum(batch.token_weights * f_BT * -j_BT)

  w = np.exp(u_BT)[m_BT > 0]
  assert np.any(w < 0.5) and np.any((w > 0.5) & (w != 1.0))  # some tokens dropped, the rest reweighted
  loss_fn = make_rl_loss(policy, cfg, temperature=1.0)
  # float32 sums in another order (a second forward, jit against eager): ulps of each leaf's largest entry
  (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
  ref_loss, ref_grads = jax.value_and_grad(decoupled)(params)
  assert abs(float(ref_loss)) > 1e-4
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5 * np.abs(r).max())

  accumulate = jax.jit(lambda p, b: accumulate_gradients(loss_fn, p, b, 2, rl.empty_metrics, rl.accumulate_metrics))
  loss_2, metrics_2, grads_2 = accumulate(params, batch)
  np.testing.assert_allclose(float(loss_2), float(loss), rtol=1e-5)
  for g, r in zip(jax.tree.leaves(grads_2), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5 * np.abs(r).max())
  f = rl.finalize_metrics(metrics_2)
  np.testing.assert_allclose(f["mismatch_masked_frac"], np.mean((w < 0.5) | (w > 5)), rtol=1e-6)
