"""A recipe study: `python launch/study.py configs/studies/loo_cpu.yaml [--report-only] [--dry-run]`.

Runs every recipe x seed of the study file one after the other, each an ordinary run directory written by
launch/train.py (its output in RUN_DIR/train.log), then fits all of them and writes the study's report into its
directory: study_report.md / .json (A, B, C_mid with intervals per recipe, P(A_i > A_j) and the crossover compute
of every pair, B at a common A), study_curves.png and study_fixed_a.png. Interrupted, the same command continues:
a finished run is skipped, an unfinished one resumes from its checkpoint. The study file format is in
scalerl_jax/scaling/study.py; every run's whole config is checked before the first run starts (and by --dry-run).

SIGTERM or Ctrl-C: passed on to the run in progress (it runs in its own process group, so a terminal's Ctrl-C
reaches it once, through the study), which checkpoints at its next step boundary and exits; then the study stops
and prints the command that continues it. A second signal is passed on too and stops the run at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from scalerl_jax.errors import UserError
from scalerl_jax.logs import setup_logging

PROG = "study.py"
TRAIN = pathlib.Path(__file__).resolve().parent / "train.py"
log = logging.getLogger("scalerl_jax.launch.study")


class StudyStopped(Exception):
  """A signal stopped the study; the message says where and how to continue."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + signum


class _Forward:
  """SIGINT / SIGTERM while the study runs: remembered (the study starts no further run) and passed on to the run in
  progress, every time (its first checkpoints and stops it, a second aborts it)."""

  def __init__(self):
    self.signum: Optional[int] = None
    self.child: Optional[subprocess.Popen] = None
    self.sent = 0  # signals passed on to `child`

  def attach(self, child: Optional[subprocess.Popen]) -> None:
    self.child, self.sent = child, 0
    if child is not None and self.signum is not None and self.sent == 0:  # one came while it was starting
      self.sent = 1
      child.send_signal(self.signum)

  def _handler(self, signum, frame):
    name = signal.Signals(signum).name
    self.signum = self.signum or signum
    child = self.child
    if child is not None and child.poll() is None:
      child.send_signal(signum)
      self.sent += 1
      log.warning("%s: passed on to the run in progress (%s); the study stops after it", name,
                  "it checkpoints at its next step boundary" if self.sent == 1 else "it stops at once")
    else:
      log.warning("%s: the study stops before its next run", name)

  @contextlib.contextmanager
  def installed(self):
    if threading.current_thread() is not threading.main_thread():  # (signals reach the main thread only)
      yield self
      return
    previous = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      yield self
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)


def _latest_checkpoint(run_dir: pathlib.Path) -> Optional[int]:
  ckpt = run_dir / "checkpoints"
  steps = [int(p.name) for p in ckpt.iterdir() if p.name.isdigit()] if ckpt.is_dir() else []
  return max(steps, default=None)


def make_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog=PROG, description="Run a recipe study (recipes x seeds) and report on it.")
  p.add_argument("study", help="study YAML, e.g. configs/studies/loo_cpu.yaml")
  p.add_argument("--report-only", action="store_true", help="fit and report on the runs that finished; run none")
  p.add_argument("--dry-run", action="store_true", help="print each run's status and train.py command; run none")
  p.add_argument("--no-plot", action="store_true", help="write the report without its figures")
  return p


def command(spec, run) -> list[str]:
  return [sys.executable, str(TRAIN), "--config", str(spec.base), *run.overrides]


def run_study(spec, *, dry_run: bool = False, progress: bool = True, again: str = "the same command") -> list[dict]:
  """Runs the unfinished runs in order; returns one record per run (status, seconds). A signal stops the run in
  progress (with its checkpoint) and the study: StudyStopped, whose message ends with `again`."""
  if dry_run:
    return _run_all(spec, True, False, _Forward(), again)
  forward = _Forward()
  with forward.installed():
    return _run_all(spec, False, progress, forward, again)


def _run_all(spec, dry_run: bool, progress: bool, forward: _Forward, again: str) -> list[dict]:
  from scalerl_jax.logs import progress_bar
  from scalerl_jax.scaling.study import run_finished

  runs = spec.plan()
  records = []
  bar = progress_bar(len(runs), f"study {spec.name}", "run") if progress else None
  for run in runs:
    done = run_finished(run, spec.steps)
    status = "finished" if done else ("resumes" if (run.run_dir / "checkpoints").is_dir() else "new")
    if dry_run:
      print(f"{run.recipe}/seed{run.seed}: {status}: " + " ".join(command(spec, run)))
      records.append({"recipe": run.recipe, "seed": run.seed, "status": status})
      continue
    t0 = time.perf_counter()
    if not done:
      if forward.signum is not None:
        raise StudyStopped(f"study stopped by {signal.Signals(forward.signum).name} before run {run.recipe}/seed"
                           f"{run.seed}; continue it with: {again}", forward.signum)
      run.run_dir.mkdir(parents=True, exist_ok=True)
      log_path = run.run_dir / "train.log"
      with log_path.open("a") as out:  # its own process group: a terminal's Ctrl-C reaches it only through us
        child = subprocess.Popen(command(spec, run), stdout=out, stderr=subprocess.STDOUT, process_group=0)
        forward.attach(child)
        try:
          code = child.wait()
        finally:
          forward.attach(None)
      if forward.signum is not None:
        latest = _latest_checkpoint(run.run_dir)
        where = (f"its latest checkpoint is step {latest}" if latest is not None else "it had no checkpoint yet")
        raise StudyStopped(f"study stopped by {signal.Signals(forward.signum).name}: run {run.recipe}/seed"
                           f"{run.seed} stopped (exit {code}; {where}); continue the study with: {again}",
                           forward.signum)
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
  if forward.signum is not None:  # after the last run: the report (its fits take minutes) is not started
    raise StudyStopped(f"study stopped by {signal.Signals(forward.signum).name} before its report; every run has "
                       f"finished: write the report with: {again} --report-only", forward.signum)
  return records


def main(argv=None) -> int:
  args = make_parser().parse_args(argv)
  setup_logging()
  from scalerl_jax.scaling.study import check_configs, format_report, load_study, report

  again = shlex.join(["python", _script(), args.study, *(["--no-plot"] if args.no_plot else [])])
  try:
    spec = load_study(args.study)
    if not args.report_only:
      check_configs(spec, args.study)  # a typo in a recipe stops the study now, not when that run starts
      records = run_study(spec, dry_run=args.dry_run, again=again)
      if args.dry_run:
        return 0
      spec.dir.mkdir(parents=True, exist_ok=True)
      with (spec.dir / "study_runs.jsonl").open("a") as f:  # what each invocation ran, and how long it took
        f.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": records}) + "\n")
    out = report(spec, plot=not args.no_plot)
  except UserError as exc:
    sys.stderr.write(f"{PROG}: error: {exc}\n")
    return 2
  except StudyStopped as exc:
    sys.stderr.write(f"{PROG}: {exc}\n")
    return exc.exit_code
  except KeyboardInterrupt:  # Ctrl-C outside the runs (the report's fits): nothing to save
    sys.stderr.write(f"{PROG}: interrupted\n")
    return 130
  print(format_report(out))
  print(f"report: {spec.dir / 'study_report.md'}")
  return 0


def _script() -> str:
  """This script's path as the user may type it (relative to the working directory when below it)."""
  rel = os.path.relpath(__file__)
  return __file__ if rel.startswith("..") else rel


if __name__ == "__main__":
  sys.exit(main())
