"""Verifiers: `fn(completion: str, answer: str) -> float` in [0, 1], pure and side-effect free.

  exact_match_reward   the final answer (after the last end-of-thinking marker, before EOS) equals the reference
  math_verify_reward   math-verify equivalence of the final (boxed / "####" / last) answer
  final_answer         the text a verifier compares

Any such function can be named in `data.reward_fn`; `RewardRunner` (runner.py) bounds its time and failures.
How the runner runs the built-in ones is decided by name, below (tasks.py's `reward` staticmethods wrap them).
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from scalerl_jax.data.tokenizer import END_MARKER, EOS_CHAR


# Pure and cannot hang (string comparison, a bounded integer-expression parser): scored inline on the caller's
# thread, no worker pool. Everything else (a user's data.reward_fn, math-verify) runs in worker processes.
PURE_VERIFIERS = frozenset({
    "scalerl_jax.rewards.verifiers.exact_match_reward",
    "scalerl_jax.data.tasks.AdditionTask.reward",
    "scalerl_jax.data.tasks.CountdownTask.reward",
})
# Run the model's programs: always in worker processes, each run inside the sandbox (code.py, sandbox.py); the
# runner configures their workers with the run's SandboxConfig and checks the sandbox before the first step.
SANDBOXED_VERIFIERS = frozenset({
    "scalerl_jax.rewards.code.code_reward",
    "scalerl_jax.data.tasks.code_reward",  # the built-in code task's verifier (it calls the one above)
})
# Modules a reward worker imports when it starts, so the first call after a worker was replaced is not slow.
PRELOAD = {
    "scalerl_jax.rewards.verifiers.math_verify_reward": ("math_verify",),
    "scalerl_jax.data.tasks.FileTask.reward": ("math_verify",),
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
