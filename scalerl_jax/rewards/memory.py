"""One memory bound per sandboxed run, over all its processes: a memory cgroup when this host lets us make one, else
a single address space.

    bound = MemoryBound.detect(setting)      # setting: sandbox.memory_cgroup ("auto", "off" or a directory)
    bound.kind                               # "cgroup2" | "cgroup1" | "one_address_space"
    run = bound.open(limit_bytes)            # a fresh cgroup (None without one)
    run.enter(pid); ...; run.oom_killed(); run.close()

RLIMIT_AS is per process: a program that forks holds up to max_procs times memory_mb. The paths:
  cgroup2            a cgroup v2 directory whose cgroup.subtree_control enables "memory" and that this process may
                     write (a delegated subtree: systemd's Delegate=yes, or the root cgroup). Each run gets a child
                     cgroup with memory.max = the limit, memory.swap.max = 0 and memory.oom.group = 1 (an OOM kills
                     the whole run). "auto" uses this process's own cgroup when it is such a directory.
  cgroup1            a cgroup v1 memory cgroup, given as sandbox.memory_cgroup (never chosen by "auto";
                     v1_memory_cgroup() finds this process's): a child cgroup with memory.limit_in_bytes (and
                     memory.memsw.limit_in_bytes where swap is accounted) = the limit.
  one_address_space  no cgroup ("auto" without a delegated v2 cgroup, or "off"): the seccomp filter refuses every
                     new process (threads still work, see seccomp.py), so the program is one address space and
                     RLIMIT_AS (memory_mb) bounds all it can hold. Programs that fork or start subprocesses fail
                     (cause procs) there.
Cost: moving a process into a cgroup waits for an RCU grace period (the kernel's cgroup_threadgroup_rwsem): 5-12 ms
per run on this project's 2-core VM, a fifth of a trivial run, which is why "auto" does not pick a v1 hierarchy
(hosts that mount cgroup2 with `favordynmods` make the move cheap). one_address_space costs nothing.
A cgroup bound counts everything the kernel charges to the run: anonymous memory, its tmpfs /tmp, and kernel
memory such as inodes and dentries (a program creating millions of empty files hits it). The sandbox's processes
enter the cgroup before the program starts: bubblewrap blocks its child on --block-fd until the caller has moved
it (sandbox.py). A run's cgroup is removed once its processes are gone.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Optional

CGROUP_ROOT = "/sys/fs/cgroup"
_counter = itertools.count()


class CgroupError(OSError):
  """A cgroup could not be made, limited or entered (the sandbox turns this into SandboxUnavailable)."""


def _write(path: str, text: str) -> None:
  try:
    with open(path, "w") as f:
      f.write(text)
  except OSError as exc:
    raise CgroupError(f"cannot write {text!r} to {path}: {exc.strerror or exc}") from None


def _own_cgroups() -> dict[str, str]:
  """/proc/self/cgroup as {controller or "" (v2): path}."""
  out = {}
  with open("/proc/self/cgroup") as f:
    for line in f:
      _, controllers, path = line.rstrip("\n").split(":", 2)
      for name in controllers.split(","):
        out[name] = path
  return out


def v1_memory_cgroup() -> Optional[str]:
  """This process's cgroup v1 memory cgroup directory (for sandbox.memory_cgroup), or None without one."""
  try:
    own, mount = _own_cgroups(), _v1_memory_mount()
  except OSError:
    return None
  return os.path.join(mount, own["memory"].lstrip("/")) if mount and "memory" in own else None


def _v1_memory_mount() -> Optional[str]:
  with open("/proc/self/mountinfo") as f:
    for line in f:
      fields = line.split()
      sep = fields.index("-")
      if fields[sep + 1] == "cgroup" and "memory" in fields[sep + 3].split(","):
        return fields[4]
  return None


@dataclasses.dataclass
class RunCgroup:
  """One run's cgroup."""
  path: str
  version: int

  def enter(self, pid: int) -> None:
    _write(os.path.join(self.path, "cgroup.procs"), str(pid))

  def oom_killed(self) -> bool:
    """Whether the kernel's OOM killer killed a process of this run (memory.events / memory.oom_control)."""
    name = "memory.events" if self.version == 2 else "memory.oom_control"
    try:
      with open(os.path.join(self.path, name)) as f:
        counts = dict(line.split() for line in f if len(line.split()) == 2)
    except OSError:
      return False
    return int(counts.get("oom_kill", 0)) > 0

  def close(self) -> None:
    """Removes the cgroup (its processes are gone by now); a leftover is harmless and logged, never raised."""
    try:
      os.rmdir(self.path)
    except OSError as exc:
      import logging

      logging.getLogger(__name__).warning("sandbox: cannot remove the run's cgroup %s: %s", self.path, exc)


@dataclasses.dataclass(frozen=True)
class MemoryBound:
  kind: str  # "cgroup2" | "cgroup1" | "one_address_space"
  parent: Optional[str] = None  # the cgroup that runs' cgroups are made in
  why: str = ""  # for one_address_space: why no cgroup is used

  @property
  def cgroup(self) -> bool:
    return self.kind != "one_address_space"

  @staticmethod
  def detect(setting: str = "auto") -> "MemoryBound":
    """The bound for `setting` (sandbox.memory_cgroup): "off" -> one_address_space; a directory -> that cgroup
    (CgroupError when it is unusable: an explicit choice is never silently dropped); "auto" -> this process's
    cgroup v2 when it is delegated, else one_address_space."""
    if setting == "off":
      return MemoryBound("one_address_space", why="sandbox.memory_cgroup is off")
    if setting != "auto":
      bound = MemoryBound._at(setting)
      bound.probe()
      return bound
    try:
      own = _own_cgroups()
    except OSError as exc:
      return MemoryBound("one_address_space", why=f"cannot read /proc/self/cgroup: {exc}")
    if "" not in own or not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
      return MemoryBound("one_address_space", why="no cgroup v2 hierarchy at /sys/fs/cgroup")
    bound = MemoryBound("cgroup2", os.path.join(CGROUP_ROOT, own[""].lstrip("/")))
    try:
      bound.probe()
      return bound
    except CgroupError as exc:
      return MemoryBound("one_address_space", why=f"cgroup v2 at {bound.parent}: {exc}")

  @staticmethod
  def _at(path: str) -> "MemoryBound":
    if os.path.exists(os.path.join(path, "cgroup.subtree_control")):
      return MemoryBound("cgroup2", path)
    if os.path.exists(os.path.join(path, "memory.limit_in_bytes")):
      return MemoryBound("cgroup1", path)
    raise CgroupError(f"sandbox.memory_cgroup: {path} is neither a cgroup v2 directory (no cgroup.subtree_control) "
                      "nor a cgroup v1 memory cgroup (no memory.limit_in_bytes)")

  def probe(self) -> None:
    """CgroupError unless a run's cgroup can be made and limited here."""
    if self.kind == "cgroup2":
      try:
        with open(os.path.join(self.parent, "cgroup.subtree_control")) as f:
          enabled = f.read().split()
      except OSError as exc:
        raise CgroupError(f"cannot read {self.parent}/cgroup.subtree_control: {exc}") from None
      if "memory" not in enabled:
        raise CgroupError(f"the memory controller is not enabled for children of {self.parent} (its "
                          "cgroup.subtree_control lacks 'memory': the cgroup is not delegated to this process)")
    self.open(64 * 2**20).close()

  def open(self, limit_bytes: int) -> Optional[RunCgroup]:
    """A fresh cgroup limited to `limit_bytes` (None for one_address_space); CgroupError if that fails."""
    if not self.cgroup:
      return None
    path = os.path.join(self.parent, f"scalerl-sandbox-{os.getpid()}-{next(_counter)}")
    try:
      os.mkdir(path)
    except OSError as exc:
      raise CgroupError(f"cannot make a cgroup in {self.parent}: {exc.strerror or exc}") from None
    run = RunCgroup(path, 2 if self.kind == "cgroup2" else 1)
    try:
      if run.version == 2:
        _write(os.path.join(path, "memory.max"), str(limit_bytes))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
          if os.path.exists(os.path.join(path, name)):
            _write(os.path.join(path, name), value)
      else:
        _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
        if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
          _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit_bytes))
    except CgroupError:
      run.close()
      raise
    return run

  def describe(self) -> str:
    if self.cgroup:
      return f"{self.kind} (a cgroup per run in {self.parent})"
    return f"one_address_space (no memory cgroup: {self.why}; programs cannot start processes)"
