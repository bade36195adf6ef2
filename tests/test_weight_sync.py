"""Weight sync copies: a fresh buffer in the rollout layout even where the layouts coincide (the train state is
donated to the next step, so an alias would be freed under the generator), versions only grow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from scalerl_jax.mesh import make_mesh
from scalerl_jax.pipeline.weight_sync import WeightBox, WeightSync, to_rollout_layout


def test_copy_is_a_fresh_buffer_that_survives_donating_the_source():
  mesh = make_mesh("data=4", jax.devices()[:4])
  sharding = NamedSharding(mesh, P("data"))
  x = jax.device_put(jnp.arange(8.0), sharding)
  y = to_rollout_layout({"w": x}, {"w": sharding})["w"]  # same devices, same sharding: a plain put could alias
  assert y.sharding == x.sharding
  pointers = lambda a: {s.data.unsafe_buffer_pointer() for s in a.addressable_shards}
  assert pointers(x).isdisjoint(pointers(y))
  step = jax.jit(lambda a: a * 2.0, donate_argnums=0)
  x2 = step(x)  # the trainer's next step consumes (donates) its params
  assert x.is_deleted() and not y.is_deleted()
  np.testing.assert_array_equal(np.asarray(y), np.arange(8.0))
  np.testing.assert_array_equal(np.asarray(x2), 2 * np.arange(8.0))


def test_box_versions_only_grow():
  sharding = NamedSharding(make_mesh("data=1", jax.devices()[:1]), P())
  sync = WeightSync({"w": sharding}, {"w": jnp.zeros(2)}, version=3)
  sync.publish({"w": jnp.ones(2)}, 4)
  params, version = sync.box.latest()
  assert version == 4 and float(params["w"][0]) == 1.0 and sync.last_seconds >= 0
  with pytest.raises(ValueError, match="versions only grow"):
    sync.box.publish({"w": jnp.zeros(2)}, 2)
  assert isinstance(sync.box, WeightBox)


def test_adapter_syncs_move_the_adapters_alone_onto_the_generators_base():
  """lora.rank > 0: the first sync moves the whole tree; later ones only the adapters (their bytes), joined on the
  generator side with the base it received first."""
  from scalerl_jax.config import LoraConfig, ModelConfig
  from scalerl_jax.mesh import ROLLOUT_RULES, Layout
  from scalerl_jax.model import lora, make_policy

  cfg = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
  policy = make_policy(cfg, LoraConfig(rank=4, targets=("q", "v", "down")))
  layout = Layout(make_mesh("data=1", jax.devices()[:1]), ROLLOUT_RULES)
  shardings = layout.shardings(policy.logical_axes, policy.param_shapes)
  params = policy.init(0)
  sync = WeightSync(shardings, params, version=0, policy=policy)
  whole = sum(x.nbytes for x in jax.tree.leaves(params))
  assert sync.last_bytes == whole
  # the trainer's next params: adapters moved; the base too, which a frozen base never does, so that the test sees
  # which part travelled
  moved = jax.tree_util.tree_map_with_path(lambda p, x: x + (1.0 if lora.is_adapter(p) else 5.0), params)
  sync.publish(moved, 1)
  got, version = sync.box.latest()
  adapter_bytes = 4 * lora.count(params)
  assert version == 1 and sync.last_bytes == adapter_bytes < whole / 4
  for path, x in jax.tree_util.tree_leaves_with_path(got):
    want = jax.tree_util.tree_leaves_with_path(moved if lora.is_adapter(path) else params)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(dict(want)[path]))
  # without adapters every sync moves the whole tree
  plain = make_policy(cfg)
  full = WeightSync(layout.shardings(plain.logical_axes, plain.param_shapes), plain.init(0), 0, policy=plain)
  full.publish(plain.init(1), 1)
  assert full.last_bytes == sum(x.nbytes for x in jax.tree.leaves(plain.init(1)))
