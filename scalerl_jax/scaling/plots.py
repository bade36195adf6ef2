"""Matplotlib figures of fitted runs: one run with its band and extrapolated region, several runs compared, and
the linearised view ln F(R) = B ln C.

Every function draws on `ax` (a new figure when None) and returns the axes; `save` writes a figure to disk.
"""

from __future__ import annotations

import pathlib
from typing import Optional, Sequence

import numpy as np

import matplotlib.pyplot as plt

from scalerl_jax.scaling.analysis import RunFit, headline
from scalerl_jax.scaling.compare import linearised, refit_common_a
from scalerl_jax.scaling.curves import log_f, sigmoid_curve
from scalerl_jax.scaling.io import UNITS



def _short(name: str) -> str:
  """A run's label: the last path component of its input."""
  return pathlib.Path(name).name if name else ""


def _unit(runs: Sequence[RunFit]) -> str:
  """The compute unit the runs' points were read on (`CurvePoints.x_axis`); "" when unknown or mixed."""
  axes = {run.points.x_axis for run in runs}
  return UNITS.get(axes.pop(), "") if len(axes) == 1 else ""


def _x_label(runs: Sequence[RunFit]) -> str:
  unit = _unit(runs)
  return f"compute ({unit})" if unit else "compute"


def _axes(ax):
  return ax if ax is not None else plt.subplots(figsize=(7, 4.5))[1]


def _grid(run: RunFit, c_max: Optional[float] = None) -> np.ndarray:
  c = run.points.compute
  lo = float(np.min(c[c > 0]))
  return np.geomspace(lo, c_max or 1.05 * float(c[-1]), 300)


def _band(run: RunFit, grid: np.ndarray):
  """(lower, upper) of the mean curve: the posterior band with a Bayesian fit, the delta-method band otherwise."""
  if run.bayes is not None:
    lo, _, hi = run.bayes.band(grid, run.level)
    return lo, hi
  return run.lsq.band(grid, run.level)


def plot_fit(run: RunFit, ax=None, c_max: Optional[float] = None, color: str = "C0", label: str = "",
             target: Optional[float] = None):
  """Measured points (fitted: filled, held out: hollow, dropped below c_min: grey; each kind in the legend), the
  headline fit's curve (`analysis.headline`: the paper's least squares) with its band, the NumPyro posterior's
  median curve beside it when the run has one, the headline's predictive band of one evaluation (dashed:
  continuous and smooth through the cut-off), the extrapolated region shaded, the cut-off marked, the ceiling A
  drawn and labelled only when the fit identifies it, and a `target` pass rate when given. The legend sits beside
  the axes, off the data."""
  ax = _axes(ax)
  w, name = run.window, label or _short(run.name) or "run"
  grid = _grid(run, c_max)
  lo, hi = run.lsq.band(grid, run.level)
  head = headline(run)
  ax.axvspan(w.c_cut, grid[-1], color="0.93", zorder=0, label="extrapolated (beyond the fit)")
  ax.axvline(w.c_cut, color="0.5", ls="--", lw=1, label=f"fit cut-off C = {w.c_cut:.3g}")
  if w.c_min > 0:
    ax.axvline(w.c_min, color="0.7", ls=":", lw=1, label=f"c_min = {w.c_min:.3g}")
  if np.all(np.isfinite(lo)):
    ax.fill_between(grid, lo, hi, color=color, alpha=0.2, lw=0, label=f"{run.level:.0%} band (delta method)")
  ax.plot(grid, run.lsq.params(grid), color=color, lw=2,
          label=f"{name}: {head['fitter']} (A = {head['A']:.3f}, B = {head['B']:.2f})")
  if run.bayes is not None:  # the posterior's median curve beside it, thin
    a, b = (float(np.median(run.bayes.param(k))) for k in ("A", "B"))
    ax.plot(grid, run.bayes.band(grid, run.level)[1], color=color, lw=0.8, ls=":",
            label=f"NumPyro posterior median (A = {a:.3f}, B = {b:.2f})")
  plo, *_, phi = run.lsq.band(grid, run.level, predictive=True)
  if np.all(np.isfinite(plo)):  # where one evaluation should land: the mean's band plus its noise and, beyond the
    # cut-off, the model discrepancy (curves.Discrepancy)
    ax.plot(grid, plo, color=color, lw=0.8, ls="--", label=f"{run.level:.0%} predictive band (one evaluation)")
    ax.plot(grid, phi, color=color, lw=0.8, ls="--")
  pts = run.points
  dropped = (pts.compute > 0) & (pts.compute < w.c_min)
  ax.scatter(w.fit.compute, w.fit.reward, s=14, color=color, zorder=3, label="evaluations fitted")
  if len(w.held_out):
    ax.scatter(w.held_out.compute, w.held_out.reward, s=14, facecolors="none", edgecolors=color, zorder=3,
               label="evaluations held out (not fitted)")
  if np.any(dropped):
    ax.scatter(pts.compute[dropped], pts.reward[dropped], s=10, color="0.6", zorder=3, label="below c_min (dropped)")
  if head["ceiling_identified"]:
    ax.axhline(head["A"], color=color, lw=0.8, ls="-.", alpha=0.7, label=f"ceiling A = {head['A']:.3f}")
  if target is not None:
    ax.axhline(target, color="C3", lw=0.8, ls=(0, (4, 2)), label=f"target {target:.3g}")
  ax.set_xscale("log")
  ax.set_xlabel(_x_label([run]))
  ax.set_ylabel("held-out pass rate")
  if not head["ceiling_identified"]:
    ax.set_title(f"ceiling not identified: {head['why_not']}", fontsize=8, loc="left", wrap=True)
  _legend_beside(ax)
  return ax


def _legend_beside(ax) -> None:
  """The legend to the right of the axes (off the data), the figure widened to hold it."""
  fig = ax.figure
  if fig.get_figwidth() < 10:
    fig.set_figwidth(10.5)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def plot_comparison(runs: Sequence[RunFit], ax=None, c_max: Optional[float] = None):
  """Several runs on one axis, each with its points, fitted curve and band."""
  ax = _axes(ax)
  c_max = c_max or 1.05 * max(r.c_last for r in runs)
  for i, run in enumerate(runs):
    color = f"C{i}"
    grid = _grid(run, c_max)
    lo, hi = _band(run, grid)
    if np.all(np.isfinite(lo)):
      ax.fill_between(grid, lo, hi, color=color, alpha=0.15, lw=0)
    p = run.lsq.params
    label = f"{_short(run.name) or i}: A={p.A:.3f} B={p.B:.2f} C_mid={p.C_mid:.3g}"
    ax.plot(grid, p(grid), color=color, lw=2, label=label)
    ax.scatter(run.points.compute[1:], run.points.reward[1:], s=10, color=color)
    ax.axvline(run.window.c_cut, color=color, ls="--", lw=0.8, alpha=0.6)
  ax.set_xscale("log")
  ax.set_xlabel(_x_label(runs))
  ax.set_ylabel("held-out pass rate")
  _legend_beside(ax)
  return ax


def plot_linearised(runs: Sequence[RunFit], ax=None, common_a: bool = True):
  """ln F(R) against ln C per run, after refitting at a common A (the paper's Fig. 7 procedure): slope = B."""
  ax = _axes(ax)
  a, fits = refit_common_a(runs) if common_a else (None, [r.lsq for r in runs])
  for i, (run, f) in enumerate(zip(runs, fits)):
    x, y = linearised(run, f.params)
    ax.scatter(x, y, s=10, color=f"C{i}")
    xs = np.linspace(x.min(), x.max(), 10) if x.size else np.zeros(0)
    ax.plot(xs, f.params.B * xs, color=f"C{i}", label=f"{_short(run.name) or i}: B={f.params.B:.2f}")
  unit = _unit(runs)
  ax.set_xlabel(f"ln C (C in {unit})" if unit else "ln C")
  ax.set_ylabel("ln F(R)")
  ax.set_title(f"linearised at common A={a:.3f}" if a is not None else "linearised")
  ax.legend(fontsize=8)
  return ax


def plot_recipes(fits, ax=None, level: float = 0.9, unit: str = "", c_max: Optional[float] = None):
  """A study's recipes (`study.RecipeFit`) on one log-compute axis: each seed's points, the recipe-level posterior
  median curve and its `level` band, extended to `c_max` (default: 10x the largest compute)."""
  ax = _axes(ax)
  c_all = np.concatenate([p.compute for f in fits for p in f.points])
  grid = np.geomspace(float(c_all.min()), c_max or 10.0 * float(c_all.max()), 300)
  for i, f in enumerate(fits):
    color, d = f"C{i}", f.draws()
    curves = sigmoid_curve(grid[None, :], d["A"][:, None], d["B"][:, None], d["C_mid"][:, None], d["R0"][:, None])
    lo, med, hi = np.quantile(curves, [0.5 - level / 2, 0.5, 0.5 + level / 2], axis=0)
    ax.fill_between(grid, lo, hi, color=color, alpha=0.15, lw=0)
    ax.plot(grid, med, color=color, lw=2, label=f"{f.name}: A={np.median(d['A']):.3f}, B={np.median(d['B']):.2f}")
    for p in f.points:
      ax.scatter(p.compute, p.reward, s=8, color=color, alpha=0.7)
  ax.set_xscale("log")
  ax.set_xlabel(f"compute ({UNITS.get(unit, unit)})" if unit else "compute")
  ax.set_ylabel("held-out pass rate")
  ax.set_title(f"recipes: posterior median and {level:.0%} band (one A per recipe over its seeds)")
  ax.legend(fontsize=8, loc="lower right")
  return ax.figure


def plot_fixed_a(fits, fixed: dict, ax=None):
  """The paper's fixed-A view of a study: every recipe's points (seeds pooled) as ln F(R) against ln C at the
  common A, with lines of slope B from `study.fixed_a_comparison`."""
  ax = _axes(ax)
  a = fixed["A_common"]
  for i, f in enumerate(fits):
    b, c_mid = fixed["B"][f.name], fixed["C_mid"][f.name]
    c = np.concatenate([p.compute for p in f.points])
    r = np.concatenate([p.reward for p in f.points])
    y = log_f(r, a, c_mid, b, float(np.mean(f.r0)))
    ok = np.isfinite(y)
    x = np.log(c[ok])
    ax.scatter(x, y[ok], s=8, color=f"C{i}")
    if x.size:
      xs = np.linspace(x.min(), x.max(), 10)
      ax.plot(xs, b * xs, color=f"C{i}", label=f"{f.name}: B={b:.2f}")
  ax.set_xlabel("ln C")
  ax.set_ylabel("ln F(R)")
  ax.set_title(f"fixed A = {a:.3f}: slope = B")
  ax.legend(fontsize=8)
  return ax.figure


def save(fig, path) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend beside the axes included
  plt.close(fig)
  return path
