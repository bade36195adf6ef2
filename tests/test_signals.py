"""Stopping and refusing cleanly. Preemption and Ctrl-C: SIGTERM (Slurm, Kubernetes, a TPU VM maintenance event) and SIGINT stop a run at the next
step boundary with a checkpoint of exactly the steps consumed, in the pipeline and in the synchronous loop; the
long phases before and between steps (warm start, compilation, evaluation) stop within seconds; a second signal
exits at once with one line. A preempted VM gives about 30 s."""

import signal
import subprocess
import time

import pytest

from tests import fault_helpers
from tests.pipeline_helpers import read_consumed, read_metrics, tiny_config, tiny_job
from tests.test_resume import ROOT, _command, _env

GENEROUS_S = 120  # far above the few seconds a stop takes, far below what the phases would run on for


@pytest.mark.parametrize("sig,flags,code", [(signal.SIGTERM, [], 143), (signal.SIGINT, ["--reference-loop"], 130)])
def test_signal_checkpoints_at_the_step_boundary_and_exits(tmp_path, sig, flags, code):
  run_dir = tmp_path / "run"
  command = [*_command(run_dir), *flags, "pipeline.steps=100000", "pipeline.eval_every=0",
             "checkpoint.every_steps=100000"]
  log = tmp_path / "log.txt"  # a file, not a pipe: a child never blocks on output nobody reads
  with open(log, "wb") as out_file:
    proc = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=out_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    hang_guard = time.time() + 600  # only so that a broken run fails instead of hanging the suite
    while len(read_consumed(run_dir, missing_ok=True)) < 2:  # a few steps in: the signal lands mid-loop
      if proc.poll() is not None or time.time() > hang_guard:
        proc.kill()
        pytest.fail(f"the run ended or hung before its second step:\n{log.read_text()[-3000:]}")
      time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=600)
  out = log.read_text()
  assert proc.returncode == code, out[-3000:]
  assert f"{signal.Signals(sig).name}: checkpointing at the next step boundary" in out
  consumed = len(read_consumed(run_dir, missing_ok=True))
  steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [consumed]  # the checkpoint holds every consumed step, and no step after it was consumed
  assert read_metrics(run_dir)[-1]["step"] == consumed


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
  job = tiny_job(tmp_path, "pipeline.steps=3", "pipeline.eval_every=0")
  setup = job.setup

  def setup_then_ctrl_c():
    setup()
    job.interrupts.receive(signal.SIGINT)  # as if it came during compilation

  job.setup = setup_then_ctrl_c
  summary = job.run_sync()
  assert summary["steps"] == 0 and job.exit_code == 130
  assert not read_consumed(tmp_path, missing_ok=True)


def _start(tmp_path, overrides, faults=None):
  """launch/train.py as a child (tiny config), stdout and stderr to files (not terminals, never blocking)."""
  out, err = open(tmp_path / "stdout.txt", "wb"), open(tmp_path / "stderr.txt", "wb")
  proc = subprocess.Popen(fault_helpers.command(tmp_path / "run", overrides), cwd=ROOT,
                          env=fault_helpers.child_env(faults), stdout=out, stderr=err, stdin=subprocess.DEVNULL)
  out.close(), err.close()
  return proc


def _wait_for(proc, path, text, what):
  hang_guard = time.time() + 600  # only so that a broken run fails instead of hanging the suite
  while text not in path.read_text(errors="replace"):
    if proc.poll() is not None or time.time() > hang_guard:
      proc.kill()
      pytest.fail(f"the run ended or hung before {what}:\n{path.read_text(errors='replace')[-3000:]}")
    time.sleep(0.05)


def _exit_code_within(proc, seconds, tmp_path):
  try:
    return proc.wait(timeout=seconds)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    pytest.fail(f"still running {seconds} s after the signal:\n{(tmp_path / 'stderr.txt').read_text()[-3000:]}")


def test_sigterm_during_the_warm_start_stops_the_run_within_seconds(tmp_path):
  """The warm start (here: a target it never reaches, a million steps) checks the stop flag after every step: the
  run stops without caching the partial warm start, compiling or evaluating, and the summary names the signal."""
  cache = tmp_path / "warm_cache"
  proc = _start(tmp_path, ["warm_start.enabled=true", "warm_start.max_steps=1000000", "warm_start.target_pass_rate=2.0",
                           "warm_start.batch_size=16", f"warm_start.cache_dir={cache}", "pipeline.eval_every=2"])
  _wait_for(proc, tmp_path / "stderr.txt", "warm start: up to 1000000 supervised steps", "the warm start")
  proc.send_signal(signal.SIGTERM)
  code = _exit_code_within(proc, GENEROUS_S, tmp_path)
  out, err = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
  assert code == 143, err[-3000:]
  assert "Traceback" not in err
  assert "stopped by SIGTERM after 0 steps, during the warm start (" in out, out
  assert "not cached: the next start warms up afresh); the same command starts the run again" in out
  assert not list(cache.glob("*.safetensors"))  # a partial warm start is never taken for the finished one
  assert not read_metrics(tmp_path / "run", missing_ok=True)  # no step-0 evaluation ran


def test_a_second_signal_exits_at_once_with_one_line(tmp_path):
  """The first SIGTERM lands while the trainer is held inside a step (a failpoint that never returns): it is
  acknowledged; the second ends the run at once with one line, exit 143, no traceback."""
  proc = _start(tmp_path, ["pipeline.eval_every=0"], faults="train_step@2~")
  _wait_for(proc, tmp_path / "stderr.txt", "failpoint train_step holding", "the held step")
  proc.send_signal(signal.SIGTERM)
  _wait_for(proc, tmp_path / "stderr.txt", "SIGTERM: checkpointing at the next step boundary", "the first signal")
  proc.send_signal(signal.SIGTERM)
  code = _exit_code_within(proc, GENEROUS_S, tmp_path)
  err = (tmp_path / "stderr.txt").read_text()
  assert code == 143, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  assert err.count("train.py: SIGTERM again: stopped at once, without a checkpoint") == 1, err[-3000:]


@pytest.mark.parametrize("where", ["init_train_state", "rewards_start"])
def test_a_signal_before_compiling_or_the_step_0_evaluation_starts_neither(tmp_path, monkeypatch, where):
  """A signal during set-up (as if during the warm start's last step or the parameter init): the train step is not
  compiled; one during the compilation: the step-0 evaluation does not run."""
  from scalerl_jax.run import build as build_lib
  job = tiny_job(tmp_path, "pipeline.steps=3", "pipeline.eval_every=2")
  signal_now = lambda: job.interrupts.receive(signal.SIGTERM)  # noqa: E731
  compiled, evaluated = [], []
  if where == "init_train_state":
    init = build_lib.init_train_state
    monkeypatch.setattr(build_lib, "init_train_state", lambda *a, **k: (init(*a, **k), signal_now())[0])
    monkeypatch.setattr(job.trainer, "step_for", lambda groups: compiled.append(groups))
  else:
    start = job.rewards.start
    monkeypatch.setattr(job.rewards, "start", lambda: (start(), signal_now()))
  evaluate = job.evaluator.evaluate
  monkeypatch.setattr(job.evaluator, "evaluate", lambda *a: (evaluated.append(a), evaluate(*a))[1])
  summary = job.run_sync()
  expected = "before compiling the train step" if where == "init_train_state" else "before the step-0 evaluation"
  assert summary["stopped"] == (f"stopped by SIGTERM after 0 steps, {expected}; the same command starts the run "
                                "again")
  assert job.exit_code == 143 and not compiled and not evaluated
  assert not read_metrics(tmp_path, missing_ok=True)


def test_a_signal_during_an_evaluation_stops_it_and_the_resume_evaluates_that_step(tmp_path, monkeypatch):
  """SIGTERM at the first decode step of the last step's evaluation: the evaluation stops at its next decode step,
  step 2's metrics are written without it and the checkpoint holds step 2; the resumed run evaluates step 2 first
  (else a study would never see the run finished)."""
  from scalerl_jax.run.job import RLJob
  from scalerl_jax.rollout.driver import RolloutDriver
  cfg = tiny_config(tmp_path, "pipeline.steps=2", "pipeline.eval_every=2", "checkpoint.every_steps=100")
  job = RLJob(cfg, progress=False)
  step, eval_steps_after = RolloutDriver.step, []

  def step_then_signal(driver, params, version):
    if driver is not job.driver and version == 2:  # an evaluation's decode step (training uses job.driver)
      if job.interrupts.is_set():
        eval_steps_after.append(version)
      else:
        job.interrupts.receive(signal.SIGTERM)
    return step(driver, params, version)

  monkeypatch.setattr(RolloutDriver, "step", step_then_signal)
  summary = job.run_sync()
  assert summary["stopped"] == ("stopped by SIGTERM after 2 steps, during the evaluation at step 2; the same command "
                                "resumes from the checkpoint of step 2")
  assert job.exit_code == 143 and eval_steps_after == []  # not one decode step after the signal
  rows = read_metrics(tmp_path)
  assert [r["step"] for r in rows] == [0, 1, 2] and "eval/pass_rate" in rows[0]
  assert "eval/pass_rate" not in rows[2] and "train/grad_norm" in rows[2]
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
  monkeypatch.undo()
  resumed = RLJob(cfg, progress=False)
  assert resumed.run_sync()["steps"] == 2 and resumed.exit_code == 0
  rows = read_metrics(tmp_path)
  assert [r["step"] for r in rows] == [0, 1, 2, 2] and "eval/pass_rate" in rows[3]


_STUCK_IN_A_LONG_CALL = """
import signal, sys, time
from scalerl_jax.pipeline import interrupts
interrupts.ABORT_GRACE_S = 1.0
with interrupts.Interrupts().installed():
  for s in interrupts.SIGNALS:  # as inside an XLA compilation: the run's own handlers never get to act
    signal.signal(s, lambda *_: None)  # (a Python handler still: the signals still reach the wake-up pipe)
  print("ready", flush=True)
  time.sleep(300)
print("the handlers ran only now", flush=True)
"""


def test_a_second_signal_ends_a_main_thread_stuck_in_a_long_call(tmp_path):
  """Python runs signal handlers on the main thread between bytecodes only, so a main thread inside a long C call
  never acts on them; the watcher thread sees the signals at once and ends the process itself (1 s of grace here).
  SIGTERM then SIGINT: two different signals never merge into one pending signal, whatever the timing."""
  import sys
  proc = subprocess.Popen([sys.executable, "-c", _STUCK_IN_A_LONG_CALL], cwd=ROOT, env=_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert proc.stdout.readline().strip() == "ready"
  proc.send_signal(signal.SIGTERM)
  proc.send_signal(signal.SIGINT)
  try:
    out, err = proc.communicate(timeout=GENEROUS_S)  # far below the 300 s the main thread sleeps
  except subprocess.TimeoutExpired:
    proc.kill()
    pytest.fail("the process outlived the second signal")
  assert proc.returncode == 130 and "handlers ran" not in out, (out, err)
  assert err.strip().splitlines()[-1] == ("-c: SIGINT again: stopped at once, without a checkpoint (the same command "
                                          "resumes from the latest one, if any)"), err
