"""The checkpoint metadata record: what `RunMeta.to_json` writes reads back the same, and the older layouts that
`from_json` alone still reads (one data state under "data"; no per-process reward states)."""

import json

from scalerl_jax.types import RunMeta


def test_run_meta_round_trips_through_json():
  meta = RunMeta(step=4, seed=7, data_states=[{"epoch": 1}, {"epoch": 2}], npr={"solved": ["p1"]},
                 compute={"train_s": 1.5}, fingerprint={"loss.name": "cispo"}, rewards={"calls": 3},
                 reward_states=[{"calls": 3}, {"calls": 2}], last_eval_step=4, summary={"steps": 4})
  written = json.loads(json.dumps(meta.to_json()))  # as orbax's JSON item stores it
  assert written["version"] == written["step"] == 4
  assert RunMeta.from_json(written) == meta


def test_older_checkpoints_read_through_the_legacy_keys():
  old = {"step": 2, "version": 2, "seed": 0, "data": {"epoch": 0}, "npr": {}, "compute": {}, "fingerprint": {}}
  meta = RunMeta.from_json(old)
  assert meta.data_states == [{"epoch": 0}]  # one process's stream state, before per-process states
  assert meta.rewards is None and meta.reward_states is None and meta.last_eval_step == -1 and meta.summary == {}
