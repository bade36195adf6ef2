"""Policy models: shared layers (layers.py), the dense decoder (transformer.py), and the functional face and family
dispatch (policy.py: `make_policy(cfg)` by `model.family`)."""

from scalerl_jax.model.layers import LayerCache, SharedPrefix
from scalerl_jax.model.policy import (Params, Policy, completion_logprobs, flops_per_token, make_policy,
                                      next_token_loss, param_count, token_logprobs)
from scalerl_jax.model.transformer import Transformer

__all__ = ["LayerCache", "Params", "Policy", "SharedPrefix", "Transformer", "completion_logprobs", "flops_per_token",
           "make_policy", "next_token_loss", "param_count", "token_logprobs"]
