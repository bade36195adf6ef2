"""Stopping and refusing cleanly. Preemption and Ctrl-C: SIGTERM (Slurm, Kubernetes, a TPU VM maintenance event) and SIGINT stop a run at the next
step boundary with a checkpoint of exactly the steps consumed, in the pipeline and in the synchronous loop."""

import json
import signal
import subprocess
import time

import pytest

from tests.test_resume import ROOT, _command, _env, _lines


@pytest.mark.parametrize("sig,flags,code", [(signal.SIGTERM, [], 143), (signal.SIGINT, ["--sync"], 130)])
def test_signal_checkpoints_at_the_step_boundary_and_exits(tmp_path, sig, flags, code):
  run_dir = tmp_path / "run"
  command = [*_command(run_dir), *flags, "pipeline.steps=100000", "pipeline.eval_every=0",
             "checkpoint.every_steps=100000"]
  log = tmp_path / "log.txt"  # a file, not a pipe: a child never blocks on output nobody reads
  with open(log, "wb") as out_file:
    proc = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=out_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    prompts = run_dir / "consumed_prompts.jsonl"
    hang_guard = time.time() + 600  # only so that a broken run fails instead of hanging the suite
    while len(_lines(prompts)) < 2:  # a few steps in: the signal lands in the middle of the loop
      if proc.poll() is not None or time.time() > hang_guard:
        proc.kill()
        pytest.fail(f"the run ended or hung before its second step:\n{log.read_text()[-3000:]}")
      time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=600)
  out = log.read_text()
  assert proc.returncode == code, out[-3000:]
  assert f"{signal.Signals(sig).name}: checkpointing at the next step boundary" in out
  consumed = len(_lines(prompts))
  steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [consumed]  # the checkpoint holds every consumed step, and no step after it was consumed
  assert [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()][-1] == consumed


def test_a_refused_resume_is_one_line(tmp_path):
  run_dir = tmp_path / "run"
  base = [*_command(run_dir), "pipeline.steps=1", "pipeline.eval_every=0"]
  done = subprocess.run(base, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  refused = subprocess.run([*base, "pipeline.steps=2", "loss.name=dapo"], cwd=ROOT, env=_env(), capture_output=True,
                           text=True, timeout=300)
  assert refused.returncode == 2 and "Traceback" not in refused.stderr
  assert "train.py: error:" in refused.stderr and "loss.name: cispo -> dapo" in refused.stderr


def test_a_second_signal_during_a_checkpoint_write_waits_for_the_write():
  from scalerl_jax.pipeline.interrupts import Interrupts
  interrupts = Interrupts()
  interrupts._handler(signal.SIGINT, None)  # the first: stop at the next step boundary
  assert interrupts.is_set() and interrupts.exit_code == 130
  wrote = []
  with pytest.raises(KeyboardInterrupt):
    with interrupts.critical():
      interrupts._handler(signal.SIGINT, None)  # the second, mid-write: no exception here
      wrote.append("the rest of the write")
  assert wrote == ["the rest of the write"]  # the abort came only after the section
  with pytest.raises(KeyboardInterrupt):  # outside a write the second signal aborts at once
    interrupts._handler(signal.SIGTERM, None)


def test_an_interrupt_before_the_first_step_stops_without_a_step(tmp_path):
  """Ctrl-C while the run compiles (the handlers are on from the start): the loop never starts."""
  from tests.pipeline_helpers import tiny_config
  from scalerl_jax.pipeline.job import RLJob
  job = RLJob(tiny_config(tmp_path, "pipeline.steps=3", "pipeline.eval_every=0"), progress=False)
  setup = job.setup

  def setup_then_ctrl_c():
    setup()
    job._interrupt._handler(signal.SIGINT, None)  # as if it came during compilation

  job.setup = setup_then_ctrl_c
  summary = job.run_sync()
  assert summary["steps"] == 0 and job.exit_code == 130
  assert not (tmp_path / "consumed_prompts.jsonl").exists() or not _lines(tmp_path / "consumed_prompts.jsonl")
