"""Prompt records read from JSONL or Parquet files, with a field mapping and bad-row handling.

A row maps to a `Record` through three configurable fields (dotted paths reach into nested objects, e.g.
`reward_model.ground_truth`): the prompt (`data.prompt_field`, e.g. "prompt" or "question"), the reference answer
(`data.answer_field`; numbers are turned into strings) and an optional id (`data.id_field`). Without an id field the
id is a hash of the prompt and answer, so it is stable across runs and machines; a repeated row gets "-2", "-3", ...
appended. A repeated explicit id is a bad row.

A file whose first row holds HumanEval's fields (task_id, prompt, entry_point, test) is read as HumanEval: every
row a code problem, the field mapping unused (data/humaneval.py). JSONL may be gzipped (.jsonl.gz).

A bad row (not UTF-8, not valid JSON, not an object, a missing or empty field, a wrong type, a non-finite number, a
string with lone surrogates) raises a DataError naming the file, the line (JSONL) or row (Parquet, 1-based) and the
field; with `data.skip_bad_rows` it is skipped and counted instead: `ReadResult.skipped` of `ReadResult.rows`, the
first few reasons in `ReadResult.errors`, and on this module's logger a warning naming the file, the count and the
first reason (the next few reasons follow at INFO). A Parquet file without the field's column, an unreadable file and a file that ends up with no rows are
always errors. A UTF-8 byte-order mark at the start of a JSONL file is accepted.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import math
import pathlib
import zlib
from typing import Any, Iterator

from scalerl_jax.errors import UserError

log = logging.getLogger(__name__)


class DataError(UserError, ValueError):
  """A problem with the input data; the message names the file, line and field where it has them."""


@dataclasses.dataclass(frozen=True)
class Record:
  """One prompt before tokenization."""
  prompt_id: str  # stable id (NPR history, resume checks)
  text: str
  answer: str  # reference the verifier checks against
  where: str = ""  # "path:line N" for messages
  task: str = ""  # mixed tasks: "math" | "code" ("": the run's single task)


@dataclasses.dataclass(frozen=True)
class ReadResult:
  records: list[Record]
  skipped: int  # bad rows skipped under skip_bad_rows
  errors: list[str]  # the first few skip reasons
  rows: int = 0  # rows read (good and bad; blank JSONL lines are not rows)

  def counts(self) -> dict[str, int]:
    """The metrics of one read: {"rows_read", "skipped_bad_rows"} (unprefixed, like PromptStream.counts)."""
    return {"rows_read": self.rows, "skipped_bad_rows": self.skipped}


_MISSING = object()


def _field(row: dict, dotted: str) -> Any:
  value: Any = row
  for part in dotted.split("."):
    if not isinstance(value, dict) or part not in value:
      return _MISSING
    value = value[part]
  return value


def _short(value: Any, limit: int = 60) -> str:
  """repr(value) cut to `limit` characters, for messages (a row may hold megabytes)."""
  text = repr(value)
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _keys_hint(row: Any, kind: str) -> str:
  """What the row does hold, for a missing field: its first keys and the config key that picks the field."""
  if not isinstance(row, dict) or not row:
    return ""
  keys = ", ".join(_short(k, 40) for k in list(row)[:8]) + (", ..." if len(row) > 8 else "")
  return f" (row keys: {keys}; set data.{kind}_field)"


def _text(value: Any, field: str, kind: str, allow_numbers: bool, row: Any = None) -> str:
  if value is _MISSING:
    raise DataError(f"missing {kind} field {field!r}" + _keys_hint(row, kind))
  if isinstance(value, bool) or not isinstance(value, (str, int, float) if allow_numbers else str):
    raise DataError(f"{kind} field {field!r} must be a {'string or number' if allow_numbers else 'string'}, "
                    f"got {type(value).__name__}")
  if isinstance(value, float) and not math.isfinite(value):
    raise DataError(f"{kind} field {field!r} must be a finite number, got {value!r}")
  if isinstance(value, str):
    text = value
  elif isinstance(value, float):
    text = repr(value)
  else:
    try:
      text = str(value)
    except ValueError as exc:  # an int past Python's digit limit for str()
      raise DataError(f"{kind} field {field!r}: number too long to convert ({exc})") from None
  if not text.strip():
    raise DataError(f"{kind} field {field!r} is empty")
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as exc:  # JSON "\ud800": a lone surrogate, no character
    raise DataError(f"{kind} field {field!r} is not valid Unicode (lone surrogate {text[exc.start]!r} at character "
                    f"{exc.start})") from None
  return text


def content_id(text: str, answer: str) -> str:
  return hashlib.sha1(f"{text}\x00{answer}".encode()).hexdigest()[:16]


def _decode(raw: bytes, lineno: int) -> str:
  if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
    raw = raw[3:]  # a UTF-8 byte-order mark
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as exc:
    hint = "; the file looks UTF-16: convert it to UTF-8" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or (
        b"\x00" in raw and lineno == 1) else ""
    raise DataError(f"not UTF-8 text (byte {raw[exc.start]:#04x} at byte {exc.start + 1} of the line{hint})") from None


def _json_row(raw: bytes, lineno: int) -> Any:
  text = _decode(raw, lineno)
  try:
    row = json.loads(text)
  except json.JSONDecodeError as exc:
    raise DataError(f"not valid JSON ({exc.msg} at character {exc.pos + 1})") from None
  except RecursionError:
    raise DataError("not valid JSON (nested too deeply to read)") from None
  except ValueError as exc:  # an integer literal past Python's digit limit
    raise DataError(f"not valid JSON ({str(exc).split(';')[0]})") from None
  if not isinstance(row, dict):
    raise DataError(f"row is a JSON {type(row).__name__}, not an object")
  return row


def _parquet_rows(path: pathlib.Path, fields: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
  import pyarrow.parquet as pq

  try:
    table = pq.read_table(path)
    rows = table.to_pylist()
  except Exception as exc:  # pyarrow raises several types for unreadable files
    reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    raise DataError(f"{path}: cannot read Parquet ({reason})") from None
  columns = table.column_names
  from scalerl_jax.data import humaneval  # imports this module: here, not at the top

  if set(humaneval.FIELDS) <= set(columns):
    fields = ()  # a HumanEval-format file: the field mapping does not apply
  for field in fields:
    if field and field.split(".")[0] not in columns:
      shown = ", ".join(_short(c, 40) for c in columns[:12]) + (", ..." if len(columns) > 12 else "")
      raise DataError(f"{path}: no column {field.split('.')[0]!r} for field {field!r} (columns: {shown or 'none'})")
  for i, row in enumerate(rows, start=1):
    yield f"{path}:row {i}", row


def _rows(path: pathlib.Path, fields: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
  """(location, row or the DataError that made the row unreadable)."""
  suffix = path.suffix.lower()
  gzipped = suffix == ".gz"
  if gzipped:
    suffix = pathlib.Path(path.stem).suffix.lower()
  if suffix in (".jsonl", ".json", ".ndjson"):
    try:
      with (gzip.open(path, "rb") if gzipped else path.open("rb")) as f:
        for lineno, raw in enumerate(f, start=1):
          if not raw.strip():
            continue
          try:
            row = _json_row(raw, lineno)
          except DataError as exc:
            row = exc
          yield f"{path}:line {lineno}", row
    except (OSError, EOFError, zlib.error) as exc:  # gzip: BadGzipFile (an OSError), a truncated or damaged stream
      raise DataError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
  elif suffix in (".parquet", ".pq") and not gzipped:
    yield from _parquet_rows(path, fields)
  else:
    shown = "".join(path.suffixes[-2:]) if gzipped else path.suffix
    raise DataError(f"{path}: unknown data format {shown!r} (expected .jsonl, .jsonl.gz or .parquet)")


TASKS = ("math", "code")  # the values a row's task field may hold


def _task(row: dict, field: str) -> str:
  """A row's task: "math" without the field (or with a null), else the field's value, which must be in TASKS."""
  value = _field(row, field) if field else _MISSING
  if value is _MISSING or value is None:
    return "math"
  if value not in TASKS:
    raise DataError(f"task field {field!r} must be one of {', '.join(TASKS)}, got {_short(value)}")
  return value


def _code_tests(value: Any, field: str) -> str:
  """A code row's answer: its tests as a JSON object (given as an object or as its JSON text), kept as JSON text
  for the code verifier (scalerl_jax/rewards/code.py documents the keys)."""
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as exc:
      raise DataError(f"answer field {field!r} of a code row must be a JSON object of tests ({exc.msg})") from None
  if not isinstance(value, dict):
    raise DataError(f"answer field {field!r} of a code row must be a JSON object of tests, got "
                    f"{type(value).__name__}")
  if not (value.get("stdio") or value.get("asserts")):
    raise DataError(f"answer field {field!r} of a code row has no tests (give \"stdio\" pairs or \"asserts\")")
  return json.dumps(value, sort_keys=True)


def read_records(path: str | pathlib.Path, *, prompt_field: str = "prompt", answer_field: str = "answer",
                 id_field: str = "", skip_bad_rows: bool = False, max_errors: int = 5,
                 task_field: str = "", key: str = "data.path") -> ReadResult:
  """All rows of one JSONL or Parquet file as Records, in file order. With `task_field`, each row's task (math
  when the field is absent) is read too, and a code row's answer is its tests (a JSON object). A HumanEval-format
  file (its first row decides) gives code records (data/humaneval.py). `key`: the config key that named the file
  (data.path, data.eval_path), for the messages."""
  from scalerl_jax.data import humaneval

  path = pathlib.Path(path).expanduser()
  if path.is_dir():
    raise DataError(f"{key}: {path} is a directory; give one .jsonl, .jsonl.gz or .parquet file")
  if not path.is_file():
    raise DataError(f"{key}: no such file {path}")
  records: list[Record] = []
  errors: list[str] = []
  skipped = 0
  seen: dict[str, int] = {}
  rows = 0
  is_humaneval = None  # decided by the first row that is an object
  for where, row in _rows(path, (prompt_field, answer_field, id_field)):
    rows += 1
    try:
      if isinstance(row, Exception):
        raise row
      if is_humaneval is None:
        is_humaneval = humaneval.is_humaneval(row)
        if is_humaneval:
          log.info("%s: HumanEval format (its first row has %s): every row a code problem, its id the task_id",
                   path, ", ".join(humaneval.FIELDS))
      if is_humaneval:
        pid, text, answer = humaneval.parts(row)
        if pid in seen:
          raise DataError(f"HumanEval field 'task_id': duplicate id {_short(pid)}")
        seen[pid] = 1
        records.append(Record(pid, text, answer, where, "code"))
        continue
      text = _text(_field(row, prompt_field), prompt_field, "prompt", allow_numbers=False, row=row)
      task = _task(row, task_field) if task_field else ""
      if task == "code":
        raw = _field(row, answer_field)
        if raw is _MISSING:
          raise DataError(f"missing answer field {answer_field!r}" + _keys_hint(row, "answer"))
        answer = _code_tests(raw, answer_field)
      else:
        answer = _text(_field(row, answer_field), answer_field, "answer", allow_numbers=True, row=row)
      if id_field:
        pid = _text(_field(row, id_field), id_field, "id", allow_numbers=True, row=row)
        if pid in seen:
          raise DataError(f"id field {id_field!r}: duplicate id {_short(pid)}")
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
    records.append(Record(pid, text, answer, where, task))
  if not records:
    detail = f"; {skipped} bad rows skipped, e.g. {errors[0]}" if skipped else " (the file holds no rows)"
    raise DataError(f"{path}: no usable rows{detail}")
  if skipped:
    log.warning("%s: skipped %d of %d rows as bad (data.skip_bad_rows=true); first: %s", path, skipped, rows,
                errors[0])
    for reason in errors[1:]:
      log.info("also skipped: %s", reason)
  return ReadResult(records, skipped, errors, rows)
