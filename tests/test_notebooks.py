"""The notebooks run top to bottom (short form: LIT_AGENTS_NOTEBOOK_SHORT=1)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
# a line each notebook must print once it ran through
EXPECTED = {"quickstart": "held-out success", "multi2": "held-out success", "mosaic": "broadcast",
            "rao": "depth 1 goal="}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_AGENTS_NOTEBOOK_SHORT", "1")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    assert EXPECTED[path.stem] in outputs
