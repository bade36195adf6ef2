"""The numbers one RL step logs, in two halves: the host half right after the step is dispatched
(`host_metrics`), the device half one step later (`finish`), when the device scalars are ready without waiting.

Keys are `group/name`: train/ (loss diagnostics, grad and update norms, throughput), rollout/ (tokens, truncation,
interruption, reward failures), pipeline/ (lag of the consumed tokens, weight-sync time, trainer wait, generator
idle), data/ (epoch, NPR), compute/ (the curve's x axis, from ComputeMeter).
"""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np

from scalerl_jax import rl, types


def host_metrics(batch: types.ScoredBatch, prepare_metrics: dict, data_metrics: dict, sync_s: float, wait_s: float,
                 version: int) -> dict:
  """What the host knows right after step `batch.index`: its rollouts, the lag of its tokens, the data state."""
  samples = [s for g in batch.groups for s in g.samples]
  versions = np.concatenate([s.versions[s.versions >= 0] for s in samples])
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
  }


def oldest_version(batch: types.ScoredBatch) -> Optional[int]:
  """The oldest policy version among the batch's sampled tokens (None if it has none)."""
  olds = [int(s.versions[s.versions >= 0].min()) for g in batch.groups for s in g.samples if (s.versions >= 0).any()]
  return min(olds) if olds else None


def finish(record: types.StepRecord, generator_stats=None) -> dict:
  """The step's full metrics once its device scalars are ready (read one step late)."""
  device = jax.device_get(record.device_metrics)
  out = {**record.host_metrics,
         **{f"train/{k}": v for k, v in rl.finalize_metrics({k: v for k, v in device.items()
                                                              if k in rl.METRIC_KEYS}).items()}}
  for k in ("grad_norm", "update_norm"):
    out[f"train/{k}"] = float(device[k])
  step_s = max(record.step_s, 1e-9)
  out["pipeline/trainer_wait_frac"] = record.wait_s / step_s
  out["train/tokens_per_s"] = record.train_tokens_per_s
  out["rollout/tokens_per_s"] = record.host_metrics["rollout/tokens"] / step_s
  if generator_stats is not None:
    g = generator_stats
    out["pipeline/generator_idle_frac"] = g.idle_s / max(g.idle_s + g.busy_s, 1e-9)
    out["pipeline/in_flight_weight_updates"] = g.in_flight_updates
  return out
