"""JSONL / Parquet readers: field mapping, stable ids, bad rows named by file, line and field."""

import json
import pathlib

import pytest

from tests.fixtures import make_fixtures
from scalerl_jax.data.sources import DataError, read_records


def test_committed_fixture_matches_its_generator():
  committed = pathlib.Path(make_fixtures.__file__).parent / "gsm8k_50.jsonl"
  rows = [json.loads(line) for line in committed.read_text().splitlines()]
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
