"""Decoder-only policy (Llama / Qwen / Mixtral families) in Flax NNX: blocks of attention + a SwiGLU MLP from
`layers.py` or a mixture of experts from `moe.py` (model.family=moe, in the layers `ModelConfig.moe_layers` names),
and the analytic parameter count and FLOPs of both.

Array names carry their shape as a suffix (`x_BTD`, `logits_BTV`); the letters are the package legend in
`scalerl_jax/types.py`. Parameters carry logical axis names (see `layers.py`); nothing here names a mesh axis.

The param tree (`Policy.param_shapes`; keys as `weights.flatten_params` spells them, `['blocks'][i]['attn']['q']`;
i = 0 .. num_layers - 1), with its logical axes and the Hugging Face tensor it holds (Llama / Qwen2 / Qwen3
`*ForCausalLM`; torch Linear weights are [out, in], so a loader transposes and reshapes, and permutes nothing:
RoPE here is rotate_half, the layout transformers stores q_proj / k_proj in; `L.` = `model.layers.{i}.`):

  embed                          [V, D]     vocab, embed            model.embed_tokens.weight
  blocks[i].attn_norm.scale      [D]        norm                    L.input_layernorm.weight
  blocks[i].attn.q               [D, Q, H]  embed, heads, head_dim  L.self_attn.q_proj.weight [Q*H, D] .T.reshape
  blocks[i].attn.k / .v          [D, K, H]  embed, kv_heads, head_dim  L.self_attn.k_proj / v_proj.weight [K*H, D]
  blocks[i].attn.o               [Q, H, D]  heads, head_dim, embed  L.self_attn.o_proj.weight [D, Q*H] .T.reshape
  blocks[i].attn.q_bias          [Q, H]     heads, head_dim         L.self_attn.q_proj.bias [Q*H]   (qkv_bias)
  blocks[i].attn.k_bias / v_bias [K, H]     kv_heads, head_dim      L.self_attn.k_proj / v_proj.bias [K*H]
  blocks[i].attn.q_norm.scale    [H]        norm                    L.self_attn.q_norm.weight   (qk_norm, Qwen3)
  blocks[i].attn.k_norm.scale    [H]        norm                    L.self_attn.k_norm.weight   (qk_norm)
  blocks[i].mlp_norm.scale       [D]        norm                    L.post_attention_layernorm.weight
  blocks[i].mlp.gate / .up       [D, F]     embed, mlp              L.mlp.gate_proj / up_proj.weight [F, D] .T
  blocks[i].mlp.down             [F, D]     mlp, embed              L.mlp.down_proj.weight [D, F] .T
  MoE layers (i in cfg.moe_layers) hold `moe` instead of `mlp` (Qwen3-MoE names; Mixtral's in model/hf.py):
  blocks[i].moe.router           [D, E]     embed, None             L.mlp.gate.weight [E, D] .T
  blocks[i].moe.gate / .up       [E, D, F]  expert, embed, mlp      L.mlp.experts.{e}.gate_proj / up_proj.weight
  blocks[i].moe.down             [E, F, D]  expert, mlp, embed      L.mlp.experts.{e}.down_proj.weight
  blocks[i].moe.shared.gate/up/down  as mlp, width shared_expert_intermediate  (when > 0)
  with lora.rank > 0 (model/lora.py), beside each targeted projection P of attn / mlp / moe / moe.shared:
  ...P_lora.a / .b               [*in, r] / [r, *out]  P's input / output axes, rank None; MoE experts'
                                 [E, *in, r] / [E, r, *out]      (PEFT: L.*.P_proj.lora_A / lora_B, transposed)
  final_norm.scale               [D]        norm                    model.norm.weight
  lm_head                        [D, V]     embed, vocab            lm_head.weight [V, D] .T  (absent when
                                                                    tie_embeddings: the head is `embed`)

Head index order is kept: query head q is rows q*H .. q*H + H - 1 of q_proj and reads KV head q // R
(transformers' repeat_kv). No o_proj / MLP biases exist (Llama's attention_bias / mlp_bias, Qwen3's
attention_bias put one on o_proj: a loader must refuse them). Norm scales multiply plainly (no Gemma-style 1 + w).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.model.layers import (MLP, Attention, LayerCache, RMSNorm, SharedPrefix, dtype_of, normal_param,
                                      rope_angles)
from scalerl_jax.model.lora import LoraSpec
from scalerl_jax.model.moe import MoE, Routing


class Block(nnx.Module):
  """Pre-norm attention + MLP; the MLP is a mixture of experts (`moe`) in the layers `cfg.moe_layers` names and a
  dense SwiGLU (`mlp`) elsewhere."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, sparse: bool = False, lora: Optional[LoraSpec] = None):
    pd = dtype_of(cfg.param_dtype)
    self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.attn = Attention(cfg, rngs, lora)
    self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.mlp = None if sparse else MLP(cfg, rngs, lora=lora)
    self.moe = MoE(cfg, rngs, lora) if sparse else None

  def __call__(self, x_BTD, positions_BT, sin_cos, cache, prefix=None, recorded_BTk=None, mask_BT=None,
               replay: bool = False):
    """(x_BTD, layer cache, RouterStats or None)."""
    h_BTD, cache = self.attn(self.attn_norm(x_BTD), positions_BT, sin_cos, cache, prefix)
    x_BTD = x_BTD + h_BTD
    if self.moe is None:
      return x_BTD + self.mlp(self.mlp_norm(x_BTD)), cache, None
    y_BTD, stats = self.moe(self.mlp_norm(x_BTD), recorded_BTk, mask_BT, replay)
    return x_BTD + y_BTD, cache, stats


class Transformer(nnx.Module):
  """Embeddings -> blocks -> final norm. `__call__` returns hidden states; `logits` applies the LM head."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, lora: Optional[LoraSpec] = None):
    pd = dtype_of(cfg.param_dtype)
    self.cfg = cfg
    # std 1/sqrt(D): with tied embeddings the LM head then starts with unit-variance logits
    self.embed = normal_param(rngs, (cfg.vocab_size, cfg.hidden), ("vocab", "embed"), cfg.hidden ** -0.5, pd)
    sparse = set(cfg.moe_layers)
    self.blocks = nnx.List([Block(cfg, rngs, i in sparse, lora) for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden, cfg.norm_eps, pd)
    self.lm_head = None if cfg.tie_embeddings else normal_param(
        rngs, (cfg.hidden, cfg.vocab_size), ("embed", "vocab"), cfg.hidden ** -0.5, pd)

  def __call__(self, tokens_BT, positions_BT, cache: Optional[list[LayerCache]] = None,
               prefix: Optional[list[SharedPrefix]] = None, routing: Optional[Routing] = None):
    """Hidden states, per-layer KV and the RouterStats of each MoE layer (in layer order; [] for a dense model).
    `cache`: decode into it; `prefix`: attend to a read-only prefix per layer as well as causally to this call's
    tokens; neither: causal self-attention over this call's tokens. `routing`: the generator's recorded experts
    (compared, or replayed) and the tokens the router statistics count."""
    x_BTD = self.embed[...].astype(dtype_of(self.cfg.dtype))[tokens_BT]
    sin_cos = rope_angles(positions_BT, self.cfg)
    routing = routing or Routing()
    new_cache, router = [], []
    for i, block in enumerate(self.blocks):
      recorded = routing.expert_ids_BTXk
      x_BTD, layer_cache, stats = block(
          x_BTD, positions_BT, sin_cos, None if cache is None else cache[i], None if prefix is None else prefix[i],
          None if recorded is None or block.moe is None else recorded[:, :, len(router)], routing.mask_BT,
          routing.replay)
      new_cache.append(layer_cache)
      if stats is not None:
        router.append(stats)
    return self.final_norm(x_BTD), new_cache, router

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


def _attn_params(cfg: ModelConfig) -> tuple[int, int]:
  """(parameters, of which matmul weights) of one attention layer."""
  D, Q, K, H = cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  matmul = D * Q * H + 2 * D * K * H + Q * H * D
  return matmul + (2 * H if cfg.qk_norm else 0) + ((Q + 2 * K) * H if cfg.qkv_bias else 0), matmul


def _mlp_params(cfg: ModelConfig, active: bool) -> list[int]:
  """Matmul weights of each layer's MLP: a dense SwiGLU, or an MoE layer's router + experts (+ shared expert),
  counting all E experts, or with `active` only the k a token uses."""
  D, E, k = cfg.hidden, cfg.num_experts, cfg.experts_per_token
  sparse = set(cfg.moe_layers)
  moe = D * E + (k if active else E) * 3 * D * cfg.expert_width + 3 * D * cfg.shared_expert_intermediate
  return [moe if i in sparse else 3 * D * cfg.intermediate for i in range(cfg.num_layers)]


def param_count(cfg: ModelConfig, active: bool = False) -> int:
  """Analytic parameter count (equals the initialised tree's size; checked in tests). `active`: the parameters
  one token uses (an MoE layer's k routed experts instead of all E; the same for a dense model)."""
  D, V = cfg.hidden, cfg.vocab_size
  block = _attn_params(cfg)[0] + 2 * D
  return (V * D + cfg.num_layers * block + sum(_mlp_params(cfg, active)) + D
          + (0 if cfg.tie_embeddings else D * V))


def flops_per_token(cfg: ModelConfig, context: int, backward: bool = False) -> float:
  """Analytic matmul FLOPs for one token attending to `context` earlier positions.

  forward = 2 * (active matmul params, LM head included) + 4 * layers * Q * H * context (QK^T and PV);
  forward + backward = 3x forward. An MoE layer counts its router and the k experts a token is routed to (the
  dispatch's sort, gather and scatter are not matmuls). Elementwise work (norms, q/k/v biases, RoPE, softmax) is
  not counted.
  """
  Q, H, layers = cfg.num_heads, cfg.head_dim, cfg.num_layers
  matmul_params = layers * _attn_params(cfg)[1] + sum(_mlp_params(cfg, active=True)) + cfg.hidden * cfg.vocab_size
  fwd = 2.0 * matmul_params + 4.0 * layers * Q * H * context
  return 3.0 * fwd if backward else fwd
