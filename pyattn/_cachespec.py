"""One description of a KV cache call (Architecture v4, issue 39 item 1).

``cache_spec`` checks what ``attention_with_kvcache`` is given about its
caches -- contiguous caches ``(B, Hkv, S_max, E)`` or paged pools
``(num_blocks, Hkv, block_size, E)`` with a block table, their element dtype
(float32, float64, float16, bfloat16, or int8 / int4 with float32 scales
``(..., E / group)``), the rows written (``cache_seqlens``, packed
``cu_seqlens_q``, a ``tree_mask``), the new rows to append and the rotary
tables -- and normalises it into one immutable ``CacheSpec``, which the
runners (``_kvapi`` for contiguous caches, ``_kvpaged`` for paged, packed
and tree calls) take instead of re-listing twenty options. The conversion to
the C binding's tuples (``_C.sdpa``'s ``append`` and ``paged``) is made in
one place: ``CacheSpec.c_append`` and ``CacheSpec.c_paged`` (as
``AttnSpec.c_kwargs`` gives the keywords).

``cache_leftpad`` / ``cache_batch_idx`` (contiguous caches) are fields of
the spec, checked here and applied in C on the cache's description
(csrc/bind_call.c, ``pa_cache``): sequence b reads its keys from row
``leftpad[b]`` of cache entry ``batch_idx[b]``.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional

import numpy as np

from . import _kvextra
from ._checks import (as_array, check_numeric, check_out, fp8_of, int8_precision, is16, not_flag_mask,
                      number, precision_value, real_scalar, to_dtype)
from ._spec import AttnSpec, attn_spec

__all__ = []  # private


class CacheSpec(NamedTuple):
    """A KV cache call, checked and normalised (see the module docstring).
    A NamedTuple, as ``_spec.AttnSpec`` (cheap to build on every call)."""
    query: np.ndarray            # (B, Hq, T, E) or packed (total, Hq, E): rotated, in the compute dtype
    k_cache: np.ndarray          # the caches / pools as given (checked)
    v_cache: np.ndarray
    k_scale: Optional[np.ndarray]   # an int8 / int4 cache's float32 scales, else None
    v_scale: Optional[np.ndarray]
    cd: np.dtype                 # the compute dtype (float32 or float64)
    B: int                       # sequences (the caches' batch, or the block table's rows)
    Hq: int
    Hkv: int
    S: int                       # keys a sequence may hold (S_max, or table columns x block_size)
    E: int                       # head dims (int4: two values a byte, counted as values)
    Ev: int
    T: int                       # query rows per sequence (packed: the most)
    key: Optional[np.ndarray]    # the new rows (checked), or None
    value: Optional[np.ndarray]
    n: np.ndarray                # (B,) int64 rows filled before the call
    kv_len: np.ndarray           # (B,) int64 rows attended (n + new rows)
    rope: Optional[tuple]        # (cos, sin, interleaved) in cd: the append rotates the new keys
    scale: float
    opts: dict                   # the call's attention options as given (is_causal, window, softcap, ...)
    # paged, packed and tree calls (_kvpaged); None / 0 for contiguous caches
    table: Optional[np.ndarray] = None   # (B, W) int64 block table (contiguous caches there: one block each)
    paged: bool = False          # a block table was given
    bs: int = 0                  # rows per block
    cu: Optional[np.ndarray] = None      # (B + 1,) int64 query offsets (packed), else every T
    packed: bool = False
    Ts: Optional[np.ndarray] = None      # (B,) query rows per sequence
    written: Optional[tuple] = None      # (block, row) of every row written
    tree: Optional[np.ndarray] = None    # the checked tree_mask
    slopes: Optional[np.ndarray] = None  # alibi_slopes as an array (checked against (B, Hq))
    int8: bool = False           # precision="int8" with an int8 / int4 k cache
    # contiguous caches (FlashAttention's options): sequence b's keys from row leftpad[b], in
    # cache entry batch_idx[b] ((B,) int64, checked; None: row 0, entry b)
    leftpad: Optional[np.ndarray] = None
    batch_idx: Optional[np.ndarray] = None

    @property
    def quant(self) -> bool:
        """An int8 / int4 cache (its scales given)."""
        return self.k_scale is not None or self.v_scale is not None

    def u16(self) -> tuple:
        """The caches as the binding takes them (bfloat16 as its uint16 bits)."""
        return tuple(c.view(np.uint16) if is16(c.dtype) and c.dtype.kind == "V" else c
                     for c in (self.k_cache, self.v_cache))

    def rows(self, kn, vn) -> tuple:
        """New rows kn, vn in the caches' storage, as the binding's append takes
        them (a copy: never a view of a cache): a quantized cache's as float32
        (quantized as they are written), rotary keys in cd (rotated as they
        are written), else the cache's dtype (bfloat16 as its uint16 bits)."""
        out = []
        for i, (x, c) in enumerate(((kn, self.k_cache), (vn, self.v_cache))):
            r = x.astype(np.float32 if _qcache(c) else self.cd if self.rope and i == 0 else c.dtype,
                         order="C", copy=True)
            out.append(r.view(np.uint16) if is16(r.dtype) and r.dtype.kind == "V" else r)
        return tuple(out)

    def c_append(self, rows, n) -> tuple:
        """_C.sdpa's ``append`` of this call (``c_append``, the module's)."""
        paged = self.table is not None
        return c_append(self.u16(), rows, np.ascontiguousarray(n, np.int64) if paged else n, paged,
                        (self.k_scale, self.v_scale) if self.quant else None, self.rope)

    def c_paged(self, table) -> tuple:
        """_C.sdpa's ``paged`` of this call (``c_paged``, the module's)."""
        return c_paged(self.u16(), np.ascontiguousarray(table), (self.k_scale, self.v_scale) if self.quant else None)

    def attn(self, q, k, v, mask=None, kv_len=None, slopes=None) -> AttnSpec:
        """The AttnSpec of a kernel call over this cache: q its queries, k, v
        stand-ins of the keys/values' shape (float32 ones for a quantized
        cache: the spec's checks), the call's options."""
        o = self.opts
        spec = attn_spec(q, k, v, mask, 0.0, "bottom_right" if o["is_causal"] else False, self.scale,
                         q.shape[-3] != self.Hkv,
                         {"window": o["window"], "alibi_slopes": slopes, "softcap": o["softcap"], "sinks": o["sinks"],
                          "precision": None if self.int8 else o["precision"], "return_lse": o["return_lse"],
                          "kv_len": kv_len, "block_mask": o.get("block_mask")})
        return spec


# ---- the binding's cache tuples, in one place (CacheSpec's and _kvfast's per-call path) ---------

def c_append(caches, rows, n, paged, scales=None, rope=None) -> tuple:
    """_C.sdpa's ``append``: contiguous caches (k, v, rows_k, rows_v, n[,
    k_scale, v_scale][, rope]); paged (rows_k, rows_v, n[, rope]) (the pools
    and scales are in ``c_paged``). caches: (k, v) as the binding takes
    them; n: (B,) int64, contiguous; scales: (k_scale, v_scale) or None."""
    tail = () if rope is None else (rope,)
    if paged:
        return (rows[0], rows[1], n) + tail
    return (caches[0], caches[1], rows[0], rows[1], n) + (() if scales is None else tuple(scales)) + tail


def c_paged(pools, table, scales=None) -> tuple:
    """_C.sdpa's ``paged``: (k pool, v pool, table[, k_scale, v_scale])."""
    return (pools[0], pools[1], table) + (() if scales is None else tuple(scales))


# ---- checks shared by the contiguous and the paged layouts -----------------------------------

def _cache_array(x, name, writeable):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray (it is read, and written, in place), "
                        f"got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64, np.int8, np.uint8) and not is16(x.dtype) and not fp8_of(x.dtype):
        raise TypeError(f"{name} must be float32, float64, float16 or bfloat16, or int8 / uint8 (int4 "
                        f"pairs) / ml_dtypes float8_e4m3fn / float8_e5m2 with its scales, got dtype {x.dtype}")
    if x.ndim != 4:
        raise ValueError(f"{name} must be (B, Hkv, S_max, E), got shape {x.shape}")
    if writeable and not x.flags.writeable:
        raise ValueError(f"{name} is read-only, but key/value were given to be written into it")
    return x


def _seqlens(cache_seqlens, B, limit, T):
    """(B,) int64 from an int or a (B,) integer array (never modified), each
    entry in [0, limit] (limit: S_max, or S_max - T with T new rows): compared
    as they are, never summed, so nothing wraps however large they are."""
    if cache_seqlens is None:
        raise TypeError("cache_seqlens is required: an int or a (B,) integer array of filled rows")
    name = "cache_seqlens"
    if isinstance(cache_seqlens, (list, tuple)):
        vals = [number(x, "cache_seqlens entries", integer=True) for x in cache_seqlens]
    elif isinstance(cache_seqlens, (numbers.Number, np.generic, bool, str, bytes)):
        vals = number(cache_seqlens, name, integer=True)
    else:
        a = as_array(cache_seqlens, name)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
        vals = int(a[()]) if a.ndim == 0 else a
    if isinstance(vals, int):
        vals = [vals] * B
    if isinstance(vals, list) and len(vals) != B:
        raise ValueError(f"{name} has {len(vals)} entries; expected an int or shape ({B},)")
    if isinstance(vals, np.ndarray):
        if vals.shape != (B,):
            raise ValueError(f"{name} has shape {vals.shape}; expected an int or shape ({B},)")
        bad = np.ones(B, bool) if limit < 0 else (vals < 0) | (vals > limit)
    else:
        bad = np.array([not 0 <= x <= limit for x in vals], bool)
    if bad.any():
        shown = vals.tolist() if isinstance(vals, np.ndarray) else vals
        raise ValueError(f"{name} must be in [0, S_max{' - T' if T else ''}] = [0, {limit}] "
                         f"(S_max = {limit + T}{f', T = {T} new rows' if T else ''}), got {shown}; "
                         "nothing was written")
    return np.array(vals, dtype=np.int64)


def _qcache(c):
    """Values per stored element of a quantized cache: 1 (int8, fp8), 2 (int4
    in uint8); 0 for a float cache."""
    return 1 if c.dtype == np.int8 or fp8_of(c.dtype) else 2 if c.dtype == np.uint8 else 0


def _qname(c):
    """The quantized format of a cache array: "int8", "int4", "fp8_e4m3" or
    "fp8_e5m2" (for messages)."""
    return fp8_of(c.dtype) or ("int8" if c.dtype == np.int8 else "int4")


def _scale_value(scale, E):
    return (1.0 / math.sqrt(E) if E > 0 else 1.0) if scale is None else real_scalar(scale, "scale")


# ---- the one builder ---------------------------------------------------------------------------

def cache_spec(query, k_cache, v_cache, key, value, a) -> CacheSpec:
    """Check a KV cache call and normalise it into a CacheSpec: ``a`` holds
    attention_with_kvcache's keywords (all of them, as given). A block
    table, cu_seqlens_q or a tree_mask make a paged call (a contiguous cache
    there is one block of S_max rows per sequence); else contiguous.
    Raises what attention_with_kvcache documents, naming the argument."""
    if a["block_table"] is not None or a["cu_seqlens_q"] is not None or a["tree_mask"] is not None:
        return _paged_spec(query, k_cache, v_cache, key, value, a)
    return _contiguous_spec(query, k_cache, v_cache, key, value, a)


def _contiguous_spec(query, k_cache, v_cache, key, value, a):
    k_scale, v_scale = a["k_scale"], a["v_scale"]
    new = key is not None
    kc = _cache_array(k_cache, "k_cache", new)
    vc = _cache_array(v_cache, "v_cache", new)
    kq, vq = _qcache(kc), _qcache(vc)
    for c, sc, nm, sn in ((kc, k_scale, "k_cache", "k_scale"), (vc, v_scale, "v_cache", "v_scale")):
        if _qcache(c) and sc is None:
            raise ValueError(f"{nm} is an {_qname(c)} cache: {sn} (its float32 "
                             "scales, (B, Hkv, S_max, E / group)) is required")
        if not _qcache(c) and sc is not None:
            raise ValueError(f"{sn} is given but {nm} is {c.dtype}, not an int8 / int4 / fp8 cache")
        if sc is not None and not (isinstance(sc, np.ndarray) and sc.dtype == np.float32):
            raise TypeError(f"{sn} must be a float32 numpy.ndarray, got "
                            f"{getattr(sc, 'dtype', type(sc).__name__)}")
    cd = np.dtype(np.float32) if is16(kc.dtype) or kq else kc.dtype    # the compute dtype
    if (np.dtype(np.float32) if is16(vc.dtype) or vq else vc.dtype) != cd:
        raise TypeError(f"k_cache ({kc.dtype}) and v_cache ({vc.dtype}) must compute in one dtype")
    B, Hkv, S_max, E = kc.shape
    E *= kq or 1
    if vc.shape[:3] != (B, Hkv, S_max):
        raise ValueError(f"v_cache has shape {vc.shape} and k_cache {kc.shape}: their first three "
                         "axes (B, Hkv, S_max) must match")
    Ev = vc.shape[3] * (vq or 1)
    q = as_array(query, "query")
    check_numeric(q, "query")
    if q.ndim != 4:
        raise ValueError(f"query must be (B, Hq, T, E), got shape {q.shape}")
    idx = None
    if a["cache_batch_idx"] is not None:        # sequence b in cache entry idx[b]: any B
        B = q.shape[0]
        idx = _kvextra.indices(a["cache_batch_idx"], "cache_batch_idx", B, 0, kc.shape[0] - 1,
                               "the caches' batch entries")
    if q.shape[0] != B or q.shape[3] != E:
        raise ValueError(f"query has shape {q.shape} and k_cache {kc.shape}: B and E must match")
    Hq, T = q.shape[1], q.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"the query heads ({Hq}) must be a multiple of the cache heads "
                         f"(k_cache shape {kc.shape})")
    is_causal = a["is_causal"]
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool here (bottom-right causal on cache positions), "
                        f"got {is_causal!r}")
    rope = None
    kn = vn = None
    if new:
        kn, vn = as_array(key, "key"), as_array(value, "value")
        Tk = kn.shape[2] if kn.ndim == 4 else T
        for x, nm, last in ((kn, "key", E), (vn, "value", Ev)):
            check_numeric(x, nm)
            if x.shape != (B, Hkv, Tk, last):
                raise ValueError(f"{nm} has shape {x.shape}; expected {(B, Hkv, Tk, last)} "
                                 "(B, cache heads, the new rows Tk, head dim; key and value alike)")
        n = _seqlens(a["cache_seqlens"], B, S_max - Tk, Tk)
        if a["rotary_cos"] is not None or a["rotary_sin"] is not None:    # queries rotated in C (a scratch)
            q, rope = _kvextra.rotary(q, kn, n, a["rotary_cos"], a["rotary_sin"], a["rotary_interleaved"],
                                      bool(is_causal) or a["window"] is not None, cd)
        kv_len = n + Tk
    else:
        if a["rotary_cos"] is not None or a["rotary_sin"] is not None:
            _kvextra.tables(a["rotary_cos"], a["rotary_sin"], None, E, None, "", cd)     # raises: no new keys
        n = kv_len = _seqlens(a["cache_seqlens"], B, S_max, 0)
    pad = None if a["cache_leftpad"] is None else \
        _kvextra.indices(a["cache_leftpad"], "cache_leftpad", B, 0, n, "at most cache_seqlens")
    sc = _scale_value(a["scale"], E)
    # a 16-bit query is read in place (bfloat16 as such: _sdpa views its bits);
    # anything else is converted to the caches' compute dtype
    qd = q if is16(q.dtype) and cd == np.float32 else to_dtype(q, cd)
    q8 = int8_precision(a["precision"], kc)     # precision="int8": an int8 / int4 k_cache
    return CacheSpec(qd, kc, vc, k_scale, v_scale, cd, B, Hq, Hkv,
                     S_max, E, Ev, T, kn, vn, n, kv_len, rope, sc, a, int8=q8, leftpad=pad, batch_idx=idx)


# ---- paged, packed and tree calls (API.md, "Paged and mixed-length KV caches") -----------------

def _int_array(x, name, ndim):
    a = as_array(x, name)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} has entries past the int64 range")
    return a.astype(np.int64)


def _cu_seqlens(cu, B, total):
    """cu_seqlens_q as (B + 1,) int64: 0 first, non-decreasing, total last
    (total None: any last entry, for PagedKVCache.plan)."""
    a = _int_array(cu, "cu_seqlens_q", 1)
    if a.shape != (B + 1,):
        raise ValueError(f"cu_seqlens_q has shape {a.shape}; expected ({B + 1},): one offset per "
                         "sequence (the caches' batch or the block table's rows) plus the end")
    if a[0] != 0:
        raise ValueError(f"cu_seqlens_q must start at 0, got {int(a[0])} at position 0")
    down = np.nonzero(np.diff(a) < 0)[0]
    if down.size:
        i = int(down[0]) + 1
        raise ValueError(f"cu_seqlens_q must be non-decreasing: position {i} is {int(a[i])} after "
                         f"{int(a[i - 1])}")
    if total is not None and a[-1] != total:
        raise ValueError(f"cu_seqlens_q ends at {int(a[-1])} (position {B}), but query has {total} "
                         "rows (axis 0): they must match")
    return a


def _check_table(table, kv_len, bs, nblk):
    """Every entry a sequence needs (rows [0, kv_len)) in [0, nblk)."""
    need = -(-kv_len // bs)
    used = np.arange(table.shape[1])[None, :] < need[:, None]
    bad = used & ((table < 0) | (table >= nblk))
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(f"block_table[{b}, {i}] is {int(table[b, i])}: sequence {b} reads or writes "
                         f"rows [0, {int(kv_len[b])}), i.e. blocks 0..{int(need[b]) - 1} of its row, "
                         f"which must be in [0, {nblk}) (num_blocks); nothing was written")


def _written_rows(table, n, Ts, cu, bs):
    """(block, row) of every row the call writes, in (sequence, token)
    order, checked for two writes of one physical row."""
    seq = np.repeat(np.arange(len(Ts)), Ts)
    r = n[seq] + (np.arange(seq.size) - cu[seq])
    blk, row = table[seq, r // bs], r % bs
    phys = blk * bs + row
    uniq, first, counts = np.unique(phys, return_index=True, return_counts=True)
    if (counts > 1).any():
        p = uniq[counts > 1][0]
        who = sorted(set(seq[phys == p].tolist()))
        raise ValueError(f"block_table: sequences {who} would all write row {int(p % bs)} of block "
                         f"{int(p // bs)} in this call (a block shared between sequences: fork it "
                         "first); nothing was written")
    return blk, row


def _tree(tree_mask, B, Hq, T):
    not_flag_mask(tree_mask, "tree_mask")
    m = as_array(tree_mask, "tree_mask")
    if m.dtype.kind != "b":
        raise TypeError(f"tree_mask must be bool (True = may attend), got dtype {m.dtype}")
    if m.ndim != 4 or m.shape[0] not in (1, B) or m.shape[1] not in (1, Hq) or m.shape[2:] != (T, T):
        raise ValueError(f"tree_mask has shape {m.shape}; expected (B or 1, Hq or 1, T, T) = "
                         f"({B} or 1, {Hq} or 1, {T}, {T}) (T: the most new tokens of a sequence)")
    return m


def _scales(c, sc, cname, sname, new):
    """A quantized pool's scale pool (float32, the pool's first three axes,
    groups dividing the head dim; writeable with new rows); None for a
    float pool. Returns (scales or None, values per row)."""
    per = _qcache(c)
    if not per:
        if sc is not None:
            raise ValueError(f"{sname} is given but {cname} is {c.dtype}, not an int8 / int4 / fp8 cache")
        return None, c.shape[3]
    if sc is None:
        raise ValueError(f"{cname} is an {_qname(c)} cache: {sname} (its float32 "
                         "scales, (num_blocks, Hkv, block_size, E / group) with block_table) is required")
    if not (isinstance(sc, np.ndarray) and sc.dtype == np.float32):
        raise TypeError(f"{sname} must be a float32 numpy.ndarray, got {getattr(sc, 'dtype', type(sc).__name__)}")
    D = c.shape[3] * per
    if sc.ndim != 4 or sc.shape[:3] != c.shape[:3] or sc.shape[3] < 1 or D % sc.shape[3]:
        raise ValueError(f"{sname} has shape {sc.shape}; expected {c.shape[:3]} + (groups,) as {cname}, "
                         f"groups dividing its head dim {D}")
    if new and not sc.flags.writeable:
        raise ValueError(f"{sname} is read-only, but key/value were given to be quantized into it")
    return sc, D


def _paged_spec(query, k_cache, v_cache, key, value, a):
    """cache_spec with block_table, cu_seqlens_q or tree_mask."""
    new = key is not None
    kc = _cache_array(k_cache, "k_cache", new)
    vc = _cache_array(v_cache, "v_cache", new)
    ks, E = _scales(kc, a["k_scale"], "k_cache", "k_scale", new)
    vs, Ev = _scales(vc, a["v_scale"], "v_cache", "v_scale", new)
    quant = ks is not None or vs is not None
    cd = np.dtype(np.float32) if is16(kc.dtype) or ks is not None else kc.dtype
    if (np.dtype(np.float32) if is16(vc.dtype) or vs is not None else vc.dtype) != cd:
        raise TypeError(f"k_cache ({kc.dtype}) and v_cache ({vc.dtype}) must compute in one dtype")
    if vc.shape[:3] != kc.shape[:3]:
        raise ValueError(f"v_cache has shape {vc.shape} and k_cache {kc.shape}: their first three "
                         "axes must match")
    paged = a["block_table"] is not None
    if paged:                                   # pools (num_blocks, Hkv, block_size, E)
        nblk, Hkv, bs = kc.shape[:3]
        if bs == 0:
            raise ValueError(f"k_cache has shape {kc.shape}: block_size (axis 2) must be >= 1")
        table = _int_array(a["block_table"], "block_table", 2)
        B = table.shape[0]
        S = table.shape[1] * bs
    else:                                       # one block of S_max rows per sequence
        B, Hkv, S = kc.shape[:3]
        nblk, bs = B, max(S, 1)
        table = np.arange(B, dtype=np.int64)[:, None]
    q = as_array(query, "query")
    check_numeric(q, "query")
    packed = a["cu_seqlens_q"] is not None
    if packed:
        if q.ndim != 3 or q.shape[2] != E:
            raise ValueError(f"query must be (total_q, Hq, E) with cu_seqlens_q, E = {E} as the caches; "
                             f"got shape {q.shape}")
        cu = _cu_seqlens(a["cu_seqlens_q"], B, q.shape[0])
        Ts = np.diff(cu)
        Hq = q.shape[1]
    else:
        if q.ndim != 4 or q.shape[0] != B or q.shape[3] != E:
            raise ValueError(f"query must be (B, Hq, T, E) = ({B}, Hq, T, {E}) (B: "
                             f"{'the block table rows' if paged else 'the caches batch'}); got {q.shape}")
        Hq = q.shape[1]
        Ts = np.full(B, q.shape[2], np.int64)
        cu = np.arange(B + 1, dtype=np.int64) * q.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"the query heads ({Hq}) must be a multiple of the cache heads "
                         f"(k_cache shape {kc.shape})")
    is_causal, window = a["is_causal"], a["window"]
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool here, got {is_causal!r}")
    T = q.shape[2] if not packed else int(Ts.max()) if B else 0     # (B, Hq, T, E): T even when B = 0
    Tn, cun = Ts, cu                            # the new rows per sequence, their offsets
    kn = vn = None
    if new:
        kn, vn = as_array(key, "key"), as_array(value, "value")
        Tk = kn.shape[2] if kn.ndim == 4 and not packed else T      # any Tk (not packed)
        for x, nm, last in ((kn, "key", E), (vn, "value", Ev)):
            check_numeric(x, nm)
            want = (q.shape[0], Hkv, last) if packed else (B, Hkv, Tk, last)
            if x.shape != want:
                raise ValueError(f"{nm} has shape {x.shape}; expected {want} (as query, with the "
                                 "cache heads and head dim; key and value alike)")
            if (ks if nm == "key" else vs) is not None and not np.isfinite(x).all():
                raise ValueError(f"{nm} holds NaN or infinity: the {'k' if nm == 'key' else 'v'}_cache's "
                                 "scales cannot hold it (it is quantized as it is written); nothing was written")
        if not packed and Tk != T:
            if a["tree_mask"] is not None:
                raise ValueError(f"tree_mask needs as many new keys as queries (key has {Tk} rows, "
                                 f"query {T})")
            Tn, cun = np.full(B, Tk, np.int64), np.arange(B + 1, dtype=np.int64) * Tk
    n = _seqlens(a["cache_seqlens"], B, S, 0)
    if new and (n > S - Tn).any():
        b = int(np.argmax(n > S - Tn))
        raise ValueError(f"the cache is too short: sequence {b} holds {int(n[b])} rows and brings "
                         f"{int(Tn[b])} new, past its {S} rows (cache_seqlens + new tokens > "
                         f"{'block_table columns x block_size' if paged else 'S_max'}); nothing was written")
    kv_len = n + Tn if new else n
    _check_table(table, kv_len, bs, nblk)
    written = _written_rows(table, n, Tn, cun, bs) if new else None
    tm = None if a["tree_mask"] is None else _tree(a["tree_mask"], B, Hq, T)
    rope = None
    if a["rotary_cos"] is not None or a["rotary_sin"] is not None:    # as the contiguous path
        q_steps = bool(is_causal) or window is not None
        q, rope = _kvextra.rotary(q, kn, n, a["rotary_cos"], a["rotary_sin"], bool(a["rotary_interleaved"]),
                                  q_steps, cd, cu=cu if packed else None)
    sc = _scale_value(a["scale"], E)
    shape = (q.shape[0], Hq, Ev) if packed else (B, Hq, T, Ev)
    narrow = tuple(d for d in (q.dtype, kc.dtype, vc.dtype) if is16(d))
    if a["out"] is not None:
        check_out(a["out"], shape, cd, narrow)
    slopes = a["alibi_slopes"]
    if slopes is not None:
        slopes = as_array(slopes, "alibi_slopes")
        if slopes.ndim == 2 and slopes.shape != (B, Hq):
            raise ValueError(f"alibi_slopes has shape {slopes.shape}; expected (Hq,) or (B, Hq) = "
                             f"({Hq},) or ({B}, {Hq})")
    q8 = int8_precision(a["precision"], kc)     # precision="int8": an int8 / int4 k_cache
    qd = q if is16(q.dtype) and cd == np.float32 else to_dtype(q, cd)
    return CacheSpec(qd, kc, vc, ks, vs, cd, B, Hq, Hkv, S, E, Ev, T, kn, vn, n, kv_len, rope, sc, a,
                     table=table, paged=paged, bs=bs, cu=cu, packed=packed, Ts=Ts, written=written, tree=tm,
                     slopes=slopes, int8=q8)

