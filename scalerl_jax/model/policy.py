"""The functional face of the policy: params as a plain nested dict, pure functions over it, one face for every
model family.

The trainer and the rollout engine both use `Policy` (build it with `make_policy(cfg)`): params are passed
explicitly on every call, so a weight swap is passing a new pytree with the same shapes and shardings (no
recompilation). `token_logprobs` is the one function from (params, tokens) to per-token log-probabilities used on
both sides. `model.family` picks the decoder module and its analytic costs from one table (`family_of`).

Array names carry their shape as a suffix; the letters are the package legend in `scalerl_jax/types.py` (here: P
prompts, G samples per prompt, B = P*G rows, T row tokens, L prompt width, N completion tokens, D hidden, V vocab).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.model import transformer
from scalerl_jax.model import lora as lora_lib
from scalerl_jax.model.layers import LayerCache, SharedPrefix, dtype_of
from scalerl_jax.model.moe import Routing

Params = Any  # nested dict of arrays


@dataclasses.dataclass(frozen=True)
class Family:
  """What a model family supplies. `decoder(cfg, rngs, lora)` is an nnx module whose params carry `logical_axes`
(and, with a lora.LoraSpec, adapters beside the projections it targets), with
  `__call__(tokens_BT, positions_BT, cache, prefix, routing) -> (h_BTD, [LayerCache] per layer, [RouterStats] per
  MoE layer)` and `logits(h_BTD)`."""
  decoder: Callable[[ModelConfig, nnx.Rngs, Optional[lora_lib.LoraSpec]], nnx.Module]
  param_count: Callable[..., int]  # (cfg, active=False), analytic, equals the initialised tree's size
  flops_per_token: Callable[[ModelConfig, int, bool], float]  # (cfg, context, backward) -> matmul FLOPs


# one decoder serves both: `cfg.moe_layers` (empty for dense) decides which layers hold experts
_FAMILIES = {name: Family(transformer.Transformer, transformer.param_count, transformer.flops_per_token)
             for name in ("dense", "moe")}


def family_of(cfg: ModelConfig) -> Family:
  """The family `cfg.family` names; ValueError naming `model.family` when there is none."""
  if cfg.family not in _FAMILIES:
    raise ValueError(f"model.family={cfg.family!r} is not a model family (known: {', '.join(sorted(_FAMILIES))})")
  return _FAMILIES[cfg.family]


class Policy:
  """Stateless wrapper around `cfg.family`'s decoder: `init`, `forward`, `logits`, `init_cache`, plus the param
  tree's logical axes. With `lora` (a lora.LoraSpec) the tree also holds low-rank adapters (model/lora.py)."""

  def __init__(self, cfg: ModelConfig, lora: Optional[lora_lib.LoraSpec] = None):
    self.cfg = cfg
    self.lora = lora
    self.decoder = family_of(cfg).decoder
    abstract = nnx.eval_shape(lambda: self.decoder(cfg, nnx.Rngs(0, lora=1), lora))
    self.graphdef, abstract_state = nnx.split(abstract)
    self._state_treedef = jax.tree.structure(abstract_state)
    self.param_shapes = nnx.to_pure_dict(abstract_state)  # ShapeDtypeStructs
    self._params_treedef = jax.tree.structure(self.param_shapes)
    variables = jax.tree.leaves(abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    self.logical_axes = jax.tree.unflatten(self._params_treedef,
                                           [v.get_metadata()["logical_axes"] for v in variables])

  def init(self, seed: int | jax.Array) -> Params:
    """Fresh params. Pure: wrap in jit with out_shardings so nothing is materialised unsharded. Adapters draw from
    their own stream, so the base params of a seed are the same with and without them."""
    key = seed if isinstance(seed, jax.Array) else jax.random.key(seed)
    streams = {"params": key} if self.lora is None else {"params": key, "lora": jax.random.fold_in(key, 1)}
    return nnx.to_pure_dict(nnx.state(self.decoder(self.cfg, nnx.Rngs(**streams), self.lora)))

  def attach_adapters(self, base: Params, seed: int | jax.Array, shardings: Any = None) -> Params:
    """`base` (this model's tree without adapters: a checkpoint, a warm start) with fresh adapters beside the
    weights they adapt (B = 0: the same function). The adapters are born with `shardings`' (the whole tree's)
    placement; the base arrays are reused, not copied."""
    key = seed if isinstance(seed, jax.Array) else jax.random.key(seed)
    fresh = jax.jit(lambda k: self.split_trainable(self.init(k))[0],  # the base half of init is never computed
                    out_shardings=None if shardings is None else self.split_trainable(shardings)[0])
    return lora_lib.attach(base, fresh(key))

  def split_trainable(self, params: Params) -> tuple[Params, Optional[Params]]:
    """(what trains, what is frozen): the adapters and the rest (None at each other's leaves) when the policy has
    adapters, else (params, None). Works on arrays, ShapeDtypeStructs and shardings alike."""
    if self.lora is None:
      return params, None
    return lora_lib.partition(params, lora_lib.trainable_mask(params))

  @staticmethod
  def join_trainable(trainable: Params, frozen: Optional[Params]) -> Params:
    """`split_trainable`'s inverse."""
    return trainable if frozen is None else lora_lib.combine(trainable, frozen)

  def module(self, params: Params) -> nnx.Module:
    if jax.tree.structure(params) != self._params_treedef:
      raise ValueError("params do not match this model's structure: "
                       f"expected {self._params_treedef}, got {jax.tree.structure(params)}")
    state = jax.tree.unflatten(self._state_treedef, jax.tree.leaves(params))
    return nnx.merge(self.graphdef, state)

  def forward(self, params: Params, tokens_BT, positions_BT=None, cache: Optional[list[LayerCache]] = None,
              prefix: Optional[list[SharedPrefix]] = None):
    """Hidden states [B, T, D] and the per-layer KV (the cache updated in place when one is given; with a
    `prefix`, the tokens also attend to that read-only KV)."""
    return self.forward_routed(params, tokens_BT, positions_BT, cache, prefix)[:2]

  def forward_routed(self, params: Params, tokens_BT, positions_BT=None, cache: Optional[list[LayerCache]] = None,
                     prefix: Optional[list[SharedPrefix]] = None, routing: Optional[Routing] = None):
    """`forward` plus the RouterStats of each MoE layer ([] for a dense model); `routing` passes the generator's
    recorded experts (compared with this model's choice, or replayed) and the tokens the statistics count."""
    if positions_BT is None:
      positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
    return self.module(params)(tokens_BT, positions_BT, cache, prefix, routing)

  def logits(self, params: Params, h_BTD):
    return self.module(params).logits(h_BTD)

  def init_cache(self, batch: int, length: int, dtype: str = "model") -> list[LayerCache]:
    """Zero KV cache of `batch` rows and `length` positions per layer, stored in `dtype` (a config name, or
    "model": model.dtype; attention casts on write and on read, so bfloat16 halves the bytes decode streams)."""
    c = self.cfg
    dt = dtype_of(c.dtype if dtype == "model" else dtype)
    zeros = lambda *shape: jnp.zeros((batch, c.num_kv_heads) + shape, dt)
    return [LayerCache(zeros(c.head_dim, length), zeros(length, c.head_dim)) for _ in range(c.num_layers)]


def _gather_logprobs(logits_BTV, targets_BT, temperature: float):
  logits_BTV = logits_BTV.astype(jnp.float32)
  if temperature != 1.0:
    logits_BTV = logits_BTV / temperature
  logz_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  picked_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return picked_BT - logz_BT


def token_logprobs(policy: Policy, params: Params, tokens_BT, temperature: float = 1.0):
  """logp[b, t] = log softmax(logits(tokens[b, :t]) / temperature)[tokens[b, t]]; logp[:, 0] = 0.

  The sampler computes the same quantity token by token (same LM head, same temperature); the trainer's
  importance ratio compares the two. Top-p / top-k truncation is not replicated here: with them on, the
  sampler's recorded log-probs are of the truncated distribution and the ratio absorbs the difference.
  """
  return token_logprobs_routed(policy, params, tokens_BT, temperature)[0]


def token_logprobs_routed(policy: Policy, params: Params, tokens_BT, temperature: float = 1.0,
                          routing: Optional[Routing] = None):
  """(`token_logprobs`, RouterStats per MoE layer) with `routing` given to the forward (see `Policy.forward_routed`;
  its arrays are aligned with `tokens_BT`)."""
  h_BTD, _, router = policy.forward_routed(params, tokens_BT, routing=routing)
  logp_BT1 = _gather_logprobs(policy.logits(params, h_BTD[:, :-1]), tokens_BT[:, 1:], temperature)
  return jnp.pad(logp_BT1, ((0, 0), (1, 0))), router


def completion_logprobs(policy: Policy, params: Params, tokens_BT, prompt_len_B, group_size: int,
                        prompt_width: int, completion_width: int, temperature: float = 1.0,
                        routing: Optional[Routing] = None):
  """The log-probs `token_logprobs` gives on each row's completion, with each prompt computed once per group.

  Rows are prompt-major groups: rows [p*G, (p+1)*G) hold the same prompt in `tokens[b, :prompt_len_B[b]]`
  (`prompt_len_B[b] <= prompt_width`) followed by that row's completion (layout of `scalerl_jax.types`). The
  prompt runs through the model on B/G rows; the completions attend to its KV, repeated over the group, and to
  themselves. For RL groups (8-16 samples of one prompt) this removes the prompt's share of the trainer's work.

  `routing` (MoE), aligned with `tokens_BT`: the prompt pass reads each group's first row, the completion pass
  the completion columns (mask off past the row's end). The router statistics count what full rows count: the
  prompt pass weighs each prompt token by the group's rows that count it, and never counts the first row's
  completion tokens that fall inside `prompt_width` (the completion pass counts those).

  Returns (logp_BN, cols_BN, router): `logp_BN[b, t] == token_logprobs(policy, params, tokens_BT)[b, cols_BN[b, t]]`
  with `cols_BN[b, t] = prompt_len_B[b] + t` for t < `completion_width`; columns at or past the row's end
  (cols >= T) read 0. `router`: the RouterStats of each MoE layer, summed over both passes.
  """
  B, T = tokens_BT.shape
  G = group_size
  if B % G:
    raise ValueError(f"{B} rows do not form groups of {G}")
  prompt_len_B = jnp.asarray(prompt_len_B, jnp.int32)
  cols_BN = prompt_len_B[:, None] + jnp.arange(completion_width, dtype=jnp.int32)
  take = lambda x_BT: jnp.take_along_axis(x_BT, jnp.minimum(cols_BN, T - 1).reshape(
      cols_BN.shape + (1,) * (x_BT.ndim - 2)), axis=1)
  prompt_routing = comp_routing = None
  if routing is not None:
    ids, mask = routing.expert_ids_BTXk, routing.mask_BT
    in_prompt_BL = jnp.arange(prompt_width)[None, :] < prompt_len_B[:, None]
    rows_BL = in_prompt_BL if mask is None else in_prompt_BL * mask[:, :prompt_width]
    prompt_mask_PL = jnp.sum(rows_BL.astype(jnp.float32).reshape(B // G, G, prompt_width), axis=1)
    prompt_routing = Routing(None if ids is None else ids[::G, :prompt_width], prompt_mask_PL, routing.replay)
    comp_mask = cols_BN < T if mask is None else (cols_BN < T) & take(mask).astype(bool)
    comp_routing = Routing(None if ids is None else take(ids), comp_mask, routing.replay)
  h_PLD, kv, router_prompt = policy.forward_routed(params, tokens_BT[::G, :prompt_width], routing=prompt_routing)
  comp_BN = take(tokens_BT)
  prefix = [SharedPrefix(jnp.repeat(c.k_BKHS.transpose(0, 1, 3, 2), G, axis=0), jnp.repeat(c.v_BKSH, G, axis=0),
                         prompt_len_B)
            for c in kv]
  h_BND, _, router_comp = policy.forward_routed(params, comp_BN, cols_BN, prefix=prefix, routing=comp_routing)
  # the first completion token is predicted from the prompt's last position
  last_PL = jax.nn.one_hot(prompt_len_B[::G] - 1, prompt_width, dtype=h_PLD.dtype)
  last_PD = jnp.einsum("PL,PLD->PD", last_PL, h_PLD)
  h_pred_BND = jnp.concatenate([jnp.repeat(last_PD, G, axis=0)[:, None], h_BND[:, :-1]], axis=1)
  logp_BN = _gather_logprobs(policy.logits(params, h_pred_BND), comp_BN, temperature)
  router = [a + b for a, b in zip(router_prompt, router_comp)]
  return jnp.where(cols_BN < T, logp_BN, 0.0), cols_BN, router


def next_token_loss(policy: Policy, params: Params, tokens_BT, weights_BT):
  """Supervised loss (sum of weighted token NLL) for warm starts and foundation tests; additive over
  micro-batches when `weights_BT` is normalised by the global count."""
  logp_BT = token_logprobs(policy, params, tokens_BT)
  return -jnp.sum(logp_BT * weights_BT), {"tokens": jnp.sum(weights_BT > 0)}


def make_policy(cfg: ModelConfig, lora=None) -> Policy:
  """The policy of `cfg.family` (ValueError naming `model.family` when unknown), with the adapters `lora` (a
  LoraConfig: `lora.*`) asks for. Dense and MoE share `Policy`'s face (an MoE's router statistics come out of
  `forward_routed`, [] for dense); a family whose face differs would return its own class here, so callers build
  policies with this and never name a family."""
  return Policy(cfg, lora_lib.LoraSpec.of(lora))


def param_count(cfg: ModelConfig, active: bool = False) -> int:
  """Analytic parameter count of `cfg.family` (equals the initialised tree's size; checked in tests); `active`:
  the parameters one token uses (an MoE layer's k routed experts, not all E)."""
  return family_of(cfg).param_count(cfg, active)


def flops_per_token(cfg: ModelConfig, context: int, backward: bool = False, lora=None) -> float:
  """Analytic matmul FLOPs of `cfg.family` for one token attending to `context` earlier positions (forward, or
  forward + backward). With adapters (`lora`: a LoraConfig or LoraSpec of rank > 0) the forward adds 2 FLOPs per
  adapter param a token uses, and the backward computes no gradient of the frozen base's weights: 2x the base's
  forward (the gradients of its activations) plus 3x the adapters' forward."""
  spec = lora if isinstance(lora, lora_lib.LoraSpec) or lora is None else lora_lib.LoraSpec.of(lora)
  fwd = family_of(cfg).flops_per_token(cfg, context, False)
  if spec is None:
    return 3.0 * fwd if backward else fwd
  ad = 2.0 * lora_lib.adapter_params(cfg, spec, active=True)
  return 2.0 * fwd + 3.0 * ad if backward else fwd + ad
