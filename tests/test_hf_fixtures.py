"""The committed Hugging Face parity fixtures (tests/fixtures/hf, written by tools/make_hf_fixtures.py) are complete
and consistent, so the loader's parity tests can rely on them. No torch, no network: headers are read as bytes and
tensors with the safetensors numpy API; ids are re-derived with `tokenizers` from each fixture's tokenizer.json."""

import json
import pathlib
import struct

import numpy as np
import pytest
import tokenizers
from safetensors import safe_open
from safetensors.numpy import load_file

ROOT = pathlib.Path(__file__).parent / "fixtures" / "hf"
# fixture directory -> (family, dtype of every weight on disk, sharded)
FIXTURES = {
  "llama": ("llama", "F32", False),
  "qwen2": ("qwen2", "F32", False),
  "qwen3": ("qwen3", "F32", False),
  "qwen3_sharded": ("qwen3", "F32", True),
  "qwen3_bf16": ("qwen3", "BF16", False),
  "qwen3_fp16": ("qwen3", "F16", False),
}
CONFIG_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
COMMON_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "reference.json",
                "reference_logits.safetensors")
MAX_NEW_TOKENS = 8


def read_json(path: pathlib.Path) -> dict:
  return json.loads(path.read_text())


def header(path: pathlib.Path) -> dict:
  """A safetensors header: {name: {dtype, shape, data_offsets}} (no __metadata__)."""
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    h = json.loads(f.read(n))
  h.pop("__metadata__", None)
  return h


def weight_files(d: pathlib.Path) -> list[pathlib.Path]:
  index = d / "model.safetensors.index.json"
  if index.exists():
    return [d / s for s in sorted(set(read_json(index)["weight_map"].values()))]
  return [d / "model.safetensors"]


def all_headers(d: pathlib.Path) -> dict:
  out = {}
  for f in weight_files(d):
    h = header(f)
    assert not out.keys() & h.keys(), f"{f.name}: tensors stored twice"
    out.update(h)
  return out


def expected_shapes(cfg: dict) -> dict[str, list[int]]:
  """Every tensor a transformers checkpoint of this family holds, with its shape, from config.json alone."""
  D, V, F = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
  H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
  hd = cfg.get("head_dim") or D // H
  shapes = {"model.embed_tokens.weight": [V, D], "model.norm.weight": [D]}
  if not cfg["tie_word_embeddings"]:
    shapes["lm_head.weight"] = [V, D]
  for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    shapes |= {p + "input_layernorm.weight": [D], p + "post_attention_layernorm.weight": [D],
               p + "self_attn.q_proj.weight": [H * hd, D], p + "self_attn.k_proj.weight": [K * hd, D],
               p + "self_attn.v_proj.weight": [K * hd, D], p + "self_attn.o_proj.weight": [D, H * hd],
               p + "mlp.gate_proj.weight": [F, D], p + "mlp.up_proj.weight": [F, D], p + "mlp.down_proj.weight": [D, F]}
    if cfg["model_type"] == "qwen2":  # Qwen2 always has q/k/v biases (no config key says so)
      shapes |= {p + "self_attn.q_proj.bias": [H * hd], p + "self_attn.k_proj.bias": [K * hd],
                 p + "self_attn.v_proj.bias": [K * hd]}
    if cfg["model_type"] == "qwen3":  # QK-norm over head_dim
      shapes |= {p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]}
  return shapes


def eos_ids(cfg: dict) -> list[int]:
  e = cfg["eos_token_id"]
  return e if isinstance(e, list) else [e]


def test_the_fixture_set_is_exactly_the_documented_one():
  assert sorted(p.name for p in ROOT.iterdir() if p.is_dir()) == sorted(FIXTURES)
  total = sum(f.stat().st_size for f in ROOT.rglob("*") if f.is_file())
  assert total < 2_000_000, f"fixtures grew to {total} bytes"


@pytest.mark.parametrize("name", FIXTURES)
def test_files_present(name):
  d = ROOT / name
  for f in COMMON_FILES:
    assert (d / f).is_file(), f"{name}/{f} missing"
  for f in weight_files(d):
    assert f.is_file(), f"{name}/{f.name} missing"
  assert FIXTURES[name][2] == (d / "model.safetensors.index.json").exists() != (d / "model.safetensors").exists()
  # the chat template in exactly one place: tokenizer_config.json or chat_template.jinja
  in_config = "chat_template" in read_json(d / "tokenizer_config.json")
  assert in_config != (d / "chat_template.jinja").exists()
  if FIXTURES[name][1] == "F32":
    assert (d / "config_v4.json").is_file()


@pytest.mark.parametrize("name", FIXTURES)
def test_config_keys_per_family(name):
  family, dtype, _ = FIXTURES[name]
  cfg = read_json(ROOT / name / "config.json")
  assert cfg["model_type"] == family and cfg["dtype"] == CONFIG_DTYPE[dtype]
  assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (2, 4, 2)
  rope = cfg["rope_parameters"]  # transformers 5's spelling
  assert "rope_theta" not in cfg and "rope_scaling" not in cfg
  if family == "llama":
    assert rope == {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    assert cfg["max_position_embeddings"] == 64 and cfg["tie_word_embeddings"] is False
    assert len(eos_ids(cfg)) == 2  # Llama 3: <|end_of_text|> and <|eot_id|>
  else:
    assert rope == {"rope_type": "default", "rope_theta": 1000000.0}
    assert cfg["tie_word_embeddings"] is True and cfg["use_sliding_window"] is False
    assert set(cfg["layer_types"]) == {"full_attention"}
  if family == "qwen3":
    assert cfg["head_dim"] == 16 != cfg["hidden_size"] // cfg["num_attention_heads"]
  gen = read_json(ROOT / name / "generation_config.json")
  assert eos_ids(gen) == eos_ids(cfg) and gen["pad_token_id"] == cfg["pad_token_id"]


@pytest.mark.parametrize("name", [n for n, (_, dtype, _) in FIXTURES.items() if dtype == "F32"])
def test_transformers4_config_spells_the_same_rope(name):
  cfg, old = read_json(ROOT / name / "config.json"), read_json(ROOT / name / "config_v4.json")
  assert "rope_parameters" not in old
  rope = dict(cfg["rope_parameters"])
  assert old["rope_theta"] == rope.pop("rope_theta")
  assert old["rope_scaling"] == (None if rope["rope_type"] == "default" else rope)
  same = {k for k in cfg if k not in ("rope_parameters", "dtype", "transformers_version")}
  assert {k: old[k] for k in same} == {k: cfg[k] for k in same}


@pytest.mark.parametrize("name", FIXTURES)
def test_weights_match_the_config(name):
  d = ROOT / name
  cfg = read_json(d / "config.json")
  h = all_headers(d)
  assert {k: v["shape"] for k, v in h.items()} == expected_shapes(cfg)
  assert {v["dtype"] for v in h.values()} == {FIXTURES[name][1]}
  for f in weight_files(d):  # readable with the numpy API (bf16 has no numpy dtype: keys only)
    with safe_open(str(f), framework="numpy") as st:
      assert set(st.keys()) == set(header(f))
      if FIXTURES[name][1] != "BF16":
        for k in st.keys():
          assert np.isfinite(st.get_tensor(k)).all(), k


def test_sharded_index_names_existing_shards_and_equals_the_single_file():
  d = ROOT / "qwen3_sharded"
  index = read_json(d / "model.safetensors.index.json")
  shards = sorted(set(index["weight_map"].values()))
  assert len(shards) > 1
  for s in shards:
    assert (d / s).is_file(), s
    assert set(header(d / s)) == {k for k, v in index["weight_map"].items() if v == s}
  assert sorted(p.name for p in d.glob("*.safetensors") if p.name != "reference_logits.safetensors") == shards
  assert index["metadata"]["total_size"] == sum(np.prod(v["shape"]) * 4 for v in all_headers(d).values())
  single = load_file(str(ROOT / "qwen3" / "model.safetensors"))
  sharded = {k: v for s in shards for k, v in load_file(str(d / s)).items()}
  assert single.keys() == sharded.keys()
  for k in single:
    np.testing.assert_array_equal(sharded[k], single[k], err_msg=k)


def bf16_bits(path: pathlib.Path) -> dict[str, np.ndarray]:
  """A BF16 file's tensors as their raw uint16 bits (numpy has no bfloat16)."""
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    h = json.loads(f.read(n))
    data = f.read()
  h.pop("__metadata__", None)
  return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<u2").reshape(v["shape"])
          for k, v in h.items()}


def test_half_precision_copies_are_the_fp32_weights_rounded():
  fp32 = load_file(str(ROOT / "qwen3" / "model.safetensors"))
  fp16 = load_file(str(ROOT / "qwen3_fp16" / "model.safetensors"))
  bf16 = bf16_bits(ROOT / "qwen3_bf16" / "model.safetensors")
  assert fp32.keys() == fp16.keys() == bf16.keys()
  for k, w in fp32.items():
    np.testing.assert_array_equal(fp16[k], w.astype(np.float16), err_msg=k)
    bits = w.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    np.testing.assert_array_equal(bf16[k], rounded, err_msg=k)
  assert any((fp16[k].astype(np.float32) != w).any() for k, w in fp32.items())  # the copies really were rounded


@pytest.mark.parametrize("name", FIXTURES)
def test_reference_logits(name):
  d = ROOT / name
  cfg, ref = read_json(d / "config.json"), read_json(d / "reference.json")
  t = load_file(str(d / "reference_logits.safetensors"))
  assert set(t) == {"input_ids", "attention_mask", "logits"}
  ids, mask, logits = t["input_ids"], t["attention_mask"], t["logits"]
  B, T = ids.shape
  assert ids.dtype == mask.dtype == np.int64 and mask.shape == (B, T) and B == 3
  assert logits.dtype == np.float32 and logits.shape == (B, T, cfg["vocab_size"]) and list(logits.shape) == ref[
    "logits"]["shape"]
  lengths = mask.sum(1)
  for b in range(B):  # right-padded: ones then zeros, pads hold pad_token_id
    assert (mask[b, :lengths[b]] == 1).all() and (mask[b, lengths[b]:] == 0).all()
    assert (ids[b, lengths[b]:] == cfg["pad_token_id"]).all()
  assert lengths.max() == T and lengths.min() < T
  assert np.isfinite(logits[mask == 1]).all() and logits[mask == 1].std() > 0.1
  if cfg["model_type"] == "llama":  # positions past the original context of the Llama-3 rope scaling
    assert T > cfg["rope_parameters"]["original_max_position_embeddings"]
  assert T <= cfg["max_position_embeddings"]


def test_dtype_copies_differ_from_fp32_only_by_rounding():
  want = load_file(str(ROOT / "qwen3" / "reference_logits.safetensors"))
  same = load_file(str(ROOT / "qwen3_sharded" / "reference_logits.safetensors"))
  for k in want:
    np.testing.assert_array_equal(same[k], want[k])
  m = want["attention_mask"] == 1
  for name in ("qwen3_bf16", "qwen3_fp16"):
    got = load_file(str(ROOT / name / "reference_logits.safetensors"))
    np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
    diff = np.abs(got["logits"] - want["logits"])[m].max()
    assert 0 < diff < 0.2, (name, diff)


@pytest.mark.parametrize("name", FIXTURES)
def test_tokenizer_reproduces_the_reference_ids(name):
  d = ROOT / name
  cfg, ref, tok_cfg = (read_json(d / f) for f in ("config.json", "reference.json", "tokenizer_config.json"))
  tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
  assert tok.get_vocab_size(with_added_tokens=True) == ref["tokenizer_size"] <= cfg["vocab_size"]
  t = load_file(str(d / "reference_logits.safetensors"))
  for b, text in enumerate(ref["logits"]["texts"]):
    row = tok.encode(text).ids
    assert t["input_ids"][b, :len(row)].tolist() == row and t["attention_mask"][b].sum() == len(row)
  prompts = ref["generate"]["prompts"]
  for p in prompts:
    add = not p.get("from_chat", False)
    assert tok.encode(p["prompt"], add_special_tokens=add).ids == p["prompt_ids"]
  chat = ref["chat"]
  assert tok.encode(chat["rendered"], add_special_tokens=False).ids == chat["rendered_ids"]
  assert [p["prompt_ids"] for p in prompts if p.get("from_chat")] == [chat["rendered_ids"]]
  # special tokens: the tokenizer's names and the config's ids agree
  assert tok.token_to_id(tok_cfg["pad_token"]) == cfg["pad_token_id"] == ref["special_tokens"]["pad_token_id"]
  assert tok.token_to_id(tok_cfg["eos_token"]) in eos_ids(cfg) == ref["special_tokens"]["eos_token_ids"]
  if cfg["model_type"] == "llama":  # Llama 3's post-processor prepends BOS
    assert tok_cfg["bos_token"] == "<|begin_of_text|>" and tok.token_to_id("<|begin_of_text|>") == cfg["bos_token_id"]
    assert t["input_ids"][:, 0].tolist() == [cfg["bos_token_id"]] * 3
  else:
    assert tok_cfg["bos_token"] is None and cfg["bos_token_id"] not in t["input_ids"][:, 0]


@pytest.mark.parametrize("name", FIXTURES)
def test_chat_template_and_rendering(name):
  d = ROOT / name
  tok_cfg, ref = read_json(d / "tokenizer_config.json"), read_json(d / "reference.json")
  template = tok_cfg.get("chat_template") or (d / "chat_template.jinja").read_text()
  assert "add_generation_prompt" in template and "messages" in template
  chat = ref["chat"]
  assert chat["add_generation_prompt"] is True and len(chat["messages"]) == 4
  assert chat["rendered"].startswith(chat["rendered_without_generation_prompt"])
  assert len(chat["rendered"]) > len(chat["rendered_without_generation_prompt"])
  for m in chat["messages"]:
    assert m["content"] in chat["rendered"]
  tail = chat["rendered"][len(chat["rendered_without_generation_prompt"]):]
  assert "assistant" in tail


@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_references(name):
  d = ROOT / name
  cfg, ref = read_json(d / "config.json"), read_json(d / "reference.json")
  assert set(ref["versions"]) >= {"transformers", "torch", "tokenizers", "safetensors"}
  assert ref["dtype_on_disk"] == CONFIG_DTYPE[FIXTURES[name][1]] and ref["attn_implementation"] == "eager"
  gen = ref["generate"]
  assert gen["max_new_tokens"] == MAX_NEW_TOKENS and gen["do_sample"] is False and gen["eos_token_ids"] == eos_ids(cfg)
  assert len(gen["prompts"]) == 3
  for p in gen["prompts"]:
    new = p["new_ids"]
    assert 1 <= len(new) <= MAX_NEW_TOKENS and all(0 <= i < cfg["vocab_size"] for i in new)
    assert not set(new[:-1]) & set(eos_ids(cfg)), "generation goes on past an EOS"
    assert p["stopped_at_eos"] == (new[-1] in eos_ids(cfg))
    assert p["stopped_at_eos"] or len(new) == MAX_NEW_TOKENS
    assert len(p["prompt_ids"]) + MAX_NEW_TOKENS <= cfg["max_position_embeddings"]
    assert p["min_top2_margin"] > 1e-3  # greedy ties would make token parity depend on rounding
