"""Learned shape priors, the pass@k bound on A, and calibration files (scaling/prior.py, scaling/calibration.py)."""

import json

import numpy as np
import pytest
from scipy.special import betaln

from scalerl_jax.scaling import analyse, calibration, format_report, summary
from scalerl_jax.scaling.bayes import fit_bayes
from scalerl_jax.scaling.curves import SigmoidParams
from scalerl_jax.scaling.points import CurveDataError, CurvePoints
from scalerl_jax.scaling.prior import (CurvePrior, bound_on_a, learn_prior, pass_at_k, pass_at_k_betabinomial,
                                       prior_from_fits)
from scalerl_jax.scaling.synthetic import synthetic_run


def test_learned_prior_recovers_a_known_prior_net_of_each_runs_posterior_spread():
  # 400 runs whose true ln B and ln C_mid/step come from known normals; each run's posterior is centred on a noisy
  # estimate of its truth and is as wide as that noise (w = 0.3), wider than the population's spread: the spread
  # of the posterior means is sqrt(sd^2 + w^2), and the prior must take w back out
  rng = np.random.default_rng(0)
  truth = {"b": (np.log(1.8), 0.2), "m": (np.log(120.0), 0.25)}
  draws = {}
  for k, (mean, sd) in truth.items():
    true = rng.normal(mean, sd, 400)
    centre = true + rng.normal(0.0, 0.3, 400)
    draws[k] = [c + rng.normal(0.0, 0.3, 2000) for c in centre]
  prior = learn_prior(draws["b"], draws["m"], "synthetic")
  assert prior.n_runs == 400
  assert prior.b_mean == pytest.approx(truth["b"][0], abs=0.06) and prior.m_mean == pytest.approx(truth["m"][0], abs=0.06)
  assert prior.b_sd == pytest.approx(0.2, abs=0.07) and prior.m_sd == pytest.approx(0.25, abs=0.07)
  naive = np.std([np.mean(d) for d in draws["b"]])  # what a prior that ignored the posteriors' width would say
  assert naive > 0.33


def test_prior_from_whole_run_fits_recovers_the_shape_in_steps():
  # 6 noisy synthetic runs with B = 2 and C_mid = 40 steps at different compute per step: the prior from their
  # NUTS fits is stated in steps, so runs of different per-step cost agree
  fits, per_step = [], []
  for i, cps in enumerate((1.0, 3.0, 10.0, 1.0, 3.0, 10.0)):
    pts = synthetic_run(SigmoidParams(A=0.85, B=2.0, C_mid=40.0 * cps, R0=0.2), 200.0 * cps, n_evals=20,
                        n_prompts=256, samples_per_prompt=4, seed=i)
    fits.append(analyse(pts, fit_upto=1.0, bayes=True, num_warmup=200, num_samples=300).bayes)
    per_step.append(cps)
  prior = prior_from_fits(fits, per_step)
  assert np.exp(prior.b_mean) == pytest.approx(2.0, rel=0.15)
  assert np.exp(prior.m_mean) == pytest.approx(40.0, rel=0.15)


def _quarter_run(seed=0, cps=2.0):
  pts = synthetic_run(SigmoidParams(A=0.9, B=1.5, C_mid=60.0 * cps, R0=0.2), 240.0 * cps, n_evals=24, n_prompts=128,
                      samples_per_prompt=4, seed=seed)
  return pts.take(slice(0, 8))  # the first third: the bend is not in the data


def test_a_tight_learned_prior_sets_the_fit_through_the_runs_compute_per_step():
  pts = _quarter_run()
  r0 = float(pts.reward[0])
  generic = fit_bayes(pts.take(slice(1, None)), r0, num_warmup=200, num_samples=300)
  prior = CurvePrior(np.log(3.0), 0.03, np.log(50.0), 0.03, n_runs=10)
  tight = fit_bayes(pts.take(slice(1, None)), r0, num_warmup=200, num_samples=300, prior=prior, c_per_step=2.0)
  assert np.median(generic.param("B")) < 2.5  # the data alone do not say B = 3 ...
  assert np.median(tight.param("B")) == pytest.approx(3.0, rel=0.1)  # ... the prior does
  assert np.median(tight.param("C_mid")) == pytest.approx(100.0, rel=0.1)  # 50 steps x 2 per step
  with pytest.raises(CurveDataError, match="compute per step"):
    fit_bayes(pts.take(slice(1, None)), r0, num_warmup=10, num_samples=10, prior=prior)


def test_analyse_takes_the_compute_per_step_from_the_points_and_says_which_prior_it_used():
  pts = _quarter_run()
  prior = CurvePrior(np.log(3.0), 0.03, np.log(50.0), 0.03, n_runs=10)
  with pytest.raises(CurveDataError, match="compute per step"):  # a prior in steps needs the run's step cost
    analyse(pts, fit_upto=1.0, bayes=True, num_warmup=10, num_samples=10, prior=prior)
  # a calibration that ships a prior falls back to the generic priors, and says so, where the step cost is unknown
  cal = calibration.Calibration("c", calibration.load().discrepancy, prior, use_prior=True)
  without = analyse(pts, fit_upto=1.0, bayes=True, num_warmup=100, num_samples=100, calibration=cal)
  assert "generic shape prior" in without.calibration
  pts = CurvePoints(pts.compute, pts.reward, pts.n_correct, pts.n_total, name="q", c_per_step=2.0)
  run = analyse(pts, fit_upto=1.0, bayes=True, num_warmup=200, num_samples=300, prior=prior)
  assert "learned shape prior (10 runs, given by the caller)" in run.calibration
  assert np.median(run.bayes.param("C_mid")) == pytest.approx(100.0, rel=0.1)


def test_pass_at_k_unbiased_estimator_matches_its_closed_forms():
  c = np.array([0, 1, 2, 3, 4, 0, 4, 1])
  assert pass_at_k(c, 4, 1) == pytest.approx(np.mean(c) / 4)
  assert pass_at_k(c, 4, 4) == pytest.approx(np.mean(c > 0))
  # k = 2 of n = 4: 1 - C(4 - c, 2) / C(4, 2)
  fail = {0: 6, 1: 3, 2: 1, 3: 0, 4: 0}
  assert pass_at_k(c, 4, 2) == pytest.approx(np.mean([1 - fail[x] / 6 for x in c]))
  with pytest.raises(CurveDataError, match="k <= n"):
    pass_at_k(c, 4, 8)


def test_pass_at_k_beyond_n_extrapolates_through_the_prompts_beta():
  rng = np.random.default_rng(1)
  a, b = 0.4, 1.2  # many prompts nearly never solved: pass@64 well below 1
  p = rng.beta(a, b, 20000)
  c = rng.binomial(4, p)
  for k in (16, 64):
    exact = 1 - np.exp(betaln(a, b + k) - betaln(a, b))
    assert pass_at_k_betabinomial(c, 4, k) == pytest.approx(exact, abs=0.02)
  assert pass_at_k_betabinomial(c, 4, 4) == pytest.approx(pass_at_k(c, 4, 4), abs=0.01)
  assert bound_on_a(c, 4, 64) == pytest.approx(pass_at_k_betabinomial(c, 4, 64))
  assert bound_on_a(c, 4, 2) == pytest.approx(pass_at_k(c, 4, 2))
  assert bound_on_a(None, None, 64) is None


def test_a_pass_at_k_bound_caps_the_ceiling():
  pts = synthetic_run(SigmoidParams(A=0.9, B=1.5, C_mid=60.0, R0=0.2), 240.0, n_evals=24, n_prompts=128,
                      samples_per_prompt=4, seed=0)
  fit = pts.take(slice(1, 10))
  free = fit_bayes(fit, float(pts.reward[0]), num_warmup=200, num_samples=300)
  capped = fit_bayes(fit, float(pts.reward[0]), num_warmup=200, num_samples=300, a_max=0.7)
  assert np.quantile(free.param("A"), 0.9) > 0.75
  assert np.max(capped.param("A")) <= 0.7 + 1e-6
  with pytest.raises(CurveDataError, match="bound on A"):
    fit_bayes(fit, 0.2, num_warmup=10, num_samples=10, a_max=1.5)


def test_calibration_files_round_trip_name_themselves_in_the_report_and_fail_clearly(tmp_path):
  shipped = calibration.load()
  assert shipped.path == str(calibration.DEFAULT_PATH) and set(shipped.discrepancy) == {"paper", "numpyro"}
  quarter, half = (3.0,) * 12, (0.5,) * 12
  mine = calibration.Calibration("my task's 12 runs", {k: d for k, d in shipped.discrepancy.items()},
                                 CurvePrior(0.5, 0.2, 4.0, 0.3, 12, "mine"), True,
                                 cut_scores={"numpyro": {0.25: quarter, 0.5: half}})
  path = tmp_path / "cal.json"
  calibration.save(mine, path)
  back = calibration.load(path)
  assert back.name == mine.name and back.discrepancy == mine.discrepancy and back.prior == mine.prior
  assert back.use_prior and back.shape_prior == mine.prior and back.cut_scores == mine.cut_scores
  # a fit is judged by the scores of runs cut nearest its own cut; a fitter without per-cut scores keeps its own
  assert back.for_cut("numpyro", 0.3).scores == quarter and back.for_cut("numpyro", 0.45).scores == half
  assert back.for_cut("paper", 0.25) == shipped.discrepancy["paper"]
  full = synthetic_run(SigmoidParams(A=0.9, B=1.5, C_mid=60.0, R0=0.2), 240.0, n_evals=24, seed=0)
  assert analyse(full, fit_upto=0.3, bayes=True, num_warmup=50, num_samples=50,
                 calibration=back).bayes.discrepancy.scores == quarter
  pts = _quarter_run()
  report = format_report(summary(analyse(pts, fit_upto=0.6, calibration=back)))
  assert "bands calibrated on my task's 12 runs" in report and str(path) in report
  report = format_report(summary(analyse(pts, fit_upto=0.6)))
  assert f"bands calibrated on {shipped.name}" in report and "shipped default" in report
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"name": "x", "discrepancy": {"paper": {"scale": 1, "power": 1}}}))
  with pytest.raises(CurveDataError, match=r"bad\.json.*numpyro"):
    calibration.load(bad)
  bad.write_text("{")
  with pytest.raises(CurveDataError, match=r"bad\.json: not JSON"):
    calibration.load(bad)
  with pytest.raises(CurveDataError, match="no such calibration file"):
    calibration.load(tmp_path / "missing.json")


def test_the_trainers_end_of_run_report_says_which_calibration_its_bands_used(tmp_path):
  from scalerl_jax.config import load_config
  from scalerl_jax.pipeline.report import final_report
  from scalerl_jax.scaling.synthetic import write_run_dir
  run_dir = tmp_path / "run"
  write_run_dir(synthetic_run(SigmoidParams(A=0.9, B=1.5, C_mid=60.0, R0=0.2), 240.0, n_evals=12, seed=0), run_dir)
  shipped = calibration.load()
  report = final_report(load_config(None, [f"run_dir={run_dir}", "curve_fit.bayes=false"]), {"steps": 1200})
  assert f"bands calibrated on {shipped.name}" in report and "shipped default" in report
  mine = tmp_path / "mine.json"
  calibration.save(calibration.Calibration("my runs", shipped.discrepancy), mine)
  report = final_report(load_config(None, [f"run_dir={run_dir}", "curve_fit.bayes=false",
                                           f"curve_fit.calibration={mine}"]), {"steps": 1200})
  assert f"bands calibrated on my runs" in report and str(mine) in report
  # a calibration file that is missing or malformed stops the run before it starts, not its report after
  from scalerl_jax.config import ConfigError
  with pytest.raises(ConfigError, match=r"curve_fit.calibration: .*none\.json: no such calibration file"):
    load_config(None, [f"curve_fit.calibration={tmp_path / 'none.json'}"])
  (tmp_path / "bad.json").write_text("[1, 2")
  with pytest.raises(ConfigError, match=r"curve_fit.calibration: .*bad\.json: not JSON"):
    load_config(None, [f"curve_fit.calibration={tmp_path / 'bad.json'}"])
