#!/usr/bin/env bash
# The oldest and the newest supported Python (requires-python = ">=3.10";
# 3.13 the newest tested): for each, a fresh venv inside the clone
# (.venv-py<ver>, pip and setuptools as that Python ships them: nothing upgraded),
# `pip install -e ".[test]"` from the project's own files (NumPy
# and the test extras as wheels from the index; the C extension compiled for
# that interpreter), then a representative subset of the tests: the reference
# and error tests, the layers, the ISA families, generation, the install
# tests (editable install, unbuilt tree, messages). PyTorch is not installed
# here (its comparisons run in .ci/run on the CI's own Python). Then Python 3.9, when there is one: the
# install must stop with a message naming the requirement, not build a
# module that cannot be imported (3.9 lacks Py_NewRef; NumPy's last 3.9 wheels
# are 2.0.x).
#
# Interpreters: $PYATTN_PY_OLDEST / $PYATTN_PY_NEWEST / $PYATTN_PY_TOO_OLD,
# else pyenv's (~/.pyenv/versions/3.X.*), else python3.X on PATH. A missing
# oldest or newest interpreter fails the script (CI must test both).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

find_py() {   # find_py 3.10 -> path of an interpreter of that version, or nothing
  local v=$1 p
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python; do
    [ -x "$p" ] && { echo "$p"; return; }
  done
  command -v "python$v" || true
}

OLDEST=${PYATTN_PY_OLDEST:-$(find_py 3.10)}
NEWEST=${PYATTN_PY_NEWEST:-$(find_py 3.13)}
TOO_OLD=${PYATTN_PY_TOO_OLD:-$(find_py 3.9)}
for v in OLDEST NEWEST; do
  if [ -z "${!v}" ]; then echo "pythons.sh: no interpreter for the $v supported Python" >&2; exit 1; fi
done

TESTS=(tests/test_reference.py tests/test_errors.py tests/test_nn.py tests/test_isa.py
       tests/test_generate.py tests/test_install.py)

for py in "$OLDEST" "$NEWEST"; do
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv="$ROOT/.venv-py${ver/./}"
  echo "== Python $ver ($py)"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  # the pip and setuptools that Python ships (3.10: setuptools 65; 3.13: none), as
  # a new user has them: pip builds in isolation, the test extra brings setuptools>=77
  "$venv/bin/python" -m pip install -q -e ".[test]"
  "$venv/bin/python" -c "import sys, numpy, pyattn; print('  ', sys.version.split()[0], 'numpy', numpy.__version__, pyattn.__file__)"
  (cd /tmp && "$venv/bin/python" -m pyattn --config > /dev/null)
  PYATTN_REQUIRE_TORCH=0 "$venv/bin/python" -m pytest -q -p no:cacheprovider -x "${TESTS[@]}"
done

if [ -n "$TOO_OLD" ]; then
  ver=$("$TOO_OLD" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  echo "== Python $ver ($TOO_OLD): refused with a message"
  venv="$ROOT/.venv-py${ver/./}"
  rm -rf "$venv"
  "$TOO_OLD" -m venv "$venv"
  if "$venv/bin/python" -m pip install -q . > "$venv/install.log" 2>&1; then
    echo "pythons.sh: pip installed pyattn on Python $ver, which is below requires-python" >&2; exit 1
  fi
  grep -E "requires a different Python|needs Python 3.10 or newer" "$venv/install.log" \
    || { cat "$venv/install.log"; echo "pythons.sh: no clear message on Python $ver" >&2; exit 1; }
fi
echo "pythons.sh: Python $("$OLDEST" -V 2>&1 | cut -d' ' -f2) and $("$NEWEST" -V 2>&1 | cut -d' ' -f2) passed"
