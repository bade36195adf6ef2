"""The step batch cut to the groups that carry loss (`trainer.batch_buckets`): bucket sizes, which groups are
kept, and the same loss, gradient and loss metrics as the whole batch on fewer rows."""

import dataclasses

import jax
import numpy as np
import pytest

from scalerl_jax import rl
from scalerl_jax.config import LossConfig, ModelConfig
from scalerl_jax.model import Policy
from scalerl_jax.pipeline.batching import compact_groups, group_buckets, kept_groups
from scalerl_jax.train.rl_loss import PromptLayout, make_rl_loss
from tests.model_helpers import rl_batch

CFG = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8,
                  max_seq_len=16)
P, G, WIDTH, N = 8, 4, 5, 6


def test_buckets_are_multiples_of_the_unit_and_end_at_the_whole_batch():
  assert group_buckets(64, 8) == (8, 16, 24, 32, 40, 48, 56, 64)
  assert group_buckets(64, 4) == (16, 32, 48, 64)
  assert group_buckets(10, 4) == (3, 5, 8, 10)
  assert group_buckets(64, 8, unit=3) == (9, 18, 24, 33, 42, 48, 57, 64)
  assert group_buckets(64, 1) == (64,)


def _batch(rewards_PG, loss_cfg):
  """A shared-prompt step batch (ragged prompts and completions) with rl.prepare's advantages and weights."""
  batch = rl_batch(P, G, WIDTH, N, CFG.vocab_size, seed=0)
  prep = rl.prepare(rewards_PG, batch.loss_mask, np.zeros((P, G), bool), loss_cfg)
  return dataclasses.replace(batch, advantages=np.asarray(prep.advantages),
                             token_weights=np.asarray(prep.token_weights),
                             sample_weights=np.asarray(prep.sample_weights))


# groups 1, 3, 4 and 6 score the same on every sample (zero variance): filtered
REWARDS = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 1, 0], [0, 0, 0, 0],
                    [1, 1, 1, 1], [1, 1, 0, 1], [0, 0, 0, 0], [0, 1, 1, 1]], np.float32)


def test_kept_groups_first_then_filtered_ones_as_padding():
  batch = _batch(REWARDS, LossConfig(name="cispo"))
  np.testing.assert_array_equal(kept_groups(batch, G), [True, False, True, False, False, True, False, True])
  small, groups = compact_groups(batch, G, group_buckets(P, 4))
  assert groups == 4 and small.tokens.shape == (4 * G, WIDTH + N)
  rows = np.concatenate([np.arange(g * G, (g + 1) * G) for g in (0, 2, 5, 7)])
  np.testing.assert_array_equal(small.tokens, batch.tokens[rows])
  np.testing.assert_array_equal(small.prompt_lengths, batch.prompt_lengths[rows])
  # 5 kept groups need the bucket of 6: the first filtered group pads it, with zero weights
  rewards = REWARDS.copy()
  rewards[1, 0] = 0
  batch = _batch(rewards, LossConfig(name="cispo"))
  small, groups = compact_groups(batch, G, group_buckets(P, 4))
  assert groups == 6
  np.testing.assert_array_equal(small.tokens[5 * G:], batch.tokens[3 * G:4 * G])
  assert not small.token_weights[5 * G:].any()
  # every group kept, or one bucket only: the batch itself
  assert compact_groups(batch, G, (P,))[0] is batch


@pytest.mark.parametrize("loss", ["cispo", "gspo", "dapo"])
def test_the_cut_batch_gives_the_same_loss_gradient_and_loss_metrics(loss):
  cfg = LossConfig(name=loss, aggregation="sample" if loss == "gspo" else "prompt")
  batch = _batch(REWARDS, cfg)
  small, groups = compact_groups(batch, G, group_buckets(P, 4))
  assert small.tokens.shape[0] == groups * G < batch.tokens.shape[0]  # computed on different rows
  policy = Policy(CFG)
  params = policy.init(jax.random.key(0))
  loss_fn = jax.jit(jax.value_and_grad(make_rl_loss(policy, cfg, 1.0, PromptLayout(G, WIDTH, N)), has_aux=True))
  (full_loss, full_m), full_g = loss_fn(params, batch)
  (cut_loss, cut_m), cut_g = loss_fn(params, small)
  assert abs(float(full_loss)) > 1e-4
  np.testing.assert_allclose(float(cut_loss), float(full_loss), rtol=1e-5, atol=1e-7)
  for a, b in zip(jax.tree.leaves(cut_g), jax.tree.leaves(full_g)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
  for key in ("tokens", "samples", "loss_sum", "neg_logp_sum", "ratio_sum", "clip_upper_sum"):
    np.testing.assert_allclose(float(cut_m[key]), float(full_m[key]), rtol=1e-5, atol=1e-6)
