"""The notebooks: each committed one holds its generator's cells (notebooks/make_<name>.py) and the outputs of
`python notebooks/build.py`; executed again here (nbclient, kernel "python3" from the venv's ipykernel), every
committed output must still hold, up to numerical noise."""

import importlib.util
import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("notebook_build", ROOT / "notebooks" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

# what each notebook must show (beyond matching its committed outputs)
EXPECT = {
    "bayesian_extrapolation": (("NumPyro posterior", "P(A1 > A2)", "the 90 % band", "the other study",
                                "bands calibrated on", "prior learned on the other study"), 4),
    "recipe_comparison": (("A [90 % interval]", "P(A1 > A2) =", "common A =", "P(ceiling > target)",
                           "higher at the end:", "whole study addition4_cpu"), 2),
}


def _committed(name: str) -> nbformat.NotebookNode:
  return nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)


@pytest.mark.parametrize("name", build.NOTEBOOKS)
def test_notebook_matches_its_generator(name):
  assert [c.source for c in _committed(name).cells] == [c.source for c in build.notebook(name).cells]


@pytest.mark.parametrize("name", build.NOTEBOOKS)
def test_notebook_executes_and_its_committed_outputs_are_current(name):
  pytest.importorskip("nbclient")
  committed = _committed(name)
  old_text = build.text_outputs(committed)
  assert any(old_text), f"notebooks/{name}.ipynb was committed without outputs: run python notebooks/build.py"
  fresh = build.execute(build.notebook(name))  # raises CellExecutionError on any failing cell
  new_text = build.text_outputs(fresh)
  for i, (old, new) in enumerate(zip(old_text, new_text)):
    assert build.outputs_match(old, new), (
        f"notebooks/{name}.ipynb: the committed output of code cell {i} is stale (rerun python notebooks/build.py)"
        f"\n--- committed\n{old}\n--- now\n{new}")
  assert build.image_counts(fresh) == build.image_counts(committed)
  needles, images = EXPECT[name]
  text = "\n".join(new_text)
  assert all(n in text for n in needles), [n for n in needles if n not in text]
  assert sum(build.image_counts(fresh)) == images


def test_stale_outputs_are_told_from_numerical_noise():
  old = "A=0.812 [0.790, 0.835] covered True\n"
  assert build.outputs_match(old, "A=0.813 [0.789, 0.836] covered True\n")  # another chain, same answer
  assert not build.outputs_match(old, "A=0.712 [0.690, 0.735] covered True\n")  # a different result
  assert not build.outputs_match(old, "A=0.812 [0.790, 0.835] covered False\n")  # different text
  assert not build.outputs_match(old, "A=0.812 [0.790] covered True\n")  # a number gone
  big = "C_mid=7.88e+11 [4.73e+11, 1.31e+12] ess 735\n"  # compute-scale tails and ESS move more between chains
  assert build.outputs_match(big, "C_mid=7.9e+11 [4.39e+11, 1.42e+12] ess 582\n")
  assert not build.outputs_match(big, "C_mid=2.6e+11 [1.58e+11, 0.44e+12] ess 735\n")  # a third of the compute
