"""Continuous batching over the engine's decode slots, with per-token versions and groups of samples per prompt.

One `step(params, version)`:

    refill free slots ── prefill_insert (one jitted call per prompt-length bucket: many prompts, many slots;
         │               each prompt is prefilled once and its KV copied into the slots of its samples)
         ▼
    generate ─────────── `decode_chunk` fused decode steps over all slots, tokens stamped with `version`
         │
         ▼
    collect ──────────── host numpy: append each slot's tokens, free the slots that finished, return the
                         prompt groups whose samples are all finished

Admission: the driver starts everything submitted, in submission order, as slots free up; the samples left of a
prompt that has started take the next free slots before any new prompt, so a started group is never dropped and
comes back whole. The pipeline paces admission under its staleness bound by deciding when to `submit` a batch's
prompts (GeneratorThread in scalerl_jax/pipeline/orchestrator.py).

In-flight weight update (PipelineRL): pass new params / version to the next `step`. Nothing is drained and no KV
is recomputed: a sample in flight keeps the KV its earlier tokens got from the old params, and its tokens record
both versions.

Shapes (legend in scalerl_jax/types.py): B decode slots, N tokens of a whole completion (`max_new_tokens`) in the
per-slot buffers; a generate call's results are [B, steps].
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from scalerl_jax import types
from scalerl_jax.model.policy import Params
from scalerl_jax.rollout.engine import Engine
from scalerl_jax.rollout.sampling import SamplingParams


@dataclasses.dataclass
class RolloutStats:
  """Cumulative counters over finished samples."""
  samples: int = 0
  tokens: int = 0  # generated tokens, forced ones included
  forced_tokens: int = 0
  interrupted: int = 0
  truncated: int = 0

  @property
  def interruption_rate(self) -> float:
    return self.interrupted / max(self.samples, 1)

  @property
  def truncation_rate(self) -> float:
    return self.truncated / max(self.samples, 1)


class _Group:
  """Host bookkeeping of one prompt's n samples."""

  def __init__(self, prompt: types.Prompt, n: int, uid: int):
    self.prompt, self.n, self.uid = prompt, n, uid
    self.tokens = np.asarray(prompt.tokens, np.int32)
    self.next_sample = 0  # samples given a slot so far
    self.samples: list[Optional[types.Sample]] = [None] * n
    self.unfinished = n


@functools.lru_cache(maxsize=64)
def _seed_key(seed: int) -> jax.Array:
  """The base key of a seed (one device computation; evaluation builds a driver per `generate_all` call)."""
  return jax.random.key(seed)


class RolloutDriver:
  """Keeps every decode slot busy; see the module docstring."""

  def __init__(self, engine: Engine, *, seed: int = 0, sampling: Optional[SamplingParams] = None,
               steps: Optional[int] = None, uid_stride: int = 1, uid_offset: int = 0):
    """`uid_stride` / `uid_offset`: the n-th prompt submitted here gets uid offset + stride * n, so that drivers
    of several processes number their prompts as one driver would number the whole stream (process i of m holds
    stream positions i, i + m, ...), and every sample draws the same random stream however many processes
    generate."""
    self.engine = engine
    self.uid_stride, self.uid_offset = uid_stride, uid_offset
    self.sampling = sampling or engine.default_sampling
    self.steps = steps or engine.cfg.decode_chunk  # decode steps fused into one generate call
    self.stats = RolloutStats()
    self.last_eval_stats = RolloutStats()  # of the latest generate_all
    self.seed = seed
    self._base_key = _seed_key(seed)
    self._state = None  # DecodeState, allocated on first use
    self._eval_state = None  # generate_all's own DecodeState, kept between calls (all slots idle)
    B, N = engine.cfg.max_slots, engine.cfg.max_new_tokens
    self._slot_uid = np.full((B,), -1, np.int64)  # group uid per slot, -1 = free
    self._slot_sample = np.zeros((B,), np.int64)
    self._len_B = np.zeros((B,), np.int64)
    self._tok_BN = np.zeros((B, N), np.int32)
    self._logp_BN = np.zeros((B, N), np.float32)
    self._ver_BN = np.zeros((B, N), np.int32)
    self._forced_BN = np.zeros((B, N), bool)
    Xk = engine.routes_Xk  # MoE: each sample's recorded experts (prompt from prefill, then each decode step)
    self._routes_BNXk = None if Xk is None else np.full((B, N) + Xk, -1, np.int16)
    self._prompt_routes_BLXk = None if Xk is None else np.full((B, engine.cfg.max_prefill_len) + Xk, -1, np.int16)
    self._inserted: list[int] = []  # slots filled since the last generate call (their prompt routes to fetch)
    self._groups: dict[int, _Group] = {}  # started and unfinished
    self._started: collections.deque[_Group] = collections.deque()  # started, samples left without a slot
    self._queued: collections.deque[_Group] = collections.deque()  # submitted, not started
    self._next_uid = 0

  # ---- input ---------------------------------------------------------------------------------------------
  def submit(self, prompt: types.Prompt, n: int) -> int:
    """Queue one prompt for n samples (started, in submission order, as slots free up); returns its uid
    (submission number, which also keys its samples' random streams)."""
    if n < 1:
      raise ValueError(f"n must be >= 1, got {n}")
    self.engine.bucket(len(prompt.tokens))  # fail now on a prompt that is too long
    group = _Group(prompt, n, self._take_uid())
    self._queued.append(group)
    return group.uid

  @property
  def first_uid(self) -> int:
    """The submission count the numbering continues from (uid = offset + stride * count)."""
    return self._next_uid

  @first_uid.setter
  def first_uid(self, uid: int) -> None:
    """Continue the uid numbering (a resumed run: fresh random streams for the batches it generates)."""
    if self._groups or self._queued:
      raise RuntimeError("first_uid can only be set on an idle driver")
    self._next_uid = int(uid)

  def _take_uid(self) -> int:
    self._next_uid += 1
    return self.uid_offset + self.uid_stride * (self._next_uid - 1)

  # ---- counters --------------------------------------------------------------------------------------------
  @property
  def idle_slots(self) -> int:
    return int(np.sum(self._slot_uid < 0))

  @property
  def queued_prompts(self) -> int:
    return len(self._queued)

  @property
  def busy(self) -> bool:
    """Anything started that has not been returned yet."""
    return bool(self._groups)

  # ---- the loop ------------------------------------------------------------------------------------------
  def step(self, params: Params, version: int) -> list[types.RolloutGroup]:
    """Refill free slots, run one fused generate call with (params, version), return finished groups."""
    if self._state is None:
      self._state = self.engine.init_decode_state()
    self._refill(params)
    if self.idle_slots == len(self._slot_uid):
      return []
    self._state, results = self.engine.generate(params, self._state, version, self.steps, self.sampling)
    results = jax.device_get(results)
    if self._prompt_routes_BLXk is not None and self._inserted:  # before collecting: a slot may finish already
      self._prompt_routes_BLXk[self._inserted] = self.engine.prompt_routes(self._state, self._inserted)
    self._inserted = []
    return self._collect(results)

  def generate_all(self, params: Params, version: int, prompts: Sequence[types.Prompt], n: int,
                   sampling: Optional[SamplingParams] = None, seed: Optional[int] = None,
                   steps: Optional[int] = None, uid_stride: int = 1, uid_offset: int = 0,
                   between: Optional[Callable[[], None]] = None) -> list[types.RolloutGroup]:
    """n samples of every prompt (evaluation), in prompt order; sampling, seed and steps default to this
    driver's; prompt i gets uid uid_offset + uid_stride * i (a process's shard of the held-out set keeps each
    prompt's random stream). Uses its own decode state: in-flight work of this driver is untouched. `between` is
    called before each decode step and may raise to abandon the work (a stop signal)."""
    runner = RolloutDriver(self.engine, seed=self.seed if seed is None else seed, sampling=sampling or self.sampling,
                           steps=steps or self.steps, uid_stride=uid_stride, uid_offset=uid_offset)
    runner._state, self._eval_state = self._eval_state, None  # reuse the idle evaluation decode state
    for p in prompts:
      runner.submit(p, n)
    out: list[types.RolloutGroup] = []
    while runner.busy or runner.queued_prompts:
      if between is not None:
        between()
      out += runner.step(params, version)
    self.last_eval_stats, self._eval_state = runner.stats, runner._state
    return sorted(out, key=lambda g: g.uid)  # uids grow in submission order

  def _refill(self, params: Params) -> None:
    free = np.flatnonzero(self._slot_uid < 0)
    plan: list[tuple[_Group, int, int]] = []  # (group, sample index, slot)
    while len(plan) < len(free):
      if not self._started:
        if not self._queued:
          break
        group = self._queued.popleft()
        self._groups[group.uid] = group
        self._started.append(group)
      group = self._started[0]
      take = min(group.n - group.next_sample, len(free) - len(plan))
      for i in range(take):
        plan.append((group, group.next_sample + i, int(free[len(plan)])))
      group.next_sample += take
      if group.next_sample == group.n:
        self._started.popleft()
    if not plan:
      return
    by_bucket: dict[int, list[tuple[_Group, int, int]]] = collections.defaultdict(list)
    for item in plan:
      by_bucket[self.engine.bucket(len(item[0].tokens))].append(item)
    for items in by_bucket.values():
      rows: dict[int, int] = {}
      for group, _, _ in items:
        rows.setdefault(group.uid, len(rows))
      prompts = [self._groups[uid].tokens for uid in rows]
      self._state = self.engine.prefill_insert(
          params, self._state, prompts, [rows[g.uid] for g, _, _ in items], [s for _, _, s in items],
          [g.uid for g, _, _ in items], [i for _, i, _ in items], self._base_key)
    for group, i, slot in plan:
      self._slot_uid[slot], self._slot_sample[slot], self._len_B[slot] = group.uid, i, 0
    self._inserted += [slot for _, _, slot in plan]

  def _collect(self, res) -> list[types.RolloutGroup]:
    valid_BN = res.valid_BN
    rows, cols = np.nonzero(valid_BN)
    dst = self._len_B[rows] + cols
    self._tok_BN[rows, dst] = res.tokens_BN[rows, cols]
    self._logp_BN[rows, dst] = res.logprobs_BN[rows, cols]
    self._ver_BN[rows, dst] = res.versions_BN[rows, cols]
    self._forced_BN[rows, dst] = res.forced_BN[rows, cols]
    if self._routes_BNXk is not None:
      self._routes_BNXk[rows, dst] = res.routes_BNXk[rows, cols]
    self._len_B += valid_BN.sum(axis=1)
    done = np.flatnonzero(res.done_B)
    if not done.size:
      return []
    # per-sample statistics in one vectorized pass over the finished slots
    lens = self._len_B[done]
    in_sample = np.arange(self._tok_BN.shape[1])[None, :] < lens[:, None]
    s = self.stats
    s.samples += len(done)
    s.tokens += int(lens.sum())
    s.forced_tokens += int((self._forced_BN[done] & in_sample).sum())
    s.interrupted += int(res.interrupted_B[done].sum())
    s.truncated += int(res.truncated_B[done].sum())
    finished = []
    # one copy per array for all finished slots; each sample holds row slices of these copies
    tok, logp, vers, forced = self._tok_BN[done], self._logp_BN[done], self._ver_BN[done], self._forced_BN[done]
    truncated, interrupted = res.truncated_B[done].tolist(), res.interrupted_B[done].tolist()
    for j, (slot, n) in enumerate(zip(done.tolist(), lens.tolist())):
      group = self._groups[int(self._slot_uid[slot])]
      routes = None
      if self._routes_BNXk is not None:  # positions 0 .. L-2 from prefill, then the n tokens fed by decode
        routes = np.concatenate([self._prompt_routes_BLXk[slot, :len(group.tokens) - 1], self._routes_BNXk[slot, :n]])
      group.samples[int(self._slot_sample[slot])] = types.Sample(
          prompt_id=group.prompt.prompt_id, prompt_tokens=group.tokens, tokens=tok[j, :n], logprobs=logp[j, :n],
          versions=vers[j, :n], forced=forced[j, :n], truncated=truncated[j], interrupted=interrupted[j],
          routes=routes)
      group.unfinished -= 1
      if group.unfinished == 0:
        del self._groups[group.uid]
        finished.append(types.RolloutGroup(group.prompt, tuple(group.samples), group.uid))
    self._slot_uid[done], self._len_B[done] = -1, 0
    return finished
