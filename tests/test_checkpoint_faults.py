"""Checkpoint faults: a damaged latest checkpoint falls back to the previous one with a warning naming what was
wrong (never a raw traceback, never a silent fresh start); a different configuration is refused naming each
changed key with its old and new value, NPR and micro-batching may change; a failed write (full disk) leaves the
previous checkpoint restorable and says so; a killed write's temporary directory is removed at start-up; nothing in
a checkpoint or a YAML config can execute code.

Two checkpoints (steps 2 and 4, different params) of a tiny TrainState are written once per module and copied into
each test's directory.
"""

import contextlib
import errno
import json
import logging
import os
import pathlib
import pickle
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
import yaml
from etils import epath

from scalerl_jax.config import ConfigError, ModelConfig, OptimizerConfig, absolute_paths, load_config
from scalerl_jax.errors import UserError
from scalerl_jax.mesh import TRAIN_RULES, Layout, make_mesh
from scalerl_jax.model import make_policy
from scalerl_jax.train import checkpoint as ckpt_lib
from scalerl_jax.train.checkpoint import CheckpointError, ResumeError, RunCheckpointer, config_fingerprint
from scalerl_jax.train.state import init_train_state, make_optimizer, restore_target, state_shardings
from tests.fault_helpers import tmpfs

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=16,
                   max_seq_len=8)
CFG = load_config()
LOGGER = "scalerl_jax.train.checkpoint"


def _meta(step, cfg=CFG, **extra):
  return {"step": step, "npr": {"solved": []}, "fingerprint": config_fingerprint(cfg), **extra}


def _host(state):
  return jax.tree.map(np.asarray, state)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  layout = Layout(make_mesh("data=1", jax.devices()[:1]), TRAIN_RULES)
  policy, optimizer = make_policy(TINY), make_optimizer(OptimizerConfig())
  target = restore_target(policy, optimizer, state_shardings(policy, optimizer, layout))
  states = {step: init_train_state(policy, optimizer, layout, seed=step) for step in (2, 4, 6)}
  template = tmp_path_factory.mktemp("template") / "checkpoints"
  ck = RunCheckpointer(template, keep=3)
  for step in (2, 4):
    ck.save(step, states[step], _meta(step))
  ck.close()
  host = {step: _host(s) for step, s in states.items()}
  assert not np.array_equal(host[2].params["embed"], host[4].params["embed"])  # the two checkpoints differ
  return {"template": template, "target": target, "states": states, "host": host}


@pytest.fixture
def ckdir(tmp_path, saved):
  shutil.copytree(saved["template"], tmp_path / "checkpoints")
  return tmp_path / "checkpoints"


def assert_equal_state(restored, expected):
  leaves, want = jax.tree.leaves(_host(restored)), jax.tree.leaves(expected)
  assert len(leaves) == len(want) and all(np.array_equal(a, b) for a, b in zip(leaves, want))


def _data_files(step_dir):
  """The tensorstore data files of the state item, largest first."""
  files = [f for f in (step_dir / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
  return sorted(files, key=lambda f: -f.stat().st_size)


def _truncate(f):
  f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _garble(f):
  data = bytearray(f.read_bytes())
  data[len(data) // 2] ^= 0x10
  f.write_bytes(bytes(data))


_DATA_FILE_ERROR = r"4/state/(ocdbt\.process_0/)?d/\w+: (OUT_OF_RANGE|DATA_LOSS): .* \(reading array \S+\)"
# kind -> (damage step directory d, what the warning must say: a regular expression)
DAMAGE = {
    "truncated_state_files": (lambda d: [_truncate(f) for f in _data_files(d)], _DATA_FILE_ERROR),
    "zeroed_state_files": (lambda d: [f.write_bytes(bytes(f.stat().st_size)) for f in _data_files(d)],
                           _DATA_FILE_ERROR),
    # tensorstore decodes this garbled byte without an error: only the checksum written at save catches it
    "garbled_state_bytes": (lambda d: _garble(_data_files(d)[0]),
                            r"4/state: array params\S* differs from the checksum written at save"),
    "truncated_state_metadata": (lambda d: _truncate(d / "state" / "_METADATA"), "4/state/_METADATA: invalid JSON"),
    "zeroed_state_metadata": (lambda d: (d / "state" / "_METADATA").write_bytes(bytes(100)),
                              "4/state/_METADATA: invalid JSON"),
    "truncated_meta_json": (lambda d: _truncate(d / "meta" / "metadata"), "4/meta/metadata: invalid JSON"),
    "invalid_meta_json": (lambda d: (d / "meta" / "metadata").write_text("{'step': 4}"),
                          "4/meta/metadata: invalid JSON"),
    "meta_not_an_object": (lambda d: (d / "meta" / "metadata").write_text("[4]"), "4/meta/metadata: holds a JSON list"),
    "missing_state_item": (lambda d: shutil.rmtree(d / "state"), "4/state: item directory is missing"),
    "missing_meta_item": (lambda d: shutil.rmtree(d / "meta"), "4/meta: item directory is missing"),
}


def test_intact_latest_checkpoint_restores_exactly(ckdir, saved, caplog):
  caplog.set_level(logging.WARNING, logger=LOGGER)
  step, state, meta = RunCheckpointer(ckdir, 3).restore_latest_intact(saved["target"], CFG)
  assert step == 4 and meta["step"] == 4 and meta["npr"] == {"solved": []}
  assert_equal_state(state, saved["host"][4])
  assert not caplog.records


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(kind, ckdir, saved, caplog):
  damage, expected = DAMAGE[kind]
  damage(ckdir / "4")
  caplog.set_level(logging.WARNING, logger=LOGGER)
  ck = RunCheckpointer(ckdir, 3)
  step, state, meta = ck.restore_latest_intact(saved["target"], CFG)
  assert step == 2 and meta["step"] == 2
  assert_equal_state(state, saved["host"][2])
  warning = next(r.getMessage() for r in caplog.records if "is damaged" in r.getMessage())
  assert "checkpoint 4" in warning and re.search(expected, warning), warning
  # the damaged checkpoint is kept aside, so the resumed run can write step 4 again
  assert (ckdir / "4.damaged").is_dir() and ck.all_steps() == [2]
  ck.save(4, saved["states"][4], _meta(4))
  assert RunCheckpointer(ckdir, 3).restore_latest_intact(saved["target"], CFG)[0] == 4


def test_restoring_exactly_a_damaged_step_is_a_one_line_resume_error(ckdir, saved):
  shutil.rmtree(ckdir / "4" / "meta")
  with pytest.raises(ResumeError, match=r"checkpoint .*/4 is damaged \(4/meta: item directory is missing\)"):
    RunCheckpointer(ckdir, 3).restore(saved["target"], CFG, 4)


def test_no_intact_checkpoint_lists_each_one_and_how_to_start_over(ckdir, saved):
  _truncate(ckdir / "4" / "meta" / "metadata")
  shutil.rmtree(ckdir / "2" / "state")
  with pytest.raises(ResumeError) as info:
    RunCheckpointer(ckdir, 3).restore_latest_intact(saved["target"], CFG)
  msg = str(info.value)
  assert "checkpoint 4: 4/meta/metadata: invalid JSON" in msg and "checkpoint 2: 2/state: item directory" in msg
  assert "new run_dir" in msg and "checkpoint.resume=false" in msg and "\n" not in msg
  assert sorted(p.name for p in ckdir.iterdir()) == ["2", "4"]  # nothing moved or deleted: the user decides


def test_an_empty_directory_has_nothing_to_restore(tmp_path, saved):
  assert RunCheckpointer(tmp_path / "none", 3).restore_latest_intact(saved["target"], CFG) is None


def test_a_changed_learning_rate_is_refused_naming_old_and_new_value(ckdir, saved):
  changed = load_config(overrides=["optimizer.lr=0.001", "optimizer.b2=0.99"])
  with pytest.raises(ResumeError) as info:
    RunCheckpointer(ckdir, 3).restore_latest_intact(saved["target"], changed)
  msg = str(info.value)
  assert f"{ckdir}/4 was written with a different configuration" in msg  # refused at once, not "damaged"
  assert "optimizer.lr: 0.0005 -> 0.001" in msg and "optimizer.b2: 0.999 -> 0.99" in msg
  assert "data.npr" not in msg and "new run_dir" in msg
  assert sorted(p.name for p in ckdir.iterdir()) == ["2", "4"]


def test_npr_and_micro_batching_may_change_on_resume(ckdir, saved):
  resumed = load_config(overrides=["data.npr.enabled=false", "data.npr.threshold=0.5", "trainer.micro_batches=4",
                                   "reward.workers=1", "pipeline.steps=900"])
  step, state, _ = RunCheckpointer(ckdir, 3).restore_latest_intact(saved["target"], resumed)
  assert step == 4
  assert_equal_state(state, saved["host"][4])


def test_fingerprint_holds_the_values_that_define_the_run():
  fp = config_fingerprint(load_config(overrides=["optimizer.lr=0.002"]))
  assert fp["optimizer.lr"] == 0.002 and fp["loss.name"] == "cispo" and fp["model.hidden"] == CFG.model.hidden
  assert {f"optimizer.{k}" for k in ("lr", "warmup_steps", "weight_decay", "b1", "b2", "eps", "grad_clip")} <= set(fp)
  assert not [k for k in fp if k.startswith(("data.npr", "trainer.", "pipeline."))]
  json.dumps(fp)  # stored in the checkpoint's JSON meta as values, so a refusal can name them


def test_a_checkpoint_with_the_older_hashed_fingerprint_still_resumes(ckdir, saved):
  ck = RunCheckpointer(ckdir, 3)
  ck.save(6, saved["states"][6], {**_meta(6), "fingerprint": ckpt_lib._legacy_fingerprint(CFG)})
  assert ck.restore_latest_intact(saved["target"], CFG)[0] == 6
  with pytest.raises(ResumeError, match=r"loss\.\* \(a checkpoint from before per-key fingerprints"):
    ck.restore_latest_intact(saved["target"], load_config(overrides=["loss.name=dapo"]))


def test_a_checkpoint_from_before_the_reward_group_resumes():
  """Checkpoints written before the reward keys left the data group (and before the KL keys went) hold
  data.reward_*, data.failure_reward and loss.kl_* in their fingerprints: read under their new names (config.MOVED),
  the same run resumes, and a changed value is named by its new key."""
  cfg = load_config(overrides=["reward.scale=pm1", "reward.timeout_s=10"])
  old = {k: v for k, v in config_fingerprint(cfg).items() if not k.startswith("reward.")}
  old.update({"data.reward_fn": "", "data.reward_timeout_s": 10.0, "data.failure_reward": None,
              "data.reward_scale": "pm1", "loss.kl_coef": 0.0, "loss.kl_estimator": "k3"})
  assert ckpt_lib.fingerprint_changes(old, cfg) == []
  assert ckpt_lib.fingerprint_changes(old, load_config(overrides=["reward.timeout_s=10"])) == [
      "reward.scale: pm1 -> 01"]
  assert "reward.workers" not in config_fingerprint(cfg)  # parallelism only: may change on resume


def test_a_checkpoint_naming_a_relative_path_resumes_once_the_path_is_absolute(tmp_path, monkeypatch):
  """RLJob makes existing relative paths absolute (absolute_paths); a checkpoint written before that stored them as
  given, and the same file is not a change."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "rows.jsonl").write_text("")
  cfg = load_config(overrides=["data.task=file", "data.path=rows.jsonl"])
  assert absolute_paths(cfg).data.path == str(tmp_path / "rows.jsonl")
  assert ckpt_lib.fingerprint_changes(config_fingerprint(cfg), absolute_paths(cfg)) == []
  moved = load_config(overrides=["data.task=file", "data.path=/elsewhere/rows.jsonl"])
  assert ckpt_lib.fingerprint_changes(config_fingerprint(cfg), moved) == ["data.path: rows.jsonl -> "
                                                                          "/elsewhere/rows.jsonl"]


# ---- write failures ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _python_write_fails_with_enospc(monkeypatch):
  """The lowest Python write orbax makes (etils' Path.write_text / write_bytes) fails as on a full disk."""
  cls = type(epath.Path("/"))
  for name in ("write_text", "write_bytes"):
    original = getattr(cls, name)

    def failing(self, *args, _original=original, **kwargs):
      if ckpt_lib.TMP_MARKER in str(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
      return _original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, failing)
  yield "No space left on device"


@contextlib.contextmanager
def _every_write_past_8k_fails(monkeypatch):
  """The kernel refuses every write past 8 KiB (RLIMIT_FSIZE, EFBIG): tensorstore's own C++ writes fail too."""
  resource = pytest.importorskip("resource")
  limits = resource.getrlimit(resource.RLIMIT_FSIZE)
  previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer
  resource.setrlimit(resource.RLIMIT_FSIZE, (8192, limits[1]))
  try:
    yield "File too large"
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.parametrize("failure", [_python_write_fails_with_enospc, _every_write_past_8k_fails])
def test_a_failed_write_keeps_the_previous_checkpoint_and_says_so(failure, ckdir, saved, monkeypatch):
  ck = RunCheckpointer(ckdir, 2)
  with failure(monkeypatch) as cause, pytest.raises(CheckpointError) as info:
    ck.save(6, saved["states"][6], _meta(6))
  msg = str(info.value)
  assert isinstance(info.value, UserError) and "\n" not in msg
  assert f"checkpoint 6 could not be written to {ckdir}" in msg and cause in msg, msg
  assert "checkpoint 4 is untouched" in msg
  assert sorted(p.name for p in ckdir.iterdir()) == ["2", "4"]  # the partial directory is gone, keep=2 deleted none
  step, state, _ = RunCheckpointer(ckdir, 2).restore_latest_intact(saved["target"], CFG)
  assert step == 4
  assert_equal_state(state, saved["host"][4])


def test_a_full_tmpfs_keeps_the_previous_checkpoint(saved, tmp_path):
  """The real thing where a tmpfs can be mounted (root): the disk fills up in the middle of the write."""
  with tmpfs(tmp_path / "disk", "size=2m") as disk:
    shutil.copytree(saved["template"], disk / "checkpoints")
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
      with pytest.raises(OSError, match="No space left"):
        while True:  # fill the disk up
          os.write(fd, b"\0" * 4096)
    finally:
      os.close(fd)
    os.truncate(filler, filler.stat().st_size - 32 * 1024)  # 32 KiB free: the write starts, then fails midway
    ck = RunCheckpointer(disk / "checkpoints", 2)
    with pytest.raises(CheckpointError, match=r"checkpoint 6 could not be written .*No space left on device.*"
                                              r"checkpoint 4 is untouched"):
      ck.save(6, saved["states"][6], _meta(6))
    assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["2", "4"]
    step, state, _ = RunCheckpointer(disk / "checkpoints", 2).restore_latest_intact(saved["target"], CFG)
    assert step == 4
    assert_equal_state(state, saved["host"][4])


# ---- interrupted writes ----------------------------------------------------------------------------------
_KILLED_MID_WRITE = """
import os, signal, sys
import jax.numpy as jnp
from etils import epath
from scalerl_jax.train.checkpoint import RunCheckpointer, TMP_MARKER
cls = type(epath.Path(sys.argv[1]))
write = cls.write_text
def killing(self, *a, **k):
  if TMP_MARKER in str(self):
    os.kill(os.getpid(), signal.SIGKILL)
  return write(self, *a, **k)
cls.write_text = killing
RunCheckpointer(sys.argv[1], 2).save(6, {"x": jnp.arange(4)}, {"step": 6})
"""


def test_a_write_killed_midway_leaves_a_temporary_directory_that_start_up_removes(ckdir, saved, caplog):
  proc = subprocess.run([sys.executable, "-c", _KILLED_MID_WRITE, str(ckdir)], cwd=ROOT, capture_output=True,
                        env={**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == -9, proc.stderr.decode()[-2000:]
  orphans = [p.name for p in ckdir.iterdir() if ckpt_lib.TMP_MARKER in p.name]
  assert orphans and all(name.startswith("6.") for name in orphans)
  (ckdir / "8.orbax-checkpoint-tmp-1700000000").mkdir()  # older orbax versions append a timestamp
  caplog.set_level(logging.WARNING, logger=LOGGER)
  ck = RunCheckpointer(ckdir, 2)
  assert ck.latest_step() == 4  # never committed, so never a checkpoint
  removed = ck.remove_orphans()
  assert sorted(p.name for p in removed) == sorted([*orphans, "8.orbax-checkpoint-tmp-1700000000"])
  assert sorted(p.name for p in ckdir.iterdir()) == ["2", "4"]
  assert sum("never finished" in r.getMessage() for r in caplog.records) == len(removed)
  assert ck.restore_latest_intact(saved["target"], CFG)[0] == 4


# ---- untrusted inputs ------------------------------------------------------------------------------------
class _Payload:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return os.system, (f"touch {self.marker}",)


def test_restore_never_unpickles_or_evaluates_what_a_checkpoint_holds(ckdir, saved, tmp_path, monkeypatch):
  marker, control = tmp_path / "code_ran", tmp_path / "control"
  pickle.loads(pickle.dumps(_Payload(control)))
  assert control.exists()  # the payload is live: unpickling it runs a command
  bomb = pickle.dumps(_Payload(marker))
  for planted in ("4/meta/metadata", "4/state/_METADATA", "4/state/checkpoint", "4/checkpoint.pkl", "2/state/x.pkl"):
    (ckdir / planted).write_bytes(bomb)
  calls = []
  for name in ("load", "loads", "Unpickler"):
    monkeypatch.setattr(pickle, name, lambda *a, _n=name, **k: calls.append(_n))
  ck = RunCheckpointer(ckdir, 3)
  crafted = {"py/reduce": [{"py/function": "os.system"}, [f"touch {marker}"]], "__reduce__": "os.system",
             "yaml": f"!!python/object/apply:os.system ['touch {marker}']"}
  ck.save(6, saved["states"][6], _meta(6, crafted=crafted))
  step, _, meta = ck.restore_latest_intact(saved["target"], CFG)
  assert step == 6 and meta["crafted"] == crafted  # plain JSON data, never evaluated
  shutil.rmtree(ckdir / "6")
  ck = RunCheckpointer(ckdir, 3)
  assert ck.restore_latest_intact(saved["target"], CFG)[0] == 2  # 4's pickles are damage, not code
  assert not calls and not marker.exists()


def test_yaml_python_tags_are_refused_without_running_anything(tmp_path):
  marker, control = tmp_path / "code_ran", tmp_path / "control"
  yaml.unsafe_load(f'run_dir: !!python/object/apply:os.system ["touch {control}"]')
  assert control.exists()  # the tag is live: an unsafe loader runs the command
  evil = tmp_path / "evil.yaml"
  evil.write_text(f'run_dir: !!python/object/apply:os.system ["touch {marker}"]\n')
  child = tmp_path / "child.yaml"
  child.write_text("base: evil.yaml\nseed: 1\n")
  for path in (evil, child):
    with pytest.raises(ConfigError, match="evil.yaml"):
      load_config(path)
  tagged = f"!!python/object/apply:os.system ['touch {marker}']"
  assert load_config(overrides=[f"run_dir={tagged}"]).run_dir == tagged  # a string key takes the text as written
  with pytest.raises(ConfigError, match="seed"):  # any other key parses YAML safely: the tag is refused
    load_config(overrides=[f"seed={tagged}"])
  assert not marker.exists()
