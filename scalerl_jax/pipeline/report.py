"""The end-of-run summary: the learning curve in numbers and the scaling-curve fit of this run."""

from __future__ import annotations

import json
import pathlib

from scalerl_jax.config import RunConfig


def _rows(run_dir: pathlib.Path) -> list[dict]:
  """The metrics lines that parse (a report never fails a finished run over a line a kill cut off)."""
  path = run_dir / "metrics.jsonl"
  if not path.exists():
    return []
  rows = []
  for line in path.read_text(errors="replace").splitlines():
    try:
      row = json.loads(line) if line.strip() else None
    except (ValueError, RecursionError):  # json.JSONDecodeError is a ValueError
      continue
    if isinstance(row, dict):
      rows.append(row)
  return rows


def final_report(cfg: RunConfig, summary: dict) -> str:
  run_dir = pathlib.Path(cfg.run_dir)
  rows = _rows(run_dir)
  evals = [r for r in rows if r.get("eval/pass_rate") is not None]
  lines = [f"run {run_dir}: {summary.get('steps', 0)} steps ({cfg.pipeline.mode}, k={cfg.pipeline.max_lag}, "
           f"loss={cfg.loss.name}, aggregation={cfg.loss.aggregation}, adv_norm={cfg.loss.adv_norm})"]
  if summary.get("stopped"):  # a signal: which, where, after how many steps, and how to continue
    lines.append(summary["stopped"])
  if "warm_start/pass_rate" in summary:
    lines.append(f"warm start: {summary['warm_start/steps']} supervised steps, {summary['warm_start/seconds']:.1f} s, "
                 f"validation P(reference) {summary['warm_start/pass_rate']:.3f}")
  if evals:
    first, last = evals[0], evals[-1]
    best = max(evals, key=lambda r: r["eval/pass_rate"])
    lines.append(f"held-out mean@{first.get('eval/samples_per_prompt', '?')} (T={cfg.pipeline.eval_temperature}): "
                 f"{first['eval/pass_rate']:.3f} at step {first['step']} -> {last['eval/pass_rate']:.3f} at step "
                 f"{last['step']} (best {best['eval/pass_rate']:.3f} at step {best['step']}); greedy pass@1 "
                 f"{first.get('eval/greedy_pass_at_1', float('nan')):.3f} -> {last.get('eval/greedy_pass_at_1', float('nan')):.3f}")
  if rows:
    last = rows[-1]
    if last.get("data/skipped_bad_rows"):
      lines.append(f"data: {last['data/skipped_bad_rows']} of {last.get('data/rows_read', '?')} rows of "
                   f"{cfg.data.path} skipped as bad (data.skip_bad_rows=true; the log names the first)")
    logs = f"{run_dir}/metrics.jsonl" + (f" and {run_dir}/tensorboard" if cfg.logging.tensorboard else "")
    lines.append(f"compute: {last.get('compute/accelerator_seconds', 0):.1f} accelerator-seconds, "
                 f"{last.get('compute/flops', 0):.3g} FLOPs; logs in {logs}")
  if len(evals) >= 6:
    try:
      from scalerl_jax.scaling import fit_run, format_report
      fit = fit_run(str(run_dir), x=cfg.curve_fit.x, fit_upto=cfg.curve_fit.fit_upto, c_min=cfg.curve_fit.c_min,
                    bayes=cfg.curve_fit.bayes, plot=str(run_dir / "scaling_curve.png"), target=cfg.curve_fit.target,
                    calibration=cfg.curve_fit.calibration)
      (run_dir / "scaling_fit.json").write_text(json.dumps(fit, indent=2, default=str))
      lines.append(format_report(fit))
      lines.append(f"plot: {run_dir / 'scaling_curve.png'}")
      from scalerl_jax.scaling import fit_tasks
      per_task = fit_tasks(str(run_dir), x=cfg.curve_fit.x, fit_upto=cfg.curve_fit.fit_upto,
                           c_min=cfg.curve_fit.c_min, bayes=cfg.curve_fit.bayes, calibration=cfg.curve_fit.calibration,
                           plot=str(run_dir / "scaling_curve_tasks.png"))
      if per_task:  # a mixed-task run: one curve per task, plotted together
        (run_dir / "scaling_fit_tasks.json").write_text(json.dumps(per_task, indent=2, default=str))
        lines += [f"{task}: {format_report(f)}" for task, f in per_task.items()]
        lines.append(f"plot: {run_dir / 'scaling_curve_tasks.png'}")
    except Exception as exc:  # the fit is a report, never a reason to fail a finished run
      lines.append(f"curve fit skipped: {type(exc).__name__}: {exc}")
  else:
    lines.append(f"curve fit skipped: {len(evals)} evaluation points (needs >= 6)")
  return "\n".join(lines)
