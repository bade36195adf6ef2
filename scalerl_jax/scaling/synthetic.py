"""Synthetic runs with known curves, for tests, the notebook and the quality benchmark.

An evaluation at compute C scores `n_prompts` held-out prompts with `samples_per_prompt` samples each (paper:
1000 x 16, every 100 steps). Noise models:
  * binomial (default): n_correct ~ Binomial(n_prompts * samples_per_prompt, R(C));
  * per-prompt, with `prompt_phi`: prompt j's pass rate p_j ~ Beta(R phi, (1 - R) phi), drawn afresh at every
    evaluation, and k_j ~ Binomial(samples_per_prompt, p_j) — the beta-binomial model of `bayes.py`.
"""

from __future__ import annotations

import json
import pathlib
from typing import Dict, Optional, Tuple

import numpy as np

from scalerl_jax.scaling.curves import SigmoidParams
from scalerl_jax.scaling.points import CurvePoints

# Paper Table 1 (v1 A.13): name -> (C_mid GPU-hours, B, A). R0 is not reported.
PAPER_TABLE1: Dict[str, Tuple[float, float, float]] = {
    "ScaleRL": (2542.0, 1.92, 0.610),
    "ScaleRL-32k": (11272.0, 1.89, 0.645),
    "ScaleRL-8gen": (2542.0, 2.44, 0.585),
    "ScaleRL-24gen": (3054.0, 2.22, 0.590),
    "ScaleRL-32gen": (2936.0, 2.07, 0.595),
    "ScaleRL-Scout": (4242.0, 1.65, 0.710),
    "ScaleRL-bs512": (2818.0, 1.77, 0.605),
    "ScaleRL-bs2048": (10909.0, 1.70, 0.645),
    "ScaleRL-math+code-math": (2896.0, 2.05, 0.595),
    "ScaleRL-math+code-code": (1675.0, 1.09, 0.615),
}


def table1(name: str, r0: float = 0.3) -> SigmoidParams:
  c_mid, b, a = PAPER_TABLE1[name]
  return SigmoidParams(A=a, B=b, C_mid=c_mid, R0=r0)


def synthetic_run(params: SigmoidParams, c_max: float, *, n_evals: int = 80, n_prompts: int = 1000,
                  samples_per_prompt: int = 16, prompt_phi: Optional[float] = None, noise: bool = True,
                  seed: int = 0, name: str = "") -> CurvePoints:
  """A run evaluated at C = 0 (the R0 point) and `n_evals` evenly spaced computes up to `c_max`."""
  rng = np.random.default_rng(seed)
  c = np.linspace(0.0, c_max, n_evals + 1)
  mu = params(c)
  n = n_prompts * samples_per_prompt
  if not noise:
    return CurvePoints(c, mu, name=name)
  if prompt_phi is None:
    k = rng.binomial(n, mu)
    return CurvePoints(c, k / n, k, np.full(c.shape, n), name=name)
  p = rng.beta(mu[:, None] * prompt_phi, (1 - mu[:, None]) * prompt_phi, size=(c.size, n_prompts))
  per = rng.binomial(samples_per_prompt, p)
  k = per.sum(axis=1)
  return CurvePoints(c, k / n, k, np.full(c.shape, n), per, samples_per_prompt, name=name)


def write_run_dir(points: CurvePoints, run_dir, steps_per_eval: int = 100,
                  flops_per_hour: float = 1e18) -> pathlib.Path:
  """Writes `points` (compute in accelerator-hours) as the trainer's RUN_DIR/metrics.jsonl; returns its path.

  Each evaluation line carries the step, the compute keys (generator FLOPs: half of all) and the eval/* keys; a non-eval line (a train step)
  sits between evaluations, as in a real run.
  """
  run_dir = pathlib.Path(run_dir)
  run_dir.mkdir(parents=True, exist_ok=True)
  path = run_dir / "metrics.jsonl"
  with path.open("w") as f:
    for i, (c, r) in enumerate(zip(points.compute, points.reward)):
      step = i * steps_per_eval
      compute = {"compute/accelerator_seconds": float(c) * 3600.0, "compute/flops": float(c) * flops_per_hour,
                 "compute/generator_flops": float(c) * flops_per_hour / 2}
      if i:
        f.write(json.dumps({"step": step - 1, "train/loss": 0.0, **compute}) + "\n")
      rec = {"step": step, **compute, "eval/pass_rate": float(r)}
      if points.has_counts:
        rec.update({"eval/n_correct": int(points.n_correct[i]), "eval/n_total": int(points.n_total[i])})
      if points.per_prompt is not None:
        rec.update({"eval/per_prompt_correct": points.per_prompt[i].tolist(),
                    "eval/samples_per_prompt": int(points.samples_per_prompt)})
      f.write(json.dumps(rec) + "\n")
  return path
