"""Faulty reward functions for tests/test_rewards.py (no tests here).

They are module-level functions in a module with only standard-library imports, so reward worker processes import
them by dotted path ('tests.test_rewards_faulty.<name>') quickly. Workers find `tests` because the pool sends the
trainer's sys.path to every worker (rewards/worker.py), and pytest puts the repository root on it.
A completion steers the behaviour: "hang:<file>" appends the worker's pid to <file>, then sleeps far past any test
timeout; everything else is scored by exact match.
"""

import math
import os
import sys
import time


def exact(completion, answer):
  return float(completion == answer)


def hang_on_request(completion, answer):
  if completion.startswith("hang:"):
    with open(completion[len("hang:"):], "a") as f:
      f.write(f"{os.getpid()}\n")
    time.sleep(60)
  return float(completion == answer)


def always_raises(completion, answer):
  raise RuntimeError(f"verifier crashed on {completion!r}")


def raises_on_boom(completion, answer):
  if completion == "boom":
    raise RuntimeError("verifier crashed")
  return float(completion == answer)


def bad_values(completion, answer):
  return {"nan": math.nan, "inf": -math.inf, "str": "abc", "none": None}.get(completion, completion == answer)


def exits_on_exit(completion, answer):
  if completion == "exit":
    os._exit(3)  # the worker process dies mid-call
  return float(completion == answer)


def loud(completion, answer):
  """Prints megabytes through Python and at the file-descriptor level; scores 1 only if both stdout and stderr
  are /dev/null in this process (so nothing of it can reach the trainer's log)."""
  sys.stdout.write("x" * (1 << 21))
  sys.stdout.flush()
  os.write(1, b"y" * (1 << 20))
  os.write(2, b"z" * (1 << 20))
  null = os.stat(os.devnull)
  return float(all((os.fstat(fd).st_dev, os.fstat(fd).st_ino) == (null.st_dev, null.st_ino) for fd in (1, 2)))


def one_argument(completion):
  return 1.0


def three_arguments(completion, answer, extra):
  return 1.0


def fraction(completion, answer):
  """A non-trivial float, to compare the pool's values with the inline path's bit for bit."""
  return (len(completion) * 7 % 11) / (len(answer) + 3)


def prefix_share(completion, answer):
  """Partial credit: the share of the answer's characters the completion matches in place (1 only when equal)."""
  return sum(a == b for a, b in zip(completion, answer)) / len(answer)
