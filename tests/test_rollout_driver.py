"""Continuous-batching driver: groups by prompt, forced interruption and length limits, admission control and
version counters for the pipeline, evaluation runs, determinism by seed."""

import jax
import numpy as np
import pytest

from scalerl_jax import mesh as mesh_lib, types
from scalerl_jax.config import InterruptionConfig, ModelConfig, RolloutConfig
from scalerl_jax.model.policy import Policy
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine

CFG = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  max_seq_len=64)
IT = InterruptionConfig(think_budget_min=3, think_budget_max=5, answer_budget=3)
ROLLOUT = RolloutConfig(max_slots=8, max_prefill_len=16, prefill_buckets=(8, 16), max_new_tokens=12,
                        decode_chunk=4, temperature=1.0, interruption=IT)
STOP, PHRASE, MARKER = 31, (28, 29), 27


def prompt(i: int) -> types.Prompt:
  rng = np.random.default_rng(i)
  length = 4 + i % 9  # both buckets
  return types.Prompt(f"p{i}", "", "", np.concatenate([[1], rng.integers(2, 27, length - 1)]).astype(np.int32))


@pytest.fixture(scope="module")
def engine():
  mesh = mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES)
  return Engine(Policy(CFG), ROLLOUT, mesh, stop_ids=[STOP], phrase_ids=PHRASE, end_marker_ids=[MARKER])


@pytest.fixture(scope="module")
def params(engine):
  p = engine.init_params(0)
  return engine.put_params({**p, "embed": p["embed"] * 0.3})  # flatter distributions: varied samples


@pytest.fixture(scope="module")
def groups(engine, params):
  """20 prompts x 4 samples through 8 slots."""
  return RolloutDriver(engine, seed=0).generate_all(params, 3, [prompt(i) for i in range(20)], 4)


class Spy:
  """The engine, with a record of how many slots were active at each generate call."""

  def __init__(self, engine):
    self.engine, self.active = engine, []

  def __getattr__(self, name):
    return getattr(self.engine, name)

  def generate(self, params, state, *args, **kwargs):
    self.active.append(int(np.asarray(state.active_B).sum()))
    return self.engine.generate(params, state, *args, **kwargs)


def test_groups_are_complete_in_prompt_order_with_consistent_records(groups):
  assert [g.prompt.prompt_id for g in groups] == [f"p{i}" for i in range(20)]
  for g in groups:
    assert len(g.samples) == 4
    for s in g.samples:
      n = len(s.tokens)
      assert s.prompt_id == g.prompt.prompt_id and np.array_equal(s.prompt_tokens, g.prompt.tokens)
      assert len(s.logprobs) == len(s.versions) == len(s.forced) == n and 1 <= n <= ROLLOUT.max_new_tokens
      assert np.all(s.logprobs[s.forced] == 0) and np.all(s.versions[s.forced] == -1)
      assert np.all(s.versions[~s.forced] == 3) and np.all(s.logprobs[~s.forced] < 0)


def test_interruption_inserts_the_phrase_at_the_budget_masks_it_and_bounds_the_answer(groups):
  samples = [s for g in groups for s in g.samples]
  budgets = set()
  for s in samples:
    toks, forced = s.tokens, s.forced
    stopped = toks[-1] == STOP and not forced[-1]
    assert s.truncated == (not stopped)
    if s.interrupted:
      f = int(np.argmax(forced))
      budgets.add(f)
      assert IT.think_budget_min <= f <= IT.think_budget_max
      assert MARKER not in toks[:f]  # the model never ended its thinking itself
      np.testing.assert_array_equal(toks[f:f + 2], PHRASE)
      np.testing.assert_array_equal(np.flatnonzero(forced), [f, f + 1])
      answer = len(toks) - (f + 2)
      assert answer <= IT.answer_budget and (stopped or answer == IT.answer_budget)
    else:
      assert not forced.any()
      assert MARKER in toks[:IT.think_budget_max] or len(toks) <= IT.think_budget_max
      assert stopped or len(toks) == ROLLOUT.max_new_tokens
  assert len(budgets) > 1  # budgets are drawn per sample
  # every path was taken: interrupted, ended its thinking itself, stopped, hit max_new_tokens
  assert any(s.interrupted for s in samples) and any(MARKER in s.tokens and not s.interrupted for s in samples)
  assert any(not s.truncated for s in samples) and any(len(s.tokens) == ROLLOUT.max_new_tokens for s in samples)


def test_rates_are_recorded(engine, params):
  driver = RolloutDriver(engine, seed=0)
  groups = driver.generate_all(params, 0, [prompt(i) for i in range(6)], 4)
  samples = [s for g in groups for s in g.samples]
  stats = driver.last_eval_stats
  assert stats.samples == len(samples) == 24
  assert stats.interruption_rate == pytest.approx(np.mean([s.interrupted for s in samples]))
  assert stats.truncation_rate == pytest.approx(np.mean([s.truncated for s in samples]))
  assert stats.forced_tokens == sum(int(s.forced.sum()) for s in samples)


def test_determinism_by_seed(engine, params, groups):
  prompts = [g.prompt for g in groups]
  again = RolloutDriver(engine, seed=0).generate_all(params, 3, prompts, 4)
  other = RolloutDriver(engine, seed=1).generate_all(params, 3, prompts, 4)
  flat = lambda gs: [(s.tokens.tolist(), s.logprobs.tolist()) for g in gs for s in g.samples]
  assert flat(again) == flat(groups)
  assert flat(other) != flat(groups)


def test_continuous_batching_keeps_every_slot_busy(engine, params):
  spy = Spy(engine)
  driver = RolloutDriver(spy, seed=0)
  driver.admit_from((prompt(i) for i in range(12)), 3)  # 36 samples through 8 slots, partial groups included
  done = []
  while len(done) < 12:
    done += driver.step(params, 0)
  assert sorted(g.prompt.prompt_id for g in done) == sorted(f"p{i}" for i in range(12))
  assert all(len(g.samples) == 3 and all(s is not None for s in g.samples) for g in done)
  # every generate call ran with all 8 slots busy until the iterator ran dry (36 samples, ~4 finish per call)
  full = [a == ROLLOUT.max_slots for a in spy.active]
  assert full[:4] == [True] * 4 and not driver.busy and driver.idle_slots == ROLLOUT.max_slots


def test_admission_pause_pacing_versions_and_drain(engine, params):
  driver = RolloutDriver(engine, seed=0)
  for i in range(4):
    driver.submit(prompt(i), 2)
  driver.admit = False
  assert driver.step(params, 0) == [] and driver.idle_slots == ROLLOUT.max_slots and driver.oldest_version is None
  driver.admit = True
  driver.can_admit = lambda: driver.in_flight_prompts < 1  # one prompt at a time
  done, version = [], 0
  while len(done) < 2:
    got = driver.step(params, version)
    assert driver.in_flight_prompts <= 1 and driver.idle_slots >= ROLLOUT.max_slots - 2
    if driver.busy:  # the in-flight prompt started at some version and has kept every token's version since
      assert driver.oldest_version is not None and driver.oldest_version <= version
    for g in got:
      versions = np.concatenate([s.versions[s.versions >= 0] for s in g.samples])
      assert versions.max() > versions.min()  # samples spanning a weight update record both versions
    done += got
    version += 1
  driver.can_admit = None
  driver.step(params, version)  # starts the remaining prompts
  assert driver.queued_prompts == 0 and driver.busy
  rest = driver.drain(params, version)
  assert len(done) + len(rest) == 4 and not driver.busy and driver.admit


def test_generate_all_leaves_in_flight_work_alone(engine, params):
  driver = RolloutDriver(engine, seed=0)
  driver.submit(prompt(0), 8)
  driver.step(params, 0)
  assert driver.busy
  evals = driver.generate_all(params, 0, [prompt(i) for i in range(3)], 2)
  assert [g.prompt.prompt_id for g in evals] == ["p0", "p1", "p2"]
  rest = driver.drain(params, 0)
  alone = RolloutDriver(engine, seed=0)
  alone.submit(prompt(0), 8)
  ref = alone.step(params, 0) + alone.drain(params, 0)
  assert [s.tokens.tolist() for s in rest[0].samples] == [s.tokens.tolist() for s in ref[0].samples]


def test_prefill_insert_compilations_stay_bounded(engine):
  # buckets (8, 16) x power-of-two prompt counts x power-of-two insert counts: a handful after all the above
  assert engine._prefill_insert._cache_size() <= 12


def test_first_uid_continues_the_random_streams(engine, params):
  whole = RolloutDriver(engine, seed=0)
  uids = [whole.submit(prompt(i), 2) for i in range(6)]
  assert uids == list(range(6))
  ref = {}
  while whole.busy or whole.queued_prompts:
    ref.update({g.uid: g for g in whole.step(params, 0)})
  resumed = RolloutDriver(engine, seed=0)
  resumed.first_uid = 5  # as a resumed run does
  assert resumed.submit(prompt(5), 2) == 5
  got = resumed.step(params, 0) + resumed.drain(params, 0)
  assert [s.tokens.tolist() for s in got[0].samples] == [s.tokens.tolist() for s in ref[5].samples]
