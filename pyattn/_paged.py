"""Paged and packed KV caches (API.md, "Paged and mixed-length KV caches"):
``attention_with_kvcache(block_table=, cu_seqlens_q=, tree_mask=)`` and
:class:`pyattn.PagedKVCache`.

The C side reads the pools through the block table in place (csrc/ops/
paged.h, csrc/bind_paged.c): no gathered copy of a cache exists. A call
whose sequences bring different numbers of new tokens runs one kernel call
in ONE kernel call (csrc/ops/paged_packed.c: tasks over (sequence, head,
query block), each sequence with its own kv length and block-table row,
bit-identical to calling it alone); the new rows are written by the call's
before-hook once every check has passed and everything is allocated, so a
call that raises writes nothing. Only with a tree_mask do sequences with
different token counts still run one kernel call per distinct count; there
every check is made before the first call, and should a later one fail
(MemoryError, KeyboardInterrupt) the rows the earlier ones wrote are put
back.
"""
from __future__ import annotations

import math

import numpy as np

from ._api import _cache_array, _qcache, _sdpa, _seqlens
from . import _C
from ._checks import (as_array, not_flag_mask, bcast, cache_dtype, check_numeric, check_out, is16, number, per_head,
                      int8_precision, precision_value, real_scalar, split_axis, standin, store16, to_dtype)
from ._spec import attn_spec

__all__ = ["PagedKVCache", "CacheFullError"]


class CacheFullError(MemoryError):
    """A :class:`PagedKVCache` has too few free blocks for a call, or a
    :class:`KVCache` too few rows left (``lengths + T > max_len``); raised
    before anything is written (the cache is unchanged). A ``MemoryError``.

    Raised by :meth:`KVCache.attend` and :meth:`PagedKVCache.attend` (and the
    :mod:`pyattn.nn` layers' calls with a cache); its message says what the
    call needs and what the cache has left.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> cache = pyattn.KVCache(batch=1, num_kv_heads=1, max_len=2, head_dim=4)
    >>> x = np.zeros((1, 1, 3, 4), np.float32)          # 3 new rows, room for 2
    >>> try:
    ...     cache.attend(x, x, x)
    ... except pyattn.CacheFullError as e:
    ...     print(isinstance(e, MemoryError), cache.lengths)
    True [0]
    """


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
    """cu_seqlens_q as (B + 1,) int64: 0 first, non-decreasing, total last."""
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
    if a[-1] != total:
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


def _tree_mask(tm, idx, T, base, S):
    """The group's (len, Hq or 1, T, S) bool mask: cached keys before the new
    tokens visible, the tree among them, nothing after."""
    m = np.zeros((len(idx), tm.shape[1], T, S), np.bool_)
    for i, b in enumerate(idx):
        lo = int(base[b])
        t = tm[b if tm.shape[0] > 1 else 0, :, :T, :T]
        m[i, :, :, :max(lo, 0)] = True
        c0 = max(lo, 0)
        m[i, :, :, c0:lo + T] = t[:, :, c0 - lo:]
    return m


def _scales(c, sc, cname, sname, new):
    """A quantized pool's scale pool (float32, the pool's first three axes,
    groups dividing the head dim; writeable with new rows); None for a
    float pool. Returns (scales or None, values per row)."""
    per = _qcache(c)
    if not per:
        if sc is not None:
            raise ValueError(f"{sname} is given but {cname} is {c.dtype}, not an int8 / int4 cache")
        return None, c.shape[3]
    if sc is None:
        raise ValueError(f"{cname} is an {'int8' if per == 1 else 'int4'} cache: {sname} (its float32 "
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


def kvcache_paged(query, k_cache, v_cache, key, value, cache_seqlens, block_table, cu_seqlens_q,
                  tree_mask, *, is_causal, scale, window, alibi_slopes, softcap, sinks, return_lse,
                  out, precision, k_scale=None, v_scale=None, rotary=(None, None, False)):
    """attention_with_kvcache with block_table, cu_seqlens_q or tree_mask (its docstring)."""
    new = key is not None
    kc = _cache_array(k_cache, "k_cache", new)
    vc = _cache_array(v_cache, "v_cache", new)
    ks, E = _scales(kc, k_scale, "k_cache", "k_scale", new)
    vs, Ev = _scales(vc, v_scale, "v_cache", "v_scale", new)
    quant = ks is not None or vs is not None
    cd = np.dtype(np.float32) if is16(kc.dtype) or ks is not None else kc.dtype
    if (np.dtype(np.float32) if is16(vc.dtype) or vs is not None else vc.dtype) != cd:
        raise TypeError(f"k_cache ({kc.dtype}) and v_cache ({vc.dtype}) must compute in one dtype")
    if vc.shape[:3] != kc.shape[:3]:
        raise ValueError(f"v_cache has shape {vc.shape} and k_cache {kc.shape}: their first three "
                         "axes must match")
    paged = block_table is not None
    if paged:                                   # pools (num_blocks, Hkv, block_size, E)
        nblk, Hkv, bs = kc.shape[:3]
        if bs == 0:
            raise ValueError(f"k_cache has shape {kc.shape}: block_size (axis 2) must be >= 1")
        table = _int_array(block_table, "block_table", 2)
        B = table.shape[0]
        S = table.shape[1] * bs
    else:                                       # one block of S_max rows per sequence
        B, Hkv, S = kc.shape[:3]
        nblk, bs = B, max(S, 1)
        table = np.arange(B, dtype=np.int64)[:, None]
    q = as_array(query, "query")
    check_numeric(q, "query")
    packed = cu_seqlens_q is not None
    if packed:
        if q.ndim != 3 or q.shape[2] != E:
            raise ValueError(f"query must be (total_q, Hq, E) with cu_seqlens_q, E = {E} as the caches; "
                             f"got shape {q.shape}")
        cu = _cu_seqlens(cu_seqlens_q, B, q.shape[0])
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
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool here, got {is_causal!r}")
    T = q.shape[2] if not packed else int(Ts.max()) if B else 0     # (B, Hq, T, E): T even when B = 0
    Tn, cun = Ts, cu                            # the new rows per sequence, their offsets
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
            if tree_mask is not None:
                raise ValueError(f"tree_mask needs as many new keys as queries (key has {Tk} rows, "
                                 f"query {T})")
            Tn, cun = np.full(B, Tk, np.int64), np.arange(B + 1, dtype=np.int64) * Tk
    n = _seqlens(cache_seqlens, B, S, 0)
    if new and (n > S - Tn).any():
        b = int(np.argmax(n > S - Tn))
        raise ValueError(f"the cache is too short: sequence {b} holds {int(n[b])} rows and brings "
                         f"{int(Tn[b])} new, past its {S} rows (cache_seqlens + new tokens > "
                         f"{'block_table columns x block_size' if paged else 'S_max'}); nothing was written")
    kv_len = n + Tn if new else n
    _check_table(table, kv_len, bs, nblk)
    written = _written_rows(table, n, Tn, cun, bs) if new else None
    tm = None if tree_mask is None else _tree(tree_mask, B, Hq, T)
    rope = None
    if rotary[0] is not None or rotary[1] is not None:    # as the contiguous path (_kvextra)
        from . import _kvextra
        q_steps = bool(is_causal) or window is not None
        q, rope = _kvextra.rotary(q, kn if new else None, n, rotary[0], rotary[1], bool(rotary[2]),
                                  q_steps, cd, cu=cu if packed else None)
    sc = (1.0 / math.sqrt(E) if E > 0 else 1.0) if scale is None else real_scalar(scale, "scale")
    shape = (q.shape[0], Hq, Ev) if packed else (B, Hq, T, Ev)
    narrow = tuple(d for d in (q.dtype, kc.dtype, vc.dtype) if is16(d))
    if out is not None:
        check_out(out, shape, cd, narrow)
    slopes = alibi_slopes
    if slopes is not None:
        slopes = as_array(slopes, "alibi_slopes")
        if slopes.ndim == 2 and slopes.shape != (B, Hq):
            raise ValueError(f"alibi_slopes has shape {slopes.shape}; expected (Hq,) or (B, Hq) = "
                             f"({Hq},) or ({B}, {Hq})")
    q8 = int8_precision(precision, kc)          # precision="int8": an int8 / int4 k_cache
    if quant and not q8 and precision_value(precision, cd):
        raise ValueError("precision='bf16' is not available with int8 / int4 caches")
    qd = q if is16(q.dtype) and cd == np.float32 else to_dtype(q, cd)
    u16 = [c.view(np.uint16) if c.dtype.kind == "V" else c for c in (kc, vc)]
    if packed and tm is None and not quant and B > 0 and (sinks is None or np.ndim(sinks) <= 1):
        res, lse = _packed(qd, kc, vc, u16, table, kn if new else None, vn if new else None, n, kv_len, cu,
                           S, Hkv, E, Ev, is_causal, sc, window, slopes, softcap, sinks, precision,
                           return_lse, rope=rope)
        if out is not None:
            out[...] = res
            res = out
        return (res, lse) if return_lse else res
    groups = {}
    for b in range(B):
        if Ts[b] or not packed:
            groups.setdefault(int(Ts[b]), []).append(b)
    whole = not packed and len(groups) == 1
    res = None if whole else np.empty(shape, cd)
    lse = None if whole or not return_lse else np.empty(shape[:-1], cd)
    saved = None
    if new and len(groups) > 1:                 # the rows, to put back if a later group fails
        saved = [(c, c[written[0], :, written[1], :].copy()) for c in (kc, vc, ks, vs) if c is not None]
    try:
        for Tg, idx in groups.items():
            r = _group(qd, kc, vc, u16, table, kn if new else None, vn if new else None, idx, Tg, n,
                       kv_len, cu, packed, whole, tm, S, Hkv, E, Ev, cd, is_causal, sc, window,
                       slopes, softcap, sinks, precision, return_lse, ks, vs, rope=rope)
            if whole:
                res, lse = r if return_lse else (r, None)
                break
            o, lg = r if return_lse else (r, None)
            for i, b in enumerate(idx):
                if packed:
                    res[cu[b]:cu[b + 1]] = o[i].transpose(1, 0, 2)
                    if lse is not None:
                        lse[cu[b]:cu[b + 1]] = lg[i].T
                else:
                    res[b] = o[i]
                    if lse is not None:
                        lse[b] = lg[i]
    except BaseException:
        if saved is not None:
            for c, old in saved:
                c[written[0], :, written[1], :] = old
        raise
    if res is None:                             # no sequence (B = 0)
        res = np.empty(shape, cd)
        lse = np.empty(shape[:-1], cd) if return_lse else None
    if out is not None:
        out[...] = res
        res = out
    return (res, lse) if return_lse else res


def _packed(qd, kc, vc, u16, table, kn, vn, n, kv_len, cu, S, Hkv, E, Ev, is_causal, sc, window,
            slopes, softcap, sinks, precision, return_lse, rope=None):
    """One kernel call for every sequence (csrc/ops/paged_packed.c): query
    (total, Hq, E) viewed head-major (Hq, total, E), or (Hkv, G, total, E)
    with GQA; decode steps (one token) have their G query heads stacked as
    rows, as the dense call of a decode step (_api._sdpa)."""
    total, Hq = qd.shape[0], qd.shape[1]
    B = len(kv_len)
    views = [standin((Hkv, S, D), c.dtype) for c, D in ((kc, E), (vc, Ev))]    # the call's k, v: shape
    # only (C reads the pools)
    spec = attn_spec(qd.transpose(1, 0, 2), views[0], views[1], None, 0.0,
                     "bottom_right" if is_causal else False, sc, Hq != Hkv, window=window, softcap=softcap,
                     sinks=sinks, precision=precision, return_lse=return_lse)
    dt, G, hkv = spec.dtype, spec.groups, spec.hkv
    q = store16(spec.query, dt)
    k, v = (store16(x, dt) for x in (spec.key, spec.value))
    buf = np.empty((total, Hq, Ev), dt)
    o = buf.transpose(1, 0, 2)
    if G > 1:
        q, o = split_axis(q, -3, hkv, G), split_axis(o, -3, hkv, G)
        k, v = (bcast(x[:, None], (hkv, G, S, x.shape[-1])) for x in (k, v))
    kw = spec.c_kwargs()
    kw["cu_seqlens_q"] = cu
    kw["kv_len"] = np.repeat(np.asarray(kv_len, np.int64), Hq)
    if slopes is not None:
        kw["slopes"] = per_head(slopes, "alibi_slopes", (B, Hq), "(Hq,) or (B, Hq)").reshape(-1)
    if G > 1 and slopes is None and sinks is None and G <= 48:
        kw["row_div"] = G                       # decode steps: the G query heads as rows
    if spec.bf16:
        kw["bf16"] = True
    if return_lse:
        kw["want_lse"] = True
    if kn is not None:                          # rotary: keys in cd, rotated as they are written
        rk, rv = [x.astype(rope[0].dtype if rope and i == 0 else c.dtype, order="C", copy=True)
                  for i, (x, c) in enumerate(((kn, kc), (vn, vc)))]
        rk, rv = [x.view(np.uint16) if x.dtype.kind == "V" else x for x in (rk, rv)]
        kw["append"] = (rk, rv, np.ascontiguousarray(n, np.int64)) + ((rope,) if rope else ())
    kw["paged"] = (u16[0], u16[1], np.ascontiguousarray(table))
    _, _, lse = _C.sdpa(q, k, v, o, **kw)
    return buf, (None if lse is None else np.ascontiguousarray(lse.reshape(Hq, total).T))


def _group(qd, kc, vc, u16, table, kn, vn, idx, Tg, n, kv_len, cu, packed, whole, tm, S, Hkv, E, Ev,
           cd, is_causal, sc, window, slopes, softcap, sinks, precision, return_lse, ks=None, vs=None,
           rope=None):
    """One kernel call: the sequences idx, each with Tg new tokens."""
    ix = np.asarray(idx, np.int64)
    if packed:
        rows = cu[ix][:, None] + np.arange(Tg)[None, :]
        qg = qd[rows].transpose(0, 2, 1, 3)
    else:
        qg = qd if whole else qd[ix]
    def stand_in(c, D):                         # the call's k, v: shape only (C reads the pools)
        return standin((len(idx), Hkv, S, D), c.dtype)
    views = [stand_in(kc, kc.shape[3]), stand_in(vc, vc.shape[3])]
    quant = ks is not None or vs is not None
    svs = [None if x is None else stand_in(x, x.shape[3]) for x in (ks, vs)]
    append = None
    if kn is not None:
        rk, rv = [(x[rows].transpose(0, 2, 1, 3) if packed else (x if whole else x[ix])) for x in (kn, vn)]
        rk, rv = [x.astype(np.float32 if s is not None else cd if rope and i == 0 else c.dtype, order="C",
                           copy=True) for i, (x, c, s) in enumerate(((rk, kc, ks), (rv, vc, vs)))]
        rk, rv = [x.view(np.uint16) if x.dtype.kind == "V" else x for x in (rk, rv)]
        append = (rk, rv, np.ascontiguousarray(n[ix])) + ((rope,) if rope else ())
    mask = None
    if tm is not None:
        base = n if kn is not None else n - Tg
        mask = _tree_mask(tm, idx, Tg, base, S)
    sl = slopes
    if sl is not None and sl.ndim == 2:
        sl = sl[ix]
    # a quantized pool: float32 stand-ins of its values for the spec's checks,
    # then the spec carries the pools' stand-ins and their scales'
    kspec = np.broadcast_to(np.float32(0), views[0].shape[:3] + (E,)) if ks is not None else views[0]
    vspec = np.broadcast_to(np.float32(0), views[1].shape[:3] + (Ev,)) if vs is not None else views[1]
    q8 = int8_precision(precision, kc)
    spec = attn_spec(qg, kspec, vspec, mask, 0.0, "bottom_right" if is_causal else False, sc,
                     qg.shape[1] != Hkv, window=window, alibi_slopes=sl, softcap=softcap, sinks=sinks,
                     precision=None if q8 else precision, return_lse=return_lse, kv_len=kv_len[ix][:, None])
    paged = (u16[0], u16[1], np.ascontiguousarray(table[ix]))
    if quant:
        spec = spec._replace(key=views[0], value=views[1], kv_scales=tuple(svs), int8=q8)
        paged += (ks, vs)
    return _sdpa(spec, None, append=append, paged=paged)


class PagedKVCache:
    """Key/value caches of many sequences in one pool of fixed-size blocks
    (vLLM's paged attention, on NumPy arrays).

    ``k (num_blocks, Hkv, block_size, E)`` and ``v (num_blocks, Hkv,
    block_size, Ev)`` are allocated once (zeros): pyattn's head-major block
    layout, read in place by :func:`pyattn.attention_with_kvcache` through a
    block table. A sequence of length n holds ``ceil(n / block_size)`` blocks
    from a free list; :meth:`fork` makes a sequence that shares its parent's
    blocks (nothing is copied) and the first write into a shared block
    copies that block first (copy-on-write, by reference counts), so the
    parent's rows never change.

    Parameters
    ----------
    num_blocks, block_size, num_kv_heads, head_dim : int
    value_dim : int, optional (default ``head_dim``)
    dtype : float32 (default), float64, float16, ``ml_dtypes.bfloat16``, ``"int8"`` or ``"int4"``
        ``"int8"`` / ``"int4"``: quantized pools (``k`` is ``np.int8
        (num_blocks, Hkv, block_size, E)`` or ``np.uint8 (..., E / 2)``, two
        values per byte) with float32 scale pools ``k_scale (num_blocks, Hkv,
        block_size, E / group_size)`` (``v``, ``v_scale`` likewise): new rows
        are quantized into their pages as they are written
        (:func:`pyattn.quantize`'s rule), the kernels read rows and scales
        per block in place; a copied-on-write block takes its scales along.
    group_size : int, default 32
        Values per scale of an int8 / int4 pool (it must divide head_dim and
        value_dim); unused by the float dtypes.

    Attributes
    ----------
    k, v : ndarray, the pools
    k_scale, v_scale : ndarray float32 (their scale pools), or None for a float cache

    Raises
    ------
    ValueError
        A negative size, ``block_size`` or ``num_kv_heads`` below 1; a
        ``group_size`` that does not divide the head dims (int4: odd head dims).
    TypeError
        A dtype other than the six above, sizes that are not integers.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> cache = pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=2, head_dim=8)
    >>> a = cache.add_sequence()
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 1, 2, 5, 8)).astype(np.float32)
    >>> cache.attend([a], q, k, v).shape            # a prompt of 5 tokens
    (1, 2, 5, 8)
    >>> b = cache.fork(a)                            # shares a's 2 blocks
    >>> cache.length(b), cache.blocks_free
    (5, 6)
    """

    def __init__(self, num_blocks, block_size, num_kv_heads, head_dim, value_dim=None,
                 dtype=np.float32, group_size=32):
        names = ("num_blocks", "block_size", "num_kv_heads", "head_dim", "value_dim")
        dims = []
        for x, name in zip((num_blocks, block_size, num_kv_heads, head_dim,
                            head_dim if value_dim is None else value_dim), names):
            x = number(x, name, integer=True)
            low = 1 if name in ("block_size", "num_kv_heads") else 0
            if x < low:
                raise ValueError(f"{name} must be >= {low}, got {x}")
            dims.append(x)
        gs = number(group_size, "group_size", integer=True)
        if gs < 1:
            raise ValueError(f"group_size must be >= 1, got {gs}")
        dt, quant = cache_dtype(dtype)
        N, bs, H, E, Ev = dims
        if quant and (E % gs or Ev % gs or (quant == "int4" and (E % 2 or Ev % 2))):
            raise ValueError(f"group_size {gs} must divide head_dim {E} and value_dim {Ev}"
                             + (" (which must be even for int4)" if quant == "int4" else ""))
        limit = np.iinfo(np.intp).max
        for D, what in ((E, "head_dim"), (Ev, "value_dim")):
            if N * H * bs * D * max(dt.itemsize, 4 if quant else 1) > limit:
                raise ValueError(f"PagedKVCache(num_blocks={N}, block_size={bs}, num_kv_heads={H}, "
                                 f"{what}={D}) would need more than {limit} bytes")
        per = 2 if quant == "int4" else 1             # values per stored element
        self.k = np.zeros((N, H, bs, E // per), dt)
        self.v = np.zeros((N, H, bs, Ev // per), dt)
        self.k_scale = np.zeros((N, H, bs, E // gs), np.float32) if quant else None
        self.v_scale = np.zeros((N, H, bs, Ev // gs), np.float32) if quant else None
        self.group_size = gs
        self._quant = quant
        self._free = list(range(N - 1, -1, -1))   # pop() hands out the lowest block first
        self._refs = np.zeros(N, np.int64)
        self._seqs = {}                            # id -> [blocks (list), length]
        self._next = 0

    @property
    def block_size(self) -> int:
        """Rows per block."""
        return self.k.shape[2]

    @property
    def blocks_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    def add_sequence(self) -> int:
        """A new, empty sequence (no block yet); returns its id.

        Ids count up from 0 and are never reused (not even after
        :meth:`free`).

        Returns
        -------
        int
            The new sequence's id, to pass to :meth:`attend`, :meth:`fork`,
            :meth:`free` and :meth:`length`.

        Examples
        --------
        >>> import pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a, b = cache.add_sequence(), cache.add_sequence()
        >>> a, b, cache.length(b), cache.blocks_free
        (0, 1, 0, 4)
        """
        sid = self._next
        self._next += 1
        self._seqs[sid] = [[], 0]
        return sid

    def _get(self, seq, name="seq"):
        s = number(seq, name, integer=True)
        if s not in self._seqs:
            raise ValueError(f"{name} {s} is not a live sequence of this cache (ids: "
                             f"{sorted(self._seqs)})")
        return s

    def fork(self, seq) -> int:
        """A new sequence sharing ``seq``'s blocks and length (nothing copied;
        a shared block is copied on its first write, by either sequence; when
        every sequence holding it writes it in one :meth:`attend`, all but
        the last of them copy it and the last writes it in place).

        Parameters
        ----------
        seq : int
            The id of a live sequence of this cache (the parent).

        Returns
        -------
        int
            The new sequence's id.

        Raises
        ------
        ValueError
            ``seq`` is not a live sequence of this cache.
        TypeError
            ``seq`` is not an integer.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a = cache.add_sequence()
        >>> x = np.ones((1, 1, 3, 4), np.float32)
        >>> _ = cache.attend([a], x, x, x)                  # 3 rows: 2 blocks
        >>> b = cache.fork(a)                               # shares them
        >>> cache.length(b), cache.blocks_free
        (3, 2)
        >>> y = np.ones((1, 1, 1, 4), np.float32)
        >>> _ = cache.attend([b], y, y, y)                  # b copies the shared last block
        >>> cache.length(a), cache.length(b), cache.blocks_free
        (3, 4, 1)
        """
        blocks, length = self._seqs[self._get(seq)]
        sid = self.add_sequence()
        self._seqs[sid] = [list(blocks), length]
        self._refs[blocks] += 1
        return sid

    def free(self, seq) -> None:
        """Forget ``seq``: its blocks go back to the free list once no other
        sequence shares them.

        Parameters
        ----------
        seq : int
            The id of a live sequence of this cache; it is not live
            afterwards (ids are not reused).

        Raises
        ------
        ValueError
            ``seq`` is not a live sequence of this cache (for instance,
            freed already).
        TypeError
            ``seq`` is not an integer.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a = cache.add_sequence()
        >>> x = np.ones((1, 1, 3, 4), np.float32)
        >>> _ = cache.attend([a], x, x, x)
        >>> b = cache.fork(a)
        >>> cache.free(a); cache.blocks_free                # b still holds the blocks
        2
        >>> cache.free(b); cache.blocks_free
        4
        """
        blocks, _ = self._seqs.pop(self._get(seq))
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)

    def length(self, seq) -> int:
        """Rows filled in ``seq``.

        Parameters
        ----------
        seq : int
            The id of a live sequence of this cache.

        Returns
        -------
        int
            The rows written into ``seq`` so far (a fork starts with its
            parent's).

        Raises
        ------
        ValueError
            ``seq`` is not a live sequence of this cache.
        TypeError
            ``seq`` is not an integer.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a = cache.add_sequence()
        >>> x = np.ones((1, 1, 3, 4), np.float32)
        >>> _ = cache.attend([a], x, x, x)
        >>> cache.length(a)
        3
        """
        return self._seqs[self._get(seq)][1]

    def _plan(self, ids, Ts):
        """Block lists after writing Ts[i] rows to sequence ids[i]: new blocks
        from the free list and copy-on-write copies of shared blocks. Returns
        (lists, taken, copies); nothing changes here.

        A shared block that every sequence holding it writes in this call is
        copied for all of them but the last, which writes it in place (else
        the block would be left with no holder and off the free list)."""
        bs = self.block_size
        left = {}                                    # holders of a shared block not yet moved off it
        need = 0
        for s, t in zip(ids, Ts):
            blocks, n = self._seqs[s]
            if t:
                need += -(-(n + t) // bs) - len(blocks)
                for b in blocks[n // bs:]:           # blocks written: n // bs .. end
                    left.setdefault(b, int(self._refs[b]))
                    if left[b] > 1:
                        need += 1
                        left[b] -= 1
        if need > len(self._free):
            raise CacheFullError(f"PagedKVCache: the call needs {need} free blocks, {len(self._free)} "
                                 f"are free (of {self.k.shape[0]}); nothing was written")
        free = self._free[len(self._free) - need:] if need else []    # popped from the end, as they
        left = {}                                                       # are taken
        lists, copies = [], []
        for s, t in zip(ids, Ts):
            blocks, n = self._seqs[s]
            blocks = list(blocks)
            if t:
                for j in range(n // bs, len(blocks)):
                    left.setdefault(blocks[j], int(self._refs[blocks[j]]))
                    if left[blocks[j]] > 1:          # shared: copied before the write
                        left[blocks[j]] -= 1
                        nb = free.pop()
                        copies.append((blocks[j], nb))
                        blocks[j] = nb
                while len(blocks) * bs < n + t:
                    blocks.append(free.pop())
            lists.append(blocks)
        return lists, self._free[:len(self._free) - need] + free, copies

    def attend(self, seqs, query, key, value, *, cu_seqlens_q=None, **kw):
        """Write ``key``/``value`` after each sequence's rows, attend, advance the lengths.

        Any error leaves the cache's sequences as they were (blocks it took
        go back to the free list) and its pools bit for bit (the blocks a
        copy-on-write had copied into are put back).

        Parameters
        ----------
        seqs : sequence of int
            Live sequence ids of this cache, each at most once (a list, not
            a single int): the rows of ``query`` belong to them in this
            order.
        query : array_like
            ``(len(seqs), Hq, T, E)`` (one T for all), or packed
            ``(total_q, Hq, E)`` in ``seqs`` order with ``cu_seqlens_q``;
            ``Hq`` a multiple of the cache's heads. Converted to the cache's
            compute dtype, as :func:`pyattn.attention_with_kvcache` does.
        key : array_like
            The new keys, one per query row, likewise with the cache heads:
            ``(len(seqs), Hkv, T, E)`` or packed ``(total_q, Hkv, E)``;
            converted to the pools' dtype (int8 / int4: quantized) as they
            are written.
        value : array_like
            The new values, as ``key`` with ``Ev``.
        cu_seqlens_q : (len(seqs) + 1,) integer array, optional
            Packed rows: sequence ``i`` brings rows ``cu_seqlens_q[i]`` to
            ``cu_seqlens_q[i + 1]`` of ``query``/``key``/``value`` (0
            allowed); starts at 0, does not decrease, ends at ``total_q``.
        **kw
            Other keywords are :func:`pyattn.attention_with_kvcache`'s
            (``is_causal``, ``scale``, ``window``, ``tree_mask``,
            ``return_lse``, ...); not ``block_table``, ``cache_seqlens``,
            ``k_scale`` or ``v_scale`` (the cache holds them).
            ``precision="int8"`` with an int8 / int4 pool (else a
            ``ValueError``, nothing written): the query rows quantized to
            int8 per group as :func:`pyattn.quantize` does, integer key
            products per group scaled by the two scales and summed over the
            groups in float32; the same bits as a :class:`pyattn.KVCache`
            with the same rows, on every kernel family. Each score differs
            from the default precision's by at most ``|scale| * sum_g (s_q,g
            / 2) * sum_{e in g} |k_e|`` plus float32 rounding (see
            :func:`pyattn.attention_with_kvcache`).

        Returns
        -------
        out : ndarray
            Shaped as ``query`` with ``Ev``: ``(len(seqs), Hq, T, Ev)`` or
            ``(total_q, Hq, Ev)``.
        lse : ndarray
            Only with ``return_lse=True`` (then the call returns ``(out,
            lse)``): ``(len(seqs), Hq, T)`` or ``(total_q, Hq)``.

        Raises
        ------
        CacheFullError
            (a ``MemoryError``) when the free blocks do not suffice.
        ValueError
            Unknown or repeated sequence ids, a ``query`` that is neither
            ``(len(seqs), Hq, T, E)`` nor packed, a ``key`` whose T is not
            the query's, and the errors of
            :func:`pyattn.attention_with_kvcache`.
        TypeError
            ``seqs`` an int, ``key`` or ``value`` None, a ``block_table``,
            ``cache_seqlens``, ``k_scale`` or ``v_scale`` keyword, and the
            type errors of :func:`pyattn.attention_with_kvcache`.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=4)
        >>> a, b = cache.add_sequence(), cache.add_sequence()
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((3, 2, 1, 3, 4)).astype(np.float32)
        >>> cache.attend([a, b], q, k, v).shape             # 3 tokens each
        (2, 1, 3, 4)

        Packed rows, a different count per sequence (2 for ``a``, 1 for ``b``):

        >>> q, k, v = rng.standard_normal((3, 3, 1, 4)).astype(np.float32)
        >>> out, lse = cache.attend([a, b], q, k, v, cu_seqlens_q=[0, 2, 3], return_lse=True)
        >>> out.shape, lse.shape, cache.length(a), cache.length(b)
        ((3, 1, 4), (3, 1), 5, 4)
        """
        if isinstance(seqs, (int, np.integer)):
            raise TypeError("seqs must be a sequence of sequence ids (a list), got an int")
        ids = [self._get(s, "seqs entry") for s in seqs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"seqs has a repeated sequence id: {ids}")
        for x, name in ((key, "key"), (value, "value")):
            if x is None:
                raise TypeError(f"PagedKVCache.attend writes new rows: {name} is None")
        for name in ("block_table", "cache_seqlens"):
            if name in kw:
                raise TypeError(f"PagedKVCache.attend takes no {name} (the cache holds them)")
        q = as_array(query, "query")
        if cu_seqlens_q is not None:
            Ts = np.diff(_cu_seqlens(cu_seqlens_q, len(ids), q.shape[0] if q.ndim else -1)).tolist()
        else:
            if q.ndim != 4 or q.shape[0] != len(ids):
                raise ValueError(f"query must be (len(seqs), Hq, T, E) = ({len(ids)}, Hq, T, E), got "
                                 f"shape {q.shape} (or packed, with cu_seqlens_q)")
            Ts = [q.shape[2]] * len(ids)
            kx = as_array(key, "key")
            if kx.ndim == 4 and kx.shape[2] != q.shape[2]:     # the cache's lengths advance by T
                raise ValueError(f"key has shape {kx.shape}: PagedKVCache.attend appends one new key "
                                 f"per query row (T = {q.shape[2]}, query shape {q.shape})")
        lists, free, copies = self._plan(ids, Ts)
        width = max([len(b) for b in lists] + [1])
        if all(len(b) == width for b in lists):
            table = np.array(lists, np.int64).reshape(len(ids), width)
        else:
            table = np.full((len(ids), width), -1, np.int64)
            for i, b in enumerate(lists):
                table[i, :len(b)] = b
        lengths = np.array([self._seqs[s][1] for s in ids], np.int64)
        for name in ("k_scale", "v_scale"):
            if name in kw:
                raise TypeError(f"PagedKVCache.attend takes no {name} (the cache holds them)")
        pools = [x for x in (self.k, self.v, self.k_scale, self.v_scale) if x is not None]
        dst = [d for _, d in copies]
        before = [p[dst] for p in pools] if copies else None    # the free blocks, put back on an error
        from ._api import attention_with_kvcache    # (here: _api imports this module)
        try:
            for src, d in copies:                    # into free blocks: no live row changes
                for p in pools:                      # (the scales of a quantized block with it)
                    p[d] = p[src]
            res = attention_with_kvcache(query, self.k, self.v, key, value, cache_seqlens=lengths,
                                         block_table=table, cu_seqlens_q=cu_seqlens_q, k_scale=self.k_scale,
                                         v_scale=self.v_scale, **kw)
        except BaseException:
            if copies:
                for p, old in zip(pools, before):
                    p[dst] = old
            raise
        for src, _ in copies:                        # the writer leaves the shared block
            self._refs[src] -= 1
        for s, b, t in zip(ids, lists, Ts):
            old = self._seqs[s][0]
            for blk in b[len(old):] + [x for x, y in zip(b, old) if x != y]:
                self._refs[blk] += 1
            self._seqs[s] = [b, self._seqs[s][1] + t]
        self._free = free
        return res

    def __repr__(self) -> str:
        N, H, bs, E = self.k.shape
        per = 2 if self._quant == "int4" else 1
        q = f", group_size={self.group_size}" if self._quant else ""
        return (f"PagedKVCache(num_blocks={N}, block_size={bs}, num_kv_heads={H}, head_dim={E * per}, "
                f"value_dim={self.v.shape[3] * per}, dtype={self._quant or self.k.dtype}{q}, "
                f"sequences={len(self._seqs)}, blocks_free={self.blocks_free})")
