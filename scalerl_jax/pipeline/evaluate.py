"""Held-out evaluation through the rollout engine: mean@n at a temperature, greedy pass@1, per-prompt counts.

Runs on its own decode state (`RolloutDriver.generate_all`), so in-flight training rollouts are untouched. The
per-prompt success counts go into the metrics so the curve fit can use a binomial likelihood.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from scalerl_jax import types
from scalerl_jax.data.evaluation import eval_metrics, is_success
from scalerl_jax.rollout.sampling import GREEDY, SamplingParams


class Evaluator:

  def __init__(self, driver, tokenizer, rewards, reward_scale: str, seed: int):
    self.driver, self.tokenizer, self.rewards = driver, tokenizer, rewards
    self.reward_scale, self.seed = reward_scale, seed

  def correctness(self, params: Any, version: int, prompts: Sequence[types.Prompt], n: int,
                  sampling: SamplingParams) -> np.ndarray:
    """bool[P, n]: which samples of each prompt succeeded."""
    groups = self.driver.generate_all(params, version, prompts, n, sampling=sampling, seed=self.seed)
    texts = [self.tokenizer.decode(s.tokens) for g in groups for s in g.samples]
    answers = [g.prompt.answer for g in groups for _ in g.samples]
    rewards, _ = self.rewards.score(texts, answers)
    return is_success(rewards, self.reward_scale).reshape(len(prompts), n)

  def evaluate(self, params: Any, version: int, prompts: Sequence[types.Prompt], n: int, temperature: float) -> dict:
    greedy_P1 = self.correctness(params, version, prompts, 1, GREEDY)
    correct_PN = self.correctness(params, version, prompts, n, SamplingParams(temperature=temperature))
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
    })
    return out
