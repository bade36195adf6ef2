"""Low-rank adapters (model/lora.py, lora.* keys): an adapter with B = 0 leaves the model's function exactly as its
base's; the factored adapter's gradient is the hand-computed one; training moves the adapters only, with optimizer
state for them alone, on one device and sharded; MoE experts each get their own adapter; bad keys are refused."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.config import ConfigError, LoraConfig, ModelConfig, OptimizerConfig, RunConfig, validate
from scalerl_jax.mesh import TRAIN_RULES, Layout, batch_sharding, make_mesh
from scalerl_jax.model import lora, make_policy, next_token_loss, token_logprobs
from scalerl_jax.model.layers import project
from scalerl_jax.model.moe import dispatch_dense, dispatch_ragged, ExpertAdapter
from scalerl_jax.train.state import init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step

DENSE = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                    max_seq_len=16)
MOE = dataclasses.replace(DENSE, family="moe", num_experts=4, experts_per_token=2, shared_expert_intermediate=16,
                          decoder_sparse_step=2)  # layer 0 dense, layer 1 MoE
LORA = LoraConfig(rank=4, alpha=8.0)


def _leaves(tree):
  return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_adapters_with_b_zero_give_the_base_models_logits_exactly(cfg):
  base_policy, policy = make_policy(cfg), make_policy(cfg, LORA)
  base = base_policy.init(0)
  params = policy.attach_adapters(base, 1)
  adapters = {k: v for k, v in _leaves(params).items() if "_lora" in k}
  # every targeted projection of every layer has its adapter: dense q k v o + MLP, MoE experts + shared expert
  assert len(adapters) == 2 * (4 * cfg.num_layers + 3 * cfg.num_layers + 3 * len(cfg.moe_layers))
  assert all(float(jnp.abs(v).max()) > 0 for k, v in adapters.items() if k.endswith("['a']"))  # A is drawn
  assert all(not np.any(np.asarray(v)) for k, v in adapters.items() if k.endswith("['b']"))  # B is zero
  tokens = jax.random.randint(jax.random.key(2), (3, 12), 0, cfg.vocab_size)
  want = token_logprobs(base_policy, base, tokens)
  np.testing.assert_array_equal(np.asarray(token_logprobs(policy, params, tokens)), np.asarray(want))
  # the adapters are on the path: a non-zero B changes the function
  moved = jax.tree_util.tree_map_with_path(lambda p, x: x + 0.1 if lora.is_adapter(p) else x, params)
  assert float(jnp.abs(token_logprobs(policy, moved, tokens) - want).max()) > 1e-3


def test_base_params_of_a_seed_do_not_depend_on_adapters():
  """Adapters draw from their own random stream: the same seed gives the same base with and without them."""
  with_adapters = _leaves(make_policy(DENSE, LORA).init(5))
  without = _leaves(make_policy(DENSE).init(5))
  assert set(without) < set(with_adapters)
  for k, v in without.items():
    np.testing.assert_array_equal(np.asarray(with_adapters[k]), np.asarray(v))


def test_adapter_gradient_is_the_hand_computed_one():
  """y = x W + s (x A) B, L = sum(y * g): dA = s x^T (g B^T), dB = s (x A)^T g, and W gets x^T g (unused)."""
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=(5, 6)), rng.normal(size=(6, 3))
  a, b, g = rng.normal(size=(6, 2)), rng.normal(size=(2, 3)), rng.normal(size=(5, 3))
  s = 0.75
  ad = lambda a_, b_: type("Ad", (), {"a": a_, "b": b_, "scale": s})()  # noqa: E731  (project reads a, b, scale)

  def loss(a_, b_):
    return jnp.sum(project(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32), ad(a_, b_), jnp.float32) * g)

  da, db = jax.grad(loss, argnums=(0, 1))(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  np.testing.assert_allclose(np.asarray(da), s * x.T @ (g @ b.T), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(db), s * (x @ a).T @ g, rtol=1e-4, atol=1e-5)
  # and the value: the base projection plus the scaled low-rank term
  np.testing.assert_allclose(float(loss(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))),
                             np.sum((x @ w + s * (x @ a) @ b) * g), rtol=1e-4)


def test_expert_adapters_ragged_dispatch_equals_the_dense_reference():
  """Each expert's adapter applies to its own tokens: the grouped-matmul dispatch against every expert on every
  token with one-hot gates, and against a per-token loop in numpy."""
  rng = np.random.default_rng(1)
  U, D, F, E, k, r = 7, 6, 5, 3, 2, 2
  x = rng.normal(size=(U, D)).astype(np.float32)
  ids = np.stack([rng.permutation(E)[:k] for _ in range(U)]).astype(np.int32)
  gates = rng.uniform(0.2, 1, size=(U, k)).astype(np.float32)
  gate, up = rng.normal(size=(2, E, D, F)).astype(np.float32)
  down = rng.normal(size=(E, F, D)).astype(np.float32)
  ads = tuple(ExpertAdapter(rng.normal(size=(E, i, r)).astype(np.float32), rng.normal(size=(E, r, o)).astype(
      np.float32), 0.5) for i, o in ((D, F), (D, F), (F, D)))
  ragged = np.asarray(dispatch_ragged(x, ids, gates, gate, up, down, adapters=ads))
  dense = np.asarray(dispatch_dense(x, ids, gates, gate, up, down, adapters=ads))
  silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
  lin = lambda v, w, ad, e: v @ w[e] + ad.scale * (v @ ad.a_EIr[e]) @ ad.b_ErO[e]  # noqa: E731
  want = np.zeros((U, D), np.float32)
  for u in range(U):
    for j in range(k):
      e = ids[u, j]
      h = silu(lin(x[u], gate, ads[0], e)) * lin(x[u], up, ads[1], e)
      want[u] += gates[u, j] * lin(h, down, ads[2], e)
  np.testing.assert_allclose(ragged, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(dense, want, rtol=1e-4, atol=1e-4)
  plain = np.asarray(dispatch_ragged(x, ids, gates, gate, up, down))
  assert np.abs(plain - want).max() > 1e-2  # the adapters changed the result


def _train(spec: str, devices, steps: int = 3):
  policy = make_policy(DENSE, LORA)
  opt = make_optimizer(OptimizerConfig(lr=1e-2, warmup_steps=1, grad_clip=1.0))
  layout = Layout(make_mesh(spec, devices), TRAIN_RULES)
  sh = state_shardings(policy, opt, layout)
  base = make_policy(DENSE).init(0)
  state = init_train_state(policy, opt, layout, seed=0, params=policy.attach_adapters(base, 1, sh.params))
  tokens = jax.random.randint(jax.random.key(7), (16, 12), 0, DENSE.vocab_size)
  weights = jnp.ones((16, 12)).at[:, 0].set(0.0)
  bsh = batch_sharding(layout.mesh, TRAIN_RULES, 2, 16)
  batch = jax.device_put({"tokens": tokens, "weights": weights / weights.sum()}, bsh)
  step = make_train_step(lambda p, b: next_token_loss(policy, p, b["tokens"], b["weights"]), opt, 1, sh,
                         {"tokens": bsh, "weights": bsh}, policy=policy)
  before = jax.tree.map(np.asarray, state.params)
  losses = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return before, state, losses


@pytest.fixture(scope="module")
def trained_one_device():
  return _train("data=1", jax.devices()[:1])


def test_training_moves_the_adapters_and_leaves_the_base_bit_identical(trained_one_device):
  before, state, losses = trained_one_device
  after = _leaves(state.params)
  moved = [k for k, v in _leaves(before).items() if not np.array_equal(np.asarray(after[k]), v)]
  assert moved and all("_lora" in k for k in moved)  # only adapters changed...
  assert all(any(k.startswith(m.rsplit("[", 1)[0]) for m in moved) for k in after if k.endswith("['b']"))
  assert losses[-1] < losses[0]  # ...and they learned
  # optimizer moments exist for the adapters alone: Adam's mu and nu, each the adapters' size
  opt_elems = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)
  assert opt_elems == 2 * lora.count(state.params)
  assert lora.count(state.params) < 0.5 * sum(x.size for x in jax.tree.leaves(state.params))


def test_adapter_training_sharded_matches_one_device(trained_one_device):
  """fsdp=4 x tensor=2: the adapters shard with their base weights' axes, and train to the same values."""
  _, ref, ref_losses = trained_one_device
  _, state, losses = _train("fsdp=4,tensor=2", jax.devices())
  a = state.params["blocks"][0]["attn"]["q_lora"]["a"]
  assert len(a.sharding.device_set) == 8 and a.sharding.spec[0] == "fsdp"  # A [D, r]: embed -> fsdp
  b = state.params["blocks"][0]["mlp"]["up_lora"]["b"]
  assert b.sharding.spec[1] == "tensor"  # B [r, F]: mlp -> tensor
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5, rtol=2e-5)


def test_targets_choose_the_adapted_projections():
  params = make_policy(DENSE, dataclasses.replace(LORA, targets=("q", "v"))).init(0)
  names = {k for k in _leaves(params) if "_lora" in k}
  assert names == {f"['blocks'][{i}]['attn']['{t}_lora']['{m}']" for i in range(2) for t in "qv" for m in "ab"}


@pytest.mark.parametrize("override, key", [
    (dict(rank=-1), "lora.rank"), (dict(rank=4, alpha=0.0), "lora.alpha"), (dict(rank=4, dropout=0.1), "lora.dropout"),
    (dict(rank=4, targets=("q", "qkv")), "lora.targets"), (dict(rank=4, targets=()), "lora.targets")])
def test_bad_lora_keys_are_refused_by_name(override, key):
  with pytest.raises(ConfigError, match=key):
    validate(RunConfig(lora=LoraConfig(**override)))


def test_a_lora_run_checkpoints_its_adapters_alone_resumes_them_and_refuses_another_base(tmp_path):
  """The main job with lora.rank: weight syncs after the first move the adapters alone; the checkpoint holds the
  adapters, their optimizer state and the step, and names the base by source and checksum; a resume joins them to
  the rebuilt base and continues; a base that changed under the same config is refused by name and checksum."""
  import orbax.checkpoint as ocp

  from scalerl_jax.train.checkpoint import ResumeError
  from tests.pipeline_helpers import read_metrics, tiny_job

  lora_keys = ["lora.rank=4", "lora.targets=[q,v,down]", "pipeline.eval_every=0"]
  job = tiny_job(tmp_path, *lora_keys, "pipeline.steps=4")
  job.run()
  adapters = lora.count(job.state.params)
  syncs = [r["pipeline/weight_sync_bytes"] for r in read_metrics(tmp_path) if "pipeline/weight_sync_bytes" in r]
  assert syncs and all(b == 4 * adapters for b in syncs)  # float32 adapters, nothing else
  step_dir = tmp_path / "checkpoints" / "4"
  meta = ocp.CheckpointManager(tmp_path / "checkpoints").restore(
      4, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  assert meta["base"]["source"] == "the init of seed 0" and len(meta["base"]["checksum"]) == 16
  held = [k for k in meta["state_digest"] if k.startswith(".params")]
  assert held and all("_lora" in k for k in held)  # no base array in the checkpoint
  assert all("_lora" in k for k in meta["state_digest"] if k.startswith(".opt_state") and "mu" in k)
  trained = jax.tree.map(np.asarray, job.state.params)

  again = tiny_job(tmp_path, *lora_keys, "pipeline.steps=6")
  again.setup()
  try:
    assert again.start_step == 4
    for path, x in jax.tree_util.tree_leaves_with_path(again.state.params):  # adapters and base as they were
      np.testing.assert_array_equal(np.asarray(x), dict(jax.tree_util.tree_leaves_with_path(trained))[path])
  finally:
    again.release()

  # exports: the merged model (base + scale A B) that load_pretrained reads back with the adapted model's
  # log-probs, and the PEFT adapter directory that reads back exactly
  import importlib.util
  import pathlib

  from scalerl_jax.model import load_pretrained
  from scalerl_jax.model.lora_export import read_peft
  spec = importlib.util.spec_from_file_location("export_cli", pathlib.Path(__file__).parents[1] / "launch" / "export.py")
  cli = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(cli)
  assert cli.main([str(tmp_path), "--out", str(tmp_path / "merged"), "--family", "llama"]) == 0
  assert cli.main([str(tmp_path), "--out", str(tmp_path / "peft"), "--family", "llama", "--adapter"]) == 0
  policy = job.parts.policy
  merged = load_pretrained(str(tmp_path / "merged"))
  assert not any("_lora" in k for k in _leaves(merged.params))
  tokens = jax.random.randint(jax.random.key(4), (2, 10), 0, 32)
  adapted = token_logprobs(policy, job.state.params, tokens)
  np.testing.assert_allclose(np.asarray(token_logprobs(merged.policy, merged.params, tokens)), np.asarray(adapted),
                             atol=1e-5)
  # the adapters trained: the model without them (B = 0) differs, so the merge really added them
  no_adapters = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.zeros_like(x) if lora.is_adapter(p) and p[-1].key == "b" else x, job.state.params)
  assert float(jnp.abs(token_logprobs(policy, no_adapters, tokens) - adapted).max()) > 1e-4
  back = read_peft(tmp_path / "peft", policy)
  for path, x in jax.tree_util.tree_leaves_with_path(policy.split_trainable(job.state.params)[0]):
    np.testing.assert_array_equal(np.asarray(dict(jax.tree_util.tree_leaves_with_path(back))[path]), np.asarray(x))
  # PEFT variants whose adapters compute something else, and tensors the targets do not adapt, are refused by name
  import json
  import shutil

  from safetensors.numpy import load_file, save_file

  from scalerl_jax.model.hf import HFCheckpointError
  for key, value in (("use_dora", True), ("use_rslora", True), ("rank_pattern", {"q_proj": 8})):
    bad = tmp_path / f"peft_{key}"
    shutil.copytree(tmp_path / "peft", bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(HFCheckpointError, match=f"adapter_config.json: {key} = "):
      read_peft(bad, policy)
  extra = tmp_path / "peft_extra"
  shutil.copytree(tmp_path / "peft", extra)
  tensors = load_file(str(extra / "adapter_model.safetensors"))
  name = next(k for k in tensors if ".q_proj.lora_A" in k).replace("q_proj", "k_proj")  # k is not a target here
  save_file({**tensors, name: np.zeros((4, 32), np.float32)}, str(extra / "adapter_model.safetensors"))
  with pytest.raises(HFCheckpointError, match="holds 1 tensor\\(s\\) the policy's lora.targets do not adapt, e.g. "
                     + name.replace(".", "\\.")):
    read_peft(extra, policy)

  # a resume whose base is not the one the adapters were trained on (here the init of another seed; a
  # model.pretrained whose files changed alike)
  other = tiny_job(tmp_path, *lora_keys, "pipeline.steps=6", "seed=1")
  try:
    with pytest.raises(ResumeError, match=f"{step_dir}: its adapters were trained on the base the init of seed 0 "
                                          f"\\(checksum {meta['base']['checksum']}\\), but this run's base the init of "
                                          "seed 1 has checksum"):
      other.setup()
  finally:
    other.release()


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_peft_loads_the_adapter_export_onto_its_base(name):
  """Recorded by the dev-only tools/make_hf_fixtures.py --check-peft (tools/README.md): peft.PeftModel loaded our
  PEFT export of random adapters onto the fixture, and its logits equalled our merged export's under transformers."""
  import json
  import pathlib
  check = json.loads((pathlib.Path(__file__).parent / "fixtures" / "hf" / name / "reference.json").read_text())
  check = check["peft_check"]
  assert check["logits_max_abs_diff"] < 1e-4 < check["adapters_move_logits_by"]
  assert check["merged_weights_max_abs_diff"] < 1e-5
  assert set(check["target_modules"]) == {f"{t}_proj" for t in ("q", "k", "v", "o", "gate", "up", "down")}


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_adapter_param_count_and_flops_are_analytic(cfg):
  """lora.adapter_params equals the initialised adapters' size (all experts), and the FLOPs a token costs with
  adapters: their forward on top of the base's, and a backward with no gradient of the frozen base's weights."""
  from scalerl_jax.model import flops_per_token
  spec = lora.LoraSpec.of(LORA)
  assert lora.adapter_params(cfg, spec) == lora.count(make_policy(cfg, LORA).init(0)) > 0
  assert lora.adapter_params(cfg, None) == 0
  # one token uses k of E experts' adapters: fewer than all, and exactly the dense layer's share plus k experts'
  active = lora.adapter_params(cfg, spec, active=True)
  assert active <= lora.adapter_params(cfg, spec) and (active < lora.adapter_params(cfg, spec)) == bool(cfg.moe_layers)
  fwd, ad = flops_per_token(cfg, 8), 2.0 * active
  assert flops_per_token(cfg, 8, lora=LORA) == fwd + ad
  assert flops_per_token(cfg, 8, backward=True, lora=LORA) == 2 * fwd + 3 * ad  # not 3 x (fwd + ad)
  assert flops_per_token(cfg, 8, backward=True) == 3 * fwd  # without adapters, as before


def test_adapters_train_in_fp32_on_a_bf16_base():
  """A bf16 base keeps bf16 weights, its adapters fp32 (their small early updates would round away in bf16), and
  the merged export keeps the sum in fp32 until the export casts."""
  from scalerl_jax.model.lora_export import merge
  cfg = dataclasses.replace(DENSE, param_dtype="bfloat16", dtype="bfloat16")
  policy = make_policy(cfg, LORA)
  params = policy.init(0)
  leaves = _leaves(params)
  assert {str(x.dtype) for k, x in leaves.items() if "_lora" in k} == {"float32"}
  assert {str(x.dtype) for k, x in leaves.items() if "_lora" not in k} == {"bfloat16"}
  params = jax.tree_util.tree_map_with_path(  # a small trained B: what bf16 rounding would lose
      lambda p, x: jnp.full_like(x, 1e-4) if lora.is_adapter(p) and p[-1].key == "b" else x, params)
  merged = _leaves(merge(params, policy))
  q = next(k for k in merged if k.endswith("['attn']['q']"))
  assert merged[q].dtype == jnp.float32
  base = np.asarray(_leaves(params)[q], np.float32)
  kept_fp32 = np.mean(np.asarray(merged[q]) != base)
  kept_bf16 = np.mean(np.asarray(jnp.asarray(merged[q], jnp.bfloat16), np.float32) != base)
  assert kept_fp32 > 0.99 and kept_bf16 < 0.5, (kept_fp32, kept_bf16)  # bf16 would have rounded most of it away


def test_lora_keys_other_than_rank_do_not_block_a_resume_without_adapters():
  """At lora.rank = 0 the other lora keys describe nothing the run trained: changing them is no config change."""
  from scalerl_jax.train.checkpoint import config_fingerprint, fingerprint_changes
  off = RunConfig()
  other = dataclasses.replace(off, lora=dataclasses.replace(off.lora, alpha=32.0, targets=("q",)))
  assert fingerprint_changes(config_fingerprint(off), other) == []
  on = dataclasses.replace(off, lora=dataclasses.replace(off.lora, rank=8))
  assert fingerprint_changes(config_fingerprint(dataclasses.replace(on, lora=dataclasses.replace(on.lora, alpha=32.0))),
                             on) == ["lora.alpha: 32.0 -> 16.0"]
  assert fingerprint_changes(config_fingerprint(off), on) == ["lora.rank: 0 -> 8"]


def test_a_warm_started_base_sits_on_the_trainer_mesh_fresh_and_resumed(tmp_path):
  """The warm start hands back host arrays (trained, or from its cache); the base a LoRA run trains on, fresh and
  rebuilt on a resume, lies on the trainer mesh in the train state's shardings (a multi-process step refuses host
  arrays)."""
  from tests.pipeline_helpers import tiny_job
  keys = ["lora.rank=4", "pipeline.eval_every=0", "warm_start.enabled=true", "warm_start.max_steps=2",
          "warm_start.eval_every=1", f"warm_start.cache_dir={tmp_path / 'ws'}"]
  job = tiny_job(tmp_path / "run", *keys, "pipeline.steps=2")
  job.run()
  again = tiny_job(tmp_path / "run", *keys, "pipeline.steps=4")
  again.setup()
  try:
    assert again.start_step == 2
    for (path, x), want in zip(jax.tree_util.tree_leaves_with_path(again.state.params),
                               jax.tree.leaves(again.parts.state_sh.params)):
      assert isinstance(x, jax.Array) and x.sharding.is_equivalent_to(want, x.ndim), jax.tree_util.keystr(path)
  finally:
    again.release()
