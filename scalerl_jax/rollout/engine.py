"""Rollout engine: the two jitted calls the RL driver makes, over `max_slots` decode slots.

    prefill_insert(params, state, prompts, rows, slots, uids, samples, base_key) -> DecodeState
                    one forward over the P padded prompts (bucket width Lb), then their KV copied into M slots
                    (one prompt row can fill G slots: G samples of one prompt)
    generate(params, state, version, steps=N) -> (state, StepResults)
                    N decode steps over all slots in ONE jitted loop

Both are composed of public building blocks (`prefill_rows`, `insert_rows`, `over_slots`, `pad_prompts`,
`pad_inserts`), from which jetstream_adapter.py builds JetStream's single-prompt prefill and insert.

Decode slots sharded over the mesh's "data" axis run insert and the decode loop per shard (shard_map, no
collectives); other mesh axes stay under automatic partitioning.

Params are an explicit argument of every call and must be in `param_shardings` (the rollout layout on the
engine's mesh; the pipeline's weight_sync module puts them there), so an in-flight weight update is passing a new
pytree with the same shapes and shardings between two `generate` calls: no recompilation, no drain, and the KV of
earlier tokens (computed by the old params) stays (PipelineRL).

Semantics of the decode loop, per slot (B = max_slots, S = cache length, N = steps in this call):
  * A slot holds the prompt's KV for positions < L-1 and feeds the last prompt token at position L-1 in its first
    step; step t writes the KV of its input token, then samples the next token. Positions beyond a slot's current
    one are never read (the attention mask is `key position <= query position`), so a slot's output does not
    depend on what ran in it before.
  * Each sample has its own key, derived on device from (driver seed, prompt uid, sample index); step keys fold
    in the number of tokens emitted so far. Results are thus reproducible by seed and independent of which slot
    a sample lands in or how decode steps are chunked into calls.
  * Forced interruption: every sample draws a thinking budget from U[think_budget_min, think_budget_max]. When it
    has emitted that many tokens without the end-of-thinking marker, the phrase tokens are forced (one per step,
    log-prob 0, version -1, flagged `forced`), then up to `answer_budget` more tokens are sampled.
  * A slot stops on a sampled stop token (kept in the output), or is truncated at `max_new_tokens` emitted tokens
    (forced ones included) or when the answer budget runs out.
  * Every emitted token records the version passed to the call that produced it (-1 for forced tokens).

Shape legend: scalerl_jax/types.py (here P prompts of a prefill call, Lb its bucket width, M inserts of one call,
N decode steps of one generate call); W, the end-marker length, is local to `DecodeState.recent_BW`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import RolloutConfig
from scalerl_jax.model.policy import Params, Policy
from scalerl_jax.model.layers import LayerCache
from scalerl_jax.rollout import sampling as sampling_lib
from scalerl_jax.rollout.sampling import SamplingParams


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prefix:
  """Prefilled prompts: KV of every bucket position (positions >= length are overwritten before being read)."""
  cache: list  # list[LayerCache], k [P, K, H, Lb], v [P, K, Lb, H]
  tokens_PL: jax.Array  # int32 prompt tokens, right-padded to the bucket width Lb
  lengths_P: jax.Array  # int32 true lengths
  routes_PLXk: Optional[jax.Array] = None  # int16 MoE: each position's top-k experts per MoE layer X


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  """Everything the decode loop carries, one row per slot."""
  cache: list  # list[LayerCache], k [B, K, H, S], v [B, K, S, H], in rollout.kv_cache_dtype
  token_B: jax.Array  # int32 next input token
  pos_B: jax.Array  # int32 its absolute position
  n_gen_B: jax.Array  # int32 tokens emitted so far (forced included)
  active_B: jax.Array  # bool
  key_B: jax.Array  # typed PRNG key per sample
  budget_B: jax.Array  # int32 thinking budget
  force_B: jax.Array  # int32 index of the next phrase token being forced, -1 when not forcing
  think_done_B: jax.Array  # bool: end marker seen or phrase inserted
  interrupted_B: jax.Array  # bool: the phrase was inserted
  answer_left_B: jax.Array  # int32 sampled tokens still allowed after the phrase
  truncated_B: jax.Array  # bool: stopped by a length limit
  recent_BW: jax.Array  # int32 last W emitted tokens, W = end-marker length (matching the marker)
  # int16 [B, max_prefill_len, X, k] MoE: the top-k experts prefill chose at each prompt position, per MoE layer
  prompt_routes_BLXk: Optional[jax.Array] = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepResults:
  """Output of one `generate` call. Column j holds what a slot emitted at the j-th step of the call; the valid
  columns of a slot are a prefix (a slot only stops, it never starts, inside a call).

  Stored as three arrays, so fetching a call's results is three device-to-host copies (per shard), not nine;
  read it through the properties, which work on device arrays and on the numpy copy from `jax.device_get`."""
  ints_BN3: jax.Array  # int32 [token, version (-1 for forced tokens), flags: VALID | FORCED]
  logprobs_BN: jax.Array  # float32, 0 for forced tokens
  rows_B4: jax.Array  # int32 [finished during this call, truncated, interrupted, tokens emitted so far]
  # int16 MoE: the top-k experts of the token a slot fed at each step (its input, at position pos), per MoE layer
  routes_BNXk: Optional[jax.Array] = None

  VALID, FORCED = 1, 2  # flag bits

  tokens_BN = property(lambda self: self.ints_BN3[..., 0])
  versions_BN = property(lambda self: self.ints_BN3[..., 1])
  valid_BN = property(lambda self: (self.ints_BN3[..., 2] & self.VALID) != 0)  # the slot emitted a token
  forced_BN = property(lambda self: (self.ints_BN3[..., 2] & self.FORCED) != 0)
  done_B = property(lambda self: self.rows_B4[:, 0] != 0)  # the slot finished during this call
  truncated_B = property(lambda self: self.rows_B4[:, 1] != 0)
  interrupted_B = property(lambda self: self.rows_B4[:, 2] != 0)
  n_gen_B = property(lambda self: self.rows_B4[:, 3])  # tokens emitted so far (forced included)


def _pow4(n: int, lo: int = 1) -> int:
  """Smallest lo * 4**k >= n: coarse padding keeps the number of compiled prefill/insert shapes small (at most
  4x wasted rows, on the cheap prefill, not on decode)."""
  size = lo
  while size < n:
    size *= 4
  return size


class Engine:
  """Jitted prefill_insert / multi-step generate over `max_slots` decode slots on `mesh`.

  stop_ids: sampled tokens that end a sample (kept in its output). phrase_ids / end_marker_ids: the tokenized
  end-of-thinking phrase that forced interruption inserts, and the model's own end-of-thinking marker.
  """

  def __init__(self, policy: Policy, cfg: RolloutConfig, mesh: Mesh, *, stop_ids: Sequence[int] = (),
               phrase_ids: Sequence[int] = (), end_marker_ids: Sequence[int] = (), cache_len: Optional[int] = None,
               rules=mesh_lib.ROLLOUT_RULES):
    self.policy, self.cfg, self.mesh = policy, cfg, mesh
    it = cfg.interruption
    self.interrupt = bool(it.enabled)
    if self.interrupt and not phrase_ids:
      raise ValueError("rollout.interruption.enabled needs the tokenized phrase: pass phrase_ids")
    self.stop_ids = tuple(int(t) for t in stop_ids)
    self.phrase_ids = tuple(int(t) for t in phrase_ids)
    self.end_marker_ids = tuple(int(t) for t in end_marker_ids)
    self.buckets = tuple(cfg.prefill_buckets)
    self.cache_len = cache_len or cfg.max_prefill_len + cfg.max_new_tokens
    if self.cache_len < cfg.max_prefill_len + cfg.max_new_tokens:
      raise ValueError(f"cache_len={self.cache_len} cannot hold max_prefill_len + max_new_tokens")
    self.default_sampling = SamplingParams.from_config(cfg)
    self._version = (None, None)  # (version, its int32 scalar on the mesh)
    # MoE: (MoE layers, experts per token) of the routes every prefill and decode step records (None: dense)
    mc = policy.cfg
    self.routes_Xk = (len(mc.moe_layers), mc.experts_per_token) if mc.moe_layers else None

    B, S, mc = cfg.max_slots, self.cache_len, policy.cfg
    self.param_shardings = mesh_lib.logical_to_sharding(policy.logical_axes, policy.param_shapes, mesh, rules)
    spec = lambda axes, shape: NamedSharding(mesh, mesh_lib.logical_to_spec(axes, shape, mesh, rules))
    layer_cache = LayerCache(spec(("batch", "kv_heads", "head_dim", None), (B, mc.num_kv_heads, mc.head_dim, S)),
                             spec(("batch", "kv_heads", None, "head_dim"), (B, mc.num_kv_heads, S, mc.head_dim)))
    row = spec(("batch",), (B,))
    abstract = jax.eval_shape(self._empty_state)
    self.state_shardings = dataclasses.replace(
        jax.tree.map(lambda x: row if x.ndim == 1 else spec(("batch", None), x.shape), abstract),
        cache=[layer_cache] * mc.num_layers)

    self._init_state = jax.jit(self._empty_state, out_shardings=self.state_shardings)
    self._init_params = jax.jit(policy.init, out_shardings=self.param_shardings)
    self._prefill_insert = jax.jit(self._prefill_insert_impl, donate_argnums=(1,))
    self._prompt_routes = jax.jit(lambda state, slots: state.prompt_routes_BLXk[slots])
    self._generate = jax.jit(self._generate_sharded, static_argnames=("steps", "sampling"), donate_argnums=(1,))
    # Decode slots sharded over the mesh's "data" axis are independent, so insert and generate run per shard
    # (`over_slots`): no collectives, no step waits on a cross-device "any slot still active?", and a shard
    # stops as soon as its own slots finish. Other mesh axes (tensor) stay under automatic partitioning.
    self.data_shards = mesh.shape.get("data", 1) if self.state_shardings.token_B.spec[:1] == ("data",) else 1

  # ---- shapes, params and state ---------------------------------------------------------------------------
  def bucket(self, length: int) -> int:
    for b in self.buckets:
      if length <= b:
        return b
    raise ValueError(f"prompt of {length} tokens exceeds rollout.max_prefill_len={self.cfg.max_prefill_len}")

  def init_params(self, seed: int) -> Params:
    return self._init_params(jax.random.key(seed))

  def init_decode_state(self) -> DecodeState:
    return self._init_state()

  def _empty_state(self) -> DecodeState:
    B = self.cfg.max_slots
    zi = lambda *shape: jnp.zeros((B,) + shape, jnp.int32)
    zb = lambda: jnp.zeros((B,), bool)
    return DecodeState(
        cache=self.policy.init_cache(B, self.cache_len, self.cfg.kv_cache_dtype), token_B=zi(), pos_B=zi(),
        n_gen_B=zi(), active_B=zb(), key_B=jax.random.split(jax.random.key(0), B), budget_B=zi(),
        force_B=zi() - 1, think_done_B=zb(),
        interrupted_B=zb(), answer_left_B=zi(), truncated_B=zb(),
        recent_BW=zi(max(1, len(self.end_marker_ids))) - 1,
        prompt_routes_BLXk=None if self.routes_Xk is None else jnp.full(
            (B, self.cfg.max_prefill_len) + self.routes_Xk, -1, jnp.int16))

  def _constrain(self, state: DecodeState) -> DecodeState:
    return jax.lax.with_sharding_constraint(state, self.state_shardings)

  def over_slots(self, fn, state: DecodeState, *replicated, out_rows=1):
    """`fn(state, *replicated)` on each data shard of the slots (shard_map), or whole when the slots are not
    sharded; `fn` returns a state, or a tuple of `out_rows` row-sharded trees (the state first). Traceable."""
    if self.data_shards > 1:
      rows = jax.tree.map(lambda _: P("data"), state)
      out = rows if out_rows == 1 else (rows,) + (P("data"),) * (out_rows - 1)
      fn = jax.shard_map(fn, mesh=self.mesh, in_specs=(rows,) + (P(),) * len(replicated), out_specs=out,
                         axis_names={"data"}, check_vma=False)
    out = fn(state, *replicated)
    return self._constrain(out) if out_rows == 1 else (self._constrain(out[0]),) + tuple(out[1:])

  # ---- prefill / insert ------------------------------------------------------------------------------------
  def prefill_rows(self, params, tokens_PL, lengths_P) -> Prefix:
    """The forward over padded prompts (traceable): KV of every bucket position."""
    _, cache, router = self.policy.forward_routed(params, tokens_PL)
    return Prefix(cache=cache, tokens_PL=tokens_PL, lengths_P=lengths_P, routes_PLXk=_stack_routes(router))

  def insert_rows(self, state: DecodeState, prefix: Prefix, plan_4M, base_key) -> DecodeState:
    """Scatter prefix rows into this shard's slots (traceable; run it through `over_slots`). `plan_4M` rows:
    prefix row, global slot (padding entries use an index >= the total slot count; every entry outside this
    shard's range is dropped), prompt uid, sample."""
    rows_M, slots_M, uids_M, samples_M = plan_4M
    if self.data_shards > 1:
      B = state.token_B.shape[0]
      first = jax.lax.axis_index("data") * B
      slots_M = jnp.where((slots_M >= first) & (slots_M < first + B), slots_M - first, B)
    Lb = prefix.tokens_PL.shape[1]
    put_k = lambda c, p: c.at[slots_M, :, :, :Lb].set(p[rows_M].astype(c.dtype), mode="drop")
    put_v = lambda c, p: c.at[slots_M, :, :Lb].set(p[rows_M].astype(c.dtype), mode="drop")
    cache = [LayerCache(put_k(c.k_BKHS, p.k_BKHS), put_v(c.v_BKSH, p.v_BKSH))
             for c, p in zip(state.cache, prefix.cache)]
    len_M = prefix.lengths_P[rows_M]
    keys_M = jax.vmap(lambda u, s: jax.random.fold_in(jax.random.fold_in(base_key, u), s))(uids_M, samples_M)
    budget_key_M, decode_key_M = jax.vmap(lambda k: tuple(jax.random.split(k)))(keys_M)
    it = self.cfg.interruption
    if self.interrupt:
      budget_M = jax.vmap(lambda k: jax.random.randint(k, (), it.think_budget_min, it.think_budget_max + 1))(
          budget_key_M)
    else:
      budget_M = jnp.full(slots_M.shape, jnp.iinfo(jnp.int32).max, jnp.int32)
    put = lambda x, v: x.at[slots_M].set(v, mode="drop")
    M = slots_M.shape[0]
    state = DecodeState(
        cache=cache, token_B=put(state.token_B, prefix.tokens_PL[rows_M, len_M - 1]),
        pos_B=put(state.pos_B, len_M - 1), n_gen_B=put(state.n_gen_B, 0),
        active_B=put(state.active_B, True), key_B=put(state.key_B, decode_key_M),
        budget_B=put(state.budget_B, budget_M), force_B=put(state.force_B, -1),
        think_done_B=put(state.think_done_B, False), interrupted_B=put(state.interrupted_B, False),
        answer_left_B=put(state.answer_left_B, 0), truncated_B=put(state.truncated_B, False),
        recent_BW=put(state.recent_BW, jnp.full((M, state.recent_BW.shape[1]), -1, jnp.int32)),
        prompt_routes_BLXk=None if prefix.routes_PLXk is None else
        state.prompt_routes_BLXk.at[slots_M, :Lb].set(prefix.routes_PLXk[rows_M], mode="drop"))
    return state

  def _prefill_insert_impl(self, params, state, tokens_PL, lengths_P, plan_4M, base_key):
    """Each data shard prefills every prompt of the call itself (prompts are few and short next to decode) and
    keeps the KV its own slots need: no collective moves the prefix."""
    def local(state, params, tokens_PL, lengths_P, *insert_args):
      return self.insert_rows(state, self.prefill_rows(params, tokens_PL, lengths_P), *insert_args)
    return self.over_slots(local, state, params, tokens_PL, lengths_P, plan_4M, base_key)

  def pad_prompts(self, prompts: Sequence[np.ndarray]):
    """Host-side padding: length to the largest prompt's bucket, count to a power of four (bounded recompiles)."""
    Lb = self.bucket(max(len(p) for p in prompts))
    tokens_PL = np.zeros((_pow4(len(prompts)), Lb), np.int32)
    lengths_P = np.ones((tokens_PL.shape[0],), np.int32)
    for i, p in enumerate(prompts):
      tokens_PL[i, :len(p)] = p
      lengths_P[i] = len(p)
    return tokens_PL, lengths_P

  def pad_inserts(self, rows, slots, uids, samples):
    """The insert plan as one int32 [4, M] array (one host-to-device copy): rows, slots, uids, samples, padded
    to a power of four with entries aimed at slot index max_slots (dropped)."""
    M = min(_pow4(len(slots), 8), self.cfg.max_slots)
    plan_4M = np.zeros((4, M), np.int32)
    plan_4M[1] = self.cfg.max_slots
    for i, x in enumerate((rows, slots, uids, samples)):
      plan_4M[i, :len(slots)] = np.asarray(x, np.int32)
    return plan_4M

  def prefill_insert(self, params: Params, state: DecodeState, prompts: Sequence[np.ndarray], rows, slots, uids,
                     samples, base_key: jax.Array) -> DecodeState:
    """Prefill the prompts and insert M samples in one dispatch: sample m goes to slots[m] from prompts[rows[m]],
    as sample samples[m] of prompt uids[m] (its keys derive from these). `state` is donated."""
    tokens_PL, lengths_P = self.pad_prompts(prompts)
    return self._prefill_insert(params, state, tokens_PL, lengths_P, self.pad_inserts(rows, slots, uids, samples),
                                base_key)

  def prompt_routes(self, state: DecodeState, slots: Sequence[int]) -> np.ndarray:
    """MoE: host int16 [len(slots), max_prefill_len, X, k], the experts prefill chose for the prompts now in
    `slots` (positions past a prompt's bucket read -1)."""
    padded = np.zeros((_pow4(len(slots), 8),), np.int32)
    padded[:len(slots)] = slots
    return np.asarray(jax.device_get(self._prompt_routes(state, padded)))[:len(slots)]

  # ---- generate --------------------------------------------------------------------------------------------
  def generate(self, params: Params, state: DecodeState, version: int = 0, steps: Optional[int] = None,
               sampling: Optional[SamplingParams] = None) -> tuple[DecodeState, StepResults]:
    """Up to `steps` decode steps over all slots in one jitted loop (stops early once no slot is active).
    `version` is traced: a new version or new params (same layout) never recompile. `state` is donated."""
    cached = self._version  # the latest version on device: one host-to-device copy per update (a local, so
    if cached[0] != version:  # threads generating at different versions each pass their own)
      cached = self._version = (version, jax.device_put(np.int32(version), NamedSharding(self.mesh, P())))
    return self._generate(params, state, cached[1], steps=steps or self.cfg.decode_chunk,
                          sampling=sampling or self.default_sampling)

  def _generate_sharded(self, params, state: DecodeState, version, *, steps: int, sampling: SamplingParams):
    loop = lambda state, params, version: self._generate_impl(params, state, version, steps=steps, sampling=sampling)
    return self.over_slots(loop, state, params, version, out_rows=2)

  def _generate_impl(self, params, state: DecodeState, version, *, steps: int, sampling: SamplingParams):
    """The decode loop over this shard's slots (all slots on a mesh without a sharded data axis)."""
    B, N = state.token_B.shape[0], steps
    out = (jnp.zeros((B, N, 3), jnp.int32).at[:, :, 1].set(-1), jnp.zeros((B, N), jnp.float32))
    if self.routes_Xk is not None:
      out += (jnp.full((B, N) + self.routes_Xk, -1, jnp.int16),)

    def cond(carry):
      i, st, _ = carry
      return (i < N) & jnp.any(st.active_B)

    u_BN2 = sampling_lib.uniforms(state.key_B, state.n_gen_B, N)  # a slot active at step i has emitted n_gen + i

    def body(carry):
      i, st, out = carry
      u_B2 = jax.lax.dynamic_index_in_dim(u_BN2, i, axis=1, keepdims=False)
      st, cols = self._decode_step(params, st, version, sampling, u_B2)
      out = tuple(o.at[:, i].set(c) for o, c in zip(out, cols))
      return i + 1, st, out

    _, final, out = jax.lax.while_loop(cond, body, (jnp.int32(0), state, out))
    rows_B4 = jnp.stack([state.active_B & ~final.active_B, final.truncated_B, final.interrupted_B],
                        axis=1).astype(jnp.int32)
    return final, StepResults(*out[:2], rows_B4=jnp.concatenate([rows_B4, final.n_gen_B[:, None]], axis=1),
                              routes_BNXk=out[2] if len(out) > 2 else None)

  def _decode_step(self, params, st: DecodeState, version, sp: SamplingParams, u_B2):
    cfg, it = self.cfg, self.cfg.interruption
    h_B1D, cache, router = self.policy.forward_routed(params, st.token_B[:, None], st.pos_B[:, None], st.cache)
    logits_BV = self.policy.logits(params, h_B1D)[:, 0]
    sampled_B, logp_B = sampling_lib.sample(logits_BV, u_B2, sp)
    act = st.active_B
    if self.interrupt:
      phrase = jnp.asarray(self.phrase_ids, jnp.int32)
      start = act & ~st.think_done_B & (st.force_B < 0) & (st.n_gen_B >= st.budget_B)
      forcing = act & ((st.force_B >= 0) | start)
      fidx = jnp.where(start, 0, st.force_B)
      tok = jnp.where(forcing, phrase[jnp.clip(fidx, 0, len(self.phrase_ids) - 1)], sampled_B)
      phrase_end = forcing & (fidx + 1 >= len(self.phrase_ids))
      force_B = jnp.where(forcing & ~phrase_end, fidx + 1, -1)
      answering = act & ~forcing & st.interrupted_B
      answer_left = jnp.where(phrase_end, it.answer_budget, st.answer_left_B - answering)
      interrupted = st.interrupted_B | start
    else:
      forcing = phrase_end = answering = jnp.zeros_like(act)
      tok, force_B, answer_left, interrupted = sampled_B, st.force_B, st.answer_left_B, st.interrupted_B
    sampled = act & ~forcing
    recent = jnp.where(act[:, None], jnp.concatenate([st.recent_BW[:, 1:], tok[:, None]], axis=1), st.recent_BW)
    think_done = st.think_done_B | phrase_end
    if self.interrupt and self.end_marker_ids:
      marker = jnp.asarray(self.end_marker_ids, jnp.int32)
      think_done = think_done | (sampled & jnp.all(recent == marker[None, :], axis=1))
    if self.stop_ids:
      stop = sampled & jnp.any(tok[:, None] == jnp.asarray(self.stop_ids, jnp.int32)[None, :], axis=1)
    else:
      stop = jnp.zeros_like(act)
    n_gen = st.n_gen_B + act
    trunc = act & ~stop & ((n_gen >= cfg.max_new_tokens) | (answering & (answer_left <= 0)))
    new = DecodeState(
        cache=cache, token_B=jnp.where(act, tok, st.token_B), pos_B=st.pos_B + act, n_gen_B=n_gen,
        active_B=act & ~stop & ~trunc, key_B=st.key_B, budget_B=st.budget_B, force_B=force_B,
        think_done_B=think_done, interrupted_B=interrupted, answer_left_B=answer_left,
        truncated_B=st.truncated_B | trunc, recent_BW=recent, prompt_routes_BLXk=st.prompt_routes_BLXk)
    flags = act * StepResults.VALID + forcing * StepResults.FORCED
    cols = (jnp.stack([tok, jnp.where(forcing, -1, version), flags], axis=1), jnp.where(forcing, 0.0, logp_B))
    if self.routes_Xk is not None:
      cols += (_stack_routes(router)[:, 0],)
    return new, cols


def _stack_routes(router):
  """int16 [B, T, X, k]: the own top-k ids ([B, T, k]) of each MoE layer's RouterStats; None for a dense policy."""
  if not router:
    return None
  return jnp.stack([r.expert_ids_BTk for r in router], axis=2).astype(jnp.int16)
