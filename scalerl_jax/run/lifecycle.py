"""How a run starts and ends on a trainer process: signal handlers, the run-directory lock, the reward workers, the
step-0 evaluation, a checkpoint and a summary at the end, and a user error turned into a stop with a checkpoint.
`RLJob` (run/job.py) adds the set-up and the step; the exchange (run/exchange.py) chooses the loop.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

from scalerl_jax.data.prompt_stream import PromptsExhausted
from scalerl_jax.errors import UserError
from scalerl_jax.pipeline.interrupts import Stopped
from scalerl_jax.pipeline.orchestrator import PipelineError


class Lifecycle:
  """The lifecycle of RLJob, which provides `parts`, `exchange`, `interrupts`, `log`, `summary`, `run_dir`,
  `version`, `start_step`, `_last_eval_step`, `_lock` and the methods `setup`, `evaluate`, `checkpoint`, `_flush`
  and `_stop_now`."""

  @property
  def exit_code(self) -> int:
    """0, or 128 + the signal that stopped the run (130 Ctrl-C, 143 SIGTERM)."""
    return self.interrupts.exit_code

  def release(self) -> None:
    """Gives the run directory back (idempotent)."""
    if self._lock is not None:
      self._lock.release()

  def begin(self) -> None:
    """Set up (compiles the train step), start the reward workers, evaluate R0, start the compute meter."""
    self.setup()
    self.parts.rewards.start()  # the reward workers' start-up is a restart cost, not compute
    # R0, the curve's starting point; on resume, an evaluation a signal cut short at the checkpoint's step
    if self._evaluation_due(self.start_step) and self._last_eval_step != self.start_step:
      if self._stop_now():
        raise Stopped(f"before the step-{self.start_step} evaluation")
      self.log.logger.write(self.start_step, {**self.evaluate(), **self.parts.meter.metrics()})
    self.parts.meter.start()

  def _evaluation_due(self, version: int) -> bool:
    p = self.cfg.pipeline
    return version == p.steps or bool(p.eval_every and version % p.eval_every == 0)

  def finish(self, stopped: Optional[Stopped] = None) -> dict:
    """The last step's metrics (with an evaluation unless a signal stopped the run), a checkpoint of the steps
    taken, the summary (naming the signal and where it stopped the run, if one did)."""
    if self.log is not None:  # (a signal during set-up stops the run before the metrics sinks exist)
      self._flush(evaluate=self._last_eval_step != self.version and not self.interrupts.is_set())
    ckpt = self.parts.ckpt
    if self.version > self.start_step and ckpt.latest_step() != self.version:
      self.checkpoint()
    if self.log is not None:
      self.log.close()
    self.summary.update({"steps": self.version, "run_dir": str(self.run_dir)})
    if self.interrupts.is_set():
      latest = ckpt.latest_step() if ckpt is not None else None
      where = f", {stopped}" if stopped is not None else ""
      self.summary["stopped"] = (
          f"stopped by {self.interrupts.name} after {self.version} steps{where}; the same command " +
          (f"resumes from the checkpoint of step {latest}" if latest else "starts the run again"))
    return self.summary

  def run(self) -> dict:
    """PipelineRL-k / PPO-off-policy-k: with a generator thread, or the generator processes (run/exchange.py)."""
    return self.exchange.run(self, sync=False)

  def run_sync(self) -> dict:
    """The synchronous reference loop (no threads): generate batch s with params v = s, train, repeat."""
    return self.exchange.run(self, sync=True)

  def run_loop(self, loop: Callable[[], None]) -> dict:
    """Set up, run `loop`, finish. A user error (a reward batch that failed whole, NPR leaving no prompt,
    non-finite steps), raised here or in the generator thread, stops the run with a checkpoint of the work done."""
    with self.session():
      try:
        self.begin()
        self._loop(loop)
      except Stopped as exc:  # a signal ended a long phase (warm start, evaluation) or came before one
        self.exchange.end_early()  # disaggregated: the generators may still wait for the first weights
        return self.finish(exc)
      return self.finish()

  def _loop(self, loop: Callable[[], None]) -> None:
    try:
      with self.parts.meter.count_compilation():
        loop()
    except PipelineError as exc:
      if isinstance(exc.__cause__, UserError) and self.exchange.alone:
        self._stop_on(exc.__cause__)
      raise
    except UserError as exc:
      # with several processes another one's error, or a shard's reward failure, could leave the processes in
      # different collectives: the error ends every process instead, and the run resumes from its checkpoint
      if not self.exchange.alone:
        raise
      self._stop_on(exc)

  @contextlib.contextmanager
  def session(self):
    """Signal handlers on; the reward workers and the run-directory lock are given back however the run ends."""
    with self.interrupts.installed(), self.parts.rewards:
      try:
        yield self
      finally:
        self.release()

  def _stop_on(self, error: UserError) -> None:
    """A user error ended the loop (not a bug): keep the work done, with a checkpoint, then say what happened."""
    self._flush()
    if self.version > self.start_step and self.parts.ckpt.latest_step() != self.version:
      self.checkpoint()
    self.log.close()
    done = f"stopped at step {self.version} with a checkpoint" if self.version else "stopped before the first step"
    if isinstance(error, PromptsExhausted):
      raise PromptsExhausted(f"{error}; {done}. Continue with data.npr.enabled=false or a higher "
                             "data.npr.threshold (NPR settings may change on resume)") from None
    error.args = (f"{error} ({done})",)
    raise error from None
