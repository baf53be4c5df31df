"""The README's and the guides' Python code blocks run as written, in order.

Each Markdown file's ```python blocks are executed one after another in one
namespace, in a fresh subprocess (so a block sees what the blocks above it
defined, exactly as a reader pasting them into one session would). A block
that uses an optional package that is not installed (torch, transformers,
ml_dtypes, dask) is skipped with that reason, and so is every later block of
the same file that uses it; CI installs all of them.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("torch", "transformers", "ml_dtypes", "dask")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def markdown_files():
    files = [ROOT / "README.md"]
    docs = ROOT / "docs"
    if docs.is_dir():
        files += sorted(p for p in docs.rglob("*.md")
                        if "_build" not in p.parts and not p.name.startswith("_"))
    return files


def python_blocks(path):
    """The ```python blocks of a Markdown file, with their first line numbers."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


def missing_optional():
    out = []
    for name in OPTIONAL:
        try:
            __import__(name)
        except ImportError:
            out.append(name)
    return out


# Runs the blocks in one namespace and reports each as ok / skip / error, as JSON
# lines on stdout (the blocks' own output goes to stderr).
RUNNER = r"""
import json, sys, traceback, re, io, contextlib

blocks, missing = json.loads(sys.stdin.read())
ns = {"__name__": "__main__"}
report = sys.stdout
sys.stdout = sys.stderr
for line, src in blocks:
    need = [m for m in missing if re.search(r"\b%s\b" % m, src)]
    if need:
        report.write(json.dumps([line, "skip", "needs " + ", ".join(need)]) + "\n"); continue
    try:
        exec(compile(src, "block at line %d" % line, "exec"), ns)
    except BaseException:
        report.write(json.dumps([line, "error", traceback.format_exc()]) + "\n")
        break
    report.write(json.dumps([line, "ok", ""]) + "\n")
    report.flush()
"""


def run_file(path, cwd=None):
    """Run a file's blocks in a fresh interpreter that imports the pyattn this
    process imports (the checkout's or an installed one), from ``cwd``."""
    import pyattn
    blocks = python_blocks(path)
    env = dict(os.environ)
    env.setdefault("PYATTN_NUM_THREADS", "2")
    env["MPLBACKEND"] = "Agg"
    site = str(Path(pyattn.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER], input=json.dumps([blocks, missing_optional()]),
        capture_output=True, text=True, cwd=str(cwd or ROOT), env=env, timeout=900)
    results = [json.loads(s) for s in proc.stdout.splitlines() if s.startswith("[")]
    return blocks, results, proc


FILES = [p for p in markdown_files() if python_blocks(p)]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_code_blocks_run_in_order(path, tmp_path):
    blocks, results, proc = run_file(path, cwd=tmp_path)
    rel = path.relative_to(ROOT)
    assert results, f"{rel}: the runner reported nothing\n{proc.stderr[-4000:]}"
    for line, status, detail in results:
        assert status != "error", f"{rel}, the block at line {line} failed:\n{detail}"
    assert len(results) == len(blocks), (
        f"{rel}: {len(results)} of {len(blocks)} blocks ran\n{proc.stderr[-4000:]}")
    skipped = [f"line {line}: {detail}" for line, status, detail in results if status == "skip"]
    if skipped:
        pytest.skip(f"{rel}: blocks skipped ({'; '.join(skipped)})")


def test_readme_has_blocks():
    assert len(python_blocks(ROOT / "README.md")) >= 5
