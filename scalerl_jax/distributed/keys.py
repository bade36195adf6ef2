"""The coordination service's key-value store as the processes' shared notice board: the abort and stop records,
waits for a key in bounded polls that watch both, and the barrier.

No wait here blocks for good: a peer may be busy for minutes, so `wait_for_key` polls every `_POLL_MS` and between
polls looks for the trainers' stop record (it raises `Stopped`) and a failed process's abort record (the cluster's
`Watchdog` then exits this process).
"""

from __future__ import annotations

import time
from typing import Optional

import jax

ABORT_KEY = "scalerl_jax/abort"
STOP_KEY = "scalerl_jax/stop"  # set by the trainers when a disaggregated run ends early: generators stop waiting
_POLL_MS = 500


class Stopped(Exception):
  """The trainers ended the run (STOP_KEY) while this process waited for a message."""


def _client():
  from jax._src import distributed as jax_distributed

  return jax_distributed.global_state.client


def _has_key(client, key: str) -> bool:
  try:
    client.key_value_try_get(key)
    return True
  except Exception:  # noqa: BLE001 (NOT_FOUND)
    return False


def stop_requested() -> bool:
  """Whether the trainers have ended the run (the stop record is set; one key-value read)."""
  return _has_key(_client(), STOP_KEY)


def request_stop() -> None:
  """Tells every process waiting in `wait_for_key` that the run is over (idempotent)."""
  try:
    _client().key_value_set(STOP_KEY, "stop")
  except Exception:  # noqa: BLE001 (already set)
    pass


def aborted() -> Optional[str]:
  """The abort record ("status\nprocess i: text") when some process has failed, else None (one key-value read)."""
  try:
    return _client().key_value_try_get(ABORT_KEY)
  except Exception:  # noqa: BLE001 (NOT_FOUND)
    return None


def wait_for_key(key: str) -> str:
  """The value of `key` once some process sets it. Waits as long as it takes (a peer may be busy for minutes),
  but in bounded polls: a failed process's abort record ends the wait (the Watchdog exits this process), and the
  trainers' stop record raises Stopped."""
  client = _client()
  while True:
    try:
      return client.blocking_key_value_get(key, _POLL_MS)
    except Exception as exc:  # noqa: BLE001
      if "DEADLINE_EXCEEDED" not in str(exc):
        raise
    if stop_requested():
      raise Stopped(key)
    if aborted() is not None:
      time.sleep(5)  # the Watchdog is exiting this process


def barrier(name: str, timeout_s: int = 600) -> None:
  """Every process waits here until all have arrived (the coordination service's barrier)."""
  if jax.process_count() > 1:
    _client().wait_at_barrier(name, timeout_s * 1000)
