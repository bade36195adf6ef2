"""Scoring throughput of the code reward: programs per second through the reward pool, every run in bubblewrap.

    python benchmarks/sandbox_throughput.py                  # 2 workers, 200 programs per batch, 3 batches
    python benchmarks/sandbox_throughput.py --workers 1 --programs 50

Each program is one completion with one stdio test (a trivial correct program: `print(int(input()) * 2)`), scored
by code_reward in a RewardRunner with isolation "process" (`--workers` processes, as reward.workers), the
workers started and warmed up before the clock. Two loads:
  correct   every program correct
  mixed     one program in `--hang-every` sleeps past sandbox.wall_s (killed: cause timeout_wall), one in
            `--hang-every` is wrong, the rest correct
and, for reference, the same correct program run back to back by one Sandbox in this process (no pool). Reports
programs/s (median over `--repeats` batches) and writes JSON with the date, the machine and the command to --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from scalerl_jax.config.schema import SandboxConfig
from scalerl_jax.rewards import RewardRunner, Sandbox
from scalerl_jax.rewards.code import code_reward

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

CORRECT = "```python\nprint(int(input()) * 2)\n```"
WRONG = "```python\nprint(int(input()) * 3)\n```"
HANG = "```python\nimport time\ntime.sleep(1000)\n```"
ANSWER = json.dumps({"stdio": [["21\n", "42\n"]]})


def batch(n: int, hang_every: int) -> list[str]:
  if not hang_every:
    return [CORRECT] * n
  return [HANG if i % hang_every == 0 else WRONG if i % hang_every == 1 else CORRECT for i in range(n)]


def timed_batches(runner: RewardRunner, completions: list[str], repeats: int) -> tuple[list[float], dict]:
  seconds = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    runner.score(completions, [ANSWER] * len(completions))
    seconds.append(time.perf_counter() - t0)
  return seconds, runner.metrics()


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--programs", type=int, default=200)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--hang-every", type=int, default=20)
  ap.add_argument("--wall-s", type=float, default=1.0)
  ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "sandbox_throughput.json"))
  args = ap.parse_args(argv)

  cfg = SandboxConfig(wall_s=args.wall_s)
  sandbox = Sandbox(cfg)
  sandbox.check_available()
  t0 = time.perf_counter()
  runs = [sandbox.run("print(int(input()) * 2)", "21\n") for _ in range(args.programs // 4)]
  sequential = len(runs) / (time.perf_counter() - t0)
  assert all(r.ok and r.stdout == "42\n" for r in runs)

  result: dict = {"workers": args.workers, "programs_per_batch": args.programs, "repeats": args.repeats,
                  "sandbox": {"wall_s": cfg.wall_s, "cpu_s": cfg.cpu_s, "memory_mb": cfg.memory_mb},
                  "sequential_one_process_programs_per_s": round(sequential, 1), "loads": {}}
  print(f"one Sandbox, back to back in this process: {sequential:.1f} programs/s")
  for load, hang_every in (("correct", 0), ("mixed", args.hang_every)):
    timeout = 10 * args.wall_s + 5  # per call: far above one test's wall limit
    with RewardRunner(code_reward, timeout_s=timeout, workers=args.workers, sandbox=cfg) as runner:
      runner.start()
      runner.score([CORRECT] * (2 * args.workers), [ANSWER] * (2 * args.workers))  # warm-up
      seconds, metrics = timed_batches(runner, batch(args.programs, hang_every), args.repeats)
    rate = args.programs / statistics.median(seconds)
    causes = {k.split("/")[-1]: v for k, v in metrics.items() if k.startswith("reward/cause/")}
    result["loads"][load] = {"programs_per_s": round(rate, 1), "batch_seconds": [round(s, 3) for s in seconds],
                             "hang_every": hang_every, "causes_including_warmup": causes,
                             "timeouts": metrics["reward/timeouts"], "killed_workers": metrics["reward/killed_workers"]}
    print(f"{load:8s} {rate:7.1f} programs/s through {args.workers} workers (batches {seconds}); causes {causes}")
  save_result(args.out, result)
  return result


if __name__ == "__main__":
  main()
