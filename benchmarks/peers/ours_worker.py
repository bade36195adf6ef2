"""scalerl_jax's side of benchmarks/compare_peers.py: the real RLJob (its Engine, RolloutDriver, reward runner,
batching and jitted train step), driven round by round through the job's own PipelineRL loop.

    python benchmarks/peers/ours_worker.py SPEC.json     # speaks peer_common's JSON-lines protocol

Each "run N steps" runs `run_pipeline` with a fresh GeneratorThread over batches [v, v + N) and the job's own
`consume` (what `RLJob.run` does between `start` and `end`); the job is set up once (compilation happens in
`setup`, before the first round). PipelineRL-0 (k = 0): every batch is sampled by the params it trains, so the
loss is on-policy. Loss: loss.name=grpo, no KL term, advantages normalised by each group's std (adv_norm=prompt),
each sample's token mean averaged over samples (aggregation=sample), no zero-variance filter: GRPO's settings.
The reward is the workload's (spec "reward", a dotted name the job's reward runner imports: reward.fn). When
the prompts file carries our token ids (prompt_ids) every trained group's prompt tokens are checked against them,
as the peers check theirs.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402  (this folder; the reward workers import it by the same name)

SPEC = peer_common.load_spec(sys.argv) if __name__ == "__main__" else None
if SPEC:  # before jax is imported: this many XLA CPU devices (an inherited count, e.g. the tests' 8, is replaced)
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
  os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={SPEC.get('xla_devices', 1)}"])

from scalerl_jax.config import (CheckpointConfig, DataConfig, InterruptionConfig, LoggingConfig,  # noqa: E402
                                LossConfig, ModelConfig, NPRConfig, OptimizerConfig, PipelineConfig, RewardConfig,
                                RolloutConfig, RunConfig, WarmStartConfig, validate)
from scalerl_jax.run.job import RLJob  # noqa: E402
from scalerl_jax.pipeline.orchestrator import BatchBuffer, GeneratorThread, run_pipeline  # noqa: E402

# the optimizer settings compared: the recipe's own (OptimizerConfig's defaults) and AdamW matched across systems
OPTIMIZERS = {"default": lambda lr: OptimizerConfig(lr=lr),
              "matched": lambda lr: OptimizerConfig(lr=lr, warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.999,
                                                    eps=1e-8, grad_clip=1.0)}


def run_config(spec: dict) -> RunConfig:
  width, new = spec["prompt_width"], spec["max_new_tokens"]
  slots = spec["prompts_per_step"] * spec["samples"]
  return validate(RunConfig(
      run_dir=spec["run_dir"], seed=spec["seed"],
      model=ModelConfig(pretrained=spec["checkpoint"], max_seq_len=width + new),
      rollout=RolloutConfig(max_slots=slots, max_prefill_len=width, prefill_buckets=(width,), max_new_tokens=new,
                            decode_chunk=spec.get("decode_chunk", 16), temperature=spec["temperature"],
                            interruption=InterruptionConfig(enabled=False)),
      loss=LossConfig(name="grpo", aggregation="sample", adv_norm="prompt", zero_variance_filter=False),
      data=DataConfig(task="file", path=spec["prompts"], eval_path=spec["prompts"], num_eval=1,
                      tokenizer=spec["checkpoint"], prompts_per_step=spec["prompts_per_step"],
                      samples_per_prompt=spec["samples"], seed=spec["seed"], npr=NPRConfig(enabled=False)),
      reward=RewardConfig(fn=spec.get("reward", "peer_common.digit_fraction"), workers=1),
      optimizer=OPTIMIZERS[spec["optimizer"]](spec["lr"]),
      warm_start=WarmStartConfig(enabled=False),
      pipeline=PipelineConfig(mode="pipeline", max_lag=0, steps=10 ** 9, eval_every=0),
      checkpoint=CheckpointConfig(every_steps=10 ** 9, resume=False),
      logging=LoggingConfig(tensorboard=False, progress=False)))


class OursWorker:

  def __init__(self, spec: dict):
    os.environ["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).resolve().parent),
                                                os.environ.get("PYTHONPATH", "")])  # for the reward workers
    self.spec = spec
    self.job = RLJob(run_config(spec), progress=False)
    self.clock = peer_common.StepClock()
    self.records: list[dict] = []
    self._gen_busy = self._reward_s = 0.0
    self._reward_lock = threading.Lock()  # _reward_s: added by the generator thread, taken by the trainer's
    self._held: list = []  # the StepRecord of each step as consume holds it (its device metrics are read later)
    self.job.observers.append(self._held.append)
    self._prompt_ids = {r["prompt"]: r["prompt_ids"] for r in peer_common.read_jsonl(spec["prompts"])
                        if "prompt_ids" in r}  # prompt text -> the driver's token ids (pretrained workloads)

  def info(self) -> dict:
    import jax
    from scalerl_jax.model import param_count
    cfg = self.job.cfg
    return {"system": "scalerl_jax", "jax": jax.__version__, "devices": len(jax.devices()),
            "params": int(param_count(cfg.model)), "loss": "grpo (no KL term, adv_norm prompt, aggregation sample)",
            "optimizer": dataclasses.asdict(cfg.optimizer), "pipeline": "PipelineRL-0 (run_pipeline, k = 0)",
            "prompt_width": cfg.rollout.max_prefill_len, "kv_cache": cfg.model.max_seq_len,
            "decode_chunk": cfg.rollout.decode_chunk}

  def _trained_tokens(self, record, rows: int) -> int:
    """The token positions the step ran through the model (what its train_tokens_per_s counts), of the rows
    trained (a batch may be cut to fewer groups, `train/groups`)."""
    groups = record.host_metrics.get("train/groups")
    return self.job.trainer.trained_tokens(groups * self.job.shapes.G if groups else rows)

  def _consume(self, batch, wait_s: float = 0.0) -> bool:
    samples = [s for g in batch.groups for s in g.samples]
    rewards = [float(r) for g in batch.groups for r in g.rewards]
    checked = 0
    if self._prompt_ids:
      checked = peer_common.check_prompt_ids([self._prompt_ids[g.prompt.text] for g in batch.groups],
                                             [g.prompt.tokens.tolist() for g in batch.groups], "scalerl_jax")
    self._held.clear()
    keep_going = self.job.consume(batch, wait_s)
    pending = self._held[-1] if self._held else None  # the StepRecord consume just held
    busy = self._generator.stats.busy_s  # decode chunks and scoring (the generator thread scores what finished)
    self._gen_busy, gen_busy = busy, busy - self._gen_busy
    with self._reward_lock:
      reward_s, self._reward_s = self._reward_s, 0.0
    self.clock.add("gen_s", gen_busy - reward_s)
    if pending is not None:
      self.clock.add("train_s", self._trained_tokens(pending, len(samples)) / pending.train_tokens_per_s)
    self.records.append(self.clock.end_step(batch.index, sum(len(s.tokens) for s in samples), len(samples),
                                            sum(rewards) / len(rewards), wait_s=wait_s,
                                            reward_s=reward_s, prompt_ids_checked=checked))
    return keep_going

  def _score(self, groups):
    t = time.perf_counter()
    out = self.job.score(groups)
    with self._reward_lock:
      self._reward_s += time.perf_counter() - t
    return out

  def run(self, steps: int) -> list[dict]:
    job, start = self.job, self.job.version
    stop = threading.Event()
    self._generator = GeneratorThread(
        driver=job.driver, next_prompts=job.cursor.next_batch, score=self._score, weights=job.weights,
        policy=job.admission, samples=job.shapes.G, start=start, end=start + steps, out=BatchBuffer(stop), stop=stop)
    job.generator_stats = self._generator.stats
    self._gen_busy, self._reward_s, self.records = 0.0, 0.0, []
    self.clock.start_round()
    run_pipeline(generator=self._generator, consume=self._consume, start=start, end=start + steps,
                 interrupted=lambda: False)
    return self.records


def main() -> None:
  proto = peer_common.Protocol()
  worker = OursWorker(SPEC)
  with worker.job.session():  # signal handlers, the reward workers, the run-directory lock
    t = time.perf_counter()
    worker.job.begin()  # set up (compiles the train step), start the reward workers, start the compute meter
    proto.send({"ready": True, "info": {**worker.info(), "setup_s": time.perf_counter() - t}})
    while (cmd := proto.command())["cmd"] == "run":
      for rec in worker.run(int(cmd["steps"])):
        proto.send(rec)
      proto.send({"done": True})
    worker.job.log.close()


if __name__ == "__main__":
  main()
