"""Fit the ScaleRL compute-performance curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) to runs, extrapolate.

  python launch/fit_curve.py INPUT [INPUT ...] [--x accelerator_seconds|accelerator_hours|flops|
                             generator_flops|steps] [--fit-upto 0.5]
                             [--c-min X] [--bayes] [--task T | --per-task] [--target R] [--json OUT]
                             [--plot OUT.png] [--calibration FILE]

INPUT: a run directory (metrics.jsonl or tensorboard events), a metrics .jsonl, or a CSV with columns
compute,reward[,n_correct,n_total]. The first point of each input is its R0 measurement. With several inputs the
runs are also compared (A, P(A1 > A2) with --bayes, B at a common A when |A1 - A2| < 0.02, crossing computes).
--target R adds early-stop advice: the probability that the run's ceiling A exceeds R and the compute at which it is
predicted to reach R, with its interval (scaling/advice.py; from the posterior with --bayes). A mixed-task run
(math + code) logs one held-out curve per task: `--task code` fits that one, `--per-task` fits
every task of every input, compares them and plots them together. --calibration FILE: the predictive bands'
calibration and shape prior (scaling/calibration.py; default the shipped one, named in the report), e.g. one
refitted on finished runs of your task by `python benchmarks/calibration.py RUNS --write-calibration FILE`.
"""

import argparse
import json
import os
import pathlib
import sys

from scalerl_jax import scaling
from scalerl_jax.config import CurveFitConfig
from scalerl_jax.errors import UserError
from scalerl_jax.logs import setup_logging
from scalerl_jax.scaling import calibration as calibration_lib
from scalerl_jax.scaling.advice import format_advice, target_advice


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="fit_curve.py")
  p.add_argument("inputs", nargs="+", metavar="INPUT")
  defaults = CurveFitConfig()  # the same defaults as the trainer's end-of-run fit (curve_fit.*)
  p.add_argument("--x", default=defaults.x, choices=sorted(scaling.io.X_AXES), help="compute axis (%(default)s)")
  p.add_argument("--fit-upto", type=float, default=defaults.fit_upto, help="fit on compute <= this fraction of the "
                 "last")
  p.add_argument("--c-min", type=float, default=defaults.c_min, help="drop points below this compute, in the --x "
                 "unit (paper: 1.5k GPU-hours = 5.4e6 accelerator-seconds)")
  p.add_argument("--method", default="paper", choices=scaling.analysis.METHODS)
  p.add_argument("--bayes", action="store_true", help="also sample the NumPyro posterior (NUTS)")
  p.add_argument("--samples", type=int, default=1000, help="NUTS samples (half as many warmup steps)")
  p.add_argument("--task", action="append", default=[], metavar="T",
                 help="fit task T's held-out curve of a mixed-task run (repeatable)")
  p.add_argument("--per-task", action="store_true", help="fit every task's curve of each input")
  p.add_argument("--target", type=float, metavar="R", help="early-stop advice for reaching pass rate R")
  p.add_argument("--json", metavar="OUT", help="write the fits as JSON")
  p.add_argument("--plot", metavar="OUT.png", help="save the fit (one input) or comparison (several) plot")
  p.add_argument("--calibration", default=defaults.calibration, metavar="FILE",
                 help="calibration file for the bands and prior (default: the shipped one)")
  p.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs (jax, numpyro, ...)")
  return p, p.parse_args(argv)


def fail(message: str) -> None:
  sys.stderr.write(f"fit_curve.py: error: {message}\n")
  raise SystemExit(2)


def _writable(path: str, flag: str) -> None:
  """Fails early (before a long fit) when `path` cannot be written: a folder, or a parent that is not one."""
  p = pathlib.Path(path)
  if p.is_dir():
    fail(f"cannot write {flag} {p}: is a directory")
  parent = next((a for a in [p.parent, *p.parent.parents] if a.exists()), pathlib.Path("."))
  if not parent.is_dir():
    fail(f"cannot write {flag} {p}: {parent} is not a directory")
  if not os.access(parent, os.W_OK | os.X_OK):
    fail(f"cannot write {flag} {p}: {parent} is not writable")
  if flag == "--plot" and p.suffix:
    from matplotlib.backend_bases import FigureCanvasBase
    kinds = FigureCanvasBase.get_supported_filetypes()
    if p.suffix[1:].lower() not in kinds:
      fail(f"cannot write {flag} {p}: unknown image format {p.suffix!r} (use one of {', '.join(sorted(kinds))})")


def _write(path: str, flag: str, write) -> None:
  try:
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    write()
  except (OSError, ValueError) as e:  # ValueError: matplotlib's unknown image format
    fail(f"cannot write {flag} {path}: {e.strerror if isinstance(e, OSError) and e.strerror else e}")


def main(argv=None) -> int:
  _, args = parse_args(argv)
  setup_logging(args.verbose)
  if args.samples < 1:
    fail(f"--samples must be positive, got {args.samples}")
  for flag, path in (("--json", args.json), ("--plot", args.plot)):
    if path:
      _writable(path, flag)
  if args.task and args.per_task:
    fail("--task and --per-task exclude each other")
  try:
    curves = [(path, task) for path in args.inputs
              for task in (scaling.tasks_in(path) if args.per_task else args.task) or [""]]
    if args.per_task and all(not t for _, t in curves):
      fail("--per-task: no input logged per-task curves (eval/<task>/pass_rate); it is not a mixed-task run")
    cal = calibration_lib.load(args.calibration)
    runs = [scaling.analyse(scaling.load_points(path, x=args.x, task=task), fit_upto=args.fit_upto,
                            c_min=args.c_min, method=args.method, bayes=args.bayes, num_warmup=args.samples // 2,
                            num_samples=args.samples, calibration=cal) for path, task in curves]
  except UserError as e:
    fail(str(e))
  out = {"x": args.x, "fit_upto": args.fit_upto, "c_min": args.c_min, "runs": [scaling.summary(r) for r in runs]}
  if args.target is not None:
    try:
      for s, r in zip(out["runs"], runs):
        s["advice"] = target_advice(r, args.target)
    except UserError as e:
      fail(str(e))
  for s in out["runs"]:
    print(scaling.format_report(s))
    if "advice" in s:
      print(format_advice(s["advice"]))
  if len(runs) > 1:
    out["comparisons"] = scaling.compare_runs(runs)
    for pair in out["comparisons"]:
      print(scaling.format_comparison(pair))
  if args.json:
    _write(args.json, "--json", lambda: pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n"))
  if args.plot:
    from scalerl_jax.scaling import plots
    ax = plots.plot_fit(runs[0], target=args.target) if len(runs) == 1 else plots.plot_comparison(runs)
    _write(args.plot, "--plot", lambda: plots.save(ax.figure, args.plot))
  return 0


if __name__ == "__main__":
  sys.exit(main())
