"""Shared by the model tests: the full forward and the KV-cached forward of a policy, jitted; a shared-prompt RL
batch."""

import jax
import numpy as np

from scalerl_jax.types import TrainBatch


def full_and_cached(policy):
  """(full(params, tokens) -> logits, cached(params, tokens, positions, cache) -> (logits, cache))."""
  full = jax.jit(lambda p, x: policy.logits(p, policy.forward(p, x)[0]))

  @jax.jit
  def cached(p, x, positions, cache):
    h, cache = policy.forward(p, x, positions, cache)
    return policy.logits(p, h), cache

  return full, cached


def rl_batch(P: int, G: int, width: int, N: int, vocab: int, seed: int = 3) -> TrainBatch:
  """Groups of G rows sharing a ragged prompt, ragged completions, CISPO inputs normalised over the batch."""
  rng = np.random.default_rng(seed)
  B, T = P * G, width + N
  prompt_len = np.repeat(rng.integers(2, width + 1, P), G).astype(np.int32)
  tokens = rng.integers(0, vocab, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  for b in range(B):
    tokens[b, :prompt_len[b]] = tokens[b - b % G, :prompt_len[b]]
    mask[b, prompt_len[b]:prompt_len[b] + rng.integers(1, N + 1)] = 1
  gen = np.where(mask > 0, -rng.uniform(0.5, 3.0, (B, T)), 0).astype(np.float32)
  return TrainBatch(tokens=tokens, loss_mask=mask, gen_logprobs=gen, advantages=rng.normal(size=B).astype(np.float32),
                    token_weights=mask / mask.sum(), sample_weights=np.full(B, 1 / B, np.float32), prompt_lengths=prompt_len)
