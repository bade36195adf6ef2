"""Continuous-batching driver: groups by prompt, forced interruption and length limits, admission in submission
order (a started group is never dropped and comes back whole), versions across weight updates, evaluation runs,
determinism by seed."""

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
  return jax.device_put({**p, "embed": p["embed"] * 0.3}, engine.param_shardings)  # flatter: varied samples


@pytest.fixture(scope="module")
def groups(engine, params):
  """20 prompts x 4 samples through 8 slots."""
  return RolloutDriver(engine, seed=0).generate_all(params, 3, [prompt(i) for i in range(20)], 4)


class Spy:
  """The engine, with a record of how many slots were active at each generate call and of the (uid, sample)
  pairs given a slot, in order."""

  def __init__(self, engine):
    self.engine, self.active, self.started = engine, [], []

  def __getattr__(self, name):
    return getattr(self.engine, name)

  def generate(self, params, state, *args, **kwargs):
    self.active.append(int(np.asarray(state.active_B).sum()))
    return self.engine.generate(params, state, *args, **kwargs)

  def prefill_insert(self, params, state, prompts, rows, slots, uids, samples, base_key):
    self.started += list(zip(uids, samples))
    return self.engine.prefill_insert(params, state, prompts, rows, slots, uids, samples, base_key)


def finish(driver, params, version=0):
  """Step until everything submitted has come back."""
  out = []
  while driver.busy or driver.queued_prompts:
    out += driver.step(params, version)
  return out


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
  for i in range(12):
    driver.submit(prompt(i), 3)  # 36 samples through 8 slots, partial groups included
  done = finish(driver, params)
  assert sorted(g.prompt.prompt_id for g in done) == sorted(f"p{i}" for i in range(12))
  assert all(len(g.samples) == 3 and all(s is not None for s in g.samples) for g in done)
  # every generate call ran with all 8 slots busy until the queue ran dry (36 samples, ~4 finish per call)
  full = [a == ROLLOUT.max_slots for a in spy.active]
  assert full[:4] == [True] * 4 and not driver.busy and driver.idle_slots == ROLLOUT.max_slots


def test_submission_paces_admission_and_samples_record_every_version(engine, params):
  """The pipeline paces admission by when it submits: only submitted prompts run, and a group whose samples
  span weight updates records each version its tokens were sampled at."""
  driver = RolloutDriver(engine, seed=0)
  assert driver.step(params, 0) == [] and driver.idle_slots == ROLLOUT.max_slots  # nothing submitted
  version = 0
  for i in range(2):  # one prompt at a time, the next submitted once the previous came back
    driver.submit(prompt(i), 2)
    got = []
    while not got:
      got = driver.step(params, version)
      assert driver.idle_slots >= ROLLOUT.max_slots - 2 and driver.queued_prompts == 0
      version += 1
    assert [g.prompt.prompt_id for g in got] == [f"p{i}"] and not driver.busy
    versions = np.concatenate([s.versions[s.versions >= 0] for s in got[0].samples])
    assert versions.max() > versions.min()  # samples spanning a weight update record both versions


def test_a_started_group_is_never_dropped_and_comes_back_whole(engine, params):
  """A group with more samples than slots: its remaining samples take the next free slots before any prompt
  submitted after it, including prompts submitted while it runs; every group comes back whole."""
  spy = Spy(engine)
  driver = RolloutDriver(spy, seed=0)
  big = driver.submit(prompt(0), 12)  # 12 samples, 8 slots
  small = [driver.submit(prompt(1), 2)]
  done = driver.step(params, 0)
  assert driver.busy and driver.idle_slots == 0
  small.append(driver.submit(prompt(2), 2))  # submitted mid-flight
  done += finish(driver, params, 1)
  uids = [u for u, _ in spy.started]
  assert spy.started[:12] == [(big, i) for i in range(12)] and big not in uids[12:]
  assert sorted(uids[12:]) == sorted([small[0]] * 2 + [small[1]] * 2) and uids.index(small[0]) < uids.index(small[1])
  assert sorted(g.uid for g in done) == [big] + small
  for g in done:
    assert len(g.samples) == (12 if g.uid == big else 2) and all(s is not None for s in g.samples)
  assert len({tuple(s.tokens) for s in done[[g.uid for g in done].index(big)].samples}) == 12  # distinct samples


def test_generate_all_leaves_in_flight_work_alone(engine, params):
  driver = RolloutDriver(engine, seed=0)
  driver.submit(prompt(0), 8)
  driver.step(params, 0)
  assert driver.busy
  evals = driver.generate_all(params, 0, [prompt(i) for i in range(3)], 2)
  assert [g.prompt.prompt_id for g in evals] == ["p0", "p1", "p2"]
  rest = finish(driver, params)
  alone = RolloutDriver(engine, seed=0)
  alone.submit(prompt(0), 8)
  ref = finish(alone, params)
  assert [s.tokens.tolist() for s in rest[0].samples] == [s.tokens.tolist() for s in ref[0].samples]


def test_prefill_insert_compilations_stay_bounded(engine):
  # buckets (8, 16) x power-of-two prompt counts x power-of-two insert counts: a handful after all the above
  assert engine._prefill_insert._cache_size() <= 12


def test_first_uid_continues_the_random_streams(engine, params):
  whole = RolloutDriver(engine, seed=0)
  uids = [whole.submit(prompt(i), 2) for i in range(6)]
  assert uids == list(range(6))
  ref = {g.uid: g for g in finish(whole, params)}
  resumed = RolloutDriver(engine, seed=0)
  resumed.first_uid = 5  # as a resumed run does
  assert resumed.submit(prompt(5), 2) == 5
  got = finish(resumed, params)
  assert [s.tokens.tolist() for s in got[0].samples] == [s.tokens.tolist() for s in ref[5].samples]
