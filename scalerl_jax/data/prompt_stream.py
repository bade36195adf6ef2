"""The prompt pipeline: records -> tokenized Prompts, shuffled per epoch, NPR-filtered, sharded, in fixed batches.

    records ──encode_records (long prompts: error|truncate|skip)──► prompts[i]
    epoch e:  active = [i : prompts[i] not among the first K_e NPR-solved ids]     K_e = npr.num_removed at e's start
              grain.MapDataset.source(permutation(active, seed(data.seed, e)))[:usable][process_index::process_count]
    stream:   epoch 0, epoch 1, ... concatenated; next_batch() takes the next `batch_size` prompts (a batch may span
              an epoch boundary; every epoch is complete, none is cut short)

Sharding: each epoch's shuffled order is the same on every process; `usable` drops the `active % process_count`
last prompts of that order so that all processes see equally many prompts per epoch (a different few each epoch).
The default batch size is data.prompts_per_step / process_count (prompts_per_step is global).

Resume: the state is (epoch, K_e, grain iterator state within the epoch) plus a fingerprint of the records, seed
and shard. It is taken between batches, so nothing is buffered outside grain, and restoring it (with the NPR state
of the same checkpoint) yields exactly the remaining sequence. A checkpoint must hold every process's state.

NPR: a prompt solved during epoch e is dropped from epoch e + 1 on, never from the epoch in progress. The snapshot
K of a new epoch is `npr_count` when the caller passes it to `next_batch` (the pipeline passes the count as of a
fixed step, see data/npr.py), else the NPR state's count now. An epoch with no prompt left for this process raises
PromptsExhausted.

grain runs without worker processes or read threads (`ReadOptions(num_threads=0)`): the work per prompt is an index
lookup, and grain's multiprocessing would need absl flags and a __main__ guard in every entry point. The epoch's
permutation is drawn once with numpy rather than with `MapDataset.shuffle`: grain 0.2.18's per-element index
shuffle measured ~0.1 s / pool size per element here (2 ms per prompt for a pool of 40, as NPR may leave late in a
run; 20 us at 20k), while one numpy permutation per epoch costs microseconds. grain keeps the position and its state.
"""

from __future__ import annotations

import collections
import hashlib
import logging
from typing import Optional, Sequence

import grain
import numpy as np

from scalerl_jax import types
from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.sources import DataError, Record

log = logging.getLogger(__name__)
# Fractions of the training prompts left by NPR at which an epoch's start is logged as a warning (each once): the
# never-solved remainder is the hardest part of the split, most of its groups all fail and the zero-variance filter
# keeps few per step. Measured on 4-digit addition (20k prompts, benchmarks/RESULTS.md): with 9 % of the split left
# (step ~920) the held-out pass rate fell from 0.84 to 0.10 in 90 steps.
NPR_LEFT_WARNINGS = (0.5, 0.25, 0.1)

_STATE_VERSION = 1


class PromptsExhausted(DataError):
  """No-Positive-Resampling left no training prompt for a new epoch (the run can stop cleanly with a checkpoint
  and continue with NPR relaxed)."""


def encode_records(records: Sequence[Record], tokenizer, max_prefill_len: int, long_prompts: str = "error"
                   ) -> tuple[list[types.Prompt], dict[str, int]]:
  """Tokenizes records (BOS + chat-templated text). A prompt longer than `max_prefill_len` tokens raises
  (`error`), keeps BOS and its last tokens (`truncate`: the end of a prompt carries the question and the turn
  header), or is dropped (`skip`). Returns the prompts and counts {"truncated_prompts", "skipped_long_prompts"}."""
  if long_prompts not in ("error", "truncate", "skip"):
    raise ValueError(f"data.long_prompts must be error, truncate or skip, got {long_prompts!r}")
  prompts, truncated, skipped = [], 0, 0
  for rec in records:
    try:
      ids = tokenizer.encode_prompt(rec.text)
    except DataError as exc:
      raise DataError(f"{rec.where or rec.prompt_id}: prompt field: {exc}") from None
    if len(ids) > max_prefill_len:
      if long_prompts == "error":
        raise DataError(f"{rec.where or rec.prompt_id}: prompt field: {len(ids)} tokens exceed "
                        f"rollout.max_prefill_len={max_prefill_len} (set data.long_prompts=truncate or skip)")
      if long_prompts == "skip":
        skipped += 1
        continue
      head = ids[:1] if tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id else []
      ids = head + ids[len(ids) - (max_prefill_len - len(head)):]
      truncated += 1
    prompts.append(types.Prompt(rec.prompt_id, rec.text, rec.answer, np.asarray(ids, np.int32), rec.task))
  return prompts, {"truncated_prompts": truncated, "skipped_long_prompts": skipped}


def _epoch_seed(seed: int, epoch: int) -> int:
  return int(np.random.SeedSequence([seed, epoch, 0x5CA1E]).generate_state(1)[0])


class PromptStream:
  """Batches of training prompts with exact resume; see the module docstring."""

  def __init__(self, records: Sequence[Record], cfg, tokenizer, max_prefill_len: int, *, process_index: int = 0,
               process_count: int = 1, npr: Optional[NPRState] = None, batch_size: Optional[int] = None,
               counts: Optional[dict] = None):
    """`counts`: what reading the records counted (rows read, bad rows skipped, ...), reported in `metrics()`."""
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in [0, process_count={process_count})")
    if batch_size is None:
      if cfg.prompts_per_step % process_count:
        raise ValueError(f"data.prompts_per_step={cfg.prompts_per_step} is not divisible by {process_count} processes")
      batch_size = cfg.prompts_per_step // process_count
    if batch_size <= 0:
      raise ValueError(f"batch size must be positive, got {batch_size}")
    if not records:
      raise DataError("the training dataset is empty")
    self.batch_size = batch_size
    self.seed = cfg.seed
    self.process_index, self.process_count = process_index, process_count
    self.npr = npr
    self._prompts, encoded = encode_records(records, tokenizer, max_prefill_len, cfg.long_prompts)
    self.counts = {**(counts or {}), **encoded}
    if not self._prompts:
      raise DataError(f"all {len(records)} training prompts were skipped as longer than "
                      f"rollout.max_prefill_len={max_prefill_len}")
    ids = [p.prompt_id for p in self._prompts]
    if len(set(ids)) != len(ids):
      dup = collections.Counter(ids).most_common(1)[0][0]
      raise DataError(f"prompt id {dup!r} occurs more than once in the training records")
    digest = hashlib.sha1("\n".join(ids).encode())
    digest.update(f"|{cfg.seed}|{process_index}|{process_count}".encode())
    self._fingerprint = digest.hexdigest()
    self._warned_left = 1.0  # the smallest NPR_LEFT_WARNINGS fraction warned about so far
    self._start_epoch(0, npr.num_removed if npr is not None else 0)

  def _start_epoch(self, epoch: int, npr_removed: int) -> None:
    removed = self.npr.removed_ids(npr_removed) if self.npr is not None and npr_removed else frozenset()
    active = np.array([i for i, p in enumerate(self._prompts) if p.prompt_id not in removed], np.int64)
    usable = len(active) - len(active) % self.process_count
    if usable == 0:
      raise PromptsExhausted(f"epoch {epoch}: no training prompts left for {self.process_count} process(es): "
                      f"{len(self._prompts) - len(active)} of {len(self._prompts)} were removed by "
                      f"No-Positive-Resampling (data.npr.threshold)")
    order = np.random.default_rng(_epoch_seed(self.seed, epoch)).permutation(active)
    ds = grain.MapDataset.source(order)[:usable][self.process_index::self.process_count]
    self._iter = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    self.epoch = epoch
    self._npr_removed = npr_removed
    self.epoch_size = len(ds)  # prompts this process sees in this epoch
    self._warn_npr_left(epoch, len(active))

  def _warn_npr_left(self, epoch: int, active: int) -> None:
    total = len(self._prompts)
    crossed = [f for f in NPR_LEFT_WARNINGS if active <= f * total and f < self._warned_left]
    if not crossed or self.process_index != 0:
      return
    self._warned_left = min(crossed)
    log.warning("No-Positive-Resampling has removed %d of the %d training prompts: epoch %d holds the %d (%.0f %%) "
                "never solved at pass rate >= data.npr.threshold, the hardest, and the zero-variance filter will keep "
                "few groups per step (a collapse risk: watch eval/pass_rate and train/kept_prompts). A larger "
                "training split (data.num_train or more rows: a new run) or data.npr.enabled=false (allowed on "
                "resume) keeps the batches full",
                total - active, total, epoch, active, 100.0 * active / total)

  def next_batch(self, npr_count: Optional[int] = None) -> list[types.Prompt]:
    """The next `batch_size` prompts; crosses into the next epoch (re-filtered by NPR: the first `npr_count`
    solved prompts, default all solved so far) when this one ends."""
    batch = []
    while len(batch) < self.batch_size:
      try:
        batch.append(self._prompts[int(next(self._iter))])
      except StopIteration:
        filtering = self.npr is not None and self.npr.cfg.enabled
        count = (self.npr.num_removed if npr_count is None else npr_count) if filtering else 0
        self._start_epoch(self.epoch + 1, count)
    return batch

  def get_state(self) -> dict:
    """JSON-able; restore with set_state on a pipeline built from the same records, config and shard."""
    it = {k: int(v) if isinstance(v, (int, np.integer)) else v for k, v in self._iter.get_state().items()}
    return {"version": _STATE_VERSION, "epoch": self.epoch, "npr_removed": self._npr_removed, "iterator": it,
            "fingerprint": self._fingerprint}

  def set_state(self, state: dict) -> None:
    if state.get("version") != _STATE_VERSION:
      raise DataError(f"prompt pipeline state version {state.get('version')!r} is not {_STATE_VERSION}")
    if state["fingerprint"] != self._fingerprint:
      raise DataError("the checkpoint's prompt pipeline was built from different training prompts, data.seed or "
                      "process sharding; it cannot resume this data order")
    have = self.npr.num_removed if self.npr is not None else 0
    if state["npr_removed"] > have:
      raise DataError(f"the pipeline state expects {state['npr_removed']} NPR-removed prompts but the NPR state has "
                      f"{have}; restore the NPR state from the same checkpoint first")
    self._start_epoch(int(state["epoch"]), int(state["npr_removed"]))
    self._iter.set_state(dict(state["iterator"]))

  def metrics(self) -> dict[str, float]:
    return {"data/epoch": self.epoch, "data/epoch_size": self.epoch_size, **{f"data/{k}": v for k, v in
                                                                            self.counts.items()}}


class RatioStream:
  """Batches with a fixed share per task (data.task_mix=ratio): one PromptStream per task, each with its own
  shuffle, epochs and exact resume, all filtered by the same NPR state (its solved ids are global), and every
  batch the concatenation of one batch of each (`batch_sizes`, in task order). Same face as PromptStream."""

  def __init__(self, pools: dict[str, Sequence[Record]], batch_sizes: dict[str, int], cfg, tokenizer,
               max_prefill_len: int, **kwargs):
    self.streams = {name: PromptStream(pools[name], cfg, tokenizer, max_prefill_len, batch_size=size, **kwargs)
                    for name, size in batch_sizes.items() if size > 0}
    self.batch_size = sum(batch_sizes.values())

  def next_batch(self, npr_count: Optional[int] = None) -> list[types.Prompt]:
    return [p for stream in self.streams.values() for p in stream.next_batch(npr_count)]

  def get_state(self) -> dict:
    return {name: stream.get_state() for name, stream in self.streams.items()}

  def set_state(self, state: dict) -> None:
    if set(state) != set(self.streams):
      raise DataError(f"the checkpoint's prompt pipeline holds the tasks {sorted(state)}, this run "
                      f"{sorted(self.streams)}: it cannot resume this data order")
    for name, stream in self.streams.items():
      stream.set_state(state[name])

  def metrics(self) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, stream in self.streams.items():
      out.update({f"{k}_{name}" if k in ("data/epoch", "data/epoch_size") else k: v
                  for k, v in stream.metrics().items()})
    out["data/epoch"] = min(stream.epoch for stream in self.streams.values())
    return out


def make_prompt_stream(task, cfg, tokenizer, max_prefill_len: int, *, process_count: int = 1, **kwargs):
  """The run's training prompts: a PromptStream over `task.train_records()`, or with data.task=mixed and
  data.task_mix=ratio a RatioStream giving every batch round(code_fraction * batch) code prompts."""
  if cfg.task == "mixed" and cfg.task_mix == "ratio":
    batch = cfg.prompts_per_step // process_count
    code = round(cfg.code_fraction * batch)
    return RatioStream(task.task_records(), {"math": batch - code, "code": code}, cfg, tokenizer, max_prefill_len,
                       process_count=process_count, counts=task.counts, **kwargs)
  return PromptStream(task.train_records(), cfg, tokenizer, max_prefill_len, process_count=process_count,
                      counts=task.counts, **kwargs)
