"""The code reward's sandbox (rewards/sandbox.py, rewards/code.py): every escape attempt is contained, scored as a
failure and counted by cause, and scoring goes on.

Each escape test proves that the attempt would succeed without the sandbox: the same program runs unsandboxed (the
same interpreter, in a throwaway temporary directory) where that is safe, else the test asserts on what only the
sandbox can cause (a fork refused below max_procs as root, EFBIG on stdout, SIGXCPU). Skipped, with bubblewrap's
own message, only where bubblewrap cannot build a sandbox on this machine (CI installs it: .ci/run).

No test depends on speed: limits that should not trigger are far away (wall_s 30 s for programs that take
milliseconds), a sleeping program sleeps 1000 s against a 1 s wall limit, a loop spins against 1 CPU second.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

from scalerl_jax import types
from scalerl_jax.config import ConfigError, RewardConfig
from scalerl_jax.config.schema import SandboxConfig
from scalerl_jax.rewards import RewardRunner, code, make_reward_runner, memory as mem, sandbox as sb
from scalerl_jax.rewards.code import code_reward
from scalerl_jax.rewards.sandbox import Sandbox, SandboxUnavailable

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMITS = SandboxConfig(cpu_s=1.0, wall_s=30.0, memory_mb=256, max_procs=16, file_kb=256, output_kb=16, tmp_mb=4,
                       tmp_files=256)
F = "```"


@pytest.fixture(scope="module")
def box() -> Sandbox:
  sandbox = Sandbox(LIMITS)
  try:
    sandbox.check_available()
  except SandboxUnavailable as exc:
    pytest.skip(f"bubblewrap cannot build a sandbox on this machine: {exc}")
  return sandbox


@pytest.fixture
def configured(box):
  """code_reward in this process uses LIMITS (the workers get theirs from RewardRunner's sandbox=)."""
  code.configure(LIMITS)
  yield
  code._sandbox = None


def unsandboxed(program: str, cwd: pathlib.Path, stdin: str = "") -> subprocess.CompletedProcess:
  """The same program, same interpreter and flags, without the sandbox: the proof that an attempt would work."""
  (cwd / "main.py").write_text(program)
  return subprocess.run([LIMITS.python, "-I", "-B", str(cwd / "main.py")], input=stdin, capture_output=True,
                        text=True, cwd=cwd, timeout=60)


def fenced(program: str) -> str:
  return f"Some thinking.\n{F}python\n{program}\n{F}\n"


def stdio(*pairs) -> str:
  return json.dumps({"stdio": [list(p) for p in pairs]})


# --- correct and incorrect programs ----------------------------------------------------------------------------

def test_correct_and_incorrect_programs_score_as_expected(configured):
  double = stdio(["3\n", "6\n"], ["21\n", "42"])
  right = code_reward(fenced("print(int(input()) * 2)"), double)
  assert right == 1.0 and right.cause == "ok"
  assert code_reward(fenced("print(int(input()) * 2 + 1)"), double).cause == "wrong_answer"
  # trailing whitespace per line and trailing empty lines do not count; inner differences do
  assert code_reward(fenced("print(6, '  ')\nprint()\nprint()"), stdio(["", "6\n"])) == 1.0
  assert code_reward(fenced("print(' 6')"), stdio(["", "6"])) == 0.0
  # the last Python block wins; a block of another language is not a program
  two = f"{F}python\nprint(1)\n{F}\nthen\n{F}py\nprint(2)\n{F}\n{F}text\nprint(3)\n{F}"
  assert code_reward(two, stdio(["", "2"])) == 1.0
  # no fence: the text after the last marker, up to '$'
  assert code_reward("a | b |print(5)$print(6)", stdio(["", "5"])) == 1.0
  for nothing in ("no program here", f"{F}python\n   \n{F}", "ends with a marker |", f"{F}python\nprint(1)"):
    result = code_reward(nothing, stdio(["", "1"]))
    assert result == 0.0 and result.cause == "no_program"
  # asserts, with a HumanEval-style starter prepended as it is
  starter = json.dumps({"starter": "def f(x):return ", "asserts": ["assert f(2) == 7", "assert f(10) == 31"]})
  assert code_reward("3 | 3*x+1$", starter) == 1.0
  wrong = code_reward("3 | 3*x+2$", starter)
  assert wrong == 0.0 and wrong.cause == "wrong_answer"
  crash = code_reward("3 | 1/0$", starter)
  assert crash == 0.0 and crash.cause == "nonzero_exit"


def test_right_output_with_a_nonzero_exit_fails(configured, tmp_path):
  """Documented in code.py: the output is right, the exit status is not; scored as a failure."""
  program = "print(42)\nraise SystemExit(3)"
  plain = unsandboxed(program, tmp_path)
  assert plain.stdout == "42\n" and plain.returncode == 3
  result = code_reward(fenced(program), stdio(["", "42"]))
  assert result == 0.0 and result.cause == "nonzero_exit"


def test_an_exit_before_the_asserts_cannot_pass(configured):
  tests = json.dumps({"asserts": ["assert f(1) == 2"]})
  assert code_reward(fenced("def f(x): return 2 * x"), tests) == 1.0
  for trick in ("import os; os._exit(0)", "import sys; sys.exit(0)", "import builtins; builtins.exec = print"):
    result = code_reward(fenced(f"def f(x): return 0\n{trick}"), tests)
    assert result == 0.0 and result.cause in ("exited_early", "wrong_answer"), (trick, result)


def test_partial_credit(box):
  code.configure(dataclasses.replace(LIMITS, partial_credit=True))
  try:
    tests = json.dumps({"stdio": [["1", "1"], ["2", "4"]], "asserts": ["assert sq(3) == 9", "assert sq(4) == 15"]})
    # (in an assert test the harness has read stdin's only line, its token: the loop reads nothing)
    result = code_reward(fenced("import sys\nsq = lambda x: x * x\nfor line in sys.stdin: print(sq(int(line)))"),
                         tests)
    assert result == 0.75 and result.cause == "wrong_answer" and result.success is False  # 3 of 4: not solved
    solved = code_reward(fenced("sq = lambda x: x * x"), json.dumps({"asserts": ["assert sq(3) == 9"]}))
    assert solved == 1.0 and solved.success is True
  finally:
    code._sandbox = None
  assert code_reward(fenced("sq = lambda x: x * x"), json.dumps({"asserts": ["assert sq(3) == 9",
                                                                             "assert sq(4) == 15"]})) == 0.0


def test_malformed_tests_raise_naming_the_key(configured):
  for answer, key in [("not json", "not JSON"), ("[1]", "JSON object"), ('{"stdin": []}', "'stdin'"),
                      ('{"stdio": [["a"]]}', "'stdio'"), ('{"asserts": [1]}', "'asserts'"), ("{}", "no tests")]:
    with pytest.raises(ValueError, match=key):
      code_reward(fenced("print(1)"), answer)


# --- escapes: each contained, each a failure with its cause ------------------------------------------------------

def test_files_outside_the_sandbox_cannot_be_read(box, tmp_path):
  readme = ROOT / "README.md"
  targets = [str(readme)] + [p for p in ("/etc/hostname", "/etc/passwd") if os.path.exists(p)]
  program = "import sys\nfor path in sys.argv[1:] or %r:\n  print(open(path).read()[:40])" % (targets,)
  plain = unsandboxed(program, tmp_path)
  assert plain.returncode == 0 and readme.read_text()[:40] in plain.stdout  # readable without the sandbox
  result = box.run(program)
  assert result.cause == "nonzero_exit" and "FileNotFoundError" in result.stderr and not result.stdout
  listing = box.run("import os; print(sorted(os.listdir('/')), os.path.exists(%r), os.path.exists('/etc'))"
                    % str(ROOT))
  assert listing.ok and listing.stdout.split("] ")[1].split() == ["False", "False"], listing


def test_writes_outside_its_tmp_are_refused(box, tmp_path):
  target = tmp_path / "escaped.txt"
  host_tmp = pathlib.Path("/tmp") / f"scalerl-sandbox-probe-{os.getpid()}"
  program = (f"import pathlib\npathlib.Path({str(target)!r}).write_text('out')\n")
  plain = unsandboxed(program, tmp_path)
  assert plain.returncode == 0 and target.read_text() == "out"  # without the sandbox the write lands
  target.unlink()
  result = box.run(program)
  assert result.cause == "nonzero_exit" and not target.exists()
  for path in ("/escaped", "/usr/escaped", "/dev/escaped", "/proc/escaped"):
    assert not box.run(f"open({path!r}, 'w').write('x')").ok, path
  # its /tmp is private (the host's /tmp never sees the file) and bounded (tmp_mb = 4: 8 MiB do not fit)
  assert box.run(f"open({str(host_tmp)!r}, 'w').write('x'); print(open({str(host_tmp)!r}).read())").stdout == "x\n"
  assert not host_tmp.exists()
  full = box.run("for i in range(32): open(f'/tmp/big{i}', 'wb').write(b'x' * 200 * 1024)")  # files < file_kb
  assert full.cause == "nonzero_exit" and "No space left" in full.stderr


CONNECT_SOCKET = "import socket, sys\nsocket.create_connection(('127.0.0.1', int(sys.argv[1] if len(sys.argv) > 1 " \
                 "else {port})), timeout=5).close()\nprint('connected')"
CONNECT_CTYPES = """import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
addr = struct.pack('=HH4s8x', socket.AF_INET, socket.htons({port}), socket.inet_aton('127.0.0.1'))
if libc.connect(fd, ctypes.c_char_p(addr), len(addr)) != 0:
  raise OSError(ctypes.get_errno(), 'connect failed')
print('connected')"""
CONNECT_CURL = "import os, sys\ncode = os.system('curl -s -o /dev/null --max-time 1 http://127.0.0.1:{port}/')\n" \
               "sys.exit(0 if os.WEXITSTATUS(code) in (0, 28, 52) else 1)  # 28: timed out after connecting"


def _pending_connection(listener: socket.socket) -> bool:
  """Whether a connection waits to be accepted (the handshake completes in the kernel before connect returns,
  so after the program has exited this does not depend on timing)."""
  try:
    conn, _ = listener.accept()
  except BlockingIOError:
    return False
  conn.close()
  return True


@pytest.mark.parametrize("attempt", ["socket", "ctypes", "curl"])
def test_the_network_is_unreachable(box, tmp_path, attempt):
  if attempt == "curl" and not shutil.which("curl"):
    pytest.skip("curl is not installed here")
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    program = {"socket": CONNECT_SOCKET, "ctypes": CONNECT_CTYPES, "curl": CONNECT_CURL}[attempt].format(port=port)
    plain = unsandboxed(program, tmp_path)
    assert plain.returncode == 0 and _pending_connection(listener), plain.stderr  # it connects without the sandbox
    result = box.run(program)
    assert result.cause == "nonzero_exit" and not _pending_connection(listener), result


def test_fork_bombs_are_bounded(box, tmp_path):
  cap = LIMITS.max_procs + 5
  # threads: RLIMIT_NPROC counts them as processes, and they start with or without a memory cgroup (memory.py)
  program = ("import os, threading, time\nthreads = []\ntry:\n  while len(threads) < %d:\n"
             "    threads.append(threading.Thread(target=time.sleep, args=(1000,), daemon=True))\n"
             "    threads[-1].start()\nexcept RuntimeError:\n  threads.pop()\n"
             "print(len(threads), flush=True)\nos._exit(0)" % cap)
  assert unsandboxed(program, tmp_path).stdout == f"{cap}\n"  # without the sandbox nothing refuses them
  counted = box.run(program)
  assert counted.ok and 0 < int(counted.stdout) < LIMITS.max_procs  # refused below max_procs (bwrap's two count)
  bomb = Sandbox(dataclasses.replace(LIMITS, wall_s=2.0)).run(
      "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass")
  assert bomb.cause in ("cpu_limit", "timeout_wall"), bomb
  assert box.run("print('after')").stdout == "after\n"
  assert not _sandbox_processes()  # run() returns once the PID namespace is gone


def _sandbox_processes() -> list[int]:
  """Processes of this process's sandbox uid still alive (root only; [] otherwise)."""
  if os.geteuid() != 0:
    return []
  uid = sb.UID_BASE + os.getpid()
  found = []
  for entry in os.scandir("/proc"):
    if entry.name.isdigit():
      try:
        if entry.stat().st_uid == uid:
          found.append(int(entry.name))
      except OSError:
        pass
  return found


def test_allocating_past_the_memory_limit_fails(box, tmp_path):
  program = f"x = bytearray({2 * LIMITS.memory_mb} * 2**20)\nprint('allocated', len(x) >> 20)"
  assert unsandboxed(program, tmp_path).stdout == f"allocated {2 * LIMITS.memory_mb}\n"
  result = box.run(program)
  assert result.cause == "memory" and "MemoryError" in result.stderr


def test_an_infinite_loop_hits_the_cpu_limit(box):
  result = box.run("while True: pass")
  assert result.cause == "cpu_limit" and result.exit_code == 128 + 24  # SIGXCPU: only RLIMIT_CPU sends it
  stubborn = box.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass")
  assert stubborn.cause == "cpu_limit" and stubborn.exit_code == 128 + 9  # the hard limit's SIGKILL


def test_sleeping_past_the_wall_limit_is_killed_with_its_whole_tree(tmp_path):
  marker = f"scalerl-sandbox-sleeper-{os.getpid()}"
  quick = Sandbox(dataclasses.replace(LIMITS, wall_s=1.0))
  program = ("import signal, subprocess, sys, time\ntry:\n"  # no new process without a memory cgroup
             f"  subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, "
             f"signal.SIG_IGN); time.sleep(1000)  # {marker}'], start_new_session=True)\nexcept OSError:\n  pass\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(1000)")
  try:
    quick.check_available()
  except SandboxUnavailable as exc:
    pytest.skip(str(exc))
  result = quick.run(program)
  assert result.cause == "timeout_wall" and result.exit_code is None
  assert not [p for p in _cmdlines() if marker in p]  # the detached grandchild died with the PID namespace
  assert quick.run("print('next')").ok


def _cmdlines() -> list[str]:
  out = []
  for entry in os.scandir("/proc"):
    if entry.name.isdigit():
      try:
        out.append(pathlib.Path(entry.path, "cmdline").read_bytes().decode(errors="replace"))
      except OSError:
        pass
  return out


def test_printing_gigabytes_is_capped(box):
  result = box.run("import sys\nfor _ in range(2**14): sys.stdout.write('x' * 2**16)")  # 1 GiB
  assert result.cause == "output_limit" and len(result.stdout) == LIMITS.output_kb * 1024
  # stdout is a pipe: the reader kills the program once it has written more than file_kb (it would run on)
  assert result.exit_code == 128 + 9
  chatty = box.run("print('y' * (2 * 16 * 1024))")  # within file_kb, past output_kb: cannot be compared whole
  assert chatty.cause == "output_limit" and chatty.exit_code == 0


def test_killing_its_parent_is_contained(box, tmp_path):
  program = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('parent was', os.getppid())"
  (tmp_path / "main.py").write_text(program)
  plain = subprocess.run(["sh", "-c", f"{LIMITS.python} -I {tmp_path / 'main.py'}; echo parent-alive"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
  assert plain.returncode == -9 and "parent-alive" not in plain.stdout  # without the sandbox the parent dies
  result = box.run(program)
  assert result.ok and result.stdout == "parent was 1\n"  # its parent is the sandbox's PID 1, which ignores it
  assert box.run("print('next')").ok


# --- one memory bound per run, host disk, kernel keyrings, system calls, program size --------------------------

HOLD = """import os, signal
held, pids = 0, []
for _ in range({n}):
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(r)
    x = b'x' * ({mb} << 20)  # touched: resident
    os.write(w, b'1')
    signal.pause()
  pids.append(pid)
  os.close(w)
  held += os.read(r, 1) == b'1'  # b'' when the child was killed first
print(held)
for pid in pids:
  os.kill(pid, signal.SIGKILL)"""


@pytest.mark.parametrize("bound", ["auto", "off", "cgroup1"])
def test_processes_share_one_memory_bound(box, tmp_path, bound):
  """RLIMIT_AS is per process: 3 processes of 0.7 x memory_mb each hold 2.1 x memory_mb without a run-wide bound.
  With a memory cgroup (auto where cgroup v2 is delegated; this process's v1 memory cgroup, given explicitly) the
  OOM killer ends the run (cause memory); without one (off, auto elsewhere) no second process starts (procs)."""
  if bound == "cgroup1":
    bound = mem.v1_memory_cgroup()
    if bound is None or not os.access(bound, os.W_OK):
      pytest.skip("no writable cgroup v1 memory cgroup here")
  program = HOLD.format(n=3, mb=LIMITS.memory_mb * 7 // 10)
  assert unsandboxed(program, tmp_path).stdout == "3\n"  # nothing bounds the sum without the sandbox
  sandbox = Sandbox(dataclasses.replace(LIMITS, memory_cgroup=bound))
  result = sandbox.run(program)
  if sandbox.memory_bound().cgroup:
    assert result.cause == "memory", result  # the OOM killer of the run's cgroup (only a full cgroup calls it)
    assert sandbox.run(HOLD.format(n=1, mb=LIMITS.memory_mb // 4)).stdout == "1\n"  # within the bound: fine
  else:
    assert result.cause == "procs" and "BlockingIOError" in result.stderr and not result.stdout, result
    one = sandbox.run(f"x = b'x' * ({LIMITS.memory_mb * 7 // 10} << 20)\nprint(len(x) >> 20)")
    assert one.stdout == f"{LIMITS.memory_mb * 7 // 10}\n"  # one process may still use memory_mb


def test_without_a_cgroup_an_assert_tests_program_cannot_fork_either(box):
  """The harness forks the program's process (trusted code: bubblewrap's filter lets it); that process applies
  the filter without new processes to itself before the program runs."""
  code.configure(dataclasses.replace(LIMITS, memory_cgroup="off"))
  try:
    tests = json.dumps({"asserts": ["assert f(1) == 2"]})
    assert code_reward(fenced("def f(x): return 2 * x"), tests) == 1.0
    forks = code_reward(fenced("import os\nos.fork()\ndef f(x): return 2 * x"), tests)
    assert (forks, forks.cause) == (0.0, "procs")
  finally:
    code._sandbox = None


def test_the_oom_killer_prefers_the_sandbox(box):
  program = "print(open('/proc/self/oom_score_adj').read().strip())"
  with open("/proc/self/oom_score_adj") as f:
    assert f.read().strip() != "1000"  # the caller's (inherited by anything it starts unsandboxed)
  assert box.run(program).stdout == "1000\n"


def test_a_fake_cgroup_v2_gets_the_limit_and_the_sandbox(box, tmp_path):
  """The cgroup v2 path against a directory that looks like a delegated cgroup (no kernel behind it: the files are
  what the sandbox writes; on this host `auto` uses whatever memory cgroup the kernel offers, tested above)."""
  (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")
  sandbox = Sandbox(dataclasses.replace(LIMITS, memory_cgroup=str(tmp_path)))
  assert sandbox.memory_bound().kind == "cgroup2"
  result = sandbox.run("print('in')")
  assert result.ok and result.stdout == "in\n"
  runs = [p for p in tmp_path.iterdir() if p.is_dir()]  # a real cgroup is removed after the run; files stay here
  assert len(runs) == 2  # the probe's and the run's
  run = max(runs, key=lambda p: (p / "cgroup.procs").exists())
  assert (run / "memory.max").read_text() == str((LIMITS.memory_mb + LIMITS.tmp_mb) * 2**20)
  assert int((run / "cgroup.procs").read_text()) > 0  # the sandbox's PID 1, moved in before the program started
  (run / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
  assert mem.RunCgroup(str(run), 2).oom_killed()
  with pytest.raises(SandboxUnavailable, match="sandbox.memory_cgroup: .* is neither"):
    Sandbox(dataclasses.replace(LIMITS, memory_cgroup=str(tmp_path / "nothing"))).memory_bound()


def test_files_in_its_tmp_are_capped(box, tmp_path):
  """A tmpfs caps bytes, not files: empty files cost kernel memory only (about 1 KiB each). The sandbox's /tmp
  holds at most tmp_files inodes (root trainers: tmpfs.py)."""
  if os.geteuid() != 0:
    pytest.skip("the inode cap needs a root trainer (it mounts the tmpfs itself)")
  program = ("import os\nmade = 0\ntry:\n  for i in range(%d):\n    open(f'f{i}', 'w').close()\n    made += 1\n"
             "except OSError as exc:\n  print(exc.strerror)\nprint(made)" % (LIMITS.tmp_files + 100))
  assert unsandboxed(program, tmp_path).stdout == f"{LIMITS.tmp_files + 100}\n"
  result = box.run(program)
  assert result.ok and result.stdout.splitlines()[0] == "No space left on device", result
  assert int(result.stdout.splitlines()[1]) < LIMITS.tmp_files
  assert box.run("import os\nprint(os.listdir('/tmp'))").stdout == "[]\n"  # wiped for the next run


FALLOCATE = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
done = [fd for fd in (0, 1, 2) if libc.fallocate(fd, 1, 0, 16 << 20) == 0]  # FALLOC_FL_KEEP_SIZE, 16 MiB
os.write(1, f'reserved on {done}\\n'.encode())"""


def test_stdio_cannot_reserve_host_disk(box, tmp_path):
  """stdin, stdout and stderr are a sealed memfd and pipes: fallocate(KEEP_SIZE) on them fails. On regular files
  (what they were) it reserves disk that RLIMIT_FSIZE does not see."""
  paths = [tmp_path / name for name in ("in", "out", "err")]
  paths[0].write_text("")
  (tmp_path / "main.py").write_text(FALLOCATE)
  with open(paths[0], "r+") as i, open(paths[1], "w") as o, open(paths[2], "w") as e:
    subprocess.run([LIMITS.python, "-I", "-B", str(tmp_path / "main.py")], stdin=i, stdout=o, stderr=e, timeout=60)
  assert paths[1].read_text() == "reserved on [0, 1, 2]\n"
  assert all(p.stat().st_size <= 64 and p.stat().st_blocks * 512 >= 16 << 20 for p in paths[1:])
  result = box.run(FALLOCATE)
  assert result.ok and result.stdout == "reserved on []\n", result


KEYS = """import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
SESSION = ctypes.c_long(-3)  # KEY_SPEC_SESSION_KEYRING
if sys.argv[1:] == ['plant'] or {plant!r}:
  if libc.syscall(248, b'user', b'{name}-planted', b'x', 1, SESSION) < 0:  # add_key
    raise OSError(ctypes.get_errno(), 'add_key')
  print('planted')
else:
  key = libc.syscall(250, 10, SESSION, b'user', b'{name}', 0)  # keyctl(KEYCTL_SEARCH)
  if key < 0:
    raise OSError(ctypes.get_errno(), 'keyctl search')
  buf = ctypes.create_string_buffer(64)
  n = libc.syscall(250, 11, ctypes.c_long(key), buf, 64)  # keyctl(KEYCTL_READ)
  print(buf.raw[:n].decode())"""


def _keyctl(*args) -> int:
  import ctypes

  libc = ctypes.CDLL(None, use_errno=True)
  return libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])


def test_the_callers_keyring_is_out_of_reach(box, tmp_path):
  """A key in the caller's session keyring (pam_keyinit gives SSH logins and services one) is readable by
  anything the caller starts, and a key such a process adds lands in it; keyctl and add_key fail in the sandbox
  (seccomp: EPERM)."""
  name = f"scalerl-probe-{os.getpid()}"
  key = _keyctl(248, b"user", name.encode(), b"SECRET", 6, -3)  # add_key to this process's session keyring
  if key < 0:
    pytest.skip("this host refuses add_key (no kernel keyrings here)")
  try:
    for plant in (False, True):
      program = KEYS.format(name=name, plant=plant)
      plain = unsandboxed(program, tmp_path)
      assert plain.stdout == ("planted\n" if plant else "SECRET\n"), plain.stderr  # both work without it
      planted = _keyctl(250, 10, -3, b"user", f"{name}-planted".encode(), 0)
      assert (planted > 0) == plant
      if planted > 0:
        _keyctl(250, 9, planted, -3)  # KEYCTL_UNLINK
      result = box.run(program)
      assert result.cause == "nonzero_exit" and "PermissionError: [Errno 1]" in result.stderr, result
      assert "SECRET" not in result.stdout and _keyctl(250, 10, -3, b"user", f"{name}-planted".encode(), 0) < 0
  finally:
    _keyctl(250, 9, key, -3)


@pytest.mark.parametrize("call", ["ptrace", "bpf", "perf_event_open", "mount"])
def test_kernel_interfaces_a_program_has_no_use_for_are_refused(box, call):
  """Without the filter ptrace attaches to the sandbox's PID 1 and the others fail only once the kernel has looked
  at their arguments (EINVAL, EFAULT); with it each is EPERM before the kernel does anything (x86_64 numbers)."""
  number, args = {"ptrace": (101, "16, 1, 0, 0"), "bpf": (321, "0, 0, 0"), "perf_event_open": (298, "0, 0, -1, -1, 0"),
                  "mount": (165, "0, 0, 0, 0, 0")}[call]
  program = (f"import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.syscall({number}, {args})\n"
             "print(rc, errno.errorcode.get(ctypes.get_errno()))")
  assert box.run(program).stdout == "-1 EPERM\n"


def test_a_program_over_the_file_size_limit_is_scored_not_raised(configured):
  """bubblewrap writes the program under RLIMIT_FSIZE: one over file_kb made it fail, which read as a missing
  sandbox and stopped the run. Now it is a failed run with its own cause."""
  huge = "print(1)\n#" + "x" * (2 * LIMITS.file_kb * 1024)
  result = code_reward(fenced(huge), stdio(["", "1"]))
  assert (result, result.cause, result.success) == (0.0, "program_too_large", False)
  asserts = code_reward(fenced(huge), json.dumps({"asserts": ["assert True"]}))
  assert asserts.cause == "program_too_large"
  assert code_reward(fenced("print(1)"), stdio(["", "1"])) == 1.0


# --- assert tests are judged where the program cannot reach ----------------------------------------------------

FORGERIES = {
    # an object equal to anything
    "always_equal": ("class Anything:\n  def __eq__(self, other): return True\n  __hash__ = object.__hash__\n"
                     "def f(x): return Anything()", "assert f(1) == 2"),
    # the harness's token, dug out of its frame, printed as if the tests had run
    "token_from_frame": ("import os, sys\ntoken = sys._getframe(1).f_locals.get('token')\nif token:\n"
                         "  os.write(1, ('\\n' + token + '\\n').encode())\n  os._exit(0)\ndef f(x): return 0",
                         "assert f(1) == 2"),
    # the token read again from stdin
    "token_from_stdin": ("import os\nos.lseek(0, 0, os.SEEK_SET)\nfor line in os.read(0, 4096).decode().split():\n"
                         "  os.write(1, ('\\n' + line + '\\n').encode())\nos._exit(0)\ndef f(x): return 0",
                         "assert f(1) == 2"),
    # the expected values read from the script that holds the test
    "expected_from_main_py": ("import re\ntable = {int(a): int(b) for a, b in re.findall(r'f\\((\\d+)\\) == (\\d+)', "
                              "open('/sandbox/main.py').read())}\ndef f(x): return table.get(x)",
                              "assert f(1) == 2"),
    # a builtin the test uses, replaced
    "replaced_builtin": ("import builtins\nbuiltins.abs = lambda x: 0\ndef f(x): return 0.0",
                         "assert abs(f(1.5) - 3.0) < 1e-6"),
}
HONEST = {"always_equal": "def f(x): return 2 * x", "replaced_builtin": "def f(x): return 2 * x"}


@pytest.mark.parametrize("trick", sorted(FORGERIES))
def test_assert_tests_cannot_be_forged(configured, trick):
  """Each trick scored 1.0 for a wrong program while the program ran in the test's interpreter (the harness ran
  `program`, then the test, then printed a token). The program now runs in a process of its own and sends back
  data only; the verdict comes from the test's process."""
  program, statement = FORGERIES[trick]
  tests = json.dumps({"asserts": [statement]})
  result = code_reward(fenced(program), tests)
  assert result == 0.0 and result.cause in ("wrong_answer", "nonzero_exit", "exited_early"), result
  assert code_reward(fenced(HONEST.get(trick, "def f(x): return 2 * x")), tests) == 1.0


def test_the_judge_is_out_of_the_programs_reach(configured):
  """The judge is non-dumpable: the program cannot open its descriptors (the verdict's) or its memory through /proc;
  writing "ok" everywhere it can and exiting 0 is no verdict."""
  program = ("import os\nppid, hits = os.getppid(), []\nfor path in [f'/proc/{ppid}/fd/{n}' for n in range(3, 64)] + "
             "[f'/proc/{ppid}/mem']:\n  try:\n    with open(path, 'wb') as f:\n      f.write(b'ok\\n')\n"
             "    hits.append(path)\n  except OSError:\n    pass\nfor fd in range(3, 64):\n  try:\n"
             "    os.write(fd, b'ok\\n')\n  except OSError:\n    pass\nassert not hits, hits\nos._exit(0)\n"
             "def f(x): return 0")
  result = code_reward(fenced(program), json.dumps({"asserts": ["assert f(1) == 2"]}))
  # exited_early; or nonzero_exit when its "ok" landed on the pipe the judge reads replies from (not JSON)
  assert result == 0.0 and result.cause in ("exited_early", "nonzero_exit"), result


def test_program_functions_behave_as_in_one_process(configured):
  """What assert tests rely on still works across the two processes: builtin data both ways (tuples stay tuples,
  floats exact), keyword arguments, a starter's helpers, the program's exceptions caught by the test, module-level
  values of the program."""
  starter = "import math\n\ndef helper(x):\n  return x + 1\n\ndef g(a, b=0):\n  '''Stub: the program writes it.'''\n"
  program = ("  return (a, b, {1: {2, 3}}, b'x', 1.5, -0.0, None, True, 2**70, 1j)\n"
             "def boom(): raise KeyError('k')\nLIMIT = [1, (2, 3)]\n")
  statement = ("assert g(1, b=helper(1)) == (1, 2, {1: {2, 3}}, b'x', 1.5, -0.0, None, True, 2**70, 1j)\n"
               "assert type(g(1)[0]) is int and type(g(1)[4]) is float and math.copysign(1, g(1)[5]) == -1\n"
               "try:\n  boom()\n  assert False\nexcept KeyError:\n  pass\nassert LIMIT == [1, (2, 3)]")
  tests = json.dumps({"starter": starter, "program": "completion", "asserts": [statement]})
  result = code_reward(program, tests)
  assert (result, result.cause) == (1.0, "ok"), result
  # a starter's helper the program redefines is not what the test calls
  cheat = program + "def helper(x):\n  return 2\n"
  assert code_reward(cheat, tests) == 1.0  # g(1, b=helper(1)) uses the starter's helper: still b == 2
  wrong = code_reward(program.replace("(a, b,", "(a, b + 1,"), tests)
  assert (wrong, wrong.cause) == (0.0, "wrong_answer")


# --- through the reward pool: isolation "process", per-task dispatch, counted by cause ---------------------------

ESCAPES = {
    "read": ("print(open('/etc/hostname').read())", "nonzero_exit"),
    "write": (f"open({str(ROOT / 'escaped.txt')!r}, 'w').write('x')", "nonzero_exit"),
    "network": (CONNECT_SOCKET.format(port=22), "nonzero_exit"),
    "memory": ("x = bytearray(1 << 30)", "memory"),
    "loop": ("while True: pass", "cpu_limit"),
    "print": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", "output_limit"),
    "segfault": ("import ctypes; ctypes.string_at(0)", "killed"),
    "forks": ("import os, time\nwhile True:\n  if os.fork() == 0: time.sleep(1000)", "procs"),
    "huge": ("print('ok')\n#" + "x" * (2 << 20), "program_too_large"),  # a batch of these raised RewardError
}


def _group(task: str, answer: str, indices: list[int]) -> types.RolloutGroup:
  prompt = types.Prompt(f"{task}-{indices[0]}", "p", answer, np.zeros(1, np.int32), task)
  samples = tuple(types.Sample(prompt.prompt_id, prompt.tokens, np.array([i], np.int32), np.zeros(1, np.float32),
                               np.zeros(1, np.int32), np.zeros(1, bool), False, False) for i in indices)
  return types.RolloutGroup(prompt, samples)


def test_escapes_through_the_pool_are_scored_counted_and_the_run_goes_on(box):
  answer = stdio(["", "ok"])
  texts = [fenced(program) for program, _ in ESCAPES.values()] + [fenced("print('ok')"), "no program", "so|7"]
  n = len(ESCAPES)
  groups = [_group("code", answer, list(range(n))), _group("code", answer, [n, n + 1]), _group("math", "7", [n + 2])]
  cfg = RewardConfig(workers=2, timeout_s=60.0)
  with pytest.raises(ValueError, match="sandbox=cfg.sandbox"):
    make_reward_runner(cfg, {"math": "addition", "code": "code"})
  rewards = make_reward_runner(cfg, {"math": "addition", "code": "code"}, sandbox=LIMITS)
  assert rewards.runners["code"].isolation == "process" and rewards.runners["math"].isolation == "inline"
  with rewards:
    rewards.start()  # checks the sandbox, then starts the code workers
    scored = rewards.score_groups(groups, lambda tokens: texts[int(tokens[0])])
    np.testing.assert_array_equal(scored[0].rewards, np.zeros(n, np.float32))
    np.testing.assert_array_equal(scored[1].rewards, np.float32([1, 0]))
    np.testing.assert_array_equal(scored[2].rewards, np.float32([1]))
    metrics = rewards.metrics()
    expected = {}
    for _, cause in ESCAPES.values():
      expected[cause] = expected.get(cause, 0) + 1
    expected["ok"], expected["no_program"] = 1, 1
    assert {k[len("reward/code/cause/"):]: v for k, v in metrics.items()
            if k.startswith("reward/code/cause/")} == expected
    assert metrics["reward/calls"] == n + 3 and metrics["reward/code/calls"] == n + 2
    assert metrics["reward/errors"] == metrics["reward/timeouts"] == 0
    assert metrics["reward/code/sandbox_memory_cgroup"] == float(Sandbox(LIMITS).memory_bound().cgroup)
    assert metrics["reward/code/queue"] == n + 2 and metrics["reward/code/score_s"] > 0
    assert not (ROOT / "escaped.txt").exists()
    with pytest.raises(ConfigError, match="task 'poetry'.*code, math"):
      rewards.score_groups([_group("poetry", answer, [n])], lambda tokens: texts[int(tokens[0])])
    state = rewards.state()
  resumed = make_reward_runner(cfg, {"math": "addition", "code": "code"}, sandbox=LIMITS)
  resumed.load_state(json.loads(json.dumps(state)))
  assert resumed.metrics()["reward/code/cause/ok"] == 1


def test_the_pool_keeps_scoring_after_a_worker_is_killed(box):
  """A program that outlives reward.timeout_s (its own wall limit is longer) gets its worker killed by the
  pool; bubblewrap dies with the worker (--die-with-parent) and the next batch runs on a fresh worker."""
  marker = f"scalerl-sandbox-orphan-{os.getpid()}"
  slow = dataclasses.replace(LIMITS, wall_s=1000.0, cpu_s=1000.0)
  program = ("import subprocess, sys, time\ntry:\n"  # no new process where the memory bound is one address space
             f"  subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)  # {marker}'])\n"
             "except OSError:\n  pass\ntime.sleep(1000)")
  answer = stdio(["", "ok"])
  with RewardRunner(code_reward, timeout_s=2.0, workers=2, sandbox=slow) as runner:
    batch = runner.score_batch([fenced(program), fenced("print('ok')")], [answer, answer])
    assert batch.timed_out.tolist() == [True, False] and batch.rewards.tolist() == [0.0, 1.0]
    assert runner.metrics()["reward/killed_workers"] >= 1
    again = runner.score_batch([fenced("print('ok')")] * 4, [answer] * 4)
    assert again.rewards.tolist() == [1.0] * 4 and runner.metrics()["reward/cause/ok"] == 5
  checks = 0
  while [p for p in _cmdlines() if marker in p]:  # SIGKILL by --die-with-parent reaches it asynchronously
    checks += 1
    assert checks < 600, "a sandboxed program outlived its killed worker by 30 s"
    time.sleep(0.05)


def test_an_unusable_sandbox_refuses_to_start(box, monkeypatch):
  with pytest.raises(SandboxUnavailable, match="sandbox.python"):
    Sandbox(dataclasses.replace(LIMITS, python="/nonexistent/python3")).check_available()
  monkeypatch.setattr(sb.shutil, "which", lambda *a, **k: None)
  with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
    box.run("print(1)")
  runner = RewardRunner(code_reward, timeout_s=5.0, workers=1, sandbox=LIMITS)
  with pytest.raises(SandboxUnavailable, match="never run programs unsandboxed"):
    runner.start()
  assert not runner._pool.started
  with pytest.raises(ValueError, match="worker processes"):
    RewardRunner(code_reward, isolation="inline", sandbox=LIMITS)
