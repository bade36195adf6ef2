"""Shared tiny pipeline configuration and rewards for the pipeline tests (importable by subprocesses too)."""

from __future__ import annotations

from scalerl_jax.config import load_config

TINY = [
    "model.vocab_size=32", "model.hidden=32", "model.intermediate=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=2", "model.head_dim=16", "model.max_seq_len=24",
    "rollout.max_slots=16", "rollout.max_prefill_len=8", "rollout.prefill_buckets=[8]", "rollout.max_new_tokens=12",
    "rollout.decode_chunk=4", "rollout.interruption.think_budget_min=3", "rollout.interruption.think_budget_max=4",
    "rollout.interruption.answer_budget=4",
    "data.digits=2", "data.num_train=200", "data.num_eval=8", "data.prompts_per_step=4", "data.samples_per_prompt=4",
    "data.reward_fn=tests.pipeline_helpers.reward_digit_one",
    "warm_start.enabled=false", "pipeline.eval_every=2", "pipeline.eval_samples=2", "checkpoint.every_steps=2",
    "logging.tensorboard=false", "logging.progress=false", "optimizer.lr=3e-2",
    # the code defaults are the cpu_default recipe; these tests were written against these values of its keys
    "loss.exclude_truncated=true", "optimizer.warmup_steps=0", "pipeline.max_lag=8", "pipeline.steps=120",
]


def reward_digit_one(completion: str, answer: str) -> float:
  """A reward a random tiny policy earns about half the time, so groups have variance and the loss is non-zero."""
  return float("1" in completion[:3])


def tiny_config(run_dir, *overrides):
  return load_config(overrides=[f"run_dir={run_dir}", *TINY, *overrides])
