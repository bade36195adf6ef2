"""Serve a policy with JetStream: `jetstream.engine.engine_api.Engine` over our rollout engine.

Optional extra (see requirements-jetstream.txt):  pip install --no-deps -r requirements-jetstream.txt

PyPI's google-jetstream 0.2.2 is archived upstream and needs containment, each piece done here on purpose:
  * TensorFlow: its dependency list pulls TensorFlow (~2.4 GB) only through seqio, which `token_utils` imports
    for SentencePiece types. We install it with --no-deps, serve with `JetStreamTokenizer` (no SentencePiece), and
    while importing JetStream give it a placeholder `seqio.vocabularies` (removed right after; a real seqio is
    used when installed).
  * `jax.tree_map`: removed from jax, but called by the Driver when it frees a prefix (`delete_pytree`); the
    AttributeError would kill the generate thread, and JetThread then SIGKILLs the whole process. The alias is
    scoped: only `jetstream.core.orchestrator` sees a `jax` that has `tree_map`; the real `jax` is untouched.
  * Logging: importing the orchestrator sets the root logger to DEBUG and adds a stdout handler; both are undone.
  * Top-level `benchmarks` package: the wheel installs one into site-packages. This module never imports it;
    our `benchmarks/` must be a regular package (with `__init__.py`) so it wins when run from the repository.

JetStream's Driver reads params once per thread and generates one token per call: serving only, no in-flight
updates (use `RolloutDriver` for RL). Its `prefill` pads prompts to buckets 16, 32, 64, ... capped at
`max_prefill_length`, which must itself be one of them. Its single-prompt prefill and single-slot insert live
here, built from the engine's building blocks (the same ones as the engine's fused `prefill_insert`), so the
core engine carries only what the RL driver calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import itertools
import logging
import sys
import types
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.rollout.engine import DecodeState, Engine, Prefix
from scalerl_jax.rollout.sampling import GREEDY, SamplingParams

INSTALL_HINT = "pip install --no-deps -r requirements-jetstream.txt"


@contextlib.contextmanager
def _contained_jetstream_import():
  root = logging.getLogger()
  level, handlers = root.level, list(root.handlers)
  placeholder = importlib.util.find_spec("seqio") is None
  if placeholder:
    seqio, vocabularies = types.ModuleType("seqio"), types.ModuleType("seqio.vocabularies")

    class Vocabulary:  # type names only; JetStreamTokenizer replaces the SentencePiece tokenizer
      def __init__(self, *args, **kwargs):
        raise ImportError(f"seqio is not installed; serve with JetStreamTokenizer ({INSTALL_HINT})")

    vocabularies.Vocabulary = Vocabulary
    vocabularies.SentencePieceVocabulary = type("SentencePieceVocabulary", (Vocabulary,), {})
    seqio.vocabularies = vocabularies
    sys.modules.update({"seqio": seqio, "seqio.vocabularies": vocabularies})
  try:
    yield
  finally:
    if placeholder:
      sys.modules.pop("seqio", None)
      sys.modules.pop("seqio.vocabularies", None)
    root.setLevel(level)
    for handler in [h for h in root.handlers if h not in handlers]:
      root.removeHandler(handler)


try:
  with _contained_jetstream_import():
    from jetstream.core import orchestrator
    from jetstream.core.utils import async_multifuture
    from jetstream.engine import engine_api, token_utils, tokenizer_api, tokenizer_pb2
except ImportError as exc:  # the optional extra is missing
  raise ImportError(f"scalerl_jax.rollout.jetstream_adapter needs google-jetstream: {INSTALL_HINT}") from exc


class _JaxWithTreeMap(types.ModuleType):
  """`jax` as the orchestrator module sees it: plus `tree_map` (= jax.tree.map), which its Driver still calls."""

  def __init__(self):
    super().__init__("jax")
    self.tree_map = jax.tree.map

  def __getattr__(self, name):
    return getattr(jax, name)


if not hasattr(jax, "tree_map"):
  orchestrator.jax = _JaxWithTreeMap()  # scoped compatibility alias (see module docstring)


class JetStreamTokenizer(tokenizer_api.Tokenizer):
  """JetStream's tokenizer API over ours (scalerl_jax.data.tokenizer: encode/decode, pad/bos/eos ids)."""

  def __init__(self, tokenizer: Any, stop_ids: Sequence[int] = ()):
    if tokenizer.bos_id is None:
      raise ValueError("JetStream's Driver prepends BOS to every prompt: the tokenizer needs a bos_id")
    self._tok, self._stop = tokenizer, {int(t) for t in stop_ids}

  def encode(self, s: str, **kwargs):
    return token_utils.pad_tokens(np.asarray(self._tok.encode(s), np.int32), self.bos_id, self.pad_id,
                                  is_bos=kwargs.get("is_bos", True),
                                  prefill_lengths=kwargs.get("prefill_lengths"),
                                  max_prefill_length=kwargs.get("max_prefill_length"),
                                  jax_padding=kwargs.get("jax_padding", True))

  def decode(self, token_ids: list[int], **kwargs) -> str:
    return self._tok.decode(token_ids)

  @property
  def pad_id(self) -> int:
    return int(self._tok.pad_id)

  @property
  def eos_id(self) -> int:
    return int(self._tok.eos_id)

  @property
  def bos_id(self) -> int:
    return int(self._tok.bos_id)

  @property
  def stop_tokens(self) -> set[int]:
    return {self.eos_id, self.pad_id} | self._stop


@jax.jit
def _pack(tokens_BN, valid_BN, n_gen_B):
  return jnp.stack([tokens_BN[:, 0], valid_BN[:, 0].astype(jnp.int32), n_gen_B], axis=1)


class JetStreamEngine(engine_api.Engine):
  """One decode step per `generate` (JetStream's contract), greedy unless told otherwise. Give the underlying
  engine the tokenizer's stop tokens as stop_ids so finished slots go idle."""

  def __init__(self, engine: Engine, tokenizer: JetStreamTokenizer, params: Any = None,
               sampling: SamplingParams = GREEDY, version: int = 0):
    self._engine, self._tokenizer, self._params = engine, tokenizer, params
    self._sampling, self._version = sampling, version
    self._uids = itertools.count()  # distinct sample keys per request
    self._base_key = jax.random.key(0)
    self._prefill = jax.jit(engine.prefill_rows)
    self._insert = jax.jit(functools.partial(engine.over_slots, engine.insert_rows), donate_argnums=(0,))

  def load_params(self, *args, **kwargs) -> Any:
    return self._params

  def prefill(self, *, params: Any, existing_prefix: Optional[Prefix] = None, padded_tokens: jax.Array,
              true_length: int) -> Prefix:
    """One prompt, re-padded to the engine's bucket: a one-row Prefix."""
    if existing_prefix is not None:
      raise NotImplementedError("multi-turn prefixes are not supported")
    tokens = np.asarray(padded_tokens, np.int32).reshape(-1)[:true_length]
    return self._prefill(params, *self._engine.pad_prompts([tokens]))

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
    """The prefix's row into `slot`, as sample 0 of a fresh uid (its keys derive from it); the state is donated."""
    plan_4M = self._engine.pad_inserts(rows=[0], slots=[slot], uids=[next(self._uids)], samples=[0])
    return self._insert(decode_state, prefix, plan_4M, self._base_key)

  def generate(self, params: Any, decode_state: DecodeState):
    state, res = self._engine.generate(params, decode_state, self._version, 1, self._sampling)
    data = _pack(res.tokens_BN, res.valid_BN, res.n_gen_B)
    return state, engine_api.ResultTokens(data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
                                          samples_per_slot=1)

  def get_prefix_destination_sharding(self) -> Any:
    return jax.sharding.NamedSharding(self._engine.mesh, jax.sharding.PartitionSpec())

  def get_tokenizer(self) -> tokenizer_pb2.TokenizerParameters:
    return tokenizer_pb2.TokenizerParameters(path="scalerl_jax:JetStreamTokenizer")

  def build_tokenizer(self, metadata: tokenizer_pb2.TokenizerParameters) -> JetStreamTokenizer:
    return self._tokenizer

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    return self._engine.init_decode_state()

  @property
  def max_concurrent_decodes(self) -> int:
    return self._engine.cfg.max_slots

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self._engine.cfg.max_prefill_len

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self._engine.mesh

  @property
  def colocated_cpus(self) -> None:
    return None


def serve(engine: JetStreamEngine, params: Any, prompts: Sequence[str | list[int]], max_tokens: int,
          timeout_s: float = 120.0) -> list[list[int]]:
  """Serve prompts (text, or token ids without BOS) through JetStream's Driver in interleaved mode; returns
  the generated token ids of each (stop token excluded, as JetStream does)."""
  driver = orchestrator.Driver(prefill_engines=[engine], generate_engines=[engine], prefill_params=[params],
                               generate_params=[params], interleaved_mode=True)

  async def one(content) -> list[int]:
    request = orchestrator.ActiveRequest(max_tokens=max_tokens, prefill_content=content,
                                         return_channel=async_multifuture.AsyncMultifuture())
    driver.place_request_on_prefill_queue(request)
    tokens: list[int] = []
    async for step in request.return_channel:
      tokens.extend(step[0].token_ids)
    return tokens

  async def all_prompts():
    return await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), timeout_s)

  # The loop must outlive the driver: its detokenize thread still schedules callbacks on a request's loop after
  # the last result, and on a closed loop that raises inside a JetThread, which SIGKILLs the process.
  loop = asyncio.new_event_loop()
  try:
    return loop.run_until_complete(all_prompts())
  finally:
    driver.stop()
    loop.close()
