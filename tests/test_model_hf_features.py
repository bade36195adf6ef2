"""The dense decoder's Hugging Face features (Llama / Qwen2 / Qwen3): q/k/v biases, Llama-3 RoPE scaling, QK-norm,
head_dim independent of hidden / heads. Each is checked against a plain numpy transcription written here from
transformers' formulas and weight layout (torch Linear weights [out, in], rotate_half RoPE, repeat_kv GQA), never
against our own code; and the defaults stay bit for bit what they were."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.config import ConfigError, ModelConfig, load_config
from scalerl_jax.model import Policy, param_count
from scalerl_jax.model.layers import rope_angles, rope_frequencies
from tests.model_helpers import full_and_cached

# Qwen2 + Qwen3 + Llama-3 features at once: biases, QK-norm, head_dim (24) != hidden / heads (32 / 4 = 8), GQA
CFG = ModelConfig(vocab_size=40, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24,
                  qkv_bias=True, qk_norm=True, tie_embeddings=False, max_seq_len=48, rope_theta=10000.0,
                  rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                  rope_original_max_positions=256, norm_eps=1e-5)


def llama3_inv_freq_np(head_dim, theta, factor, low, high, original_max):
  """transformers' _compute_llama3_parameters, in float64 numpy: default inverse frequencies, then wavelengths
  above original_max / low divided by factor, below original_max / high kept, smoothly interpolated between."""
  inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  wavelen = 2 * math.pi / inv_freq
  smooth = (original_max / wavelen - low) / (high - low)
  out = np.where(wavelen > original_max / low, inv_freq / factor, inv_freq)
  medium = (wavelen >= original_max / high) & (wavelen <= original_max / low)
  return np.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, out), wavelen


@pytest.mark.parametrize("head_dim,theta,factor,original_max", [(24, 10000.0, 8.0, 256), (128, 500000.0, 8.0, 8192),
                                                               (64, 500000.0, 32.0, 8192)])
def test_llama3_frequencies_match_the_transformers_formula(head_dim, theta, factor, original_max):
  cfg = dataclasses.replace(CFG, head_dim=head_dim, rope_theta=theta, rope_factor=factor,
                            rope_original_max_positions=original_max)
  want, wavelen = llama3_inv_freq_np(head_dim, theta, factor, 1.0, 4.0, original_max)
  regimes = (wavelen < original_max / 4.0, (wavelen >= original_max / 4.0) & (wavelen <= original_max),
             wavelen > original_max)
  assert all(r.any() for r in regimes), "the setting must exercise kept, interpolated and divided frequencies"
  got = np.asarray(rope_frequencies(cfg))
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=2e-6)  # float32 vs float64: a few ulp
  # the three regimes really differ from the unscaled frequencies as the formula says
  plain = np.asarray(rope_frequencies(dataclasses.replace(cfg, rope_scaling="default", rope_factor=1.0)))
  np.testing.assert_array_equal(got[regimes[0]], plain[regimes[0]])
  np.testing.assert_allclose(got[regimes[2]], plain[regimes[2]] / factor, rtol=1e-6)
  assert np.all(got[regimes[1]] < plain[regimes[1]]) and np.all(got[regimes[1]] > plain[regimes[1]] / factor)


def test_default_rope_is_byte_identical_to_the_previous_formula():
  cfg = dataclasses.replace(CFG, rope_scaling="default", rope_factor=1.0, rope_theta=500.0, head_dim=16)
  half = 8
  old_freq = 500.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)  # the formula before rope_scaling existed
  assert np.asarray(rope_frequencies(cfg)).tobytes() == np.asarray(old_freq).tobytes()
  positions = jnp.asarray([[0, 3, 7, 47]])
  angle = jnp.arange(cfg.max_seq_len, dtype=jnp.float32)[:, None] * old_freq
  sin, cos = rope_angles(positions, cfg)
  assert sin.shape == cos.shape == (1, 4, 1, half)
  assert np.asarray(sin).tobytes() == np.asarray(jnp.sin(angle)[positions][:, :, None]).tobytes()
  assert np.asarray(cos).tobytes() == np.asarray(jnp.cos(angle)[positions][:, :, None]).tobytes()


def test_llama3_angles_past_the_original_context():
  cfg = dataclasses.replace(CFG, rope_original_max_positions=16)  # positions 16..47 lie past it
  inv_freq, _ = llama3_inv_freq_np(cfg.head_dim, cfg.rope_theta, 8.0, 1.0, 4.0, 16)
  positions = np.arange(48)[None]
  sin, cos = rope_angles(jnp.asarray(positions), cfg)
  angle = positions[..., None] * inv_freq
  np.testing.assert_allclose(np.asarray(sin)[:, :, 0], np.sin(angle), atol=2e-5)
  np.testing.assert_allclose(np.asarray(cos)[:, :, 0], np.cos(angle), atol=2e-5)


@pytest.fixture(scope="module")
def policy_params():
  """CFG's policy with every bias and norm scale set to random values (init gives zeros and ones)."""
  policy = Policy(CFG)
  params = jax.jit(policy.init)(jax.random.key(0))
  keys = iter(jax.random.split(jax.random.key(7), 100))
  for block in params["blocks"].values():
    for name in ("q_bias", "k_bias", "v_bias"):
      block["attn"][name] = 0.5 * jax.random.normal(next(keys), block["attn"][name].shape)
    for norm in (block["attn"]["q_norm"], block["attn"]["k_norm"]):
      norm["scale"] = 1 + 0.3 * jax.random.normal(next(keys), norm["scale"].shape)
  return policy, params


def test_param_count_and_axes_with_biases(policy_params):
  policy, params = policy_params
  assert sum(x.size for x in jax.tree.leaves(params)) == param_count(CFG)
  for cfg in (dataclasses.replace(CFG, qk_norm=False), dataclasses.replace(CFG, tie_embeddings=True)):
    assert sum(x.size for x in jax.tree.leaves(Policy(cfg).param_shapes)) == param_count(cfg)
  no_bias = dataclasses.replace(CFG, qkv_bias=False)
  assert param_count(CFG) - param_count(no_bias) == CFG.num_layers * (4 + 2 * 2) * CFG.head_dim
  attn_axes = policy.logical_axes["blocks"][0]["attn"]
  assert attn_axes["q_bias"] == ("heads", "head_dim")
  assert attn_axes["k_bias"] == attn_axes["v_bias"] == ("kv_heads", "head_dim")
  assert params["blocks"][0]["attn"]["q_bias"].shape == (4, 24)
  assert params["blocks"][0]["attn"]["k_bias"].shape == params["blocks"][0]["attn"]["v_bias"].shape == (2, 24)
  # biases start at zero and draw no random numbers: every other param is the bias-free model's
  fresh = Policy(CFG).init(0)
  assert not np.any(np.asarray(fresh["blocks"][1]["attn"]["v_bias"]))
  for path, leaf in jax.tree_util.tree_flatten_with_path(Policy(no_bias).init(0))[0]:
    other = fresh
    for k in path:
      other = other[k.key]
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(other))


def hf_attention_np(x_TD, w, cfg, inv_freq_h):
  """One Qwen2/Qwen3-style attention layer in numpy float64, on transformers' weight layout: q_proj [Q*H, D] (+bias
  [Q*H]), q_norm weight [H] applied per head before RoPE, rotate_half RoPE, scores * head_dim**-0.5, causal
  softmax, repeat_kv (query head q reads KV head q // R), o_proj [D, Q*H]."""
  Q, K, H, T = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, x_TD.shape[0]

  def rms(z, weight):
    return z / np.sqrt(np.mean(z * z, axis=-1, keepdims=True) + cfg.norm_eps) * weight

  q = rms((x_TD @ w["q_proj"].T + w["q_bias"]).reshape(T, Q, H), w["q_norm"])
  k = rms((x_TD @ w["k_proj"].T + w["k_bias"]).reshape(T, K, H), w["k_norm"])
  v = (x_TD @ w["v_proj"].T + w["v_bias"]).reshape(T, K, H)
  emb = np.concatenate([np.arange(T)[:, None] * inv_freq_h] * 2, axis=-1)[:, None]  # [T, 1, H]
  rotate_half = lambda z: np.concatenate([-z[..., H // 2:], z[..., :H // 2]], axis=-1)
  q, k = q * np.cos(emb) + rotate_half(q) * np.sin(emb), k * np.cos(emb) + rotate_half(k) * np.sin(emb)
  k, v = np.repeat(k, Q // K, axis=1), np.repeat(v, Q // K, axis=1)  # repeat_kv
  scores = np.einsum("tqh,sqh->qts", q, k) * H ** -0.5 + np.where(np.tri(T, dtype=bool), 0, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("qts,sqh->tqh", probs, v).reshape(T, Q * H) @ w["o_proj"].T


def test_attention_equals_transformers_layout_reference(policy_params):
  """Our attention (biases, QK-norm, llama3 RoPE, GQA, head_dim != hidden / heads) equals the numpy reference fed
  transformers-layout weights made from ours by transpose + reshape only: no q/k permutation is needed."""
  policy, params = policy_params
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["blocks"][0]["attn"])
  D, Q, K, H = CFG.hidden, CFG.num_heads, CFG.num_kv_heads, CFG.head_dim
  hf = {"q_proj": p["q"].reshape(D, Q * H).T, "k_proj": p["k"].reshape(D, K * H).T,
        "v_proj": p["v"].reshape(D, K * H).T, "o_proj": p["o"].reshape(Q * H, D).T,
        "q_bias": p["q_bias"].reshape(Q * H), "k_bias": p["k_bias"].reshape(K * H),
        "v_bias": p["v_bias"].reshape(K * H), "q_norm": p["q_norm"]["scale"], "k_norm": p["k_norm"]["scale"]}
  T = 40  # CFG's frequencies fall in all three llama3 regimes (kept, interpolated, divided)
  x_TD = np.random.default_rng(0).normal(size=(T, D))
  inv_freq, _ = llama3_inv_freq_np(H, CFG.rope_theta, 8.0, 1.0, 4.0, 256)
  want = hf_attention_np(x_TD, hf, CFG, inv_freq)
  positions = jnp.arange(T)[None]
  attn = policy.module(params).blocks[0].attn
  layer = jax.jit(lambda x_BTD: attn(x_BTD, positions, rope_angles(positions, CFG), None))
  got, _ = layer(jnp.asarray(x_TD[None], jnp.float32))
  assert not np.allclose(want, hf_attention_np(x_TD, {**hf, "q_bias": 0 * hf["q_bias"]}, CFG, inv_freq))
  np.testing.assert_allclose(np.asarray(got[0]), want, atol=2e-5, rtol=1e-4)


def test_incremental_decode_equals_full_forward_with_biases(policy_params):
  policy, params = policy_params
  tokens = jax.random.randint(jax.random.key(2), (2, 10), 0, CFG.vocab_size)
  full_fn, cached = full_and_cached(policy)
  full = full_fn(params, tokens)

  cache = policy.init_cache(2, CFG.max_seq_len)
  steps, cache = [], cache
  for start, stop in ((0, 4), (4, 5), (5, 10)):
    out, cache = cached(params, tokens[:, start:stop], jnp.broadcast_to(jnp.arange(start, stop), (2, stop - start)),
                        cache)
    steps.append(out)
  np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, axis=1)), np.asarray(full), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides,key", [
    (["model.rope_scaling=llama3", "model.rope_factor=0.5"], "model.rope_factor: must be >= 1"),
    (["model.rope_scaling=llama3", "model.rope_low_freq_factor=0"], "model.rope_low_freq_factor: must be positive"),
    (["model.rope_scaling=llama3", "model.rope_high_freq_factor=1.0"],
     "model.rope_high_freq_factor: must be > model.rope_low_freq_factor=1.0"),
    (["model.rope_scaling=llama3", "model.rope_original_max_positions=0"],
     "model.rope_original_max_positions: must be positive"),
    (["model.rope_factor=8.0"], "model.rope_factor: is only used with model.rope_scaling=llama3"),
    (["model.rope_original_max_positions=16"], "model.rope_original_max_positions: is only used with"),
    (["model.rope_scaling=yarn"], "model.rope_scaling"),
])
def test_rope_settings_are_validated(overrides, key):
  with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("(", r"\(")):
    load_config(overrides=overrides)


def test_valid_hf_settings_load():
  cfg = load_config(overrides=["model.rope_scaling=llama3", "model.rope_factor=8.0", "model.rope_theta=500000.0",
                               "model.rope_original_max_positions=8192", "model.qkv_bias=true"])
  assert cfg.model.rope_scaling == "llama3" and cfg.model.qkv_bias and cfg.model.rope_factor == 8.0
  assert load_config().model.rope_scaling == "default" and not load_config().model.qkv_bias
