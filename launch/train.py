"""The main job: `python launch/train.py [--config FILE] [--mesh SPEC] [--reference-loop] [--overwrite] [key=value ...]`

Many processes (TPU pod slices, GPU clusters): the same command on every process (scalerl_jax/run/start.py;
launch/tpu_pod.sh, gke_jobset.sh, slurm_gpu.sbatch). Process 0 logs, writes metrics and prints the report.

With no arguments: the CPU default (configs/cpu_default.yaml), a small policy warm-started on built-in addition,
then ScaleRL with PipelineRL-k, evaluations, checkpoints, logs, a scaling-curve fit. `--reference-loop`: generate a batch, train on it, repeat, in one thread (PipelineRL
with k = 0, `pipeline.mode=lockstep`, equals it bit for bit). A user error prints as `train.py: error: ...` and
exits 2, whichever thread raised it; anything else keeps its traceback. SIGTERM or Ctrl-C stops the run within
seconds (pipeline/interrupts.py) and exits 143 / 130; a second one exits at once with one line.
"""

import argparse
import pathlib
import sys
import traceback

from scalerl_jax.config import CONFIG_GROUPS, load_config
from scalerl_jax.errors import UserError, user_error
from scalerl_jax.logs import setup_logging
from scalerl_jax.run import start
from scalerl_jax.run.run_dir import PREVIOUS_RUN

DEFAULT = pathlib.Path(__file__).resolve().parent.parent / "configs" / "cpu_default.yaml"
PROG = "train.py"


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
                     help="seconds without a heartbeat before jax declares a process dead (default: %(default)s)")
  parser.add_argument("overrides", nargs="*", metavar="key=value")
  return parser


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
  parser = make_parser()
  return parser, parser.parse_intermixed_args(argv)  # `a=1 --overwrite b=2`: overrides on both sides of a flag


def leave(text: str, code: int) -> None:
  """Exit `code` with `text` on stderr; in a multi-process run every other process stops too, printing it."""
  start.stop_peers(text, code)
  sys.stderr.write(text)
  raise SystemExit(code) from None


def fail(message: str) -> None:
  leave(f"{PROG}: error: {message}\n", 2)


def main(argv=None) -> int:
  _, args = parse_args(argv)
  if args.sync:
    fail("--sync was renamed --reference-loop (the reference loop without threads; pipeline.mode=lockstep is "
         "PipelineRL with k = 0)")
  overrides = [*args.overrides, *([f"mesh.spec={args.mesh}"] if args.mesh else []),
               *([f"mesh.generator_spec={args.generator_mesh}"] if args.generator_mesh else [])]
  try:
    cfg = load_config(args.config, overrides)
    setup_logging(args.verbose)
    start.set_cpu_devices(cfg.mesh.cpu_devices)
    multi = start.start_processes(args.coordinator, args.num_processes, args.process_id, args.heartbeat_timeout,
                                  args.single_process)
    main_process = start.prepare(cfg, args.overwrite, multi)
  except UserError as exc:
    fail(str(exc))

  from scalerl_jax.pipeline.report import final_report  # after argument checks: importing jax takes a while
  from scalerl_jax.run.job import RLJob

  try:  # config, mesh, data, reward or resume problems, from either thread: one clear line, no traceback
    job = RLJob(cfg, transfer_host=args.transfer_host)
    summary = job.run_sync() if args.reference_loop else job.run()
  except Exception as exc:  # noqa: BLE001  (re-raised unless it is, or was caused by, a user error)
    cause = user_error(exc)
    if cause is None:
      start.stop_peers(traceback.format_exc(), 1)  # the others must not wait on this process in a collective
      raise
    fail(str(cause))
  except KeyboardInterrupt as exc:  # a second signal (Aborted), or Ctrl-C before the handlers were on: one line
    leave(f"{PROG}: {exc or 'interrupted'}\n", getattr(exc, "exit_code", 130))
  if main_process:
    print(final_report(cfg, summary))
  return job.exit_code


if __name__ == "__main__":
  sys.exit(main())
