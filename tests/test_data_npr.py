"""No-Positive-Resampling history: threshold, min observations, last vs cumulative, exact JSON round-trip."""

import json

import pytest

from scalerl_jax.config import NPRConfig
from scalerl_jax.data.npr import NPRState


def test_last_history_removes_at_threshold_and_stays_removed():
  npr = NPRState(NPRConfig(threshold=0.9, history="last"))
  assert npr.update(["a", "b", "c"], [0.875, 0.9, 1.0]) == ["b", "c"]  # at or above 0.9
  assert npr.update(["a", "b"], [1.0, 0.0]) == ["a"]  # last observation decides; b stays solved
  assert npr.is_removed("b") and npr.num_removed == 3 and npr.history("b") == 0.0
  assert npr.removed_ids(2) == {"b", "c"}  # in the order solved


def test_cumulative_history_and_min_observations():
  npr = NPRState(NPRConfig(threshold=0.9, history="cumulative", min_observations=3))
  assert npr.update(["a", "b"], [1.0, 1.0]) == [] and npr.update(["a", "b"], [1.0, 1.0]) == []  # < 3 observations
  # a: mean (1 + 1 + 0.75) / 3 = 0.9167 >= 0.9, removed; b: mean (1 + 1 + 0.5) / 3 = 0.8333, kept
  assert npr.update(["a", "b"], [0.75, 0.5]) == ["a"]
  assert npr.history("a") == pytest.approx(2.75 / 3) and npr.history("b") == pytest.approx(2.5 / 3)
  last = NPRState(NPRConfig(threshold=0.9, history="last", min_observations=3))
  last.update(["b"] * 4, [1.0, 1.0, 0.5, 1.0])  # the same b under "last": removed at the 4th observation
  assert last.is_removed("b") and last.observations("b") == 4


def test_disabled_records_history_but_never_removes():
  npr = NPRState(NPRConfig(enabled=False))
  npr.update(["a"], [1.0])
  assert npr.observations("a") == 1 and npr.num_removed == 0 and not npr.is_removed("a")


def test_state_round_trips_exactly_through_json():
  cfg = NPRConfig(threshold=0.9, history="cumulative", min_observations=2)
  npr = NPRState(cfg)
  npr.update(["a", "b", "c", "a", "b"], [1 / 3, 1.0, 0.1, 0.7, 1.0])
  restored = NPRState(cfg)
  restored.load_state_dict(json.loads(json.dumps(npr.state_dict())))
  assert restored.state_dict() == npr.state_dict()
  assert restored.history("a") == npr.history("a") and restored.removed_ids() == {"b"}
  # both continue identically
  assert restored.update(["a", "c"], [1.0, 1.0]) == npr.update(["a", "c"], [1.0, 1.0])


def test_bad_inputs():
  npr = NPRState(NPRConfig())
  with pytest.raises(ValueError, match="in \\[0, 1\\]"):
    npr.update(["a"], [1.5])
  with pytest.raises(ValueError):
    npr.update(["a", "b"], [1.0])
  with pytest.raises(ValueError, match="version"):
    npr.load_state_dict({"version": 99})
