"""The multi-host launchers (launch/tpu_pod.sh, gke_jobset.sh, slurm_gpu.sbatch): what their dry runs print, that
the real path runs exactly that (gcloud, kubectl, srun and scontrol replaced by fakes that record their calls),
that the printed worker and task commands work when a shell runs them (a fake interpreter reports the argv it
got), and that bad arguments exit 2 naming the flag. No network, cloud tools or Slurm needed."""

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from tests.pipeline_helpers import read_jsonl

ROOT = pathlib.Path(__file__).resolve().parents[1]
TPU_POD, GKE, SLURM = (ROOT / "launch" / n for n in ("tpu_pod.sh", "gke_jobset.sh", "slurm_gpu.sbatch"))
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="the launchers are bash scripts")
# overrides that a careless quoting would split or expand: a space, both quotes, $, & and a glob
OVERRIDES = ["mesh.generator_processes=1", "data.path=my data/it's \"q\".jsonl", "run_name=$HOME&*"]
SHA = "0123456789abcdef0123456789abcdef01234567"


def run(script, *args, env=None, **kwargs):
  return subprocess.run([BASH, str(script), *args], capture_output=True, text=True, timeout=60,
                        env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL, **kwargs)


def write_tool(path, body):
  """An executable Python script at `path` (its shebang is this interpreter)."""
  path.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
  path.chmod(0o755)
  return path


def fake_tools(tmp_path, *names, stdout=""):
  """A bin folder of fake `names` that append {argv, stdin} to calls.jsonl and print `stdout`."""
  bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
  bin_dir.mkdir(exist_ok=True)
  for name in names:
    write_tool(bin_dir / name, f"open({str(calls)!r}, 'a').write(json.dumps({{'argv': [{name!r}] + sys.argv[1:], "
                               f"'stdin': sys.stdin.read()}}) + '\\n')\nprint({stdout!r}, end='')")
  return bin_dir, calls


def tpu_args(*extra):
  return ["--tpu", "pod-v5e-32", "--zone", "us-west4-a", "--project", "my-proj", *extra]


# --- tpu_pod.sh ----------------------------------------------------------------------------------------------


def test_tpu_pod_dry_run_prints_install_start_and_stream():
  out = run(TPU_POD, *tpu_args("--repo", "https://example.com/scalerl_jax.git", "--ref", SHA, "--run-dir",
                               "gs://bucket/run 1", "--dry-run", "--", *OVERRIDES))
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert len(lines) == 3
  install, start, stream = (shlex.split(line) for line in lines)
  ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod-v5e-32", "--zone", "us-west4-a", "--project", "my-proj"]
  for argv, worker in ((install, "--worker=all"), (start, "--worker=all"), (stream, "--worker=0")):
    assert argv[:-3] == ssh and argv[-3:-1] == [worker, "--command"]
  assert "git clone --quiet https://example.com/scalerl_jax.git ~/scalerl_jax" in install[-1]
  assert f"git fetch --quiet origin {SHA} && git checkout --quiet --detach FETCH_HEAD" in install[-1]
  assert "python3.11 -m venv .venv && .venv/bin/pip install --quiet -r requirements.txt -e '.[tpu]'" in install[-1]
  assert "PYTHONUNBUFFERED=1 .venv/bin/python launch/train.py" in start[-1]
  assert "--coordinator" not in start[-1]  # jax finds the pod slice itself
  assert re.search(r"> logs/\d{8}T\d{6}Z\.log 2>&1 < /dev/null &", start[-1])
  assert "tail -n +1 -F --pid=" in stream[-1]


def _worker_python(tmp_path):
  """Stands in for python3.11 on a worker: `-m venv .venv` makes a pip that records its arguments and a python
  that prints its argv and PYTHONUNBUFFERED as JSON, then exits 3."""
  pip = "open('pip_args.json', 'w').write(json.dumps(sys.argv[1:]))"
  python = "print(json.dumps([sys.argv[1:], os.environ.get('PYTHONUNBUFFERED')]))\nsys.exit(3)"
  return write_tool(tmp_path / "python3.11", f"""
assert sys.argv[1:] == ['-m', 'venv', '.venv'], sys.argv
os.makedirs('.venv/bin', exist_ok=True)
for name, body in (('pip', {pip!r}), ('python', {python!r})):
  with open('.venv/bin/' + name, 'w') as f:
    f.write('#!' + sys.executable + '\\nimport json, os, sys\\n' + body + '\\n')
  os.chmod('.venv/bin/' + name, 0o755)""")


def _commit(repo, text):
  git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
  (repo / "f.txt").write_text(text)
  subprocess.run(git + ["add", "f.txt"], check=True)
  subprocess.run(git + ["commit", "-q", "-m", text], check=True)
  return subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_tpu_pod_worker_commands_work_in_a_shell(tmp_path):
  """The three --command strings, run by bash as a worker's login shell would (HOME = a fresh folder): the repo is
  cloned at the ref (and fetched at a newer one on a second install), the trainer gets exactly our arguments,
  and the stream shows its log and returns its exit status."""
  src, home = tmp_path / "src", tmp_path / "home"
  home.mkdir()
  subprocess.run(["git", "init", "-q", str(src)], check=True)
  python = _worker_python(tmp_path)
  env = {"HOME": str(home)}
  for text in ("one", "two"):
    sha = _commit(src, text)
    out = run(TPU_POD, *tpu_args("--repo", str(src), "--ref", sha, "--python", str(python), "--run-dir",
                                 "gs://bucket/run 1", "--dry-run", "--", *OVERRIDES))
    assert out.returncode == 0, out.stderr
    install, start, stream = (shlex.split(line)[-1] for line in out.stdout.splitlines())
    done = subprocess.run([BASH, "-c", install], env={**os.environ, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    checkout = home / "scalerl_jax"
    assert (checkout / "f.txt").read_text() == text
    assert json.loads((checkout / "pip_args.json").read_text()) == ["install", "--quiet", "-r", "requirements.txt",
                                                                    "-e", ".[tpu]"]
  subprocess.run([BASH, "-c", start], env={**os.environ, **env}, check=True, timeout=30)
  rc_file = next((home / "scalerl_jax" / "logs").glob("*.pid")).with_suffix(".rc")
  deadline = time.monotonic() + 20
  while not rc_file.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert rc_file.read_text().strip() == "3"
  shown = subprocess.run([BASH, "-c", stream], env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
  assert shown.returncode == 3
  argv, unbuffered = json.loads(shown.stdout)
  assert argv == ["launch/train.py", "--config", "configs/scalerl_8b.yaml", "run_dir=gs://bucket/run 1", *OVERRIDES]
  assert unbuffered == "1"


def test_tpu_pod_runs_what_its_dry_run_prints(tmp_path):
  bin_dir, calls = fake_tools(tmp_path, "gcloud")
  args = tpu_args("--repo", "https://example.com/r.git", "--ref", SHA, "--config", "configs/math_hf.yaml")
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
  dry = run(TPU_POD, *args, "--dry-run", "--", *OVERRIDES, env=env)
  real = run(TPU_POD, *args, "--", *OVERRIDES, env=env)
  assert dry.returncode == 0 and real.returncode == 0, real.stderr
  unstamp = lambda s: re.sub(r"\d{8}T\d{6}Z", "STAMP", s)  # noqa: E731  (the two runs may be a second apart)
  printed = [[unstamp(w) for w in shlex.split(line)] for line in dry.stdout.splitlines()]
  assert [[unstamp(w) for w in call["argv"]] for call in read_jsonl(calls)] == printed
  assert "--config configs/math_hf.yaml" in printed[1][-1]


@pytest.mark.parametrize("args, message", [
    (["--zone", "z", "--project", "p", "--repo", "r", "--ref", SHA], "--tpu is required"),
    (["--tpu", "t", "--project", "p", "--repo", "r", "--ref", SHA], "--zone is required"),
    (tpu_args("--repo", "r", "--ref", SHA, "--workers", "4"), "unknown argument: --workers"),
    (tpu_args("--repo", "r", "--ref", SHA, "--config"), "--config needs a value"),
    (["--tpu", "--zone", "z", "--project", "p"], "--tpu needs a value"),
    (tpu_args("--repo", "r", "--ref", "abc1234"), "--ref abc1234"),
])
def test_tpu_pod_bad_arguments_exit_2(args, message):
  out = run(TPU_POD, *args, "--dry-run")
  assert out.returncode == 2 and message in out.stderr and "usage: tpu_pod.sh" in out.stderr
  assert out.stdout == ""


def _bin_with_only(tmp_path, *tools):
  """A PATH folder holding only `tools` (links to the real ones)."""
  bin_dir = tmp_path / "only"
  bin_dir.mkdir()
  for tool in tools:
    (bin_dir / tool).symlink_to(shutil.which(tool))
  return str(bin_dir)


def test_missing_cloud_tools_are_named(tmp_path):
  path = _bin_with_only(tmp_path, "dirname", "date")
  out = run(TPU_POD, *tpu_args("--repo", "r", "--ref", SHA), env={"PATH": path})
  assert out.returncode == 1 and "gcloud not found on PATH" in out.stderr
  out = run(GKE, *gke_args(), env={"PATH": path})
  assert out.returncode == 1 and "kubectl not found on PATH" in out.stderr


# --- gke_jobset.sh -------------------------------------------------------------------------------------------


def gke_args(*extra):
  return ["--name", "rl-8b", "--image", "us-docker.pkg.dev/p/r/scalerl:v1", "--accelerator", "tpu-v5-lite-podslice",
          "--topology", "4x4", "--hosts", "2", "--chips-per-host", "8", *extra]


def _manifest(stdout):
  lines = stdout.splitlines()
  assert lines[0] == "kubectl apply -f - <<'EOF'" and lines[-1] == "EOF"
  return yaml.safe_load("\n".join(lines[1:-1]))


def test_gke_dry_run_prints_the_jobset():
  out = run(GKE, *gke_args("--config", "configs/math_hf.yaml", "--dry-run", "--", *OVERRIDES))
  assert out.returncode == 0, out.stderr
  jobset = _manifest(out.stdout)
  assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
  assert jobset["metadata"]["name"] == "rl-8b"
  [job] = jobset["spec"]["replicatedJobs"]
  spec = job["template"]["spec"]
  assert (job["replicas"], spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (1, 2, 2, 0)
  pod = spec["template"]["spec"]
  assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                 "cloud.google.com/gke-tpu-topology": "4x4"}
  [container] = pod["containers"]
  assert container["image"] == "us-docker.pkg.dev/p/r/scalerl:v1"
  assert container["resources"] == {"requests": {"google.com/tpu": 8}, "limits": {"google.com/tpu": 8}}
  assert container["command"] == ["python", "launch/train.py", "--config", "configs/math_hf.yaml", *OVERRIDES]
  assert {"name": "PYTHONUNBUFFERED", "value": "1"} in container["env"]


def test_gke_applies_what_its_dry_run_prints(tmp_path):
  bin_dir, calls = fake_tools(tmp_path, "kubectl", stdout="jobset.jobset.x-k8s.io/rl-8b created\n")
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
  dry, real = run(GKE, *gke_args("--dry-run", "--", *OVERRIDES)), run(GKE, *gke_args("--", *OVERRIDES), env=env)
  assert real.returncode == 0 and "rl-8b created" in real.stdout, real.stderr
  [call] = read_jsonl(calls)
  assert call["argv"] == ["kubectl", "apply", "-f", "-"]
  assert yaml.safe_load(call["stdin"]) == _manifest(dry.stdout)


@pytest.mark.parametrize("change, message", [
    ({"--hosts": "0"}, "--hosts 0: expected a positive integer"),
    ({"--hosts": "two"}, "--hosts two: expected a positive integer"),
    ({"--hosts": "4"}, "--topology 4x4 has 16"),  # 4 hosts x 8 chips != 16
    ({"--chips-per-host": "-1"}, "--chips-per-host -1: expected a positive integer"),
    ({"--name": "RL_8b"}, "--name RL_8b"),
    ({"--topology": "4by4"}, "--topology 4by4"),
    ({"--image": None}, "--image is required"),
    ({"--replicas": "2"}, "unknown argument: --replicas"),
])
def test_gke_bad_arguments_exit_2(change, message):
  args = gke_args()
  pairs = dict(zip(args[::2], args[1::2]))
  pairs.update(change)
  out = run(GKE, *[w for k, v in pairs.items() if v is not None for w in (k, v)], "--dry-run")
  assert out.returncode == 2 and message in out.stderr and "usage: gke_jobset.sh" in out.stderr
  assert out.stdout == ""


# --- slurm_gpu.sbatch ----------------------------------------------------------------------------------------


def _task_python(tmp_path):
  return write_tool(tmp_path / "python", "print(json.dumps(sys.argv[1:]))")


def _run_task(srun_argv, procid, ntasks):
  """Runs one task of the srun command the way srun would: its command, with that task's SLURM_* variables."""
  command = srun_argv[srun_argv.index("bash"):]
  env = {**os.environ, "SLURM_PROCID": str(procid), "SLURM_NTASKS": str(ntasks)}
  return json.loads(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout)


def test_slurm_dry_run_prints_srun_with_coordinator_and_process_ids(tmp_path):
  python = _task_python(tmp_path)
  env = {"PYTHON": str(python), "SLURM_JOB_NODELIST": ""}
  out = run(SLURM, "--dry-run", "--nodes", "3", "--port", "2222", "--", *OVERRIDES, env=env)
  assert out.returncode == 0, out.stderr
  [line] = out.stdout.splitlines()
  srun = shlex.split(line)
  assert srun[:2] == ["srun", "--kill-on-bad-exit=1"]
  assert '--num-processes "$SLURM_NTASKS" --process-id "$SLURM_PROCID"' in line  # evaluated inside each task
  assert "node-0 .. node-2" in out.stderr
  for procid in range(3):
    assert _run_task(srun, procid, 3) == ["launch/train.py", "--coordinator", "node-0:2222", "--num-processes", "3",
                                          "--process-id", str(procid), "--config", "configs/scalerl_8b.yaml",
                                          *OVERRIDES]


def test_slurm_job_takes_the_first_node_as_coordinator(tmp_path):
  bin_dir, calls = fake_tools(tmp_path, "scontrol", "srun", stdout="gpu-a17\ngpu-b03\n")
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-[a17,b03]",
         "SLURM_SUBMIT_DIR": str(ROOT), "PYTHON": str(_task_python(tmp_path))}
  out = run(SLURM, "--config", "configs/math_hf.yaml", "--", *OVERRIDES, env=env, cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  scontrol, srun = read_jsonl(calls)
  assert scontrol["argv"] == ["scontrol", "show", "hostnames", "gpu-[a17,b03]"]
  assert _run_task(srun["argv"], 1, 2) == ["launch/train.py", "--coordinator", "gpu-a17:1234", "--num-processes", "2",
                                           "--process-id", "1", "--config", "configs/math_hf.yaml", *OVERRIDES]


@pytest.mark.parametrize("args, message", [
    (["--dry-run", "--gpus", "8"], "unknown argument: --gpus"),
    (["--dry-run", "--nodes", "0"], "--nodes 0: expected a positive integer"),
    (["--dry-run", "--port", "70000"], "--port 70000"),
    (["--dry-run", "--port"], "--port needs a value"),
    ([], "SLURM_JOB_NODELIST is not set"),
])
def test_slurm_bad_arguments_exit_2(args, message):
  out = run(SLURM, *args, env={"SLURM_JOB_NODELIST": ""})
  assert out.returncode == 2 and message in out.stderr and "usage: sbatch launch/slurm_gpu.sbatch" in out.stderr
  assert out.stdout == ""
