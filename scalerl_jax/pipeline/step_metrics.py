"""The numbers one RL step logs, in two halves: the host half right after the step is dispatched
(`host_metrics`), the device half one step later (`finish`), when the device scalars are ready without waiting.
`StepLog` holds the pending step and writes it (with an evaluation when one is due) to the sinks.

Keys are `group/name`: train/ (loss diagnostics, grad and update norms, throughput; train/<task>/... per task of a
mixed run), rollout/ (tokens, truncation, interruption, reward failures), moe/ (an MoE policy's router losses,
routing mismatch and expert loads), pipeline/ (lag of the consumed tokens, weight-sync time, trainer wait, generator
idle), data/ (epoch, NPR), compute/ (the curve's x axis, from ComputeMeter), predict/ (early-stop advice at each
evaluation with curve_fit.target, `TargetAdvisor`).
"""

from __future__ import annotations

import jax
import numpy as np

from typing import Callable, Optional

from scalerl_jax import rl, types
from scalerl_jax.pipeline.compute import ComputeMeter
from scalerl_jax.pipeline.interrupts import Stopped
from scalerl_jax.pipeline.sinks import MetricsLogger, ProgressBar
from scalerl_jax.train.rl_loss import router_metrics


def host_metrics(batch: types.ScoredBatch, packed: types.PackedRows, prepare_metrics: dict, data_metrics: dict,
                 sync_s: float, wait_s: float, version: int) -> dict:
  """What the host knows right after step `batch.index`: its rollouts, the lag of its tokens, the data state."""
  samples = [s for g in batch.groups for s in g.samples]
  versions = packed.versions_BT[packed.versions_BT >= 0]
  lag = batch.index - versions if versions.size else np.zeros(1)
  return {
      **{f"train/{k}": v for k, v in prepare_metrics.items()},
      **data_metrics,
      "rollout/truncation_rate": float(np.mean([s.truncated for s in samples])),
      "rollout/interruption_rate": float(np.mean([s.interrupted for s in samples])),
      "rollout/tokens": sum(len(s.tokens) for s in samples),
      "rollout/reward_failures": sum(g.reward_failures for g in batch.groups),
      "pipeline/lag_min": float(lag.min()), "pipeline/lag_mean": float(lag.mean()),
      "pipeline/lag_max": float(lag.max()),
      "pipeline/weight_sync_s": sync_s, "pipeline/trainer_wait_s": wait_s, "pipeline/version": version,
      **task_metrics(batch),
  }


def merge_counters(records: list[dict]) -> dict:
  """Several processes' reward and data counters (`RewardRunner.metrics`, the prompt stream's) as one run's:
  reward counts and times and each shard's epoch size summed, epochs the lowest, every failure rate (the run's and
  each task's, reward/<task>/failure_rate) recomputed from its summed counts; the other data/* counts describe the
  whole dataset, which every process reads: process 0's."""
  out: dict = {}
  for i, record in enumerate(records):
    for k, v in record.items():
      if k.startswith("data/epoch_size") or (k.startswith("reward/") and isinstance(v, (int, float))):
        out[k] = out.get(k, 0) + v
      elif k.startswith("data/epoch"):
        out[k] = min(out.get(k, v), v)
      elif i == 0:
        out[k] = v
  for k in [k for k in out if k.startswith("reward/") and k.endswith("/failure_rate")]:
    prefix = k[:-len("failure_rate")]  # "reward/" or "reward/<task>/"
    calls = out.get(prefix + "calls", 0)
    out[k] = (out.get(prefix + "errors", 0) + out.get(prefix + "timeouts", 0)) / calls if calls else 0.0
  return out


def task_metrics(batch: types.ScoredBatch) -> dict:
  """Mixed tasks: each task's prompts, pass rate and mean completion length in this step's batch
  (train/<task>/...); {} when the prompts carry no task."""
  by_task: dict[str, list] = {}
  for g in batch.groups:
    if g.prompt.task:
      by_task.setdefault(g.prompt.task, []).append(g)
  out = {}
  for task, groups in sorted(by_task.items()):
    out[f"train/{task}/prompts"] = len(groups)
    out[f"train/{task}/pass_rate"] = float(np.mean([g.pass_rate for g in groups]))
    out[f"train/{task}/completion_tokens"] = float(np.mean([len(s.tokens) for g in groups for s in g.samples]))
  return out


def finish(record: types.StepRecord, generator_stats=None, generator_window=None) -> dict:
  """The step's full metrics once its device scalars are ready (read one step late). `generator_window`: the
  generator's (idle, busy) seconds since the previous logged step (default: its totals)."""
  device = jax.device_get(record.device_metrics)
  out = {**record.host_metrics,
         **{f"train/{k}": v for k, v in rl.finalize_metrics({k: v for k, v in device.items()
                                                              if k in rl.METRIC_KEYS + rl.OPTIONAL_METRIC_KEYS}
                                                             ).items()}}
  out.update(router_metrics(device))  # moe/...: router losses, trainer-vs-generator mismatch, expert loads
  for k in ("grad_norm", "update_norm"):
    out[f"train/{k}"] = float(device[k])
  out["train/skipped"] = int(device["skipped"])  # 1: non-finite loss or gradient, the update was not applied
  step_s = max(record.step_s, 1e-9)
  out["pipeline/trainer_wait_frac"] = record.wait_s / step_s
  out["train/tokens_per_s"] = record.train_tokens_per_s
  out["rollout/tokens_per_s"] = record.host_metrics["rollout/tokens"] / step_s
  if generator_stats is not None:
    idle, busy = generator_window or (generator_stats.idle_s, generator_stats.busy_s)
    out["pipeline/generator_idle_frac"] = idle / max(idle + busy, 1e-9)
    out["pipeline/in_flight_weight_updates"] = generator_stats.in_flight_updates
  return out


class TargetAdvisor:
  """Early-stop advice at every evaluation (curve_fit.target): the run's evaluation points so far (metrics.jsonl
  plus the one being logged) fitted by the paper's procedure on all of them, then scaling.advice.target_advice
  from the fit's Laplace draws (about 50 ms). Keys, once MIN_POINTS evaluations exist and a fit is found:
    predict/target, predict/p_target (P(ceiling > target)), predict/A (the fitted ceiling),
    predict/ceiling_identified (0 when the curve has not bent yet: the numbers are then guesses),
    predict/c_target, predict/c_target_lo, predict/c_target_hi (compute on the curve_fit.x axis at which the target
    is reached, with its 90 % interval; only when some draws reach it), predict/reached (1 once measured)."""

  MIN_POINTS = 6  # R0 + 5 evaluations, as the end-of-run fit

  def __init__(self, cfg, run_dir):
    self.cfg, self.run_dir = cfg, run_dir

  def __call__(self, out: dict) -> dict:
    from scalerl_jax import scaling
    from scalerl_jax.scaling.advice import target_advice
    key, factor = scaling.io.X_AXES[self.cfg.x]
    try:
      prev = scaling.load_points(self.run_dir, x=self.cfg.x)
      compute, reward = list(prev.compute), list(prev.reward)
    except scaling.CurveDataError:  # no evaluation written yet
      compute, reward = [], []
    compute.append(out[key] * factor)
    reward.append(out["eval/pass_rate"])
    if len(compute) < self.MIN_POINTS:
      return {}
    try:
      run = scaling.analyse(scaling.CurvePoints(np.array(compute), np.array(reward)), fit_upto=1.0,
                            c_min=self.cfg.c_min)
      a = target_advice(run, self.cfg.target)
    except scaling.CurveDataError:  # too few usable points or no curve: no advice this time
      return {}
    advice = {"predict/target": a["target"], "predict/p_target": a["p_reach"], "predict/A": run.lsq.params.A,
              "predict/ceiling_identified": int(a["ceiling_identified"]),
              "predict/reached": int(a["reached"] is not None)}
    if a["c_target"] is not None:
      advice.update({"predict/c_target": a["c_target"]["median"], "predict/c_target_lo": a["c_target"]["lo"],
                     "predict/c_target_hi": a["c_target"]["hi"]})
    return advice


class StepLog:
  """The trainer's metric writer: `hold` the step just dispatched; `flush` writes the held one (its device scalars
  are ready by the time the next step has been dispatched), with compute and, when asked, a held-out evaluation."""

  def __init__(self, logger: MetricsLogger, bar: ProgressBar, meter: ComputeMeter, evaluate: Callable[[], dict],
               advise: Optional[Callable[[dict], dict]] = None):
    self.logger, self.bar, self.meter, self._evaluate, self._advise = logger, bar, meter, evaluate, advise
    self._pending: Optional[types.StepRecord] = None
    self._generator_seen = (0.0, 0.0)  # the generator's idle and busy seconds at the last hold
    self._window: Optional[tuple[float, float]] = None

  def hold(self, record: types.StepRecord, generator_stats=None) -> None:
    """Keeps the step just dispatched (the previous one must have been flushed: its compute is counted first),
    with the generator's idle and busy seconds since the previous step was held (taken here, at the same point
    of every step, so an early flush for an evaluation or a checkpoint does not shorten the window)."""
    if self._pending is not None:
      raise RuntimeError(f"step {self._pending.step} was never flushed")
    self._pending, self._window = record, None
    if generator_stats is not None:
      idle, busy = self._generator_seen
      if generator_stats.idle_s < idle or generator_stats.busy_s < busy:  # a new generator: totals from 0
        idle = busy = 0.0
      self._window = (generator_stats.idle_s - idle, generator_stats.busy_s - busy)
      self._generator_seen = (generator_stats.idle_s, generator_stats.busy_s)

  def flush(self, generator_stats=None, evaluate: bool = False) -> None:
    if self._pending is None:
      return
    record, self._pending = self._pending, None
    self.meter.tick()
    out = finish(record, generator_stats, self._window)
    if self._window is not None:  # added up per step: a resumed run's new generator starts its totals at 0
      self.meter.gen_busy_s += self._window[1]
    stopped = None
    if evaluate:
      try:
        out.update(self._evaluate())
      except Stopped as exc:  # a signal abandoned the evaluation: the step's line is written without it
        stopped, evaluate = exc, False
    out.update(self.meter.metrics())
    if evaluate and self._advise is not None:
      out.update(self._advise({**out, "step": record.step + 1}))  # (curve_fit.x=steps reads it)
    self.logger.write(record.step + 1, out)
    self.bar.update(out)
    if stopped is not None:
      raise stopped

  def close(self) -> None:
    self.bar.close()
    self.logger.close()
