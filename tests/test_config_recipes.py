"""One truth for config: the code defaults are the cpu_default recipe, and every shipped YAML resolves to a reviewed
snapshot.

tests/snapshots/configs/<name>.yaml holds `config.to_yaml(load_config("configs/<name>.yaml"))`: every key of the run,
defaults included. When a shipped YAML or a code default changes, the snapshot test fails with a unified diff; if
the change is intended, refresh the snapshots and review the diff before committing:

    python -m tests.snapshots.refresh            # rewrite tests/snapshots/configs/*.yaml
    python -m tests.snapshots.refresh --check    # only print what differs
"""

import dataclasses
import importlib.util
import inspect
import pathlib

import pytest

from scalerl_jax.config import CHOICES, CurveFitConfig, RunConfig, load_config, to_yaml
from scalerl_jax.scaling import io as scaling_io
from tests.snapshots import refresh

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = refresh.shipped()


def _flat(cfg, prefix=""):
  out = {}
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    out.update(_flat(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name: value})
  return out


def test_the_defaults_are_the_cpu_default_recipe():
  from_file, defaults = _flat(load_config(ROOT / "configs" / "cpu_default.yaml")), _flat(RunConfig())
  differ = [f"{k}: yaml {from_file[k]!r} != default {defaults[k]!r}" for k in defaults if from_file[k] != defaults[k]]
  assert not differ, "configs/cpu_default.yaml and config.py's defaults differ:\n" + "\n".join(differ)
  assert load_config(ROOT / "configs" / "cpu_default.yaml") == RunConfig() == load_config()


def test_shipped_configs_are_all_there():
  assert {p.name for p in SHIPPED} >= {"cpu_default.yaml", "scalerl_8b.yaml", "loo_dapo.yaml"}
  stale = sorted(p.name for p in refresh.SNAPSHOTS.glob("*.yaml")) != sorted(p.name for p in SHIPPED)
  assert not stale, f"snapshots without a shipped config (or the reverse): run {refresh.COMMAND}"


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_config_matches_its_reviewed_snapshot(path):
  diff = refresh.drift(path)
  assert not diff, f"{path.name} drifted from its snapshot:\n{diff}"


def test_drift_shows_a_readable_diff_and_the_refresh_command(tmp_path):
  changed = tmp_path / "cpu_default.yaml"
  changed.write_text(f"base: {ROOT / 'configs' / 'cpu_default.yaml'}\nloss:\n  name: dapo\n")
  diff = refresh.drift(changed, refresh.SNAPSHOTS / "cpu_default.yaml")
  assert "-  name: cispo\n" in diff and "+  name: dapo\n" in diff and refresh.COMMAND in diff
  assert diff.count("\n-") == 1 and diff.count("\n+") == 2  # one changed line (and the "+++" header)
  assert "does not exist" in refresh.drift(changed, tmp_path / "missing.yaml")


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_to_yaml_round_trips_through_load_config(path, tmp_path):
  cfg = load_config(path)
  again = tmp_path / "again.yaml"
  again.write_text(to_yaml(cfg))
  assert load_config(again) == cfg
  assert to_yaml(load_config(again)) == to_yaml(cfg)


def test_one_default_for_the_curve_fit_axis():
  spec = importlib.util.spec_from_file_location("fit_curve_cli", ROOT / "launch" / "fit_curve.py")
  cli = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(cli)
  _, args = cli.parse_args(["some_run"])
  assert CurveFitConfig().x == "generator_flops"  # the sampling compute (schema.CurveFitConfig says why)
  assert args.x == scaling_io.DEFAULT_X == inspect.signature(scaling_io.load_points).parameters["x"].default == \
      CurveFitConfig().x
  assert (args.fit_upto, args.c_min) == (CurveFitConfig().fit_upto, CurveFitConfig().c_min)
  assert set(CHOICES["curve_fit.x"]) == set(scaling_io.X_AXES)  # the config offers exactly the axes io reads


def test_fit_run_reads_the_same_default_axis():
  from scalerl_jax.scaling import fit_run
  assert inspect.signature(fit_run).parameters["x"].default == scaling_io.DEFAULT_X == CurveFitConfig().x
