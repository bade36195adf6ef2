"""Executes notebooks/bayesian_extrapolation.ipynb with nbclient (kernel "python3" from the venv's ipykernel)."""

import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "bayesian_extrapolation.ipynb"


def test_notebook_matches_its_generator():
  import importlib.util
  spec = importlib.util.spec_from_file_location("make_nb", ROOT / "notebooks" / "make_bayesian_extrapolation.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  committed = nbformat.read(NOTEBOOK, as_version=4)
  assert [c.source for c in committed.cells] == [c.source for c in module.build().cells]


def test_bayesian_extrapolation_notebook_executes():
  nbclient = pytest.importorskip("nbclient")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                   resources={"metadata": {"path": str(ROOT / "notebooks")}})
  client.execute()  # raises CellExecutionError on any failing cell
  text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
  assert "posterior: A=" in text and "P(A1 > A2)" in text and "covered" in text
  images = sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.outputs)
  assert images == 3
