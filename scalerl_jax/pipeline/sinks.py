"""Metric sinks: metrics.jsonl (+ tensorboardX) and the consumed-prompt log.

metrics.jsonl holds one JSON object per optimizer step (and one for the step-0 evaluation); keys are
`group/name`. The curve fit reads one `compute/...` key (scaling.io.X_AXES; by default `compute/generator_flops`)
against `eval/pass_rate`.
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
  """`enabled=False` (every process of a multi-process run but process 0) writes nothing; `suffix` names another
  process's own files (metrics<suffix>.jsonl, logging.every_process)."""

  def __init__(self, run_dir: pathlib.Path, tensorboard: bool, resume_step: Optional[int] = None,
               enabled: bool = True, suffix: str = ""):
    self.path = run_dir / f"metrics{suffix}.jsonl"
    self.prompts_path = run_dir / f"consumed_prompts{suffix}.jsonl"
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    if resume_step is None:
      for p in (self.path, self.prompts_path):
        p.unlink(missing_ok=True)
    else:  # metrics lines carry the version after the step (<= s survive); prompt lines the batch index (< s)
      self._truncate(self.path, resume_step)
      self._truncate(self.prompts_path, resume_step - 1)
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
    if not self.enabled:
      return
    record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}, "time/unix": time.time()}
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(_tb_name(k), v, step)

  def write_prompts(self, step: int, prompt_ids: list[str]) -> None:
    if not self.enabled:
      return
    with self.prompts_path.open("a") as f:
      f.write(json.dumps({"step": step, "prompt_ids": prompt_ids}) + "\n")

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _tb_name(key: str) -> str:
  """TensorBoard's name for a metric: '@' is not allowed there (tensorboardX would rename it and log each time)."""
  return key.replace("@", "_at_")


class ProgressBar:
  """tqdm over the RL steps, showing the latest reward and held-out pass rate (nothing when disabled; plain log
  lines when stderr is not a terminal: logs.progress_bar)."""

  def __init__(self, enabled: bool, total: int, initial: int, desc: str):
    self._bar = None
    if enabled:
      from scalerl_jax.logs import progress_bar
      self._bar = progress_bar(total, desc, "step", initial=initial)

  def update(self, metrics: dict) -> None:
    if self._bar is None:
      return
    self._bar.update(1)
    post = {"reward": f"{metrics.get('train/reward_mean', 0):.3f}"}
    if "eval/pass_rate" in metrics:
      post["held_out"] = f"{metrics['eval/pass_rate']:.3f}"
    self._bar.set_postfix(post)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
