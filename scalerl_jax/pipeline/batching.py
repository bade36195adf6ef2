"""Scored groups -> a fixed-shape TrainBatch (host numpy): rows packed prompt-major (`pack_groups`), then
advantages, filters and aggregation weights from `rl.prepare` over the whole step batch (`build_train_batch`).
The loss the train step runs on it is in `scalerl_jax.train.rl_loss`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import jax
import numpy as np

from scalerl_jax import rl, types
from scalerl_jax.config import LossConfig
from scalerl_jax.train.rl_loss import PromptLayout


def pack_groups(groups: Sequence[types.ScoredGroup], row_len: int, pad_id: int) -> types.PackedRows:
  """Prompt-major rows (P*G) of prompt + completion tokens padded to `row_len`, with the per-token arrays
  aligned to `tokens` (see scalerl_jax.types; an MoE policy's recorded experts too), each row's prompt length,
  and per-sample arrays as [P, G]."""
  P, G = len(groups), len(groups[0].samples)
  B = P * G
  tokens = np.full((B, row_len), pad_id, np.int32)
  mask = np.zeros((B, row_len), np.float32)
  gen_logp = np.zeros((B, row_len), np.float32)
  versions = np.full((B, row_len), -1, np.int32)
  truncated = np.zeros((P, G), bool)
  lengths = np.zeros((P, G), np.int32)
  prompt_lengths = np.zeros(B, np.int32)
  first = groups[0].samples[0].routes
  routes = None if first is None else np.full((B, row_len) + first.shape[1:], -1, np.int16)
  for p, group in enumerate(groups):
    if len(group.samples) != G:
      raise ValueError(f"group {p} ({group.prompt.prompt_id}) has {len(group.samples)} samples, expected {G}")
    for g, s in enumerate(group.samples):
      b, L, N = p * G + g, len(s.prompt_tokens), len(s.tokens)
      if L + N > row_len:
        raise ValueError(f"prompt {s.prompt_id}: {L} prompt + {N} completion tokens exceed the row length {row_len}")
      tokens[b, :L] = s.prompt_tokens
      tokens[b, L:L + N] = s.tokens
      mask[b, L:L + N] = ~s.forced  # forced-interruption tokens carry no loss
      gen_logp[b, L:L + N] = s.logprobs
      versions[b, L:L + N] = s.versions
      truncated[p, g], lengths[p, g], prompt_lengths[b] = s.truncated, N, L
      if routes is not None:  # positions 0 .. L + N - 2: the last token was never fed to the generator's model
        routes[b, :len(s.routes)] = s.routes
  return types.PackedRows(
      prompt_ids=tuple(g.prompt.prompt_id for g in groups), tokens_BT=tokens, loss_mask_BT=mask,
      gen_logprobs_BT=gen_logp, versions_BT=versions,
      prompt_lengths_B=prompt_lengths, rewards_PG=np.stack([np.asarray(g.rewards, np.float32) for g in groups]),
      success_PG=np.stack([np.asarray(g.success, bool) for g in groups]), truncated_PG=truncated, lengths_PG=lengths,
      routes_BTXk=routes)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _prepare(rewards_PG, loss_mask_BT, truncated_PG, lengths_PG, correct_PG, cfg: LossConfig):
  return rl.prepare(rewards_PG, loss_mask_BT, truncated_PG, cfg, lengths_PG=lengths_PG, correct_PG=correct_PG)


def warm_prepare(shapes: types.StepShapes, cfg: LossConfig) -> None:
  """Compile `rl.prepare` for this batch shape before the loop starts."""
  P, G, B, T = shapes.P, shapes.G, shapes.B, shapes.T
  jax.block_until_ready(_prepare(np.zeros((P, G), np.float32), np.zeros((B, T), np.float32), np.zeros((P, G), bool),
                                 np.zeros((P, G), np.int32), np.zeros((P, G), bool), cfg))


def build_train_batch(packed: types.PackedRows, cfg: LossConfig,
                      layout: Optional[PromptLayout] = None) -> tuple[types.TrainBatch, dict]:
  """Advantages, filters and aggregation weights for the whole step batch (rl.prepare), then a TrainBatch.
  With a `layout` (the shared-prompt loss), every prompt and completion must fit its width."""
  if layout is not None:
    for name, lengths, width in (("prompt", packed.prompt_lengths_B, layout.prompt_width),
                                 ("completion", packed.lengths_PG.reshape(-1), layout.completion_width)):
      if lengths.max() > width:
        b = int(np.argmax(lengths))
        prompt = packed.prompt_ids[b // packed.success_PG.shape[1]]
        raise ValueError(f"prompt {prompt}: {lengths[b]} {name} tokens exceed the trainer's {name} width {width}")
  prep = _prepare(packed.rewards_PG, packed.loss_mask_BT, packed.truncated_PG, packed.lengths_PG, packed.success_PG,
                  cfg)
  batch = types.TrainBatch(tokens=packed.tokens_BT, loss_mask=packed.loss_mask_BT,
                           gen_logprobs=packed.gen_logprobs_BT, advantages=np.asarray(prep.advantages),
                           token_weights=np.asarray(prep.token_weights), sample_weights=np.asarray(prep.sample_weights),
                           prompt_lengths=packed.prompt_lengths_B, routes=packed.routes_BTXk)
  metrics = {k: float(v) for k, v in jax.device_get(prep.metrics).items()}
  metrics["pass_rate"] = float(np.mean(packed.success_PG))
  return batch, metrics


def group_buckets(P: int, buckets: int, unit: int = 1) -> tuple[int, ...]:
  """The group counts a step batch may be cut to (`trainer.batch_buckets` of them, ascending, each a multiple of
  `unit`, the last P): ceil(P * j / buckets) for j = 1..buckets, rounded up to the unit."""
  ceil = lambda a, b: -(-a // b)
  sizes = {min(P, ceil(ceil(P * j, buckets), unit) * unit) for j in range(1, buckets + 1)}
  return tuple(sorted(sizes | {P}))


def kept_groups(batch: types.TrainBatch, G: int) -> np.ndarray:
  """bool[P]: groups with any non-zero loss weight (the rest, zero-variance or empty, add nothing to the loss,
  its gradient or the step's loss metrics, which count only tokens of weight > 0)."""
  P = batch.advantages.shape[0] // G
  return (np.any(batch.token_weights.reshape(P, -1) != 0, axis=1)
          | np.any(batch.sample_weights.reshape(P, G) != 0, axis=1))


def compact_groups(batch: types.TrainBatch, G: int, sizes: Sequence[int]) -> tuple[types.TrainBatch, int]:
  """The step batch cut to the smallest of `sizes` (group counts) that holds every kept group: kept groups first,
  in order, then filtered ones as padding (their weights are 0). Same loss, gradient and loss metrics as the
  whole batch, on fewer rows. Returns (batch, its group count)."""
  keep_P = kept_groups(batch, G)
  groups = next((n for n in sizes if n >= keep_P.sum()), len(keep_P))
  if groups == len(keep_P):
    return batch, groups
  order_P = np.concatenate([np.flatnonzero(keep_P), np.flatnonzero(~keep_P)])[:groups]
  rows = (order_P[:, None] * G + np.arange(G)).reshape(-1)
  take = lambda x: None if x is None else np.asarray(x)[rows]
  return types.TrainBatch(**{f.name: take(getattr(batch, f.name)) for f in dataclasses.fields(batch)}), groups
