"""The per-step order of collectives (run/exchange.py's docstring): a process that skips or reorders one deadlocks a
pod, so the job's calls into its exchange are recorded on one process and compared with the documented order."""

import re

from scalerl_jax.run import exchange
from scalerl_jax.run.job import RLJob
from tests.pipeline_helpers import tiny_config

METHODS = {"gather": "gather", "record": "record", "publish": "publish", "evaluate": "evaluate",
           "checkpoint_states": "checkpoint", "vote_stop": "vote_stop"}


def test_the_docstring_numbers_the_collective_order():
  numbered = re.findall(r"^  (\d)\. (\w+)", exchange.__doc__, re.M)
  assert [int(n) for n, _ in numbered] == list(range(1, len(exchange.COLLECTIVE_ORDER) + 1))
  assert tuple(name for _, name in numbered) == exchange.COLLECTIVE_ORDER
  assert "if is_main" in exchange.__doc__ and "deadlock" in exchange.__doc__


def _recorded_calls(run_dir, monkeypatch, main: bool) -> list[str]:
  """Every call the job makes into its exchange over a 3-step run whose every step evaluates and checkpoints (every
  call of the order is made), as the main process (`main`) or as another process of a pod sees it."""
  calls = []
  for method, name in METHODS.items():
    def recorded(self, *args, _fn=getattr(exchange.Local, method), _name=name):
      calls.append(_name)
      return _fn(self, *args)
    monkeypatch.setattr(exchange.Local, method, recorded)
  job = RLJob(tiny_config(run_dir, "pipeline.steps=3", "pipeline.eval_every=1", "checkpoint.every_steps=1"),
              progress=False)
  assert type(job.exchange) is exchange.Local
  job.exchange.is_main = main  # what differs between the processes: logs, metrics, config.yaml, the lock
  job.run_sync()
  monkeypatch.undo()
  return calls


def test_every_step_calls_the_exchange_in_the_documented_order(tmp_path, monkeypatch):
  calls = _recorded_calls(tmp_path, monkeypatch, main=True)
  first = calls.index("gather")  # before it: the set-up's stop votes and the step-0 evaluation
  per_step, current = [], []
  for name in calls[first:]:
    if name == "gather":
      current = []
      per_step.append(current)
    current.append(name)
  assert per_step == [list(exchange.COLLECTIVE_ORDER)] * 3
  # a process other than the main one makes exactly the same calls: a collective behind `if is_main` would leave
  # the main process waiting in it
  other = _recorded_calls(tmp_path / "other", monkeypatch, main=False)
  assert not (tmp_path / "other" / "config.yaml").exists()  # precondition: the run did take the non-main paths
  assert other == calls
