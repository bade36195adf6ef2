"""Does the sampler-trainer mismatch correction matter? The CPU default (`python launch/train.py`) with a known
mismatch induced, learning with each correction of loss.mismatch against none, over the same seeds (issue 31).

Conditions (each a list of overrides on the CPU default; every condition of a seed shares its warm start):
  matched               no mismatch (fp32 sampler and trainer at temperature 1): the reference curve
  kv_bf16               rollout.kv_cache_dtype=bfloat16: the generator's bf16 KV cache, a real (small) mismatch
  T{t}/sampler/none     the sampler at temperature t, the trainer at 1 (rollout.sampler_temperature=t): the ratio
                        rho = pi_trainer / pi_sampler carries the mismatch, capped by cispo's eps_max (today's)
  T{t}/trainer/none     loss.behavior=trainer, no correction: the mismatch ignored (on-policy PG of the trainer)
  T{t}/trainer/tis      ... token-level truncated IS, min(w, 2)
  T{t}/trainer/mask     ... token-level two-sided mask (IcePop), w outside [0.5, 5] dropped
  T{t}/trainer/seq_mask ... sequence-level mask on the geometric-mean ratio, outside [0.999, 1.001] dropped
  T{t}/sampler/mask     loss.behavior=sampler with the token mask

For each run: the held-out mean@n (at temperature 1, the trainer's) at the start, the best, the final and the mean
of the last three evaluations, greedy pass@1, and the medians over steps of the gap's diagnostics (train/
mismatch_kl: k3 estimate of KL(sampler || trainer) per token; mismatch_masked_frac, mismatch_truncated_frac,
mismatch_ess, ratio_max, mismatch_seq_masked_frac). Prints a table of medians over seeds (min-max beside) and writes
benchmarks/results/mismatch.json (date, machine, command, every run's curve).

    python benchmarks/mismatch.py [--seeds 0 1 2] [--steps 150] [--temperature 0.7] [--only NAME ...] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

import numpy as np

from learning_curve import ROOT, run_seed, spread  # benchmarks/ (this script's folder is on sys.path)
from record import save_result

DIAGNOSTICS = ("mismatch_kl", "mismatch_masked_frac", "mismatch_truncated_frac", "mismatch_ess", "ratio_max",
               "mismatch_seq_masked_frac")


def conditions(t: float) -> dict[str, list[str]]:
  """name -> overrides on the CPU default (module docstring)."""
  induced = [f"rollout.sampler_temperature={t}"]
  trainer = [*induced, "loss.behavior=trainer"]
  return {
      "matched": [],
      "kv_bf16": ["rollout.kv_cache_dtype=bfloat16"],
      f"T{t}/sampler/none": induced,
      f"T{t}/trainer/none": trainer,
      f"T{t}/trainer/tis": [*trainer, "loss.mismatch=tis"],
      f"T{t}/trainer/mask": [*trainer, "loss.mismatch=mask"],
      f"T{t}/trainer/seq_mask": [*trainer, "loss.mismatch=seq_mask"],
      f"T{t}/sampler/mask": [*induced, "loss.mismatch=mask"],
  }


def diagnostics(metrics_path: pathlib.Path) -> dict:
  """Median over training steps of each DIAGNOSTICS metric (steps where it is finite)."""
  rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
  out = {}
  for key in DIAGNOSTICS:
    v = [r[f"train/{key}"] for r in rows if isinstance(r.get(f"train/{key}"), (int, float))]  # NaN is logged null
    v = [x for x in v if np.isfinite(x)]
    out[key] = float(np.median(v)) if v else None
  return out


def num(value, spec: str) -> str:
  """`value` formatted, or "-" when no step logged it."""
  return "-" if value is None else format(value, spec)


def summarize(runs: list[dict]) -> dict:
  """[min, median, max] over seeds of the learning numbers and the diagnostics' medians."""
  keys = ("start", "best", "final", "last3", "greedy_final")
  return {**{k: spread([r[k] for r in runs]) for k in keys},  # the diagnostics unrounded: KL can be 1e-9
          **{k: spread([r["diagnostics"][k] for r in runs], digits=12) for k in DIAGNOSTICS}}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--temperature", type=float, default=0.7, help="the sampler's (the trainer's stays 1)")
  parser.add_argument("--only", nargs="+", default=None, help="run only these conditions")
  parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mismatch.json"))
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  todo = {k: v for k, v in conditions(args.temperature).items() if args.only is None or k in args.only}
  runs: dict[str, list[dict]] = {name: [] for name in todo}
  with tempfile.TemporaryDirectory() as tmp:
    for seed in args.seeds:  # seed-major: a seed's warm start is made once and reused by its conditions
      for name, overrides in todo.items():
        tag = name.replace("/", "_") + "_"
        r = run_seed(seed, args.steps, [*overrides, *args.overrides], pathlib.Path(tmp), name=tag)
        evals = [c["pass_rate"] for c in r["curve"]]
        run = {"seed": seed, "start": evals[0], "best": r["best"], "final": r["final"],
               "last3": float(np.mean(evals[-3:])), "greedy_final": r["greedy_final"], "total_s": r["total_s"],
               "diagnostics": diagnostics(pathlib.Path(tmp) / f"{tag}seed{seed}" / "metrics.jsonl"),
               "curve": r["curve"]}
        runs[name].append(run)
        d = {k: num(v, ".2e" if k == "mismatch_kl" else ".3f") for k, v in run["diagnostics"].items()}
        print(f"seed {seed} {name:24s} start {run['start']:.3f} best {run['best']:.3f} final {run['final']:.3f} "
              f"last3 {run['last3']:.3f} | KL(sampler||trainer) {d['mismatch_kl']} masked "
              f"{d['mismatch_masked_frac']} truncated {d['mismatch_truncated_frac']} ESS "
              f"{d['mismatch_ess']} | {run['total_s']} s", flush=True)
  summary = {name: summarize(rs) for name, rs in runs.items()}
  print(f"\nmedian over seeds {args.seeds} [min-max]; held-out mean@n at T=1; {args.steps} RL steps")
  print(f"{'condition':24s} {'final':>20s} {'last3':>20s} {'KL(s||t)':>10s} {'masked':>8s} {'trunc':>8s} {'ESS':>6s}")
  for name, s in summary.items():
    band = lambda v: f"{v[1]:.3f} [{v[0]:.3f}-{v[2]:.3f}]"  # noqa: E731
    mid = lambda k, spec: num(s[k] and s[k][1], spec)  # noqa: E731
    print(f"{name:24s} {band(s['final']):>20s} {band(s['last3']):>20s} {mid('mismatch_kl', '.2e'):>10s} "
          f"{mid('mismatch_masked_frac', '.3f'):>8s} {mid('mismatch_truncated_frac', '.3f'):>8s} "
          f"{mid('mismatch_ess', '.3f'):>6s}")
  save_result(args.out, {"seeds": args.seeds, "steps": args.steps, "sampler_temperature": args.temperature,
                         "conditions": conditions(args.temperature), "summary": summary, "runs": runs})


if __name__ == "__main__":
  main()
