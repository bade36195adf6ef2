"""Policy models: the dense decoder (transformer.py) and its functional face (policy.py)."""

from scalerl_jax.model.policy import (Params, Policy, completion_logprobs, flops_per_token, next_token_loss,
                                      param_count, policy_for, token_logprobs)
from scalerl_jax.model.transformer import LayerCache, SharedPrefix, Transformer

__all__ = ["LayerCache", "Params", "Policy", "SharedPrefix", "Transformer", "completion_logprobs", "flops_per_token",
           "next_token_loss", "param_count", "policy_for", "token_logprobs"]
