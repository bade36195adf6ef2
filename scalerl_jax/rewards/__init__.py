"""Rewards: verifiers, the runner that makes any of them safe to call, and success / pass-rate metrics.

  verifiers.py   exact match, countdown, math-verify, final-answer extraction; VERIFIERS / verifier: each task's
                 verifier by the task's name; which built-in verifiers are pure (run inline), which run programs in
                 the sandbox, and what a worker preloads
  arith.py       safe integer-expression evaluation for the countdown verifier
  code.py        code_reward: the completion's program run against an item's tests (stdin/stdout pairs, asserts)
  sandbox.py     Sandbox: one untrusted program in bubblewrap with resource limits and a wall-clock kill; the causes
  runner.py      RewardRunner: failures scored with the failure reward, counted and reported (by cause too);
                 RewardError when a whole batch fails; inline or process isolation; make_reward_runner
  routing.py     TaskRewards: one runner per task in a mixed run, each group scored by its task's
  pool.py        VerifierPool: the reward function in pebble worker processes, a hung call killed with its worker
  worker.py      what runs inside a worker (light imports), the call-and-check the inline path shares, Scored
  pass_rates.py  mean@n, unbiased pass@k of a success matrix (success: the verifier's verdict, runner.py)

The runner's names are imported lazily (PEP 562), so a worker process that imports `scalerl_jax.rewards.worker`
does not pull in jax through runner.py -> types.py.
"""

from scalerl_jax.rewards.code import code_reward
from scalerl_jax.rewards.pass_rates import eval_metrics, mean_at_n, pass_at_k
from scalerl_jax.rewards.sandbox import RunResult, Sandbox, SandboxUnavailable
from scalerl_jax.rewards.verifiers import (VERIFIERS, countdown_reward, exact_match_reward, final_answer,
                                           math_verify_reward, verifier)
from scalerl_jax.rewards.worker import Scored

_RUNNER_NAMES = ("RewardBatch", "RewardError", "RewardFn", "RewardRunner", "TaskRewards", "load_reward_fn",
                 "lowest_reward", "make_reward_runner")

__all__ = ["RewardBatch", "RewardError", "RewardFn", "RewardRunner", "RunResult", "Sandbox", "SandboxUnavailable",
           "Scored", "TaskRewards", "VERIFIERS", "code_reward", "countdown_reward", "eval_metrics",
           "exact_match_reward", "final_answer", "load_reward_fn", "lowest_reward", "make_reward_runner", "mean_at_n",
           "math_verify_reward", "pass_at_k", "verifier"]


def __getattr__(name):
  if name in _RUNNER_NAMES:
    from scalerl_jax.rewards import runner

    return getattr(runner, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
