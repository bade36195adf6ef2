"""TRL's side of benchmarks/compare_peers.py: trl.GRPOTrainer (transformers generate on CPU, PyTorch from PyPI)
training the workload's checkpoint (the random Qwen3 or the converted SmolLM2), loaded with
AutoModelForCausalLM.from_pretrained and its tokenizer. Runs in TRL's own virtual environment: scalerl_jax is not
installed there; only a workload whose reward is one of its verifiers imports that module from the repository.

Chat workloads (spec "chat"): each prompt goes in as a conversation of one user turn, which GRPOTrainer renders with
the tokenizer's chat template (apply_chat_template, add_generation_prompt=True); every batch's rendered token ids
are checked against ours (the prompts file's prompt_ids) before the step goes on.

    python benchmarks/peers/trl_worker.py SPEC.json     # speaks peer_common's JSON-lines protocol

Rounds are cut by a TrainerCallback: at the end of each optimizer step it reports the step and, once a round's steps
are done, blocks on the driver's next command. One generation batch per optimizer step (steps_per_generation = 1,
num_iterations = 1): on-policy. Sampling time is `GRPOTrainer._generate`; training time runs from the end of
`_generate_and_score_completions` (sampling, reward, advantages) to the step's end (forward, backward, optimizer).
"""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402


def grpo_args(spec: dict, out_dir: str):
  """default: GRPOConfig's own optimizer settings (AdamW, linear decay to 0 over max_steps, weight decay 0, clip 1)
  at the benchmark's lr; matched: constant lr. Gradient checkpointing (on by default in GRPOConfig) is off: it only
  recomputes activations, which costs time and saves memory this model does not need. loss_type=grpo (each sample's
  token mean, averaged over samples; TRL's default is dapo), rewards scaled by each group's std, beta 0. With the
  spec's micro_batch, the step's generation batch (all its rows, one generate call) trains in micro-batches of that
  many rows with gradients accumulated (steps_per_generation = gradient_accumulation_steps: still one optimizer
  step per generation batch, on-policy, no old-log-prob pass)."""
  from trl import GRPOConfig
  matched = spec["optimizer"] == "matched"
  rows = spec["prompts_per_step"] * spec["samples"]
  micro = spec.get("micro_batch") or rows  # rows per forward/backward; one generation batch per optimizer step
  if rows % micro:
    raise SystemExit(f"trl_worker: micro_batch {micro} does not divide the step's {rows} rows")
  return GRPOConfig(
      output_dir=out_dir, per_device_train_batch_size=micro, gradient_accumulation_steps=rows // micro,
      num_generations=spec["samples"], steps_per_generation=rows // micro, num_iterations=1,
      max_completion_length=spec["max_new_tokens"], temperature=spec["temperature"], top_p=1.0, top_k=0,
      learning_rate=spec["lr"], lr_scheduler_type="constant" if matched else "linear", warmup_steps=0,
      weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
      beta=0.0, loss_type="grpo", scale_rewards="group", max_steps=spec["max_steps"], shuffle_dataset=False,
      logging_steps=10 ** 9, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
      gradient_checkpointing=False, dataloader_num_workers=0, seed=spec["seed"], disable_tqdm=True)


def main() -> None:
  import importlib.metadata as md
  proto = peer_common.Protocol()
  spec = peer_common.load_spec(sys.argv)
  t0 = time.perf_counter()
  import datasets
  import torch
  import transformers
  from trl import GRPOTrainer

  torch.manual_seed(spec["seed"])
  tokenizer = transformers.AutoTokenizer.from_pretrained(spec["checkpoint"], padding_side="left")
  model = transformers.AutoModelForCausalLM.from_pretrained(spec["checkpoint"], dtype=torch.float32)
  score_one = peer_common.load_reward(spec.get("reward", "peer_common.digit_fraction"), spec.get("repo", ""))
  prompts = peer_common.read_jsonl(spec["prompts"])
  expected_ids = {r["prompt"]: r["prompt_ids"] for r in prompts if "prompt_ids" in r}
  source = peer_common.prompt_batches(prompts, spec["prompts_per_step"])
  ordered = [r for _ in range(spec["max_steps"] + 2) for r in next(source)]
  chat = spec.get("chat", False)
  dataset = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}] if chat else r["prompt"],
                                         "answer": r["answer"]} for r in ordered])
  clock = peer_common.StepClock()
  state = {"tokens": 0, "rewards": [], "left": 0, "step": 0, "t_scored": None, "checked": 0}

  def reward(prompts, completions, answer, **kwargs):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # chat: the assistant's turn
    scores = [score_one(c, a) for c, a in zip(texts, answer)]
    state["rewards"].extend(scores)
    return scores

  def wait_for_round() -> bool:
    cmd = proto.command()
    if cmd["cmd"] != "run":
      return False
    state["left"] = int(cmd["steps"])
    clock.start_round()
    return True

  class Rounds(transformers.TrainerCallback):
    def on_step_end(self, args, tstate, control, **kwargs):
      clock.add("train_s", time.perf_counter() - state["t_scored"])
      n = len(state["rewards"])
      proto.send(clock.end_step(state["step"], state["tokens"], n, sum(state["rewards"]) / max(n, 1),
                                prompt_ids_checked=state["checked"]))
      state.update(step=state["step"] + 1, tokens=0, rewards=[], left=state["left"] - 1, checked=0)
      if state["left"] == 0:
        proto.send({"done": True})
        if not wait_for_round():
          control.should_training_stop = True
      return control

  trainer = GRPOTrainer(model=model, reward_funcs=reward, args=grpo_args(spec, spec["run_dir"]),
                        train_dataset=dataset, processing_class=tokenizer, callbacks=[Rounds()])
  generate, score = trainer._generate, trainer._generate_and_score_completions

  def timed_generate(prompts):
    t = time.perf_counter()
    out = generate(prompts)
    clock.add("gen_s", time.perf_counter() - t)
    state["tokens"] += sum(len(ids) for ids in out[1])
    if expected_ids:  # out[0]: the prompt ids the model was fed, one row per sample
      texts = [p[-1]["content"] if isinstance(p, list) else p for p in prompts]
      state["checked"] += peer_common.check_prompt_ids([expected_ids[x] for x in texts], out[0], "trl")
    return out

  def timed_score(batch):
    out = score(batch)
    state["t_scored"] = time.perf_counter()
    return out

  trainer._generate, trainer._generate_and_score_completions = timed_generate, timed_score
  params = sum(p.numel() for p in model.parameters())
  versions = {p: md.version(p) for p in ("trl", "torch", "transformers", "accelerate", "datasets")}
  proto.send({"ready": True, "info": {"system": "trl", "packages": versions, "params": int(params),
                                      "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
                                      "torch_threads": torch.get_num_threads(),
                                      "loss": "GRPOConfig(loss_type=grpo, beta=0, scale_rewards=group)",
                                      "optimizer": spec["optimizer"], "setup_s": time.perf_counter() - t0}})
  if wait_for_round():
    trainer.train()


if __name__ == "__main__":
  main()
