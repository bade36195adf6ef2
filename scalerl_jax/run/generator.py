"""A generator process of a disaggregated run (mesh.generator_processes = n > 0; the last n processes generate):
the generator thread on this process's devices, its batches sent to the trainer processes in order, NPR records
and weights received in between.

    generator process g (its own devices)                       trainer processes (the trainer mesh)
    ┌──────────────────────────────────────────┐                ┌──────────────────────────────────────────┐
    │ GeneratorThread: prompts of shard g,      │                │                                          │
    │ admission under k, in-flight weights      │                │                                          │
    │ batch b complete ──── BatchMsg b ────────┼───────────────►│ step b: all generators' groups, in order  │
    │                                           │                │ (rl.prepare over the whole batch)         │
    │ NPR.record(b) ◄────── ControlMsg b ──────┼────────────────┤ NPR.record(b) (the same on every process) │
    │ WeightBox ◄────────── weights b + 1 ─────┼────────────────┤ publish params b + 1 (if mode publishes)  │
    └──────────────────────────────────────────┘                └──────────────────────────────────────────┘

Every message goes through `distributed.Channel` (jax.experimental.transfer servers, headers in the coordination
service's key-value store), in one fixed order per step: batch b, control b, weights b + 1. That order is the
trainer's own (it needs batch b for step b and publishes b + 1 after it), so the generator never waits for
anything the staleness bound does not already make it wait for: batch b + 1 may be complete before weights b + 1
arrive (k >= 1) and then simply waits its turn on the generator process while decoding goes on. The staleness
contract is the one-process one: the generator admits batch b only while its version >= b - k, and NPR hears of
step b (control b) before version b + 1 is published, on every process.

Start: the trainers restore or initialise the train state and send the initial weights, then a StartMsg (the first
step, and on a resume each generator's data-stream and reward state from the checkpoint). Each BatchMsg carries
the generator's stream state as of the next batch and its counters, so checkpoints (written by the trainer
processes only) store every generator's stream. End: at the last step both sides simply stop; a trainer that
stops early (signal, error) sets the stop record and the generators' waits end; a failure anywhere aborts every
process.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import threading
import time

from scalerl_jax import distributed, types
from scalerl_jax.pipeline.orchestrator import BatchBuffer, GeneratorThread, PipelineError
from scalerl_jax.pipeline.weight_sync import WeightBox, WeightReceiver
from scalerl_jax.train.checkpoint import params_checksum


def serve(job, exchange) -> dict:
  """This generator process's part of the run (`job`: its RLJob, of which it uses the built parts, `score` and the
  signal handlers; `exchange`: its GeneratorEnd). Returns when the run is over."""
  p, channel, cfg = job.parts, exchange.channel, job.cfg
  lead = exchange.trainers[0]
  receiver = WeightReceiver(p.engine.param_shardings, channel, lead, p.policy)
  with job.interrupts.installed(), p.rewards:  # signals: the trainers decide when the run stops
    try:
      first = receiver.fetch()
      hello: types.StartMsg = channel.recv_obj(lead, "start")
    except distributed.Stopped:
      return {"steps": 0, "role": "generator"}
    start = hello.step
    if hello.data_state is not None:
      p.cursor.restore(hello.data_state, hello.npr)
    if hello.reward_state:
      p.rewards.load_state(hello.reward_state)
    p.driver.first_uid = start * p.prompts_here
    receiver.box = WeightBox(first, start)
    weight_log = WeightLog(p.run_dir, exchange.topology.process_index) if cfg.logging.every_process else None
    if weight_log:
      weight_log.write(start, first)
    p.rewards.start()
    stop = threading.Event()
    generator = GeneratorThread(
        driver=p.driver, next_prompts=p.cursor.next_batch, score=job.score, weights=receiver.box,
        policy=p.admission, samples=p.shapes.G, start=start, end=cfg.pipeline.steps, out=BatchBuffer(stop), stop=stop)
    job.generator, job.generator_stats = generator, generator.stats
    generator.start()
    step = start
    try:
      for step in range(start, cfg.pipeline.steps):
        batch = _wait_for_batch(generator, step)
        msg = types.BatchMsg(batch.groups, p.cursor.state_before(step + 1)[0], p.cursor.stream.metrics(),
                             p.rewards.metrics(), p.rewards.state(), dataclasses.asdict(generator.stats),
                             receiver.last_seconds)  # the latest weight transfer, measured where it ends
        for t in exchange.trainers:
          channel.send_obj(t, "batch", msg)
        control: types.ControlMsg = channel.recv_obj(lead, "control")
        p.cursor.record(step, control.prompt_ids, control.pass_rates)
        if control.publishes:
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


class WeightLog:
  """weights.process<i>.jsonl: the checksum of every weight version this generator received (logging.every_process),
  for comparison with the trainer's pipeline/weight_checksum."""

  def __init__(self, run_dir: pathlib.Path, process_index: int):
    self.path = run_dir / f"weights.process{process_index}.jsonl"

  def write(self, version: int, params) -> None:
    with self.path.open("a") as f:
      f.write(json.dumps({"version": version, "checksum": params_checksum(params)}) + "\n")
