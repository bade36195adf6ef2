"""MetricsLogger: the jsonl keeps metric names as they are; TensorBoard gets legal names without warnings."""

import logging

from scalerl_jax.pipeline.sinks import MetricsLogger
from scalerl_jax.scaling.io import _read_events
from tests.pipeline_helpers import read_metrics


def test_metrics_jsonl_and_tensorboard_names(tmp_path, caplog):
  logger = MetricsLogger(tmp_path, tensorboard=True)
  with caplog.at_level(logging.INFO):
    logger.write(3, {"eval/pass@4": 0.5, "eval/mean@4": 0.25, "train/loss": -0.1, "note": "text"})
  logger.close()
  row = read_metrics(tmp_path)[0]
  assert row["step"] == 3 and row["eval/pass@4"] == 0.5 and row["note"] == "text" and "time/unix" in row
  events = _read_events(sorted((tmp_path / "tensorboard").rglob("events.out.tfevents.*")))
  tags = {k for e in events for k in e if k != "step"}
  assert {"eval/pass_at_4", "eval/mean_at_4", "train/loss"} <= tags and not any("@" in t for t in tags)
  assert not [r for r in caplog.records if "illegal" in r.getMessage()]


def test_generator_idle_fraction_is_of_the_time_since_the_previous_step(tmp_path):
  """Not of the time since the start (which counts compilation as busy): each step sees the generator's idle and
  busy seconds between its hold and the previous step's, however early it is flushed; a new generator whose totals
  start again at 0 is followed, and the compute meter adds up the busy seconds per step."""
  from scalerl_jax import rl, types
  from scalerl_jax.pipeline.compute import ComputeMeter
  from scalerl_jax.pipeline.orchestrator import GeneratorStats
  from scalerl_jax.pipeline.sinks import ProgressBar
  from scalerl_jax.pipeline.step_metrics import StepLog

  logger = MetricsLogger(tmp_path, tensorboard=False)
  log = StepLog(logger, ProgressBar(False, 3, 0, "test"), ComputeMeter(1, 1, True), evaluate=dict)
  device = {**rl.empty_metrics(), "grad_norm": 1.0, "update_norm": 1.0, "skipped": 0}
  stats = GeneratorStats()
  fracs = []
  for step, (idle, busy) in enumerate([(1.0, 9.0), (3.0, 1.0), (0.0, 1.0)]):
    if step == 2:
      stats = GeneratorStats()  # restarted: its totals begin again
    stats.idle_s += idle
    stats.busy_s += busy
    log.hold(types.StepRecord(step, device, {"rollout/tokens": 10}, 1.0, 1.0, 0.0), stats)
    stats.idle_s += 100.0  # after the hold: belongs to the next step's window, whenever this one is flushed
    log.flush(stats, evaluate=step == 1)  # an evaluation's early flush does not shorten the window
    stats.idle_s -= 100.0
  logger.close()
  rows = read_metrics(tmp_path)
  assert [r["pipeline/generator_idle_frac"] for r in rows] == [0.1, 0.75, 0.0]  # cumulative would read 4 / 14
  assert log.meter.gen_busy_s == 11.0  # 9 + 1 + 1, the restarted generator's too


def test_the_advisor_gets_the_step_its_record_is_written_with(tmp_path):
  """The early-stop advisor runs before metrics.jsonl adds the step, so the flush hands it the step (an advisor
  on curve_fit.x=steps reads it): it sees the same step the line is written with."""
  from scalerl_jax import rl, types
  from scalerl_jax.pipeline.compute import ComputeMeter
  from scalerl_jax.pipeline.sinks import ProgressBar
  from scalerl_jax.pipeline.step_metrics import StepLog

  seen = []
  logger = MetricsLogger(tmp_path, tensorboard=False)
  log = StepLog(logger, ProgressBar(False, 3, 0, "test"), ComputeMeter(1, 1, True),
                evaluate=lambda: {"eval/pass_rate": 0.5}, advise=lambda out: seen.append(out["step"]) or {})
  device = {**rl.empty_metrics(), "grad_norm": 1.0, "update_norm": 1.0, "skipped": 0}
  log.hold(types.StepRecord(4, device, {"rollout/tokens": 10}, 1.0, 1.0, 0.0))
  log.flush(evaluate=True)
  logger.close()
  row = read_metrics(tmp_path)[0]
  assert seen == [row["step"]] == [5]


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(capsys, caplog):
  """A log file gets a few plain lines, not tqdm's `\\r` redraws (150 KB of them for the CPU default's run)."""
  from scalerl_jax.pipeline.sinks import ProgressBar
  assert not __import__("sys").stderr.isatty()  # (capsys: stderr is a buffer, as when it goes to a file)
  with caplog.at_level(logging.INFO, logger="scalerl_jax.progress"):
    bar = ProgressBar(True, 40, 0, "RL (pipeline)")
    for step in range(25):
      bar.update({"train/reward_mean": 0.5, **({"eval/pass_rate": 0.25} if step % 10 == 9 else {})})
    bar.close()
  assert "\r" not in capsys.readouterr().err
  lines = [r.getMessage() for r in caplog.records if r.name == "scalerl_jax.progress"]
  assert lines[0] == "RL (pipeline): 4/40 steps (reward=0.500)" and lines[-1].startswith("RL (pipeline): 25/40 steps")
  assert len(lines) == 7  # one per tenth of the total, and the last one at close
