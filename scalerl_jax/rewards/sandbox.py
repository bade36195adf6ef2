"""Sandbox: one untrusted Python program run inside bubblewrap, with resource limits and a wall-clock bound.

The model's programs are untrusted: running them is the most dangerous thing the trainer does. Every run is

    prlimit <limits> -- bwrap <namespaces, mounts, --seccomp> -- <sandbox.python> -I -B /sandbox/main.py

started by `Sandbox.run`, never anything less: when bubblewrap, prlimit or libseccomp is missing, or bubblewrap
cannot build its namespaces, the run raises SandboxUnavailable (`check_available()` says how to fix it); there is
no unsandboxed fallback.

What the program sees (bubblewrap, Debian package `bubblewrap`):
  - its own user, mount, PID, IPC, UTS, cgroup and network namespaces (`--unshare-all --unshare-user`): no network
    interface but a loopback of its own (nothing listens there; the host's 127.0.0.1 is another namespace), no
    other process (it is PID 2 under bubblewrap's reaper), no further user namespaces (`--disable-userns`);
  - a read-only root that holds only /usr (the interpreter and its libraries; bound read-only), the host's
    /bin /lib /lib64 /sbin as the same symlinks or read-only binds, the interpreter's prefix when it lives outside
    /usr, a fresh /proc of its PID namespace, a minimal read-only /dev (null, zero, random, urandom, tty), its
    program at /sandbox/main.py, and a private writable /tmp (its working directory: tmp_mb bytes and, for a root
    trainer, tmp_files inodes, tmpfs.py). No /etc, no repository, run directory or home: those paths do not exist;
  - stdin a sealed memory-backed file (readable, not writable or growable), stdout and stderr pipes read by this
    process: no descriptor of the run is a file on the host's disk, so fallocate cannot reserve host disk;
  - a system-call filter (seccomp.py: keyrings, ptrace, bpf, perf_event_open, userfaultfd, io_uring, mounts,
    modules, kexec, ... fail with EPERM);
  - an empty environment but PATH=/usr/bin:/bin, HOME=/tmp, LANG=C.UTF-8; `-I` ignores PYTHON* variables and the
    user site; `--new-session` (no terminal to inject keystrokes into); `--die-with-parent` (bubblewrap and the
    program get SIGKILL when the process that called run() dies, e.g. a reward worker killed by its pool).
Resource limits (util-linux `prlimit`, set on itself before it execs bwrap, so the whole tree inherits them):
  cpu_s       RLIMIT_CPU, rounded up to whole seconds: SIGXCPU at the soft limit, SIGKILL one second later
  memory_mb   RLIMIT_AS (address space), per process; and one bound for the whole run (memory.py): a memory
              cgroup of memory_mb + tmp_mb per run where there is one (a delegated cgroup v2, or sandbox.memory_cgroup),
              else no process but the first (threads only, seccomp.py), so RLIMIT_AS bounds it all. The sandbox's
              processes enter the cgroup before the program starts (bubblewrap's child waits on --block-fd until
              this process has moved it) and get oom_score_adj 1000: the OOM killer takes them first
  max_procs   RLIMIT_NPROC: processes and threads of the sandbox's user, bubblewrap's two processes included.
              The kernel counts them per real uid and does not enforce the limit for root, so a root trainer runs
              each sandbox as a uid of its own, UID_BASE + the calling process's pid (a uid no account has; two
              workers never share a budget, and runs of one worker follow each other). A non-root trainer cannot
              change uid: the limit is then the user's current process count plus max_procs (read from /proc
              before each run), a budget shared with everything else that user starts meanwhile
  file_kb     RLIMIT_FSIZE: the largest file it may write in /tmp; the program itself must fit (a longer one is
              cause program_too_large, without a run: bubblewrap writes it under this limit); stdout and stderr
              are cut here too, by the reader, which kills the run once either passes file_kb
  open_files  RLIMIT_NOFILE; core dumps are off (RLIMIT_CORE 0)
  wall_s      enforced from outside: past it, bubblewrap's reaper (PID 1 of the sandbox) is sent SIGKILL, which
              makes the kernel kill every process of the PID namespace. Nothing of the program outlives run():
              bubblewrap returns as soon as the program's main process exits, and its reaper (SIGKILLed by
              --die-with-parent then, with whatever the program left running) would be orphaned to the machine's
              init, which may never reap it (a zombie still counts against RLIMIT_NPROC); so run() makes this
              process a child subreaper while it runs and reaps the reaper itself, after its namespace is gone
  output_kb   bytes of stdout read back (the first) and of stderr (the last: the final traceback)

Causes (`RunResult.cause`, CAUSES), one per run, first match wins:
  program_too_large  the program is over file_kb (not run)
  timeout_wall  still running after wall_s (killed)
  memory        the run's memory cgroup had to OOM-kill, or it exited with a MemoryError (RLIMIT_AS)
  cpu_limit     killed by SIGXCPU, or by SIGKILL after using its CPU seconds
  output_limit  stdout or stderr passed file_kb (killed), or stdout is longer than output_kb (it could not be
                compared whole)
  procs         exited because it could not start a process or thread (RLIMIT_NPROC, or no new process without a
                cgroup: EAGAIN)
  killed        died of another signal (a crash, its own kill)
  nonzero_exit  any other non-zero exit status
  ok            exit status 0 within every limit
The two heuristic ones (memory by MemoryError, procs) read the last line of stderr (the interpreter's final
traceback line), and the exit status is the program's own: a program can pretend to any cause by printing or
exiting accordingly. That changes only which counter grows, never the verdict (every cause but ok is a failure).
A run where bubblewrap itself failed (it reported no exit status of the program) raises SandboxUnavailable with
bubblewrap's message: that is the machine's problem, not the program's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import time
from typing import Optional, Sequence

from scalerl_jax.errors import UserError
from scalerl_jax.rewards import reaping, seccomp, tmpfs
from scalerl_jax.rewards.memory import CgroupError, MemoryBound

CAUSES = ("ok", "nonzero_exit", "timeout_wall", "cpu_limit", "memory", "procs", "output_limit", "killed",
          "program_too_large")
UID_BASE = 2_000_000_000  # + pid (pid_max <= 2**22); bubblewrap's uid map refuses uids of 2**31 and above
SANDBOX_PATH = "/usr/bin:/bin"
_HOST_DIRS = ("/bin", "/lib", "/lib64", "/sbin")  # symlinks into /usr on merged-/usr systems
_FIX = ("Code rewards never run programs unsandboxed. Install bubblewrap (`apt-get install bubblewrap`; "
        "`dnf install bubblewrap` on Fedora) and allow unprivileged user namespaces: "
        "`sysctl -w kernel.unprivileged_userns_clone=1` (Debian/Ubuntu kernels), `sysctl -w "
        "user.max_user_namespaces=15000`, on Ubuntu 23.10+ `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
        "; in a container, a seccomp profile that allows unshare/clone of user namespaces (docker run "
        "--security-opt seccomp=unconfined).")


_bounds: dict = {}  # sandbox.memory_cgroup -> MemoryBound, detected once per process
_warned: set = set()


def _warn_once(message: str) -> None:
  if message not in _warned:
    _warned.add(message)
    logging.getLogger(__name__).warning(message)


class SandboxUnavailable(UserError):
  """bubblewrap (or prlimit, or the sandbox's interpreter) is missing or cannot build a sandbox on this machine."""


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One sandboxed run: what it printed (at most output_kb each, decoded as UTF-8 with replacement), the program's
  exit status (128 + n: died of signal n; None: killed for its wall time or never started), why it ended
  (CAUSES), its wall seconds and what its main process wrote to the side channel (run(side=...); else None).
  stderr is its last output_kb bytes (the final traceback), stdout its first."""
  stdout: str
  stderr: str
  exit_code: Optional[int]
  cause: str
  seconds: float
  side: Optional[str] = None

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


def _status(data: bytes) -> dict:
  """bubblewrap's --json-status-fd output: concatenated JSON objects ({"child-pid": ...}, {"exit-code": ...})."""
  text, out, decoder, i = data.decode("utf-8", "replace"), {}, json.JSONDecoder(), 0
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


def _sealed(data: bytes, name: str) -> int:
  """A memory-backed file holding `data`, sealed (no write, grow, shrink, no new seals): a program that gets it
  can read it but neither change it nor reserve memory or disk through it (fallocate fails with EPERM)."""
  fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]
  fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


class _Stream:
  """What the caller keeps of one output pipe: the first `head` bytes, the last `tail` bytes and the total count."""

  def __init__(self, head: int, tail: int = 0):
    self.head, self.tail, self.total = bytearray(), bytearray(), 0
    self._head, self._tail = head, tail

  def add(self, data: bytes) -> None:
    self.total += len(data)
    room = self._head - len(self.head)
    if room > 0:
      self.head += data[:room]
    if self._tail:
      self.tail = (self.tail + data)[-self._tail:]

  def text(self, tail: bool = False) -> str:
    data = bytes(self.tail if tail and self.total > self._head else self.head)
    return data.decode("utf-8", "replace")


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

  def memory_bound(self) -> MemoryBound:
    """How this process bounds a run's memory (memory.py), detected once per process and setting."""
    key = self.cfg.memory_cgroup
    if key not in _bounds:
      try:
        _bounds[key] = MemoryBound.detect(key)
      except CgroupError as exc:
        raise SandboxUnavailable(str(exc)) from None
    return _bounds[key]

  def command(self, fds: dict, uid: Optional[int] = None, argv: Sequence[str] = (), tmp: Optional[str] = None
              ) -> list[str]:
    """The argv of one run. `fds`: "program" (read by bubblewrap into /sandbox/main.py), "status" (bubblewrap's
    JSON reports), "block" (bubblewrap's child waits for a byte on it before it starts the program), "seccomp" (the
    filter); `uid`: the uid it runs as when the caller is root (None: the caller's); `argv`: the program's
    arguments; `tmp`: a host directory to bind at /tmp (tmpfs.py), else bubblewrap's own tmpfs of tmp_mb."""
    bwrap, prlimit, python = self._tools()
    return [prlimit, *self._limits(uid), "--",
            bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", *self._mounts(python),
            "--proc", "/proc", "--dev", "/dev",
            *(["--bind", tmp, "/tmp"] if tmp else ["--size", str(self.cfg.tmp_mb * 2**20), "--tmpfs", "/tmp"]),
            "--ro-bind-data", str(fds["program"]), "/sandbox/main.py",
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", "/tmp", "--clearenv", "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--json-status-fd", str(fds["status"]), "--block-fd", str(fds["block"]),
            "--seccomp", str(fds["seccomp"]),
            "--", python, "-I", "-B", "/sandbox/main.py", *argv]

  # --- one run ------------------------------------------------------------------------------------------------
  def run(self, program: str, stdin: str = "", side: Optional[bytes] = None) -> RunResult:
    """Runs `program` (Python source) with `stdin` in a fresh sandbox; see the module docstring. `side` makes
    `program` a trusted harness (assert_harness.py): bytes for its main process only, on a descriptor whose
    number is its first argument; its second argument is a descriptor whose writes come back as RunResult.side
    (at most output_kb); its third, "-" or a descriptor holding the seccomp filter that refuses new processes,
    which the harness must apply to the process that runs untrusted code (without a memory cgroup, bubblewrap
    then applies the filter without that rule, so that the harness can fork). None of them is reachable from
    other processes of the sandbox: its PID 1 closes them, and a process that makes itself non-dumpable keeps
    them from /proc."""
    cfg = self.cfg
    source = program.encode("utf-8", "surrogateescape")
    if len(source) > cfg.file_kb * 1024:  # bubblewrap writes it under RLIMIT_FSIZE: it would fail to start
      return RunResult("", f"the program is {len(source)} bytes, over sandbox.file_kb ({cfg.file_kb} KiB)", None,
                       "program_too_large", 0.0)
    bound = self.memory_bound()
    # a harness run (side channel) starts as trusted code that forks the program's process: without a cgroup, that
    # process applies the filter that refuses new processes to itself (argv[3]); bubblewrap applies the rest
    strict = not bound.cgroup
    bpf = self._filter(strict and side is None)
    uid = UID_BASE + os.getpid() if os.geteuid() == 0 else None
    user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    mine, theirs = [], []  # descriptors to close: this process's ends, and the child's (once it has them)
    cgroup = None
    with contextlib.ExitStack() as stack:
      tmp = stack.enter_context(tmpfs.private_tmp(cfg.tmp_mb * 2**20, cfg.tmp_files))
      if tmp is None:
        _warn_once("sandbox: cannot mount a tmpfs with an inode cap (needs root): the sandbox's /tmp caps bytes "
                   "only; its files are bounded by the run's memory cgroup where there is one")
      stack.callback(self._close, mine, theirs, lambda: cgroup)
      fds = {"program": _sealed(source, "program"), "seccomp": _sealed(bpf, "seccomp")}
      theirs += fds.values()
      stdin_fd = _sealed(stdin.encode("utf-8", "surrogateescape"), "stdin")
      theirs.append(stdin_fd)
      pipes = {}
      for name in ("status", "block", "stdout", "stderr") + (("side",) if side is not None else ()):
        r, w = os.pipe()
        pipes[name] = (r, w)
        mine.append(w if name == "block" else r)
        theirs.append(r if name == "block" else w)
      fds["status"], fds["block"] = pipes["status"][1], pipes["block"][0]
      extra = ()
      if side is not None:
        side_in = _sealed(side, "side")
        theirs.append(side_in)
        extra = (str(side_in), str(pipes["side"][1]), "-")
        if strict:
          theirs.append(_sealed(self._filter(True), "seccomp-program"))
          extra = extra[:2] + (str(theirs[-1]),)
      argv = self.command(fds, uid, extra, tmp)
      if bound.cgroup:
        try:
          cgroup = bound.open((cfg.memory_mb + cfg.tmp_mb) * 2**20)
        except CgroupError as exc:
          raise SandboxUnavailable(f"sandbox memory bound ({bound.kind}): {exc}") from None
      t0 = time.monotonic()
      with reaping.Subreaper():
        proc = subprocess.Popen(argv, stdin=stdin_fd, stdout=pipes["stdout"][1], stderr=pipes["stderr"][1],
                                pass_fds=[fd for fd in theirs if fd != stdin_fd], env={"PATH": SANDBOX_PATH}, **user)
        for fd in theirs:
          os.close(fd)
        theirs.clear()
        streams, reported, timed_out, over = self._watch(proc, pipes, cgroup, t0 + cfg.wall_s)
        _, wait_status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        reaper_usage = reaping.reap(reported.get("child-pid"))
      seconds = time.monotonic() - t0
      oom = cgroup is not None and cgroup.oom_killed()
    stdout, stderr = streams["stdout"].text(), streams["stderr"].text(tail=True)
    side_out = streams["side"].text() if side is not None else None
    if timed_out:
      return RunResult(stdout, stderr, None, "timeout_wall", seconds, side_out)
    if "exit-code" not in reported:
      raise SandboxUnavailable(f"bubblewrap could not start the sandbox (exit status {proc.returncode}): "
                               f"{stderr.strip()[-500:] or 'no message'}. {_FIX}")
    code = int(reported["exit-code"])
    if oom:
      return RunResult(stdout, stderr, code, "memory", seconds, side_out)
    cpu_used = sum(u.ru_utime + u.ru_stime for u in (usage, reaper_usage) if u is not None)
    over = over or streams["stdout"].total > cfg.output_kb * 1024
    return RunResult(stdout, stderr, code, self._cause(code, stderr, over, cpu_used), seconds, side_out)

  @staticmethod
  def _close(mine: list, theirs: list, cgroup) -> None:
    for fd in mine + theirs:
      try:
        os.close(fd)
      except OSError:
        pass
    if cgroup() is not None:
      cgroup().close()

  @staticmethod
  def _filter(one_address_space: bool) -> bytes:
    try:
      return seccomp.filter_bpf(one_address_space)
    except seccomp.SeccompUnavailable as exc:
      raise SandboxUnavailable(f"the sandbox's system-call filter: {exc}") from None

  def _watch(self, proc: subprocess.Popen, pipes: dict, cgroup, deadline: float):
    """Reads the run's pipes until bubblewrap has exited and its pipes are closed. Starts the program once
    bubblewrap has reported its child (moved into the run's cgroup, oom_score_adj 1000, then one byte on the
    block pipe). Kills it past `deadline` or once stdout or stderr passes file_kb. -> (streams, bubblewrap's
    reports, timed out, over the output limit)."""
    cfg = self.cfg
    cap = cfg.output_kb * 1024
    streams = {"stdout": _Stream(cap), "stderr": _Stream(cap, cap), "side": _Stream(cap)}
    status = bytearray()
    by_fd = {pipes[name][0]: name for name in pipes if name != "block"}
    poller = select.poll()
    for fd in by_fd:
      poller.register(fd, select.POLLIN)
    pidfd = os.pidfd_open(proc.pid)
    poller.register(pidfd, select.POLLIN)
    started = exited = timed_out = over = False
    reported: dict = {}
    try:
      while by_fd or not exited:
        left = deadline - time.monotonic()
        if left <= 0:
          if exited:  # the program's pipes outlived bubblewrap by KILL_WAIT_S: stop reading
            break
          timed_out = True
          self._kill(proc, reported.get("child-pid"))
          exited, deadline = True, time.monotonic() + reaping.KILL_WAIT_S
          continue
        for fd, _ in poller.poll(max(1, int(math.ceil(left * 1000)))):
          if fd == pidfd:
            poller.unregister(pidfd)
            exited, deadline = True, time.monotonic() + reaping.KILL_WAIT_S
            continue
          data = os.read(fd, 65536)
          if not data:
            poller.unregister(fd)
            del by_fd[fd]
            continue
          name = by_fd[fd]
          if name == "status":
            status += data
            reported = _status(bytes(status))
            if not started and isinstance(reported.get("child-pid"), int):
              started = True
              self._start(proc, reported["child-pid"], pipes["block"][1], cgroup)
            continue
          streams[name].add(data)
          if name != "side" and streams[name].total > cfg.file_kb * 1024 and not over:
            over = True
            self._kill(proc, reported.get("child-pid"))
    finally:
      os.close(pidfd)
    return streams, reported, timed_out, over

  def _start(self, proc: subprocess.Popen, child: int, block_fd: int, cgroup) -> None:
    """Bubblewrap's child (the sandbox's PID 1 to be, waiting on --block-fd) joins the run's cgroup and gets
    oom_score_adj 1000 (the OOM killer takes it and its descendants before anything else), then starts."""
    try:
      if cgroup is not None:
        cgroup.enter(child)
      try:
        with open(f"/proc/{child}/oom_score_adj", "w") as f:
          f.write("1000")
      except OSError as exc:
        _warn_once(f"sandbox: cannot set oom_score_adj of the sandbox ({exc}); the OOM killer may pick another "
                   "process first")
    except CgroupError as exc:
      self._kill(proc, child)
      raise SandboxUnavailable(f"sandbox memory bound: {exc}") from None
    os.write(block_fd, b"x")

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

  def _kill(self, proc: subprocess.Popen, child) -> None:
    """SIGKILL to the sandbox's PID 1 (bubblewrap's reaper, which takes its PID namespace down with it). The reaper
    is addressed through a pidfd checked to be bubblewrap's child, so a pid reused meanwhile is never signalled.
    When the reaper is unknown (bubblewrap was still setting up), bubblewrap itself is killed (its reaper follows
    by --die-with-parent). The caller goes on reading until bubblewrap has exited."""
    if isinstance(child, int):
      try:
        fd = os.pidfd_open(child)
      except OSError:
        fd = None
      if fd is not None:
        try:
          if reaping.parent_of(child) == proc.pid:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            return
        except (OSError, ValueError, IndexError):
          pass
        finally:
          os.close(fd)
    proc.kill()

  def check_available(self) -> None:
    """Runs a trivial program in a sandbox; SandboxUnavailable saying how to fix it unless that works. Logs how a
    run's memory is bounded here."""
    result = self.run("print(6 * 7)")
    logging.getLogger(__name__).info("sandbox: memory bound per run: %s", self.memory_bound().describe())
    if result.cause != "ok" or result.stdout.strip() != "42":
      uid_note = (f" (as root the sandbox runs as uid {UID_BASE}+pid: sandbox.python {self.cfg.python!r} and its "
                  "libraries must be readable by any user)" if os.geteuid() == 0 else "")
      raise SandboxUnavailable(f"a trivial program failed in the sandbox (cause {result.cause}, exit status "
                               f"{result.exit_code}): {result.stderr.strip()[-500:] or 'no message'}{uid_note}. "
                               f"{_FIX}")
