"""A prior over a run's curve shape learned from finished runs, and the base policy's pass@k as a bound on A.

Shape prior (`CurvePrior`): normals over ln B and over ln C_mid in units of the run's own compute per RL step
(C_mid / C_step: "the step count at the midpoint"), so runs of one task with different per-step costs, and tasks of
different costs, share one scale. Learned by `learn_prior` from full-run posteriors as a normal-normal hierarchy
by the method of moments: the population mean is the mean of the runs' posterior means, the population variance
the spread of those means less the runs' average posterior variance (a run fitted loosely says little about how
runs differ), floored at `MIN_SD`. The NumPyro model then draws ln B ~ Normal(b_mean, b_sd) and
ln C_mid ~ Normal(ln C_step + m_mean, m_sd) in place of its generic priors (bayes.sigmoid_model).

pass@k (`pass_at_k`, `pass_at_k_betabinomial`): the chance that at least one of k samples of a prompt is correct,
averaged over prompts. RL mostly sharpens what the base can already sample, so the base policy's pass@k at large
k bounds the pass rate RL can reach: A <= pass@k (bayes: A = R0 + (a_max - R0) u). From an evaluation of n samples
per prompt, pass@k for k <= n is the unbiased estimator 1 - C(n - c, k) / C(n, k) averaged over prompts; beyond n
it extrapolates through a beta distribution of per-prompt pass rates fitted to the counts (beta-binomial maximum
likelihood): 1 - B(alpha, beta + k) / B(alpha, beta).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import minimize
from scipy.special import betaln, gammaln

from scalerl_jax.scaling.points import CurveDataError

MIN_SD = 0.05  # the floor of a learned prior's spread (ln units): never a point mass


@dataclasses.dataclass(frozen=True)
class CurvePrior:
  """Normals over ln B and ln(C_mid / C_step); n_runs and source say what they were learned from."""
  b_mean: float
  b_sd: float
  m_mean: float  # ln of C_mid in RL steps
  m_sd: float
  n_runs: int = 0
  source: str = ""

  def log_b(self) -> tuple[float, float]:
    return self.b_mean, self.b_sd

  def log_c_mid(self, c_per_step: float) -> tuple[float, float]:
    """(loc, scale) of ln C_mid on a run's own compute axis, `c_per_step` its compute per RL step."""
    if not c_per_step > 0:
      raise CurveDataError(f"a learned C_mid prior needs the run's compute per step (> 0), got {c_per_step!r}")
    return float(np.log(c_per_step) + self.m_mean), self.m_sd

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "CurvePrior":
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

  def __str__(self) -> str:
    return (f"ln B ~ N({self.b_mean:.2f}, {self.b_sd:.2f}) (B ~ {np.exp(self.b_mean):.2f}), ln C_mid/step ~ "
            f"N({self.m_mean:.2f}, {self.m_sd:.2f}) (C_mid ~ {np.exp(self.m_mean):.0f} steps), from {self.n_runs} runs"
            + (f" of {self.source}" if self.source else ""))


def _moments(draws: Sequence[np.ndarray]) -> tuple[float, float]:
  means = np.array([np.mean(d) for d in draws])
  within = float(np.mean([np.var(d) for d in draws]))
  between = float(np.var(means, ddof=1)) if len(means) > 1 else 0.0
  return float(np.mean(means)), float(np.sqrt(max(between - within, MIN_SD**2)))


def learn_prior(log_b_draws: Sequence[np.ndarray], log_m_step_draws: Sequence[np.ndarray],
                source: str = "") -> CurvePrior:
  """The shape prior from finished runs: one array of posterior draws of ln B and of ln(C_mid / C_step) per run
  (module docstring: the method of moments of a normal-normal hierarchy)."""
  if len(log_b_draws) != len(log_m_step_draws) or len(log_b_draws) < 2:
    raise CurveDataError(f"learning a prior needs >= 2 runs with draws of both B and C_mid, got "
                         f"{len(log_b_draws)} and {len(log_m_step_draws)}")
  (bm, bs), (mm, ms) = _moments(log_b_draws), _moments(log_m_step_draws)
  return CurvePrior(bm, bs, mm, ms, len(log_b_draws), source)


def prior_from_fits(fits, c_per_step: Sequence[float], source: str = "") -> CurvePrior:
  """`learn_prior` from bayes.BayesFit posteriors of whole runs and each run's compute per step."""
  return learn_prior([np.log(f.param("B")) for f in fits],
                     [np.log(f.param("C_mid")) - np.log(c) for f, c in zip(fits, c_per_step)], source)


def load_prior(path) -> CurvePrior:
  with open(path) as f:
    return CurvePrior.from_dict(json.load(f)["prior"])


def pass_at_k(per_prompt: np.ndarray, n: int, k: int) -> float:
  """Unbiased pass@k from per-prompt correct counts of n samples each (k <= n), averaged over prompts."""
  c = np.asarray(per_prompt, dtype=float).reshape(-1)
  if not 1 <= k <= n:
    raise CurveDataError(f"the unbiased pass@k needs 1 <= k <= n = {n}, got k = {k}")
  if np.any((c < 0) | (c > n)):
    raise CurveDataError(f"per-prompt counts must lie in [0, {n}]")
  # C(n - c, k) / C(n, k): the chance that k samples drawn without replacement are all wrong
  log_fail = np.where(n - c >= k, gammaln(n - c + 1) - gammaln(n - c - k + 1) - gammaln(n + 1) + gammaln(n - k + 1),
                      -np.inf)
  return float(np.mean(1.0 - np.exp(log_fail)))


def fit_beta(per_prompt: np.ndarray, n: int) -> tuple[float, float]:
  """Maximum-likelihood (alpha, beta) of a beta distribution of per-prompt pass rates, from counts of n samples."""
  c = np.asarray(per_prompt, dtype=float).reshape(-1)

  def nll(theta):
    a, b = np.exp(theta)
    return -float(np.sum(betaln(c + a, n - c + b) - betaln(a, b)))

  mean = np.clip(np.mean(c) / n, 1e-3, 1 - 1e-3)
  res = minimize(nll, np.log([mean * 2, (1 - mean) * 2]), method="Nelder-Mead",
                 options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 4000})
  a, b = np.exp(res.x)
  return float(a), float(b)


def pass_at_k_betabinomial(per_prompt: np.ndarray, n: int, k: int) -> float:
  """pass@k for any k through the fitted beta of per-prompt pass rates (module docstring); for k <= n it is close
  to `pass_at_k`, beyond n it extrapolates."""
  a, b = fit_beta(per_prompt, n)
  return float(1.0 - np.exp(betaln(a, b + k) - betaln(a, b)))


def bound_on_a(per_prompt: Optional[np.ndarray], n: Optional[int], k: int) -> Optional[float]:
  """The base policy's pass@k (unbiased when k <= n, else beta-binomial) as an upper bound on A; None without
  per-prompt counts."""
  if per_prompt is None or not n:
    return None
  return pass_at_k(per_prompt, n, k) if k <= n else pass_at_k_betabinomial(per_prompt, n, k)
