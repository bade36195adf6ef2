"""Calibration on real runs: does a run's early part predict its end?

  python benchmarks/calibration.py RUN_DIR [RUN_DIR ...] [--x generator_flops] [--fracs 0.25 0.5] [--c-min 0 0.05]
                                   [--variants free/none free/iid free/ou]

For every finished run directory given (a study's runs, the learning-curve runs, any run): fit the held-out pass
rate against compute on the first 25 % and 50 % of its compute (each --fracs value), with the paper's least-squares
procedure and with the NumPyro model (one fit per --variants entry, "R0/wander": R0 fixed to the step-0 evaluation,
"free" with that evaluation one more data point, or "curve" from the curve points alone; wander none, iid or ou,
bayes._observe), and compare with what the run measured at its end:
  * the absolute and signed error of the point prediction of the final pass rate (least squares: the fitted curve;
    NumPyro: the median of the predictive draws);
  * whether the final measurement lies inside the 50 % and 90 % predictive bands: the band of the curve plus one
    evaluation's own noise (least squares: the residual variance; NumPyro: the likelihood's noise, beta-binomial
    from the per-prompt counts the trainer logs, and the wander) plus the model discrepancy beyond the fit
    (curves.Discrepancy), in five modes: none; fitted on all the runs given (in sample); leave one recipe out (a
    run's recipe is its parent directory: its runs are judged with the discrepancy fitted on the other recipes'
    runs, the honest estimate for a recipe not yet run); and the conformal band (the discrepancy plus the scores
    of the runs cut at the same fraction, curves.Discrepancy), in sample and leaving one recipe out;
  * the median width of those bands (a conformal band holds the final value at about its level by construction,
    for exchangeable runs: its width is what the model contributes);
  * whether the fit calls its ceiling identified (`advice.ceiling_status`): a fit that says it is not is counted
    as a refusal, and coverage is also given over the identified fits alone.
Each --c-min value is the early-phase cut as a fraction of the run's last compute (the paper's c_min). Goals (issue
20, over >= 12 runs of >= 3 recipes, 50 % fits): 90 % band covers 85-95 % of runs, 50 % band 40-60 %, median
absolute error <= 0.03. The discrepancy fitted on all runs, with the scores of the 50 % cuts, is what
analysis.DISCREPANCY ships (printed at the end).

Prints a table and writes benchmarks/results/calibration.json (with date, machine, command).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import pathlib
import time
from typing import Optional

import numpy as np
from tqdm.auto import tqdm

from scalerl_jax.scaling import advice
from scalerl_jax.scaling import bayes as bayes_lib
from scalerl_jax.scaling.curves import Discrepancy, logit, logit_sd
from scalerl_jax.scaling.analysis import analyse, discrepancy_mle
from scalerl_jax.scaling.io import DEFAULT_X, load_points
from scalerl_jax.scaling.points import CurveDataError

LEVELS = (0.5, 0.9)


VARIANTS = ("free/none", "free/iid", "free/ou")  # NumPyro: R0 fixed|free / wander (bayes.WANDERS)
NONE = Discrepancy()  # no discrepancy


@dataclasses.dataclass
class Case:
  """One run fitted on one fraction with one c_min by one fitter, with the numbers its rows need."""
  run: str
  group: str  # the run's recipe (its parent directory), for the leave-one-recipe-out discrepancy
  frac: float
  c_min_frac: float
  fitter: str
  final: float
  fit: object  # fit.LsqFit or bayes.BayesFit (discrepancy 0); bands come from dataclasses.replace(fit, ...)
  c_last: float
  distance: float  # ln(C_last / the last fitted C)
  identified: bool
  why_not: str
  n_fit: int
  seconds: float
  extra: dict


def fit_cases(points, group: str, frac: float, c_min_frac: float, *, num_warmup: int, num_samples: int,
              variants=VARIANTS) -> list[Case]:
  """The paper's least-squares fit and one NumPyro fit per variant "R0/wander" of one run (discrepancy 0)."""
  c_last, final = float(points.compute[-1]), float(points.reward[-1])
  cases = []
  for k, variant in enumerate(variants):
    bayes_r0, wander = variant.split("/")
    t0 = time.perf_counter()
    run = analyse(points, fit_upto=frac, c_min=c_min_frac * c_last, bayes=True, bayes_r0=bayes_r0,
                  num_warmup=num_warmup, num_samples=num_samples, wander=wander, discrepancy=NONE)
    identified, why = advice.ceiling_status(run)
    common = dict(run=points.name, group=group, frac=frac, c_min_frac=c_min_frac, final=final, c_last=c_last,
                  distance=float(np.log(c_last / run.window.fit.compute[-1])), identified=identified, why_not=why,
                  n_fit=len(run.window.fit), seconds=time.perf_counter() - t0)
    if k == 0:  # the least-squares fit is the same in all; its ceiling judged from its own estimates
      ok, why_lsq = advice.ceiling_status(dataclasses.replace(run, bayes=None))
      cases.append(Case(fitter="paper", fit=run.lsq, extra={}, **{**common, "identified": ok, "why_not": why_lsq}))
    post = run.bayes
    extra = {"likelihood": post.likelihood, "divergences": post.diagnostics["divergences"],
             **{f"{n}_median": float(np.median(post.samples[n])) for n in ("wander_sigma", "wander_ell")
                if n in post.samples}}
    cases.append(Case(fitter=f"numpyro_{bayes_r0}_r0_{wander}", fit=post, extra=extra, **common))
  return cases


def band(case: Case, level: float, discrepancy=NONE) -> tuple[float, float, float]:
  """(lo, point prediction, hi) of the final measurement: the predictive band at the run's last compute. The point
  prediction: the fitted curve (least squares) or the median of the predictive draws (NumPyro: the curve plus the
  wander conditioned on the fitted points, so a run above its curve is predicted to stay above for a while)."""
  c = np.array([case.c_last])
  fit = dataclasses.replace(case.fit, discrepancy=discrepancy)
  if isinstance(fit, bayes_lib.BayesFit):
    lo, med, hi = (float(v[0]) for v in fit.band(c, level, predictive=True))
    return lo, med, hi
  lo, hi = (float(v[0]) for v in fit.band(c, level, predictive=True))
  return lo, float(fit.params(c)[0]), hi


def error_and_sd(case: Case, discrepancy: Discrepancy = NONE) -> Optional[tuple[float, float]]:
  """On the logit scale: the final measurement's error from the band's median, and the band's sd (from its 90 %
  band, at least 1e-3); None without a band."""
  lo, med, hi = band(case, 0.9, discrepancy)
  if not np.isfinite(lo):
    return None
  return float(logit(case.final) - logit(med)), max(float(logit_sd(lo, hi)), 1e-3)


def fit_discrepancy(cases: list[Case]) -> Discrepancy:
  """Maximum-likelihood discrepancy over cases (analysis.discrepancy_mle), with each fit's own
  predictive sd on the logit scale taken from its 90 % band."""
  rows = [(*e, case.distance) for case in cases if (e := error_and_sd(case)) is not None]
  if not rows:
    return NONE
  err, sd, dist = (np.array(v) for v in zip(*rows))
  return discrepancy_mle(err, sd, dist)


def scores_of(cases: list[Case], discrepancy: Discrepancy) -> tuple:
  """The conformal scores of finished runs (curves.Discrepancy): |logit(final) - logit(prediction)| / the sd of
  the run's predictive band with `discrepancy` (from its 90 % band)."""
  return tuple(sorted(round(abs(e[0]) / e[1], 4) for case in cases
                      if (e := error_and_sd(case, discrepancy)) is not None))


def rows_for(cases: list[Case], discrepancy: Discrepancy, mode: str) -> list[dict]:
  out = []
  for case in cases:
    row = {k: getattr(case, k) for k in ("run", "group", "frac", "c_min_frac", "fitter", "final", "identified",
                                          "why_not", "n_fit", "seconds")}
    row.update(case.extra, mode=mode, discrepancy={**discrepancy.as_dict(), "scores": len(discrepancy.scores)})
    for level in LEVELS:
      lo, _, hi = band(case, level, discrepancy)
      row[f"covered_{round(100 * level)}"] = bool(lo <= case.final <= hi) if np.isfinite(lo) else False
      row[f"width_{round(100 * level)}"] = float(hi - lo) if np.isfinite(lo) else None
    med = band(case, 0.5, NONE)[1]  # one point prediction in every mode (the discrepancy's draws left out)
    row["predicted"], row["abs_err"] = med, abs(med - case.final)
    out.append(row)
  return out


def calibrate(cases: list[Case]) -> tuple[list[dict], dict]:
  """Rows for each (fitter, c_min) in five modes: no discrepancy; the discrepancy fitted on all runs (in
  sample); leave one recipe out (each recipe's runs judged with the discrepancy fitted on the other recipes' runs:
  the honest estimate for a new recipe); and the conformal band (scores of the runs cut at the same fraction)
  in sample and leaving one recipe out. The discrepancy is fitted over all fit fractions together."""
  rows, fitted = [], {}
  by_key: dict = {}
  for c in cases:
    by_key.setdefault((c.fitter, c.c_min_frac), []).append(c)
  for (fitter, c_min), cs in by_key.items():
    k_all = fit_discrepancy(cs)
    key = f"{fitter} c_min={c_min}"
    fitted[key] = {"all": k_all}
    rows += rows_for(cs, NONE, "none") + rows_for(cs, k_all, "fitted")
    for frac in sorted({c.frac for c in cs}):
      at = [c for c in cs if c.frac == frac]
      conf = dataclasses.replace(k_all, scores=scores_of(at, k_all))
      fitted[key][f"conformal frac={frac}"] = conf
      rows += rows_for(at, conf, "conformal")
    for g in sorted({c.group for c in cs}):
      others = [c for c in cs if c.group != g]
      k_g = fit_discrepancy(others)
      fitted[key][f"without {g}"] = k_g
      rows += rows_for([c for c in cs if c.group == g], k_g, "leave-one-recipe-out")
      for frac in sorted({c.frac for c in cs}):
        conf = dataclasses.replace(k_g, scores=scores_of([c for c in others if c.frac == frac], k_g))
        rows += rows_for([c for c in cs if c.group == g and c.frac == frac], conf, "conformal, leave-one-out")
  return rows, fitted


def summarize(rows: list[dict], identified_only: bool = False) -> dict:
  rs = [r for r in rows if r["identified"] or not identified_only]
  if not rs:
    return {"runs": 0}
  return {"runs": len(rs), "median_abs_err": float(np.median([r["abs_err"] for r in rs])),
          "mean_signed_err": float(np.mean([r["predicted"] - r["final"] for r in rs])),
          "covered_50": float(np.mean([r["covered_50"] for r in rs])),
          "covered_90": float(np.mean([r["covered_90"] for r in rs])),
          "median_width_50": float(np.median([r["width_50"] for r in rs if r["width_50"] is not None] or [np.nan])),
          "median_width_90": float(np.median([r["width_90"] for r in rs if r["width_90"] is not None] or [np.nan])),
          "refused": int(sum(not r["identified"] for r in rows)) if not identified_only else None}


def expand(paths) -> list[pathlib.Path]:
  out = []
  for p in paths:
    matches = sorted(glob.glob(p)) or [p]
    out += [pathlib.Path(m) for m in matches]
  return out


def main(argv=None) -> Optional[dict]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("runs", nargs="+", help="run directories (or metrics.jsonl files); shell globs are expanded")
  ap.add_argument("--x", default=DEFAULT_X, help="the compute axis (scaling.io.X_AXES)")
  ap.add_argument("--fracs", type=float, nargs="+", default=[0.25, 0.5])
  ap.add_argument("--c-min", type=float, nargs="+", default=[0.0], help="early-phase cuts, fractions of the run's C")
  ap.add_argument("--variants", nargs="+", default=list(VARIANTS),
                  help="NumPyro variants R0/wander: R0 fixed|free, wander none|iid|ou")
  ap.add_argument("--num-warmup", type=int, default=500)
  ap.add_argument("--num-samples", type=int, default=1000)
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "calibration.json"))
  args = ap.parse_args(argv)
  from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

  cases, skipped = [], {}
  paths = expand(args.runs)
  for path in tqdm(paths, desc="calibration", unit="run"):
    try:
      points = load_points(path, x=args.x)
    except CurveDataError as exc:
      skipped[str(path)] = str(exc)
      continue
    points = dataclasses.replace(points, name=str(path))
    group = path.parent.name if path.is_dir() else path.parent.parent.name
    for frac in args.fracs:
      for c_min in args.c_min:
        try:
          cases += fit_cases(points, group, frac, c_min, num_warmup=args.num_warmup, num_samples=args.num_samples,
                             variants=args.variants)
        except CurveDataError as exc:
          skipped[f"{path} frac={frac} c_min={c_min}"] = str(exc)
  rows, kappas = calibrate(cases)
  groups: dict = {}
  for r in rows:
    groups.setdefault((r["fitter"], r["mode"], r["frac"], r["c_min_frac"]), []).append(r)
  results = []
  print(f"\n{'fitter':<24}{'discrepancy':<26}{'frac':>5}{'c_min':>6}{'runs':>5}{'med|err|':>9}{'bias':>7}"
        f"{'cov50':>7}{'cov90':>7}{'wid90':>7}{'refused':>8}   identified only: {'runs':>4}{'cov50':>7}{'cov90':>7}")
  for (fitter, mode, frac, c_min), rs in sorted(groups.items()):
    a, b = summarize(rs), summarize(rs, identified_only=True)
    results.append({"fitter": fitter, "mode": mode, "frac": frac, "c_min_frac": c_min, "all": a, "identified": b,
                    "groups": len({r["group"] for r in rs})})
    tail = f"{b['runs']:>4}{100 * b['covered_50']:6.0f}%{100 * b['covered_90']:6.0f}%" if b["runs"] else f"{0:>4}"
    print(f"{fitter:<24}{mode:<26}{frac:5.2f}{c_min:6.2f}{a['runs']:>5}{a['median_abs_err']:9.3f}"
          f"{a['mean_signed_err']:+7.3f}{100 * a['covered_50']:6.0f}%{100 * a['covered_90']:6.0f}%"
          f"{a['median_width_90']:7.3f}{a['refused']:>8}"
          f"   {' ' * 18}{tail}")
  print("\ndiscrepancy fitted on all runs (logit scale; what analysis.DISCREPANCY ships, with the conformal scores "
        "of the 50 % cuts):")
  for k, v in kappas.items():
    print(f"  {k}: {v['all']}")
    for name, d in v.items():
      if name.startswith("conformal"):
        print(f"    {name}: scores={d.scores}")
  for k, v in skipped.items():
    print(f"skipped {k}: {v}")
  out = {"config": {**vars(args), "out": os.path.relpath(args.out, pathlib.Path(__file__).parents[1])},
         "goals": {"covered_90": "0.85 .. 0.95", "covered_50": "0.40 .. 0.60", "median_abs_err": "<= 0.03",
                   "runs": ">= 12 of >= 3 recipes, frac 0.5"},
         "discrepancy": {k: {g: v.as_dict() for g, v in d.items()} for k, d in kappas.items()},
         "results": results, "rows": rows, "skipped": skipped}
  save_result(args.out, out)
  return out


if __name__ == "__main__":
  main()
