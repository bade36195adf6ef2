"""Metrics sinks (metrics.jsonl + tensorboardX) and compute accounting.

metrics.jsonl holds one JSON object per optimizer step (and one for the step-0 evaluation); keys are
`group/name`. The curve fit reads `compute/accelerator_seconds` or `compute/flops` against `eval/pass_rate`.
On resume the file is cut back to the checkpoint's step so that the series continues without duplicates.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Any, Optional


def _jsonable(v: Any) -> Any:
  if isinstance(v, float) and not math.isfinite(v):
    return None
  if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
    return _jsonable(v.item())
  return v


class MetricsLogger:

  def __init__(self, run_dir: pathlib.Path, tensorboard: bool, resume_step: Optional[int] = None):
    self.path = run_dir / "metrics.jsonl"
    self.prompts_path = run_dir / "consumed_prompts.jsonl"
    if resume_step is None:
      for p in (self.path, self.prompts_path):
        p.unlink(missing_ok=True)
    else:  # metrics lines carry the version after the step (<= s survive); prompt lines the batch index (< s)
      self._truncate(self.path, resume_step)
      self._truncate(self.prompts_path, resume_step - 1)
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step)

  @staticmethod
  def _truncate(path: pathlib.Path, step: int) -> None:
    """Keeps lines of steps <= `step` (lines written after the checkpoint are replayed by the resumed run)."""
    if not path.exists():
      return
    keep = []
    for line in path.read_text().splitlines():
      try:
        if json.loads(line).get("step", 0) <= step:
          keep.append(line)
      except json.JSONDecodeError:  # a line cut by a kill
        break
    path.write_text("".join(l + "\n" for l in keep))

  def write(self, step: int, metrics: dict) -> None:
    record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}, "time/unix": time.time()}
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(_tb_name(k), v, step)

  def write_prompts(self, step: int, prompt_ids: list[str]) -> None:
    with self.prompts_path.open("a") as f:
      f.write(json.dumps({"step": step, "prompt_ids": prompt_ids}) + "\n")

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _tb_name(key: str) -> str:
  """TensorBoard's name for a metric: '@' is not allowed there (tensorboardX would rename it and log each time)."""
  return key.replace("@", "_at_")


class ComputeMeter:
  """Cumulative compute: accelerator-seconds = wall time of the RL loop (evaluation and checkpointing excluded)
  x devices, split between generator and trainer meshes (by busy time when they share devices); analytic FLOPs
  of generation (forward) and training (forward + backward)."""

  def __init__(self, generator_devices: int, trainer_devices: int, colocated: bool, state: Optional[dict] = None):
    self.gen_devices, self.train_devices, self.colocated = generator_devices, trainer_devices, colocated
    state = state or {}
    self.wall_s = state.get("wall_s", 0.0)
    self.gen_flops = state.get("gen_flops", 0.0)
    self.train_flops = state.get("train_flops", 0.0)
    self.gen_busy_s = state.get("gen_busy_s", 0.0)
    self.train_busy_s = state.get("train_busy_s", 0.0)
    self._mark: Optional[float] = None
    self._excluded = 0.0

  def start(self) -> None:
    self._mark, self._excluded = time.perf_counter(), 0.0

  def exclude(self, seconds: float) -> None:
    self._excluded += seconds

  def tick(self) -> None:
    now = time.perf_counter()
    if self._mark is not None:
      self.wall_s += max(now - self._mark - self._excluded, 0.0)
    self._mark, self._excluded = now, 0.0

  def state(self) -> dict:
    return {"wall_s": self.wall_s, "gen_flops": self.gen_flops, "train_flops": self.train_flops,
            "gen_busy_s": self.gen_busy_s, "train_busy_s": self.train_busy_s}

  def metrics(self) -> dict:
    if self.colocated:
      total = self.wall_s * self.train_devices
      share = self.gen_busy_s / max(self.gen_busy_s + self.train_busy_s, 1e-9)
      gen, train = total * share, total * (1 - share)
    else:
      gen, train = self.wall_s * self.gen_devices, self.wall_s * self.train_devices
    return {
        "compute/accelerator_seconds": gen + train,
        "compute/accelerator_hours": (gen + train) / 3600.0,
        "compute/generator_accelerator_seconds": gen,
        "compute/trainer_accelerator_seconds": train,
        "compute/flops": self.gen_flops + self.train_flops,
        "compute/generator_flops": self.gen_flops,
        "compute/trainer_flops": self.train_flops,
        "compute/wall_seconds": self.wall_s,
    }
