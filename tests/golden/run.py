"""The golden run: a tiny fixed-seed configuration trained for a few RL steps, summarised as numbers that a
refactor must leave unchanged (loss, reward, lag, grad norm, held-out pass rate per step; prompt order; a
checksum of the final params).

The run is deterministic on one machine, but another CPU (AVX-512 against AVX2 kernels, say) rounds differently in
the last bits (seen: loss 0.8754070997 against 0.8754066229 at step 4, 5e-7 relative). So `diff` compares what is
discrete exactly (prompt order, steps, lag, version, rewards and pass rates, which are counts of samples) and the
float summaries within `RTOL` relative, 100x the cross-CPU difference seen and 10x below what a real change does
(tests/test_golden.py changes one loss term by 0.1 % and checks that the comparison reports it). The file records
the machine that wrote it (`written_on`).

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

from tests.pipeline_helpers import consumed_prompt_ids, read_metrics

HERE = pathlib.Path(__file__).resolve().parent
CONFIG = HERE / "golden_config.yaml"
GOLDEN = HERE / "golden_run.json"
# Float summaries compared within RTOL relative (params checksums: within RTOL of the sum of magnitudes, since a sum
# of signed values can be near 0); everything else exactly.
RTOL = 1e-4
FLOAT_KEYS = ("train/loss", "train/grad_norm", "train/update_norm")
KEYS = ("train/loss", "train/reward_mean", "train/grad_norm", "train/update_norm", "pipeline/lag_max",
        "pipeline/version", "eval/pass_rate", "eval/greedy_pass_at_1")


def golden_numbers(run_dir: pathlib.Path) -> dict:
  """Runs the golden configuration in `run_dir` with the synchronous loop (no threads, so nothing depends on
  timing; PipelineRL-0 equals it bit for bit, tests/test_pipeline.py) and returns its summary."""
  from scalerl_jax.config import load_config
  from scalerl_jax.run.job import RLJob

  cfg = load_config(CONFIG, overrides=[f"run_dir={run_dir}"])
  job = RLJob(cfg, progress=False)
  job.run_sync()
  rows, prompts = read_metrics(run_dir), consumed_prompt_ids(run_dir)
  leaves = jax.tree_util.tree_flatten_with_path(job.state.params)[0]
  checksum = {jax.tree_util.keystr(p): [float(np.sum(np.asarray(x, np.float64))),
                                        float(np.sum(np.abs(np.asarray(x, np.float64))))] for p, x in leaves}
  return {"steps": [{"step": r["step"], **{k: r[k] for k in KEYS if k in r}} for r in rows],
          "prompts": prompts, "params_checksum": dict(sorted(checksum.items()))}


def machine() -> dict:
  """The CPU and library versions that computed a summary: the last bits of its floats depend on them."""
  import platform
  cpu, flags = platform.processor(), set()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = line.partition(":")
      if key.strip() == "model name":
        cpu = value.strip()
      elif key.strip() == "flags":
        flags = set(value.split())
  except OSError:
    pass
  isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else platform.machine()
  import jaxlib
  return {"cpu": cpu, "isa": isa, "jax": jax.__version__, "jaxlib": jaxlib.__version__}


def diff(stored: dict, got: dict, rtol: float = RTOL) -> list[str]:
  """Every place where two summaries differ: the float summaries beyond `rtol` relative, the rest at all."""
  out = _exact(stored["prompts"], got["prompts"], ".prompts")
  if len(stored["steps"]) != len(got["steps"]):
    return out + [f".steps: length {len(stored['steps'])} != {len(got['steps'])}"]
  for i, (a, b) in enumerate(zip(stored["steps"], got["steps"])):
    out += _exact({k: v for k, v in a.items() if k not in FLOAT_KEYS},
                  {k: v for k, v in b.items() if k not in FLOAT_KEYS}, f".steps[{i}]")
    for k in FLOAT_KEYS:
      if (k in a) != (k in b):
        out.append(f".steps[{i}].{k}: only in one side")
      elif k in a and not _close(a[k], b[k], rtol * abs(a[k]) + 1e-9):
        out.append(f".steps[{i}].{k}: {a[k]!r} != {b[k]!r} (rel. {_rel(a[k], b[k]):.1e} > {rtol:.0e})")
  sa, sb = stored["params_checksum"], got["params_checksum"]
  out += [f".params_checksum.{k}: only in one side" for k in sorted(set(sa) ^ set(sb))]
  for k in sorted(set(sa) & set(sb)):
    (sum_a, abs_a), (sum_b, abs_b) = sa[k], sb[k]
    if not (_close(abs_a, abs_b, rtol * abs_a) and _close(sum_a, sum_b, rtol * abs_a)):
      out.append(f".params_checksum.{k}: sum {sum_a!r} != {sum_b!r} or sum|x| {abs_a!r} != {abs_b!r} "
                 f"(beyond {rtol:.0e} of sum|x|)")
  return out


def _close(a: float, b: float, atol: float) -> bool:
  return abs(a - b) <= atol


def _rel(a: float, b: float) -> float:
  return abs(a - b) / max(abs(a), abs(b), 1e-30)


def _exact(a, b, path: str) -> list[str]:
  """Every place where two JSON values differ at all."""
  if isinstance(a, dict) and isinstance(b, dict):
    out = [f"{path}.{k}: only in one side" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
      out += _exact(a[k], b[k], f"{path}.{k}")
    return out
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      return [f"{path}: length {len(a)} != {len(b)}"]
    return [d for i, (x, y) in enumerate(zip(a, b)) for d in _exact(x, y, f"{path}[{i}]")]
  return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def max_float_difference(stored: dict, got: dict) -> float:
  """The largest relative difference among the float summaries (how far two machines' roundings lie apart)."""
  rels = [_rel(a[k], b[k]) for a, b in zip(stored["steps"], got["steps"]) for k in FLOAT_KEYS if k in a and k in b]
  rels += [abs(sa - sb) / max(aa, 1e-30) for k in set(stored["params_checksum"]) & set(got["params_checksum"])
           for (sa, aa), (sb, _) in [(stored["params_checksum"][k], got["params_checksum"][k])]]
  return max(rels, default=0.0)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--write", action="store_true", help=f"overwrite {GOLDEN.name} with this run's numbers")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    numbers = golden_numbers(pathlib.Path(tmp) / "run")
  if args.write:
    GOLDEN.write_text(json.dumps({"written_on": machine(), **numbers}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
    return 0
  stored = json.loads(GOLDEN.read_text())
  problems = diff(stored, numbers)
  print(f"stored on {stored.get('written_on')}; this machine {machine()}")
  print(f"largest relative float difference: {max_float_difference(stored, numbers):.2e} (tolerance {RTOL:.0e})")
  print("\n".join(problems) if problems else "equal to the golden file within its tolerances")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
