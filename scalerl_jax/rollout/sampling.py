"""Token sampling with the log-probability of the distribution actually sampled from.

Order of processing (as in Hugging Face and vLLM): temperature, then top-k, then top-p on the renormalised top-k
distribution. `processed_logprobs` returns that final distribution (log-space, -inf outside its support); the
sampler draws from it and records log p(token) under it, so the importance ratio pi_train / pi_gen the trainer
forms is honest. With top_p = 1 and top_k = 0 this is exactly `token_logprobs(..., temperature)` of the trainer.

Greedy (temperature 0) has no proper distribution (a point mass would give log-prob 0); we record the model's
temperature-1 log-prob of the argmax token instead, which is what evaluation and diagnostics want.

Randomness: two uniforms per row and step from that row's own key, turned into a token by an exact inverse-CDF
draw over the processed probabilities. That needs 2B random numbers per step instead of B*V Gumbel draws (the
difference matters at large V on CPU).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import RolloutConfig


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static sampling settings (hashable: each distinct setting compiles the decode loop once)."""
  temperature: float = 1.0  # 0 = greedy
  top_p: float = 1.0  # 1 = off
  top_k: int = 0  # 0 = off

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  @classmethod
  def from_config(cls, cfg: RolloutConfig) -> "SamplingParams":
    """The sampler's settings: rollout.sampler_temperature when set (a mismatch on purpose), else the trainer's."""
    t = cfg.temperature if cfg.sampler_temperature is None else cfg.sampler_temperature
    return cls(temperature=t, top_p=cfg.top_p, top_k=cfg.top_k)


GREEDY = SamplingParams(temperature=0.0)


def processed_logprobs(logits_BV, sp: SamplingParams):
  """log of the distribution sampled from: fp32, -inf outside the top-k / top-p support."""
  logits_BV = logits_BV.astype(jnp.float32)
  if sp.greedy:
    return jax.nn.log_softmax(logits_BV, axis=-1)
  if sp.temperature != 1.0:
    logits_BV = logits_BV / sp.temperature
  neg_inf = -jnp.inf
  V = logits_BV.shape[-1]
  sorted_BK = None  # descending logits of the candidate set, when we have them
  if 0 < sp.top_k < V:
    sorted_BK, _ = jax.lax.top_k(logits_BV, sp.top_k)
    # Ties with the k-th value are kept (the support may exceed k by ties).
    logits_BV = jnp.where(logits_BV < sorted_BK[:, -1:], neg_inf, logits_BV)
  if sp.top_p < 1.0:
    if sorted_BK is None:
      sorted_BK = -jnp.sort(-logits_BV, axis=-1)
    probs_BK = jax.nn.softmax(sorted_BK, axis=-1)
    mass_before_BK = jnp.cumsum(probs_BK, axis=-1) - probs_BK
    # Smallest prefix whose mass reaches top_p: keep every token whose preceding mass is still < top_p.
    n_keep_B = jnp.sum(mass_before_BK < sp.top_p, axis=-1)
    threshold_B1 = jnp.take_along_axis(sorted_BK, n_keep_B[:, None] - 1, axis=-1)
    logits_BV = jnp.where(logits_BV < threshold_B1, neg_inf, logits_BV)
  return jax.nn.log_softmax(logits_BV, axis=-1)


def uniforms(keys_B, first_B, steps: int):
  """u[b, j] = two U[0, 1) draws from fold_in(keys[b], first[b] + j): the randomness of a row's next `steps`
  tokens, drawn in one batched call (on CPU each threefry call is a loop: keep them out of the decode loop)."""
  def row(key, first):
    step_keys = jax.vmap(lambda j: jax.random.fold_in(key, first + j))(jnp.arange(steps))
    return jax.vmap(lambda k: jax.random.uniform(k, (2,), jnp.float32))(step_keys)
  return jax.vmap(row)(keys_B, first_B)  # [B, steps, 2]


def _inverse_cdf(probs_BV, u_B2):
  """Exact categorical draw from unnormalised probs by a two-level inverse CDF: a block of ~sqrt(V) tokens from
  the block masses with u[:, 0], then a token inside it with u[:, 1]. Running sums are matmuls with a triangular
  ones matrix (XLA:CPU lowers cumsum to a slow reduce-window); zero-probability tokens never win."""
  B, V = probs_BV.shape
  width = int(np.ceil(np.sqrt(V)))
  blocks = -(-V // width)
  probs_BNW = jnp.pad(probs_BV, ((0, 0), (0, blocks * width - V))).reshape(B, blocks, width)
  hi = jax.lax.Precision.HIGHEST
  running = lambda x, n: jnp.matmul(x, jnp.triu(jnp.ones((n, n), jnp.float32)), precision=hi)

  def pick(cdf_BX, u_B):
    return jnp.sum(cdf_BX <= u_B[:, None] * cdf_BX[:, -1:], axis=-1)  # first index whose cdf exceeds u * total

  block_B = jnp.minimum(pick(running(probs_BNW.sum(-1), blocks), u_B2[:, 0]), blocks - 1)
  inner_BW = jnp.take_along_axis(probs_BNW, block_B[:, None, None], axis=1)[:, 0]
  index_B = jnp.minimum(pick(running(inner_BW, width), u_B2[:, 1]), width - 1)
  return (block_B * width + index_B).astype(jnp.int32)


def sample(logits_BV, u_B2, sp: SamplingParams):
  """(tokens int32[B], logprobs float32[B]); u_B2 are the row's two uniforms for this step (see `uniforms`)."""
  logp_BV = processed_logprobs(logits_BV, sp)
  if sp.greedy:
    tokens_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  else:
    tokens_B = _inverse_cdf(jnp.exp(logp_BV), u_B2)
  return tokens_B, jnp.take_along_axis(logp_BV, tokens_B[:, None], axis=-1)[:, 0]
