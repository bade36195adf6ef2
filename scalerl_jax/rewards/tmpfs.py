"""The sandbox's /tmp with a cap on files as well as bytes: a tmpfs mounted on the host with nr_inodes, per run.

    with private_tmp(size_bytes, files) as path:   # path: a host directory to bind at /tmp, or None
      ...

bubblewrap's own `--size N --tmpfs /tmp` caps bytes only; its tmpfs gets the kernel's default inode count (half
the machine's RAM pages), and each empty file costs about 1 KiB of kernel memory that no byte count sees (163k
empty files, +222 MiB, in 4 s). bubblewrap has no option for tmpfs mount options, so the trainer mounts the tmpfs
itself (`size=,nr_inodes=,mode=1777`) on a fresh directory under /tmp/scalerl-sandbox-<pid> (mode 0711: the
mounts inside cannot be listed by other users) and bubblewrap binds it at /tmp. When the run ends (its processes
are gone) the tmpfs is wiped and kept for the next run of this process; it is unmounted (lazily) when it cannot be
wiped and at exit. A process killed outright leaves its mounts behind (each at most tmp_mb bytes and `files`
inodes); the next process to use this module removes them. Mounting needs CAP_SYS_ADMIN (a root trainer):
without it this yields None and the sandbox falls back to bubblewrap's tmpfs, whose files are then bounded only
by the run's memory cgroup (their kernel memory is charged to it, memory.py) or, without one, not at all.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import tempfile
import threading
from typing import Iterator, Optional

_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_usable: dict = {}  # pid -> whether mount worked in this process
_free: dict = {}  # (pid, size, files) -> wiped tmpfs mounts ready for the next run
_lock = threading.Lock()


def _libc() -> ctypes.CDLL:
  return ctypes.CDLL(None, use_errno=True)


def _sweep(root: str) -> None:
  """Unmounts and removes what processes that no longer exist left under `root` (killed mid-run)."""
  libc = _libc()
  for entry in os.scandir(root):
    name = entry.name
    if not name.startswith("scalerl-sandbox-") or not name[16:].isdigit() or os.path.exists(f"/proc/{name[16:]}"):
      continue
    for run in os.scandir(entry.path):
      libc.umount2(run.path.encode(), _MNT_DETACH)
      with contextlib.suppress(OSError):
        os.rmdir(run.path)
    with contextlib.suppress(OSError):
      os.rmdir(entry.path)


def _unmount(path: str) -> None:
  _libc().umount2(path.encode(), _MNT_DETACH)
  with contextlib.suppress(OSError):
    os.rmdir(path)


def _wipe(path: str) -> bool:
  """Removes everything a run left in its tmpfs (its processes are gone); whether the tmpfs is empty again."""
  try:
    for entry in os.scandir(path):
      if entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path)
      else:
        os.unlink(entry.path)
    return not os.listdir(path)
  except OSError:
    return False


def _release() -> None:
  """Unmounts this process's kept tmpfs mounts: at exit, and when a multiprocessing worker (a reward worker)
  ends, which skips atexit (multiprocessing.util's finalizers run instead)."""
  with _lock:
    for paths in _free.values():
      for path in paths:
        _unmount(path)
    _free.clear()


@contextlib.contextmanager
def private_tmp(size_bytes: int, files: int) -> Iterator[Optional[str]]:
  """A host directory holding an empty tmpfs of `size_bytes` and at most `files` inodes (the root included), or
  None where this process cannot mount (see the module docstring). A tmpfs is wiped after its run and kept for the
  next run of this process (mounting and unmounting cost about 3 ms a run)."""
  pid = os.getpid()
  if _usable.get(pid) is False or os.geteuid() != 0:
    yield None
    return
  key = (pid, size_bytes, files)
  with _lock:
    path = _free[key].pop() if _free.get(key) else None
  if path is None:
    path = _mount(pid, size_bytes, files)
    if path is None:
      yield None
      return
  try:
    yield path
  finally:
    if _wipe(path):
      with _lock:
        _free.setdefault(key, []).append(path)
    else:
      _unmount(path)


def _mount(pid: int, size_bytes: int, files: int) -> Optional[str]:
  if pid not in _usable:
    with contextlib.suppress(OSError):
      _sweep(tempfile.gettempdir())
  base = os.path.join(tempfile.gettempdir(), f"scalerl-sandbox-{pid}")
  os.makedirs(base, mode=0o711, exist_ok=True)
  path = tempfile.mkdtemp(dir=base)
  options = f"size={size_bytes},nr_inodes={files},mode=1777".encode()
  if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
    _usable[pid] = False
    os.rmdir(path)
    return None
  if pid not in _usable:
    atexit.register(_release)
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _release, exitpriority=0)
  _usable[pid] = True
  return path
