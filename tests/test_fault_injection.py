"""Fault injection: kill -9 a short training run at seeded failpoints in every phase, resume it, and check that no
data or progress was lost (issue 18, Deliver 1 and 2).

Each scenario starts launch/train.py (the tiny config of tests/pipeline_helpers.py, the default CPU devices) as a child
process with SCALERL_FAULTS set to a seeded choice of (failpoint, hit count, delay) in one phase (warm start,
rollout, train step, checkpoint write, weight sync, evaluation; scalerl_jax/faults.py), asserts that it died of
SIGKILL (a child that exits by itself means the scenario chose a point the run never reaches), checks the
checkpoint directory the kill left, and does that again (several kills in a row), then resumes with the same command
and no faults until it finishes. Then, against an uninterrupted run of the same config:
  - the consumed prompt-id sequence is the same, step by step (no prompt lost, none trained twice);
  - metrics.jsonl has steps 0..N, each once, in order;
  - after every kill, every numbered checkpoint directory restores (temporary directories of an interrupted write
    may exist but are never taken for a checkpoint) and, with k = 0, equals the uninterrupted run's checkpoint of
    that step bit for bit;
  - with k = 0 (deterministic), the final params and optimizer state and every step's metrics that do not measure
    time (rewards, losses, evaluations, FLOPs, ...) equal the uninterrupted run's bit for bit;
  - with PipelineRL-k, k = 2: rollouts generated but not yet trained when the run dies (or when its last checkpoint
    was written) are regenerated after the resume from the same prompts in the same order: the consumed sequence
    equals an uninterrupted k = 2 run's (params need not be bitwise equal: which version generated a token depends
    on the threads' timing).
Kill points are failpoints (deterministic); a +MS delay only chooses where inside the following work (e.g. the
orbax write) the kill lands, and comes with a backstop failpoint at the end of the same step, so whether the run
dies never depends on the machine's speed.

The default (CI) set is reduced: one k = 0 scenario with a kill in each RL phase, one warm-start kill, one k = 2
scenario with two kills (about 15 child runs). The full set (more seeds, more kills, every phase several times):

    SCALERL_FAULTS_FULL=1 .venv/bin/python -m pytest -q tests/test_fault_injection.py

With SCALERL_FAULTS_REPORT=path.json the module writes what it injected and what survived (one record per
scenario) to that file at the end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import time

import pytest

from tests import fault_helpers as fh
from tests.pipeline_helpers import read_consumed, read_metrics

FULL = os.environ.get("SCALERL_FAULTS_FULL") == "1"
STEPS = 8  # RL steps of the k = 0 and k = 2 runs
EVERY = 2  # checkpoint.every_steps = pipeline.eval_every
WARM_STEPS = 4  # RL steps of the warm-start runs
WARM_START_STEPS = 6  # supervised steps (target pass rate 1.0: never reached, so always all of them)
ROLLOUT_STEPS_PER_BATCH_K0 = 2  # a k = 0 batch of the tiny config takes 3 decode chunks; 2 leaves a margin

RL_PHASES = ("rollout", "train_step", "weight_sync", "checkpoint_write", "evaluation")


def _overrides(kind: str, tmp: pathlib.Path, keep: int = 2) -> list[str]:
  common = [f"checkpoint.every_steps={EVERY}", f"pipeline.eval_every={EVERY}", f"checkpoint.keep={keep}"]
  if kind == "k0":
    return [*common, "pipeline.max_lag=0", f"pipeline.steps={STEPS}"]
  if kind == "k2":
    return [*common, "pipeline.max_lag=2", f"pipeline.steps={STEPS}"]
  if kind == "warm":
    return [*common, "pipeline.max_lag=0", f"pipeline.steps={WARM_STEPS}", "warm_start.enabled=true",
            f"warm_start.max_steps={WARM_START_STEPS}", "warm_start.batch_size=16", "warm_start.eval_every=2",
            "warm_start.target_pass_rate=1.0", f"warm_start.cache_dir={tmp / 'warm_start_cache'}"]
  raise ValueError(kind)


def _steps(kind: str) -> int:
  return WARM_STEPS if kind == "warm" else STEPS


# ---- scenarios ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Scenario:
  kind: str  # k0 | k2 | warm
  name: str
  phases: tuple[str, ...]  # one kill per entry, in this order, then a run to the end without faults
  seed: int

  @property
  def id(self) -> str:
    return f"{self.kind}-{self.name}-s{self.seed}"


def _shuffled(phases, seed) -> tuple[str, ...]:
  out = list(phases)
  random.Random(f"order-{seed}").shuffle(out)
  return tuple(out)


REDUCED_K0 = [Scenario("k0", "each-phase", _shuffled(RL_PHASES, 0), 0)]
REDUCED_WARM = [Scenario("warm", "warm-start", ("warm_start",), 0)]
REDUCED_K2 = [Scenario("k2", "buffered", ("train_step", "rollout"), 0)]

FULL_K0 = REDUCED_K0 + [
    Scenario("k0", "each-phase", _shuffled((*RL_PHASES, "after_step"), s), s) for s in (1, 2, 3)] + [
    Scenario("k0", f"3x-{phase}", (phase,) * 3, 10 + i) for i, phase in enumerate((*RL_PHASES, "after_step"))]
FULL_WARM = REDUCED_WARM + [
    Scenario("warm", "warm-start-twice", ("warm_start", "warm_start"), 1),
    # killed after the warm start was cached, before the first checkpoint: the fresh restart reads the cache
    Scenario("warm", "warm-start-then-rl", ("warm_start", "train_step", "checkpoint_write"), 2)]
FULL_K2 = REDUCED_K2 + [
    Scenario("k2", "mixed", tuple(random.Random(f"k2-{s}").choices((*RL_PHASES, "after_step"), k=4)), s)
    for s in (1, 2, 3)]

K0_SCENARIOS = FULL_K0 if FULL else REDUCED_K0
WARM_SCENARIOS = FULL_WARM if FULL else REDUCED_WARM
K2_SCENARIOS = FULL_K2 if FULL else REDUCED_K2


# ---- uninterrupted references (one per module and kind) ---------------------------------------------------------------
@dataclasses.dataclass
class Reference:
  consumed: list[list[str]]
  metrics: list[dict]
  checkpoints: dict[int, tuple[dict, dict]]  # step -> (state as numpy, meta): every checkpoint it wrote
  seconds: float


def _reference(kind: str, tmp: pathlib.Path) -> Reference:
  run_dir = tmp / "run"
  t0 = time.perf_counter()
  # keeps every checkpoint, so each one a killed run leaves can be compared (keep changes nothing else)
  rc = fh.run_child(run_dir, _overrides(kind, tmp, keep=100), None, tmp / "log.txt")
  assert rc == 0, f"uninterrupted {kind} run failed (rc={rc})\n{fh.tail(tmp / 'log.txt')}"
  ckpt_dir = run_dir / "checkpoints"
  checkpoints = {int(p.name): fh.restore_numpy(p) for p in ckpt_dir.iterdir() if p.name.isdigit()}
  consumed = read_consumed(run_dir)
  assert [r["step"] for r in consumed] == list(range(_steps(kind)))
  # training moves the params, so the bitwise comparisons below are not vacuous
  first, last = checkpoints[min(checkpoints)][0]["params"], checkpoints[_steps(kind)][0]["params"]
  assert fh.tree_mismatches(first, last), f"{kind}: params did not change between checkpoints"
  return Reference([r["prompt_ids"] for r in consumed], read_metrics(run_dir), checkpoints,
                   time.perf_counter() - t0)


@pytest.fixture(scope="module")
def reference_k0(tmp_path_factory):
  return _reference("k0", tmp_path_factory.mktemp("reference_k0"))


@pytest.fixture(scope="module")
def reference_k2(tmp_path_factory):
  return _reference("k2", tmp_path_factory.mktemp("reference_k2"))


@pytest.fixture(scope="module")
def reference_warm(tmp_path_factory):
  return _reference("warm", tmp_path_factory.mktemp("reference_warm"))


RESULTS: list[dict] = []  # one record per scenario run (SCALERL_FAULTS_REPORT)


@pytest.fixture(scope="module", autouse=True)
def _report():
  yield
  path = os.environ.get("SCALERL_FAULTS_REPORT")
  if path:
    pathlib.Path(path).write_text(json.dumps({"full": FULL, "scenarios": RESULTS}, indent=1))


# ---- one scenario ----------------------------------------------------------------------------------------------------
# metrics that measure time (differ between any two runs); every other key must replay exactly with k = 0.
# reward/ holds the reward runner's running totals, counted when calls happen: the generator thread scores the next
# batch while the trainer checkpoints, so a resume recounts those calls (per-step counts, e.g.
# rollout/reward_failures, replay exactly and are compared)
_TIMING_KEYS = ("time/", "compute/accelerator", "compute/generator_accelerator", "compute/trainer_accelerator",
                "compute/wall", "compute/compile", "eval/seconds", "pipeline/trainer_wait", "pipeline/weight_sync_s",
                "pipeline/generator_idle", "pipeline/in_flight", "train/tokens_per_s", "rollout/tokens_per_s",
                "warm_start/seconds", "reward/")


def _replayed(line: dict) -> dict:
  return {k: v for k, v in line.items() if not k.startswith(_TIMING_KEYS)}


def _run_scenario(scenario: Scenario, reference: Reference, tmp: pathlib.Path) -> dict:
  """Kills, resumes, checks; returns the scenario's record. Raises AssertionError listing every problem found."""
  bitwise = scenario.kind != "k2"  # k = 0: deterministic
  run_dir, log = tmp / "run", tmp / "log.txt"
  ckpt_dir = run_dir / "checkpoints"
  overrides, steps = _overrides(scenario.kind, tmp), _steps(scenario.kind)
  rng = random.Random(scenario.id)
  problems: list[str] = []
  kills, resumed_from = [], []
  t0 = time.perf_counter()
  skipped = []
  for i, phase in enumerate(scenario.phases):
    start = fh.latest_step(ckpt_dir)
    if start >= steps:  # a kill after the last checkpoint committed: nothing left to kill
      skipped = list(scenario.phases[i:])
      break
    cached = any((tmp / "warm_start_cache").glob("*.safetensors"))
    warm = WARM_START_STEPS if scenario.kind == "warm" and start == 0 and not cached else 0
    if phase == "warm_start" and not warm:
      phase = "train_step"  # (a full-set sequence whose warm start is already done)
    plan = fh.Plan(steps, EVERY, start, warm, ROLLOUT_STEPS_PER_BATCH_K0 if scenario.kind != "k2" else 1)
    spec = fh.choose_fault(phase, plan, rng)
    if start:
      resumed_from.append(start)
    rc = fh.run_child(run_dir, overrides, spec, log)
    if rc != fh.SIGKILLED:
      what = ("finished before the failpoint fired: the scenario chose a point this run never reaches"
              if rc == 0 else "crashed (a resume that fails, or a bug) instead of being killed")
      raise AssertionError(f"{scenario.id}: run {len(kills) + 1} with SCALERL_FAULTS={spec!r} (resuming from step "
                           f"{start}) {what}: rc={rc}\n{fh.tail(log)}")
    listing = fh.list_checkpoints(ckpt_dir)
    kills.append({"phase": phase, "spec": spec, "resumed_from": start, "numbered": listing.numbered,
                  "other": listing.other, "latest": listing.latest})
    where = f"after the kill SCALERL_FAULTS={spec!r} (resumed from {start})"
    for step, err in listing.broken.items():
      problems.append(f"{where}: checkpoint {step} is half-written or unreadable: {err}")
    if listing.latest != (max(listing.numbered) if listing.numbered else None):
      problems.append(f"{where}: the resume would start from {listing.latest}, the complete checkpoints are "
                      f"{listing.numbered} (other entries: {listing.other})")
    if bitwise:
      for step in listing.numbered:
        if step in listing.broken:
          continue
        state, meta = fh.restore_numpy(ckpt_dir / str(step))
        ref_state, ref_meta = reference.checkpoints[step]
        bad = fh.tree_mismatches(state, ref_state)
        if bad:
          problems.append(f"{where}: checkpoint {step} differs from the uninterrupted run's: {bad[:3]}")
        if meta["data_states"] != ref_meta["data_states"] or meta["npr"] != ref_meta["npr"]:
          problems.append(f"{where}: checkpoint {step} holds another data stream / NPR state than the "
                          f"uninterrupted run's")

  assert kills, f"{scenario.id}: no kill happened (the comparison would be with a run just like the reference)"
  start = fh.latest_step(ckpt_dir)
  if start:
    resumed_from.append(start)
  rc = fh.run_child(run_dir, overrides, None, log)
  assert rc == 0, (f"{scenario.id}: the final resume (from step {start}, no faults) failed: rc={rc}; kills: "
                   f"{[k['spec'] for k in kills]}\n{fh.tail(log)}")

  # a kill never damages a checkpoint, so no resume falls back past one (train/checkpoint.py restore_latest_intact
  # would do that with a warning and move it aside as <step>.damaged)
  damaged = [l for l in log.read_text(errors="replace").splitlines() if "damaged" in l]
  if damaged or any(".damaged" in p.name for p in ckpt_dir.iterdir()):
    problems.append(f"a resume found a damaged checkpoint: {damaged[:3]}")

  consumed = read_consumed(run_dir)
  got = [r["prompt_ids"] for r in consumed]
  lost, duplicated = fh.lost_and_duplicated(reference.consumed, got)
  if [r["step"] for r in consumed] != list(range(steps)):
    problems.append(f"consumed_prompts.jsonl steps are {[r['step'] for r in consumed]}, not 0..{steps - 1} once each")
  if got != reference.consumed:
    first = next((i for i, (a, b) in enumerate(zip(got, reference.consumed)) if a != b), min(len(got),
                                                                                            len(reference.consumed)))
    problems.append(f"consumed prompt ids differ from the uninterrupted run's from step {first} on "
                    f"({lost} prompts lost, {duplicated} extra or duplicated): {got[first:first + 2]} vs "
                    f"{reference.consumed[first:first + 2]}")
  lines = read_metrics(run_dir)
  if [r["step"] for r in lines] != list(range(steps + 1)):
    problems.append(f"metrics.jsonl steps are {[r['step'] for r in lines]}, not 0..{steps} once each in order")
  params_equal = None
  final = fh.list_checkpoints(ckpt_dir)
  if final.latest != steps or final.broken:
    problems.append(f"after the final run the latest checkpoint is {final.latest} (broken: {final.broken})")
  else:
    state, _ = fh.restore_numpy(ckpt_dir / str(steps))
    ref_state, _ = reference.checkpoints[steps]
    if int(state["step"]) != steps:
      problems.append(f"final checkpoint holds step {int(state['step'])}")
    if bitwise:
      bad = fh.tree_mismatches(state["params"], ref_state["params"]) + fh.tree_mismatches(
          state["opt_state"], ref_state["opt_state"], "opt_state")
      params_equal = not bad
      if bad:
        problems.append(f"final params / optimizer state differ from the uninterrupted run's: {bad[:4]}")
  if bitwise and len(lines) == len(reference.metrics):
    # every metric that is not a time or a running total counted when calls happen (_TIMING_KEYS) replays exactly:
    # rewards, losses, evaluations, FLOPs
    differ: dict[str, list[int]] = {}
    for got_line, ref_line in zip(lines, reference.metrics):
      a, b = _replayed(got_line), _replayed(ref_line)
      for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
          differ.setdefault(k, []).append(got_line["step"])
    if differ:
      problems.append("metrics differ from the uninterrupted run's (key: steps): "
                      + "; ".join(f"{k}: {v}" for k, v in sorted(differ.items())[:8]))

  record = {
      "scenario": scenario.id, "kind": scenario.kind, "kills": kills, "runs_killed": len(kills), "skipped": skipped,
      "resumed_from": resumed_from, "prompts_lost": lost, "prompts_duplicated": duplicated,
      "params_equal": params_equal, "seconds": round(time.perf_counter() - t0, 1),
      "accelerator_seconds": lines[-1].get("compute/accelerator_seconds") if lines else None,
      "reference_accelerator_seconds": reference.metrics[-1].get("compute/accelerator_seconds"),
      "metrics": [{k: r.get(k) for k in ("step", "compute/accelerator_seconds", "compute/flops")} for r in lines],
      "reference_metrics": [{k: r.get(k) for k in ("step", "compute/accelerator_seconds", "compute/flops")}
                            for r in reference.metrics],
      "problems": problems}
  RESULTS.append(record)
  assert not problems, (f"{scenario.id}: kills {[k['spec'] for k in kills]} (resumed from {resumed_from}):\n  "
                        + "\n  ".join(problems) + f"\n{fh.tail(log, 2000)}")
  return record


@pytest.mark.parametrize("scenario", K0_SCENARIOS, ids=lambda s: s.id)
def test_kill_and_resume_k0_replays_exactly(scenario, reference_k0, tmp_path):
  _run_scenario(scenario, reference_k0, tmp_path)


@pytest.mark.parametrize("scenario", WARM_SCENARIOS, ids=lambda s: s.id)
def test_kill_during_warm_start_replays_exactly(scenario, reference_warm, tmp_path):
  _run_scenario(scenario, reference_warm, tmp_path)


@pytest.mark.parametrize("scenario", K2_SCENARIOS, ids=lambda s: s.id)
def test_pipeline_k2_buffered_rollouts_regenerated_after_kill(scenario, reference_k2, tmp_path):
  """PipelineRL-2: a run that starts at step c (0 or a checkpoint's) admits batches c..c+2 at once (version c
  admits b <= c + 2), so a kill at its n-th train step lands with batch c + n - 1 generated and scored but not
  trained and later batches drawn and in flight, and a kill before a decode chunk with batches in flight; a kill
  after a checkpoint (step_end, weight_sync, checkpoint_save) lands with batches generated past it. None of that is
  in the checkpoint: the resume restores the stream to the checkpoint's batch boundary and regenerates those
  batches from the same prompts in the same order, so the consumed sequence equals an uninterrupted k = 2 run's."""
  _run_scenario(scenario, reference_k2, tmp_path)


# That a restart's start-up and compilation are not booked as compute is checked without timing in
# tests/test_reliability.py::test_a_restart_is_not_compute.
