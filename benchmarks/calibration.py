"""Calibration on real runs: does a run's early part predict its end?

  python benchmarks/calibration.py RUN_DIR [RUN_DIR ...] [--x generator_flops] [--fracs 0.25 0.5] [--c-min 0 0.05]
                                   [--variants free/none free/iid free/ou] [--prior] [--passk K ...]
                                   [--write-calibration FILE [--use-prior]]

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
  * whether the fit calls its ceiling identified (its own verdict, `advice.lsq_ceiling_status` or
    `posterior_ceiling_status`): a fit that says it is not is counted as a refusal, and coverage is also given
    over the identified fits alone.
Each --c-min value is the early-phase cut as a fraction of the run's last compute (the paper's c_min). Goals (issue
20, over >= 12 runs of >= 3 recipes, 50 % fits): 90 % band covers 85-95 % of runs, 50 % band 40-60 %, median
absolute error <= 0.03. The discrepancy fitted on all runs, with the scores of the 50 % cuts, is what a
calibration file holds (printed at the end).

Runs of more than one study (a run's study: its recipe directory's parent, e.g. runs/study_cpu/<recipe>/seed0)
are also judged across studies: "transfer" calibrates each study's runs on the other studies' runs alone,
"transfer, scores refitted" takes the other studies' discrepancy with the same study's conformal scores.
--prior also fits the first variant with a shape prior (prior.CurvePrior) learned from the whole-run fits of the
same study's other recipes ("+prior_within") and of the other studies ("+prior_transfer"); --passk K with A
bounded by the step-0 evaluation's pass@K ("+passkK"), and prints how often that bound held the final value.
--train-trend also fits the first variant on the held-out points together with the training pass rate
("+train": train/pass_rate over the whole step batch, prompts_per_step x samples_per_prompt rollouts a step, pooled
in windows of --train-window steps, each a point with its counts, up to the cut): ten times as many points,
sampled on the training prompts rather than the held-out ones.
--write-calibration FILE writes the calibration file the fit reads (scaling/calibration.py: the discrepancy and
the conformal scores of every cut of --calibration-fitter and the paper's fitter, and the prior learned from every
whole run), the one command that refits the bands on a new task's finished runs.

Prints a table and writes benchmarks/results/calibration.json (with date, machine, command).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import pathlib
import sys
import time
from typing import Optional

import numpy as np
import yaml
from tqdm.auto import tqdm

from scalerl_jax.scaling import advice
from scalerl_jax.scaling import bayes as bayes_lib
from scalerl_jax.scaling import prior as prior_lib
from scalerl_jax.scaling.calibration import Calibration, save as save_calibration
from scalerl_jax.scaling.curves import Discrepancy, logit, logit_sd
from scalerl_jax.scaling.analysis import analyse, discrepancy_mle
from scalerl_jax.scaling.io import DEFAULT_X, X_AXES, load_points
from scalerl_jax.scaling.points import CurveDataError, CurvePoints

LEVELS = (0.5, 0.9)


VARIANTS = ("free/none", "free/iid", "free/ou")  # NumPyro: R0 fixed|free / wander (bayes.WANDERS)
NONE = Discrepancy()  # no discrepancy


@dataclasses.dataclass
class Case:
  """One run fitted on one fraction with one c_min by one fitter, with the numbers its rows need."""
  run: str
  group: str  # the run's recipe (its parent directory), for the leave-one-recipe-out discrepancy
  task: str  # the run's study (its recipe's parent directory): transfer is judged across tasks
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


GENERIC = Calibration("no calibration", {"paper": NONE, "numpyro": NONE})  # bands without any discrepancy


def training_rate(run_dir: pathlib.Path, x: str, window: int) -> Optional[CurvePoints]:
  """The run's training pass rate as curve points: train/pass_rate of every step (all prompts_per_step x
  samples_per_prompt rollouts of the step batch, read from the run's config.yaml) pooled over `window` consecutive
  steps, at the windows' mean compute; None when it logged none or fewer than `window` steps."""
  key, factor = X_AXES[x]
  cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
  per_step = int(cfg["data"]["prompts_per_step"]) * int(cfg["data"]["samples_per_prompt"])
  rows = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
          if "train/pass_rate" in r and key in r and r.get("step")]
  if not rows:
    return None
  steps = np.array([r["step"] for r in rows])
  rate = np.array([r["train/pass_rate"] for r in rows])
  comp = np.array([r[key] for r in rows], float) * factor
  pts = []
  for end in range(window, int(steps.max()) + 1, window):
    sel = (steps > end - window) & (steps <= end)
    if sel.any():
      n = per_step * int(sel.sum())
      pts.append((comp[sel].mean(), rate[sel].mean(), round(rate[sel].mean() * n), n))
  if not pts:
    return None
  c, r, k, n = (np.array(v) for v in zip(*pts))
  return CurvePoints(c, r, k.astype(np.int64), n.astype(np.int64), name=f"{run_dir} [training pass rate]", x_axis=x)


def with_training(points: CurvePoints, train: CurvePoints, c_cut: float) -> CurvePoints:
  """The held-out points with the training-rate points up to `c_cut` merged in by compute (the counts of both; the
  held-out points' per-prompt counts dropped: the training points have none)."""
  keep = train.compute <= c_cut
  compute = np.concatenate([points.compute, train.compute[keep]])
  order = np.argsort(compute, kind="stable")
  merged = lambda a, b: np.concatenate([a, b[keep]])[order]  # noqa: E731
  return CurvePoints(compute[order], merged(points.reward, train.reward), merged(points.n_correct, train.n_correct),
                     merged(points.n_total, train.n_total), name=points.name, x_axis=points.x_axis,
                     c_per_step=points.c_per_step)


def fit_cases(points, group: str, task: str, frac: float, c_min_frac: float, *, num_warmup: int, num_samples: int,
              variants=VARIANTS, priors: Optional[dict] = None, a_max: Optional[dict] = None,
              train: Optional[CurvePoints] = None) -> list[Case]:
  """The paper's least-squares fit and one NumPyro fit per variant "R0/wander" of one run (discrepancy 0); with
  `priors` ({name: prior.CurvePrior}) also the first variant with each learned shape prior (fitter suffix
  "+prior_<name>"), with `a_max` ({name: bound}) with each bound on A ("+<name>"), with `train` (training_rate) on
  the held-out and training points together ("+train")."""
  c_last, final = float(points.compute[-1]), float(points.reward[-1])
  cases = []
  extra_fits = [(variants[0], f"+prior_{n}", dict(prior=p)) for n, p in (priors or {}).items()]
  extra_fits += [(variants[0], f"+{n}", dict(a_max=b)) for n, b in (a_max or {}).items() if b is not None]
  if train is not None:
    extra_fits.append((variants[0], "+train", dict(points=with_training(points, train, frac * c_last))))
  for k, (variant, suffix, kw) in enumerate([(v, "", {}) for v in variants] + extra_fits):
    bayes_r0, wander = variant.split("/")
    t0 = time.perf_counter()
    # (+train's merged points end where the run does: the same cut)
    run = analyse(**{"points": points, **kw}, fit_upto=frac, c_min=c_min_frac * c_last, bayes=True,
                  bayes_r0=bayes_r0, num_warmup=num_warmup, num_samples=num_samples, wander=wander,
                  calibration=GENERIC)
    identified, why = advice.posterior_ceiling_status(run)
    common = dict(run=points.name, group=group, task=task, frac=frac, c_min_frac=c_min_frac, final=final,
                  c_last=c_last, distance=float(np.log(c_last / run.window.fit.compute[-1])), identified=identified,
                  why_not=why, n_fit=len(run.window.fit), seconds=time.perf_counter() - t0)
    if k == 0:  # the least-squares fit is the same in all; its ceiling judged from its own estimates
      ok, why_lsq = advice.lsq_ceiling_status(run)
      cases.append(Case(fitter="paper", fit=run.lsq, extra={}, **{**common, "identified": ok, "why_not": why_lsq}))
    post = run.bayes
    extra = {"likelihood": post.likelihood, "divergences": post.diagnostics["divergences"],
             **{f"{n}_median": float(np.median(post.samples[n])) for n in ("wander_sigma", "wander_ell")
                if n in post.samples}}
    cases.append(Case(fitter=f"numpyro_{bayes_r0}_r0_{wander}{suffix}", fit=post, extra=extra, **common))
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
    row = {k: getattr(case, k) for k in ("run", "group", "task", "frac", "c_min_frac", "fitter", "final",
                                          "identified", "why_not", "n_fit", "seconds")}
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
  """Rows for each (fitter, c_min) in these modes: no discrepancy; the discrepancy fitted on all runs (in sample);
  leave one recipe out (each recipe's runs judged with the discrepancy fitted on the other recipes' runs of the
  same task: the honest estimate for a new recipe); the conformal band (scores of the runs cut at the same
  fraction) in sample and leaving one recipe out; and with runs of more than one task, transfer: each task's runs
  judged with the discrepancy and scores of the other tasks' runs alone ("transfer"), or with the other tasks'
  discrepancy and the scores of the same task's other recipes ("transfer, scores refitted"). The discrepancy is
  fitted over all fit fractions together."""
  rows, fitted = [], {}
  by_key: dict = {}
  for c in cases:
    by_key.setdefault((c.fitter, c.c_min_frac), []).append(c)
  fracs = sorted({c.frac for c in cases})
  tasks = sorted({c.task for c in cases})

  def conformal(judged, calib, disc, mode, keep=None):
    """Rows of `judged` with `disc` made conformal by `calib`'s scores at each cut (into `keep`, by cut)."""
    out = []
    for frac in fracs:
      conf = dataclasses.replace(disc, scores=scores_of([c for c in calib if c.frac == frac], disc))
      if keep is not None:
        keep[f"conformal frac={frac}"] = conf
      out += rows_for([c for c in judged if c.frac == frac], conf, mode)
    return out

  for (fitter, c_min), cs in by_key.items():
    k_all = fit_discrepancy(cs)
    key = f"{fitter} c_min={c_min}"
    fitted[key] = {"all": k_all}
    rows += (rows_for(cs, NONE, "none") + rows_for(cs, k_all, "fitted")
             + conformal(cs, cs, k_all, "conformal", keep=fitted[key]))
    for task in tasks:
      mine = [c for c in cs if c.task == task]
      for g in sorted({c.group for c in mine}):
        others = [c for c in mine if c.group != g]
        k_g = fit_discrepancy(others)
        fitted[key][f"without {task}/{g}"] = k_g
        judged = [c for c in mine if c.group == g]
        rows += rows_for(judged, k_g, "leave-one-recipe-out")
        rows += conformal(judged, others, k_g, "conformal, leave-one-out")
      if len(tasks) > 1:
        elsewhere = [c for c in cs if c.task != task]
        k_t = fit_discrepancy(elsewhere)
        fitted[key][f"without task {task}"] = k_t
        rows += rows_for(mine, k_t, "transfer, parametric") + conformal(mine, elsewhere, k_t, "transfer")
        for g in sorted({c.group for c in mine}):
          rows += conformal([c for c in mine if c.group == g], [c for c in mine if c.group != g], k_t,
                            "transfer, scores refitted")
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


def whole_run_fits(runs: dict, *, num_warmup: int, num_samples: int) -> dict:
  """The NumPyro fit of each whole run (generic priors, no discrepancy): what the learned shape priors are
  learned from. runs: path -> (points, group, task)."""
  out = {}
  for path, (points, _, _) in tqdm(runs.items(), desc="whole-run fits", unit="run"):
    if points.c_per_step:
      out[path] = analyse(points, fit_upto=1.0, bayes=True, num_warmup=num_warmup, num_samples=num_samples,
                          calibration=GENERIC).bayes
  return out


def learned_priors(path: str, runs: dict, whole: dict) -> dict:
  """The shape priors a run is fitted with in the measurement, never learned from its own recipe: "within", from
  the other recipes of its task; "transfer", from the other tasks' runs."""
  _, group, task = runs[path]

  def learn(keep, name):
    chosen = [p for p in whole if keep(runs[p])]
    if len(chosen) < 2:
      return None
    return prior_lib.prior_from_fits([whole[p] for p in chosen], [runs[p][0].c_per_step for p in chosen], name)

  out = {"within": learn(lambda r: r[2] == task and r[1] != group, f"{task} without {group}"),
         "transfer": learn(lambda r: r[2] != task, f"tasks other than {task}")}
  return {k: v for k, v in out.items() if v is not None}


def write_calibration(path: str, fitted: dict, fitter: str, runs: dict, whole: dict, use_prior: bool,
                      x: str) -> Calibration:
  """The calibration file analyse reads (scaling/calibration.py): per fitter ("paper" and `fitter` as "numpyro")
  the discrepancy `calibrate` fitted on all the cases (c_min 0), with the conformal scores of the 50 % cuts (else of
  the largest cut) and those of every cut, and the shape prior learned from every whole run."""
  disc, cut_scores = {}, {}
  for name, key in (("paper", "paper"), ("numpyro", fitter)):
    got = fitted.get(f"{key} c_min=0.0")
    if got is None:
      raise SystemExit(f"calibration.py: --write-calibration: no cases of fitter {key!r} at c_min 0 (see --variants)")
    cuts = {float(k.split("=")[1]): d for k, d in got.items() if k.startswith("conformal frac=")}
    frac = 0.5 if 0.5 in cuts else max(cuts)
    disc[name] = cuts[frac]
    cut_scores[name] = {f: d.scores for f, d in sorted(cuts.items())}
  tasks = sorted({t for _, _, t in runs.values()})
  prior = (prior_lib.prior_from_fits(list(whole.values()), [runs[p][0].c_per_step for p in whole],
                                     " + ".join(tasks)) if len(whole) >= 2 else None)
  name = (f"{len(runs)} runs of {len({(t, g) for _, g, t in runs.values()})} recipes on "
          f"{len(tasks)} task(s) ({', '.join(tasks)}), {round(100 * frac)} % cuts")
  cal = Calibration(name, disc, prior, use_prior and prior is not None,
                    {"command": " ".join(["python", "benchmarks/calibration.py", *sys.argv[1:]]),
                     "date": time.strftime("%Y-%m-%d", time.gmtime()), "x": x, "cut": frac, "fitter": fitter,
                     "runs": sorted(runs)}, cut_scores=cut_scores)
  save_calibration(cal, path)
  cal = dataclasses.replace(cal, path=str(path))
  print(f"wrote {path}: {cal.describe(cal.shape_prior)}")
  return cal


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
  ap.add_argument("--prior", action="store_true", help="also fit the first variant with learned shape priors "
                  "(whole-run fits of the other recipes of the task, and of the other tasks)")
  ap.add_argument("--passk", type=int, nargs="*", default=[], metavar="K",
                  help="also fit the first variant with A bounded by the step-0 evaluation's pass@K")
  ap.add_argument("--train-trend", action="store_true",
                  help="also fit the first variant with the training pass rate beside the held-out points (+train)")
  ap.add_argument("--train-window", type=int, default=10, help="--train-trend: steps pooled into one point")
  ap.add_argument("--write-calibration", metavar="FILE",
                  help="write the calibration file analyse reads (scaling/calibration.py) from these runs")
  ap.add_argument("--calibration-fitter", default="numpyro_free_r0_iid",
                  help="the NumPyro fitter whose cases --write-calibration uses")
  ap.add_argument("--use-prior", action="store_true",
                  help="--write-calibration: the file's learned shape prior is used by default (with --prior and "
                  "without this, FILE_with_prior.json is written as well: the prior on, the scores of its fits)")
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "calibration.json"))
  args = ap.parse_args(argv)
  from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

  cases, skipped, runs = [], {}, {}
  for path in expand(args.runs):
    try:
      points = load_points(path, x=args.x)
    except CurveDataError as exc:
      skipped[str(path)] = str(exc)
      continue
    recipe_dir = path.parent if path.is_dir() else path.parent.parent
    runs[str(path)] = (dataclasses.replace(points, name=str(path)), recipe_dir.name, recipe_dir.parent.name)
  whole = (whole_run_fits(runs, num_warmup=args.num_warmup, num_samples=args.num_samples)
           if args.prior or args.write_calibration else {})
  bounds, priors_of = {}, {}
  for path, (points, group, task) in tqdm(runs.items(), desc="calibration", unit="run"):
    priors = priors_of[path] = learned_priors(path, runs, whole) if args.prior else {}
    a_max = {f"passk{k}": prior_lib.bound_on_a(points.per_prompt[0] if points.per_prompt is not None else None,
                                               points.samples_per_prompt, k) for k in args.passk}
    bounds[path] = {"final": float(points.reward[-1]), **a_max}
    train = training_rate(pathlib.Path(path), args.x, args.train_window) if args.train_trend else None
    for frac in args.fracs:
      for c_min in args.c_min:
        try:
          cases += fit_cases(points, group, task, frac, c_min, num_warmup=args.num_warmup,
                             num_samples=args.num_samples, variants=args.variants, priors=priors, a_max=a_max,
                             train=train)
        except CurveDataError as exc:
          skipped[f"{path} frac={frac} c_min={c_min}"] = str(exc)
  rows, kappas = calibrate(cases)
  groups: dict = {}
  for r in rows:
    groups.setdefault((r["fitter"], r["mode"], r["frac"], r["c_min_frac"]), []).append(r)
    if len({t for _, _, t in runs.values()}) > 1:  # per task as well
      groups.setdefault((r["fitter"], f"{r['mode']} [{r['task']}]", r["frac"], r["c_min_frac"]), []).append(r)
  results = []
  print(f"\n{'fitter':<36}{'discrepancy':<44}{'frac':>5}{'c_min':>6}{'runs':>5}{'med|err|':>9}{'bias':>7}"
        f"{'cov50':>7}{'cov90':>7}{'wid90':>7}{'refused':>8}   identified only: {'runs':>4}{'cov50':>7}{'cov90':>7}")
  for (fitter, mode, frac, c_min), rs in sorted(groups.items()):
    a, b = summarize(rs), summarize(rs, identified_only=True)
    results.append({"fitter": fitter, "mode": mode, "frac": frac, "c_min_frac": c_min, "all": a, "identified": b,
                    "groups": len({r["group"] for r in rs})})
    tail = f"{b['runs']:>4}{100 * b['covered_50']:6.0f}%{100 * b['covered_90']:6.0f}%" if b["runs"] else f"{0:>4}"
    print(f"{fitter:<36}{mode:<44}{frac:5.2f}{c_min:6.2f}{a['runs']:>5}{a['median_abs_err']:9.3f}"
          f"{a['mean_signed_err']:+7.3f}{100 * a['covered_50']:6.0f}%{100 * a['covered_90']:6.0f}%"
          f"{a['median_width_90']:7.3f}{a['refused']:>8}"
          f"   {' ' * 18}{tail}")
  print("\ndiscrepancy fitted on all runs (logit scale; what a calibration file holds, with the conformal scores "
        "of the 50 % cuts):")
  for k, v in kappas.items():
    print(f"  {k}: {v['all']}")
    for name, d in v.items():
      if name.startswith("conformal"):
        print(f"    {name}: scores={d.scores}")
  for k, v in skipped.items():
    print(f"skipped {k}: {v}")
  if args.passk:  # how often the base policy's pass@k bounded the run's final pass rate
    for k in args.passk:
      vals = [(b[f"passk{k}"], b["final"]) for b in bounds.values() if b.get(f"passk{k}") is not None]
      if vals:
        print(f"pass@{k} at step 0 >= the final pass rate in {sum(a >= f for a, f in vals)} of {len(vals)} runs "
              f"(median bound {np.median([a for a, _ in vals]):.3f}, median final {np.median([f for _, f in vals]):.3f})")
  if args.write_calibration:
    write_calibration(args.write_calibration, kappas, args.calibration_fitter, runs, whole, args.use_prior, args.x)
    if args.prior and not args.use_prior:  # the alternative, to choose between: the prior on, its fits' scores
      alt = pathlib.Path(args.write_calibration)
      which = "transfer" if len({t for _, _, t in runs.values()}) > 1 else "within"
      write_calibration(str(alt.with_name(alt.stem + "_with_prior" + alt.suffix)), kappas,
                        f"{args.calibration_fitter}+prior_{which}", runs, whole, True, args.x)
  out = {"config": {**vars(args), "out": os.path.relpath(args.out, pathlib.Path(__file__).parents[1])},
         "goals": {"covered_90": "0.85 .. 0.95", "covered_50": "0.40 .. 0.60", "median_abs_err": "<= 0.03",
                   "runs": ">= 12 of >= 3 recipes, frac 0.5"},
         "discrepancy": {k: {g: v.as_dict() for g, v in d.items()} for k, d in kappas.items()},
         "results": results, "rows": rows, "skipped": skipped, "passk_bounds": bounds,
         "priors": {p: {k: v.as_dict() for k, v in pr.items()} for p, pr in priors_of.items() if pr}}
  save_result(args.out, out)
  return out


if __name__ == "__main__":
  main()
