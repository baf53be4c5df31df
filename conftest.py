"""pytest configuration at the repository root: the doctests.

``pytest --doctest-modules pyattn`` runs every ``>>>`` example of the package's
docstrings (``.ci/run`` does). NumPy's print options are fixed for each example
(NumPy's defaults, 75 columns) so that printed arrays do not depend on what ran
before; modules whose optional dependencies are missing are not collected, and
a docstring elsewhere whose examples import torch (the nn layers' ``from_torch``) is
skipped where torch is missing.
"""
import importlib.util
import re

import numpy as np
import pytest

collect_ignore = ["setup.py", "docs/conf.py", "docs/plots.py"]
for _mod, _needs in (("pyattn/torch.py", "torch"), ("pyattn/flash.py", "torch"),
                     ("pyattn/transformers.py", "transformers"), ("pyattn/dask.py", "dask")):
    if importlib.util.find_spec(_needs) is None:
        collect_ignore.append(_mod)
_MISSING_TORCH = importlib.util.find_spec("torch") is None
# `import torch`, `import numpy as np, torch`, `from torch import ...` (not `import pyattn.torch`)
_IMPORTS_TORCH = re.compile(r"^\s*(?:import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*torch\b|from\s+torch\b)", re.M)


@pytest.fixture(autouse=True)
def _doctest_print_options(request):
    """For doctests only: NumPy's print options fixed, ``np`` in the namespace."""
    if type(request.node).__name__ != "DoctestItem":
        yield
        return
    if _MISSING_TORCH and any(_IMPORTS_TORCH.search(ex.source) for ex in request.node.dtest.examples):
        pytest.skip("the example imports torch, which is not installed")
    request.getfixturevalue("doctest_namespace")["np"] = np
    with np.printoptions(precision=8, threshold=1000, edgeitems=3, linewidth=75,
                         suppress=False, sign="-", floatmode="maxprec", legacy=False):
        yield
