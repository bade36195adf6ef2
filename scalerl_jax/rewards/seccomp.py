"""The sandbox's system-call filter: a classic-BPF program compiled by libseccomp, handed to bubblewrap (`--seccomp`).

    filter_bpf(one_address_space) -> bytes   (cached per process)

The filter allows every system call but those an untrusted program has no use for, which fail with EPERM
(DENIED): the kernel keyrings (keyctl, add_key, request_key: a host's session keyring is inherited across user
namespaces, so without this a program reads the caller's keys and plants its own), ptrace and reading or writing
other processes' memory, bpf, perf_event_open, userfaultfd, io_uring (a frequent source of kernel bugs), mounts
and namespaces, kernel modules, kexec, reboot, swap, clocks, quotas and accounting. System calls of another ABI
(i386 through int 0x80, x32) kill the program (libseccomp's default for a foreign architecture).

`one_address_space` (the sandbox's memory bound when no cgroup is available, see memory.py) also refuses every new
process: fork and vfork fail with EAGAIN, clone unless it makes a thread (CLONE_THREAD: same address space), and
clone3 with ENOSYS (its flags are in memory the filter cannot read; the C library then falls back to clone). A
thread shares its process's address space, so RLIMIT_AS then bounds all the memory the program can hold.

Why libseccomp: it is the kernel community's own library for this (systemd, podman, flatpak use it), knows the
system-call numbers of every architecture and writes the architecture check; the Debian package `libseccomp2` is
on every Debian system (systemd depends on it). It is called through ctypes: the few functions used here have had
the same ABI since 2.2, and no Python package is needed (the PyPI bindings are unmaintained or need a compiler).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

DENIED = (
    "keyctl", "add_key", "request_key",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "unshare", "setns", "name_to_handle_at", "open_by_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "syslog", "vhangup", "iopl", "ioperm", "uselib", "nfsservctl", "lookup_dcookie",
    "fanotify_init", "personality",
)
_ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW
_CMP_MASKED_EQ = 7  # SCMP_CMP_MASKED_EQ: (arg & datum_a) == datum_b
_CLONE_THREAD = 0x00010000


def _errno(code: int) -> int:
  return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


class _ArgCmp(ctypes.Structure):
  _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
              ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(RuntimeError):
  """libseccomp is missing or refused the filter (the sandbox turns this into SandboxUnavailable)."""


def _library() -> ctypes.CDLL:
  name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
  try:
    lib = ctypes.CDLL(name, use_errno=True)
  except OSError as exc:
    raise SeccompUnavailable(f"libseccomp is not installed ({exc}): `apt-get install libseccomp2` (Debian/Ubuntu), "
                             "`dnf install libseccomp` (Fedora)") from None
  lib.seccomp_init.restype = ctypes.c_void_p
  lib.seccomp_init.argtypes = [ctypes.c_uint32]
  lib.seccomp_release.argtypes = [ctypes.c_void_p]
  lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
  lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                         ctypes.POINTER(_ArgCmp)]
  lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
  return lib


@functools.lru_cache(maxsize=None)
def filter_bpf(one_address_space: bool) -> bytes:
  """The filter described in the module docstring, as the BPF bytes bubblewrap's --seccomp reads."""
  lib = _library()
  ctx = lib.seccomp_init(_ALLOW)
  if not ctx:
    raise SeccompUnavailable("seccomp_init failed")
  try:
    def add(name: str, action: int, *conditions: _ArgCmp) -> None:
      nr = lib.seccomp_syscall_resolve_name(name.encode())
      if nr < 0:  # __NR_SCMP_ERROR or a pseudo-number: no such system call on this architecture
        return
      array = (_ArgCmp * max(1, len(conditions)))(*conditions)
      rc = lib.seccomp_rule_add_array(ctx, action, nr, len(conditions), array)
      if rc < 0:
        raise SeccompUnavailable(f"seccomp_rule_add({name}) failed: {os.strerror(-rc)}")

    for name in DENIED:
      add(name, _errno(errno.EPERM))
    if one_address_space:
      add("fork", _errno(errno.EAGAIN))
      add("vfork", _errno(errno.EAGAIN))
      add("clone", _errno(errno.EAGAIN), _ArgCmp(0, _CMP_MASKED_EQ, _CLONE_THREAD, 0))  # arg 0: the flags
      add("clone3", _errno(errno.ENOSYS))
    read_fd, write_fd = os.pipe()
    try:
      rc = lib.seccomp_export_bpf(ctx, write_fd)
      os.close(write_fd)
      write_fd = -1
      if rc < 0:
        raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
      chunks = []
      while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
      return b"".join(chunks)
    finally:
      os.close(read_fd)
      if write_fd >= 0:
        os.close(write_fd)
  finally:
    lib.seccomp_release(ctx)
