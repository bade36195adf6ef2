"""TaskRewards: one reward runner per task in one run (math and code mixed); each group is scored by its task's.

make_reward_runner(cfg.reward, {"math": "addition", "code": "code"}, sandbox=cfg.sandbox) builds one RewardRunner
per task (each with its own isolation: a pure math verifier inline, the code reward in its own worker pool of
reward.workers processes) and wraps them here. A TaskRewards has the RewardRunner methods a run uses
(start, close, context manager, score_groups, state, load_state, metrics); `score_groups` splits the groups by
`group.prompt.task`, scores each task's share with its runner (one batch per task) and returns the groups in their
order. A group whose task has no function stops the run (ConfigError naming the task and the known ones).

Metrics: the RewardRunner keys (runner.py) summed over tasks (failure_rate recomputed from the sums), and each
task's own under reward/<task>/...: reward/code/calls, reward/code/cause/timeout_wall, reward/math/failure_rate.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

import numpy as np

from scalerl_jax import types
from scalerl_jax.config import ConfigError

_TASK = re.compile(r"[a-z][a-z0-9_]*")
_SUMMED = ("reward/calls", "reward/errors", "reward/timeouts", "reward/killed_workers", "reward/score_s",
           "reward/queue")


class TaskRewards:
  """{task name: RewardRunner}; see the module docstring. Thread-safe as the runners are."""

  def __init__(self, runners: Mapping):
    if not runners:
      raise ValueError("TaskRewards needs at least one task")
    for task in runners:
      if not (isinstance(task, str) and _TASK.fullmatch(task)):
        raise ValueError(f"reward task names are short lowercase names (math, code), got {task!r}")
    scales = {r.scale for r in runners.values()}
    if len(scales) != 1:
      raise ValueError(f"every task's reward must use one scale, got {sorted(scales)}")
    self.runners = dict(runners)
    self.scale = scales.pop()

  def start(self) -> None:
    """Starts every runner, those with a sandbox first: a sandbox that does not work stops the run (its
    SandboxUnavailable) before any worker starts."""
    for runner in sorted(self.runners.values(), key=lambda r: r.sandbox is None):
      runner.start()

  def close(self) -> None:
    for runner in self.runners.values():
      runner.close()

  def __enter__(self) -> TaskRewards:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def score_groups(self, groups: Sequence[types.RolloutGroup],
                   decode: Callable[[np.ndarray], str]) -> list[types.ScoredGroup]:
    by_task: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
      by_task.setdefault(group.prompt.task, []).append(i)
    for task in by_task:
      if task not in self.runners:
        raise ConfigError(f"prompts of task {task!r} have no reward function (this run's tasks: "
                          f"{', '.join(sorted(self.runners))}); is the dataset's task field right?")
    out: list = [None] * len(groups)
    for task, indices in by_task.items():
      for i, scored in zip(indices, self.runners[task].score_groups([groups[i] for i in indices], decode)):
        out[i] = scored
    return out

  def state(self) -> dict:
    return {"tasks": {task: runner.state() for task, runner in self.runners.items()}}

  def load_state(self, state: dict) -> None:
    """Each task's totals; a task absent from `state` (a checkpoint of another mix, or of one task) starts at 0."""
    for task, task_state in state.get("tasks", {}).items():
      if task in self.runners:
        self.runners[task].load_state(task_state)

  def metrics(self) -> dict[str, float]:
    out: dict[str, float] = {key: 0 for key in _SUMMED}
    for task, runner in self.runners.items():
      for key, value in runner.metrics().items():
        out[key.replace("reward/", f"reward/{task}/", 1)] = value
        if key in _SUMMED or key.startswith("reward/cause/"):
          out[key] = out.get(key, 0) + value
    failed = out["reward/errors"] + out["reward/timeouts"]
    out["reward/failure_rate"] = failed / out["reward/calls"] if out["reward/calls"] else 0.0
    return out
