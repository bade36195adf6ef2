"""Range and cross-field checks of a RunConfig, collected into one ConfigError that names every bad key."""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from typing import Any

from scalerl_jax.config.schema import LORA_TARGETS, ConfigError, ModelConfig, RunConfig
from scalerl_jax.errors import UserError


def validate(cfg: RunConfig) -> RunConfig:
  """Checks values that types cannot; raises one ConfigError naming every bad key."""
  errors: list[str] = []

  def need(ok: bool, key: str, msg: str) -> None:
    if not ok:
      errors.append(f"{key}: {msg} (got {functools.reduce(getattr, key.split('.'), cfg)!r})")

  m = cfg.model
  for key in ("vocab_size", "hidden", "intermediate", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "max_seq_len"):
    need(getattr(m, key) > 0, f"model.{key}", "must be positive")
  need(m.num_kv_heads > 0 and m.num_heads % max(m.num_kv_heads, 1) == 0, "model.num_kv_heads",
       f"must divide model.num_heads={m.num_heads}")
  need(m.head_dim % 2 == 0, "model.head_dim", "must be even (RoPE rotates pairs)")
  need(m.rope_theta > 0, "model.rope_theta", "must be positive")
  need(m.rope_factor >= 1, "model.rope_factor", "must be >= 1 (llama3 divides long wavelengths' frequencies by it)")
  need(m.rope_low_freq_factor > 0, "model.rope_low_freq_factor", "must be positive")
  need(m.rope_high_freq_factor > m.rope_low_freq_factor, "model.rope_high_freq_factor",
       f"must be > model.rope_low_freq_factor={m.rope_low_freq_factor} (the band between them is interpolated)")
  need(m.rope_original_max_positions > 0, "model.rope_original_max_positions", "must be positive")
  if m.rope_scaling == "default":  # a llama3 setting without rope_scaling=llama3 would be silently ignored
    defaults = ModelConfig()
    for f in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_positions"):
      default = getattr(defaults, f)
      need(getattr(m, f) == default, f"model.{f}",
           f"is only used with model.rope_scaling=llama3: set that, or leave this key at its default {default!r}")
  if m.family == "moe":
    need(m.num_experts >= 2, "model.num_experts", "must be >= 2 with model.family=moe")
    need(1 <= m.experts_per_token <= max(m.num_experts, 1), "model.experts_per_token",
         f"must be in [1, model.num_experts={m.num_experts}]")
    need(m.moe_intermediate >= 0, "model.moe_intermediate", "must be >= 0 (0: model.intermediate)")
    need(m.shared_expert_intermediate >= 0, "model.shared_expert_intermediate", "must be >= 0 (0: none)")
    need(m.decoder_sparse_step >= 1, "model.decoder_sparse_step", "must be >= 1")
    need(all(0 <= i < m.num_layers for i in m.mlp_only_layers), "model.mlp_only_layers",
         f"must list layers in [0, model.num_layers={m.num_layers})")
    need(bool(m.moe_layers) or m.decoder_sparse_step < 1, "model.mlp_only_layers",
         "leaves no MoE layer (with model.decoder_sparse_step): use model.family=dense")
  else:
    need(m.num_experts == 0, "model.num_experts", "is only used with model.family=moe: set that, or leave it 0")
  need(cfg.loss.router_aux_coef >= 0, "loss.router_aux_coef", "must be >= 0")
  need(cfg.loss.router_z_coef >= 0, "loss.router_z_coef", "must be >= 0")
  sb = cfg.sandbox
  for key in ("cpu_s", "wall_s", "memory_mb", "max_procs", "file_kb", "open_files", "output_kb", "tmp_mb",
              "tmp_files"):
    need(getattr(sb, key) > 0, f"sandbox.{key}", "must be positive")
  need(bool(sb.python), "sandbox.python", "must name the interpreter that runs programs in the sandbox")
  need(sb.memory_cgroup in ("auto", "off") or sb.memory_cgroup.startswith("/"), "sandbox.memory_cgroup",
       "must be 'auto', 'off' or the absolute path of a cgroup directory")
  need(0.0 <= cfg.data.code_fraction <= 1.0, "data.code_fraction", "must be in [0, 1]")
  need(bool(cfg.data.task_field), "data.task_field", "must name the field that holds a row's task")
  need(cfg.curve_fit.target is None or 0 < cfg.curve_fit.target < 1, "curve_fit.target",
       "must be a pass rate in (0, 1) or null")
  r = cfg.rollout
  need(r.max_slots > 0, "rollout.max_slots", "must be positive")
  need(r.temperature >= 0, "rollout.temperature", "must be >= 0 (0 = greedy)")
  need(r.sampler_temperature is None or r.sampler_temperature > 0, "rollout.sampler_temperature",
       "must be > 0 or null (null = rollout.temperature)")
  need(r.sampler_temperature is None or r.temperature > 0, "rollout.temperature",
       "must be > 0 with rollout.sampler_temperature set (the trainer's log-probs are at it)")
  need(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
  need(r.top_k >= 0, "rollout.top_k", "must be >= 0 (0 = off)")
  need(r.decode_chunk > 0, "rollout.decode_chunk", "must be positive")
  need(r.max_new_tokens > 0, "rollout.max_new_tokens", "must be positive")
  need(len(r.prefill_buckets) > 0 and list(r.prefill_buckets) == sorted(r.prefill_buckets)
       and r.prefill_buckets[-1] == r.max_prefill_len, "rollout.prefill_buckets",
       f"must be increasing and end at rollout.max_prefill_len={r.max_prefill_len}")
  need(r.max_prefill_len + r.max_new_tokens <= m.max_seq_len, "model.max_seq_len",
       f"must hold rollout.max_prefill_len + rollout.max_new_tokens = {r.max_prefill_len + r.max_new_tokens}")
  it = r.interruption
  need(0 < it.think_budget_min <= it.think_budget_max, "rollout.interruption.think_budget_min",
       f"must be in [1, think_budget_max={it.think_budget_max}]")
  need(it.answer_budget > 0, "rollout.interruption.answer_budget", "must be positive")
  l = cfg.loss
  need(l.eps_max > 0, "loss.eps_max", "must be positive (absolute cap on the ratio)")
  need(0 < l.eps_low < 1, "loss.eps_low", "must be in (0, 1)")
  need(l.eps_high > 0, "loss.eps_high", "must be positive")
  need(l.dual_clip is None or l.dual_clip > 1, "loss.dual_clip", "must be > 1 or null")
  need(l.log_ratio_clamp > 0, "loss.log_ratio_clamp", "must be positive")
  need(l.mismatch_cap >= 1, "loss.mismatch_cap", "must be >= 1 (a cap below 1 would shrink on-policy tokens)")
  for low, high in (("mismatch_low", "mismatch_high"), ("mismatch_seq_low", "mismatch_seq_high")):
    need(0 <= getattr(l, low) < 1, f"loss.{low}", "must be in [0, 1) (a ratio of 1, no mismatch, is always kept)")
    need(getattr(l, high) > 1, f"loss.{high}", "must be > 1 (a ratio of 1, no mismatch, is always kept)")
  need(l.name != "gspo" or l.mismatch in ("none", "seq_mask"), "loss.mismatch",
       "must be none or seq_mask with loss.name=gspo (a sequence loss: tis and mask are per token)")
  need(l.behavior == "trainer" or l.mismatch != "tis", "loss.mismatch",
       "tis needs loss.behavior=trainer: with behavior=sampler the loss's ratio already weights each token by "
       "w = pi_trainer / pi_sampler and tis would weight it twice (cispo's loss.eps_max is that truncation there)")
  need(l.kl_coef >= 0, "loss.kl_coef", "must be >= 0 (0 = no KL term)")
  need(l.distill_coef > 0, "loss.distill_coef", "must be positive")
  need(bool(l.reference), "loss.reference", "must be initial (the run's starting params) or a checkpoint path")
  per_token = (l.kl_coef > 0 and l.kl_mode == "reward") or bool(l.distill_teacher)
  need(l.name != "gspo" or not per_token, "loss.name",
       "gspo is a sequence loss and takes one advantage per sample: loss.kl_mode=reward and loss.distill_teacher "
       "give one per token (use a token loss, or kl_mode=loss)")
  need(not l.distill_teacher or l.distill_task_reward or not l.zero_variance_filter, "loss.zero_variance_filter",
       "drops the groups whose rewards are all equal, which distillation alone (loss.distill_task_reward=false) "
       "still learns from: set loss.zero_variance_filter=false, or loss.distill_task_reward=true")
  need(l.truncated_reward is None or not l.exclude_truncated, "loss.truncated_reward",
       "scores samples that loss.exclude_truncated=true leaves out of the loss: set one of the two")
  need(0 < l.length_penalty_cache < l.length_penalty_max, "loss.length_penalty_cache",
       f"must be in (0, loss.length_penalty_max={l.length_penalty_max})")
  d = cfg.data
  need(d.prompts_per_step > 0, "data.prompts_per_step", "must be positive")
  need(d.samples_per_prompt > 1, "data.samples_per_prompt", "must be >= 2 (advantages are group-relative)")
  need(d.task != "file" or bool(d.path), "data.path", "is required when data.task=file")
  lo = cfg.lora
  need(lo.rank >= 0, "lora.rank", "must be >= 0 (0: no adapters, every weight trains)")
  if lo.rank > 0:
    need(lo.alpha > 0, "lora.alpha", "must be positive")
    need(lo.dropout == 0, "lora.dropout", "must be 0: dropout in the trainer's forward would make its token "
         "probabilities differ from the sampler's by a random mask each step, which the importance ratios (and the "
         "mismatch metrics) would read as off-policy drift; it is not implemented")
    need(bool(lo.targets) and set(lo.targets) <= set(LORA_TARGETS), "lora.targets",
         f"must be a non-empty list of {', '.join(LORA_TARGETS)}")
  rw = cfg.reward
  need(rw.timeout_s > 0, "reward.timeout_s", "must be positive")
  need(rw.workers >= 1, "reward.workers", "must be >= 1")
  lowest = 0.0 if rw.scale == "01" else -1.0
  need(rw.on_failure is None or rw.on_failure <= lowest, "reward.on_failure",
       f"must be at most the lowest reward of reward.scale={rw.scale} ({lowest:g}) or null, so a failed "
       "verification never scores above a wrong answer")
  need(0 <= rw.unboxed_reward < 1, "reward.unboxed_reward", "must be in [0, 1): a right boxed answer earns 1")
  need(0 <= rw.boxed_wrong_reward < 1, "reward.boxed_wrong_reward", "must be in [0, 1): a right boxed answer earns 1")
  need(d.num_eval > 0, "data.num_eval", "must be positive (the held-out set the curve is measured on)")
  need(d.task == "file" or d.num_train > 0, "data.num_train", "must be positive")
  need(0 < d.npr.threshold <= 1, "data.npr.threshold", "must be in (0, 1]")
  need(d.npr.min_observations >= 1, "data.npr.min_observations", "must be >= 1")
  o = cfg.optimizer
  need(o.lr > 0, "optimizer.lr", "must be positive")
  need(o.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
  need(o.eps > 0, "optimizer.eps", "must be positive")
  need(o.grad_clip >= 0, "optimizer.grad_clip", "must be >= 0 (0 = off)")
  p = cfg.pipeline
  need(p.max_lag >= 0, "pipeline.max_lag", "must be >= 0")
  need(p.mode != "ppo_offpolicy" or p.max_lag >= 1, "pipeline.max_lag", "must be >= 1 for ppo_offpolicy")
  need(p.steps > 0, "pipeline.steps", "must be positive")
  need(cfg.trainer.micro_batches > 0 and d.prompts_per_step % cfg.trainer.micro_batches == 0,
       "trainer.micro_batches", f"must divide data.prompts_per_step={d.prompts_per_step}")
  need(cfg.trainer.max_step_memory_mb >= 0, "trainer.max_step_memory_mb", "must be >= 0 (0: no limit)")
  need(cfg.mesh.cpu_devices >= 0, "mesh.cpu_devices", "must be >= 0 (0: jax's default CPU device count)")
  need(cfg.trainer.batch_buckets >= 1, "trainer.batch_buckets", "must be >= 1 (1: always the whole batch)")
  need(p.eval_samples > 0, "pipeline.eval_samples", "must be positive")
  need(0 < cfg.curve_fit.fit_upto <= 1, "curve_fit.fit_upto", "must be in (0, 1]")
  if cfg.curve_fit.calibration:  # read now, not after the run: the end-of-run fit needs it
    from scalerl_jax.scaling import calibration  # (scaling imports config: loaded on demand)
    try:
      calibration.load(cfg.curve_fit.calibration)
    except UserError as e:
      errors.append(f"curve_fit.calibration: {e}")
  need(cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
  need(cfg.checkpoint.every_steps > 0, "checkpoint.every_steps", "must be positive")
  need(p.eval_every >= 0, "pipeline.eval_every", "must be >= 0 (0 = no periodic evaluation)")
  need(cfg.trainer.max_skipped_steps >= 1, "trainer.max_skipped_steps", "must be >= 1")
  w = cfg.warm_start
  if w.enabled:
    need(w.max_steps > 0, "warm_start.max_steps", "must be positive (or warm_start.enabled=false)")
    need(w.eval_every > 0, "warm_start.eval_every", "must be positive")
    need(w.batch_size > 0, "warm_start.batch_size", "must be positive")
    need(d.task == "file" or w.batch_size <= d.num_train, "warm_start.batch_size",
         f"must be at most the training pool, data.num_train={d.num_train}")
    need(w.lr > 0, "warm_start.lr", "must be positive")
  need(cfg.mesh.generator_devices >= 0, "mesh.generator_devices", "must be >= 0")
  need(cfg.mesh.generator_processes >= 0, "mesh.generator_processes", "must be >= 0")
  for key, value in _floats(cfg):
    if not math.isfinite(value):
      errors.append(f"{key}: must be a finite number (got {value!r})")
  if errors:
    raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
  return cfg


def _floats(cfg: Any, prefix: str = "") -> list[tuple[str, float]]:
  """Every float-valued key of a config (nested groups included), with its dotted name."""
  out = []
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    if dataclasses.is_dataclass(value):
      out += _floats(value, f"{prefix}{f.name}.")
    elif isinstance(value, float):
      out.append((prefix + f.name, value))
  return out


def validate_with_tokenizer(cfg: RunConfig, tokenizer) -> None:
  """The checks that need the run's tokenizer (built from data.tokenizer): the model's vocabulary holds it, it is
  model.pretrained's own (_check_pretrained_tokenizer), the pretrained model can write the end-of-thinking marker
  (_check_end_marker), and the interruption budget (thinking + the phrase's tokens + answer) fits
  rollout.max_new_tokens."""
  if tokenizer.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"model.vocab_size: {cfg.model.vocab_size} is smaller than the tokenizer's "
                      f"{tokenizer.vocab_size} tokens")
  if cfg.model.pretrained:
    _check_pretrained_tokenizer(cfg, tokenizer)
    _check_end_marker(cfg, tokenizer)
  r, it = cfg.rollout, cfg.rollout.interruption
  phrase = len(tokenizer.encode(it.phrase))
  if it.enabled and it.think_budget_max + phrase + it.answer_budget > r.max_new_tokens:
    raise ConfigError(f"rollout.max_new_tokens: {r.max_new_tokens} cannot hold think_budget_max "
                      f"{it.think_budget_max} + the phrase's {phrase} tokens + answer_budget {it.answer_budget} = "
                      f"{it.think_budget_max + phrase + it.answer_budget}")


# a checkpoint directory holding any of these has a tokenizer of its own
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def _check_end_marker(cfg: RunConfig, tokenizer) -> None:
  """Forced interruption cuts every sample that has not written rollout.interruption.end_marker within its thinking
  budget. A pretrained model writes a thinking marker only if it is one of its tokenizer's added tokens (Qwen3's
  </think>) or its chat template writes it; a non-thinking model (SmolLM2, Llama) never does, and most of its
  samples were cut. Such a marker is refused, not switched off behind the user's back. (A model trained from
  scratch or warm-started learns its task's marker; an empty marker interrupts every sample at its budget.)"""
  from scalerl_jax.data.tokenizer import HFTokenizer

  it = cfg.rollout.interruption
  marker = it.end_marker.strip()
  if not it.enabled or not marker or not isinstance(tokenizer, HFTokenizer):
    return  # the character vocabulary: a checkpoint exported from a built-in task's run, which writes '|'
  templates = [tokenizer.chat_template, tokenizer.chat.source if tokenizer.chat is not None else ""]
  if marker in tokenizer.added_tokens() or any(marker in t for t in templates):
    return
  raise ConfigError(f"rollout.interruption.end_marker: {it.end_marker!r} is not a token of data.tokenizer="
                    f"{cfg.data.tokenizer} (not one of its added tokens, as Qwen3's '</think>' is) and its chat "
                    f"template never writes it: model.pretrained={cfg.model.pretrained} does not end its thinking "
                    "with it, so forced interruption would cut nearly every sample. For a non-thinking model set "
                    "rollout.interruption.enabled=false (rollout.max_new_tokens then bounds the completion); for a "
                    "thinking model set rollout.interruption.end_marker to the marker it writes")


def _check_pretrained_tokenizer(cfg: RunConfig, tokenizer) -> None:
  """data.tokenizer must be model.pretrained's own (ids mean tokens only to the model trained on them): the
  built-in character vocabulary only for a checkpoint without a tokenizer of its own (one exported from a
  character-tokenizer run); any tokenizer must hold the checkpoint's BOS / EOS ids (those of its
  generation_config.json / config.json), and a checkpoint directory's tokenizer must name the same BOS and share an
  EOS id. (The tokenizer fitting the embedding is make_tokenizer's check; Qwen pads vocab_size past its tokenizer.)"""
  from scalerl_jax.model.gguf import gguf_path
  from scalerl_jax.model.hf import special_ids

  m, d = cfg.model.pretrained, pathlib.Path(cfg.model.pretrained)
  hint = f"use the checkpoint's own tokenizer (data.tokenizer={m})"
  if cfg.data.tokenizer == "char":
    own = [n for n in _TOKENIZER_FILES if (d / n).is_file()] or (
        ["tokenizer.ggml.tokens"] if gguf_path(d) is not None else [])  # a GGUF file carries its vocabulary
    if own:
      raise ConfigError(f"data.tokenizer: char (the built-in character vocabulary) with model.pretrained={m}, a "
                        f"checkpoint with its own tokenizer ({own[0]}): the character ids mean other tokens to it; "
                        f"{hint}")
  ids = special_ids(d)
  tok = f"data.tokenizer={cfg.data.tokenizer} ({tokenizer.vocab_size} tokens)"
  for key, got in [("bos_token_id", ids.bos_id)] + [("eos_token_id", i) for i in ids.eos_ids]:
    if got is not None and got >= tokenizer.vocab_size:
      raise ConfigError(f"data.tokenizer: model.pretrained={m} names {key} {got}, not an id of {tok}: a tokenizer "
                        f"of another model; {hint}")
  if getattr(tokenizer, "directory", None) is None:
    return  # a bare tokenizer.json names its special tokens by guesswork (usual names): only the ids are checked
  if ids.bos_id is not None and tokenizer.bos_id is not None and ids.bos_id != tokenizer.bos_id:
    raise ConfigError(f"data.tokenizer: {tok} has BOS id {tokenizer.bos_id} but model.pretrained={m} names "
                      f"bos_token_id {ids.bos_id}: a tokenizer of another model; {hint}")
  if ids.eos_ids and not set(ids.eos_ids) & set(tokenizer.eos_ids):
    raise ConfigError(f"data.tokenizer: {tok} stops on EOS ids {list(tokenizer.eos_ids)} but model.pretrained={m} "
                      f"names eos_token_id {list(ids.eos_ids)}: a tokenizer of another model; {hint}")
