"""Compute-performance curves: the ScaleRL sigmoid, the power law it is compared with, and their algebra.

Sigmoid (paper Eq. 1), with C the training compute (any positive unit: GPU-hours, accelerator-hours, FLOPs):

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
         = R0 + (A - R0) * sigmoid(B * (ln C - ln C_mid))        (the form evaluated here: stable, and exact at C = 0)

  A       asymptotic pass rate ("ceiling"), R0 <= A <= 1
  B > 0   scaling exponent ("efficiency"; larger = steeper in log C)
  C_mid   compute at which half of the gain A - R0 is reached
  R0      reward at zero training compute. R(0) = R0 exactly; the log-form handles C = 0 without division.

Power law (paper A.4), valid only for C >= C_0 (it diverges as C -> 0):

    R(C) = A - D / C^B

For C >> C_mid the sigmoid tends to that power law with D = (A - R0) * C_mid^B.

Linearised sigmoid (paper Fig. 7 caption), for R0 < R < A:

    F(R) = C_mid^B / ((A - R0) / (R - R0) - 1) = C^B      =>      ln F(R) = B * ln C

so ln F plotted against ln C is a line of slope B through the origin.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.special import expit


Z90 = 1.6448536269514722  # the standard normal's 95th percentile
# the distance ln(C / the last fitted C) over which a conformal band widens from the fit's own to the calibrated one:
# ln 2, a fit on the first half of a run's compute predicting its end (Discrepancy.ramp)
RAMP = float(np.log(2.0))


def logit(p) -> np.ndarray:
  """ln(p / (1 - p)), with p clipped to [1e-6, 1 - 1e-6]."""
  p = np.clip(np.asarray(p, dtype=float), 1e-6, 1 - 1e-6)
  return np.log(p) - np.log1p(-p)


def logit_sd(lo90, hi90) -> np.ndarray:
  """The sd on the logit scale of a band given by its 5 % and 95 % points (normal on that scale)."""
  return (logit(hi90) - logit(lo90)) / (2 * Z90)


@dataclasses.dataclass(frozen=True)
class Discrepancy:
  """The model discrepancy of a predictive band beyond the fitted data, on the logit scale: a sigmoid through a
  run's early part is not the run's exact shape, and the error of its extrapolation grows with the distance
  d = ln(C / the last fitted C). At compute C the band adds scale * d^power times a Student-t(df) draw (df = inf:
  normal); nothing inside the fit. Fitted on finished runs by benchmarks/calibration.py (analysis.discrepancy_mle;
  the shipped default, calibration_default.json, on the project's two studies).

  `scores` (optional) make the band conformal (split conformal prediction over runs): each is a finished run's
  |logit(final) - logit(prediction)| divided by the sd of its band (from its 90 % band, on the logit scale).
  Then the band at level L beyond the fit is the prediction -/+ q_L times that sd, with q_L the
  ceil((n + 1) L)-th smallest of the n scores (the largest when L asks for more than n scores can tell): under
  exchangeable runs it holds the final value with probability >= L, whatever the errors' shape. A parametric band
  cannot match both a 50 % and a 90 % level when most runs follow their curve and a few leave it."""
  scale: float = 0.0
  power: float = 1.0
  df: float = float("inf")
  scores: tuple = ()

  @staticmethod
  def distance(c, c_fit_last: float) -> np.ndarray:
    """ln(c / c_fit_last), 0 at and before it (and everywhere without a fit's last compute)."""
    c = np.asarray(c, dtype=float)
    if c_fit_last <= 0:
      return np.zeros(c.shape)
    return np.log(np.maximum(c, c_fit_last) / c_fit_last)

  def sd(self, c, c_fit_last: float) -> np.ndarray:
    """The scale at each compute c (0 at and before c_fit_last)."""
    d = self.distance(c, c_fit_last)
    return np.zeros(d.shape) if self.scale <= 0 else self.scale * d ** self.power

  def draws(self, rng: np.random.Generator, shape) -> np.ndarray:
    """Standard draws (Student-t with df degrees of freedom, or normal), to be multiplied by `sd`."""
    return rng.normal(size=shape) if np.isinf(self.df) else rng.standard_t(self.df, size=shape)

  def multiplier(self, level: float) -> float:
    """q_L of the scores (the class docstring)."""
    s = np.sort(np.asarray(self.scores, dtype=float))
    return float(s[min(int(np.ceil((s.size + 1) * level)), s.size) - 1])

  def conformal(self, lo90, med, hi90, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) at `level` from a band's 5 %, 50 % and 95 % points: med -/+ multiplier(level) * sd on the logit
    scale, sd = the 5-95 % width / (2 * 1.645)."""
    sd = logit_sd(lo90, hi90)
    m = self.multiplier(level)
    return expit(logit(med) - m * sd), expit(logit(med) + m * sd)

  @staticmethod
  def ramp(dist) -> np.ndarray:
    """The weight of the conformal band against the draws' own at distance `dist` = ln(C / the last fitted C): 0
    inside the fit, 1 from RAMP on (the distance of the calibration's extrapolations, half a run to its end), linear
    in between, so a band is continuous at the cut-off and exactly the calibrated one from RAMP on."""
    return np.clip(np.asarray(dist, dtype=float) / RAMP, 0.0, 1.0)

  def as_dict(self) -> dict:
    return {"scale": self.scale, "power": self.power, "df": None if np.isinf(self.df) else self.df,
            "scores": list(self.scores)}


def log_compute(c: np.ndarray) -> np.ndarray:
  """ln C with ln 0 = -inf (no warning), so that sigmoid(B * (-inf)) = 0 and R(0) = R0."""
  c = np.asarray(c, dtype=float)
  out = np.full(c.shape, -np.inf)
  np.log(c, out=out, where=c > 0)
  return out


def sigmoid_curve(c, a, b, c_mid, r0):
  """R(C) = R0 + (A - R0) * sigmoid(B * (ln C - ln C_mid)); broadcasts over every argument (numpy)."""
  return r0 + (a - r0) * expit(b * (log_compute(c) - np.log(c_mid)))


def power_law_curve(c, a, d, b):
  """R(C) = A - D / C^B (numpy; C must be > 0)."""
  return a - d * np.power(np.asarray(c, dtype=float), -b)


@dataclasses.dataclass(frozen=True)
class SigmoidParams:
  """Parameters of the sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)."""
  A: float
  B: float
  C_mid: float
  R0: float

  def __call__(self, c) -> np.ndarray:
    return sigmoid_curve(c, self.A, self.B, self.C_mid, self.R0)

  def compute_for(self, reward) -> np.ndarray:
    """Inverse of the curve: the compute at which R(C) = reward, i.e. C = C_mid * ((A-R0)/(R-R0) - 1)^(-1/B).

    nan outside the open interval (R0, A), which the curve never reaches.
    """
    r = np.asarray(reward, dtype=float)
    frac = (r - self.R0) / (self.A - self.R0)
    ok = (frac > 0) & (frac < 1)
    safe = np.where(ok, frac, 0.5)
    return np.where(ok, self.C_mid * (1.0 / safe - 1.0) ** (-1.0 / self.B), np.nan)

  def power_law_limit(self) -> "PowerLawParams":
    """The high-compute limit A - D / C^B with D = (A - R0) * C_mid^B (paper A.4)."""
    return PowerLawParams(A=self.A, D=(self.A - self.R0) * self.C_mid**self.B, B=self.B)

  def as_dict(self) -> dict:
    return {k: float(v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True)
class PowerLawParams:
  """Parameters of the power law R(C) = A - D / C^B."""
  A: float
  D: float
  B: float

  def __call__(self, c) -> np.ndarray:
    return power_law_curve(c, self.A, self.D, self.B)

  def as_dict(self) -> dict:
    return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def log_f(reward, a, c_mid, b, r0) -> np.ndarray:
  """The linearised ordinate ln F(R) = B ln C_mid - ln((A - R0)/(R - R0) - 1); nan where R is outside (R0, A).

  For points on the curve, ln F(R(C)) = B ln C: a line of slope B (paper Fig. 7).
  """
  r = np.asarray(reward, dtype=float)
  frac = (r - r0) / (a - r0)
  ok = (frac > 0) & (frac < 1)
  safe = np.where(ok, frac, 0.5)
  return np.where(ok, b * np.log(c_mid) - np.log(1.0 / safe - 1.0), np.nan)
