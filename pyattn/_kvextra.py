"""attention_with_kvcache's FlashAttention options (issue 29): rotary
embedding of the new keys and of the queries, and the checks of
``cache_leftpad`` / ``cache_batch_idx``. ``_cachespec.cache_spec`` calls
``rotary`` (the tables checked, the queries rotated in C into a scratch of
their size; the new keys are rotated in C as they are written into the
cache, csrc/ops/rotary.h); ``indices`` checks ``cache_leftpad`` /
``cache_batch_idx`` (``_cachespec``; C applies them on the cache's
description); ``cache_layouts`` copies a cache the kernels cannot take in
place.

Shapes: query ``(B, Hq, T, E)``; caches ``(Bc, Hkv, S_max, E/Ev)``; new
keys/values ``(B, Hkv, Tk, E/Ev)``; ``rotary_cos``/``rotary_sin``
``(R, rotary_dim / 2)``.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import _C
from ._checks import as_array, check_numeric, is16

__all__ = []  # private


def _table(x, name):
    a = as_array(x, name)
    check_numeric(a, name)
    if a.ndim != 2:
        raise ValueError(f"{name} must be (seqlen_ro, rotary_dim / 2), got shape {a.shape}")
    return a


def tables(rotary_cos, rotary_sin, k, E, need, what, cd):
    """The checked (cos, sin) tables in cd, for positions up to need."""
    if rotary_cos is None or rotary_sin is None:
        raise ValueError("give both rotary_cos and rotary_sin, or neither")
    if k is None:
        raise ValueError("rotary_cos/rotary_sin rotate the new keys as they are written: "
                         "key and value must be given with them")
    cos, sin = _table(rotary_cos, "rotary_cos"), _table(rotary_sin, "rotary_sin")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary_cos has shape {cos.shape} and rotary_sin {sin.shape}: they must match")
    R, half = cos.shape
    if 2 * half > E:
        raise ValueError(f"rotary_cos has shape {cos.shape}: rotary_dim = {2 * half} exceeds the head "
                         f"dim {E}")
    if need is not None and need >= R:
        raise ValueError(f"rotary_cos/rotary_sin have {R} rows, but positions up to {need} are "
                         f"needed ({what})")
    return _native(cos.astype(cd, copy=False)), _native(sin.astype(cd, copy=False))


def _native(a):
    """a itself when aligned and in native byte order, else one copy in its own
    dtype (native order, aligned): the values and the dtype the rotation rounds
    in stay those of ``a``; only the bytes' layout changes."""
    if a.dtype.isnative and a.flags.aligned:
        return a
    return a.astype(a.dtype.newbyteorder("="))


def rotate_rows(x, pos, cos, sin, interleaved, cd):
    """Rows of ``x (A, H, T, E)`` rotated at ``pos (A, T)`` in C
    (``_C.rotary``, csrc/ops/rotary.h) into a new array: x's own dtype when
    it is 16-bit and cd float32 (rounded once from the exact float32 value),
    else cd; a big-endian or unaligned ``x`` is first copied once into native
    order (its own dtype, so its rounding rule is unchanged). Float32
    arithmetic is exactly rounded (products exact in double); float64 rounds
    as NumPy's ``x1 * c - x2 * s`` does."""
    x = _native(x)                  # a big-endian float16 rounds as float16; unaligned rows are read
    f32 = cd == np.float32
    odt = x.dtype if is16(x.dtype) and f32 else np.dtype(cd)
    src = x if x.dtype == odt or x.dtype == cd else x.astype(cd)
    y = np.empty(x.shape, odt)
    u16 = lambda a: a.view(np.uint16) if a.dtype.kind == "V" else a  # noqa: E731   bfloat16's bits
    _C.rotary(u16(src), np.asarray(pos, np.int64), cos, sin, bool(interleaved), u16(y))
    return y if odt == x.dtype or not is16(x.dtype) else y.astype(x.dtype)


def rotary(q, k, n, rotary_cos, rotary_sin, interleaved, q_steps, cd, cu=None):
    """Rotary embedding (RoPE) of a call: checks the tables for every new key
    ``k (B, Hkv, Tk, E)`` at positions ``n_b + t`` and rotates the queries
    ``q (B, Hq, T, E)`` at ``n_b + t`` (``q_steps``: causal or a window) or
    all at ``n_b`` (FlashAttention's rule), into a new array of the
    queries' size (a 16-bit query keeps its dtype, as FlashAttention rounds
    it; else cd). Packed (``cu``, the (B + 1,) offsets): ``q (total, Hq,
    E)``, ``k (total, Hkv, E)``, row ``cu[b] + t`` at ``n_b + t``. Returns
    ``(q, rope)``: rope = ``(cos, sin, interleaved)`` in cd, which the
    append (``_C.sdpa``'s ``append``) rotates the new keys with as it
    writes them into the cache (they are given in cd). The first
    ``rotary_dim`` features rotate: pairs ``(2i, 2i+1)`` when
    ``interleaved``, else ``(i, i + rotary_dim/2)`` (GPT-NeoX / Llama)."""
    E = None if k is None else k.shape[-1]
    if cu is None:
        need = None
        if k is not None:
            T, Tk = q.shape[2], k.shape[2]
            if (Tk or T) and n.size:
                need = int(n.max()) + max(Tk, T if q_steps else 1) - 1
        cos, sin = tables(rotary_cos, rotary_sin, k, E, need,
                          f"cache_seqlens {None if n is None else n.tolist()} plus the new rows", cd)
        T = q.shape[2]
        qpos = n[:, None] + (np.arange(T) if q_steps else np.zeros(T, np.int64))
        return rotate_rows(q, qpos, cos, sin, interleaved, cd), (cos, sin, bool(interleaved))
    Ts = np.diff(cu)
    seq = np.repeat(np.arange(Ts.size), Ts)
    t = np.arange(seq.size) - cu[seq]
    kpos = n[seq] + t
    need = int(kpos.max()) if seq.size else None
    cos, sin = tables(rotary_cos, rotary_sin, k, E, need,
                      f"cache_seqlens {n.tolist()} plus each sequence's new rows", cd)
    qpos = (kpos if q_steps else n[seq])[None]
    qr = rotate_rows(q.transpose(1, 0, 2)[None], qpos, cos, sin, interleaved, cd)[0].transpose(1, 0, 2)
    return qr, (cos, sin, bool(interleaved))


def cache_layouts(arrays, names, written):
    """The caches and scales of an ``attention_with_kvcache`` call in layouts
    the kernels read and write in place: native byte order, aligned, and (int8
    / int4 caches and their scales) unit stride along the last axis. Any other
    ndarray is copied once, C-contiguous in its own dtype; when the call
    writes the caches (``written``), the copy is written back into the
    caller's array after the call succeeds (a call that raises writes
    nothing). Returns None when nothing needs a copy, else ``(arrays,
    write_back)``. A read-only array that is to be written is left as it is:
    the entry point refuses it, naming it."""
    out, copies = list(arrays), []
    for i, (a, name) in enumerate(zip(arrays, names)):
        if not isinstance(a, np.ndarray) or a.ndim == 0 or a.size == 0:
            continue                    # an empty pool is never read (NumPy may give it any strides)
        rows = a.dtype in (np.int8, np.uint8) or name.endswith("_scale")
        if (a.dtype.isnative and a.flags.aligned and
                not (rows and a.shape[-1] > 1 and a.strides[-1] != a.itemsize)):
            continue
        if written and not a.flags.writeable:
            continue
        c = np.array(a, dtype=a.dtype.newbyteorder("="), order="C", copy=True)
        out[i] = c
        copies.append((a, c))
    if not copies:
        return None

    def write_back():
        if written:
            for a, c in copies:
                a[...] = c
    return out, write_back


def indices(x, name, B, lo, hi, what):
    """(B,) int64 from an int array; every entry in [lo, hi] (hi: an int or (B,))."""
    a = as_array(x, name)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    if a.shape != (B,):
        raise ValueError(f"{name} has shape {a.shape}; expected ({B},)")
    a = a.astype(np.int64)
    bad = (a < lo) | (a > hi)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        top = hi if isinstance(hi, numbers.Integral) else int(hi[b])
        raise ValueError(f"{name}[{b}] = {int(a[b])} is outside [{lo}, {top}] ({what}); nothing was written")
    return a
