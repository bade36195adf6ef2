"""configs/math_hf.yaml end to end on an imported checkpoint: the tiny Qwen3 fixture (tests/fixtures/hf/qwen3) and a
generated 50-row GSM8K-style JSONL run three RL steps through the whole pipeline (rollouts, rewards in the reward
workers, train steps, a checkpoint) with the recipe's own dtypes (bf16 compute, fp32 master weights), then resume
for a fourth."""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.config import ConfigError, load_config
from scalerl_jax.model.hf import HFCheckpointError, load_pretrained
from scalerl_jax.run.job import RLJob
from tests.pipeline_helpers import read_consumed, read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]
QWEN3 = ROOT / "tests" / "fixtures" / "hf" / "qwen3"
TINY = ["rollout.max_slots=16", "rollout.max_prefill_len=48", "rollout.prefill_buckets=[48]",
        "rollout.max_new_tokens=12", "rollout.decode_chunk=4", "rollout.interruption.think_budget_min=4",
        "rollout.interruption.think_budget_max=6", "rollout.interruption.answer_budget=4",
        "rollout.interruption.phrase=is", "model.max_seq_len=64",
        "data.prompts_per_step=4", "data.samples_per_prompt=2", "data.num_eval=4", "data.long_prompts=truncate",
        "pipeline.eval_every=2", "pipeline.eval_samples=1", "checkpoint.every_steps=2", "logging.tensorboard=false",
        "logging.progress=false", "mesh.generator_devices=4", "mesh.spec=data=-1", "mesh.generator_spec=data=-1"]


def thinking_qwen3(dest: pathlib.Path) -> pathlib.Path:
  """A copy of the Qwen3 fixture whose tokenizer has Qwen3's thinking markers <think> / </think> as added tokens
  (ids 91, 92 of its 96-row embedding), as the real Qwen3 tokenizer has them: the recipe's end marker is then a
  token the model writes. The fixture's own tokenizer lacks them, like a non-thinking model's."""
  shutil.copytree(QWEN3, dest)
  path = dest / "tokenizer.json"
  tok = json.loads(path.read_text())
  tok["added_tokens"] += [dict(id=91 + i, content=c, single_word=False, lstrip=False, rstrip=False, normalized=False,
                               special=False) for i, c in enumerate(("<think>", "</think>"))]
  path.write_text(json.dumps(tok))
  return dest


def checkpoint(path: pathlib.Path) -> list[str]:
  return [f"model.pretrained={path}", f"data.tokenizer={path}"]


def _rows(path: pathlib.Path, seed: int) -> pathlib.Path:
  rng = np.random.default_rng(seed)
  with path.open("w") as f:
    for i in range(50):
      a, b = (int(x) for x in rng.integers(1, 50, 2))
      f.write(json.dumps({"question": f"Sara has {a} apples and buys {b} more. How many apples does she have?",
                          "answer": f"{a}+{b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}) + "\n")
  return path


def test_math_hf_recipe_trains_an_imported_checkpoint_and_resumes(tmp_path):
  data, held_out = _rows(tmp_path / "train.jsonl", seed=0), _rows(tmp_path / "eval.jsonl", seed=1)
  # the fixture cannot write digits (math-verify would score every sample -1) and seldom ends a sample within the
  # tiny budgets (truncated samples would be out of the loss): a reward with variance and truncated samples in the
  # loss, so the gradient is not 0 and the recipe's lr 1e-6 makes real updates
  overrides = [f"run_dir={tmp_path / 'run'}", f"data.path={data}", f"data.eval_path={held_out}", *TINY,
               *checkpoint(thinking_qwen3(tmp_path / "qwen3")),
               "reward.fn=tests.pipeline_helpers.reward_even_length", "loss.exclude_truncated=false"]
  job = RLJob(load_config(ROOT / "configs" / "math_hf.yaml", [*overrides, "pipeline.steps=3"]), progress=False)
  assert job.cfg.model.qk_norm and job.cfg.model.head_dim == 16  # the architecture came from config.json
  assert len(job.task.train_records()) == 50 - job.task.overlap_dropped  # held out in their own file
  assert [r.prompt_id for r in job.task.eval_records()] == [r.prompt_id for r in job.evaluator.prompts][:4]
  imported = load_pretrained(QWEN3).params
  job.setup()
  _assert_fp32_state(job)  # the checkpoint's weights are the fp32 master weights
  start = [np.array(x) for x in jax.tree.leaves(job.state.params)]  # a copy: the train step donates the state
  for a, b in zip(start, jax.tree.leaves(imported)):
    np.testing.assert_array_equal(a, np.asarray(b))  # training starts from the checkpoint's weights
  job.release()
  job.run()
  lines = read_metrics(tmp_path / "run")
  assert [l["step"] for l in lines] == [0, 1, 2, 3] and all("train/loss" in l for l in lines[1:])
  assert sum(l["train/grad_norm"] > 0 for l in lines[1:]) >= 2
  _assert_updates_kept(job, start)
  assert job.ckpt.latest_step() == 3
  resumed = RLJob(load_config(ROOT / "configs" / "math_hf.yaml", [*overrides, "pipeline.steps=4"]), progress=False)
  resumed.run()
  assert resumed.start_step == 3 and resumed.ckpt.latest_step() == 4
  prompts = [r["step"] for r in read_consumed(tmp_path / "run")]
  assert prompts == [0, 1, 2, 3]


def _assert_fp32_state(job: RLJob) -> None:
  """model.param_dtype=float32 survives model.pretrained: params and Adam moments are fp32 under bf16 compute."""
  assert job.cfg.model.dtype == "bfloat16" and job.cfg.model.param_dtype == "float32"
  params = jax.tree.leaves(job.state.params)
  moments = [x for x in jax.tree.leaves(job.state.opt_state) if x.ndim > 0]
  assert len(moments) == 2 * len(params) and {x.dtype for x in params + moments} == {np.dtype(np.float32)}


def _assert_updates_kept(job: RLJob, start: list[np.ndarray]) -> None:
  """fp32 master weights after training: the warm-up's updates at lr 1e-6 (each far below half a bf16 step of its
  weight) moved the params, where bf16 master weights would have rounded them away (0.004 % of them moved then)."""
  _assert_fp32_state(job)
  before = np.concatenate([x.ravel() for x in start])
  after = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(job.state.params)])
  as_bf16 = before.astype(jnp.bfloat16)
  kept_in_bf16 = (as_bf16.astype(np.float32) + (after - before)).astype(jnp.bfloat16) == as_bf16
  assert np.mean(after != before) > 0.5 and np.mean(kept_in_bf16) > 0.99


def test_a_missing_or_file_checkpoint_path_names_model_pretrained(tmp_path):
  """math_hf.yaml's placeholder checkpoint, and a file (not a GGUF) where a directory is expected: a ConfigError
  naming the key (not config.json's 'no such file', nor a utf-8 codec error from reading a binary file as JSON); a
  broken GGUF file: an error naming it."""
  run = [f"run_dir={tmp_path / 'run'}"]
  with pytest.raises(ConfigError, match=r"^model\.pretrained: checkpoints/model: no such directory; a Hugging Face "
                                        r"checkpoint directory .* is expected"):
    RLJob(load_config(ROOT / "configs" / "math_hf.yaml", run), progress=False)
  weights = tmp_path / "model.bin"
  weights.write_bytes(b"GGUF\x03\x00\x00\x00\xff\xfe\x80")
  with pytest.raises(ConfigError, match=rf"^model\.pretrained: {weights} is a file, not a checkpoint directory"):
    RLJob(load_config(ROOT / "configs" / "math_hf.yaml", [*run, f"model.pretrained={weights}"]), progress=False)
  gguf = tmp_path / "model.gguf"  # a GGUF file is a checkpoint (tests/test_gguf.py); a broken one is named
  gguf.write_bytes(b"GGUF\x03\x00\x00\x00\xff\xfe\x80")
  with pytest.raises(HFCheckpointError, match=rf"^{gguf}: not a readable GGUF file"):
    RLJob(load_config(ROOT / "configs" / "math_hf.yaml", [*run, f"model.pretrained={gguf}"]), progress=False)


def test_an_end_marker_the_checkpoint_cannot_write_is_refused_naming_the_key(tmp_path):
  """math_hf.yaml force-interrupts at '</think>': on a checkpoint whose tokenizer has no such added token and whose
  chat template never writes it (a non-thinking model, as the fixture's own tokenizer is), nearly every sample would
  be cut; refused, naming rollout.interruption.end_marker and the way out. A Qwen3-style tokenizer with </think>,
  a chat template that writes the marker, and interruption off all pass."""
  from scalerl_jax.config import validate_with_tokenizer
  from scalerl_jax.data.tokenizer import make_tokenizer

  run = [f"run_dir={tmp_path / 'run'}", f"data.path={_rows(tmp_path / 'train.jsonl', seed=0)}", *TINY]
  with pytest.raises(ConfigError, match=r"^rollout\.interruption\.end_marker: '</think>' is not a token of "
                                        r"data\.tokenizer=.*qwen3 .* set rollout\.interruption\.enabled=false"):
    RLJob(load_config(ROOT / "configs" / "math_hf.yaml", [*run, *checkpoint(QWEN3)]), progress=False)

  def check(path: pathlib.Path, *overrides: str) -> None:  # what RLJob checks, with the checkpoint's architecture
    cfg = load_config(ROOT / "configs" / "math_hf.yaml", [*run, *checkpoint(path), "model.vocab_size=96",
                                                          *overrides])
    validate_with_tokenizer(cfg, make_tokenizer(cfg.data, vocab_size=96))

  check(QWEN3, "rollout.interruption.enabled=false")
  check(thinking_qwen3(tmp_path / "thinking"))
  templated = shutil.copytree(QWEN3, tmp_path / "templated")
  (templated / "chat_template.jinja").write_text((QWEN3 / "chat_template.jinja").read_text().replace(
      "<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"))
  check(templated)


def test_a_train_step_over_trainer_max_step_memory_mb_runs_in_more_micro_batches(tmp_path):
  """The train step's temporaries grow with a micro-batch's rows, the model and the widths (on the fixture the
  recipe's own 32 x 8 rows of 512 + 1,024 tokens needed 39 GB in one micro-batch, 9.8 GB with 8 groups kept: a
  13 GB peak RSS): a step over trainer.max_step_memory_mb runs in the fewest micro-batches of whole groups that fit
  (here 4 groups of 2 rows of 48 + 256 tokens, on one trainer device: 71 MiB in one, 18 MiB in 4); 0: no limit."""
  from scalerl_jax.train.state import init_train_state
  from scalerl_jax.train.step import temp_bytes

  ckpt = thinking_qwen3(tmp_path / "qwen3")
  base = [f"run_dir={tmp_path / 'run'}", f"data.path={_rows(tmp_path / 'train.jsonl', seed=0)}", *TINY,
          *checkpoint(ckpt), "rollout.max_new_tokens=256", "model.max_seq_len=320", "mesh.generator_devices=7"]

  def whole_batch_step(budget_mb: int):
    job = RLJob(load_config(ROOT / "configs" / "math_hf.yaml", [*base, f"trainer.max_step_memory_mb={budget_mb}"]),
                progress=False)
    job.trainer.state = init_train_state(job.policy, job.optimizer, job.trainer_layout, seed=0)
    step = job.trainer.step_for(4)
    return job.trainer.micro_batches, temp_bytes(step)

  whole, temp = whole_batch_step(0)
  assert whole == {4: 1} and temp > 32 << 20
  split, temp = whole_batch_step(32)
  assert split == {4: 4} and temp <= 32 << 20


def test_the_default_config_with_a_checkpoint_refuses_the_character_tokenizer(tmp_path):
  """model.pretrained alone on the default config: data.tokenizer=char would feed the built-in character ids to a
  BPE checkpoint; refused, naming both keys."""
  with pytest.raises(ConfigError, match=rf"^data\.tokenizer: char .* with model\.pretrained={QWEN3}, a checkpoint "
                                        rf"with its own tokenizer .*data\.tokenizer={QWEN3}\)$"):
    RLJob(load_config(None, [f"run_dir={tmp_path / 'run'}", f"model.pretrained={QWEN3}"]), progress=False)
