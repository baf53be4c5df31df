"""Argument handling shared by the public functions (no arithmetic here).

Everything here turns user input into arrays the C kernels can read in
place: dtype resolution by NumPy promotion, alignment and byte order,
broadcasting through stride-0 views (never copies), and the error messages
that name the argument.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from ._bridge import from_dlpack, torch_bf16_hint

__all__ = []  # private


def as_array(x, name):
    """np.asarray(x) with a TypeError naming the argument when that fails."""
    if isinstance(x, np.ndarray):
        return x
    if x is None:
        raise TypeError(f"{name} is None; expected an array (a NumPy array, list, or tensor)")
    if hasattr(type(x), "__dlpack__"):
        a = from_dlpack(x)
        if a is not None:
            return a
    try:
        return np.asarray(x)
    except Exception as exc:  # objects whose __array__ raises, ragged lists
        raise TypeError(f"{name} could not be converted to a numpy array: {exc}"
                        f"{torch_bf16_hint(x)}") from exc


def is16(dt):
    """float16, or bfloat16 (ml_dtypes' NumPy dtype, found by name so that
    ml_dtypes stays optional): the 16-bit storage types, computed in float32."""
    return dt == np.float16 or (dt.kind == "V" and dt.name == "bfloat16" and dt.itemsize == 2)


# the fp8 formats: the quantize / cache dtype names -> ml_dtypes' type names
FP8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def fp8_of(dt):
    """"fp8_e4m3" / "fp8_e5m2" for ml_dtypes' float8_e4m3fn / float8_e5m2
    (found by name, so that ml_dtypes stays optional), else None."""
    if dt is None or getattr(dt, "itemsize", 0) != 1 or dt.kind not in "Vf":
        return None
    for k, n in FP8.items():
        if dt.name == n:
            return k
    return None


def fp8_dtype(name):
    """ml_dtypes' NumPy dtype of fp8 format name ("fp8_e4m3" / "fp8_e5m2"):
    ImportError saying so when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(f"{name!r} needs the ml_dtypes package (its float8 NumPy dtypes hold fp8 "
                          f"arrays): pip install ml_dtypes") from None
    return np.dtype(getattr(ml_dtypes, FP8[name]))


def cache_dtype(dtype):
    """The storage of a KV cache (KVCache, PagedKVCache): (numpy dtype,
    None) for float32, float64, float16 and bfloat16, or (int8 / uint8 /
    ml_dtypes' float8, "int8" / "int4" / "fp8_e4m3" / "fp8_e5m2") for the
    quantized ones. TypeError naming dtype otherwise (ImportError for fp8
    without ml_dtypes)."""
    if isinstance(dtype, str) and dtype in ("int8", "int4"):
        return np.dtype(np.int8 if dtype == "int8" else np.uint8), dtype
    if isinstance(dtype, str) and dtype in FP8:
        return fp8_dtype(dtype), dtype
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a NumPy dtype, 'int8' or 'int4' (or 'fp8_e4m3' / 'fp8_e5m2'), "
                        f"got {dtype!r}") from None
    if fp8_of(dt):                      # ml_dtypes' float8 dtype itself: that format
        return dt, fp8_of(dt)
    if dt not in (np.float32, np.float64) and not is16(dt):
        raise TypeError(f"dtype must be float32, float64, float16, bfloat16 (ml_dtypes), 'int8' or "
                        f"'int4' (or 'fp8_e4m3' / 'fp8_e5m2'), got {dt}")
    return dt, None


def store16(a, dt):
    """a as the kernels read it: 16-bit storage kept in place when the compute
    dtype dt is float32 (bfloat16 as a uint16 view of its bits), otherwise
    to_dtype(a, dt)."""
    if dt == np.float32 and is16(a.dtype) and a.flags.aligned and a.dtype.isnative:
        return a if a.dtype == np.float16 else a.view(np.uint16)
    return to_dtype(a, dt)


def check_numeric(a, name):
    """Raise TypeError unless a's dtype is bool, integer or a float pyattn computes."""
    k = a.dtype.kind
    if k in "biu" or is16(a.dtype):
        return
    if k == "f" and a.dtype.itemsize <= 8:
        return
    raise TypeError(
        f"{name} has dtype {a.dtype}; pyattn computes in float32 or float64 and accepts "
        "float16/32/64, integer and bool inputs (not complex, object, string, datetime "
        "or extended precision)"
    )


def compute_dtype(*named):
    """Result dtype by NumPy promotion of (array, name) pairs, mapped to what the
    kernels compute in: float16 -> float32, integers/bools -> float64."""
    for a, name in named:
        check_numeric(a, name)
    dt = np.result_type(*[np.dtype(np.float32) if is16(a.dtype) else a.dtype for a, _ in named])
    if dt.kind != "f":
        return np.dtype(np.float64)
    return np.dtype(np.float32) if dt.itemsize <= 4 else np.dtype(np.float64)


def to_dtype(a, dt):
    """a in dtype dt, native byte order and aligned; a view when it already is."""
    if a.dtype != dt:
        a = a.astype(dt)
    if not a.flags.aligned:
        a = a.copy()
    return a


def bcast(a, shape):
    """np.broadcast_to(a, shape), skipped when a already has that shape."""
    return a if a.shape == shape else np.broadcast_to(a, shape)


def broadcast_shapes(named, what="batch axes"):
    """np.broadcast_shapes over (shape, name) pairs with a message naming them."""
    first = tuple(named[0][0])
    if all(tuple(s) == first for s, _ in named[1:]):
        return first
    try:
        return np.broadcast_shapes(*[s for s, _ in named])
    except ValueError:
        desc = ", ".join(f"{n} {tuple(s)}" for s, n in named)
        raise ValueError(f"the {what} do not broadcast: {desc}") from None


def standin(shape, dtype):
    """An array of ``shape`` and ``dtype`` over one zero row (every axis but
    the last of stride 0): a paged call's k / v, which describe the call by
    their shape and dtype while C reads the pools."""
    dtype = np.dtype(dtype)
    row = np.zeros(max(shape[-1], 1), dtype)
    return np.ndarray(shape, dtype, row, 0, (0,) * (len(shape) - 1) + (dtype.itemsize,))


def split_axis(a, axis, n1, n2):
    """View of a with axis `axis` (negative) split into (n1, n2); never a copy."""
    ax = a.ndim + axis
    st = a.strides[ax]
    shape = a.shape[:ax] + (n1, n2) + a.shape[ax + 1:]
    strides = a.strides[:ax] + (st * n2, st) + a.strides[ax + 1:]
    return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=a.flags.writeable)


def causal_code(is_causal, name="is_causal"):
    """False -> 0, True / 'top_left' -> 1, 'bottom_right' -> 2."""
    if isinstance(is_causal, str):
        if is_causal == "top_left":
            return 1
        if is_causal == "bottom_right":
            return 2
        raise ValueError(f"{name} must be True, False, 'top_left' or 'bottom_right', got {is_causal!r}")
    if is_causal is None or isinstance(is_causal, (bool, np.bool_)):
        return 1 if is_causal else 0
    raise ValueError(f"{name} must be True, False, 'top_left' or 'bottom_right', got {is_causal!r}")


def align_code(align, causal):
    """align= (where query row i sits on the key axis): None / "top_left" ->
    False (row i at i, or i + S - L when causal is 2, bottom-right causal),
    "bottom_right" -> True (row i at i + S - L for the causal rule, the
    window and ALiBi, as FlashAttention places it when L != S)."""
    if align is None or (isinstance(align, str) and align == "top_left"):
        if align is not None and causal == 2:
            raise ValueError("align='top_left' contradicts is_causal='bottom_right' (pass align=None "
                             "or align='bottom_right')")
        return False
    if isinstance(align, str) and align == "bottom_right":
        return True
    raise ValueError(f"align must be None, 'top_left' or 'bottom_right', got {align!r}")


def number(x, name, integer=False, allow_none=False):
    """THE scalar argument check (scale, softcap, dropout_p, window sides,
    lengths, sizes): float(x) for a real number -- a Python int or float, a
    NumPy integer or floating scalar, a 0-d integer or float array, any
    numbers.Real -- or, with integer=True, int(x) for an integer (as NumPy
    indexes: operator.index). None only where allow_none. A TypeError naming
    the argument for anything else: strings and bytes (no parsing: "0.5" is
    not a number), complex, and bool (True is a flag, not the number 1: a bool
    here is taken for an argument in the wrong place)."""
    what = "an integer" if integer else "a real number"
    if x is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be {what}, got None")
    a = x
    if isinstance(x, np.ndarray):
        if x.ndim != 0:
            raise TypeError(f"{name} must be {what}, got an array of shape {x.shape}")
        a = x[()]
    if isinstance(a, (bool, np.bool_)):
        raise TypeError(f"{name} must be {what}, got the bool {x!r}")
    if integer:
        if isinstance(a, (numbers.Integral, np.integer)):
            return operator.index(a)
    elif isinstance(a, (numbers.Real, np.integer, np.floating)):
        try:
            return float(a)
        except OverflowError:
            raise ValueError(f"{name} is too large for a float: {x!r}") from None
    raise TypeError(f"{name} must be {what}, got {x!r} ({type(x).__name__})")


def real_scalar(x, name):
    """float(x) for a real number; TypeError naming the argument otherwise (number())."""
    return number(x, name)


def dropout_p_value(p):
    p = number(p, "dropout_p")
    if not (0.0 <= p < 1.0):
        raise ValueError(f"dropout_p must be in [0, 1), got {p}")
    return p


def dropout_key(rng):
    """A 64-bit key for the counter-based dropout generator, drawn from rng
    (as NumPy's random API takes it: None, an int seed, a SeedSequence or
    BitGenerator, or a Generator, which is advanced)."""
    if isinstance(rng, np.random.Generator):
        gen = rng
    elif isinstance(rng, (bool, np.bool_)):
        raise TypeError(f"rng must be None, an int seed or a numpy.random.Generator, got {rng!r}")
    else:
        try:
            gen = np.random.default_rng(rng)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"rng must be None, an int seed or a numpy.random.Generator, got {rng!r}"
            ) from exc
    return int(gen.integers(0, 2**64, dtype=np.uint64))


def not_flag_mask(mask, name):
    """TypeError when a mask slot holds a Python (or NumPy scalar) bool: the
    PyTorch habit sdpa(q, k, v, True) meant is_causal=True; NumPy would read
    it as a 0-d mask that keeps every key (PyTorch refuses it too)."""
    if isinstance(mask, (bool, np.bool_)):
        kind = ("bool (True = may attend) or float (added to the scores)" if name == "attn_mask"
                else "bool (True = may attend)")
        raise TypeError(f"{name} is {bool(mask)!r}, a bool where a mask array belongs ({kind}); for a "
                        "causal mask pass is_causal=True (by keyword: in scaled_dot_product_attention "
                        "the fourth positional argument is attn_mask)")


def prep_mask(mask, shape, dt, name="attn_mask"):
    """Mask as a stride-0 broadcast view of `shape`: bool (True = may attend)
    stays bool, floats are cast to the compute dtype dt (additive). A bool
    scalar is a TypeError naming is_causal (not_flag_mask)."""
    not_flag_mask(mask, name)
    m = as_array(mask, name)
    k = m.dtype.kind
    if k == "b":
        m = to_dtype(m, np.dtype(np.bool_))
    elif (k == "f" and m.dtype.itemsize <= 8) or is16(m.dtype):
        m = to_dtype(m, dt)
    else:
        raise TypeError(
            f"{name} must be bool (True = may attend) or float (added to the scores), "
            f"got dtype {m.dtype}"
        )
    try:
        return bcast(m, tuple(shape))
    except ValueError:
        raise ValueError(
            f"{name} has shape {m.shape}, which does not broadcast to the score shape {tuple(shape)}"
        ) from None


def check_out(out, shape, dt, narrow=()):
    """Validate a user `out`: ndarray of exactly `shape` and dtype `dt` (or one of
    the 16-bit dtypes in `narrow`, which the result is rounded into), writeable."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape) or (out.dtype != dt and out.dtype not in narrow):
        alt = "".join(f" (or {d})" for d in dict.fromkeys(str(d) for d in narrow))
        raise ValueError(
            f"out has shape {out.shape} and dtype {out.dtype}, but the result has shape "
            f"{tuple(shape)} and dtype {dt}{alt}"
        )
    if not out.flags.writeable:
        raise ValueError("out must be writeable")


def out_for_kernel(out, inputs):
    """True when the kernels may write straight into out: aligned, native,
    and sharing no memory with any input (else pyattn computes into a new
    array and copies, as NumPy does for overlapping ufunc operands)."""
    if not out.flags.aligned or not out.dtype.isnative:
        return False
    return not any(x is not None and np.may_share_memory(out, x) for x in inputs)


def index_value(n, name):
    """int(n) for an integer; TypeError naming the argument otherwise (number())."""
    return number(n, name, integer=True)


def window_value(window, reach=None):
    """(left, right) for the C frame: each a non-negative int, or -1 for None
    (unbounded on that side). reach: S + L (+ |qoff|), beyond which a side
    passes every key from every query position (those lie within [-L, S]):
    a side at least that wide is unbounded too, so any Python int is taken
    and no sum in C comes near 2**63."""
    if window is None:
        return -1, -1
    if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
        raise TypeError(f"window must be a pair (left, right) of ints or None, got {window!r}")
    res = []
    for side, w in zip(("left", "right"), window):
        n = number(w, f"window {side} size", integer=True, allow_none=True)
        if n is None or (reach is not None and n >= reach):
            res.append(-1)
            continue
        if n < 0:
            raise ValueError(f"window sizes must be >= 0 (or None), got window={tuple(window)!r}")
        res.append(n)
    return res[0], res[1]


def window_arg(left, right):
    """The inverse of window_value: a (left, right) pair of ints, a negative
    side unbounded (the C frame's, torch.library's and FlashAttention's -1),
    as pyattn's ``window`` (None: unbounded on both sides)."""
    if left < 0 and right < 0:
        return None
    return (None if left < 0 else left, None if right < 0 else right)


def softcap_value(softcap):
    """0.0 for None; a finite float > 0 otherwise."""
    if softcap is None:
        return 0.0
    c = number(softcap, "softcap")
    if not (c > 0 and np.isfinite(c)):
        raise ValueError(f"softcap must be a finite number > 0 (or None), got {softcap!r}")
    return c


def per_head(x, name, full_batch, shapes_doc):
    """A per-head float parameter (ALiBi slopes, sinks) as a float64 array of
    full_batch's shape (batch axes and the query heads): x's shape must be a
    trailing part of full_batch (``(Hq,)``, or ``(B, Hq)``...)."""
    a = as_array(x, name)
    if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
        raise TypeError(f"{name} must be a float array, got dtype {a.dtype}")
    nb = len(full_batch)
    if nb == 0:
        raise ValueError(f"{name} needs a head axis (-3) in query, whose shape has none")
    if not (1 <= a.ndim <= nb) or a.shape != tuple(full_batch[nb - a.ndim:]):
        raise ValueError(f"{name} has shape {a.shape}; expected {shapes_doc} with the "
                         f"query's heads: one of {[tuple(full_batch[nb - d:]) for d in range(1, nb + 1)]}")
    return np.ascontiguousarray(np.broadcast_to(a.astype(np.float64), tuple(full_batch)))


def precision_value(precision, dt):
    """precision= (API.md "Reduced-precision compute"): None / "highest" -> False,
    "bf16" -> True (float32 compute only); anything else is a ValueError."""
    if precision is None or (isinstance(precision, str) and precision == "highest"):
        return False
    if isinstance(precision, str) and precision == "bf16":
        if dt != np.float32:
            raise ValueError(f"precision='bf16' needs float32 (or float16 / bfloat16) inputs; these compute "
                             f"in {dt} (cast them to float32 first)")
        return True
    if isinstance(precision, str) and precision == "int8":
        raise ValueError("precision='int8' is for int8 / int4 KV caches only (attention_with_kvcache, "
                         "KVCache.attend, PagedKVCache.attend with such a cache)")
    raise ValueError(f"precision must be None, 'highest' or 'bf16' (or 'int8' with an int8 / int4 KV "
                     f"cache), got {precision!r}")


def int8_precision(precision, k_cache) -> bool:
    """precision="int8" (API.md "Decode precision and FP8 caches"): True when
    asked for, with k_cache an int8 / int4 cache (np.int8, or packed np.uint8);
    a ValueError naming precision with any other cache. Any other precision:
    False (precision_value checks it)."""
    if not (isinstance(precision, str) and precision == "int8"):
        return False
    dt = getattr(k_cache, "dtype", None)
    if dt not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise ValueError(f"precision='int8' needs an int8 or int4 cache (k_cache int8, or int4 packed in "
                         f"uint8, with k_scale; not fp8 or float caches); this k_cache is {dt}")
    return True
