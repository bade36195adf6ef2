"""Rewards: verifiers, the runner that makes any of them safe to call, and success / pass-rate metrics.

  verifiers.py   exact match, math-verify, final-answer extraction (the code sandbox lands here); which built-in
                 verifiers are pure (run inline) and what a worker preloads
  runner.py      RewardRunner: failures scored with the failure reward, counted and reported; RewardError when a
                 whole batch fails; inline or process isolation
  pool.py        VerifierPool: the reward function in pebble worker processes, a hung call killed with its worker
  worker.py      what runs inside a worker (light imports), and the call-and-check the inline path shares
  pass_rates.py  success of a reward on its scale, mean@n, unbiased pass@k

The runner's names are imported lazily (PEP 562), so a worker process that imports `scalerl_jax.rewards.worker`
does not pull in jax through runner.py -> types.py.
"""

from scalerl_jax.rewards.pass_rates import eval_metrics, is_success, mean_at_n, pass_at_k
from scalerl_jax.rewards.verifiers import exact_match_reward, final_answer, math_verify_reward

_RUNNER_NAMES = ("RewardBatch", "RewardError", "RewardFn", "RewardRunner", "load_reward_fn", "lowest_reward",
                 "make_reward_runner")

__all__ = ["RewardBatch", "RewardError", "RewardFn", "RewardRunner", "eval_metrics", "exact_match_reward",
           "final_answer", "is_success", "load_reward_fn", "lowest_reward", "make_reward_runner", "mean_at_n",
           "math_verify_reward", "pass_at_k"]


def __getattr__(name):
  if name in _RUNNER_NAMES:
    from scalerl_jax.rewards import runner

    return getattr(runner, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
