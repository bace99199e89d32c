"""The notebooks run top to bottom (small settings: DPTRAIN_NOTEBOOK_QUICK=1), as a user
would run them after pip install; every cell must succeed and the figures must render."""

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_are_there():
    assert [p.stem for p in NOTEBOOKS] == ["01_quickstart", "02_scaling_study", "03_communication"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="executing notebooks needs nbformat")
    nbclient = pytest.importorskip("nbclient", reason="executing notebooks needs nbclient")
    pytest.importorskip("ipykernel", reason="executing notebooks needs ipykernel")
    pytest.importorskip("matplotlib", reason="the notebooks plot with matplotlib")
    monkeypatch.setenv("DPTRAIN_NOTEBOOK_QUICK", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend
    if (SHARED_DATA / "mnist").is_dir():  # else the announced synthetic MNIST
        monkeypatch.setenv("DPTRAIN_DATA", str(SHARED_DATA))
    # the kernel imports the dptrain under test (a checkout's, or the installed one)
    import dptrain

    root = str(Path(dptrain.__file__).resolve().parent.parent)
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the cell
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
