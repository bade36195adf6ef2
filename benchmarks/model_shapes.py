"""Parameter counts and FLOPs per token of run configs, from abstract shapes only (nothing is allocated).

    python -m benchmarks.model_shapes configs/scout_moe.yaml configs/scalerl_8b.yaml
    python -m benchmarks.model_shapes configs/scout_moe.yaml --context 4096

For each config: the policy's param tree is built with `nnx.eval_shape` (`make_policy(cfg).param_shapes`, a tree
of ShapeDtypeStructs), its total size and its active size (each MoE layer's routed experts counted k / E: the
parameters one token uses) are summed from the tree, and checked against the analytic `param_count`; FLOPs per
token are `flops_per_token(cfg, context)` forward and forward + backward (3x), the numbers the run's compute
meter books (scalerl_jax/run/build.py's Parts.flops_per_token passes context = (rollout.max_prefill_len + rollout.max_new_tokens) // 2,
the default here).
"""

from __future__ import annotations

import argparse
import math

import jax

from scalerl_jax.config import load_config
from scalerl_jax.model import flops_per_token, make_policy, param_count


def tree_counts(cfg) -> tuple[int, int]:
  """(total, active) parameters summed over `make_policy(cfg).param_shapes` (abstract: no array is allocated).
  Active: a routed expert leaf ([E, ...] under a block's `moe`, not its shared expert) counts k / E of its size."""
  m = cfg.model
  total = active = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(make_policy(m).param_shapes)[0]:
    key = jax.tree_util.keystr(path)  # "['blocks'][0]['moe']['gate']", as weights.flatten_params spells it
    assert isinstance(leaf, jax.ShapeDtypeStruct), (key, type(leaf))
    size = math.prod(leaf.shape)
    total += size
    routed = "['moe']" in key and "['shared']" not in key and "['router']" not in key
    active += size * m.experts_per_token // m.num_experts if routed else size
  return total, active


def job_context(cfg) -> int:
  """The context the job's compute meter uses for every token: half the step's row width."""
  return (cfg.rollout.max_prefill_len + cfg.rollout.max_new_tokens) // 2


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("configs", nargs="+")
  ap.add_argument("--context", type=int, default=0,
                  help="positions each token attends to (default: the job's, (prefill + new tokens) // 2)")
  args = ap.parse_args(argv)
  head = (f"{'config':<26} {'family':<6} {'total params':>16} {'active params':>16} {'context':>8} "
          f"{'GFLOP/token fwd':>16} {'fwd+bwd':>10}")
  print(head)
  print("-" * len(head))
  for path in args.configs:
    cfg = load_config(path)
    total, active = tree_counts(cfg)
    assert total == param_count(cfg.model), (path, total, param_count(cfg.model))
    assert active == param_count(cfg.model, active=True), (path, active, param_count(cfg.model, active=True))
    ctx = args.context or job_context(cfg)
    fwd, both = flops_per_token(cfg.model, ctx), flops_per_token(cfg.model, ctx, backward=True)
    print(f"{path:<26} {cfg.model.family:<6} {total:>16,} {active:>16,} {ctx:>8} {fwd / 1e9:>16.2f} "
          f"{both / 1e9:>10.2f}")
  print("parameters summed over eval_shape trees (equal to the analytic param_count); FLOPs: matmuls only "
        "(2 x active matmul params + 4 x layers x heads x head_dim x context; fwd+bwd = 3 x fwd)")


if __name__ == "__main__":
  main()
