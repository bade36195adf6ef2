"""Config errors name the offending key; mesh specs parse, infer -1 and fail clearly; layouts come from rules."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from scalerl_jax.config import CONFIG_GROUPS, ConfigError, load_config
from scalerl_jax.mesh import (ROLLOUT_AXES, ROLLOUT_RULES, TRAIN_RULES, MeshError, logical_to_sharding, make_mesh,
                              parse_mesh_spec)
from scalerl_jax.model import Policy


def test_defaults_and_overrides(tmp_path):
  cfg = load_config(overrides=["loss.name=dapo", "rollout.interruption.answer_budget=3"])
  assert cfg.loss.name == "dapo" and cfg.rollout.interruption.answer_budget == 3
  f = tmp_path / "c.yaml"
  f.write_text("loss:\n  aggregation: token\noptimizer:\n  lr: 5.0e-7\n")
  cfg = load_config(f, ["optimizer.lr=1e-4"])
  assert cfg.loss.aggregation == "token" and cfg.optimizer.lr == 1e-4  # override beats file beats default
  assert {"model", "mesh", "rollout", "loss", "pipeline", "data", "optimizer", "checkpoint", "logging",
          "curve_fit"} <= set(CONFIG_GROUPS)


@pytest.mark.parametrize("overrides,key", [
    (["loss.nmae=cispo"], "loss.nmae"),
    (["model.hidden=big"], "model.hidden"),
    (["loss.name=foo"], "loss.name"),
    (["model.num_kv_heads=3"], "model.num_kv_heads"),
    (["pipeline.micro_batches=7"], "pipeline.micro_batches"),
    (["rollout.top_p=0"], "rollout.top_p"),
    (["data.task=file"], "data.path"),
])
def test_errors_name_the_key(overrides, key):
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    load_config(overrides=overrides)


def test_file_errors_name_file_and_key(tmp_path):
  f = tmp_path / "bad.yaml"
  f.write_text("optimizer:\n  lrr: 1\n")
  with pytest.raises(ConfigError, match=r"optimizer\.lrr.*bad\.yaml"):
    load_config(f)
  with pytest.raises(ConfigError, match="not found"):
    load_config(tmp_path / "missing.yaml")


def test_all_shipped_configs_load():
  import pathlib
  files = sorted(pathlib.Path(__file__).parent.parent.glob("configs/*.yaml"))
  for f in files:
    load_config(f)


def test_mesh_spec_parsing():
  assert parse_mesh_spec("data=2,fsdp=-1,tensor=2", 8) == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
  with pytest.raises(MeshError, match="multiply to 6 but 8"):
    parse_mesh_spec("data=3,fsdp=2", 8)
  with pytest.raises(MeshError, match="only one axis"):
    parse_mesh_spec("data=-1,fsdp=-1", 8)
  with pytest.raises(MeshError, match="bad entry"):
    parse_mesh_spec("pipeline=2", 8)
  mesh = make_mesh("data=-1,tensor=2", jax.devices()[4:], ROLLOUT_AXES)
  assert dict(mesh.shape) == {"data": 2, "tensor": 2, "expert": 1}


def test_layouts_from_rule_tables():
  from scalerl_jax.config import ModelConfig
  policy = Policy(ModelConfig(num_kv_heads=2, tie_embeddings=False))
  train = make_mesh("fsdp=4,tensor=2")
  sh = logical_to_sharding(policy.logical_axes, policy.param_shapes, train, TRAIN_RULES)
  assert sh["blocks"][0]["mlp"]["gate"].spec == P("fsdp", "tensor")  # embed -> fsdp, mlp -> tensor
  assert sh["blocks"][0]["attn"]["k"].spec == P("fsdp", "tensor", None)
  rollout = make_mesh("data=2,tensor=4", jax.devices(), ROLLOUT_AXES)
  rsh = logical_to_sharding(policy.logical_axes, policy.param_shapes, rollout, ROLLOUT_RULES)
  assert rsh["blocks"][0]["mlp"]["gate"].spec == P(None, "tensor")  # no FSDP in the rollout layout
  # 2 KV heads cannot split over tensor=4: replicated rather than an invalid sharding
  assert rsh["blocks"][0]["attn"]["k"].spec == P(None, None, None)
