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
