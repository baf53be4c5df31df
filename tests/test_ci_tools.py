"""The CI's own checks: a check that fails on a clean tree is as harmful as one
that cannot fail. Each is fed a log it must accept and one it must reject."""
import os
import subprocess
import sys

import pytest

# CI (.ci/run): does not depend on the kernel family (or switches the families itself)
pytestmark = [pytest.mark.nofamily]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = os.path.join(ROOT, ".ci", "valgrind_summary.py")
if not os.path.exists(SUMMARY):   # an sdist ships the tests, not .ci/
    pytest.skip(".ci/ is not here (the tests run from an sdist)", allow_module_level=True)

# A definite leak inside CPython's import machinery, run from a clone whose
# folder is named pyattn (as `git clone` names it): not pyattn's.
NUMPY_LEAK = """\
==123== 64 bytes in 1 blocks are definitely lost in loss record 10 of 20
==123==    at 0x4848899: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==123==    by 0x5A1B2C3: PyInit__multiarray_umath (in /srv/ci/pyattn/.venv-ci/lib/python3.11/site-packages/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so)
==123==    by 0x4C2E10: _PyImport_LoadDynamicModuleWithSpec (in /usr/bin/python3.11)
==123==
"""

OWN_LEAKS = [
    # a function of the extension
    """\
==9== 32 bytes in 1 blocks are definitely lost in loss record 1 of 2
==9==    at 0x4848899: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==9==    by 0x6B0: pa_attn_setup (in /tmp/x/_C.cpython-311-x86_64-linux-gnu.so)
==9==
""",
    # a static function of a csrc file, with debug lines
    """\
==9== 32 bytes in 1 blocks are definitely lost in loss record 1 of 2
==9==    at 0x4848899: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==9==    by 0x6B0: kv_append (module.c:812)
==9==
""",
    # no symbol: only the extension's shared object
    """\
==9== Invalid read of size 4
==9==    at 0x6B0: ??? (in /srv/ci/proj/pyattn/_C.cpython-311-x86_64-linux-gnu.so)
==9==
""",
]


def run(tmp_path, text):
    log = tmp_path / "valgrind.log"
    log.write_text(text + "==123== ERROR SUMMARY: 0 errors from 0 contexts\n")
    return subprocess.run([sys.executable, SUMMARY, str(log)], capture_output=True, text=True)


def test_valgrind_summary_ignores_a_clone_named_pyattn(tmp_path):
    r = run(tmp_path, NUMPY_LEAK)
    assert r.returncode == 0, r.stdout
    assert "1 definite-leak records in all, 0 through pyattn's code" in r.stdout


@pytest.mark.parametrize("text", OWN_LEAKS)
def test_valgrind_summary_finds_pyattn_frames(tmp_path, text):
    r = run(tmp_path, text)
    assert r.returncode == 1, r.stdout
    assert "1 through pyattn's code" in r.stdout


def test_ci_selects_tests_by_markers_not_file_lists():
    """.ci/run names no test file but the one a step exists for (the notebooks):
    a new test file runs in every step unless its markers say otherwise; and
    the sanitizer step builds the kernel checks' extension with its flags."""
    import re
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        lines = [s for s in f.read().splitlines() if not s.lstrip().startswith("#")]
    named = {m for s in lines for m in re.findall(r"tests/(test_\w+\.py)", s) if "echo" not in s}
    assert named <= {"test_notebooks.py"}, named
    san = next(s for s in lines if s.startswith("san() {"))
    body = lines[lines.index(san) + 1]
    assert 'CFLAGS="$SAN_CFLAGS"' in body and 'LDFLAGS="$SAN_LDFLAGS"' in body, body
