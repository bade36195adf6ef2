"""Held-out evaluation through the rollout engine: mean@n at a temperature, greedy pass@1, per-prompt counts, and
the greedy answers by the verifier's cause.

Runs on its own decode state (`RolloutDriver.generate_all`), so in-flight training rollouts are untouched. The
per-prompt success counts go into the metrics so the curve fit can use a binomial likelihood.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from scalerl_jax import types
from scalerl_jax.rewards.pass_rates import eval_metrics
from scalerl_jax.rollout.driver import RolloutStats
from scalerl_jax.rollout.sampling import GREEDY, SamplingParams


class Evaluator:
  """Scores params on the held-out prompts with the run's reward runner (its failures are counted there too).

  Several processes share the work with `shard=(i, m)` and `gather` (every evaluating process's record, in process
  order: a collective among them): process i scores prompts i, i + m, ... with the random streams those prompts
  have in a one-process run, and every process gets the metrics of the whole set.

  `between` is called before every decode step and may raise to abandon the evaluation (the job's stop check: a
  signal must not wait for a whole evaluation)."""

  def __init__(self, driver, tokenizer, rewards, prompts: Sequence[types.Prompt], n: int, temperature: float,
               seed: int, shard: tuple[int, int] = (0, 1), gather: Optional[Callable[[Any], list]] = None,
               between: Optional[Callable[[], None]] = None):
    self.driver, self.tokenizer, self.rewards, self.seed = driver, tokenizer, rewards, seed
    self.prompts, self.n, self.temperature = list(prompts), n, temperature  # fixed at start, never trained on
    self.shard, self.gather, self.between = shard, gather, between
    self._failures, self._greedy_causes = 0, collections.Counter()

  def correctness(self, params: Any, version: int, prompts: Sequence[types.Prompt], n: int,
                  sampling: SamplingParams, uid_stride: int = 1, uid_offset: int = 0) -> np.ndarray:
    """bool[P, n]: which samples of each prompt succeeded."""
    groups = self.driver.generate_all(params, version, prompts, n, sampling=sampling, seed=self.seed,
                                      uid_stride=uid_stride, uid_offset=uid_offset, between=self.between)
    scored = self.rewards.score_groups(groups, self.tokenizer.decode)
    self._failures += sum(g.reward_failures for g in scored)
    if sampling is GREEDY:
      self._greedy_causes.update(c for g in scored for c in g.causes if c is not None)
    return np.stack([g.success for g in scored]) if scored else np.zeros((0, n), bool)

  def _correctness_all(self, params: Any, version: int) -> tuple[np.ndarray, np.ndarray, RolloutStats]:
    """(greedy bool[P, 1], sampled bool[P, n], the sampled pass's rollout stats) over every held-out prompt, this process's shard
    scored here and the others' gathered."""
    i, m = self.shard
    mine = self.prompts[i::m]
    greedy = self.correctness(params, version, mine, 1, GREEDY, m, i)
    correct = self.correctness(params, version, mine, self.n, SamplingParams(temperature=self.temperature), m, i)
    stats = dataclasses.replace(self.driver.last_eval_stats)  # of the sampled pass (interruption, truncation)
    if m == 1:
      return greedy, correct, stats
    parts = self.gather((greedy, correct, stats, self._failures, self._greedy_causes))
    greedy_P1 = np.zeros((len(self.prompts), 1), bool)
    correct_PN = np.zeros((len(self.prompts), self.n), bool)
    total = RolloutStats()
    self._failures, self._greedy_causes = 0, collections.Counter()
    for j, (g, c, st, failures, causes) in enumerate(parts):
      greedy_P1[j::m], correct_PN[j::m] = g, c
      for k, v in dataclasses.asdict(st).items():
        setattr(total, k, getattr(total, k) + v)
      self._failures += failures
      self._greedy_causes += causes
    return greedy_P1, correct_PN, total

  def evaluate(self, params: Any, version: int) -> dict:
    """mean@n at the evaluation temperature, greedy pass@1, per-prompt counts, and the wall time it took."""
    t0, self._failures, self._greedy_causes = time.perf_counter(), 0, collections.Counter()
    prompts, n = self.prompts, self.n
    greedy_P1, correct_PN, stats = self._correctness_all(params, version)
    counts = correct_PN.sum(axis=1)
    out = eval_metrics(correct_PN, ks=(1, n))
    out.update({
        "eval/pass_rate": float(correct_PN.mean()),  # mean@n (equal prompts x n samples)
        "eval/greedy_pass_at_1": float(greedy_P1.mean()),
        "eval/n_correct": int(counts.sum()),
        "eval/n_total": int(correct_PN.size),
        "eval/samples_per_prompt": n,
        "eval/per_prompt_correct": counts.tolist(),
        "eval/interruption_rate": stats.interruption_rate,
        "eval/truncation_rate": stats.truncation_rate,
        "eval/reward_failures": self._failures,  # verifier calls that raised or timed out, scored as failures
        "eval/seconds": time.perf_counter() - t0,
        # the greedy answers by the verifier's cause, as fractions of the prompts (a verifier that says why it
        # scored: word_problems' "correct" / "correct_unboxed" / "boxed_wrong" / "wrong", the code reward's causes)
        **{f"eval/greedy_cause/{c}": k / max(1, len(prompts)) for c, k in sorted(self._greedy_causes.items())},
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
