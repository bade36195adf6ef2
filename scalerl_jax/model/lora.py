"""Low-rank adapters (LoRA, `lora.*` keys): a projection W gains y = x W + (alpha / r) (x A) B, A [in, r] drawn
at random and B [r, out] zeros, so an adapted model starts equal to its base, and only A and B train.

An adapter lives beside the weight it adapts, as two params of the same module (`blocks[i].attn.q_lora.a` / `.b`
beside `blocks[i].attn.q`), A carrying the weight's input logical axes and B its output ones, with the rank axis
replicated: adapters shard on the mesh as their base weights do. A model without adapters (lora.rank = 0) holds
no such params, draws no extra random numbers and computes exactly what it did before.

The adapted output is computed factored, (x A) B, never as x (W + A B): the backward then produces gradients of A
and B from x and the output's gradient ([rows, r] intermediates), and none of W's size. MoE experts get one
adapter per expert (A [E, D, r], B [E, r, F], applied with the same grouped matmul as the experts): each expert's
update is its own, as when PEFT adapts each expert's Linear layers, so an adapter export maps one to one.

Which params train is a rule on names (`is_adapter`); `trainable_mask`, `partition` and `combine` split a param
tree into the adapters and the frozen rest and put them back together (the trainer differentiates only the
first; train/step.py).

Array names carry their shape as a suffix; letters are the package legend (types.py) plus r, the adapter rank.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

_SUFFIX = "_lora"


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """What the model needs of `lora.*`: the rank, the output scale alpha / rank, and the targeted projections."""
  rank: int
  alpha: float
  targets: frozenset

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  @classmethod
  def of(cls, cfg) -> Optional["LoraSpec"]:
    """From a LoraConfig; None when adapters are off (rank 0)."""
    if cfg is None or cfg.rank == 0:
      return None
    return cls(cfg.rank, float(cfg.alpha), frozenset(cfg.targets))


class Adapter(nnx.Module):
  """One projection's adapter: `a` [*in, r] ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PEFT's default for lora_A),
  `b` [r, *out] zeros; `experts` > 0 prepends an expert dim to both. Random numbers come from the `lora` stream
  when the Rngs has one (Policy.init gives it one), so adding adapters leaves the base's draws unchanged."""

  def __init__(self, spec: LoraSpec, in_shape, in_axes, out_shape, out_axes, param_dtype, rngs: nnx.Rngs,
               experts: int = 0):
    lead, lead_axes = ((experts,), ("expert",)) if experts else ((), ())
    # at least fp32 whatever the base's dtype: adapters are small, and in bf16 their early updates (A ~ 1/sqrt(in)
    # times lr) would round away
    param_dtype = jnp.promote_types(param_dtype, jnp.float32)
    fan_in = math.prod(in_shape)
    key = rngs.lora() if "lora" in rngs else rngs.params()
    bound = fan_in ** -0.5
    a = jax.random.uniform(key, (*lead, *in_shape, spec.rank), param_dtype, -bound, bound)
    self.a = nnx.Param(a, logical_axes=(*lead_axes, *in_axes, None))
    self.b = nnx.Param(jnp.zeros((*lead, spec.rank, *out_shape), param_dtype),
                       logical_axes=(*lead_axes, None, *out_axes))
    self.scale = spec.scale  # static: applied by layers.project / moe's experts


def adapter(spec: Optional[LoraSpec], target: str, in_shape, in_axes, out_shape, out_axes, param_dtype,
            rngs: nnx.Rngs, experts: int = 0) -> Optional[Adapter]:
  """The adapter of projection `target`, or None when adapters are off or do not target it."""
  if spec is None or target not in spec.targets:
    return None
  return Adapter(spec, in_shape, in_axes, out_shape, out_axes, param_dtype, rngs, experts)


def adapter_params(cfg, spec: Optional[LoraSpec], active: bool = False) -> int:
  """Analytic count of the adapters' params (r (in + out) per adapted projection; equals `count` of an initialised
  tree, checked in tests), or with `active` those one token's matmuls use (an MoE layer's k routed experts'
  adapters instead of all E). 0 without adapters."""
  if spec is None:
    return 0
  D, Q, K, H, r, t = cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, spec.rank, set(spec.targets)
  attn = {"q": (D, Q * H), "k": (D, K * H), "v": (D, K * H), "o": (Q * H, D)}
  each = lambda shapes: sum(r * (i + o) for name, (i, o) in shapes.items() if name in t)  # noqa: E731
  mlp = lambda F: each({"gate": (D, F), "up": (D, F), "down": (F, D)})  # noqa: E731
  sparse = set(cfg.moe_layers)
  routed = cfg.experts_per_token if active else cfg.num_experts
  per_layer = [(routed * mlp(cfg.expert_width) + (mlp(cfg.shared_expert_intermediate)
                                                  if cfg.shared_expert_intermediate else 0))
               if i in sparse else mlp(cfg.intermediate) for i in range(cfg.num_layers)]
  return cfg.num_layers * each(attn) + sum(per_layer)


def is_adapter(path) -> bool:
  """Whether a param's key path (jax.tree_util keys, or plain names) is an adapter's A or B."""
  names = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
  return len(names) >= 2 and names[-2].endswith(_SUFFIX) and names[-1] in ("a", "b")


def trainable_mask(params: Any) -> Any:
  """True at the adapters' leaves, False elsewhere (the same tree structure as `params`)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: is_adapter(path), params)


def partition(params: Any, mask: Any) -> tuple[Any, Any]:
  """(the leaves where `mask` is True, the rest), each the tree of `params` with None at the other's leaves."""
  return (jax.tree.map(lambda p, m: p if m else None, params, mask),
          jax.tree.map(lambda p, m: None if m else p, params, mask))


def combine(trainable: Any, frozen: Any) -> Any:
  """`partition`'s inverse."""
  return jax.tree.map(lambda t, f: f if t is None else t, trainable, frozen, is_leaf=lambda x: x is None)


def count(params: Any) -> int:
  """Elements in the adapters of `params`."""
  return sum(x.size for x in jax.tree.leaves(partition(params, trainable_mask(params))[0]))


def attach(base: Any, adapters: Any) -> Any:
  """The tree of `adapters` (an adapted model's tree with None at every base leaf, as `partition` gives) with each
  None filled from `base` (the same model's tree without adapters): the adapted model's params."""
  def fill(a, b):
    if isinstance(a, dict):
      return {k: fill(v, (b or {}).get(k)) for k, v in a.items()}
    if a is None:
      if b is None or isinstance(b, dict):
        raise ValueError("attach: the base has no param where the adapted model holds a base weight")
      return b
    return a
  return fill(adapters, base)
