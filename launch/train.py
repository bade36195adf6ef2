"""The main job: `python launch/train.py [--config FILE] [--mesh SPEC] [--reference-loop] [--overwrite] [key=value ...]`

Many processes (TPU pod slices, GPU clusters): the same command on every process, which then calls
`jax.distributed.initialize`: explicitly with `--coordinator HOST:PORT --num-processes N --process-id I`, or as jax
detects the cluster (TPU VMs, GKE, Slurm). Process 0 logs, writes metrics and prints the report; a failure in
any process ends all of them with its message or traceback (launch/tpu_pod.sh, gke_jobset.sh, slurm_gpu.sbatch).

With no arguments it runs the embedded CPU default (configs/cpu_default.yaml): a small policy warm-started on the
built-in addition task, then the ScaleRL recipe with PipelineRL-k, held-out evaluation, checkpoints, logs and a
scaling-curve fit at the end. Overrides may come before, between or after the flags. `--reference-loop` runs the
reference loop instead (generate a batch, train on it, repeat, in one thread), which PipelineRL with k = 0
(`pipeline.mode=lockstep`, the pipeline's threads) equals bit for bit. A user error (config, data, tokenizer, mesh,
reward, resume, run directory) prints as `train.py: error: ...` and exits 2, whichever thread raised it; anything
else is a bug and keeps its traceback. SIGTERM or Ctrl-C stops the run within seconds
(pipeline/interrupts.py) and exits 143 / 130; a second one exits at once with one line.
"""

import argparse
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import traceback
from typing import Optional

from scalerl_jax.config import CONFIG_GROUPS, load_config
from scalerl_jax.errors import UserError, user_error
from scalerl_jax.logs import setup_logging

DEFAULT = pathlib.Path(__file__).resolve().parent.parent / "configs" / "cpu_default.yaml"
PROG = "train.py"
# what a run writes into its run directory and a fresh run (checkpoint.resume=false) would replace
PREVIOUS_RUN = ("metrics.jsonl", "consumed_prompts.jsonl", "checkpoints", "tensorboard")
log = logging.getLogger("scalerl_jax.launch.train")


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog=PROG,
      description="ScaleRL training (PipelineRL-k). Any config key can be overridden as group.key=value, before or "
                  "after the flags.",
      epilog="config groups: " + ", ".join(CONFIG_GROUPS) + ". Example: loss.name=dapo pipeline.max_lag=4 "
             "optimizer.lr=5e-7. See configs/*.yaml for every key. A run directory with a checkpoint resumes; "
             "checkpoint.resume=false into a run directory that already holds a run is refused unless --overwrite.")
  parser.add_argument("--config", default=str(DEFAULT), help="YAML file (default: %(default)s)")
  parser.add_argument("--mesh", help="trainer mesh, e.g. data=1,fsdp=4,tensor=2,expert=1 (one axis may be -1)")
  parser.add_argument("--generator-mesh", help="generator mesh over mesh.generator_devices, e.g. data=-1,tensor=1")
  parser.add_argument("--reference-loop", action="store_true",
                      help="run the reference loop instead of the pipeline: generate a batch, train on it, repeat, "
                           "in one thread (no generator thread; not pipeline.mode=lockstep, which runs the "
                           "pipeline's threads with k = 0)")
  parser.add_argument("--sync", action="store_true", help=argparse.SUPPRESS)  # renamed: refused by main()
  parser.add_argument("--overwrite", action="store_true",
                      help="with checkpoint.resume=false: delete the run directory's previous " + ", ".join(
                          PREVIOUS_RUN) + " and start afresh (without this flag such a run is refused, so a "
                      "finished run's metrics are never lost silently)")
  parser.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs (jax, orbax, ...)")
  multi = parser.add_argument_group(
      "multi-process", "explicit jax.distributed set-up (omit all three on a cluster jax detects: TPU VM pods, GKE, "
      "Slurm); mesh.generator_processes=N makes the last N processes generators (disaggregated)")
  multi.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address, the same on every process")
  multi.add_argument("--num-processes", type=int, metavar="N")
  multi.add_argument("--process-id", type=int, metavar="I", help="0 .. N-1, different on every process")
  multi.add_argument("--transfer-host", metavar="HOST",
                     help="disaggregated runs: the address other processes reach this one's transfer server at "
                          "(default: this host's address on the route to the coordinator)")
  multi.add_argument("--single-process", action="store_true",
                     help="do not look for a cluster (e.g. one python process inside a multi-task Slurm allocation)")
  multi.add_argument("--heartbeat-timeout", type=int, default=100, metavar="S",
                     help="seconds without a heartbeat after which jax declares a process dead and stops the others "
                          "(default: %(default)s)")
  parser.add_argument("overrides", nargs="*", metavar="key=value")
  return parser


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
  parser = make_parser()
  return parser, parser.parse_intermixed_args(argv)  # `a=1 --overwrite b=2`: overrides on both sides of a flag


def _previous_run(run_dir: pathlib.Path) -> list[str]:
  """The parts of an earlier run in `run_dir` (non-empty files and folders of PREVIOUS_RUN)."""
  found = []
  for name in PREVIOUS_RUN:
    p = run_dir / name
    if (p.is_file() and p.stat().st_size > 0) or (p.is_dir() and any(p.iterdir())):
      found.append(name + ("/" if p.is_dir() else ""))
  return found


def _unwritable(run_dir: pathlib.Path) -> Optional[str]:
  """Why the run could not write run_dir or its checkpoints/ folder, found now with a real file rather than at the
  first checkpoint (a read-only mount, permissions, a file where the folder belongs); None when it can."""
  ckpt = run_dir / "checkpoints"
  if ckpt.exists() and not ckpt.is_dir():
    return f"run_dir {run_dir}: checkpoints is a file; the run keeps its checkpoints in a folder of that name"
  for folder in (run_dir, ckpt) if ckpt.is_dir() else (run_dir,):
    try:
      with tempfile.TemporaryFile(dir=folder):
        pass
    except OSError as exc:
      return f"run_dir {run_dir}: cannot write in {folder} ({exc.strerror or exc})"
  return None


def prepare_run_dir(cfg, overwrite: bool) -> Optional[str]:
  """Checks and creates cfg.run_dir before the job is built; returns a one-line error, or None when fine.

  checkpoint.resume=false into a directory that holds an earlier run is refused (the fresh run would delete its
  metrics.jsonl and mix its checkpoints with the old ones) unless `overwrite`, which deletes those parts first."""
  run_dir = pathlib.Path(cfg.run_dir)  # as RLJob reads it
  if run_dir.exists() and not run_dir.is_dir():
    return f"run_dir {run_dir}: is a file"
  try:
    run_dir.mkdir(parents=True, exist_ok=True)
  except OSError as exc:
    return f"run_dir {run_dir}: cannot create it ({exc.strerror or exc})"
  problem = _unwritable(run_dir)
  if problem:
    return problem
  previous = _previous_run(run_dir)
  if not previous:
    return None
  if cfg.checkpoint.resume:
    if overwrite:
      log.warning("--overwrite does nothing without checkpoint.resume=false (%s is resumed, not replaced)", run_dir)
    if "checkpoints/" not in previous and "metrics.jsonl" in previous:
      log.warning("%s holds metrics.jsonl but no checkpoint: this run starts afresh and replaces it", run_dir)
    return None
  if not overwrite:
    return (f"run_dir {run_dir} holds an earlier run ({', '.join(previous)}) that checkpoint.resume=false would "
            "overwrite: pass --overwrite to delete it, choose another run_dir, or drop checkpoint.resume=false to "
            "continue it")
  from scalerl_jax.train.run_lock import RunLock  # a live run holds the lock: never delete what it writes

  try:
    with RunLock(run_dir):
      log.warning("--overwrite: deleting the earlier run's %s in %s", ", ".join(previous), run_dir)
      for name in previous:
        p = run_dir / name.rstrip("/")
        shutil.rmtree(p) if p.is_dir() else p.unlink()
  except UserError as exc:  # RunDirBusyError
    return str(exc)
  except OSError as exc:
    return f"run_dir {run_dir}: cannot delete the earlier run ({exc.strerror or exc}: {exc.filename})"
  return None


def stop_peers(text: str, code: int) -> None:
  """In a multi-process run: record `text` for the other processes (they print it and stop) and exit `code`
  without waiting on them; otherwise return."""
  if "jax" in sys.modules:
    import jax
    if jax.distributed.is_initialized():  # (never starts a backend)
      from scalerl_jax import distributed
      distributed.abort(text, code)


def fail(message: str) -> None:
  """Exit 2 with one line; in a multi-process run every other process stops too, printing it."""
  text = f"{PROG}: error: {message}\n"
  stop_peers(text, 2)
  sys.stderr.write(text)
  raise SystemExit(2)


def start_processes(args) -> bool:
  """jax.distributed for a multi-process run (before any backend starts); returns whether it is one. Processes
  other than 0 log warnings only; all of them wait until process 0 has prepared the run directory."""
  from scalerl_jax import distributed

  try:
    multi = distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                                   heartbeat_timeout_s=args.heartbeat_timeout)
  except UserError as exc:
    fail(str(exc))
  if multi:
    import jax
    if jax.process_index() != 0:
      logging.getLogger("scalerl_jax").setLevel(logging.WARNING)
    log.info("process %d of %d (%d local devices of %d)", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
  return multi


def main(argv=None) -> int:
  _, args = parse_args(argv)
  if args.sync:
    fail("--sync was renamed --reference-loop (the reference loop without threads; pipeline.mode=lockstep is "
         "PipelineRL with k = 0)")
  overrides = list(args.overrides)
  if args.mesh:
    overrides.append(f"mesh.spec={args.mesh}")
  if args.generator_mesh:
    overrides.append(f"mesh.generator_spec={args.generator_mesh}")
  try:
    cfg = load_config(args.config, overrides)
  except UserError as exc:
    fail(str(exc))
  setup_logging(args.verbose)
  set_cpu_devices(cfg.mesh.cpu_devices)
  explicit = args.coordinator or args.num_processes or args.process_id is not None
  multi = start_processes(args) if explicit or (not args.single_process and _cluster_detected()) else False
  main_process = not multi or _process_index() == 0
  problem = prepare_run_dir(cfg, args.overwrite) if main_process else None
  if problem:
    fail(problem)
  if multi:
    from scalerl_jax import distributed
    distributed.barrier("scalerl_jax/run_dir_ready")

  from scalerl_jax.pipeline.job import RLJob  # after argument checks: importing jax takes a while
  from scalerl_jax.pipeline.report import final_report

  try:  # config, mesh, data, reward or resume problems, from either thread: one clear line, no traceback
    job = RLJob(cfg, transfer_host=args.transfer_host)
    summary = job.run_sync() if args.reference_loop else job.run()
  except Exception as exc:  # noqa: BLE001  (re-raised unless it is, or was caused by, a user error)
    cause = user_error(exc)
    if cause is None:
      stop_peers(traceback.format_exc(), 1)  # the others must not wait on this process in a collective
      raise
    fail(str(cause))
  except KeyboardInterrupt as exc:  # a second signal (Aborted), or Ctrl-C before the handlers were on: one line
    code = getattr(exc, "exit_code", 130)
    text = f"{PROG}: {exc or 'interrupted'}\n"
    stop_peers(text, code)
    sys.stderr.write(text)
    raise SystemExit(code) from None
  if main_process:
    print(final_report(cfg, summary))
  return job.exit_code


def set_cpu_devices(count: int) -> None:
  """mesh.cpu_devices: how many XLA devices the CPU platform shows (before any jax backend starts); an explicit
  --xla_force_host_platform_device_count in XLA_FLAGS is left alone."""
  if count and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    import jax
    try:
      jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as exc:  # jax already started in this process (main() called from Python): keep its devices
      logging.getLogger(PROG).warning("mesh.cpu_devices=%d not applied: %s", count, exc)


def _cluster_detected() -> bool:
  """Whether jax's cluster detection sees more than one process here (cheap off clusters: environment checks)."""
  from scalerl_jax import distributed
  return distributed.detected_process_count() > 1


def _process_index() -> int:
  import jax
  return jax.process_index()


if __name__ == "__main__":
  sys.exit(main())
