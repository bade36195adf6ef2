"""Stores the evaluations of a study's runs for notebooks/recipe_comparison.ipynb:

  python notebooks/make_study_data.py runs/study_cpu [--recipes scalerl loo_dapo loo_savg] [--out FILE]

From every RUN_DIR/metrics.jsonl of the study directory (layout <recipe>/seed<k>, as launch/study.py writes it) the
evaluation lines only, with the keys the curve fit reads (step, compute, pass rate, correct and total counts),
into notebooks/data/study_cpu.json (a few tens of kilobytes: the notebook ships with real data, not synthetic), or
--out (notebooks/data/study_add4.json: the 4-digit addition study, for bayesian_extrapolation).
"""

from __future__ import annotations

import argparse
import json
import pathlib

KEYS = ("step", "compute/accelerator_seconds", "compute/flops", "compute/generator_flops", "eval/pass_rate",
        "eval/n_correct", "eval/n_total", "eval/samples_per_prompt")


def main(argv=None) -> pathlib.Path:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("study_dir")
  ap.add_argument("--recipes", nargs="*", help="recipes to keep (default: all)")
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "data" / "study_cpu.json"))
  args = ap.parse_args(argv)
  root = pathlib.Path(args.study_dir)
  runs = {}
  for path in sorted(root.glob("*/seed*/metrics.jsonl")):
    recipe, seed = path.parent.parent.name, path.parent.name
    if args.recipes and recipe not in args.recipes:
      continue
    evals = [{k: r[k] for k in KEYS if k in r} for r in map(json.loads, path.read_text().splitlines())
             if "eval/pass_rate" in r]
    runs[f"{recipe}/{seed}"] = {"recipe": recipe, "seed": int(seed.removeprefix("seed")), "evals": evals}
  if not runs:
    raise SystemExit(f"make_study_data.py: error: no <recipe>/seed<k>/metrics.jsonl under {root}")
  report = root / "study_report.json"
  meta = json.loads(report.read_text()) if report.is_file() else {}
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({
      "source": f"{len(runs)} runs of the study {meta.get('name', root.name)} ({meta.get('steps', '?')} steps each; "
                f"python launch/study.py configs/studies/{meta.get('name', 'loo_cpu')}.yaml)",
      "x": meta.get("fit", {}).get("x", "flops"), "runs": runs}, indent=None, separators=(",", ":")))
  print(f"wrote {out} ({out.stat().st_size // 1024} KiB, {len(runs)} runs)")
  return out


if __name__ == "__main__":
  main()
