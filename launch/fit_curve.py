"""Fit the ScaleRL compute-performance curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) to runs, extrapolate.

  python launch/fit_curve.py INPUT [INPUT ...] [--x accelerator_seconds|accelerator_hours|flops] [--fit-upto 0.5]
                             [--c-min X] [--bayes] [--json OUT] [--plot OUT.png]

INPUT: a run directory (metrics.jsonl or tensorboard events), a metrics .jsonl, or a CSV with columns
compute,reward[,n_correct,n_total]. The first point of each input is its R0 measurement. With several inputs the
runs are also compared (A, P(A1 > A2) with --bayes, B at a common A when |A1 - A2| < 0.02, crossing computes).
"""

import argparse
import json
import pathlib
import sys

from scalerl_jax import scaling
from scalerl_jax.config import CurveFitConfig
from scalerl_jax.errors import UserError
from scalerl_jax.logs import setup_logging


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
  p.add_argument("--json", metavar="OUT", help="write the fits as JSON")
  p.add_argument("--plot", metavar="OUT.png", help="save the fit (one input) or comparison (several) plot")
  p.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs (jax, numpyro, ...)")
  return p, p.parse_args(argv)


def main(argv=None) -> int:
  parser, args = parse_args(argv)
  setup_logging(args.verbose)
  try:
    runs = [scaling.analyse(scaling.load_points(path, x=args.x), fit_upto=args.fit_upto, c_min=args.c_min,
                            method=args.method, bayes=args.bayes, num_warmup=args.samples // 2,
                            num_samples=args.samples) for path in args.inputs]
  except UserError as e:
    parser.error(str(e))
  out = {"x": args.x, "fit_upto": args.fit_upto, "c_min": args.c_min, "runs": [scaling.summary(r) for r in runs]}
  for s in out["runs"]:
    print(scaling.format_report(s))
  if len(runs) > 1:
    out["comparisons"] = scaling.compare_runs(runs)
    for pair in out["comparisons"]:
      print(scaling.format_comparison(pair))
  if args.json:
    pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
  if args.plot:
    from scalerl_jax.scaling import plots
    ax = plots.plot_fit(runs[0]) if len(runs) == 1 else plots.plot_comparison(runs)
    plots.save(ax.figure, args.plot)
  return 0


if __name__ == "__main__":
  sys.exit(main())
