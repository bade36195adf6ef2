"""Supervised warm start: its stopping estimate is the probability of the reference completion."""

import jax
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.data.tasks import AdditionTask
from scalerl_jax.data.tokenizer import CharTokenizer
from scalerl_jax.model import Policy
from scalerl_jax.train.warmstart import reference_pass_rate_fn, solution_rows

CFG = ModelConfig(vocab_size=32, hidden=32, intermediate=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  max_seq_len=24)


def test_reference_pass_rate_is_the_mean_probability_of_the_reference_completion():
  task, tok = AdditionTask(1, num_train=40, num_eval=8, num_warmstart_val=6), CharTokenizer()
  records = task.warmstart_val_records()
  tokens, mask = solution_rows(task, records, tok)
  assert tokens.shape == (6, 16) and mask.sum(axis=1).tolist() == [len(task.solution(r)) for r in records]
  policy = Policy(CFG)
  params = jax.jit(policy.init)(jax.random.key(3))
  fast = float(reference_pass_rate_fn(policy, tokens, mask)(params))

  # Independently: one forward per prefix, softmax at its last position, product over the completion's tokens.
  forward = jax.jit(lambda p, t: policy.logits(p, policy.forward(p, t)[0])[:, -1])
  probs = []
  for rec in records:
    prompt, completion = tok.encode_prompt(rec.text), tok.encode(task.solution(rec))
    p = 1.0
    for i, target in enumerate(completion):
      logits = np.asarray(forward(params, np.asarray([prompt + completion[:i]], np.int32))[0], np.float64)
      z = np.exp(logits - logits.max())
      p *= z[target] / z.sum()
    probs.append(p)
  assert 0.0 < fast < 1.0
  np.testing.assert_allclose(fast, np.mean(probs), rtol=1e-4)
