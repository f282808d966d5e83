"""``examples/quickstart.ipynb`` runs headlessly, top to bottom, on tiny toy models (so it cannot rot)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert sum("parameters" in cell.metadata.get("tags", []) for cell in code) == 1


def test_notebook_runs_on_tiny_models(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the kernel: tiny models need no threads
    nb = nbformat.read(NOTEBOOK, as_version=4)
    parameters = next(cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", []))
    parameters.source += "\nTINY = True\n"
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    for algorithm in ("slem", "tli", "slrs"):
        assert f"{algorithm}: identical to the target alone" in text
    assert "recommended for sampling:" in text
    assert "byte-exact (hf_hetspec TLI)" in text
    images = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if "image/png" in out.get("data", {})]
    assert len(images) == 1  # the statistics plot
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
