"""Whole-run checkpoints with orbax: the sharded TrainState plus a JSON record of everything else.

A checkpoint at step s holds params, optimizer state and step (sharded arrays, restored straight into their
shardings), and `meta`: policy version, RNG seed, the data pipeline's state *at the boundary of batch s* (so a
resumed run continues the same prompt order: nothing lost, nothing twice), NPR state, compute counters, the number
of metric lines written, and a fingerprint of the config fields a resume must not change. Orbax writes into a
temporary directory and renames it on commit, so a process killed mid-save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Any, Optional

import orbax.checkpoint as ocp

from scalerl_jax.config import RunConfig
from scalerl_jax.errors import UserError

# Config groups whose change makes a checkpoint unusable (shapes, data order, objective); the rest (steps,
# logging, eval cadence, learning rate) may change on resume.
_FINGERPRINT_FIELDS = ("model", "data", "loss")


class ResumeError(UserError, RuntimeError):
  """A checkpoint this run cannot resume from (none there, or written with a different configuration)."""


def config_fingerprint(cfg: RunConfig) -> dict:
  out = {}
  for name in _FINGERPRINT_FIELDS:
    blob = json.dumps(dataclasses.asdict(getattr(cfg, name)), sort_keys=True, default=str)
    out[name] = hashlib.sha256(blob.encode()).hexdigest()[:16]
  out["optimizer"] = {"b1": cfg.optimizer.b1, "b2": cfg.optimizer.b2, "grad_clip": cfg.optimizer.grad_clip}
  return out


class RunCheckpointer:

  def __init__(self, directory: str | pathlib.Path, keep: int):
    self.directory = pathlib.Path(directory).absolute()
    self._mgr = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                             enable_async_checkpointing=False))

  def latest_step(self) -> Optional[int]:
    return self._mgr.latest_step()

  def save(self, step: int, state: Any, meta: dict) -> None:
    self._mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                   force=True)
    self._mgr.wait_until_finished()

  def restore(self, abstract_state: Any, cfg: RunConfig, step: Optional[int] = None) -> tuple[Any, dict]:
    """Restores into the shardings carried by `abstract_state` (ShapeDtypeStructs with .sharding)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise ResumeError(f"no checkpoint in {self.directory}")
    meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    saved, now = meta.get("fingerprint", {}), config_fingerprint(cfg)
    changed = [k for k in now if saved.get(k) != now[k]]
    if changed:
      raise ResumeError(f"checkpoint {self.directory}/{step} was written with a different configuration of "
                        f"{', '.join(changed)}; resume with the same settings or use a new run_dir")
    state = self._mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))).state
    return state, meta

  def close(self) -> None:
    self._mgr.close()
