"""Supervised warm start for the built-in tasks, cached on disk.

The paper starts RL from an SFT'd model; the embedded CPU default gets the same from a few hundred steps of
next-token training on the task's reference solutions. Training stops as soon as the pass rate on the task's
warm-start validation split (disjoint from the RL training pool and from the held-out evaluation split) reaches
`warm_start.target_pass_rate`, so RL starts from a policy that sometimes succeeds (RL needs groups with reward
variance) but is far from solved. The pass rate is measured without sampling, as the mean over validation
prompts of P(reference completion) at temperature 1 = exp(sum of its token log-probs): one forward pass instead
of a sampled mean@n, and a lower bound on the expected mean@n (a sample can also pass by another route), with no
sampling noise near the threshold. The result is cached under `warm_start.cache_dir`, keyed by everything that
determines it, as a safetensors file; a second run starts in a second.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import distributed, faults
from scalerl_jax.config import RunConfig
from scalerl_jax.types import StepShapes
from scalerl_jax.mesh import Layout
from scalerl_jax.model import Policy, load_params, next_token_loss, save_params, token_logprobs
from scalerl_jax.train.state import init_train_state, make_optimizer, state_shardings
from scalerl_jax.train.step import make_train_step

log = logging.getLogger(__name__)


def cache_path(cfg: RunConfig, task) -> pathlib.Path:
  """Keyed by everything that determines the warm start, the task's own format included (its first problems)."""
  sample = [(r.text, task.solution(r)) for r in task.train_records()[:3]]
  key = {"sample": sample, "model": dataclasses.asdict(cfg.model), "warm_start": dataclasses.asdict(cfg.warm_start),
         "task": [cfg.data.task, cfg.data.digits, cfg.data.num_train, cfg.data.num_eval, cfg.data.seed,
                  cfg.data.tokenizer, cfg.data.chat_template], "seed": cfg.seed,
         "rollout": [cfg.rollout.max_prefill_len, cfg.rollout.max_new_tokens], "eval_samples": cfg.pipeline.eval_samples}
  if cfg.data.task in ("code", "mixed"):  # (keys of the other tasks unchanged: their caches stay valid)
    key["task"] += [cfg.data.code_digits, cfg.data.code_fraction]
  digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
  return pathlib.Path(cfg.warm_start.cache_dir).expanduser() / f"{cfg.data.task}-{digest}.safetensors"


def supervised_rows(prompts_tokens: list[list[int]], solutions: list[list[int]], row_len: int, pad_id: int):
  """tokens [N, row_len] of prompt + solution, and a mask of the solution tokens."""
  n = len(prompts_tokens)
  tokens = np.full((n, row_len), pad_id, np.int32)
  mask = np.zeros((n, row_len), np.float32)
  for i, (p, s) in enumerate(zip(prompts_tokens, solutions)):
    row = (list(p) + list(s))[:row_len]
    tokens[i, :len(row)] = row
    mask[i, len(p):len(row)] = 1.0
  return tokens, mask


def reference_pass_rate_fn(policy: Policy, tokens_BT: np.ndarray, mask_BT: np.ndarray):
  """jitted params -> mean over rows of P(the masked completion) at temperature 1."""

  @jax.jit
  def pass_rate(params):
    return jnp.mean(jnp.exp(jnp.sum(token_logprobs(policy, params, tokens_BT) * mask_BT, axis=1)))
  return pass_rate


def validation_pass_rate_fn(policy: Policy, task, tokenizer):
  """params -> P(reference completion) on the warm-start validation split; for a mixed-task run, the lowest of the
  tasks' own (so the warm start stops when every task reached the target, not when the easiest one carried the
  average: measured on configs/mixed_cpu.yaml, an average stop left addition at held-out 0.01 while code was at
  0.57)."""
  by_task: dict[str, list] = {}
  for r in task.warmstart_val_records():
    by_task.setdefault(r.task, []).append(r)
  fns = [reference_pass_rate_fn(policy, *solution_rows(task, records, tokenizer)) for records in by_task.values()]
  return lambda params: min(float(fn(params)) for fn in fns)


def solution_rows(task, records, tokenizer):
  """`supervised_rows` of the records' prompts and reference solutions, as long as the longest rounded up to 8."""
  prompts = [tokenizer.encode_prompt(r.text) for r in records]
  solutions = [tokenizer.encode(task.solution(r)) for r in records]
  longest = max(len(p) + len(q) for p, q in zip(prompts, solutions))
  return supervised_rows(prompts, solutions, -(-longest // 8) * 8, tokenizer.pad_id)


def warm_start(cfg: RunConfig, policy: Policy, layout: Layout, task, tokenizer, progress: bool = True,
               stop: Callable[[], bool] = lambda: False) -> tuple[Any, dict]:
  """Params after the supervised warm start (from the cache when present) and a summary dict. `stop` is asked after
  every step (the run's stop flag: a signal); when it says so the warm start ends there, is not cached (the next
  start warms up afresh), and the summary holds `warm_start/stopped`."""
  path = cache_path(cfg, task)
  # several processes: use the cache only if every trainer process sees it (they must all take the same branch)
  trainers = sorted({d.process_index for d in layout.mesh.devices.flat})
  if all(distributed.gather_json(path.exists(), trainers)):
    params = load_params(policy, path)
    return params, {"warm_start/cached": 1.0, "warm_start/path": str(path)}

  ws = cfg.warm_start
  opt = make_optimizer(dataclasses.replace(cfg.optimizer, lr=ws.lr, warmup_steps=0, eps=ws.eps, grad_clip=ws.grad_clip))
  state = init_train_state(policy, opt, layout, seed=cfg.seed)
  # rows as long as the longest example rounded up to 8 (no compute on padding), within the rollout budget
  tokens_all, mask_all = solution_rows(task, task.train_records(), tokenizer)
  budget = StepShapes.from_config(cfg).T
  tokens_all, mask_all = tokens_all[:, :budget], mask_all[:, :budget]
  evaluate = validation_pass_rate_fn(policy, task, tokenizer)
  bsh = layout.batch(2, ws.batch_size)
  step_fn = make_train_step(lambda p, b: next_token_loss(policy, p, b["tokens"], b["weights"]), opt, 1,
                            state_shardings(policy, opt, layout), {"tokens": bsh, "weights": bsh})
  rng = np.random.default_rng(cfg.seed)
  t0, pass_rate, history = time.perf_counter(), 0.0, []
  log.info("warm start: up to %d supervised steps, until P(reference) on the validation split reaches %.3f",
           ws.max_steps, ws.target_pass_rate)
  bar = None
  if progress:
    from scalerl_jax.logs import progress_bar
    bar = progress_bar(ws.max_steps, "warm start (supervised)", "step", leave=False)
  step, stopped = 0, False
  for step in range(1, ws.max_steps + 1):
    idx = rng.choice(len(tokens_all), ws.batch_size, replace=False)
    mask = mask_all[idx]
    batch = jax.device_put({"tokens": tokens_all[idx], "weights": mask / mask.sum()}, bsh)
    faults.point("warm_start_step")
    state, metrics = step_fn(state, batch)
    if bar is not None:
      bar.update(1)
    if step % ws.eval_every == 0:
      pass_rate = float(evaluate(state.params))
      history.append((step, pass_rate))
      if bar is not None:
        bar.set_postfix(loss=f"{float(metrics['loss']):.3f}", pass_rate=f"{pass_rate:.3f}")
      if pass_rate >= ws.target_pass_rate:
        break
    if stop():
      stopped = True
      break
  if bar is not None:
    bar.close()
  info = {"warm_start/cached": 0.0, "warm_start/steps": step, "warm_start/pass_rate": pass_rate,
          "warm_start/seconds": time.perf_counter() - t0, "warm_start/path": str(path)}
  if stopped:  # a partial warm start is not what the cache key promises: never cached
    return state.params, {**info, "warm_start/stopped": 1.0}
  if pass_rate < ws.target_pass_rate:
    log.warning("warm start reached pass rate %.3f < target %.3f after %d steps", pass_rate, ws.target_pass_rate,
                ws.max_steps)
  params = distributed.to_host(state.params)
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_params(params, tmp)
    tmp.replace(path)
  return params, info
