"""Writes the GGUF fixture of issue 28 (item 1): a tiny random Llama-architecture checkpoint with a SmolLM2-style
tokenizer, converted as llama.cpp's convert_hf_to_gguf.py converts a Hugging Face checkpoint (Q/K rows permuted for
GGML's rope, the vocabulary as tokenizer.ggml.* keys), in F32, Q8_0 and Q4_1. Runs in the project's venv (numpy,
tokenizers and the gguf package's GGUFWriter + gguf.quants.quantize; no torch):

    .venv/bin/python tools/make_gguf_fixture.py --out tests/fixtures/gguf

It writes `tiny-llama-{F32,Q8_0,Q4_1}.gguf` and `source/`, the Hugging Face tokenizer the GGUFs' vocabulary was
taken from (tokenizer.json: byte-level BPE with SmolLM2's pre-tokenizer, digits split one by one before GPT-2's
regex; tokenizer_config.json with SmolLM2's ChatML template): the reference tests/test_gguf.py compares the loaded
tokenizer's ids with. Seeds are fixed: a rerun writes the same bytes.

`write_gguf` is also the tests' writer for variants written to a temporary directory (other tensor types, qwen2 /
qwen3, refused metadata), so that every GGUF the suite reads is produced by one converter.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any, Mapping, Optional

import gguf
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from scalerl_jax.model.gguf import BLOCK_NAMES, GLOBAL_NAMES, permute

SEED = 28
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # SmolLM2's first three ids: 0, 1, 2
USER_DEFINED = ("<think>", "</think>")  # added, not special: llama.cpp's USER_DEFINED token type
# SmolLM2-135M-Instruct's chat template
CHAT_TEMPLATE = (
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
  "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
  "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = (
  "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
  "system user assistant: what is 17 + 25? The answer is 42. Put it in \\boxed{42}.",
  "the cat sat on the mat and the dog sat on the log, 2024-11-05 at 10:30",
  "héllo wörld, naïve café; 日本語のテキスト ✓ 🙂",
  "def add(a, b):\n    return a + b\n\n",
)
# the tiny model: every row a multiple of the Q8_0 / Q4_1 block (32)
CONFIG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=64,
              tie_word_embeddings=True)
FILE_TYPES = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
              "BF16": gguf.LlamaFileType.MOSTLY_BF16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
              "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1}


def build_tokenizer() -> tokenizers.Tokenizer:
  """A byte-level BPE trained on CORPUS, laid out as SmolLM2's tokenizer.json: specials at ids 0..2, the 256 byte
  symbols, merges; pre-tokenizer Digits(individual) + ByteLevel (GPT-2's regex), ByteLevel decoder. It is trained
  under GPT-2's split alone, so the vocabulary holds multi-digit tokens ("17", "42") that the digit split never
  produces: a tokenizer that missed the digit split encodes numbers differently (tests/test_gguf.py checks so)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=list(SPECIALS), show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(list(CORPUS), trainer)
  tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in USER_DEFINED])
  return tok


def vocab_metadata(tok: tokenizers.Tokenizer) -> tuple[list[str], list[int], list[str]]:
  """(tokens by id, token types, merges as 'a b') as convert_hf_to_gguf.py writes a gpt2-model vocabulary: special
  added tokens CONTROL, other added tokens USER_DEFINED, the rest NORMAL."""
  spec = json.loads(tok.to_str())
  vocab = tok.get_vocab(with_added_tokens=True)
  tokens = [""] * len(vocab)
  for t, i in vocab.items():
    tokens[i] = t
  added = {a["id"]: a for a in spec["added_tokens"]}
  types = [int(gguf.TokenType.NORMAL)] * len(tokens)
  for i, a in added.items():
    types[i] = int(gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED)
  merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
  return tokens, types, merges


def random_weights(config: Mapping[str, Any], vocab_size: int, seed: int = SEED, *, qkv_bias: bool = False,
                   qk_norm: bool = False) -> dict[str, np.ndarray]:
  """Hugging Face-named float32 tensors of a random dense decoder (torch's [out, in] layout); projections with
  std 1/sqrt(fan_in), an embedding of std 1 and norm scales near 1, so logits spread over several units."""
  rng = np.random.default_rng(seed)
  D, F, H = config["hidden_size"], config["intermediate_size"], config["head_dim"]
  Q, K = config["num_attention_heads"], config["num_key_value_heads"]
  lin = lambda o, i: (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
  scale = lambda n: (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)
  out = {"model.embed_tokens.weight": rng.standard_normal((vocab_size, D)).astype(np.float32),
         "model.norm.weight": scale(D)}
  if not config["tie_word_embeddings"]:
    out["lm_head.weight"] = lin(vocab_size, D)
  for i in range(config["num_hidden_layers"]):
    L = f"model.layers.{i}."
    out.update({L + "input_layernorm.weight": scale(D), L + "post_attention_layernorm.weight": scale(D),
                L + "self_attn.q_proj.weight": lin(Q * H, D), L + "self_attn.k_proj.weight": lin(K * H, D),
                L + "self_attn.v_proj.weight": lin(K * H, D), L + "self_attn.o_proj.weight": lin(D, Q * H),
                L + "mlp.gate_proj.weight": lin(F, D), L + "mlp.up_proj.weight": lin(F, D),
                L + "mlp.down_proj.weight": lin(D, F)})
    if qkv_bias:
      out.update({L + f"self_attn.{p}_proj.bias": (0.1 * rng.standard_normal(n * H)).astype(np.float32)
                  for p, n in (("q", Q), ("k", K), ("v", K))})
    if qk_norm:
      out.update({L + "self_attn.q_norm.weight": scale(H), L + "self_attn.k_norm.weight": scale(H)})
  return out


def _gguf_names() -> dict[str, str]:
  return {**{h: g for g, h in GLOBAL_NAMES.items()}, **{h: g for g, h in BLOCK_NAMES.items()}}


def gguf_tensor_name(hf_name: str) -> str:
  names = _gguf_names()
  if hf_name in names:
    return names[hf_name]
  _, _, i, rest = hf_name.split(".", 3)
  return f"blk.{i}.{names[rest]}"


def write_gguf(path: str | pathlib.Path, tensors: Mapping[str, Any], config: Mapping[str, Any],
               tok: tokenizers.Tokenizer, *, qtype: str = "F32", arch: str = "llama", pre: str = "smollm",
               chat_template: Optional[str] = CHAT_TEMPLATE, ids: Mapping[str, int] = None,
               metadata: Mapping[str, Any] = None, drop: tuple[str, ...] = ()) -> pathlib.Path:
  """A GGUF file of Hugging Face-named `tensors` as llama.cpp's converter writes it: names mapped, llama's
  q_proj / k_proj rows permuted, 2-D weights quantized to `qtype` (1-D norms and biases stay F32, as llama.cpp keeps
  them), the config as `<arch>.*` keys and the tokenizer as tokenizer.ggml.* keys. A tensor given as (uint8 bytes
  [rows, bytes per row], type name) is written as those raw blocks (types gguf cannot quantize: the k-quants).
  `ids`: bos / eos / pad token ids (default SmolLM2's 1 / 2 / 2); `metadata`: further keys as {key: value} (str,
  int, float, bool) to add or override; `drop`: keys to leave out."""
  path = pathlib.Path(path)
  ids = dict(ids or {"bos": 1, "eos": 2, "pad": 2})
  tokens, types, merges = vocab_metadata(tok)
  Q, K, H = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
  keys: dict[str, Any] = {
      "general.name": "tiny-llama-gguf-fixture",
      "general.file_type": int(FILE_TYPES.get(qtype, gguf.LlamaFileType.GUESSED)),
      "general.quantization_version": gguf.GGML_QUANT_VERSION,
      f"{arch}.context_length": config["max_position_embeddings"], f"{arch}.embedding_length": config["hidden_size"],
      f"{arch}.block_count": config["num_hidden_layers"], f"{arch}.feed_forward_length": config["intermediate_size"],
      f"{arch}.attention.head_count": Q, f"{arch}.attention.head_count_kv": K,
      f"{arch}.rope.dimension_count": H, f"{arch}.rope.freq_base": float(config["rope_theta"]),
      f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]), f"{arch}.vocab_size": len(tokens),
      "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
      "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
      "tokenizer.ggml.bos_token_id": ids["bos"], "tokenizer.ggml.eos_token_id": ids["eos"],
      "tokenizer.ggml.padding_token_id": ids["pad"], "tokenizer.ggml.add_bos_token": False}
  if H * Q != config["hidden_size"]:
    keys.update({f"{arch}.attention.key_length": H, f"{arch}.attention.value_length": H})
  if chat_template is not None:
    keys["tokenizer.chat_template"] = chat_template
  keys.update(metadata or {})
  w = gguf.GGUFWriter(str(path), arch=arch)  # writes general.architecture
  for key, value in keys.items():
    if key in drop:
      continue
    if isinstance(value, list):
      w.add_array(key, value)
    elif isinstance(value, str):
      w.add_string(key, value)
    elif isinstance(value, bool):
      w.add_bool(key, value)
    elif isinstance(value, float):
      w.add_float32(key, value)
    else:
      w.add_uint32(key, int(value))
  for hf_name, x in tensors.items():
    raw = isinstance(x, tuple)
    data, kind = (x[0], x[1]) if raw else (np.asarray(x, np.float32), qtype)
    if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
      data = permute(data, Q if "q_proj" in hf_name else K)
    if not raw and data.ndim == 1:
      kind = "F32"
    qt = gguf.GGMLQuantizationType[kind]
    if raw:
      w.add_tensor(gguf_tensor_name(hf_name), np.ascontiguousarray(data, np.uint8), raw_dtype=qt)
    elif kind in ("F32", "F16"):
      w.add_tensor(gguf_tensor_name(hf_name), gguf.quants.quantize(data, qt))
    else:
      w.add_tensor(gguf_tensor_name(hf_name), gguf.quants.quantize(data, qt), raw_dtype=qt)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def write_source(out: pathlib.Path, tok: tokenizers.Tokenizer) -> None:
  """The Hugging Face tokenizer the GGUFs' vocabulary comes from (the tests' reference)."""
  out.mkdir(parents=True, exist_ok=True)
  (out / "tokenizer.json").write_text(json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n")
  tok_cfg = {"add_prefix_space": False, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
             "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
             "clean_up_tokenization_spaces": False, "model_max_length": CONFIG["max_position_embeddings"],
             "tokenizer_class": "GPT2Tokenizer", "vocab_size": tok.get_vocab_size()}
  (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, type=pathlib.Path)
  args = p.parse_args(argv)
  tok = build_tokenizer()
  write_source(args.out / "source", tok)
  weights = random_weights(CONFIG, tok.get_vocab_size())
  for qtype in ("F32", "Q8_0", "Q4_1"):
    f = write_gguf(args.out / f"tiny-llama-{qtype}.gguf", weights, CONFIG, tok, qtype=qtype)
    print(f"{f}: {f.stat().st_size} bytes")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
