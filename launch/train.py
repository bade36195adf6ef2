"""The main job: `python launch/train.py [--config FILE] [--mesh SPEC] [key=value ...]`.

With no arguments it runs the embedded CPU default (configs/cpu_default.yaml): a small policy warm-started on the
built-in addition task, then the ScaleRL recipe with PipelineRL-k, held-out evaluation, checkpoints, logs and a
scaling-curve fit at the end.
"""

import argparse
import pathlib
import sys

from scalerl_jax.config import CONFIG_GROUPS, load_config
from scalerl_jax.errors import UserError
from scalerl_jax.logs import setup_logging

DEFAULT = pathlib.Path(__file__).resolve().parent.parent / "configs" / "cpu_default.yaml"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description="ScaleRL training (PipelineRL-k). Any config key can be overridden as group.key=value.",
      epilog="config groups: " + ", ".join(CONFIG_GROUPS) + ". Example: loss.name=dapo pipeline.max_lag=4 "
             "optimizer.lr=5e-7. See configs/*.yaml for every key.")
  parser.add_argument("--config", default=str(DEFAULT), help="YAML file (default: %(default)s)")
  parser.add_argument("--mesh", help="trainer mesh, e.g. data=1,fsdp=4,tensor=2,expert=1 (one axis may be -1)")
  parser.add_argument("--generator-mesh", help="generator mesh over mesh.generator_devices, e.g. data=-1,tensor=1")
  parser.add_argument("--sync", action="store_true", help="run the synchronous reference loop instead")
  parser.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs (jax, orbax, ...)")
  parser.add_argument("overrides", nargs="*", metavar="key=value")
  args = parser.parse_args(argv)
  overrides = list(args.overrides)
  if args.mesh:
    overrides.append(f"mesh.spec={args.mesh}")
  if args.generator_mesh:
    overrides.append(f"mesh.generator_spec={args.generator_mesh}")
  try:
    cfg = load_config(args.config, overrides)
  except UserError as exc:
    parser.error(str(exc))
  setup_logging(args.verbose)

  from scalerl_jax.pipeline.job import RLJob  # after argument checks: importing jax takes a while
  from scalerl_jax.pipeline.report import final_report

  try:  # config, mesh, data, reward or resume problems: one clear line, no traceback
    job = RLJob(cfg)
    summary = job.run_sync() if args.sync else job.run()
  except UserError as exc:
    parser.exit(2, f"train.py: error: {exc}\n")
  print(final_report(cfg, summary))
  return 130 if job.interrupted else 0


if __name__ == "__main__":
  sys.exit(main())
