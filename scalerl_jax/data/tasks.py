"""Verifiable tasks: two built-in ones generated from a seed, and user files.

Every task gives Records for its splits, `verifiers` ({a prompt's task: the name of its verifier}, looked up by
rewards.verifier; {"": name} when the prompts carry no task) and, for the built-in tasks, the reference worked
completion `solution(record)` for a supervised warm start.

Built-in splits, disjoint by prompt text (checked at construction):
  - eval            `num_eval` prompts, the held-out set for mean@n / pass@k. Never trained on, by RL or warm start.
  - warmstart_val   `num_warmstart_val` (256) prompts on which the warm start measures its pass rate to stop.
  - train           up to `num_train` prompts: the RL prompt pool; the warm start also trains on (prompt, solution)
                    pairs drawn from it.
The eval and warm-start splits depend only on the task and its knob, not on `data.seed`, so runs with different
seeds are scored on the same held-out prompts; the training pool is drawn with `data.seed`. When the problem space is
small, the training pool holds every remaining problem (fewer than `num_train`).

Formats (character vocabulary in tokenizer.py; the prompt is encoded as BOS + text; '|' ends the thinking, '$' is
EOS):
  addition (knob `digits` = d): both operands zero-padded to d digits and written least-significant digit first.
    The work is the carry into each of the d + 1 columns (0 or 1, the first always 0), then '|', then the
    answer: the zero-padded (d + 1)-digit sum, also least-significant digit first, then '$'. For 37 + 485:
        prompt "730+584="   completion "0110|2250$"   answer "2250"
    Why this shape: every digit the model writes then sits at a fixed distance from the tokens it depends on
    (column i's operand digits and its carry), the distance a rotary-position model attends over. A carry is
    correlated with each operand digit on its own, so attention gets a gradient from the first steps; a sum digit
    alone is not (it is uniform given one operand digit), so without the carries the warm start sits on a
    plateau whose length depends on the seed. Measured on the default 0.4M policy (lr 3e-3, batch 128,
    teacher-forced pass rate >= 0.15 on the validation split): the carry work got there in 150-230 steps for
    seeds 0-2; work = the sum itself took 220 to > 300 steps, and with the answer also re-written in normal order
    (the previous format) seeds 1 and 2 had not left the plateau after 400 steps.
    Reward: exact match of the text after the last '|' (up to '$') with the answer. No '|', no answer.
  countdown (knob = how many numbers, `data.digits` for the built-in config; numbers 1..9, sorted in the prompt):
    reach the target with + - * and exact integer /, each number used at most once. The work is a running chain of
    steps "a op b = r op c = r' ...", then '|', then one expression.
        prompt "3,5,7>22:"   completion "3*5=15+7=22|3*5+7$"   answer "3,5,7>22"
    Reward: the expression after the last '|' parses (rewards/arith.py), uses each given number at most once,
    equals the target. The reference chain uses every number once, keeps every intermediate positive, and never
    divides by 1.
  code (knob `code_digits` = d): write f(x) = a*x + b (a in 1..9, b in [0, 10^d)) from its values at 0 and 1.
    The work is the slope f(1) - f(0), then '|', then the function body as a Python expression in x; the program
    run is "def f(x):return " + that expression, against one assert test of x = 2, 3, 7 and 10 in the sandbox
    (rewards/code.py; any correct expression passes, "x*3+52" as well as "3*x+52").
        prompt "52,55:"   completion "3|3*x+52$"   answer {"starter": "def f(x):return ", "asserts": [...]}
  word_problems (knob `digits`): English arithmetic word problems for a pretrained instruct model, answered in
    \\boxed{} and checked by math-verify (data/word_problems.py).
  mixed: the addition and code tasks in one pool (rows tagged math / code; data.code_fraction, data.task_mix),
    each scored by its own verifier, with held-out pass rates and curves per task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from typing import Callable

import numpy as np

from scalerl_jax.data.sources import DataError, Record, read_records
from scalerl_jax.data.word_problems import WordProblemTask
from scalerl_jax.markers import END_MARKER, EOS_CHAR

NUM_WARMSTART_VAL = 256
_SPLIT_SALT = {"eval": 1, "warmstart_val": 2, "train": 3}


def _draw(sample: Callable, text_of: Callable, rng: np.random.Generator, k: int, taken: set[str]) -> list:
  """Up to k problems with prompt texts not in `taken` (which grows), in draw order. Stops early once the space
  looks exhausted: a round of draws in which fewer than 1 in 50 was new."""
  out: list = []
  while len(out) < k:
    drawn = sample(rng, min(4096, max(64, 2 * (k - len(out)))))
    added = 0
    for problem in drawn:
      text = text_of(problem)
      if text not in taken:
        taken.add(text)
        out.append(problem)
        added += 1
        if len(out) == k:
          break
    if len(out) < k and added * 50 < len(drawn):
      break
  return out


class _BuiltinTask:
  """Split bookkeeping shared by the built-in tasks; subclasses define the problems."""

  name = ""

  def __init__(self, knob: int, seed: int, num_train: int, num_eval: int, num_warmstart_val: int):
    self.verifiers = {"": self.name}  # untagged prompts, scored by the verifier of the task's own name
    self.skipped_rows = 0
    self.counts: dict[str, int] = {}  # no data file: nothing to count
    self._solutions: dict[str, str] = {}
    taken: set[str] = set()
    splits = {}
    for split, k in (("eval", num_eval), ("warmstart_val", num_warmstart_val), ("train", num_train)):
      key = [_SPLIT_SALT[split], zlib.crc32(self.name.encode()), knob] + ([seed] if split == "train" else [])
      problems = _draw(self._sample, self._text, np.random.default_rng(key), k, taken)
      if len(problems) < k and split != "train":
        raise DataError(f"{self.name}: only {len(problems)} distinct problems left for the {split} split of {k}; "
                        "raise the difficulty knob or lower data.num_eval")
      if not problems and k:
        raise DataError(f"{self.name}: no problems left for training after the held-out splits")
      splits[split] = [self._record(p, split) for p in problems]
    self._splits = splits
    texts = [{r.text for r in recs} for recs in splits.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2]), "splits overlap"

  def _record(self, problem, split: str) -> Record:
    text = self._text(problem)
    self._solutions[text] = self._solution(problem)
    return Record(prompt_id=text, text=text, answer=self._answer(problem), where=f"{self.name}:{split}")

  def train_records(self) -> list[Record]:
    return list(self._splits["train"])

  def eval_records(self) -> list[Record]:
    return list(self._splits["eval"])

  def warmstart_val_records(self) -> list[Record]:
    return list(self._splits["warmstart_val"])

  def solution(self, record: Record) -> str:
    """The reference worked completion, ending with EOS '$'."""
    return self._solutions[record.text]


class AdditionTask(_BuiltinTask):
  """Fixed-width addition; see the module docstring for the format."""

  name = "addition"

  def __init__(self, digits: int = 3, seed: int = 0, num_train: int = 20000, num_eval: int = 512,
               num_warmstart_val: int = NUM_WARMSTART_VAL):
    if not 1 <= digits <= 9:
      raise DataError(f"data.digits must be in [1, 9] for addition, got {digits}")
    self.digits = digits
    super().__init__(digits, seed, num_train, num_eval, num_warmstart_val)

  def _sample(self, rng: np.random.Generator, m: int) -> list[tuple[int, int]]:
    ab = rng.integers(0, 10**self.digits, size=(m, 2))
    return [(int(a), int(b)) for a, b in ab]

  def _text(self, p: tuple[int, int]) -> str:
    a, b = f"{p[0]:0{self.digits}d}", f"{p[1]:0{self.digits}d}"
    return f"{a[::-1]}+{b[::-1]}="  # operands least-significant digit first, like the work

  def _answer(self, p: tuple[int, int]) -> str:
    return f"{p[0] + p[1]:0{self.digits + 1}d}"[::-1]  # least-significant digit first

  def _solution(self, p: tuple[int, int]) -> str:
    carries, carry = [], 0
    for i in range(self.digits + 1):
      carries.append(carry)
      carry = (p[0] // 10**i % 10 + p[1] // 10**i % 10 + carry) // 10
    return "".join(map(str, carries)) + END_MARKER + self._answer(p) + EOS_CHAR


class CountdownTask(_BuiltinTask):
  """Reach a target from a few small numbers; see the module docstring for the format."""

  name = "countdown"

  def __init__(self, num_numbers: int = 3, seed: int = 0, num_train: int = 20000, num_eval: int = 512,
               num_warmstart_val: int = NUM_WARMSTART_VAL, max_number: int = 9):
    if not 2 <= num_numbers <= 6:
      raise DataError(f"countdown: the number count (data.digits) must be in [2, 6], got {num_numbers}")
    self.num_numbers = num_numbers
    self.max_number = max_number
    super().__init__(num_numbers, seed, num_train, num_eval, num_warmstart_val)

  def _sample(self, rng: np.random.Generator, m: int) -> list[tuple]:
    nums_MN = rng.integers(1, self.max_number + 1, size=(m, self.num_numbers))
    keys_MSO = rng.random((m, self.num_numbers - 1, 4))  # random choice among the valid ops of each step
    acc_M = nums_MN[:, 0].copy()
    ops_MS = np.zeros((m, self.num_numbers - 1), np.int64)
    for s in range(self.num_numbers - 1):
      x_M = nums_MN[:, s + 1]
      valid_MO = np.stack([acc_M > 0, acc_M > x_M, acc_M > 0, (x_M > 1) & (acc_M % x_M == 0)], axis=1)
      ops_MS[:, s] = op_M = np.argmax(np.where(valid_MO, keys_MSO[:, s], -1.0), axis=1)
      acc_M = np.choose(op_M, [acc_M + x_M, acc_M - x_M, acc_M * x_M, acc_M // x_M])
    out = []
    for nums, ops in zip(nums_MN.tolist(), ops_MS.tolist()):
      acc = nums[0]
      expr, steps, low_precedence = str(acc), str(acc), False
      for x, o in zip(nums[1:], ops):
        op = "+-*/"[o]
        acc = (acc + x, acc - x, acc * x, acc // x)[o]
        if o >= 2 and low_precedence:
          expr = f"({expr})"
        expr, steps, low_precedence = f"{expr}{op}{x}", f"{steps}{op}{x}={acc}", o < 2
      out.append((tuple(sorted(nums)), acc, steps, expr))
    return out

  def _text(self, p: tuple) -> str:
    return f"{self._answer(p)}:"

  def _answer(self, p: tuple) -> str:
    return ",".join(map(str, p[0])) + f">{p[1]}"

  def _solution(self, p: tuple) -> str:
    return f"{p[2]}{END_MARKER}{p[3]}{EOS_CHAR}"


class CodeTask(_BuiltinTask):
  """Write a linear function from two of its values; see the module docstring for the format."""

  name = "code"
  STARTER = "def f(x):return "
  TEST_INPUTS = (2, 3, 7, 10)

  def __init__(self, digits: int = 2, seed: int = 0, num_train: int = 20000, num_eval: int = 512,
               num_warmstart_val: int = NUM_WARMSTART_VAL):
    if not 1 <= digits <= 6:
      raise DataError(f"data.code_digits must be in [1, 6], got {digits}")
    self.digits = digits
    super().__init__(digits, seed, num_train, num_eval, num_warmstart_val)

  def _sample(self, rng: np.random.Generator, m: int) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in zip(rng.integers(1, 10, m), rng.integers(0, 10**self.digits, m))]

  def _text(self, p: tuple[int, int]) -> str:
    a, b = p
    return f"{b},{a + b}:"

  def _answer(self, p: tuple[int, int]) -> str:
    a, b = p
    # one test (one sandboxed run) checking every input: the task needs no partial credit, and a run costs ~50 ms
    values = [a * x + b for x in self.TEST_INPUTS]
    return json.dumps({"starter": self.STARTER, "asserts": [f"assert [f(x) for x in {self.TEST_INPUTS}]=={values}"]})

  def _solution(self, p: tuple[int, int]) -> str:
    a, b = p
    return f"{a}{END_MARKER}{a}*x+{b}{EOS_CHAR}"


class WordProblems(WordProblemTask, _BuiltinTask):
  """English arithmetic word problems for a pretrained instruct model (data/word_problems.py)."""

  def __init__(self, digits: int = 2, seed: int = 0, num_train: int = 20000, num_eval: int = 512,
               num_warmstart_val: int = NUM_WARMSTART_VAL):
    self._check_knob(digits)
    super().__init__(digits, seed, num_train, num_eval, num_warmstart_val)


class MixedTask:
  """The addition (math) and code tasks in one run: every record tagged with its task, each task scored by its own
  verifier (the math rows are addition problems: the addition verifier). Held-out and warm-start splits are both
  tasks' own (`data.num_eval` each). The training pool holds both tasks' pools in the proportion
  data.code_fraction (the larger one cut to fit); `task_records()` gives them apart for data.task_mix=ratio."""

  name = "mixed"

  def __init__(self, cfg):
    self.tasks = {"math": AdditionTask(cfg.digits, cfg.seed, cfg.num_train, cfg.num_eval),
                  "code": CodeTask(cfg.code_digits, cfg.seed, cfg.num_train, cfg.num_eval)}
    self.code_fraction = cfg.code_fraction
    self.verifiers = {"math": "addition", "code": "code"}
    self.counts: dict[str, int] = {}
    self.skipped_rows = 0

  @staticmethod
  def _tagged(records: list[Record], task: str) -> list[Record]:
    return [dataclasses.replace(r, task=task) for r in records]

  def task_records(self) -> dict[str, list[Record]]:
    """Each task's whole training pool, tagged."""
    return {name: self._tagged(t.train_records(), name) for name, t in self.tasks.items()}

  def train_records(self) -> list[Record]:
    pools = self.task_records()
    f = self.code_fraction
    n_math, n_code = len(pools["math"]), len(pools["code"])
    if 0 < f < 1:  # cut the larger pool so the pool's code share is f
      n_math = min(n_math, round(n_code * (1 - f) / f))
      n_code = min(n_code, round(n_math * f / (1 - f)))
    return pools["math"][:n_math if f < 1 else 0] + pools["code"][:n_code if f > 0 else 0]

  def eval_records(self) -> list[Record]:
    return [r for name, t in self.tasks.items() for r in self._tagged(t.eval_records(), name)]

  def warmstart_val_records(self) -> list[Record]:
    return [r for name, t in self.tasks.items() for r in self._tagged(t.warmstart_val_records(), name)]

  def solution(self, record: Record) -> str:
    return self.tasks[record.task].solution(record)


class FileTask:
  """Prompts from a JSONL/Parquet file (data.path). The held-out split is the first `num_eval` rows of
  data.eval_path when given, else `num_eval` rows of data.path held out by a hash of their id (so the split does not
  depend on the seed or on the file's row order); training rows whose prompt text equals a held-out
  prompt are dropped (`overlap_dropped`). No reference completions: no warm start. Verifiers: math-verify ("math");
  a file with code rows: math-verify for its math rows, the sandboxed code verifier for its code rows.

  `counts` ({"rows_read", "skipped_bad_rows", "overlap_dropped"}, unprefixed like PromptStream.counts) is what the
  run logs as data/... metrics; read_records has already logged a warning when rows were skipped."""

  name = "file"

  def __init__(self, cfg):
    result = read_records(cfg.path, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field,
                          id_field=cfg.id_field, skip_bad_rows=cfg.skip_bad_rows, task_field=cfg.task_field)
    self.skipped_rows = result.skipped
    self.bad_row_examples = result.errors
    records = result.records
    if cfg.eval_path:  # the held-out split has its own file: every training row trains
      held_out = read_records(cfg.eval_path, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field,
                              id_field=cfg.id_field, skip_bad_rows=cfg.skip_bad_rows,
                              task_field=cfg.task_field, key="data.eval_path").records
      self._eval, train = held_out[:cfg.num_eval], records
    else:
      if len(records) <= cfg.num_eval:
        raise DataError(f"{cfg.path}: data.num_eval={cfg.num_eval} held-out prompts leave none of the "
                        f"{len(records)} rows for training; lower data.num_eval or give data.eval_path")
      rank = sorted(range(len(records)),
                    key=lambda i: hashlib.sha1(f"eval:{records[i].prompt_id}".encode()).digest())
      held = set(rank[:cfg.num_eval])
      self._eval = [r for i, r in enumerate(records) if i in held]
      train = [r for i, r in enumerate(records) if i not in held]
    eval_texts = {r.text for r in self._eval}
    self._train = [r for r in train if r.text not in eval_texts]
    self.overlap_dropped = len(train) - len(self._train)
    self.counts = {**result.counts(), "overlap_dropped": self.overlap_dropped}
    if not self._train:
      raise DataError(f"{cfg.path}: every training row repeats a held-out prompt")
    self.tasks_present = sorted({r.task for r in self._train + self._eval})
    self.verifiers = {"math": "math", "code": "code"}
    if self.tasks_present == ["math"]:  # a math-only file: one verifier, untagged (the single-task run of before)
      self._train = [dataclasses.replace(r, task="") for r in self._train]
      self._eval = [dataclasses.replace(r, task="") for r in self._eval]
      self.verifiers = {"": "math"}

  def train_records(self) -> list[Record]:
    return list(self._train)

  def eval_records(self) -> list[Record]:
    return list(self._eval)

  def warmstart_val_records(self) -> list[Record]:
    return []

  def solution(self, record: Record) -> str:
    raise DataError("data.task=file has no reference completions; disable warm_start")


def make_task(cfg) -> AdditionTask | CountdownTask | CodeTask | WordProblems | MixedTask | FileTask:
  """From a DataConfig. For countdown, `data.digits` is the number count."""
  if cfg.task == "addition":
    return AdditionTask(cfg.digits, cfg.seed, cfg.num_train, cfg.num_eval)
  if cfg.task == "countdown":
    return CountdownTask(cfg.digits, cfg.seed, cfg.num_train, cfg.num_eval)
  if cfg.task == "code":
    return CodeTask(cfg.code_digits, cfg.seed, cfg.num_train, cfg.num_eval)
  if cfg.task == "word_problems":
    return WordProblems(cfg.digits, cfg.seed, cfg.num_train, cfg.num_eval)
  if cfg.task == "mixed":
    return MixedTask(cfg)
  if cfg.task == "file":
    return FileTask(cfg)
  raise DataError(f"data.task must be addition, countdown, code, word_problems, mixed or file, got {cfg.task!r}")
