"""Whole-run checkpoints with orbax: the sharded TrainState plus a JSON record of everything else.

A checkpoint at step s holds params, optimizer state and step (sharded arrays, restored straight into their
shardings), and `meta`: policy version, RNG seed, the data pipeline's state *at the boundary of batch s* (so a
resumed run continues the same prompt order: nothing lost, nothing twice), NPR state, compute counters, the number
of metric lines written, the config values a resume must not change (`config_fingerprint`) and a checksum of every
state array (`state_digest`, added by `save`).

Faults, and what each one does:
  - kill during a write: orbax writes `<step>.orbax-checkpoint-tmp` and renames it on commit, so the previous
    checkpoint stays the latest; `remove_orphans()` deletes such leftovers at start-up.
  - write failure (a full disk): `save` removes the partial directory and raises CheckpointError naming the step,
    the cause and the checkpoint that remains.
  - damage (truncated, zeroed or garbled files, invalid JSON, a missing item): `restore_latest_intact` warns and
    falls back to the next older checkpoint; the damaged ones are moved aside to `<step>.damaged` so the resumed
    run can write those steps again. Tensorstore's own checks miss some garbled bytes (a flipped byte in a large
    array can decode silently), so every restored array is checked against `state_digest`.
  - a different configuration: ResumeError at once naming each changed key with its old and new value.
Restore reads only orbax arrays (tensorstore) and JSON: nothing in a checkpoint is unpickled or evaluated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import sys
import threading
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from scalerl_jax.config import MOVED, PATH_KEYS, RunConfig
from scalerl_jax.errors import UserError

log = logging.getLogger(__name__)
try:  # the class of orbax's background writer threads (private: absent in another orbax version, then not joined)
  from orbax.checkpoint._src.futures.future import _SignalingThread as _OrbaxThread
except ImportError:
  _OrbaxThread = None

# Config groups a resume must keep (shapes, data order, objective, update rule). Not in the fingerprint, so they
# may change on resume: pipeline (steps, cadence), logging, checkpoint, rollout, mesh, and trainer: micro-batching
# and the shared-prompt loss compute the same loss and gradient (the loss is normalised by global counts and
# summed over micro-batches; tests/test_train_step.py checks micro-batched == full batch), so a resume may trade
# memory for time; max_skipped_steps is a stop rule.
_FINGERPRINT_GROUPS = ("model", "lora", "data", "reward", "loss", "optimizer")
# Keys inside those groups that may change: NPR (a run whose NPR removed every prompt must be able to continue
# with NPR off) and the number of reward worker processes (parallelism only).
_MAY_CHANGE = ("data.npr.", "reward.workers")
TMP_MARKER = ".orbax-checkpoint-tmp"  # orbax's suffix of a directory being written (before the commit rename)
DAMAGED_SUFFIX = ".damaged"
DIGEST_KEY = "state_digest"
_START_OVER = "start over with a new run_dir or checkpoint.resume=false"


class ResumeError(UserError, RuntimeError):
  """A checkpoint this run cannot resume from (none intact, or written with a different configuration)."""


class CheckpointError(UserError, RuntimeError):
  """A checkpoint could not be written (a full disk, an I/O error); the previous checkpoint is untouched."""


class _Damaged(Exception):
  def __init__(self, where: str, why: str):  # the file or item, and what is wrong with it
    super().__init__(f"{where}: {why}")


# ---- configuration fingerprint -------------------------------------------------------------------------
def _flatten(prefix: str, value: Any, out: dict) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      _flatten(f"{prefix}.{k}", v, out)
  else:
    out[prefix] = json.loads(json.dumps(value, default=str))  # the value as JSON gives it back (tuples: lists)


def config_fingerprint(cfg: RunConfig) -> dict[str, Any]:
  """The values (not hashes) of every config key a resume must not change, by dotted key."""
  out: dict[str, Any] = {}
  for group in _FINGERPRINT_GROUPS:
    _flatten(group, dataclasses.asdict(getattr(cfg, group)), out)
  # without adapters (lora.rank = 0) the other lora keys describe nothing the run trained
  off = ("lora.",) if cfg.lora.rank == 0 else ()
  return {k: v for k, v in out.items() if not any(k == m or k.startswith(m) for m in _MAY_CHANGE)
          and (k == "lora.rank" or not k.startswith(off))}


def _legacy_fingerprint(cfg: RunConfig) -> dict:
  """What checkpoints written before per-key fingerprints stored (hashes of whole groups)."""
  out: dict[str, Any] = {name: hashlib.sha256(json.dumps(dataclasses.asdict(getattr(cfg, name)), sort_keys=True,
                                                         default=str).encode()).hexdigest()[:16]
                         for name in ("model", "data", "loss")}
  return {**out, "optimizer": {"b1": cfg.optimizer.b1, "b2": cfg.optimizer.b2, "grad_clip": cfg.optimizer.grad_clip}}


def _text(v: Any) -> str:
  return v if isinstance(v, str) else repr(v)


def fingerprint_changes(saved: dict, cfg: RunConfig) -> list[str]:
  """`key: old -> new` for every fingerprinted key whose value differs from the checkpoint's."""
  if isinstance(saved.get("model"), str):  # the legacy format: one hash per group
    now, changes = _legacy_fingerprint(cfg), []
    for group in ("model", "data", "loss"):
      if saved.get(group) != now[group]:
        changes.append(f"{group}.* (a checkpoint from before per-key fingerprints: which {group} key is unknown)")
    changes += [f"optimizer.{k}: {_text(v)} -> {_text(now['optimizer'][k])}"
                for k, v in saved.get("optimizer", {}).items() if now["optimizer"].get(k) != v]
    return changes
  saved = {MOVED.get(k, k): v for k, v in saved.items()}  # a checkpoint from before a key moved: its new name
  now, defaults = config_fingerprint(cfg), config_fingerprint(RunConfig())
  changes = []
  for key, value in now.items():
    if key not in saved and key not in defaults:  # lora.* beyond lora.rank of a run without adapters: the rank says it
      continue
    # a key the checkpoint does not know was added to the config later: it had its default value then
    old = saved.get(key, defaults.get(key))
    if key in PATH_KEYS and isinstance(old, str) and old and os.path.abspath(os.path.expanduser(old)) == value:
      continue  # a relative path, as checkpoints stored them before RLJob made them absolute
    if old != value:
      changes.append(f"{key}: {_text(old) if key in saved else f'(default) {_text(old)}'} -> {_text(value)}")
  return changes


# ---- state checksum ------------------------------------------------------------------------------------
def _leaf_digest(x: jax.Array) -> jax.Array:
  """sum_i (2 i + 1) * word_i mod 2^32 over the array's bits as uint32 words: any one changed word (an odd
  multiplier is invertible mod 2^32), a zeroed block or moved data changes it. Elementwise then one reduction,
  so it runs on sharded arrays in place, and integer addition makes it independent of the sharding."""
  size = x.dtype.itemsize
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  elif size == 8:
    words = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
  else:
    words = jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]).astype(jnp.uint32)
  index, stride = jnp.zeros(words.shape, jnp.uint32), 1
  for d in reversed(range(words.ndim)):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, d) * jnp.uint32(stride % 2**32)
    stride *= words.shape[d]
  return jnp.sum(words * (index * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)


_digest_fn = jax.jit(lambda tree: jax.tree.map(_leaf_digest, tree))


def state_digest(state: Any) -> dict[str, int]:
  """{array path: checksum} of every array of `state` (computed on device; one small jit per state layout)."""
  sums = _digest_fn(state)
  return {jax.tree_util.keystr(path): int(np.asarray(leaf.addressable_shards[0].data))
          for path, leaf in jax.tree_util.tree_flatten_with_path(sums)[0]}


def params_checksum(tree: Any) -> str:
  """One hex checksum of a tree of arrays, independent of their sharding and of which processes hold them."""
  return hashlib.sha256(json.dumps(state_digest(tree), sort_keys=True).encode()).hexdigest()[:16]


# ---- describing failures -------------------------------------------------------------------------------
def _one_line(text: str, limit: int = 300) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _chain(exc: Optional[BaseException]) -> list[BaseException]:
  """The exception and its causes, outermost first."""
  chain: list[BaseException] = []
  while exc is not None and all(exc is not e for e in chain):
    chain.append(exc)
    exc = exc.__cause__ or exc.__context__
  return chain


def _root_cause(exc: BaseException) -> str:
  """The most telling line of an exception chain: an OS error's text (tensorstore reports one as
  `[os_error_code='28']`), else the first exception's own message."""
  chain = _chain(exc)
  for e in chain:
    if isinstance(e, OSError) and e.errno:
      return os.strerror(e.errno) + (f" ({e.filename})" if e.filename else "")
  for e in chain:
    if m := re.search(r"os_error_code='?(\d+)", str(e)):
      return os.strerror(int(m.group(1)))
  return _one_line(f"{type(chain[0]).__name__}: {chain[0]}")


def _bad_json_file(directory: pathlib.Path) -> Optional[tuple[str, str]]:
  """The first JSON file orbax reads in item `directory` (<step>/<item>) that does not parse, and why."""
  for f in sorted(directory.rglob("*")):
    if f.is_file() and (f.name in ("_METADATA", "metadata") or f.parent.name == "array_metadatas"):
      try:
        json.loads(f.read_bytes())
      except (ValueError, UnicodeDecodeError) as exc:
        return str(f.relative_to(directory.parents[1])), f"invalid JSON ({_one_line(exc, 120)})"
  return None


def _describe_state_error(step_dir: pathlib.Path, exc: Exception) -> _Damaged:
  """Names the file and the problem: tensorstore's messages nest every layer it opened, `CODE: ... local file
  "PATH": problem [tensorstore_spec=...]`; the code, the array, the innermost file and its problem are the news."""
  if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)) and (bad := _bad_json_file(step_dir / "state")):
    return _Damaged(*bad)
  exc = next((e for e in _chain(exc) if re.match(r"[A-Z_]+: ", str(e))), exc)  # tensorstore's status, if any
  text = str(exc).split(" [tensorstore_spec")[0]
  files = re.findall(r'local file "([^"]+)"', text)
  if not files:
    return _Damaged(f"{step_dir.name}/state", _one_line(f"{type(exc).__name__}: {text}", 240))
  where = files[-1]
  with contextlib.suppress(ValueError):
    where = str(pathlib.Path(where).relative_to(step_dir.parent))
  code = re.match(r"([A-Z_]+): ", text)
  array = re.search(r'Error reading "([^"/]+)/', text)
  why = text.rsplit(f'local file "{files[-1]}"', 1)[1].lstrip(": ")
  why = (f"{code.group(1)}: " if code else "") + (why or text) + (f" (reading array {array.group(1)})" if array else "")
  return _Damaged(where, _one_line(why, 240))


_quiet = False


def _quiet_orbax_aftermath() -> None:
  """After a damaged read, tensorstore completes orbax's other pending reads on an event loop orbax has closed:
  Python prints each as an unraisable "Event loop is closed" traceback and asyncio logs each lost error as "never
  retrieved". Both are noise once the first failure is reported; drop exactly those (installed once)."""
  global _quiet
  if _quiet:
    return
  _quiet = True
  logging.getLogger("asyncio").addFilter(
      lambda r: not ("never retrieved" in (m := r.getMessage()) and ("orbax" in m or "tensorstore" in m)))
  previous = sys.unraisablehook

  def hook(unraisable):
    exc = unraisable.exc_value
    if not (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"):
      previous(unraisable)

  sys.unraisablehook = hook


class _OrbaxErrorsHeld(logging.Filter):
  """While a save runs, what orbax logs at WARNING or above (through absl's logger: each writer thread that fails
  logs its whole traceback, about 40 lines, and a full disk fails them all) is held back: dropped when the save
  fails (the CheckpointError says it in one line; the texts go to DEBUG), logged as usual when it succeeds."""

  def __init__(self):
    super().__init__()
    self.records: list[logging.LogRecord] = []
    self.failed = False
    self._logger = logging.getLogger("absl")

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno >= logging.WARNING and f"{os.sep}orbax{os.sep}" in record.pathname:
      self.records.append(record)
      return False
    return True

  def __enter__(self) -> "_OrbaxErrorsHeld":
    self._logger.addFilter(self)
    return self

  def __exit__(self, *exc) -> None:
    self._logger.removeFilter(self)
    for record in self.records:
      if self.failed:
        log.debug("orbax, during the failed write: %s", record.getMessage())
      else:
        self._logger.handle(record)


# ---- the checkpointer ----------------------------------------------------------------------------------
class RunCheckpointer:
  """Saves and restores whole-run checkpoints in `directory` (one orbax step directory per checkpoint)."""

  def __init__(self, directory: str | pathlib.Path, keep: int, processes: Optional[Sequence[int]] = None):
    """`processes`: the processes that hold the train state and write it together (each its own shards; process
    processes[0] writes the JSON record); None = every process."""
    self.directory = pathlib.Path(directory).absolute()
    self.processes = list(range(jax.process_count())) if processes is None else list(processes)
    subset = len(self.processes) < jax.process_count()
    multiprocessing = ocp.options.MultiprocessingOptions(
        primary_host=self.processes[0], active_processes=set(self.processes) if subset else None,
        barrier_sync_key_prefix="scalerl_jax_train" if subset else None)
    if subset and jax.process_index() == self.processes[0]:
      self.directory.mkdir(parents=True, exist_ok=True)  # (orbax creates it only when every process takes part)
    self._mgr = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=not subset,
                                                             enable_async_checkpointing=False,
                                                             multiprocessing_options=multiprocessing))

  def latest_step(self) -> Optional[int]:
    return self._mgr.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._mgr.all_steps())

  def remove_orphans(self) -> list[pathlib.Path]:
    """Deletes the temporary directories a killed or interrupted save left behind (never committed, so never
    listed as checkpoints). Call it only while holding the run directory's lock: a live run's save in progress
    looks the same."""
    removed = []
    if jax.process_index() == 0 and self.directory.is_dir():
      for path in sorted(self.directory.iterdir()):
        if TMP_MARKER in path.name:
          shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
          log.warning("removed %s: a checkpoint write that never finished (the process was killed or interrupted "
                      "during the save)", path)
          removed.append(path)
    return removed

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Writes checkpoint `step` atomically. On failure the partial directory is removed, the previous checkpoint
    is untouched, and CheckpointError says what happened."""
    meta = {**meta, DIGEST_KEY: state_digest(state)}
    if jax.process_count() > 1 and all(x.is_fully_addressable for x in jax.tree.leaves(state)):
      # one trainer process among several (disaggregated): it holds the whole state, and orbax takes arrays held
      # by one process only as host-local numpy
      state = jax.device_get(state)
    with _OrbaxErrorsHeld() as held:
      try:
        self._mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)), force=True)
        self._mgr.wait_until_finished()
      except Exception as exc:  # noqa: BLE001 (every write failure becomes one CheckpointError)
        held.failed = True
        raise self._save_failed(step, exc) from exc

  def _save_failed(self, step: int, exc: Exception) -> CheckpointError:
    # orbax raises the first failure while its other writer threads may still be writing into the directory
    deadline = time.monotonic() + 60
    for t in threading.enumerate():
      if _OrbaxThread is not None and isinstance(t, _OrbaxThread) and t is not threading.current_thread():
        threading.Thread.join(t, max(0.0, deadline - time.monotonic()))  # (its own join re-raises its error)
    if jax.process_index() == 0:
      # writers that are not orbax threads (tensorstore's) may still create files for a moment: remove until the
      # partial directory stays gone for two looks in a row (at most ~5 s)
      quiet = 0
      for _ in range(50):
        partial = list(self.directory.glob(f"{step}{TMP_MARKER}*"))
        for path in partial:
          shutil.rmtree(path, ignore_errors=True)
        quiet = 0 if partial else quiet + 1
        if quiet >= 2:
          break
        time.sleep(0.1)
    with contextlib.suppress(Exception):  # else the listing below is what the manager knew
      self._mgr.reload()
    steps = self._mgr.all_steps()
    earlier = [s for s in steps if s < step]
    remains = ("it was committed before the failure" if step in steps else
               f"checkpoint {max(earlier)} is untouched and a restart resumes from it" if earlier else
               "no earlier checkpoint exists")
    cause = _root_cause(exc)
    hint = "; free space there and run the same command again" if cause.startswith(os.strerror(errno.ENOSPC)) else ""
    return CheckpointError(f"checkpoint {step} could not be written to {self.directory} ({cause}); "
                           f"{remains}{hint}")

  def _read_meta(self, step: int) -> dict:
    step_dir = self.directory / str(step)
    for item in ("meta", "state"):
      if not (step_dir / item).is_dir():
        raise _Damaged(f"{step}/{item}", "item directory is missing")
    try:
      meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    except Exception as exc:  # noqa: BLE001
      if isinstance(exc, (ValueError, UnicodeDecodeError)) and (bad := _bad_json_file(step_dir / "meta")):
        raise _Damaged(*bad) from None
      raise _Damaged(f"{step}/meta", _one_line(f"{type(exc).__name__}: {exc}", 240)) from None
    problem = (f"holds a JSON {type(meta).__name__}, not an object" if not isinstance(meta, dict) else
               f"says step {meta.get('step')!r}" if meta.get("step", step) != step else
               "has no configuration fingerprint" if not isinstance(meta.get("fingerprint"), dict) else None)
    if problem:
      raise _Damaged(f"{step}/meta/metadata", problem)
    return meta

  def _read_state(self, step: int, abstract_state: Any, meta: dict) -> Any:
    try:
      state = self._mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))).state
    except Exception as exc:  # noqa: BLE001
      raise _describe_state_error(self.directory / str(step), exc) from None
    saved = meta.get(DIGEST_KEY)
    if isinstance(saved, dict):  # checkpoints written before the checksum have none
      now = state_digest(state)
      bad = [k.lstrip(".") for k in now if saved.get(k) != now[k]]
      if bad:
        what = f"array {bad[0]} differs" if len(bad) == 1 else f"arrays {bad[0]} and {len(bad) - 1} more differ"
        raise _Damaged(f"{step}/state", f"{what} from the checksum written at save (corrupted data)")
    return state

  def _check_config(self, step: int, meta: dict, cfg: RunConfig) -> None:
    changes = fingerprint_changes(meta["fingerprint"], cfg)
    if changes:
      raise ResumeError(f"checkpoint {self.directory}/{step} was written with a different configuration: "
                        f"{', '.join(changes)}; resume with the same settings, or {_START_OVER}")

  def restore(self, abstract_state: Any, cfg: RunConfig, step: Optional[int] = None) -> tuple[Any, dict]:
    """Restores exactly checkpoint `step` (default: the latest) into the shardings carried by `abstract_state`
    (ShapeDtypeStructs with .sharding); a damaged one raises ResumeError (no fallback: see
    `restore_latest_intact`)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise ResumeError(f"no checkpoint in {self.directory}")
    _quiet_orbax_aftermath()
    try:
      meta = self._read_meta(step)
      self._check_config(step, meta, cfg)
      return self._read_state(step, abstract_state, meta), meta
    except _Damaged as d:
      raise ResumeError(f"checkpoint {self.directory}/{step} is damaged ({d}); {_START_OVER}") from None

  def restore_latest_intact(self, abstract_state: Any, cfg: RunConfig) -> Optional[tuple[int, Any, dict]]:
    """(step, state, meta) of the newest checkpoint that reads back intact, or None if there is none at all.

    A damaged checkpoint logs a warning naming the step, the file or item and what is wrong, and the next older
    one is tried; the damaged ones newer than the one restored are moved aside (`<step>.damaged`). A checkpoint
    written with a different configuration raises ResumeError at once (that is not damage); so does finding no
    intact checkpoint, listing each one and why it failed.
    """
    _quiet_orbax_aftermath()
    self._mgr.reload()
    steps = sorted(self._mgr.all_steps(), reverse=True)
    if not steps:
      return None
    failures: list[tuple[int, _Damaged]] = []
    for step in steps:
      try:
        meta = self._read_meta(step)
        self._check_config(step, meta, cfg)
        state = self._read_state(step, abstract_state, meta)
      except _Damaged as d:
        failures.append((step, d))
        log.warning("checkpoint %d in %s is damaged: %s; %s", step, self.directory, d,
                    "trying the previous one" if step != steps[-1] else "no older checkpoint to try")
        continue
      if failures:
        self._set_aside([s for s, _ in failures])
        log.warning("resuming from checkpoint %d instead of the damaged %s", step,
                    ", ".join(str(s) for s, _ in failures))
      return step, state, meta
    listing = "; ".join(f"checkpoint {s}: {d}" for s, d in failures)
    raise ResumeError(f"no intact checkpoint in {self.directory} ({listing}); {_START_OVER}")

  def _set_aside(self, steps: list[int]) -> None:
    """Renames damaged step directories to `<step>.damaged[.n]` (kept for inspection, invisible to orbax)."""
    if jax.process_count() > 1:
      # every process is done reading them
      ocp.multihost.sync_global_processes("scalerl_jax:set_aside_damaged", processes=set(self.processes))
    if jax.process_index() == 0:
      for step in steps:
        src, n = self.directory / str(step), 0
        while (dst := self.directory / (f"{step}{DAMAGED_SUFFIX}" + (f".{n}" if n else ""))).exists():
          n += 1
        src.rename(dst)
        log.warning("moved the damaged checkpoint %s aside to %s (delete it once inspected)", src, dst)
    if jax.process_count() > 1:
      ocp.multihost.sync_global_processes("scalerl_jax:set_aside_done", processes=set(self.processes))
    self._mgr.reload()

  def close(self) -> None:
    self._mgr.close()
