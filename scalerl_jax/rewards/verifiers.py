"""Verifiers: `fn(completion: str, answer: str) -> float` in [0, 1], pure and side-effect free.

  exact_match_reward   the final answer (after the last end-of-thinking marker, before EOS) equals the reference
  countdown_reward     the final answer is an expression (arith.py) of the given numbers that reaches the target
  math_verify_reward   math-verify equivalence of the final (boxed / "####" / last) answer
  boxed_answer_reward  1 for the right answer boxed, 0.5 unboxed (math-verify), 0 for a wrong one
  final_answer         the text a verifier compares
  verifier             the verifier of a task, by its name (VERIFIERS): the one lookup a run's rewards use

Any such function can be named in `reward.fn`; `RewardRunner` (runner.py) bounds its time and failures.
How the runner runs the built-in ones is decided by name, below.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
from typing import Callable, Optional

from scalerl_jax.markers import END_MARKER, EOS_CHAR
from scalerl_jax.rewards import arith
from scalerl_jax.rewards.code import code_reward


# Pure and cannot hang (string comparison, a bounded integer-expression parser): scored inline on the caller's
# thread, no worker pool. Everything else (a user's reward.fn, math-verify) runs in worker processes.
PURE_VERIFIERS = frozenset({
    "scalerl_jax.rewards.verifiers.exact_match_reward",
    "scalerl_jax.rewards.verifiers.countdown_reward",
})
# Run the model's programs: always in worker processes, each run inside the sandbox (code.py, sandbox.py); the
# runner configures their workers with the run's SandboxConfig and checks the sandbox before the first step.
SANDBOXED_VERIFIERS = frozenset({"scalerl_jax.rewards.code.code_reward"})
# Modules a reward worker imports when it starts, so the first call after a worker was replaced is not slow.
PRELOAD = {
    "scalerl_jax.rewards.verifiers.math_verify_reward": ("math_verify",),
    "scalerl_jax.rewards.verifiers.boxed_answer_reward": ("math_verify",),
}


def qualified_name(fn) -> str:
  """'package.module.Qual.name' of a function ('' when it has none, e.g. a functools.partial)."""
  module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
  return f"{module}.{qualname}" if module and qualname else ""


def final_answer(completion: str, end_marker: str = END_MARKER, eos: str = EOS_CHAR) -> Optional[str]:
  """The text after the last `end_marker`, up to the first `eos` (or the end); None without a marker."""
  text = completion.split(eos, 1)[0] if eos else completion
  if end_marker not in text:
    return None
  return text.rsplit(end_marker, 1)[1]


def exact_match_reward(completion: str, answer: str) -> float:
  """1 if the final answer (after the last '|', before '$') equals `answer` character for character."""
  return float(final_answer(completion) == answer)


def countdown_reward(completion: str, answer: str) -> float:
  """1 if the final answer is an expression (arith.py) that uses each number of `answer` ("3,5,7>22": the numbers,
  then the target) at most once and equals the target."""
  nums_text, _, target = answer.partition(">")
  expression = final_answer(completion)
  if not expression:
    return 0.0
  try:
    value, literals = arith.evaluate(expression)
  except ValueError:
    return 0.0
  allowed = collections.Counter(int(x) for x in nums_text.split(","))
  used = collections.Counter(literals)
  return float(value == int(target) and all(used[n] <= allowed[n] for n in used))


class _DropTimeoutWarning(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return "Timeout is disabled" not in record.getMessage()


_mv_lock = threading.Lock()
_mv_ready = False


def _math_verify():
  global _mv_ready
  import math_verify

  with _mv_lock:
    if not _mv_ready:  # math-verify warns on every call made with its timeouts off; we bound time ourselves
      for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutWarning())
      _mv_ready = True
  return math_verify


def math_verify_reward(completion: str, answer: str) -> float:
  """1 if the completion's final answer (boxed, or a final-answer phrase, or the last expression) is
  mathematically equivalent to `answer` per math-verify. Thinking up to the last `</think>` is dropped; a GSM8K
  answer ("... #### 72") is reduced to what follows the last "####"."""
  mv = _math_verify()
  if "</think>" in completion:
    completion = completion.rsplit("</think>", 1)[1]
  gold_text = answer.rsplit("####", 1)[1].strip() if "####" in answer else answer.strip()
  if not gold_text or not completion.strip():
    return 0.0
  gold = []
  if "$" not in gold_text and "\\boxed" not in gold_text:
    gold = mv.parse(f"${gold_text}$", parsing_timeout=None)
  if not gold:
    gold = mv.parse(gold_text, parsing_timeout=None)
  pred = mv.parse(completion, parsing_timeout=None)
  if not gold or not pred:
    return 0.0
  return float(mv.verify(gold, pred, timeout_seconds=None))


BOXED = "\\boxed{"


def boxed_answer(completion: str) -> Optional[str]:
  """The content of the completion's last \\boxed{...} (braces balanced), or None when it boxes nothing."""
  start = completion.rfind(BOXED)
  if start < 0:
    return None
  depth, i = 1, start + len(BOXED)
  for j in range(i, len(completion)):
    depth += {"{": 1, "}": -1}.get(completion[j], 0)
    if depth == 0:
      return completion[i:j].strip() or None
  return None


_NUMBER = re.compile(r"[-+]?\s*(\d[\d,]*(\.\d*)?|\.\d+)")
# boxed_answer_reward's table below the 1 a right boxed answer earns: a right final answer left unboxed, a boxed
# wrong number (reward.unboxed_reward, reward.boxed_wrong_reward; configure_boxed sets them in each process)
_boxed_table = {"unboxed": 0.5, "boxed_wrong": 0.0}


def configure_boxed(unboxed: float, boxed_wrong: float) -> None:
  """Sets what boxed_answer_reward pays a right unboxed answer and a boxed wrong number, in this process (the
  reward runner calls it here and in its worker processes)."""
  _boxed_table.update(unboxed=float(unboxed), boxed_wrong=float(boxed_wrong))


def boxed_answer_reward(completion: str, answer: str):
  """The reward of a task whose prompt asks for the final answer in \\boxed{}: 1 when the completion's last boxed
  number is the answer (math-verify); reward.unboxed_reward (0.5) when it boxes no number but its final answer is
  right (math_verify_reward: a final-answer phrase or the last number); reward.boxed_wrong_reward (0) for a boxed
  wrong number; 0 for an unboxed wrong one. Solved (`success`, the pass rates) only at 1. Causes, one per call:
  "correct", "correct_unboxed", "boxed_wrong", "wrong": the held-out greedy causes give the boxed-answer rate and
  the right-but-unboxed share.

  Measured on SmolLM2-135M (one-digit problems, 64-token budget): a binary right-and-boxed reward starts at 6 %
  solved (greedy), so most groups carry no gradient; 0.2 for any boxed number (right or wrong) taught it to box
  wrong numbers (greedy boxed 0.08 -> 1.00, right 0.06 -> 0.03 in 10 steps); 0.8 for an unboxed right final
  number taught it to ramble into the budget, whose cut text ends in numbers (truncation 0.70 -> 0.98 in 10 steps)
  unless truncated samples score 0 (loss.truncated_reward); 0.5 with that answered right unboxed (RESULTS)."""
  from scalerl_jax.rewards.worker import Scored
  boxed = boxed_answer(completion)
  if boxed is not None and not _NUMBER.fullmatch(boxed):  # "\\boxed{number}" copied from the prompt boxes nothing
    boxed = None
  correct = math_verify_reward(f"\\boxed{{{boxed}}}" if boxed is not None else completion, answer) >= 1.0
  if boxed is None:
    return Scored(_boxed_table["unboxed"] if correct else 0.0, "correct_unboxed" if correct else "wrong",
                  success=False)
  if correct:
    return Scored(1.0, "correct", success=True)
  return Scored(_boxed_table["boxed_wrong"], "boxed_wrong", success=False)


# Each task's verifier by the task's name: the built-in data.task names, and "math" for free-form math answers (a
# data file's math rows). A task names the verifier of each of its prompts' tasks (data/tasks.py, `verifiers`:
# the math rows of data.task=mixed are addition problems, scored by "addition"); `verifier` is the one lookup.
VERIFIERS: dict[str, Callable] = {
    "addition": exact_match_reward,
    "countdown": countdown_reward,
    "code": code_reward,
    "word_problems": boxed_answer_reward,
    "math": math_verify_reward,
}


def verifier(name: str) -> Callable:
  """The verifier registered under task name `name` (VERIFIERS); ValueError naming the known ones otherwise."""
  if name not in VERIFIERS:
    raise ValueError(f"no verifier for task {name!r}; the known ones: {', '.join(VERIFIERS)}")
  return VERIFIERS[name]
