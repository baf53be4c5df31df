"""csrc/README.md against the C sources: its file map names every file under
csrc/, and the layering counts it quotes (csrc/tools/layers.py's report, run
here as a script: include and call cycles, upward arrows) can only go down.

From an installed sdist: csrc/ and its README ship (MANIFEST.in), so the file
map is checked there too; csrc/tools/layers.py does not ship, so the counts
are checked in a source tree only. Without csrc/ everything skips."""
import os
import contextlib
import io
import re
import runpy
import sys

import pytest

pytestmark = [pytest.mark.nofamily]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
README = os.path.join(CSRC, "README.md")
LAYERS = os.path.join(CSRC, "tools", "layers.py")
COUNT = re.compile(r"^(files not in the file map|include cycles|call cycles|upward includes|upward calls): (\d+)$",
                   re.M)

if not os.path.isdir(CSRC):
    pytest.skip("no csrc/ here (tests run from an installed package)", allow_module_level=True)


def csrc_files():
    out = []
    for d, dirs, files in os.walk(CSRC):
        dirs[:] = [x for x in dirs if x != "__pycache__" and not x.startswith(".")]
        for f in files:
            if f.startswith(".") or f.endswith((".pyc", ".o", ".so", ".pyd")):
                continue
            rel = os.path.relpath(os.path.join(d, f), CSRC).replace(os.sep, "/")
            if rel != "README.md":
                out.append(rel)
    return sorted(out)


def file_map():
    """The files the README's "## File map" table names, in its order."""
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r"^## File map\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "csrc/README.md has no '## File map' section"
    return re.findall(r"^\|\s*`([^`]+)`\s*\|", m.group(1), re.M)


def test_every_csrc_file_is_in_the_file_map():
    named = file_map()
    missing = [f for f in csrc_files() if f not in named]
    assert not missing, f"files under csrc/ not named in csrc/README.md's file map: {missing}"
    dup = sorted({f for f in named if named.count(f) > 1})
    assert not dup, f"named twice in the file map: {dup}"


def test_the_file_map_names_no_file_that_is_gone():
    if not os.path.exists(LAYERS):
        pytest.skip("csrc/tools/layers.py is not shipped (an sdist: only *.c *.h *.inc ship)")
    gone = [f for f in file_map() if not os.path.exists(os.path.join(CSRC, f))]
    assert not gone, f"csrc/README.md's file map names files that do not exist: {gone}"


def run_layers(monkeypatch):
    """csrc/tools/layers.py run as a script (in this process: no subprocess,
    so the sanitizer steps can run it too); its printed report."""
    monkeypatch.setattr(sys, "argv", [LAYERS])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(LAYERS, run_name="__main__")
    return buf.getvalue()


def test_layering_counts_do_not_grow(monkeypatch):
    if not os.path.exists(LAYERS):
        pytest.skip("csrc/tools/layers.py is not shipped (an sdist)")
    out = run_layers(monkeypatch)
    now = {k: int(v) for k, v in COUNT.findall(out)}
    with open(README, encoding="utf-8") as fh:
        stated = {k: int(v) for k, v in COUNT.findall(fh.read())}
    assert set(now) == set(stated) == {"files not in the file map", "include cycles", "call cycles",
                                        "upward includes", "upward calls"}, (now, stated)
    assert now["include cycles"] <= stated["include cycles"], out
    grew = {k: (stated[k], now[k]) for k in now if now[k] > stated[k]}
    assert not grew, (f"csrc/ layering got worse than csrc/README.md states ((stated, now): {grew}); "
                      f"the report:\n{out}")


SIZES = re.compile(r"^over (\d+) (lines|parameters): (\d+)$", re.M)


def test_no_binding_or_frame_function_over_the_limits(monkeypatch):
    """Issue 39: no function of csrc/*.c (binding, dispatch, runtime) or ops/
    (the frame) over 80 lines or 10 parameters (csrc/tools/layers.py
    --sizes, which lists them), and csrc/README.md says so. Private Python
    functions' limit: tests/test_limits.py."""
    if not os.path.exists(LAYERS):
        pytest.skip("csrc/tools/layers.py is not shipped (an sdist)")
    monkeypatch.setattr(sys, "argv", [LAYERS, "--sizes"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(LAYERS, run_name="__main__")
    out = buf.getvalue()
    counts = {(int(n), what): int(c) for n, what, c in SIZES.findall(out)}
    assert set(counts) == {(80, "lines"), (10, "parameters")}, out
    assert all(c == 0 for c in counts.values()), f"functions over issue 39's limits:\n{out}"
    with open(README, encoding="utf-8") as fh:
        stated = {(int(n), what): int(c) for n, what, c in SIZES.findall(fh.read())}
    assert stated == counts, (f"csrc/README.md's 'Function sizes, measured' states {stated}, "
                              f"csrc/tools/layers.py --sizes measures {counts}")
