"""Shared by the model tests: the full forward and the KV-cached forward of a policy, jitted."""

import jax


def full_and_cached(policy):
  """(full(params, tokens) -> logits, cached(params, tokens, positions, cache) -> (logits, cache))."""
  full = jax.jit(lambda p, x: policy.logits(p, policy.forward(p, x)[0]))

  @jax.jit
  def cached(p, x, positions, cache):
    h, cache = policy.forward(p, x, positions, cache)
    return policy.logits(p, h), cache

  return full, cached
