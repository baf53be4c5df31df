"""The teaching notebooks run top to bottom on a fresh kernel (needs the
`notebooks` extra: pip install ".[notebooks]"; skipped without nbclient)."""
import glob
import os

import pytest

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
PATHS = sorted(glob.glob(os.path.join(HERE, "*.ipynb")))


def test_every_seed_is_retold():
    names = [os.path.basename(p) for p in PATHS]
    assert len(names) >= 5, names
    for prefix in ("01_", "02_", "03_", "04_", "05_"):
        assert any(n.startswith(prefix) for n in names), prefix


@pytest.mark.parametrize("path", PATHS, ids=[os.path.basename(p) for p in PATHS])
def test_committed_with_a_picture(path):
    nb = nbformat.read(path, as_version=4)
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, f"{os.path.basename(path)} has no picture in its committed outputs"


@pytest.mark.parametrize("path", PATHS, ids=[os.path.basename(p) for p in PATHS])
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": HERE}})
    client.execute()          # raises CellExecutionError on any cell error
