"""What a fit's predictive bands and priors were calibrated on: one JSON file, shipped or refitted per task.

    {"name": "...",                       what the report names: the studies, tasks and runs it was fitted on
     "discrepancy": {"paper": {...}, "numpyro": {...}},   curves.Discrepancy per fitter (scale, power, df, scores)
     "prior": {...} | null,               prior.CurvePrior learned from the same runs' whole-run fits
     "use_prior": bool,                   whether the NumPyro fit uses that prior (measured: RESULTS.md)
     "cut_scores": {fitter: {cut: [...]}},  conformal scores per fit fraction (a fit uses the nearest cut's)
     "provenance": {...}}                 the command, date, machine and runs that made it

The shipped default (`DEFAULT_PATH`, scalerl_jax/scaling/calibration_default.json) is written by
benchmarks/calibration.py from the project's studies; refit on finished runs of your own task with one command,
    python benchmarks/calibration.py "runs/my_study/*/seed*" --write-calibration runs/my_study/calibration.json
and point a run at it (curve_fit.calibration=PATH, or launch/fit_curve.py --calibration PATH).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import re
from typing import Optional

from scalerl_jax.scaling.curves import Discrepancy
from scalerl_jax.scaling.points import CurveDataError
from scalerl_jax.scaling.prior import CurvePrior

DEFAULT_PATH = pathlib.Path(__file__).with_name("calibration_default.json")
FITTERS = ("paper", "numpyro")


@dataclasses.dataclass(frozen=True)
class Calibration:
  name: str
  discrepancy: dict  # fitter -> curves.Discrepancy
  prior: Optional[CurvePrior] = None
  use_prior: bool = False
  provenance: dict = dataclasses.field(default_factory=dict)
  path: str = ""
  cut_scores: dict = dataclasses.field(default_factory=dict)  # fitter -> {fit fraction: conformal scores}

  def for_cut(self, fitter: str, fit_upto: float) -> Discrepancy:
    """The fitter's discrepancy with the conformal scores of the runs cut nearest `fit_upto` (a band from a quarter
    of a run is judged by quarter cuts); the default scores without per-cut ones."""
    cuts = self.cut_scores.get(fitter)
    if not cuts:
      return self.discrepancy[fitter]
    cut = min(cuts, key=lambda c: (abs(float(c) - fit_upto), -float(c)))
    return dataclasses.replace(self.discrepancy[fitter], scores=tuple(cuts[cut]))

  @property
  def shape_prior(self) -> Optional[CurvePrior]:
    """The prior the NumPyro fit uses: the learned one when `use_prior`, else None (the generic priors)."""
    return self.prior if self.use_prior else None

  def describe(self, prior: Optional[CurvePrior] = None, given: bool = False, bands: str = "") -> str:
    """One line for a report: what the bands were calibrated on (or `bands`, when the caller set them), and the
    shape prior the fit used (`prior`: a learned one, this calibration's unless `given` by the caller; None: the
    generic priors)."""
    n = sum(len(d.scores) for d in self.discrepancy.values()) // max(len(self.discrepancy), 1)
    prior = ("generic shape prior" if prior is None else
             f"learned shape prior ({prior.n_runs} runs{', given by the caller' if given else ''})")
    where = "shipped default" if self.path == str(DEFAULT_PATH) else self.path or "in memory"
    return f"{bands or f'bands calibrated on {self.name} ({n} conformal scores; {where})'}; {prior}"

  def as_dict(self) -> dict:
    return {"name": self.name, "discrepancy": {k: d.as_dict() for k, d in self.discrepancy.items()},
            "prior": self.prior.as_dict() if self.prior else None, "use_prior": self.use_prior,
            "cut_scores": {k: {str(c): list(v) for c, v in d.items()} for k, d in self.cut_scores.items()},
            "provenance": self.provenance}


def _discrepancy(d: dict, where: str) -> Discrepancy:
  try:
    df = d.get("df")
    return Discrepancy(float(d["scale"]), float(d["power"]), float("inf") if df is None else float(df),
                       tuple(float(s) for s in d.get("scores", ())))
  except (KeyError, TypeError, ValueError) as e:
    raise CurveDataError(f"{where}: a discrepancy needs numeric scale, power, df and scores ({e})") from None


def from_dict(d: dict, path: str = "") -> Calibration:
  where = path or "calibration"
  missing = [f for f in FITTERS if f not in d.get("discrepancy", {})]
  if "name" not in d or missing:
    raise CurveDataError(f"{where}: a calibration needs 'name' and a discrepancy for each of {FITTERS} "
                         f"(missing: {['name'] if 'name' not in d else missing})")
  disc = {k: _discrepancy(v, f"{where}: discrepancy.{k}") for k, v in d["discrepancy"].items()}
  prior = CurvePrior.from_dict(d["prior"]) if d.get("prior") else None
  if d.get("use_prior") and prior is None:
    raise CurveDataError(f"{where}: use_prior is true but the file holds no prior")
  try:
    cut_scores = {k: {float(c): tuple(float(x) for x in v) for c, v in cuts.items()}
                  for k, cuts in (d.get("cut_scores") or {}).items()}
  except (AttributeError, TypeError, ValueError) as e:
    raise CurveDataError(f"{where}: cut_scores must map fitter -> fraction -> a list of numbers ({e})") from None
  return Calibration(d["name"], disc, prior, bool(d.get("use_prior")), d.get("provenance", {}), path, cut_scores)


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: tuple) -> Calibration:  # stamp: the file's (mtime, size), so an edit is read again
  try:
    d = json.loads(pathlib.Path(path).read_text())
  except json.JSONDecodeError as e:
    raise CurveDataError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
  return from_dict(d, path)


def load(path=None) -> Calibration:
  """The calibration at `path`; the shipped default when None or ""."""
  path = str(path or DEFAULT_PATH)
  try:
    st = pathlib.Path(path).stat()
  except FileNotFoundError:
    raise CurveDataError(f"{path}: no such calibration file") from None
  return _load(path, (st.st_mtime_ns, st.st_size))


def save(cal: Calibration, path) -> None:
  text = json.dumps(cal.as_dict(), indent=1)
  text = re.sub(r"\[[-0-9.eE,\s]+\]", lambda m: " ".join(m.group(0).split()), text)  # number lists on one line
  pathlib.Path(path).write_text(text + "\n")
