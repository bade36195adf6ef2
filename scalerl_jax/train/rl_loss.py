"""The RL loss the train step runs: the policy's log-probs of a TrainBatch's tokens (at the sampling temperature)
fed to the configured policy loss from `scalerl_jax.rl`. Everything that is a function of params lives here; the
pure objective of arrays lives in `rl/`; the frozen reference's and teacher's log-probs come in the batch
(train/reference.py computes them once per step).

MoE policies (model.family=moe): the trainer's forward gets the generator's recorded experts (`TrainBatch.routes`,
replayed when trainer.routing_replay is on), and the router losses are added here, not inside the model:

    loss = policy loss + (router_aux_coef * mean_l aux_l + router_z_coef * mean_l z_l) / micro_batches

with aux_l and z_l of MoE layer l over the micro-batch's tokens (each row's prompt and sampled completion tokens,
the same count in both layouts; `model.moe.load_balance_loss`, `model.moe.z_loss`), so the sum over micro-batches
is their mean. The step's metric
sums gain `moe_*` keys, turned into `moe/...` metrics by `router_metrics`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import rl, types
from scalerl_jax.config import LossConfig
from scalerl_jax.model import Policy, RouterStats, Routing, completion_logprobs, token_logprobs_routed
from scalerl_jax.model.moe import load_balance_loss, z_loss


@dataclasses.dataclass(frozen=True)
class PromptLayout:
  """How the trainer may compute each prompt once per group: rows come in groups of `group_size` sharing a prompt
  of at most `prompt_width` tokens, followed by at most `completion_width` completion tokens."""
  group_size: int
  prompt_width: int
  completion_width: int

  def trained_tokens(self, rows: int) -> int:
    """Token positions the model runs through for `rows` rows: each prompt once per group, every completion."""
    return rows // self.group_size * self.prompt_width + rows * self.completion_width


def completion_view(batch: types.TrainBatch, cols_BN) -> types.TrainBatch:
  """The batch's per-token arrays read at columns `cols_BN` (each row's completion), loss off past the row."""
  T = batch.tokens.shape[1]
  inside_BN = cols_BN < T
  take = lambda x_BT: jnp.take_along_axis(jnp.asarray(x_BT), jnp.minimum(cols_BN, T - 1), axis=1)
  off = lambda x_BN: jnp.where(inside_BN, x_BN, 0)
  maybe = lambda x_BT: None if x_BT is None else take(x_BT)
  return types.TrainBatch(tokens=take(batch.tokens), loss_mask=off(take(batch.loss_mask)),
                          gen_logprobs=take(batch.gen_logprobs), advantages=batch.advantages,
                          token_weights=off(take(batch.token_weights)),
                          sample_weights=batch.sample_weights,  # routes: the forward reads them, the loss not
                          ref_logprobs=maybe(batch.ref_logprobs), teacher_logprobs=maybe(batch.teacher_logprobs))


def make_rl_loss(policy: Policy, cfg: LossConfig, temperature: float, layout: Optional[PromptLayout] = None,
                 replay: bool = False, micro_batches: int = 1):
  """loss_fn(params, micro_batch) for the train step: trainer log-probs at the sampling temperature, then the
  configured policy loss (additive over micro-batches), plus the router losses of an MoE policy (module
  docstring; `replay`: route through the batch's recorded experts; `micro_batches`: the step's count).

  With a `layout`, each prompt runs through the model once per group (`completion_logprobs`) and the loss reads
  the batch in completion columns: the same loss and gradient (the weights are 0 on prompt tokens), with the
  model's work divided by about (prompt + completion) / (prompt / G + completion). Micro-batches must then hold
  whole groups.
  """
  t = temperature if temperature > 0 else 1.0
  k = policy.cfg.experts_per_token

  def loss_fn(params, batch: types.TrainBatch):
    routing = None
    if policy.cfg.moe_layers:
      routing = Routing(batch.routes, router_token_mask(batch), replay=replay and batch.routes is not None)
    if layout is None:
      logp_BT, router = token_logprobs_routed(policy, params, batch.tokens, temperature=t, routing=routing)
      loss, metrics = rl.policy_loss(logp_BT, batch, cfg)
    else:
      logp_BN, cols_BN, router = completion_logprobs(
          policy, params, batch.tokens, batch.prompt_lengths, layout.group_size, layout.prompt_width,
          layout.completion_width, temperature=t, routing=routing)
      loss, metrics = rl.policy_loss(logp_BN, completion_view(batch, cols_BN), cfg)
    if not router:
      return loss, metrics
    aux = jnp.mean(jnp.stack([load_balance_loss(s, k) for s in router]))
    z = jnp.mean(jnp.stack([z_loss(s) for s in router]))
    loss = loss + (cfg.router_aux_coef * aux + cfg.router_z_coef * z) / micro_batches
    return loss, {**metrics, **_router_sums(router, aux, z, micro_batches)}

  return loss_fn


def router_token_mask(batch: types.TrainBatch):
  """float32[B, T]: the tokens whose routing the router losses and statistics count: each row's prompt and its
  sampled completion tokens (padding and forced-interruption tokens are out)."""
  T = batch.tokens.shape[1]
  prompt_BT = jnp.arange(T)[None, :] < jnp.asarray(batch.prompt_lengths)[:, None]
  return (prompt_BT | (jnp.asarray(batch.loss_mask) > 0)).astype(jnp.float32)


def _router_sums(router: list[RouterStats], aux, z, micro_batches: int) -> dict:
  """The step's `moe_*` metric sums (additive over micro-batches)."""
  sg = jax.lax.stop_gradient
  return {"moe_aux_sum": sg(aux) / micro_batches, "moe_z_sum": sg(z) / micro_batches,
          "moe_mismatched": sum(s.mismatched for s in router), "moe_compared": sum(s.compared for s in router),
          "moe_load_XE": jnp.stack([s.load_E for s in router])}


def router_metrics(device_metrics: dict) -> dict:
  """Host side: the `moe/...` metrics of a step from its summed `moe_*` device values ({} for a dense policy).

  moe/aux_loss, moe/z_loss: the mean over MoE layers (and micro-batches) of the two router losses;
  moe/router_mismatch_frac: of the token-layer routing decisions the generator recorded, the fraction where the
  trainer's own top-k set differs (with or without replay); moe/load_max_over_mean_l{j}: the busiest expert's
  assignments over the mean per expert in MoE layer j (1 = perfectly balanced, E = all on one expert), and
  moe/load_max_over_mean its maximum over layers."""
  if "moe_load_XE" not in device_metrics:
    return {}
  load_XE = np.asarray(device_metrics["moe_load_XE"], np.float64)
  ratio_X = load_XE.max(axis=1) / np.maximum(load_XE.mean(axis=1), 1e-12)
  compared = float(device_metrics["moe_compared"])
  out = {"moe/aux_loss": float(device_metrics["moe_aux_sum"]), "moe/z_loss": float(device_metrics["moe_z_sum"]),
         "moe/router_mismatch_frac": float(device_metrics["moe_mismatched"]) / compared if compared else float("nan"),
         "moe/load_max_over_mean": float(ratio_X.max())}
  out.update({f"moe/load_max_over_mean_l{j}": float(r) for j, r in enumerate(ratio_X)})
  return out
