"""pyattn: attention for NumPy, in C.

Matmul, masked softmax, fused scaled-dot-product attention and multi-head
attention on NumPy arrays, with PyTorch's argument names and conventions.
See ``pyattn.nn`` for layers that mirror the classes of the seed notebooks.

>>> import numpy as np, pyattn
>>> x = np.random.default_rng(0).standard_normal((6, 3))
>>> pyattn.scaled_dot_product_attention(x, x, x).shape
(6, 3)
"""
from __future__ import annotations

import os as _os
import warnings as _warnings

from . import _C
from ._api import matmul, multi_head_attention, scaled_dot_product_attention, softmax

__version__ = "0.1.0"
__all__ = [
    "matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
    "set_num_threads", "get_num_threads", "show_config", "nn", "__version__",
]

# "avx512emu" is for tests: the AVX-512 kernels built over pairs of AVX2
# registers, so a CPU without AVX-512 can check them (slow; needs AVX2)
_ISA_CODES = {"generic": 0, "avx2": 1, "avx512": 2, "avx512emu": 3}


def set_num_threads(n: int) -> None:
    """Set the number of threads the kernels use (one pool for the process).

    Results are bit-identical whatever the count. Safe to call while other
    Python threads run pyattn: the change takes effect between calls.

    >>> import pyattn
    >>> pyattn.set_num_threads(1); pyattn.get_num_threads()
    1
    """
    import operator
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"n must be an integer, got {n!r}") from None
    _C.set_num_threads(n)


def get_num_threads() -> int:
    """Number of threads the kernels use (see :func:`set_num_threads`)."""
    return _C.get_num_threads()


def show_config() -> None:
    """Print the version, compiler, CPU kernel family and kernels in use, and threads."""
    c = _C.config()
    print(f"pyattn {__version__}")
    print(f"  compiler        : {c['compiler']}")
    print(f"  CPU supports    : {c['isa_machine']}")
    print(f"  family allowed  : {c['isa']}"
          + ("  (PYATTN_ISA)" if _os.environ.get("PYATTN_ISA") else ""))
    print(f"  matmul kernels  : {c['gemm_f32']}, {c['gemm_f64']}")
    print(f"  attention       : {c['attn_f32']}, {c['attn_f64']} (tile softmax {c['attn_tile_softmax']})")
    print(f"  softmax         : {c['softmax_f32']}, {c['softmax_f64']}")
    print(f"  threads         : {c['threads']}")


def _default_threads() -> int:
    env = _os.environ.get("PYATTN_NUM_THREADS")
    if env:
        try:
            n = int(env)
            if n >= 1:
                return n
        except ValueError:
            pass
        _warnings.warn(f"PYATTN_NUM_THREADS={env!r} is not a positive integer; ignored",
                       RuntimeWarning, stacklevel=2)
    try:
        return max(1, len(_os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, _os.cpu_count() or 1)


def _env_isa_code(warn: bool = True) -> int:
    """The kernel-family code PYATTN_ISA asks for (-1: the best the CPU has)."""
    isa = _os.environ.get("PYATTN_ISA", "").strip().lower()
    if not isa:
        return -1
    if isa in _ISA_CODES:
        return _ISA_CODES[isa]
    if warn:
        _warnings.warn(f"PYATTN_ISA={isa!r} is not one of generic, avx2, avx512, avx512emu; ignored",
                       RuntimeWarning, stacklevel=3)
    return -1


def _init() -> None:
    _C.select_isa(_env_isa_code())
    _C.set_num_threads(min(_default_threads(), 1024))


_init()

from . import nn  # noqa: E402  (nn uses the functions above)
