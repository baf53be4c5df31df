"""pyattn: attention for NumPy, in C.

Matmul, masked softmax, fused scaled-dot-product attention and multi-head
attention on NumPy arrays, with PyTorch's argument names and conventions.
See ``pyattn.nn`` for layers that mirror the classes of the seed notebooks.

>>> import numpy as np, pyattn
>>> x = np.random.default_rng(0).standard_normal((6, 3))
>>> pyattn.scaled_dot_product_attention(x, x, x).shape
(6, 3)
"""
import os as _os
import warnings as _warnings

try:
    from . import _C
except ImportError:
    import importlib.machinery as _machinery
    if any(_os.path.isfile(_os.path.join(_os.path.dirname(__file__), "_C" + _sfx))
           for _sfx in _machinery.EXTENSION_SUFFIXES):
        raise                    # built, yet it does not load: the original error says why
    raise ImportError(           # the source tree, without its extension built in place
        f"pyattn's C extension (pyattn._C) is not built next to {__file__}: Python is importing "
        "pyattn's source folder, not an installed pyattn. Build it there with `pip install -e .` "
        "(run from the folder holding pyproject.toml), or run Python from another folder to use "
        "the installed copy."
    ) from None
from ._api import (matmul, merge_attention, multi_head_attention,
                   scaled_dot_product_attention, softmax)
from ._grad import (scaled_dot_product_attention_backward, scaled_dot_product_attention_vjp,
                    softmax_backward)
from ._kvapi import attention_with_kvcache
from ._kvcache import KVCache
from ._varlen import (scaled_dot_product_attention_varlen, scaled_dot_product_attention_varlen_backward,
                      scaled_dot_product_attention_varlen_vjp)
from ._paged import CacheFullError, PagedKVCache, PagedPlan
from ._quant import dequantize, quantize
from ._blockmask import BlockMask
from . import masks
from . import _ukr

__version__ = "0.1.0"
__all__ = [
    "matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
    "merge_attention", "attention_with_kvcache", "KVCache",
    "scaled_dot_product_attention_backward", "scaled_dot_product_attention_vjp", "softmax_backward",
    "set_num_threads", "get_num_threads", "show_config", "nn", "__version__",
    "scaled_dot_product_attention_varlen", "scaled_dot_product_attention_varlen_backward",
    "scaled_dot_product_attention_varlen_vjp",
    "PagedKVCache", "PagedPlan", "CacheFullError",
    "quantize", "dequantize",
    "BlockMask", "masks",
]

# The kernel families, PYATTN_ISA's word -> code, as the C extension lists
# them (csrc/registry.h, PA_FAMILIES). "avx512emu" is for tests: the AVX-512
# kernels built over pairs of AVX2 registers, so a CPU without AVX-512 can
# check them (slow; needs AVX2). "neon" is aarch64's.
_ISA_CODES = {word: code for word, code, _built in _C.families()}


def set_num_threads(n: int) -> None:
    """Set the number of threads the kernels use (one pool for the process).

    Results are bit-identical whatever the count. Safe to call while other
    Python threads run pyattn: the change takes effect between calls.

    Parameters
    ----------
    n : int
        Threads, 1 to 1024 (the environment variable ``PYATTN_NUM_THREADS``
        sets the count at import; the default is the CPUs this process may use).

    Raises
    ------
    TypeError
        ``n`` is not an integer.
    ValueError
        ``n`` is outside 1 to 1024.

    See Also
    --------
    get_num_threads

    Examples
    --------
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
    """Number of threads the kernels use (see :func:`set_num_threads`).

    Returns
    -------
    int
        The size of pyattn's thread pool.

    Examples
    --------
    >>> import pyattn
    >>> pyattn.get_num_threads() >= 1
    True
    """
    return _C.get_num_threads()


def _bf16_how(kernel):
    """show_config's word on the bfloat16 products: native or emulated, and how"""
    if kernel.endswith("avx512bf16"):
        return "native: AVX512_BF16's vdpbf16ps"
    if kernel.endswith("_ref"):
        return "emulated: portable scalar C, much slower than float32"
    if kernel.endswith("_neon"):
        return ("emulated on NEON float32 FMAs (flush-to-zero mode), the same bits; "
                "its cost against float32 is not measured on an ARM CPU yet")
    return ("emulated on float32 FMAs, the same bits: this CPU or family has no AVX512_BF16; "
            + _BF16_COST.get(kernel, "about float32 speed"))


# precision="bf16" time / float32 time of the x86 emulations, as measured
# (AMD Zen 5 with PYATTN_TEST_CPU=nobf16, 1 thread, CPU time, minima of
# interleaved runs on a shared machine: matmul 2048^3 and attention B1 H8
# L=S=2048 E=64 / 128, causal or not)
_BF16_COST = {
    "pa_gemm_bf16_avx512": "measured 1.2-1.35x the float32 time (attention L=S=2048) and 1.05x "
                           "(matmul 2048^3) on a Zen 5",
    "pa_gemm_bf16_avx2": "measured 1.1-1.25x the float32 time (attention L=S=2048) and 1.13-1.2x "
                         "(matmul 2048^3) with the avx2 family on a Zen 5",
}


# how decode reads a float cache (C: family.h, PA_READ_*; cpu.c chooses)
_READ_HOW = {"hw": "in place, the hardware's prefetchers",
             "t2": "in place, prefetcht2 8 KiB ahead",
             "nta": "in place, non-temporal software prefetches",
             "gather": "each key tile copied once, the next prefetched"}


def show_config() -> None:
    """Print the version, compiler, kernel family and its kernels, and threads.

    A kernel family is one instruction set's complete kernel set (``generic``
    portable C, ``avx2``, ``avx512``, ``neon``): the best one the CPU has is
    chosen at import, ``PYATTN_ISA`` caps it. The attention driver (the
    ``flash`` line: query block x key tile) is portable C around the family's
    GEMM micro-kernels and online-softmax tile steps.

    Examples
    --------
    >>> import pyattn
    >>> pyattn.show_config()  # doctest: +SKIP
    """
    c = _C.config()

    def size(n: int) -> str:
        return "?" if not n else f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"

    def blocking(b: tuple) -> str:
        return f"MR x NR {b[0]}x{b[1]}, KC {b[2]}, MC {b[3]}, NC {b[4]}"

    print(f"pyattn {__version__}")
    print(f"  compiler          : {c['compiler']}")
    print(f"  CPU supports      : {c['isa_machine']}")
    print(f"  caches (OS)       : L1d {size(c['l1d_bytes'])}, L2 {size(c['l2_bytes'])}, "
          f"L3 {size(c['l3_bytes'])}")
    asked = _os.environ.get("PYATTN_ISA", "").strip().lower() if _env_isa_code(warn=False) >= 0 else ""
    print(f"  kernel family     : {c['isa']}"
          + ("" if not asked else "  (PYATTN_ISA)" if asked == c["isa"]
             else f"  (PYATTN_ISA={asked!r} cannot run on this CPU)"))
    print(f"  GEMM micro-kernels: {c['gemm_f32']}, {c['gemm_f64']}")
    if _ukr.describe(c):
        print(f"  AVX-512 micro-kernel: {_ukr.describe(c)}")
    print(f"  GEMM blocking     : float32 {blocking(c['gemm_f32_blocking'])}; "
          f"float64 {blocking(c['gemm_f64_blocking'])} ({c['gemm_blocking_from']})")
    print(f"  attention (flash) : {c['attn_f32']}, {c['attn_f64']} "
          f"(query rows x keys per tile: {c['attn_f32_tile'][0]}x{c['attn_f32_tile'][1]}, "
          f"{c['attn_f64_tile'][0]}x{c['attn_f64_tile'][1]})")
    print(f"  tile softmax steps: {c['tilesm_f32']}, {c['tilesm_f64']}")
    print(f"  bfloat16 products : {c['gemm_bf16']} (precision='bf16'; "
          f"{_bf16_how(c['gemm_bf16'])})")
    print(f"  backward steps    : {c['backward_f32']}, {c['backward_ds_f32']} (and their float64 twins; "
          f"dK, dV summed over query chunks of 48)")
    print(f"  softmax rows      : {c['softmax_f32']}, {c['softmax_f64']}")
    print(f"  threads           : {c['threads']}")
    print(f"  decode reads      : {c['decode_read']} ({_READ_HOW[c['decode_read']]}"
          + ("; PYATTN_DECODE_READ" if _os.environ.get("PYATTN_DECODE_READ") == c["decode_read"] else "")
          + ")")
    print(f"  shared reads      : {c['shared_blocks']} key/value blocks read once for several "
          f"sequences' queries, {c['shared_reads_saved']} block reads saved (paged decode, "
          f"since import)")


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
        _warnings.warn(f"PYATTN_ISA={isa!r} is not one of {', '.join(_ISA_CODES)}; ignored",
                       RuntimeWarning, stacklevel=3)
    return -1


def _init() -> None:
    import importlib.util
    if importlib.util.find_spec("threadpoolctl") is not None:   # optional: register the pool
        try:
            from . import _threadpoolctl  # noqa: F401
        except ImportError:       # a threadpoolctl without the controller API (< 3.5)
            pass
    want = _env_isa_code()
    _ukr.apply_env()
    got = _C.select_isa(want)
    if want > 0 and got != want:
        # a family this CPU cannot run (asking for avx512 on an AVX2-only CPU
        # included): say what runs instead, never fall back silently
        names = {v: k for k, v in _ISA_CODES.items()}
        _warnings.warn(f"PYATTN_ISA={names[want]!r} cannot run on this CPU (it supports "
                       f"{_C.config()['isa_machine']!r}); using the {names[got]!r} kernel family",
                       RuntimeWarning, stacklevel=2)
    _C.set_num_threads(min(_default_threads(), 1024))


_init()

from . import nn  # noqa: E402  (nn uses the functions above)


def __dir__():
    """The public names only (PEP 562): what tab completion shows."""
    return sorted(__all__)
