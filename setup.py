"""Build script for the pyattn C extension (pyattn._C).

Flags: C11, -O3; never tuned for the build machine's CPU, never fast-math. SIMD kernels select their
instruction set per function with __attribute__((target(...))), so every other
file builds for the baseline of the platform and the wheel runs on any CPU of
that architecture. Extra flags (e.g. CFLAGS=-Werror in CI) come from the
environment as usual.
"""
import os
import sys
from glob import glob

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(
    os.path.relpath(p, HERE)
    for p in glob(os.path.join(HERE, "csrc", "**", "*.c"), recursive=True)
)
# headers and templates included by the sources: a change to any of them
# rebuilds the extension (setuptools tracks only what is listed)
DEPENDS = sorted(
    os.path.relpath(p, HERE)
    for ext in ("h", "inc")
    for p in glob(os.path.join(HERE, "csrc", "**", "*." + ext), recursive=True)
)


class BuildExt(build_ext):
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
        super().build_extensions()


ext = Extension(
    "pyattn._C",
    sources=SOURCES,
    depends=DEPENDS,
    include_dirs=[np.get_include(), os.path.join("csrc")],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_22_API_VERSION")],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
