"""Curve-fit quality: how well each fitter predicts a run's ceiling and final reward from its first half.

  python benchmarks/curve_fit_quality.py [--runs 200] [--bayes-runs 200] [--seed 0]

Synthetic runs around the paper's Table 1: A ~ U(0.55, 0.72), B ~ U(1.0, 2.5), C_mid ~ U(1.5k, 11k) GPU-hours,
R0 ~ U(0.20, 0.40). A run lasts C_max = r * C_mid with r log-uniform in [4, 12] (the paper's runs end at 4-12x
their C_mid: ScaleRL 16k / 2542, bs2048 100k / 10909, Scout 50k / 4242) over T ~ U{4000..8000} steps, evaluated
every 100 steps on 1000 prompts x 16 samples (n_correct ~ Binomial(16000, R(C))). Every fitter sees the points with
C <= C_max / 2 (c_min = 0: the synthetic curves are sigmoids from the start) and R0 from the step-0 evaluation.

Per fitter: the fraction of runs with |A_hat - A| <= 0.02; with |R_hat(C_max) - R(C_max)| <= 0.02 (the truth is
the noiseless curve); and the coverage of R(C_max) by the 90 % band of the mean curve (least squares: delta
method; NUTS: posterior). For NUTS also the coverage of the measured final pass rate by the 90 % predictive band,
and of the true A and the true B by their 90 % posterior intervals. nuts_binomial_free_r0 fits R0 too (the step-0
evaluation is one more binomial point) instead of fixing it to that evaluation's noisy value.
Goals: >= 90 %, >= 90 %, coverage in [85 %, 95 %]; one NUTS fit <= 10 s on 2 cores.
Writes benchmarks/results/curve_fit_quality.json (with date, machine and command).
"""

import argparse
import os
import pathlib
import time

import numpy as np

from scalerl_jax.scaling import bayes, fit, synthetic
from scalerl_jax.scaling.analysis import join_points
from scalerl_jax.scaling.curves import SigmoidParams
from scalerl_jax.scaling.points import split

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

FITTERS = ("paper", "free", "power_law", "nuts_binomial", "nuts_gaussian", "nuts_binomial_free_r0")


def draw_run(rng: np.random.Generator, i: int):
  truth = SigmoidParams(A=rng.uniform(0.55, 0.72), B=rng.uniform(1.0, 2.5), C_mid=rng.uniform(1500.0, 11000.0),
                        R0=rng.uniform(0.20, 0.40))
  c_max = truth.C_mid * np.exp(rng.uniform(np.log(4.0), np.log(12.0)))
  n_evals = int(rng.integers(40, 81))  # T / 100 steps
  return truth, synthetic.synthetic_run(truth, c_max, n_evals=n_evals, seed=int(rng.integers(2**31)), name=f"run{i}")


def fit_one(name: str, w, nuts: dict):
  """(A_hat, R_hat(C_max), mean band (lo, hi) or None, predictive band or None, seconds, 90 % intervals
  {"A": (lo, hi), "B": (lo, hi)} or None)."""
  c, r, c_last = w.fit.compute, w.fit.reward, float(w.held_out.compute[-1])
  t = time.perf_counter()
  if name == "power_law":
    p = fit.fit_power_law(c, r).params
    return p.A, float(p(c_last)), None, None, time.perf_counter() - t, None
  if name in ("paper", "free"):
    f = fit.fit_paper(c, r, w.r0) if name == "paper" else fit.fit_free(c, r, w.r0)
    lo, hi = f.band(np.array([c_last]))
    return f.params.A, float(f.params(c_last)), (lo[0], hi[0]), None, time.perf_counter() - t, None
  if name == "nuts_binomial_free_r0":  # R0 a parameter, the step-0 evaluation one more data point
    post = bayes.fit_bayes(join_points(w.start, w.fit), 0.0, likelihood="binomial", fit_r0=True, **nuts)
  else:
    points = w.fit if name == "nuts_binomial" else type(w.fit)(w.fit.compute, w.fit.reward)  # no counts: gaussian
    post = bayes.fit_bayes(points, w.r0, likelihood=name.split("_")[1], **nuts)
  seconds = time.perf_counter() - t
  lo, med, hi = post.band(np.array([c_last]))
  plo, _, phi = post.band(np.array([c_last]), predictive=True)
  intervals = {k: tuple(post.quantiles(k, (0.05, 0.95)).values()) for k in ("A", "B")}
  return post.quantiles("A")["q50"], float(med[0]), (lo[0], hi[0]), (plo[0], phi[0]), seconds, intervals


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--runs", type=int, default=200)
  ap.add_argument("--bayes-runs", type=int, default=200, help="NUTS on the first this many runs (it is slower)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--num-warmup", type=int, default=500)
  ap.add_argument("--num-samples", type=int, default=1000)
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "curve_fit_quality.json"))
  args = ap.parse_args(argv)
  rng = np.random.default_rng(args.seed)
  nuts = dict(num_warmup=args.num_warmup, num_samples=args.num_samples)
  rows = {k: [] for k in FITTERS}
  for i in range(args.runs):
    truth, pts = draw_run(rng, i)
    w = split(pts, fit_upto=0.5)
    final_true, final_measured = float(truth(pts.compute[-1])), float(pts.reward[-1])
    for name in FITTERS:
      if name.startswith("nuts") and i >= args.bayes_runs:
        continue
      a_hat, r_hat, band, pred, seconds, intervals = fit_one(name, w, nuts)
      rows[name].append(dict(a_err=a_hat - truth.A, r_err=r_hat - final_true, seconds=seconds,
                             covered=None if band is None else bool(band[0] <= final_true <= band[1]),
                             pred_covered=None if pred is None else bool(pred[0] <= final_measured <= pred[1]),
                             a_covered=None if intervals is None else bool(
                                 intervals["A"][0] <= truth.A <= intervals["A"][1]),
                             b_covered=None if intervals is None else bool(
                                 intervals["B"][0] <= truth.B <= intervals["B"][1])))
    if (i + 1) % 20 == 0:
      print(f"  {i + 1}/{args.runs} runs", flush=True)
  results = {}
  for name, rs in rows.items():
    if not rs:  # e.g. the NUTS fitters with --bayes-runs 0
      continue
    frac = lambda key, ok: float(np.mean([ok(r[key]) for r in rs])) if rs and rs[0][key] is not None else None  # noqa: E731
    sec = np.array([r["seconds"] for r in rs])
    results[name] = {"runs": len(rs), "A_within_0.02": frac("a_err", lambda e: abs(e) <= 0.02),
                     "final_within_0.02": frac("r_err", lambda e: abs(e) <= 0.02),
                     "band90_covers_final": frac("covered", bool), "predictive90_covers_measured": frac("pred_covered", bool),
                     "A90_covers_true": frac("a_covered", bool), "B90_covers_true": frac("b_covered", bool),
                     "median_abs_A_err": float(np.median([abs(r["a_err"]) for r in rs])),
                     "median_abs_final_err": float(np.median([abs(r["r_err"]) for r in rs])),
                     "seconds_median": float(np.median(sec)), "seconds_max": float(np.max(sec))}
  pct = lambda v: "   -  " if v is None else f"{100 * v:5.1f}%"  # noqa: E731
  print(f"\n{'fitter':<22}{'runs':>5} {'|dA|<=.02':>10} {'|dR|<=.02':>10} {'band90 cov':>11} {'pred90 cov':>11}"
        f" {'A90 cov':>8} {'B90 cov':>8} {'med|dA|':>8} {'s/fit med':>10} {'s/fit max':>10}")
  for name, v in results.items():
    print(f"{name:<22}{v['runs']:>5} {pct(v['A_within_0.02']):>10} {pct(v['final_within_0.02']):>10}"
          f" {pct(v['band90_covers_final']):>11} {pct(v['predictive90_covers_measured']):>11}"
          f" {pct(v['A90_covers_true']):>8} {pct(v['B90_covers_true']):>8}"
          f" {v['median_abs_A_err']:8.4f} {v['seconds_median']:10.3f} {v['seconds_max']:10.2f}")
  print("(s/fit max of a NUTS fitter includes its XLA compilations: one per padded length)")
  save_result(args.out, {
      "config": {**vars(args), "out": os.path.relpath(args.out, pathlib.Path(__file__).parents[1])},
      "goals": {"A_within_0.02": ">= 0.90", "final_within_0.02": ">= 0.90", "band90_covers_final": "0.85 .. 0.95",
                "A90_covers_true": "0.85 .. 0.95", "B90_covers_true": "0.85 .. 0.95",
                "nuts_seconds": "<= 10"},
      "results": results})


if __name__ == "__main__":
  main()
