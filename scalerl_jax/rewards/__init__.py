"""Rewards: verifiers, the runner that makes any of them safe to call, and success / pass-rate metrics.

  verifiers.py   exact match, math-verify, final-answer extraction (the code sandbox lands here)
  runner.py      RewardRunner: bounded time, failures scored with the failure reward and counted, never raises
  pass_rates.py  success of a reward on its scale, mean@n, unbiased pass@k
"""

from scalerl_jax.rewards.pass_rates import eval_metrics, is_success, mean_at_n, pass_at_k
from scalerl_jax.rewards.runner import RewardFn, RewardRunner, load_reward_fn, make_reward_runner
from scalerl_jax.rewards.verifiers import exact_match_reward, final_answer, math_verify_reward

__all__ = ["RewardFn", "RewardRunner", "eval_metrics", "exact_match_reward", "final_answer", "is_success",
           "load_reward_fn", "make_reward_runner", "mean_at_n", "math_verify_reward", "pass_at_k"]
