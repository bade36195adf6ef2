"""PipelineRL-k across processes: trainer processes and generator processes on disjoint devices
(mesh.generator_processes = n > 0; the last n processes generate).

    generator process g (its own devices)                       trainer processes (the trainer mesh)
    ┌──────────────────────────────────────────┐                ┌──────────────────────────────────────────┐
    │ GeneratorThread: prompts of shard g,      │                │                                          │
    │ admission under k, in-flight weights      │                │                                          │
    │ batch b complete ──── "batch" b ─────────┼───────────────►│ step b: all generators' groups, in order  │
    │                                           │                │ (rl.prepare over the whole batch)         │
    │ NPR.record(b) ◄────── "control" b ───────┼────────────────┤ NPR.record(b) (the same on every process) │
    │ WeightBox ◄────────── "weights" b + 1 ───┼────────────────┤ publish params b + 1 (if mode publishes)  │
    └──────────────────────────────────────────┘                └──────────────────────────────────────────┘

Every message goes through `distributed.Channel` (jax.experimental.transfer servers, headers in the
coordination service's key-value store), in one fixed order per step: batch b, control b, weights b + 1. That order is the
trainer's own (it needs batch b for step b and publishes b + 1 after it), so the generator never waits for
anything the staleness bound does not already make it wait for: batch b + 1 may be complete before weights b + 1
arrive (k >= 1) and then simply waits its turn on the generator process while decoding goes on. The staleness
contract is the one-process one: the generator admits batch b only while its version >= b - k, and NPR hears of
step b (control b) before version b + 1 is published, on every process.

Start: the trainers restore or initialise the train state and send the initial weights, then "start" (the first
step, and on a resume each generator's data-stream state from the checkpoint). Each batch message carries the
generator's stream state as of the next batch and its counters, so checkpoints (written by the trainer processes
only) store every generator's stream. End: at the last step both sides simply stop; a trainer that stops early
(signal, error) sets the stop record and the generators' waits end; a failure anywhere aborts every process.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import jax

from scalerl_jax import distributed, types
from scalerl_jax.pipeline import step_metrics
from scalerl_jax.pipeline.orchestrator import BatchBuffer, GeneratorStats, GeneratorThread, PipelineError
from scalerl_jax.pipeline.weight_sync import WeightBox, WeightReceiver
from scalerl_jax.train.checkpoint import params_checksum


def run_trainer(job) -> dict:
  """A trainer process's loop: receive batch s from every generator, train step s, send control s (+ weights)."""
  topo, channel = job.topology, job.channel
  lead = jax.process_index() == topo.trainers[0]

  def on_record(step, prompt_ids, pass_rates, publishes):
    if lead:
      for g in topo.generators:
        channel.send_obj(g, "control", {"step": step, "prompt_ids": list(prompt_ids),
                                        "pass_rates": [float(r) for r in pass_rates], "publishes": publishes})

  def loop():
    job.on_record = on_record
    if lead:  # the initial weights went out with WeightSync in setup
      states = job.remote.get("data_states")
      rewards = job.remote.get("reward_states")
      for i, g in enumerate(topo.generators):
        channel.send_obj(g, "start", {"step": job.start_step, "data_state": states[i] if states else None,
                                      "npr": job.cursor.npr.state_dict(),
                                      "reward_state": rewards[i] if rewards and rewards[i] else None})
    try:
      for step in range(job.start_step, job.cfg.pipeline.steps):
        t0 = time.perf_counter()
        parts = [channel.recv_obj(g, "batch") for g in topo.generators]
        job.remote.update(data_states=[p["data_state"] for p in parts],
                          data_metrics={**step_metrics.merge_counters([p["data_metrics"] for p in parts]),
                                        "pipeline/weight_recv_s": parts[0]["weight_recv_s"]},
                          reward_metrics=[job.rewards.metrics()] + [p["reward_metrics"] for p in parts],
                          reward_states=[p["reward_state"] for p in parts])
        job._gen_stats = GeneratorStats(**parts[0]["stats"])
        batch = types.ScoredBatch(step, tuple(g for p in parts for g in p["groups"]))
        if not job.consume(batch, time.perf_counter() - t0):
          break
    finally:
      if lead:
        distributed.request_stop()

  return job._run(loop)


def run_generator(job) -> dict:
  """A generator process's loop: the generator thread on this process's devices, batches sent to the trainers in
  order, NPR records and weights received in between. Returns when the run is over."""
  topo, channel, cfg = job.topology, job.channel, job.cfg
  lead = topo.trainers[0]
  receiver = WeightReceiver(job.engine.param_shardings, channel, lead)
  with job._interrupt.installed(), job.rewards:  # signals: the trainers decide when the run stops
    try:
      first = receiver.fetch()
      hello = channel.recv_obj(lead, "start")
    except distributed.Stopped:
      return {"steps": 0, "role": "generator"}
    start = hello["step"]
    if hello["data_state"] is not None:
      job.cursor.restore(hello["data_state"], hello["npr"])
    if hello.get("reward_state"):
      job.rewards.load_state(hello["reward_state"])
    job.driver.first_uid = start * job._prompts_here
    receiver.box = WeightBox(first, start)
    weight_log = _WeightLog(job) if cfg.logging.every_process else None
    if weight_log:
      weight_log.write(start, first)
    job.rewards.start()
    stop = threading.Event()
    generator = GeneratorThread(
        driver=job.driver, next_prompts=job.cursor.next_batch, score=job.score, weights=receiver.box,
        policy=job.admission, samples=job.shapes.G, start=start, end=cfg.pipeline.steps, out=BatchBuffer(stop),
        stop=stop)
    generator.start()
    step = start
    try:
      for step in range(start, cfg.pipeline.steps):
        batch = _wait_for_batch(generator, step)
        payload = {"groups": batch.groups, "data_state": job.cursor.state_before(step + 1)[0],
                   "data_metrics": job.cursor.stream.metrics(), "reward_metrics": job.rewards.metrics(),
                   "reward_state": job.rewards.state(), "stats": dataclasses.asdict(generator.stats),
                   "weight_recv_s": receiver.last_seconds}  # the latest weight transfer, measured where it ends
        for t in topo.trainers:
          channel.send_obj(t, "batch", payload)
        control = channel.recv_obj(lead, "control")
        job.cursor.record(step, control["prompt_ids"], control["pass_rates"])
        if control["publishes"]:
          receiver.receive(step + 1)
          if weight_log:
            weight_log.write(step + 1, receiver.box.latest()[0])
    except distributed.Stopped:
      pass
    finally:
      generator.stop_event.set()
      generator.join(timeout=30)
    if generator.error is not None:
      raise PipelineError(f"generator thread failed:\n{generator.error_text}") from generator.error
  return {"steps": step, "role": "generator"}


def _wait_for_batch(generator: GeneratorThread, step: int) -> types.ScoredBatch:
  """Batch `step` from the generator thread; raises its error if it failed, Stopped if the trainers stopped."""
  while True:
    batch = generator.out.get(step, poll=0.05) if generator.out.ready(step) else None
    if batch is not None:
      return batch
    if generator.error is not None:
      raise PipelineError(f"generator thread failed:\n{generator.error_text}") from generator.error
    if distributed.stop_requested():
      raise distributed.Stopped(f"batch {step}")
    time.sleep(0.02)


class _WeightLog:
  """weights.process<i>.jsonl: the checksum of every weight version this generator received (logging.every_process),
  for comparison with the trainer's pipeline/weight_checksum."""

  def __init__(self, job):
    self.path = job.run_dir / f"weights.process{jax.process_index()}.jsonl"

  def write(self, version: int, params) -> None:
    with self.path.open("a") as f:
      f.write(json.dumps({"version": version, "checksum": params_checksum(params)}) + "\n")
