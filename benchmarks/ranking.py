"""The paper's use of the fits, checked on finished studies: does the first half of compute rank the recipes as
the end does?

  python benchmarks/ranking.py configs/studies/loo_cpu.yaml [configs/studies/addition4_cpu.yaml ...]
                               [--frac 0.5] [--last 5] [--out benchmarks/results/ranking_NAME.json]

For each study (its runs finished by launch/study.py): every recipe is fitted as the study report fits it (the
hierarchical NUTS fit over seeds, scaling/study.py) twice, on the first `--frac` of each run's compute and on all
of it, and compared with what the runs measured:
  * the ranking: Spearman's rho between the recipes' median A from the half fits and (a) from the full fits,
    (b) the measured end (the mean over seeds of each run's last `--last` evaluations: one evaluation's noise,
    about 0.01, would otherwise decide close pairs); and between the half fits' predicted pass rate at the last
    compute and that measured end;
  * the pairs the half fits call resolved (scaling.study.resolved: P(A_i > A_j) >= 0.9 with both ceilings
    identified, or the lower identified and the intervals apart): how many came out that way at the end (the
    full fits' P(A_i > A_j) >= 0.5 on the same side, and the measured end on the same side);
  * crossovers: for each pair the half fits say cross within the measured compute range (in >= half of the
    draws), the predicted crossing compute against the observed one (the first sign change of the difference of
    the two recipes' seed-mean curves, each smoothed over `--last` evaluations, past the fit cut).
Prints the tables and writes benchmarks/results/ranking.json (with date, machine, command).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from typing import Optional

import numpy as np
from scipy.stats import spearmanr

from scalerl_jax.scaling import study as study_lib
from scalerl_jax.scaling.curves import sigmoid_curve
from scalerl_jax.scaling.io import load_points

GAP = 0.02  # the paper's margin on A: pairs that end closer than this have no crossing to observe


def recipe_points(spec) -> dict:
  """recipe -> [CurvePoints per finished seed]."""
  out = {}
  for name in spec.recipes:
    done = [r for r in spec.plan() if r.recipe == name and study_lib.run_finished(r, spec.steps)]
    if done:
      out[name] = [dataclasses.replace(load_points(r.run_dir, x=spec.fit["x"]), name=f"{name}/seed{r.seed}")
                   for r in done]
  return out


def measured_end(points, last: int) -> float:
  return float(np.mean([np.mean(p.reward[-last:]) for p in points]))


def mean_curve(points, last: int) -> tuple[np.ndarray, np.ndarray]:
  """The seeds' mean pass rate on the first seed's computes (the seeds share them: one compute per step), smoothed by
  a running mean over `last` evaluations."""
  n = min(len(p) for p in points)
  c = points[0].compute[:n]
  r = np.mean([p.reward[:n] for p in points], axis=0)
  kernel = np.ones(last) / last
  return c[last - 1:], np.convolve(r, kernel, mode="valid")


def observed_crossing(p1, p2, c_from: float, last: int) -> Optional[float]:
  c, r1 = mean_curve(p1, last)
  _, r2 = mean_curve(p2, last)
  n = min(len(r1), len(r2))
  c, diff = c[:n], (r1 - r2)[:n]
  keep = c >= c_from
  c, diff = c[keep], diff[keep]
  change = np.flatnonzero(np.sign(diff[:-1]) * np.sign(diff[1:]) < 0)
  return float(np.sqrt(c[change[0]] * c[change[0] + 1])) if change.size else None


def check_study(path: str, frac: float, last: int, num_warmup: int, num_samples: int) -> dict:
  spec = study_lib.load_study(path)
  pts = recipe_points(spec)
  if len(pts) < 2:
    raise SystemExit(f"ranking.py: {path}: fewer than two recipes have finished runs")
  fits = {}
  for label, upto in (("half", frac), ("full", 1.0)):
    fs = [study_lib.fit_recipe(name, p, {**spec.fit, "fit_upto": upto}, num_warmup=num_warmup,
                               num_samples=num_samples) for name, p in pts.items()]
    rows = study_lib.recipe_table(fs, spec.fit["level"])
    pairs = [{**pair, "resolved": study_lib.resolved(pair, rows)} for pair in study_lib.compare_recipes(fs)]
    fits[label] = {"fits": fs, "rows": {r["recipe"]: r for r in rows}, "pairs": pairs}
  names = list(pts)
  end = {n: measured_end(pts[n], last) for n in names}
  c_last = {n: float(np.mean([p.compute[-1] for p in pts[n]])) for n in names}
  a_half = {n: fits["half"]["rows"][n]["A"]["median"] for n in names}
  a_full = {n: fits["full"]["rows"][n]["A"]["median"] for n in names}
  pred_end = {}
  for f in fits["half"]["fits"]:
    d = f.draws()
    pred_end[f.name] = float(np.median(sigmoid_curve(c_last[f.name], d["A"], d["B"], d["C_mid"], d["R0"])))
  rho = lambda x, y: float(spearmanr([x[n] for n in names], [y[n] for n in names]).statistic)  # noqa: E731
  table = [{"recipe": n, "A_half": a_half[n], "A_half_interval": [fits["half"]["rows"][n]["A"]["lo"],
                                                                   fits["half"]["rows"][n]["A"]["hi"]],
            "identified_half": fits["half"]["rows"][n]["ceiling_identified"], "A_full": a_full[n],
            "predicted_end": pred_end[n], "measured_end": end[n]} for n in names]
  full_p = {tuple(p["recipes"]): p["p_A1_greater"] for p in fits["full"]["pairs"]}
  pairs, crossings = [], []
  cut = {n: frac * c_last[n] for n in names}
  for p in fits["half"]["pairs"]:
    a, b = p["recipes"]
    higher_half = a if p["p_A1_greater"] > 0.5 else b
    row = {"recipes": [a, b], "p_A1_greater_half": p["p_A1_greater"], "resolved_half": p["resolved"],
           "higher_half": higher_half, "p_A1_greater_full": full_p[(a, b)],
           "higher_full": a if full_p[(a, b)] > 0.5 else b, "higher_measured": a if end[a] > end[b] else b,
           "measured_gap": abs(end[a] - end[b])}
    pairs.append(row)
    cross = p["crossover"]
    if cross.get("p_cross_in_range", 0) >= 0.5 and "median" in cross and cross["median"] <= max(c_last[a], c_last[b]):
      crossings.append({"recipes": [a, b], "predicted": cross["median"], "interval": [cross["lo"], cross["hi"]],
                        "p_cross": cross["p_cross_in_range"], "measured_gap": abs(end[a] - end[b]),
                        "observed": observed_crossing(pts[a], pts[b], max(cut[a], cut[b]), last)})
  resolved = [r for r in pairs if r["resolved_half"].startswith("yes")]
  out = {"study": spec.name, "frac": frac, "last": last, "recipes": table, "pairs": pairs, "crossings": crossings,
         "spearman": {"A_half vs A_full": rho(a_half, a_full), "A_half vs measured end": rho(a_half, end),
                      "predicted end vs measured end": rho(pred_end, end)},
         "resolved_half": {"pairs": len(resolved), "of": len(pairs),
                           "same_side_full_fit": sum(r["higher_half"] == r["higher_full"] for r in resolved),
                           "same_side_measured": sum(r["higher_half"] == r["higher_measured"] for r in resolved)},
         "all_pairs_same_side_measured": sum(r["higher_half"] == r["higher_measured"] for r in pairs)}
  return out


def print_study(r: dict) -> None:
  print(f"\n== {r['study']}: fits on the first {100 * r['frac']:.0f} % of compute against the end "
        f"(measured: the last {r['last']} evaluations, mean over seeds)")
  print(f"{'recipe':<14}{'A half [90 %]':>26}{'ident.':>7}{'A full':>8}{'pred. end':>10}{'meas. end':>10}")
  for t in sorted(r["recipes"], key=lambda t: -t["measured_end"]):
    lo, hi = t["A_half_interval"]
    print(f"{t['recipe']:<14}{t['A_half']:>10.3f} [{lo:.3f}, {hi:.3f}]{'yes' if t['identified_half'] else 'no':>7}"
          f"{t['A_full']:>8.3f}{t['predicted_end']:>10.3f}{t['measured_end']:>10.3f}")
  print("Spearman: " + ", ".join(f"{k} {v:+.2f}" for k, v in r["spearman"].items()))
  rs = r["resolved_half"]
  print(f"pairs resolved from the half (P >= 0.9, ceilings identified): {rs['pairs']} of {rs['of']}; the same side "
        f"in the full fits {rs['same_side_full_fit']}, in the measured end {rs['same_side_measured']}; all pairs on "
        f"the measured end's side: {r['all_pairs_same_side_measured']} of {rs['of']}")
  for c in r["crossings"]:
    obs = f"{c['observed']:.3g}" if c["observed"] else "none observed"
    if c.get("measured_gap", 1.0) < GAP:
      obs += f" (the two end {c['measured_gap']:.3f} apart, within {GAP}: a crossing of curves this close is noise)"
    print(f"crossover {c['recipes'][0]} / {c['recipes'][1]}: predicted {c['predicted']:.3g} "
          f"[{c['interval'][0]:.3g}, {c['interval'][1]:.3g}] (P {c['p_cross']:.2f}), observed {obs}")


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("studies", nargs="+", help="study YAML files whose runs have finished")
  ap.add_argument("--frac", type=float, default=0.5)
  ap.add_argument("--last", type=int, default=5)
  ap.add_argument("--num-warmup", type=int, default=500)
  ap.add_argument("--num-samples", type=int, default=1000)
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "ranking.json"))
  args = ap.parse_args(argv)
  from record import save_result  # benchmarks/record.py

  results = [check_study(s, args.frac, args.last, args.num_warmup, args.num_samples) for s in args.studies]
  for r in results:
    print_study(r)
  save_result(args.out, {"studies": results})
  return {"studies": results}


if __name__ == "__main__":
  main()
