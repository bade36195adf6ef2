"""Policy models: shared layers (layers.py), the mixture-of-experts MLP (moe.py), the decoder (transformer.py), the
functional face and family dispatch (policy.py: `make_policy(cfg)` by `model.family`), params as named host arrays
(weights.py), and Hugging Face checkpoints in (hf.py: `load_pretrained`, which also reads GGUF files through
gguf.py) and out (hf_export.py: `export_pretrained`; gguf_convert.py: a GGUF file as a Hugging Face directory)."""

from scalerl_jax.model.hf import HFCheckpointError, Pretrained, hf_model_config, load_pretrained
from scalerl_jax.model.hf_export import HFExportError, export_pretrained
from scalerl_jax.model.layers import LayerCache, SharedPrefix
from scalerl_jax.model.moe import RouterStats, Routing
from scalerl_jax.model.policy import (Params, Policy, completion_logprobs, flops_per_token, make_policy,
                                      next_token_loss, param_count, token_logprobs, token_logprobs_routed)
from scalerl_jax.model.transformer import Transformer
from scalerl_jax.model.weights import flatten_params, load_params, save_params, unflatten_params

__all__ = ["HFCheckpointError", "HFExportError", "LayerCache", "Params", "Policy", "Pretrained", "RouterStats",
           "Routing", "SharedPrefix", "Transformer", "completion_logprobs", "export_pretrained", "flatten_params", "flops_per_token",
           "hf_model_config", "load_params", "load_pretrained", "make_policy", "next_token_loss", "param_count",
           "save_params", "token_logprobs", "token_logprobs_routed", "unflatten_params"]
