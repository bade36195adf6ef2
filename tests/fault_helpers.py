"""Helpers of tests/test_fault_injection.py: start launch/train.py as a child process (with failpoints armed through
SCALERL_FAULTS, scalerl_jax/faults.py), choose seeded kill points that the child is sure to reach, and read a run
directory's checkpoints, every one restored read-only as numpy (its metrics and consumed prompts:
tests/pipeline_helpers.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import random
import subprocess
import sys
from collections import Counter
from typing import Optional

import numpy as np

from tests.pipeline_helpers import TINY

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHILD_TIMEOUT_S = 300
SIGKILLED = -9  # subprocess returncode of a child that died of SIGKILL


# ---- running the child ------------------------------------------------------------------------------------------
def command(run_dir: pathlib.Path, overrides: list[str]) -> list[str]:
  return [sys.executable, str(ROOT / "launch" / "train.py"), f"run_dir={run_dir}", *TINY, *overrides]


def child_env(faults: Optional[str]) -> dict:
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SCALERL_FAULTS")}  # mesh.cpu_devices decides
  env["PYTHONUNBUFFERED"] = "1"
  env["PYTHONPATH"] = str(ROOT)  # the reward function lives in tests/ (user code on the user's path)
  env.setdefault("JAX_PLATFORMS", "cpu")
  # children reuse compiled executables across runs (start-up dominates these runs on 2 cores)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/scalerl_jax/jax_test_cache"))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  if faults:
    env["SCALERL_FAULTS"] = faults
  return env


def run_child(run_dir: pathlib.Path, overrides: list[str], faults: Optional[str], log_path: pathlib.Path) -> int:
  """Runs the training command to its end (or its failpoint); returns its returncode (-9: SIGKILLed)."""
  with open(log_path, "ab") as log:
    log.write(f"\n==== SCALERL_FAULTS={faults or ''} {' '.join(command(run_dir, overrides))}\n".encode())
    log.flush()
    proc = subprocess.Popen(command(run_dir, overrides), cwd=ROOT, env=child_env(faults), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
      return proc.wait(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      raise AssertionError(f"SCALERL_FAULTS={faults!r}: the child ran past {CHILD_TIMEOUT_S} s "
                           f"(hung?)\n{tail(log_path)}")


def tail(path: pathlib.Path, chars: int = 4000) -> str:
  return path.read_text(errors="replace")[-chars:] if path.exists() else ""


# ---- reading a run directory's checkpoints ------------------------------------------------------------------------
@dataclasses.dataclass
class Listing:
  """What a checkpoint directory holds right after a kill."""
  numbered: list[int]  # step directories (the only ones that may be taken for checkpoints)
  other: list[str]  # everything else (orbax's *.orbax-checkpoint-tmp* directories of an interrupted write, ...)
  latest: Optional[int]  # what RunCheckpointer.latest_step() (what a resume uses) says
  broken: dict[int, str]  # numbered directories that do not restore, with the error


def restore_numpy(step_dir: pathlib.Path) -> tuple[dict, dict]:
  """(TrainState as a tree of numpy arrays, meta) of one checkpoint directory, restored read-only."""
  import jax
  import orbax.checkpoint as ocp
  absl_log = logging.getLogger("absl")
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)  # "Metadata file does not exist" for a sub-item: expected, noise here
  try:
    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    item = ckptr.metadata(step_dir / "state").item_metadata
    tree = item.tree if hasattr(item, "tree") else item
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = ckptr.restore(step_dir / "state", args=ocp.args.PyTreeRestore(restore_args=restore_args))
    meta = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(step_dir / "meta")
  finally:
    absl_log.setLevel(level)
  return state, meta


def list_checkpoints(ckpt_dir: pathlib.Path) -> Listing:
  numbered, other, broken = [], [], {}
  if ckpt_dir.exists():
    for p in sorted(ckpt_dir.iterdir()):
      (numbered if p.name.isdigit() else other).append(int(p.name) if p.name.isdigit() else p.name)
  for step in numbered:
    try:
      state, meta = restore_numpy(ckpt_dir / str(step))
      if int(state["step"]) != step or int(meta["step"]) != step:
        broken[step] = f"holds step {int(state['step'])} / meta step {meta['step']}"
    except Exception as exc:  # noqa: BLE001 - reported by the caller
      broken[step] = f"{type(exc).__name__}: {exc}"
  latest = None
  if ckpt_dir.exists():
    from scalerl_jax.train.checkpoint import RunCheckpointer
    ckpt = RunCheckpointer(ckpt_dir, keep=100)
    latest = ckpt.latest_step()
    ckpt.close()
  return Listing(sorted(numbered), other, latest, broken)


def latest_step(ckpt_dir: pathlib.Path) -> int:
  """The step a resume starts from (0: no checkpoint, a fresh start)."""
  numbered = [int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()] if ckpt_dir.exists() else []
  return max(numbered, default=0)


def tree_mismatches(a, b, path: str = "") -> list[str]:
  """Paths where two trees of arrays differ (structure, shape, dtype or any bit); [] when bitwise equal."""
  if isinstance(a, dict) and isinstance(b, dict):
    if set(a) != set(b):
      return [f"{path}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
    return [m for k in sorted(a, key=str) for m in tree_mismatches(a[k], b[k], f"{path}/{k}")]
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    if len(a) != len(b):
      return [f"{path}: length {len(a)} != {len(b)}"]
    return [m for i, (x, y) in enumerate(zip(a, b)) for m in tree_mismatches(x, y, f"{path}[{i}]")]
  if a is None or b is None:
    return [] if a is None and b is None else [f"{path}: {a!r} != {b!r}"]
  x, y = np.asarray(a), np.asarray(b)
  if x.shape != y.shape or x.dtype != y.dtype:
    return [f"{path}: {x.shape} {x.dtype} != {y.shape} {y.dtype}"]
  if x.tobytes() != y.tobytes():
    diff = np.abs(x.astype(np.float64) - y.astype(np.float64)).max() if x.size else 0.0
    return [f"{path}: values differ (max abs diff {diff:.3g})"]
  return []


def lost_and_duplicated(reference: list[list[str]], got: list[list[str]]) -> tuple[int, int]:
  """(prompts of the reference never consumed, prompts consumed more often than in the reference: twice, or not
  at all in the reference)."""
  ref, seen = Counter(p for b in reference for p in b), Counter(p for b in got for p in b)
  return sum((ref - seen).values()), sum((seen - ref).values())


# ---- choosing where to kill -----------------------------------------------------------------------------------------
# the phases a kill targets, and the failpoint of each (scalerl_jax/faults.py)
POINTS = {"warm_start": "warm_start_step", "rollout": "rollout_step", "train_step": "train_step",
          "weight_sync": "weight_sync", "checkpoint_write": "checkpoint_save", "evaluation": "evaluate",
          "after_step": "step_end"}
CHECKPOINT_DELAYS_MS = (1, 5, 15, 30, 45, 60, 90, 150)  # a save of the tiny state takes ~40-80 ms when idle
OTHER_DELAYS_MS = (1, 5, 20)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a run does from its start, which the hit counts of a kill are relative to."""
  steps: int  # pipeline.steps
  every: int  # checkpoint.every_steps (= pipeline.eval_every in these tests)
  start: int  # the step it resumes from (0: fresh)
  warm_start_steps: int = 0  # supervised steps it takes first (0: none, or the warm start is cached)
  rollout_steps_per_batch: int = 1  # driver.step calls each batch surely needs
  window: int = 5  # a kill lands within this many steps of the start, so kills in a row spread over the run


def choose_fault(phase: str, plan: Plan, rng: random.Random) -> str:
  """A SCALERL_FAULTS spec that kills a run of `plan` during `phase`, with the hit count (and delay) drawn from
  `rng`. Every choice is a hit the run surely reaches; a delayed kill (+MS: it lands inside the work after the
  point, wherever MS takes it) comes with a backstop, the `step_end` point of the same step, which kills the run
  right after that step if the timer has not fired by then, so the run dies whatever the machine's speed."""
  point, remaining = POINTS[phase], min(plan.steps - plan.start, plan.window)
  assert remaining > 0, plan
  if phase == "warm_start":
    assert plan.warm_start_steps > 0, plan
    return f"{point}@{rng.randint(1, plan.warm_start_steps)}"
  if phase == "rollout":  # the generator thread, between decode chunks; no step_end mapping, so no delay
    return f"{point}@{rng.randint(1, remaining * plan.rollout_steps_per_batch)}"
  if phase == "after_step":
    return f"{point}@{rng.randint(1, remaining)}"
  if phase in ("train_step", "weight_sync"):  # both once per step in PipelineRL-k
    hit = rng.randint(1, remaining)
    step_end_hit = hit
  elif phase == "checkpoint_write":  # checkpoints after every `every` steps; the resume point is one of them
    hit = rng.randint(1, max(remaining // plan.every, 1))
    step_end_hit = hit * plan.every
  elif phase == "evaluation":  # a fresh run evaluates step 0 first (before any step), then every `every` steps
    first = int(plan.start == 0)
    hit = rng.randint(1, max(remaining // plan.every, 1) + first)
    step_end_hit = max(hit - first, 1) * plan.every if hit > first else 1
  else:
    raise ValueError(phase)
  delays = CHECKPOINT_DELAYS_MS if phase == "checkpoint_write" else OTHER_DELAYS_MS
  delay = rng.choice((0, *delays)) if phase == "checkpoint_write" else rng.choice((0, 0, *delays))
  if delay == 0:
    return f"{point}@{hit}"
  return f"{point}@{hit}+{delay},step_end@{step_end_hit}"


@contextlib.contextmanager
def tmpfs(path: pathlib.Path, options: str):
  """A tmpfs mounted at `path` (made here) with mount `options` (`size=2m`, `size=1m,ro`) while inside; the test
  is skipped where none can be mounted (mounting needs root)."""
  import pytest
  path.mkdir()
  if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                         capture_output=True).returncode != 0:
    pytest.skip("mounting a tmpfs needs root")
  try:
    yield path
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)
