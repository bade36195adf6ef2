"""Sharded train step: same parameters on data=8, fsdp=4 x tensor=2 and one device; micro-batched == full batch;
the shared-prompt RL loss == the full-row loss."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import rl
from scalerl_jax.config import LossConfig, ModelConfig, OptimizerConfig
from scalerl_jax.mesh import TRAIN_RULES, Layout, batch_sharding, make_mesh
from scalerl_jax.model import Policy, next_token_loss
from scalerl_jax.train.rl_loss import PromptLayout, make_rl_loss
from scalerl_jax.train.state import init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step, micro_batches_within, split_micro_batches
from scalerl_jax.types import TrainBatch
from tests.model_helpers import rl_batch

CFG = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  max_seq_len=16)
OPT = OptimizerConfig(lr=1e-2, warmup_steps=2, grad_clip=1.0)
B, T = 16, 12


def _batch():
  tokens = jax.random.randint(jax.random.key(7), (B, T), 0, CFG.vocab_size)
  lengths = jnp.arange(B) % 5 + 7  # ragged rows: padding must not change the result
  weights = (jnp.arange(T)[None] < lengths[:, None]).astype(jnp.float32).at[:, 0].set(0.0)
  return {"tokens": tokens, "weights": weights / weights.sum()}  # normalised by the GLOBAL token count


def _run(spec: str, devices, micro_batches: int, steps: int = 3):
  policy = Policy(CFG)
  opt = make_optimizer(OPT)
  mesh = make_mesh(spec, devices)
  state = init_train_state(policy, opt, Layout(mesh, TRAIN_RULES), seed=0)
  loss_fn = lambda p, b: next_token_loss(policy, p, b["tokens"], b["weights"])
  bsh = batch_sharding(mesh, TRAIN_RULES, 2, B)
  step = make_train_step(loss_fn, opt, micro_batches, state_shardings(policy, opt, Layout(mesh, TRAIN_RULES)),
                         {"tokens": bsh, "weights": bsh})
  batch = jax.device_put(_batch(), bsh)
  losses = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return state, losses


@pytest.fixture(scope="module")
def single_device():
  return _run("data=1", jax.devices()[:1], micro_batches=1)


def _assert_same_params(a, b, tol):
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=tol, rtol=tol)


@pytest.mark.parametrize("spec", ["data=8", "fsdp=4,tensor=2"])
def test_sharded_step_matches_single_device(single_device, spec):
  ref_state, ref_losses = single_device
  state, losses = _run(spec, jax.devices(), micro_batches=1)
  shardings = {x.sharding.spec for x in jax.tree.leaves(state.params)}
  if spec == "fsdp=4,tensor=2":  # the two sides really were laid out differently
    assert any(s != jax.sharding.PartitionSpec() for s in shardings)
    assert len(state.params["embed"].sharding.device_set) == 8
  assert ref_state.params["embed"].sharding.device_set != state.params["embed"].sharding.device_set
  assert int(state.step) == 3
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  _assert_same_params(state, ref_state, 2e-5)


def test_micro_batched_step_equals_full_batch(single_device):
  ref_state, ref_losses = single_device
  state, losses = _run("data=1", jax.devices()[:1], micro_batches=4)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  _assert_same_params(state, ref_state, 2e-5)
  assert losses[2] < losses[0]  # the step does optimise (step 0 has lr 0: linear warmup from 0)


def test_split_micro_batches_keeps_groups_whole():
  rows = jnp.arange(12)
  np.testing.assert_array_equal(split_micro_batches(rows, 2), [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]])
  np.testing.assert_array_equal(split_micro_batches(rows, 2, block=3), [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]])
  with pytest.raises(ValueError, match="whole 4-row groups"):
    split_micro_batches(rows, 2, block=4)


def test_micro_batches_within_a_memory_budget():
  """Temporaries scale with a micro-batch's rows: the fewest micro-batches of whole groups (a multiple of the least
  count, dividing the groups) whose share fits; one group each when none does; no budget or a fit: the least."""
  MiB = 1 << 20
  assert micro_batches_within(32, 1, 39157 * MiB, 4096 * MiB) == 16  # needs >= 9.6: 16 is the next divisor of 32
  assert micro_batches_within(8, 1, 9789 * MiB, 4096 * MiB) == 4  # >= 2.4 -> 4
  assert micro_batches_within(12, 2, 10 * MiB, 4 * MiB) == 6  # 2 * 10 / 4 = 5 -> 6 (multiples of 2: 2, 4, 6, 12)
  assert micro_batches_within(4, 1, 100 * MiB, 1 * MiB) == 4  # nothing fits: one group per micro-batch
  assert micro_batches_within(32, 1, 39157 * MiB, 0) == 1 == micro_batches_within(32, 1, 3 * MiB, 4 * MiB)


def test_shared_prompt_rl_step_equals_full_rows_sharded_and_micro_batched():
  """The RL loss that computes each prompt once per group (micro-batches of whole groups, fsdp x tensor mesh)
  takes the same optimizer steps as the full-row loss on one device."""
  P, G, width, N = 8, 4, 5, 6
  batch = rl_batch(P, G, width, N, CFG.vocab_size)
  policy, opt = Policy(CFG), make_optimizer(OPT)
  loss_cfg = LossConfig(name="cispo")

  def run(spec, devices, layout, micro_batches):
    mesh = make_mesh(spec, devices)
    state = init_train_state(policy, opt, Layout(mesh, TRAIN_RULES), seed=0)
    rows, cols = batch_sharding(mesh, TRAIN_RULES, 1, P * G), batch_sharding(mesh, TRAIN_RULES, 2, P * G)
    bsh = TrainBatch.of(rows=rows, tokens=cols)
    step = make_train_step(make_rl_loss(policy, loss_cfg, 1.0, layout), opt, micro_batches,
                           state_shardings(policy, opt, Layout(mesh, TRAIN_RULES)), bsh,
                           metrics_init=rl.empty_metrics, metrics_combine=rl.accumulate_metrics,
                           micro_batch_block=G if layout else 1)
    losses = []
    for _ in range(3):
      state, metrics = step(state, jax.device_put(batch, bsh))
      losses.append(float(metrics["loss"]))
    return state, losses

  ref_state, ref_losses = run("data=1", jax.devices()[:1], None, 1)
  state, losses = run("fsdp=4,tensor=2", jax.devices(), PromptLayout(G, width, N), 2)
  assert ref_losses[0] != 0 and ref_losses[2] != ref_losses[0]  # a real loss that moves (step 0 has lr 0)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-7)
  _assert_same_params(state, ref_state, 5e-5)


def test_warmup_moves_the_params_from_the_first_update():
  """lr ramps lr/W, 2lr/W, ..., lr: the first update is not a no-op (a ramp from 0 made step 1 change nothing)."""
  import optax
  from scalerl_jax.train.state import warmup_schedule
  sched = warmup_schedule(1e-3, 4)
  assert [float(sched(n)) for n in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
  opt = make_optimizer(OptimizerConfig(lr=1e-3, warmup_steps=10, weight_decay=0.0))
  params = {"w": jnp.ones((3,))}
  updates, _ = opt.update({"w": jnp.array([1.0, -2.0, 0.5])}, opt.init(params), params)
  # Adam's first step is -lr_0 * sign(g) (eps 1e-15): lr_0 = 1e-3 / 10
  np.testing.assert_allclose(np.asarray(optax.global_norm(updates)), 1e-4 * np.sqrt(3), rtol=1e-5)
