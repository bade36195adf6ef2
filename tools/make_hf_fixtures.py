"""Writes the Hugging Face parity fixtures of issue 14 (item 5): tiny random checkpoints of Llama 3, Qwen2 and
Qwen3 built with transformers' own classes, with reference logits and greedy tokens computed by transformers; and
(issue 15, item 4) of the mixture-of-experts families Qwen3-MoE and Mixtral, in a root of their own.

Dev-only: needs torch + transformers (the `hf-fixtures` extra, in a venv of its own; see tools/README.md). The test
suite reads the files this writes without torch (tests/test_hf_fixtures.py checks they are complete; the MoE ones
are read by tests/test_hf_moe.py).

    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py --out tests/fixtures/hf
    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py --out tests/fixtures/hf_moe --families qwen3_moe,mixtral

The MoE fixtures are saved as transformers saves them (the per-expert layout of the Hub checkpoints); the same
model saved with `save_original_format=False` (transformers 5's fused in-memory expert layout) is checked to load
to the same logits, and its tensors' names, shapes and sha256 are recorded in reference.json (`fused_checkpoint`)
so that the test suite can rebuild that file from the per-expert one and know it is the very file transformers
writes. Their export check (tools/README.md) is the dense one's with `hf_moe` for `hf`: export_pretrained each of
qwen3_moe and mixtral to /tmp/hfexp_moe/<name> with `source_dir=`, then

    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py --out tests/fixtures/hf_moe --check-export /tmp/hfexp_moe/*

Every fixture directory is self-contained (config.json, generation_config.json, weights, tokenizer.json,
tokenizer_config.json, reference.json, reference_logits.safetensors). Seeds are fixed: a rerun on the same versions
writes the same bytes. Before writing a reference the script reloads what it saved with from_pretrained and checks
the logits again (and the transformers-4 config spelling, the sharded checkpoint, unpadded rows, greedy tokens
against argmax), so the references are the saved files' outputs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shutil
import sys

import safetensors
import safetensors.torch
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

SEED = 1234
MAX_NEW_TOKENS = 8

# The tokenizer's training text: plain sentences and the words the chat templates and prompts use.
CORPUS = (
  "the cat sat on the mat and the dog sat on the log at nine",
  "what is two plus three? the answer is five.",
  "solve for x: x plus four equals ten, so x equals six",
  "system user assistant be brief and four plus six?",
  "\n\n\n",
)

# The right-padded logits batch (rows of different lengths; the longest is past Llama's 16 original positions).
BATCH_TEXTS = (
  "the cat sat on the mat and the dog sat on the log at nine. what is two plus three? the answer is five.",
  "what is two plus three? the answer is five.",
  "solve for x: x plus four",
)
PROMPTS = (
  "the dog sat on the",
  "solve for x: x plus four equals ten, so x equals",
)
CONVERSATION = (
  {"role": "system", "content": "be brief"},
  {"role": "user", "content": "two plus three?"},
  {"role": "assistant", "content": "five."},
  {"role": "user", "content": "and four plus six?"},
)

LLAMA_TEMPLATE = (
  "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
  "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
  "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN_TEMPLATE = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MIXTRAL_TEMPLATE = (
  "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
  "{% else %}[INST] {{ m['content'] }} [/INST]{% endif %}{% endfor %}"
)

MIXTRAL_SPECIALS = ("<s>", "</s>", "[INST]", "[/INST]")
LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|finetune_right_pad_id|>")
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def build_tokenizer(n_trained: int, specials: tuple[str, ...], bos: str | None) -> tokenizers.Tokenizer:
  """A small BPE (Metaspace, a SentencePiece-style word boundary) trained on CORPUS; specials appended at the end of
  the vocabulary as Llama 3 and Qwen do; with `bos`, a post-processor that prepends it (Llama 3's behaviour)."""
  tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
  tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
  trainer = trainers.BpeTrainer(vocab_size=n_trained, special_tokens=["<unk>"], show_progress=False)
  tok.train_from_iterator(list(CORPUS) + [m["content"] for m in CONVERSATION], trainer)
  tok.add_special_tokens(list(specials))
  if bos is not None:
    tok.post_processor = processors.TemplateProcessing(
      single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
  return tok


def family_specs(name: str):
  """(model class, config kwargs, tokenizer, tokenizer_config, chat template in a separate chat_template.jinja)."""
  if name == "llama":
    tok = build_tokenizer(112, LLAMA_SPECIALS, bos="<|begin_of_text|>")
    ids = {t: tok.token_to_id(t) for t in LLAMA_SPECIALS}
    cfg = dict(
      vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
      rope_theta=500000.0,
      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16},
      bos_token_id=ids["<|begin_of_text|>"], eos_token_id=[ids["<|end_of_text|>"], ids["<|eot_id|>"]],
      pad_token_id=ids["<|finetune_right_pad_id|>"])
    tok_cfg = dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>",
                   chat_template=LLAMA_TEMPLATE)
    return transformers.LlamaForCausalLM, transformers.LlamaConfig, cfg, tok, tok_cfg, False
  if name == "qwen2":
    tok = build_tokenizer(96, QWEN_SPECIALS, bos=None)
    ids = {t: tok.token_to_id(t) for t in QWEN_SPECIALS}
    # vocab_size above the tokenizer's size: padded embedding rows, as Qwen's real checkpoints have
    cfg = dict(
      vocab_size=112, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
      rope_theta=1000000.0, use_sliding_window=False,
      bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    tok_cfg = dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=QWEN_TEMPLATE)
    return transformers.Qwen2ForCausalLM, transformers.Qwen2Config, cfg, tok, tok_cfg, False
  if name == "qwen3":
    tok = build_tokenizer(88, QWEN_SPECIALS, bos=None)
    ids = {t: tok.token_to_id(t) for t in QWEN_SPECIALS}
    cfg = dict(
      vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
      rope_theta=1000000.0, use_sliding_window=False,
      bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    tok_cfg = dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    return transformers.Qwen3ForCausalLM, transformers.Qwen3Config, cfg, tok, tok_cfg, True
  if name == "qwen3_moe":
    # 3 layers, layer 1 dense (mlp_only_layers): MoE layers 0 and 2; 4 experts of width 24, top-2, the top-2
    # probabilities not renormalised (norm_topk_prob false, transformers' default); untied head
    _, _, dense, tok, tok_cfg, _ = family_specs("qwen3")  # the qwen3 fixture's tokenizer and attention
    cfg = dict(dense, num_hidden_layers=3, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=24, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1])
    return transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig, cfg, tok, tok_cfg, True
  if name == "mixtral":
    # every layer MoE: 4 experts of width intermediate_size 24, top-2 (always renormalised); head_dim 16 != 32/4;
    # BOS prepended by the tokenizer (Mistral's); no pad token of its own: </s> pads
    tok = build_tokenizer(72, MIXTRAL_SPECIALS, bos="<s>")
    ids = {t: tok.token_to_id(t) for t in MIXTRAL_SPECIALS}
    cfg = dict(
      vocab_size=80, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
      rope_theta=1000000.0, sliding_window=None, num_local_experts=4, num_experts_per_tok=2,
      bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["</s>"])
    tok_cfg = dict(bos_token="<s>", eos_token="</s>", pad_token="</s>", chat_template=MIXTRAL_TEMPLATE)
    return transformers.MixtralForCausalLM, transformers.MixtralConfig, cfg, tok, tok_cfg, False
  raise ValueError(f"unknown family {name!r}")


def randomize(model: torch.nn.Module, seed: int) -> None:
  """Every parameter random, norms and biases included (HF's init leaves norms at 1 and biases at 0, which would
  hide a loader that drops them). Matrices and embeddings N(0, 1/fan_in) (embeddings: 1/hidden, so tied logits
  stay O(1) and fp32 rounding stays far below the 1e-5 parity tolerance; fan_in is the last dim: torch's [out, in],
  and the fused expert tensors' [E, out, in]); norms 1 + N(0, 0.2); biases N(0, 0.3)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in sorted(model.named_parameters()):
      noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
      if "norm" in name:
        p.copy_(1.0 + 0.2 * noise)
      elif name.endswith(".bias"):
        p.copy_(0.3 * noise)
      else:
        p.copy_(noise / p.shape[-1] ** 0.5)


def write_tokenizer(out: pathlib.Path, tok: tokenizers.Tokenizer, tok_cfg: dict, template_file: bool,
                    max_len: int) -> None:
  tok.save(str(out / "tokenizer.json"))
  cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, "clean_up_tokenization_spaces": False,
         **{k: v for k, v in tok_cfg.items() if k != "chat_template"}}
  if template_file:
    (out / "chat_template.jinja").write_text(QWEN_TEMPLATE)
  else:
    cfg["chat_template"] = tok_cfg["chat_template"]
  (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def encode_batch(tok: tokenizers.Tokenizer, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
  rows = [tok.encode(t).ids for t in BATCH_TEXTS]
  T = max(map(len, rows))
  ids = torch.full((len(rows), T), pad_id, dtype=torch.int64)
  mask = torch.zeros((len(rows), T), dtype=torch.int64)
  for b, r in enumerate(rows):
    ids[b, :len(r)] = torch.tensor(r)
    mask[b, :len(r)] = 1
  return ids, mask


@torch.no_grad()
def logits_of(model, ids, mask) -> torch.Tensor:
  return model(input_ids=ids, attention_mask=mask).logits.float()


@torch.no_grad()
def greedy(model, tok: tokenizers.Tokenizer, prompt_ids: list[int], eos_ids: list[int], pad_id: int) -> dict:
  ids = torch.tensor([prompt_ids])
  out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                       eos_token_id=eos_ids, pad_token_id=pad_id, output_scores=True, return_dict_in_generate=True)
  new = out.sequences[0, len(prompt_ids):].tolist()
  margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
  # the same tokens by argmax over a full forward pass without a cache
  seq = list(prompt_ids)
  for t in new:
    nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
    assert nxt == t, f"generate token {t} != full-forward argmax {nxt}"
    seq.append(nxt)
  return {"prompt_ids": list(prompt_ids), "new_ids": new, "new_text": tok.decode(new, skip_special_tokens=False),
          "stopped_at_eos": new[-1] in eos_ids, "min_top2_margin": round(min(margins), 4)}


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
  m = mask.bool()
  return float((a - b).abs()[m].max())


def save_reference(out: pathlib.Path, model, tok, hf_tok, config, *, dtype_on_disk: str, checks: dict) -> None:
  eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
  ids, mask = encode_batch(tok, config.pad_token_id)
  logits = logits_of(model, ids, mask)
  # right padding: each row's non-pad logits equal the row run alone
  for b in range(ids.shape[0]):
    n = int(mask[b].sum())
    alone = logits_of(model, ids[b:b + 1, :n], mask[b:b + 1, :n])
    err = float((alone[0] - logits[b, :n]).abs().max())
    assert err < 1e-5, f"padded row {b} differs from the row alone by {err}"
  safetensors.torch.save_file({"input_ids": ids, "attention_mask": mask, "logits": logits.contiguous()},
                              str(out / "reference_logits.safetensors"), metadata={"format": "pt"})
  # hf_tok (transformers' wrapper of our tokenizer.json) and the raw tokenizer must agree
  for t in BATCH_TEXTS + PROMPTS:
    assert hf_tok(t)["input_ids"] == tok.encode(t).ids, f"transformers and tokenizers disagree on {t!r}"
  chat = hf_tok.apply_chat_template(list(CONVERSATION), tokenize=False, add_generation_prompt=True)
  chat_plain = hf_tok.apply_chat_template(list(CONVERSATION), tokenize=False, add_generation_prompt=False)
  chat_ids = tok.encode(chat, add_special_tokens=False).ids
  prompts = [{"prompt": p, **greedy(model, tok, tok.encode(p).ids, eos, config.pad_token_id)} for p in PROMPTS]
  prompts.append({"prompt": chat, "from_chat": True, **greedy(model, tok, chat_ids, eos, config.pad_token_id)})
  ref = {
    "family": config.model_type,
    "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                 "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                 "python": platform.python_version()},
    "seed": SEED, "dtype_on_disk": dtype_on_disk, "compute_dtype": "float32", "attn_implementation": "eager",
    "special_tokens": {"bos_token_id": config.bos_token_id, "eos_token_ids": eos, "pad_token_id": config.pad_token_id},
    "tokenizer_size": tok.get_vocab_size(with_added_tokens=True), "vocab_size": config.vocab_size,
    "logits": {"file": "reference_logits.safetensors", "texts": list(BATCH_TEXTS), "shape": list(logits.shape),
               "padding": "right", "compare": "positions where attention_mask == 1", "atol": 1e-5,
               "input_ids_encoding": "tokenizer.json, add_special_tokens=True"},
    "generate": {"max_new_tokens": MAX_NEW_TOKENS, "do_sample": False, "batch_size": 1, "eos_token_ids": eos,
                 "prompts": prompts,
                 "note": "new_ids are the tokens after the prompt; prompt_ids already hold any BOS; generation stops "
                         "after the first EOS id (included in new_ids)"},
    "chat": {"messages": list(CONVERSATION), "add_generation_prompt": True, "rendered": chat,
             "rendered_ids": chat_ids, "rendered_without_generation_prompt": chat_plain,
             "ids_encoding": "tokenizer.json, add_special_tokens=False"},
    "checks": checks,
  }
  (out / "reference.json").write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n")


def legacy_config(config_dict: dict) -> dict:
  """The same config in transformers 4's spelling: top-level rope_theta and rope_scaling (None when default)."""
  d = dict(config_dict)
  rope = dict(d.pop("rope_parameters"))
  d["rope_theta"] = rope.pop("rope_theta")
  d["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
  d["transformers_version"] = "4.57.6"
  d["torch_dtype"] = d.pop("dtype", "float32")
  return d


def load(path: pathlib.Path, cls, dtype=torch.float32):
  return cls.from_pretrained(str(path), dtype=dtype, attn_implementation="eager").eval()


def make_family(root: pathlib.Path, name: str) -> None:
  cls, cfg_cls, cfg_kwargs, tok, tok_cfg, template_file = family_specs(name)
  assert tok.get_vocab_size(with_added_tokens=True) <= cfg_kwargs["vocab_size"]
  torch.manual_seed(SEED)
  config = cfg_cls(**cfg_kwargs, attn_implementation="eager")
  model = cls(config).eval()
  randomize(model, SEED)
  out = root / name
  out.mkdir(parents=True)
  model.save_pretrained(str(out))
  write_tokenizer(out, tok, tok_cfg, template_file, config.max_position_embeddings)
  # PreTrainedTokenizerFast wraps tokenizer.json as it is; transformers 5's AutoTokenizer would rebuild Qwen2's
  # byte-level pipeline from the model type and ignore this Metaspace tokenizer's pre-tokenizer
  hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
  ids, mask = encode_batch(tok, config.pad_token_id)
  want = logits_of(model, ids, mask)
  reloaded = load(out, cls)
  checks = {"reload_max_abs_diff": max_diff(logits_of(reloaded, ids, mask), want, mask)}
  assert checks["reload_max_abs_diff"] == 0.0

  # transformers 4's spelling of the same config: it must give the same model
  legacy = legacy_config(json.loads((out / "config.json").read_text()))
  (out / "config_v4.json").write_text(json.dumps(legacy, indent=2, sort_keys=True) + "\n")
  legacy_cfg = cfg_cls.from_dict(legacy, attn_implementation="eager")
  assert legacy_cfg.rope_parameters == config.rope_parameters, (legacy_cfg.rope_parameters, config.rope_parameters)
  legacy_model = cls(legacy_cfg).eval()
  legacy_model.load_state_dict(reloaded.state_dict())
  checks["config_v4_max_abs_diff"] = max_diff(logits_of(legacy_model, ids, mask), want, mask)
  assert checks["config_v4_max_abs_diff"] == 0.0
  if hasattr(config, "num_experts_per_tok"):
    checks["min_router_margin"] = router_margin(reloaded, ids, mask)
    assert checks["min_router_margin"] > 1e-4, "a near-tie in some token's top-k experts: choose another seed"
  save_reference(out, reloaded, tok, hf_tok, reloaded.config, dtype_on_disk="float32", checks=checks)
  if hasattr(config, "num_experts_per_tok"):
    record_fused(out, reloaded, cls, ids, mask, want)

  if name != "qwen3":
    return
  # the same weights sharded (model.safetensors.index.json), and bf16 / fp16 copies on disk
  sharded = root / "qwen3_sharded"
  reloaded.save_pretrained(str(sharded), max_shard_size="40KB")
  write_tokenizer(sharded, tok, tok_cfg, template_file, config.max_position_embeddings)
  shutil.copy(out / "config_v4.json", sharded / "config_v4.json")
  diff = max_diff(logits_of(load(sharded, cls), ids, mask), want, mask)
  assert diff == 0.0
  save_reference(sharded, load(sharded, cls), tok, hf_tok, reloaded.config, dtype_on_disk="float32",
                 checks={**checks, "sharded_vs_single_max_abs_diff": diff})
  for dtype, label in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
    d = root / f"qwen3_{label}"
    load(out, cls).to(dtype).save_pretrained(str(d))
    write_tokenizer(d, tok, tok_cfg, template_file, config.max_position_embeddings)
    # the reference: the rounded weights upcast to fp32 and run in fp32 (what dtype=float32 loading must match)
    upcast = load(d, cls, dtype=torch.float32)
    rounding = max_diff(logits_of(upcast, ids, mask), want, mask)
    save_reference(d, upcast, tok, hf_tok, upcast.config, dtype_on_disk=str(dtype).removeprefix("torch."),
                   checks={"vs_fp32_weights_max_abs_diff": round(rounding, 6)})


@torch.no_grad()
def router_margin(model, ids, mask) -> float:
  """The smallest gap, over non-pad tokens and MoE layers, between a token's k-th and (k+1)-th router probability:
  a near-tie would let fp32 rounding pick other experts than transformers did."""
  out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
  k, m = model.config.num_experts_per_tok, mask.reshape(-1).bool()
  gaps = []
  for logits in out.router_logits:
    top = torch.softmax(logits.float(), -1).topk(k + 1, dim=-1).values[m]
    gaps.append(float((top[:, k - 1] - top[:, k]).min()))
  return round(min(gaps), 6)


def record_fused(out: pathlib.Path, model, cls, ids, mask, want) -> None:
  """Saves `model` in transformers 5's fused expert layout (save_original_format=False) to a scratch directory,
  checks from_pretrained gives the same logits, and records that file's tensors (name: shape, dtype, sha256 of the
  little-endian bytes) as `fused_checkpoint` in reference.json."""
  import hashlib
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp, save_original_format=False)
    tensors = safetensors.torch.load_file(str(pathlib.Path(tmp) / "model.safetensors"))
    assert any(n.endswith(".mlp.experts.gate_up_proj") for n in tensors), sorted(tensors)
    diff = max_diff(logits_of(load(pathlib.Path(tmp), cls), ids, mask), want, mask)
    assert diff == 0.0, diff
  ref = json.loads((out / "reference.json").read_text())
  ref["fused_checkpoint"] = {
    "what": "the tensors of this model saved by save_pretrained(save_original_format=False) (transformers 5's fused "
            "in-memory expert layout); from_pretrained of that file gives these reference logits exactly",
    "logits_max_abs_diff": diff,
    "tensors": {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                    "sha256": hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()}
                for n, t in sorted(tensors.items())}}
  (out / "reference.json").write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def check_export(exported: pathlib.Path, fixture: pathlib.Path) -> dict:
  """Loads a directory scalerl_jax's export_pretrained wrote (from `fixture`'s weights) with transformers and checks
  it is the fixture's model: same class and config, the reference logits, the same tokenizer ids, the same greedy
  tokens. Records the result as `export_check` in the fixture's reference.json."""
  ref = json.loads((fixture / "reference.json").read_text())
  want = safetensors.torch.load_file(str(fixture / "reference_logits.safetensors"))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32,
                                                            attn_implementation="eager").eval()
  theirs = transformers.AutoConfig.from_pretrained(str(fixture))
  skip = {"transformers_version", "_name_or_path", "architectures"}
  ours_d, theirs_d = transformers.AutoConfig.from_pretrained(str(exported)).to_dict(), theirs.to_dict()
  config_diff = sorted(k for k in set(ours_d) | set(theirs_d) - skip
                       if k not in skip and ours_d.get(k) != theirs_d.get(k))
  assert type(model).__name__ == theirs.architectures[0], (type(model).__name__, theirs.architectures)
  assert not config_diff, f"config differs from the fixture's in {config_diff}"
  diff = max_diff(logits_of(model, want["input_ids"], want["attention_mask"]), want["logits"], want["attention_mask"])
  assert diff < ref["logits"]["atol"], f"{exported}: logits differ from {fixture}'s reference by {diff}"
  hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(exported))
  rows = [hf_tok(t)["input_ids"] for t in ref["logits"]["texts"]]
  assert rows == [r[:int(m.sum())] for r, m in zip(want["input_ids"].tolist(), want["attention_mask"])]
  tok = tokenizers.Tokenizer.from_file(str(exported / "tokenizer.json"))
  eos, pad = ref["special_tokens"]["eos_token_ids"], ref["special_tokens"]["pad_token_id"]
  for p in ref["generate"]["prompts"]:
    got = greedy(model, tok, p["prompt_ids"], eos, pad)["new_ids"]
    assert got == p["new_ids"], f"{exported}: greedy tokens {got} != the fixture's {p['new_ids']}"
  ref["export_check"] = {
    "what": "scalerl_jax's export_pretrained of this fixture's params (tools/README.md), loaded by transformers' "
            "AutoModelForCausalLM: same class and config, these reference logits, tokenizer ids and greedy tokens",
    "dtype_on_disk": str(ours_d["dtype"]).removeprefix("torch."), "compute_dtype": "float32",
    "logits_max_abs_diff": diff, "config_equal": True, "tokenizer_ids_equal": True, "greedy_equal": True,
    "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
  (fixture / "reference.json").write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n")
  return ref["export_check"]


def check_peft(d: pathlib.Path, fixture: pathlib.Path) -> dict:
  """Loads `d`/adapter (scalerl_jax's export_peft of adapters on `fixture`'s weights) onto the fixture with peft's
  PeftModel, and `d`/merged (scalerl_jax's merge of the same adapters, exported) with transformers: the two give the
  same logits, which differ from the fixture's own (the adapters act), and peft's merge_and_unload gives the merged
  export's weights. Records the result as `peft_check` in the fixture's reference.json."""
  import peft
  ref = json.loads((fixture / "reference.json").read_text())
  want = safetensors.torch.load_file(str(fixture / "reference_logits.safetensors"))
  ids, mask = want["input_ids"], want["attention_mask"]
  base = transformers.AutoModelForCausalLM.from_pretrained(str(fixture), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
  adapted = peft.PeftModel.from_pretrained(base, str(d / "adapter")).eval()
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(d / "merged"), dtype=torch.float32,
                                                             attn_implementation="eager").eval()
  with torch.no_grad():
    peft_logits = adapted(input_ids=ids, attention_mask=mask).logits
  diff = max_diff(peft_logits, logits_of(merged, ids, mask), mask)
  moved = max_diff(peft_logits, want["logits"], mask)
  assert diff < 1e-4, f"{d}: PEFT's adapted logits differ from the merged export's by {diff}"
  assert moved > 1e-2, f"{d}: the adapters do not change the logits ({moved})"
  unloaded = adapted.merge_and_unload().state_dict()
  weights = max(float((unloaded[k] - v).abs().max()) for k, v in merged.state_dict().items())
  assert weights < 1e-5, f"{d}: merge_and_unload's weights differ from the merged export's by {weights}"
  config = json.loads((d / "adapter" / "adapter_config.json").read_text())
  ref["peft_check"] = {
      "what": "scalerl_jax's export_peft of random adapters on this fixture (tools/README.md), loaded by "
              "peft.PeftModel onto it: its logits against scalerl_jax's merged export loaded by transformers, and "
              "merge_and_unload's weights against the merged export's",
      "r": config["r"], "lora_alpha": config["lora_alpha"], "target_modules": config["target_modules"],
      "logits_max_abs_diff": diff, "adapters_move_logits_by": moved, "merged_weights_max_abs_diff": weights,
      "versions": {"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__}}
  (fixture / "reference.json").write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n")
  return ref["peft_check"]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="tests/fixtures/hf", help="fixture root; each family's directories in it are replaced")
  ap.add_argument("--families", default="llama,qwen2,qwen3", help="also: qwen3_moe, mixtral")
  ap.add_argument("--check-export", nargs="+", metavar="DIR", help="instead: check exported directories with "
                  "transformers, each against the fixture of its name in --out (DIR/../qwen3 -> OUT/qwen3), and "
                  "record the result in that fixture's reference.json")
  ap.add_argument("--check-peft", nargs="+", metavar="DIR", help="instead: check DIR/adapter (a PEFT export) and "
                  "DIR/merged with peft and transformers against the fixture of DIR's name; record it likewise")
  args = ap.parse_args()
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
  root = pathlib.Path(args.out)
  if args.check_export:
    for d in map(pathlib.Path, args.check_export):
      print(f"{d}: {json.dumps(check_export(d, root / d.name))}", file=sys.stderr)
    return
  if args.check_peft:
    for d in map(pathlib.Path, args.check_peft):
      print(f"{d}: {json.dumps(check_peft(d, root / d.name))}", file=sys.stderr)
    return
  for name in args.families.split(","):
    for d in root.glob(f"{name}*"):
      shutil.rmtree(d)
    make_family(root, name)
    print(f"wrote {root / name}", file=sys.stderr)


if __name__ == "__main__":
  main()
