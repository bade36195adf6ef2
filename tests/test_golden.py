"""The golden run (tests/golden/run.py) reproduces the stored numbers exactly: loss, reward, grad and update
norms, lag, held-out pass rates, prompt order and a params checksum. A change that must alter them refreshes the
file on purpose (`python -m tests.golden.run --write`) in a commit of its own, saying why."""

import json

from tests.golden.run import GOLDEN, diff, golden_numbers


def test_golden_run_is_unchanged(tmp_path):
  stored = json.loads(GOLDEN.read_text())
  got = golden_numbers(tmp_path / "run")
  assert len(got["steps"]) == len(stored["steps"]) > 1 and any(s.get("train/loss") for s in got["steps"][1:])
  problems = diff(stored, got)
  assert not problems, "the golden run changed:\n" + "\n".join(problems[:20])
