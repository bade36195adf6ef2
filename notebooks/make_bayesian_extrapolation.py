"""The cells of notebooks/bayesian_extrapolation.ipynb: `python notebooks/build.py bayesian_extrapolation` writes
and executes the notebook and saves it with its outputs.
"""

CELLS = [
    ("md", """# Bayesian extrapolation of an RL scaling curve

ScaleRL models the held-out pass rate after training compute $C$ as

$$R(C) = R_0 + \\frac{A - R_0}{1 + (C_{mid}/C)^B}$$

with ceiling $A$, efficiency exponent $B$ and half-gain compute $C_{mid}$. This notebook

1. fits a run on the **first half** of its compute — the paper's least-squares grid fit and a NumPyro posterior,
2. extrapolates to the end of the run with a **90 % band** and checks it against what the run reached,
3. compares **two recipes**: $P(A_1 > A_2)$, the paper's rule for comparing $B$, and where the curves cross;
4. on **real runs**: whether bands calibrated on one task hold on another, and what a prior learned from finished
   runs does for a forecast from a quarter of the compute.

The first runs are synthetic, with known curves (paper Table 1), written in the trainer's `metrics.jsonl` format, so
the truth is known; the last section reads the project's own studies. It runs in about two minutes on a CPU."""),
    ("code", """import dataclasses
import pathlib
import tempfile
import warnings

import matplotlib.pyplot as plt
import numpy as np

warnings.filterwarnings("ignore", message="IProgress not found")  # (tqdm, imported below, wants ipywidgets)
from scalerl_jax import scaling
from scalerl_jax.scaling import plots, synthetic

%matplotlib inline"""),
    ("md", """## Two runs with known curves

*ScaleRL* (A = 0.610, B = 1.92, C_mid = 2542 GPU-h) and *ScaleRL-8gen* (A = 0.585, B = 2.44): the second is more
efficient early but has a lower ceiling. Each evaluation scores 1000 held-out prompts × 16 samples; prompt
difficulty varies (per-prompt pass rates ~ Beta), so the per-prompt counts are over-dispersed and the fit uses the
beta-binomial likelihood on them."""),
    ("code", """tmp = tempfile.TemporaryDirectory(prefix="scaling_nb_")  # removed when the kernel exits
workdir = pathlib.Path(tmp.name)
truth = {"scalerl": synthetic.table1("ScaleRL", r0=0.30), "scalerl_8gen": synthetic.table1("ScaleRL-8gen", r0=0.30)}
for i, (name, params) in enumerate(truth.items()):
  run = synthetic.synthetic_run(params, c_max=16000.0, n_evals=60, prompt_phi=20.0, seed=i)
  synthetic.write_run_dir(run, workdir / name)  # RUN_DIR/metrics.jsonl, as the trainer writes it

points = {name: dataclasses.replace(scaling.load_points(workdir / name, x="accelerator_hours"), name=name)
          for name in truth}
p = points["scalerl"]
print(f"{len(p)} evaluations; R0 measured {p.reward[0]:.3f}; last compute {p.compute[-1]:.0f} GPU-h; "
      f"per-prompt counts {p.per_prompt.shape}")"""),
    ("md", """## Fit the first half, extrapolate the second

`analyse` fixes $R_0$ to the first evaluation, fits points with $C \\le 0.5\\,C_{last}$, runs the paper's grid fit
and NUTS (one chain), and keeps the held-out half for checking."""),
    ("code", """fits = {name: scaling.analyse(pts, fit_upto=0.5, bayes=True, num_warmup=400, num_samples=600, seed=0)
        for name, pts in points.items()}
run = fits["scalerl"]
print(scaling.format_report(scaling.summary(run)))
print("NUTS diagnostics:", run.bayes.diagnostics)
ax = plots.plot_fit(run)
ax.set_xlabel("GPU-hours")
plt.show()"""),
    ("md", """## Posterior of A and B

The ceiling is constrained by the bend of the curve within the fitted half; the dashed lines are the truth."""),
    ("code", """fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for ax, name in zip(axes, ("A", "B")):
  ax.hist(run.bayes.samples[name], bins=40, color="C0", alpha=0.7)
  ax.axvline(getattr(truth["scalerl"], name), color="k", ls="--")
  q = run.bayes.quantiles(name)
  ax.set_title(f"{name}: {q['q50']:.3f} [{q['q05']:.3f}, {q['q95']:.3f}]")
plt.show()"""),
    ("md", """## How good was the extrapolation?

The 90 % band of the mean curve against the true curve, at computes beyond the fit cut-off."""),
    ("code", """c = np.array([9000.0, 12000.0, 16000.0, 32000.0])
lo, med, hi = run.bayes.band(c)
true = truth["scalerl"](c)
print(f"{'C':>8} {'true':>7} {'median':>7} {'90% band':>17} covered")
for row in zip(c, true, med, lo, hi):
  print(f"{row[0]:8.0f} {row[1]:7.3f} {row[2]:7.3f}   [{row[3]:.3f}, {row[4]:.3f}] {row[3] <= row[1] <= row[4]}")
print("least-squares (paper) prediction at 16k:", round(float(run.lsq.params(16000.0)), 3))"""),
    ("md", """## Compare the two recipes

* $P(A_1 > A_2)$ from the two posteriors;
* $B$ is compared (at a common $A$) only if the two ceilings are within 0.02 — the paper's error margin on $A$;
* the computes where the curves cross: a more efficient recipe with a lower ceiling is eventually overtaken."""),
    ("code", """runs = [fits["scalerl"], fits["scalerl_8gen"]]
for pair in scaling.compare_runs(runs):
  print(scaling.format_comparison(pair))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
plots.plot_comparison(runs, ax=ax1, c_max=64000.0)
plots.plot_linearised(runs, ax=ax2)
plt.show()"""),
    ("md", """Reading the result: the posterior says which ceiling is higher and how sure we are; when the ceilings are
within the 0.02 margin, the common-$A$ refit (right: $\\ln F$ against $\\ln C$, slope $B$) says which recipe is more
compute-efficient. With real runs, pass `--bayes` to `launch/fit_curve.py RUN_DIR1 RUN_DIR2` for the same numbers."""),
    ("md", """## Real runs: is the band honest on a task it was not calibrated on?

A sigmoid through half of a real run is not the run's exact shape, so beyond the fit the predictive band adds a
**model discrepancy** and takes its width from the standardized errors ("scores") of finished runs cut at the same
fraction (split conformal prediction). Those were fitted on runs of some task; a user's first run is on another.
`benchmarks/calibration.py` measured this on two studies of the project's CPU policy — the leave-one-out recipes
on 3-digit addition (`configs/studies/loo_cpu.yaml`) and on 4-digit addition (`configs/studies/addition4_cpu.yaml`),
12 runs each — calibrating on one study and judging the other ("transfer"), against calibrating on the same
study's other recipes ("leave one recipe out"). A band that holds the final value at its level but is 0.5 wide
is honest and useless, so the width comes with the coverage."""),
    ("code", """import json
from scalerl_jax.scaling import calibration

result = json.loads(pathlib.Path("../benchmarks/results/calibration_transfer.json").read_text())
fitters = {"paper": "least squares (the headline)", "numpyro_free_r0_iid": "NumPyro posterior median"}
print(f"{'fit':<29} {'cut':>4} {'calibrated on':<31} {'judged on':<10} {'runs':>4} {'med |err|':>9} {'in 50 %':>8} "
      f"{'in 90 %':>8} {'90 % width':>10}")
for fitter, name in fitters.items():
  for frac in (0.5, 0.25):
    for mode, label in (("conformal, leave-one-out", "the same study's other recipes"),
                        ("transfer", "the other study")):
      for task in ("study_cpu", "study_add4"):
        r = next(r for r in result["results"] if r["fitter"] == fitter and r["frac"] == frac
                 and r["mode"] == f"{mode} [{task}]")["all"]
        print(f"{name:<29} {frac:4.2f} {label:<31} {task:<10} {r['runs']:>4} {r['median_abs_err']:9.3f} "
              f"{r['covered_50']:8.0%} {r['covered_90']:8.0%} {r['median_width_90']:10.2f}")
print("\\nthe fit's default:", calibration.load().describe())"""),
    ("md", """## A quarter of the compute, and a prior learned from finished runs

From a quarter of a run the curve has not bent yet: many sigmoids fit it, and the prediction of the end is poor.
Finished runs know more: their $B$ and their $C_{mid}$ counted in RL steps (`scaling/prior.py`, learned from each
whole run's posterior, net of its own uncertainty). Below, one run of the 4-digit study fitted on its first 25 %
with the generic priors and with the prior learned from the *other* study's runs only (what the benchmark stored
for it: never its own data), against what the run measured at its end."""),
    ("code", """from scalerl_jax.scaling.prior import CurvePrior

study = json.loads(pathlib.Path("data/study_add4.json").read_text())
run_dir = pathlib.Path(tempfile.mkdtemp(prefix="add4_nb_")) / "scalerl_seed0"
run_dir.mkdir()
(run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in study["runs"]["scalerl/seed0"]["evals"]))
run = scaling.load_points(run_dir, x=study["x"])
learned = next(CurvePrior.from_dict(v["transfer"]) for k, v in result["priors"].items()
               if k.endswith("study_add4/scalerl/seed0"))
print("prior learned on the other study:", learned)
fits_q = {}
for label, prior in (("generic priors", None), ("learned prior", learned)):
  fits_q[label] = scaling.analyse(run, fit_upto=0.25, bayes=True, num_warmup=400, num_samples=800, prior=prior)
  lo, med, hi = (float(v[0]) for v in fits_q[label].bayes.band(run.compute[-1:], 0.9, predictive=True))
  print(f"{label:<15} predicted at the end {med:.3f}, 90 % band [{lo:.3f}, {hi:.3f}]; measured {run.reward[-1]:.3f}")
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for ax, (label, f) in zip(axes, fits_q.items()):
  plots.plot_fit(f, ax=ax)
  ax.set_title(f"first 25 %, {label}")
plt.show()"""),
    ("md", """Reading it: the learned prior says where a typical run of the *other* task bends — about 110 RL steps for
3-digit addition — which the first quarter of one run cannot tell; this 4-digit run bends later (its study's
runs at about 180 steps), so here the prior pulls the bend too early. Over the 12 runs of each study
(`benchmarks/RESULTS.md`, "Transfer of the calibrated bands, and a forecast from a quarter of the compute") the
prior learned on 4-digit runs brought the 3-digit quarter-run error from 0.047 to 0.029, and the other way it made
the 4-digit error worse (0.081 to 0.106): a prior helps where the shapes agree, so learn it on finished runs of the
same task. The paper's least squares, which the report leads with, missed the ends from a quarter of the compute
by 0.035 and 0.031 (its bands, calibrated, are wide there: a quarter of a run says little about the ceiling).
Refit the calibration (the bands' scores and the prior) on finished runs of your own task with one command:
`python benchmarks/calibration.py "runs/my_study/*/seed*" --write-calibration my_cal.json`, then
`curve_fit.calibration=my_cal.json` (or `launch/fit_curve.py RUN --calibration my_cal.json`)."""),
]

