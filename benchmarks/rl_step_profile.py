"""Where an RL step of the CPU default spends its time: host and device time per stage, per optimizer step.

    python benchmarks/rl_step_profile.py [--steps 80] [--skip 10] [override ...]

Runs the real job (`RLJob`, configs/cpu_default.yaml plus the dotted overrides) with a timer around each stage:

  admission    the driver refilling free decode slots (prompt padding, insert plan), prefill excluded
  prefill      Engine.prefill_insert (prompt forward + cache insert), blocked on so device time is inside
  decode       Engine.generate (the fused decode steps), blocked on, and the copy of its results to the host
  collect      the driver turning decode results into samples and finished groups
  reward       scoring the finished groups
  batch        pack_groups + rl.prepare + the zero-variance compaction (host numpy + one small jit)
  train        the jitted train step, blocked on
  weight_copy  publishing the new params into the rollout layout
  metrics      the step's metrics: device half read one step late, sinks, progress bar
  eval         held-out evaluation (every pipeline.eval_every steps)
  checkpoint   the orbax checkpoint (every checkpoint.every_steps steps)

Blocking on the prefill and decode calls removes the small overlap of host work with device work that the real
loop has (on one shared CPU device there is little). Prints each stage's median per step (ms), its share of the
median step, and writes benchmarks/results/rl_step_profile.json.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import pathlib
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.record import save_result  # noqa: E402
from scalerl_jax.config import load_config  # noqa: E402
from scalerl_jax.pipeline import step_metrics, weight_sync  # noqa: E402
from scalerl_jax.rollout import driver as driver_lib, engine as engine_lib  # noqa: E402
from scalerl_jax.run import job as job_lib, trainer as trainer_lib  # noqa: E402

STAGES = ("admission", "prefill", "decode", "collect", "reward", "batch", "train", "weight_copy", "metrics", "eval",
          "checkpoint")


class StageClock:
  """Exclusive seconds per stage (a stage timed inside another is taken out of the outer one, except inside eval,
  which keeps everything it runs), from any thread,
  accumulated between step boundaries; `close_step` files them."""

  def __init__(self):
    self._lock = threading.Lock()
    self._open = collections.Counter()
    self.steps: list[dict] = []
    self._local = threading.local()

  @contextlib.contextmanager
  def stage(self, name: str):
    stack = self._local.__dict__.setdefault("stack", [])
    if "eval" in stack:  # the evaluation's own prefill / decode / scoring count as eval
      yield
      return
    stack.append(name)
    t0 = time.perf_counter()
    try:
      yield
    finally:
      dt = time.perf_counter() - t0
      stack.pop()
      with self._lock:
        self._open[name] += dt
        if stack:
          self._open[stack[-1]] -= dt

  def close_step(self, wall_s: float) -> None:
    with self._lock:
      self.steps.append({**{s: self._open.get(s, 0.0) for s in STAGES}, "step": wall_s})
      self._open.clear()


def wrap(owner, name: str, clock: StageClock, stage: str, block: bool = False) -> Callable[[], None]:
  """Times `owner.name` as `stage` (blocking on its result when `block`); returns the undo."""
  fn = getattr(owner, name)

  @functools.wraps(fn)
  def timed(*args, **kwargs):
    with clock.stage(stage):
      out = fn(*args, **kwargs)
      return jax.block_until_ready(out) if block else out

  setattr(owner, name, timed)
  return lambda: setattr(owner, name, fn)


@contextlib.contextmanager
def instrumented(clock: StageClock):
  """Every stage of the job timed into `clock` while inside (class and module functions patched, then restored)."""
  E, D, J, T = engine_lib.Engine, driver_lib.RolloutDriver, job_lib.RLJob, trainer_lib.Trainer
  undo = [wrap(D, "_refill", clock, "admission"),  # its prefill call is timed inside it, as prefill
          wrap(E, "prefill_insert", clock, "prefill", block=True),
          wrap(E, "generate", clock, "decode", block=True),
          wrap(D, "_collect", clock, "collect"),
          wrap(J, "score", clock, "reward"),
          *(wrap(trainer_lib, name, clock, "batch") for name in ("pack_groups", "build_train_batch", "compact_groups")),
          wrap(weight_sync.WeightSync, "publish", clock, "weight_copy", block=True),
          wrap(step_metrics.StepLog, "hold", clock, "metrics"),
          wrap(step_metrics.StepLog, "flush", clock, "metrics"),
          wrap(J, "evaluate", clock, "eval"),
          wrap(J, "checkpoint", clock, "checkpoint")]
  step_for, consume = T.step_for, J.consume

  def timed_step_for(self, groups):
    fn = step_for(self, groups)

    def run(state, batch):
      with clock.stage("train"):
        return jax.block_until_ready(fn(state, batch))
    return run

  def timed_consume(self, batch, wait_s=0.0):
    t0 = time.perf_counter()
    out = consume(self, batch, wait_s)
    clock.close_step(time.perf_counter() - t0 + wait_s)
    return out

  T.step_for, J.consume = timed_step_for, timed_consume
  try:
    yield clock
  finally:
    T.step_for, J.consume = step_for, consume
    for restore in reversed(undo):
      restore()


def profile(config: str | pathlib.Path, steps: int, skip: int, overrides: Sequence[str] = ()) -> dict:
  """Runs `steps` steps of the job (`config` plus the dotted `overrides`, in a temporary run directory) with every
  stage timed: {overrides, steps, skip, summary (the job's), median_s, mean_s, untimed_mean_s, per_step} over the
  steps after the first `skip` (each per-step row: seconds per stage and the step's wall time)."""
  with tempfile.TemporaryDirectory() as tmp:
    cfg = load_config(config, [f"run_dir={tmp}/run", f"pipeline.steps={steps}", "curve_fit.bayes=false",
                               *overrides])
    with instrumented(StageClock()) as clock:
      summary = job_lib.RLJob(cfg, progress=False).run()
  rows = clock.steps[skip:]
  if not rows:
    raise SystemExit(f"{len(clock.steps)} of --steps {steps} ran ({summary}): none after --skip {skip}")
  med = {k: float(np.median([r[k] for r in rows])) for k in STAGES + ("step",)}
  mean = {k: float(np.mean([r[k] for r in rows])) for k in STAGES + ("step",)}
  return {"overrides": list(overrides), "steps": steps, "skip": skip, "summary": summary, "median_s": med,
          "mean_s": mean, "untimed_mean_s": mean["step"] - sum(mean[k] for k in STAGES), "per_step": rows}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default=str(ROOT / "configs/cpu_default.yaml"))
  parser.add_argument("--steps", type=int, default=80)
  parser.add_argument("--skip", type=int, default=10, help="first steps left out (compilation, warm-up)")
  parser.add_argument("--out", default=str(ROOT / "benchmarks/results/rl_step_profile.json"))
  parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. pipeline.max_lag=1")
  args = parser.parse_args()
  result = profile(args.config, args.steps, args.skip, args.overrides)
  med, mean, other = result["median_s"], result["mean_s"], result["untimed_mean_s"]
  print(f"{len(result['per_step'])} steps (first {args.skip} skipped); overrides: {' '.join(args.overrides) or '-'}")
  print(f"{'stage':12s} {'median ms':>10s} {'mean ms':>9s} {'share of mean step':>19s}")
  for k in STAGES + ("step",):
    print(f"{k:12s} {1e3 * med[k]:10.1f} {1e3 * mean[k]:9.1f} {mean[k] / mean['step']:19.1%}")
  print(f"{'(untimed)':12s} {'':10s} {1e3 * other:9.1f} {other / mean['step']:19.1%}")
  save_result(args.out, result)


if __name__ == "__main__":
  main()
