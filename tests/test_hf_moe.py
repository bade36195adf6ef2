"""Hugging Face mixture-of-experts checkpoints in and out (scalerl_jax/model/hf.py, hf_export.py) against the
committed transformers fixtures of tests/fixtures/hf_moe (tools/make_hf_fixtures.py): Qwen3-MoE (3 layers, layer 1
dense, top-2 of 4 experts, norm_topk_prob false) and Mixtral (top-2 of 4, renormalised). Config mapping, logit
parity, greedy tokens by full forwards and by the rollout engine's KV-cache decode (whose recorded experts equal a
full forward's), transformers 5's fused expert layout, loading onto an expert-parallel mesh without reading an
expert tensor whole, export -> import exact, and every bad checkpoint's error naming its file and tensor or key.
No torch."""

import dataclasses
import functools
import hashlib
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scalerl_jax.mesh import make_mesh
from scalerl_jax.model import hf
from scalerl_jax.model.hf import hf_model_config, hf_name_map, load_pretrained
from scalerl_jax.model.hf_export import HFExportError, export_pretrained, hf_config
from tests import test_hf_load as hf_load_tests
from tests.test_hf_export import exact_round_trip
from tests.test_hf_load import _Recorder, edit_config, expect, flat, rewrite

ROOT = pathlib.Path(__file__).parent / "fixtures" / "hf_moe"
FAMILIES = ("qwen3_moe", "mixtral")
ATOL = 1e-5


@pytest.fixture(scope="module")
def loaded():
  return {name: load_pretrained(ROOT / name) for name in FAMILIES}


reference = functools.partial(hf_load_tests.reference, root=ROOT)
max_err = functools.partial(hf_load_tests.max_err, root=ROOT)


def copy_of(tmp_path, name):
  d = tmp_path / name
  shutil.copytree(ROOT / name, d)
  return d


def test_config_mapping():
  q, m = (hf_model_config(ROOT / n) for n in FAMILIES)
  assert q.family == m.family == "moe"
  assert (q.num_experts, q.experts_per_token, q.expert_width, q.intermediate) == (4, 2, 24, 64)
  assert q.mlp_only_layers == (1,) and q.decoder_sparse_step == 1 and q.moe_layers == (0, 2)
  assert q.qk_norm and not q.qkv_bias and not q.norm_topk_prob and not q.tie_embeddings
  assert (m.num_experts, m.experts_per_token, m.expert_width, m.moe_layers) == (4, 2, 24, (0, 1))
  assert m.norm_topk_prob and not m.qk_norm and not m.qkv_bias and m.head_dim == 16 != m.hidden // m.num_heads
  assert m.shared_expert_intermediate == q.shared_expert_intermediate == 0
  # the Hub's Qwen3-MoE configs spell the expert count num_experts (transformers 5 writes num_local_experts)
  hub = json.loads((ROOT / "qwen3_moe" / "config.json").read_text())
  hub["num_experts"] = hub.pop("num_local_experts")
  assert hf_model_config(hub) == q


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_transformers(loaded, name):
  """fp32 parity on every non-pad position (transformers routes each token through its own top-k loop; we run
  the dropless ragged_dot dispatch)."""
  model = loaded[name]
  assert model.cfg.moe_dispatch == "ragged"
  err = max_err(model, name)
  assert err < ATOL, (name, err)


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_tokens_match_transformers_generate(loaded, name):
  """Full forwards + argmax over one fixed [1, W] row (causal: tokens after the last position do not change it)."""
  model = loaded[name]
  gen = json.loads((ROOT / name / "reference.json").read_text())["generate"]
  assert set(model.eos_ids) == set(gen["eos_token_ids"])
  W = max(len(p["prompt_ids"]) for p in gen["prompts"]) + gen["max_new_tokens"]
  for p in gen["prompts"]:
    row, new = list(p["prompt_ids"]), []
    while len(new) < gen["max_new_tokens"]:
      padded = np.full((1, W), model.pad_id, np.int32)
      padded[0, :len(row)] = row
      new.append(int(np.argmax(np.asarray(model.logits(padded))[0, len(row) - 1])))
      row.append(new[-1])
      if new[-1] in gen["eos_token_ids"]:
        break
    assert new == p["new_ids"], (name, p["prompt"])


@pytest.mark.parametrize("name", FAMILIES)
def test_rollout_engine_decode_reproduces_generate_and_its_experts(loaded, name):
  """The imported MoE policy in the rollout engine at temperature 0 (KV-cache decode) gives transformers' greedy
  tokens; the experts the engine records at each decode step (those of the token it fed, at its position) are
  the ones a full forward over prompt + new tokens picks there."""
  model = loaded[name]
  prompts, new, routes, gen = hf_load_tests.greedy_in_engine(model, ROOT, name)
  assert new == [p["new_ids"] for p in gen["prompts"]]
  X, k = len(model.cfg.moe_layers), model.cfg.experts_per_token
  for b, p in enumerate(prompts):
    seq = np.asarray([list(p) + new[b]], np.int32)
    _, _, stats = model.policy.forward_routed(model.params, seq)
    full_TXk = np.stack([np.asarray(s.expert_ids_BTk[0]) for s in stats], axis=1)  # [T, X, k]
    got_NXk = np.asarray(routes[b]).reshape(-1, X, k)
    assert len(got_NXk) == len(new[b]) and (got_NXk >= 0).all()  # one route per decode step, every layer
    want_NXk = full_TXk[len(p) - 1:len(p) - 1 + len(got_NXk)]  # step j feeds the token at position len - 1 + j
    np.testing.assert_array_equal(np.sort(got_NXk, -1), np.sort(want_NXk, -1), err_msg=f"{name} row {b}")


# ---- transformers 5's fused expert layout (save_pretrained(save_original_format=False)) ----

def fused_tensors(name) -> dict[str, np.ndarray]:
  """The fixture's per-expert tensors in the fused layout: per MoE layer mlp.gate.weight [E, D], mlp.experts
  .gate_up_proj [E, 2F, D] (each expert's gate rows, then its up rows) and mlp.experts.down_proj [E, D, F]."""
  cfg = hf_model_config(ROOT / name)
  per = load_file(str(ROOT / name / "model.safetensors"))
  prefix, (g, u, dn) = {"qwen3_moe": ("mlp.", ("gate_proj", "up_proj", "down_proj")),
                        "mixtral": ("block_sparse_moe.", ("w1", "w3", "w2"))}[name]
  for i in cfg.moe_layers:
    L = f"model.layers.{i}."
    pop = lambda n: [per.pop(f"{L}{prefix}experts.{e}.{n}.weight") for e in range(cfg.num_experts)]
    gates, ups, downs = pop(g), pop(u), pop(dn)
    per[L + "mlp.gate.weight"] = per.pop(L + prefix + "gate.weight")
    per[L + "mlp.experts.gate_up_proj"] = np.stack([np.concatenate([a, b]) for a, b in zip(gates, ups)])
    per[L + "mlp.experts.down_proj"] = np.stack(downs)
  return per


@pytest.mark.parametrize("name", FAMILIES)
def test_fused_layout_loads_to_the_same_params(loaded, name, tmp_path):
  tensors = fused_tensors(name)
  # the very file transformers writes: names, shapes and bytes as the fixture script recorded them
  record = json.loads((ROOT / name / "reference.json").read_text())["fused_checkpoint"]
  assert record["logits_max_abs_diff"] == 0.0
  assert sorted(tensors) == sorted(record["tensors"])
  for n, t in tensors.items():
    want = record["tensors"][n]
    assert (list(t.shape), str(t.dtype), hashlib.sha256(t.tobytes()).hexdigest()) == (
        want["shape"], want["dtype"], want["sha256"]), n
  d = copy_of(tmp_path, name)
  save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
  fused = load_pretrained(d)
  a, b = flat(fused.params), flat(loaded[name].params)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert max_err(fused, name) < ATOL
  # the export of a fused import is the per-expert Hub layout again: the fixture's own tensors
  out = export_pretrained(fused.params, fused.cfg, tmp_path / "out", source_dir=ROOT / name)
  ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(ROOT / name / "model.safetensors"))
  assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("fused", [False, True])
def test_loads_onto_an_expert_parallel_mesh_reading_only_the_held_experts(loaded, fused, tmp_path, monkeypatch):
  """fsdp=2 x tensor=2 x expert=2: every device's block equals the host load; the experts are split over the
  expert axis (and each expert's width over tensor), so no read covers a whole expert tensor: per-expert files
  are read in row blocks, a fused gate_up_proj in blocks of 2 of the 4 experts and only its gate or its up half."""
  name = "qwen3_moe"
  d = ROOT / name
  if fused:
    d = copy_of(tmp_path, name)
    save_file(fused_tensors(name), str(d / "model.safetensors"), metadata={"format": "pt"})
  mesh = make_mesh("fsdp=2,tensor=2,expert=2")
  rec = _Recorder(hf.safe_open)
  monkeypatch.setattr(hf, "safe_open", rec)
  model = load_pretrained(d, mesh=mesh)
  monkeypatch.undo()
  full = flat(loaded[name].params)
  for path, x in jax.tree_util.tree_flatten_with_path(model.params)[0]:
    key = jax.tree_util.keystr(path)
    if "['moe']" in key and "router" not in key:
      assert x.sharding.spec[0] == "expert", key
    for shard in x.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), full[key][shard.index], err_msg=key)
  names = hf_name_map(model.cfg, name, fused_experts=fused)
  assert {n for n, _, _ in rec.reads} == {n for m in names.values() for n in m.names}
  E, F = model.cfg.num_experts, model.cfg.expert_width
  expert_reads = [(n, ext, shape) for n, ext, shape in rec.reads if ".experts." in n]
  assert expert_reads
  for n, extent, shape in expert_reads:
    assert extent != [(0, s) for s in shape], f"{n} was read whole"
    if n.endswith("gate_up_proj"):
      (e0, e1), (r0, r1), _ = extent
      assert e1 - e0 == E // 2 and r1 - r0 <= F and (r0 >= F or r1 <= F), (n, extent)
  assert max_err(model, name) < ATOL


# ---- export ----

@pytest.mark.parametrize("name", FAMILIES)
def test_export_then_import_is_exact(loaded, name, tmp_path):
  out, ours = exact_round_trip(loaded[name], ROOT, name, tmp_path)
  assert any(".experts.3." in k for k in ours)  # the per-expert tensors transformers saved, bit for bit
  # config.json as transformers wrote it for the fixture (but transformers_version)
  c_ours, c_theirs = (json.loads((x / "config.json").read_text()) for x in (out, ROOT / name))
  assert c_ours == {k: v for k, v in c_theirs.items() if k != "transformers_version"}
  assert {k: v for k, v in c_theirs.items() if k != "transformers_version" and not k.endswith("_token_id")} == (
      hf_config(loaded[name].cfg, name))


@pytest.mark.parametrize("name", FAMILIES)
def test_transformers_loaded_the_exports(name):
  """tools/make_hf_fixtures.py --check-export recorded that transformers loads our export of this fixture and
  reproduces its reference logits, config, tokenizer ids and greedy tokens (the script's docstring)."""
  check = json.loads((ROOT / name / "reference.json").read_text())["export_check"]
  assert check["logits_max_abs_diff"] == 0.0 and check["dtype_on_disk"] == "float32"
  assert check["config_equal"] and check["tokenizer_ids_equal"] and check["greedy_equal"]


def test_export_refusals(loaded, tmp_path):
  q, m = loaded["qwen3_moe"], loaded["mixtral"]
  dense = load_pretrained(ROOT.parent / "hf" / "qwen3")
  unnormalised = dataclasses.replace(m.cfg, norm_topk_prob=False)
  cases = [
      (q, q.cfg, dict(family="mixtral"),
       "model.qk_norm=True but mixtral has qk_norm=False (this model exports as qwen3_moe)"),
      (q, q.cfg, dict(family="qwen3"), "model.family=moe but qwen3 has family=dense (this model exports as qwen3_moe)"),
      (dense, dense.cfg, dict(family="qwen3_moe"),
       "model.family=dense but qwen3_moe has family=moe (this model exports as qwen3)"),
      (m, m.cfg, dict(family="qwen3_moe"),
       "model.qk_norm=False but qwen3_moe has qk_norm=True (this model exports as mixtral)"),
      (m, unnormalised, dict(family="mixtral"),
       "model.norm_topk_prob=False but mixtral has norm_topk_prob=True (no family we export fits)"),
      (m, m.cfg, dict(source_dir=ROOT / "qwen3_moe"), "does not describe these params"),
  ]
  for model, cfg, kw, msg in cases:
    with pytest.raises(HFExportError) as e:
      export_pretrained(model.params, cfg, tmp_path, **kw)
    assert msg in str(e.value), (kw, str(e.value))
  shared = dataclasses.replace(q.cfg, shared_expert_intermediate=16)
  with pytest.raises(HFExportError, match="model.shared_expert_intermediate=16 but qwen3_moe has "
                                          "shared_expert_intermediate=0"):
    hf_config(shared, "qwen3_moe")
  with pytest.raises(ValueError, match="needs model_type"):
    hf_name_map(q.cfg)


# ---- bad input: each error names the file and the tensor or key ----

def test_missing_and_wrong_shape_expert_tensors(tmp_path):
  d = copy_of(tmp_path / "a", "qwen3_moe")
  rewrite(d, lambda t: t.pop("model.layers.2.mlp.experts.3.up_proj.weight"))
  expect(d, str(d / "model.safetensors"), "missing tensor 'model.layers.2.mlp.experts.3.up_proj.weight'")
  d = copy_of(tmp_path / "b", "mixtral")
  w2 = "model.layers.1.block_sparse_moe.experts.0.w2.weight"
  rewrite(d, lambda t: t.update({w2: t[w2][:, :20]}))
  expect(d, str(d / "model.safetensors"), w2, "[32, 20]", "[32, 24]")
  d = copy_of(tmp_path / "c", "qwen3_moe")  # the router is read as [E, D]
  rewrite(d, lambda t: t.update({"model.layers.0.mlp.gate.weight": t["model.layers.0.mlp.gate.weight"][:3]}))
  expect(d, "model.layers.0.mlp.gate.weight", "[3, 32]", "[4, 32]")
  d = copy_of(tmp_path / "d", "qwen3_moe")  # a dense layer's MLP where the config puts experts
  rewrite(d, lambda t: t.update({"model.layers.0.mlp.gate_proj.weight": t["model.layers.1.mlp.gate_proj.weight"]}))
  expect(d, "unexpected", "model.layers.0.mlp.gate_proj.weight")
  d = copy_of(tmp_path / "e", "mixtral")  # fused, but one layer's gate_up_proj lacks rows
  tensors = fused_tensors("mixtral")
  name = "model.layers.1.mlp.experts.gate_up_proj"
  tensors[name] = tensors[name][:, :-2]
  save_file(tensors, str(d / "model.safetensors"))
  expect(d, str(d / "model.safetensors"), name, "[4, 46, 32]", "[4, 48, 32]")
  d = copy_of(tmp_path / "f", "mixtral")  # fused, missing down_proj
  tensors = fused_tensors("mixtral")
  tensors.pop("model.layers.0.mlp.experts.down_proj")
  save_file(tensors, str(d / "model.safetensors"))
  expect(d, "missing tensor 'model.layers.0.mlp.experts.down_proj'")


def test_a_shared_expert_with_a_sigmoid_gate_is_refused(tmp_path):
  d = copy_of(tmp_path / "a", "qwen3_moe")
  edit_config(d, shared_expert_intermediate_size=16)
  expect(d, str(d / "config.json"), "shared_expert_intermediate_size=16", "shared_expert_gate", "not supported")
  d = copy_of(tmp_path / "b", "qwen3_moe")  # Qwen2-MoE's tensors in a checkpoint whose config does not say so
  rewrite(d, lambda t: t.update({"model.layers.0.mlp.shared_expert_gate.weight": np.ones((1, 32), np.float32),
                                 "model.layers.0.mlp.shared_expert.up_proj.weight": np.ones((16, 32), np.float32)}))
  expect(d, str(d / "model.safetensors"), "model.layers.0.mlp.shared_expert_gate.weight", "unexpected",
         "sigmoid gate")


@pytest.mark.parametrize("name,changes,fragments", [
  ("mixtral", {"sliding_window": 16}, ["sliding_window=16", "max_seq_len=64"]),
  ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 16}, ["use_sliding_window", "True"]),
  ("qwen3_moe", {"attention_bias": True}, ["attention_bias", "True"]),
  ("qwen3_moe", {"num_experts": 8}, ["num_experts=8", "num_local_experts=4", "disagree"]),
  ("qwen3_moe", {"num_local_experts": None}, ["lacks the key 'num_local_experts'"]),
  ("mixtral", {"num_local_experts": 1}, ["num_local_experts=1", "at least 2 experts"]),
  ("mixtral", {"num_experts_per_tok": 5}, ["num_experts_per_tok=5", "[1, 4]"]),
  ("qwen3_moe", {"moe_intermediate_size": None}, ["lacks the key 'moe_intermediate_size'"]),
  ("qwen3_moe", {"mlp_only_layers": [0, 3]}, ["mlp_only_layers=[0, 3]", "[0, 3)"]),
  ("qwen3_moe", {"mlp_only_layers": [0, 1, 2]}, ["mlp_only_layers=[0, 1, 2]", "no MoE layer"]),
  ("qwen3_moe", {"decoder_sparse_step": 0}, ["decoder_sparse_step=0", ">= 1"]),
  ("mixtral", {"hidden_act": "gelu"}, ["hidden_act", "gelu"]),
])
def test_unsupported_configs_are_refused(tmp_path, name, changes, fragments):
  d = copy_of(tmp_path, name)
  edit_config(d, **changes)
  expect(d, str(d / "config.json"), *fragments)


def test_a_sliding_window_no_sequence_reaches_changes_nothing(loaded, tmp_path):
  """Mixtral attends within sliding_window positions: with max_seq_len <= the window that is full attention."""
  d = copy_of(tmp_path / "a", "mixtral")
  edit_config(d, sliding_window=64)  # = max_position_embeddings
  assert max_err(load_pretrained(d), "mixtral") < ATOL
  d = copy_of(tmp_path / "b", "mixtral")
  edit_config(d, sliding_window=56)
  T = reference("mixtral")["input_ids"].shape[1]
  assert T <= 56
  expect(d, "sliding_window=56", "max_seq_len=64", "load with max_seq_len <= 56")
  assert max_err(load_pretrained(d, max_seq_len=56), "mixtral") < ATOL
