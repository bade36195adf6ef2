"""kill -9 and resume: a short run is SIGKILLed after a checkpoint and, resumed, again between two checkpoints (held
at each kill point by a reward that blocks once a given step was consumed, so where the kill lands does not depend
on speed); each resume continues the data order with no prompt lost or duplicated, and the metrics continue."""

import os
import pathlib
import signal
import subprocess
import sys
import time

from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.prompt_stream import PromptStream
from scalerl_jax.data.tasks import make_task
from scalerl_jax.data.tokenizer import make_tokenizer
from tests.pipeline_helpers import PAUSE_ENV, TINY, read_consumed, read_metrics, tiny_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS = 8


def _command(run_dir):
  return [sys.executable, str(ROOT / "launch" / "train.py"), f"run_dir={run_dir}", *TINY, f"pipeline.steps={STEPS}"]


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the default: mesh.cpu_devices, colocated
  env.update(extra)
  env["PYTHONUNBUFFERED"] = "1"
  env["PYTHONPATH"] = str(ROOT)  # the reward function lives in tests/ (user code on the user's path)
  return env


def _start(run_dir, log, **env):
  return subprocess.Popen(_command(run_dir), cwd=ROOT, env=_env(**env), stdout=log, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL)


def _kill_when(proc, condition, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      raise AssertionError(f"run ended (rc={proc.returncode}) before the kill point")
    if condition():
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      return
    time.sleep(0.02)
  proc.kill()
  raise AssertionError("kill point not reached in time")


def _expected_prompt_order(run_dir):
  cfg = tiny_config(run_dir)
  task = make_task(cfg.data)
  pipe = PromptStream(task.train_records(), cfg.data, make_tokenizer(cfg.data), cfg.rollout.max_prefill_len,
                        npr=NPRState(cfg.data.npr))
  return [[p.prompt_id for p in pipe.next_batch()] for _ in range(STEPS)]


def test_sigkill_after_checkpoint_and_mid_step_then_resume(tmp_path):
  run_dir = tmp_path / "run"
  with open(tmp_path / "log.txt", "wb") as log:
    # 1. killed after the step-4 checkpoint committed and before the step-6 one: held once step 4 is consumed
    _kill_when(_start(run_dir, log, **{PAUSE_ENV: f"{run_dir}:4"}), lambda: (run_dir / "paused").exists())
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == [2, 4]
    (run_dir / "paused").unlink()
    # 2. resumed, then killed between checkpoints: once step 5 is consumed every reward call blocks (the held-out
    #    evaluation at version 6 comes before the step-6 checkpoint), so the run is held after step 5 for the kill
    _kill_when(_start(run_dir, log, **{PAUSE_ENV: f"{run_dir}:5"}), lambda: (run_dir / "paused").exists())
    assert any(r["step"] == 5 for r in read_consumed(run_dir))
    assert max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) <= 4
    # 3. resumed to the end
    final = _start(run_dir, log)
    assert final.wait(timeout=300) == 0, (tmp_path / "log.txt").read_text()[-3000:]

  consumed = read_consumed(run_dir)
  assert [r["step"] for r in consumed] == list(range(STEPS))  # each step once, in order
  assert [r["prompt_ids"] for r in consumed] == _expected_prompt_order(run_dir)  # none lost, none twice
  metrics = read_metrics(run_dir)
  assert [r["step"] for r in metrics] == list(range(STEPS + 1))
  compute = [r["compute/accelerator_seconds"] for r in metrics]
  assert all(b >= a for a, b in zip(compute, compute[1:]))  # compute continues across the kills
