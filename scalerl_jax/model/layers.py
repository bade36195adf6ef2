"""The layers every decoder family shares, in Flax NNX: RMSNorm, RoPE, rank-2 projections, grouped-query attention
with the explicit KV cache and the read-only shared prefix, and the SwiGLU MLP. The dense decoder
(`transformer.py`) is built from them, and an MoE decoder reuses all but the MLP.

Array names carry their shape as a suffix (`x_BTD`); the letters are the package legend in `scalerl_jax/types.py`
(here: B rows or decode slots, T query tokens of this call, S key/value positions, L prompt (prefix) tokens, D
hidden, F MLP width, Q query heads, K key/value heads, R = Q // K, H head dim). Local letters are defined where
they are used.

Parameters carry *logical* axis names as metadata (`logical_axes`); `scalerl_jax.mesh` maps them to mesh axes.
This module never names a mesh axis and holds no parallelism code.

The KV cache is an explicit pytree argument and result (not module state), so the rollout engine can keep one
cache per decode slot, pass params on every call, and swap params between calls without touching the cache.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.model.lora import LoraSpec, adapter


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerCache:
  """Keys and values of one layer, KV-head-major, keys transposed: k [B, K, H, S], v [B, K, S, H].

  Decode attention multiplies contiguous blocks per (row, KV head), and both dots then contract a non-minor
  dim of the cache (q [J, H] x k [H, S], p [J, S] x v [S, H], J = R*T queries). Measured in decode on CPU: a
  [B, S, K, H] cache made XLA transpose the whole cache twice per layer and step (~4x slower); keys stored [S, H]
  made the QK dot ~2x slower than with [H, S]."""
  k_BKHS: jax.Array
  v_BKSH: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SharedPrefix:
  """One layer's keys and values of a prompt that rows continue (the trainer computes each prompt once per group
  and repeats its KV over the group's rows). Slot j holds position j; slots at or beyond `length_B` are padding."""
  k_BKLH: jax.Array
  v_BKLH: jax.Array
  length_B: jax.Array  # int32[B] true prefix length per row


def dtype_of(name: str):
  """The jnp dtype of a config string (`model.dtype`, `model.param_dtype`)."""
  return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def dense(x, w, contract: int = 1):
  """`x[..., *w.shape[:contract]] @ w` as one rank-2 matmul, e.g. [B, T, D] x [D, Q, H] -> [B, T, Q, H].

  XLA:CPU runs rank-2 dots through its fast GEMM; the gradients of an einsum like "BTD,DF->BTF" contract two
  batch dims (B, T) and fell to a slow path (measured: SwiGLU MLP forward + backward on [512, 24, 128] took
  0.26 s as einsums and 0.17 s as rank-2 matmuls). Reshapes merge leading dims, so shardings carry over.
  """
  in_shape, out_shape = w.shape[:contract], w.shape[contract:]
  lead = x.shape[:x.ndim - contract]
  k = math.prod(in_shape)
  y = jnp.dot(x.reshape(-1, k), w.reshape(k, -1))
  return y.reshape(*lead, *out_shape)


def project(x, w, ad, dt, contract: int = 1):
  """`dense(x, w)` in compute dtype `dt`, plus the adapter's scale * (x A) B when `ad` (a lora.Adapter) is given:
  factored, so the backward needs no gradient of w's size."""
  y = dense(x, w[...].astype(dt), contract)
  if ad is None:
    return y
  return y + ad.scale * dense(dense(x, ad.a[...].astype(dt), contract), ad.b[...].astype(dt))


def normal_param(rngs: nnx.Rngs, shape, axes, scale: float, dtype) -> nnx.Param:
  """A normal(0, scale) parameter carrying its logical axes."""
  init = jax.nn.initializers.normal(stddev=scale)
  return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, param_dtype):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope_frequencies(cfg: ModelConfig):
  """float32[H/2] inverse frequencies of RoPE: theta^(-2i/H), then rescaled by `model.rope_scaling`.

  "llama3" (Llama 3.1+, transformers' rope_type llama3): with wavelength w = 2 pi / f and C =
  rope_original_max_positions, frequencies with w > C / low_freq_factor are divided by rope_factor, those with
  w < C / high_freq_factor are kept, and in between f becomes (1 - s) f / factor + s f with
  s = (C / w - low_freq_factor) / (high_freq_factor - low_freq_factor): long wavelengths are stretched, short ones
  kept, smoothly in between. Computed in float32 in transformers' order of operations."""
  half = cfg.head_dim // 2
  freq_h = cfg.rope_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if cfg.rope_scaling == "llama3":
    factor, low, high, C = (cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                            cfg.rope_original_max_positions)
    wavelength_h = 2 * math.pi / freq_h
    smooth_h = (C / wavelength_h - low) / (high - low)
    between_h = (1 - smooth_h) * freq_h / factor + smooth_h * freq_h
    freq_h = jnp.where(wavelength_h > C / low, freq_h / factor,
                       jnp.where(wavelength_h < C / high, freq_h, between_h))
  return freq_h


def rope_angles(positions_BT, cfg: ModelConfig):
  """(sin, cos) of the rotary angles, [B, T, 1, H/2] each, looked up in a [max_seq_len, H/2] table of
  position * `rope_frequencies(cfg)`. One lookup per forward serves every layer's queries and keys. The table
  depends on no input, so XLA folds or hoists it (out of the decode loop); computing sin/cos from the positions
  instead gets fused into each of the 2L rope consumers and evaluated per head and element (on CPU those fusions
  were ~15 % of a decode step). Positions must be < model.max_seq_len (config validation keeps prompt + new
  tokens within it)."""
  freq_h = rope_frequencies(cfg)
  angle_Sh = jnp.arange(cfg.max_seq_len, dtype=jnp.float32)[:, None] * freq_h
  return jnp.sin(angle_Sh)[positions_BT][:, :, None, :], jnp.cos(angle_Sh)[positions_BT][:, :, None, :]


def rope(x_BTAH, sin_cos):
  """Rotary embedding on the two halves of the head dim (the Llama/Qwen 'rotate_half' layout). A: any head count
  (Q for queries, K for keys)."""
  sin, cos = sin_cos
  x1, x2 = jnp.split(x_BTAH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTAH.dtype)


def _masked(logits_CJS, mask_BTS):
  """fp32 logits with the keys a query may not see at the lowest float (C = B*K blocks, J = R*T queries)."""
  B, T, S = mask_BTS.shape
  C, J, _ = logits_CJS.shape
  logits_BKRTS = logits_CJS.reshape(B, C // B, J // T, T, S)
  return jnp.where(mask_BTS[:, None, None], logits_BKRTS, jnp.finfo(jnp.float32).min).reshape(C, J, S)


def _softmax(logits_CJS):
  """(probs, row max, row sum of exp): `jax.nn.softmax`'s arithmetic, keeping what the backward recomputes from."""
  max_CJ1 = jnp.max(logits_CJS, axis=-1, keepdims=True)
  exp_CJS = jnp.exp(logits_CJS - max_CJ1)
  sum_CJ1 = jnp.sum(exp_CJS, axis=-1, keepdims=True)
  return exp_CJS / sum_CJ1, max_CJ1, sum_CJ1


def _attend_fwd(q_CJH, k_CSH, v_CSH, mask_BTS):
  H = q_CJH.shape[-1]
  logits_CJS = jnp.einsum("CJH,CSH->CJS", q_CJH, k_CSH, preferred_element_type=jnp.float32) * (H ** -0.5)
  probs_CJS, max_CJ1, sum_CJ1 = _softmax(_masked(logits_CJS, mask_BTS))
  out_CJH = jnp.einsum("CJS,CSH->CJH", probs_CJS.astype(q_CJH.dtype), v_CSH)
  return out_CJH, (q_CJH, k_CSH, v_CSH, mask_BTS, max_CJ1, sum_CJ1, out_CJH)


def _attend_bwd(res, dout_CJH):
  """The softmax backward as FlashAttention writes it: with dP = dO V^T, dS = P * (dP - rowsum(dO * O)), since
  rowsum(P * dP) = rowsum(dO * O). Autodiff's rowsum(P * dP) made XLA:CPU fuse the dP matmul into that reduction
  and run it as a loop (~15 % of a 36M train step); here every matmul is a plain batched dot. P is recomputed from
  the saved row max and sum (the forward's exact arithmetic) instead of kept: one [C, J, S] fp32 array less per
  layer between forward and backward."""
  q_CJH, k_CSH, v_CSH, mask_BTS, max_CJ1, sum_CJ1, out_CJH = res
  H, dt = q_CJH.shape[-1], q_CJH.dtype
  logits_CJS = jnp.einsum("CJH,CSH->CJS", q_CJH, k_CSH, preferred_element_type=jnp.float32) * (H ** -0.5)
  probs_CJS = jnp.exp(_masked(logits_CJS, mask_BTS) - max_CJ1) / sum_CJ1
  dv_CSH = jnp.einsum("CJS,CJH->CSH", probs_CJS.astype(dt), dout_CJH)
  dprobs_CJS = jnp.einsum("CJH,CSH->CJS", dout_CJH, v_CSH, preferred_element_type=jnp.float32)
  delta_CJ1 = jnp.sum(dout_CJH.astype(jnp.float32) * out_CJH.astype(jnp.float32), axis=-1, keepdims=True)
  # masked keys get no gradient (a query that sees no key at all has uniform probs, but its logits are constants)
  dlogits_CJS = _masked_zero(probs_CJS * (dprobs_CJS - delta_CJ1) * (H ** -0.5), mask_BTS).astype(dt)
  dq_CJH = jnp.einsum("CJS,CSH->CJH", dlogits_CJS, k_CSH)
  dk_CSH = jnp.einsum("CJS,CJH->CSH", dlogits_CJS, q_CJH)
  return dq_CJH, dk_CSH, dv_CSH, None


def _masked_zero(x_CJS, mask_BTS):
  B, T, S = mask_BTS.shape
  C, J, _ = x_CJS.shape
  return jnp.where(mask_BTS[:, None, None], x_CJS.reshape(B, C // B, J // T, T, S), 0.0).reshape(C, J, S)


@jax.custom_vjp
def attend(q_CJH, k_CSH, v_CSH, mask_BTS):
  """softmax(q k^T / sqrt(H), masked) v per block c = (row, KV head): q [C, J, H] (J = R*T queries, query
  j = r*T + t), keys and values [C, S, H], mask_BTS: key s visible to query t of row b = c // K. fp32 logits and
  softmax; probs cast to the compute dtype for the PV matmul. Gradients by `_attend_bwd`."""
  return _attend_fwd(q_CJH, k_CSH, v_CSH, mask_BTS)[0]


attend.defvjp(_attend_fwd, _attend_bwd)


class Attention(nnx.Module):
  """Grouped-query attention with optional q/k/v biases, optional QK-norm and an explicit KV cache. Query head q
  reads key/value head q // R (transformers' repeat_kv order)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, lora: Optional[LoraSpec] = None):
    D, Q, K, H = cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pd = dtype_of(cfg.param_dtype)
    self.q = normal_param(rngs, (D, Q, H), ("embed", "heads", "head_dim"), D ** -0.5, pd)
    self.k = normal_param(rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), D ** -0.5, pd)
    self.v = normal_param(rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), D ** -0.5, pd)
    self.o = normal_param(rngs, (Q, H, D), ("heads", "head_dim", "embed"),
                          (Q * H) ** -0.5 / (2 * cfg.num_layers) ** 0.5, pd)
    # Qwen2-style q/k/v biases, added to the projections' outputs (zeros at init: they draw no random numbers)
    bias = lambda shape, axes: nnx.Param(jnp.zeros(shape, pd), logical_axes=axes)
    self.q_bias = bias((Q, H), ("heads", "head_dim")) if cfg.qkv_bias else None
    self.k_bias = bias((K, H), ("kv_heads", "head_dim")) if cfg.qkv_bias else None
    self.v_bias = bias((K, H), ("kv_heads", "head_dim")) if cfg.qkv_bias else None
    self.q_norm = RMSNorm(H, cfg.norm_eps, pd) if cfg.qk_norm else None
    self.k_norm = RMSNorm(H, cfg.norm_eps, pd) if cfg.qk_norm else None
    # low-rank adapters (model/lora.py), after every base param so the base's random draws stay as without them
    self.q_lora = adapter(lora, "q", (D,), ("embed",), (Q, H), ("heads", "head_dim"), pd, rngs)
    self.k_lora = adapter(lora, "k", (D,), ("embed",), (K, H), ("kv_heads", "head_dim"), pd, rngs)
    self.v_lora = adapter(lora, "v", (D,), ("embed",), (K, H), ("kv_heads", "head_dim"), pd, rngs)
    self.o_lora = adapter(lora, "o", (Q, H), ("heads", "head_dim"), (D,), ("embed",), pd, rngs)
    self.cfg = cfg

  def __call__(self, x_BTD, positions_BT, sin_cos, cache: Optional[LayerCache],
               prefix: Optional[SharedPrefix] = None):
    dt = dtype_of(self.cfg.dtype)
    q_BTQH = project(x_BTD, self.q, self.q_lora, dt)
    k_BTKH = project(x_BTD, self.k, self.k_lora, dt)
    v_BTKH = project(x_BTD, self.v, self.v_lora, dt)
    if self.q_bias is not None:
      q_BTQH = q_BTQH + self.q_bias[...].astype(dt)
      k_BTKH = k_BTKH + self.k_bias[...].astype(dt)
      v_BTKH = v_BTKH + self.v_bias[...].astype(dt)
    if self.q_norm is not None:  # Qwen3: over the head dim, one scale [H] shared by the heads, before RoPE
      q_BTQH, k_BTKH = self.q_norm(q_BTQH), self.k_norm(k_BTKH)
    q_BTQH, k_BTKH = rope(q_BTQH, sin_cos), rope(k_BTKH, sin_cos)

    key_ok_BS = None  # keys every query may see regardless of position (None: all)
    if prefix is not None:  # this call's tokens continue a read-only prefix (prompt computed once per group)
      keys_BKSH = jnp.concatenate([prefix.k_BKLH.astype(dt), k_BTKH.transpose(0, 2, 1, 3)], axis=2)
      values_BKSH = jnp.concatenate([prefix.v_BKLH.astype(dt), v_BTKH.transpose(0, 2, 1, 3)], axis=2)
      B, L = prefix.length_B.shape[0], prefix.k_BKLH.shape[2]
      slot_L = jnp.arange(L)
      key_pos_BS = jnp.concatenate([jnp.broadcast_to(slot_L, (B, L)), positions_BT], axis=1)
      key_ok_BS = jnp.concatenate([slot_L[None, :] < prefix.length_B[:, None],
                                   jnp.ones(positions_BT.shape, bool)], axis=1)
    elif cache is None:  # full causal self-attention over this call's tokens (training, prefill)
      keys_BKSH, values_BKSH = k_BTKH.transpose(0, 2, 1, 3), v_BTKH.transpose(0, 2, 1, 3)
      key_pos_BS = positions_BT
    else:  # write this call's keys at their absolute positions, then attend over the whole cache
      B, T = positions_BT.shape
      rows_BT = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
      # advanced indices (rows, positions) split by slices come first: the update is [B, T, K, H]
      keys_BKHS = cache.k_BKHS.at[rows_BT, :, :, positions_BT].set(k_BTKH.astype(cache.k_BKHS.dtype), mode="drop")
      values_BKSH = cache.v_BKSH.at[rows_BT, :, positions_BT].set(v_BTKH.astype(cache.v_BKSH.dtype), mode="drop")
      key_pos_BS = jnp.broadcast_to(jnp.arange(values_BKSH.shape[2])[None, :], (B, values_BKSH.shape[2]))
    if cache is None:
      keys_BKHS = keys_BKSH.transpose(0, 1, 3, 2)  # only the returned cache (prefill) uses it; training drops it
    new_cache = LayerCache(keys_BKHS, values_BKSH)

    B, T, Q, H = q_BTQH.shape
    K, S = values_BKSH.shape[1], values_BKSH.shape[2]
    R = Q // K
    # Local letters: C = B*K (one block per row and KV head), J = R*T (the queries that read one block).
    # One batch dim C: XLA:CPU runs these dots several times faster than with two batch dims (B, K), and
    # [B, K, S, H] reshapes to [C, S, H] for free.
    q_CJH = q_BTQH.reshape(B, T, K, R, H).transpose(0, 2, 3, 1, 4).reshape(B * K, R * T, H)
    # A query at absolute position p sees keys at positions <= p. With a cache, positions beyond a slot's
    # current length hold stale or zero keys and are excluded by the same test.
    mask_BTS = key_pos_BS[:, None, :] <= positions_BT[:, :, None]
    if key_ok_BS is not None:  # a prefix's padding slots are never visible
      mask_BTS = mask_BTS & key_ok_BS[:, None, :]
    if cache is None:  # training / prefill: keys as computed
      out_CJH = attend(q_CJH, keys_BKSH.reshape(B * K, S, H).astype(dt), values_BKSH.reshape(B * K, S, H).astype(dt),
                       mask_BTS)
    else:  # decode: the cache's transposed keys
      logits_CJS = jnp.einsum("CJH,CHS->CJS", q_CJH, keys_BKHS.reshape(B * K, H, S).astype(dt),
                              preferred_element_type=jnp.float32)
      probs_CJS = _softmax(_masked(logits_CJS * (H ** -0.5), mask_BTS))[0].astype(dt)
      out_CJH = jnp.einsum("CJS,CSH->CJH", probs_CJS, values_BKSH.reshape(B * K, S, H).astype(dt))
    out_BTQH = out_CJH.reshape(B, K, R, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, Q, H)
    out_BTD = project(out_BTQH, self.o, self.o_lora, dt, contract=2)
    return out_BTD, new_cache


class MLP(nnx.Module):
  """SwiGLU: down(silu(x W_gate) * (x W_up)); `width` defaults to model.intermediate (an MoE's shared expert
  passes its own)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, width: Optional[int] = None, lora: Optional[LoraSpec] = None):
    D, F = cfg.hidden, width or cfg.intermediate
    pd = dtype_of(cfg.param_dtype)
    self.gate = normal_param(rngs, (D, F), ("embed", "mlp"), D ** -0.5, pd)
    self.up = normal_param(rngs, (D, F), ("embed", "mlp"), D ** -0.5, pd)
    self.down = normal_param(rngs, (F, D), ("mlp", "embed"), F ** -0.5 / (2 * cfg.num_layers) ** 0.5, pd)
    self.gate_lora = adapter(lora, "gate", (D,), ("embed",), (F,), ("mlp",), pd, rngs)
    self.up_lora = adapter(lora, "up", (D,), ("embed",), (F,), ("mlp",), pd, rngs)
    self.down_lora = adapter(lora, "down", (F,), ("mlp",), (D,), ("embed",), pd, rngs)
    self.dtype = dtype_of(cfg.dtype)

  def __call__(self, x_BTD):
    dt = self.dtype
    g_BTF = project(x_BTD, self.gate, self.gate_lora, dt)
    u_BTF = project(x_BTD, self.up, self.up_lora, dt)
    return project(jax.nn.silu(g_BTF) * u_BTF, self.down, self.down_lora, dt)
