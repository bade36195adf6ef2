"""The pipeline simulator (benchmarks/pipeline_sim.py), pure Python: k = 0 never overlaps generation and training,
the staleness bound of PipelineRL-k, PPO-off-policy-k's lag pattern, conservation of samples, and a case whose
times are computed by hand."""

import numpy as np
import pytest

from benchmarks import pipeline_sim as ps

HAND = ps.Workload(prompts=4, samples=4, prompt_len=8, lengths=ps.fixed_lengths(10))
HAND_GEN, HAND_TRAIN = ps.GenCost(step_s=0.01), ps.TrainCost(step_s=0.2)
# lengths from 1 to 40 tokens (several chunks, in-flight updates), a generator about as fast as the trainer
RANDOM = ps.Workload(prompts=4, samples=4, prompt_len=8, lengths=lambda rng, n: rng.integers(1, 41, n))
GEN = ps.GenCost(step_s=0.01, per_slot_s=1e-4, call_s=0.002, prefill_s=0.001, score_s=0.001)
TRAIN = ps.TrainCost(step_s=0.05, per_token_s=1e-4, sync_s=0.01)


def _run(mode, k, work=RANDOM, gen=GEN, train=TRAIN, steps=12, **kw):
  kw = {"slots": 8, "chunk": 4, **kw}
  return ps.simulate(mode, k, steps, work, gen, train, **kw)


def test_hand_computed_synchronous_case():
  # 16 samples of 10 tokens on 16 slots, chunks of 4 steps: 4 + 4 + 2 = 10 decode steps x 0.01 s = 0.1 s per
  # batch, then 0.2 s of training: 10 steps take 10 x 0.3 = 3.0 s. The trainer waits 0.1 of every 0.3 s; the
  # generator is busy 10 x 0.1 = 1.0 s and idle 9 x 0.2 = 1.8 s (it stops after the last batch, at 2.8 s).
  r = ps.simulate("pipeline", 0, 10, HAND, HAND_GEN, HAND_TRAIN, slots=16, chunk=4).summary()
  assert r["makespan_s"] == pytest.approx(3.0)
  assert r["trainer_wait_frac"] == pytest.approx(1 / 3)
  assert r["gen_idle_frac"] == pytest.approx(1.8 / 2.8)
  assert r["gen_slot_util"] == pytest.approx(1.0 / 3.0)  # every slot live while generating
  assert r["steps_per_hour"] == pytest.approx(3600 * 10 / 3.0)
  # k = 1: batch b + 1 is generated while step b trains; the trainer is the bottleneck: 0.1 + 10 x 0.2 s
  r1 = ps.simulate("pipeline", 1, 10, HAND, HAND_GEN, HAND_TRAIN, slots=16, chunk=4).summary()
  assert r1["makespan_s"] == pytest.approx(2.1)
  assert r1["lag_max"] == 1 and r1["trainer_wait_frac"] == pytest.approx(0.1 / 2.1)


def test_k0_never_overlaps_and_has_no_staleness():
  r = _run("pipeline", 0)
  assert set(r.lag_hist) == {0}
  chunks = [iv for reps in r.busy_iv for iv in reps]
  assert chunks and r.train_iv
  for a, b in r.train_iv:  # the trainer is alone while it trains, the generator alone while it generates
    assert all(e <= a + 1e-12 or s >= b - 1e-12 for s, e in chunks)
  assert r.summary()["trainer_wait_frac"] > 0


@pytest.mark.parametrize("k", [1, 2, 4])
def test_pipeline_staleness_bound_holds_and_is_reached(k):
  r = _run("pipeline", k, replicas=2, gen=ps.GenCost(step_s=0.002))  # a generator 5x faster than the trainer
  assert max(r.lag_hist) == k and min(r.lag_hist) >= 0  # reached: the generator runs ahead up to the bound
  assert all(0 <= lo <= hi <= k for lo, hi in zip(r.step_lag_min, r.step_lag_max))
  balanced = _run("pipeline", k, replicas=2)  # generator about as fast as the trainer: updates land mid-sequence
  assert balanced.in_flight_updates > 0 and max(balanced.lag_hist) <= k
  assert any(lo < hi for lo, hi in zip(balanced.step_lag_min, balanced.step_lag_max))  # mixed-version batches


def test_overlap_shortens_the_run():
  times = [_run("pipeline", k).makespan_s for k in (0, 1, 4)]
  assert times[0] > times[1] >= times[2]


@pytest.mark.parametrize("k", [2, 4])
def test_ppo_offpolicy_lag_pattern(k):
  # k batches from the frozen params of version floor(b / k) * k: every token of batch b lags by exactly b mod k
  r = _run("ppo_offpolicy", k)
  assert r.step_lag_min == r.step_lag_max == [b % k for b in range(12)]


def test_ppo_offpolicy_1_is_the_synchronous_loop():
  a, b = _run("ppo_offpolicy", 1).summary(), _run("pipeline", 0).summary()
  assert a["makespan_s"] == b["makespan_s"] and a["lag_max"] == b["lag_max"] == 0
  with pytest.raises(ValueError):
    _run("ppo_offpolicy", 0)


@pytest.mark.parametrize("mode,k", [("pipeline", 0), ("pipeline", 3), ("ppo_offpolicy", 2)])
def test_every_sample_generated_once_and_trained_once(mode, k):
  r = _run(mode, k, replicas=3)
  np.testing.assert_array_equal(r.generated, r.lengths)  # each sample to its full length, never regenerated
  assert r.trained == list(range(12))  # batches in order, each once
  assert sum(r.lag_hist.values()) == r.lengths.sum() == r.gen_tokens


def test_empirical_lengths_refuse_empty():
  with pytest.raises(ValueError):
    ps.empirical_lengths([])


def test_overlap_factor_slows_only_chunks_that_overlap_training():
  slow = ps.GenCost(step_s=0.01, overlap_factor=2.0)
  # k = 0: generation never overlaps a train step, so the factor changes nothing (3.0 s as by hand above)
  r0 = ps.simulate("pipeline", 0, 10, HAND, slow, HAND_TRAIN, slots=16, chunk=4).summary()
  assert r0["makespan_s"] == pytest.approx(3.0)
  # k = 1: batch b + 1 (0.1 s alone) is generated while step b trains (0.2 s): 0.2 s at half speed, still within
  # the step, so the trainer never waits after the first batch: 0.1 + 10 x 0.2 s as without the factor
  r1 = ps.simulate("pipeline", 1, 10, HAND, slow, HAND_TRAIN, slots=16, chunk=4).summary()
  assert r1["makespan_s"] == pytest.approx(2.1)
  # at factor 3 generating batch b + 1 takes 0.3 s > 0.2 s: the trainer now waits for each batch
  r3 = ps.simulate("pipeline", 1, 10, HAND, ps.GenCost(step_s=0.01, overlap_factor=3.0), HAND_TRAIN, slots=16,
                   chunk=4).summary()
  assert r3["makespan_s"] > 2.1 + 0.05 and r3["trainer_wait_frac"] > r1["trainer_wait_frac"]


def test_fractions_depend_only_on_cost_ratios():
  scale = lambda c, f: type(c)(**{k: v * f if isinstance(v, float) and k != "overlap_factor" else v
                                  for k, v in vars(c).items()})
  a = _run("pipeline", 2).summary()
  b = _run("pipeline", 2, gen=scale(GEN, 10.0), train=scale(TRAIN, 10.0)).summary()
  assert b["makespan_s"] == pytest.approx(10 * a["makespan_s"])
  for key in ("gen_idle_frac", "gen_slot_util", "trainer_wait_frac", "trainer_util", "lag_mean"):
    assert b[key] == pytest.approx(a[key]), key
