"""Shared tiny pipeline configuration, jobs and rewards for the pipeline tests, and readers of what a run directory
holds (importable by subprocesses too)."""

from __future__ import annotations

import json
import os
import pathlib
import time

from scalerl_jax.config import load_config

# Set to "RUN_DIR:STEP" in a child process's environment: every reward call made after step STEP was consumed
# blocks for good (after touching RUN_DIR/paused), so a test can kill the child at a known point without racing it.
PAUSE_ENV = "SCALERL_TEST_PAUSE_AFTER_STEP"

TINY = [
    "model.vocab_size=32", "model.hidden=32", "model.intermediate=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=2", "model.head_dim=16", "model.max_seq_len=24",
    "rollout.max_slots=16", "rollout.max_prefill_len=8", "rollout.prefill_buckets=[8]", "rollout.max_new_tokens=12",
    "rollout.decode_chunk=4", "rollout.interruption.think_budget_min=3", "rollout.interruption.think_budget_max=4",
    "rollout.interruption.answer_budget=4",
    "data.digits=2", "data.num_train=200", "data.num_eval=8", "data.prompts_per_step=4", "data.samples_per_prompt=4",
    "reward.fn=tests.pipeline_helpers.reward_digit_one",
    "warm_start.enabled=false", "pipeline.eval_every=2", "pipeline.eval_samples=2", "checkpoint.every_steps=2",
    "logging.tensorboard=false", "logging.progress=false", "optimizer.lr=3e-2",
    # the code defaults are the cpu_default recipe; these tests were written against these values of its keys
    "loss.exclude_truncated=true", "optimizer.warmup_steps=0", "pipeline.max_lag=8", "pipeline.steps=120",
]
# disjoint meshes: the generator on 4 of the 8 test devices, the trainer on the other 4
SPLIT = ["mesh.generator_devices=4", "mesh.spec=data=-1", "mesh.generator_spec=data=-1,tensor=1"]


def reward_digit_one(completion: str, answer: str) -> float:
  """A reward a random tiny policy earns about half the time, so groups have variance and the loss is non-zero."""
  if os.environ.get(PAUSE_ENV):
    _pause_if_past_step(*os.environ[PAUSE_ENV].rsplit(":", 1))
  return float("1" in completion[:3])


def reward_even_length(completion: str, answer: str) -> float:
  """A reward any text earns about half the time (the tiny Hugging Face fixtures cannot write digits, so
  math-verify scores every sample alike and the loss is zero)."""
  return float(len(completion) % 2 == 0)


def _pause_if_past_step(run_dir: str, step: str) -> None:
  if any(r["step"] >= int(step) for r in read_consumed(run_dir, missing_ok=True)):
    (pathlib.Path(run_dir) / "paused").touch()
    while True:  # the test kills the process now
      time.sleep(1)


def tiny_config(run_dir, *overrides):
  return load_config(overrides=[f"run_dir={run_dir}", *TINY, *overrides])


def tiny_job(run_dir, *overrides):
  """RLJob of tiny_config(run_dir, *overrides), no progress bar."""
  from scalerl_jax.run.job import RLJob  # here: the reward workers that import this module need no jax
  return RLJob(tiny_config(run_dir, *overrides), progress=False)


def consume_after_generating(job, last) -> None:
  """Makes `job`'s trainer wait, before it consumes batch s, until the generator has finished batches s .. last(s)
  (all started at the version before step s, whatever the threads' speed)."""
  consume = job.consume

  def waiting(batch, wait_s=0.0):
    s, deadline = batch.index, time.monotonic() + 120
    while not all(b == s or job.generator.out.ready(b) for b in range(s, last(s) + 1)):
      assert job.generator.is_alive() and time.monotonic() < deadline, "generator stopped short of the bound"
      time.sleep(0.005)
    return consume(batch, wait_s)

  job.consume = waiting


# ---- reading a run directory --------------------------------------------------------------------------------------
def read_jsonl(path, missing_ok: bool = False) -> list[dict]:
  """One record a line; a missing file raises FileNotFoundError, or is [] with `missing_ok` (a run that has not
  written it yet)."""
  path = pathlib.Path(path)
  if missing_ok and not path.exists():
    return []
  return [json.loads(l) for l in path.read_text().splitlines()]


def read_metrics(run_dir, missing_ok: bool = False) -> list[dict]:
  """RUN_DIR/metrics.jsonl: a record a step (and one for the step-0 evaluation)."""
  return read_jsonl(pathlib.Path(run_dir) / "metrics.jsonl", missing_ok)


def read_consumed(run_dir, missing_ok: bool = False) -> list[dict]:
  """RUN_DIR/consumed_prompts.jsonl: {"step", "prompt_ids"} of every batch the trainer consumed, in order."""
  return read_jsonl(pathlib.Path(run_dir) / "consumed_prompts.jsonl", missing_ok)


def consumed_prompt_ids(run_dir) -> list[list[str]]:
  return [r["prompt_ids"] for r in read_consumed(run_dir)]
