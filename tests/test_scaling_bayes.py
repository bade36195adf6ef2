"""NumPyro posterior of the scaling curve: recovery per likelihood, bands, R0, seeds, comparisons.

NUTS is kept small (one chain, 300 warmup, 400 samples) and every test uses the same sizes, so each likelihood
compiles once for the whole file.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from scalerl_jax import scaling
from scalerl_jax.scaling import bayes, synthetic
from scalerl_jax.scaling.curves import SigmoidParams
from scalerl_jax.scaling.points import CurveDataError, CurvePoints, split

NUTS = dict(num_warmup=300, num_samples=400)
SCALERL = synthetic.table1("ScaleRL", r0=0.30)


def _fit(truth, likelihood, seed=0, fit_upto=0.5, prompt_phi=None, drop_counts=False, **kw):
  pts = synthetic.synthetic_run(truth, 6 * truth.C_mid, n_evals=60, seed=seed, prompt_phi=prompt_phi)
  if drop_counts:
    pts = CurvePoints(pts.compute, pts.reward)
  w = split(pts, fit_upto=fit_upto)
  return w, bayes.fit_bayes(w.fit, w.r0, likelihood=likelihood, seed=seed, **NUTS, **kw)


def _covers(f, name, value):
  q = f.quantiles(name)
  return q["q05"] <= value <= q["q95"]


@pytest.fixture(scope="module")
def binomial_fit():
  return _fit(SCALERL, "binomial", seed=1)


def test_binomial_recovers_parameters_and_extrapolates(binomial_fit):
  w, f = binomial_fit
  assert f.likelihood == "binomial" and f.samples["A"].shape == (400,)
  for name in ("A", "B", "C_mid"):
    assert _covers(f, name, getattr(SCALERL, name)), (name, f.quantiles(name))
  assert abs(f.quantiles("A")["q50"] - SCALERL.A) <= 0.02
  q = f.quantiles("A")
  assert q["q95"] - q["q05"] < 0.04  # informative, not the prior (R0..1)
  c_last = 6 * SCALERL.C_mid
  lo, med, hi = f.band(np.array([c_last]))
  assert lo[0] <= SCALERL(c_last) <= hi[0]
  assert f.diagnostics["divergences"] < 20 and f.diagnostics["r_hat_max"] < 1.1


def test_predictive_band_is_wider_than_the_mean_band(binomial_fit):
  _, f = binomial_fit
  c = np.array([2000.0, 15000.0])
  lo, _, hi = f.band(c)
  plo, _, phi = f.band(c, predictive=True)
  assert np.all(phi - plo > hi - lo)
  # One evaluation of 16000 samples adds sd ~ sqrt(0.6 * 0.4 / 16000) = 0.0039 around the mean curve.
  assert np.all((phi - plo) - (hi - lo) < 4 * 1.645 * 0.0039)


def test_gaussian_likelihood_without_counts():
  _, f = _fit(SCALERL, "auto", seed=2, drop_counts=True)
  assert f.likelihood == "gaussian"
  assert _covers(f, "A", SCALERL.A) and _covers(f, "B", SCALERL.B)
  sigma = np.median(f.samples["sigma"])
  assert sigma == pytest.approx(np.sqrt(0.55 * 0.45 / 16000), rel=0.5)  # the binomial noise, learnt


def test_betabinomial_on_per_prompt_counts():
  truth = synthetic.table1("ScaleRL-Scout", r0=0.35)
  _, f = _fit(truth, "auto", seed=3, prompt_phi=5.0)
  assert f.likelihood == "betabinomial"
  assert _covers(f, "A", truth.A) and _covers(f, "B", truth.B)
  assert np.median(f.samples["phi"]) == pytest.approx(5.0, rel=0.3)


def test_betabinomial_logpmf_matches_numpyro():
  alpha = jnp.array([[0.5, 3.0], [7.0, 0.1]])
  beta = jnp.array([[2.0, 0.3], [1.0, 9.0]])
  ours = jax.jit(bayes.betabinomial_logpmf, static_argnums=2)(alpha, beta, 16)  # rising factorials
  ref = jax.jit(lambda a, b: dist.BetaBinomial(a[..., None], b[..., None], 16).log_prob(jnp.arange(17)))(
      alpha, beta)  # lgamma
  assert ours.shape == ref.shape == (2, 2, 17)
  np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_fit_r0_uses_the_zero_compute_point():
  truth = SigmoidParams(0.62, 1.8, 3000.0, 0.22)
  pts = synthetic.synthetic_run(truth, 18000.0, n_evals=60, seed=4)
  f = bayes.fit_bayes(pts, r0=0.5, likelihood="binomial", fit_r0=True, seed=4, **NUTS)  # r0 unused
  assert f.quantiles("R0")["q50"] == pytest.approx(0.22, abs=0.01)
  assert _covers(f, "A", truth.A)
  with pytest.raises(CurveDataError, match="C = 0"):
    bayes.fit_bayes(pts, r0=0.22, likelihood="binomial", **NUTS)


def test_hierarchical_seeds_share_a():
  truth = [SigmoidParams(0.64, b, m, 0.3) for b, m in ((1.6, 2500.0), (1.9, 3000.0), (1.75, 2700.0))]
  windows = [split(synthetic.synthetic_run(t, 18000.0, n_evals=40, seed=10 + i), fit_upto=0.5)
             for i, t in enumerate(truth)]
  f = bayes.fit_bayes_seeds([w.fit for w in windows], [w.r0 for w in windows], seed=5, **NUTS)
  assert f.samples["A"].shape == (400,) and f.samples["B"].shape == (400, 3)
  assert _covers(f, "A", 0.64)
  for i, t in enumerate(truth):
    assert f.param("B", seed=i).shape == (400,)
    assert f.quantiles("C_mid", seed=i)["q50"] == pytest.approx(t.C_mid, rel=0.25)
  assert f.curves(np.array([1000.0, 6000.0]), seed=2).shape == (400, 2)
  # Sharing A pools the seeds' evidence: its band is narrower than any single seed's.
  width = lambda q: q["q95"] - q["q05"]  # noqa: E731
  singles = [bayes.fit_bayes(w.fit, w.r0, seed=i, **NUTS).quantiles("A") for i, w in enumerate(windows)]
  assert width(f.quantiles("A")) < min(width(q) for q in singles)


def test_probability_that_one_ceiling_is_higher(binomial_fit):
  _, f1 = binomial_fit
  higher = SigmoidParams(0.70, SCALERL.B, SCALERL.C_mid, SCALERL.R0)
  _, f2 = _fit(higher, "binomial", seed=6)
  assert scaling.prob_a_greater(f2, f1) > 0.99
  assert scaling.prob_a_greater(f1, f2) < 0.01
  # Hand-made samples: a1 = {0.1, 0.3} vs a2 = {0.2}: one of two pairs has a1 > a2.
  fake = lambda a: bayes.BayesFit({"A": np.array(a)}, "gaussian", 0.0, 0, {})  # noqa: E731
  assert scaling.prob_a_greater(fake([0.1, 0.3]), fake([0.2])) == 0.5


def test_likelihood_needs_its_data():
  pts = CurvePoints([1.0, 2.0, 3.0, 4.0], [0.3, 0.4, 0.45, 0.5])
  with pytest.raises(CurveDataError, match="needs n_correct/n_total"):
    bayes.fit_bayes(pts, 0.2, likelihood="binomial")
  with pytest.raises(CurveDataError, match="unknown likelihood"):
    bayes.fit_bayes(pts, 0.2, likelihood="poisson")
