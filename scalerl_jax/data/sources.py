"""Prompt records read from JSONL or Parquet files, with a field mapping and bad-row handling.

A row maps to a `Record` through three configurable fields (dotted paths reach into nested objects, e.g.
`reward_model.ground_truth`): the prompt (`data.prompt_field`, e.g. "prompt" or "question"), the reference answer
(`data.answer_field`; numbers are turned into strings) and an optional id (`data.id_field`). Without an id field the
id is a hash of the prompt and answer, so it is stable across runs and machines; a repeated row gets "-2", "-3", ...
appended. A repeated explicit id is a bad row.

A bad row (not valid JSON, not an object, a missing or empty field, a wrong type) raises a DataError naming the file,
the line (JSONL) or row (Parquet, 1-based) and the field; with `data.skip_bad_rows` it is skipped and counted instead.
A file that ends up with no rows is always an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Any, Iterator

from scalerl_jax.errors import UserError


class DataError(UserError, ValueError):
  """A problem with the input data; the message names the file, line and field where it has them."""


@dataclasses.dataclass(frozen=True)
class Record:
  """One prompt before tokenization."""
  prompt_id: str  # stable id (NPR history, resume checks)
  text: str
  answer: str  # reference the verifier checks against
  where: str = ""  # "path:line N" for messages


@dataclasses.dataclass(frozen=True)
class ReadResult:
  records: list[Record]
  skipped: int  # bad rows skipped under skip_bad_rows
  errors: list[str]  # the first few skip reasons


_MISSING = object()


def _field(row: dict, dotted: str) -> Any:
  value: Any = row
  for part in dotted.split("."):
    if not isinstance(value, dict) or part not in value:
      return _MISSING
    value = value[part]
  return value


def _text(value: Any, field: str, kind: str, allow_numbers: bool) -> str:
  if value is _MISSING:
    raise DataError(f"missing {kind} field {field!r}")
  if isinstance(value, bool) or not isinstance(value, (str, int, float) if allow_numbers else str):
    raise DataError(f"{kind} field {field!r} must be a {'string or number' if allow_numbers else 'string'}, "
                    f"got {type(value).__name__}")
  text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
  if not text.strip():
    raise DataError(f"{kind} field {field!r} is empty")
  return text


def content_id(text: str, answer: str) -> str:
  return hashlib.sha1(f"{text}\x00{answer}".encode()).hexdigest()[:16]


def _rows(path: pathlib.Path) -> Iterator[tuple[str, Any]]:
  """(location, row or the exception that made the row unreadable)."""
  suffix = path.suffix.lower()
  if suffix in (".jsonl", ".json", ".ndjson"):
    with path.open("rb") as f:
      for lineno, raw in enumerate(f, start=1):
        if not raw.strip():
          continue
        where = f"{path}:line {lineno}"
        try:
          row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
          yield where, DataError(f"not valid JSON ({exc})")
          continue
        yield where, row if isinstance(row, dict) else DataError(f"row is a {type(row).__name__}, not an object")
  elif suffix in (".parquet", ".pq"):
    import pyarrow.parquet as pq

    try:
      table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
      raise DataError(f"{path}: cannot read Parquet ({exc})") from None
    for i, row in enumerate(table.to_pylist(), start=1):
      yield f"{path}:row {i}", row
  else:
    raise DataError(f"{path}: unknown data format {suffix!r} (expected .jsonl or .parquet)")


def read_records(path: str | pathlib.Path, *, prompt_field: str = "prompt", answer_field: str = "answer",
                 id_field: str = "", skip_bad_rows: bool = False, max_errors: int = 5) -> ReadResult:
  """All rows of one JSONL or Parquet file as Records, in file order."""
  path = pathlib.Path(path).expanduser()
  if not path.is_file():
    raise DataError(f"data.path: no such file {path}")
  records: list[Record] = []
  errors: list[str] = []
  skipped = 0
  seen: dict[str, int] = {}
  for where, row in _rows(path):
    try:
      if isinstance(row, Exception):
        raise row
      text = _text(_field(row, prompt_field), prompt_field, "prompt", allow_numbers=False)
      answer = _text(_field(row, answer_field), answer_field, "answer", allow_numbers=True)
      if id_field:
        pid = _text(_field(row, id_field), id_field, "id", allow_numbers=True)
        if pid in seen:
          raise DataError(f"id field {id_field!r}: duplicate id {pid!r}")
        seen[pid] = 1
      else:
        pid = content_id(text, answer)
        seen[pid] = seen.get(pid, 0) + 1
        if seen[pid] > 1:
          pid = f"{pid}-{seen[pid]}"
    except DataError as exc:
      message = f"{where}: {exc}"
      if not skip_bad_rows:
        raise DataError(message + " (set data.skip_bad_rows=true to skip bad rows)") from None
      skipped += 1
      if len(errors) < max_errors:
        errors.append(message)
      continue
    records.append(Record(pid, text, answer, where))
  if not records:
    detail = f"; {skipped} bad rows skipped, e.g. {errors[0]}" if skipped else ""
    raise DataError(f"{path}: no usable rows{detail}")
  return ReadResult(records, skipped, errors)
