"""benchmarks/compare_peers.py without the peers' virtual environments: our worker through the JSON-lines protocol
(2 rounds of the tiny workload, the real RLJob), the driver's aggregation on constructed records, the shared
tokenizer and reward. No timing assertions."""

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
