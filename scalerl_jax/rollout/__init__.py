"""Rollout: a JetStream-contract engine (prefill / insert / fused multi-step generate over decode slots, params
passed on every call) and the continuous-batching driver the pipeline calls; per-token log-probs and policy
versions, in-flight param swaps, forced interruption.

  sampling.py           temperature / top-k / top-p with the log-prob of the distribution actually sampled
  engine.py             jitted prefill, insert, generate; decode state; interruption and stop logic on device
  driver.py             RolloutDriver: keeps slots busy, groups samples by prompt, admission control, eval runs
  jetstream_adapter.py  optional: serve with JetStream's Driver (pip install --no-deps -r requirements-jetstream.txt)
"""

from scalerl_jax.rollout.driver import RolloutDriver, RolloutGroup, RolloutStats
from scalerl_jax.rollout.engine import DecodeState, Engine, Prefix, StepResults
from scalerl_jax.rollout.sampling import GREEDY, SamplingParams

__all__ = ["DecodeState", "Engine", "GREEDY", "Prefix", "RolloutDriver", "RolloutGroup", "RolloutStats",
           "SamplingParams", "StepResults"]
