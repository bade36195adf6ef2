"""The trainer's one call at the end of a run: read the run's points, fit them, optionally plot, summarise.

It sits above both `analysis.py` (fit, summary) and `plots.py` (figures of an `analysis.RunFit`), so those two
do not import each other; matplotlib is imported only when a plot is asked for.
"""

from __future__ import annotations

from typing import Optional, Union

from scalerl_jax.scaling import calibration as calibration_lib
from scalerl_jax.scaling.analysis import analyse, summary
from scalerl_jax.scaling.io import DEFAULT_X, load_points, tasks_in
from scalerl_jax.scaling.points import CurvePoints


def fit_run(points: Union[CurvePoints, str], *, x: str = DEFAULT_X, fit_upto: float = 0.5,
            c_min: float = 0.0, bayes: bool = True, plot: Optional[str] = None, target: Optional[float] = None,
            calibration: str = "", **kwargs) -> dict:
  """Fits one run and returns `summary` (JSON-ready); `plot` saves the fit plot there (with a `target` line).

  `points`: CurvePoints, or a run directory / CSV / metrics.jsonl read on the `x` axis ("accelerator_hours",
  "accelerator_seconds" or "flops"). `calibration`: a calibration file (scaling/calibration.py), "" for the
  shipped one. Other keyword arguments go to `analyse` (method, fit_r0, likelihood, ...).
  """
  if not isinstance(points, CurvePoints):
    points = load_points(points, x=x)
  run = analyse(points, fit_upto=fit_upto, c_min=c_min, bayes=bayes, calibration=calibration_lib.load(calibration),
                **kwargs)
  if plot:
    from scalerl_jax.scaling import plots  # matplotlib only when asked
    plots.save(plots.plot_fit(run, target=target).figure, plot)
  return summary(run)


def fit_tasks(run_dir: str, *, x: str = DEFAULT_X, fit_upto: float = 0.5, c_min: float = 0.0, bayes: bool = True,
              plot: Optional[str] = None, calibration: str = "", **kwargs) -> dict:
  """A mixed-task run: one fit per task's held-out curve (`tasks_in`), summaries keyed by task; `plot` draws every
  task's curve on one axis. {} for a single-task run."""
  tasks = tasks_in(run_dir)
  cal = calibration_lib.load(calibration)
  runs = {t: analyse(load_points(run_dir, x=x, task=t), fit_upto=fit_upto, c_min=c_min, bayes=bayes,
                     calibration=cal, **kwargs) for t in tasks}
  if plot and runs:
    from scalerl_jax.scaling import plots
    plots.save(plots.plot_comparison(list(runs.values())).figure, plot)
  return {t: summary(r) for t, r in runs.items()}
