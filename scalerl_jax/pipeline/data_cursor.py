"""The prompt stream and its NPR state as the pipeline shares them between its two threads.

The generator thread draws batches (`next_batch`); the trainer records each step's pass rates into NPR (`record`)
and checkpoints the stream (`state_before`). NPR decides which prompts the stream drops, so both sides touch one
state: every access goes through one lock. The stream's state is remembered before each batch is drawn, because
the generator runs ahead of the trainer: a checkpoint after step s must store the stream as it was before batch s,
not as far as the generator has read.
"""

from __future__ import annotations

import threading
from typing import Sequence

from scalerl_jax import types
from scalerl_jax.data.npr import NPRState
from scalerl_jax.data.prompt_stream import PromptStream


class DataCursor:

  def __init__(self, stream: PromptStream, npr: NPRState, max_lag: int = 0):
    self.stream, self.npr, self.max_lag = stream, npr, max_lag
    self._lock = threading.Lock()
    self._before: dict[int, dict] = {}  # batch index -> the stream's state before that batch was drawn

  def next_batch(self, batch_index: int) -> list[types.Prompt]:
    """Batch `batch_index`. An epoch it starts is filtered by NPR as of step batch_index - k: those steps are done
    whenever the admission rule lets the generator draw this batch, however far the trainer has got since."""
    with self._lock:
      self._before[batch_index] = self.stream.get_state()
      return self.stream.next_batch(npr_count=self.npr.num_removed_before(batch_index - self.max_lag))

  def record(self, step: int, prompt_ids: Sequence[str], pass_rates: Sequence[float]) -> dict:
    """NPR update with the groups of step `step`; returns the data metrics (`data/...`) after it."""
    with self._lock:
      self.npr.update(list(prompt_ids), list(pass_rates), step)
      return {**self.stream.metrics(), "data/npr_removed": self.npr.num_removed}

  def state_before(self, step: int) -> tuple[dict, dict]:
    """(stream state before batch `step`, NPR state): what a checkpoint after `step` steps stores. Forgets the
    states of earlier batches."""
    with self._lock:
      state = self._before.get(step) or self.stream.get_state()
      for b in [b for b in self._before if b < step]:
        del self._before[b]
      return state, self.npr.state_dict()

  def restore(self, stream_state: dict, npr_state: dict) -> None:
    with self._lock:
      self.npr.load_state_dict(npr_state)
      self.stream.set_state(stream_state)
