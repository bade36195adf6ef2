"""scalerl_jax: a JAX RL trainer. `scalerl_jax.load_pretrained` / `hf_model_config` (Hugging Face checkpoints in,
scalerl_jax/model/hf.py) and `export_pretrained` (out, scalerl_jax/model/hf_export.py) are imported lazily, so
`import scalerl_jax` alone does not import jax (entry points set XLA flags before jax loads)."""

_LAZY = {"load_pretrained": "scalerl_jax.model.hf", "hf_model_config": "scalerl_jax.model.hf",
         "HFCheckpointError": "scalerl_jax.model.hf", "Pretrained": "scalerl_jax.model.hf",
         "export_pretrained": "scalerl_jax.model.hf_export", "HFExportError": "scalerl_jax.model.hf_export"}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'scalerl_jax' has no attribute {name!r}")
