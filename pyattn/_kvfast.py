"""Plans by signature: the fast path of a repeated small call (decode per-call cost).

A model calls attention once per layer per generated token with the same
shapes, dtypes and options every time; only the arrays' contents and the
lengths change. The full entry points check every argument and derive the
kernel call (views, keywords) anew each time -- tens of microseconds of Python
around about one microsecond of arithmetic.

Here a call's *signature* -- the shapes, dtypes and layouts of the arrays and
the values (with their types) of the scalar options -- keys a memo of plans:
the kernel call that signature leads to. A plan is made only after the full
entry point has accepted and run a call of that signature (so every check that
depends on the signature alone has passed); a later call with the same
signature runs the plan: it converts ``cache_seqlens``, copies the new rows,
builds the views and calls ``_C.sdpa`` with the keywords the full path would
give it (tests/test_kvfast.py compares the two calls argument by argument).
What depends on the values is still checked on every call: the lengths and a
block table's entries by the C binding (which writes nothing when it refuses:
the call is then handed to the full entry point, which raises its own
message), two sequences writing one row of a paged pool by the full path's own
check, the arrays' alignment, byte order and writeability here.

Covered (``_kvapi`` and ``_api`` decide which calls ask):
- ``attention_with_kvcache`` on contiguous caches of float32, float64,
  float16 or bfloat16 and on such paged pools (``block_table``; not packed, no
  tree), with or without new rows, GQA, ``is_causal``, ``scale``, ``window``,
  ``softcap``, ``precision``, ``return_lse`` and ``out`` (the result is
  computed apart and copied into it: the values the full path writes) -- and
  so ``KVCache.attend``, ``PagedKVCache.attend`` and pyattn.flash's
  ``flash_attn_with_kvcache`` (token-major views);
- ``scaled_dot_product_attention`` without a mask, dropout, ALiBi, sinks,
  weights or a block mask, on batch axes that need no broadcasting.
Everything else (rotary, left padding, batch indices, packed or tree calls,
quantized caches, block masks, caches copied for their layout, non-ndarray
inputs) takes the full path.
"""
from __future__ import annotations

import numpy as np

from . import _C
from ._cachespec import _written_rows, c_append, c_paged
from ._checks import is16, standin, store16, to_dtype
from ._spec import attn_spec

_F32 = np.dtype(np.float32)
_MAX_PLANS = 256                    # signatures remembered (a model has a handful)
_plans: dict = {}
# counters (read by the tests): calls run by a plan, calls that took the full path
stats = {"fast": 0, "full": 0}
# Threads for this process's next calls when not 0: pyattn.transformers sets 1 around a decode
# call while PyTorch's own intra-op threads (OpenMP) are busy-waiting on the other cores -- a
# second pyattn thread would share a core with a spinning one (a decode call in a model 2x
# slower on 2 threads than on 1, measured). Read by _SdpaPlan.run and _api._sdpa; the bits
# are the same for any thread count.
call_threads = 0

# the option types a plan is keyed by (a scale of 1 / np.sqrt(E) is a np.float64)
_SCALAR_TYPES: tuple[type, ...] = (bool, int, float, str, type(None), np.float64, np.float32, np.float16,
                                   np.int64, np.int32, np.bool_)


def _opt(x):
    """A scalar option as a memo key: its type and value (True, 1 and 1.0 are
    distinct arguments to the checks); tuples (window) element by element.
    None for anything else (the call takes the full path)."""
    t = type(x)
    if t in _SCALAR_TYPES:
        return (t, x)
    if t is tuple and all(type(e) in _SCALAR_TYPES for e in x):
        return (t,) + tuple((type(e), e) for e in x)
    return None


def _out_key(out):
    """out's part of a memo key: None for no out, (shape, dtype) for an
    ndarray, False for anything else (the full path)."""
    if out is None:
        return None
    return (out.shape, out.dtype) if type(out) is np.ndarray else False


def signature(query, k_cache, v_cache, key, value, out, opts):
    """The memo key of a call, or None when the call is not one the fast path
    covers (the caller then takes the full path). opts: the call's (is_causal,
    scale, window, softcap, return_lse, precision)."""
    nd = np.ndarray
    if type(query) is not nd or type(k_cache) is not nd or type(v_cache) is not nd:
        return None
    if key is None:
        if value is not None:
            return None
        rows = None
    else:
        if type(key) is not nd or type(value) is not nd:
            return None
        rows = (key.shape, key.dtype, value.shape, value.dtype)
    o = _out_key(out)
    if o is False:
        return None
    c, s, w, cap, lse, p = opts
    ok = (_opt(c), _opt(s), _opt(w), _opt(cap), _opt(lse), _opt(p))
    if None in ok:
        return None
    return (query.shape, query.strides, query.dtype, k_cache.shape, k_cache.strides, k_cache.dtype,
            v_cache.shape, v_cache.strides, v_cache.dtype, rows, o) + ok


def paged_signature(query, k_pool, v_pool, key, value, out, block_table, opts):
    """The memo key of an attention_with_kvcache call with a block_table (and
    none of cu_seqlens_q, tree_mask, rotary, quantized pools...), or None."""
    sig = signature(query, k_pool, v_pool, key, value, out, opts)
    if sig is None or type(block_table) is not np.ndarray or block_table.ndim != 2 or \
            block_table.dtype.kind not in "iu" or (block_table.dtype.kind == "u" and block_table.dtype.itemsize == 8):
        return None
    return ("paged", block_table.shape, block_table.dtype) + sig


def _layout_ok(query, k_cache, v_cache, new, out):
    """What depends on the arrays' addresses and flags: the query and the
    caches aligned, the caches writeable when rows are appended, out writeable."""
    kf, vf = k_cache.flags, v_cache.flags
    return (query.flags.aligned and kf.aligned and vf.aligned and (not new or (kf.writeable and vf.writeable))
            and (out is None or out.flags.writeable))


def _seqlens(cache_seqlens, B):
    """(B,) int64 from an int or a (B,) integer ndarray, or None (full path).
    The range is checked by the C call."""
    t = type(cache_seqlens)
    if t is int:
        if cache_seqlens < 0 or cache_seqlens >= 1 << 62:
            return None
        return np.full(B, cache_seqlens, np.int64)
    if t is np.ndarray and cache_seqlens.shape == (B,) and cache_seqlens.dtype.kind in "iu":
        if cache_seqlens.dtype.kind == "u" and cache_seqlens.dtype.itemsize == 8:
            return None                 # may not fit int64: the full path says so
        return cache_seqlens.astype(np.int64)     # a copy: the call never holds the caller's array
    return None


class _Plan:
    """The kernel call of one signature (see the module docstring)."""
    __slots__ = ("cd", "q_conv", "B", "Hq", "Hkv", "G", "T", "Tk", "E", "Ev", "S", "bs", "kv", "stack", "extra",
                 "k_view", "v_view", "rows_dt", "out_shape", "lse_shape", "views_ok")

    def __init__(self, query, k_cache, v_cache, key, opts, table=None):
        is_causal, scale, window, softcap, return_lse, precision = opts
        kc, vc = k_cache, v_cache
        cd = _F32 if is16(kc.dtype) else kc.dtype
        B, Hkv, S_max, E = kc.shape
        Ev = vc.shape[3]
        self.bs = None
        if table is not None:               # pools (num_blocks, Hkv, block_size, E): the call's k, v
            self.bs = S_max                 # stand in as (B, Hkv, table columns x block_size, E)
            B, S_max = table.shape[0], table.shape[1] * S_max
            kc, vc = (standin((B, Hkv, S_max, c.shape[3]), c.dtype) for c in (kc, vc))
        self.S = S_max
        self.kv = None if table is None else (store16(kc, cd), store16(vc, cd))
        Hq, T = query.shape[1], query.shape[2]
        G = Hq // Hkv
        Tk = 0 if key is None else key.shape[2]
        self.cd, self.B, self.Hq, self.Hkv, self.G, self.T, self.Tk, self.E, self.Ev = \
            cd, B, Hq, Hkv, G, T, Tk, E, Ev
        # the query as attention_with_kvcache converts it: 16-bit read in place
        # when the caches compute in float32, anything else in the compute dtype
        self.q_conv = not (is16(query.dtype) and cd == _F32) and query.dtype != cd
        # the options as attn_spec checks them and _sdpa passes them (the spec
        # of a stand-in call of the same signature: the same helpers decide)
        spec = attn_spec(query.astype(cd) if self.q_conv else query, kc, vc, None, 0.0,
                         "bottom_right" if is_causal else False, scale, Hq != Hkv,
                         {"window": window, "softcap": softcap, "precision": precision, "return_lse": return_lse})
        self.stack = G > 1 and T == 1
        extra = spec.c_kwargs()
        if self.stack:
            extra["row_div"] = G
        if spec.bf16:
            extra["bf16"] = True
        if spec.return_lse:
            extra["want_lse"] = True
        self.extra = extra
        self.k_view = kc.dtype.kind == "V"  # bfloat16: its bits as uint16
        self.v_view = vc.dtype.kind == "V"
        self.rows_dt = (kc.dtype, vc.dtype)
        self.out_shape = (B, Hq, T, Ev)
        self.lse_shape = (B, Hq, T) if spec.return_lse else None
        # the query's head axis split into (Hkv, G) by reshape: a view with the
        # strides the full path's split_axis gives (else no plan: reshape would copy)
        self.views_ok = True
        if G > 1:
            qs = store16(to_dtype(query, cd) if self.q_conv else query, cd)
            st = qs.strides
            want = st[:1] + (st[1] * G, st[1]) + st[2:]
            r = qs.reshape((B, Hkv, G, T, E))
            self.views_ok = qs.size == 0 or (np.shares_memory(r, qs) and all(
                a == b for a, b, m in zip(r.strides, want, r.shape) if m > 1))

    def run(self, query, k_cache, v_cache, key, value, n, table=None, lens=None):
        """The call with cache_seqlens n ((B,) int64, a copy, or a PagedPlan's
        read-only lengths); None when the C call refuses it (the full path
        then raises its own message). lens: a PagedPlan's memo of the kv
        lengths repeated per head (read-only arrays, reused by every layer)."""
        cd = self.cd
        q = to_dtype(query, cd) if self.q_conv else query
        q = store16(q, cd)
        extra = dict(self.extra)
        c0, c1 = k_cache, v_cache
        if self.k_view:
            c0 = c0.view(np.uint16)
        if self.v_view:
            c1 = c1.view(np.uint16)
        if table is None:
            k, v = store16(k_cache, cd), store16(v_cache, cd)
        else:                               # a paged call: k, v stand in for their shape (C reads the pools)
            k, v = self.kv
            extra["paged"] = c_paged((c0, c1), table)
        if key is not None:
            r0 = key.astype(self.rows_dt[0], order="C", copy=True)
            r1 = value.astype(self.rows_dt[1], order="C", copy=True)
            if self.k_view:
                r0 = r0.view(np.uint16)
            if self.v_view:
                r1 = r1.view(np.uint16)
            # the layouts of _cachespec.c_append / c_paged (the full path's CacheSpec builds
            # them there too), without a spec: this is the per-call path
            extra["append"] = c_append((c0, c1), (r0, r1), n, table is not None)
        B, Hkv, G = self.B, self.Hkv, self.G
        reps = Hkv if self.stack else self.Hq
        kl = None if lens is None else lens.get(reps)
        if kl is None:                      # the kv lengths, after the new rows
            kl = np.repeat(n if key is None else n + self.Tk, reps)
            if lens is not None:
                kl.flags.writeable = False
                lens[reps] = kl
        extra["kv_len"] = kl
        if self.stack:                      # GQA decode: a group's query heads are rows of one call
            q = q.reshape(B, Hkv, G, self.E)
        elif G > 1:
            q = q.reshape(B, Hkv, G, self.T, self.E)
            S = k.shape[2]
            k = np.broadcast_to(k[:, :, None], (B, Hkv, G, S, k.shape[3]))
            v = np.broadcast_to(v[:, :, None], (B, Hkv, G, S, v.shape[3]))
        try:
            res, _, lse = _C.sdpa(q, k, v, None, None, **extra)
        except (TypeError, ValueError):
            return None
        if G > 1:
            res = res.reshape(self.out_shape)
            if lse is not None:
                lse = lse.reshape(self.lse_shape)
        return res if self.lse_shape is None else (res, lse)


def run(sig, query, k_cache, v_cache, key, value, out, cache_seqlens, block_table=None):
    """The call by its signature's plan; None when there is no plan yet or
    this call is not one the plan covers (the caller takes the full path)."""
    plan = _plans.get(sig)
    if plan is None or not _layout_ok(query, k_cache, v_cache, key is not None, out):
        return None
    n = _seqlens(cache_seqlens, plan.B)
    if n is None:
        return None
    table = None
    if block_table is not None:
        table = block_table if block_table.dtype == np.int64 else block_table.astype(np.int64)
        table = np.ascontiguousarray(table)
        if key is not None and (plan.B > 1 or plan.Tk > 1):
            # two writes of one physical row: the full path's check (and its error), as it makes it
            Tk = plan.Tk
            if ((n < 0) | (n > plan.S - Tk)).any() or (table < 0).any():
                return None                 # out of range: the full path says which
            _written_rows(table, n, np.full(plan.B, Tk, np.int64), np.arange(plan.B + 1, dtype=np.int64) * Tk,
                          plan.bs)
    return _finish(plan.run(query, k_cache, v_cache, key, value, n, table), plan, out)


def _finish(res, plan, out):
    """A plan's result (None: refused, the full path then) into out when given."""
    if res is None:
        return None
    stats["fast"] += 1
    if out is None:
        return res
    # the result computed apart, then copied (rounded into a 16-bit out): the
    # values the full path writes, whether its kernel wrote out in place or not
    if plan.lse_shape is None:
        out[...] = res
        return out
    out[...] = res[0]
    return out, res[1]


# the keywords of PagedKVCache.attend a plan covers, with attention_with_kvcache's defaults
_PAGED_KW = {"is_causal": True, "scale": None, "window": None, "softcap": None, "return_lse": False, "out": None,
             "precision": None}


_PAGED_OPTS = tuple(_opt(_PAGED_KW[x]) for x in ("is_causal", "scale", "window", "softcap", "return_lse",
                                                  "precision"))


def run_planned(query, k_pool, v_pool, key, value, n, table, kw, lens):
    """A step of a PagedKVCache with a PagedPlan (pyattn/_paged.py): n the
    lengths before it ((B,) int64) and table its block table ((B, W) int64,
    C order), both made and checked by the plan (entries in range, each row
    written by one sequence), so neither is checked again here; lens, the
    plan's memo of its kv lengths repeated per head (the same for every
    layer). None when the signature has no plan yet or kw holds keywords
    not covered (the caller takes the full path)."""
    nd = np.ndarray
    if kw:
        o = _PAGED_KW
        for name in kw:
            if name not in o:
                return None
        o = dict(o)
        o.update(kw)
        out = o["out"]
        sig = paged_signature(query, k_pool, v_pool, key, value, out, table,
                              (o["is_causal"], o["scale"], o["window"], o["softcap"], o["return_lse"],
                               o["precision"]))
    elif type(query) is nd and type(key) is nd and type(value) is nd:    # the defaults: signature's key
        out = None
        sig = ("paged", table.shape, table.dtype, query.shape, query.strides, query.dtype, k_pool.shape,
               k_pool.strides, k_pool.dtype, v_pool.shape, v_pool.strides, v_pool.dtype,
               (key.shape, key.dtype, value.shape, value.dtype), None) + _PAGED_OPTS
    else:
        return None
    plan = _plans.get(sig) if sig is not None else None
    if plan is None or not _layout_ok(query, k_pool, v_pool, True, out):
        return None
    return _finish(plan.run(query, k_pool, v_pool, key, value, n, table, lens), plan, out)


def remember(sig, query, k_cache, v_cache, key, out, opts, block_table=None):
    """Make the plan of a signature the full path has just accepted (and ran):
    only for the calls the fast path covers."""
    stats["full"] += 1
    if sig is None or sig in _plans:
        return
    if not _layout_ok(query, k_cache, v_cache, key is not None, out):
        return
    if k_cache.dtype not in (np.float32, np.float64) and not is16(k_cache.dtype):
        return                              # quantized caches: the full path
    if not (k_cache.dtype.isnative and v_cache.dtype.isnative and query.dtype.isnative):
        return
    if block_table is not None and (block_table.shape[0] == 0 or 0 in k_cache.shape or 0 in v_cache.shape):
        return                              # no sequence, or empty pools: the full path
    plan = _Plan(query, k_cache, v_cache, key, opts, block_table)
    if plan.views_ok:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[sig] = plan


# ---- scaled_dot_product_attention: the same memo for a plain call -------------------------

def sdpa_signature(query, key, value, out, opts):
    """The memo key of a scaled_dot_product_attention call without a mask,
    dropout, ALiBi, sinks, weights or a block mask (the caller checks those
    are None / False), or None (the full path). opts: the call's (dropout_p,
    is_causal, scale, enable_gqa, window, softcap, return_lse, precision,
    align)."""
    nd = np.ndarray
    if type(query) is not nd or type(key) is not nd or type(value) is not nd:
        return None
    o = _out_key(out)
    if o is False:
        return None
    p, c, s, g, w, cap, lse, pr, al = opts
    ok = (_opt(p), _opt(c), _opt(s), _opt(g), _opt(w), _opt(cap), _opt(lse), _opt(pr), _opt(al))
    if None in ok or p != 0:
        return None
    return ("sdpa", query.shape, query.strides, query.dtype, key.shape, key.strides, key.dtype,
            value.shape, value.strides, value.dtype, o) + ok


class _SdpaPlan:
    """The kernel call of a scaled_dot_product_attention signature, from the
    spec the full path made for a call of it (pyattn._spec.AttnSpec)."""
    __slots__ = ("dt", "split", "stack", "kshape", "vshape", "extra", "out_shape", "lse_shape", "ok")

    def __init__(self, spec):
        q, k, v = spec.query, spec.key, spec.value
        G, L, E = spec.groups, spec.L, spec.E
        fb = spec.full_batch
        self.dt = spec.dtype
        self.ok = (spec.mask is None and spec.dropout_p == 0 and not spec.return_weights and spec.slopes is None
                   and spec.sinks is None and spec.block_mask is None and spec.kv_len is None
                   and spec.cu_seqlens_q is None and spec.kv_scales is None
                   and all(x.dtype.isnative for x in (q, k, v)))
        if G > 1:       # the batch axes given in full (no broadcasting): the views below are _sdpa's
            hb = fb[:-1]
            self.ok = self.ok and q.shape[:-3] == k.shape[:-3] == v.shape[:-3] == hb
            self.split = hb + (spec.hkv, G, L, E)
        else:
            self.ok = self.ok and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] == fb
            self.split = None
        self.stack = G > 1 and L == 1
        if G > 1 and not self.stack:
            self.kshape = hb + (spec.hkv, G, spec.S, E)
            self.vshape = hb + (spec.hkv, G, spec.S, spec.Ev)
        extra = spec.c_kwargs()
        if self.stack:
            extra["row_div"] = G
        if spec.bf16:
            extra["bf16"] = True
        if spec.qoff is not None:
            extra["qoff"] = spec.qoff
        if spec.return_lse:
            extra["want_lse"] = True
        self.extra = extra
        self.out_shape = spec.out_shape
        self.lse_shape = fb + (L,) if spec.return_lse else None
        if self.ok and G > 1:           # the query's head axis split by reshape: a view, as split_axis
            qs = store16(q, self.dt)
            st = qs.strides
            want = st[:-3] + (st[-3] * G, st[-3]) + st[-2:]
            r = qs.reshape(self.split)
            self.ok = qs.size == 0 or (np.shares_memory(r, qs) and all(
                a == b for a, b, m in zip(r.strides, want, r.shape) if m > 1))

    def run(self, query, key, value, out):
        dt = self.dt
        q, k, v = store16(query, dt), store16(key, dt), store16(value, dt)
        if self.split is not None:
            q = q.reshape(self.split)
            if self.stack:
                q = q[..., 0, :]
            else:
                k = np.broadcast_to(k[..., None, :, :], self.kshape)
                v = np.broadcast_to(v[..., None, :, :], self.vshape)
        try:
            res, _, lse = (_C.sdpa(q, k, v, None, None, **self.extra) if not call_threads else
                           _C.sdpa(q, k, v, None, None, nthreads=call_threads, **self.extra))
        except (TypeError, ValueError):
            return None
        stats["fast"] += 1
        if self.split is not None:
            res = res.reshape(self.out_shape)
            if lse is not None:
                lse = lse.reshape(self.lse_shape)
        if out is not None:
            out[...] = res
            res = out
        return res if self.lse_shape is None else (res, lse)


def sdpa_run(sig, query, key, value, out):
    """scaled_dot_product_attention by its signature's plan, or None."""
    plan = _plans.get(sig)
    if plan is None or not (query.flags.aligned and key.flags.aligned and value.flags.aligned
                            and (out is None or out.flags.writeable)):
        return None
    return plan.run(query, key, value, out)


def sdpa_remember(sig, spec, out):
    """Make the plan of a signature whose full call (spec) has just run."""
    stats["full"] += 1
    if sig is None or sig in _plans:
        return
    if not (spec.query.flags.aligned and spec.key.flags.aligned and spec.value.flags.aligned
            and (out is None or out.flags.writeable)):
        return
    plan = _SdpaPlan(spec)
    if plan.ok:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[sig] = plan


def clear():
    """Forget every plan (tests; set_num_threads and select_isa need not)."""
    _plans.clear()
