"""Mixed math + code data: the built-in code task, the mixed pool and its ratio-controlled batches (with resume),
code rows of a user file, per-task metrics, and per-task curves (scaling.io, fit_curve.py --per-task)."""

import dataclasses
import json

import numpy as np
import pytest

from launch import fit_curve as cli
from scalerl_jax import scaling, types
from scalerl_jax.config import load_config
from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.prompt_stream import RatioStream, make_prompt_stream
from scalerl_jax.data.sources import DataError
from scalerl_jax.data.tasks import CodeTask, MixedTask, make_task
from scalerl_jax.data.tokenizer import CharTokenizer
from scalerl_jax.pipeline.held_out import per_task_metrics
from scalerl_jax.pipeline.step_metrics import merge_counters, task_metrics
from scalerl_jax.rewards import RewardRunner, TaskRewards
from scalerl_jax.scaling import synthetic
from tests import test_rewards_faulty as faulty


def mixed_cfg(*overrides):
  return load_config(overrides=["data.task=mixed", "data.num_eval=32", "data.prompts_per_step=8", *overrides]).data


def test_code_task_problems_solutions_and_tests_agree():
  task = CodeTask(2, 0, 20000, 64)
  splits = [task.train_records(), task.eval_records(), task.warmstart_val_records()]
  texts = [{r.text for r in s} for s in splits]
  assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
  assert len(texts[0]) == 9 * 100 - 64 - 256  # every other problem of the space trains
  tok = CharTokenizer()
  for r in splits[1][:20]:
    solution = task.solution(r)
    tok.encode(r.text + solution)  # the char vocabulary covers prompt and completion
    b, f1 = map(int, r.text.rstrip(":").split(","))
    slope, _, body = solution.rstrip("$").partition("|")
    tests = json.loads(r.answer)
    # the reference body, run by plain Python here (our own text, not a model's), passes the item's asserts
    namespace = {}
    exec(tests["starter"] + body, namespace)  # noqa: S102
    for statement in tests["asserts"]:
      exec(statement, namespace)  # noqa: S102
    assert int(slope) == f1 - b and len(tests["asserts"]) == 1


def test_mixed_pool_is_tagged_and_keeps_the_code_share():
  for fraction in (0.5, 0.25, 1.0, 0.0):
    task = MixedTask(mixed_cfg(f"data.code_fraction={fraction}"))
    pool = task.train_records()
    code = sum(r.task == "code" for r in pool)
    assert {r.task for r in pool} <= {"math", "code"} and abs(code / len(pool) - fraction) < 0.01
  assert {r.task for r in task.eval_records()} == {"math", "code"} and len(task.eval_records()) == 64
  assert task.verifiers == {"math": "addition", "code": "code"}  # the math rows are addition problems
  record = next(r for r in task.eval_records() if r.task == "code")
  assert task.solution(record) == task.tasks["code"].solution(dataclasses.replace(record, task=""))


def test_ratio_stream_fills_every_batch_with_the_share_and_resumes_exactly():
  cfg = mixed_cfg("data.task_mix=ratio", "data.code_fraction=0.25")
  task, tok = MixedTask(cfg), CharTokenizer()
  stream = make_prompt_stream(task, cfg, tok, 10, npr=NPRState(cfg.npr))
  assert isinstance(stream, RatioStream)
  for _ in range(3):
    batch = stream.next_batch()
    assert [p.task for p in batch] == ["math"] * 6 + ["code"] * 2
  state = json.loads(json.dumps(stream.get_state()))
  expected = [[p.prompt_id for p in stream.next_batch()] for _ in range(4)]
  again = make_prompt_stream(task, cfg, tok, 10, npr=NPRState(cfg.npr))
  again.set_state(state)
  assert [[p.prompt_id for p in again.next_batch()] for _ in range(4)] == expected
  shuffled = make_prompt_stream(task, mixed_cfg(), tok, 10, npr=NPRState(cfg.npr))
  assert {p.task for _ in range(4) for p in shuffled.next_batch()} == {"math", "code"}


def test_file_rows_choose_their_task_and_code_rows_hold_tests(tmp_path):
  tests = {"starter": "def f(x):return ", "asserts": ["assert f(1)==2"]}
  rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "double", "answer": tests, "task": "code"},
          {"prompt": "2+2=", "answer": "4", "task": "math"}, {"prompt": "inc", "answer": json.dumps(tests),
                                                               "task": "code"}]
  path = tmp_path / "mixed.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  cfg = load_config(overrides=["data.task=file", f"data.path={path}", "data.num_eval=1"]).data
  task = make_task(cfg)
  records = task.train_records() + task.eval_records()
  assert sorted(r.task for r in records) == ["code", "code", "math", "math"]
  assert all(json.loads(r.answer) == tests for r in records if r.task == "code")
  assert task.verifiers == {"math": "math", "code": "code"}
  math_only = tmp_path / "math.jsonl"
  math_only.write_text("\n".join(json.dumps(r) for r in (rows[0], rows[2])) + "\n")
  single = make_task(dataclasses.replace(cfg, path=str(math_only)))
  assert single.verifiers == {"": "math"} and {r.task for r in single.train_records() + single.eval_records()} == {""}
  for bad, message in (({"prompt": "p", "answer": "a", "task": "sql"}, "line 2: task field 'task' must be one of"),
                       ({"prompt": "p", "answer": {"starter": ""}, "task": "code"}, "line 2: answer field 'answer' "
                                                                                   "of a code row has no tests"),
                       ({"prompt": "p", "answer": "not json", "task": "code"}, "must be a JSON object of tests")):
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=message):
      make_task(cfg)


def _group(task, rewards, n_tokens=3):
  prompt = types.Prompt(f"{task}-{rewards}", "", "", np.zeros(2, np.int32), task)
  sample = types.Sample("x", np.zeros(2, np.int32), np.zeros(n_tokens, np.int32), np.zeros(n_tokens, np.float32),
                        np.zeros(n_tokens, np.int32), np.zeros(n_tokens, bool), False, False)
  return types.ScoredGroup(prompt, (sample,) * len(rewards), np.asarray(rewards, np.float32),
                           np.asarray(rewards) > 0.5)


def test_per_task_train_and_eval_metrics():
  batch = types.ScoredBatch(0, (_group("math", [1, 0]), _group("code", [1, 1], 5), _group("code", [0, 0], 7)))
  out = task_metrics(batch)
  assert out == {"train/code/prompts": 2, "train/code/pass_rate": 0.5, "train/code/completion_tokens": 6.0,
                 "train/math/prompts": 1, "train/math/pass_rate": 0.5, "train/math/completion_tokens": 3.0}
  assert task_metrics(types.ScoredBatch(0, (_group("", [1, 0]),))) == {}
  correct = np.array([[1, 1], [0, 1], [0, 0]], bool)
  got = per_task_metrics(["math", "code", "code"], correct, np.array([[1], [0], [1]], bool))
  assert got["eval/code/pass_rate"] == 0.25 and got["eval/code/per_prompt_correct"] == [1, 0]
  assert got["eval/math/n_correct"] == 2 and got["eval/code/n_total"] == 4 and got["eval/code/greedy_pass_at_1"] == 0.5
  assert per_task_metrics(["", ""], correct[:2], correct[:2, :1]) == {}


def test_per_task_failure_rates_of_two_processes_are_recomputed_from_their_counts():
  """Each process scores its shard of a mixed run with its own TaskRewards; the run logs one record: counts summed,
  every rate (the run's and each task's) recomputed from the sums, never added."""
  def process(math_texts, code_texts):
    rewards = TaskRewards({task: RewardRunner(faulty.raises_on_boom, isolation="inline") for task in ("math", "code")})
    rewards.runners["math"].score(math_texts, ["a"] * len(math_texts))
    rewards.runners["code"].score(code_texts, ["a"] * len(code_texts))
    return rewards.metrics()

  one = process(["boom"] + ["a"] * 9, ["a"] * 4)  # math 1 of 10 failed, code 0 of 4
  two = process(["boom"] + ["a"] * 9, ["boom"] * 3 + ["a"] * 3)  # math 1 of 10, code 3 of 6
  assert one["reward/math/failure_rate"] == two["reward/math/failure_rate"] == 0.1
  merged = merge_counters([one, two])
  assert merged["reward/math/calls"] == 20 and merged["reward/code/calls"] == 10 and merged["reward/calls"] == 30
  assert merged["reward/math/failure_rate"] == pytest.approx(0.1)
  assert merged["reward/code/failure_rate"] == pytest.approx(0.3)
  assert merged["reward/failure_rate"] == pytest.approx(5 / 30)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
  """A metrics.jsonl whose evaluations carry two task curves with different ceilings (synthetic, known)."""
  root = tmp_path_factory.mktemp("mixed")
  math = synthetic.synthetic_run(synthetic.table1("ScaleRL", r0=0.3), 16000.0, n_evals=30, seed=1)
  code = synthetic.synthetic_run(synthetic.table1("ScaleRL-Scout", r0=0.2), 16000.0, n_evals=30, seed=2)
  lines = []
  for i, (c, rm, rc) in enumerate(zip(math.compute, math.reward, code.reward)):
    lines.append({"step": i, "compute/generator_flops": float(c), "eval/pass_rate": float(rm + rc) / 2,
                  "eval/math/pass_rate": float(rm), "eval/code/pass_rate": float(rc)})
  (root / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
  return root, math, code


def test_per_task_points_and_fits(mixed_run, tmp_path, capsys):
  root, math, code = mixed_run
  assert scaling.tasks_in(root) == ["code", "math"]
  pts = scaling.load_points(root, task="code")
  np.testing.assert_allclose(pts.reward, code.reward, rtol=1e-6)
  assert pts.name.endswith("[code]")
  fits = scaling.fit_tasks(str(root), bayes=False, plot=str(tmp_path / "tasks.png"))
  assert set(fits) == {"code", "math"} and (tmp_path / "tasks.png").stat().st_size > 0
  assert cli.main([str(root), "--per-task", "--json", str(tmp_path / "f.json")]) == 0
  out = json.loads((tmp_path / "f.json").read_text())
  assert [r["name"].rsplit(" ", 1)[1] for r in out["runs"]] == ["[code]", "[math]"] and out["comparisons"]
  assert cli.main([str(root), "--task", "math"]) == 0
  with pytest.raises(SystemExit):
    cli.main([str(root), "--task", "math", "--per-task"])
  assert "exclude each other" in capsys.readouterr().err


def test_short_mixed_run_scores_code_in_the_sandbox_and_reports_per_task(tmp_path):
  from scalerl_jax.run.job import RLJob
  from scalerl_jax.rewards.sandbox import Sandbox, SandboxUnavailable
  from scalerl_jax.config import SandboxConfig
  from tests.pipeline_helpers import read_metrics, tiny_config
  try:
    Sandbox(SandboxConfig()).check_available()
  except SandboxUnavailable as exc:
    pytest.skip(f"no usable sandbox here: {exc}")
  cfg = tiny_config(tmp_path, "data.task=mixed", "reward.fn=", "data.task_mix=ratio", "data.num_eval=8",
                    "rollout.interruption.answer_budget=7", "pipeline.steps=10", "pipeline.eval_every=2",
                    "reward.workers=1", "reward.timeout_s=10")
  job = RLJob(cfg, progress=False)
  job.run_sync()
  rows = read_metrics(job.run_dir)
  steps = [r for r in rows if "train/loss" in r]
  assert all(r["train/math/prompts"] == r["train/code/prompts"] == 2 for r in steps)
  last = rows[-1]
  assert last["reward/code/calls"] > 0 and sum(v for k, v in last.items() if k.startswith("reward/code/cause/")) > 0
  assert last["eval/code/n_total"] == last["eval/math/n_total"] == 8 * cfg.pipeline.eval_samples
  # every greedy code answer has its cause (exact match gives none): 8 of the 16 held-out prompts; solved = "ok"
  for row in (r for r in rows if "eval/greedy_pass_at_1" in r):
    causes = {k: v for k, v in row.items() if k.startswith("eval/greedy_cause/")}
    assert sum(causes.values()) == pytest.approx(0.5)
    assert causes.get("eval/greedy_cause/ok", 0.0) == pytest.approx(row["eval/code/greedy_pass_at_1"] / 2)
  assert scaling.tasks_in(job.run_dir) == ["code", "math"]
  for task in ("code", "math"):
    assert len(scaling.load_points(job.run_dir, task=task).compute) == 6  # R0 + 5 evaluations


def test_mixed_cpu_config_fits_its_prompts_and_solutions():
  cfg = load_config("configs/mixed_cpu.yaml")
  task, tok = make_task(cfg.data), CharTokenizer()
  r, it = cfg.rollout, cfg.rollout.interruption
  records = task.train_records() + task.eval_records()
  assert {rec.task for rec in records} == {"math", "code"}
  assert max(len(tok.encode_prompt(rec.text)) for rec in records) <= r.max_prefill_len
  for rec in [rec for t in ("math", "code") for rec in records if rec.task == t][::97]:
    work, _, answer = task.solution(rec).partition("|")
    assert len(tok.encode(work)) <= it.think_budget_min and len(tok.encode(answer)) <= it.answer_budget
    assert len(tok.encode(task.solution(rec))) <= r.max_new_tokens
  assert r.max_prefill_len + r.max_new_tokens <= cfg.model.max_seq_len


def test_warm_start_validation_of_a_mixed_run_is_its_weakest_task(monkeypatch):
  from scalerl_jax.train import warmstart
  task, tok = MixedTask(mixed_cfg()), CharTokenizer()
  # each task's validation rows stand for a "pass rate" of their own (the mean token id of the rows it was given)
  monkeypatch.setattr(warmstart, "reference_pass_rate_fn", lambda policy, tokens, mask: lambda params: tokens.mean())
  val = task.warmstart_val_records()
  each = {t: warmstart.solution_rows(task, [r for r in val if r.task == t], tok)[0].mean() for t in ("math", "code")}
  assert each["math"] != each["code"]
  assert warmstart.validation_pass_rate_fn(None, task, tok)(None) == min(each.values())
  single = CodeTask(2, 0, 20000, 64)  # untagged: one split, one value
  assert warmstart.validation_pass_rate_fn(None, single, tok)(None) == warmstart.solution_rows(
      single, single.warmstart_val_records(), tok)[0].mean()
