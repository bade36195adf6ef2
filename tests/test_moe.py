"""The MoE policy: the layer against a plain loop over experts (values and gradients, uneven loads, an idle expert),
both dispatches, expert-parallel sharding against one device, the router losses on a hand-computed case, KV-cache
decode against the full forward, a train step on an expert-parallel mesh, and routing replay from the generator's
recorded experts to the trainer's forward."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scalerl_jax import mesh as mesh_lib, types
from scalerl_jax.config import InterruptionConfig, LossConfig, ModelConfig, OptimizerConfig, RolloutConfig
from scalerl_jax.mesh import Layout
from scalerl_jax.model import Routing, make_policy, token_logprobs, token_logprobs_routed
from scalerl_jax.model.moe import MoE, RouterStats, load_balance_loss, z_loss
from scalerl_jax.pipeline.batching import pack_groups
from scalerl_jax.run.job import RLJob
from scalerl_jax.rollout.driver import RolloutDriver
from scalerl_jax.rollout.engine import Engine
from scalerl_jax.rollout.sampling import SamplingParams
from scalerl_jax.train.rl_loss import PromptLayout, make_rl_loss, router_metrics
from scalerl_jax.train.state import init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step
from tests.model_helpers import full_and_cached
from tests.pipeline_helpers import tiny_config

CFG = ModelConfig(family="moe", vocab_size=32, hidden=32, intermediate=48, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=16, max_seq_len=32, num_experts=4, experts_per_token=2, moe_intermediate=24,
                  mlp_only_layers=(1,), shared_expert_intermediate=16)


def layer_and_input(cfg=CFG, tokens=24, seed=0):
  layer = MoE(cfg, nnx.Rngs(seed))
  # inputs share a positive offset, so a router column of -1s scores every token far below the others: uneven
  # loads and an idle expert 3
  x = jax.random.normal(jax.random.key(seed + 1), (2, tokens // 2, cfg.hidden)) + 2.0
  layer.router[...] = layer.router[...].at[:, 3].set(-1.0)
  return layer, x


def expert_choice(layer: MoE, x_BTD):
  """Each token's k most probable experts, chosen in Python from concrete router probabilities."""
  probs = np.asarray(jax.nn.softmax(x_BTD.reshape(-1, layer.cfg.hidden) @ layer.router[...], axis=-1))
  return [sorted(range(layer.cfg.num_experts), key=lambda e: -probs[u, e])[:layer.cfg.experts_per_token]
          for u in range(probs.shape[0])]


def loop_reference(layer: MoE, x_BTD, choice):
  """Token by token, expert by expert, in plain Python: sum_k gate * swiglu_e(x) (+ shared expert)."""
  cfg = layer.cfg
  x_UD = x_BTD.reshape(-1, cfg.hidden)
  probs = jax.nn.softmax(x_UD @ layer.router[...], axis=-1)
  rows = []
  for u in range(x_UD.shape[0]):
    order = choice[u]
    gates = jnp.stack([probs[u, e] for e in order])
    if cfg.norm_topk_prob:
      gates = gates / gates.sum()
    y = 0.0
    for g, e in zip(gates, order):
      h = jax.nn.silu(x_UD[u] @ layer.gate[...][e]) * (x_UD[u] @ layer.up[...][e])
      y = y + g * (h @ layer.down[...][e])
    if layer.shared is not None:
      s = layer.shared
      y = y + (jax.nn.silu(x_UD[u] @ s.gate[...]) * (x_UD[u] @ s.up[...])) @ s.down[...]
    rows.append(y)
  return jnp.stack(rows).reshape(x_BTD.shape)


@pytest.mark.parametrize("dispatch", ["ragged", "dense"])
def test_moe_layer_equals_a_loop_over_experts_values_and_gradients(dispatch):
  cfg = dataclasses.replace(CFG, moe_dispatch=dispatch)
  layer, x = layer_and_input(cfg)
  y, stats = layer(x)
  load = np.asarray(stats.load_E)
  assert load[3] == 0 and len(set(load[:3].tolist())) > 1, f"want uneven loads and an idle expert, got {load}"
  assert load.sum() == x.shape[0] * x.shape[1] * cfg.experts_per_token
  choice = expert_choice(layer, x)
  np.testing.assert_allclose(y, loop_reference(layer, x, choice), atol=1e-5)

  graphdef, state = nnx.split(layer)
  def total(state, x, fn):
    return jnp.sum(fn(nnx.merge(graphdef, state), x) * jnp.cos(jnp.arange(x.size).reshape(x.shape)))
  ours = jax.grad(total, argnums=(0, 1))(state, x, lambda m, x: m(x)[0])
  ref = jax.grad(total, argnums=(0, 1))(state, x, lambda m, x: loop_reference(m, x, choice))
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, atol=1e-4)
  g_router = ours[0]["router"][...]
  assert float(jnp.abs(g_router).sum()) > 0  # the gates carry gradient to the router
  np.testing.assert_array_equal(ours[0]["gate"][...][3], 0.0)  # the idle expert gets no gradient


def test_routing_is_per_token_so_batch_composition_never_changes_a_tokens_experts():
  layer, x = layer_and_input()
  _, both = layer(x)
  _, first = layer(x[:1])
  np.testing.assert_array_equal(both.expert_ids_BTk[:1], first.expert_ids_BTk)


def test_router_losses_on_a_hand_computed_case():
  # 2 tokens, E = 2, k = 1. probs: token 0 [0.75, 0.25], token 1 [0.5, 0.5]; both routed to expert 0.
  # f = load / (tokens * k) = [2, 0] / 2 = [1, 0]; P = mean probs = [0.625, 0.375]
  # aux = E * sum f * P = 2 * (1 * 0.625 + 0 * 0.375) = 1.25
  # logits token 0 [ln 3, 0] -> logsumexp = ln 4; token 1 [0, 0] -> ln 2; z = (ln4^2 + ln2^2) / 2 = 2.5 * ln2^2
  stats = RouterStats(expert_ids_BTk=jnp.zeros((0,), jnp.int32), prob_sum_E=jnp.array([1.25, 0.75]),
                      load_E=jnp.array([2.0, 0.0]), z_sum=jnp.float32(np.log(4) ** 2 + np.log(2) ** 2),
                      tokens=jnp.float32(2), mismatched=jnp.float32(0), compared=jnp.float32(0))
  np.testing.assert_allclose(load_balance_loss(stats, k=1), 1.25, rtol=1e-6)
  np.testing.assert_allclose(z_loss(stats), 2.5 * np.log(2) ** 2, rtol=1e-6)
  # the layer produces those sums from real logits
  cfg = ModelConfig(family="moe", hidden=2, num_experts=2, experts_per_token=1, moe_intermediate=2)
  layer = MoE(cfg, nnx.Rngs(0))
  layer.router[...] = jnp.array([[np.log(3), 0.0], [0.0, 0.0]])
  _, got = layer(jnp.array([[[1.0, 0.0], [0.0, 1.0]]]))
  np.testing.assert_allclose(got.prob_sum_E, [1.25, 0.75], rtol=1e-6)
  np.testing.assert_allclose(got.load_E, [2.0, 0.0])  # token 1's tie goes to the lower index
  np.testing.assert_allclose(load_balance_loss(got, 1), 1.25, rtol=1e-6)
  np.testing.assert_allclose(z_loss(got), 2.5 * np.log(2) ** 2, rtol=1e-5)
  # uniform routing gives exactly 1
  uniform = dataclasses.replace(stats, prob_sum_E=jnp.array([1.0, 1.0]), load_E=jnp.array([1.0, 1.0]))
  np.testing.assert_allclose(load_balance_loss(uniform, k=1), 1.0)


def test_moe_policy_kv_cache_decode_equals_full_forward():
  policy = make_policy(CFG)
  params = policy.init(0)
  full, cached = full_and_cached(policy)
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, CFG.vocab_size)
  ref = full(params, tokens)
  cache = policy.init_cache(2, 16)
  logits, cache = cached(params, tokens[:, :5], jnp.broadcast_to(jnp.arange(5), (2, 5)), cache)
  steps = [logits]
  for t in range(5, 9):
    logits, cache = cached(params, tokens[:, t:t + 1], jnp.full((2, 1), t), cache)
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), ref, atol=2e-5)


def _expert_layout(spec="data=2,fsdp=1,tensor=1,expert=4"):
  return Layout(mesh_lib.make_mesh(spec, jax.devices()[:8]), mesh_lib.TRAIN_RULES)


@pytest.mark.parametrize("spec", ["data=2,fsdp=1,tensor=1,expert=4", "data=1,fsdp=1,tensor=2,expert=4"])
def test_expert_parallel_forward_equals_one_device(spec):
  policy = make_policy(CFG)
  params = policy.init(0)
  tokens = jax.random.randint(jax.random.key(4), (4, 10), 0, CFG.vocab_size)
  layout = _expert_layout(spec)
  shardings = layout.shardings(policy.logical_axes, policy.param_shapes)
  gate_spec = shardings["blocks"][0]["moe"]["gate"].spec
  tensor = layout.mesh.shape["tensor"]
  # the experts really are split over 4 devices (and each expert's FFN over `tensor`)
  assert gate_spec[0] == "expert" and gate_spec[2] == ("tensor" if tensor > 1 else None), gate_spec
  sharded = jax.device_put(params, shardings)
  shard = sharded["blocks"][0]["moe"]["gate"].addressable_shards[0].data
  assert shard.shape == (CFG.num_experts // 4, CFG.hidden, CFG.expert_width // tensor)
  fn = jax.jit(lambda p, t: token_logprobs(policy, p, t))
  one = fn(jax.device_put(params, jax.devices()[0]), tokens)
  many = fn(sharded, jax.device_put(tokens, layout.batch(2, 4)))
  np.testing.assert_allclose(many, one, atol=2e-5)


def _batch(B=8, T=10, seed=5, routes_Xk=None):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  mask[:, 4:] = 1
  routes = None if routes_Xk is None else rng.integers(0, CFG.num_experts, (B, T) + routes_Xk).astype(np.int16)
  return types.TrainBatch(tokens=tokens, loss_mask=mask, gen_logprobs=np.full((B, T), -3.0, np.float32),
                          advantages=rng.normal(size=B).astype(np.float32), token_weights=mask / mask.sum(),
                          sample_weights=np.full(B, 1.0 / B, np.float32), prompt_lengths=np.full(B, 4, np.int32),
                          routes=routes)


def test_train_step_on_an_expert_parallel_mesh_equals_one_device():
  policy = make_policy(CFG)
  opt = make_optimizer(OptimizerConfig(lr=1e-2, warmup_steps=0))
  loss_fn = make_rl_loss(policy, LossConfig(), 1.0, replay=True, micro_batches=2)
  routes_Xk = (len(CFG.moe_layers), CFG.experts_per_token)
  batch = _batch(routes_Xk=routes_Xk)
  results = []
  for layout in (Layout(mesh_lib.make_mesh("data=1,fsdp=1,tensor=1,expert=1", jax.devices()[:1]),
                        mesh_lib.TRAIN_RULES), _expert_layout()):
    sh = state_shardings(policy, opt, layout)
    state = init_train_state(policy, opt, layout, 0)
    batch_sh = types.TrainBatch.of(layout.batch(1, 8), layout.batch(2, 8), routes=layout.batch(4, 8))
    step = make_train_step(loss_fn, opt, 2, sh, batch_sh)
    state, metrics = step(state, jax.device_put(batch, batch_sh))
    results.append((jax.device_get(state.params), jax.device_get(metrics)))
  (p1, m1), (p8, m8) = results
  assert state.params["blocks"][0]["moe"]["down"].sharding.spec[0] == "expert"  # the second run was split
  assert int(m8["skipped"]) == 0 and float(m8["moe_compared"]) > 0
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(a, b, atol=2e-5)
  out = router_metrics(m8)
  np.testing.assert_allclose(out["moe/aux_loss"], router_metrics(m1)["moe/aux_loss"], rtol=1e-5)
  assert 0 < out["moe/router_mismatch_frac"] <= 1  # random recorded ids mostly differ from the router's own
  # under replay the loads are the recorded ids' counts over every token (the mask covers prompt + completion)
  want_XE = np.stack([np.bincount(batch.routes[:, :, j].ravel(), minlength=CFG.num_experts)
                      for j in range(routes_Xk[0])])
  for m in (m1, m8):
    np.testing.assert_array_equal(np.asarray(m["moe_load_XE"]), want_XE)
  want_ratio = (want_XE.max(axis=1) / want_XE.mean(axis=1))
  np.testing.assert_allclose([out[f"moe/load_max_over_mean_l{j}"] for j in range(routes_Xk[0])], want_ratio)
  np.testing.assert_allclose(out["moe/load_max_over_mean"], want_ratio.max())


def test_router_losses_join_the_loss_with_their_coefficients():
  policy = make_policy(CFG)
  params = policy.init(0)
  batch = jax.tree.map(jnp.asarray, _batch())
  off = make_rl_loss(policy, dataclasses.replace(LossConfig(), router_aux_coef=0.0, router_z_coef=0.0), 1.0)
  on = make_rl_loss(policy, dataclasses.replace(LossConfig(), router_aux_coef=0.5, router_z_coef=0.25), 1.0)
  base, m = off(params, batch)
  total, _ = on(params, batch)
  np.testing.assert_allclose(total - base, 0.5 * m["moe_aux_sum"] + 0.25 * m["moe_z_sum"], rtol=1e-5)
  assert float(m["moe_aux_sum"]) > 0.5 and float(m["moe_z_sum"]) > 0



def test_shared_prompt_layout_gives_the_full_row_router_losses_and_metrics():
  """The router counts each row's prompt and sampled completion tokens in both layouts. Row 0's completion starts
  inside the prompt width, so the prompt pass (run on each group's first row) sees its first completion tokens:
  they must count once, in the completion pass, as in the full rows."""
  policy = make_policy(CFG)
  params = policy.init(0)
  G, W, N = 2, 6, 5
  T = W + N
  prompt_len_P, done_B = np.array([3, 6, 4, 5]), np.array([5, 2, 4, 5, 1, 3, 5, 4])
  B = G * len(prompt_len_P)
  rng = np.random.default_rng(7)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  prompt_len_B = np.repeat(prompt_len_P, G).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  for b in range(B):  # rows of a group share the prompt; each row's completion has its own length
    tokens[b, :prompt_len_B[b]] = tokens[b - b % G, :prompt_len_B[b]]
    mask[b, prompt_len_B[b]:prompt_len_B[b] + done_B[b]] = 1
  routes = rng.integers(0, CFG.num_experts, (B, T, len(CFG.moe_layers), CFG.experts_per_token)).astype(np.int16)
  for b in range(B):  # the generator records one prompt's experts for every row of its group
    routes[b, :prompt_len_B[b]] = routes[b - b % G, :prompt_len_B[b]]
  batch = jax.tree.map(jnp.asarray, types.TrainBatch(
      tokens=tokens, loss_mask=mask, gen_logprobs=np.full((B, T), -3.0, np.float32),
      advantages=rng.normal(size=B).astype(np.float32), token_weights=mask / mask.sum(),
      sample_weights=np.full(B, 1.0 / B, np.float32), prompt_lengths=prompt_len_B, routes=routes))
  layout = PromptLayout(G, W, N)
  assert prompt_len_B[0] < W and mask[0, prompt_len_B[0]:W].sum() == 3  # row 0's completion inside the prompt width
  assert layout.trained_tokens(B) < B * T  # the two sides run the model on different token sets
  cfg = dataclasses.replace(LossConfig(), router_aux_coef=0.5, router_z_coef=0.25)
  full_loss, full = make_rl_loss(policy, cfg, 1.0, replay=True)(params, batch)  # replay: loads are recorded counts
  shared_loss, shared = make_rl_loss(policy, cfg, 1.0, layout, replay=True)(params, batch)
  tokens_counted = float(G * prompt_len_P.sum() + done_B.sum())  # every row's prompt and completion, once each
  assert float(full["moe_compared"]) == tokens_counted * len(CFG.moe_layers)
  for key in ("moe_compared", "moe_mismatched", "moe_load_XE"):
    np.testing.assert_array_equal(np.asarray(shared[key]), np.asarray(full[key]), err_msg=key)
  for key in ("moe_aux_sum", "moe_z_sum"):
    np.testing.assert_allclose(float(shared[key]), float(full[key]), rtol=1e-5, err_msg=key)
  np.testing.assert_allclose(float(shared_loss), float(full_loss), rtol=1e-5)
  want, got = router_metrics(full), router_metrics(shared)
  assert want.keys() == got.keys()
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)


# ---- routing replay ---------------------------------------------------------------------------------------

REPLAY = dataclasses.replace(CFG, experts_per_token=1, shared_expert_intermediate=0, mlp_only_layers=())
ROLLOUT = RolloutConfig(max_slots=8, max_prefill_len=8, prefill_buckets=(8,), max_new_tokens=8, decode_chunk=3,
                        interruption=InterruptionConfig(enabled=False))


@pytest.fixture(scope="module")
def generated():
  """A generator's groups from an MoE policy (top-1: the gate of the one chosen expert is 1 whatever the router
  says, so under replay the trainer's log-probs cannot depend on its router at all)."""
  policy = make_policy(REPLAY)
  engine = Engine(policy, ROLLOUT, mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES))
  params = engine.init_params(0)
  params = {**params, "embed": params["embed"] * 0.3}
  driver = RolloutDriver(engine, seed=0, sampling=SamplingParams(temperature=1.0))
  prompts = [types.Prompt(f"p{i}", "", "", np.array([1, 2 + i, 5, 3 + i, 7], np.int32)[:3 + i]) for i in range(3)]
  groups = driver.generate_all(params, 0, prompts, n=2)
  return policy, params, groups


def test_engine_records_every_fed_positions_experts(generated):
  policy, params, groups = generated
  s = groups[0].samples[0]
  L, N = len(s.prompt_tokens), len(s.tokens)
  assert s.routes.shape == (L + N - 1, len(REPLAY.moe_layers), 1) and s.routes.dtype == np.int16
  # the trainer's own top-1 on the same sequence equals what prefill + decode recorded (same params)
  seq = jnp.asarray(np.concatenate([s.prompt_tokens, s.tokens])[None])
  _, _, router = policy.forward_routed(params, seq)
  own = np.stack([np.asarray(r.expert_ids_BTk[0]) for r in router], axis=1)[:L + N - 1]
  assert (own == s.routes).mean() > 0.95  # decode and full forward differ only in rounding


def test_routing_replay_makes_trainer_logprobs_independent_of_its_router(generated):
  policy, params, groups = generated
  packed = pack_groups([types.ScoredGroup(g.prompt, g.samples, np.zeros(2, np.float32), np.zeros(2, bool))
                        for g in groups], 16, 0)
  mask = packed.loss_mask_BT > 0
  gen = packed.gen_logprobs_BT[mask]
  perturbed = jax.tree.map(lambda x: x, params)
  for i in REPLAY.moe_layers:  # a new router after generation: most tokens would pick other experts
    r = perturbed["blocks"][i]["moe"]["router"]
    perturbed["blocks"][i]["moe"]["router"] = jax.random.normal(jax.random.key(100 + i), r.shape) * 3.0

  def logp(p, replay):
    routing = Routing(jnp.asarray(packed.routes_BTXk), jnp.asarray(mask, jnp.float32), replay=replay)
    out, router = token_logprobs_routed(policy, p, jnp.asarray(packed.tokens_BT), 1.0, routing)
    return np.asarray(out)[mask], router

  same_params, _ = logp(params, False)
  np.testing.assert_allclose(same_params, gen, atol=1e-4)  # the sampler's log-probs, reproduced
  replayed, router = logp(perturbed, True)
  own, _ = logp(perturbed, False)
  mismatch = sum(float(r.mismatched) for r in router) / sum(float(r.compared) for r in router)
  assert mismatch > 0.3, mismatch  # the perturbed router's own choice differs from the generator's
  assert np.abs(own - gen).max() > 0.05  # without replay the log-probs move
  np.testing.assert_allclose(replayed, gen, atol=1e-4)  # with replay they are the generator's


def test_pipeline_run_with_an_moe_policy_reports_routing(tmp_path):
  """PipelineRL-1 with an MoE policy: trainer on 4 devices with the experts split over them, generators on the
  other 4; routing replay on. Every step's metrics carry the router losses, the mismatch and the expert loads."""
  moe = ["model.family=moe", "model.num_experts=4", "model.experts_per_token=2", "model.moe_intermediate=32",
         "model.num_layers=2", "model.mlp_only_layers=[0]", "rollout.routing_replay=true",
         "mesh.generator_devices=4", "mesh.spec=data=1,fsdp=1,tensor=1,expert=4",
         "mesh.generator_spec=data=2,tensor=1,expert=2", "pipeline.max_lag=1", "pipeline.steps=4",
         "pipeline.eval_every=0", "checkpoint.every_steps=100", "trainer.micro_batches=2"]
  job = RLJob(tiny_config(tmp_path, *moe), progress=False)
  job.run()
  assert job.state.params["blocks"][1]["moe"]["gate"].sharding.spec[0] == "expert"
  rows = [json.loads(l) for l in (job.run_dir / "metrics.jsonl").read_text().splitlines()]
  steps = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in steps] == [1, 2, 3, 4]
  for r in steps:
    assert 0.0 <= r["moe/router_mismatch_frac"] <= 1.0
    per_layer = [v for k, v in r.items() if k.startswith("moe/load_max_over_mean_l")]
    assert len(per_layer) == 1 and r["moe/load_max_over_mean"] == per_layer[0]  # one MoE layer (layer 0 is dense)
    assert r["moe/aux_loss"] > 0 and r["moe/z_loss"] > 0
  # the generator's params after the last sync equal the trainer's (weight sync is family-blind)
  gen, version = job.weights.latest()
  assert version == 4
  for a, b in zip(jax.tree.leaves(gen), jax.tree.leaves(job.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
