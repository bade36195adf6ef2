"""Calibration on real runs: does a run's early part predict its end?

  python benchmarks/calibration.py RUN_DIR [RUN_DIR ...] [--fracs 0.25 0.5] [--c-min 0 0.05]

For every finished run directory given (a study's runs, the learning-curve runs, any run): fit the held-out pass
rate against compute on the first 25 % and 50 % of its compute (each --fracs value), with the paper's least-squares
procedure and with the NumPyro model, and compare with what the run measured at its end:
  * the absolute error of the predicted final pass rate (least squares: the fitted curve; NumPyro: the posterior
    median of the mean curve);
  * whether the final measurement lies inside the 50 % and 90 % predictive bands (the band of the curve plus one
    evaluation's own noise: least squares adds the residual variance, NumPyro draws the likelihood's noise:
    beta-binomial from the per-prompt counts the trainer logs);
  * whether the fit calls its ceiling identified (`advice.ceiling_status`): a fit that says it is not is counted
    as a refusal, and the numbers are given over all fits and over the identified ones.
Each --c-min value is the early-phase cut as a fraction of the run's last compute (the paper's c_min). NumPyro
runs twice: with R0 fixed to the step-0 evaluation and with R0 a parameter (that evaluation one more data point). Goals (issue 20, over >= 12 runs of >= 3 recipes, 50 % fits): 90 % band
covers 85-95 % of runs, 50 % band 40-60 %, median absolute error <= 0.03.

Prints a table and writes benchmarks/results/calibration.json (with date, machine, command).
"""

from __future__ import annotations

import argparse
import glob
import os
import pathlib
import time
from typing import Optional

import numpy as np

from scalerl_jax.scaling import advice
from scalerl_jax.scaling.analysis import analyse
from scalerl_jax.scaling.io import load_points
from scalerl_jax.scaling.points import CurveDataError

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

LEVELS = (0.5, 0.9)


def evaluate_run(points, frac: float, c_min_frac: float, *, num_warmup: int = 500, num_samples: int = 1000,
                 eval_noise: bool = False) -> list[dict]:
  """One row per fitter for one run, fit fraction and c_min: "paper" (least squares, R0 fixed), "numpyro_fixed_r0"
  and "numpyro_free_r0" (R0 a parameter with the step-0 evaluation as data); with `eval_noise` also
  "numpyro_free_r0_noise" (plus a fitted per-evaluation noise scale)."""
  c_last, final = float(points.compute[-1]), float(points.reward[-1])
  c = np.array([c_last])
  rows = []
  for bayes_r0, noise in [("fixed", False), ("free", False)] + ([("free", True)] if eval_noise else []):
    t0 = time.perf_counter()
    run = analyse(points, fit_upto=frac, c_min=c_min_frac * c_last, bayes=True, bayes_r0=bayes_r0,
                  num_warmup=num_warmup, num_samples=num_samples, eval_noise=noise)
    identified, why = advice.ceiling_status(run)
    common = {"run": points.name, "frac": frac, "c_min_frac": c_min_frac, "final": final, "identified": identified,
              "why_not": why, "n_fit": len(run.window.fit), "seconds": time.perf_counter() - t0}
    if bayes_r0 == "fixed":  # the least-squares fit is the same in all
      pred = float(run.lsq.params(c_last))
      row = {**common, "fitter": "paper", "predicted": pred, "abs_err": abs(pred - final)}
      for level in LEVELS:
        lo, hi = (float(v[0]) for v in run.lsq.band(c, level, predictive=True))
        row[f"covered_{round(100 * level)}"] = bool(lo <= final <= hi) if np.isfinite(lo) else False
      rows.append(row)
    post = run.bayes
    med = float(post.band(c, 0.9)[1][0])
    row = {**common, "fitter": f"numpyro_{bayes_r0}_r0" + ("_noise" if noise else ""), "predicted": med,
           "abs_err": abs(med - final),
           "likelihood": post.likelihood, "divergences": post.diagnostics["divergences"]}
    for level in LEVELS:
      lo, _, hi = (float(v[0]) for v in post.band(c, level, predictive=True))
      row[f"covered_{round(100 * level)}"] = bool(lo <= final <= hi)
    rows.append(row)
  return rows


def summarize(rows: list[dict], identified_only: bool = False) -> dict:
  rs = [r for r in rows if r["identified"] or not identified_only]
  if not rs:
    return {"runs": 0}
  return {"runs": len(rs), "median_abs_err": float(np.median([r["abs_err"] for r in rs])),
          "covered_50": float(np.mean([r["covered_50"] for r in rs])),
          "covered_90": float(np.mean([r["covered_90"] for r in rs])),
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
  ap.add_argument("--x", default="accelerator_seconds", help="the compute axis")
  ap.add_argument("--fracs", type=float, nargs="+", default=[0.25, 0.5])
  ap.add_argument("--c-min", type=float, nargs="+", default=[0.0], help="early-phase cuts, fractions of the run's C")
  ap.add_argument("--eval-noise", action="store_true", help="also NumPyro with a fitted per-evaluation noise scale")
  ap.add_argument("--num-warmup", type=int, default=500)
  ap.add_argument("--num-samples", type=int, default=1000)
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "calibration.json"))
  args = ap.parse_args(argv)
  rows, skipped = [], {}
  for path in expand(args.runs):
    try:
      points = load_points(path, x=args.x)
    except CurveDataError as exc:
      skipped[str(path)] = str(exc)
      continue
    points = type(points)(**{**points.__dict__, "name": str(path)})
    for frac in args.fracs:
      for c_min in args.c_min:
        try:
          rows += evaluate_run(points, frac, c_min, num_warmup=args.num_warmup, num_samples=args.num_samples,
                               eval_noise=args.eval_noise)
        except CurveDataError as exc:
          skipped[f"{path} frac={frac} c_min={c_min}"] = str(exc)
    print(f"  {path}: done", flush=True)
  groups: dict = {}
  for r in rows:
    groups.setdefault((r["fitter"], r["frac"], r["c_min_frac"]), []).append(r)
  results = []
  print(f"\n{'fitter':<18}{'frac':>5}{'c_min':>6}{'runs':>5}{'med|err|':>9}{'cov50':>7}{'cov90':>7}{'refused':>8}"
        f"   identified only: {'runs':>4}{'med|err|':>9}{'cov50':>7}{'cov90':>7}")
  for (fitter, frac, c_min), rs in sorted(groups.items()):
    a, b = summarize(rs), summarize(rs, identified_only=True)
    results.append({"fitter": fitter, "frac": frac, "c_min_frac": c_min, "all": a, "identified": b})
    tail = (f"{b['runs']:>4}{b['median_abs_err']:9.3f}{100 * b['covered_50']:6.0f}%{100 * b['covered_90']:6.0f}%"
            if b["runs"] else f"{0:>4}")
    print(f"{fitter:<18}{frac:5.2f}{c_min:6.2f}{a['runs']:>5}{a['median_abs_err']:9.3f}{100 * a['covered_50']:6.0f}%"
          f"{100 * a['covered_90']:6.0f}%{a['refused']:>8}   {' ' * 18}{tail}")
  for k, v in skipped.items():
    print(f"skipped {k}: {v}")
  out = {"config": {**vars(args), "out": os.path.relpath(args.out, pathlib.Path(__file__).parents[1])},
         "goals": {"covered_90": "0.85 .. 0.95", "covered_50": "0.40 .. 0.60", "median_abs_err": "<= 0.03",
                   "runs": ">= 12 of >= 3 recipes, frac 0.5"},
         "results": results, "rows": rows, "skipped": skipped}
  save_result(args.out, out)
  return out


if __name__ == "__main__":
  main()
