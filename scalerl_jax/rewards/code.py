"""Code reward: the program in a completion, run against an item's tests, every run inside the sandbox (sandbox.py).

    code_reward(completion, answer) -> Scored (a float in [0, 1] that carries a cause)

`answer` is a JSON object describing the tests (a dataset's answer field holds it as a string):

    {"starter": "def add(a, b):\\n",              optional, default "": prepended to the program as it is, no
                                                 newline added (HumanEval-style: the prompt's signature and
                                                 docstring, the completion's body; or "def f(x):return " and an
                                                 expression)
     "program": "marker",                        optional, default "marker": where the program is when the
                                                 completion has no fenced block: "marker" (the text after the
                                                 last sandbox.marker) or "completion" (the whole completion: it
                                                 continues the starter, as a HumanEval body does)
     "stdio": [["1 2\\n", "3\\n"], ...],          optional: [stdin, expected stdout] pairs, one run each
     "asserts": ["assert add(1, 2) == 3", ...]}  optional: Python statements, one test each, run after the program

At least one test (stdio or asserts) is required, and no other key; a malformed answer raises ValueError (the
runner scores that call as failed and counts it under reward/errors: the item is broken, not the policy).

The program: the last fenced block (```, ```python, ```py or ```python3; blocks of other languages are skipped) in
the completion; without one, the text after the last `sandbox.marker` up to the end-of-sequence '$' (when
present), or with "program": "completion" the whole completion (a final '$' dropped; not cut at a marker, which
Python code may hold: '|' is an operator). None, or only whitespace: the failure reward, cause "no_program". Each test is one fresh sandboxed run
with the per-test limits of the `sandbox` config group:
  - stdio: `starter + program` runs as the main script with the test's stdin; it passes when the run ends with
    cause ok (exit status 0 within every limit) and its stdout equals the expected output after stripping trailing
    whitespace from every line and dropping trailing empty lines. A program that prints the right output but exits
    non-zero FAILS (cause nonzero_exit): a crash after printing is still a crash.
  - asserts: the program runs in one process of the sandbox and the statement in another (assert_harness.py):
    the test's process forks the program's before it reads the test, runs the statement with the real builtins,
    and each program function the statement names is a stub that sends the call over a pipe; only builtin data
    (None, bool, int, float, complex, str, bytes and lists, tuples, dicts, sets of them, exact types) comes back.
    Names the starter defines come from the test's own run of the starter, except stubs (a function with only a
    docstring) and what its last statement binds (the program continues it). It passes when the run ends with
    cause ok and the test's process wrote "ok" on a descriptor that only it holds. An assert that fails is cause
    wrong_answer; a program that exits 0 before the tests ran (sys.exit(0), os._exit(0)) is exited_early. What
    the program cannot do any more: return an object whose __eq__ is always true, replace a builtin or module
    function the test uses, read the test or a token (there is none) from the harness's frame, stdin or
    /sandbox/main.py, or print the verdict itself. What an assert test cannot do: pass a function or object of
    its own to the program, or get back anything but builtin data (such a test fails). A program over file_kb is
    program_too_large before any test runs.
Reward: 1.0 when every test passes, else 0.0; with `sandbox.partial_credit` the fraction passed. Without partial
credit the tests stop at the first failure. Success (pass rates, No-Positive-Resampling) is "every test passed"
either way: the result carries it (`Scored.success`), so 2 of 3 tests passed (0.67) is not solved. The cause is
"ok" when every test passed, else that of the first failing test: a sandbox cause (sandbox.CAUSES, which has
program_too_large), wrong_answer
(clean exit, wrong stdout or a failed assert), exited_early (an assert test's run ended cleanly without reaching
its tests), or no_program. The runner counts them (RewardRunner.metrics: reward/cause/<cause>, per task
reward/<task>/cause/<cause>).

Configuration: `configure(cfg)` sets the sandbox of this process; reward workers call it from their initializer
(RewardRunner(..., sandbox=cfg.sandbox) arranges it), so the function keeps the fn(completion, answer) signature.
Unconfigured, it uses SandboxConfig's defaults.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Optional

from scalerl_jax.markers import EOS_CHAR
from scalerl_jax.rewards.sandbox import Sandbox
from scalerl_jax.rewards.worker import Scored

CAUSES = ("ok", "wrong_answer", "exited_early", "no_program")  # besides the sandbox's (sandbox.CAUSES)
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = ("", "python", "py", "python3")
_KEYS = ("starter", "program", "stdio", "asserts")
_PROGRAMS = ("marker", "completion")  # the "program" key's values

_HARNESS = (pathlib.Path(__file__).parent / "assert_harness.py").read_text()  # runs in the sandbox, not here

_sandbox: Optional[Sandbox] = None


def configure(cfg) -> None:
  """Sets the SandboxConfig that code_reward's runs use in this process."""
  global _sandbox
  _sandbox = Sandbox(cfg)


def _current() -> Sandbox:
  if _sandbox is None:
    from scalerl_jax.config.schema import SandboxConfig

    configure(SandboxConfig())
  return _sandbox


@dataclasses.dataclass(frozen=True)
class Tests:
  """One item's tests (see the module docstring)."""
  starter: str
  stdio: tuple[tuple[str, str], ...]
  asserts: tuple[str, ...]
  program: str = "marker"  # without a fenced block: the text after the marker, or the whole "completion"

  def __len__(self) -> int:
    return len(self.stdio) + len(self.asserts)


def parse_tests(answer: str) -> Tests:
  """The JSON answer -> Tests; ValueError naming the key that is wrong."""
  try:
    spec = json.loads(answer)
  except (TypeError, ValueError) as exc:
    raise ValueError(f"code answer is not JSON ({exc}); expected "
                     '{"starter": str, "stdio": [[stdin, stdout], ...], "asserts": [str, ...]}') from None
  if not isinstance(spec, dict):
    raise ValueError(f"code answer must be a JSON object with keys {', '.join(_KEYS)}, got {type(spec).__name__}")
  unknown = sorted(set(spec) - set(_KEYS))
  if unknown:
    raise ValueError(f"code answer: unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(_KEYS)})")
  starter = spec.get("starter", "")
  if not isinstance(starter, str):
    raise ValueError("code answer: 'starter' must be a string")
  program = spec.get("program", "marker")
  if program not in _PROGRAMS:
    raise ValueError(f"code answer: 'program' must be one of {', '.join(map(repr, _PROGRAMS))}, got {program!r}")
  stdio = spec.get("stdio", [])
  if not isinstance(stdio, list) or not all(
      isinstance(t, list) and len(t) == 2 and all(isinstance(x, str) for x in t) for t in stdio):
    raise ValueError("code answer: 'stdio' must be a list of [stdin, expected_stdout] string pairs")
  asserts = spec.get("asserts", [])
  if not isinstance(asserts, list) or not all(isinstance(t, str) for t in asserts):
    raise ValueError("code answer: 'asserts' must be a list of strings (Python statements)")
  tests = Tests(starter, tuple((i, o) for i, o in stdio), tuple(asserts), program)
  if not len(tests):
    raise ValueError("code answer has no tests: give 'stdio' pairs and/or 'asserts'")
  return tests


def extract_program(completion: str, marker: str, whole: bool = False) -> Optional[str]:
  """The last fenced Python block; else the text after the last `marker` (up to '$'), or with `whole` the whole
  completion (a final '$' dropped); None when there is none."""
  blocks = [body for tag, body in _FENCE.findall(completion) if tag.lower() in _PYTHON_TAGS]
  if blocks:
    program = blocks[-1]
  elif whole:
    program = completion[:-len(EOS_CHAR)] if completion.endswith(EOS_CHAR) else completion
  else:
    text = completion.split(EOS_CHAR, 1)[0]
    if not marker or marker not in text:
      return None
    program = text.rsplit(marker, 1)[1]
  return program if program.strip() else None


def normalize_output(text: str) -> list[str]:
  """Lines without trailing whitespace, trailing empty lines dropped: what stdio tests compare."""
  lines = [line.rstrip() for line in text.splitlines()]
  while lines and not lines[-1]:
    lines.pop()
  return lines


def _stdio_test(sandbox: Sandbox, source: str, stdin: str, expected: str) -> str:
  result = sandbox.run(source, stdin)
  if not result.ok:
    return result.cause
  return "ok" if normalize_output(result.stdout) == normalize_output(expected) else "wrong_answer"


def _assert_test(sandbox: Sandbox, source: str, statement: str, starter: str) -> str:
  """The program runs in one process of the sandbox, the test in another (assert_harness.py); the verdict comes
  back on a descriptor only the test's process holds."""
  result = sandbox.run(_HARNESS, json.dumps({"program": source, "starter": starter}),
                       side=json.dumps({"test": statement}).encode())
  if not result.ok:
    last = next((line for line in reversed(result.stderr.splitlines()) if line.strip()), "")
    return "wrong_answer" if result.cause == "nonzero_exit" and last.startswith("AssertionError") else result.cause
  return "ok" if result.side == "ok\n" else "exited_early"


def code_reward(completion: str, answer: str) -> Scored:
  """1.0 if the completion's program passes every test of `answer` (see the module docstring), else 0.0 or, with
  sandbox.partial_credit, the fraction of tests passed; the result's `cause` says why, its `success` whether every
  test passed."""
  tests = parse_tests(answer)
  sandbox = _current()
  program = extract_program(completion, sandbox.cfg.marker, whole=tests.program == "completion")
  if program is None:
    return Scored(0.0, "no_program", success=False)
  source = tests.starter + program
  if len(source.encode("utf-8", "surrogateescape")) > sandbox.cfg.file_kb * 1024:
    return Scored(0.0, "program_too_large", success=False)  # what the sandbox would say for each test
  runs = [lambda i=i, o=o: _stdio_test(sandbox, source, i, o) for i, o in tests.stdio]
  runs += [lambda s=s: _assert_test(sandbox, source, s, tests.starter) for s in tests.asserts]
  passed, first_failure = 0, None
  for run in runs:
    cause = run()
    if cause == "ok":
      passed += 1
      continue
    first_failure = first_failure or cause
    if not sandbox.cfg.partial_credit:
      break
  if first_failure is None:
    return Scored(1.0, "ok", success=True)
  return Scored(passed / len(tests) if sandbox.cfg.partial_credit else 0.0, first_failure, success=False)
