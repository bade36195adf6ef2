"""Mixture-of-experts MLP in Flax NNX: an fp32 top-k softmax router over E SwiGLU experts, dropless dispatch, an
optional shared expert, routing replay, and the router statistics the trainer turns into auxiliary losses.

Array names carry their shape as a suffix; the letters are the package legend in `scalerl_jax/types.py` (E
experts, D hidden, F an expert's width). Local letters: U = B*T tokens of this call, A = U*k (token, expert)
assignments, k = experts per token, X = MoE layers of the model (in `Routing`).

Routing (per token, independent of every other token: dropless, no capacity, so a token's experts never depend on
the batch it is in, which routing replay relies on):

    logits_UE = x_UD @ router_DE                  in fp32 (HIGHEST precision), whatever the compute dtype
    probs_UE  = softmax(logits_UE)
    ids_Uk    = top_k(probs_UE)                   or, with replay, the generator's recorded ids
    gates_Uk  = probs_UE[ids_Uk]                  (/ their sum with model.norm_topk_prob: Qwen3-MoE, Mixtral)
    y_UD      = sum_k gates_Uk * expert[ids_Uk](x_UD)  (+ shared expert(x_UD))

Under replay the gate weights still come from this model's own router, so gradients reach the router; only the
choice of experts is the generator's.

Dispatch (`model.moe_dispatch`):
  ragged  the U*k assignments are sorted by expert, gathered into one [A, D] array and run through each expert's
          weights with `jax.lax.ragged_dot` (a grouped matmul over contiguous groups); results are scattered back
          and combined with the gates. On TPU/GPU jax lowers ragged_dot to a native grouped GEMM; on CPU its
          generic lowering masks the assignments into an [E, A, D] array and runs one dense dot over it: E times
          the active expert FLOPs (benchmarks/moe_step.py: 4.0 / 8.1 / 16.1 x at E = 4 / 8 / 16, k = 2).
  dense   every expert on every token with one-hot combine weights: E/k times the active FLOPs; a reference for
          tiny tests (on CPU it still runs 1.4-1.7x slower than ragged in the expert layer).

Parallelism is declared only in logical axes: expert weights are ("expert", "embed", "mlp") / ("expert", "mlp",
"embed"), mapped by `scalerl_jax.mesh` onto the `expert` and `tensor` mesh axes; XLA's partitioner splits the
grouped matmul over the expert axis (each device holds E / expert experts) and sums the partial outputs. This
module names no mesh axis.

Parameters (keys under `blocks[i]['moe']`; Hugging Face names in `scalerl_jax/model/hf.py`):
  router [D, E] embed, None        gate / up [E, D, F] expert, embed, mlp        down [E, F, D] expert, mlp, embed
  shared.{gate, up, down}          a plain SwiGLU of width model.shared_expert_intermediate (when > 0)
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.model.layers import MLP, dtype_of, normal_param
from scalerl_jax.model.lora import LoraSpec, adapter


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Routing:
  """What a caller tells the MoE layers of one forward call.

  expert_ids_BTXk: the generator's top-k expert ids of each token per MoE layer (-1 where none was recorded: the
  layer then uses its own top-k). mask_BT: tokens whose decisions count in the statistics (None: all). replay
  (static): route through `expert_ids_BTXk` instead of this model's own top-k; off, the ids are only compared."""
  expert_ids_BTXk: Optional[jax.Array] = None
  mask_BT: Optional[jax.Array] = None
  replay: bool = dataclasses.field(default=False, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterStats:
  """One MoE layer's routing in one forward call: sums over the masked tokens, additive across calls (the trainer
  adds a prompt pass and a completion pass) and micro-batches. `prob_sum_E` and `z_sum` carry gradients."""
  expert_ids_BTk: jax.Array  # int32 this model's own top-k (what the generator records)
  prob_sum_E: jax.Array  # sum over tokens of the router's softmax
  load_E: jax.Array  # assignments routed to each expert (the routing used, replayed or own); no gradient
  z_sum: jax.Array  # sum over tokens of logsumexp(router logits)^2
  tokens: jax.Array  # masked tokens
  mismatched: jax.Array  # tokens with recorded ids whose own top-k set differs from the recorded one
  compared: jax.Array  # tokens with recorded ids

  def __add__(self, other: "RouterStats") -> "RouterStats":
    """Sums of two calls (the ids are not added: the sum keeps no ids)."""
    add = lambda name: getattr(self, name) + getattr(other, name)
    return RouterStats(expert_ids_BTk=jnp.zeros((0,), jnp.int32),
                       **{f.name: add(f.name) for f in dataclasses.fields(self) if f.name != "expert_ids_BTk"})


def load_balance_loss(stats: RouterStats, k: int) -> jax.Array:
  """E * sum_e f_e * P_e with f_e = load_e / (tokens * k) (share of assignments, no gradient) and P_e the mean
  router probability: 1 under uniform routing, larger when the load concentrates where the probability does
  (Switch Transformer; transformers' load_balancing_loss_func returns k times this)."""
  E = stats.prob_sum_E.shape[-1]
  tokens = jnp.maximum(stats.tokens, 1.0)
  f_E = jax.lax.stop_gradient(stats.load_E) / (tokens * k)
  return E * jnp.sum(f_E * stats.prob_sum_E / tokens)


def z_loss(stats: RouterStats) -> jax.Array:
  """Mean over tokens of logsumexp(router logits)^2 (ST-MoE): keeps the router's logits small."""
  return stats.z_sum / jnp.maximum(stats.tokens, 1.0)


class MoE(nnx.Module):
  """Top-k routed SwiGLU experts (+ optional shared expert); see the module docstring."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, lora: Optional[LoraSpec] = None):
    D, E, F = cfg.hidden, cfg.num_experts, cfg.expert_width
    pd = dtype_of(cfg.param_dtype)
    self.router = normal_param(rngs, (D, E), ("embed", None), D ** -0.5, pd)
    self.gate = normal_param(rngs, (E, D, F), ("expert", "embed", "mlp"), D ** -0.5, pd)
    self.up = normal_param(rngs, (E, D, F), ("expert", "embed", "mlp"), D ** -0.5, pd)
    self.down = normal_param(rngs, (E, F, D), ("expert", "mlp", "embed"),
                             F ** -0.5 / (2 * cfg.num_layers) ** 0.5, pd)
    self.shared = (MLP(cfg, rngs, width=cfg.shared_expert_intermediate, lora=lora)
                   if cfg.shared_expert_intermediate else None)
    # one adapter per expert (model/lora.py); the router is never adapted
    self.gate_lora = adapter(lora, "gate", (D,), ("embed",), (F,), ("mlp",), pd, rngs, experts=E)
    self.up_lora = adapter(lora, "up", (D,), ("embed",), (F,), ("mlp",), pd, rngs, experts=E)
    self.down_lora = adapter(lora, "down", (F,), ("mlp",), (D,), ("embed",), pd, rngs, experts=E)
    self.cfg = cfg

  def route(self, x_UD, recorded_Uk=None, replay: bool = False):
    """(router logits fp32 [U, E], probs [U, E], own top-k ids [U, k], ids used [U, k], gates fp32 [U, k])."""
    cfg = self.cfg
    logits_UE = jnp.dot(x_UD.astype(jnp.float32), self.router[...].astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)
    probs_UE = jax.nn.softmax(logits_UE, axis=-1)
    _, own_Uk = jax.lax.top_k(jax.lax.stop_gradient(probs_UE), cfg.experts_per_token)
    ids_Uk = own_Uk
    if replay and recorded_Uk is not None:
      ids_Uk = jnp.where(jnp.all(recorded_Uk >= 0, axis=-1, keepdims=True), recorded_Uk.astype(jnp.int32), own_Uk)
    gates_Uk = jnp.take_along_axis(probs_UE, ids_Uk, axis=-1)
    if cfg.norm_topk_prob:
      gates_Uk = gates_Uk / jnp.sum(gates_Uk, axis=-1, keepdims=True)
    return logits_UE, probs_UE, own_Uk, ids_Uk, gates_Uk

  def __call__(self, x_BTD, recorded_BTk=None, mask_BT=None, replay: bool = False):
    """(y_BTD, RouterStats). `recorded_BTk`: the generator's ids for this layer (-1: none)."""
    cfg = self.cfg
    B, T, D = x_BTD.shape
    k = cfg.experts_per_token
    x_UD = x_BTD.reshape(B * T, D)
    recorded_Uk = None if recorded_BTk is None else recorded_BTk.reshape(B * T, k)
    logits_UE, probs_UE, own_Uk, ids_Uk, gates_Uk = self.route(x_UD, recorded_Uk, replay)
    experts = dispatch_ragged if cfg.moe_dispatch == "ragged" else dispatch_dense
    dt = dtype_of(cfg.dtype)
    w = tuple(p[...].astype(dt) for p in (self.gate, self.up, self.down))
    ad = tuple(None if a is None else ExpertAdapter(a.a[...].astype(dt), a.b[...].astype(dt), a.scale)
               for a in (self.gate_lora, self.up_lora, self.down_lora))
    y_UD = experts(x_UD.astype(dt), ids_Uk, gates_Uk.astype(dt), *w, adapters=ad)
    if self.shared is not None:
      y_UD = y_UD + self.shared(x_UD)
    return y_UD.reshape(B, T, D).astype(x_BTD.dtype), self._stats(
        logits_UE, probs_UE, own_Uk, ids_Uk, recorded_Uk, mask_BT, (B, T))

  def _stats(self, logits_UE, probs_UE, own_Uk, ids_Uk, recorded_Uk, mask_BT, BT) -> RouterStats:
    E = self.cfg.num_experts
    mask_U = jnp.ones(logits_UE.shape[:1], jnp.float32) if mask_BT is None else mask_BT.reshape(-1).astype(
        jnp.float32)
    sg = jax.lax.stop_gradient
    load_E = jnp.zeros((E,), jnp.float32).at[ids_Uk.reshape(-1)].add(jnp.repeat(mask_U, ids_Uk.shape[1]))
    lse_U = jax.nn.logsumexp(logits_UE, axis=-1)
    if recorded_Uk is None:
      mismatched = compared = jnp.float32(0.0)
    else:
      has_U = jnp.all(recorded_Uk >= 0, axis=-1).astype(jnp.float32) * mask_U
      same_U = jnp.all(jnp.sort(own_Uk, axis=-1) == jnp.sort(recorded_Uk.astype(jnp.int32), axis=-1), axis=-1)
      compared, mismatched = jnp.sum(has_U), jnp.sum(has_U * (1.0 - same_U))
    return RouterStats(expert_ids_BTk=own_Uk.reshape(*BT, -1), prob_sum_E=jnp.sum(mask_U[:, None] * probs_UE, 0),
                       load_E=sg(load_E), z_sum=jnp.sum(mask_U * lse_U ** 2), tokens=jnp.sum(mask_U),
                       mismatched=mismatched, compared=compared)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExpertAdapter:
  """One projection's per-expert adapter in compute dtype: a [E, in, r], b [E, r, out], scale (model/lora.py)."""
  a_EIr: jax.Array
  b_ErO: jax.Array
  scale: float = dataclasses.field(metadata=dict(static=True))


def _ragged(x_AI, w_EIO, sizes_E, ad: Optional[ExpertAdapter]):
  """Each assignment's rows times its expert's weight, plus its expert's adapter scale * (x A) B."""
  y_AO = jax.lax.ragged_dot(x_AI, w_EIO, sizes_E)
  if ad is None:
    return y_AO
  return y_AO + ad.scale * jax.lax.ragged_dot(jax.lax.ragged_dot(x_AI, ad.a_EIr, sizes_E), ad.b_ErO, sizes_E)


def _swiglu_ragged(x_AD, gate_EDF, up_EDF, down_EFD, sizes_E, adapters=(None, None, None)):
  g_AF = _ragged(x_AD, gate_EDF, sizes_E, adapters[0])
  u_AF = _ragged(x_AD, up_EDF, sizes_E, adapters[1])
  return _ragged(jax.nn.silu(g_AF) * u_AF, down_EFD, sizes_E, adapters[2])


def dispatch_ragged(x_UD, ids_Uk, gates_Uk, gate_EDF, up_EDF, down_EFD, adapters=(None, None, None)):
  """Dropless: sort the U*k assignments by expert, one grouped matmul per projection, scatter back, combine."""
  U, k = ids_Uk.shape
  E = gate_EDF.shape[0]
  flat_A = ids_Uk.reshape(-1)
  order_A = jnp.argsort(flat_A, stable=True)  # assignments grouped by expert, in token order within a group
  sizes_E = jnp.bincount(flat_A, length=E).astype(jnp.int32)
  y_AD = _swiglu_ragged(x_UD[order_A // k], gate_EDF, up_EDF, down_EFD, sizes_E, adapters)
  unsorted_AD = jnp.zeros_like(y_AD).at[order_A].set(y_AD, unique_indices=True)
  return jnp.einsum("UkD,Uk->UD", unsorted_AD.reshape(U, k, -1), gates_Uk)


def dispatch_dense(x_UD, ids_Uk, gates_Uk, gate_EDF, up_EDF, down_EFD, adapters=(None, None, None)):
  """Every expert on every token, combined with one-hot gate weights (reference; E/k times the work)."""
  E = gate_EDF.shape[0]
  combine_UE = jnp.sum(jax.nn.one_hot(ids_Uk, E, dtype=gates_Uk.dtype) * gates_Uk[..., None], axis=1)

  def each(x, w_EIO, ad, spec):  # spec: x's letters -> the [U, E, out] result
    y = jnp.einsum(f"{spec},EIO->UEO", x, w_EIO)
    if ad is None:
      return y
    return y + ad.scale * jnp.einsum("UEr,ErO->UEO", jnp.einsum(f"{spec},EIr->UEr", x, ad.a_EIr), ad.b_ErO)

  g_UEF = each(x_UD, gate_EDF, adapters[0], "UI")
  u_UEF = each(x_UD, up_EDF, adapters[1], "UI")
  y_UED = each(jax.nn.silu(g_UEF) * u_UEF, down_EFD, adapters[2], "UEI")
  return jnp.einsum("UED,UE->UD", y_UED, combine_UE)
