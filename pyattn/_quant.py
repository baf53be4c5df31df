"""Symmetric per-group quantization: pyattn.quantize and pyattn.dequantize
(the C op is csrc/ops/quant.c; the float64-free NumPy oracle is
pyattn._reference.quantize)."""
from __future__ import annotations

import operator

import numpy as np

from . import _C
from ._checks import FP8, as_array, fp8_dtype, fp8_of, is16

__all__ = ["quantize", "dequantize"]

# the C binding's "bits": 8, 4, or the fp8 formats' codes (csrc/ops/quant.h)
_BITS = {"int8": 8, "int4": 4, "fp8_e4m3": 1, "fp8_e5m2": 2}
# the largest finite value of each format: scale = max|x_g| / this
_QMAX = {"int8": 127, "int4": 7, "fp8_e4m3": 448, "fp8_e5m2": 57344}


def _bits(dtype) -> int:
    if isinstance(dtype, str) and dtype in _BITS:
        return _BITS[dtype]
    raise ValueError(f"dtype must be 'int8' or 'int4' (or 'fp8_e4m3' / 'fp8_e5m2'), got {dtype!r}")


def _group(group_size) -> int:
    try:
        g = operator.index(group_size)
    except TypeError:
        raise TypeError(f"group_size must be an integer, got {group_size!r}") from None
    if g < 1:
        raise ValueError(f"group_size must be >= 1, got {g}")
    return g


def _axis(axis, nd: int, name: str = "x") -> int:
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis must be an integer, got {axis!r}") from None
    if not -nd <= a < nd:
        raise ValueError(f"axis {a} is out of range for {name} with {nd} dimensions")
    return a % nd


def quantize(x, /, dtype="int8", *, group_size=32, axis=-1):
    """Quantize ``x`` symmetrically per group of ``group_size`` values along ``axis``.

    For each group ``x_g`` (float32 values; other float dtypes -- float64,
    float16, ``ml_dtypes.bfloat16`` -- are rounded to float32 first):

    - ``scale = max|x_g| / 127`` (int8) or ``/ 7`` (int4): one float32
      division, rounded to nearest;
    - ``q = clip(rint(x / scale), -127, 127)`` (int4: ``-7, 7``), where
      ``x / scale`` is one float32 division of the float32 value by the
      float32 scale, rounded to nearest, and ``rint`` rounds ties to even;
      ``q = 0`` wherever ``scale == 0``.

    ``dequantize(q, scale)`` is ``float32(q) * scale``. The same rule writes
    the rows of an int8 / int4 :class:`KVCache`.

    fp8 (``"fp8_e4m3"``, ``"fp8_e5m2"``; needs ``ml_dtypes``): ``scale =
    max|x_g| / 448`` (e4m3) or ``/ 57344`` (e5m2), float32; ``q`` is the
    float32 ``x / scale`` rounded to the fp8 format to nearest even,
    saturating to its largest finite value (+-448 / +-57344; subnormals kept,
    ``-0`` kept), ``0`` where ``scale == 0``; returned as
    ``ml_dtypes.float8_e4m3fn`` / ``ml_dtypes.float8_e5m2``. The rows of an
    fp8 :class:`KVCache` are written with it.

    Unlike llama.cpp's q8_0 (``d = amax / 127`` stored as float16,
    ``q = roundf(x * (1 / d))``: ties away from zero, a multiply by the
    float32 reciprocal), the scale stays float32 and the value is divided by
    it; where the two rules give the same scale and no tie or reciprocal
    rounding intervenes, the integers agree (tests/test_quant.py).

    Parameters
    ----------
    x : array_like, float32, float64, float16 or ``ml_dtypes.bfloat16``
        Shape ``(..., E, ...)`` with ``E = x.shape[axis]`` a multiple of
        ``group_size`` (even for int4); at least one dimension. Values other
        than float32 are rounded to float32 first; NaN and +-inf are refused.
    dtype : {"int8", "int4", "fp8_e4m3", "fp8_e5m2"}, default "int8"
        The format: int8 (values in ``[-127, 127]``), int4 (values in
        ``[-7, 7]``, two per byte), or fp8 (ml_dtypes' float8_e4m3fn /
        float8_e5m2, one per byte).
    group_size : int, default 32
        Values per scale, ``>= 1``; it must divide ``E``.
    axis : int, default -1
        The axis the groups run along (negative: counted from the end).

    Returns
    -------
    q : ndarray
        ``np.int8`` of ``x``'s shape (int8), or ``np.uint8`` with ``E / 2``
        along ``axis`` (int4: two values per byte, value ``2i`` in the low
        nibble of byte ``i``, ``2i + 1`` in the high one, two's complement),
        or ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2`` of ``x``'s shape (fp8).
    scale : ndarray
        float32, ``x``'s shape with ``E / group_size`` along ``axis``.

    Raises
    ------
    ValueError
        NaN or +-inf in ``x`` (a scale cannot hold them), a ``group_size``
        that does not divide ``E`` (or is below 1), a ``dtype`` other than
        the four above, an ``axis`` out of range, a 0-d ``x``.
    ImportError
        An fp8 ``dtype`` without ``ml_dtypes`` installed.
    TypeError
        A non-float ``x`` (integers, bool, complex); a ``group_size`` or
        ``axis`` that is not an integer.

    See Also
    --------
    dequantize : The inverse, ``x = q * scale`` per group.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> q, s = pyattn.quantize(np.array([[1.0, -0.5, 0.25, 2.0]]), group_size=2)
    >>> q, s
    (array([[127, -64,  16, 127]], dtype=int8), array([[0.00787402, 0.01574803]], dtype=float32))

    int4 packs two values per byte (the first in the low nibble):

    >>> q4, s4 = pyattn.quantize(np.array([3.5, -3.5, 1.0, 0.0], np.float32), "int4", group_size=4)
    >>> q4, s4          # byte 0: 7 low, -7 (0b1001) high = 151; byte 1: 1.0 / 0.5 = 2, 0
    (array([151,   2], dtype=uint8), array([0.5], dtype=float32))
    """
    bits = _bits(dtype)
    qdt = fp8_dtype(dtype) if dtype in FP8 else np.dtype(np.int8 if bits == 8 else np.uint8)
    g = _group(group_size)
    x = as_array(x, "x")
    if not (x.dtype.kind == "f" or is16(x.dtype)):
        raise TypeError(f"x must hold floating-point values (float16, bfloat16, float32 or float64), "
                        f"got dtype {x.dtype}")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension")
    a = _axis(axis, x.ndim)
    E = x.shape[a]
    if E % g != 0 or (bits == 4 and E % 2 != 0):
        raise ValueError(f"group_size {g} must divide x.shape[{a}] = {E}"
                         + (" (which must be even for int4)" if bits == 4 else ""))
    qshape = list(x.shape)
    qshape[a] = E // 2 if bits == 4 else E
    sshape = list(x.shape)
    sshape[a] = E // g
    q = np.empty(qshape, qdt)
    s = np.empty(sshape, np.float32)
    with np.errstate(over="ignore"):          # a float64 beyond float32 becomes inf: ValueError
        xf = np.require(x, np.float32, "A")    # float32 (rounded), aligned, native order
        _C.quantize(np.moveaxis(xf, a, -1), np.moveaxis(q, a, -1), np.moveaxis(s, a, -1), bits, g)
    return q, s


def _infer(q, scale, a, dtype, group_size):
    """(bits, group size) of a dequantize call: what q's dtype and the two
    shapes say, checked against the dtype / group_size given (None: not
    given). TypeError for a q dtype quantize never returns, ValueError where
    a given value contradicts the arrays or the shapes do not fit."""
    said = {np.dtype(np.int8): "int8", np.dtype(np.uint8): "int4"}.get(q.dtype) or fp8_of(q.dtype)
    if said is None:
        raise TypeError(f"q must be np.int8 (int8), np.uint8 (int4, two values per byte) or ml_dtypes' "
                        f"float8_e4m3fn / float8_e5m2 (fp8) as quantize returns it, got dtype {q.dtype}")
    if dtype is not None:
        _bits(dtype)
        if dtype != said:
            stored = {"int8": "np.int8", "int4": "packed np.uint8"}.get(dtype) or FP8[dtype]
            raise ValueError(f"dtype={dtype!r} contradicts q: q is {q.dtype}, which is {said!r} ("
                             f"{stored} is {dtype!r}); leave dtype out to read it from q")
    bits = _BITS[said]
    E = q.shape[a] * (2 if bits == 4 else 1)
    if scale.ndim != q.ndim:
        raise ValueError(f"scale must have q's {q.ndim} dimensions (q's shape with axis {a} of "
                         f"E / group_size), got shape {scale.shape}")
    ng = scale.shape[a]
    if ng == 0 and E == 0:
        inferred = None                      # nothing to dequantize: any group size fits
    elif ng == 0 or E % ng:
        raise ValueError(f"scale has {ng} groups along axis {a}, which does not divide q's {E} "
                         f"values there (q shape {q.shape}, scale shape {scale.shape})")
    else:
        inferred = E // ng
    if group_size is not None:
        g = _group(group_size)
        if inferred is not None and g != inferred:
            raise ValueError(f"group_size={g} contradicts the shapes: q holds {E} values along axis {a} "
                             f"and scale {ng} groups, so the group size is {inferred}; leave group_size "
                             "out to read it from the shapes")
        inferred = g
    return bits, 1 if inferred is None else inferred


def dequantize(q, scale, /, *, dtype=None, group_size=None, axis=-1, out_dtype=np.float32):
    """The inverse of :func:`quantize`: ``x = q * scale`` per group.

    ``dequantize(*quantize(x, "int4", group_size=16))`` needs no repeated
    arguments: ``dtype`` and ``group_size`` default to what ``q`` and
    ``scale`` say.

    Parameters
    ----------
    q : array_like, ``np.int8``, ``np.uint8`` or an ml_dtypes float8
        ``(..., E, ...)`` ``np.int8`` (int8), ``(..., E/2, ...)``
        ``np.uint8`` (int4, packed as :func:`quantize` packs), or
        ``(..., E, ...)`` ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``
        (fp8: its value, exact in float32, times the scale); at least one
        dimension.
    scale : array_like, float32
        ``q``'s shape with ``E / group_size`` along ``axis`` (``q``'s other
        axes unchanged); any byte order.
    dtype : {"int8", "int4", "fp8_e4m3", "fp8_e5m2"} or None, optional
        Default: from ``q``'s dtype (``np.int8`` is int8, ``np.uint8``
        int4, a float8 dtype that fp8 format). Given, it must agree with
        ``q``'s dtype.
    group_size : int or None, optional
        Default: ``E / scale.shape[axis]``. Given, it must agree with the
        shapes.
    axis : int, default -1
        The axis the groups run along (negative: counted from the end).
    out_dtype : float32 (default), float64 or float16
        float32: the product rounded once (one float32 multiply). float64:
        the exact product of the integer and the float32 scale (a float64
        holds it). float16: the float32 result rounded to float16.

    Returns
    -------
    x : ndarray
        ``(..., E, ...)`` of ``out_dtype``.

    Raises
    ------
    TypeError
        A ``q`` or ``scale`` of the wrong dtype (``q`` not ``np.int8``,
        ``np.uint8`` or an fp8 dtype, ``scale`` not float32), an ``out_dtype`` other
        than the three above.
    ValueError
        Mismatched shapes, or a ``dtype`` / ``group_size`` given that
        contradicts ``q``'s dtype or the shapes; a 0-d ``q``; an ``axis``
        out of range.

    See Also
    --------
    quantize : The forward rule, and the int4 packing.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> x = np.array([[1.0, -0.5, 0.25, 2.0]], np.float32)
    >>> pyattn.dequantize(*pyattn.quantize(x, group_size=2))
    array([[ 1.       , -0.503937 ,  0.2519685,  2.       ]], dtype=float32)

    int4, read from ``q``'s dtype and the shapes, the result in float64:

    >>> q4, s4 = pyattn.quantize(np.array([3.5, -3.5, 1.0, 0.0], np.float32), "int4", group_size=4)
    >>> pyattn.dequantize(q4, s4, out_dtype=np.float64)
    array([ 3.5, -3.5,  1. ,  0. ])

    fp8, read from ``q``'s ml_dtypes float8 dtype:

    >>> q8, s8 = pyattn.quantize(np.array([448.0, -1.0, 0.3, 20.0], np.float32), "fp8_e4m3", group_size=4)
    >>> q8.dtype.name, pyattn.dequantize(q8, s8).tolist()
    ('float8_e4m3fn', [448.0, -1.0, 0.3125, 20.0])
    """
    q = as_array(q, "q")
    scale = as_array(scale, "scale")
    if scale.dtype.newbyteorder("=") != np.float32:        # any byte order: its numbers count
        raise TypeError(f"scale must be float32, got {scale.dtype}")
    od = np.dtype(out_dtype)
    if od not in (np.float32, np.float64, np.float16):
        raise TypeError(f"out_dtype must be float32, float64 or float16, got {od}")
    if q.ndim == 0:
        raise ValueError("q must have at least one dimension")
    a = _axis(axis, q.ndim, "q")
    bits, g = _infer(q, scale, a, dtype, group_size)
    E = q.shape[a] * (2 if bits == 4 else 1)
    if E % g != 0:
        raise ValueError(f"group_size {g} must divide the axis length {E}")
    sshape = list(q.shape)
    sshape[a] = E // g
    if scale.shape != tuple(sshape):
        raise ValueError(f"scale must have shape {tuple(sshape)} (q's with axis {a} of E/group_size "
                         f"= {E // g}), got {scale.shape}")
    q = np.require(q, None, "A")
    scale = np.require(scale, np.float32, "A")     # aligned, native order (one copy where it is not)
    xshape = list(q.shape)
    xshape[a] = E
    x = np.empty(xshape, np.float64 if od == np.float64 else np.float32)
    _C.dequantize(np.moveaxis(q, a, -1), np.moveaxis(scale, a, -1), np.moveaxis(x, a, -1), bits, g)
    return x if od == x.dtype else x.astype(od)
