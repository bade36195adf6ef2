"""Rewards never crash or hang the run; math answers are judged by equivalence."""

import threading

import numpy as np
import pytest

from scalerl_jax.config import DataConfig
from scalerl_jax.rewards import (RewardRunner, exact_match_reward, load_reward_fn, make_reward_runner,
                                      math_verify_reward)

_release = threading.Event()  # lets the hanging reward's abandoned thread finish at the end of the test


def hanging_reward(completion, answer):
  if completion == "hang":
    _release.wait(60)
  return float(completion == answer)


def raising_reward(completion, answer):
  if completion == "boom":
    raise RuntimeError("verifier crashed")
  return float(completion == answer)


def test_raising_and_bad_values_are_scored_as_failures_and_counted():
  runner = RewardRunner(raising_reward, timeout_s=2.0, failure_reward=-0.5)
  rewards, failures = runner.score(["a", "boom", "b", "a"], ["a", "a", "a", "b"])
  np.testing.assert_array_equal(rewards, np.float32([1, -0.5, 0, 0]))
  assert failures == 1 and runner.errors == 1 and "RuntimeError: verifier crashed" in runner.last_error
  weird = RewardRunner(lambda c, a: {"x": None, "n": float("nan")}.get(c, True), failure_reward=-1.0)
  rewards, failures = weird.score(["x", "n", "ok"], ["", "", ""])
  np.testing.assert_array_equal(rewards, np.float32([-1, -1, 1]))
  assert failures == 2


def test_hanging_reward_is_bounded_and_the_rest_of_the_batch_is_scored():
  # the deadline is far above what an instant call can take on a loaded machine, so only the hangs time out
  runner = RewardRunner(hanging_reward, timeout_s=2.0, failure_reward=0.0, scale="pm1")
  try:  # returning at all is the bound: each hanging call was abandoned at its deadline (counted below)
    rewards, failures = runner.score(["a", "hang", "b", "hang", "c"], ["a", "a", "b", "a", "x"])
  finally:
    _release.set()
  np.testing.assert_array_equal(rewards, np.float32([1, 0, 1, 0, -1]))
  assert failures == 2 and runner.timeouts == 2 and runner.abandoned_threads == 2
  assert runner.metrics()["reward/timeouts"] == 2


def test_scales_and_empty_batch():
  completions, answers = ["1", "2"], ["1", "1"]
  np.testing.assert_array_equal(RewardRunner(lambda c, a: c == a).score(completions, answers)[0], [1, 0])
  np.testing.assert_array_equal(RewardRunner(lambda c, a: c == a, scale="pm1").score(completions, answers)[0], [1, -1])
  rewards, failures = RewardRunner(exact_match_reward).score([], [])
  assert rewards.shape == (0,) and rewards.dtype == np.float32 and failures == 0
  with pytest.raises(ValueError, match="01 or pm1"):
    RewardRunner(exact_match_reward, scale="pm2")


@pytest.mark.parametrize("completion, answer, expected", [
    ("The answer is \\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("so \\boxed{\\dfrac{1}{2}}", "$\\frac12$", 1.0),
    ("\\boxed{x(x+2)}", "x^2+2x", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("<think>maybe \\boxed{3}</think> The final answer is \\boxed{4}.", "4", 1.0),
    ("<think>\\boxed{4}</think> The final answer is \\boxed{3}.", "4", 0.0),  # thinking is not the answer
    ("We get 4 + 6 = 10.\n#### 10", "4+6 = <<4+6=10>>10 stamps.\n#### 10", 1.0),  # GSM8K gold
    ("\\boxed{11}", "10", 0.0),
    ("", "10", 0.0),  # empty completion
    ("\\boxed{", "10", 0.0),  # malformed
    ("\\boxed{10}", "", 0.0),  # empty reference
    ("\\boxed{10}", "\\frac{", 0.0),  # malformed reference
])
def test_math_verify_reward_equivalences_and_malformed(completion, answer, expected):
  assert math_verify_reward(completion, answer) == expected


def test_math_verify_runs_off_the_main_thread_through_the_runner():
  runner = RewardRunner(math_verify_reward, timeout_s=30.0)
  rewards, failures = runner.score(["\\boxed{0.5}", "\\boxed{2}"], ["\\frac{1}{2}", "3"])
  np.testing.assert_array_equal(rewards, [1, 0])
  assert failures == 0


def test_load_reward_fn_by_dotted_path():
  assert load_reward_fn("scalerl_jax.rewards.exact_match_reward") is exact_match_reward
  assert load_reward_fn("scalerl_jax.rewards:math_verify_reward") is math_verify_reward
  for bad, msg in [("nodots", "not a dotted path"), ("no_such_module_xyz.fn", "cannot import"),
                   ("scalerl_jax.rewards.nope", "has no function")]:
    with pytest.raises(ValueError, match=msg):
      load_reward_fn(bad)


def test_make_reward_runner_prefers_the_configured_function():
  cfg = DataConfig(reward_fn="tests.test_rewards.raising_reward", reward_timeout_s=1.5, failure_reward=-1.0,
                   reward_scale="pm1")
  runner = make_reward_runner(cfg, exact_match_reward)
  assert runner.fn is raising_reward and runner.timeout_s == 1.5 and runner.scale == "pm1"
  assert make_reward_runner(DataConfig(), exact_match_reward).fn is exact_match_reward
