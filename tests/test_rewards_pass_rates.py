"""Held-out metrics against hand-computed and brute-force values."""

import itertools
import math

import numpy as np
import pytest

from scalerl_jax.rewards.pass_rates import (eval_metrics, mean_at_n, pass_at_k, pass_at_k_per_prompt,
                                         success_counts)

CORRECT_PN = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], bool)


def test_mean_at_n_and_counts_by_hand():
  np.testing.assert_array_equal(success_counts(CORRECT_PN), [4, 1, 0])
  assert mean_at_n(CORRECT_PN) == pytest.approx((1 + 0.25 + 0) / 3)


def test_pass_at_k_by_hand():
  # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
  np.testing.assert_allclose(pass_at_k_per_prompt([4, 1, 0], 4, 2), [1.0, 0.5, 0.0])
  assert pass_at_k([4, 1, 0], 4, 1) == pytest.approx(mean_at_n(CORRECT_PN))  # pass@1 is mean@n


@pytest.mark.parametrize("n, k", [(5, 1), (5, 3), (6, 6), (7, 2)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_success(n, k):
  for c in range(n + 1):
    outcomes = [1] * c + [0] * (n - c)
    brute = np.mean([any(s) for s in itertools.combinations(outcomes, k)])  # enumerated, not by formula
    assert pass_at_k_per_prompt([c], n, k)[0] == pytest.approx(brute)


def test_pass_at_k_is_exact_for_large_n():
  n, c, k = 1000, 3, 100
  expected = 1 - math.comb(n - c, k) / math.comb(n, k)
  assert pass_at_k([c], n, k) == pytest.approx(expected, rel=1e-12)


def test_summary():
  m = eval_metrics(CORRECT_PN, ks=(1, 2, 8))
  assert m["eval/mean@4"] == pytest.approx(1.25 / 3) and m["eval/pass@2"] == pytest.approx(0.5)
  assert "eval/pass@8" not in m and m["eval/all_correct"] == pytest.approx(1 / 3)
  assert m["eval/none_correct"] == pytest.approx(1 / 3)


def test_bad_arguments():
  with pytest.raises(ValueError, match="1 <= k <= n"):
    pass_at_k([1], 4, 5)
  with pytest.raises(ValueError, match="in \\[0, n=4\\]"):
    pass_at_k([5], 4, 1)
  with pytest.raises(ValueError, match="\\[prompts, samples\\]"):
    mean_at_n(np.ones(3, bool))
