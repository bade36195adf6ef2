"""Held-out evaluation metrics, pure functions of a success matrix.

`correct_PN` is bool[P, N]: sample n of prompt p succeeded. A sample succeeds when it solved its item, as its
verifier says (`RewardBatch.success`: the full score, or the code reward's every test passed), whatever the
reward scale; a partial score is not a success.
  mean@n  = mean over prompts of (successes / n)   (the paper's held-out metric: 1000 prompts x 16 samples)
  pass@k  = mean over prompts of 1 - C(n - c, k) / C(n, k), the unbiased estimator of Chen et al. (2021) from n >= k
            samples with c successes, computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i) to stay exact for large n.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def success_counts(correct_PN: np.ndarray) -> np.ndarray:
  """int64[P]: successes per prompt."""
  correct_PN = np.asarray(correct_PN, bool)
  if correct_PN.ndim != 2:
    raise ValueError(f"correct_PN must be [prompts, samples], got shape {correct_PN.shape}")
  return correct_PN.sum(axis=1)


def mean_at_n(correct_PN: np.ndarray) -> float:
  """Mean over prompts of the per-prompt pass rate."""
  counts_P = success_counts(correct_PN)
  if counts_P.size == 0:
    raise ValueError("mean@n of no prompts")
  return float(np.mean(counts_P / np.asarray(correct_PN).shape[1]))


def pass_at_k_per_prompt(n_correct_P: Sequence[int] | np.ndarray, n: int, k: int) -> np.ndarray:
  """float64[P]: unbiased pass@k of each prompt from n samples with n_correct_P successes."""
  c_P = np.asarray(n_correct_P, np.int64)
  if not 1 <= k <= n:
    raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
  if np.any((c_P < 0) | (c_P > n)):
    raise ValueError(f"success counts must be in [0, n={n}]")
  out = np.ones(c_P.shape, np.float64)
  for p, c in enumerate(c_P.tolist()):
    if n - c >= k:  # otherwise every k-subset holds a success
      out[p] = 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64))
  return out


def pass_at_k(n_correct_P: Sequence[int] | np.ndarray, n: int, k: int) -> float:
  """Mean over prompts of the unbiased pass@k."""
  values = pass_at_k_per_prompt(n_correct_P, n, k)
  if values.size == 0:
    raise ValueError("pass@k of no prompts")
  return float(values.mean())


def eval_metrics(correct_PN: np.ndarray, ks: Sequence[int] = (1,), prefix: str = "eval/") -> dict[str, float]:
  """mean@n, pass@k for each k <= n, and the fractions of prompts solved by every / no sample."""
  counts_P = success_counts(correct_PN)
  n = np.asarray(correct_PN).shape[1]
  out = {f"{prefix}mean@{n}": mean_at_n(correct_PN),
         f"{prefix}all_correct": float(np.mean(counts_P == n)),
         f"{prefix}none_correct": float(np.mean(counts_P == 0))}
  for k in ks:
    if k <= n:
      out[f"{prefix}pass@{k}"] = pass_at_k(counts_P, n, k)
  return out
