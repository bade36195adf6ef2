"""The pure train step `(state, batch) -> (state, metrics)`.

The loss is an argument: `loss_fn(params, micro_batch) -> (loss, metric_sums)` where `loss` is *additive over
micro-batches* (normalised by global counts carried in the batch, see `scalerl_jax.types.TrainBatch`) and
`metric_sums` is a dict of scalars that are summed over micro-batches. Gradient accumulation runs inside the jit
as a `lax.scan` over micro-batches; micro-batch m holds rows m, m+M, m+2M, ... (or, with `micro_batch_block=G`,
the G-row groups m, m+M, ...: whole groups for a loss that computes each prompt once) so that on a data-sharded
batch every device works on every micro-batch without moving data. A batch gets exactly one optimizer update:
rl/mismatch.py's loss.behavior=trainer relies on it (the pre-update params' log-probs are the step's own forward).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from scalerl_jax.errors import UserError
from scalerl_jax.train.state import TrainState

LossFn = Callable[[Any, Any], tuple[jax.Array, dict]]


class NonFiniteError(UserError):
  """Too many optimizer steps in a row had a non-finite loss or gradient (each was skipped)."""


def split_micro_batches(batch: Any, num: int, block: int = 1) -> Any:
  """[B, ...] -> [num, B/num, ...]: rows go in blocks of `block` consecutive rows (a prompt's group), and
  micro-batch m holds blocks m, m+num, m+2*num, ... (with block=1: rows m::num)."""
  def split(x):
    if x.shape[0] % (num * block):
      raise ValueError(f"batch of {x.shape[0]} rows does not split into {num} micro-batches of whole "
                       f"{block}-row groups")
    y = x.reshape(x.shape[0] // (num * block), num, block, *x.shape[1:])
    return jnp.swapaxes(y, 0, 1).reshape(num, x.shape[0] // num, *x.shape[1:])
  return jax.tree.map(split, batch)


def temp_bytes(compiled) -> int:
  """XLA's temporaries of a compiled step, in bytes (0 where the backend does not say)."""
  stats = compiled.memory_analysis()
  return 0 if stats is None else int(stats.temp_size_in_bytes)


def micro_batches_within(groups: int, least: int, temp: int, budget: int) -> int:
  """The micro-batch count for a step of `groups` groups whose compile with `least` micro-batches needs `temp`
  bytes of temporaries: `least` when that fits `budget` (or there is none), else the fewest micro-batches of whole
  groups (a multiple of `least` dividing `groups`) that would fit, the temporaries scaling with a micro-batch's
  rows; one group per micro-batch when none does."""
  if not budget or temp <= budget:
    return least
  counts = [m for m in range(least, groups + 1, least) if groups % m == 0]
  return next((m for m in counts if m * budget >= temp * least), counts[-1])


def _add(a, b):
  return jax.tree.map(lambda x, y: x + y.astype(jnp.float32), a, b)


def accumulate_gradients(loss_fn: LossFn, params: Any, batch: Any, micro_batches: int,
                         metrics_init: Optional[Callable[[], dict]] = None,
                         metrics_combine: Optional[Callable[[dict, dict], dict]] = None, block: int = 1):
  """(loss, metrics, grads) summed over micro-batches in one scan with fp32 accumulators.

  Metrics start from `metrics_init()` and combine with `metrics_combine(acc, new)` (default: zeros and +; a
  loss library may combine some keys by min/max). `block` keeps groups of consecutive rows in one micro-batch.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if micro_batches == 1:
    (loss, metrics), grads = grad_fn(params, batch)
    return loss, metrics, grads

  mbs = split_micro_batches(batch, micro_batches, block)
  first = jax.tree.map(lambda x: x[0], mbs)
  (_, metrics_shape), _ = jax.eval_shape(grad_fn, params, first)
  zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), tree)
  # keys `metrics_init` does not know (an MoE loss's router sums) start at zero
  init_metrics = {**zeros(metrics_shape), **(metrics_init() if metrics_init is not None else {})}
  combine = metrics_combine or _add
  init = (jnp.zeros((), jnp.float32), init_metrics, zeros(params))

  def body(carry, mb):
    (loss, metrics), grads = grad_fn(params, mb)
    acc_loss, acc_metrics, acc_grads = carry
    return (acc_loss + loss.astype(jnp.float32), combine(acc_metrics, metrics), _add(acc_grads, grads)), None

  (loss, metrics, grads), _ = jax.lax.scan(body, init, mbs)
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
  return loss, metrics, grads


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, micro_batches: int = 1,
                    state_shardings: Optional[TrainState] = None, batch_shardings: Any = None,
                    eager: bool = False, metrics_init=None, metrics_combine=None, micro_batch_block: int = 1,
                    policy=None):
  """Returns `step(state, batch) -> (state, metrics)`, jitted with explicit shardings and a donated state.

  `micro_batch_block`: rows that must share a micro-batch come in consecutive blocks of this size (a loss that
  computes each prompt once per group needs whole groups). `policy`: when it has adapters, only they are
  differentiated and updated (`Policy.split_trainable`); the frozen rest gets no gradient and comes back as it
  went in. `eager=True` returns the same function un-jitted, for stepping through with a debugger.
  """
  split = policy.split_trainable if policy is not None else lambda p: (p, None)
  join = policy.join_trainable if policy is not None else lambda t, f: t

  def step(state: TrainState, batch: Any):
    train, frozen = split(state.params)
    loss, metrics, grads = accumulate_gradients(lambda t, b: loss_fn(join(t, frozen), b), train, batch,
                                                micro_batches, metrics_init, metrics_combine, micro_batch_block)
    updates, opt_state = optimizer.update(grads, state.opt_state, train)
    params = join(optax.apply_updates(train, updates), frozen)
    out = dict(metrics)
    out["loss"] = loss
    out["grad_norm"] = optax.tree.norm(grads)
    out["update_norm"] = optax.tree.norm(updates)
    # A non-finite loss, gradient or update never reaches the state: the step is skipped (params and optimizer
    # state kept, `skipped` = 1). The step counter still advances: it counts consumed batches (= the version).
    finite = jnp.isfinite(loss) & jnp.isfinite(out["grad_norm"]) & jnp.isfinite(out["update_norm"])
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    out["skipped"] = jnp.where(finite, 0, 1).astype(jnp.int32)
    return TrainState(params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
                      step=state.step + 1), out

  if eager:
    return step
  return jax.jit(step, in_shardings=(state_shardings, batch_shardings), out_shardings=(state_shardings, None),
                 donate_argnums=(0,))
