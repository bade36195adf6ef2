"""The golden run: a tiny fixed-seed configuration trained for a few RL steps, summarised as numbers that a
refactor must leave unchanged (loss, reward, lag, grad norm, held-out pass rate per step; prompt order; a
checksum of the final params).

    python -m tests.golden.run --write     # refresh tests/golden/golden_run.json (only on purpose)
    python -m tests.golden.run             # print the diff against the stored file

The configuration is spelled out in full in `golden_config.yaml` (every key, not only the ones that differ from
the defaults), so a change of the code's defaults cannot change the golden numbers. Run it as the test suite
does (8 fake CPU devices, highest matmul precision): importing `tests.conftest` sets that up.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

import tests.conftest  # noqa: F401  (8 CPU devices, matmul precision) before jax computes anything

import jax
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
CONFIG = HERE / "golden_config.yaml"
GOLDEN = HERE / "golden_run.json"
KEYS = ("train/loss", "train/reward_mean", "train/grad_norm", "train/update_norm", "pipeline/lag_max",
        "pipeline/version", "eval/pass_rate", "eval/greedy_pass_at_1")


def golden_numbers(run_dir: pathlib.Path) -> dict:
  """Runs the golden configuration in `run_dir` with the synchronous loop (no threads, so nothing depends on
  timing; PipelineRL-0 equals it bit for bit, tests/test_pipeline.py) and returns its summary."""
  from scalerl_jax.config import load_config
  from scalerl_jax.pipeline.job import RLJob

  cfg = load_config(CONFIG, overrides=[f"run_dir={run_dir}"])
  job = RLJob(cfg, progress=False)
  job.run_sync()
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  prompts = [json.loads(l)["prompt_ids"] for l in (run_dir / "consumed_prompts.jsonl").read_text().splitlines()]
  leaves = jax.tree_util.tree_flatten_with_path(job.state.params)[0]
  checksum = {jax.tree_util.keystr(p): [float(np.sum(np.asarray(x, np.float64))),
                                        float(np.sum(np.abs(np.asarray(x, np.float64))))] for p, x in leaves}
  return {"steps": [{"step": r["step"], **{k: r[k] for k in KEYS if k in r}} for r in rows],
          "prompts": prompts, "params_checksum": dict(sorted(checksum.items()))}


def diff(a: dict, b: dict, path: str = "") -> list[str]:
  """Every place where two summaries differ (exact comparison)."""
  if isinstance(a, dict) and isinstance(b, dict):
    out = [f"{path}.{k}: only in one side" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
      out += diff(a[k], b[k], f"{path}.{k}")
    return out
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      return [f"{path}: length {len(a)} != {len(b)}"]
    return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
  return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--write", action="store_true", help=f"overwrite {GOLDEN.name} with this run's numbers")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    numbers = golden_numbers(pathlib.Path(tmp) / "run")
  if args.write:
    GOLDEN.write_text(json.dumps(numbers, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
    return 0
  problems = diff(json.loads(GOLDEN.read_text()), numbers)
  print("\n".join(problems) if problems else "identical to the golden file")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
