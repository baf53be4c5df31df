"""The API reference lists every public name: each name of ``pyattn.__all__`` and
of each public submodule's ``__all__`` appears in ``docs/api/index.rst`` under its
module, so that autosummary generates its page (the Sphinx build itself runs in
``.ci/run``, with warnings as errors)."""
import importlib
import re
from pathlib import Path

import pytest

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api" / "index.rst"
SUBMODULES = ["nn", "masks", "flash", "dask", "torch", "transformers"]
NOT_PAGES = {"nn", "masks", "__version__"}     # modules (their own sections) and a string


def listed():
    """{module: names} from the autosummary blocks of the API page."""
    if not API.exists():
        pytest.skip("docs/ is not in this tree (an sdist)")
    out, module = {}, None
    lines = API.read_text(encoding="utf-8").splitlines()
    in_summary = False
    for line in lines:
        m = re.match(r"\.\. currentmodule:: (\S+)", line)
        if m:
            module = m.group(1)
            continue
        if line.startswith(".. autosummary::"):
            in_summary = True
            continue
        if in_summary:
            if line.startswith("   :") or not line.strip():
                continue
            if line.startswith("   "):
                out.setdefault(module, set()).add(line.strip())
                continue
            in_summary = False
    return out


def test_every_public_name_of_pyattn_has_a_page():
    import pyattn
    missing = set(pyattn.__all__) - NOT_PAGES - listed().get("pyattn", set())
    assert not missing, f"docs/api/index.rst lacks {sorted(missing)}"


@pytest.mark.parametrize("sub", SUBMODULES)
def test_every_public_name_of_each_submodule_has_a_page(sub):
    if sub in ("torch", "flash", "transformers"):
        pytest.importorskip("torch")
    if sub == "transformers":
        pytest.importorskip("transformers")
    if sub == "dask":
        pytest.importorskip("dask")
    mod = importlib.import_module("pyattn." + sub)
    missing = set(mod.__all__) - listed().get("pyattn." + sub, set())
    assert not missing, f"docs/api/index.rst lacks pyattn.{sub}: {sorted(missing)}"
