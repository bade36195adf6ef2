"""Sandbox: one untrusted Python program run inside bubblewrap, with resource limits and a wall-clock bound.

The model's programs are untrusted: running them is the most dangerous thing the trainer does. Every run is

    prlimit <limits> -- bwrap <namespaces, mounts> -- <sandbox.python> -I -B /sandbox/main.py

started by `Sandbox.run`, never anything less: when bubblewrap is missing or cannot build its namespaces the run
raises SandboxUnavailable (`check_available()` says how to fix it); there is no unsandboxed fallback.

What the program sees (bubblewrap, Debian package `bubblewrap`):
  - its own user, mount, PID, IPC, UTS, cgroup and network namespaces (`--unshare-all --unshare-user`): no network
    interface but a loopback of its own (nothing listens there; the host's 127.0.0.1 is another namespace), no
    other process (it is PID 2 under bubblewrap's reaper), no further user namespaces (`--disable-userns`);
  - a read-only root that holds only /usr (the interpreter and its libraries; bound read-only), the host's
    /bin /lib /lib64 /sbin as the same symlinks or read-only binds, the interpreter's prefix when it lives outside
    /usr, a fresh /proc of its PID namespace, a minimal read-only /dev (null, zero, random, urandom, tty), its
    program at /sandbox/main.py, and a private writable /tmp (tmpfs of `tmp_mb`, its working directory). No /etc,
    no repository, run directory or home: those paths do not exist inside;
  - an empty environment but PATH=/usr/bin:/bin, HOME=/tmp, LANG=C.UTF-8; `-I` ignores PYTHON* variables and the
    user site; `--new-session` (no terminal to inject keystrokes into); `--die-with-parent` (bubblewrap and the
    program get SIGKILL when the process that called run() dies, e.g. a reward worker killed by its pool).
Resource limits (util-linux `prlimit`, set on itself before it execs bwrap, so the whole tree inherits them):
  cpu_s       RLIMIT_CPU, rounded up to whole seconds: SIGXCPU at the soft limit, SIGKILL one second later
  memory_mb   RLIMIT_AS (address space), per process
  max_procs   RLIMIT_NPROC: processes and threads of the sandbox's user, bubblewrap's two processes included.
              The kernel counts them per real uid and does not enforce the limit for root, so a root trainer runs
              each sandbox as a uid of its own, UID_BASE + the calling process's pid (a uid no account has; two
              workers never share a budget, and runs of one worker follow each other). A non-root trainer cannot
              change uid: the limit is then the user's current process count plus max_procs (read from /proc
              before each run), a budget shared with everything else that user starts meanwhile
  file_kb     RLIMIT_FSIZE: the largest file it may write, stdout and stderr included (they are files opened by
              this process and handed to it, never pipes)
  open_files  RLIMIT_NOFILE; core dumps are off (RLIMIT_CORE 0)
  wall_s      enforced from outside: past it, bubblewrap's reaper (PID 1 of the sandbox) is sent SIGKILL, which
              makes the kernel kill every process of the PID namespace. Nothing of the program outlives run():
              bubblewrap returns as soon as the program's main process exits, and its reaper (SIGKILLed by
              --die-with-parent then, with whatever the program left running) would be orphaned to the machine's
              init, which may never reap it (a zombie still counts against RLIMIT_NPROC); so run() makes this
              process a child subreaper while it runs and reaps the reaper itself, after its namespace is gone
  output_kb   bytes of stdout and of stderr read back (the files themselves are capped at file_kb)

Causes (`RunResult.cause`, CAUSES), one per run, first match wins:
  timeout_wall  still running after wall_s (killed)
  cpu_limit     killed by SIGXCPU, or by SIGKILL after using its CPU seconds
  output_limit  stdout or stderr reached file_kb (CPython ignores SIGXFSZ, so a write fails with EFBIG), or stdout
                is longer than output_kb (it could not be compared whole)
  memory        exited with a MemoryError (RLIMIT_AS)
  procs         exited because it could not start a process or thread (RLIMIT_NPROC: EAGAIN)
  killed        died of another signal (a crash, its own kill, the kernel's OOM killer)
  nonzero_exit  any other non-zero exit status
  ok            exit status 0 within every limit
The two heuristic ones (memory, procs) read the last line of stderr (the interpreter's final traceback line), and
the exit status is the program's own: a program can pretend to any cause by printing or exiting accordingly. That
changes only which counter grows, never the verdict (every cause but ok is a failed run).
A run where bubblewrap itself failed (it reported no exit status of the program) raises SandboxUnavailable with
bubblewrap's message: that is the machine's problem, not the program's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Optional

from scalerl_jax.errors import UserError

CAUSES = ("ok", "nonzero_exit", "timeout_wall", "cpu_limit", "memory", "procs", "output_limit", "killed")
UID_BASE = 2_000_000_000  # + pid (pid_max <= 2**22); bubblewrap's uid map refuses uids of 2**31 and above
KILL_WAIT_S = 10.0  # after SIGKILL to the sandbox: how long bubblewrap gets to reap it before it is killed itself
SANDBOX_PATH = "/usr/bin:/bin"
_HOST_DIRS = ("/bin", "/lib", "/lib64", "/sbin")  # symlinks into /usr on merged-/usr systems
_FIX = ("Code rewards never run programs unsandboxed. Install bubblewrap (`apt-get install bubblewrap`; "
        "`dnf install bubblewrap` on Fedora) and allow unprivileged user namespaces: "
        "`sysctl -w kernel.unprivileged_userns_clone=1` (Debian/Ubuntu kernels), `sysctl -w "
        "user.max_user_namespaces=15000`, on Ubuntu 23.10+ `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
        "; in a container, a seccomp profile that allows unshare/clone of user namespaces (docker run "
        "--security-opt seccomp=unconfined).")


class SandboxUnavailable(UserError):
  """bubblewrap (or prlimit, or the sandbox's interpreter) is missing or cannot build a sandbox on this machine."""


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One sandboxed run: what it printed (at most output_kb each, decoded as UTF-8 with replacement), the program's
  exit status (128 + n: died of signal n; None: killed for its wall time), why it ended (CAUSES) and its wall
  seconds."""
  stdout: str
  stderr: str
  exit_code: Optional[int]
  cause: str
  seconds: float

  @property
  def ok(self) -> bool:
    return self.cause == "ok"


def _user_tasks(uid: int) -> int:
  """Processes and threads whose owner is `uid`, from /proc (what RLIMIT_NPROC counts, give or take a race)."""
  count = 0
  for entry in os.scandir("/proc"):
    if entry.name.isdigit():
      try:
        if entry.stat().st_uid == uid:
          count += len(os.listdir(f"/proc/{entry.name}/task"))
      except OSError:  # exited meanwhile
        pass
  return count


def _clamp(value: int, limit: int) -> int:
  """`value`, but never above the current hard limit (an unprivileged process cannot raise it)."""
  hard = resource.getrlimit(limit)[1]
  return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
  """Waits up to `timeout` s for `proc` to exit (without reaping it); whether it did. A pidfd wakes up the moment
  it exits; Popen's own wait polls."""
  try:
    fd = os.pidfd_open(proc.pid)
  except (AttributeError, OSError):
    try:
      proc.wait(timeout)
      return True
    except subprocess.TimeoutExpired:
      return False
  try:
    return _pidfd_wait(fd, timeout)
  finally:
    os.close(fd)


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_reaper_lock = threading.Lock()
_reaper_users = 0
_reaper_was = 0


class _Subreaper:
  """While at least one run is in flight, this process is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so
  bubblewrap's reaper, orphaned when bubblewrap exits, becomes this process's child and is reaped by run() instead
  of lingering as a zombie of the machine's init (a zombie still counts against RLIMIT_NPROC). The previous
  setting comes back when the last run ends."""

  def __enter__(self):
    global _reaper_users, _reaper_was
    import ctypes

    with _reaper_lock:
      if _reaper_users == 0:
        was = ctypes.c_int(0)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
        _reaper_was = was.value
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
          raise SandboxUnavailable(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")
      _reaper_users += 1
    return self

  def __exit__(self, *exc):
    global _reaper_users
    import ctypes

    with _reaper_lock:
      _reaper_users -= 1
      if _reaper_users == 0 and not _reaper_was:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _parent_of(pid: int) -> int:
  with open(f"/proc/{pid}/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[1])


def _pidfd_wait(fd: int, timeout: float) -> bool:
  poller = select.poll()
  poller.register(fd, select.POLLIN)
  return bool(poller.poll(max(0, int(math.ceil(timeout * 1000)))))


def _reap(child: object) -> Optional[resource.struct_rusage]:
  """Waits for bubblewrap's reaper `child` when it has become this process's child (it exits, taking its PID
  namespace down, once SIGKILLed by --die-with-parent after bubblewrap returned) and reaps it; its resource usage
  (which includes the program's: the reaper waited for it), or None when it was not ours to reap."""
  if not isinstance(child, int) or child <= 0:
    return None
  try:
    fd = os.pidfd_open(child)
  except OSError:  # already gone
    return None
  try:
    try:
      if _parent_of(child) != os.getpid():
        return None
    except (OSError, ValueError, IndexError):
      return None
    if not _pidfd_wait(fd, KILL_WAIT_S):
      signal.pidfd_send_signal(fd, signal.SIGKILL)
    try:
      return os.wait4(child, 0)[2]
    except ChildProcessError:
      return None
  finally:
    os.close(fd)


def _status(f) -> dict:
  """bubblewrap's --json-status-fd output: concatenated JSON objects ({"child-pid": ...}, {"exit-code": ...})."""
  f.seek(0)
  text, out, decoder, i = f.read().decode("utf-8", "replace"), {}, json.JSONDecoder(), 0
  while True:
    while i < len(text) and text[i].isspace():
      i += 1
    if i >= len(text):
      return out
    try:
      item, i = decoder.raw_decode(text, i)
    except ValueError:
      return out
    if isinstance(item, dict):
      out.update(item)


def _read(f, cap: int) -> tuple[str, bool]:
  """The first `cap` bytes of a file as text, and whether there was more."""
  f.seek(0)
  data = f.read(cap + 1)
  return data[:cap].decode("utf-8", "replace"), len(data) > cap


class Sandbox:
  """Runs programs as described in the module docstring, with the limits of a SandboxConfig (config group
  `sandbox`). Cheap to build (it checks nothing); `check_available()` proves a sandbox works here."""

  def __init__(self, cfg):
    self.cfg = cfg

  # --- the command --------------------------------------------------------------------------------------------
  def _tools(self) -> tuple[str, str, str]:
    """(bwrap, prlimit, the interpreter's real path), or SandboxUnavailable naming what is missing."""
    bwrap = shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
    if not bwrap:
      raise SandboxUnavailable(f"bubblewrap is not installed (no `bwrap` on PATH). {_FIX}")
    prlimit = shutil.which("prlimit") or shutil.which("prlimit", path="/usr/bin:/bin")
    if not prlimit:
      raise SandboxUnavailable("`prlimit` (util-linux) is not installed: `apt-get install util-linux`. Code rewards "
                               "never run programs without their resource limits.")
    python = os.path.realpath(self.cfg.python)
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
      raise SandboxUnavailable(f"sandbox.python: {self.cfg.python!r} is not an executable file")
    return bwrap, prlimit, python

  def _mounts(self, python: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _HOST_DIRS:
      if os.path.islink(path):
        args += ["--symlink", os.readlink(path), path]
      elif os.path.isdir(path):
        args += ["--ro-bind", path, path]
    prefix = os.path.dirname(os.path.dirname(python))  # <prefix>/bin/pythonX.Y
    if not any(prefix == d or prefix.startswith(d + "/") for d in ("/usr", *_HOST_DIRS)):
      args += ["--ro-bind", prefix, prefix]
    return args

  def _limits(self, uid: Optional[int]) -> list[str]:
    cfg = self.cfg
    cpu = max(1, math.ceil(cfg.cpu_s))
    procs = cfg.max_procs if uid is not None else _user_tasks(os.getuid()) + cfg.max_procs
    return [f"--cpu={cpu}:{cpu + 1}",
            f"--as={_clamp(cfg.memory_mb * 2**20, resource.RLIMIT_AS)}",
            f"--nproc={_clamp(procs, resource.RLIMIT_NPROC)}",
            f"--fsize={_clamp(cfg.file_kb * 1024, resource.RLIMIT_FSIZE)}",
            f"--nofile={_clamp(cfg.open_files, resource.RLIMIT_NOFILE)}",
            "--core=0"]

  def command(self, program_fd: int, status_fd: int, uid: Optional[int] = None) -> list[str]:
    """The argv of one run: the program is read from `program_fd`, bubblewrap reports to `status_fd`; `uid`: the
    uid it runs as when the caller is root (None: the caller's)."""
    bwrap, prlimit, python = self._tools()
    return [prlimit, *self._limits(uid), "--",
            bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", *self._mounts(python),
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(self.cfg.tmp_mb * 2**20), "--tmpfs", "/tmp",
            "--ro-bind-data", str(program_fd), "/sandbox/main.py",
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", "/tmp", "--clearenv", "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--json-status-fd", str(status_fd),
            "--", python, "-I", "-B", "/sandbox/main.py"]

  # --- one run ------------------------------------------------------------------------------------------------
  def run(self, program: str, stdin: str = "") -> RunResult:
    """Runs `program` (Python source) with `stdin` in a fresh sandbox; see the module docstring."""
    cfg = self.cfg
    uid = UID_BASE + os.getpid() if os.geteuid() == 0 else None
    user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    with tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, \
        tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as status:
      source.write(program.encode("utf-8", "surrogateescape"))
      source.seek(0)
      inp.write(stdin.encode("utf-8", "surrogateescape"))
      inp.seek(0)
      argv = self.command(source.fileno(), status.fileno(), uid)
      t0 = time.monotonic()
      with _Subreaper():
        proc = subprocess.Popen(argv, stdin=inp, stdout=out, stderr=err,
                                pass_fds=(source.fileno(), status.fileno()), env={"PATH": SANDBOX_PATH}, **user)
        timed_out = not _wait(proc, cfg.wall_s)
        if timed_out:
          self._kill(proc, status)
        _, wait_status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        reported = _status(status)
        reaper_usage = _reap(reported.get("child-pid"))
      seconds = time.monotonic() - t0
      stdout, more_out = _read(out, cfg.output_kb * 1024)
      stderr, _ = _read(err, cfg.output_kb * 1024)
      full = max(os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size) >= cfg.file_kb * 1024
    if timed_out:
      return RunResult(stdout, stderr, None, "timeout_wall", seconds)
    if "exit-code" not in reported:
      raise SandboxUnavailable(f"bubblewrap could not start the sandbox (exit status {proc.returncode}): "
                               f"{stderr.strip()[-500:] or 'no message'}. {_FIX}")
    code = int(reported["exit-code"])
    cpu_used = sum(u.ru_utime + u.ru_stime for u in (usage, reaper_usage) if u is not None)
    return RunResult(stdout, stderr, code, self._cause(code, stderr, more_out or full, cpu_used), seconds)

  def _cause(self, code: int, stderr: str, over_output: bool, cpu_used: float) -> str:
    if code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL) and (code != 128 + signal.SIGKILL
                                                                  or cpu_used >= max(1, math.ceil(self.cfg.cpu_s))):
      return "cpu_limit"
    if over_output or code == 128 + signal.SIGXFSZ:
      return "output_limit"
    if code == 0:
      return "ok"
    if code > 128:
      return "killed"
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    if last.startswith("MemoryError"):
      return "memory"
    if last.startswith("BlockingIOError") or "can't start new thread" in last:
      return "procs"
    return "nonzero_exit"

  def _kill(self, proc: subprocess.Popen, status) -> None:
    """SIGKILL to the sandbox's PID 1 (bubblewrap's reaper, which takes its PID namespace down with it), then
    waits for bubblewrap, which exits once it has reaped it. The reaper is addressed through a pidfd checked to
    be bubblewrap's child, so a pid reused meanwhile is never signalled. When the reaper is unknown (bubblewrap was
    still setting up), bubblewrap itself is killed (its reaper follows by --die-with-parent)."""
    child = _status(status).get("child-pid")
    if isinstance(child, int):
      try:
        fd = os.pidfd_open(child)
      except (AttributeError, OSError):
        fd = None
      if fd is not None:
        try:
          if _parent_of(child) == proc.pid:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
          pass
        finally:
          os.close(fd)
      if _wait(proc, KILL_WAIT_S):
        return
    proc.kill()

  def check_available(self) -> None:
    """Runs a trivial program in a sandbox; SandboxUnavailable saying how to fix it unless that works."""
    result = self.run("print(6 * 7)")
    if result.cause != "ok" or result.stdout.strip() != "42":
      uid_note = (f" (as root the sandbox runs as uid {UID_BASE}+pid: sandbox.python {self.cfg.python!r} and its "
                  "libraries must be readable by any user)" if os.geteuid() == 0 else "")
      raise SandboxUnavailable(f"a trivial program failed in the sandbox (cause {result.cause}, exit status "
                               f"{result.exit_code}): {result.stderr.strip()[-500:] or 'no message'}{uid_note}. "
                               f"{_FIX}")
