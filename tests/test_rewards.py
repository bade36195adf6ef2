"""Rewards never crash or stall the run; failures are scored, counted and reported; math answers are judged by
equivalence. The faulty reward functions live in tests/test_rewards_faulty.py (importable by worker processes).

No test depends on speed: a 'hang' sleeps 60 s against a 2 s timeout, and normal calls take microseconds."""

import ast
import json
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from scalerl_jax import types
from scalerl_jax.config import ConfigError, RewardConfig
from scalerl_jax.config.schema import SandboxConfig
from scalerl_jax.errors import UserError
from scalerl_jax.rewards import (VERIFIERS, RewardError, RewardRunner, RunResult, Scored, TaskRewards, code,
                                 code_reward, countdown_reward, exact_match_reward, load_reward_fn, make_reward_runner,
                                 math_verify_reward, verifier, worker)
from tests import test_rewards_faulty as faulty

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_raising_and_bad_values_are_scored_counted_and_reported(caplog):
  with RewardRunner(faulty.raises_on_boom, timeout_s=30.0, failure_reward=-0.5) as runner:
    assert runner.isolation == "process"
    batch = runner.score_batch(["a", "boom", "b", "a", "boom"], ["a", "a", "a", "b", "a"])
    np.testing.assert_array_equal(batch.rewards, np.float32([1, -0.5, 0, 0, -0.5]))
    np.testing.assert_array_equal(batch.failed, [False, True, False, False, True])
    assert batch.first_error == "RuntimeError: verifier crashed"
  with RewardRunner(faulty.bad_values, timeout_s=30.0, failure_reward=-1.0) as weird:
    with caplog.at_level(logging.WARNING, logger="scalerl_jax.rewards"):
      batch = weird.score_batch(["nan", "inf", "str", "none", "ok", "str"], ["", "", "", "", "ok", ""])
    np.testing.assert_array_equal(batch.rewards, np.float32([-1, -1, -1, -1, 1, -1]))
    assert batch.first_error == "returned nan, not a finite number" == weird.first_error == weird.last_error
  metrics = weird.metrics()
  assert metrics.pop("reward/score_s") > 0 and metrics.pop("reward/queue") == 6  # the latest batch's (own) calls
  assert metrics == {"reward/calls": 6, "reward/errors": 5, "reward/timeouts": 0, "reward/killed_workers": 0,
                     "reward/failure_rate": 5 / 6}
  warned = [r.getMessage() for r in caplog.records if r.name == "scalerl_jax.rewards"]
  warned = [w for w in warned if "bad_values" in w]
  assert len(warned) == 4  # each distinct text once, naming the function, with the failure count so far
  assert all("tests.test_rewards_faulty.bad_values failed" in w and "(5 of 6 calls failed so far)" in w for w in warned)
  assert any("returned 'abc', not a number" in w for w in warned)
  assert any("returned None, not a number" in w for w in warned)


def test_a_batch_in_which_every_call_fails_stops_the_run_with_the_error_text():
  with RewardRunner(faulty.always_raises, timeout_s=30.0, workers=1) as runner:
    with pytest.raises(RewardError, match=r"tests\.test_rewards_faulty\.always_raises .*every one of the 2 calls.*"
                                          r"RuntimeError: verifier crashed on 'x'") as info:
      runner.score(["x", "y"], ["a", "a"])
    assert isinstance(info.value, UserError)
    assert runner.metrics()["reward/failure_rate"] == 1.0
  inline = RewardRunner(lambda c, a: 1 / 0, isolation="inline")
  with pytest.raises(RewardError, match="ZeroDivisionError"):
    inline.score(["x"], ["a"])


def test_a_hanging_call_is_killed_with_its_worker_and_the_pool_keeps_working(tmp_path):
  pids = tmp_path / "pids"
  threads_before = threading.active_count()
  with RewardRunner(faulty.hang_on_request, timeout_s=2.0, failure_reward=0.0, scale="pm1", workers=2) as runner:
    completions = [f"c{i}" for i in range(12)]
    answers = list(completions)
    completions[4] = f"hang:{pids}"  # in a chunk with other calls: that chunk is rerun call by call
    assert runner._pool.chunk_size(12) > 1
    batch = runner.score_batch(completions, answers)
    expected = np.ones(12, np.float32)
    expected[4] = 0.0  # the failure reward (pm1 scale, as configured)
    np.testing.assert_array_equal(batch.rewards, expected)
    np.testing.assert_array_equal(batch.timed_out, np.arange(12) == 4)
    assert batch.first_error == "timed out after 2 s"
    hung = [int(p) for p in pids.read_text().split()]
    assert hung and not any(_alive(p) for p in hung)  # killed, not abandoned
    metrics = runner.metrics()
    assert metrics["reward/timeouts"] == 1 and metrics["reward/errors"] == 0
    assert metrics["reward/killed_workers"] >= 1
    # the replacement workers score the next batch
    np.testing.assert_array_equal(runner.score(["a", "b", "c"], ["a", "x", "c"])[0], np.float32([1, -1, 1]))
  assert threading.active_count() == threads_before  # no thread leaked: the pool's threads end with close()
  assert not runner._pool.started


def test_a_function_that_hangs_on_everything_fails_the_batch_without_running_every_call(tmp_path):
  pids = tmp_path / "pids"
  with RewardRunner(faulty.hang_on_request, timeout_s=1.0, workers=2) as runner:
    with pytest.raises(RewardError, match="timed out after 1 s"):
      runner.score([f"hang:{pids}"] * 40, [""] * 40)
    # 4 chunks, then calls alone: 2 * workers of them timed out, the rest was not run (at most 2 * workers - 1 of
    # it had started), not 40 calls of 1 s each
    assert runner.metrics()["reward/timeouts"] == 4 and runner.metrics()["reward/errors"] == 36
  started = [int(p) for p in pids.read_text().split()]
  assert 4 + 4 <= len(started) < 40  # the 4 chunks and the 4 lone calls that timed out ran; not every call
  assert not any(_alive(p) for p in started)  # close() stops the workers of the calls it gave up on


def test_a_hung_worker_does_not_outlive_a_killed_trainer(tmp_path):
  pids = tmp_path / "pids"
  code = ("from scalerl_jax.rewards import RewardRunner\n"
          "from tests.test_rewards_faulty import hang_on_request\n"
          f"RewardRunner(hang_on_request, timeout_s=600.0).score(['hang:{pids}'], [''])\n")
  trainer = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
  try:
    deadline = time.monotonic() + 120
    while not (pids.exists() and pids.read_text().endswith("\n")):
      assert trainer.poll() is None and time.monotonic() < deadline, "the reward call never started"
      time.sleep(0.05)
  finally:
    trainer.kill()
    trainer.wait()
  pid = int(pids.read_text())
  deadline = time.monotonic() + 60  # the forkserver exits, then the worker gets SIGKILL: about a second
  while _alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not _alive(pid)


def test_a_worker_that_dies_mid_call_is_replaced_and_only_that_call_fails():
  with RewardRunner(faulty.exits_on_exit, timeout_s=30.0) as runner:
    batch = runner.score_batch(["a", "exit", "b", "c", "d", "e"], ["a", "", "b", "c", "d", "x"])
    np.testing.assert_array_equal(batch.rewards, np.float32([1, 0, 1, 1, 1, 0]))
    np.testing.assert_array_equal(batch.failed, np.arange(6) == 1)
    assert "died (exit code 3)" in batch.first_error
    assert runner.score(["a"], ["a"]) == (np.float32([1]), 0)


def test_a_verifier_that_prints_megabytes_writes_to_dev_null():
  with RewardRunner(faulty.loud, timeout_s=30.0) as runner:
    np.testing.assert_array_equal(runner.score(["a", "b"], ["a", "b"])[0], np.float32([1, 1]))


def test_the_pool_scores_bit_for_bit_like_the_inline_path_and_from_two_threads_at_once():
  rng = np.random.default_rng(0)
  completions = ["x" * int(k) for k in rng.integers(0, 40, 300)]
  answers = ["y" * int(k) for k in rng.integers(0, 9, 300)]
  for scale in ("01", "pm1"):
    inline = RewardRunner(faulty.fraction, scale=scale, isolation="inline")
    expected = inline.score(completions, answers)[0]
    with RewardRunner(faulty.fraction, timeout_s=30.0, scale=scale) as pooled:
      results = [None, None]

      def score(k):
        results[k] = pooled.score(completions, answers)[0]

      threads = [threading.Thread(target=score, args=(k,)) for k in range(2)]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
      assert pooled._pool.started and inline._pool is None  # computed in worker processes vs on this thread
    assert len(set(expected.tolist())) > 5  # not a trivial 0/1 signal
    for got in results:
      assert got.dtype == np.float32 and got.tobytes() == expected.tobytes()


def test_a_wrong_signature_or_an_unsendable_function_is_refused_when_the_runner_is_built():
  for name in ("one_argument", "three_arguments"):
    with pytest.raises(ConfigError, match=rf"reward\.fn: .*{name}.*cannot be called as fn\(completion"):
      make_reward_runner(RewardConfig(fn=f"tests.test_rewards_faulty.{name}"), {"": "addition"})
  with pytest.raises(ConfigError, match="module-level function"):
    RewardRunner(lambda c, a: 1.0)  # process isolation needs a function its dotted path imports


def test_close_is_idempotent_and_the_pool_starts_lazily():
  runner = RewardRunner(faulty.exact, timeout_s=30.0, workers=1)
  assert not runner._pool.started
  assert runner.score(["a"], ["a"])[1] == 0 and runner._pool.started
  runner.close()
  runner.close()
  assert not runner._pool.started
  assert runner.score(["a"], ["b"])[0][0] == 0.0  # a later call starts the workers again
  runner.close()


def test_scales_and_empty_batch():
  completions, answers = ["1", "2"], ["1", "1"]
  eq = lambda c, a: c == a  # noqa: E731
  np.testing.assert_array_equal(RewardRunner(eq, isolation="inline").score(completions, answers)[0], [1, 0])
  np.testing.assert_array_equal(RewardRunner(eq, scale="pm1", isolation="inline").score(completions, answers)[0],
                                [1, -1])
  rewards, failures = RewardRunner(exact_match_reward).score([], [])
  assert rewards.shape == (0,) and rewards.dtype == np.float32 and failures == 0
  with pytest.raises(ValueError, match="01 or pm1"):
    RewardRunner(exact_match_reward, scale="pm2")


class _LookupSandbox:
  """Stands in for the sandbox in code_reward: the 'program' is a dict literal {stdin: stdout}, 'run' looks the
  test's stdin up in it (nothing is executed), so partial credit is scored without bubblewrap."""

  def __init__(self, partial_credit: bool):
    self.cfg = SandboxConfig(partial_credit=partial_credit)

  def run(self, source: str, stdin: str) -> RunResult:
    return RunResult(ast.literal_eval(source).get(stdin, ""), "", 0, "ok", 0.0)


def _groups(answer: str, completions: list[list[str]]):
  """Rollout groups of one prompt each whose samples decode (by index) to `completions`."""
  texts = [c for group in completions for c in group]
  out, i = [], 0
  for group in completions:
    prompt = types.Prompt(f"p{i}", "p", answer, np.zeros(1, np.int32))
    out.append(types.RolloutGroup(prompt, tuple(
        types.Sample(prompt.prompt_id, prompt.tokens, np.array([j], np.int32), np.zeros(1, np.float32),
                     np.zeros(1, np.int32), np.zeros(1, bool), False, False) for j in range(i, i + len(group)))))
    i += len(group)
  return out, lambda tokens: texts[int(tokens[0])]


def test_success_is_the_verifiers_verdict_not_a_share_of_the_reward(monkeypatch):
  """Pass rates, NPR and held-out evaluation read ScoredGroup.success: a program passing 2 of 3 tests scores 2/3
  under partial credit and has not solved its item; a score-only verifier solves with the full score."""
  answer = json.dumps({"stdio": [["1", "1"], ["2", "4"], ["3", "9"]]})
  fenced = lambda table: f"```python\n{table!r}\n```"  # noqa: E731
  two_of_three, all_three = fenced({"1": "1", "2": "4", "3": "0"}), fenced({"1": "1", "2": "4", "3": "9"})
  groups, decode = _groups(answer, [[two_of_three] * 2, [two_of_three, all_three]])
  for partial in (True, False):
    monkeypatch.setattr(code, "_sandbox", _LookupSandbox(partial))
    scored = RewardRunner(code_reward, isolation="inline").score_groups(groups, decode)
    np.testing.assert_allclose(np.concatenate([g.rewards for g in scored]),
                               [2 / 3, 2 / 3, 2 / 3, 1] if partial else [0, 0, 0, 1], rtol=1e-6)
    assert [g.success.tolist() for g in scored] == [[False, False], [False, True]]
    assert [g.pass_rate for g in scored] == [0.0, 0.5]  # NPR: the first prompt was solved by no sample
  # a score-only verifier in the worker pool (the worker's check decides): the full score only, on either scale
  groups, decode = _groups("abcd", [["abcx", "abcd", "abxx", "zzzz"]])
  for scale in ("01", "pm1"):
    with RewardRunner(faulty.prefix_share, timeout_s=30.0, workers=1, scale=scale) as runner:
      (scored,) = runner.score_groups(groups, decode)
    np.testing.assert_allclose(scored.rewards, [0.75, 1, 0.5, 0] if scale == "01" else [0.5, 1, 0, -1])
    assert scored.success.tolist() == [False, True, False, False]
  assert worker.check(Scored(1.0, "ok", success="yes"))[1] == ("returned a Scored whose success 'yes' is not a bool "
                                                                "or None")


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


def test_math_verify_runs_in_the_worker_pool():
  with RewardRunner(math_verify_reward, timeout_s=60.0, workers=1) as runner:
    rewards, failures = runner.score(["\\boxed{0.5}", "\\boxed{2}"], ["\\frac{1}{2}", "3"])
  np.testing.assert_array_equal(rewards, [1, 0])
  assert failures == 0


def test_load_reward_fn_by_dotted_path():
  assert load_reward_fn("scalerl_jax.rewards.exact_match_reward") is exact_match_reward
  assert load_reward_fn("scalerl_jax.rewards:math_verify_reward") is math_verify_reward
  for bad, msg in [("nodots", "not a dotted path"), ("no_such_module_xyz.fn", "cannot import"),
                   ("scalerl_jax.rewards.nope", "has no function")]:
    with pytest.raises(ConfigError, match=msg):
      load_reward_fn(bad)


def test_make_reward_runner_prefers_the_configured_function_and_picks_the_isolation():
  cfg = RewardConfig(fn="tests.test_rewards_faulty.raises_on_boom", timeout_s=1.5, on_failure=-1.0, scale="pm1",
                     workers=3)
  runner = make_reward_runner(cfg, {"": "addition"})
  assert runner.fn is faulty.raises_on_boom and runner.timeout_s == 1.5 and runner.scale == "pm1"
  assert runner.isolation == "process" and runner._pool.workers == 3 and not runner._pool.started
  default = make_reward_runner(RewardConfig(), {"": "addition"})
  assert default.fn is exact_match_reward and default.isolation == "inline"
  assert make_reward_runner(RewardConfig(scale="pm1"), {"": "addition"}).failure_reward == -1.0
  for task, isolation in [("addition", "inline"), ("countdown", "inline"), ("math", "process"),
                          ("word_problems", "process")]:
    assert make_reward_runner(RewardConfig(), {"": task}).isolation == isolation


def test_a_verifier_is_looked_up_by_task_name_in_one_registry():
  """Every task names its verifiers in one form ({prompt task: verifier name}) and make_reward_runner looks each up
  in one registry: untagged prompts get one runner, tagged tasks one runner per task."""
  from scalerl_jax.data.tasks import AdditionTask, MixedTask
  from scalerl_jax.config import DataConfig

  assert verifier("addition") is exact_match_reward and verifier("countdown") is countdown_reward
  assert verifier("code") is code_reward and verifier("math") is math_verify_reward
  with pytest.raises(ValueError, match="no verifier for task 'chess'; the known ones: addition, countdown"):
    verifier("chess")
  assert AdditionTask(2, num_train=20, num_eval=4, num_warmstart_val=4).verifiers == {"": "addition"}
  mixed = MixedTask(DataConfig(task="mixed", digits=2, code_digits=2, num_train=20, num_eval=4))
  assert mixed.verifiers == {"math": "addition", "code": "code"} and set(mixed.verifiers.values()) <= set(VERIFIERS)
  rewards = make_reward_runner(RewardConfig(), mixed.verifiers, sandbox=SandboxConfig())
  assert isinstance(rewards, TaskRewards)
  assert {t: r.fn for t, r in rewards.runners.items()} == {"math": exact_match_reward, "code": code_reward}
  with pytest.raises(ValueError, match="verifiers must be"):
    make_reward_runner(RewardConfig(), {"": "addition", "code": "code"})


def test_rewards_import_nothing_of_data():
  """rewards/ sits below data/ in the import graph: the markers it needs are scalerl_jax/markers.py's, and the
  tasks name their verifiers (data/ may import rewards/, never the reverse). Read from the source, so imports inside
  functions count too."""
  upward = []
  for path in sorted((ROOT / "scalerl_jax" / "rewards").glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
      else:
        continue
      upward += [f"{path.name}: {n}" for n in names if n == "scalerl_jax.data" or n.startswith("scalerl_jax.data.")]
  assert not upward, upward
