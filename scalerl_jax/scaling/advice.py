"""Early-stop advice: will a run's ceiling reach a target pass rate, and at what compute?

From a fitted run (`analysis.RunFit`), over draws of the curve's parameters:

    P(reach)   = P(A > target)                     the share of draws whose ceiling is above the target
    C_target   = C_mid / ((A - R0) / (target - R0) - 1)^(1 / B)     solving R(C) = target, for those draws

The draws are the NumPyro posterior's samples when the run was fitted with `bayes=True`; otherwise draws of the
least-squares fit's Laplace approximation, (A, ln B, ln C_mid) ~ Normal(estimate, covariance), A clipped to
(R0, 1]; without a covariance, the point estimate alone (P is then 0 or 1, and the advice says so). A target the run
has already measured, or one at or below R0, is reported as reached, with no extrapolation.

`ceiling_status` says when a fit's ceiling is not identified yet (the advice and the report say so instead of
presenting A as a prediction): the fitted midpoint C_mid lies beyond the last fitted compute (the curve has not
bent inside the fit window), or A's interval runs into the prior's bound A <= 1 (A_BOUND; for a least-squares fit
alone: its estimate does). On the CPU study's 16 runs cut at half their compute, each rule refuses 4 fits, all of
runs still climbing (benchmarks/RESULTS.md, "Calibration on real runs"). No rule catches every early fit: a run
whose last fitted points dip can look bent; such a fit often puts A below pass rates the run has already measured,
and a third rule (`below_measured`) refuses it then: a point of the fitted part whose pass rate less two standard
errors still exceeds A.
"""

from __future__ import annotations

import numpy as np

from scalerl_jax.scaling.points import CurveDataError


def _draws(run, n: int, seed: int) -> tuple[dict, str]:
  """Parameter draws {A, B, C_mid, R0} (arrays of one length) and where they came from."""
  if run.bayes is not None:
    s = run.bayes.samples
    return {k: np.asarray(s[k], float).reshape(len(s["A"]), -1)[:, 0] for k in ("A", "B", "C_mid", "R0")}, \
        "posterior"
  p, cov = run.lsq.params, run.lsq.cov
  if cov is None or not np.all(np.isfinite(cov)):
    return {k: np.array([getattr(p, k)], float) for k in ("A", "B", "C_mid", "R0")}, "point estimate"
  mean = [p.A, np.log(p.B), np.log(p.C_mid)] + ([p.R0] if cov.shape[0] == 4 else [])
  x = np.random.default_rng(seed).multivariate_normal(mean, cov, size=n, check_valid="ignore")
  r0 = x[:, 3] if cov.shape[0] == 4 else np.full(n, p.R0)
  return {"A": np.clip(x[:, 0], r0 + 1e-9, 1.0), "B": np.exp(x[:, 1]), "C_mid": np.exp(x[:, 2]), "R0": r0}, "laplace"


A_BOUND = 0.995  # an interval on A reaching this is held up by the prior's A <= 1, not by the data


def ceiling_checks(c_mid: float, c_cut: float, a_hi: float, point: bool = False) -> tuple[bool, str]:
  """The refusal rules shared by one run's fit and a study's recipe fit: the ceiling is not identified when the
  midpoint C_mid (median) lies beyond the last fitted compute c_cut (the curve has not bent inside the data), or
  when the upper end of A's interval (`point`: the estimate, for a fit without an interval) reaches A_BOUND (the
  bound A <= 1 holds it up)."""
  if c_mid >= c_cut:
    return False, (f"not bent yet: the fitted midpoint C_mid={c_mid:.4g} lies beyond the last fitted compute "
                   f"{c_cut:.4g}, so the ceiling is a guess")
  if a_hi >= A_BOUND:
    what = "A" if point else "A's interval"
    return False, f"{what} reaches {a_hi:.3f}: held up by the bound A <= 1, not by the points (the run still climbs)"
  return True, ""


def below_measured(a: float, compute, reward, n_total, rmse: float) -> str:
  """Why a ceiling `a` cannot be one (a sentence), or "": the run has already measured pass rates above it by more
  than their noise. A point counts when its pass rate less 2 standard errors (binomial, from its sample count
  `n_total`; the fit's `rmse` when the points carry no counts, n_total None) still exceeds `a`; the sentence names
  the highest such point."""
  r, c = np.asarray(reward, float), np.asarray(compute, float)
  if n_total is not None:
    se = np.sqrt(r * (1 - r) / np.maximum(np.asarray(n_total, float), 1.0))
  else:
    se = np.full(r.shape, float(rmse))
  over = np.flatnonzero(r - 2 * se > a)
  if not over.size:
    return ""
  i = over[np.argmax(r[over])]
  return (f"A={a:.3f} lies below pass rates the run has already measured ({r[i]:.3f} at C={c[i]:.4g}, "
          f"{len(over)} point(s) above A by more than 2 standard errors): the curve does not describe the run")


def _status(run, c_mid: float, a: float, a_hi: float, point: bool) -> tuple[bool, str]:
  c_cut = float(run.window.fit.compute[-1])  # the last fitted compute, as for a study's recipe
  ok, why = ceiling_checks(c_mid, c_cut, a_hi, point)
  if ok:
    pts = run.points
    seen = pts.compute <= c_cut
    why = below_measured(a, pts.compute[seen], pts.reward[seen],
                         None if pts.n_total is None else pts.n_total[seen], run.lsq.rmse)
    ok = not why
  return ok, why


def lsq_ceiling_status(run) -> tuple[bool, str]:
  """(identified, why not) by the least-squares fit alone: `ceiling_checks` on its C_mid and A (it has no interval
  on A), then `below_measured` against its A on every point measured up to the last fitted compute."""
  p = run.lsq.params
  return _status(run, p.C_mid, p.A, p.A, point=True)


def posterior_ceiling_status(run) -> tuple[bool, str]:
  """(identified, why not) by the NumPyro posterior alone: `ceiling_checks` on its median C_mid and the upper end of
  A's central `run.level` interval, then `below_measured` against A's median."""
  a = run.bayes.param("A")
  return _status(run, float(np.median(run.bayes.param("C_mid"))), float(np.median(a)),
                 float(np.quantile(a, 0.5 + run.level / 2)), point=False)


def ceiling_status(run) -> tuple[bool, str]:
  """(identified, why not) of the headline estimate (the least-squares fit, analysis.HEADLINE): its own checks
  (`lsq_ceiling_status`) and, when the run has a NumPyro posterior, the posterior's too (`posterior_ceiling_status`:
  its interval on A must stay below the bound): a ceiling is reported only when both fits say the data hold it."""
  ok, why = lsq_ceiling_status(run)
  if ok and run.bayes is not None:
    ok, why = posterior_ceiling_status(run)
    if not ok:
      why = f"the NumPyro posterior: {why}"
  return ok, why


def target_advice(run, target: float, *, level: float = 0.9, n_draws: int = 4000, seed: int = 0) -> dict:
  """{target, p_reach, c_target: {lo, median, hi} over the draws that reach it (None if none), source,
  reached: the compute of the first measurement at or above the target (None if not yet), level}."""
  if not 0.0 < target < 1.0:
    raise CurveDataError(f"target must be a pass rate in (0, 1), got {target}")
  pts = run.points
  hit = np.flatnonzero(pts.reward >= target)
  identified, why = ceiling_status(run)
  out = {"target": float(target), "level": level, "reached": float(pts.compute[hit[0]]) if hit.size else None,
         "ceiling_identified": identified, "caveat": why}
  d, out["source"] = _draws(run, n_draws, seed)
  if hit.size or target <= float(np.median(d["R0"])):
    return {**out, "p_reach": 1.0, "c_target": None}
  above = d["A"] > target
  out["p_reach"] = float(np.mean(above))
  if not above.any():
    return {**out, "c_target": None}
  a, b, m, r0 = (d[k][above] for k in ("A", "B", "C_mid", "R0"))
  c = m / ((a - r0) / (target - r0) - 1.0) ** (1.0 / b)
  lo, med, hi = np.quantile(c, [0.5 - level / 2, 0.5, 0.5 + level / 2])
  return {**out, "c_target": {"lo": float(lo), "median": float(med), "hi": float(hi)}}


def format_advice(a: dict, unit: str = "") -> str:
  """One line: the probability and, when some draws reach it, the predicted compute with its interval."""
  t = a["target"]
  if a["reached"] is not None:
    return f"  target {t:.3f}: reached at C={a['reached']:.4g}{unit}"
  line = f"  target {t:.3f}: P(ceiling > target) = {a['p_reach']:.2f} ({a['source']})"
  if a["c_target"] is not None:
    c = a["c_target"]
    pct = round(100 * a["level"])
    line += (f"; reached at C={c['median']:.4g}{unit} [{c['lo']:.4g}, {c['hi']:.4g}] ({pct} % interval of the "
             "draws that reach it)")
  elif a["p_reach"] == 0.0:
    line += "; no draw of the fit reaches it"
  if a.get("caveat"):
    line += f" (caveat: {a['caveat']})"
  return line
