"""Calibration of the NumPyro fit on synthetic runs with known curves and known noise: the 90 % posterior intervals
on A and on B hold the truth in 85-95 % of runs (benchmarks/curve_fit_quality.py measures the same on 200 runs),
with the model the project uses (R0 a parameter, the step-0 evaluation one more binomial point), and not with R0
fixed to that evaluation's noisy value, whose intervals on B are too narrow."""

import numpy as np
import pytest

from scalerl_jax.scaling import bayes, synthetic
from scalerl_jax.scaling.analysis import join_points
from scalerl_jax.scaling.curves import SigmoidParams
from scalerl_jax.scaling.points import split

RUNS = 100


def _runs(n: int, seed: int = 0):
  """Runs shaped like the paper's Table 1 (as in curve_fit_quality.py), fitted on their first half."""
  rng = np.random.default_rng(seed)
  for i in range(n):
    truth = SigmoidParams(A=rng.uniform(0.55, 0.72), B=rng.uniform(1.0, 2.5), C_mid=rng.uniform(1500.0, 11000.0),
                          R0=rng.uniform(0.20, 0.40))
    c_max = truth.C_mid * np.exp(rng.uniform(np.log(4.0), np.log(12.0)))
    pts = synthetic.synthetic_run(truth, c_max, n_evals=int(rng.integers(40, 81)), seed=int(rng.integers(2**31)))
    yield truth, split(pts, fit_upto=0.5)


@pytest.fixture(scope="module")
def coverage():
  hits = {"free": [], "fixed": []}
  for truth, w in _runs(RUNS):
    for r0 in hits:
      post = (bayes.fit_bayes(join_points(w.start, w.fit), 0.0, fit_r0=True, num_warmup=300, num_samples=600)
              if r0 == "free" else bayes.fit_bayes(w.fit, w.r0, num_warmup=300, num_samples=600))
      qa, qb = post.quantiles("A", (0.05, 0.95)), post.quantiles("B", (0.05, 0.95))
      hits[r0].append((qa["q05"] <= truth.A <= qa["q95"], qb["q05"] <= truth.B <= qb["q95"]))
  return {k: np.mean(v, axis=0) for k, v in hits.items()}


def test_intervals_on_a_and_b_are_calibrated_with_a_free_r0(coverage):
  a, b = coverage["free"]
  assert 0.85 <= a <= 0.95 and 0.85 <= b <= 0.95, coverage


def test_fixing_r0_to_a_noisy_measurement_makes_the_interval_on_b_too_narrow(coverage):
  assert coverage["fixed"][1] < 0.85 <= coverage["free"][1], coverage


def test_a_fitted_evaluation_noise_scale_finds_a_runs_own_wander():
  """Points that wander off the curve by 0.3 on the logit scale (beyond binomial noise): `eval_noise` recovers the
  scale and widens the predictive band accordingly; without it the band is the binomial one alone."""
  from scalerl_jax.scaling.points import CurvePoints

  rng = np.random.default_rng(3)
  truth = SigmoidParams(A=0.8, B=1.5, C_mid=40.0, R0=0.3)
  c = np.linspace(5.0, 120.0, 24)
  logit = np.log(truth(c) / (1 - truth(c))) + 0.3 * rng.normal(size=c.size)
  n = np.full(c.size, 2048)
  k = rng.binomial(n, 1 / (1 + np.exp(-logit)))
  pts = CurvePoints(c, k / n, k, n)
  with_noise = bayes.fit_bayes(pts, 0.3, eval_noise=True, num_warmup=300, num_samples=600)
  without = bayes.fit_bayes(pts, 0.3, num_warmup=300, num_samples=600)
  assert "eval_sigma" not in without.samples
  assert 0.15 < float(np.median(with_noise.samples["eval_sigma"])) < 0.5
  width = lambda f: np.subtract(*f.band(np.array([150.0]), predictive=True)[::-2])[0]  # noqa: E731  hi - lo
  assert width(with_noise) > 1.5 * width(without)
