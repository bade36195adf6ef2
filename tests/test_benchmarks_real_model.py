"""benchmarks/real_model.py --smoke on the tiny GGUF fixture, run as a user runs it: its own process, the host split
into the config's XLA devices (mesh.cpu_devices = 2, not this suite's 8), configs/math_hf.yaml shrunk to the
fixture. Every number the result promises is there, finite and positive, and the byte and shape accounting holds;
no speed is asserted. The process shares this suite's compilation cache (conftest.py): about 20 s once warm."""

import json
import math
import os
import pathlib
import subprocess
import sys

import jax

from tests.test_math_hf import _rows

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "gguf" / "tiny-llama-Q8_0.gguf"
# math_hf.yaml at the fixture's size, with the real-model recipe's choices (fp32, one train-step bucket, no
# thinking marker, k = 0); a reward with variance on a random model, so the steps train
SHAPES = ["model.dtype=float32", "model.max_seq_len=64", "rollout.max_slots=8", "rollout.max_prefill_len=48",
          "rollout.prefill_buckets=[48]", "rollout.max_new_tokens=12", "rollout.decode_chunk=4",
          "rollout.interruption.enabled=false", "data.prompts_per_step=2", "data.samples_per_prompt=2",
          "data.num_eval=2", "data.long_prompts=truncate", "reward.fn=tests.pipeline_helpers.reward_even_length",
          "loss.exclude_truncated=false", "trainer.batch_buckets=1", "pipeline.max_lag=0", "pipeline.eval_samples=1",
          "logging.tensorboard=false", "logging.progress=false"]


def positive(row: dict, *keys: str) -> None:
  for k in keys:
    assert isinstance(row[k], (int, float)) and math.isfinite(row[k]) and row[k] > 0, (k, row[k])


def smoke(tmp_path, *options: str, overrides: tuple = ()) -> tuple[str, dict]:
  """(stdout, result) of `real_model.py --smoke` on the fixture with `options` and config `overrides`."""
  out = tmp_path / "real_model.json"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(jax.config.jax_persistent_cache_min_compile_time_secs))
  cmd = [sys.executable, "benchmarks/real_model.py", "--smoke", *options, "--model", str(FIXTURE), "--config",
         "configs/math_hf.yaml", "--out", str(out), f"data.path={_rows(tmp_path / 'train.jsonl', seed=0)}", *SHAPES,
         *overrides]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc.stdout, json.loads(out.read_text())


def test_smoke_run_reports_every_number(tmp_path):
  stdout, r = smoke(tmp_path)
  assert "goal decode >= 0.5 x floor at batch 64" in stdout and "RL step split" in stdout
  assert {"date", "command", "machine"} <= set(r)  # record.save_result's provenance
  assert r["smoke"] and r["devices"] == 2  # the config's host split, not the suite's 8 devices
  model = r["model"]
  assert (model["layers"], model["hidden"], model["param_dtype"]) == (2, 32, "float32")
  positive(r["machine_probe"], "bandwidth", "bandwidth_one_device", "bandwidth_all_devices", "peak_flop_s")

  assert set(r["engine"]) == {"16", "64"}
  for batch, e in r["engine"].items():
    positive(e, "decode_step_ms", "decode_tok_s", "floor_tok_s", "ratio_to_floor", "decode_mfu", "prefill_tok_s",
             "prefill_mfu", "compile_prefill_s", "compile_decode_s", "weight_mb", "kv_read_mb_per_step")
    assert e["slots"] == int(batch) and (e["prompt_tokens"], e["new_tokens"], e["decode_chunk"]) == (48, 12, 4)
    # 3 calls of 4 steps, the first (compile) untimed: steps 4..11, queries at positions 47 + step read
    # 48 + step keys, mean 48 + (4 + 11) / 2 = 55.5
    assert e["mean_context"] == 55.5
    assert math.isclose(e["weight_mb"] * 1e6, model["params"] * 4)  # fp32 weights, each read once
    assert math.isclose(e["bytes_per_step_mb"], e["weight_mb"] + e["kv_read_mb_per_step"])
    assert math.isclose(e["ratio_to_floor"], e["decode_tok_s"] / e["floor_tok_s"])
  # the KV bytes a step reads grow with the slots at the same context: 64 slots read 4x what 16 do
  assert math.isclose(r["engine"]["64"]["kv_read_mb_per_step"], 4 * r["engine"]["16"]["kv_read_mb_per_step"])

  t = r["train"]
  assert (t["rows"], t["row_tokens"], t["shared_prompt"]) == (4, 60, True)
  assert t["token_positions"] == 2 * 48 + 4 * 12  # each prompt once per group, every completion column
  positive(t, "step_s_median", "train_tok_s", "positions_per_s", "flop_s", "mfu", "compile_train_s", "micro_batches")
  assert math.isfinite(t["loss"]) and t["skipped"] == 0

  sy = r["sync"]  # without adapters every publish moves the whole model
  assert sy["sync_bytes"] == sy["first_sync_bytes"] == model["params"] * 4 and "merge_s_median" not in sy
  positive(sy, "sync_s_median")

  s = r["rl_split"]
  assert len(s["profile"]["per_step"]) == 1  # 2 steps, the first (compilation) left out
  positive(s, "generate_s", "score_s", "train_s", "sync_s", "step_s")
  assert math.isfinite(s["other_s"])
  assert set(r["goals_met"]) == {"decode >= 0.5 x floor at batch 64", "compile <= 60 s per shape"}
  assert all(isinstance(v, bool) for v in r["goals_met"].values())


def test_smoke_run_with_adapters_measures_them(tmp_path):
  """lora.rank reaches every part measured: the engine decodes with the adapters in its forward, the train step
  trains them alone, and each publish after the first moves them alone; the merge into a second copy is timed."""
  stdout, r = smoke(tmp_path, "--batches", "16", "--rl-steps", "0", overrides=("lora.rank=2",))
  assert "LoRA rank 2" in stdout and "merging the adapters into a second copy" in stdout
  model, e, t, sy = r["model"], r["engine"]["16"], r["train"], r["sync"]
  assert r["lora"]["rank"] == 2
  # the fixture (2 layers, hidden 32, 4/2 heads of 8, MLP 64): per layer q, k, v, o, gate, up, down adapters of
  # rank 2, each r x (in + out) fp32 numbers
  L, D, hd, H, K, F = 2, 32, 8, 4, 2, 64
  shapes = [(D, H * hd), (D, K * hd), (D, K * hd), (H * hd, D), (D, F), (D, F), (F, D)]
  adapter_bytes = L * sum(2 * (i + o) for i, o in shapes) * 4
  assert (sy["first_sync_bytes"], sy["sync_bytes"]) == (model["params"] * 4 + adapter_bytes, adapter_bytes)
  assert sy["merged_copy_bytes"] == model["params"] * 4
  positive(sy, "sync_s_median", "merge_s_median")
  assert math.isclose(e["weight_mb"] * 1e6, model["params"] * 4 + adapter_bytes)  # the decode reads base + adapters
  assert math.isfinite(t["loss"]) and t["skipped"] == 0
  assert "rl_split" not in r
