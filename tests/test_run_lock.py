"""One run per run directory: a second process on a locked run_dir is refused at once, naming the holder's pid,
host and start time; the lock of a SIGKILLed holder (even one whose forked child lives on) is free at once.

Every holder here signals "locked" on stdout and then waits on stdin, so the test never races it."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from scalerl_jax.errors import UserError
from scalerl_jax.train.run_lock import INFO_NAME, RunDirBusyError, RunLock

ROOT = pathlib.Path(__file__).resolve().parent.parent

_HOLDER = """
import os, sys
from scalerl_jax.train.run_lock import RunLock
lock = RunLock(sys.argv[1]).acquire()
if sys.argv[2] == "fork":
  ready_r, ready_w = os.pipe()
  child = os.fork()
  if child == 0:  # a worker process that outlives its parent (it waits until the test closes stdin)
    os.write(ready_w, b"x")  # fork has returned here: the at-fork handlers have run
    sys.stdin.read()
    os._exit(0)
  os.read(ready_r, 1)
  print("child", child, flush=True)
print("locked", os.getpid(), flush=True)
sys.stdin.read()
lock.release()
"""

_TRY = """
import sys
from scalerl_jax.train.run_lock import RunLock
try:
  RunLock(sys.argv[1]).acquire()
except Exception as exc:
  print(type(exc).__name__, exc)
else:
  print("acquired")
"""


def _python(code, *args, **kwargs):
  return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, **kwargs)


def _start_holder(run_dir, mode="plain"):
  proc = _python(_HOLDER, run_dir, mode, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  child = None
  line = proc.stdout.readline().split()
  if line[:1] == ["child"]:
    child, line = int(line[1]), proc.stdout.readline().split()
  assert line[:1] == ["locked"], line
  return proc, int(line[1]), child


def _try_in_another_process(run_dir):
  proc = _python(_TRY, run_dir, stdout=subprocess.PIPE)
  out, _ = proc.communicate(timeout=120)
  return out.strip()


def test_a_second_process_is_refused_naming_the_holder(tmp_path):
  run_dir = tmp_path / "run"
  with RunLock(run_dir) as lock:
    assert lock.held
    info = json.loads((run_dir / INFO_NAME).read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    out = _try_in_another_process(run_dir)
  assert out.startswith("RunDirBusyError") and str(run_dir) in out, out
  assert f"pid {os.getpid()} on {socket.gethostname()}, started {info['started']}" in out
  assert not (run_dir / INFO_NAME).exists() and not lock.held
  assert _try_in_another_process(run_dir) == "acquired"  # released on leaving the block


def test_this_process_is_refused_while_another_holds_it(tmp_path):
  proc, pid, _ = _start_holder(tmp_path)
  try:
    with pytest.raises(RunDirBusyError, match=rf"run_dir {tmp_path} is in use by another run \(pid {pid} on "):
      RunLock(tmp_path).acquire()
    assert issubclass(RunDirBusyError, UserError)
  finally:
    proc.communicate("", timeout=120)
  assert proc.returncode == 0
  RunLock(tmp_path).acquire().release()  # the holder released it on exit


@pytest.mark.parametrize("mode", ["plain", "fork"])
def test_the_lock_of_a_sigkilled_holder_is_free_at_once(tmp_path, mode):
  proc, pid, child = _start_holder(tmp_path, mode)
  os.kill(pid, signal.SIGKILL)
  proc.wait(timeout=120)
  try:
    assert proc.returncode == -signal.SIGKILL
    lock = RunLock(tmp_path).acquire()  # no waiting: a dead process holds no lock (nor does its forked child)
    assert json.loads((tmp_path / INFO_NAME).read_text())["pid"] == os.getpid()  # the stale info replaced
    lock.release()
  finally:
    proc.stdin.close()  # the forked child (if any) reads EOF and exits
    if child is not None:
      try:
        os.kill(child, signal.SIGKILL)
      except ProcessLookupError:
        pass


def test_a_second_lock_in_the_same_process_is_refused_and_release_is_idempotent(tmp_path):
  first = RunLock(tmp_path).acquire()
  assert first.acquire() is first  # acquiring what it holds is a no-op
  with pytest.raises(RunDirBusyError, match=f"pid {os.getpid()}"):
    RunLock(tmp_path).acquire()
  first.release()
  first.release()
  with RunLock(tmp_path):
    pass


def test_unknown_holder_and_a_run_dir_that_is_a_file(tmp_path):
  holder = RunLock(tmp_path).acquire()
  (tmp_path / INFO_NAME).unlink()  # e.g. killed between taking the lock and writing its details
  with pytest.raises(RunDirBusyError, match="holder unknown"):
    RunLock(tmp_path).acquire()
  holder.release()
  (tmp_path / "file").write_text("")
  with pytest.raises(UserError, match="is a file, not a directory"):
    RunLock(tmp_path / "file").acquire()
