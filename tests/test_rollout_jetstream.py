"""JetStream adapter: a prompt served through JetStream's own Driver (interleaved mode) gets exactly the tokens our
engine gives directly with greedy sampling, and importing the extra leaves the process as it was.

The serving runs in a child process: JetStream's driver threads SIGKILL their process on any error, which must
fail this test, not end the whole test session.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PROMPTS = ["037+485=", "12+7="]
MAX_TOKENS = 9

pytest.importorskip("jetstream", reason="optional extra google-jetstream not installed "
                    "(pip install --no-deps -r requirements-jetstream.txt; .ci/run installs it)")


@pytest.fixture(scope="module")
def served():
  proc = subprocess.run([sys.executable, __file__], cwd=REPO, capture_output=True, text=True, timeout=600,
                        env={**os.environ, "PYTHONPATH": str(REPO)})
  assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_jetstream_driver_serves_exactly_our_greedy_tokens(served):
  assert len(served["jetstream"]) == len(PROMPTS)
  for tokens, direct in zip(served["jetstream"], served["engine"]):
    assert 0 < len(tokens) <= MAX_TOKENS and tokens == direct


def test_jetstream_import_is_contained(served):
  assert served["logging"]["before"] == served["logging"]["after"]  # root level and handlers restored
  assert not served["jax_has_tree_map"]  # the tree_map alias stayed inside JetStream's orchestrator
  assert served["seqio_leaked"] is False
  assert served["benchmarks_origin"].startswith(str(REPO)), (
      "site-packages' `benchmarks` (installed by google-jetstream) shadows ours: benchmarks/ needs an "
      f"__init__.py; resolved to {served['benchmarks_origin']}")


def child() -> None:
  import importlib.util
  import logging

  import jax
  import numpy as np

  from scalerl_jax import mesh as mesh_lib, types
  from scalerl_jax.config import InterruptionConfig, ModelConfig, RolloutConfig
  from scalerl_jax.data.tokenizer import CharTokenizer
  from scalerl_jax.model.policy import Policy
  from scalerl_jax.rollout.driver import RolloutDriver
  from scalerl_jax.rollout.engine import Engine
  from scalerl_jax.rollout.sampling import GREEDY

  root = logging.getLogger()
  before = [logging.getLevelName(root.level), [repr(h) for h in root.handlers]]
  from scalerl_jax.rollout import jetstream_adapter as js
  after = [logging.getLevelName(root.level), [repr(h) for h in root.handlers]]

  tok = CharTokenizer()
  cfg = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=16, max_seq_len=64)
  rollout = RolloutConfig(max_slots=4, max_prefill_len=16, prefill_buckets=(16,), max_new_tokens=16,
                          decode_chunk=4, interruption=InterruptionConfig(enabled=False))
  mesh = mesh_lib.make_mesh("data=1", jax.devices()[:1], mesh_lib.ROLLOUT_AXES)
  js_tok = js.JetStreamTokenizer(tok)
  engine = Engine(Policy(cfg), rollout, mesh, stop_ids=sorted(js_tok.stop_tokens))
  params = engine.init_params(3)
  params = jax.device_put({**params, "embed": params["embed"] * 0.5}, engine.param_shardings)

  served = js.serve(js.JetStreamEngine(engine, js_tok, params), params, PROMPTS, MAX_TOKENS)
  prompts = [types.Prompt(str(i), p, "", np.asarray(tok.encode_prompt(p), np.int32)) for i, p in enumerate(PROMPTS)]
  direct = []
  for group in RolloutDriver(engine, sampling=GREEDY).generate_all(params, 0, prompts, 1):
    tokens = group.samples[0].tokens.tolist()
    direct.append([t for t in tokens if t not in js_tok.stop_tokens][:MAX_TOKENS])  # JetStream drops the stop
  spec = importlib.util.find_spec("benchmarks")
  origin = spec.origin or (list(spec.submodule_search_locations or []) + [""])[0] if spec else ""
  print(json.dumps({"logging": {"before": before, "after": after}, "jax_has_tree_map": hasattr(jax, "tree_map"),
                    "seqio_leaked": "seqio" in sys.modules and importlib.util.find_spec("seqio") is None,
                    "jetstream": served, "engine": direct, "benchmarks_origin": str(origin)}))


if __name__ == "__main__":
  child()
