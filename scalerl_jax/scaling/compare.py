"""Comparing runs (recipes): ceilings, efficiencies, where curves cross (paper A.5, A.8 and Fig. 7).

  * P(A1 > A2): from the two (independent) posteriors, over all pairs of samples.
  * B: compared only when |A1 - A2| < 0.02 (the paper's error margin on A, from three seeds varying by <= 0.015);
    both runs are then refitted with A fixed to the mean of the two, and the higher B "is at least as good in
    terms of efficient scalability". Otherwise A decides and B is not compared.
  * crossings: the computes at which R1(C) = R2(C) — a more efficient recipe with a lower A is overtaken there.
  * linearised: ln F(R) = B ln C (curves.log_f), so refits at a common A plot as lines whose slopes are B.
"""

from __future__ import annotations

import itertools
from typing import List, Optional, Sequence, Tuple

import numpy as np
from scipy.optimize import brentq

from scalerl_jax.scaling.analysis import RunFit
from scalerl_jax.scaling.bayes import BayesFit
from scalerl_jax.scaling.curves import SigmoidParams, log_f
from scalerl_jax.scaling.fit import LsqFit, fit_fixed_a

A_MARGIN = 0.02


def prob_a_greater(f1: BayesFit, f2: BayesFit) -> float:
  """P(A1 > A2) = mean over all sample pairs of [a1 > a2] (independent posteriors)."""
  a2 = np.sort(f2.param("A"))
  return float(np.mean(np.searchsorted(a2, f1.param("A"), side="left")) / a2.size)


def refit_common_a(runs: Sequence[RunFit], a: Optional[float] = None) -> Tuple[float, List[LsqFit]]:
  """Refits every run with A fixed to `a` (default: the mean of their least-squares A): (A, fits)."""
  if a is None:
    a = float(np.mean([r.lsq.params.A for r in runs]))
  fits = [fit_fixed_a(r.window.fit.compute, r.window.fit.reward, r.window.r0, a) for r in runs]
  return a, fits


def compare_b(r1: RunFit, r2: RunFit, margin: float = A_MARGIN) -> dict:
  """The paper's rule: B is compared, at a common A, only when the two A differ by less than `margin`."""
  a1, a2 = r1.lsq.params.A, r2.lsq.params.A
  if round(abs(a1 - a2), 9) >= margin:  # rounded: grid values 0.61 - 0.59 must count as 0.02 exactly
    return {"comparable": False, "reason": f"|A1 - A2| = {abs(a1 - a2):.3f} >= {margin}: A decides"}
  a, (f1, f2) = refit_common_a([r1, r2])
  b1, b2 = f1.params.B, f2.params.B
  return {"comparable": True, "A_common": a, "B": [b1, b2], "C_mid": [f1.params.C_mid, f2.params.C_mid],
          "higher_B": 0 if b1 >= b2 else 1}


def crossings(p1: SigmoidParams, p2: SigmoidParams, c_lo: float, c_hi: float, n: int = 2000) -> List[float]:
  """Computes in [c_lo, c_hi] (c_lo > 0) where the two curves cross: sign changes of R1 - R2 on a log grid,
  each refined with brentq."""
  diff = lambda c: float(p1(c) - p2(c))  # noqa: E731
  grid = np.geomspace(c_lo, c_hi, n)
  d = p1(grid) - p2(grid)
  out = []
  for i in np.flatnonzero(np.sign(d[:-1]) * np.sign(d[1:]) < 0):
    out.append(float(brentq(diff, grid[i], grid[i + 1], xtol=1e-12 * grid[i], rtol=1e-10)))
  return out + [float(g) for g in grid[d == 0]]


def linearised(run: RunFit, params: Optional[SigmoidParams] = None) -> Tuple[np.ndarray, np.ndarray]:
  """(ln C, ln F(R)) of a run's curve points (fit window and held-out) that lie strictly inside (R0, A)."""
  p = params or run.lsq.params
  c = np.concatenate([run.window.fit.compute, run.window.held_out.compute])
  r = np.concatenate([run.window.fit.reward, run.window.held_out.reward])
  lf = log_f(r, p.A, p.C_mid, p.B, p.R0)
  ok = np.isfinite(lf)
  return np.log(c[ok]), lf[ok]


def compare_runs(runs: Sequence[RunFit], margin: float = A_MARGIN) -> List[dict]:
  """Every pair: A of each, P(A_i > A_j) when both have posteriors, the B comparison rule, crossing computes."""
  out = []
  for (i, ri), (j, rj) in itertools.combinations(enumerate(runs), 2):
    lo = min(float(np.min(r.window.fit.compute)) for r in (ri, rj))
    hi = 100.0 * max(r.c_last for r in (ri, rj))
    pair = {"runs": [ri.name or str(i), rj.name or str(j)], "A": [ri.lsq.params.A, rj.lsq.params.A],
            "B_rule": compare_b(ri, rj, margin), "crossings": crossings(ri.lsq.params, rj.lsq.params, lo, hi)}
    if ri.bayes is not None and rj.bayes is not None:
      pair["p_A1_greater"] = prob_a_greater(ri.bayes, rj.bayes)
    out.append(pair)
  return out


def format_comparison(pair: dict) -> str:
  """One line for a `compare_runs` entry."""
  (n1, n2), (a1, a2), rule = pair["runs"], pair["A"], pair["B_rule"]
  text = f"{n1} vs {n2}: A {a1:.3f} vs {a2:.3f}"
  if "p_A1_greater" in pair:
    text += f", P(A1 > A2) = {pair['p_A1_greater']:.2f}"
  if rule["comparable"]:
    text += f"; at common A={rule['A_common']:.3f}: B {rule['B'][0]:.2f} vs {rule['B'][1]:.2f}"
  else:
    text += f"; B not compared ({rule['reason']})"
  cross = ", ".join(f"{c:.4g}" for c in pair["crossings"]) or "none in range"
  return text + f"; curves cross at C = {cross}"
