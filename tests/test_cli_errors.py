"""launch/train.py and launch/fit_curve.py: every user error is one line `<prog>: error: ...` (exit 2), never a
traceback; overrides on both sides of a flag; a run directory that is a file, or holds a run that
checkpoint.resume=false would overwrite; the final report names only the logs it wrote. The subprocess cases fail
before anything compiles."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from scalerl_jax.config import load_config
from scalerl_jax.run.run_dir import prepare_run_dir
from scalerl_jax.scaling import synthetic
from tests.cli_helpers import exit_error
from tests.fault_helpers import tmpfs

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN, FIT = ROOT / "launch" / "train.py", ROOT / "launch" / "fit_curve.py"
CHEAP = ["data.num_train=64", "data.num_eval=8", "warm_start.enabled=false"]  # errors before any compilation


def _load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


train = _load(TRAIN, "train_cli")


def _run(script, *args, cwd):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = str(ROOT)
  return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                        env=env, timeout=300)


def _one_line_error(proc, prog: str) -> str:
  assert proc.returncode == 2, (proc.returncode, proc.stderr)
  assert "Traceback" not in proc.stderr, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
  return lines[0]


def _yaml(tmp_path, name, data: bytes):
  path = tmp_path / name
  path.write_bytes(data)
  return path


@pytest.mark.parametrize("name, data, message", [
    ("syntax.yaml", b"loss:\n  name: [cispo\n", "syntax.yaml, line 3, column 1: not valid YAML"),
    ("tab.yaml", b"loss:\n\tname: dapo\n", "tab.yaml, line 2, column 1: not valid YAML"),
    ("dup.yaml", b"loss:\n  name: dapo\n  name: ppo\n", "dup.yaml, line 3, column 3: not valid YAML: found duplicate"),
    ("latin1.yaml", 'run_dir: "caf\xe9"\n'.encode("latin-1"), "latin1.yaml: not UTF-8 text"),
    ("tag.yaml", b"data:\n  path: !!python/object/apply:os.system ['touch PWNED']\n", "tag.yaml, line 2, column 9: "
     "not valid YAML: could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply"),
])
def test_train_config_file_errors(tmp_path, name, data, message):
  proc = _run(TRAIN, "--config", _yaml(tmp_path, name, data), f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
  assert message in _one_line_error(proc, "train.py")
  assert not (tmp_path / "PWNED").exists()  # the tag is refused, never run


def test_train_errors_raised_while_building_the_job(tmp_path):
  run_dir = tmp_path / "run"
  proc = _run(TRAIN, f"run_dir={run_dir}", "reward.fn=no_such_module.reward", *CHEAP, cwd=tmp_path)
  assert "reward.fn: cannot import module 'no_such_module'" in _one_line_error(proc, "train.py")
  (tmp_path / "tok").mkdir()
  (tmp_path / "tok" / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLe')
  proc = _run(TRAIN, f"run_dir={run_dir}", f"data.tokenizer={tmp_path / 'tok'}", *CHEAP, cwd=tmp_path)
  line = _one_line_error(proc, "train.py")
  assert f"data.tokenizer: {tmp_path / 'tok' / 'tokenizer.json'} is not a readable tokenizer.json" in line


def test_train_run_dir_that_is_a_file(tmp_path):
  a_file = tmp_path / "taken"
  a_file.write_text("not a directory")
  proc = _run(TRAIN, f"run_dir={a_file}", "--reference-loop", *CHEAP, cwd=tmp_path)  # overrides after a flag, too
  assert _one_line_error(proc, "train.py") == f"train.py: error: run_dir {a_file}: is a file"
  proc = _run(TRAIN, f"run_dir={a_file / 'sub'}", *CHEAP, cwd=tmp_path)
  assert _one_line_error(proc, "train.py") == f"train.py: error: run_dir {a_file / 'sub'}: cannot create it (Not a " \
                                             "directory)"


def test_old_spellings_are_refused_with_their_new_names(tmp_path):
  """--sync (the reference loop without threads) is now --reference-loop, and pipeline.mode=sync (PipelineRL with
  k = 0) pipeline.mode=lockstep; a moved key in a YAML file names its new key. One line each, before any work."""
  proc = _run(TRAIN, "--sync", *CHEAP, cwd=tmp_path)
  assert _one_line_error(proc, "train.py") == ("train.py: error: --sync was renamed --reference-loop (the reference "
                                              "loop without threads; pipeline.mode=lockstep is PipelineRL with k = 0)")
  old = _yaml(tmp_path, "old.yaml", b"data:\n  reward_timeout_s: 3.0\n")
  proc = _run(TRAIN, "--config", old, "pipeline.mode=sync", *CHEAP, cwd=tmp_path)
  assert _one_line_error(proc, "train.py") == (f"train.py: error: data.reward_timeout_s: moved to reward.timeout_s "
                                              f"in {old}")
  proc = _run(TRAIN, "pipeline.mode=sync", *CHEAP, cwd=tmp_path)
  assert "pipeline.mode: 'sync' was renamed 'lockstep'" in _one_line_error(proc, "train.py")
  help_text = train.make_parser().format_help()
  assert "--reference-loop" in help_text and "--sync" not in help_text


def test_fit_curve_errors(tmp_path):
  run = synthetic.synthetic_run(synthetic.table1("ScaleRL", r0=0.3), 16000.0, n_evals=12, seed=1)
  run_dir = synthetic.write_run_dir(run, tmp_path / "run").parent
  lines = (run_dir / "metrics.jsonl").read_text().splitlines()
  rec = json.loads(lines[4])
  assert "eval/n_correct" in rec
  rec["eval/n_correct"] = "many"
  (run_dir / "metrics.jsonl").write_text("\n".join(lines[:4] + [json.dumps(rec)] + lines[5:]) + "\n")
  proc = _run(FIT, run_dir, cwd=tmp_path)
  assert _one_line_error(proc, "fit_curve.py") == \
      f"fit_curve.py: error: {run_dir / 'metrics.jsonl'}:5: eval/n_correct is not an integer: 'many'"
  (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  blocker = tmp_path / "plots"
  blocker.write_text("a file where a folder should be")
  proc = _run(FIT, run_dir, "--plot", blocker / "fit.png", cwd=tmp_path)
  assert _one_line_error(proc, "fit_curve.py").startswith(f"fit_curve.py: error: cannot write --plot "
                                                          f"{blocker / 'fit.png'}: ")


# ---- in process: argument parsing, the run directory, errors from the run ---------------------------------------

def test_overrides_before_between_and_after_flags():
  _, args = train.parse_args(["a=1", "--reference-loop", "b=2", "--mesh", "data=1", "c=3"])
  assert args.overrides == ["a=1", "b=2", "c=3"] and args.reference_loop and args.mesh == "data=1"
  assert "--overwrite" in train.make_parser().format_help()


class FakeJob:
  """Stands in for RLJob: records that it was built, raises what the test gives it from run()."""
  built = []
  raises = None

  interrupted = False
  exit_code = 0

  def __init__(self, cfg, transfer_host=None):
    FakeJob.built.append(cfg)

  def run(self):
    if FakeJob.raises is not None:
      raise FakeJob.raises
    return {"steps": 0}

  run_sync = run


@pytest.fixture
def fake_job(monkeypatch):
  from scalerl_jax.run import job
  monkeypatch.setattr(job, "RLJob", FakeJob)
  FakeJob.built, FakeJob.raises = [], None
  return FakeJob


def _main_error(capsys, argv) -> str:
  return exit_error(capsys, train.main, argv)


def test_a_user_error_from_the_generator_thread_prints_its_cause(fake_job, tmp_path, capsys):
  from scalerl_jax.data.sources import DataError
  from scalerl_jax.pipeline.orchestrator import PipelineError
  try:
    try:
      raise DataError("reward.fn: every call of tests.bad.reward raised ZeroDivisionError")
    except DataError as cause:
      raise PipelineError("generator thread failed:\nTraceback (most recent call last):\n  ...") from cause
  except PipelineError as exc:
    fake_job.raises = exc
  err = _main_error(capsys, [f"run_dir={tmp_path / 'r'}"])
  assert err == "train.py: error: reward.fn: every call of tests.bad.reward raised ZeroDivisionError\n"
  fake_job.raises = PipelineError("generator thread failed: a bug")  # no user error in the chain: a traceback
  with pytest.raises(PipelineError):
    train.main([f"run_dir={tmp_path / 'r'}"])


def _earlier_run(run_dir):
  (run_dir / "checkpoints" / "40").mkdir(parents=True)
  (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
  (run_dir / "consumed_prompts.jsonl").write_text('{"step": 0}\n')
  (run_dir / "keep.txt").write_text("not the trainer's")


def test_resume_false_into_an_earlier_run_is_refused_without_overwrite(fake_job, tmp_path, capsys, caplog):
  run_dir = tmp_path / "run"
  _earlier_run(run_dir)
  err = _main_error(capsys, [f"run_dir={run_dir}", "checkpoint.resume=false"])
  assert err == (f"train.py: error: run_dir {run_dir} holds an earlier run (metrics.jsonl, consumed_prompts.jsonl, "
                 "checkpoints/) that checkpoint.resume=false would overwrite: pass --overwrite to delete it, choose "
                 "another run_dir, or drop checkpoint.resume=false to continue it\n")
  assert not fake_job.built and (run_dir / "metrics.jsonl").exists() and (run_dir / "checkpoints" / "40").exists()
  with caplog.at_level("WARNING"):
    assert train.main([f"run_dir={run_dir}", "checkpoint.resume=false", "--overwrite"]) == 0
  assert len(fake_job.built) == 1
  assert sorted(p.name for p in run_dir.iterdir() if not p.name.startswith(".run.lock")) == ["keep.txt"]
  assert any("--overwrite: deleting the earlier run's metrics.jsonl, consumed_prompts.jsonl, checkpoints/" in
             r.getMessage() for r in caplog.records)


def test_overwrite_never_deletes_a_live_run(tmp_path):
  from scalerl_jax.train.run_lock import RunLock
  run_dir = tmp_path / "run"
  _earlier_run(run_dir)
  cfg = load_config(None, [f"run_dir={run_dir}", "checkpoint.resume=false"])
  holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from scalerl_jax.train.run_lock import RunLock; "
                             f"lock = RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
  try:
    assert holder.stdout.readline().strip() == "held"
    problem = prepare_run_dir(cfg, overwrite=True)
    assert problem.startswith(f"run_dir {run_dir.absolute()} is in use by another run (pid {holder.pid}")
    assert (run_dir / "metrics.jsonl").exists() and (run_dir / "checkpoints" / "40").exists()
  finally:
    holder.kill()
    holder.wait()
  assert prepare_run_dir(cfg, overwrite=True) is None and not (run_dir / "metrics.jsonl").exists()
  assert RunLock(run_dir).acquire().held  # released again for the job to take


def test_run_dir_checks_leave_resumes_and_fresh_dirs_alone(tmp_path, caplog):
  run_dir = tmp_path / "run"
  cfg = load_config(None, [f"run_dir={run_dir}"])
  assert prepare_run_dir(cfg, overwrite=False) is None and run_dir.is_dir()  # created
  _earlier_run(run_dir)
  assert prepare_run_dir(cfg, overwrite=False) is None  # resume=true: the job resumes it
  assert (run_dir / "metrics.jsonl").exists()
  (run_dir / "checkpoints" / "40").rmdir()
  with caplog.at_level("WARNING"):
    assert prepare_run_dir(cfg, overwrite=False) is None
  assert any("holds metrics.jsonl but no checkpoint" in r.getMessage() for r in caplog.records)


def test_final_report_names_tensorboard_only_when_it_is_on(tmp_path):
  from scalerl_jax.pipeline.report import final_report
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "compute/accelerator_seconds": 2.0}\n{"step": 2, "comp')
  for on in (True, False):
    cfg = load_config(None, [f"run_dir={tmp_path}", f"logging.tensorboard={str(on).lower()}"])
    report = final_report(cfg, {"steps": 2})  # the cut last line is skipped, not a crash
    assert f"logs in {tmp_path}/metrics.jsonl" in report
    assert (f"{tmp_path}/tensorboard" in report) == on


def test_final_report_names_skipped_bad_rows(tmp_path):
  from scalerl_jax.pipeline.report import final_report
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "data/rows_read": 80, "data/skipped_bad_rows": 68})
                                          + "\n")
  cfg = load_config(None, [f"run_dir={tmp_path}", "data.task=file", "data.path=rows.jsonl"])
  assert "data: 68 of 80 rows of rows.jsonl skipped as bad (data.skip_bad_rows=true" in final_report(cfg, {})


# ---- run directories that cannot be written, a full disk, messages that name the right thing ------------------

def test_a_run_dir_whose_checkpoints_folder_is_a_file_is_refused_up_front(fake_job, tmp_path, capsys):
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  (run_dir / "checkpoints").write_text("a file where the run keeps its checkpoints")
  assert _main_error(capsys, [f"run_dir={run_dir}"]) == (
      f"train.py: error: run_dir {run_dir}: checkpoints is a file; the run keeps its checkpoints in a folder of that "
      "name\n")
  assert not fake_job.built  # (today's code trained up to the first checkpoint, then failed)


def test_a_read_only_run_dir_is_refused_up_front(fake_job, tmp_path, capsys):
  """Root ignores file permissions, so the read-only case needs a read-only mount (root can make one; skipped
  elsewhere). Before: a 23-line orbax traceback when the job made run_dir/checkpoints."""
  with tmpfs(tmp_path / "ro", "size=1m,ro") as run_dir:
    assert _main_error(capsys, [f"run_dir={run_dir}"]) == (
        f"train.py: error: run_dir {run_dir}: cannot write in {run_dir} (Read-only file system)\n")
    assert not fake_job.built


_FULL_DISK = """
import os, resource, runpy, signal, sys
from scalerl_jax.train import checkpoint
save = checkpoint.RunCheckpointer.save
def save_on_a_full_disk(self, *args, **kwargs):  # every file write past 8 KiB fails (EFBIG), tensorstore's too
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  limits = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (8192, limits[1]))
  try:
    return save(self, *args, **kwargs)
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
checkpoint.RunCheckpointer.save = save_on_a_full_disk
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_checkpoint_write_that_fails_on_the_disk_is_one_line(tmp_path):
  """orbax's writer threads each log their failure with a traceback through absl (288 lines here before): held back,
  so the CheckpointError's one line is all the user sees."""
  from tests.fault_helpers import child_env
  from tests.pipeline_helpers import TINY
  run_dir = tmp_path / "run"
  # no persistent compilation cache: a compile that ends inside the save's file-size limit (the generator thread
  # compiles whenever it gets there: later on a loaded machine) fails to write its cache entry and jax warns
  env = {**child_env(None), "JAX_ENABLE_COMPILATION_CACHE": "false"}
  proc = subprocess.run([sys.executable, "-c", _FULL_DISK, str(TRAIN), f"run_dir={run_dir}", *TINY,
                         "pipeline.steps=2"], capture_output=True, text=True, cwd=tmp_path, env=env,
                        timeout=600)  # (stderr a pipe: the file-size limit does not apply to it)
  line = _one_line_error(proc, "train.py")
  assert line == (f"train.py: error: checkpoint 2 could not be written to {run_dir / 'checkpoints'} (File too "
                  "large); no earlier checkpoint exists")


def _rows_file(tmp_path):
  rows = tmp_path / "rows.jsonl"
  rows.write_text("".join(json.dumps({"prompt": f"{i} + 1", "answer": str(i + 1)}) + "\n" for i in range(20)))
  return rows


def _file_task_error(*overrides) -> str:
  from scalerl_jax.data.sources import DataError
  from scalerl_jax.data.tasks import make_task
  with pytest.raises(DataError) as info:
    make_task(load_config(None, ["data.task=file", *overrides]).data)
  return str(info.value)


def test_a_missing_eval_path_is_named_as_data_eval_path(tmp_path):
  missing = tmp_path / "held_out.jsonl"
  assert _file_task_error(f"data.path={_rows_file(tmp_path)}", f"data.eval_path={missing}") == \
      f"data.eval_path: no such file {missing}"


@pytest.mark.parametrize("key", ["path", "eval_path"])
def test_a_directory_given_as_a_data_file_says_so(tmp_path, key):
  overrides = {"path": _rows_file(tmp_path), key: tmp_path}
  assert _file_task_error(*(f"data.{k}={v}" for k, v in overrides.items())) == \
      f"data.{key}: {tmp_path} is a directory; give one .jsonl, .jsonl.gz or .parquet file"


def test_a_directory_given_as_config_says_so(fake_job, tmp_path, capsys):
  assert _main_error(capsys, ["--config", str(tmp_path)]) == (
      f"train.py: error: config file {tmp_path} is a directory; give a YAML file (e.g. configs/cpu_default.yaml)\n")
