"""Held-out evaluation through the rollout engine: mean@n at a temperature, greedy pass@1, per-prompt counts.

Runs on its own decode state (`RolloutDriver.generate_all`), so in-flight training rollouts are untouched. The
per-prompt success counts go into the metrics so the curve fit can use a binomial likelihood.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from scalerl_jax import types
from scalerl_jax.rewards.pass_rates import eval_metrics
from scalerl_jax.rollout.sampling import GREEDY, SamplingParams


class Evaluator:
  """Scores params on the held-out prompts with the run's reward runner (its failures are counted there too)."""

  def __init__(self, driver, tokenizer, rewards, prompts: Sequence[types.Prompt], n: int, temperature: float,
               seed: int):
    self.driver, self.tokenizer, self.rewards, self.seed = driver, tokenizer, rewards, seed
    self.prompts, self.n, self.temperature = list(prompts), n, temperature  # fixed at start, never trained on

  def correctness(self, params: Any, version: int, prompts: Sequence[types.Prompt], n: int,
                  sampling: SamplingParams) -> np.ndarray:
    """bool[P, n]: which samples of each prompt succeeded."""
    groups = self.driver.generate_all(params, version, prompts, n, sampling=sampling, seed=self.seed)
    scored = self.rewards.score_groups(groups, self.tokenizer.decode)
    self._failures += sum(g.reward_failures for g in scored)
    return np.stack([g.success for g in scored]) if scored else np.zeros((0, n), bool)

  def evaluate(self, params: Any, version: int) -> dict:
    """mean@n at the evaluation temperature, greedy pass@1, per-prompt counts, and the wall time it took."""
    t0, self._failures = time.perf_counter(), 0
    prompts, n = self.prompts, self.n
    greedy_P1 = self.correctness(params, version, prompts, 1, GREEDY)
    correct_PN = self.correctness(params, version, prompts, n, SamplingParams(temperature=self.temperature))
    counts = correct_PN.sum(axis=1)
    out = eval_metrics(correct_PN, ks=(1, n))
    out.update({
        "eval/pass_rate": float(correct_PN.mean()),  # mean@n (equal prompts x n samples)
        "eval/greedy_pass_at_1": float(greedy_P1.mean()),
        "eval/n_correct": int(counts.sum()),
        "eval/n_total": int(correct_PN.size),
        "eval/samples_per_prompt": n,
        "eval/per_prompt_correct": counts.tolist(),
        "eval/interruption_rate": self.driver.last_eval_stats.interruption_rate,
        "eval/truncation_rate": self.driver.last_eval_stats.truncation_rate,
        "eval/reward_failures": self._failures,  # verifier calls that raised or timed out, scored as failures
        "eval/seconds": time.perf_counter() - t0,
    })
    out.update(per_task_metrics([p.task for p in prompts], correct_PN, greedy_P1))
    return out


def per_task_metrics(tasks: Sequence[str], correct_PN: np.ndarray, greedy_P1: np.ndarray) -> dict:
  """Mixed tasks: eval/<task>/{pass_rate, greedy_pass_at_1, n_correct, n_total, per_prompt_correct} over each
  task's prompts (the keys scaling.io reads for a per-task curve); {} when the prompts carry no task."""
  tasks_P = np.asarray(tasks)
  out: dict = {}
  for task in sorted(set(tasks) - {""}):
    mine = tasks_P == task
    correct, counts = correct_PN[mine], correct_PN[mine].sum(axis=1)
    out.update({f"eval/{task}/pass_rate": float(correct.mean()),
                f"eval/{task}/greedy_pass_at_1": float(greedy_P1[mine].mean()),
                f"eval/{task}/n_correct": int(counts.sum()), f"eval/{task}/n_total": int(correct.size),
                f"eval/{task}/per_prompt_correct": counts.tolist()})
  return out
