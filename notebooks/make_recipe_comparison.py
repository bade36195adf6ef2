"""The cells of notebooks/recipe_comparison.ipynb: `python notebooks/build.py recipe_comparison` writes and executes
the notebook and saves it with its outputs. Its data, notebooks/data/study_cpu.json, holds the evaluations of real runs of the CPU study
(`python launch/study.py configs/studies/loo_cpu.yaml`, then `python notebooks/make_study_data.py runs/study_cpu`).
"""

CELLS = [
    ("md", """# Which recipe wins, and when? A leave-one-out study in miniature

The paper compares RL recipes by fitting each run's held-out pass rate $R$ against training compute $C$ with

$$R(C) = R_0 + \\frac{A - R_0}{1 + (C_{mid}/C)^B}$$

* $A$ — the **ceiling**: the pass rate the recipe approaches with unlimited compute;
* $B$ — the **efficiency**: how steeply it climbs (larger $B$: the gain comes in a narrower compute range);
* $C_{mid}$ — the compute at which half of the gain $A - R_0$ is reached.

This notebook does that on **real runs** of this project: the CPU study (`configs/studies/loo_cpu.yaml`), where the
ScaleRL recipe and its leave-one-out ablations each trained a small policy on the built-in addition task from two
seeds. The evaluations of some of those runs are stored in `data/study_cpu.json`. $C$ is the compute spent sampling
(generator FLOPs; every recipe here samples 64 prompts × 8 completions of one shape per step): the trainer's FLOPs
per step fall 2.4× over a run as the zero-variance filter drops solved groups, which would bend the curves against
the sigmoid (`benchmarks/RESULTS.md`, "Calibration on real runs").

Instead of one best-fit curve, we ask NumPyro for the **posterior**: every curve that is consistent with the
measurements, weighted by how well it explains them. Its spread is our uncertainty; a 90 % interval on $A$ is a
range that holds the ceiling with probability 0.9 under the model."""),
    ("code", """import json
import pathlib
import tempfile
import warnings

import matplotlib.pyplot as plt
import numpy as np

warnings.filterwarnings("ignore", message="IProgress not found")  # (tqdm, imported below, wants ipywidgets)
from scalerl_jax import scaling
from scalerl_jax.scaling import advice, plots, study

%matplotlib inline

data = json.loads(pathlib.Path("data/study_cpu.json").read_text())  # data["x"]: the compute axis
print(data["source"])
tmp = tempfile.TemporaryDirectory(prefix="recipes_nb_")  # removed when the kernel exits
points = {}  # recipe -> [CurvePoints of each seed]
for name, run in data["runs"].items():
  run_dir = pathlib.Path(tmp.name) / name
  run_dir.mkdir(parents=True)
  (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in run["evals"]))  # the trainer's format
  p = scaling.load_points(run_dir, x=data["x"])
  points.setdefault(run["recipe"], []).append(p)
print(f"{'recipe':<12} {'seeds':>5} {'evals':>6} {'R0':>6} {'final':>6}")
for recipe, runs in points.items():
  print(f"{recipe:<12} {len(runs):>5} {len(runs[0]):>6} {np.mean([p.reward[0] for p in runs]):6.3f} "
        f"{np.mean([p.reward[-1] for p in runs]):6.3f}")"""),
    ("md", """## One fit per recipe, across its seeds

Two seeds of the same recipe should share a ceiling but may climb differently (random initialisation of the
sampler, data order). The hierarchical model says exactly that: **one $A$ per recipe**, and for each seed its own
$B$ and $C_{mid}$ drawn around recipe-level values whose spread is itself fitted. Each evaluation counts correct
samples out of 512 held-out prompts × 4 samples, so the likelihood is binomial: a measurement of 0.70 from 2048
samples is known to about ±0.01, and the fit weighs it accordingly. Each seed's $R_0$ is a parameter too, with its
step-0 evaluation one more measurement (fixing it to that one noisy number makes the intervals too narrow).

Each seed is also fitted on its own: if a seed's own interval on $A$ excludes the recipe's shared $A$, one ceiling
does not describe the recipe's runs, and the table says so instead of reporting it."""),
    ("code", """fit = {"x": data["x"], "fit_upto": 1.0, "c_min": 0.0, "level": 0.9}
fits = [study.fit_recipe(name, runs, fit, num_warmup=400, num_samples=800) for name, runs in points.items()]
print(f"{'recipe':<12} {'A [90 % interval]':>22} {'B':>18} {'C_mid (' + data['x'] + ')':>30}  ceiling")
table = study.recipe_table(fits)  # also fits each seed alone, to check that one A describes it
for row in table:
  a, b, m = row["A"], row["B"], row["C_mid"]
  ceiling = "identified" if row["ceiling_identified"] else "not identified: " + row["ceiling_why_not"]
  print(f"{row['recipe']:<12} {a['median']:.3f} [{a['lo']:.3f}, {a['hi']:.3f}]   "
        f"{b['median']:.2f} [{b['lo']:.2f}, {b['hi']:.2f}]   {m['median']:.3g} [{m['lo']:.3g}, {m['hi']:.3g}]  {ceiling}")
fig = plots.plot_recipes(fits, unit=data["x"])
plt.show()"""),
    ("md", """The bands extend past the last measurement: that is the extrapolation. Where a band is wide, the runs
have not yet shown where that recipe levels off.

## Is one ceiling really higher?

With two posteriors, $P(A_1 > A_2)$ is the fraction of pairs of draws in which the first recipe's ceiling is the
higher one: near 1 or 0 the study resolves the difference; near 0.5 it cannot tell them apart. A recipe that
climbs faster but levels off lower is overtaken somewhere: the **crossover** is the compute where the two curves
meet, computed for many pairs of draws (so it comes with an interval, and with the fraction of draws in which the
curves cross at all within 100× the compute the runs used)."""),
    ("code", """for pair in study.compare_recipes(fits):
  (r1, r2), p, x = pair["recipes"], pair["p_A1_greater"], pair["crossover"]
  verdict = "resolved: " + study.resolved(pair, table)
  cross = (f"cross at C = {x['median']:.3g} [{x['lo']:.3g}, {x['hi']:.3g}] ({100 * x['p_cross_in_range']:.0f} % of draws)"
           if "median" in x else "no crossing in range")
  print(f"{r1} vs {r2}: P(A1 > A2) = {p:.2f} ({verdict}); {cross}")"""),
    ("md", """## Efficiency at a common ceiling

$B$ values are only comparable at the same $A$ (a higher ceiling with the same half-way compute looks steeper).
The paper therefore refits every recipe with $A$ fixed to a common value and compares the slopes of the
linearised curves $\\ln F(R) = B \\ln C$: the steeper line gets there with less compute."""),
    ("code", """fixed = study.fixed_a_comparison(fits)
print(f"common A = {fixed['A_common']:.3f}; B: " +
      ", ".join(f"{k} {v:.2f}" for k, v in sorted(fixed["B"].items(), key=lambda kv: -kv[1])))
plots.plot_fixed_a(fits, fixed)
plt.show()"""),
    ("md", """## Early-stop advice: would this run reach the target?

Halfway through a run, the question is practical: will it get to the pass rate we need, and when? We fit one run
on the first half of its compute only and ask for $P(\\text{ceiling} > \\text{target})$ and the compute at which
the target is reached (over the draws that reach it). `launch/fit_curve.py RUN_DIR --target 0.8` prints the same,
and `curve_fit.target=0.8` makes the trainer log it at every evaluation (`predict/p_target`, `predict/c_target`).
When the fitted half has not bent yet, the ceiling is not identified and the advice says so instead of
pretending."""),
    ("code", """recipe = "scalerl"
full = points[recipe][0]
first_half = full.take(full.compute <= 0.5 * full.compute[-1])  # what we would know halfway through
half = scaling.analyse(first_half, fit_upto=1.0, bayes=True, num_warmup=400, num_samples=800, seed=0)
print(f"{recipe}, seed 0, fitted on C <= {first_half.compute[-1]:.3g} ({len(first_half)} evaluations)")
for target in (0.7, 0.8, 0.9):
  print(advice.format_advice(advice.target_advice(half, target)))
  hit = np.flatnonzero(full.reward >= target)
  print("    the run itself: " + (f"first measured >= {target} at C = {full.compute[hit[0]]:.3g}" if hit.size else
                                  f"never measured >= {target} (last {full.reward[-1]:.3f} at C = {full.compute[-1]:.3g})"))"""),
    ("md", """## Does the first half rank the recipes as the end does?

This is the paper's use of the fits: run every recipe to a modest budget, fit, and pick the winner before paying
for the rest. We check it on these runs: each recipe fitted on the first half of its compute only, its ceiling
and its predicted pass rate at the end of the budget, against what its runs measured there (the mean of each
seed's last five evaluations: one evaluation's noise, about 0.01, would otherwise decide close pairs).
`python benchmarks/ranking.py STUDY.yaml --out benchmarks/results/ranking_NAME.json` does the same on whole
studies (the table in `benchmarks/RESULTS.md`, "Recipe ranking from half of the compute")."""),
    ("code", """half_fit = dict(fit, fit_upto=0.5)
half = [study.fit_recipe(name, runs, half_fit, num_warmup=400, num_samples=800) for name, runs in points.items()]
end = {name: np.mean([np.mean(p.reward[-5:]) for p in runs]) for name, runs in points.items()}
print(f"{'recipe':<12} {'A, first half':>24} {'predicted at the end':>21} {'measured end':>13}")
for f in half:
  d = f.draws()
  c_end = np.mean([p.compute[-1] for p in points[f.name]])
  lo, med, hi = np.quantile(d["A"], [0.05, 0.5, 0.95])
  pred = np.median(scaling.curves.sigmoid_curve(c_end, d["A"], d["B"], d["C_mid"], d["R0"]))
  print(f"{f.name:<12} {med:.3f} [{lo:.3f}, {hi:.3f}] {pred:>21.3f} {end[f.name]:>13.3f}")
half_table = study.recipe_table(half)
for pair in study.compare_recipes(half):
  (r1, r2), p = pair["recipes"], pair["p_A1_greater"]
  side = r1 if end[r1] > end[r2] else r2
  print(f"{r1} vs {r2}: from the half P(A1 > A2) = {p:.2f} ({study.resolved(pair, half_table)}); "
        f"higher at the end: {side} (by {abs(end[r1] - end[r2]):.3f})")
for name in ("loo_cpu", "addition4_cpu"):
  r = json.loads(pathlib.Path(f"../benchmarks/results/ranking_{name}.json").read_text())["studies"][0]
  rs = r["resolved_half"]
  print(f"whole study {r['study']}: Spearman (A from the half vs the measured end) "
        f"{r['spearman']['A_half vs measured end']:+.2f}; pairs resolved from the half {rs['pairs']} of {rs['of']}, "
        f"{rs['same_side_measured']} of them on the measured end's side")"""),
    ("md", """## Reading it

* A ceiling difference is real when $P(A_1 > A_2)$ is near 0 or 1 *and* each ceiling is identified (or the lower
  one is identified and the two intervals on $A$ lie apart: a ceiling that is not identified is a lower bound at
  best). Here the 500-step runs are still climbing: scalerl's interval on $A$ runs up to the model's bound of 1.
  loo_dapo's is called identified here, from the stored totals (a binomial likelihood); the study's own report,
  which also has the per-prompt counts, does not — read such a borderline call as borderline. PPO-off-policy-8
  (loo_8op) leans lower, but its ceiling is not identified: one seed still climbs (0.72 at the end), the other
  falls back to 0.51, so this budget does not resolve even that difference; the paper's longer runs do.
* $B$ is compared at a common $A$ only; a higher $B$ at a lower ceiling is a recipe that wins early and loses late —
  the crossover says where.
* The same analysis runs on any run directories: `python launch/study.py STUDY.yaml --report-only` writes it as
  `study_report.md` with the plots."""),
]

