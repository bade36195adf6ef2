"""MetricsLogger: the jsonl keeps metric names as they are; TensorBoard gets legal names without warnings."""

import json
import logging

from scalerl_jax.pipeline.sinks import MetricsLogger
from scalerl_jax.scaling.io import _read_events


def test_metrics_jsonl_and_tensorboard_names(tmp_path, caplog):
  logger = MetricsLogger(tmp_path, tensorboard=True)
  with caplog.at_level(logging.INFO):
    logger.write(3, {"eval/pass@4": 0.5, "eval/mean@4": 0.25, "train/loss": -0.1, "note": "text"})
  logger.close()
  row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
  assert row["step"] == 3 and row["eval/pass@4"] == 0.5 and row["note"] == "text" and "time/unix" in row
  events = _read_events(sorted((tmp_path / "tensorboard").rglob("events.out.tfevents.*")))
  tags = {k for e in events for k in e if k != "step"}
  assert {"eval/pass_at_4", "eval/mean_at_4", "train/loss"} <= tags and not any("@" in t for t in tags)
  assert not [r for r in caplog.records if "illegal" in r.getMessage()]
