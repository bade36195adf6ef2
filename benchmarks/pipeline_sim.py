"""A discrete-event simulation of the RL pipeline: PipelineRL-k and PPO-off-policy-k at the paper's scale (64
generator + 16 trainer accelerators, 48 prompts x 16 samples, completions up to 14k tokens), the plan for what one
machine cannot show; and its check against the real pipeline on 8 fake CPU devices.

    python benchmarks/pipeline_sim.py                 # the paper-scale table against k, JSON + plot
    python benchmarks/pipeline_sim.py --check         # real runs on 8 fake CPU devices vs the simulator

The simulated rules are the real code's (scalerl_jax/pipeline/orchestrator.py, rollout/driver.py):
  * each generator replica runs continuous batching over a fixed number of decode slots in fused chunks of
    `chunk` decode steps; a slot that finishes inside a chunk stays empty until the chunk ends, then free slots are
    refilled from one FIFO of samples (a started group's samples first), each new group's prompt prefilled once;
  * between chunks a replica reads the latest published (params, version): in-flight weight update, nothing is
    drained, every token records the version that generated it;
  * admission by version (AdmissionPolicy): PipelineRL-k admits batch b once v_gen >= b - k; PPO-off-policy-k once
    v_gen >= floor(b / k) * k and publishes only every k steps; k = 0 is the synchronous loop;
  * the trainer consumes batch b in order once all its groups are finished and scored, trains, then copies the
    weights into the rollout layout (sync cost, inside the step as in RLJob.consume) and publishes version b + 1.
Measured as the real pipeline measures them: `gen_idle_frac` is the time a generator has nothing in flight and
nothing it may admit (GeneratorStats.idle_s / (idle_s + busy_s)); `trainer_wait_frac` is wait / (wait + step).
Beyond those: `gen_slot_util` (slot-seconds holding a live sequence / all slot-seconds), `trainer_util` (train
compute / wall time), throughput, and the per-token lag (batch index - token version) distribution.

Costs. Generator: a decode step costs step_s + per_slot_s * active + per_ctx_s * (context tokens of the active
slots), plus per chunk call_s, prefill_s per new prompt + per prompt token, score_s per finished group, swap_s
per weight update and admit_s per batch drawn; overlap_factor stretches a chunk while the trainer computes (the
check's 2 CPU cores run both; 1 on disjoint accelerators). Trainer: step_s + per_token_s * tokens +
per_token_sq_s * sum(row length^2) (causal attention), sync_s per published version, post_s after publishing
(RLJob.consume's logging). `--check` measures all of them in each real run (hooks on the run's own driver, engine,
prompt cursor, scorer, weight sync and consume; no code under scalerl_jax/ is changed). The paper-scale cost
model is analytic; every number is a flag (see `paper_costs`):
  8B dense (configs/scalerl_8b.yaml: 32 layers, d 4096, 8 KV heads x 128, vocab 128256; 7.5e9 matmul params
  without the input embedding), NVIDIA GB200: 2.5e15 bf16 dense FLOP/s and 8e12 B/s HBM per GPU (NVIDIA's
  published figures). Trainer: 16 GPUs at MFU 0.4, 6 N FLOPs per token + 6 d L T per token of a row of T tokens,
  plus 0.5 s of host work per step (assumed).
  Generators: 64 GPUs as 8 tensor-parallel replicas of 8 GPUs (the recipe's generator_spec data=-1,tensor=8) with
  32 slots each (its rollout.max_slots=256), decode_chunk 64; a decode step reads the bf16 weights and every active
  slot's KV (2 L K H bf16 bytes per token) at 70 % of HBM bandwidth, plus 2 N FLOPs per active slot at MFU 0.5
  (memory and compute time added: no overlap, a conservative roofline); prefill 2 N FLOPs per prompt token at MFU
  0.5. Weight sync: 16 GB of bf16 weights over 50 GB/s per trainer GPU (a 400 Gb/s NIC); each replica pauses for
  its copy at 50 GB/s per GPU.
  Completion lengths (no distribution is published): lognormal with median 5,000 tokens and sigma 0.6; a sample
  longer than its thinking budget (uniform in [10,240, 12,288], the recipe's interruption) is interrupted and
  answers in up to 2,016 more tokens after a 20-token phrase, capped at 14,336; prompts 512 tokens.
  This roofline is optimistic in absolute terms: it gives ~16 s per step, while the paper's 8B run spent 100k
  GPU-hours on ~7,400 steps (~600 s per step on 80 GPUs). Utilisation, wait and lag depend only on the ratios of
  the costs (scaling every cost by one factor scales time and leaves them unchanged): read the table for the
  generator/trainer balance it assumes, and change the flags to move that balance.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import os
import pathlib
import sys
import time
from typing import Callable, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
KS = (0, 1, 2, 4, 8, 16)


# ---- cost models and workload -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GenCost:
  """Seconds a generator replica spends (see the module docstring)."""
  step_s: float = 0.0  # per decode step, whatever is active (weights read; a dense engine's whole step)
  per_slot_s: float = 0.0  # per active slot per decode step
  per_ctx_s: float = 0.0  # per context token of an active slot per decode step (its KV read)
  call_s: float = 0.0  # per chunk (launch, host collect, device-to-host copy)
  prefill_s: float = 0.0  # per prompt prefilled
  prefill_token_s: float = 0.0  # per prompt token prefilled
  score_s: float = 0.0  # per finished group (rewards)
  swap_s: float = 0.0  # per weight update picked up
  overlap_factor: float = 1.0  # a chunk's time is this many times longer while the trainer computes (processors
                               # shared by both, as the 2 CPU cores of the check; 1 on disjoint accelerators)
  admit_s: float = 0.0  # per batch admitted (its prompts drawn from the stream); the real GeneratorStats count it
                        # neither busy nor idle, and so does the simulation

  def chunk_s(self, steps: int, slot_steps: int, ctx_steps: float) -> float:
    return self.call_s + steps * self.step_s + slot_steps * self.per_slot_s + ctx_steps * self.per_ctx_s


@dataclasses.dataclass(frozen=True)
class TrainCost:
  step_s: float = 0.0  # per optimizer step (host work, optimizer update)
  per_token_s: float = 0.0  # per trained token
  per_token_sq_s: float = 0.0  # per (row length)^2 summed over rows: causal attention
  sync_s: float = 0.0  # per published version (copy into the rollout layout)
  post_s: float = 0.0  # per step, after publishing (RLJob.consume logs the previous step's metrics then)
  padded_tokens: Optional[int] = None  # fixed-shape batches: every step trains this many tokens

  def train_s(self, row_lengths: np.ndarray) -> float:
    if self.padded_tokens is not None:
      return self.step_s + self.per_token_s * self.padded_tokens
    rows = row_lengths.astype(np.float64)
    return self.step_s + self.per_token_s * rows.sum() + self.per_token_sq_s * np.square(rows).sum()


@dataclasses.dataclass(frozen=True)
class Workload:
  prompts: int  # per step (P)
  samples: int  # per prompt (G)
  prompt_len: int
  lengths: Callable[[np.random.Generator, int], np.ndarray]  # completion lengths of n samples


def paper_lengths(median=5000.0, sigma=0.6, think=(10240, 12288), phrase=20, answer=2016, cap=14336):
  """Lognormal natural lengths; a sample past its thinking budget is interrupted and answers (module docstring)."""
  def draw(rng: np.random.Generator, n: int) -> np.ndarray:
    natural = rng.lognormal(math.log(median), sigma, n)
    budget = rng.integers(think[0], think[1] + 1, n)
    forced = budget + phrase + rng.integers(1, answer + 1, n)
    return np.minimum(np.where(natural > budget, forced, np.maximum(natural, 1)), cap).astype(np.int64)
  return draw


def empirical_lengths(observed) -> Callable:
  observed = np.asarray(observed, np.int64)
  if observed.size == 0 or observed.min() < 1:
    raise ValueError("empirical lengths need at least one sample, each >= 1 token")
  return lambda rng, n: rng.choice(observed, n)


def fixed_lengths(n_tokens: int) -> Callable:
  return lambda rng, n: np.full(n, n_tokens, np.int64)


# ---- the simulation -------------------------------------------------------------------------------------------
def may_admit(mode: str, k: int, batch: int, version: int) -> bool:
  """AdmissionPolicy.may_admit (pipeline/orchestrator.py), for the same modes."""
  if mode == "ppo_offpolicy":
    return version >= (batch // k) * k
  return version >= batch - (0 if mode == "lockstep" else k)


def publishes(mode: str, k: int, version: int) -> bool:
  return mode != "ppo_offpolicy" or version % k == 0


@dataclasses.dataclass
class SimResult:
  mode: str
  k: int
  steps: int
  makespan_s: float
  gen_idle_s: np.ndarray  # per replica, over the measured window
  gen_busy_s: np.ndarray
  gen_slot_util: float
  trainer_wait_s: float
  trainer_step_s: float  # consume time (train + sync), window
  trainer_compute_s: float
  window_s: float
  gen_tokens: int
  train_tokens: int
  lag_hist: dict  # lag -> tokens (every step)
  generated: np.ndarray  # tokens generated per sample (== its length)
  lengths: np.ndarray
  trained: list  # batch indices in the order they were trained
  step_lag_min: list  # per step: the smallest and the largest lag among its tokens
  step_lag_max: list
  train_iv: list  # (start, end) of each optimizer step (train + sync)
  busy_iv: list  # per replica: (start, end) of each chunk
  in_flight_updates: int

  def summary(self) -> dict:
    lags = np.array(sorted(self.lag_hist), np.float64)
    counts = np.array([self.lag_hist[l] for l in sorted(self.lag_hist)], np.float64)
    cdf = np.cumsum(counts) / counts.sum()
    pct = lambda q: float(lags[np.searchsorted(cdf, q)])
    idle, busy = self.gen_idle_s.sum(), self.gen_busy_s.sum()
    return {
        "mode": self.mode, "k": self.k, "steps": self.steps,
        "gen_idle_frac": float(idle / max(idle + busy, 1e-12)), "gen_slot_util": self.gen_slot_util,
        "trainer_wait_frac": float(self.trainer_wait_s / max(self.trainer_wait_s + self.trainer_step_s, 1e-12)),
        "trainer_util": float(self.trainer_compute_s / max(self.window_s, 1e-12)),
        "gen_tokens_per_s": float(self.gen_tokens / self.makespan_s),
        "train_tokens_per_s": float(self.train_tokens / self.makespan_s),
        "steps_per_hour": float(3600 * self.steps / self.makespan_s), "makespan_s": float(self.makespan_s),
        "lag_mean": float((lags * counts).sum() / counts.sum()), "lag_p50": pct(0.5), "lag_p90": pct(0.9),
        "lag_max": float(lags.max()), "in_flight_updates": self.in_flight_updates,
    }


class _Replica:
  def __init__(self, slots: int):
    self.sample = np.full(slots, -1, np.int64)  # sample id per slot, -1 free
    self.left = np.zeros(slots, np.int64)  # tokens still to generate
    self.ctx = np.zeros(slots, np.int64)  # context tokens (prompt + generated)
    self.version: Optional[int] = None
    self.idle_since: Optional[float] = None  # waiting for weights
    self.done = False
    self.busy_iv: list = []  # (t0, t1) busy intervals
    self.idle_iv: list = []
    self.slot_s = 0.0  # slot-seconds holding a live sequence


def _clip(intervals, t0: float, t1: float) -> float:
  return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in intervals)


def simulate(mode: str, k: int, steps: int, work: Workload, gen: GenCost, train: TrainCost, *, replicas: int = 1,
             slots: int = 64, chunk: int = 16, seed: int = 0, skip: int = 0, until: Optional[int] = None) -> SimResult:
  """Runs `steps` optimizer steps; idle, wait and utilisation are measured from the moment the trainer starts
  waiting for batch `skip` (compilation and fill-up of the real runs' first steps left out alike); the trainer's
  wait and step times over steps [skip, until) (default: to the end)."""
  until = steps if until is None else until
  if mode == "ppo_offpolicy" and k < 1:
    raise ValueError("PPO-off-policy-k needs k >= 1 (k = 1 is the synchronous loop)")
  rng = np.random.default_rng(seed)
  per_batch = work.prompts * work.samples
  lengths = np.concatenate([work.lengths(rng, per_batch) for _ in range(steps)]).astype(np.int64)
  batch_of = np.arange(steps * per_batch) // per_batch
  group_of = np.arange(steps * per_batch) // work.samples
  generated = np.zeros_like(lengths)
  group_left = np.full(steps * work.prompts, work.samples, np.int64)
  batch_left = np.full(steps, work.prompts, np.int64)
  lag_hist: dict = {}
  step_lag_min, step_lag_max = [steps] * steps, [-1] * steps
  queue: list = []  # sample ids admitted, not started (FIFO: groups in order, a group's samples together)
  qpos = 0
  reps = [_Replica(slots) for _ in range(replicas)]
  events: list = []  # (time, priority, seq, kind, replica)
  seq = [0]

  def push(t, prio, kind, r=-1):
    seq[0] += 1
    heapq.heappush(events, (t, prio, seq[0], kind, r))

  st = {"v_pub": 0, "next_batch": 0, "train_start": 0.0, "train_free": 0.0, "next_step": 0, "wait_from": 0.0,
        "in_flight": 0}
  ready: dict = {}  # batch -> time complete
  trained: list = []
  train_iv: list = []
  tr = {"wait": 0.0, "step": 0.0, "compute": 0.0, "t_window": None}

  def admit(t) -> float:
    """Admits every batch the rule allows; returns the seconds it took."""
    added = 0
    while st["next_batch"] < steps and may_admit(mode, k, st["next_batch"], st["v_pub"]):
      b = st["next_batch"]
      queue.extend(range(b * per_batch, (b + 1) * per_batch))
      st["next_batch"] += 1
      added += 1
    if added:
      for i, rep in enumerate(reps):
        if rep.idle_since is not None:
          push(t + added * gen.admit_s, 1, "wake", i)
    return added * gen.admit_s

  def run_replica(t, i):
    nonlocal qpos
    rep = reps[i]
    if rep.idle_since is not None:
      rep.idle_iv.append((rep.idle_since, t))
      rep.idle_since = None
    v = st["v_pub"]
    extra = 0.0
    if rep.version is not None and v != rep.version:
      extra += gen.swap_s
      st["in_flight"] += int((rep.sample >= 0).any())
    rep.version = v
    t += admit(t)  # neither busy nor idle
    free = np.flatnonzero(rep.sample < 0)
    take = min(len(free), len(queue) - qpos)
    new_groups = set()
    for j in range(take):
      s = queue[qpos + j]
      slot = free[j]
      rep.sample[slot], rep.left[slot], rep.ctx[slot] = s, lengths[s], work.prompt_len
      new_groups.add(group_of[s])
    qpos += take
    extra += len(new_groups) * (gen.prefill_s + gen.prefill_token_s * work.prompt_len)
    live = np.flatnonzero(rep.sample >= 0)
    if live.size == 0:
      if st["next_batch"] >= steps and qpos >= len(queue):
        rep.done = True
      else:
        rep.idle_since = t
      return
    m = np.minimum(rep.left[live], chunk)  # tokens each live slot generates in this chunk
    n_steps = int(m.max())  # the fused loop stops once no slot is active
    ctx_steps = float((m * rep.ctx[live] + m * (m - 1) // 2).sum())
    decode = gen.chunk_s(n_steps, int(m.sum()), ctx_steps)
    rep.slot_s += decode * m.sum() / (n_steps * slots)
    for s, n in zip(rep.sample[live], m):
      lag = int(batch_of[s]) - v
      lag_hist[lag] = lag_hist.get(lag, 0) + int(n)
      b = batch_of[s]
      step_lag_min[b], step_lag_max[b] = min(step_lag_min[b], lag), max(step_lag_max[b], lag)
      generated[s] += n
    rep.left[live] -= m
    rep.ctx[live] += m
    finished = live[rep.left[live] == 0]
    done_groups = []
    for slot in finished:
      g = group_of[rep.sample[slot]]
      group_left[g] -= 1
      if group_left[g] == 0:
        done_groups.append(g)
    rep.sample[finished] = -1
    dt = extra + decode + gen.score_s * len(done_groups)
    end = st["train_free"]  # the trainer's current step (if it runs now) ends then; a step starting later in this
    if gen.overlap_factor != 1.0 and st["train_start"] <= t < end:  # chunk is left out (chunks are short)
      f = gen.overlap_factor
      dt = dt * f if t + dt * f <= end else (end - t) + (dt - (end - t) / f)
    rep.busy_iv.append((t, t + dt))
    for g in done_groups:
      b = g // work.prompts
      batch_left[b] -= 1
      if batch_left[b] == 0:
        push(t + dt, 0, "batch", b)  # complete (scored) when the chunk ends
    push(t + dt, 1, "chunk", i)

  def try_train(t):
    s = st["next_step"]
    if s >= steps or s not in ready or t < st["train_free"]:
      return
    start = max(t, st["train_free"])
    if s == skip:
      tr["t_window"] = st["wait_from"]
    ids = np.arange(s * per_batch, (s + 1) * per_batch)
    rows = lengths[ids] + work.prompt_len
    compute = train.train_s(rows)
    sync = train.sync_s if publishes(mode, k, s + 1) else 0.0
    if skip <= s < until:
      tr["wait"] += start - st["wait_from"]
      tr["step"] += compute + sync
      tr["compute"] += compute
    if skip <= s < until:
      tr["step"] += train.post_s
    st["train_start"], st["train_free"] = start, start + compute + sync + train.post_s
    st["next_step"] = s + 1
    trained.append(s)
    train_iv.append((start, st["train_free"]))
    push(start + compute + sync, 0, "trained", s)  # weights published
    push(st["train_free"], 0, "free", s)

  for i in range(replicas):
    push(0.0, 1, "chunk", i)
  t = 0.0
  while events:
    t, _, _, kind, x = heapq.heappop(events)
    if kind == "batch":
      ready[x] = t
      try_train(t)
    elif kind == "trained":
      if publishes(mode, k, x + 1):
        st["v_pub"] = x + 1
        for i, rep in enumerate(reps):
          if rep.idle_since is not None:
            push(t, 1, "wake", i)
    elif kind == "free":
      st["wait_from"] = t
      try_train(t)
    elif not reps[x].done and (kind == "chunk" or reps[x].idle_since is not None):
      run_replica(t, x)
  makespan = st["train_free"]
  if len(trained) != steps:
    raise RuntimeError(f"simulation stalled after {len(trained)} of {steps} steps (mode {mode}, k={k})")
  t0 = tr["t_window"] if tr["t_window"] is not None else 0.0
  ends = [max([b for _, b in rep.busy_iv] + [b for _, b in rep.idle_iv] + [0.0]) for rep in reps]
  return SimResult(
      mode=mode, k=k, steps=steps, makespan_s=makespan,
      gen_idle_s=np.array([_clip(r.idle_iv, t0, e) for r, e in zip(reps, ends)]),
      gen_busy_s=np.array([_clip(r.busy_iv, t0, e) for r, e in zip(reps, ends)]),
      gen_slot_util=float(sum(r.slot_s for r in reps) / (replicas * makespan)),
      trainer_wait_s=tr["wait"], trainer_step_s=tr["step"], trainer_compute_s=tr["compute"],
      window_s=makespan - t0, gen_tokens=int(lengths.sum()),
      train_tokens=int(train.padded_tokens * steps if train.padded_tokens else (lengths + work.prompt_len).sum()),
      lag_hist=lag_hist, generated=generated, lengths=lengths, trained=trained, step_lag_min=step_lag_min,
      step_lag_max=step_lag_max, train_iv=train_iv, busy_iv=[r.busy_iv for r in reps],
      in_flight_updates=st["in_flight"])


# ---- the check against the real pipeline (8 fake CPU devices) -------------------------------------------------
# The real run: the CPU default model (0.4M params) on a 4-device generator mesh and a 4-device trainer mesh,
# 16 prompts x 8 samples per step over 32 decode slots (four waves per batch), chunks of 4 decode steps, an untrained
# policy (no warm start) scored by a reward it earns about half the time, no evaluation or checkpoint in the loop,
# fixed-shape train steps (trainer.batch_buckets=1: a new bucket would compile mid-run).
CHECK_OVERRIDES = [
    "mesh.generator_devices=4", "mesh.spec=data=-1", "mesh.generator_spec=data=-1,tensor=1",
    "rollout.max_slots=32", "rollout.decode_chunk=4", "trainer.batch_buckets=1", "data.prompts_per_step=16",
    "data.samples_per_prompt=8",
    "data.num_train=4000", "data.num_eval=8", "reward.fn=tests.pipeline_helpers.reward_digit_one",
    "warm_start.enabled=false", "pipeline.eval_every=0", "checkpoint.every_steps=100000", "logging.tensorboard=false",
    "logging.progress=false",
]
CHECK_RUNS = (("pipeline", 0), ("pipeline", 1), ("pipeline", 2), ("pipeline", 4), ("ppo_offpolicy", 2),
              ("ppo_offpolicy", 4))


class _Probe:
  """Hooks on one RLJob's own objects (instance attributes: nothing under scalerl_jax/ changes) that record each
  generate call, each reward call and each trainer step as the run goes."""

  def __init__(self, job):
    self.job, self.calls, self.scores, self.steps, self.lengths, self.admits = job, [], [], [], [], []
    self.on = True
    driver, engine = job.driver, job.engine
    step, collect, prefill, score, consume, draw = (driver.step, driver._collect, engine.prefill_insert, job.score,
                                                    job.consume, job.cursor.next_batch)
    cur, publish = {}, None

    def prefill_hook(params, state, prompts, *rest):
      cur["prompts"] = cur.get("prompts", 0) + len(prompts)
      return prefill(params, state, prompts, *rest)

    def collect_hook(res):
      valid = np.asarray(res.valid_BN)
      cur["steps"], cur["slot_steps"] = int(valid.sum(axis=1).max(initial=0)), int(valid.sum())
      out = collect(res)
      self.lengths += [len(s.tokens) for g in out for s in g.samples]
      return out

    def step_hook(params, version):
      cur.clear()
      t = time.perf_counter()
      out = step(params, version)
      if self.on and "steps" in cur:
        self.calls.append((time.perf_counter() - t, cur["steps"], cur["slot_steps"], cur.get("prompts", 0),
                           len(self.steps), t))
      return out

    def draw_hook(batch_index):
      t = time.perf_counter()
      out = draw(batch_index)
      if self.on:
        self.admits.append((time.perf_counter() - t, len(self.steps)))
      return out

    def score_hook(groups):
      t = time.perf_counter()
      out = score(groups)
      if self.on and groups:
        self.scores.append((time.perf_counter() - t, len(groups), len(self.steps)))
      return out

    def publish_hook(params, version):
      publish(params, version)
      cur["published_at"] = time.perf_counter()

    def consume_hook(batch, wait_s=0.0):
      nonlocal publish
      if publish is None:  # the exchange's weight sync exists once the run has set up
        publish, job.exchange.sync.publish = job.exchange.sync.publish, publish_hook
      cur.pop("published_at", None)
      t = time.perf_counter()
      out = consume(batch, wait_s)
      end = time.perf_counter()
      g = job.generator.stats
      sync = job.exchange.sync.last_seconds if job.admission.publishes(job.version) else 0.0
      self.steps.append({"step": batch.index, "wait_s": wait_s, "consume_s": end - t, "sync_s": sync, "t0": t,
                         "t1": end,
                         "post_s": end - cur["published_at"] if "published_at" in cur else None,
                         "gen_idle_s": g.idle_s, "gen_busy_s": g.busy_s})
      return out

    driver.step, driver._collect, engine.prefill_insert = step_hook, collect_hook, prefill_hook
    job.score, job.consume, job.cursor.next_batch = score_hook, consume_hook, draw_hook


def _fit_gen(calls, scores, steps, skip: int) -> GenCost:
  """chunk seconds = (call_s + step_s * decode steps + per_slot_s * slot-steps + prefill_s * prompts prefilled)
  x (1 + (overlap_factor - 1) * the share of the call the trainer was computing), by non-negative least squares
  over the generate calls made once `skip` steps were trained (the first ones compile): the linear part from the
  calls that did not overlap a train step (all calls when fewer than 20 did not), the factor from the others."""
  from scipy.optimize import nnls
  c = np.array([x for x in calls if x[4] >= skip], np.float64)
  busy = [(s["t0"], s["t1"]) for s in steps]
  ovl = np.array([_clip(busy, t, t + d) / d for d, t in zip(c[:, 0], c[:, 5])])
  A = np.stack([np.ones(len(c)), c[:, 1], c[:, 2], c[:, 3]], axis=1)
  alone = ovl < 1e-3 if (ovl < 1e-3).sum() >= 20 else np.ones(len(c), bool)
  scale = A.max(axis=0)
  x, _ = nnls(A[alone] / scale, c[alone, 0])
  call_s, step_s, per_slot_s, prefill_s = x / scale
  factor = 1.0
  if alone.sum() < len(c):
    m = A[~alone] @ (x / scale)
    xi = ovl[~alone] * m
    factor = max(1.0, 1.0 + float((c[~alone, 0] - m) @ xi / (xi @ xi)))
  sc = np.array([x for x in scores if x[2] >= skip], np.float64)
  return GenCost(step_s=step_s, per_slot_s=per_slot_s, call_s=call_s, prefill_s=prefill_s, overlap_factor=factor,
                 score_s=float(sc[:, 0].sum() / sc[:, 1].sum()))


def real_run(mode: str, k: int, steps: int, skip: int, root: pathlib.Path) -> dict:
  import shutil
  from scalerl_jax.config import load_config
  from scalerl_jax.run.job import RLJob
  run_dir = root / f"{mode}_k{k}"
  shutil.rmtree(run_dir, ignore_errors=True)
  cfg = load_config(overrides=[f"run_dir={run_dir}", *CHECK_OVERRIDES, f"pipeline.mode={mode}",
                               f"pipeline.max_lag={k}", f"pipeline.steps={steps}"])
  job = RLJob(cfg, progress=False)
  probe = _Probe(job)
  t0 = time.perf_counter()
  job.run()
  probe.on = False
  wall = time.perf_counter() - t0
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "train/tokens_per_s" in r]
  st, gen_end = probe.steps, job.generator.stats
  win = st[skip:-1]  # the trainer's window; the last step evaluates the held-out set inside its consume
  start = st[skip - 1] if skip else {"gen_idle_s": 0.0, "gen_busy_s": 0.0}
  idle, busy = gen_end.idle_s - start["gen_idle_s"], gen_end.busy_s - start["gen_busy_s"]
  wait = sum(s["wait_s"] for s in win)
  consume = sum(s["consume_s"] for s in win)
  # trained tokens per step from the logged trainer FLOPs (analytic, per token) and the jitted step's own time
  flops = np.diff([0.0] + [r["compute/trainer_flops"] for r in rows]) / job.parts.flops_per_token(True)
  tokens = flops[skip:-1]
  train_s = tokens / np.array([r["train/tokens_per_s"] for r in rows[skip:-1]])
  gen = _fit_gen(probe.calls, probe.scores, probe.steps, skip)
  pub = [s for s in win if s["post_s"] is not None]
  sync, post = float(np.mean([s["sync_s"] for s in pub])), float(np.mean([s["post_s"] for s in pub]))
  per_token_s = float(train_s.sum() / tokens.sum())
  train = TrainCost(step_s=float(consume / len(win) - sync * len(pub) / len(win) - post - per_token_s * tokens.mean()),
                    per_token_s=per_token_s, sync_s=sync, post_s=post, padded_tokens=int(round(tokens.mean())))
  # the generator loop's own time outside the generate and reward calls (prompts, submit, batch assembly) per call
  hooked = sum(c[0] for c in probe.calls if c[4] >= skip) + sum(c[0] for c in probe.scores if c[2] >= skip)
  n_calls = sum(1 for c in probe.calls if c[4] >= skip)
  admits = [a for a, n in probe.admits if n >= skip] or [a for a, _ in probe.admits]
  gen = dataclasses.replace(gen, call_s=gen.call_s + max(busy - hooked, 0.0) / max(n_calls, 1),
                            admit_s=float(np.mean(admits)))
  lag = [r["pipeline/lag_mean"] for r in rows]
  return {"mode": mode, "k": k, "steps": steps, "wall_s": wall, "gen_cost": dataclasses.asdict(gen),
          "train_cost": dataclasses.asdict(train), "lengths": probe.lengths,
          "measured": {"gen_idle_frac": idle / max(idle + busy, 1e-9), "trainer_wait_frac": wait / (wait + consume),
                       "lag_mean": float(np.mean(lag)), "lag_max": float(max(r["pipeline/lag_max"] for r in rows)),
                       "window_s": sum(s["wait_s"] + s["consume_s"] for s in win),
                       "logged_generator_idle_frac": rows[-1].get("pipeline/generator_idle_frac"),
                       "logged_trainer_wait_frac_mean": float(np.mean([r["pipeline/trainer_wait_frac"]
                                                                       for r in rows[skip:-1]])),
                       "gen_unaccounted_s": (st[-1]["wait_s"] + sum(s["wait_s"] + s["consume_s"] for s in win)
                                             - idle - busy)},
          "generate_calls": len(probe.calls), "gen_busy_s": busy, "gen_hooked_s": hooked,
          "engine": {"slots": cfg.rollout.max_slots, "chunk": cfg.rollout.decode_chunk},
          "work": {"prompts": cfg.data.prompts_per_step, "samples": cfg.data.samples_per_prompt,
                   "prompt_len": cfg.rollout.max_prefill_len}}


def predict(run: dict, skip: int, seed: int = 0, costs: Optional[dict] = None) -> dict:
  """The simulator fed one real run's sizes, completion lengths and measured costs (or those of the run `costs`)."""
  w, e, c = run["work"], run["engine"], costs or run
  work = Workload(w["prompts"], w["samples"], w["prompt_len"], empirical_lengths(run["lengths"]))
  r = simulate(run["mode"], run["k"], run["steps"], work, GenCost(**c["gen_cost"]), TrainCost(**c["train_cost"]),
               replicas=1, slots=e["slots"], chunk=e["chunk"], seed=seed, skip=skip, until=run["steps"] - 1)
  return r.summary()


def check_main(a) -> None:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  sys.path.insert(0, str(ROOT))  # tests.pipeline_helpers (the reward), scalerl_jax
  import tempfile
  root = pathlib.Path(tempfile.mkdtemp(prefix="pipeline_sim_check_"))
  out = []
  runs = [(m, int(k)) for m, k in (x.split(":") for x in a.runs.split(","))] if a.runs else CHECK_RUNS
  for mode, k in runs:
    run = real_run(mode, k, a.steps, a.skip, root)
    run["predicted"] = predict(run, a.skip)
    out.append(run)
    m, p = run["measured"], run["predicted"]
    print(f"{mode:<13} k={k}: {run['wall_s']:.0f} s; gen idle {m['gen_idle_frac']:.3f} measured, "
          f"{p['gen_idle_frac']:.3f} predicted; trainer wait {m['trainer_wait_frac']:.3f} / "
          f"{p['trainer_wait_frac']:.3f}", flush=True)
  report(out, a)


def report(out: list, a) -> None:
  from record import save_result
  # out of sample: every run predicted from the costs one other run measured (PipelineRL-1: it overlaps)
  ref = next((r for r in out if (r["mode"], r["k"]) == ("pipeline", 1)), None)
  for run in out:
    run["predicted_from_k1_costs"] = predict(run, a.skip, costs=ref) if ref is not None else None
  print(f"\nreal pipeline on 8 fake CPU devices (4 generator + 4 trainer) vs the simulator fed each run's measured "
        f"costs ('x' : fed PipelineRL-1's costs instead); {a.steps} steps, measured from step {a.skip}")
  print(f"{'mode':<13} {'k':>2}  {'gen idle real':>13} {'sim':>6} {'diff':>6} {'x':>6}  {'trn wait real':>13} "
        f"{'sim':>6} {'diff':>6} {'x':>6}  {'lag real':>8} {'sim':>5}  {'s/step real':>11} {'sim':>6}")
  for run in out:
    m, p = run["measured"], run["predicted"]
    x = run["predicted_from_k1_costs"] or {"gen_idle_frac": float("nan"), "trainer_wait_frac": float("nan")}
    run["diff"] = {key: p[key] - m[key] for key in ("gen_idle_frac", "trainer_wait_frac")}
    real_step = m["window_s"] / (a.steps - a.skip - 1)
    sim_step = p["makespan_s"] / a.steps
    print(f"{run['mode']:<13} {run['k']:>2}  {m['gen_idle_frac']:>13.3f} {p['gen_idle_frac']:>6.3f} "
          f"{run['diff']['gen_idle_frac']:>+6.3f} {x['gen_idle_frac']:>6.3f}  {m['trainer_wait_frac']:>13.3f} "
          f"{p['trainer_wait_frac']:>6.3f} {run['diff']['trainer_wait_frac']:>+6.3f} {x['trainer_wait_frac']:>6.3f}  "
          f"{m['lag_mean']:>8.2f} {p['lag_mean']:>5.2f}  "
          f"{real_step:>11.3f} {sim_step:>6.3f}")
  worst = max(abs(d) for run in out for d in run["diff"].values())
  print(f"largest |predicted - measured| idle/wait fraction: {worst:.3f} (goal: within 0.1)")
  save_result(a.out, {"scale": "check", "overrides": CHECK_OVERRIDES, "steps": a.steps, "skip": a.skip,
                      "max_abs_diff": worst, "runs": out})


# ---- the paper-scale cost model -------------------------------------------------------------------------------
def paper_costs(a) -> tuple[Workload, GenCost, TrainCost]:
  """The analytic model of the module docstring, from the command-line flags `a`."""
  d, L = a.heads * a.head_dim, a.layers
  kv_bytes = 2 * L * a.kv_heads * a.head_dim * 2  # K and V, bf16, per token
  weight_bytes = 2 * a.params_total  # bf16
  tp = a.gen_gpus // a.replicas
  bw, flops = a.hbm_bw * tp * a.bw_eff, a.peak_flops * tp * a.decode_mfu
  gen = GenCost(step_s=weight_bytes / bw + a.step_latency_s,
                per_slot_s=2 * a.params_matmul / flops,
                per_ctx_s=kv_bytes / bw + 4 * d * L / flops,  # the KV read, and QK + AV FLOPs per context token
                call_s=a.call_s, prefill_token_s=2 * a.params_matmul / flops,
                swap_s=weight_bytes / tp / a.sync_bw)
  rate = a.train_gpus * a.peak_flops * a.train_mfu
  train = TrainCost(step_s=a.train_step_s, per_token_s=6 * a.params_matmul / rate, per_token_sq_s=6 * d * L / rate,
                    sync_s=weight_bytes / a.train_gpus / a.sync_bw)
  work = Workload(a.prompts, a.samples, a.prompt_len, paper_lengths(a.len_median, a.len_sigma))
  return work, gen, train


def sweep(work, gen, train, *, steps, skip, replicas, slots, chunk, seed=0, ks=KS) -> list[dict]:
  rows = []
  for mode in ("pipeline", "ppo_offpolicy"):
    for k in ks:
      # PPO-off-policy-0 is not defined (k batches per round); its k = 1 is the synchronous loop, shown as k = 0
      r = simulate(mode, max(k, 1) if mode == "ppo_offpolicy" else k, steps, work, gen, train, replicas=replicas,
                   slots=slots, chunk=chunk, seed=seed, skip=skip)
      rows.append({**r.summary(), "k": k})
  return rows


COLUMNS = (("mode", "{:<13}"), ("k", "{:>3}"), ("gen_idle_frac", "{:>8.3f}"), ("gen_slot_util", "{:>8.3f}"),
           ("trainer_util", "{:>8.3f}"), ("trainer_wait_frac", "{:>8.3f}"), ("gen_tokens_per_s", "{:>10.0f}"),
           ("steps_per_hour", "{:>9.1f}"), ("lag_mean", "{:>6.2f}"), ("lag_p50", "{:>5.0f}"), ("lag_p90", "{:>5.0f}"),
           ("lag_max", "{:>5.0f}"))
HEADS = ("mode", "k", "gen idle", "slot use", "trn util", "trn wait", "gen tok/s", "steps/h", "lag", "p50", "p90",
         "max")


def print_table(rows: list[dict]) -> None:
  widths = [len(f.format(rows[0][c])) for c, f in COLUMNS]
  print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(HEADS, widths))))
  for row in rows:
    print("  ".join(f.format(row[c]) for c, f in COLUMNS))


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for mode, style, color in (("pipeline", "-o", "tab:blue"), ("ppo_offpolicy", "--s", "tab:orange")):
    sel = [r for r in rows if r["mode"] == mode]
    ks = [r["k"] for r in sel]
    name = "PipelineRL-k" if mode == "pipeline" else "PPO-off-policy-k"
    axes[0].plot(ks, [r["steps_per_hour"] for r in sel], style, color=color, label=name)
    axes[1].plot(ks, [r["gen_slot_util"] for r in sel], style, color=color, label=f"{name}: generator slots")
    axes[1].plot(ks, [r["trainer_util"] for r in sel], style, color=color, alpha=0.4, label=f"{name}: trainer")
    axes[2].plot(ks, [r["lag_mean"] for r in sel], style, color=color, label=f"{name}: mean")
    axes[2].plot(ks, [r["lag_p90"] for r in sel], style, color=color, alpha=0.4, label=f"{name}: p90")
  for ax, ylabel in zip(axes, ("optimizer steps / hour", "utilisation", "per-token lag (versions)")):
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xticks(KS, [str(k) for k in KS])
    ax.set_xlabel("k")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  print(f"wrote {path}")


def paper_main(a) -> None:
  from record import save_result
  work, gen, train = paper_costs(a)
  t0 = time.perf_counter()
  rows = sweep(work, gen, train, steps=a.steps, skip=a.skip, replicas=a.replicas, slots=a.slots, chunk=a.chunk)
  print(f"paper scale: {a.gen_gpus} generator GPUs as {a.replicas} replicas x {a.slots} slots, {a.train_gpus} "
        f"trainer GPUs; {a.prompts} x {a.samples} samples per step; {a.steps} steps, measured from step {a.skip} "
        f"(simulated in {time.perf_counter() - t0:.0f} s)")
  print_table(rows)
  out = pathlib.Path(a.out)
  plot(rows, out.with_suffix(".png"), f"simulated ScaleRL 8B pipeline: {a.gen_gpus}+{a.train_gpus} GB200, "
       f"{a.prompts}x{a.samples} per step, lognormal lengths (median {a.len_median:.0f}) with interruption")
  save_result(out, {"scale": "paper", "flags": vars(a), "gen_cost": dataclasses.asdict(gen),
                    "train_cost": dataclasses.asdict(train), "rows": rows, "plot": out.with_suffix(".png").name})


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--check", action="store_true", help="real runs on 8 fake CPU devices against the simulator")
  p.add_argument("--runs", default=None, help="--check: mode:k,... (default: " +
                 ",".join(f"{m}:{k}" for m, k in CHECK_RUNS) + ")")
  p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/pipeline_sim[_check].json)")
  p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 120; --check: 30)")
  p.add_argument("--skip", type=int, default=None,
                 help="first steps left out of the measurement: fill-up, compilation (default 30; --check: 5)")
  g = p.add_argument_group("paper-scale workload and cost model (module docstring)")
  g.add_argument("--prompts", type=int, default=48)
  g.add_argument("--samples", type=int, default=16)
  g.add_argument("--prompt-len", type=int, default=512)
  g.add_argument("--len-median", type=float, default=5000.0)
  g.add_argument("--len-sigma", type=float, default=0.6)
  g.add_argument("--gen-gpus", type=int, default=64)
  g.add_argument("--train-gpus", type=int, default=16)
  g.add_argument("--replicas", type=int, default=8, help="generator replicas (gen-gpus / replicas GPUs each)")
  g.add_argument("--slots", type=int, default=32, help="decode slots per replica")
  g.add_argument("--chunk", type=int, default=64, help="decode steps between weight reads")
  g.add_argument("--params-total", type=float, default=8.03e9)
  g.add_argument("--params-matmul", type=float, default=7.5e9, help="without the input embedding")
  g.add_argument("--layers", type=int, default=32)
  g.add_argument("--heads", type=int, default=32)
  g.add_argument("--kv-heads", type=int, default=8)
  g.add_argument("--head-dim", type=int, default=128)
  g.add_argument("--peak-flops", type=float, default=2.5e15, help="bf16 dense FLOP/s per GPU (GB200)")
  g.add_argument("--hbm-bw", type=float, default=8e12, help="B/s per GPU (GB200)")
  g.add_argument("--bw-eff", type=float, default=0.7)
  g.add_argument("--decode-mfu", type=float, default=0.5)
  g.add_argument("--train-mfu", type=float, default=0.4)
  g.add_argument("--sync-bw", type=float, default=50e9, help="B/s per GPU for the weight sync")
  g.add_argument("--step-latency-s", type=float, default=0.0, help="fixed cost per decode step")
  g.add_argument("--call-s", type=float, default=0.0, help="fixed cost per decode chunk")
  g.add_argument("--train-step-s", type=float, default=0.5, help="fixed cost per optimizer step")
  return p


def main() -> None:
  a = parser().parse_args()
  if a.out is None:
    a.out = str(RESULTS / ("pipeline_sim_check.json" if a.check else "pipeline_sim.json"))
  a.steps = a.steps or (30 if a.check else 120)
  a.skip = (5 if a.check else 30) if a.skip is None else a.skip
  if not int(a.check) <= a.skip < a.steps - 1:
    raise SystemExit(f"pipeline_sim.py: error: --skip must lie in {int(a.check)} .. steps - 2 (got {a.skip}, "
                     f"steps {a.steps})")
  if a.check:
    check_main(a)
  else:
    paper_main(a)


if __name__ == "__main__":
  main()
