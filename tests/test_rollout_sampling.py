"""Sampling: the processed distribution (temperature, top-k, top-p) and draws from it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.rollout.sampling import GREEDY, SamplingParams, processed_logprobs, sample, uniforms

LOGITS = jnp.asarray([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0, -2.0, 0.2, 1.5, -0.5, 0.1]])  # V = 11 (padded blocks)


def probs(sp):
  return np.exp(np.asarray(processed_logprobs(LOGITS, sp))[0])


def test_processed_distribution():
  np.testing.assert_allclose(np.log(probs(SamplingParams(temperature=0.7))),
                             np.asarray(jax.nn.log_softmax(LOGITS / 0.7))[0], atol=1e-6)
  p = probs(SamplingParams(top_k=3))
  assert np.count_nonzero(p) == 3 and set(np.flatnonzero(p)) == {0, 5, 8}
  full = probs(SamplingParams())
  p = probs(SamplingParams(top_p=0.7))  # sorted masses 0.493 (id 5), 0.181 (id 0), 0.110 (id 8): 0.674 < 0.7
  assert set(np.flatnonzero(p)) == {5, 0, 8} and full[[5, 0]].sum() < 0.7 <= full[[5, 0, 8]].sum()
  p = probs(SamplingParams(top_k=2, top_p=0.5))  # top-p on the renormalised top-2: 0.731 (id 5) >= 0.5
  assert set(np.flatnonzero(p)) == {5}
  for sp in (SamplingParams(top_k=3), SamplingParams(top_p=0.7), SamplingParams(temperature=2.0, top_k=4)):
    assert probs(sp).sum() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(temperature=0.5, top_k=4),
                                SamplingParams(top_p=0.8)])
def test_draws_follow_the_processed_distribution(sp):
  n = 40000
  keys = jax.random.split(jax.random.key(0), n)
  u = uniforms(keys, jnp.zeros(n, jnp.int32), 1)[:, 0]
  tokens, logp = jax.jit(lambda x, u: sample(jnp.broadcast_to(x, (n, x.shape[1])), u, sp))(LOGITS, u)
  expected = probs(sp)
  freq = np.bincount(np.asarray(tokens), minlength=LOGITS.shape[1]) / n
  np.testing.assert_allclose(freq, expected, atol=0.01)  # binomial std <= 0.0025
  assert np.all(freq[expected == 0] == 0)
  np.testing.assert_allclose(np.exp(np.asarray(logp)), expected[np.asarray(tokens)], rtol=1e-5)


def test_greedy_and_uniform_streams():
  tokens, logp = sample(LOGITS, jnp.zeros((1, 2)), GREEDY)
  assert int(tokens[0]) == 5
  assert float(logp[0]) == pytest.approx(float(jax.nn.log_softmax(LOGITS)[0, 5]), abs=1e-6)
  keys = jax.random.split(jax.random.key(1), 3)
  # the draws for step n of a row do not depend on how steps are split into calls
  whole = uniforms(keys, jnp.asarray([0, 5, 9]), 6)
  part = uniforms(keys, jnp.asarray([2, 7, 11]), 4)
  np.testing.assert_array_equal(np.asarray(whole)[:, 2:], np.asarray(part))
