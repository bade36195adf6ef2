"""Compute-performance scaling curves: fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), extrapolate, compare.

    curves.py     the sigmoid, the power law, the linearised form
    points.py     CurvePoints (validated) and the R0 / fit / held-out split
    io.py         run directories (metrics.jsonl, tensorboard events) and CSVs -> CurvePoints
    fit.py        least squares: the paper's grid fit, a free bounded fit, the power law
    bayes.py      NumPyro NUTS posterior (gaussian / binomial / beta-binomial; hierarchical over seeds)
    analysis.py   one run end to end: analyse / summary / format_report
    calibration.py the bands' discrepancy and conformal scores and the shape prior, as a file (shipped or refitted)
    prior.py      a shape prior learned from finished runs; pass@k as a bound on A
    compare.py    P(A1 > A2), the paper's B rule at a common A, crossing computes
    plots.py      matplotlib figures (imported on demand)
    end_of_run.py fit_run / fit_tasks: the trainer's end-of-run fit (per task for mixed runs), plot, summary
    advice.py     early-stop advice: P(ceiling > target) and the compute to reach it
    synthetic.py  runs with known curves (tests, notebook, benchmark)
"""

from scalerl_jax.scaling.analysis import RunFit, analyse, format_report, summary
from scalerl_jax.scaling.bayes import BayesFit, fit_bayes, fit_bayes_seeds
from scalerl_jax.scaling.compare import (compare_b, compare_runs, crossings, format_comparison, prob_a_greater,
                                         refit_common_a)
from scalerl_jax.scaling.curves import PowerLawParams, SigmoidParams
from scalerl_jax.scaling.end_of_run import fit_run, fit_tasks
from scalerl_jax.scaling.fit import LsqFit, fit_fixed_a, fit_free, fit_paper, fit_power_law
from scalerl_jax.scaling.io import load_points, tasks_in
from scalerl_jax.scaling.points import CurveDataError, CurvePoints, Window, split

__all__ = [
    "BayesFit", "CurveDataError", "CurvePoints", "LsqFit", "PowerLawParams", "RunFit", "SigmoidParams", "Window",
    "analyse", "compare_b", "compare_runs", "crossings", "fit_bayes", "fit_bayes_seeds", "fit_fixed_a",
    "fit_free", "fit_paper", "fit_power_law", "fit_run", "fit_tasks", "format_comparison", "format_report", "load_points",
    "prob_a_greater", "refit_common_a", "split", "summary", "tasks_in",
]
