"""Writes every notebook from its generator (notebooks/make_*.py), executes it, and saves it with its outputs, so a
reader sees the tables and plots without running anything:

  python notebooks/build.py            # all notebooks
  python notebooks/build.py recipe_comparison

The test suite (tests/test_notebooks.py) checks that each committed notebook's cells are its generator's, executes
it again and fails when a committed output is stale: text that differs, or a number that moved by more than
numerical noise (`outputs_match`).
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = pathlib.Path(__file__).resolve().parent
NOTEBOOKS = ("bayesian_extrapolation", "recipe_comparison")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def notebook(name: str) -> nbformat.NotebookNode:
  """The notebook of notebooks/make_<name>.py's CELLS ([("md" | "code", source)]), without outputs."""
  spec = importlib.util.spec_from_file_location(f"make_{name}", HERE / f"make_{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in module.CELLS]
  for i, cell in enumerate(cells):
    cell.id = f"cell-{i:02d}"  # stable ids: regenerating gives the same file
  nb = new_notebook(cells=cells)
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  nb.metadata["language_info"] = {"name": "python"}
  return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 600) -> nbformat.NotebookNode:
  """Runs every cell in a fresh python3 kernel, in notebooks/ (raises CellExecutionError on a failing cell)."""
  import nbclient

  nbclient.NotebookClient(nb, kernel_name="python3", timeout=timeout,
                          resources={"metadata": {"path": str(HERE)}}).execute()
  return nb


def text_outputs(nb: nbformat.NotebookNode) -> list[str]:
  """Each code cell's printed and displayed text, in order."""
  out = []
  for cell in nb.cells:
    if cell.cell_type != "code":
      continue
    parts = []
    for o in cell.get("outputs", []):
      if o.get("output_type") == "stream":
        if o.get("name") != "stderr":  # library warnings, not results
          parts.append(o.get("text", ""))
      elif "data" in o and "image/png" not in o["data"]:
        parts.append(o["data"].get("text/plain", ""))
    out.append("".join(parts))
  return out


def image_counts(nb: nbformat.NotebookNode) -> list[int]:
  return [sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))
          for cell in nb.cells if cell.cell_type == "code"]


def outputs_match(committed: str, fresh: str, rel: float = 0.08, abs_tol: float = 0.03,
                  rel_large: float = 0.6) -> bool:
  """Same text, and every number the same within `abs_tol` + `rel` of its size (`rel_large` above 10). NUTS on
  another CPU (or in another process set-up) draws another chain: on an AVX-512 EPYC pass rates, A and B held to
  2 %, but a heavy posterior's tail in compute units moved by 28 % (C_mid's 5 % point 1.04e12 -> 1.45e12) and the
  effective sample size by 21 % (735 -> 582); in the test process the far tail of a target's compute moved 37 %
  (4.99e13 -> 7.87e13) and a posterior probability 0.06 (0.51 -> 0.45); a stale output changes the text (a verdict, a label, a count of
  lines) or moves numbers by more."""
  split = lambda s: (NUMBER.split(s), [float(x) for x in NUMBER.findall(s)])  # noqa: E731
  (words_a, nums_a), (words_b, nums_b) = split(committed), split(fresh)
  if [w.split() for w in words_a] != [w.split() for w in words_b] or len(nums_a) != len(nums_b):
    return False
  size = lambda a, b: max(abs(a), abs(b))  # noqa: E731
  return all(abs(a - b) <= abs_tol + (rel if size(a, b) <= 10 else rel_large) * size(a, b)
             for a, b in zip(nums_a, nums_b))


def build(name: str) -> pathlib.Path:
  nb = execute(notebook(name))
  path = HERE / f"{name}.ipynb"
  nbformat.write(nb, path)
  return path


if __name__ == "__main__":
  for name in sys.argv[1:] or NOTEBOOKS:
    print(f"wrote {build(name)}")
