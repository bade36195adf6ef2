"""Measured (compute, reward) points of one run, their validation, and the split into R0 / fit window / held-out.

Conventions (the trainer's metrics.jsonl, and CSVs read by `io.py`):
  * the first point is the R0 measurement: the pass rate of the starting checkpoint (compute 0, or the warm-start
    point). By default it fixes R0 and is not itself a curve point;
  * curve points are the later points with C > 0 and C >= c_min (the paper drops points below ~1.5k GPU-hours);
  * the fit window holds the curve points with C <= fit_upto * max C; the rest are held out, for extrapolation.

Arrays are per evaluation point (one entry per metrics.jsonl evaluation), per-prompt counts [points, P] with P
held-out prompts as in the package legend (scalerl_jax/types.py).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from scalerl_jax.errors import UserError

MIN_FIT_POINTS = 4


class CurveDataError(UserError, ValueError):
  """Input points cannot be fitted; the message says which input and why."""


def _floats(values, where: str, label: str, flat: bool = True) -> np.ndarray:
  try:
    out = np.asarray(values, dtype=float)
  except (TypeError, ValueError, OverflowError) as e:
    raise CurveDataError(f"{where}{label} holds a value that is not a number ({e})") from None
  return out.reshape(-1) if flat else out


@dataclasses.dataclass(frozen=True)
class CurvePoints:
  """Evaluation points of one run, compute strictly increasing. Validated on construction."""
  compute: np.ndarray  # float[N] cumulative training compute, >= 0, strictly increasing
  reward: np.ndarray  # float[N] held-out pass rate (mean@n) in [0, 1]
  n_correct: Optional[np.ndarray] = None  # int[N] correct samples over all held-out prompts
  n_total: Optional[np.ndarray] = None  # int[N] samples over all held-out prompts
  per_prompt: Optional[np.ndarray] = None  # int[N, P] correct samples per held-out prompt
  samples_per_prompt: Optional[int] = None  # n of mean@n; needed with per_prompt
  name: str = ""
  x_axis: str = ""  # the compute unit: a key of io.X_AXES ("generator_flops", "flops", ...); "" when unknown
  c_per_step: Optional[float] = None  # compute per RL step (the last point's compute / its step), when known

  def __post_init__(self):
    where = f"{self.name}: " if self.name else ""
    compute, reward = _floats(self.compute, where, "compute"), _floats(self.reward, where, "reward")
    if compute.shape != reward.shape:
      raise CurveDataError(f"{where}{compute.size} compute values but {reward.size} rewards")
    for label, v in (("compute", compute), ("reward", reward)):
      bad = np.flatnonzero(~np.isfinite(v))
      if bad.size:
        raise CurveDataError(f"{where}{label} is NaN or infinite at point(s) {bad[:5].tolist()}")
    if np.any(compute < 0):
      raise CurveDataError(f"{where}negative compute at point(s) {np.flatnonzero(compute < 0)[:5].tolist()}")
    steps = np.flatnonzero(np.diff(compute) <= 0)
    if steps.size:
      i = int(steps[0]) + 1
      raise CurveDataError(f"{where}compute must increase strictly, but point {i} has compute {compute[i]:g} "
                           f"after {compute[i - 1]:g}")
    if np.any((reward < 0) | (reward > 1)):
      raise CurveDataError(f"{where}rewards must be pass rates in [0, 1]")
    object.__setattr__(self, "compute", compute)
    object.__setattr__(self, "reward", reward)
    self._check_counts(where, compute.size)

  def _check_counts(self, where: str, n: int):
    if (self.n_correct is None) != (self.n_total is None):
      raise CurveDataError(f"{where}n_correct and n_total must be given together")
    if self.n_correct is not None:
      k, m = _floats(self.n_correct, where, "n_correct"), _floats(self.n_total, where, "n_total")
      if k.shape != (n,) or m.shape != (n,):
        raise CurveDataError(f"{where}n_correct / n_total must have one value per point")
      if not (np.all(np.isfinite(k)) and np.all(np.isfinite(m))):
        raise CurveDataError(f"{where}n_correct or n_total is NaN")
      if np.any(m <= 0) or np.any(k < 0) or np.any(k > m):
        raise CurveDataError(f"{where}need 0 <= n_correct <= n_total and n_total > 0")
      if np.any(k != np.round(k)) or np.any(m != np.round(m)):
        raise CurveDataError(f"{where}n_correct and n_total must be whole counts")
      object.__setattr__(self, "n_correct", k.astype(np.int64))
      object.__setattr__(self, "n_total", m.astype(np.int64))
    if self.per_prompt is not None:
      pp = _floats(self.per_prompt, where, "per_prompt", flat=False)
      if not np.all(np.isfinite(pp)) or np.any(pp != np.round(pp)):
        raise CurveDataError(f"{where}per_prompt must hold whole counts")
      pp = pp.astype(np.int64)
      if pp.ndim != 2 or pp.shape[0] != n or not self.samples_per_prompt:
        raise CurveDataError(f"{where}per_prompt must be [points, prompts] with samples_per_prompt set")
      if np.any(pp < 0) or np.any(pp > self.samples_per_prompt):
        raise CurveDataError(f"{where}per-prompt counts must lie in [0, samples_per_prompt]")
      object.__setattr__(self, "per_prompt", pp)

  def __len__(self) -> int:
    return int(self.compute.size)

  @property
  def has_counts(self) -> bool:
    return self.n_correct is not None

  def take(self, index) -> "CurvePoints":
    """The sub-run at `index` (a boolean mask or integer indices, in increasing order)."""
    pick = lambda v: None if v is None else v[index]  # noqa: E731
    return CurvePoints(self.compute[index], self.reward[index], pick(self.n_correct), pick(self.n_total),
                       pick(self.per_prompt), self.samples_per_prompt, self.name, self.x_axis, self.c_per_step)


@dataclasses.dataclass(frozen=True)
class Window:
  """One run split for fitting: the R0 measurement, the points fitted, the points held out."""
  r0: float  # the fixed R0 (the measured start unless given)
  start: CurvePoints  # the R0 measurement (one point; empty when R0 was given)
  fit: CurvePoints  # curve points with c_min <= C <= c_cut
  held_out: CurvePoints  # curve points with C > c_cut
  c_cut: float  # fit_upto * max compute
  c_min: float


def split(points: CurvePoints, fit_upto: float = 0.5, c_min: float = 0.0, r0: Optional[float] = None,
          min_points: int = MIN_FIT_POINTS) -> Window:
  """Splits a run into its R0 measurement, fit window and held-out tail.

  R0 is the first point's reward unless `r0` is given (then every point with C > 0 is a curve point). Points
  below `c_min` are dropped (the paper's early-phase cut); points with C <= fit_upto * max C are fitted.
  Raises CurveDataError when fewer than `min_points` points are left to fit.
  """
  where = f"{points.name}: " if points.name else ""
  if not 0.0 < fit_upto <= 1.0:
    raise CurveDataError(f"fit_upto must lie in (0, 1], got {fit_upto}")
  if len(points) == 0:
    raise CurveDataError(f"{where}no evaluation points")
  if r0 is None:
    start, rest, r0 = points.take(slice(0, 1)), points.take(slice(1, None)), float(points.reward[0])
  else:
    start, rest = points.take(slice(0, 0)), points
  curve = rest.take((rest.compute > 0) & (rest.compute >= c_min))
  c_cut = fit_upto * float(points.compute[-1])
  inside = curve.compute <= c_cut * (1 + 1e-12)
  fit, held_out = curve.take(inside), curve.take(~inside)
  if len(fit) < min_points:
    raise CurveDataError(
        f"{where}only {len(fit)} usable point(s) to fit (need >= {min_points}): {len(points)} points, the first "
        f"{'is R0' if len(start) else 'counted'}, c_min={c_min:g} drops {len(rest) - len(curve)}, fit_upto="
        f"{fit_upto:g} (compute <= {c_cut:g}) holds out {len(held_out)}")
  return Window(float(r0), start, fit, held_out, c_cut, float(c_min))
