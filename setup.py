"""Build script for the pyattn C extension (pyattn._C).

Flags: C11, -O3; never tuned for the build machine's CPU, never fast-math. SIMD kernels select their
instruction set per function with __attribute__((target(...))), so every other
file builds for the baseline of the platform and the wheel runs on any CPU of
that architecture. Extra flags (e.g. CFLAGS=-Werror in CI) come from the
environment as usual.
"""
import hashlib
import os
import shutil
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from glob import glob

if sys.version_info < (3, 10):    # pip says so from requires-python; setup.py run directly too
    sys.exit(f"pyattn needs Python 3.10 or newer (its C extension uses the 3.10 C API, and "
             f"NumPy >= 2.1 no longer supports 3.9); this is Python {sys.version.split()[0]}")

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import PlatformError

HERE = os.path.dirname(os.path.abspath(__file__))
# Built extensions, kept by the hash of everything that goes into them (see
# BuildExt.build_extension): the README's installs (demo, tests, notebooks)
# and every `pip install [-e] .` after the first reuse the binary instead of
# compiling for a minute each time; delete the folder to drop them.
CACHE = os.path.join(HERE, "build", "pyattn-ext-cache")
CACHE_KEEP = 8
# csrc/check/ is left out: the kernel checks are a test-only extension
# (tests/kcheck.py builds it), not part of the shipped pyattn._C
TEST_ONLY = os.path.join("csrc", "check") + os.sep
SOURCES = sorted(
    os.path.relpath(p, HERE)
    for p in glob(os.path.join(HERE, "csrc", "**", "*.c"), recursive=True)
    if not os.path.relpath(p, HERE).startswith(TEST_ONLY)
)
# headers and templates included by the sources: a change to any of them
# rebuilds the extension (setuptools tracks only what is listed)
DEPENDS = sorted(
    os.path.relpath(p, HERE)
    for ext in ("h", "inc")
    for p in glob(os.path.join(HERE, "csrc", "**", "*." + ext), recursive=True)
    if not os.path.relpath(p, HERE).startswith(TEST_ONLY)
)


def _no_compiler_message(what):
    return (f"pyattn's C extension cannot be built: {what}. pyattn needs a C compiler and the "
            "Python headers: on Debian/Ubuntu `sudo apt install gcc python3-dev`, on Fedora "
            "`sudo dnf install gcc python3-devel`, on macOS `xcode-select --install`, on "
            "Windows the \"Desktop development with C++\" workload of Visual Studio Build "
            "Tools; conda users: `conda install -c conda-forge c-compiler`. Then run the "
            "install again.")


def _cpus():
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _parallel_compile(compiler, jobs):
    """Make compiler.compile build its sources `jobs` at a time (setuptools'
    own parallel option only runs several *extensions* at once, and pyattn is
    one extension of many C files). The same commands and objects as the
    serial compile, one compiler process per file; the first error stops the
    build with the compiler's own message. Compilers without the Unix
    compiler's per-file _compile (MSVC) stay serial."""
    if jobs <= 1 or not all(hasattr(compiler, a) for a in ("_setup_compile", "_get_cc_args", "_compile")):
        return

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            if obj in build:
                src, ext = build[obj]
                compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for f in [pool.submit(one, obj) for obj in objects]:
                f.result()              # the first failure, re-raised here
        return objects

    compiler.compile = compile


class BuildExt(build_ext):
    def _check_toolchain(self):
        """A clear message, before the first compile, where the compiler or
        Python.h is missing (instead of setuptools' generic failure)."""
        if self.compiler.compiler_type == "msvc":
            return                   # setuptools' own message names Build Tools there
        cc = self.compiler.compiler_so[0]
        if shutil.which(cc) is None:
            raise PlatformError(_no_compiler_message(f"the C compiler {cc!r} was not found"))
        inc = sysconfig.get_paths()["include"]
        if not os.path.isfile(os.path.join(inc, "Python.h")):
            raise PlatformError(_no_compiler_message(f"the Python headers (Python.h) are not in {inc}"))

    def _cache_key(self, ext):
        """Hash of the sources, headers, this script, the compiler command and
        flags (CFLAGS etc. included), NumPy's version and the interpreter."""
        h = hashlib.sha256()
        for p in sorted(set(ext.sources) | set(ext.depends)) + [os.path.basename(__file__)]:
            with open(os.path.join(HERE, p), "rb") as f:
                h.update(p.encode() + b"\0" + f.read() + b"\0")
        for part in (self.compiler.compiler_type, getattr(self.compiler, "compiler_so", None),
                     getattr(self.compiler, "linker_so", None), ext.extra_compile_args,
                     ext.extra_link_args, ext.define_macros, self.debug, np.__version__,
                     sys.version, sys.platform, sysconfig.get_config_var("EXT_SUFFIX"),
                     [os.environ.get(v) for v in ("CC", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED")]):
            h.update(repr(part).encode() + b"\0")
        return h.hexdigest()[:24]

    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        cached = os.path.join(CACHE, self._cache_key(ext) + "-" + os.path.basename(target))
        if not self.force and os.path.isfile(cached):
            print(f"pyattn: reusing the extension built before ({os.path.relpath(cached, HERE)})")
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
            shutil.copyfile(cached, target)
            return
        super().build_extension(ext)
        try:                         # keep it (a read-only or full disk only costs the reuse)
            os.makedirs(CACHE, exist_ok=True)
            tmp = f"{cached}.{os.getpid()}.tmp"
            shutil.copyfile(target, tmp)
            os.replace(tmp, cached)
            old = sorted(glob(os.path.join(CACHE, "*")), key=os.path.getmtime)[:-CACHE_KEEP]
            for p in old:
                os.remove(p)
        except OSError:
            pass

    def build_extensions(self):
        ctype = self.compiler.compiler_type
        for ext in self.extensions:
            if ctype == "msvc":
                ext.extra_compile_args = ["/O2", "/std:c11", "/W3"]
            else:
                ext.extra_compile_args = [
                    "-std=c11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter",
                    "-fno-strict-aliasing", "-ffp-contract=off",
                    "-fvisibility=hidden", "-pthread",
                ]
                ext.extra_link_args = ["-pthread"]
        self._check_toolchain()
        # all the CPUs this process may use, unless `build_ext -j N` says otherwise
        jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 0 else _cpus()
        _parallel_compile(self.compiler, jobs)
        super().build_extensions()


ext = Extension(
    "pyattn._C",
    sources=SOURCES,
    depends=DEPENDS,
    include_dirs=[np.get_include(), os.path.join("csrc")],
    # NPY_TARGET_VERSION: the NumPy C API the extension may use (1.22: the
    # memory-handler calls, bind_views.c), at most the oldest NumPy it runs
    # with (numpy>=1.23); NumPy 2.0-2.2's headers default to 1.19 and hide them
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_22_API_VERSION"), ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
