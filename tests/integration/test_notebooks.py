"""Every notebook in notebooks/ runs top to bottom (outputs are not compared)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.notebook]

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
# The paper notebooks read a `tlcap reproduce` report (figures/reproduce, or they run smoke first:
# about 3 and 1.2 minutes on the 2-core CPU).
CASES = [pytest.param(p, id=p.name) for p in NOTEBOOKS]


@pytest.mark.parametrize("path", CASES)
def test_notebook_runs(path, smollm2):  # smollm2: skip when the offline model is missing
    import nbformat
    from nbclient import NotebookClient

    os.environ["HF_HUB_OFFLINE"] = "1"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
