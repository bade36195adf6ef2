"""JSONL / Parquet readers: field mapping, stable ids, bad rows named by file, line and field."""

import json
import logging
import pathlib

import pytest

from tests.fixtures import make_fixtures
from scalerl_jax.data.sources import DataError, read_records
from tests.pipeline_helpers import read_jsonl


def test_committed_fixture_matches_its_generator():
  committed = pathlib.Path(make_fixtures.__file__).parent / "gsm8k_50.jsonl"
  rows = read_jsonl(committed)
  assert rows == make_fixtures.gsm8k_rows(50, seed=0)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_reads_gsm8k_format_with_field_mapping(tmp_path, fmt):
  rows = make_fixtures.gsm8k_rows(50)
  path = tmp_path / f"gsm8k.{fmt}"
  (make_fixtures.write_jsonl if fmt == "jsonl" else make_fixtures.write_parquet)(path, rows)
  result = read_records(path, prompt_field="question", answer_field="answer", id_field="id")
  assert [r.prompt_id for r in result.records] == [r["id"] for r in rows]
  assert result.records[3].text == rows[3]["question"]
  assert result.records[3].answer.endswith("#### " + rows[3]["answer"].rsplit("#### ", 1)[1])
  assert result.skipped == 0


def test_derived_ids_are_stable_and_unique(tmp_path):
  rows = [{"prompt": "1+1?", "answer": 2}, {"prompt": "2+2?", "answer": "4"}, {"prompt": "1+1?", "answer": 2}]
  path = make_fixtures.write_jsonl(tmp_path / "d.jsonl", rows)
  first = [r.prompt_id for r in read_records(path).records]
  again = [r.prompt_id for r in read_records(path).records]
  assert first == again and len(set(first)) == 3
  assert first[2] == first[0] + "-2"
  assert read_records(path).records[0].answer == "2"  # numbers become strings


def test_dotted_field_reaches_nested_objects(tmp_path):
  path = make_fixtures.write_jsonl(tmp_path / "n.jsonl", [{"q": {"text": "x?"}, "reward_model": {"truth": "7"}}])
  rec = read_records(path, prompt_field="q.text", answer_field="reward_model.truth").records[0]
  assert (rec.text, rec.answer) == ("x?", "7")


def _bad_file(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"prompt": "ok", "answer": "1"}\n'
                  '{"prompt": "no answer"}\n'
                  '\n'
                  '{"prompt": "broken", \n'
                  '[1, 2]\n'
                  '{"prompt": "", "answer": "1"}\n'
                  '{"prompt": 5, "answer": "1"}\n'
                  '{"prompt": "fine", "answer": "2"}\n')
  return path


@pytest.mark.parametrize("line, field", [(2, "answer"), (4, "JSON"), (5, "object"), (6, "prompt"), (7, "prompt")])
def test_bad_row_error_names_file_line_and_field(tmp_path, line, field):
  path = _bad_file(tmp_path)
  lines = path.read_text().splitlines(keepends=True)
  path.write_text(lines[0] + lines[line - 1])  # the good row, then the bad one on line 2
  with pytest.raises(DataError) as err:
    read_records(path)
  assert f"{path}:line 2" in str(err.value) and field in str(err.value)


def test_first_bad_row_raises_with_location(tmp_path):
  with pytest.raises(DataError, match=r"bad\.jsonl:line 2: missing answer field 'answer'"):
    read_records(_bad_file(tmp_path))


def test_skip_bad_rows_counts_them(tmp_path):
  result = read_records(_bad_file(tmp_path), skip_bad_rows=True)
  assert [r.text for r in result.records] == ["ok", "fine"]
  assert result.skipped == 5 and "line 2" in result.errors[0]


def test_parquet_bad_row_names_row_and_field(tmp_path):
  path = make_fixtures.write_parquet(tmp_path / "p.parquet", [{"prompt": "a", "answer": "1"},
                                                              {"prompt": None, "answer": "2"}])
  with pytest.raises(DataError, match=r"p\.parquet:row 2: prompt field 'prompt' must be a string"):
    read_records(path)


def test_empty_or_fully_bad_dataset_is_a_clear_error(tmp_path):
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(DataError, match="no usable rows"):
    read_records(empty)
  bad = make_fixtures.write_jsonl(tmp_path / "allbad.jsonl", [{"x": 1}, {"x": 2}])
  with pytest.raises(DataError, match="no usable rows; 2 bad rows skipped, e.g. .*line 1: missing prompt"):
    read_records(bad, skip_bad_rows=True)


def test_duplicate_explicit_id_and_unknown_format(tmp_path):
  dup = make_fixtures.write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "prompt": "p", "answer": "1"}] * 2)
  with pytest.raises(DataError, match="line 2: id field 'id': duplicate id 'a'"):
    read_records(dup, id_field="id")
  other = tmp_path / "data.csv"
  other.write_text("prompt,answer\n")
  with pytest.raises(DataError, match="unknown data format"):
    read_records(other)
  with pytest.raises(DataError, match="no such file"):
    read_records(tmp_path / "missing.jsonl")


def test_gzipped_jsonl(tmp_path):
  import gzip

  rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}]
  path = tmp_path / "d.jsonl.gz"
  path.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows)))
  assert [r.answer for r in read_records(path).records] == ["2", "4"]
  path.write_bytes(gzip.compress(b"not json\n"))
  with pytest.raises(DataError, match=r"d\.jsonl\.gz:line 1: not valid JSON"):
    read_records(path)
  path.write_bytes(gzip.compress(json.dumps(rows[0]).encode() * 50)[:40])  # cut short
  with pytest.raises(DataError, match=r"d\.jsonl\.gz: cannot read \(Compressed file ended"):
    read_records(path)
  path.write_text("plain text, not gzip\n")
  with pytest.raises(DataError, match=r"d\.jsonl\.gz: cannot read \(Not a gzipped file"):
    read_records(path)
  other = tmp_path / "d.csv.gz"
  other.write_bytes(gzip.compress(b"prompt,answer\n"))
  with pytest.raises(DataError, match=r"unknown data format '\.csv\.gz'"):
    read_records(other)


@pytest.mark.parametrize("raw, message", [
    ('{"prompt": "caf\xe9", "answer": "1"}\n'.encode("latin-1"), "line 2: not UTF-8 text (byte 0xe9"),
    (b'{"prompt": "a", "answer": ' + b"9" * 5000 + b"}\n", "line 2: not valid JSON (Exceeds the limit"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b', "answer": "1"}\n', "line 2: not valid JSON (nested"),
    (b'{"prompt": "\\ud800", "answer": "1"}\n', "line 2: prompt field 'prompt' is not valid Unicode"),
    (b'{"prompt": "a", "answer": NaN}\n', "line 2: answer field 'answer' must be a finite number"),
    (b'{"prompt": "a", "answer": -Infinity}\n', "line 2: answer field 'answer' must be a finite number"),
    (b'{"prompt": "a", "answer": "1"\n', "line 2: not valid JSON (Expecting ',' delimiter at character 31)"),
    (b'\x00\x00\x00\x00\n', "line 2: not valid JSON"),
])
def test_undecodable_rows_are_data_errors_naming_the_line(tmp_path, raw, message):
  path = tmp_path / "rows.jsonl"
  path.write_bytes(b'{"prompt": "ok", "answer": "1"}\n' + raw)
  with pytest.raises(DataError) as err:
    read_records(path)
  assert f"{path}:{message}" in str(err.value) and "\n" not in str(err.value)
  assert read_records(path, skip_bad_rows=True).skipped == 1


def test_utf8_byte_order_mark_is_accepted(tmp_path):
  path = tmp_path / "bom.jsonl"
  path.write_bytes(b'\xef\xbb\xbf{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n')
  assert [r.text for r in read_records(path).records] == ["a", "b"]


def test_utf16_file_is_named_as_such(tmp_path):
  path = tmp_path / "u16.jsonl"
  path.write_bytes('{"prompt": "a", "answer": "1"}\n'.encode("utf-16"))
  with pytest.raises(DataError, match=r"u16\.jsonl:line 1: not UTF-8 text .*looks UTF-16"):
    read_records(path)


def test_missing_field_lists_the_row_keys(tmp_path):
  path = make_fixtures.write_jsonl(tmp_path / "q.jsonl", [{"question": "x?", "answer": "1"}])
  with pytest.raises(DataError, match=r"q\.jsonl:line 1: missing prompt field 'prompt' \(row keys: 'question', "
                                      r"'answer'; set data\.prompt_field\)"):
    read_records(path)


def test_parquet_without_the_column_names_it_and_the_columns(tmp_path):
  path = make_fixtures.write_parquet(tmp_path / "p.parquet", [{"question": "a", "answer": "1"}])
  for skip in (False, True):  # a missing column is the file's problem, not a bad row
    with pytest.raises(DataError, match=r"p\.parquet: no column 'prompt' for field 'prompt' \(columns: 'question', "
                                        r"'answer'\)"):
      read_records(path, skip_bad_rows=skip)
  nested = make_fixtures.write_parquet(tmp_path / "n.parquet", [{"q": {"text": "a"}, "answer": "1"}])
  assert read_records(nested, prompt_field="q.text").records[0].text == "a"
  with pytest.raises(DataError, match="no column 'reward_model' for field 'reward_model.truth'"):
    read_records(nested, prompt_field="q.text", answer_field="reward_model.truth")


def test_parquet_non_string_rows_and_unreadable_file(tmp_path):
  path = make_fixtures.write_parquet(tmp_path / "t.parquet", [{"prompt": "a", "answer": 1.5},
                                                              {"prompt": None, "answer": 2.0},
                                                              {"prompt": "c", "answer": float("nan")}])
  with pytest.raises(DataError, match=r"t\.parquet:row 2: prompt field 'prompt' must be a string, got NoneType"):
    read_records(path)
  result = read_records(path, skip_bad_rows=True)
  assert [r.answer for r in result.records] == ["1.5"] and (result.skipped, result.rows) == (2, 3)
  assert "row 3: answer field 'answer' must be a finite number" in result.errors[1]
  binary = make_fixtures.write_parquet(tmp_path / "b.parquet", [{"prompt": b"\xff", "answer": "1"}])
  with pytest.raises(DataError, match=r"b\.parquet:row 1: prompt field 'prompt' must be a string, got bytes"):
    read_records(binary)
  for name, data in (("empty.parquet", b""), ("junk.parquet", b"PAR1 not really")):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=f"{name}: cannot read Parquet"):
      read_records(tmp_path / name)


def test_empty_file_says_it_holds_no_rows(tmp_path):
  empty = tmp_path / "empty.jsonl"
  empty.write_bytes(b"")
  with pytest.raises(DataError, match=r"empty\.jsonl: no usable rows \(the file holds no rows\)"):
    read_records(empty)


def test_skipped_rows_reach_the_log_and_the_counts(tmp_path, caplog):
  path = _bad_file(tmp_path)
  with caplog.at_level(logging.INFO, logger="scalerl_jax.data.sources"):
    result = read_records(path, skip_bad_rows=True)
  assert result.rows == 7 and result.counts() == {"rows_read": 7, "skipped_bad_rows": 5}
  record, *more = [r for r in caplog.records if r.name == "scalerl_jax.data.sources"]
  assert record.levelno == logging.WARNING
  assert [r.getMessage() for r in more] == [f"also skipped: {e}" for e in result.errors[1:]] and len(more) == 4
  assert record.getMessage().startswith(f"{path}: skipped 5 of 7 rows as bad (data.skip_bad_rows=true); first: "
                                        f"{path}:line 2: missing answer field 'answer'")
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="scalerl_jax.data.sources"):
    read_records(make_fixtures.write_jsonl(tmp_path / "good.jsonl", [{"prompt": "a", "answer": "1"}]))
  assert not caplog.records  # nothing skipped, nothing said


def test_file_task_exposes_its_counts_for_the_metrics(tmp_path):
  from scalerl_jax.config import DataConfig
  from scalerl_jax.data.tasks import make_task
  rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)] + [{"prompt": 3, "answer": "x"}, {"x": 1}]
  path = make_fixtures.write_jsonl(tmp_path / "d.jsonl", rows)
  task = make_task(DataConfig(task="file", path=str(path), num_eval=4, skip_bad_rows=True))
  assert task.counts == {"rows_read": 22, "skipped_bad_rows": 2, "overlap_dropped": 0}
  assert make_task(DataConfig(num_train=64, num_eval=8)).counts == {}  # built-in tasks read no file


def test_messages_stay_short_for_huge_values(tmp_path):
  huge = "x" * 1_000_000
  dup = make_fixtures.write_jsonl(tmp_path / "h.jsonl", [{"id": huge, "prompt": "p", "answer": "1"}] * 2)
  with pytest.raises(DataError) as err:
    read_records(dup, id_field="id")
  assert "duplicate id" in str(err.value) and len(str(err.value)) < 400
  missing = make_fixtures.write_jsonl(tmp_path / "k.jsonl", [{huge: 1, **{f"k{i}": i for i in range(20)}}])
  with pytest.raises(DataError) as err:
    read_records(missing)
  assert "missing prompt field" in str(err.value) and len(str(err.value)) < 800
