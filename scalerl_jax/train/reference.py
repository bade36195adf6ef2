"""Frozen policies the loss compares with (rl/reference.py has the formulas): the KL reference (loss.kl_coef > 0)
and the distillation teacher (loss.distill_teacher).

    loss.reference / loss.distill_teacher ──load_pretrained (TRAIN_RULES, trainer mesh)──► Frozen(policy, params)
    TrainBatch ──reference_logprobs (jit, one forward per micro-batch, no grad)──► batch.ref_logprobs / teacher_logprobs
    ──► the train step (unchanged: the loss reads them like gen_logprobs)

Each frozen policy's params are read by the loader the run's own pretrained params use (`load_pretrained`: a Hugging
Face directory or a GGUF file; a run's checkpoint after launch/export.py), placed on the trainer mesh with the
policy's sharding rules, and never touch the optimizer (no gradient, no optimizer state, not checkpointed).
`loss.reference=initial` is the params the run started from: a copy made before the first step (the train step
donates its state), rebuilt the same way on a resume (the pretrained checkpoint, the warm start's cache, or the
seed's init). A frozen policy may have its own architecture (a bigger teacher); its tokenizer must be the
student's (`check_same_tokenizer`), since the log-probs compare token ids.

Its log-probs are computed once per step, outside the train step, by one jitted forward per micro-batch of the
same split (so its activations are a micro-batch's, like the step's), at the sampling temperature like the
policy's own, over the whole rows (prompt + completion; the loss reads only the loss tokens). A separate jit and
not inside the train step: the step's signature, its donation and its compiled memory checks stay as they were,
the loss stays a function of arrays, and a run with both features off compiles exactly the step it did before.
Its cost goes into the compute meter's trainer FLOPs as forward-only tokens (`frozen_flops`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

from scalerl_jax import types
from scalerl_jax.config import ConfigError
from scalerl_jax.model import Policy, flops_per_token, token_logprobs
from scalerl_jax.train.step import split_micro_batches

# probes whose ids two tokenizers must agree on: the built-in character vocabulary's symbols, then free text
PROBES = ("12+345=357,(6*7)/8-9:x>0|$", "The 17 foxes, 42 owls and 3.5 cats jumped over 9999 lazy dogs!\n"
          "x = (a + b) * c; print(x)")


@dataclasses.dataclass(frozen=True)
class Frozen:
  """A frozen policy on the trainer mesh: which batch field its log-probs fill, where it came from."""
  field: str  # "ref_logprobs" | "teacher_logprobs"
  source: str  # the config key and value it was read from, for messages
  policy: Policy
  params: Any


def tokenizer_fingerprint(tokenizer) -> dict:
  """What two tokenizers must share for token ids to mean the same tokens: size, special ids, the probe's ids."""
  def ids(text):
    try:
      return tuple(tokenizer.encode(text))
    except ValueError:  # outside its vocabulary (the character one has no letters): both must refuse it
      return "not encodable"

  return {"vocab_size": tokenizer.vocab_size, "eos_ids": tuple(tokenizer.eos_ids), "pad_id": tokenizer.pad_id,
          "bos_id": getattr(tokenizer, "bos_id", None), "probe_ids": tuple(ids(p) for p in PROBES)}


def check_same_tokenizer(student, other, student_name: str, other_name: str) -> None:
  """ConfigError naming both checkpoints and the first difference unless `other` tokenizes like `student`."""
  a, b = tokenizer_fingerprint(student), tokenizer_fingerprint(other)
  for key in a:
    if a[key] != b[key]:
      shown = lambda v: str(v) if len(str(v)) < 80 else str(v)[:77] + "..."  # noqa: E731
      raise ConfigError(f"{other_name}: its tokenizer is not the student's ({student_name}): {key} "
                        f"{shown(b[key])} vs {shown(a[key])}; the teacher's log-probs would score other tokens. "
                        "Use a checkpoint with the student's tokenizer")


def frozen_tokenizer(path: str, student_tokenizer):
  """The tokenizer of checkpoint `path`: its own files when it has them, else the built-in character vocabulary
  (a checkpoint exported from a character-tokenizer run carries none)."""
  from scalerl_jax.data.tokenizer import CharTokenizer, tokenizer_from_pretrained
  from scalerl_jax.model.gguf import gguf_path
  own = gguf_path(path) is not None or any((pathlib.Path(path) / n).is_file() for n in (
      "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json"))
  if own:
    return tokenizer_from_pretrained(path)
  return CharTokenizer(getattr(student_tokenizer, "chat_template", ""))


def load_frozen(field: str, key: str, path: str, layout, tokenizer, student_name: str) -> Frozen:
  """The checkpoint at `path` (config key `key`) as a Frozen policy on `layout`'s mesh, its tokenizer checked."""
  from scalerl_jax.model.hf import load_pretrained
  check_same_tokenizer(tokenizer, frozen_tokenizer(path, tokenizer), student_name, f"{key}={path}")
  loaded = load_pretrained(path, dtype="float32", mesh=layout.mesh, rules=layout.rules)
  return Frozen(field, f"{key}={path}", loaded.policy, loaded.params)


def copy_params(params):
  """A copy of `params` with their shardings (the train step donates the state, and with it the params' buffers)."""
  return jax.jit(lambda p: jax.tree.map(jnp.copy, p))(params)


def reference_logprobs(frozen: Frozen, batch: types.TrainBatch, temperature: float, micro_batches: int,
                       block: int = 1):
  """float32[B, T]: the frozen policy's log-probs of `batch.tokens` (logp[:, 0] = 0), one forward per micro-batch of
  the train step's split (rows m::M, or `block`-row groups), rows put back in the batch's order."""
  t = temperature if temperature > 0 else 1.0
  tokens_BT = batch.tokens
  B, T = tokens_BT.shape
  if micro_batches == 1:
    return token_logprobs(frozen.policy, frozen.params, tokens_BT, temperature=t)
  mbs = split_micro_batches(tokens_BT, micro_batches, block)  # [M, B/M, T]
  logp_MbT = jax.lax.map(lambda x: token_logprobs(frozen.policy, frozen.params, x, temperature=t), mbs)
  # undo split_micro_batches: [M, B/(M k), k, T] -> [B/(M k), M, k, T] -> [B, T]
  y = logp_MbT.reshape(micro_batches, B // (micro_batches * block), block, T)
  return jnp.swapaxes(y, 0, 1).reshape(B, T)


def make_reference_fn(frozen: list[Frozen], temperature: float, micro_batches: int, block: int, batch_sh):
  """`fill(batch) -> batch` with every frozen policy's log-probs in its field, jitted once (params are arguments,
  sharded as placed; the output sharded like the batch's token fields)."""
  fields = [f.field for f in frozen]

  def run(params_list, batch):
    return [reference_logprobs(dataclasses.replace(f, params=p), batch, temperature, micro_batches, block)
            for f, p in zip(frozen, params_list)]

  run = jax.jit(run) if batch_sh is None else jax.jit(run, out_shardings=[batch_sh.tokens] * len(frozen))

  def fill(batch: types.TrainBatch) -> types.TrainBatch:
    out = run([f.params for f in frozen], batch)
    return dataclasses.replace(batch, **dict(zip(fields, out)))

  return fill


def frozen_flops(frozen: list[Frozen], tokens: int, context: int) -> float:
  """Analytic FLOPs of the frozen forwards of one step: `tokens` token positions through each frozen policy."""
  return sum(tokens * flops_per_token(f.policy.cfg, context, backward=False) for f in frozen)


def with_frozen_fields(abstract: types.TrainBatch, frozen: list[Frozen]) -> types.TrainBatch:
  """The abstract batch a step with frozen policies compiles for: their fields shaped like gen_logprobs."""
  spec = abstract.gen_logprobs
  return dataclasses.replace(abstract, **{f.field: spec for f in frozen})
