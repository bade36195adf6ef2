"""PipelineRL-k on disjoint meshes (4 generator + 4 trainer devices): k = 0 equals the synchronous loop bit for
bit, the staleness bound holds with in-flight weight updates, weight sync, PPO-off-policy-k, failure handling."""

import threading
import time

import jax
import numpy as np
import pytest

from scalerl_jax.run.job import RLJob
from scalerl_jax.pipeline.orchestrator import PipelineError
from tests.pipeline_helpers import SPLIT, consume_after_generating, consumed_prompt_ids, read_metrics, tiny_job


@pytest.fixture(scope="module")
def k0_runs(tmp_path_factory):
  base = tmp_path_factory.mktemp("k0")
  overrides = [*SPLIT, "pipeline.max_lag=0", "pipeline.steps=4"]
  piped = tiny_job(base / "pipeline", *overrides)
  piped.run()
  sync = tiny_job(base / "sync", *overrides)
  sync.run_sync()
  return piped, sync


def test_k0_pipeline_equals_synchronous_loop_bitwise(k0_runs):
  piped, sync = k0_runs
  # two different code paths: a generator thread fed through the weight box vs. a plain loop on this thread
  assert piped.generator is not None and piped.generator.stats.busy_s > 0 and sync.generator is None
  assert len(piped.trainer_layout.devices) == 4 and set(piped.trainer_layout.devices).isdisjoint(
      piped.generator_layout.devices)
  assert consumed_prompt_ids(piped.run_dir) == consumed_prompt_ids(sync.run_dir)
  for a, b in zip(jax.tree.leaves(piped.state.params), jax.tree.leaves(sync.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ma, mb = read_metrics(piped.run_dir), read_metrics(sync.run_dir)
  assert [r["step"] for r in ma] == [0, 1, 2, 3, 4]
  for ra, rb in zip(ma, mb):
    for key in ("train/loss", "train/reward_mean", "eval/pass_rate"):
      assert ra.get(key) == rb.get(key), key
  assert any(r.get("train/loss") not in (None, 0.0) for r in ma)  # the loss really trained
  assert all(r.get("pipeline/lag_max", 0) == 0 for r in ma)


def test_weight_sync_generator_params_equal_trainer_params(k0_runs):
  piped, _ = k0_runs
  gen_params, version = piped.weights.latest()
  assert version == 4 == int(piped.state.step)
  assert {d for x in jax.tree.leaves(gen_params) for d in x.sharding.device_set} == set(piped.generator_layout.devices)
  for a, b in zip(jax.tree.leaves(gen_params), jax.tree.leaves(piped.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("mode,k", [("pipeline", 2), ("ppo_offpolicy", 2)])
def test_staleness_bound_holds(tmp_path, mode, k):
  """The lag is set by the admission rule, not by which thread is faster: the trainer here waits, before each
  step s, until the generator has finished every batch the bound lets it start with version s (batch s + k under
  PipelineRL-k, the rest of the round under PPO-off-policy-k). Those batches are then generated entirely at
  version s, so the lag of every consumed token is known exactly."""
  steps = 6
  job = tiny_job(tmp_path, *SPLIT, f"pipeline.mode={mode}", f"pipeline.max_lag={k}", f"pipeline.steps={steps}",
                 "pipeline.eval_every=0", "checkpoint.every_steps=100")
  consume_after_generating(job, lambda s: min(s + k if mode == "pipeline" else (s // k + 1) * k - 1, steps - 1))
  job.run()
  rows = [r for r in read_metrics(job.run_dir) if "pipeline/lag_max" in r]
  assert [r["step"] for r in rows] == list(range(1, steps + 1))
  if mode == "pipeline":  # batch b was generated at version max(b - k, 0): lag min(b, k), at the bound from b = k
    expected = [min(b, k) for b in range(steps)]
  else:  # PPO-off-policy-k: the k batches of round r all come from the params of version r * k
    expected = [b % k for b in range(steps)]
  assert [r["pipeline/lag_max"] for r in rows] == expected
  assert [r["pipeline/lag_min"] for r in rows] == expected


def test_generator_exception_ends_run_with_its_traceback(tmp_path):
  job = tiny_job(tmp_path, *SPLIT, "pipeline.steps=6", "pipeline.eval_every=0")
  calls = []

  def exploding_score(groups):
    calls.append(1)
    if len(calls) > 5:
      raise ValueError("reward plumbing broke")
    return RLJob.score(job, groups)

  job.score = exploding_score
  outcome = {}

  def target():
    try:
      job.run()
    except PipelineError as exc:
      outcome["error"] = exc

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(timeout=300)
  assert not thread.is_alive(), "the run hung after the generator failed"
  assert "reward plumbing broke" in str(outcome["error"]) and isinstance(outcome["error"].__cause__, ValueError)


def test_resume_with_an_incompatible_config_is_refused(k0_runs):
  from scalerl_jax.train.checkpoint import ResumeError
  piped, _ = k0_runs
  assert piped.ckpt.latest_step() == 4
  changed = tiny_job(piped.run_dir, *SPLIT, "pipeline.max_lag=0", "loss.name=dapo")
  with pytest.raises(ResumeError, match="loss"):
    changed.setup()
  same = tiny_job(piped.run_dir, *SPLIT, "pipeline.max_lag=0", "pipeline.steps=6")
  same.setup()  # the same settings (more steps) resume from step 4
  assert same.start_step == 4 and int(same.state.step) == 4


def test_generator_counts_a_batch_busy_time_before_handing_it_over():
  # A consumer that reads the generator's busy time when it takes batch b (the compute meter, the peer comparison's
  # gen_s) must find b's generation in it. A fake driver finishes each batch in one step; the buffer records
  # busy_s at the moment of each put. Before the fix, the last step's time was added after the put: 0.0 here.
  from scalerl_jax.pipeline.orchestrator import AdmissionPolicy, BatchBuffer, GeneratorThread
  from scalerl_jax.pipeline.weight_sync import WeightBox

  class OneStepDriver:
    def __init__(self):
      self.queued, self.uids = [], 0
      self.busy, self.queued_prompts = False, 0

    def submit(self, prompt, samples):
      self.uids += 1
      self.queued.append(self.uids)
      self.queued_prompts = len(self.queued)
      return self.uids

    def step(self, params, version):
      time.sleep(0.01)  # the step's work: any positive duration
      done = [type("Group", (), {"uid": u})() for u in self.queued]
      self.queued, self.queued_prompts = [], 0
      return done

  class Recording(BatchBuffer):
    def put(self, batch):
      seen.append(generator.stats.busy_s)
      super().put(batch)
      weights.publish(None, batch.index + 1)  # the trainer's step: k = 0 admits the next batch only now

  seen, stop, weights = [], threading.Event(), WeightBox(None, 0)
  generator = GeneratorThread(driver=OneStepDriver(), next_prompts=lambda b: ["p0", "p1"],
                              score=lambda groups: list(groups), weights=weights,
                              policy=AdmissionPolicy("pipeline", 0), samples=1, start=0, end=3,
                              out=Recording(stop), stop=stop)
  generator.start()
  generator.join(timeout=30)
  assert not generator.is_alive() and generator.error is None
  assert len(seen) == 3 and seen[0] > 0 and all(b > a for a, b in zip(seen, seen[1:]))
