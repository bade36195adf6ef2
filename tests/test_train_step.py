"""Sharded train step: same parameters on data=8, fsdp=4 x tensor=2 and one device; micro-batched == full batch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.config import ModelConfig, OptimizerConfig
from scalerl_jax.mesh import TRAIN_RULES, batch_sharding, make_mesh
from scalerl_jax.model import Policy, next_token_loss
from scalerl_jax.train.state import init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step

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
  state = init_train_state(policy, opt, mesh, TRAIN_RULES, seed=0)
  loss_fn = lambda p, b: next_token_loss(policy, p, b["tokens"], b["weights"])
  bsh = batch_sharding(mesh, TRAIN_RULES, 2, B)
  step = make_train_step(loss_fn, opt, micro_batches, state_shardings(policy, opt, mesh, TRAIN_RULES),
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
