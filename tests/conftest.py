"""Test configuration: 8 fake CPU devices, set before jax is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after XLA_FLAGS on purpose)

jax.config.update("jax_default_matmul_precision", "highest")
# Reuse compiled executables across test processes and runs (XLA compilation dominates this suite on 2 cores).
jax.config.update("jax_compilation_cache_dir", os.path.expanduser("~/.cache/scalerl_jax/jax_test_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
