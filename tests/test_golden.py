"""The golden run (tests/golden/run.py) reproduces the stored numbers: prompt order, steps, lag, rewards and
held-out pass rates exactly, and loss, grad and update norms and a params checksum within `RTOL` relative (another
CPU rounds the last bits differently). A change that must alter them refreshes the file on purpose
(`python -m tests.golden.run --write`) in a commit of its own, saying why."""

import copy
import json

import pytest

from tests.golden.run import GOLDEN, RTOL, diff, golden_numbers


@pytest.fixture(scope="module")
def stored():
  return json.loads(GOLDEN.read_text())


def test_golden_run_is_unchanged(tmp_path, stored):
  got = golden_numbers(tmp_path / "run")
  assert len(got["steps"]) == len(stored["steps"]) > 1 and any(s.get("train/loss") for s in got["steps"][1:])
  problems = diff(stored, got)
  assert not problems, (f"the golden run (stored on {stored.get('written_on')}) changed:\n"
                        + "\n".join(problems[:20]))


def test_a_changed_loss_term_is_reported(tmp_path, stored, monkeypatch):
  """The tolerance is no blanket: the policy-gradient term scaled by 1.001 (a tenth of a percent) fails it."""
  from scalerl_jax import rl
  policy_loss = rl.policy_loss

  def scaled(*args, **kwargs):
    loss, metrics = policy_loss(*args, **kwargs)
    return loss * 1.001, metrics

  monkeypatch.setattr(rl, "policy_loss", scaled)
  got = golden_numbers(tmp_path / "run")
  problems = diff(stored, got)
  assert any("train/grad_norm" in p for p in problems), problems  # its gradient moved by 0.1 %
  assert got["prompts"] == stored["prompts"]  # the same data: only the loss term moved


def _summary():
  return {"prompts": [[1, 2], [3, 4]],
          "steps": [{"step": 0, "eval/pass_rate": 0.5},
                    {"step": 1, "train/loss": 0.8754070997, "train/grad_norm": 2.89, "train/update_norm": 1.78,
                     "train/reward_mean": 0.375, "pipeline/lag_max": 0.0}],
          "params_checksum": {"['embed']": [-1e-7, 150.0]}}


def test_diff_tolerates_another_cpus_rounding_and_nothing_more():
  a = _summary()
  b = copy.deepcopy(a)
  b["steps"][1]["train/loss"] = 0.8754066229  # the cross-CPU difference seen on an AVX-512 EPYC (5e-7 relative)
  b["params_checksum"]["['embed']"] = [2e-6, 150.0003]  # a near-zero sum moves by 2e-6, its magnitude by 2e-6 rel.
  assert b != a and diff(a, b) == []
  for change in (lambda s: s["steps"][1].update({"train/loss": 0.8754070997 * (1 + 10 * RTOL)}),
                 lambda s: s["steps"][1].update({"train/reward_mean": 0.4375}),  # one more sample rewarded
                 lambda s: s["steps"][1].update({"pipeline/lag_max": 1.0}),
                 lambda s: s["steps"][0].update({"eval/pass_rate": 0.5625}),
                 lambda s: s["prompts"].reverse(),
                 lambda s: s["params_checksum"]["['embed']"].__setitem__(0, 150.0 * 10 * RTOL)):
    c = copy.deepcopy(a)
    change(c)
    assert c != a and diff(a, c), c
