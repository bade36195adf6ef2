"""What every system of benchmarks/compare_peers.py loads, written once per workload under the cache's work/<name>/:
checkpoint/ (a Hugging Face checkpoint with its tokenizer files: a random Qwen3 init with a character tokenizer, or
a GGUF converted by the project's converter), prompts.jsonl and eval.jsonl. Runs in the project's environment (the
driver's); `w` is a compare_peers.Workload.
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import TYPE_CHECKING

import peer_common  # benchmarks/peers (compare_peers puts it on sys.path)

if TYPE_CHECKING:
  from compare_peers import Workload


def build_assets(w: Workload, work: pathlib.Path, seed: int) -> dict:
  """work/<workload>/: checkpoint/ (a Hugging Face checkpoint with its tokenizer files), prompts.jsonl, eval.jsonl
  (our job's held-out file, one prompt; unused: eval is off). A random Qwen3 init or a converted GGUF."""
  if w.pretrained:
    return build_pretrained_assets(w, work, seed)
  return build_random_assets(w, work, seed)


def build_random_assets(w: Workload, work: pathlib.Path, seed: int) -> dict:
  """checkpoint/: our random init exported as a Hugging Face Qwen3 checkpoint with the character tokenizer's files;
  prompts: random letters."""
  import jax

  from scalerl_jax.config import ModelConfig
  from scalerl_jax.model import make_policy, param_count
  from scalerl_jax.model.hf_export import export_pretrained

  d = work / w.name
  ckpt = d / "checkpoint"
  m = w.model
  cfg = ModelConfig(vocab_size=m["vocab_size"], hidden=m["hidden"], intermediate=m["intermediate"],
                    num_layers=m["num_layers"], num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"],
                    head_dim=m["head_dim"], rope_theta=m["rope_theta"], norm_eps=m["norm_eps"], qk_norm=True,
                    tie_embeddings=True, max_seq_len=w.kv_cache)
  params = jax.jit(make_policy(cfg).init)(jax.random.key(seed))
  export_pretrained(params, cfg, ckpt, family="qwen3")
  hf = json.loads((ckpt / "config.json").read_text())
  hf.update(pad_token_id=0, eos_token_id=1, bos_token_id=None, max_position_embeddings=max(hf.get(
      "max_position_embeddings", 0), 256))
  (ckpt / "config.json").write_text(json.dumps(hf, indent=1))
  (ckpt / "generation_config.json").write_text(json.dumps({"pad_token_id": 0, "eos_token_id": 1}))
  peer_common.build_tokenizer(str(ckpt), m["vocab_size"])
  prompts = peer_common.make_prompts(512, 8, w.prompt_width, w.max_new_tokens, seed)
  write_prompts(d, prompts)
  return {"checkpoint": str(ckpt), "prompts": str(d / "prompts.jsonl"), "params": param_count(cfg)}


def write_prompts(d: pathlib.Path, prompts: list[dict]) -> None:
  for name, rows in (("prompts.jsonl", prompts), ("eval.jsonl", [{"id": "eval", "prompt": "held", "answer": "1"}])):
    (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def convert_checkpoint(source: str, ckpt: pathlib.Path, min_positions: int) -> dict:
  """ckpt: the GGUF `source` ("package:NAME": the file that installed distribution ships, found from its metadata)
  as a Hugging Face directory, written by the project's converter (fp32: every dequantized value kept) unless
  ckpt/source.json says this very file (path, size, mtime) was converted there already. max_position_embeddings is
  raised to `min_positions` when below (the tiny fixture's 64 positions; rope has no table to outgrow). Returns
  source.json's record."""
  from scalerl_jax.config.load import PACKAGE_PREFIX, package_checkpoint
  from scalerl_jax.model.gguf_convert import convert_gguf

  gguf = pathlib.Path(package_checkpoint(source) if source.startswith(PACKAGE_PREFIX) else source).resolve()
  stat = gguf.stat()
  record = {"source": source, "gguf": str(gguf), "bytes": stat.st_size, "mtime": stat.st_mtime}
  stamp = ckpt / "source.json"
  if not (stamp.exists() and json.loads(stamp.read_text()) == record):
    t = time.perf_counter()
    print(f"  converting {gguf} -> {ckpt}", flush=True)
    convert_gguf(gguf, ckpt, dtype="float32")
    print(f"  converted in {time.perf_counter() - t:.0f} s", flush=True)
    stamp.write_text(json.dumps(record))
  hf = json.loads((ckpt / "config.json").read_text())
  if hf.get("max_position_embeddings", 0) < min_positions:
    hf["max_position_embeddings"] = min_positions
    (ckpt / "config.json").write_text(json.dumps(hf, indent=1))
  return record


def word_problem_prompts(tokenizer, n: int, width: int, seed: int) -> list[dict]:
  """The first n training records of the built-in word_problems task (digits 1 as configs/smollm2_cpu.yaml, its seeded
  train split), each with the text our job renders (`prompt`: the problem; the tokenizer's chat template makes it one
  user turn), that rendering (`rendered`, what Tunix is given), the reference answer and our token ids of the rendered
  prompt (`prompt_ids`: what every worker checks its model is fed). ValueError when a prompt is longer than `width`."""
  from scalerl_jax.data.tasks import WordProblems

  rows = []
  for i, rec in enumerate(WordProblems(digits=1, seed=seed, num_train=n, num_eval=64).train_records()[:n]):
    ids = [int(t) for t in tokenizer.encode_prompt(rec.text)]
    if len(ids) > width:
      raise ValueError(f"word problem {i} is {len(ids)} tokens, over the workload's prompt width {width}")
    rows.append({"id": f"wp{i}", "prompt": rec.text, "rendered": tokenizer.render_prompt(rec.text),
                 "answer": rec.answer, "prompt_ids": ids})
  return rows


def build_pretrained_assets(w: Workload, work: pathlib.Path, seed: int) -> dict:
  """checkpoint/: w.pretrained converted (convert_checkpoint); prompts: word problems rendered with its chat
  template (word_problem_prompts), tokenized by the tokenizer our job builds from that directory."""
  from scalerl_jax.data.tokenizer import PretrainedTokenizer
  from scalerl_jax.model import param_count
  from scalerl_jax.model.hf import hf_model_config

  d = work / w.name
  ckpt = d / "checkpoint"
  source = convert_checkpoint(w.pretrained, ckpt, w.kv_cache)
  write_prompts(d, word_problem_prompts(PretrainedTokenizer(ckpt), 512, w.prompt_width, seed))
  hf = json.loads((ckpt / "config.json").read_text())
  return {"checkpoint": str(ckpt), "prompts": str(d / "prompts.jsonl"), "source": source,
          "model_type": hf["model_type"], "params": param_count(hf_model_config(ckpt))}
