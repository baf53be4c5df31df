"""Sphinx configuration of pyattn's documentation.

Build: ``sphinx-build -n -W --keep-going docs docs/_build/html`` from the
repository root, after ``pip install -e ".[docs]"`` (or with the extension
built in place: this file puts the repository root first on ``sys.path``, so
the checkout's pyattn is the one documented). Nothing is downloaded: there is
no intersphinx mapping (the build machines have no network, and an inventory
that cannot be fetched is a warning, which ``-W`` turns into an error);
references to NumPy, PyTorch and Dask names are rendered as code instead.
The notebooks are rendered from their stored outputs, never executed here.
"""
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

import pyattn  # noqa: E402  (the checkout's pyattn, built in place or installed editable)

# pyattn.torch / .transformers / .flash / .dask import their frameworks; the docs extra does not
# install them (PyTorch's default wheel is the CUDA build). Where one is missing, autodoc mocks it
# and still reads those modules' docstrings.
autodoc_mock_imports = []
for _name in ("torch", "transformers", "dask", "ml_dtypes"):
    try:
        __import__(_name)
    except ImportError:
        autodoc_mock_imports.append(_name)

project = "pyattn"
author = "the pyattn developers"
copyright = "2026, the pyattn developers"
release = version = getattr(pyattn, "__version__", "0.1.0")

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_nb",
]

# ---- the files that live outside docs/, copied in before the build --------------------
# benchmarks/RESULTS*.md, csrc/README.md, RELIABILITY.md and the notebooks are
# the sources of truth; docs/_copied/ is regenerated on every build (git-ignored).
# Links from those files to files the site does not hold become plain text.
COPIED = DOCS / "_copied"


def _copy_sources():
    if COPIED.exists():
        shutil.rmtree(COPIED)
    (COPIED / "benchmarks").mkdir(parents=True)
    (COPIED / "notebooks").mkdir()
    files = {}
    for p in sorted((ROOT / "benchmarks").glob("RESULTS*.md")):
        files[p] = COPIED / "benchmarks" / p.name
    files[ROOT / "csrc" / "README.md"] = COPIED / "csrc_README.md"
    files[ROOT / "RELIABILITY.md"] = COPIED / "RELIABILITY.md"
    for src, dst in files.items():
        text = src.read_text(encoding="utf-8")
        here = {q.name for q in dst.parent.glob("*")} | {d.name for d in files.values()
                                                          if d.parent == dst.parent}

        def link(m, here=here):
            label, target = m.group(1), m.group(2)
            if target.startswith(("http://", "https://", "#")):
                return m.group(0)
            if target.split("#")[0] in here or target.endswith(".png"):
                return m.group(0)
            return label
        text = re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", link, text)
        dst.write_text(text, encoding="utf-8")
    png = ROOT / "benchmarks" / "gflops.png"
    if png.exists():
        shutil.copy(png, COPIED / "benchmarks" / png.name)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copy(nb, COPIED / "notebooks" / nb.name)


_copy_sources()

# ---- plots drawn from the benchmark's saved data --------------------------------------
try:
    import plots  # docs/plots.py
    plots.main(DOCS / "_generated")
except ImportError as exc:  # matplotlib is in the docs extra; without it: no plots
    print(f"docs/plots.py skipped: {exc}")

# ---- sources ----------------------------------------------------------------------------
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
root_doc = "index"
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3
nb_execution_mode = "off"              # CI executes the notebooks already (tests/test_notebooks.py)
nb_merge_streams = True

# ---- API reference ----------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"             # the numpydoc sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# numpydoc validation (a failure is a warning, so -W fails the build): every public object has a
# docstring (GL08), documents its parameters (PR01, PR02) and what it returns (RT01), and has an
# Examples section (EX01). The objects below are not validated: constructors (their class's
# Parameters document them), the layers' __call__ (the function their forward is, validated as
# forward), properties, and the methods an exception inherits from BaseException.
numpydoc_validation_checks = {"GL08", "PR01", "PR02", "RT01", "EX01"}
numpydoc_validation_exclude = {
    r"^pyattn\.CacheFullError\.add_note$",       # inherited from BaseException
    r"^pyattn\.CacheFullError\.with_traceback$",
    r"\.__init__$",       # constructors are documented in their class's Parameters
    r"^pyattn\.nn\.\w+\.__call__$",   # the layers' call: the function forward is, validated there
    # properties: attribute-like, one line each
    r"^pyattn\.BlockMask\.shape$",
    r"^pyattn\.KVCache\.max_len$",
    r"^pyattn\.PagedKVCache\.(block_size|blocks_free)$",
}
add_module_names = False

# NumPy, PyTorch and Dask names that the docstrings mention in roles: rendered as
# code (there is no intersphinx inventory offline, see the module docstring).
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|torch|dask|da|ml_dtypes|threadpoolctl|transformers|jax|flash_attn)(\..*)?"),
    (r"py:.*", r"(ndarray|array_like|int|float|bool|str|None|tuple|list|dict|callable|optional|object)"),
]

# ---- HTML -------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "pyattn"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
