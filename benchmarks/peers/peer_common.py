"""What every worker of benchmarks/compare_peers.py shares: the JSON-lines protocol, the workload's prompts, the
character-level tokenizer, the rewards and the prompt-token parity check. Standard library only (plus `tokenizers`
for `build_tokenizer`, which only the driver calls): the Tunix and TRL workers import this file inside their own
virtual environments, where scalerl_jax is not installed (`load_reward` puts the repository on sys.path for a
reward that lives in scalerl_jax).

Protocol (one JSON object per line). The worker writes {"ready": true, "info": {...}} once it is built, then for
each {"cmd": "run", "steps": N} on its stdin one {"step": ...} record per RL step and {"done": true}; {"cmd":
"quit"} ends it. A record: step, wall_s (the step's wall time, from the end of the previous step), gen_s (sampling),
train_s (the optimizer step, where the system exposes it), completion_tokens, samples, reward_mean, and
prompt_ids_checked (the sampled prompts whose token ids were checked against ours: workloads whose prompts file
carries prompt_ids). The protocol has its own copy of stdout: the libraries' prints go to stderr.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
import time
from typing import Callable, Sequence

PAD, EOS, UNK = "<pad>", "<|endoftext|>", "<unk>"
REWARD_CHARS = frozenset("0123456789")


def vocab_chars(vocab_size: int) -> list[str]:
  """One character per id after the three special tokens: printable ASCII without space, then Latin-1 letters and
  beyond, so that every id decodes to exactly one character."""
  chars = [chr(c) for c in range(33, 127)]
  code = 0xC0
  while len(chars) < vocab_size - 3:
    chars.append(chr(code))
    code += 1
  return chars[:vocab_size - 3]


def build_tokenizer(out_dir: str, vocab_size: int) -> None:
  """tokenizer.json (a WordLevel vocabulary of single characters, each character its own pre-token, fused back on
  decode) and tokenizer_config.json, which transformers' PreTrainedTokenizerFast loads."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

  vocab = {PAD: 0, EOS: 1, UNK: 2}
  for i, c in enumerate(vocab_chars(vocab_size)):
    vocab[c] = i + 3
  tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens([PAD, EOS, UNK])
  os.makedirs(out_dir, exist_ok=True)
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD, "eos_token": EOS, "unk_token": UNK,
               "model_max_length": 4096, "padding_side": "left", "clean_up_tokenization_spaces": False}, f, indent=1)


def make_prompts(n: int, min_len: int, max_len: int, max_new_tokens: int, seed: int = 0) -> list[dict]:
  """n prompts of min_len..max_len random lowercase letters (no digits: the reward counts those in completions);
  the answer field carries the completion budget the reward divides by."""
  rng = random.Random(seed)
  letters = "abcdefghijklmnopqrstuvwxyz"
  return [{"id": f"p{i}", "prompt": "".join(rng.choice(letters) for _ in range(rng.randint(min_len, max_len))),
           "answer": str(max_new_tokens)} for i in range(n)]


def digit_fraction(completion: str, answer: str) -> float:
  """The benchmark's reward: the fraction of the completion budget (`answer`, an int as text) spent on digits. A
  random policy over 300 ids scores ~10/300; putting mass on 10 ids is learnable from scratch in a few hundred
  steps."""
  return min(1.0, sum(c in REWARD_CHARS for c in completion) / max(int(answer), 1))


def load_reward(name: str, repo: str = "") -> Callable[[str, str], float]:
  """The workload's reward `fn(completion, answer) -> float` by dotted name: "peer_common.digit_fraction", or a
  verifier of scalerl_jax (e.g. "scalerl_jax.rewards.verifiers.boxed_answer_reward"), imported from the repository
  at `repo` (its reward modules import numpy and jinja2, not jax; math-verify is in every peer's venv). Every system
  scores with the same function: the peers call it inline, our job through its reward runner."""
  module, _, attr = name.rpartition(".")
  if module == "peer_common":
    return globals()[attr]
  if repo and repo not in sys.path:
    sys.path.insert(0, repo)
  fn = getattr(importlib.import_module(module), attr)
  return lambda completion, answer: float(fn(completion, answer))  # a Scored (float subclass) -> plain float


def check_prompt_ids(expected: Sequence[Sequence[int]], got: Sequence[Sequence[int]], where: str) -> int:
  """Raises RuntimeError unless every prompt's token ids in `got` (what a system fed its model) equal `expected`
  (what our tokenizer made of the same prompt; the prompts file's prompt_ids), naming the first prompt and position
  that differ. Returns the number of prompts checked."""
  if len(expected) != len(got):
    raise RuntimeError(f"{where}: {len(got)} prompts tokenized, {len(expected)} expected")
  for i, (want, have) in enumerate(zip(expected, got)):
    want, have = [int(t) for t in want], [int(t) for t in have]
    if want != have:
      at = next((j for j, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
      raise RuntimeError(f"{where}: prompt {i}: token ids differ from ours at position {at} (ours "
                         f"{want[at:at + 5]}..., {len(want)} ids; this system's {have[at:at + 5]}..., {len(have)} ids)")
  return len(expected)


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def prompt_batches(prompts: list[dict], per_step: int):
  """Batch s holds prompts [s * per_step, (s + 1) * per_step) of the list, cycled: every system sees the same
  prompts at the same step."""
  s = 0
  while True:
    yield [prompts[(s * per_step + i) % len(prompts)] for i in range(per_step)]
    s += 1


class Protocol:
  """The worker's end of the JSON-lines channel: its own copy of stdout (fd 1 then points at stderr, so library
  prints cannot corrupt it), commands from stdin."""

  def __init__(self):
    self._out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

  def send(self, obj: dict) -> None:
    self._out.write(json.dumps(obj) + "\n")
    self._out.flush()

  def command(self) -> dict:
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else {"cmd": "quit"}


class StepClock:
  """Per-step records for the protocol from three observations: a step's end (`end_step`), and time spent in
  sampling and training (`add`). wall_s runs from the previous step's end (or the round's start)."""

  def __init__(self):
    self.t_last = time.perf_counter()
    self.gen_s = self.train_s = 0.0
    self.records: list[dict] = []

  def start_round(self) -> None:
    self.t_last = time.perf_counter()
    self.gen_s = self.train_s = 0.0

  def add(self, what: str, seconds: float) -> None:
    setattr(self, what, getattr(self, what) + seconds)

  def end_step(self, step: int, completion_tokens: int, samples: int, reward_mean: float, **extra) -> dict:
    now = time.perf_counter()
    rec = {"step": step, "wall_s": now - self.t_last, "gen_s": self.gen_s, "train_s": self.train_s,
           "completion_tokens": int(completion_tokens), "samples": int(samples), "reward_mean": float(reward_mean),
           **extra}
    self.t_last, self.gen_s, self.train_s = now, 0.0, 0.0
    return rec


def load_spec(argv: list[str]) -> dict:
  """The workload spec the driver wrote (argv[1]: a JSON file)."""
  if len(argv) != 2:
    raise SystemExit(f"usage: {argv[0]} SPEC.json")
  with open(argv[1]) as f:
    return json.load(f)
