"""The paper's two model scales at full size, from abstract shapes only: configs/scout_moe.yaml (Llama-4 Scout,
17B active x 16 experts) and configs/scalerl_8b.yaml (8B dense). The policies are built with `nnx.eval_shape`
(`make_policy(cfg).param_shapes`, ShapeDtypeStructs: nothing is allocated), so 108B parameters cost ~2 s.

Three independent counts must agree: the tree's own leaf sizes, the package's analytic `param_count` /
`flops_per_token`, and the closed-form numbers written out below with their arithmetic. The compute meter the
job books FLOPs with (`ComputeMeter.count_tokens` fed by `scalerl_jax.model.flops_per_token`, as
scalerl_jax/run/job.py does through build.Parts.flops_per_token) must count an MoE's active parameters, not its total.

    pytest -s tests/test_model_scale.py     # prints the counts
"""

from __future__ import annotations

import math
import pathlib

import jax
import pytest

from scalerl_jax import types
from scalerl_jax.config import load_config
from scalerl_jax.model import flops_per_token, make_policy, param_count
from scalerl_jax.model import transformer
from scalerl_jax.pipeline.compute import ComputeMeter

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"

# Llama-4 Scout (configs/scout_moe.yaml): D = 5120, L = 48 layers (all MoE), Q = 40 heads, K = 8 KV heads,
# H = 128, V = 202048 (untied head), E = 16 experts, k = 1, expert width F = 8192, shared expert S = 8192, QK-norm.
#   attention matmuls / layer: q D*Q*H = 5120*5120 = 26,214,400; k + v 2*D*K*H = 2*5120*1024 = 10,485,760;
#                              o Q*H*D = 26,214,400                                      -> 62,914,560
#   + q/k norm 2*128 = 256 + attention/MLP norms 2*5120 = 10,240                         -> 62,925,056
#   router D*E = 81,920; one expert 3*D*F = 3*5120*8192 = 125,829,120; 16 experts 2,013,265,920;
#   shared 3*D*S = 125,829,120
#   MoE layer, all experts: 81,920 + 2,013,265,920 + 125,829,120 = 2,139,176,960
#   MoE layer, active (k = 1): 81,920 + 125,829,120 + 125,829,120 = 251,740,160
#   embed V*D = 202048*5120 = 1,034,485,760, LM head the same, final norm 5,120          -> 2,068,976,640
#   total  = 2,068,976,640 + 48 * (62,925,056 + 2,139,176,960) = 2,068,976,640 + 105,700,896,768
#          = 107,769,873,408   (Meta: "109B total"; the rest is presumably Scout's vision encoder, ~0.8B)
#   active = 2,068,976,640 + 48 * (62,925,056 + 251,740,160) = 2,068,976,640 + 15,103,930,368
#          = 17,172,907,008    ("17B active")
#   matmul params a token runs through (the embedding is a lookup, the LM head a matmul):
#          48 * (62,914,560 + 251,740,160) + 1,034,485,760 = 15,103,426,560 + 1,034,485,760 = 16,137,912,320
#   attention scores + values per context position: 4 * L * Q * H = 4 * 48 * 40 * 128 = 983,040
SCOUT = dict(total=107_769_873_408, active=17_172_907_008, matmul_active=16_137_912_320, attn_per_ctx=983_040)

# 8B dense (configs/scalerl_8b.yaml, Llama-3-8B's shape): D = 4096, L = 32, Q = 32, K = 8, H = 128, V = 128256
# (untied), F = 14336.
#   attention matmuls / layer: 2*4096*4096 + 2*4096*1024 = 33,554,432 + 8,388,608 = 41,943,040
#   MLP 3*4096*14336 = 176,160,768; norms 2*4096 = 8,192    -> layer 218,112,000; x 32 = 6,979,584,000
#   embed 128256*4096 = 525,336,576, LM head the same, final norm 4,096                  -> 1,050,677,248
#   total = active = 6,979,584,000 + 1,050,677,248 = 8,030,261,248   (Llama-3-8B's count)
#   matmul params: 32 * (41,943,040 + 176,160,768) + 525,336,576 = 6,979,321,856 + 525,336,576 = 7,504,658,432
#   4 * L * Q * H = 4 * 32 * 32 * 128 = 524,288
DENSE_8B = dict(total=8_030_261_248, active=8_030_261_248, matmul_active=7_504_658_432, attn_per_ctx=524_288)

EXPECTED = {"scout_moe.yaml": SCOUT, "scalerl_8b.yaml": DENSE_8B}


def tree_counts(cfg, shapes) -> dict[str, int]:
  """Sizes summed over the abstract param tree: total; active (each routed-expert leaf, [E, ...] under `moe` and
  outside its shared expert, counts k / E); the active matmul weights (rank >= 2 leaves, the embedding table
  excluded when the LM head is separate, since a lookup is no matmul), and the same with every expert counted."""
  E, k = cfg.num_experts, cfg.experts_per_token
  out = dict(total=0, active=0, matmul_active=0, matmul_total=0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    assert isinstance(leaf, jax.ShapeDtypeStruct), "param_shapes must be abstract: nothing allocated"
    key = jax.tree_util.keystr(path)
    size = math.prod(leaf.shape)
    routed = "['moe']" in key and "['shared']" not in key and "['router']" not in key
    if routed:
      assert leaf.shape[0] == E, key
      size = size * k // E
    out["total"] += math.prod(leaf.shape)
    out["active"] += size
    if len(leaf.shape) >= 2 and not (key == "['embed']" and not cfg.tie_embeddings):
      out["matmul_active"] += size
      out["matmul_total"] += math.prod(leaf.shape)
  return out


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def model(request):
  cfg = load_config(CONFIGS / request.param)
  return request.param, cfg, make_policy(cfg.model).param_shapes


def test_param_counts_of_the_abstract_tree(model):
  name, cfg, shapes = model
  m, want = cfg.model, EXPECTED[name]
  tree = tree_counts(m, shapes)
  print(f"\n{name}: total {tree['total']:,} active {tree['active']:,} "
        f"(analytic {param_count(m):,} / {param_count(m, active=True):,})")
  # three ways: the tree's leaves, the package's analytic count, the closed form above
  assert tree["total"] == param_count(m) == transformer.param_count(m) == want["total"]
  assert tree["active"] == param_count(m, active=True) == want["active"]
  if m.family == "moe":
    assert len(m.moe_layers) == m.num_layers == 48 and (m.num_experts, m.experts_per_token) == (16, 1)
    assert 16.5e9 < want["active"] < 17.5e9  # "17B" active
    assert 100e9 < want["total"] < 112e9  # Meta's "109B" (text + vision)
    assert want["active"] < want["total"] / 6
  else:
    assert want["active"] == want["total"] and 7.9e9 < want["total"] < 8.1e9


@pytest.mark.parametrize("context", [0, 8192])
def test_flops_per_token_count_active_matmuls(model, context):
  name, cfg, shapes = model
  m, want = cfg.model, EXPECTED[name]
  assert tree_counts(m, shapes)["matmul_active"] == want["matmul_active"]
  fwd = 2 * want["matmul_active"] + want["attn_per_ctx"] * context
  print(f"\n{name}: context {context}: {fwd / 1e9:.3f} GFLOP/token forward, {3 * fwd / 1e9:.3f} forward + backward")
  assert flops_per_token(m, context) == fwd
  assert flops_per_token(m, context, backward=True) == 3 * fwd


def test_the_job_books_active_not_total_flops(model):
  """What run/job.py does per step: `meter.count_tokens(generated, trained, f)` with
  f = Parts.flops_per_token = flops_per_token(cfg.model, StepShapes.T // 2, backward) (run/build.py; the
  meter multiplies). The booked FLOPs follow the active count; had the total been used, Scout's would be 5.5x."""
  name, cfg, shapes = model
  m, want = cfg.model, EXPECTED[name]
  s = types.StepShapes.from_config(cfg)
  ctx = s.T // 2
  assert ctx == 8192  # (2,048 prompt + 14,336 generation) / 2
  meter = ComputeMeter(generator_devices=64, trainer_devices=16, colocated=False)
  generated, trained = 1000, 300
  meter.count_tokens(generated, trained, lambda backward: flops_per_token(m, ctx, backward=backward))
  fwd = 2 * want["matmul_active"] + want["attn_per_ctx"] * ctx
  metrics = meter.metrics()
  assert metrics["compute/generator_flops"] == generated * fwd
  assert metrics["compute/trainer_flops"] == trained * 3 * fwd
  assert metrics["compute/flops"] == (generated + 3 * trained) * fwd
  # what counting every expert's matmuls would book
  with_total = 2 * tree_counts(m, shapes)["matmul_total"] + want["attn_per_ctx"] * ctx
  if m.family == "moe":
    assert metrics["compute/generator_flops"] < generated * with_total / 5
  else:
    assert with_total == fwd
  print(f"\n{name}: {fwd / 1e9:.2f} GFLOP/token booked at context {ctx} "
        f"(with total params it would be {with_total / 1e9:.2f})")
