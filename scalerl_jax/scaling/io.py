"""Reads a run's evaluation points: a run directory (metrics.jsonl or tensorboard events) or a CSV.

metrics.jsonl (written by the trainer): one JSON object per line with "step", cumulative "compute/accelerator_seconds"
and "compute/flops"; evaluation lines also carry "eval/pass_rate", "eval/n_correct", "eval/n_total",
"eval/per_prompt_correct" (list) and "eval/samples_per_prompt". Only lines with "eval/pass_rate" are points. Every
value read must be a JSON number (a non-numeric one is a CurveDataError naming the file, line and key). A last line
without its newline that does not parse is what a kill leaves mid-write: it is skipped with a warning, as the trainer
does on resume; any other broken line is an error naming its line.

Mixed tasks (`task=`): the same keys under "eval/<task>/" ("eval/code/pass_rate", "eval/code/n_correct", ...), one
curve per task; `tasks_in` lists the tasks a run logged.

CSV: a header with `compute,reward` and optionally `n_correct,n_total`.

Tensorboard event files: the same tags as scalars. They are decoded with the protobufs that ship with tensorboardX
(the trainer's writer), so no `tensorboard` install is needed; per-prompt lists are not available there.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import pathlib
import struct
from typing import Any, Dict, List

import numpy as np

from scalerl_jax.config import CurveFitConfig
from scalerl_jax.scaling.points import CurveDataError, CurvePoints

# --x choice -> (metrics key, factor to the plotted unit)
X_AXES = {
    "accelerator_hours": ("compute/accelerator_seconds", 1.0 / 3600.0),
    "accelerator_seconds": ("compute/accelerator_seconds", 1.0),
    "flops": ("compute/flops", 1.0),
    "generator_flops": ("compute/generator_flops", 1.0),  # the sampling compute alone
    "steps": ("step", 1.0),  # optimizer steps (a budget, not a compute: for a quick look)
}
# each axis's unit, for reports and plots
UNITS = {"accelerator_hours": "accelerator-hours", "accelerator_seconds": "accelerator-seconds", "flops": "FLOPs",
         "generator_flops": "sampling FLOPs", "steps": "optimizer steps"}
DEFAULT_X = CurveFitConfig.x  # one default everywhere (the CPU default's axis: the sampling compute)
EVAL_KEY = "eval/pass_rate"
log = logging.getLogger(__name__)


def load_points(path, x: str = DEFAULT_X, task: str = "") -> CurvePoints:
  """Points of one input: a run directory, a metrics .jsonl, a tensorboard events file, or a .csv; `task`: that
  task's held-out curve of a mixed-task run (named "<input> [<task>]")."""
  if x not in X_AXES:
    raise CurveDataError(f"unknown compute axis {x!r}; choose one of {sorted(X_AXES)}")
  p = pathlib.Path(path)
  if p.suffix.lower() == ".csv" and p.is_file():
    if task:
      raise CurveDataError(f"{p}: a CSV holds one curve; task={task!r} needs a run directory or metrics file")
    return _read_csv(p)
  records, places = _records_of(p)
  return _from_records(records, places, x, str(p) + (f" [{task}]" if task else ""), task)


def tasks_in(path) -> list[str]:
  """The tasks whose held-out curves a run logged (eval/<task>/pass_rate), sorted; [] for a single-task run."""
  p = pathlib.Path(path)
  if p.suffix.lower() == ".csv":
    return []
  records, _ = _records_of(p)
  found = {k.split("/")[1] for r in records for k in r if k.startswith("eval/") and k.endswith("/pass_rate")
           and k.count("/") == 2}
  return sorted(found)


def _records_of(p: pathlib.Path) -> tuple[List[dict], List[str]]:
  if p.is_dir():
    if (p / "metrics.jsonl").is_file():
      return _read_jsonl(p / "metrics.jsonl")
    events = sorted(p.rglob("events.out.tfevents.*"))
    if events:
      return _events_with_places(events)
    raise CurveDataError(f"{p}: no metrics.jsonl or tensorboard events file in this run directory")
  if not p.is_file():
    raise CurveDataError(f"{p}: no such file or directory")
  if "tfevents" in p.name:
    return _events_with_places([p])
  return _read_jsonl(p)


def _read_text(path: pathlib.Path) -> str:
  try:
    return path.read_text()
  except (OSError, UnicodeDecodeError) as e:
    raise CurveDataError(f"{path}: cannot read ({e})") from e


def _read_jsonl(path: pathlib.Path) -> tuple[List[dict], List[str]]:
  """The records of a metrics .jsonl and where each came from ("path:LINE")."""
  text = _read_text(path)
  lines = text.splitlines()
  # the trainer writes each line with its newline in one write: only an unterminated last line can be a kill's cut
  cut = len(lines) if lines and not text.endswith("\n") else 0
  records, places = [], []
  for i, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except (json.JSONDecodeError, RecursionError, ValueError) as e:  # ValueError: an int past the digit limit
      why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else type(e).__name__
      if i == cut:  # the line a kill cut off mid-write: the trainer drops it on resume too
        log.warning("%s:%d: skipping the last line, cut off before its end (%s)", path, i, why)
        continue
      raise CurveDataError(f"{path}:{i}: not a JSON line ({why})") from None
    if not isinstance(rec, dict):
      raise CurveDataError(f"{path}:{i}: expected a JSON object")
    records.append(rec)
    places.append(f"{path}:{i}")
  return records, places


def _number(value: Any, key: str, place: str, integer: bool = False) -> float:
  """A metrics value as a float (JSON null: NaN, which CurvePoints rejects naming the point); anything else that
  is not a JSON number (an integer where counts are meant) is an error naming the line and key."""
  if value is None and not integer:
    return float("nan")
  try:
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
  except OverflowError:  # an integer literal beyond float range
    raise CurveDataError(f"{place}: {key} is too large for a float ({len(str(value))} digits)") from None
  if number is None or (integer and not (math.isfinite(number) and number.is_integer())):
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise CurveDataError(f"{place}: {key} is not {'an integer' if integer else 'a number'}: {shown}")
  return number


def _from_records(records: List[dict], places: List[str], x: str, name: str, task: str = "") -> CurvePoints:
  key, factor = X_AXES[x]
  group = f"eval/{task}/" if task else "eval/"
  eval_key = group + "pass_rate"
  evals = [(r, w) for r, w in zip(records, places) if eval_key in r]
  if not evals:
    raise CurveDataError(f"{name}: no evaluation lines (with {eval_key!r})")
  missing = [r.get("step", "?") for r, _ in evals if key not in r]
  if missing:
    raise CurveDataError(f"{name}: evaluation step(s) {missing[:5]} lack {key!r}")
  compute = np.array([_number(r[key], key, w) for r, w in evals]) * factor
  reward = np.array([_number(r[eval_key], eval_key, w) for r, w in evals])
  counts = {}
  if all(f"{group}n_correct" in r and f"{group}n_total" in r for r, _ in evals):
    counts = {k: [_number(r[f"{group}{k}"], f"{group}{k}", w, integer=True) for r, w in evals]
              for k in ("n_correct", "n_total")}
  per_prompt = [r.get(f"{group}per_prompt_correct") for r, _ in evals]
  if (all(isinstance(v, list) and v for v in per_prompt) and len({len(v) for v in per_prompt}) == 1
      and "eval/samples_per_prompt" in evals[0][0]):
    per_prompt = [[_number(c, f"{group}per_prompt_correct[{j}]", w, integer=True) for j, c in enumerate(v)]
                  for v, (_, w) in zip(per_prompt, evals)]
    spp = _number(evals[0][0]["eval/samples_per_prompt"], "eval/samples_per_prompt", evals[0][1], integer=True)
    counts.update(per_prompt=np.array(per_prompt, dtype=np.int64), samples_per_prompt=int(spp))
  last_step = evals[-1][0].get("step")
  per_step = float(compute[-1] / last_step) if isinstance(last_step, (int, float)) and last_step > 0 else None
  return CurvePoints(compute, reward, name=name, x_axis=x, c_per_step=per_step, **counts)


def _read_csv(path: pathlib.Path) -> CurvePoints:
  reader = csv.DictReader(_read_text(path).splitlines())
  header = set(reader.fieldnames or [])
  rows = list(reader)
  if not {"compute", "reward"} <= header:
    raise CurveDataError(f"{path}: need a header with columns compute,reward (got {sorted(header)})")
  cols = ["compute", "reward"] + (["n_correct", "n_total"] if {"n_correct", "n_total"} <= header else [])
  values: Dict[str, list] = {c: [] for c in cols}
  for i, row in enumerate(rows, start=2):
    for c in cols:
      try:
        value = float(row[c])
      except (TypeError, ValueError) as e:
        raise CurveDataError(f"{path}:{i}: column {c} is not a number: {row[c]!r}") from e
      if c.startswith("n_") and not (math.isfinite(value) and value.is_integer()):
        raise CurveDataError(f"{path}:{i}: column {c} is not an integer count: {row[c]!r}")
      values[c].append(value)
  return CurvePoints(name=str(path), **values)


def _tfrecords(path: pathlib.Path):
  """Payloads of a TFRecord file: [u64 length][u32 crc][data][u32 crc] per record (CRCs not checked)."""
  try:
    data = path.read_bytes()
  except OSError as e:
    raise CurveDataError(f"{path}: cannot read ({e})") from e
  pos = 0
  while pos + 12 <= len(data):
    (n,) = struct.unpack("<Q", data[pos:pos + 8])
    if pos + 12 + n + 4 > len(data):
      raise CurveDataError(f"{path}: truncated tensorboard record at byte {pos}")
    yield data[pos + 12:pos + 12 + n]
    pos += 12 + n + 4


def _events_with_places(paths) -> tuple[List[dict], List[str]]:
  records = _read_events(paths)
  return records, [f"{paths[0] if len(paths) == 1 else paths[0].parent}: step {r['step']}" for r in records]


def _read_events(paths) -> List[dict]:
  try:
    from tensorboardX.proto import event_pb2
  except ImportError as e:
    raise CurveDataError("reading tensorboard events needs tensorboardX (pip install tensorboardX)") from e
  by_step: Dict[int, dict] = {}
  for path in paths:
    for payload in _tfrecords(path):
      event = event_pb2.Event()
      try:
        event.ParseFromString(payload)
      except Exception as e:  # protobuf's DecodeError; its class moved between protobuf versions
        raise CurveDataError(f"{path}: not a tensorboard events file ({e})") from e
      for v in event.summary.value:
        if v.HasField("simple_value"):
          value = v.simple_value
        elif v.HasField("tensor") and (v.tensor.float_val or v.tensor.double_val):
          value = (list(v.tensor.float_val) or list(v.tensor.double_val))[0]
        else:
          continue
        by_step.setdefault(int(event.step), {"step": int(event.step)})[v.tag] = float(value)
  return [by_step[s] for s in sorted(by_step)]
