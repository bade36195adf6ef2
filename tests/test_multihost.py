"""Multi-process runs: two local processes with 4 CPU devices each (jax.distributed, gloo collectives), started
through launch/train.py exactly as on a cluster. Every run is bounded by a timeout and its process group killed on
failure, so a hang fails the test instead of the suite.

The proof that the pod scripts can work: colocated (both processes train and generate) equals the same run in one
process with 8 devices; disaggregated (process 0 trains, process 1 generates) keeps the generator's weights equal
to the trainer's after every sync and the staleness bound; a checkpoint written by two processes resumes in two
new ones with the prompt sequence continuing; a process that fails ends both.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from tests.pipeline_helpers import TINY, read_consumed, read_jsonl, read_metrics, tiny_config, tiny_job

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 300  # one two-process run; they take 10-30 s on 2 idle cores
# jax's heartbeat only matters for a process killed outright, which no test here does (a failing one writes the
# abort record); 30 s was too short on a loaded 2-core CI machine: all three processes of the three-process test were
# declared dead 89 s into their run (2026-12-03) while the same test passed alone in 39 s.
HEARTBEAT_S = 120


def _free_ports(n: int) -> list[int]:
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def run_processes(run_dir, *overrides, env_of=None, extra_of=None, timeout=TIMEOUT_S, n=2, devices=4):
  """Starts launch/train.py as processes 0 .. n-1 of one run (`devices` CPU devices each); returns
  [(returncode, stdout, stderr)] of each. `env_of(i)` / `extra_of(i)`: extra environment / arguments of process i."""
  (coordinator,) = _free_ports(1)
  procs = []
  for i in range(n):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SCALERL_FAULTS")}
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **(env_of(i) if env_of else {}))
    cmd = [sys.executable, str(ROOT / "launch" / "train.py"), "--coordinator", f"127.0.0.1:{coordinator}",
           "--num-processes", str(n), "--process-id", str(i), "--transfer-host", "127.0.0.1",
           "--heartbeat-timeout", str(HEARTBEAT_S), f"run_dir={run_dir}", *TINY, *overrides, *(extra_of(i) if extra_of else [])]
    procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True))
  out = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=timeout)
      out.append((p.returncode, stdout, stderr))
  except subprocess.TimeoutExpired:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    logs = [p.communicate()[1][-3000:] for p in procs]
    pytest.fail(f"{n}-process run did not finish within {timeout} s; stderr tails:\n" + "\n---\n".join(logs))
  return out


def _ok(results) -> None:
  for i, (code, _, err) in enumerate(results):
    assert code == 0, f"process {i} exited {code}:\n{err[-4000:]}"


def _consumed(run_dir) -> list[tuple[int, list[str]]]:
  return [(r["step"], r["prompt_ids"]) for r in read_consumed(run_dir)]


def _stream_order(run_dir, steps: int) -> list[list[str]]:
  """The prompt ids of batches 0 .. steps-1 as the run's stream (one process, no NPR removals) draws them."""
  from scalerl_jax.data.prompt_stream import make_prompt_stream
  from scalerl_jax.data.tasks import make_task
  from scalerl_jax.data.tokenizer import make_tokenizer

  cfg = tiny_config(run_dir)
  stream = make_prompt_stream(make_task(cfg.data), cfg.data, make_tokenizer(cfg.data, vocab_size=cfg.model.vocab_size),
                              cfg.rollout.max_prefill_len)
  return [[p.prompt_id for p in stream.next_batch()] for _ in range(steps)]


# (not reward/calls: a running total read at the step's end, while the generator may already be scoring the next
# step's batch, so it depends on the threads' timing: 56 against 72 at step 2 on a loaded CI machine)
SAME = ("train/loss", "train/grad_norm", "train/update_norm", "train/pass_rate", "train/reward_mean", "train/adv_std",
        "rollout/tokens", "rollout/truncation_rate", "rollout/interruption_rate", "eval/pass_rate",
        "eval/greedy_pass_at_1", "eval/n_correct", "data/epoch_size", "pipeline/version")


def test_colocated_run_equals_one_process_and_resumes(tmp_path):
  run_dir = tmp_path / "colocated"
  overrides = ("pipeline.steps=4", "pipeline.max_lag=0", "logging.every_process=true")
  _ok(run_processes(run_dir, *overrides))
  two = read_metrics(run_dir)
  other = read_jsonl(run_dir / "metrics.process1.jsonl")
  assert [r["pipeline/version"] for r in two[1:]] == [1, 2, 3, 4]  # versions advance (line 0: the step-0 eval)
  assert [r["train/loss"] for r in other[1:]] == [r["train/loss"] for r in two[1:]]  # both computed the same

  tiny_job(tmp_path / "one", *overrides).run()  # the same run in this process, on its 8 devices
  one = read_metrics(tmp_path / "one")
  assert len(one) == len(two) == 5
  assert any(r.get("train/loss") for r in one)  # the comparison below is not between zeros
  for a, b in zip(one, two):
    for key in SAME:
      if key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["step"], key)
  assert sorted(map(sorted, (ids for _, ids in _consumed(run_dir)))) == sorted(map(sorted, (
      ids for _, ids in _consumed(tmp_path / "one"))))

  # resume both processes from the checkpoint at step 4 and run on to step 6
  _ok(run_processes(run_dir, "pipeline.steps=6", "pipeline.max_lag=0"))
  consumed = _consumed(run_dir)
  assert [s for s, _ in consumed] == list(range(6))
  assert [sorted(ids) for _, ids in consumed] == [sorted(ids) for ids in _stream_order(run_dir, 6)]


def test_disaggregated_weights_lag_and_resume(tmp_path):
  run_dir = tmp_path / "disaggregated"
  k = 2
  overrides = ("mesh.generator_processes=1", f"pipeline.max_lag={k}", "logging.every_process=true")
  _ok(run_processes(run_dir, "pipeline.steps=4", *overrides))
  metrics = read_metrics(run_dir)[1:]
  assert [r["pipeline/version"] for r in metrics] == [1, 2, 3, 4]
  # after every sync the generator holds exactly the trainer's params
  received = {r["version"]: r["checksum"] for r in read_jsonl(run_dir / "weights.process1.jsonl")}
  sent = {r["pipeline/version"]: r["pipeline/weight_checksum"] for r in metrics}
  assert set(sent) <= set(received) and len(set(sent.values())) == len(sent)  # (the params changed every step)
  assert {v: received[v] for v in sent} == sent
  assert all(r["pipeline/lag_max"] <= k for r in metrics)
  assert all(r["pipeline/weight_sync_s"] > 0 and r["pipeline/weight_sync_bytes"] > 0 for r in metrics)
  assert not (run_dir / "metrics.process1.jsonl").exists()  # the generator process trains nothing, logs no steps

  _ok(run_processes(run_dir, "pipeline.steps=6", *overrides))  # two new processes resume from step 4
  consumed = _consumed(run_dir)
  assert [s for s, _ in consumed] == list(range(6))
  assert [ids for _, ids in consumed] == _stream_order(run_dir, 6)  # one generator reads the stream in order
  assert [r["pipeline/version"] for r in read_metrics(run_dir)[1:]] == list(range(1, 7))


def test_disaggregated_adapters_sync_alone_onto_the_generators_base(tmp_path):
  """lora.rank > 0, process 0 trains, process 1 generates: after the first sync only the adapters cross between the
  processes, and the generator's whole model (its base + the adapters received) is the trainer's after every one."""
  from scalerl_jax.model import lora, make_policy
  run_dir = tmp_path / "lora"
  overrides = ("mesh.generator_processes=1", "pipeline.max_lag=1", "logging.every_process=true", "lora.rank=4",
               "lora.targets=[q,v,down]")
  _ok(run_processes(run_dir, "pipeline.steps=3", *overrides))
  metrics = read_metrics(run_dir)[1:]
  received = {r["version"]: r["checksum"] for r in read_jsonl(run_dir / "weights.process1.jsonl")}
  sent = {r["pipeline/version"]: r["pipeline/weight_checksum"] for r in metrics}
  assert len(set(sent.values())) == len(sent) == 3 and {v: received[v] for v in sent} == sent
  cfg = tiny_config(run_dir, *overrides)
  policy = make_policy(cfg.model, cfg.lora)
  adapter_bytes = 4 * lora.count(policy.param_shapes)  # float32
  assert all(r["pipeline/weight_sync_bytes"] == adapter_bytes for r in metrics)


def test_one_trainer_and_two_generators(tmp_path):
  """Three processes (2 devices each): process 0 trains, processes 1 and 2 each generate half of every batch."""
  run_dir = tmp_path / "three"
  _ok(run_processes(run_dir, "pipeline.steps=3", "mesh.generator_processes=2", "pipeline.max_lag=1",
                    "logging.every_process=true", n=3, devices=2, timeout=240))
  metrics = read_metrics(run_dir)[1:]
  assert [r["pipeline/version"] for r in metrics] == [1, 2, 3]
  sent = {r["pipeline/version"]: r["pipeline/weight_checksum"] for r in metrics}
  for g in (1, 2):  # each generator holds the trainer's params after every sync
    received = {r["version"]: r["checksum"] for r in read_jsonl(run_dir / f"weights.process{g}.jsonl")}
    assert {v: received[v] for v in sent} == sent
  consumed = _consumed(run_dir)
  assert [sorted(ids) for _, ids in consumed] == [sorted(ids) for ids in _stream_order(run_dir, 3)]


def test_a_process_that_raises_ends_both(tmp_path):
  results = run_processes(tmp_path / "fails", "pipeline.steps=6", "pipeline.max_lag=0",
                          env_of=lambda i: {"SCALERL_FAULTS": "train_step@2!"} if i == 1 else {}, timeout=180)
  codes = [code for code, _, _ in results]
  assert all(code != 0 for code in codes), codes
  assert "InjectedFault" in results[1][2]
  assert "process 1" in results[0][2] and "InjectedFault" in results[0][2]  # process 0 says who failed and why


def test_processes_with_different_configs_refuse_to_run(tmp_path):
  results = run_processes(tmp_path / "mismatch", "pipeline.steps=2",
                          extra_of=lambda i: ["optimizer.lr=0.001"] if i == 1 else [], timeout=120)
  assert [code for code, _, _ in results] == [2, 2]
  for _, _, err in results:
    assert "process 1: config differs from process 0's" in err and "lr" in err


@pytest.mark.parametrize("argv, needle", [
    (["--coordinator", "localhost:1"], "--num-processes, --process-id missing"),
    (["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "2"], "--process-id 2 is not in"),
])
def test_multi_process_flag_errors(capsys, tmp_path, argv, needle):
  from launch.train import main
  from tests.cli_helpers import exit_error

  assert needle in exit_error(capsys, main, [*argv, f"run_dir={tmp_path}"])
