"""Calibration of the NumPyro fit on synthetic runs with known curves and known noise: the 90 % posterior intervals
on A and on B hold the truth in 85-95 % of runs (benchmarks/curve_fit_quality.py measures the same on 200 runs),
with the model the project uses (R0 a parameter, the step-0 evaluation one more binomial point), and not with R0
fixed to that evaluation's noisy value, whose intervals on B are too narrow. The wander terms (bayes._observe) find a
run's own fluctuation off its curve."""

import dataclasses

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


def _wandering_run(f, seed=3):
  """A sigmoid run whose pass rate is off the curve by f (logit scale), measured with binomial noise."""
  from scalerl_jax.scaling.points import CurvePoints

  truth = SigmoidParams(A=0.8, B=1.5, C_mid=40.0, R0=0.3)
  c = np.linspace(5.0, 120.0, f.size)
  logit = np.log(truth(c) / (1 - truth(c))) + f
  n = np.full(c.size, 2048)
  k = np.random.default_rng(seed).binomial(n, 1 / (1 + np.exp(-logit)))
  return CurvePoints(c, k / n, k, n)


def test_a_fitted_iid_wander_finds_a_runs_own_scale():
  """Points that wander off the curve by 0.3 on the logit scale (beyond binomial noise): wander="iid" recovers the
  scale and widens the predictive band accordingly; without it the band is the binomial one alone."""
  pts = _wandering_run(0.3 * np.random.default_rng(3).normal(size=24))
  with_noise = bayes.fit_bayes(pts, 0.3, wander="iid", num_warmup=300, num_samples=600)
  without = bayes.fit_bayes(pts, 0.3, num_warmup=300, num_samples=600)
  assert "wander_sigma" not in without.samples
  assert 0.15 < float(np.median(with_noise.samples["wander_sigma"])) < 0.5
  width = lambda f: np.subtract(*f.band(np.array([150.0]), predictive=True)[::-2])[0]  # noqa: E731  hi - lo
  assert width(with_noise) > 1.5 * width(without)


def test_ou_path_has_the_exponential_covariance():
  """`_ou_path` of standard normals is the Gaussian process with covariance s^2 exp(-|x - x'| / ell), on uneven
  positions and with a padded (repeated) last position copying the point before it."""
  x = np.array([0.0, 0.05, 0.3, 0.32, 0.9, 0.9])
  z = np.random.default_rng(0).normal(size=(40000, x.size)).astype(np.float32)
  f = np.asarray(bayes._ou_path(z, x.astype(np.float32), 0.5, 0.2))
  want = 0.25 * np.exp(-np.abs(x[:, None] - x[None, :]) / 0.2)
  np.testing.assert_allclose(np.cov(f.T), want, atol=0.01)
  np.testing.assert_allclose(f[:, -1], f[:, -2], atol=1e-5)


def test_ou_wander_conditions_the_prediction_on_where_the_run_is():
  """A run that sits well above its curve over its last quarter (a slow, correlated wander): with wander="ou" the
  predictive median just past the data stays above the mean curve (the OU conditional on the last fitted point),
  the fitted correlation length is long, and the band is wider than the binomial one."""
  n = 32
  f = np.where(np.arange(n) >= 24, 0.5, 0.0)
  pts = _wandering_run(f)
  ou = bayes.fit_bayes(pts, 0.3, wander="ou", num_warmup=300, num_samples=600)
  none = bayes.fit_bayes(pts, 0.3, num_warmup=300, num_samples=600)
  c = np.array([125.0])
  mean_med = ou.band(c)[1][0]
  pred_lo, pred_med, pred_hi = (v[0] for v in ou.band(c, 0.9, predictive=True))
  # (0.020 above on an AVX-512 EPYC, more on the CPU the test was written on: MCMC draws follow the last bits; a
  # wander that ignores where the run is gives the mean curve's median)
  assert pred_med > mean_med + 0.01, (pred_med, mean_med)
  assert float(np.median(ou.samples["wander_ell"])) > 0.05
  lo, _, hi = (v[0] for v in none.band(c, 0.9, predictive=True))
  assert pred_hi - pred_lo > 1.5 * (hi - lo)


def test_discrepancy_mle_recovers_a_known_scale_and_tail():
  """Errors drawn with a known discrepancy scale, normal and heavy-tailed (Student-t, 2 degrees of freedom), and
  with none: the maximum-likelihood (scale, df) finds each."""
  from scalerl_jax.scaling.analysis import discrepancy_mle

  rng = np.random.default_rng(1)
  sd = rng.uniform(0.05, 0.3, 600)
  dist = rng.choice([np.log(2.0), np.log(4.0)], 600)
  scale = np.sqrt(sd**2 + (0.5 * dist) ** 2)
  normal = discrepancy_mle(rng.normal(size=600) * scale, sd, dist)
  assert abs(normal.scale - 0.5) < 0.08 and normal.power == 1.0 and normal.df >= 10, normal
  heavy = discrepancy_mle(rng.standard_t(2.0, size=600) * scale, sd, dist)
  assert abs(heavy.scale - 0.5) < 0.12 and heavy.power == 1.0 and heavy.df <= 3, heavy
  square = discrepancy_mle(rng.normal(size=600) * np.sqrt(sd**2 + (0.5 * dist**2) ** 2), sd, dist)
  assert square.power == 2.0 and abs(square.scale - 0.5) < 0.08, square
  assert discrepancy_mle(rng.normal(size=600) * sd, sd, dist).scale < 0.1


def test_discrepancy_widens_both_predictive_bands_beyond_the_fit_only():
  """The model discrepancy (curves.Discrepancy) leaves the bands inside the fit window as they were and widens
  them beyond it, more the farther out, for the least-squares and the NumPyro fit alike."""
  from scalerl_jax.scaling.analysis import analyse
  from scalerl_jax.scaling.curves import Discrepancy

  truth = SigmoidParams(A=0.7, B=1.5, C_mid=2000.0, R0=0.3)
  pts = synthetic.synthetic_run(truth, 16000.0, n_evals=40, seed=5)
  plain = analyse(pts, fit_upto=0.5, bayes=True, num_warmup=200, num_samples=400, discrepancy=Discrepancy())
  wide = analyse(pts, fit_upto=0.5, bayes=True, num_warmup=200, num_samples=400, discrepancy=Discrepancy(0.5))
  assert wide.lsq.params == plain.lsq.params and wide.lsq.discrepancy.scale == 0.5 == wide.bayes.discrepancy.scale
  assert plain.bayes.discrepancy.scale == 0.0
  inside, c_fit = np.array([1000.0, 4000.0]), float(plain.window.fit.compute[-1])
  beyond = np.array([1.5 * c_fit, 3.0 * c_fit])

  def widths(fit, c, level=0.9):
    lo, *_, hi = fit.band(c, level, predictive=True)
    return hi - lo

  for a, b in ((plain.lsq, wide.lsq), (plain.bayes, wide.bayes)):
    np.testing.assert_allclose(widths(b, inside), widths(a, inside))
    grow = widths(b, beyond) - widths(a, beyond)
    assert np.all(grow > 0.01) and grow[1] > grow[0], (type(a).__name__, grow)
    # heavy tails (Student-t, df 2) at the same scale: the 90 % band widens more than the 50 % band
    heavy = dataclasses.replace(b, discrepancy=Discrepancy(0.5, df=2.0))
    ratio = lambda level: widths(heavy, beyond, level) / widths(b, beyond, level)  # noqa: E731
    assert np.all(ratio(0.9) > ratio(0.5)) and np.all(ratio(0.5) > 1.0), (type(b).__name__, ratio(0.9), ratio(0.5))


def test_conformal_scores_set_each_level_of_the_band_beyond_the_fit():
  """With conformal scores (curves.Discrepancy), the band at level L beyond the fit is the prediction -/+ the
  ceil((n + 1) L)-th smallest score times the band's sd (the largest score when L asks for more): scores that are
  mostly small with a few large ones (most runs follow their curve, a few leave it) give a narrower 50 % band and
  a wider 90 % band than the parametric one; inside the fit nothing changes."""
  from scalerl_jax.scaling.analysis import analyse
  from scalerl_jax.scaling.curves import Z90, Discrepancy

  d = Discrepancy(0.5, scores=tuple(float(v) for v in range(1, 20)))
  assert (d.multiplier(0.5), d.multiplier(0.9), d.multiplier(0.99)) == (10.0, 18.0, 19.0)
  truth = SigmoidParams(A=0.7, B=1.5, C_mid=2000.0, R0=0.3)
  pts = synthetic.synthetic_run(truth, 16000.0, n_evals=40, seed=5)
  scores = (0.1,) * 13 + (3.0,) * 3
  par = analyse(pts, fit_upto=0.5, bayes=True, num_warmup=200, num_samples=400, discrepancy=Discrepancy(0.5))
  inside, beyond = np.array([1000.0, 4000.0]), np.array([2.0 * float(par.window.fit.compute[-1])])
  for fit in (par.lsq, par.bayes):
    conf = dataclasses.replace(fit, discrepancy=Discrepancy(0.5, scores=scores))
    np.testing.assert_allclose(conf.band(inside, 0.9, predictive=True)[0], fit.band(inside, 0.9, predictive=True)[0])

    def width(f, level):
      lo, *_, hi = f.band(beyond, level, predictive=True)
      return float((hi - lo)[0])

    assert width(conf, 0.5) < width(fit, 0.5) and width(conf, 0.9) > width(fit, 0.9), type(fit).__name__
    lo90, *_, hi90 = fit.band(beyond, 0.9, predictive=True)
    lo, *_, hi = conf.band(beyond, 0.9, predictive=True)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    np.testing.assert_allclose((logit(hi) - logit(lo)) / 2, 3.0 * (logit(hi90) - logit(lo90)) / (2 * Z90),
                               rtol=0.02)
