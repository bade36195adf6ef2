"""No-Positive-Resampling (paper section 3.2, from Polaris): drop prompts the policy already solves.

Every training group reports its prompt's pass rate (fraction of the G samples that succeeded). A prompt whose
history reaches `threshold` (default 0.9) after at least `min_observations` groups is *solved*; solved prompts are
left out of every later epoch. The choices the paper leaves open, made here:
  - `history = "last"`: the last observed pass rate decides (as TRL's ScaleRL trainer);
    `history = "cumulative"`: the running mean of all observed pass rates (as the prime-rl fork's Welford mean).
  - Removal is permanent: once solved, a prompt stays solved even if a later observation (e.g. a group of the same
    epoch still in flight) is lower. The paper says "permanently remove".
  - Only training rollouts should be reported; held-out evaluation never feeds NPR.
  - Removal takes effect from the next epoch: the prompt pipeline filters a new epoch with `removed_ids(count)`,
    so the epoch in progress is untouched. Solved ids are kept in the order they were solved, with the step that
    solved each, which makes that snapshot a single integer in the pipeline's checkpoint and lets it be taken as of
    a fixed step: `num_removed_before(step)` counts the prompts solved by steps < step. The pipeline asks for the
    count as of step b - k when batch b starts an epoch (k = the staleness bound: steps < b - k are always done
    then), so the snapshot does not depend on how far the trainer has got (runs and resumes replay exactly).
  - With `enabled = False` the history is still recorded (for metrics) but nothing is ever removed.

State is a JSON-able dict (`state_dict` / `load_state_dict`); floats round-trip exactly through JSON.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

_VERSION = 1


class NPRState:

  def __init__(self, cfg):
    if cfg.history not in ("last", "cumulative"):
      raise ValueError(f"data.npr.history must be last or cumulative, got {cfg.history!r}")
    self.cfg = cfg
    self._count: dict[str, int] = {}
    self._last: dict[str, float] = {}
    self._mean: dict[str, float] = {}
    self._solved: list[str] = []  # in the order prompts were solved
    self._solved_at: list[int] = []  # the step that solved each (-1: unknown)
    self._solved_set: set[str] = set()

  def update(self, prompt_ids: Sequence[str], pass_rates: Iterable[float], step: int = -1) -> list[str]:
    """Records one observed pass rate per prompt id (the groups of optimizer step `step`); returns the ids newly
    solved by these observations."""
    newly = []
    for pid, rate in zip(prompt_ids, pass_rates, strict=True):
      rate = float(rate)
      if not 0.0 <= rate <= 1.0:
        raise ValueError(f"pass rate of {pid!r} must be in [0, 1], got {rate}")
      count = self._count.get(pid, 0) + 1
      self._count[pid] = count
      self._last[pid] = rate
      self._mean[pid] = self._mean.get(pid, 0.0) + (rate - self._mean.get(pid, 0.0)) / count
      if self.cfg.enabled and pid not in self._solved_set and count >= self.cfg.min_observations \
          and self.history(pid) >= self.cfg.threshold:
        self._solved.append(pid)
        self._solved_at.append(int(step))
        self._solved_set.add(pid)
        newly.append(pid)
    return newly

  def history(self, prompt_id: str) -> float:
    """The pass rate NPR judges the prompt by (last or running mean); 0 if never observed."""
    source = self._last if self.cfg.history == "last" else self._mean
    return source.get(prompt_id, 0.0)

  def observations(self, prompt_id: str) -> int:
    return self._count.get(prompt_id, 0)

  def is_removed(self, prompt_id: str) -> bool:
    return prompt_id in self._solved_set

  @property
  def num_removed(self) -> int:
    return len(self._solved)

  @property
  def num_tracked(self) -> int:
    return len(self._count)

  def num_removed_before(self, step: int) -> int:
    """Prompts solved by the steps before `step` (solve steps only grow, so this is a prefix of the solved ids)."""
    return sum(1 for s in self._solved_at if s < step)

  def removed_ids(self, count: Optional[int] = None) -> frozenset[str]:
    """The first `count` solved ids (all by default): the snapshot an epoch is filtered with."""
    return frozenset(self._solved if count is None else self._solved[:count])

  def state_dict(self) -> dict:
    ids = list(self._count)
    return {"version": _VERSION, "ids": ids, "count": [self._count[i] for i in ids],
            "last": [self._last[i] for i in ids], "mean": [self._mean[i] for i in ids], "solved": list(self._solved),
            "solved_at": list(self._solved_at)}

  def load_state_dict(self, state: dict) -> None:
    if state.get("version") != _VERSION:
      raise ValueError(f"NPR state version {state.get('version')!r} is not {_VERSION}")
    ids = list(state["ids"])
    if not len(ids) == len(state["count"]) == len(state["last"]) == len(state["mean"]):
      raise ValueError("NPR state: ids, count, last and mean differ in length")
    self._count = {i: int(c) for i, c in zip(ids, state["count"])}
    self._last = {i: float(v) for i, v in zip(ids, state["last"])}
    self._mean = {i: float(v) for i, v in zip(ids, state["mean"])}
    self._solved = list(state["solved"])
    self._solved_at = [int(s) for s in state.get("solved_at", [-1] * len(self._solved))]
    self._solved_set = set(self._solved)

  def metrics(self) -> dict[str, float]:
    return {"npr/removed": self.num_removed, "npr/tracked": self.num_tracked}
