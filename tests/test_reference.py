"""A frozen reference policy (rl/reference.py, train/reference.py): the KL estimators and where their term goes,
on-policy distillation's per-token advantage, the teacher's tokenizer check, and a few real train steps.

Hand numbers. Per loss token d = log pi_theta - log pi_ref; at d = 0.5, -1, 0:
  k1 = d                   =  0.5,        -1,          0     d k1/d logp = 1
  k2 = d^2 / 2             =  0.125,       0.5,        0     d k2/d logp = d = 0.5, -1, 0
  k3 = exp(-d) + d - 1     =  0.1065307,   0.7182818,  0     d k3/d logp = 1 - exp(-d) = 0.3934693, -1.7182818, 0
  (exp(-0.5) = 0.6065307, exp(1) = 2.7182818)
The loss-level tests reuse tests/test_rl_losses.py's example (logp = -1 on its 9 loss tokens, rho per token there)
with aggregation=token (token weight 1/9 on each loss token) and the reference at d = 0.5 on every loss token.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import rl
from scalerl_jax.config import ConfigError, LossConfig, ModelConfig, OptimizerConfig, load_config
from scalerl_jax.data.tokenizer import CharTokenizer
from scalerl_jax.mesh import TRAIN_RULES, Layout, make_mesh
from scalerl_jax.model import Policy, token_logprobs
from scalerl_jax.train import reference as ref_lib
from scalerl_jax.train.rl_loss import make_rl_loss
from scalerl_jax.train.state import init_train_state, make_optimizer
from scalerl_jax.train.step import make_train_step
from scalerl_jax.types import TrainBatch
from tests.test_rl_losses import ROWS_RHO, example, make_batch

eager_value_and_grad = lambda f: jax.value_and_grad(f, argnums=(0, 1), has_aux=True)  # noqa: E731
D = np.array([0.5, -1.0, 0.0], np.float32)
LOGP = np.array([-1.0, -2.0, -0.5], np.float32)
K = {"k1": [0.5, -1.0, 0.0], "k2": [0.125, 0.5, 0.0], "k3": [0.1065307, 0.7182818, 0.0]}
DK = {"k1": [1.0, 1.0, 1.0], "k2": [0.5, -1.0, 0.0], "k3": [0.3934693, -1.7182818, 0.0]}
BETA = 0.1
K3_HALF, DK3_HALF = 0.1065307, 0.3934693  # k3 and its derivative at d = 0.5


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_values_and_gradients_by_hand(estimator):
  ref = LOGP - D
  k = rl.kl_estimate(jnp.asarray(LOGP), jnp.asarray(ref), estimator, clamp=20.0)
  np.testing.assert_allclose(k, K[estimator], rtol=1e-6, atol=1e-7)
  grad = jax.grad(lambda lp: jnp.sum(rl.kl_estimate(lp, jnp.asarray(ref), estimator, 20.0)))(jnp.asarray(LOGP))
  np.testing.assert_allclose(grad, DK[estimator], rtol=1e-6, atol=1e-7)


def test_k3_is_clamped_before_its_exp():
  """d = -1000 (a reference far likelier than the trainer): clamped to -20, so k3 = exp(20) - 21, finite."""
  k = rl.kl_estimate(jnp.float32(-1000.0), jnp.float32(0.0), "k3", clamp=20.0)
  np.testing.assert_allclose(k, np.exp(20.0) - 21.0, rtol=1e-6)


def _batch_with(cfg, ref=None, teacher=None):
  """The test_rl_losses example (logp = -1 on loss tokens) with reference / teacher log-probs on its loss tokens;
  padding holds NaN, which must not reach the loss."""
  logp, mask, gen = example()
  batch = make_batch(cfg, mask, gen)
  fill = lambda v: None if v is None else np.where(mask > 0, np.float32(v), np.nan).astype(np.float32)
  return logp, mask, dataclasses.replace(batch, ref_logprobs=fill(ref), teacher_logprobs=fill(teacher))


def _loss_and_grads(cfg, batch, logp):
  """(loss, metric sums, d loss / d logp, d loss / d ref_logprobs or None)."""
  ref = None if batch.ref_logprobs is None else jnp.asarray(batch.ref_logprobs)
  loss_of = lambda lp, r: rl.policy_loss(lp, dataclasses.replace(batch, ref_logprobs=r), cfg)
  (loss, metrics), (g_logp, g_ref) = eager_value_and_grad(loss_of)(jnp.asarray(logp), ref)
  return float(loss), metrics, np.asarray(g_logp), g_ref


@pytest.mark.parametrize("name", ["cispo", "dapo"])
def test_kl_loss_term_adds_beta_k_with_its_gradient(name):
  """kl_mode=loss: loss += beta sum_t (1/9) k3 = beta k3(0.5) (nine tokens of weight 1/9), and each loss token's
  gradient gains beta (1/9) (1 - exp(-0.5)); the reference's log-probs get the opposite (d k3 / d ref = -dk3)."""
  base_cfg = LossConfig(name=name, aggregation="token", adv_norm="none")
  cfg = dataclasses.replace(base_cfg, kl_coef=BETA, kl_estimator="k3", kl_mode="loss")
  logp, mask, batch = _batch_with(cfg, ref=-1.5)  # d = -1 - (-1.5) = 0.5
  loss, metrics, g, g_ref = _loss_and_grads(cfg, batch, logp)
  loss0, _, g0, _ = _loss_and_grads(base_cfg, dataclasses.replace(batch, ref_logprobs=None), np.nan_to_num(logp))
  assert loss != loss0  # computed differently: the term is there
  np.testing.assert_allclose(loss - loss0, BETA * K3_HALF, rtol=1e-5)
  np.testing.assert_allclose(g - g0, np.where(mask > 0, BETA / 9 * DK3_HALF, 0.0), rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(np.asarray(g_ref), np.where(mask > 0, -BETA / 9 * DK3_HALF, 0.0),
                             rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(rl.finalize_metrics(metrics)["kl"], K3_HALF, rtol=1e-5)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_reward_mode_is_a_stop_gradient_penalty_on_each_tokens_advantage(estimator):
  """kl_mode=reward, cispo: A[b,t] = A_b - beta sg(k), so with logp = -1 each token's loss -w A logp becomes
  w (A_b - beta k): the loss moves by -beta k sum_t w / 9 with sum_t w = 6.25 + 1.5 + 4 + 3 = 14.75 (w = min(rho, 4)),
  each token's gradient -w A[b,t] / 9 moves by +beta k w / 9, and nothing flows into the reference (sg)."""
  base_cfg = LossConfig(name="cispo", aggregation="token", adv_norm="none")
  cfg = dataclasses.replace(base_cfg, kl_coef=BETA, kl_estimator=estimator, kl_mode="reward")
  logp, mask, batch = _batch_with(cfg, ref=-1.5)
  loss, metrics, g, g_ref = _loss_and_grads(cfg, batch, logp)
  loss0, _, g0, _ = _loss_and_grads(base_cfg, dataclasses.replace(batch, ref_logprobs=None), logp)
  k = K[estimator][0]  # d = 0.5 on every loss token
  np.testing.assert_allclose(loss - loss0, -BETA * k * 14.75 / 9, rtol=1e-5)
  w = np.minimum(ROWS_RHO, 4.0)
  np.testing.assert_allclose(g - g0, np.where(mask > 0, BETA * k * w / 9, 0.0), rtol=1e-5, atol=1e-8)
  np.testing.assert_array_equal(np.asarray(g_ref), 0.0)
  np.testing.assert_allclose(rl.finalize_metrics(metrics)["kl"], k, rtol=1e-5)


def test_the_two_kl_modes_differ_as_documented():
  """Same k3 and beta: the loss mode's gradient on a token is beta (1 - exp(-d)) / 9 more than without the term,
  the reward mode's beta k3 w / 9 (a reweighted policy gradient, no derivative of k): different, both hand-checked
  above; with k1 the loss mode's extra gradient is the constant beta / 9 whatever d (its score-function mean is 0)."""
  cfgs = {m: LossConfig(name="cispo", aggregation="token", adv_norm="none", kl_coef=BETA, kl_mode=m,
                        kl_estimator="k1") for m in ("loss", "reward")}
  g = {}
  for mode, cfg in cfgs.items():
    logp, mask, batch = _batch_with(cfg, ref=-1.5)
    g[mode] = _loss_and_grads(cfg, batch, logp)[2]
  base = _loss_and_grads(LossConfig(name="cispo", aggregation="token", adv_norm="none"),
                         _batch_with(cfgs["loss"])[2], logp)[2]
  np.testing.assert_allclose(g["loss"] - base, np.where(mask > 0, BETA / 9, 0.0), rtol=1e-5, atol=1e-8)
  assert not np.allclose(g["loss"], g["reward"])


def test_kl_off_is_the_default_path():
  """kl_coef = 0 (the default): a reference in the batch is ignored, and the loss and metrics are exactly those of
  no reference at all (the golden run's path; tests/test_golden.py checks the whole run)."""
  cfg = LossConfig(name="cispo", aggregation="token", adv_norm="none")
  logp, mask, batch = _batch_with(cfg, ref=-1.5)
  a = _loss_and_grads(cfg, batch, logp)
  b = _loss_and_grads(cfg, dataclasses.replace(batch, ref_logprobs=None), logp)
  assert a[0] == b[0] and set(a[1]) == set(rl.METRIC_KEYS)
  np.testing.assert_array_equal(a[2], b[2])


def test_distillation_advantage_by_hand():
  """A[b,t] = gamma (log pi_T - log pi_theta): teacher at -0.8 on every loss token of logp = -1 gives 0.2 gamma per
  token (gamma = 0.5: 0.1), plus A_b = +-0.5 with distill_task_reward; distill_reverse_kl = mean(logp - teacher)
  = -0.2."""
  adv_B = jnp.asarray([0.5, -0.5, -0.5, 0.5])
  logp, mask, _ = example()
  logp_BT, live = jnp.where(mask > 0, logp, 0.0), jnp.asarray(mask > 0)
  teacher = jnp.where(live, -0.8, 0.0)
  cfg = LossConfig(distill_teacher="t", distill_coef=0.5, zero_variance_filter=False)
  adv, sums = rl.token_advantages(adv_B, logp_BT, live, cfg, teacher_logp_BT=teacher)
  np.testing.assert_allclose(np.where(mask > 0, adv, 0), np.where(mask > 0, 0.1, 0), rtol=1e-5)
  np.testing.assert_allclose(sums["distill_rkl_sum"], -0.2 * 9, rtol=1e-5)
  adv, _ = rl.token_advantages(adv_B, logp_BT, live, dataclasses.replace(cfg, distill_task_reward=True),
                               teacher_logp_BT=teacher)
  np.testing.assert_allclose(np.where(mask > 0, adv, 0), np.where(mask > 0, 0.1 + adv_B[:, None], 0), rtol=1e-5)


def test_a_teacher_identical_to_the_student_gives_zero_advantage():
  """The teacher's log-probs equal to the student's: A = 0 exactly on every token, so the distillation loss and its
  gradient are exactly 0; with the task reward added, A is exactly the task's A_b."""
  cfg = LossConfig(name="cispo", aggregation="token", adv_norm="none", distill_teacher="t",
                   zero_variance_filter=False)
  logp, mask, batch = _batch_with(cfg, teacher=-1.0)
  loss, metrics, g, _ = _loss_and_grads(cfg, batch, logp)
  assert loss == 0.0 and not np.any(g) and rl.finalize_metrics(metrics)["distill_reverse_kl"] == 0.0
  live = jnp.asarray(mask > 0)
  logp_BT = jnp.where(live, logp, 0.0)
  adv_B = jnp.asarray(batch.advantages)
  adv, _ = rl.token_advantages(adv_B, logp_BT, live, dataclasses.replace(cfg, distill_task_reward=True),
                               teacher_logp_BT=logp_BT)
  np.testing.assert_array_equal(adv, jnp.broadcast_to(adv_B[:, None], logp_BT.shape))


def test_a_batch_without_the_configured_logprobs_is_refused():
  """A config with a KL term or a teacher and a batch without their log-probs: an error, never a silent no-op."""
  cfg = LossConfig(name="cispo", aggregation="token", adv_norm="none")
  logp, _, batch = _batch_with(cfg)
  for kw, field in (({"kl_coef": 0.1}, "ref_logprobs"), ({"kl_coef": 0.1, "kl_mode": "reward"}, "ref_logprobs"),
                    ({"distill_teacher": "t", "zero_variance_filter": False}, "teacher_logprobs")):
    with pytest.raises(ValueError, match=f"batch\\.{field}"):
      rl.policy_loss(jnp.asarray(logp), batch, dataclasses.replace(cfg, **kw))


def test_config_refuses_what_a_per_token_advantage_cannot_do():
  with pytest.raises(ConfigError, match=r"loss\.name: gspo is a sequence loss"):
    load_config(overrides=["loss.name=gspo", "loss.kl_coef=0.1", "loss.kl_mode=reward"])
  with pytest.raises(ConfigError, match=r"loss\.zero_variance_filter"):
    load_config(overrides=["loss.distill_teacher=/some/teacher"])
  with pytest.raises(ConfigError, match=r"loss\.kl_mode"):
    load_config(overrides=["loss.kl_mode=penalty"])
  load_config(overrides=["loss.name=gspo", "loss.kl_coef=0.1"])  # a loss term needs no per-token advantage


class _OtherTokenizer(CharTokenizer):
  """The character vocabulary with its ids reversed: same size and special ids, other ids for the same text."""

  def encode(self, text):
    return [self.vocab_size - 1 - i for i in super().encode(text)]


def test_a_teacher_with_another_tokenizer_is_refused_naming_both():
  ref_lib.check_same_tokenizer(CharTokenizer(), CharTokenizer(), "data.tokenizer=char", "loss.distill_teacher=a")
  with pytest.raises(ConfigError, match=r"loss\.distill_teacher=/t/x: its tokenizer is not the student's "
                                        r"\(data\.tokenizer=char\): probe_ids"):
    ref_lib.check_same_tokenizer(CharTokenizer(), _OtherTokenizer(), "data.tokenizer=char", "loss.distill_teacher=/t/x")


def test_a_teacher_checkpoint_with_a_real_tokenizer_is_refused_for_a_char_student():
  """tests/fixtures/hf: a Hugging Face checkpoint with its own tokenizer.json, against the character vocabulary."""
  import pathlib
  d = pathlib.Path(__file__).parent / "fixtures" / "hf"
  path = next(str(p.parent) for p in sorted(d.rglob("tokenizer.json")))
  layout = Layout(make_mesh("data=-1", jax.devices()[:1]), TRAIN_RULES)
  with pytest.raises(ConfigError, match=r"loss\.distill_teacher=.*: its tokenizer is not the student's"):
    ref_lib.load_frozen("teacher_logprobs", "loss.distill_teacher", path, layout, CharTokenizer(),
                        "data.tokenizer=char")


def test_a_teacher_checkpoint_with_the_students_tokenizer_loads_on_the_trainer_mesh():
  """tests/fixtures/hf/llama as the teacher of a student with its tokenizer: read by load_pretrained onto the mesh
  (its own architecture), and its log-probs equal the loaded model's own forward."""
  import pathlib
  from scalerl_jax.data.tokenizer import tokenizer_from_pretrained
  from scalerl_jax.model.hf import load_pretrained
  d = str(pathlib.Path(__file__).parent / "fixtures" / "hf" / "llama")
  layout = Layout(make_mesh("data=-1", jax.devices()[:2]), TRAIN_RULES)
  frozen = ref_lib.load_frozen("teacher_logprobs", "loss.distill_teacher", d, layout, tokenizer_from_pretrained(d),
                               f"model.pretrained={d}")
  assert frozen.policy.cfg.hidden == 64 and frozen.source == f"loss.distill_teacher={d}"
  leaf = jax.tree.leaves(frozen.params)[0]
  assert leaf.sharding.mesh.devices.size == 2
  tokens = jnp.asarray(np.arange(2 * 6).reshape(2, 6) % 100, jnp.int32)
  batch = TrainBatch(tokens=tokens, loss_mask=None, gen_logprobs=None, advantages=None, token_weights=None,
                     sample_weights=None)
  plain = load_pretrained(d)
  np.testing.assert_allclose(ref_lib.reference_logprobs(frozen, batch, 1.0, 1),
                             token_logprobs(plain.policy, plain.params, tokens), rtol=1e-5, atol=1e-5)


# ---- real train steps on a tiny policy -----------------------------------------------------------------------------
CFG = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  max_seq_len=16)
B, T, PROMPT = 8, 12, 4


def _fixed_batch():
  tokens = np.asarray(jax.random.randint(jax.random.key(7), (B, T), 0, CFG.vocab_size), np.int32)
  mask = np.zeros((B, T), np.float32)
  mask[:, PROMPT:] = 1.0
  return tokens, mask


def _distill_steps(teacher_seed: int, steps: int, micro_batches: int = 2):
  """`steps` distillation steps (teacher's signal alone, cispo, on-policy) on one fixed batch; returns the mean
  squared gap (log pi_student - log pi_teacher)^2 over the loss tokens before each step and after the last, and the
  first step's advantages' largest magnitude."""
  policy, opt = Policy(CFG), make_optimizer(OptimizerConfig(lr=1e-2, warmup_steps=0, grad_clip=1.0))
  layout = Layout(make_mesh("data=-1", jax.devices()[:1]), TRAIN_RULES)
  state = init_train_state(policy, opt, layout, seed=0)
  teacher_params = init_train_state(policy, opt, layout, seed=teacher_seed).params
  teacher = ref_lib.Frozen("teacher_logprobs", "test", policy, ref_lib.copy_params(teacher_params))
  cfg = LossConfig(name="cispo", aggregation="token", distill_teacher="t", zero_variance_filter=False)
  step = make_train_step(make_rl_loss(policy, cfg, 1.0), opt, micro_batches, metrics_init=rl.empty_metrics,
                         metrics_combine=rl.accumulate_metrics)
  fill = ref_lib.make_reference_fn([teacher], 1.0, micro_batches, 1, None)
  tokens, mask = _fixed_batch()
  student_logp = jax.jit(lambda p: token_logprobs(policy, p, jnp.asarray(tokens)))
  gaps, metrics = [], []
  for _ in range(steps + 1):
    logp = np.asarray(student_logp(state.params))
    batch = fill(TrainBatch(tokens=tokens, loss_mask=mask, gen_logprobs=np.where(mask > 0, logp, 0.0),
                            advantages=np.zeros(B, np.float32), token_weights=mask / mask.sum(),
                            sample_weights=np.full(B, 1 / B, np.float32)))
    gaps.append(float(np.sum(mask * (logp - np.asarray(batch.teacher_logprobs)) ** 2) / mask.sum()))
    if len(gaps) <= steps:
      state, m = step(state, batch)
      metrics.append(rl.finalize_metrics({k: v for k, v in m.items() if k in rl.METRIC_KEYS + rl.OPTIONAL_METRIC_KEYS}))
  return gaps, metrics


def test_a_different_teacher_pulls_the_students_logprobs_toward_its_own():
  """With A = log pi_T - log pi_theta and on-policy weights (w = 1), the step's gradient is that of
  (1/2) sum_t tw (log pi_theta - log pi_T)^2: a few steps shrink the squared gap on the fixed batch."""
  gaps, metrics = _distill_steps(teacher_seed=1, steps=6)
  assert gaps[0] > 0.1  # a different teacher: a real gap to close
  assert gaps[-1] < 0.5 * gaps[0], gaps
  assert all(b < a for a, b in zip(gaps, gaps[1:])), gaps
  assert metrics[0]["distill_reverse_kl"] != 0.0


def test_a_teacher_with_the_students_params_gives_no_signal_in_the_train_step():
  """The teacher's forward (its own jit, micro-batched) and the trainer's log-probs of the same params agree to
  float rounding, so the step's loss and gradient are ~0 and the student does not move off its params' log-probs."""
  gaps, metrics = _distill_steps(teacher_seed=0, steps=1)
  assert gaps[0] < 1e-10 and abs(metrics[0]["distill_reverse_kl"]) < 1e-5 and abs(metrics[0]["loss"]) < 1e-6


def test_reference_logprobs_put_micro_batched_rows_back_in_order():
  """One forward per micro-batch (rows m::M, or G-row groups) and the rows put back: equal to the full forward."""
  policy = Policy(CFG)
  params = init_train_state(policy, make_optimizer(OptimizerConfig()), Layout(make_mesh("data=-1", jax.devices()[:1]),
                                                                             TRAIN_RULES), seed=3).params
  frozen = ref_lib.Frozen("ref_logprobs", "test", policy, params)
  tokens, _ = _fixed_batch()
  batch = TrainBatch(tokens=jnp.asarray(tokens), loss_mask=None, gen_logprobs=None, advantages=None,
                     token_weights=None, sample_weights=None)
  full = np.asarray(ref_lib.reference_logprobs(frozen, batch, 0.7, 1))
  for m, block in ((2, 1), (4, 1), (2, 2)):
    got = np.asarray(jax.jit(lambda b: ref_lib.reference_logprobs(frozen, b, 0.7, m, block))(batch))
    assert got.shape == full.shape
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-6)
  assert not np.allclose(full, np.asarray(ref_lib.reference_logprobs(frozen, batch, 1.0, 1)))  # temperature used


# ---- a whole run ---------------------------------------------------------------------------------------------------
def test_a_run_with_a_kl_reference_logs_kl_and_counts_the_reference_forward(tmp_path):
  """A tiny synchronous run with loss.kl_coef > 0 and reference=initial: the reference is a copy of the starting
  params (the donated state does not take it along), train/kl is logged every step, ~0 on the first step (the
  student is still the reference) and > 0 once the student moved; the trainer FLOPs hold the policy's forward +
  backward tokens plus one forward of every row's T tokens per step."""
  from tests.pipeline_helpers import read_metrics, tiny_job
  job = tiny_job(tmp_path, "loss.kl_coef=0.05", "pipeline.steps=3", "pipeline.eval_every=0", "checkpoint.every_steps=10",
                 "loss.zero_variance_filter=false")  # every step has loss tokens (a step without logs kl = NaN)
  flops = []
  job.observers.append(lambda record: flops.append(job.meter.train_flops))
  job.run_sync()
  [frozen] = job.trainer.frozen
  assert frozen.field == "ref_logprobs" and frozen.source == "loss.reference=initial"
  steps = [r for r in read_metrics(job.run_dir) if "train/loss" in r]
  assert len(steps) == 3 and all("train/kl" in r for r in steps)
  assert abs(steps[0]["train/kl"]) < 1e-5 and steps[-1]["train/kl"] > 1e-6
  moved = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
           for a, b in zip(jax.tree.leaves(frozen.params), jax.tree.leaves(job.state.params))]
  assert max(moved) > 0  # the reference stayed at the start while the policy moved
  s, fpt = job.shapes, job.parts.flops_per_token
  rows = [int(r["train/groups"]) * s.G for r in steps]  # the bucket each step's batch was compacted to
  want = [job.trainer.trained_tokens(n) * fpt(True) + n * s.T * fpt(False) for n in rows]
  np.testing.assert_allclose(np.diff([0.0] + flops), want, rtol=1e-9)


def test_a_resumed_run_rebuilds_the_initial_reference(tmp_path):
  """reference=initial is not checkpointed: a resume rebuilds the params a fresh run starts from (here the seed's
  init), equal to the first run's reference, not the checkpoint's params."""
  from tests.pipeline_helpers import tiny_job
  keys = ["loss.kl_coef=0.05", "pipeline.eval_every=0", "checkpoint.every_steps=2", "loss.zero_variance_filter=false"]
  first = tiny_job(tmp_path, *keys, "pipeline.steps=2")
  first.run_sync()
  start = [np.asarray(x) for x in jax.tree.leaves(first.trainer.frozen[0].params)]
  resumed = tiny_job(tmp_path, *keys, "pipeline.steps=3", "checkpoint.resume=true")
  resumed.run_sync()
  assert resumed.start_step == 2
  for a, b in zip(start, jax.tree.leaves(resumed.trainer.frozen[0].params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(start, jax.tree.leaves(first.state.params)))
