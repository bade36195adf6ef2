"""Dense decoder-only policy (Llama / Qwen3 family) in Flax NNX.

Shape legend (array names carry their shape as a suffix; einsum strings use the same letters):
  B batch (rows or decode slots)   T query tokens in this call   S key/value positions (cache length)
  D hidden                         N query heads                 K key/value heads
  H head dim (independent of D/N)  F MLP width                   V vocabulary   G = N // K query heads per KV head

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerCache:
  """Keys and values of one layer, KV-head-major, keys transposed: k [B, K, H, S], v [B, K, S, H].

  Decode attention multiplies contiguous blocks per (row, KV head), and both dots then contract a non-minor
  dim of the cache (q [Q, H] x k [H, S], p [Q, S] x v [S, H]). Measured in decode on CPU: a [B, S, K, H] cache
  made XLA transpose the whole cache twice per layer and step (~4x slower); keys stored [S, H] made the QK dot
  ~2x slower than with [H, S]."""
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


def _dtype(name: str):
  return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def dense(x, w, contract: int = 1):
  """`x[..., *w.shape[:contract]] @ w` as one rank-2 matmul, e.g. [B, T, D] x [D, N, H] -> [B, T, N, H].

  XLA:CPU runs rank-2 dots through its fast GEMM; the gradients of an einsum like "BTD,DF->BTF" contract two
  batch dims (B, T) and fell to a slow path (measured: SwiGLU MLP forward + backward on [512, 24, 128] took
  0.26 s as einsums and 0.17 s as rank-2 matmuls). Reshapes merge leading dims, so shardings carry over.
  """
  in_shape, out_shape = w.shape[:contract], w.shape[contract:]
  lead = x.shape[:x.ndim - contract]
  k = math.prod(in_shape)
  y = jnp.dot(x.reshape(-1, k), w.reshape(k, -1))
  return y.reshape(*lead, *out_shape)


def _param(rngs: nnx.Rngs, shape, axes, scale: float, dtype) -> nnx.Param:
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


def rope_angles(positions_BT, head_dim: int, theta: float, max_len: int):
  """(sin, cos) of the rotary angles, [B, T, 1, H/2] each, looked up in a [max_len, H/2] table. One lookup per
  forward serves every layer's queries and keys. The table depends on no input, so XLA folds or hoists it (out of
  the decode loop); computing sin/cos from the positions instead gets fused into each of the 2L rope consumers and
  evaluated per head and element (on CPU those fusions were ~15 % of a decode step). Positions must be < max_len
  (model.max_seq_len; config validation keeps prompt + new tokens within it)."""
  half = head_dim // 2
  freq_h = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_Sh = jnp.arange(max_len, dtype=jnp.float32)[:, None] * freq_h
  return jnp.sin(angle_Sh)[positions_BT][:, :, None, :], jnp.cos(angle_Sh)[positions_BT][:, :, None, :]


def rope(x_BTnH, sin_cos):
  """Rotary embedding on the two halves of the head dim (the Llama/Qwen 'rotate_half' layout)."""
  sin, cos = sin_cos
  x1, x2 = jnp.split(x_BTnH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTnH.dtype)


class Attention(nnx.Module):
  """Grouped-query attention with optional QK-norm and an explicit KV cache."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    D, N, K, H = cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pd = _dtype(cfg.param_dtype)
    self.q = _param(rngs, (D, N, H), ("embed", "heads", "head_dim"), D ** -0.5, pd)
    self.k = _param(rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), D ** -0.5, pd)
    self.v = _param(rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), D ** -0.5, pd)
    self.o = _param(rngs, (N, H, D), ("heads", "head_dim", "embed"), (N * H) ** -0.5 / (2 * cfg.num_layers) ** 0.5,
                    pd)
    self.q_norm = RMSNorm(H, cfg.norm_eps, pd) if cfg.qk_norm else None
    self.k_norm = RMSNorm(H, cfg.norm_eps, pd) if cfg.qk_norm else None
    self.cfg = cfg

  def __call__(self, x_BTD, positions_BT, sin_cos, cache: Optional[LayerCache],
               prefix: Optional[SharedPrefix] = None):
    cfg, dt = self.cfg, _dtype(self.cfg.dtype)
    q_BTNH = dense(x_BTD, self.q[...].astype(dt))
    k_BTKH = dense(x_BTD, self.k[...].astype(dt))
    v_BTKH = dense(x_BTD, self.v[...].astype(dt))
    if self.q_norm is not None:
      q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
    q_BTNH, k_BTKH = rope(q_BTNH, sin_cos), rope(k_BTKH, sin_cos)

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

    B, T, N, H = q_BTNH.shape
    K, S = values_BKSH.shape[1], values_BKSH.shape[2]
    G = N // K
    # One batch dim R = B*K (Q = G*T queries per KV head): XLA:CPU runs these dots several times faster than
    # with two batch dims (B, K), and [B, K, S, H] reshapes to [R, S, H] for free.
    q_RQH = q_BTNH.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(B * K, G * T, H)
    if cache is None:  # training / prefill: keys as computed
      logits_RQS = jnp.einsum("RQH,RSH->RQS", q_RQH, keys_BKSH.reshape(B * K, S, H).astype(dt),
                              preferred_element_type=jnp.float32)
    else:  # decode: the cache's transposed keys
      logits_RQS = jnp.einsum("RQH,RHS->RQS", q_RQH, keys_BKHS.reshape(B * K, H, S).astype(dt),
                              preferred_element_type=jnp.float32)
    logits_RQS = logits_RQS * (H ** -0.5)
    logits_BKGTS = logits_RQS.reshape(B, K, G, T, S)
    # A query at absolute position p sees keys at positions <= p. With a cache, positions beyond a slot's
    # current length hold stale or zero keys and are excluded by the same test.
    mask_BTS = key_pos_BS[:, None, :] <= positions_BT[:, :, None]
    if key_ok_BS is not None:  # a prefix's padding slots are never visible
      mask_BTS = mask_BTS & key_ok_BS[:, None, :]
    logits_BKGTS = jnp.where(mask_BTS[:, None, None], logits_BKGTS, jnp.finfo(jnp.float32).min)
    probs_BKGTS = jax.nn.softmax(logits_BKGTS, axis=-1).astype(dt)
    out_RQH = jnp.einsum("RQS,RSH->RQH", probs_BKGTS.reshape(B * K, G * T, S),
                         values_BKSH.reshape(B * K, S, H).astype(dt))
    out_BTNH = out_RQH.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)
    out_BTD = dense(out_BTNH, self.o[...].astype(dt), contract=2)
    return out_BTD, new_cache


class MLP(nnx.Module):
  """SwiGLU: down(silu(x W_gate) * (x W_up))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    D, F = cfg.hidden, cfg.intermediate
    pd = _dtype(cfg.param_dtype)
    self.gate = _param(rngs, (D, F), ("embed", "mlp"), D ** -0.5, pd)
    self.up = _param(rngs, (D, F), ("embed", "mlp"), D ** -0.5, pd)
    self.down = _param(rngs, (F, D), ("mlp", "embed"), F ** -0.5 / (2 * cfg.num_layers) ** 0.5, pd)
    self.dtype = _dtype(cfg.dtype)

  def __call__(self, x_BTD):
    dt = self.dtype
    g_BTF = dense(x_BTD, self.gate[...].astype(dt))
    u_BTF = dense(x_BTD, self.up[...].astype(dt))
    return dense(jax.nn.silu(g_BTF) * u_BTF, self.down[...].astype(dt))


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    pd = _dtype(cfg.param_dtype)
    self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x_BTD, positions_BT, sin_cos, cache, prefix=None):
    h_BTD, cache = self.attn(self.attn_norm(x_BTD), positions_BT, sin_cos, cache, prefix)
    x_BTD = x_BTD + h_BTD
    return x_BTD + self.mlp(self.mlp_norm(x_BTD)), cache


class Transformer(nnx.Module):
  """Embeddings -> blocks -> final norm. `__call__` returns hidden states; `logits` applies the LM head."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    pd = _dtype(cfg.param_dtype)
    self.cfg = cfg
    # std 1/sqrt(D): with tied embeddings the LM head then starts with unit-variance logits
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden), ("vocab", "embed"), cfg.hidden ** -0.5, pd)
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.lm_head = None if cfg.tie_embeddings else _param(
        rngs, (cfg.hidden, cfg.vocab_size), ("embed", "vocab"), cfg.hidden ** -0.5, pd)

  def __call__(self, tokens_BT, positions_BT, cache: Optional[list[LayerCache]] = None,
               prefix: Optional[list[SharedPrefix]] = None):
    """Hidden states and per-layer KV. `cache`: decode into it; `prefix`: attend to a read-only prefix per layer
    as well as causally to this call's tokens; neither: causal self-attention over this call's tokens."""
    x_BTD = self.embed[...].astype(_dtype(self.cfg.dtype))[tokens_BT]
    sin_cos = rope_angles(positions_BT, self.cfg.head_dim, self.cfg.rope_theta, self.cfg.max_seq_len)
    new_cache = []
    for i, block in enumerate(self.blocks):
      x_BTD, layer_cache = block(x_BTD, positions_BT, sin_cos, None if cache is None else cache[i],
                                 None if prefix is None else prefix[i])
      new_cache.append(layer_cache)
    return self.final_norm(x_BTD), new_cache

  def logits(self, h_BTD):
    """LM head. With `fp32_lm_head` both operands are fp32 and the matmul accumulates and returns fp32."""
    cfg = self.cfg
    if cfg.tie_embeddings:
      w_DV, spec = self.embed[...], "BTD,VD->BTV"
    else:
      w_DV, spec = self.lm_head[...], "BTD,DV->BTV"
    if cfg.fp32_lm_head:
      return jnp.einsum(spec, h_BTD.astype(jnp.float32), w_DV.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    dt = _dtype(cfg.dtype)
    return jnp.einsum(spec, h_BTD.astype(dt), w_DV.astype(dt)).astype(jnp.float32)
