"""The sandbox's /tmp with a cap on files as well as bytes: a tmpfs mounted on the host with nr_inodes, per run.

    with private_tmp(size_bytes, files) as path:   # path: a host directory to bind at /tmp, or None
      ...

bubblewrap's own `--size N --tmpfs /tmp` caps bytes only; its tmpfs gets the kernel's default inode count (half
the machine's RAM pages), and each empty file costs about 1 KiB of kernel memory that no byte count sees (163k
empty files, +222 MiB, in 4 s). bubblewrap has no option for tmpfs mount options, so the trainer mounts the tmpfs
itself (`size=,nr_inodes=,mode=1777`) on a fresh directory under /tmp/scalerl-sandbox-<pid> (mode 0711: the
mounts inside cannot be listed by other users) and bubblewrap binds it at /tmp; it is unmounted (lazily) and
removed when the run ends; a process that was killed in the middle of a run leaves its mount behind (at most
tmp_mb bytes and `files` inodes), which the next process to use this module removes. Mounting needs CAP_SYS_ADMIN (a root trainer): without it this yields None and the
sandbox falls back to bubblewrap's tmpfs, whose files are then bounded only by the run's memory cgroup (their
kernel memory is charged to it, memory.py) or, without one, not at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from typing import Iterator, Optional

_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_usable: dict = {}  # pid -> whether mount worked in this process


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


@contextlib.contextmanager
def private_tmp(size_bytes: int, files: int) -> Iterator[Optional[str]]:
  """A host directory holding a fresh tmpfs of `size_bytes` and at most `files` inodes (the root included), or
  None where this process cannot mount (see the module docstring)."""
  pid = os.getpid()
  if _usable.get(pid) is False or os.geteuid() != 0:
    yield None
    return
  if pid not in _usable:
    with contextlib.suppress(OSError):
      _sweep(tempfile.gettempdir())
  base = os.path.join(tempfile.gettempdir(), f"scalerl-sandbox-{pid}")
  os.makedirs(base, mode=0o711, exist_ok=True)
  path = tempfile.mkdtemp(dir=base)
  libc = _libc()
  options = f"size={size_bytes},nr_inodes={files},mode=1777".encode()
  if libc.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
    _usable[pid] = False
    os.rmdir(path)
    yield None
    return
  _usable[pid] = True
  try:
    yield path
  finally:
    libc.umount2(path.encode(), _MNT_DETACH)
    try:
      os.rmdir(path)
    except OSError:
      pass
