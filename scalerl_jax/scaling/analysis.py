"""One run end to end: fit on the first part of its compute, extrapolate to the rest, say how well that went.

    points ──split──► R0 | fit window (C <= fit_upto * C_last, C >= c_min) | held-out tail
              │
              ├─ least squares (paper grid, or free) ──► A, B, C_mid, residual, delta-method band
              ├─ power law A - D / C^B (for comparison only)
              └─ NUTS (optional) ──► quantiles of A, B, C_mid; band of R(C_last)
    summary: predicted reward at C_last vs the measured one; whether the band covers it.

`RunFit` keeps the objects for plots and comparisons; `summary` turns it into plain JSON-ready numbers;
`format_report` into a few printable lines. The trainer's end-of-run call (`fit_run`: fit, optional plot, summary)
lives in `end_of_run.py`, above both this module and `plots.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.stats import norm
from scipy.stats import t as student_t

from scalerl_jax.scaling import advice as advice_lib
from scalerl_jax.scaling import bayes as bayes_lib
from scalerl_jax.scaling import calibration as calibration_lib
from scalerl_jax.scaling import fit as fit_lib
from scalerl_jax.scaling.curves import Discrepancy
from scalerl_jax.scaling.io import UNITS
from scalerl_jax.scaling.points import CurveDataError, CurvePoints, Window, split

METHODS = ("paper", "free")
# R0 of the NumPyro fit: "fixed" to the step-0 evaluation, or "free" (a parameter, that evaluation one more data
# point). Chosen by calibration (benchmarks/RESULTS.md, "Calibration"): fixing R0 to a noisy measurement makes the
# intervals on A and B too narrow.
BAYES_R0 = "free"
BAYES_R0S = ("fixed", "free", "curve")  # curve: R0 a parameter fitted to the curve points alone (step 0 not data)
# The NumPyro model's wander term (bayes.WANDERS), chosen by calibration on real runs (benchmarks/RESULTS.md,
# "Calibration on real runs": iid wander gave the NumPyro fit its smallest error at the halfway cut, 0.028).
WANDER = "iid"
# The predictive bands' model discrepancy beyond the fit (curves.Discrepancy) per fitter, and the NumPyro fit's
# shape prior: the shipped calibration (calibration.DEFAULT_PATH, written by benchmarks/calibration.py from the
# project's studies; benchmarks/RESULTS.md, "Calibration on real runs"). A sigmoid through half a run is not its
# exact shape; refit on finished runs of your own task with one command (calibration.py's docstring).
CALIBRATION = calibration_lib.load()
DISCREPANCY = CALIBRATION.discrepancy


@dataclasses.dataclass(frozen=True)
class RunFit:
  """A fitted run: its points, the split, the least-squares / power-law / Bayesian fits."""
  points: CurvePoints
  window: Window
  lsq: fit_lib.LsqFit
  power: Optional[fit_lib.PowerLawFit]
  bayes: Optional[bayes_lib.BayesFit]
  level: float = 0.9
  calibration: str = ""  # calibration.Calibration.describe() of what the bands and prior came from

  @property
  def name(self) -> str:
    return self.points.name

  @property
  def c_last(self) -> float:
    return float(self.points.compute[-1])

  @property
  def measured_last(self) -> float:
    return float(self.points.reward[-1])


def analyse(points: CurvePoints, *, fit_upto: float = 0.5, c_min: float = 0.0, method: str = "paper",
            bayes: bool = False, fit_r0: bool = False, likelihood: str = "auto", num_warmup: int = 500,
            num_samples: int = 1000, seed: int = 0, level: float = 0.9, lsq_kwargs: Optional[dict] = None,
            bayes_r0: Optional[str] = None, wander: Optional[str] = None,
            discrepancy: Optional[Discrepancy] = None, calibration: Optional[calibration_lib.Calibration] = None,
            prior=None, c_per_step: Optional[float] = None, a_max: Optional[float] = None) -> RunFit:
  """Splits `points` (see `points.split`) and fits the window; R0 is fixed to the first point unless fit_r0.

  fit_r0 fits R0 as well (then the start point joins the fitted data, and method must be "free").
  bayes_r0 ("fixed" | "free"; default BAYES_R0, or "free" with fit_r0) decides the same for the NumPyro fit
  alone, so the paper's least-squares procedure can keep R0 fixed while the posterior accounts for the noise of
  the one evaluation that measures it. `wander` (default WANDER): the NumPyro model's term for a run's own
  fluctuation off the smooth curve (bayes.WANDERS). `discrepancy`: the predictive bands' model discrepancy beyond
  the fit window (curves.Discrepancy) for both fitters; default: `calibration`'s, per fitter (default
  CALIBRATION, the shipped one). `prior` (prior.CurvePrior, with the run's compute per RL step `c_per_step`;
  default: the calibration's when it says use_prior) and `a_max` (an upper bound on A, e.g. the base policy's
  pass@k) shape the NumPyro fit only; the paper's least squares stays the paper's.
  """
  cal = calibration or CALIBRATION
  c_per_step = c_per_step or points.c_per_step
  given_prior = prior is not None
  if not given_prior and c_per_step:
    prior = cal.shape_prior
  bayes_r0 = bayes_r0 or ("free" if fit_r0 else BAYES_R0)
  if bayes_r0 not in BAYES_R0S:
    raise CurveDataError(f"bayes_r0 must be one of {BAYES_R0S}, got {bayes_r0!r}")
  if method not in METHODS:
    raise CurveDataError(f"unknown method {method!r}; choose one of {METHODS}")
  if fit_r0 and method == "paper":
    raise CurveDataError("the paper's fitter keeps R0 fixed; use method='free' with fit_r0")
  window = split(points, fit_upto=fit_upto, c_min=c_min)
  data = join_points(window.start, window.fit) if fit_r0 else window.fit
  if method == "paper":
    lsq = fit_lib.fit_paper(data.compute, data.reward, window.r0, **(lsq_kwargs or {}))
  else:
    lsq = fit_lib.fit_free(data.compute, data.reward, window.r0, fit_r0=fit_r0)
  if discrepancy is not None and not isinstance(discrepancy, Discrepancy):
    raise CurveDataError(f"discrepancy must be a curves.Discrepancy, got {discrepancy!r}")
  disc = ({k: cal.for_cut(k, fit_upto) for k in cal.discrepancy} if discrepancy is None
          else dict.fromkeys(cal.discrepancy, discrepancy))
  lsq = dataclasses.replace(lsq, discrepancy=disc["paper"], c_fit_last=float(window.fit.compute[-1]))
  try:
    power = fit_lib.fit_power_law(window.fit.compute, window.fit.reward)
  except CurveDataError:
    power = None
  post = None
  if bayes:
    free = bayes_r0 == "free" and len(window.start) > 0
    post = bayes_lib.fit_bayes(join_points(window.start, window.fit) if free else window.fit, window.r0,
                               likelihood=likelihood, fit_r0=free or bayes_r0 == "curve", num_warmup=num_warmup, num_samples=num_samples,
                               seed=seed, wander=wander or WANDER, prior=prior, c_per_step=c_per_step,
                               a_max=a_max)
    post = dataclasses.replace(post, discrepancy=disc["numpyro"])
  used = cal.describe(prior if post is not None else None, given_prior,
                      "" if discrepancy is None else "bands with a discrepancy given by the caller")
  return RunFit(points, window, lsq, power, post, level, used)


DISCREPANCY_DFS = (1.0, 2.0, 3.0, 5.0, 10.0, 30.0, float("inf"))  # the degrees of freedom discrepancy_mle tries
DISCREPANCY_POWERS = (0.5, 1.0, 1.5, 2.0)  # and the powers of the distance


def discrepancy_mle(err, sd, dist, dfs=DISCREPANCY_DFS, powers=DISCREPANCY_POWERS) -> Discrepancy:
  """The maximum-likelihood model discrepancy (curves.Discrepancy) over finished runs' extrapolations: on the logit
  scale each error err_i (final measurement minus point prediction) is taken as Student-t(df) with scale
  sqrt(sd_i^2 + (scale dist_i^power)^2), sd_i the fit's own predictive sd and dist_i the distance in ln C beyond
  the fit; df = inf is the normal. The scale is fitted for each (power, df) on the grids; a few runs that take off
  or dip after the fit among many that follow it give heavy tails (small df), and fits cut at different fractions
  of their runs tell the power. benchmarks/calibration.py fits it on real runs; the scale is 0 when the fits' own
  bands already explain the errors."""
  err, sd, dist = (np.asarray(v, dtype=float) for v in (err, sd, dist))

  def nll(scale, power, df):
    s = np.sqrt(sd**2 + (scale * dist**power) ** 2)
    return float(-np.sum(norm.logpdf(err, scale=s) if np.isinf(df) else student_t.logpdf(err, df, scale=s)))

  best = None
  for power in powers:
    for df in dfs:
      res = minimize_scalar(lambda k, p=power, d=df: nll(k, p, d), bounds=(0.0, 5.0), method="bounded",
                            options={"xatol": 1e-4})
      if best is None or res.fun < best[0]:
        best = (res.fun, Discrepancy(float(res.x), float(power), float(df)))
  return best[1]


def join_points(a: CurvePoints, b: CurvePoints) -> CurvePoints:
  """`a` then `b` as one CurvePoints (e.g. the R0 point and the fit window, for a fit with a free R0)."""
  cat = lambda x, y: None if x is None or y is None else np.concatenate([x, y])  # noqa: E731
  return CurvePoints(cat(a.compute, b.compute), cat(a.reward, b.reward), cat(a.n_correct, b.n_correct),
                     cat(a.n_total, b.n_total), cat(a.per_prompt, b.per_prompt), b.samples_per_prompt, b.name,
                     b.x_axis)


def _num(v) -> Optional[float]:
  """A float for JSON; None where it is not finite (e.g. a band without a covariance)."""
  return float(v) if np.isfinite(v) else None


# The estimate a report leads with: the paper's least squares (its A, B, C_mid and its prediction, with its calibrated
# band); the NumPyro posterior, when the run has one, is printed beside it for the uncertainty on A, B and C_mid, and
# a ceiling is reported only when both fits say the data hold it (advice.ceiling_status). Why: over two studies (3-
# and 4-digit addition, 12 runs each, benchmarks/RESULTS.md "Prediction that transfers") least squares predicted the
# final pass rate better from both cuts: median errors 0.021 / 0.015 from half the compute against the posterior
# median's 0.023 / 0.017, and 0.035 / 0.031 from a quarter against 0.047 / 0.081 (at the quarter cut the posterior
# median under-predicted by 0.08 on average, least squares by 0.04-0.07), with calibrated bands as narrow at the
# halfway cut (90 % width 0.16 / 0.21 against 0.15 / 0.27). The first study alone had favoured the posterior (its
# band was the narrower there).
HEADLINE = "paper least squares"


def headline(run: RunFit) -> dict:
  """The one estimate to read (HEADLINE): its fitter's name, A, B, C_mid, R0, and whether its ceiling is identified
  (advice.ceiling_status: with why not)."""
  identified, why = advice_lib.ceiling_status(run)
  return {"fitter": HEADLINE, **run.lsq.params.as_dict(), "ceiling_identified": identified, "why_not": why}


def summary(run: RunFit) -> dict:
  """Plain numbers: A, B, C_mid, R0, residual; extrapolation to the last compute; Bayesian quantiles and band."""
  p, w, c_last = run.lsq.params, run.window, run.c_last
  predicted = float(p(c_last))
  lo, hi = (_num(v[0]) for v in run.lsq.band(np.array([c_last]), run.level, predictive=True))
  held = w.held_out
  extrap = {"c_last": c_last, "measured": run.measured_last, "predicted": predicted,
            "error": predicted - run.measured_last, "band": [lo, hi], "level": run.level,  # predictive band
            "covered": bool(lo <= run.measured_last <= hi) if len(held) and lo is not None else None,
            "held_out_rmse": float(np.sqrt(np.mean((p(held.compute) - held.reward) ** 2))) if len(held) else None}
  head = headline(run)
  out = {"name": run.name, "n_points": len(run.points), "n_fit": len(w.fit), "n_held_out": len(held),
         "c_min": w.c_min, "c_cut": w.c_cut, "method": run.lsq.method, **p.as_dict(), "x_axis": run.points.x_axis,
         "headline": head, "ceiling": {"identified": head["ceiling_identified"], "why_not": head["why_not"]},
         "residual": {"sse": run.lsq.sse, "rmse": run.lsq.rmse}, "extrapolation": extrap,
         "calibration": run.calibration}
  if run.power is not None:
    out["power_law"] = {**run.power.params.as_dict(), "sse": run.power.sse}
  if run.bayes is not None:
    b = run.bayes
    mean_lo, med, mean_hi = (float(v[0]) for v in b.band(np.array([c_last]), run.level))
    pred_lo, _, pred_hi = (float(v[0]) for v in b.band(np.array([c_last]), run.level, predictive=True))
    out["bayes"] = {
        "likelihood": b.likelihood, "level": run.level,
        **{k: b.quantiles(k) for k in ("A", "B", "C_mid")},
        "predicted_last": {"lo": mean_lo, "median": med, "hi": mean_hi},  # band of the mean curve
        "predictive_last": {"lo": pred_lo, "hi": pred_hi},  # with one evaluation's noise
        "covered": bool(pred_lo <= run.measured_last <= pred_hi) if len(held) else None,
        "diagnostics": b.diagnostics}
  return out


def format_report(s: dict) -> str:
  """A few lines for the end of a training run: the headline estimate first (its fitter named), every compute in
  the run's unit, the ceiling reported only when identified."""
  e, h = s["extrapolation"], s["headline"]
  unit = UNITS.get(s.get("x_axis", ""), "")
  u = f" {unit}" if unit else ""
  lines = [f"curve fit [{s['name'] or 'run'}] on {unit or 'compute'}: {s['n_fit']} evaluations fitted up to "
           f"C={s['c_cut']:.4g}{u}, {s['n_held_out']} held out"]
  q = s.get("bayes")
  interval = lambda k, f: "" if q is None else f" [{q[k]['q05']:{f}}, {q[k]['q95']:{f}}]"  # noqa: E731
  if h["ceiling_identified"]:
    lines.append(f"  ceiling A={h['A']:.3f} B={h['B']:.2f} C_mid={h['C_mid']:.4g}{u} R0={h['R0']:.3f} "
                 f"({h['fitter']}, rmse={s['residual']['rmse']:.4f})")
  else:
    lines.append(f"  ceiling not identified: {h['why_not']}")
    lines.append(f"  the fit's numbers, not a ceiling: A={h['A']:.3f} B={h['B']:.2f} C_mid={h['C_mid']:.4g}{u} "
                 f"({h['fitter']}, rmse={s['residual']['rmse']:.4f})")
  if q is not None:  # the posterior beside the headline: the uncertainty on the parameters
    med = lambda k, f: f"{q[k]['q50']:{f}}{interval(k, f)}"  # noqa: E731
    lines.append(f"  NumPyro posterior: A={med('A', '.3f')} B={med('B', '.2f')} C_mid={med('C_mid', '.4g')}{u} "
                 "(medians, 5-95 % intervals)")
  band_text = (f" [{e['band'][0]:.3f}, {e['band'][1]:.3f}] (width {e['band'][1] - e['band'][0]:.2f})"
               if e["band"][0] is not None else "")
  lines.append(f"  at C={e['c_last']:.4g}{u}: predicted {e['predicted']:.3f}{band_text}, measured {e['measured']:.3f} "
               f"(error {e['error']:+.3f}"
               + ("" if e["covered"] is None else f", {'inside' if e['covered'] else 'outside'} the "
                  f"{round(100 * e['level'])} % band") + ")")
  if s.get("calibration"):
    lines.append(f"  {s['calibration']}")
  return "\n".join(lines)
