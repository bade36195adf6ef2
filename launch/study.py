"""A recipe study: `python launch/study.py configs/studies/loo_cpu.yaml [--report-only] [--dry-run]`.

Runs every recipe x seed of the study file one after the other, each an ordinary run directory written by
launch/train.py (its output in RUN_DIR/train.log), then fits all of them and writes the study's report into its
directory: study_report.md / .json (A, B, C_mid with intervals per recipe, P(A_i > A_j) and the crossover compute
of every pair, B at a common A), study_curves.png and study_fixed_a.png. Interrupted, the same command continues:
a finished run is skipped, an unfinished one resumes from its checkpoint. The study file format is in
scalerl_jax/scaling/study.py.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

from scalerl_jax.errors import UserError
from scalerl_jax.logs import setup_logging

PROG = "study.py"
TRAIN = pathlib.Path(__file__).resolve().parent / "train.py"


def make_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog=PROG, description="Run a recipe study (recipes x seeds) and report on it.")
  p.add_argument("study", help="study YAML, e.g. configs/studies/loo_cpu.yaml")
  p.add_argument("--report-only", action="store_true", help="fit and report on the runs that finished; run none")
  p.add_argument("--dry-run", action="store_true", help="print each run's status and train.py command; run none")
  p.add_argument("--no-plot", action="store_true", help="write the report without its figures")
  return p


def command(spec, run) -> list[str]:
  return [sys.executable, str(TRAIN), "--config", str(spec.base), *run.overrides]


def run_study(spec, *, dry_run: bool = False, progress: bool = True) -> list[dict]:
  """Runs the unfinished runs in order; returns one record per run (status, seconds)."""
  from scalerl_jax.scaling.study import run_finished

  runs = spec.plan()
  records = []
  bar = None
  if progress and not dry_run:
    from scalerl_jax.logs import progress_bar
    bar = progress_bar(len(runs), f"study {spec.name}", "run")
  for run in runs:
    done = run_finished(run, spec.steps)
    status = "finished" if done else ("resumes" if (run.run_dir / "checkpoints").is_dir() else "new")
    if dry_run:
      print(f"{run.recipe}/seed{run.seed}: {status}: " + " ".join(command(spec, run)))
      records.append({"recipe": run.recipe, "seed": run.seed, "status": status})
      continue
    t0 = time.perf_counter()
    if not done:
      run.run_dir.mkdir(parents=True, exist_ok=True)
      log_path = run.run_dir / "train.log"
      with log_path.open("a") as log:
        code = subprocess.call(command(spec, run), stdout=log, stderr=subprocess.STDOUT)
      if code != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise UserError(f"run {run.recipe}/seed{run.seed} failed (exit {code}); the study stops here and the same "
                        f"command continues it. Last lines of {log_path}:\n{tail}")
    records.append({"recipe": run.recipe, "seed": run.seed, "status": "skipped (finished)" if done else status,
                    "seconds": round(time.perf_counter() - t0, 1)})
    if bar is not None:
      bar.update(1)
      bar.set_postfix_str(f"{run.recipe}/seed{run.seed}")
  if bar is not None:
    bar.close()
  return records


def main(argv=None) -> int:
  args = make_parser().parse_args(argv)
  setup_logging()
  from scalerl_jax.scaling.study import format_report, load_study, report

  try:
    spec = load_study(args.study)
    if not args.report_only:
      records = run_study(spec, dry_run=args.dry_run)
      if args.dry_run:
        return 0
      spec.dir.mkdir(parents=True, exist_ok=True)
      with (spec.dir / "study_runs.jsonl").open("a") as f:  # what each invocation ran, and how long it took
        f.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": records}) + "\n")
    out = report(spec, plot=not args.no_plot)
  except UserError as exc:
    sys.stderr.write(f"{PROG}: error: {exc}\n")
    return 2
  print(format_report(out))
  print(f"report: {spec.dir / 'study_report.md'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
