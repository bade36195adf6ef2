"""Silent wrong results and lost work found by review (issue 18), each pinned by a test that failed before its fix:
non-finite steps, the final evaluation, PPO-off-policy evaluation labels, NPR snapshots that depended on thread
timing, NPR exhausting the pool, compute booked in the synchronous loop, compilation counted as compute, the
interruption budget, metric names."""

import jax
import numpy as np
import pytest

from scalerl_jax import types
from scalerl_jax.config import ConfigError
from scalerl_jax.data.prompt_stream import PromptsExhausted
from scalerl_jax.run import trainer as trainer_lib
from scalerl_jax.pipeline.compute import ComputeMeter
from scalerl_jax.pipeline.orchestrator import AdmissionPolicy
from scalerl_jax.errors import UserError
from scalerl_jax.train.step import NonFiniteError
from tests.pipeline_helpers import (SPLIT, consume_after_generating, consumed_prompt_ids, read_consumed, read_metrics,
                                    tiny_config, tiny_job)


def answer_is_even(completion: str, answer: str) -> float:
  """A reward fixed by the prompt alone: prompts with an even first answer digit are solved at first sight."""
  return float(int(answer[0]) % 2 == 0)


def always_one(completion: str, answer: str) -> float:
  return 1.0


def test_non_finite_steps_are_skipped_counted_and_stop_the_run_with_a_usable_checkpoint(tmp_path, monkeypatch):
  build = trainer_lib.build_train_batch

  def poisoned(packed, cfg, layout=None):  # what one NaN reward used to do to every batch-normalised advantage
    batch, metrics = build(packed, cfg, layout)
    return types.TrainBatch(**{**batch.__dict__, "advantages": np.full_like(batch.advantages, np.nan)}), metrics

  monkeypatch.setattr(trainer_lib, "build_train_batch", poisoned)
  # the third skip lands on a checkpoint step (checkpoint.every_steps=3): one checkpoint, not a second save of it
  job = tiny_job(tmp_path, "pipeline.steps=10", "trainer.max_skipped_steps=3", "pipeline.eval_every=0",
                 "loss.zero_variance_filter=false", "checkpoint.every_steps=3")
  with pytest.raises(NonFiniteError, match="3 steps in a row .* non-finite"):
    job.run_sync()
  initial = tiny_job(tmp_path / "fresh", "pipeline.eval_every=0")
  initial.setup()
  assert int(job.state.step) == 3  # batches consumed
  for a, b in zip(jax.tree.leaves(job.state.params), jax.tree.leaves(initial.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # no NaN reached the params
  assert job.ckpt.latest_step() == 3
  rows = [r for r in read_metrics(job.run_dir) if "train/skipped" in r]
  assert [r["train/skipped"] for r in rows] == [1, 1, 1]


def test_final_evaluation_runs_when_steps_are_a_multiple_of_the_checkpoint_interval(tmp_path):
  job = tiny_job(tmp_path, "pipeline.steps=4", "checkpoint.every_steps=2", "pipeline.eval_every=3",
                 "pipeline.mode=lockstep")
  job.run_sync()
  last = read_metrics(job.run_dir)[-1]
  assert last["step"] == 4 and "eval/pass_rate" in last


def test_ppo_offpolicy_evaluates_the_trainers_current_params(tmp_path):
  job = tiny_job(tmp_path, *SPLIT, "pipeline.mode=ppo_offpolicy", "pipeline.max_lag=2", "pipeline.steps=3",
                 "pipeline.eval_every=1")
  seen = []
  evaluate = job.evaluator.evaluate

  def recording(params, version):
    same = all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(job.state.params)))
    seen.append((version, same))
    return evaluate(params, version)

  job.evaluator.evaluate = recording
  job.run()
  assert [v for v, _ in seen] == [0, 1, 2, 3]
  assert all(same for _, same in seen)  # version 1 and 3 are not published (k = 2) but are what is scored


def test_npr_epoch_snapshot_does_not_depend_on_how_far_the_trainer_has_got(tmp_path):
  """Two k = 2 runs, one whose trainer lags the generator as far as the bound allows and one whose generator
  waits for the trainer: the prompts solved in the last k steps before an epoch boundary are known to one and
  not the other, yet both must consume the same prompts in the next epoch."""
  k, steps = 2, 8
  overrides = [*SPLIT, f"pipeline.max_lag={k}", f"pipeline.steps={steps}", "pipeline.eval_every=0",
               "checkpoint.every_steps=100", "data.num_train=16", "data.npr.threshold=0.5",
               "reward.fn=tests.test_reliability.answer_is_even"]
  lagging = tiny_job(tmp_path / "lagging", *overrides)
  consume_after_generating(lagging, lambda s: min(s + k, steps - 1))
  lagging.run()
  eager = tiny_job(tmp_path / "eager", *overrides)
  # the generator admits a batch only once the trainer has consumed every earlier one (its data stream still
  # follows k = 2): it draws the first batch of epoch 1 after all of epoch 0 was recorded in NPR
  eager.admission = AdmissionPolicy("pipeline", 0)
  eager.run()
  epoch = 16 // 4  # steps in epoch 0: 16 training prompts, 4 per step
  solved_at = lagging.cursor.npr._solved_at
  assert any(epoch - k <= s < epoch for s in solved_at), "precondition: prompts solved just before the boundary"
  assert consumed_prompt_ids(eager.run_dir) == consumed_prompt_ids(lagging.run_dir)


@pytest.mark.parametrize("mode", ["lockstep", "pipeline"])  # the pipeline's generator thread hits it there
def test_npr_exhausting_the_pool_stops_cleanly_and_the_run_continues_with_npr_off(tmp_path, mode):
  overrides = [f"pipeline.mode={mode}", "pipeline.max_lag=0", "pipeline.steps=12", "data.num_train=8", "data.npr.threshold=0.5",
               "reward.fn=tests.test_reliability.always_one", "checkpoint.every_steps=100",
               "pipeline.eval_every=0"]
  job = tiny_job(tmp_path, *overrides)
  with pytest.raises(PromptsExhausted, match="stopped at step 2 with a checkpoint.*data.npr.enabled=false"):
    job.run_sync() if mode == "lockstep" else job.run()
  assert job.ckpt.latest_step() == 2
  again = tiny_job(tmp_path, *overrides, "data.npr.enabled=false", "pipeline.steps=4")
  again.run_sync() if mode == "lockstep" else again.run()
  assert [r["step"] for r in read_consumed(tmp_path)] == [0, 1, 2, 3]


def test_synchronous_colocated_loop_books_generation_compute_to_the_generator(tmp_path):
  job = tiny_job(tmp_path, "pipeline.steps=2", "pipeline.eval_every=0")
  job.run_sync()
  last = read_metrics(job.run_dir)[-1]
  assert last["compute/generator_accelerator_seconds"] > 0 and last["compute/trainer_accelerator_seconds"] > 0


def test_compilation_inside_the_loop_is_not_compute():
  meter = ComputeMeter(1, 1, colocated=True)
  fresh = jax.jit(lambda x: x * 3.0 + 1.0)  # a function nothing has compiled yet
  jax.block_until_ready(fresh(np.float32(1.0)))  # outside: not counted
  assert meter.compile_s == 0
  other = jax.jit(lambda x: (x - 7.0) ** 2)
  with meter.count_compilation():
    jax.block_until_ready(other(np.float32(2.0)))
  assert meter.compile_s > 0 and meter._excluded == pytest.approx(meter.compile_s)


def test_interruption_budget_must_fit_the_completion_budget(tmp_path):
  with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
    tiny_job(tmp_path, "rollout.max_new_tokens=8", "rollout.interruption.think_budget_max=4",
             "rollout.interruption.answer_budget=4")


def test_data_metrics_carry_one_prefix(tmp_path):
  job = tiny_job(tmp_path, "pipeline.steps=1", "pipeline.eval_every=0")
  job.run_sync()
  keys = set(read_metrics(job.run_dir)[-1])
  assert "data/epoch" in keys and not any(k.startswith("data/data/") for k in keys)


def test_a_restart_is_not_compute(tmp_path):
  """What a (re)start does once happens before the compute clock starts (the reward workers are up) or is
  subtracted from it (XLA compilation inside the loop: a resumed run recompiles the rollout engine)."""
  first = tiny_job(tmp_path, "pipeline.mode=lockstep", "pipeline.steps=2", "checkpoint.every_steps=2")
  first.run_sync()
  resumed = tiny_job(tmp_path, "pipeline.mode=lockstep", "pipeline.steps=4", "checkpoint.every_steps=2")
  seen = []
  start = resumed.meter.start
  resumed.meter.start = lambda: (seen.append(resumed.rewards._pool.started), start())
  resumed.run_sync()
  assert resumed.start_step == 2 and seen == [True]
  lines = read_metrics(resumed.run_dir)
  assert lines[-1]["compute/compile_seconds_excluded"] > lines[2]["compute/compile_seconds_excluded"]


def test_one_non_finite_step_is_skipped_and_the_run_goes_on(tmp_path, monkeypatch):
  build = trainer_lib.build_train_batch

  def poison_step_1(packed, cfg, layout=None):
    batch, metrics = build(packed, cfg, layout)
    if poison_step_1.calls == 1:
      batch = types.TrainBatch(**{**batch.__dict__, "advantages": np.full_like(batch.advantages, np.inf)})
    poison_step_1.calls += 1
    return batch, metrics

  poison_step_1.calls = 0
  monkeypatch.setattr(trainer_lib, "build_train_batch", poison_step_1)
  job = tiny_job(tmp_path, "pipeline.steps=3", "pipeline.eval_every=0", "loss.zero_variance_filter=false")
  job.run_sync()
  assert [r["train/skipped"] for r in read_metrics(job.run_dir) if "train/skipped" in r] == [0, 1, 0]
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(job.state.params))


@pytest.mark.parametrize("override,key", [
    ("optimizer.lr=inf", "optimizer.lr"), ("reward.on_failure=nan", "reward.on_failure"),
    ("reward.on_failure=0.5", "reward.on_failure"),  # above the 01 scale's lowest reward: beats a wrong answer
    ("checkpoint.every_steps=0", "checkpoint.every_steps"), ("warm_start.eval_every=0", "warm_start.eval_every"),
    ("warm_start.batch_size=0", "warm_start.batch_size"), ("warm_start.batch_size=100000", "warm_start.batch_size"),
    ("warm_start.max_steps=-1", "warm_start.max_steps"), ("data.num_eval=0", "data.num_eval")])
def test_values_that_used_to_crash_late_or_do_nothing_are_refused(override, key):
  from scalerl_jax.config import load_config
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    load_config(overrides=[override])
  if key == "reward.on_failure" and override.endswith("0.5"):
    assert load_config(overrides=["reward.scale=pm1", "reward.on_failure=-1"]).reward.on_failure == -1


def test_a_second_run_on_a_live_run_directory_is_refused(tmp_path):
  from scalerl_jax.errors import UserError
  first = tiny_job(tmp_path, "pipeline.steps=1", "pipeline.eval_every=0")
  first.setup()  # holds the run directory
  try:
    second = tiny_job(tmp_path, "pipeline.steps=1", "pipeline.eval_every=0")
    with pytest.raises(UserError, match="in use by another run"):
      second.setup()
  finally:
    first.release()


def raise_on_even_answers(completion: str, answer: str) -> float:
  if int(answer[0]) % 2 == 0:
    raise ValueError("no even answers")
  return 0.0


def test_evaluation_counts_reward_failures(tmp_path):
  job = tiny_job(tmp_path, "pipeline.steps=1", "pipeline.eval_every=1", "pipeline.eval_samples=2",
                 "reward.fn=tests.test_reliability.raise_on_even_answers")
  even = sum(int(p.answer[0]) % 2 == 0 for p in job.evaluator.prompts)
  assert 0 < even < len(job.evaluator.prompts), "precondition: some eval answers fail, not all"
  try:
    job.run_sync()
  except UserError:  # a training batch whose answers are all even fails whole: fine, step 0's evaluation ran
    pass
  first = read_metrics(job.run_dir)[0]
  assert first["step"] == 0 and first["eval/reward_failures"] == even * (1 + 2)  # greedy + 2 samples each


def test_skipped_row_counts_reach_the_stream_metrics():
  from scalerl_jax.data.npr import NPRState
  from scalerl_jax.data.prompt_stream import PromptStream
  from scalerl_jax.data.tasks import make_task
  from scalerl_jax.data.tokenizer import make_tokenizer
  cfg = tiny_config("unused")
  stream = PromptStream(make_task(cfg.data).train_records(), cfg.data, make_tokenizer(cfg.data), 8,
                        npr=NPRState(cfg.data.npr), counts={"rows_read": 7, "skipped_bad_rows": 5})
  metrics = stream.metrics()
  assert metrics["data/skipped_bad_rows"] == 5 and metrics["data/rows_read"] == 7
