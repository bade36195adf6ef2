"""Tunix's side of benchmarks/compare_peers.py: tunix.rl.grpo's GRPOLearner on an RLCluster (vanilla rollout
engine, colocated on one mesh), set up as Tunix's GRPO demo script (scripts/grpo_demo_llama3_qwen2.py) does, with
its Qwen3 model (tunix.models.qwen3) or, for a pretrained Llama checkpoint, its Llama3 model (tunix.models.llama3)
loaded from the benchmark's safetensors checkpoint. Runs in Tunix's own virtual environment: scalerl_jax is not
installed there; only a workload whose reward is one of its verifiers imports that module from the repository.

A pretrained Llama (the smollm2 workload) takes two adaptations, each measured against transformers' logits on the
converted tiny GGUF fixture: Tunix 0.1.7's llama3 Attention calls apply_rope without the config's rope_theta (the
function's default 1e6 applies to every checkpoint; max |logit difference| 2.76), so the checkpoint's theta is bound
to it (1.1e-5); and Tunix masks every prompt token equal to the pad id (tunix.generate.sampler, rl.common), which
SmolLM2's tokenizer sets to <|im_end|>, a token inside every chat prompt, so the pad becomes a token no prompt holds
(<|endoftext|>). Chat prompts come pre-rendered (the prompts file's `rendered`); the sampler's tokenization of each
(BOS prepended, then de-duplicated) is checked against our ids.

    python benchmarks/peers/tunix_worker.py SPEC.json     # speaks peer_common's JSON-lines protocol

The learner's train loop pulls one batch of prompts per step from its dataset iterator; that iterator is where the
rounds are cut: it blocks on the driver's next command once a round's steps are pulled, and a step ends when the
next batch is pulled (after the optimizer step and the weight sync). Sampling time is `rl_cluster.generate`,
training time `rl_cluster.update_actor`, both wrapped for timing only.
"""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402


def optimizer(spec: dict):
  """default: the demo script's AdamW (b2 0.99, weight decay 0.1, warmup 10 % then cosine decay to 0 over the run,
  global-norm clip 0.1) at the benchmark's peak lr; matched: the AdamW every system runs in the matched rows."""
  import optax
  lr = spec["lr"]
  if spec["optimizer"] == "matched":
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
  steps = spec["max_steps"]
  schedule = optax.schedules.warmup_cosine_decay_schedule(init_value=0.0, peak_value=lr, warmup_steps=0.1 * steps,
                                                          decay_steps=steps, end_value=0.0)
  return optax.chain(optax.clip_by_global_norm(0.1), optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=0.1))


# the pad token of a checkpoint whose own pad is a token inside its prompts (SmolLM2's <|im_end|>)
PAD_FALLBACK = "<|endoftext|>"


def random_qwen3(spec: dict, mesh):
  """The random init's Qwen3, shaped by the workload's model dict."""
  from tunix.models.qwen3 import model as qwen3_lib
  from tunix.models.qwen3 import params as qwen3_params
  m = spec["model"]
  config = qwen3_lib.ModelConfig(
      num_layers=m["num_layers"], vocab_size=m["vocab_size"], embed_dim=m["hidden"], hidden_dim=m["intermediate"],
      num_heads=m["num_heads"], head_dim=m["head_dim"], num_kv_heads=m["num_kv_heads"], rope_theta=m["rope_theta"],
      norm_eps=m["norm_eps"], use_tied_embedding=True)
  return qwen3_params.create_model_from_safe_tensors(spec["checkpoint"], config, mesh)


def pretrained_llama(checkpoint: str, mesh):
  """A Llama-architecture Hugging Face checkpoint as Tunix's Llama3, its config read from config.json, with the
  checkpoint's rope theta bound to tunix.models.llama3's apply_rope (its Attention does not pass the config's)."""
  import functools
  import json
  from tunix.models.llama3 import model as llama3_lib
  from tunix.models.llama3 import params as llama3_params
  with open(f"{checkpoint}/config.json") as f:
    hf = json.load(f)
  if hf["model_type"] != "llama":
    raise ValueError(f"{checkpoint}: model_type {hf['model_type']!r}; this worker loads llama checkpoints")
  theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta"))
  config = llama3_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
      head_dim=hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"]),
      num_kv_heads=hf["num_key_value_heads"], rope_theta=theta, norm_eps=hf["rms_norm_eps"],
      weight_tying=hf.get("tie_word_embeddings", False))
  if not isinstance(llama3_lib.apply_rope, functools.partial):
    llama3_lib.apply_rope = functools.partial(llama3_lib.apply_rope, rope_theta=theta)
  return llama3_params.create_model_from_safe_tensors(checkpoint, config, mesh)


class TunixWorker:

  def __init__(self, spec: dict, proto: peer_common.Protocol):
    import jax
    import transformers
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    self.spec, self.proto = spec, proto
    t = spec["tunix"]
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = pretrained_llama(spec["checkpoint"], mesh) if spec.get("pretrained") else random_qwen3(spec, mesh)
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(spec["checkpoint"])
    self.prompts = peer_common.read_jsonl(spec["prompts"])
    self.expected_ids = {self._text(r): r["prompt_ids"] for r in self.prompts if "prompt_ids" in r}
    if any(self.tokenizer.pad_token_id in ids for ids in self.expected_ids.values()):
      self.tokenizer.pad_token = PAD_FALLBACK
      if any(self.tokenizer.pad_token_id in ids for ids in self.expected_ids.values()):
        raise ValueError(f"{PAD_FALLBACK} (id {self.tokenizer.pad_token_id}) is inside a prompt: no pad token")
    self.score_one = peer_common.load_reward(spec.get("reward", "peer_common.digit_fraction"), spec.get("repo", ""))
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                      rl_cluster_lib.Role.ROLLOUT: mesh},
        rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optimizer(spec), eval_every_n_steps=10 ** 9, max_steps=10 ** 9,
            mini_batch_size=spec["prompts_per_step"], train_micro_batch_size=spec["prompts_per_step"]),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=spec["max_new_tokens"], max_prompt_length=t["max_prompt_length"],
            kv_cache_size=t["kv_cache_size"], temperature=spec["temperature"], top_p=1.0, top_k=None,
            seed=None))
    self.cluster = rl_cluster_lib.RLCluster(actor=model, reference=None, tokenizer=self.tokenizer,
                                            cluster_config=cluster_config)
    algo = grpo_learner.GRPOConfig(num_generations=spec["samples"], num_iterations=1, beta=0.0, epsilon=0.2)
    self.learner = grpo_learner.GRPOLearner(rl_cluster=self.cluster, reward_fns=self.reward, algo_config=algo)
    self._wrap("generate", "gen_s", self._count_tokens)
    self._wrap("update_actor", "train_s")
    self._checked = 0
    if self.expected_ids:
      self._check_tokenize(self.cluster.rollout._sampler)
    self.clock = peer_common.StepClock()
    self.step = 0
    self._tokens, self._rewards = 0, []
    self.versions = {"jax": jax.__version__, "devices": len(jax.devices()),
                     "params": int(sum(x.size for x in jax.tree.leaves(
                         __import__("flax").nnx.state(model, __import__("flax").nnx.Param))))}

  def _wrap(self, name: str, bucket: str, after=None) -> None:
    fn = getattr(self.cluster, name)

    def timed(*args, **kwargs):
      t = time.perf_counter()
      out = fn(*args, **kwargs)
      self.clock.add(bucket, time.perf_counter() - t)
      if after is not None:
        after(out)
      return out
    setattr(self.cluster, name, timed)

  def _check_tokenize(self, sampler) -> None:
    """The sampler's own tokenization of each prompt string, checked against our ids as it is made."""
    tokenize = sampler.tokenize

    def checked(text):
      ids = tokenize(text)
      self._checked += peer_common.check_prompt_ids([self.expected_ids[text]], [list(ids)], "tunix")
      return ids
    sampler.tokenize = checked

  def _text(self, row: dict) -> str:
    return row["rendered"] if self.spec.get("chat") else row["prompt"]

  def _count_tokens(self, rollout_output) -> None:
    self._tokens += sum(len(t) for t in rollout_output.tokens)

  def reward(self, prompts, completions, answer, **kwargs):
    scores = [self.score_one(c, a) for c, a in zip(completions, answer)]
    self._rewards.extend(scores)
    return scores

  def _end_step(self) -> None:
    n = len(self._rewards)
    self.proto.send(self.clock.end_step(self.step, self._tokens, n, sum(self._rewards) / max(n, 1),
                                        prompt_ids_checked=self._checked))
    self.step += 1
    self._tokens, self._rewards, self._checked = 0, [], 0

  def batches(self):
    """The learner's dataset: one batch per step, cut into the driver's rounds."""
    import numpy as np
    source = peer_common.prompt_batches(self.prompts, self.spec["prompts_per_step"])
    left, in_round = 0, False
    while True:
      if in_round:
        self._end_step()  # the previous step ended when its successor's batch is pulled
      if left == 0:
        if in_round:
          self.proto.send({"done": True})
        cmd = self.proto.command()
        if cmd["cmd"] != "run":
          return
        left, in_round = int(cmd["steps"]), True
        self.clock.start_round()
      rows = next(source)
      left -= 1
      # arrays, as a grain dataset yields them: the learner repeats every leaf G times with np.repeat
      yield {"prompts": np.array([self._text(r) for r in rows]), "answer": np.array([r["answer"] for r in rows])}


def main() -> None:
  import importlib.metadata as md
  proto = peer_common.Protocol()
  spec = peer_common.load_spec(sys.argv)
  t = time.perf_counter()
  worker = TunixWorker(spec, proto)
  versions = {p: md.version(p) for p in ("google-tunix", "jax", "flax", "optax", "transformers")}
  proto.send({"ready": True, "info": {"system": "tunix", **worker.versions, "packages": versions,
                                      "loss": "GRPOConfig(beta=0, epsilon=0.2, loss_agg_mode=sequence-mean-token-mean)",
                                      "optimizer": spec["optimizer"], "rollout_engine": "vanilla",
                                      "pad_token": worker.tokenizer.pad_token,
                                      "prompt_width": spec["tunix"]["max_prompt_length"],
                                      "kv_cache": spec["tunix"]["kv_cache_size"], "setup_s": time.perf_counter() - t}})
  worker.learner.train(worker.batches())


if __name__ == "__main__":
  main()
