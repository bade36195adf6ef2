"""Train state, optimizer and sharded initialisation.

Initialisation never materialises unsharded arrays: `jax.eval_shape` gives the state's shapes, the rule table
gives NamedShardings, and `jax.jit(init, out_shardings=...)` creates each shard where it lives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from scalerl_jax.config import OptimizerConfig
from scalerl_jax.mesh import Layout, replicated
from scalerl_jax.model import Policy


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  params: Any  # the whole model (with adapters, their frozen base too)
  opt_state: Any  # over the params that train (`Policy.split_trainable`: with adapters, them alone)
  step: jax.Array  # int32 scalar: optimizer steps taken (= the policy version of `params`)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """AdamW with linear warmup (`warmup_schedule`) then a constant rate, after global-norm clipping (0 = no clipping).

  The paper's 8B recipe: lr 5e-7 constant after 100 warmup steps, eps 1e-15 (avoids the epsilon underflow that
  otherwise acts as implicit gradient clipping), weight decay 0.01.
  """
  schedule = warmup_schedule(cfg.lr, cfg.warmup_steps)
  adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw) if cfg.grad_clip > 0 else adamw


def warmup_schedule(lr: float, warmup_steps: int) -> optax.Schedule:
  """lr * (n + 1) / warmup_steps at update n (0-based) for the first warmup_steps updates, then lr: the first
  update already moves the params (a ramp from 0 made it a no-op, update norm 0)."""
  if warmup_steps <= 0:
    return optax.constant_schedule(lr)
  return lambda n: lr * jnp.minimum((n + 1) / warmup_steps, 1.0)


def state_shardings(policy: Policy, optimizer: optax.GradientTransformation, layout: Layout) -> TrainState:
  """NamedShardings for every leaf of the TrainState: optimizer moments follow their params."""
  param_sh = layout.shardings(policy.logical_axes, policy.param_shapes)
  abstract_opt = jax.eval_shape(optimizer.init, policy.split_trainable(policy.param_shapes)[0])
  opt_sh = optax.tree_map_params(optimizer, lambda _, sh: sh, abstract_opt, policy.split_trainable(param_sh)[0],
                                 transform_non_params=lambda _: replicated(layout.mesh))
  return TrainState(params=param_sh, opt_state=opt_sh, step=replicated(layout.mesh))


def init_train_state(policy: Policy, optimizer: optax.GradientTransformation, layout: Layout, seed: int,
                     params: Any = None) -> TrainState:
  """Sharded TrainState from a seed, or around given params (e.g. a warm start), each leaf born sharded."""
  shardings = state_shardings(policy, optimizer, layout)

  def from_params(p):
    opt_state = optimizer.init(policy.split_trainable(p)[0])
    return TrainState(params=p, opt_state=opt_state, step=jnp.zeros((), jnp.int32))

  if params is None:
    return jax.jit(lambda key: from_params(policy.init(key)), out_shardings=shardings)(jax.random.key(seed))
  params = jax.device_put(params, shardings.params)
  return jax.jit(from_params, out_shardings=shardings)(params)


def restore_target(policy: Policy, optimizer: optax.GradientTransformation, shardings: TrainState) -> TrainState:
  """The abstract TrainState (ShapeDtypeStructs carrying `shardings`) a checkpoint is restored into, shard by
  shard, without materialising anything first."""
  abstract = jax.eval_shape(lambda: TrainState(
      policy.param_shapes, optimizer.init(policy.split_trainable(policy.param_shapes)[0]), jnp.zeros((), jnp.int32)))
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
