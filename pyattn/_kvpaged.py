"""The runner of paged, packed and tree KV cache calls (API.md, "Paged and
mixed-length KV caches"): ``attention_with_kvcache(block_table=,
cu_seqlens_q=, tree_mask=)`` once ``_cachespec.cache_spec`` has checked it.

The C side reads the pools through the block table in place (csrc/ops/
paged.h, csrc/bind_paged.c): no gathered copy of a cache exists. A call
whose sequences bring different numbers of new tokens runs in ONE kernel
call (csrc/ops/paged_packed.c: tasks over (sequence, head, query block),
each sequence with its own kv length and block-table row, bit-identical to
calling it alone); the new rows are written by the call's before-hook once
every check has passed and everything is allocated, so a call that raises
writes nothing. Only with a tree_mask do sequences with different token
counts still run one kernel call per distinct count; there every check is
made before the first call, and should a later one fail (MemoryError,
KeyboardInterrupt) the rows the earlier ones wrote are put back.
"""
from __future__ import annotations

import numpy as np

from . import _C
from ._api import _sdpa
from ._checks import bcast, per_head, split_axis, standin, store16

__all__ = []  # private


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


def kvcache_paged(cs, out):
    """attention_with_kvcache with block_table, cu_seqlens_q or tree_mask
    (its docstring): cs the call's CacheSpec (_cachespec.cache_spec)."""
    o = cs.opts
    return_lse, packed, B, cu = o["return_lse"], cs.packed, cs.B, cs.cu
    shape = (cs.query.shape[0], cs.Hq, cs.Ev) if packed else (B, cs.Hq, cs.T, cs.Ev)
    if packed and cs.tree is None and not cs.quant and B > 0 and (o["sinks"] is None or np.ndim(o["sinks"]) <= 1):
        res, lse = _packed(cs)
        if out is not None:
            out[...] = res
            res = out
        return (res, lse) if return_lse else res
    groups = {}
    for b in range(B):
        if cs.Ts[b] or not packed:
            groups.setdefault(int(cs.Ts[b]), []).append(b)
    whole = not packed and len(groups) == 1
    res = None if whole else np.empty(shape, cs.cd)
    lse = None if whole or not return_lse else np.empty(shape[:-1], cs.cd)
    saved = None
    written = cs.written
    if cs.key is not None and len(groups) > 1:   # the rows, to put back if a later group fails
        saved = [(c, c[written[0], :, written[1], :].copy())
                 for c in (cs.k_cache, cs.v_cache, cs.k_scale, cs.v_scale) if c is not None]
    try:
        for Tg, idx in groups.items():
            r = _group(cs, idx, Tg, whole)
            if whole:
                res, lse = r if return_lse else (r, None)
                break
            og, lg = r if return_lse else (r, None)
            for i, b in enumerate(idx):
                if packed:
                    res[cu[b]:cu[b + 1]] = og[i].transpose(1, 0, 2)
                    if lse is not None:
                        lse[cu[b]:cu[b + 1]] = lg[i].T
                else:
                    res[b] = og[i]
                    if lse is not None:
                        lse[b] = lg[i]
    except BaseException:
        if saved is not None:
            for c, old in saved:
                c[written[0], :, written[1], :] = old
        raise
    if res is None:                             # no sequence (B = 0)
        res = np.empty(shape, cs.cd)
        lse = np.empty(shape[:-1], cs.cd) if return_lse else None
    if out is not None:
        out[...] = res
        res = out
    return (res, lse) if return_lse else res


def _packed(cs):
    """One kernel call for every sequence (csrc/ops/paged_packed.c): query
    (total, Hq, E) viewed head-major (Hq, total, E), or (Hkv, G, total, E)
    with GQA; decode steps (one token) have their G query heads stacked as
    rows, as the dense call of a decode step (_api._sdpa)."""
    qd, Hkv, S, Ev = cs.query, cs.Hkv, cs.S, cs.Ev
    total, Hq = qd.shape[0], qd.shape[1]
    views = [standin((Hkv, S, D), c.dtype) for c, D in ((cs.k_cache, cs.E), (cs.v_cache, Ev))]    # the
    # call's k, v: shape only (C reads the pools)
    spec = cs.attn(qd.transpose(1, 0, 2), views[0], views[1])
    dt, G, hkv = spec.dtype, spec.groups, spec.hkv
    q = store16(spec.query, dt)
    k, v = (store16(x, dt) for x in (spec.key, spec.value))
    buf = np.empty((total, Hq, Ev), dt)
    o = buf.transpose(1, 0, 2)
    if G > 1:
        q, o = split_axis(q, -3, hkv, G), split_axis(o, -3, hkv, G)
        k, v = (bcast(x[:, None], (hkv, G, S, x.shape[-1])) for x in (k, v))
    kw = spec.c_kwargs()
    kw["cu_seqlens_q"] = cs.cu
    kw["kv_len"] = np.repeat(np.asarray(cs.kv_len, np.int64), Hq)
    slopes, sinks = cs.slopes, cs.opts["sinks"]
    if slopes is not None:
        kw["slopes"] = per_head(slopes, "alibi_slopes", (cs.B, Hq), "(Hq,) or (B, Hq)").reshape(-1)
    if G > 1 and slopes is None and sinks is None:
        kw["row_div"] = G                       # decode steps: the G query heads as rows
    if spec.bf16:
        kw["bf16"] = True
    if cs.opts["return_lse"]:
        kw["want_lse"] = True
    if cs.key is not None:                      # rotary: keys in cd, rotated as they are written
        kw["append"] = cs.c_append(cs.rows(cs.key, cs.value), cs.n)
    kw["paged"] = cs.c_paged(cs.table)
    _, _, lse = _C.sdpa(q, k, v, o, **kw)
    return buf, (None if lse is None else np.ascontiguousarray(lse.reshape(Hq, total).T))


def _group(cs, idx, Tg, whole):
    """One kernel call: the sequences idx, each with Tg new tokens (whole:
    every sequence, not packed)."""
    ix = np.asarray(idx, np.int64)
    qd, packed, S, Hkv = cs.query, cs.packed, cs.S, cs.Hkv
    if packed:
        rows = cs.cu[ix][:, None] + np.arange(Tg)[None, :]
        qg = qd[rows].transpose(0, 2, 1, 3)
    else:
        qg = qd if whole else qd[ix]

    def stand_in(c, D):                         # the call's k, v: shape only (C reads the pools)
        return standin((len(idx), Hkv, S, D), c.dtype)
    views = [stand_in(cs.k_cache, cs.k_cache.shape[3]), stand_in(cs.v_cache, cs.v_cache.shape[3])]
    ks, vs = cs.k_scale, cs.v_scale
    append = None
    if cs.key is not None:
        rk, rv = [(x[rows].transpose(0, 2, 1, 3) if packed else (x if whole else x[ix])) for x in (cs.key, cs.value)]
        append = cs.c_append(cs.rows(rk, rv), cs.n[ix])
    mask = None
    if cs.tree is not None:
        base = cs.n if cs.key is not None else cs.n - Tg
        mask = _tree_mask(cs.tree, idx, Tg, base, S)
    sl = cs.slopes
    if sl is not None and sl.ndim == 2:
        sl = sl[ix]
    # a quantized pool: float32 stand-ins of its values for the spec's checks,
    # then the spec carries the pools' stand-ins and their scales'
    kspec = np.broadcast_to(np.float32(0), views[0].shape[:3] + (cs.E,)) if ks is not None else views[0]
    vspec = np.broadcast_to(np.float32(0), views[1].shape[:3] + (cs.Ev,)) if vs is not None else views[1]
    spec = cs.attn(qg, kspec, vspec, mask, kv_len=cs.kv_len[ix][:, None], slopes=sl)
    if cs.quant:
        svs = tuple(None if x is None else stand_in(x, x.shape[3]) for x in (ks, vs))
        spec = spec._replace(key=views[0], value=views[1], kv_scales=svs, int8=cs.int8)
    return _sdpa(spec, None, append=append, paged=cs.c_paged(cs.table[ix]))
