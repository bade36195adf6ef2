"""The assert tests' harness: runs INSIDE the sandbox as /sandbox/main.py (code.py sends this file's text), never
imported by the trainer. Two processes, so that the program cannot reach the verdict:

    judge (this script's process)                         program (forked before the test is read)
      reads program and starter (stdin), runs the
      starter, forks ----------------------------------->  closes the judge's descriptors, runs the program,
      reads the test (fd argv[1]), asks for the names          then answers requests: {"names": [...]},
      the test uses, runs the test with the real                {"call": name, "args": ..., "kwargs": ...}
      builtins; a program function is a stub that             -> values as tagged JSON of exact builtin types
      sends the call and decodes the reply
      all passed: writes "ok" to fd argv[2]

Why it holds: the program runs in another address space, so it can replace no builtin, frame or object of the
test; the judge is non-dumpable (prctl PR_SET_DUMPABLE 0), so /proc gives the program neither its memory nor its
descriptors; the test and the verdict descriptor reach the judge only (bubblewrap's PID 1 closes them, the program
closes its copies before running a line of its own, and the test is read after the fork, so no copy of it is in
the program's memory); what the program sends back is data, decoded into exact builtin types (a value with its own
__eq__ cannot cross). Names of the starter (the item's trusted prefix) come from the judge's own run of it, except
stubs (a function whose body is only a docstring or pass: the program's to write), so a program cannot redefine a
helper the test relies on (HumanEval's poly, encode_cyclic).

Without a memory cgroup the program's process applies to itself, first, the seccomp filter that refuses new
processes (argv[3], sandbox.py), and the judge caps its own address space at what it holds plus 64 MiB: the run
holds at most memory_mb (the program) plus that.

Exit statuses mirror the program's: a program that dies of a signal or exits non-zero makes the judge do the same
(cpu_limit, memory, ... keep their meaning); one that exits 0 before the tests ran leaves no verdict (exited_early).
An exception the program's function raised is raised again in the test as the builtin exception of that name
(else RuntimeError), so `pytest.raises`-style tests work and an uncaught one ends the judge with its traceback.
"""

import _ast
import _json
import os
import sys


class _Context(object):
  """What the C scanner of the json package reads (the json module itself imports re: 4 ms a run)."""
  strict = True
  object_hook = object_pairs_hook = None
  parse_float, parse_int = float, int
  parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__
  memo = None


_scan = _json.make_scanner(_Context())
_FLOATS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _dumps(value):
  """JSON text of None/bool/int/float/str and lists and str-keyed dicts of them (what _encode makes)."""
  kind = type(value)
  if value is None:
    return "null"
  if kind is bool:
    return "true" if value else "false"
  if kind is int:
    return int.__repr__(value)
  if kind is float:
    text = float.__repr__(value)
    return _FLOATS.get(text, text)
  if kind is str:
    return _json.encode_basestring_ascii(value)
  if kind is list:
    return "[" + ",".join([_dumps(v) for v in value]) + "]"
  if kind is dict:
    return "{" + ",".join([_json.encode_basestring_ascii(k) + ":" + _dumps(v) for k, v in value.items()]) + "}"
  raise TypeError("not JSON: %s" % kind.__name__)


def _loads(line):
  text = line.decode("utf-8").strip()
  value, end = _scan(text, 0)
  if end != len(text):
    raise ValueError("trailing data")
  return value


def _encode(value, depth=0):
  """Exact builtin types only (no subclasses): JSON for None/bool/int/float/str and lists, tagged objects for the
  rest."""
  if depth > 100:
    raise ValueError("nested too deeply")
  kind = type(value)
  if value is None or kind in (bool, int, float, str):
    return value
  if kind is list:
    return [_encode(v, depth + 1) for v in value]
  if kind is tuple:
    return {"t": [_encode(v, depth + 1) for v in value]}
  if kind is dict:
    return {"d": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]}
  if kind in (set, frozenset):
    return {"s" if kind is set else "f": [_encode(v, depth + 1) for v in value]}
  if kind is bytes:
    return {"b": value.hex()}
  if kind is complex:
    return {"c": [value.real, value.imag]}
  raise TypeError("cannot send a %s between the program and its tests (builtin data only)" % kind.__name__)


def _decode(data):
  kind = type(data)
  if data is None or kind in (bool, int, float, str):
    return data
  if kind is list:
    return [_decode(v) for v in data]
  if kind is dict and len(data) == 1:
    (tag, body), = data.items()
    if tag == "t":
      return tuple(_decode(v) for v in body)
    if tag == "d":
      return {_decode(k): _decode(v) for k, v in body}
    if tag == "s":
      return {_decode(v) for v in body}
    if tag == "f":
      return frozenset(_decode(v) for v in body)
    if tag == "b":
      return bytes.fromhex(body)
    if tag == "c":
      return complex(float(body[0]), float(body[1]))
  raise ValueError("malformed value from the program")


def _confine(filter_fd):
  """Applies the seccomp filter on `filter_fd` (sandbox.py: no new processes, without a memory cgroup) to this
  process before it runs a line of the program; exits when that fails (every test then fails)."""
  if filter_fd == "-":
    return
  import ctypes

  fd = int(filter_fd)
  data = b""
  while True:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      break
    data += chunk
  os.close(fd)

  class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

  prog = Program(len(data) // 8, data)
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    os.write(2, b"harness: cannot apply the seccomp filter to the program's process\n")
    os._exit(1)


def _serve(program, requests, replies):
  """The program's process: runs the program, then answers the judge until it closes the pipe."""
  scope = {"__name__": "__main__", "__builtins__": __builtins__}
  try:
    exec(compile(program, "program.py", "exec"), scope)
  except SystemExit as exc:
    code = exc.code
    os._exit(code if type(code) is int else (0 if code is None else 1))
  except BaseException:
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
  reader, writer = os.fdopen(requests, "rb"), os.fdopen(replies, "wb")
  for line in reader:
    request = _loads(line)
    try:
      if "names" in request:
        reply = {}
        for name in request["names"]:
          if name in scope and name != "__builtins__":
            value = scope[name]
            if type(value).__name__ == "module":
              reply[name] = ["module", value.__name__]
            elif callable(value):
              reply[name] = ["call"]
            else:
              reply[name] = ["value", _encode(value)]
        out = {"ok": reply}
      else:
        args, kwargs = _decode(request["args"]), _decode(request["kwargs"])  # a list and a dict
        out = {"ok": _encode(scope[request["call"]](*args, **kwargs))}
    except BaseException as exc:
      try:
        message = str(exc)
      except BaseException:
        message = ""
      out = {"raise": [type(exc).__name__, message[:2000]]}
    writer.write(_dumps(out).encode() + b"\n")
    writer.flush()
  os._exit(0)


def _nodes(tree):
  """Every node under `tree` (ast.walk without importing ast: 8 ms a run)."""
  stack = [tree]
  while stack:
    node = stack.pop()
    yield node
    for field in node._fields:
      value = getattr(node, field, None)
      if type(value) is list:
        stack.extend(v for v in value if isinstance(v, _ast.AST))
      elif isinstance(value, _ast.AST):
        stack.append(value)


def _trusted(starter):
  """The starter's names, from this process's own run of it: all but stubs (a function whose body is only a
  docstring or pass) and what its last statement binds (the program continues it). {} when the starter is not a
  program by itself (it ends inside a statement): every name is then the program's."""
  import builtins

  try:
    tree = compile(starter, "starter.py", "exec", _ast.PyCF_ONLY_AST)
    scope = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(tree, "starter.py", "exec"), scope)
  except BaseException:
    return {}
  functions = (_ast.FunctionDef, _ast.AsyncFunctionDef)
  stubs = set()
  for i, node in enumerate(tree.body):
    if i == len(tree.body) - 1 or (isinstance(node, functions) and all(
        isinstance(s, _ast.Pass) or (isinstance(s, _ast.Expr) and isinstance(s.value, _ast.Constant))
        for s in node.body)):
      for n in _nodes(node):
        if isinstance(n, _ast.Name) and isinstance(n.ctx, _ast.Store):
          stubs.add(n.id)
        elif isinstance(n, functions + (_ast.ClassDef,)):
          stubs.add(n.name)
        elif isinstance(n, (_ast.Import, _ast.ImportFrom)):
          stubs.update((a.asname or a.name).split(".")[0] for a in n.names)
  return {k: v for k, v in scope.items() if k not in stubs and not k.startswith("__")}


def _judge():
  import builtins
  import ctypes
  import resource

  test_fd, verdict_fd, filter_fd = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
    raise SystemExit("harness: prctl(PR_SET_DUMPABLE) failed")
  inputs = _loads(sys.stdin.buffer.read())
  program = inputs["program"]
  trusted = _trusted(inputs["starter"])  # before the fork: the modules it imports are the program's too
  import gc

  gc.freeze()  # the objects made so far stay out of the collector's way: fewer pages copied after the fork
  requests_r, requests_w = os.pipe()  # judge -> program
  replies_r, replies_w = os.pipe()  # program -> judge
  pid = os.fork()
  if pid == 0:
    for fd in (test_fd, verdict_fd, requests_w, replies_r):
      os.close(fd)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    _confine(filter_fd)
    _serve(program, requests_r, replies_w)
  os.close(requests_r)
  os.close(replies_w)
  if filter_fd != "-":
    os.close(int(filter_fd))
  del program, inputs
  # the judge's own memory: what it has now and 64 MiB for the program's replies (the program has memory_mb)
  with open("/proc/self/statm") as f:
    size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + (64 << 20)
  resource.setrlimit(resource.RLIMIT_AS, (size, size))
  chunks = []
  while True:
    chunk = os.read(test_fd, 1 << 16)
    if not chunk:
      break
    chunks.append(chunk)
  os.close(test_fd)
  spec = _loads(b"".join(chunks))
  writer, reader = os.fdopen(requests_w, "wb"), os.fdopen(replies_r, "rb")

  def finish_like_the_program():
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
      import signal

      sig = os.WTERMSIG(status)
      signal.signal(sig, signal.SIG_DFL)
      os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)

  def ask(request):
    try:
      writer.write(_dumps(request).encode() + b"\n")
      writer.flush()
      line = reader.readline()
    except BrokenPipeError:
      line = b""
    if not line:  # the program ended: end as it did
      finish_like_the_program()
    reply = _loads(line)
    if type(reply) is not dict:
      raise ValueError("malformed reply from the program")
    if "raise" in reply:
      name, message = str(reply["raise"][0]), str(reply["raise"][1])
      kind = getattr(builtins, name, None)
      try:
        error = kind(message) if isinstance(kind, type) and issubclass(kind, Exception) else None
      except Exception:
        error = None
      raise error if error is not None else RuntimeError("%s: %s" % (name, message))
    return reply["ok"]

  class Remote(object):
    """A function of the program: each call runs there; only the builtin data it returns comes back."""
    __slots__ = ("name",)

    def __init__(self, name):
      self.name = name

    def __call__(self, *args, **kwargs):
      return _decode(ask({"call": self.name, "args": _encode(list(args)), "kwargs": _encode(dict(kwargs))}))

    def __repr__(self):
      return "<program function %s>" % self.name

  test = compile(spec["test"], "test.py", "exec")
  names = set()
  stack = [test]
  while stack:
    code = stack.pop()
    names.update(code.co_names)
    stack.extend(c for c in code.co_consts if type(c) is type(test))
  wanted = sorted(n for n in names if n not in trusted and not hasattr(builtins, n))
  scope = {"__name__": "__main__", "__builtins__": builtins}
  for name, how in ask({"names": wanted}).items():
    if how[0] == "call":
      scope[name] = Remote(name)
    elif how[0] == "value":
      scope[name] = _decode(how[1])
    elif how[0] == "module" and how[1] in getattr(sys, "stdlib_module_names", ()):
      __import__(how[1])
      scope[name] = sys.modules[how[1]]
  scope.update(trusted)
  exec(test, scope)
  os.write(verdict_fd, b"ok\n")
  writer.close()
  os.waitpid(pid, 0)


if __name__ == "__main__":
  _judge()
