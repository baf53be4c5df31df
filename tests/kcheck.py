"""The per-kernel checks' test-only extension `_kcheck`, built on demand.

The checks (csrc/check/: kernel_check.c and its templates, kcheck_module.c)
are not part of the shipped pyattn._C. `load()` compiles them -- the two C
files only, no kernel: the module runs _C's own family tables, which it gets
through the private capsule pyattn._C._families_capsule (csrc/families_api.h)
-- with the compiler and flags setuptools uses for pyattn itself (CC, CFLAGS,
LDFLAGS from the environment: CI's sanitizer step builds it sanitized too),
into build/kcheck/<hash>/, keyed by a hash of the sources, the compiler
settings and the interpreter, and imports it. A later run with the same key
reuses the binary. Without a C compiler it returns the reason instead (the
tests then skip, saying so); a compile error is raised.
"""
import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from glob import glob

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
SOURCES = [os.path.join(CSRC, "check", "kernel_check.c"), os.path.join(CSRC, "check", "kcheck_module.c")]
NAME = "_kcheck"
# the flags setup.py gives pyattn's own files (fp-contract off: the twins' bits)
GCC_FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fno-strict-aliasing",
             "-ffp-contract=off", "-fvisibility=hidden", "-pthread"]
MSVC_FLAGS = ["/O2", "/std:c11", "/W3"]
KEEP = 8                                # builds kept in build/kcheck/ (sanitized, per Python ...)
ENV = ("CC", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED")

_loaded = None


def _inputs():
    """Every file the build reads: the check sources and the headers and
    templates under csrc/ (what they include), and this script."""
    files = set(SOURCES) | {os.path.abspath(__file__)}
    for ext in ("h", "inc"):
        files.update(glob(os.path.join(CSRC, "**", "*." + ext), recursive=True))
    return sorted(files)


def _key():
    h = hashlib.sha256()
    for p in _inputs():
        with open(p, "rb") as f:
            h.update(os.path.relpath(p, ROOT).encode() + b"\0" + f.read() + b"\0")
    for part in (sys.version, sys.platform, sysconfig.get_config_var("EXT_SUFFIX"),
                 sysconfig.get_config_var("CC"), sysconfig.get_config_var("LDSHARED"),
                 [os.environ.get(v) for v in ENV]):
        h.update(repr(part).encode() + b"\0")
    return h.hexdigest()[:24]


def _out_dir(key):
    """build/kcheck/<key> in the checkout, or in the temp folder where the
    checkout is read-only."""
    for base in (os.path.join(ROOT, "build", "kcheck"),
                 os.path.join(tempfile.gettempdir(), "pyattn-kcheck")):
        d = os.path.join(base, key)
        try:
            os.makedirs(d, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            pass
    raise OSError("no writable folder for the kernel checks' build (build/kcheck/, the temp folder)")


def _prune(base, keep=KEEP):
    """Drop all but the `keep` newest builds (each a folder named by its key)."""
    try:
        dirs = sorted((os.path.join(base, d) for d in os.listdir(base)), key=os.path.getmtime)
    except OSError:
        return
    for d in dirs[:-keep]:
        shutil.rmtree(d, ignore_errors=True)


def _build(out_dir):
    """Compile and link the extension into out_dir (atomically: a temporary
    folder, then a rename, so concurrent runs never load half a file)."""
    from setuptools import Distribution, Extension
    from setuptools.errors import CCompilerError, CompileError, LinkError, PlatformError

    tmp = tempfile.mkdtemp(prefix="build-", dir=out_dir)
    try:
        ext = Extension(NAME, sources=[os.path.relpath(s, ROOT) for s in SOURCES],
                        include_dirs=[os.path.relpath(CSRC, ROOT)])
        dist = Distribution({"ext_modules": [ext], "script_name": "kcheck"})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = os.path.join(tmp, "lib")
        cmd.build_temp = os.path.join(tmp, "obj")
        cmd.ensure_finalized()
        if os.name == "nt":             # MSVC (setuptools finds it, or raises PlatformError)
            ext.extra_compile_args = MSVC_FLAGS
        else:                           # the compiler setuptools will run: CC, else Python's own
            cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "").split()
            if not cc or shutil.which(cc[0]) is None:
                return None, (f"no C compiler: {cc[0] if cc else 'CC'!r} was not found (the kernel checks "
                              "are compiled for the tests: tests/kcheck.py)")
            ext.extra_compile_args, ext.extra_link_args = GCC_FLAGS, ["-pthread"]
        cwd = os.getcwd()
        os.chdir(ROOT)                  # relative sources: objects land under build_temp
        try:
            cmd.run()
        except PlatformError as e:      # MSVC: no Build Tools
            return None, f"no C compiler: {e}"
        except (CCompilerError, CompileError, LinkError) as e:
            raise RuntimeError(f"building the kernel checks (csrc/check/) failed: {e}") from e
        finally:
            os.chdir(cwd)
        built = cmd.get_ext_fullpath(NAME)
        final = os.path.join(out_dir, os.path.basename(built))
        os.replace(built, final)
        _prune(os.path.dirname(out_dir))
        return final, None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load():
    """(module, None), or (None, why) where no C compiler is available."""
    global _loaded
    if _loaded is not None:
        return _loaded
    import pyattn._C  # noqa: F401  (the capsule's owner, imported first)
    out_dir = _out_dir(_key())
    path = os.path.join(out_dir, NAME + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.isfile(path):
        path, why = _build(out_dir)
        if path is None:
            _loaded = (None, why)
            return _loaded
    spec = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _loaded = (mod, None)
    return _loaded


def module_or_skip():
    """The module, or a skip of the calling test that says why there is none."""
    mod, why = load()
    if mod is None:
        import pytest
        pytest.skip(why)
    return mod
