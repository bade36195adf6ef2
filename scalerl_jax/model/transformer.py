"""Dense decoder-only policy (Llama / Qwen3 family) in Flax NNX: blocks of attention + SwiGLU MLP from `layers.py`,
and the dense family's analytic parameter count and FLOPs.

Array names carry their shape as a suffix (`x_BTD`, `logits_BTV`); the letters are the package legend in
`scalerl_jax/types.py`. Parameters carry logical axis names (see `layers.py`); nothing here names a mesh axis.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.model.layers import (MLP, Attention, LayerCache, RMSNorm, SharedPrefix, dtype_of, normal_param,
                                      rope_angles)


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    pd = dtype_of(cfg.param_dtype)
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
    pd = dtype_of(cfg.param_dtype)
    self.cfg = cfg
    # std 1/sqrt(D): with tied embeddings the LM head then starts with unit-variance logits
    self.embed = normal_param(rngs, (cfg.vocab_size, cfg.hidden), ("vocab", "embed"), cfg.hidden ** -0.5, pd)
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.lm_head = None if cfg.tie_embeddings else normal_param(
        rngs, (cfg.hidden, cfg.vocab_size), ("embed", "vocab"), cfg.hidden ** -0.5, pd)

  def __call__(self, tokens_BT, positions_BT, cache: Optional[list[LayerCache]] = None,
               prefix: Optional[list[SharedPrefix]] = None):
    """Hidden states and per-layer KV. `cache`: decode into it; `prefix`: attend to a read-only prefix per layer
    as well as causally to this call's tokens; neither: causal self-attention over this call's tokens."""
    x_BTD = self.embed[...].astype(dtype_of(self.cfg.dtype))[tokens_BT]
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
      w, spec = self.embed[...], "BTD,VD->BTV"  # the embedding table, [V, D]
    else:
      w, spec = self.lm_head[...], "BTD,DV->BTV"
    if cfg.fp32_lm_head:
      return jnp.einsum(spec, h_BTD.astype(jnp.float32), w.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    dt = dtype_of(cfg.dtype)
    return jnp.einsum(spec, h_BTD.astype(dt), w.astype(dt)).astype(jnp.float32)


def param_count(cfg: ModelConfig) -> int:
  """Analytic parameter count (equals the initialised tree's size; checked in tests)."""
  D, F, Q, K, H, V, layers = (cfg.hidden, cfg.intermediate, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                              cfg.vocab_size, cfg.num_layers)
  attn = D * Q * H + 2 * D * K * H + Q * H * D + (2 * H if cfg.qk_norm else 0)
  block = attn + 3 * D * F + 2 * D
  return V * D + layers * block + D + (0 if cfg.tie_embeddings else D * V)


def flops_per_token(cfg: ModelConfig, context: int, backward: bool = False) -> float:
  """Analytic matmul FLOPs for one token attending to `context` earlier positions.

  forward = 2 * (matmul params, LM head included) + 4 * layers * Q * H * context (QK^T and PV);
  forward + backward = 3x forward.
  """
  D, F, Q, K, H, V, layers = (cfg.hidden, cfg.intermediate, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                              cfg.vocab_size, cfg.num_layers)
  matmul_params = layers * (D * Q * H + 2 * D * K * H + Q * H * D + 3 * D * F) + D * V
  fwd = 2.0 * matmul_params + 4.0 * layers * Q * H * context
  return 3.0 * fwd if backward else fwd
