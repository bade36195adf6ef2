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
3. compares **two recipes**: $P(A_1 > A_2)$, the paper's rule for comparing $B$, and where the curves cross.

The runs are synthetic, with known curves (paper Table 1), written in the trainer's `metrics.jsonl` format, so the
truth is known and the notebook runs in well under two minutes on a CPU."""),
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
]

