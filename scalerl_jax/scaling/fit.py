"""Least-squares fits of R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), and of the power law A - D / C^B.

`fit_paper` — the paper's procedure (A.5): grid over A (paper: 0.450..0.800 step 0.005) and C_mid (paper: 100
  linearly spaced values in [100, 40000] GPU-hours); at each cell B is fitted by least squares (scipy's curve_fit);
  the cell with the least sum of squared residuals (SSE) wins. Departures, all on purpose:
    * the A grid defaults to 0.450..1.000 (A <= 1 is the only a-priori bound on a pass rate); cells with A <= R0
      are skipped;
    * the default C_mid grid is 100 log-spaced values in [C_max / 1000, 10 C_max] of the fitted points, because our
      compute unit varies (accelerator-hours, FLOPs); `PAPER_C_MID_GRID` is the paper's grid, for GPU-hours;
    * speed: B is first screened on a fine log grid for every (A, C_mid) cell at once — the SSE is quadratic in A
      for fixed (C_mid, B), so the screen costs one pass over (C_mid, B) — and curve_fit then fits B, from the
      screened value, at the best C_mid of the `polish` best A values. This finds the paper's minimum whenever
      SSE(B) is unimodal per cell (the paper reports the initialisation does not matter), ~100x faster;
    * refinement: at each of those A values, held at its grid value, (B, C_mid) are then fitted jointly and
      continuously, and the least SSE over them wins. The paper's reported C_mid values are off its 100-point
      grid, so its released code most likely refines too; refining several A values (not only the best coarse
      one) matters when the C_mid grid is coarse relative to the data.
  R0 is fixed (to the measured start, by default): the paper lists only {A, B, C_mid} as fitted.

`fit_free` — bounded non-linear least squares on (A, ln B, ln C_mid) (and R0 with fit_r0), multi-start.

`fit_power_law` — bounded least squares on (A, ln D, B), A in [0, 1].

Uncertainty (`LsqFit.band`): the delta method, Var R(C) = g(C)^T Sigma g(C) with Sigma = s^2 (J^T J)^-1 over
(A, ln B, ln C_mid[, R0]) at the solution, s^2 = SSE / (N - p); `predictive=True` adds s^2 (one new measurement).
For the paper fitter A is a grid value, so its band treats A as if it were continuous: an approximation (it
under-covers; see benchmarks/curve_fit_quality.py).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional, Sequence, Tuple

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit
from scipy.special import expit
from scipy.stats import norm
from scipy.stats import t as student_t

from scalerl_jax.scaling.curves import Discrepancy, PowerLawParams, SigmoidParams, log_compute, logit, sigmoid_curve
from scalerl_jax.scaling.points import MIN_FIT_POINTS, CurveDataError

PAPER_A_GRID = np.round(np.arange(0.450, 0.8001, 0.005), 3)  # 71 values
DEFAULT_A_GRID = np.round(np.arange(0.450, 1.0001, 0.005), 3)  # 111 values
PAPER_C_MID_GRID = np.linspace(100.0, 40000.0, 100)  # GPU-hours
B_SCREEN = np.geomspace(0.05, 20.0, 240)
B_BOUNDS = (0.05, 20.0)
BAND_DRAWS = 4000  # draws of a predictive band that carries the model discrepancy


@dataclasses.dataclass(frozen=True)
class LsqFit:
  """A least-squares sigmoid fit and its (approximate) parameter covariance."""
  params: SigmoidParams
  sse: float  # sum of squared residuals over the fitted points
  n: int  # fitted points
  method: str  # paper | free | fixed_a
  cov: Optional[np.ndarray]  # [p, p] over (A, ln B, ln C_mid[, R0]); None if singular
  fit_r0: bool = False
  discrepancy: Discrepancy = Discrepancy()  # the predictive band's model discrepancy beyond c_fit_last
  c_fit_last: float = 0.0

  @property
  def rmse(self) -> float:
    return float(np.sqrt(self.sse / max(self.n, 1)))

  def band(self, c, level: float = 0.9, predictive: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Delta-method band at compute `c`: R(c) -/+ z sd. `predictive` adds the residual variance s^2 (one new
    measurement rather than the mean curve) and, beyond the fit, the model discrepancy on the logit scale
    (curves.Discrepancy; then the band is taken from BAND_DRAWS draws shared by every c, so it is a smooth
    function of c, and with conformal scores it is conformal, continuous at the cut-off). nan when the covariance
    is unknown."""
    mean = self.params(c)
    if self.cov is None:
      return np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    g = _jacobian(np.asarray(c, dtype=float), self.params, self.fit_r0)
    var = np.maximum(np.einsum("np,pq,nq->n", g, self.cov, g), 0.0)
    z = norm.ppf(0.5 + level / 2)
    if not predictive:
      return mean - z * np.sqrt(var), mean + z * np.sqrt(var)
    var = var + self.sse / max(self.n - self.cov.shape[0], 1)
    d = self.discrepancy
    sd = d.sd(c, self.c_fit_last)
    if not np.any(sd > 0):
      return mean - z * np.sqrt(var), mean + z * np.sqrt(var)
    # The normal band on R, then the discrepancy on the logit scale, by draws: one column of standard draws
    # serves every c (stratified, so their quantiles are the exact ones, and paired at random)
    e_fit, e_disc = band_draws(d, BAND_DRAWS)
    r = np.clip(mean[None, :] + np.sqrt(var)[None, :] * e_fit, 1e-6, 1 - 1e-6)
    draws = expit(logit(r) + e_disc * sd[None, :])
    lo, hi = np.quantile(draws, [0.5 - level / 2, 0.5 + level / 2], axis=0)
    if d.scores:  # conformal beyond the cut-off, ramping in from the draws' own band (curves.Discrepancy.ramp)
      lo90, hi90 = np.quantile(draws, [0.05, 0.95], axis=0)
      clo, chi = d.conformal(lo90, mean, hi90, level)
      w = d.ramp(d.distance(c, self.c_fit_last))
      lo, hi = (1 - w) * lo + w * clo, (1 - w) * hi + w * chi
    return lo, hi


def band_draws(discrepancy: Discrepancy, n: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
  """([n, 1] standard normal draws, [n, 1] draws of the discrepancy's law), each stratified (the law's quantiles
  at (i + 1/2) / n) and paired by a random permutation (fixed seed): columns for bands whose every compute uses the
  same draws, so a band is smooth in c and free of Monte-Carlo noise in its quantiles."""
  u = (np.arange(n) + 0.5) / n
  e_fit = norm.ppf(u)
  e_disc = norm.ppf(u) if np.isinf(discrepancy.df) else student_t.ppf(u, discrepancy.df)
  return e_fit[:, None], np.random.default_rng(seed).permutation(e_disc)[:, None]


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
  params: PowerLawParams
  sse: float
  n: int


def _jacobian(c: np.ndarray, p: SigmoidParams, fit_r0: bool) -> np.ndarray:
  """dR/d(A, ln B, ln C_mid[, R0]) at compute c, [N, p]:
  [s, (A-R0) s(1-s) B z, -(A-R0) s(1-s) B[, 1-s]] with z = ln C - ln C_mid, s = sigmoid(B z)."""
  z = log_compute(c) - np.log(p.C_mid)
  s = expit(p.B * z)
  ds = np.where(np.isfinite(z), s * (1 - s) * p.B, 0.0)
  cols = [s, (p.A - p.R0) * ds * np.where(np.isfinite(z), z, 0.0), -(p.A - p.R0) * ds]
  if fit_r0:
    cols.append(1 - s)
  return np.stack(cols, axis=-1)


def _covariance(c, r, p: SigmoidParams, fit_r0: bool) -> Optional[np.ndarray]:
  j = _jacobian(c, p, fit_r0)
  dof = len(c) - j.shape[1]
  if dof <= 0:
    return None
  s2 = float(np.sum((p(c) - r) ** 2)) / dof
  try:
    return s2 * np.linalg.inv(j.T @ j)
  except np.linalg.LinAlgError:
    return None


def _check(c, r) -> Tuple[np.ndarray, np.ndarray]:
  c, r = np.asarray(c, dtype=float), np.asarray(r, dtype=float)
  if c.shape != r.shape or c.ndim != 1:
    raise CurveDataError("compute and reward must be 1-D arrays of equal length")
  if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))):
    raise CurveDataError("compute and reward must be finite")
  if len(c) < MIN_FIT_POINTS:
    raise CurveDataError(f"only {len(c)} point(s) to fit (need >= {MIN_FIT_POINTS})")
  return c, r


def default_c_mid_grid(c) -> np.ndarray:
  """100 log-spaced C_mid candidates in [C_max / 1000, 10 C_max] of the fitted compute."""
  c_max = float(np.max(c))
  return np.geomspace(c_max / 1000.0, 10.0 * c_max, 100)


def _curve_fit(f, c, r, p0, **kw):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", OptimizeWarning)
    warnings.simplefilter("ignore", RuntimeWarning)
    return curve_fit(f, c, r, p0=p0, **kw)


def fit_paper(c, r, r0: float, *, a_grid: Optional[Sequence[float]] = None,
              c_mid_grid: Optional[Sequence[float]] = None, refine: bool = True, polish: int = 8) -> LsqFit:
  """The paper's grid fit (module docstring): A on `a_grid`, C_mid on `c_mid_grid`, B by least squares; min SSE.

  Points with C <= 0 are skipped (their model value is R0, fixed). `refine` fits (B, C_mid) continuously at each
  of the `polish` best A values. Raises CurveDataError with fewer than 4 points or no admissible A (all A <= R0).
  """
  c, r = _check(c, r)
  keep = c > 0
  c, r = _check(c[keep], r[keep])
  a_grid = np.asarray(DEFAULT_A_GRID if a_grid is None else a_grid, dtype=float)
  a_grid = a_grid[a_grid > r0]
  if a_grid.size == 0:
    raise CurveDataError(f"no A on the grid lies above R0 = {r0:g}")
  c_mid_grid = np.asarray(default_c_mid_grid(c) if c_mid_grid is None else c_mid_grid, dtype=float)
  # Screen: S[m, b, n] = sigmoid(B_b (ln C_n - ln C_mid_m)); SSE(A) = (A-R0)^2 sum S^2 - 2 (A-R0) sum S y + sum y^2.
  y = r - r0
  s = expit(B_SCREEN[None, :, None] * (np.log(c)[None, None, :] - np.log(c_mid_grid)[:, None, None]))
  s2, sy, yy = np.sum(s * s, -1), np.sum(s * y, -1), float(np.sum(y * y))
  da = (a_grid - r0)[:, None, None]
  sse = da**2 * s2[None] - 2 * da * sy[None] + yy  # [A, C_mid, B]
  best_b = np.argmin(sse, axis=-1)  # [A, C_mid]
  cell_sse = np.take_along_axis(sse, best_b[..., None], -1)[..., 0]
  # At the `polish` best A values (each with its best screened C_mid): fit B with curve_fit (the paper's step),
  # then, with `refine`, (B, C_mid) continuously; keep the least SSE.
  best = None
  for ia in np.argsort(np.min(cell_sse, axis=1))[:polish]:
    im = int(np.argmin(cell_sse[ia]))
    a, c_mid = float(a_grid[ia]), float(c_mid_grid[im])
    f = lambda cc, b, a=a, c_mid=c_mid: sigmoid_curve(cc, a, b, c_mid, r0)  # noqa: E731
    try:
      (b,), _ = _curve_fit(f, c, r, p0=[B_SCREEN[best_b[ia, im]]])
    except RuntimeError:
      continue
    if b <= 0:
      continue
    cand = SigmoidParams(a, float(b), c_mid, r0)
    cand = (cand, float(np.sum((cand(c) - r) ** 2)))
    if refine:
      cand = _refine(c, r, cand)
    if best is None or cand[1] < best[1]:
      best = cand
  if best is None:
    raise CurveDataError("the grid fit found no curve (curve_fit failed in every candidate cell)")
  params, sse_ = best
  return LsqFit(params, sse_, len(c), "paper", _covariance(c, r, params, False))


def _refine(c, r, best):
  """Continuous least squares on (ln B, ln C_mid) with A and R0 held; kept only if it lowers the SSE."""
  p, _ = best
  f = lambda cc, lb, lm: sigmoid_curve(cc, p.A, np.exp(lb), np.exp(lm), p.R0)  # noqa: E731
  try:
    (lb, lm), _ = _curve_fit(f, c, r, p0=[np.log(p.B), np.log(p.C_mid)],
                             bounds=([np.log(B_BOUNDS[0]), -np.inf], [np.log(B_BOUNDS[1]), np.inf]))
  except (RuntimeError, ValueError):
    return best
  cand = SigmoidParams(p.A, float(np.exp(lb)), float(np.exp(lm)), p.R0)
  cand_sse = float(np.sum((cand(c) - r) ** 2))
  return (cand, cand_sse) if cand_sse < best[1] else best


def _best_start(f, c, r, starts, what: str, **kw):
  """`curve_fit` from each start; the least sum of squared residuals wins."""
  best = None
  for p0 in starts:
    try:
      theta, _ = _curve_fit(f, c, r, p0=p0, **kw)
    except (RuntimeError, ValueError):
      continue
    sse = float(np.sum((f(c, *theta) - r) ** 2))
    if best is None or sse < best[1]:
      best = (theta, sse)
  if best is None:
    raise CurveDataError(f"{what} fit failed from every start")
  return best


def fit_fixed_a(c, r, r0: float, a: float, **kw) -> LsqFit:
  """(B, C_mid) by least squares with A held at `a` (the paper's rule for comparing B across runs)."""
  fit = fit_paper(c, r, r0, a_grid=[a], **kw)
  return dataclasses.replace(fit, method="fixed_a")


def fit_free(c, r, r0: float, *, fit_r0: bool = False) -> LsqFit:
  """Bounded least squares on (A, ln B, ln C_mid) — and R0 when `fit_r0` (then `r0` is only the start value).

  Bounds: R0 <= A <= 1 (0 <= A <= 1 with fit_r0), 0.05 <= B <= 20, ln C_mid within [ln min C - 7, ln max C + 5];
  R0 in [0, 1]. Several starts; the least SSE wins. Points with C = 0 inform R0 only (model value R0).
  """
  c, r = _check(c, r)
  pos = c[c > 0]
  lo_m, hi_m = np.log(pos.min()) - 7.0, np.log(pos.max()) + 5.0
  r_top = float(np.max(r))
  lo = [0.0 if fit_r0 else r0, np.log(B_BOUNDS[0]), lo_m] + ([0.0] if fit_r0 else [])
  hi = [1.0, np.log(B_BOUNDS[1]), hi_m] + ([1.0] if fit_r0 else [])

  def f(cc, a, lb, lm, *rr):
    return sigmoid_curve(cc, a, np.exp(lb), np.exp(lm), rr[0] if fit_r0 else r0)

  def jac(cc, *theta):
    p = SigmoidParams(theta[0], np.exp(theta[1]), np.exp(theta[2]), theta[3] if fit_r0 else r0)
    return _jacobian(cc, p, fit_r0)

  starts = [np.clip([a0, np.log(1.5), m0] + ([r0] if fit_r0 else []), np.array(lo) + 1e-9, np.array(hi) - 1e-9)
            for a0 in (min(r_top + 0.02, 0.99), min(r_top + 0.3 * (1 - r_top), 0.995))
            for m0 in (np.log(np.median(pos)), np.log(pos.max()))]
  theta, sse = _best_start(f, c, r, starts, "free sigmoid", bounds=(lo, hi), jac=jac)
  params = SigmoidParams(float(theta[0]), float(np.exp(theta[1])), float(np.exp(theta[2])),
                         float(theta[3]) if fit_r0 else float(r0))
  return LsqFit(params, sse, len(c), "free", _covariance(c, r, params, fit_r0), fit_r0)


def fit_power_law(c, r) -> PowerLawFit:
  """Bounded least squares for R = A - D / C^B on (A, ln D, B): 0 <= A <= 1, 0.01 <= B <= 10. C must be > 0."""
  c, r = _check(c, r)
  if np.any(c <= 0):
    raise CurveDataError("the power law needs C > 0 (it diverges at zero compute)")
  f = lambda cc, a, ld, b: a - np.exp(ld - b * np.log(cc))  # noqa: E731
  a0 = min(float(np.max(r)) + 0.05, 0.999)
  starts = [[a0, np.log(max(a0 - float(r[0]), 1e-3)) + b0 * np.log(c[0]), b0] for b0 in (0.3, 1.0, 2.0)]
  (a, ld, b), sse = _best_start(f, c, r, starts, "power-law", bounds=([0.0, -np.inf, 0.01], [1.0, np.inf, 10.0]))
  return PowerLawFit(PowerLawParams(float(a), float(np.exp(ld)), float(b)), sse, len(c))
