"""Hugging Face checkpoints in (scalerl_jax/model/hf.py) against the committed transformers fixtures
(tests/fixtures/hf, tools/README.md): config mapping, logit parity per family and rope spelling, sharded and
half-precision files, loading straight into an fsdp=4 x tensor=2 layout without reading a sharded tensor whole,
greedy tokens, and every bad-input error naming its file and tensor or key. No torch."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import scalerl_jax
from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import InterruptionConfig, OptimizerConfig, RolloutConfig
from scalerl_jax.mesh import make_mesh
from scalerl_jax.model import hf
from scalerl_jax.model.hf import HFCheckpointError, hf_model_config, hf_name_map, load_pretrained
from scalerl_jax.rollout.engine import Engine
from scalerl_jax.model import next_token_loss
from scalerl_jax.rollout.sampling import GREEDY
from scalerl_jax.train.state import init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step

ROOT = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ("llama", "qwen2", "qwen3")
ALL = FAMILIES + ("qwen3_sharded", "qwen3_bf16", "qwen3_fp16")
ATOL = 1e-5


def reference(name, root=ROOT):
  return load_file(str(root / name / "reference_logits.safetensors"))


def max_err(model, name, root=ROOT) -> float:
  """The largest |logit - transformers' logit| of `model` on fixture `name`'s unpadded positions."""
  ref = reference(name, root)
  got = np.asarray(model.logits(ref["input_ids"]))
  assert got.dtype == np.float32 and got.shape == ref["logits"].shape
  return float(np.abs(got - ref["logits"])[ref["attention_mask"] == 1].max())


@pytest.fixture(scope="module")
def loaded():
  cache = {}

  def get(name):
    if name not in cache:
      cache[name] = load_pretrained(ROOT / name)
    return cache[name]
  return get


def flat(params):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_config_mapping():
  llama, qwen2, qwen3 = (hf_model_config(ROOT / n) for n in FAMILIES)
  assert (llama.hidden, llama.intermediate, llama.num_layers, llama.num_heads, llama.num_kv_heads, llama.head_dim,
          llama.vocab_size) == (64, 96, 2, 4, 2, 16, 128)
  assert (llama.rope_theta, llama.rope_scaling, llama.rope_factor, llama.rope_low_freq_factor,
          llama.rope_high_freq_factor, llama.rope_original_max_positions) == (500000.0, "llama3", 8.0, 1.0, 4.0, 16)
  assert not llama.tie_embeddings and llama.norm_eps == 1e-5 and llama.max_seq_len == 64
  assert not llama.qkv_bias and not llama.qk_norm
  assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.tie_embeddings and qwen2.head_dim == 12  # hidden / heads
  assert qwen2.rope_scaling == "default" and qwen2.rope_theta == 1e6 and qwen2.norm_eps == 1e-6
  assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.head_dim == 16 != qwen3.hidden // qwen3.num_heads
  assert hf_model_config(ROOT / "qwen3", max_seq_len=40).max_seq_len == 40
  as_dict = json.loads((ROOT / "qwen3" / "config.json").read_text())
  assert hf_model_config(as_dict) == qwen3 == hf_model_config(ROOT / "qwen3" / "config.json")
  assert scalerl_jax.load_pretrained is load_pretrained and scalerl_jax.hf_model_config is hf_model_config


@pytest.mark.parametrize("name", ALL)
def test_logits_match_transformers(loaded, name):
  """fp32 parity on every non-pad position. The bf16 / fp16 references are transformers running the rounded
  weights in fp32, so loading them as float32 (exact: both widen losslessly) keeps the fp32 tolerance."""
  err = max_err(loaded(name), name)
  assert err < ATOL, (name, err)


@pytest.mark.parametrize("name", FAMILIES)
def test_both_rope_spellings_give_the_same_model(loaded, name, tmp_path):
  d = tmp_path / name
  shutil.copytree(ROOT / name, d)
  shutil.copy(d / "config_v4.json", d / "config.json")
  assert "rope_parameters" not in json.loads((d / "config.json").read_text())
  v4 = load_pretrained(d)
  v5 = loaded(name)
  assert v4.cfg == v5.cfg
  a, b = flat(v4.params), flat(v5.params)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  ids = reference(name)["input_ids"]
  np.testing.assert_array_equal(np.asarray(v4.logits(ids)), np.asarray(v5.logits(ids)))
  assert max_err(v4, name) < ATOL


def test_sharded_checkpoint_equals_single_file(loaded):
  a, b = flat(loaded("qwen3_sharded").params), flat(loaded("qwen3").params)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("name", ["qwen3_bf16", "qwen3_fp16"])
def test_half_precision_files(loaded, name):
  """Loaded as float32 the params are the file's values exactly; loaded as bfloat16 (params and compute in bf16)
  the logits stay within 0.15 of the reference: bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2 %
  per op), logits here reach |4| and pass through two blocks of ~10 rounded ops each; measured 0.055 (and 0.060
  for llama), so 0.15 flags a wrong mapping (errors of order 1) without flaking on rounding."""
  f32 = loaded(name)
  disk = load_file(str(ROOT / name / "model.safetensors")) if name == "qwen3_fp16" else None
  if disk is not None:
    np.testing.assert_array_equal(flat(f32.params)["['embed']"], disk["model.embed_tokens.weight"].astype(np.float32))
  bf = load_pretrained(ROOT / name, dtype="bfloat16")
  assert bf.cfg.dtype == bf.cfg.param_dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(bf.params)} == {np.dtype(jax.numpy.bfloat16)}
  if name == "qwen3_bf16":  # no double rounding: the bf16 params are the file's bits
    np.testing.assert_array_equal(flat(bf.params)["['embed']"].astype(np.float32),
                                  flat(f32.params)["['embed']"])
  assert max_err(bf, name) < 0.15


class _Recorder:
  """Wraps hf.safe_open: records (tensor name, [(start, stop)] per stored dim) of every get_slice read."""

  def __init__(self, real):
    self.real, self.reads = real, []

  def __call__(self, path, framework="numpy"):
    rec, handle = self, self.real(path, framework=framework)

    class Slice:
      def __init__(self, name):
        self.name, self.inner = name, handle.get_slice(name)

      def get_shape(self):
        return self.inner.get_shape()

      def get_dtype(self):
        return self.inner.get_dtype()

      def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        shape = self.inner.get_shape()
        rec.reads.append((self.name, [s.indices(n)[:2] for s, n in zip(idx, shape)] +
                          [(0, n) for n in shape[len(idx):]], list(shape)))
        return self.inner[idx]

    class Handle:
      def __enter__(self):
        return self

      def __exit__(self, *a):
        return handle.__exit__(*a)

      def keys(self):
        return handle.keys()

      def get_slice(self, name):
        return Slice(name)

    handle.__enter__()
    return Handle()


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3_sharded"])
def test_loads_straight_into_an_fsdp_tensor_layout(loaded, name, monkeypatch):
  mesh = make_mesh("fsdp=4,tensor=2")
  rec = _Recorder(hf.safe_open)
  monkeypatch.setattr(hf, "safe_open", rec)
  model = load_pretrained(ROOT / name, mesh=mesh)
  monkeypatch.undo()
  full = flat(loaded(name).params)
  names = hf_name_map(model.cfg)
  sharded_tensors = set()
  for path, x in jax.tree_util.tree_flatten_with_path(model.params)[0]:
    key = jax.tree_util.keystr(path)
    assert x.sharding.mesh.shape == mesh.shape
    if any(a is not None for a in x.sharding.spec):
      sharded_tensors.add(names[key].name)
    assert len(x.addressable_shards) == 8
    for shard in x.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), full[key][shard.index], err_msg=f"{key} {shard.device}")
  # the layout shards the embedding, every projection and the MLP (norms stay replicated)
  assert "model.embed_tokens.weight" in sharded_tensors and "model.layers.1.mlp.down_proj.weight" in sharded_tensors
  assert "model.layers.0.self_attn.q_proj.weight" in sharded_tensors
  read_names = {n for n, _, _ in rec.reads}
  assert read_names == {m.name for m in names.values()}
  for n, extent, shape in rec.reads:
    if n in sharded_tensors:
      assert extent != [(0, s) for s in shape], f"{n} was read whole"
  assert max_err(model, name) < ATOL  # sharded matmuls sum in another order: equal to rounding, not bitwise


@pytest.mark.parametrize("rules", ["rollout", "head_dim"])
def test_other_layouts_place_the_same_blocks(loaded, rules):
  """The rollout layout (no FSDP), and one that shards head_dim (an inner factor of q_proj's rows: read whole
  heads, sliced on the host) over an fsdp=2 x tensor=4 mesh."""
  table = mesh_lib.ROLLOUT_RULES if rules == "rollout" else {**mesh_lib.TRAIN_RULES, "heads": None,
                                                             "kv_heads": None, "head_dim": "tensor"}
  mesh = make_mesh("data=2,tensor=4" if rules == "rollout" else "fsdp=2,tensor=4",
                   allowed=mesh_lib.ROLLOUT_AXES if rules == "rollout" else mesh_lib.TRAIN_AXES)
  model = load_pretrained(ROOT / "qwen2", mesh=mesh, rules=table)
  full = flat(loaded("qwen2").params)
  if rules == "head_dim":
    assert model.params["blocks"][0]["attn"]["q"].sharding.spec == jax.sharding.PartitionSpec("fsdp", None, "tensor")
  for path, x in jax.tree_util.tree_flatten_with_path(model.params)[0]:
    for shard in x.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), full[jax.tree_util.keystr(path)][shard.index])


def test_a_bad_tensor_is_found_before_any_data_is_read(tmp_path, monkeypatch):
  d = copy_of(tmp_path, "qwen3_sharded")
  index = json.loads((d / "model.safetensors.index.json").read_text())
  del index["weight_map"]["model.layers.1.mlp.down_proj.weight"]
  (d / "model.safetensors.index.json").write_text(json.dumps(index))
  rec = _Recorder(hf.safe_open)
  monkeypatch.setattr(hf, "safe_open", rec)
  expect(d, str(d / "model.safetensors.index.json"), "model.layers.1.mlp.down_proj.weight", "missing")
  assert rec.reads == []


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_tokens_match_transformers_generate(loaded, name):
  """Full forwards + argmax over one fixed [1, W] row (causal: tokens after the last position do not change it)."""
  model = loaded(name)
  gen = json.loads((ROOT / name / "reference.json").read_text())["generate"]
  eos = set(gen["eos_token_ids"])
  assert set(model.eos_ids) == eos
  W = max(len(p["prompt_ids"]) for p in gen["prompts"]) + gen["max_new_tokens"]
  for p in gen["prompts"]:
    row = list(p["prompt_ids"])
    new = []
    while len(new) < gen["max_new_tokens"]:
      padded = np.full((1, W), model.pad_id, np.int32)
      padded[0, :len(row)] = row
      nxt = int(np.argmax(np.asarray(model.logits(padded))[0, len(row) - 1]))
      new.append(nxt)
      row.append(nxt)
      if nxt in eos:
        break
    assert new == p["new_ids"], (name, p["prompt"])


def test_the_loaded_checkpoint_and_its_tokenizer_read_the_same_special_ids(tmp_path):
  """Qwen's layout: config.json names one EOS id (<|endoftext|>), generation_config.json two (<|im_end|> first).
  load_pretrained and the tokenizer (the trainer's stop ids) read them by one rule: generation_config.json first,
  tokenizer_config.json's eos_token added."""
  from scalerl_jax.data.tokenizer import tokenizer_from_pretrained

  d = copy_of(tmp_path)
  edit_config(d, eos_token_id=88, bos_token_id=89)
  gen = json.loads((d / "generation_config.json").read_text())
  (d / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [90, 88]}))
  model, tok = load_pretrained(d), tokenizer_from_pretrained(d)
  assert (model.bos_id, model.eos_ids, model.pad_id) == (tok.bos_id, tok.eos_ids, tok.pad_id) == (88, (90, 88), 88)
  del gen["eos_token_id"]  # config.json's one id, and tokenizer_config.json's eos_token (<|im_end|> = 90)
  (d / "generation_config.json").write_text(json.dumps(gen))
  assert load_pretrained(d).eos_ids == tokenizer_from_pretrained(d).eos_ids == (88, 90)


# ---- bad input: each error names the file and the tensor or key ----

def copy_of(tmp_path, name="qwen3"):
  d = tmp_path / name
  shutil.copytree(ROOT / name, d)
  return d


def edit_config(d, **changes):
  cfg = json.loads((d / "config.json").read_text())
  for k, v in changes.items():
    if v is None:
      cfg.pop(k, None)
    else:
      cfg[k] = v
  (d / "config.json").write_text(json.dumps(cfg))


def expect(d, *fragments, **kw):
  with pytest.raises(HFCheckpointError) as e:
    load_pretrained(d, **kw)
  assert isinstance(e.value, ValueError)
  for f in fragments:
    assert f in str(e.value), (f, str(e.value))


def test_missing_config_and_weights(tmp_path):
  d = copy_of(tmp_path)
  (d / "config.json").unlink()
  expect(d, str(d / "config.json"))
  d = copy_of(tmp_path, "qwen2")
  (d / "model.safetensors").unlink()
  expect(d, str(d / "model.safetensors"))
  d = copy_of(tmp_path, "qwen3_sharded")
  (d / "model-00003-of-00004.safetensors").unlink()
  expect(d, "model-00003-of-00004.safetensors", "model.safetensors.index.json")
  expect(tmp_path / "nowhere", "nowhere")


@pytest.mark.parametrize("name,file", [("qwen3", "model.safetensors"),
                                       ("qwen3_sharded", "model-00002-of-00004.safetensors")])
def test_truncated_weights(tmp_path, name, file):
  d = copy_of(tmp_path, name)
  data = (d / file).read_bytes()
  for cut in (len(data) - 64, 40):
    (d / file).write_bytes(data[:cut])
    expect(d, str(d / file))


def rewrite(d, change):
  tensors = load_file(str(d / "model.safetensors"))
  change(tensors)
  save_file(tensors, str(d / "model.safetensors"))


def test_missing_wrong_shape_and_extra_tensors(tmp_path):
  d = copy_of(tmp_path)
  rewrite(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  expect(d, str(d / "model.safetensors"), "model.layers.1.mlp.up_proj.weight", "missing")
  d = copy_of(tmp_path / "b")
  rewrite(d, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight":
                                 t["model.layers.0.self_attn.k_proj.weight"][:16]}))
  expect(d, str(d / "model.safetensors"), "model.layers.0.self_attn.k_proj.weight", "[16, 32]", "[32, 32]")
  d = copy_of(tmp_path / "c")
  rewrite(d, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].copy()}))  # tied: no lm_head
  expect(d, "lm_head.weight", "model.safetensors", "unexpected", "tie_word_embeddings")
  d = copy_of(tmp_path / "e", "llama")  # untied: dropping the head is a missing tensor
  rewrite(d, lambda t: t.pop("lm_head.weight"))
  expect(d, "lm_head.weight", str(d / "model.safetensors"), "missing")
  d = copy_of(tmp_path / "f", "llama")  # an old inv_freq buffer is recomputed, not refused
  rewrite(d, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)}))
  assert max_err(load_pretrained(d), "llama") < ATOL
  d = copy_of(tmp_path / "d", "qwen3_sharded")
  index = json.loads((d / "model.safetensors.index.json").read_text())
  index["weight_map"]["model.layers.0.self_attn.q_norm.weight"] = "model-00004-of-00004.safetensors"
  (d / "model.safetensors.index.json").write_text(json.dumps(index))
  expect(d, "model-00004-of-00004.safetensors", "model.layers.0.self_attn.q_norm.weight")


def test_a_special_id_outside_the_embedding_is_refused(tmp_path):
  d = copy_of(tmp_path)
  gen = json.loads((d / "generation_config.json").read_text())
  (d / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [90, 500]}))
  expect(d, f"{d / 'generation_config.json'}: eos_token_id 500 is not an id of the embedding "
            f"({d / 'config.json'} vocab_size) (96 tokens)")


def test_an_integer_tensor_is_refused_not_cast(tmp_path):
  """A weight stored as integers (a quantized checkpoint) was cast to float and trained silently."""
  d = copy_of(tmp_path)
  rewrite(d, lambda t: t.update({"model.norm.weight": np.ones_like(t["model.norm.weight"], np.int32)}))
  expect(d, str(d / "model.safetensors"), "tensor 'model.norm.weight' is stored as I32, not a floating-point weight")


@pytest.mark.parametrize("name,changes,fragments", [
  ("qwen3", {"model_type": "mistral"}, ["model_type", "mistral"]),
  ("qwen3", {"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}},
   ["rope_parameters.rope_type", "yarn"]),
  ("qwen3", {"rope_parameters": None, "rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}},
   ["rope_scaling.rope_type", "linear"]),
  ("qwen2", {"use_sliding_window": True, "sliding_window": 16}, ["use_sliding_window", "True"]),
  ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]}, ["layer_types", "sliding_attention"]),
  ("llama", {"attention_bias": True}, ["attention_bias", "True"]),
  ("qwen3", {"attention_bias": True}, ["attention_bias", "True"]),
  ("llama", {"mlp_bias": True}, ["mlp_bias", "True"]),
  ("qwen3", {"partial_rotary_factor": 0.5}, ["partial_rotary_factor", "0.5"]),
  ("llama", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "default", "partial_rotary_factor": 0.25}},
   ["rope_parameters.partial_rotary_factor", "0.25"]),
  ("llama", {"hidden_act": "gelu"}, ["hidden_act", "gelu"]),
  ("qwen3", {"hidden_size": None}, ["hidden_size"]),
  ("qwen3", {"head_dim": 15}, ["head_dim", "15"]),
  ("qwen3", {"rope_parameters": {"full_attention": {"rope_theta": 1e4, "rope_type": "default"}}},
   ["rope_parameters", "full_attention"]),
  ("llama", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 8.0}},
   ["rope_parameters", "low_freq_factor"]),
])
def test_unsupported_configs_are_refused(tmp_path, name, changes, fragments):
  d = copy_of(tmp_path, name)
  edit_config(d, **changes)
  expect(d, str(d / "config.json"), *fragments)
  with pytest.raises(HFCheckpointError):
    hf_model_config(d)


def greedy_in_engine(model, root, name):
  """Fixture `name`'s prompts decoded greedily by the rollout engine (KV cache, stop on any EOS id): (prompts,
  new tokens per prompt, recorded experts per prompt and new token [None for a dense model], the fixture's
  `generate` record)."""
  gen = json.loads((root / name / "reference.json").read_text())["generate"]
  prompts = [np.asarray(p["prompt_ids"], np.int32) for p in gen["prompts"]]
  L, N = max(len(p) for p in prompts), gen["max_new_tokens"]
  assert L + N <= model.cfg.max_seq_len
  cfg = RolloutConfig(max_slots=4, max_prefill_len=L, prefill_buckets=(L,), max_new_tokens=N, decode_chunk=N,
                      interruption=InterruptionConfig(enabled=False))
  engine = Engine(model.policy, cfg, mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES),
                  stop_ids=model.eos_ids)
  params = jax.device_put(model.params, engine.param_shardings)
  state = engine.prefill_insert(params, engine.init_decode_state(), prompts, np.arange(3), np.arange(3),
                                np.arange(3), np.zeros(3, np.int32), jax.random.key(0))
  new, routes = [[] for _ in prompts], [[] for _ in prompts]
  for _ in range(N):
    state, res = engine.generate(params, state, 0, N, GREEDY)
    res = jax.device_get(res)
    for b in range(len(prompts)):
      new[b] += res.tokens_BN[b][res.valid_BN[b]].tolist()
      if res.routes_BNXk is not None:
        routes[b] += list(res.routes_BNXk[b][res.valid_BN[b]])
    if not np.asarray(state.active_B).any():
      break
  return prompts, new, routes if engine.routes_Xk else None, gen


@pytest.mark.parametrize("name", FAMILIES)
def test_rollout_engine_at_temperature_0_reproduces_generate(loaded, name):
  """The imported policy works unchanged in the rollout engine (KV-cache decode, stop on any EOS id)."""
  _, new, routes, gen = greedy_in_engine(loaded(name), ROOT, name)
  assert routes is None
  assert new == [p["new_ids"] for p in gen["prompts"]]


def test_train_step_on_the_imported_layout():
  """Loaded onto fsdp=4 x tensor=2, the params are already the train state's shardings; one step's loss is the
  next-token NLL of transformers' own logits on the fixture batch (pads weighted 0), and the step moves them."""
  mesh = make_mesh("fsdp=4,tensor=2")
  layout = mesh_lib.Layout(mesh, mesh_lib.TRAIN_RULES)
  model = load_pretrained(ROOT / "qwen3", mesh=mesh)
  opt = make_optimizer(OptimizerConfig(lr=1e-3, warmup_steps=0))
  shardings = state_shardings(model.policy, opt, layout)
  assert jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding == s, model.params, shardings.params)) == [True] * len(
    jax.tree.leaves(model.params))
  before = flat(model.params)
  state = init_train_state(model.policy, opt, layout, seed=0, params=model.params)
  ref = reference("qwen3")
  mask = ref["attention_mask"].astype(np.float32)
  weights = mask.copy()
  weights[:, 0] = 0.0
  weights /= weights.sum()
  ids = ref["input_ids"].astype(np.int32)
  logp = ref["logits"] - np.log(np.exp(ref["logits"]).sum(-1, keepdims=True))
  want = -float((np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0] * weights[:, 1:]).sum())
  bsh = layout.batch(2, ids.shape[0])
  step = make_train_step(lambda p, b: next_token_loss(model.policy, p, b["tokens"], b["weights"]), opt, 1, shardings,
                         {"tokens": bsh, "weights": bsh})
  state, metrics = step(state, jax.device_put({"tokens": ids, "weights": weights}, bsh))
  assert abs(float(metrics["loss"]) - want) < 1e-5, (float(metrics["loss"]), want)
  assert float(np.abs(flat(state.params)["['embed']"] - before["['embed']"]).max()) > 0
