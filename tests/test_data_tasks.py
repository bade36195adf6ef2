"""Built-in tasks: formats, solutions, verifiers, and splits that never overlap; the file task's held-out split."""

import dataclasses
import pathlib

import pytest

from tests.fixtures import make_fixtures
from scalerl_jax.config import DataConfig, load_config
from scalerl_jax.config.validate import validate_with_tokenizer
from scalerl_jax.data.sources import DataError
from scalerl_jax.data import word_problems
from scalerl_jax.data.tasks import AdditionTask, CountdownTask, FileTask, WordProblems, make_task
from scalerl_jax.data.tokenizer import CharTokenizer
from scalerl_jax.rewards import arith
from scalerl_jax.rewards.verifiers import boxed_answer, boxed_answer_reward, verifier

REPO = pathlib.Path(__file__).resolve().parents[1]


def _small(cls, knob, seed=0):
  return cls(knob, seed=seed, num_train=300, num_eval=50, num_warmstart_val=20)


def _texts(records):
  return {r.text for r in records}


@pytest.mark.parametrize("cls, knob", [(AdditionTask, 3), (AdditionTask, 2), (CountdownTask, 3), (CountdownTask, 4)])
def test_splits_are_disjoint_by_content_and_sized(cls, knob):
  task = _small(cls, knob)
  train, ev, ws = _texts(task.train_records()), _texts(task.eval_records()), _texts(task.warmstart_val_records())
  assert (len(train), len(ev), len(ws)) == (300, 50, 20)
  assert not (train & ev) and not (train & ws) and not (ev & ws)


def test_eval_split_is_fixed_across_seeds_and_train_follows_the_seed():
  a, b = _small(AdditionTask, 3, seed=0), _small(AdditionTask, 3, seed=1)
  assert [r.text for r in a.eval_records()] == [r.text for r in b.eval_records()]
  assert [r.text for r in a.warmstart_val_records()] == [r.text for r in b.warmstart_val_records()]
  assert _texts(a.train_records()) != _texts(b.train_records())
  assert [r.text for r in a.train_records()] == [r.text for r in _small(AdditionTask, 3, seed=0).train_records()]


def test_addition_format_example():
  task = _small(AdditionTask, 3)
  p = (37, 485)
  # 7+5 = 12 carries 1, 3+8+1 = 12 carries 1, 0+4+1 = 5 carries 0: carries into the columns 0,1,1,0
  assert task._text(p) == "730+584=" and task._answer(p) == "2250" and task._solution(p) == "0110|2250$"
  assert task._solution((999, 1)) == "0111|0001$" and task._solution((0, 0)) == "0000|0000$"
  rec = task.train_records()[0]
  a, b = int(rec.text[:3][::-1]), int(rec.text[4:7][::-1])  # operands are written least-significant first
  assert rec.prompt_id == rec.text and rec.answer == f"{a + b:04d}"[::-1]
  assert task.solution(rec).endswith("|" + rec.answer + "$") and len(task.solution(rec)) == 10


def test_small_space_fills_what_it_can_and_errors_when_heldout_cannot():
  task = AdditionTask(1, num_train=1000, num_eval=20, num_warmstart_val=10)
  assert len(task.train_records()) == 100 - 30  # every remaining problem of 10 x 10
  with pytest.raises(DataError, match="only .* distinct problems left for the eval split"):
    AdditionTask(1, num_eval=512)


@pytest.mark.parametrize("cls, knob", [(AdditionTask, 3), (CountdownTask, 3), (CountdownTask, 5)])
def test_reference_solutions_score_one_and_fit_the_char_vocabulary(cls, knob):
  task, tok = _small(cls, knob), CharTokenizer()
  for rec in task.train_records() + task.eval_records() + task.warmstart_val_records():
    sol = task.solution(rec)
    assert verifier(task.verifiers[""])(sol, rec.answer) == 1.0, (rec, sol)
    assert sol.endswith("$") and tok.decode(tok.encode(rec.text + sol)) == rec.text + sol


# the countdown budget configs/cpu_default.yaml names (the defaults, the CPU recipe's, are sized to addition)
COUNTDOWN = ("data.task=countdown", "rollout.max_prefill_len=16", "rollout.prefill_buckets=[16]",
             "rollout.max_new_tokens=24", "model.max_seq_len=40", "rollout.interruption.think_budget_min=13",
             "rollout.interruption.think_budget_max=15", "rollout.interruption.answer_budget=8")


@pytest.mark.parametrize("config, overrides, tasks", [
    (None, (), (AdditionTask,)),  # the code defaults are the CPU recipe: sized to addition
    (REPO / "configs" / "cpu_default.yaml", (), (AdditionTask,)),
    (REPO / "configs" / "cpu_default.yaml", COUNTDOWN, (AdditionTask, CountdownTask)),
])
def test_builtin_prompts_and_solutions_fit_the_rollout_budget(config, overrides, tasks):
  cfg, tok = load_config(config, overrides), CharTokenizer()
  validate_with_tokenizer(cfg, tok)  # the interruption budget fits too
  rollout = cfg.rollout
  for cls in tasks:
    task = _small(cls, 3)
    for rec in task.train_records():
      prompt, solution = tok.encode_prompt(rec.text), tok.encode(task.solution(rec))
      assert len(prompt) <= rollout.max_prefill_len and len(solution) <= rollout.max_new_tokens, (config, rec)


@pytest.mark.parametrize("completion, reward", [
    ("0110|2250$", 1.0),
    ("9999|2250$", 1.0),  # only the answer after the last marker is judged
    ("0110|2250", 1.0),  # no EOS: up to the end
    ("0110|2250$junk", 1.0),  # after EOS is ignored
    ("0110|225$", 0.0),  # not zero-padded
    ("0110|0522$", 0.0),  # digits in normal order
    ("01102250$", 0.0),  # no end-of-thinking marker, no answer
    ("|2250|$", 0.0),
    ("", 0.0),
])
def test_addition_reward_cases(completion, reward):
  assert verifier("addition")(completion, "2250") == reward


@pytest.mark.parametrize("completion, reward", [
    ("3*5=15+7=22|3*5+7$", 1.0),
    ("x|7+5*3$", 1.0),  # any valid expression, any order
    ("|(7-5)*(3+8)$", 0.0),  # 8 is not given
    ("|5*5-3$", 0.0),  # 5 used twice
    ("|3*5+7+0$", 0.0),  # 0 is not given
    ("|(3+5)*7$", 0.0),  # wrong value
    ("|3*5+7)$", 0.0),  # malformed
    ("|03*5+7$", 0.0),  # leading zero
    ("3*5=15+7=22$", 0.0),  # no marker
    ("|$", 0.0),
])
def test_countdown_reward_cases(completion, reward):
  assert verifier("countdown")(completion, "3,5,7>22") == reward


def test_countdown_reward_allows_repeated_numbers_when_given_twice():
  assert verifier("countdown")("|7*7-7$", "7,7,7>42") == 1.0
  assert verifier("countdown")("|7*7-7$", "3,7,7>42") == 0.0


def test_arith_evaluate_is_exact_and_bounded():
  assert arith.evaluate("(2+8-8)*5") == (10, [2, 8, 8, 5])
  assert arith.evaluate("8/4/2") == (1, [8, 4, 2])  # left-associative
  for bad in ("7/2", "5/0", "-3+4", "2**3", "1+", "()", "1" * 65, "__import__('os')"):
    with pytest.raises(ValueError):
      arith.evaluate(bad)


def test_file_task_holds_out_a_fixed_disjoint_split(tmp_path):
  rows = make_fixtures.gsm8k_rows(50)
  rows.append(dict(rows[0], id="copy-of-0"))  # same content, another id
  path = make_fixtures.write_jsonl(tmp_path / "g.jsonl", rows)
  cfg = dataclasses.replace(DataConfig(), task="file", path=str(path), prompt_field="question", id_field="id",
                            num_eval=10)
  task = make_task(cfg)
  assert isinstance(task, FileTask)
  train, ev = _texts(task.train_records()), _texts(task.eval_records())
  assert len(task.eval_records()) == 10 and not (train & ev)
  assert len(task.train_records()) + len(task.eval_records()) + task.overlap_dropped == 51
  assert [r.prompt_id for r in make_task(dataclasses.replace(cfg, seed=5)).eval_records()] == \
      [r.prompt_id for r in task.eval_records()]
  assert task.verifiers == {"": "math"}
  assert verifier("math")("so the answer is \\boxed{10}", rows[0]["answer"]) == 1.0  # 4 + 6 = 10
  assert task.warmstart_val_records() == []
  with pytest.raises(DataError, match="leave none of the 51 rows"):
    make_task(dataclasses.replace(cfg, num_eval=51))


def test_make_task_builtin():
  cfg = dataclasses.replace(DataConfig(), task="countdown", digits=4, num_train=100, num_eval=20)
  task = make_task(cfg)
  assert isinstance(task, CountdownTask) and task.num_numbers == 4 and len(task.train_records()) == 100
  assert isinstance(make_task(dataclasses.replace(cfg, task="addition")), AdditionTask)


def test_word_problems_splits_answers_and_reference_solutions():
  """English word problems: disjoint splits, every op present, each answer the op of the prompt's two numbers (a
  whole number, as the module promises), the reference completion solved, the prompt asking for \\boxed{}."""
  import re
  task = _small(WordProblems, 2)
  train, ev, ws = _texts(task.train_records()), _texts(task.eval_records()), _texts(task.warmstart_val_records())
  assert (len(train), len(ev), len(ws)) == (300, 50, 20) and not (train & ev or train & ws or ev & ws)
  ops_seen = set()
  for rec in task.train_records() + task.eval_records():
    a, b = map(int, re.findall(r"\d+", rec.text.replace(word_problems.INSTRUCTION, ""))[:2])
    want = {"more": a + b, "in all": a + b, "left": a - b, "still": a - b, "bags with": a * b,
            "altogether": a * b, "equally": a // b, "packed": a // b}
    op = [k for k in want if k in rec.text]
    assert len(op) == 1, rec.text
    ops_seen.add(op[0])
    assert rec.answer == str(want[op[0]]) and int(rec.answer) >= 0, rec.text
    if op[0] in ("equally", "packed"):
      assert a % b == 0 and b < 10, rec.text
    assert rec.text.endswith(word_problems.INSTRUCTION)
    assert verifier(task.verifiers[""])(task.solution(rec), rec.answer) == 1.0
  assert len(ops_seen) == 8
  with pytest.raises(DataError, match="data.digits"):
    WordProblems(5)
  cfg = dataclasses.replace(DataConfig(), task="word_problems", digits=1, num_train=100, num_eval=20)
  assert isinstance(make_task(cfg), WordProblems) and make_task(cfg).digits == 1


@pytest.mark.parametrize("completion, value, cause, solved", [
    ("44 + 30 = 74. The answer is \\boxed{74}.", 1.0, "correct", True),
    ("\\boxed{12} no wait: \\boxed{74}", 1.0, "correct", True),  # the last box is the answer
    ("44 + 30 = 74.", 0.5, "correct_unboxed", False),  # right, but not in the format asked for
    ("The answer is \\boxed{70}.", 0.0, "boxed_wrong", False),
    ("The answer is \\boxed{number}.", 0.0, "wrong", False),  # the prompt's placeholder boxes no number
    ("So 70.", 0.0, "wrong", False),
    ("", 0.0, "wrong", False),
])
def test_boxed_answer_reward_cases(completion, value, cause, solved):
  got = boxed_answer_reward(completion, "74")
  assert (float(got), got.cause, got.success) == pytest.approx((value, cause, solved))


def test_boxed_answer_takes_the_last_balanced_box():
  assert boxed_answer("\\boxed{\\frac{1}{2}} then \\boxed{ 7 }") == "7"
  assert boxed_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
  assert boxed_answer("\\boxed{74") is None and boxed_answer("74") is None and boxed_answer("\\boxed{}") is None


def test_reward_keys_set_the_word_problem_reward_table_in_the_runner_and_its_workers():
  """reward.unboxed_reward / boxed_wrong_reward reach boxed_answer_reward wherever it runs (math-verify runs it in
  worker processes); the defaults pay 0.5 and 0."""
  from scalerl_jax.config.schema import RewardConfig
  from scalerl_jax.rewards.runner import make_reward_runner
  texts = ["The answer is \\boxed{74}.", "44 + 30 = 74.", "The answer is \\boxed{70}.", "So 70."]
  try:
    for table, want in (((0.5, 0.0), [1.0, 0.5, 0.0, 0.0]), ((0.25, 0.1), [1.0, 0.25, 0.1, 0.0])):
      cfg = RewardConfig(unboxed_reward=table[0], boxed_wrong_reward=table[1], workers=1)
      runner = make_reward_runner(cfg, {"": "word_problems"})
      try:
        assert runner.isolation == "process"
        assert runner.score_batch(texts, ["74"] * 4).rewards.tolist() == pytest.approx(want)
      finally:
        runner.close()
  finally:
    from scalerl_jax.rewards.verifiers import configure_boxed
    configure_boxed(0.5, 0.0)
