"""Property-based input tests (hypothesis): random dataset rows written to JSONL and Parquet and read through the data
loader, random config overrides and YAML files through load_config. Each input either gives the result a small
reference model of the documented rules predicts, or a UserError whose one-line message names the file and line
(data) or the key (config); never any other exception. Small `max_examples`, `deadline=None` and a fixed seed
(`derandomize`) keep it fast, timing-free and the same on every run; `database=None` writes nothing to the repo.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import re
import tempfile
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl_jax.config import RunConfig, load_config
from scalerl_jax.data.prompt_stream import encode_records
from scalerl_jax.data.sources import DataError, read_records
from scalerl_jax.data.tokenizer import CharTokenizer, HFTokenizer
from scalerl_jax.errors import UserError
from tests.fixtures import make_fixtures

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BOM = b"\xef\xbb\xbf"
HUGE = "x" * 1_000_000

# ---- random dataset rows -------------------------------------------------------------------------------------------

any_text = st.text(st.characters(exclude_categories=()), max_size=12)  # lone surrogates included
plain_text = st.text(max_size=12)
texts = st.one_of(plain_text, any_text, st.sampled_from(["", "  ", "\u2028", "\x00", HUGE]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), texts)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner,
                                                                                                  max_size=3),
                           max_leaves=5)
field_values = st.one_of(st.text(min_size=1, max_size=12), json_values)  # often a usable string


@st.composite
def json_rows(draw) -> dict:
  row = draw(st.dictionaries(any_text, json_values, max_size=3))
  for field in ("prompt", "answer"):
    if draw(st.integers(0, 5)):  # present most of the time
      row[field] = draw(field_values)
  return row


@st.composite
def jsonl_lines(draw) -> bytes:
  kind = draw(st.sampled_from(["row", "row", "row", "row_latin1", "bytes", "not_object", "cut", "bigint", "deep",
                               "blank"]))
  if kind in ("row", "row_latin1", "cut"):
    text = json.dumps(draw(json_rows()), ensure_ascii=draw(st.booleans()))
    if kind == "cut":
      text = text[:draw(st.integers(0, max(len(text) - 1, 0)))]
    if kind == "row_latin1":
      return text.encode("latin-1", "replace")
    return text.encode("utf-8", "surrogatepass")  # lone surrogates written raw: not UTF-8
  if kind == "bytes":
    return draw(st.binary(max_size=40)).replace(b"\n", b"")
  if kind == "not_object":
    return json.dumps(draw(json_values)).encode()
  if kind == "bigint":
    return b'{"prompt": "p", "answer": ' + b"9" * draw(st.integers(4200, 5000)) + b"}"
  if kind == "deep":
    n = draw(st.integers(900, 200_000))
    return b'{"prompt": "p", "answer": ' + b"[" * n + b"]" * n + b"}"
  return draw(st.sampled_from([b"", b"   ", b"\t", b"\r"]))


def _has_surrogate(text: str) -> bool:
  return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def expected_row(row) -> tuple[str, str] | None:
  """The reference: (prompt, answer) of a usable row, or None for a bad one (data/sources.py module docstring)."""
  if not isinstance(row, dict):
    return None
  prompt, answer = row.get("prompt"), row.get("answer")
  if not isinstance(prompt, str) or not prompt.strip() or _has_surrogate(prompt):
    return None
  if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
    return None
  if isinstance(answer, float) and not math.isfinite(answer):
    return None
  text = answer if isinstance(answer, str) else repr(answer) if isinstance(answer, float) else str(answer)
  if not text.strip() or _has_surrogate(text):
    return None
  return prompt, text


def expected_line(raw: bytes, lineno: int):
  """"blank", None (bad) or (prompt, answer)."""
  if not raw.strip():
    return "blank"
  if lineno == 1 and raw.startswith(BOM):
    raw = raw[len(BOM):]
  try:
    return expected_row(json.loads(raw.decode("utf-8")))
  except (UnicodeDecodeError, ValueError, RecursionError):
    return None


def _check_message(exc: UserError, path: pathlib.Path, where: str | None = None) -> str:
  message = str(exc)
  assert str(path) in message, message[:300]
  if where is not None:
    assert message.startswith(f"{path}:{where}: "), message[:300]
  assert "\n" not in message and len(message) < 1000 + len(str(path)), message[:300]
  return message


def _check_read(path: pathlib.Path, places: list[str], expected: list, skip: bool, tok: HFTokenizer):
  """read_records against the reference `expected` (per row: None = bad, else (prompt, answer))."""
  good = [e for e in expected if e is not None]
  bad = [place for place, e in zip(places, expected) if e is None]
  try:
    result = read_records(path, skip_bad_rows=skip)
  except UserError as exc:
    message = _check_message(exc, path)
    if bad and not skip:
      assert message.startswith(f"{path}:{bad[0]}: "), message[:300]
    else:
      assert not good and message.startswith(f"{path}: no usable rows"), message[:300]
    return
  except Exception as exc:  # noqa: BLE001
    pytest.fail(f"read_records raised {type(exc).__name__}: {str(exc)[:300]} (expected a DataError or rows)")
  assert good and (skip or not bad), "bad rows were read without an error"
  assert [(r.text, r.answer) for r in result.records] == good
  assert (result.skipped, result.rows) == (len(bad), len(expected))
  assert len({r.prompt_id for r in result.records}) == len(result.records)
  assert all(r.where.startswith(f"{path}:") for r in result.records)
  small = [r for r in result.records if len(r.text) < 1000]  # the tokenizers take every text the loader accepts
  try:
    encode_records(small, CharTokenizer(), 10**7)
  except DataError as exc:
    assert str(exc).startswith(f"{path}:"), str(exc)[:300]
  for r in result.records:
    tok.encode_prompt(r.text)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return HFTokenizer(make_fixtures.write_tokenizer_json(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@SETTINGS
@given(lines=st.lists(jsonl_lines(), max_size=6), bom=st.booleans(), skip=st.booleans())
def test_random_jsonl_rows_read_or_fail_naming_file_and_line(tokenizer, lines, bom, skip):
  with tempfile.TemporaryDirectory() as tmp:
    path = pathlib.Path(tmp) / "rows.jsonl"
    if bom and lines:
      lines = [BOM + lines[0]] + lines[1:]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    judged = [(f"line {i}", expected_line(raw, i)) for i, raw in enumerate(lines, start=1)]
    rows = [(place, e) for place, e in judged if e != "blank"]
    _check_read(path, [p for p, _ in rows], [e for _, e in rows], skip, tokenizer)


COLUMN_VALUES = {
    "str": st.one_of(st.text(max_size=12), st.sampled_from(["", " ", HUGE])),
    "int": st.integers(-2**63, 2**63 - 1),
    "float": st.floats(allow_nan=True, allow_infinity=True),
    "bool": st.booleans(),
    "bytes": st.binary(max_size=8),
    "list": st.lists(st.text(max_size=4), max_size=3),
    "struct": st.fixed_dictionaries({"t": st.text(max_size=4)}),
}


@st.composite
def parquet_tables(draw) -> dict[str, list]:
  names = draw(st.lists(st.text(max_size=6), max_size=3, unique=True))
  names += [f for f in ("prompt", "answer") if draw(st.integers(0, 5)) and f not in names]
  n = draw(st.integers(0, 5))
  columns = {}
  for name in draw(st.permutations(names)):
    kind = draw(st.sampled_from(sorted(COLUMN_VALUES)) if name not in ("prompt", "answer") else
                st.sampled_from(["str", "str", "str", "int", "float", "bool", "bytes", "list", "struct"]))
    values = COLUMN_VALUES[kind]
    columns[name] = [draw(st.none() | values if draw(st.booleans()) else values) for _ in range(n)]
  return columns


@SETTINGS
@given(columns=parquet_tables(), skip=st.booleans())
def test_random_parquet_rows_read_or_fail_naming_file_row_and_field(tokenizer, columns, skip):
  import pyarrow as pa
  import pyarrow.parquet as pq

  with tempfile.TemporaryDirectory() as tmp:
    path = pathlib.Path(tmp) / "rows.parquet"
    pq.write_table(pa.table({k: pa.array(v) for k, v in columns.items()}), path)
    if not {"prompt", "answer"} <= set(columns):
      with pytest.raises(DataError) as err:
        read_records(path, skip_bad_rows=skip)
      assert f"{path}: no column '" in _check_message(err.value, path)
      return
    rows = pq.read_table(path).to_pylist()
    _check_read(path, [f"row {i}" for i in range(1, len(rows) + 1)], [expected_row(r) for r in rows], skip,
                tokenizer)


# ---- random config overrides and files -----------------------------------------------------------------------------

def _keys(cls=RunConfig, prefix="") -> dict[str, type]:
  """Every dotted key of the config tree (groups too) -> its declared type."""
  out = {}
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    out[prefix + f.name] = hints[f.name]
    if dataclasses.is_dataclass(hints[f.name]):
      out.update(_keys(hints[f.name], prefix + f.name + "."))
  return out


KEYS = _keys()
LEAVES = sorted(k for k, t in KEYS.items() if not dataclasses.is_dataclass(t))
YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf"}
override_keys = st.one_of(st.sampled_from(LEAVES), st.sampled_from(sorted(KEYS)),
                          st.sampled_from(LEAVES).map(lambda k: k + "x"), st.text(max_size=8))
override_values = st.one_of(
    st.integers().map(str), st.integers(10**18, 10**30).map(str), st.floats().map(repr),
    st.from_regex(r"[a-z][a-z0-9_/-]{0,8}", fullmatch=True), st.from_regex(r"[0-9][0-9a-z_.]{0,5}", fullmatch=True),
    st.sampled_from(["true", "false", "yes", "no", "null", "~", "", "[]", "{}", "[1, 2]", "{a: 1}", "[1,", "{",
                     "${nope}", "${", "'", '"', "*a", "&a", "%x", "@x", "`x", "!!python/object:os.system", "- a",
                     "a: b", "0x10", ".inf", "-.inf", ".nan", "\t", "\x00", "'dapo'", '"01"']),
    st.text(st.characters(exclude_categories=()), max_size=10))


def _names_a_key(message: str, keys: list[str], overrides: tuple[str, ...] = ()) -> bool:
  """The message names one of the keys, quotes the override it came from, or names the dotted key validation
  refused (an override can make another key's range check fail)."""
  return (any(k and k in message for k in keys) or any(f"override {o!r}" in message for o in overrides)
          or bool(re.search(r"\b[a-z_]+\.[a-z_]+(\.[a-z_]+)?: ", message)))


def _read_back(cfg: RunConfig, key: str, value: str) -> None:
  """A value written in its field's plain form is read back as written (the correct result of a success)."""
  kind = KEYS.get(key)
  got = functools.reduce(getattr, key.split("."), cfg)
  if kind is int and re.fullmatch(r"-?[1-9][0-9]*|0", value):
    assert got == int(value), (key, value, got)
  elif kind is float and re.fullmatch(r"-?[0-9]+\.[0-9]+(e[-+]?[0-9]+)?", value):
    assert got == float(value), (key, value, got)
  elif kind is bool and value in ("true", "false"):
    assert got is (value == "true"), (key, value, got)
  elif (kind is str or typing.get_origin(kind) is typing.Literal) and re.fullmatch(r"[A-Za-z0-9_./-]+", value):
    assert got == value, f"{key}={value} was read as {got!r}"


@SETTINGS
@given(items=st.lists(st.tuples(override_keys, override_values), min_size=1, max_size=2))
def test_random_overrides_load_or_fail_naming_the_key(items):
  overrides = [f"{k}={v}" for k, v in items]
  try:
    cfg = load_config(None, overrides)
  except UserError as exc:
    assert _names_a_key(str(exc), [k for k, _ in items], tuple(overrides)), (overrides, str(exc)[:300])
    return
  except Exception as exc:  # noqa: BLE001
    pytest.fail(f"load_config(None, {overrides!r}) raised {type(exc).__name__}: {str(exc)[:200]} (not a UserError)")
  key, value = items[-1]
  if len({k for k, _ in items}) == len(items) or items[0][0] != key:
    _read_back(cfg, key, value)


yaml_values = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(10**18, 10**30),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                        st.lists(st.integers(-3, 20), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                   st.integers(), max_size=2))


@st.composite
def yaml_files(draw) -> tuple[bytes, list[str]]:
  tree: dict = {}
  keys = draw(st.lists(override_keys, max_size=4))
  for key in keys:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
      node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
    node[parts[-1]] = draw(yaml_values)
  data = yaml.safe_dump(tree, allow_unicode=True).encode()
  if draw(st.integers(0, 4)) == 0:  # damaged: random bytes somewhere
    at = draw(st.integers(0, len(data)))
    data = data[:at] + draw(st.binary(min_size=1, max_size=6)) + data[at:]
  return data, keys


@SETTINGS
@given(file=yaml_files())
def test_random_yaml_files_load_or_fail_naming_file_or_key(file):
  data, keys = file
  with tempfile.TemporaryDirectory() as tmp:
    path = pathlib.Path(tmp) / "run.yaml"
    path.write_bytes(data)
    try:
      load_config(path)
    except UserError as exc:
      assert str(path) in str(exc) or _names_a_key(str(exc), keys), str(exc)[:300]
    except Exception as exc:  # noqa: BLE001
      pytest.fail(f"load_config({data!r}) raised {type(exc).__name__}: {str(exc)[:200]} (not a UserError)")


# The failing overrides hypothesis found against scalerl_jax/config.py (`_override`), kept as plain cases: each must be
# a UserError naming the key or, for a string-valued key, be read as written (YAML must not retype a path or a field
# name: `data.prompt_field=no` is "no", not "False").
FOUND = ["optimizer.lr=[1,", "optimizer.lr={", "checkpoint.every_steps=*a", "checkpoint.every_steps='", "data.path='",
         'data.path="', "data.path=*a", "data.path=%x", "data.path=@x", "data.path=`x", "data.path=\x00",
         "data.path=\t", "loss.name=\ud800", "data.path=\ud800", "data.prompt_field=no", "data.path=yes",
         "data.id_field=007", "data.path=1e5"]


@pytest.mark.parametrize("override", FOUND)
def test_found_overrides_are_errors_or_read_as_written(override):
  key, _, value = override.partition("=")
  try:
    cfg = load_config(None, [override])
  except UserError as exc:
    assert key in str(exc), str(exc)
    return
  except Exception as exc:  # noqa: BLE001
    pytest.fail(f"load_config(None, [{override!r}]) raised {type(exc).__name__}: {str(exc)[:200]}")
  assert KEYS[key] is str, f"{override} was accepted"
  assert functools.reduce(getattr, key.split("."), cfg) == value.strip(), f"{override} was read as another value"
