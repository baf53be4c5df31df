"""A new user's first hour (issue 30): the install and the import from the
clone, the unbuilt-tree message, `python -m pyattn --help`, PYATTN_ISA's
messages, the C-compiler message, the Python version floor.

Every check runs Python in a subprocess (a fresh import, its own environment).
"""
import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

import pyattn

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

PKG = os.path.dirname(pyattn.__file__)
ROOT = os.path.dirname(PKG)
IN_CLONE = os.path.isfile(os.path.join(ROOT, "setup.py")) and os.path.isdir(os.path.join(ROOT, "csrc"))
needs_clone = pytest.mark.skipif(not IN_CLONE, reason="needs pyattn's source tree (an editable or in-place build)")


def run(args, cwd=None, env=None, **kw):
    e = dict(os.environ)
    e.pop("PYATTN_ISA", None)
    # the pyattn under test, wherever Python starts
    e["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [e.get("PYTHONPATH")] if p])
    e.update(env or {})
    return subprocess.run(args, cwd=cwd, env=e, capture_output=True, text=True, timeout=300, **kw)


def _is_ext(name):
    return any(name == "_C" + s for s in importlib.machinery.EXTENSION_SUFFIXES)


def _copy_package(dst, with_ext=False):
    """The real package folder, stubs and py.typed included; the built
    extension only when asked."""
    shutil.copytree(PKG, dst, ignore=lambda d, names: [
        n for n in names if n == "__pycache__" or (_is_ext(n) and not with_ext)])


def test_unbuilt_source_tree_says_how_to_build(tmp_path):
    # the real package folder with its stubs (_C.pyi), without the binary:
    # an ImportError that says what to do, not a "partially initialized module"
    _copy_package(tmp_path / "pyattn")
    assert (tmp_path / "pyattn" / "_C.pyi").is_file()
    assert not any(_is_ext(n) for n in os.listdir(tmp_path / "pyattn"))
    # -S: no site-packages, so no installed (or editable) pyattn to fall back on
    r = run([sys.executable, "-S", "-c", "import pyattn"], cwd=tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "not built next to" in last and "pip install -e ." in last, r.stderr
    assert "partially initialized" not in r.stderr


def test_built_extension_that_fails_to_load_keeps_its_own_error(tmp_path):
    # a file that is the extension by name but not a loadable binary: the
    # loader's error (why it does not load), not "build it"
    _copy_package(tmp_path / "pyattn")
    (tmp_path / "pyattn" / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not ELF")
    r = run([sys.executable, "-S", "-c", "import pyattn"], cwd=tmp_path)
    assert r.returncode != 0
    assert "not built next to" not in r.stderr and "ImportError" in r.stderr


def test_main_help_prints_help_without_running_the_demo(tmp_path):
    r = run([sys.executable, "-m", "pyattn", "--help"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m pyattn") and "PYATTN_ISA" in r.stdout
    assert "Attention scores" not in r.stdout and "kernel family     :" not in r.stdout
    r = run([sys.executable, "-m", "pyattn", "--bogus"], cwd=tmp_path)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
    r = run([sys.executable, "-m", "pyattn"], cwd=tmp_path)
    assert r.returncode == 0 and "Attention scores" in r.stdout and "kernel family" in r.stdout


def _config(env, tmp_path):
    r = run([sys.executable, "-c", "import pyattn; pyattn.show_config()"], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    family = [ln for ln in r.stdout.splitlines() if "kernel family" in ln]
    assert len(family) == 1
    return family[0], r.stderr


def test_unknown_pyattn_isa_is_not_reported_as_the_families_source(tmp_path):
    line, err = _config({"PYATTN_ISA": "foo"}, tmp_path)
    assert "PYATTN_ISA='foo' is not one of" in err and "ignored" in err
    assert "(PYATTN_ISA)" not in line
    line, err = _config({"PYATTN_ISA": "generic"}, tmp_path)
    assert line.split(":")[1].split()[0] == "generic" and "(PYATTN_ISA)" in line and not err


MACHINE = pyattn._C.config()["isa_machine"]


@pytest.mark.skipif(MACHINE not in ("avx2", "avx512"), reason="x86 kernel levels")
def test_avx512_asked_on_an_avx2_cpu_warns(tmp_path):
    # PYATTN_TEST_CPU (dispatch.c's testing hook) takes this CPU for one
    # with AVX2 only: asking for avx512 there says so and names what runs
    line, err = _config({"PYATTN_ISA": "avx512", "PYATTN_TEST_CPU": "avx2"}, tmp_path)
    assert "PYATTN_ISA='avx512' cannot run on this CPU" in err and "'avx2' kernel family" in err
    assert line.split(":")[1].split()[0] == "avx2" and "(PYATTN_ISA='avx512' cannot run on this CPU)" in line
    line, err = _config({"PYATTN_ISA": "avx2", "PYATTN_TEST_CPU": "generic"}, tmp_path)
    assert "PYATTN_ISA='avx2' cannot run on this CPU" in err and "'generic' kernel family" in err
    # what the CPU has: no warning
    line, err = _config({"PYATTN_ISA": "avx2", "PYATTN_TEST_CPU": "avx2"}, tmp_path)
    assert "RuntimeWarning" not in err and line.split(":")[1].split()[0] == "avx2" and "(PYATTN_ISA)" in line


def test_torch_bfloat16_tensor_gets_a_hint(monkeypatch):
    torch = pytest.importorskip("torch")
    t = torch.ones((2, 3, 4), dtype=torch.bfloat16)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)   # without ml_dtypes: the hint
    with pytest.raises(TypeError, match=r"query .*PyTorch bfloat16 tensor.*t\.float\(\)"):
        pyattn.scaled_dot_product_attention(t, t, t)
    with pytest.raises(TypeError, match=r"^a could not .*ml_dtypes"):
        pyattn.matmul(t, t.float())
    from pyattn.nn import MultiHeadAttention
    m = MultiHeadAttention(4, 4, 2, qkv_bias=True)
    sd = {k: torch.zeros(v.shape, dtype=torch.bfloat16) for k, v in m.state_dict().items()}
    with pytest.raises(ValueError, match="'W_query.weight'.*PyTorch bfloat16 tensor"):
        m.load_state_dict(sd)
    monkeypatch.undo()                                    # ml_dtypes back
    # the hint's recipe works, and with ml_dtypes the tensor is viewed so (DLPack path)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert pyattn.scaled_dot_product_attention(t, t, t).shape == (2, 3, 4)
    a = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    assert pyattn.scaled_dot_product_attention(a, a, a).shape == (2, 3, 4)


@needs_clone
def test_python_version_floor_is_stated_in_one_place():
    # requires-python and setup.py's own check agree (3.9 lacks the C API the
    # extension uses: Py_NewRef)
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert 'requires-python = ">=3.10"' in f.read()
    with open(os.path.join(ROOT, "setup.py")) as f:
        assert "sys.version_info < (3, 10)" in f.read()


def _setuptools_version():
    """The running interpreter's setuptools version as a tuple, None without it."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        v = version("setuptools")
    except (ImportError, PackageNotFoundError):
        return None
    return tuple(int(p) for p in v.split(".")[:2] if p.isdigit())


# setup.py run directly uses this environment's setuptools (pip's build isolation
# does not apply), and pyproject.toml's `license = "MIT"` needs setuptools >= 77:
# the `test` extra asks for it; without the extra, skip with the reason
needs_setuptools_77 = pytest.mark.skipif(
    (_setuptools_version() or (0,)) < (77,),
    reason=f"needs setuptools >= 77 in this environment (pyproject.toml's license field), found "
           f"{'none' if _setuptools_version() is None else '.'.join(map(str, _setuptools_version()))}: "
           "pip install -e \".[test]\" installs it")


@needs_clone
@needs_setuptools_77
def test_build_without_a_c_compiler_says_what_to_install(tmp_path):
    r = run([sys.executable, "setup.py", "-q", "build_ext", "--force", "--build-lib", str(tmp_path / "lib"),
             "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env={"CC": "no-such-cc-pyattn"})
    assert r.returncode != 0
    assert "the C compiler 'no-such-cc-pyattn' was not found" in r.stderr
    assert "apt install gcc python3-dev" in r.stderr
    assert not (tmp_path / "lib").exists()


def _deps_dir(tmp_path):
    """A folder exposing only numpy and setuptools of the running interpreter
    (the temporary venv's build and run-time needs, offline; no pyattn)."""
    import numpy
    setuptools = pytest.importorskip("setuptools", minversion="77")   # pyproject's license field
    deps = tmp_path / "deps"
    deps.mkdir()
    import importlib.util
    hack = importlib.util.find_spec("_distutils_hack")        # setuptools' companion module
    import glob
    dirs = [os.path.dirname(m.__file__) for m in (numpy, setuptools)]
    for d in dirs + ([os.path.dirname(hack.origin)] if hack else []):
        os.symlink(d, deps / os.path.basename(d))
        libs = d + ".libs"                  # numpy wheels' bundled OpenBLAS
        if os.path.isdir(libs):
            os.symlink(libs, deps / os.path.basename(libs))
    for d, m in zip(dirs, (numpy, setuptools)):   # their metadata: setuptools' commands are entry points
        for info in glob.glob(os.path.join(os.path.dirname(d), f"{m.__name__}-{m.__version__}.dist-info")):
            os.symlink(info, deps / os.path.basename(info))
    return deps


@needs_clone
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX venv layout")
def test_editable_install_wins_in_the_clones_parent_folder(tmp_path):
    # A clone named like the package (…/work/pyattn), installed editable, then
    # Python started in …/work (a notebook kept next to the clone): the clone
    # folder must not shadow the install as an empty namespace package.
    clone = tmp_path / "pyattn"
    clone.mkdir()
    for f in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, f), clone)
    shutil.copytree(os.path.join(ROOT, "csrc"), clone / "csrc")
    _copy_package(clone / "pyattn")
    cache = os.path.join(ROOT, "build", "pyattn-ext-cache")
    if os.path.isdir(cache):                # the build this checkout made: no compile
        shutil.copytree(cache, clone / "build" / "pyattn-ext-cache")
    deps = _deps_dir(tmp_path)
    r = run([sys.executable, "-m", "venv", str(tmp_path / "venv")])   # pip from ensurepip: offline
    assert r.returncode == 0, r.stderr
    py = str(tmp_path / "venv" / "bin" / "python")
    env = {"PYTHONPATH": str(deps), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", str(clone)],
            env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    probe = ("import pyattn, numpy as np; print(pyattn.__file__); "
             "print(pyattn.scaled_dot_product_attention(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3))).shape)")
    for cwd in (tmp_path, tmp_path / "venv", clone):   # the clone's parent, elsewhere, the clone
        r = run([py, "-c", probe], env={"PYTHONPATH": str(deps)}, cwd=cwd)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(clone / "pyattn" / "__init__.py"), "(2,", "3)"]
    # an edit in the clone is what Python imports (editable)
    with open(clone / "pyattn" / "__init__.py", "a") as f:
        f.write("\nEDITED_IN_CLONE = 1\n")
    r = run([py, "-c", "import pyattn; print(pyattn.EDITED_IN_CLONE)"], env={"PYTHONPATH": str(deps)},
            cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr


def _unguarded_imports(tree):
    """Top-level module names imported outside `try: ... except ImportError`."""
    import ast
    names, guarded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            for inner in node.body:
                for n in ast.walk(inner):
                    guarded.add(id(n))
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@needs_clone
def test_notebooks_extra_installs_what_the_notebooks_import():
    # `pip install -e ".[notebooks]"` then every notebook runs: each module a
    # notebook imports unconditionally comes with the extra (or NumPy)
    import ast
    import glob
    import json
    import re
    try:
        import tomllib
    except ImportError:                                  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    dists = {re.split(r"[\[<>=!~ ;]", d)[0].lower()
             for d in project["optional-dependencies"]["notebooks"] + project["dependencies"]}
    provides = {"numpy": "numpy", "matplotlib": "matplotlib", "dask": "dask", "distributed": "distributed",
                "IPython": "ipykernel", "threadpoolctl": "threadpoolctl", "nbformat": "nbformat",
                "nbclient": "nbclient", "torch": "torch", "transformers": "transformers"}
    paths = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    assert paths
    for path in paths:
        with open(path) as f:
            cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
        src = "\n".join("".join(c["source"]) for c in cells)
        for name in sorted(_unguarded_imports(ast.parse(src)) - set(sys.stdlib_module_names) - {"pyattn"}):
            assert name in provides, f"{os.path.basename(path)} imports {name}: which distribution provides it?"
            assert provides[name] in dists, (f"{os.path.basename(path)} imports {name}, but the notebooks "
                                             f"extra does not install {provides[name]}")


_FAKE_CC = r'''#!/bin/sh
# a stand-in compiler and linker: logs when it starts and ends, writes the -o file
out=""
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
echo "start $(date +%s.%N)" >> "$FAKE_CC_LOG"
sleep 0.4
mkdir -p "$(dirname "$out")" && : > "$out"
echo "end $(date +%s.%N)" >> "$FAKE_CC_LOG"
'''


def _compiles_at_once(tmp_path, jobs):
    """The most compiler processes running at one time while `setup.py
    build_ext` (-j jobs, or the default) builds a copy of the sources with
    a stand-in compiler (no real compile; nothing lands in the clone's build cache)."""
    src = tmp_path / "src"
    src.mkdir(parents=True)
    for f in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, f), src)
    shutil.copytree(os.path.join(ROOT, "csrc"), src / "csrc")
    _copy_package(src / "pyattn")
    cc = tmp_path / "fakecc"
    cc.write_text(_FAKE_CC)
    cc.chmod(0o755)
    log = tmp_path / "cc.log"
    args = [sys.executable, "setup.py", "-q", "build_ext", "--force", "--build-lib", str(tmp_path / "lib"),
            "--build-temp", str(tmp_path / "tmp")] + ([] if jobs is None else ["-j", str(jobs)])
    r = run(args, cwd=str(src), env={"CC": str(cc), "LDSHARED": f"{cc} -shared", "FAKE_CC_LOG": str(log),
                                     "CFLAGS": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    events = sorted((float(t), 1 if kind == "start" else -1)
                    for kind, t in (line.split() for line in log.read_text().splitlines()))
    n = sum(1 for _, d in events if d == 1)
    assert n > 10, n                                   # every C file, and the link
    running = most = 0
    for _, d in events:
        running += d
        most = max(most, running)
    return most


@needs_clone
@needs_setuptools_77
@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell stand-in compiler")
def test_build_compiles_the_c_files_in_parallel(tmp_path):
    # issue 43 item 4: setuptools' -j alone runs several extensions at once, and
    # pyattn is one extension of many C files; BuildExt compiles the files jobs at a time
    assert _compiles_at_once(tmp_path / "j1", 1) == 1
    assert _compiles_at_once(tmp_path / "j3", 3) == 3
