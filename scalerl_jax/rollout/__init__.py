"""Rollout: an engine (fused prefill-insert and multi-step generate over decode slots, params passed on every
call) and the continuous-batching driver the pipeline calls; per-token log-probs and policy versions, in-flight
param swaps, forced interruption.

  sampling.py           temperature / top-k / top-p with the log-prob of the distribution actually sampled
  engine.py             jitted prefill_insert and generate; decode state; interruption and stop logic on device
  driver.py             RolloutDriver: starts submitted prompts as slots free up, groups samples by prompt, eval runs
  jetstream_adapter.py  optional: serve with JetStream's Driver (its single-prompt prefill / insert live there;
                        pip install --no-deps -r requirements-jetstream.txt)
"""

from scalerl_jax.rollout.driver import RolloutDriver, RolloutStats
from scalerl_jax.rollout.engine import DecodeState, Engine, Prefix, StepResults
from scalerl_jax.rollout.sampling import GREEDY, SamplingParams

__all__ = ["DecodeState", "Engine", "GREEDY", "Prefix", "RolloutDriver", "RolloutStats",
           "SamplingParams", "StepResults"]
