"""Compute accounting: the curve's x axis (accelerator-seconds of the generator and trainer meshes, analytic
FLOPs), with time that is not compute excluded: evaluation, checkpoints, and XLA compilation (jax reports every
trace / lowering / backend compile through jax.monitoring; `count_compilation` subtracts them, so a resumed run,
whose first steps recompile, does not book its restart as compute)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Optional

import jax

# the jax.monitoring duration events that together make one compilation
COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration",
                            "/jax/core/compile/backend_compile_duration"})


class ComputeMeter:
  """Cumulative compute: accelerator-seconds = wall time of the RL loop (evaluation and checkpointing excluded)
  x devices, split between generator and trainer meshes (by busy time when they share devices); analytic FLOPs
  of generation (forward) and training (forward + backward)."""

  def __init__(self, generator_devices: int, trainer_devices: int, colocated: bool, state: Optional[dict] = None):
    self.gen_devices, self.train_devices, self.colocated = generator_devices, trainer_devices, colocated
    self.load_state(state or {})

  def load_state(self, state: dict) -> None:
    """Continue the counters of a checkpoint's `state()` (a resumed run)."""
    self.wall_s = state.get("wall_s", 0.0)
    self.gen_flops = state.get("gen_flops", 0.0)
    self.train_flops = state.get("train_flops", 0.0)
    self.gen_busy_s = state.get("gen_busy_s", 0.0)
    self.train_busy_s = state.get("train_busy_s", 0.0)
    self._mark: Optional[float] = None
    self._excluded = 0.0
    self._lock = threading.Lock()  # compile events arrive from any thread
    self.compile_s = state.get("compile_s", 0.0)  # compilation excluded so far (for the record)

  def count_tokens(self, generated: int, trained: int, flops_per_token) -> None:
    """Analytic FLOPs of one step: `flops_per_token(backward)` per generated (forward) and trained (forward +
    backward) token."""
    self.gen_flops += generated * flops_per_token(False)
    self.train_flops += trained * flops_per_token(True)

  def start(self) -> None:
    self._mark, self._excluded = time.perf_counter(), 0.0

  def exclude(self, seconds: float) -> None:
    with self._lock:
      self._excluded += seconds

  @contextlib.contextmanager
  def count_compilation(self):
    """While inside, XLA compilation time (on any thread) is excluded from the wall time."""
    def listener(event: str, duration: float, **_) -> None:
      if event in COMPILE_EVENTS:
        self.exclude(duration)
        with self._lock:
          self.compile_s += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
      yield
    finally:
      jax.monitoring.unregister_event_duration_listener(listener)

  def tick(self) -> None:
    now = time.perf_counter()
    with self._lock:
      if self._mark is not None:
        self.wall_s += max(now - self._mark - self._excluded, 0.0)
      self._mark, self._excluded = now, 0.0

  def state(self) -> dict:
    return {"wall_s": self.wall_s, "gen_flops": self.gen_flops, "train_flops": self.train_flops,
            "gen_busy_s": self.gen_busy_s, "train_busy_s": self.train_busy_s, "compile_s": self.compile_s}

  def metrics(self) -> dict:
    if self.colocated:
      total = self.wall_s * self.train_devices
      share = self.gen_busy_s / max(self.gen_busy_s + self.train_busy_s, 1e-9)
      gen, train = total * share, total * (1 - share)
    else:
      gen, train = self.wall_s * self.gen_devices, self.wall_s * self.train_devices
    return {
        "compute/accelerator_seconds": gen + train,
        "compute/accelerator_hours": (gen + train) / 3600.0,
        "compute/generator_accelerator_seconds": gen,
        "compute/trainer_accelerator_seconds": train,
        "compute/flops": self.gen_flops + self.train_flops,
        "compute/generator_flops": self.gen_flops,
        "compute/trainer_flops": self.train_flops,
        "compute/wall_seconds": self.wall_s,
        "compute/compile_seconds_excluded": self.compile_s,
    }
