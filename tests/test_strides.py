"""Strides and byte order of every array argument of every entry point
(the serving paths included), generated from one table.

Each row of ``ROWS`` builds one call: its array arguments (by name), the
ones the call writes in place, and the call itself. For every array argument
and every layout kind below, the call on a view with the *same numbers* laid
out differently must give the same bits as the call on C-contiguous native
arrays (and leave the same numbers in what it writes). A layout a written
argument cannot take (a broadcast view, a read-only array) must be refused
with an exception naming the argument, before anything is written. Adding an
entry point or an argument is adding a row or a name here.

Layout kinds (API.md: any strides are accepted):

- ``neg``: every axis reversed (negative strides on all axes);
- ``zero``: axis 0 broadcast (stride 0) -- the numbers repeat along it;
- ``step``: a non-unit stride on the last axis (every other element);
- ``unaligned``: the data one byte past an aligned address;
- ``bigendian``: the same numbers stored big-endian;
- ``readonly``: the array is not writeable.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import pyattn

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
KINDS = ("neg", "zero", "step", "unaligned", "bigendian", "readonly")
FLOATS = {"f32": F32, "f16": F16, "bf16": BF16, "f64": F64}


# ---- the layouts: (the numbers C-contiguous and native, the same numbers laid out) --

def _applies(a, kind):
    if not isinstance(a, np.ndarray) or a.size == 0:
        return False
    if kind == "zero":
        return a.ndim >= 1 and a.shape[0] >= 2
    if kind == "bigendian":
        return a.dtype.itemsize > 1 and a.dtype.kind in "fiu"
    if kind == "unaligned":
        return a.dtype.alignment > 1
    return True


def layout(a, kind):
    """(contiguous numbers, view with those numbers in layout `kind`)."""
    if kind == "neg":
        rev = (slice(None, None, -1),) * a.ndim
        return a, np.ascontiguousarray(a[rev])[rev]
    if kind == "zero":
        c = np.ascontiguousarray(np.broadcast_to(a[:1], a.shape))
        return c, np.broadcast_to(c[:1], a.shape)
    if kind == "step":
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        v = wide[..., ::2]
        v[...] = a
        return a, v
    if kind == "unaligned":
        buf = np.zeros(a.nbytes + 1, np.uint8)[1:].view(a.dtype).reshape(a.shape)
        buf[...] = a
        assert not buf.flags.aligned
        return a, buf
    if kind == "bigendian":
        return a, a.astype(a.dtype.newbyteorder(">"))
    if kind == "readonly":
        r = a.copy()
        r.setflags(write=False)
        return a, r
    raise AssertionError(kind)


# ---- the table ------------------------------------------------------------------

def _rng(seed):
    return np.random.default_rng(seed)


def _f(rng, shape, dt):
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def _sdpa(dt, prec, L=7, S=21):
    rng = _rng(1)
    arrs = dict(query=_f(rng, (2, 4, L, 8), dt), key=_f(rng, (2, 2, S, 8), dt), value=_f(rng, (2, 2, S, 6), dt),
                attn_mask=rng.random((2, 1, L, S)) > 0.3, alibi_slopes=np.linspace(0.1, 0.4, 4),
                sinks=np.linspace(-1, 1, 4).astype(np.float32))
    return arrs, (), lambda a: pyattn.scaled_dot_product_attention(
        a["query"], a["key"], a["value"], a["attn_mask"], enable_gqa=True, alibi_slopes=a["alibi_slopes"],
        sinks=a["sinks"], return_lse=True, precision=prec)


def _sdpa_decode(dt, prec):
    rng = _rng(2)
    arrs = dict(query=_f(rng, (2, 8, 1, 16), dt), key=_f(rng, (2, 2, 300, 16), dt),
                value=_f(rng, (2, 2, 300, 16), dt))
    return arrs, (), lambda a: pyattn.scaled_dot_product_attention(
        a["query"], a["key"], a["value"], enable_gqa=True, return_lse=True, precision=prec)


def _backward(dt, prec):
    rng = _rng(3)
    q, k, v = _f(rng, (2, 2, 9, 8), dt), _f(rng, (2, 2, 13, 8), dt), _f(rng, (2, 2, 13, 5), dt)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    arrs = dict(grad_out=_f(rng, o.shape, dt), query=q, key=k, value=v, out=o, lse=lse)
    return arrs, (), lambda a: pyattn.scaled_dot_product_attention_backward(
        a["grad_out"], a["query"], a["key"], a["value"], a["out"], a["lse"], is_causal=True)


def _varlen(dt, prec):
    rng = _rng(4)
    arrs = dict(query=_f(rng, (12, 4, 8), dt), key=_f(rng, (15, 2, 8), dt), value=_f(rng, (15, 2, 8), dt),
                cu_seqlens_q=np.array([0, 5, 12], np.int32), cu_seqlens_k=np.array([0, 7, 15], np.int64))
    return arrs, (), lambda a: pyattn.scaled_dot_product_attention_varlen(
        a["query"], a["key"], a["value"], a["cu_seqlens_q"], a["cu_seqlens_k"], is_causal=True,
        enable_gqa=True, return_lse=True, precision=prec)


def _varlen_backward(dt, prec):
    rng = _rng(5)
    q, k, v = _f(rng, (12, 2, 8), dt), _f(rng, (15, 2, 8), dt), _f(rng, (15, 2, 8), dt)
    cq, ck = np.array([0, 5, 12], np.int32), np.array([0, 7, 15], np.int32)
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, return_lse=True)
    arrs = dict(grad_out=_f(rng, o.shape, dt), query=q, key=k, value=v, out=o, lse=lse,
                cu_seqlens_q=cq, cu_seqlens_k=ck)
    return arrs, (), lambda a: pyattn.scaled_dot_product_attention_varlen_backward(
        a["grad_out"], a["query"], a["key"], a["value"], a["out"], a["lse"], a["cu_seqlens_q"],
        a["cu_seqlens_k"])


def _caches(rng, dt, shape_k, shape_v):
    """(k_cache, v_cache, k_scale, v_scale) in dt: a float dtype or "int8"/"int4"."""
    if dt in ("int8", "int4"):
        kc, ks = pyattn.quantize(_f(rng, shape_k, F32), dt, group_size=4)
        vc, vs = pyattn.quantize(_f(rng, shape_v, F32), dt, group_size=4)
        return kc, vc, ks, vs
    return _f(rng, shape_k, dt), _f(rng, shape_v, dt), None, None


def _kvcache(dt, prec, new=True, extra=None):
    rng = _rng(6)
    kc, vc, ks, vs = _caches(rng, dt, (2, 2, 24, 8), (2, 2, 24, 8))
    qdt = F32 if dt in ("int8", "int4") else dt
    arrs = dict(query=_f(rng, (2, 4, 3, 8), qdt), k_cache=kc, v_cache=vc, cache_seqlens=np.array([4, 9], np.int32),
                alibi_slopes=np.linspace(0.1, 0.4, 4))
    if ks is not None:
        arrs.update(k_scale=ks, v_scale=vs)
    if new:
        arrs.update(key=_f(rng, (2, 2, 3, 8), qdt), value=_f(rng, (2, 2, 3, 8), qdt))
    if extra == "rotary":
        arrs.update(rotary_cos=rng.random((40, 4)).astype(np.float32),
                    rotary_sin=rng.random((40, 4)).astype(np.float32))
    if extra == "leftpad":
        arrs.update(cache_leftpad=np.array([1, 3], np.int32), cache_batch_idx=np.array([1, 0], np.int64))
        del arrs["alibi_slopes"]
    written = ("k_cache", "v_cache", "k_scale", "v_scale") if new else ()
    return arrs, tuple(w for w in written if w in arrs), lambda a: pyattn.attention_with_kvcache(
        **a, return_lse=True, precision=prec)


def _paged(dt, prec, new=True, extra=None):
    rng = _rng(7)
    kc, vc, ks, vs = _caches(rng, dt, (6, 2, 4, 8), (6, 2, 4, 8))
    qdt = F32 if dt in ("int8", "int4") else dt
    arrs = dict(k_cache=kc, v_cache=vc, block_table=np.array([[4, 0, 2], [1, 5, 3]], np.int32),
                cache_seqlens=np.array([3, 6], np.int32))
    if ks is not None:
        arrs.update(k_scale=ks, v_scale=vs)
    if extra == "packed":
        arrs.update(query=_f(rng, (5, 4, 8), qdt), cu_seqlens_q=np.array([0, 2, 5], np.int32))
        if new:
            arrs.update(key=_f(rng, (5, 2, 8), qdt), value=_f(rng, (5, 2, 8), qdt))
    else:
        arrs["query"] = _f(rng, (2, 4, 3, 8), qdt)
        if new:
            arrs.update(key=_f(rng, (2, 2, 3, 8), qdt), value=_f(rng, (2, 2, 3, 8), qdt))
    if extra == "tree":
        tm = np.tril(np.ones((3, 3), bool))
        tm[2, 1] = False
        arrs["tree_mask"] = np.broadcast_to(tm, (2, 4, 3, 3)).copy()
    written = ("k_cache", "v_cache", "k_scale", "v_scale") if new else ()
    return arrs, tuple(w for w in written if w in arrs), lambda a: pyattn.attention_with_kvcache(
        **a, return_lse=True, precision=prec)


def _matmul(dt, prec):
    rng = _rng(8)
    arrs = dict(a=_f(rng, (2, 9, 17), dt), b=_f(rng, (17, 11), dt))
    return arrs, (), lambda a: pyattn.matmul(a["a"], a["b"], precision=prec)


def _softmax(dt, prec):
    rng = _rng(9)
    arrs = dict(x=_f(rng, (2, 3, 5, 9), dt), attn_mask=rng.random((2, 1, 5, 9)) > 0.2)
    return arrs, (), lambda a: pyattn.softmax(a["x"], attn_mask=a["attn_mask"], is_causal=True)


def _softmax_backward(dt, prec):
    rng = _rng(10)
    y = pyattn.softmax(_f(rng, (2, 3, 9), dt))
    arrs = dict(grad_y=_f(rng, y.shape, dt), y=y)
    return arrs, (), lambda a: pyattn.softmax_backward(a["grad_y"], a["y"])


def _merge(dt, prec):
    rng = _rng(11)
    arrs = dict(outputs=_f(rng, (3, 2, 4, 5), dt), lses=_f(rng, (3, 2, 4), dt))
    return arrs, (), lambda a: pyattn.merge_attention(a["outputs"], a["lses"])


def _mha(dt, prec):
    rng = _rng(12)
    arrs = dict(query=_f(rng, (2, 5, 8), dt), key=_f(rng, (2, 7, 8), dt), value=_f(rng, (2, 7, 8), dt),
                w_q=_f(rng, (8, 8), dt), w_k=_f(rng, (8, 8), dt), w_v=_f(rng, (8, 8), dt), w_o=_f(rng, (8, 8), dt))
    return arrs, (), lambda a: pyattn.multi_head_attention(
        a["query"], a["key"], a["value"], 2, a["w_q"], a["w_k"], a["w_v"], a["w_o"])


def _quantize(dt, prec):
    rng = _rng(13)
    arrs = dict(x=_f(rng, (2, 3, 16), dt))
    return arrs, (), lambda a: pyattn.quantize(a["x"], prec, group_size=8)


def _dequantize(dt, prec):
    rng = _rng(14)
    q, s = pyattn.quantize(_f(rng, (2, 3, 16), F32), prec, group_size=8)
    arrs = dict(q=q, scale=s)
    return arrs, (), lambda a: pyattn.dequantize(a["q"], a["scale"], dtype=prec, group_size=8)


def _kvcache_attend(dt, prec):
    rng = _rng(15)
    arrs = dict(query=_f(rng, (2, 4, 2, 8), dt), key=_f(rng, (2, 2, 2, 8), dt), value=_f(rng, (2, 2, 2, 8), dt))

    def call(a):
        c = pyattn.KVCache(2, 2, 16, 8, dtype=dt)
        c.attend(*(_f(_rng(16), s, dt) for s in ((2, 4, 3, 8), (2, 2, 3, 8), (2, 2, 3, 8))))
        return c.attend(a["query"], a["key"], a["value"], return_lse=True, precision=prec), c.k, c.v
    return arrs, (), call


def _paged_attend(dt, prec):
    rng = _rng(17)
    arrs = dict(query=_f(rng, (2, 4, 2, 8), F32), key=_f(rng, (2, 2, 2, 8), F32), value=_f(rng, (2, 2, 2, 8), F32))

    def call(a):
        c = pyattn.PagedKVCache(8, 4, 2, 8, dtype=dt)
        s0 = c.add_sequence()
        c.attend([s0], *(_f(_rng(18), s, F32) for s in ((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8))))
        s1 = c.fork(s0)
        return c.attend([s0, s1], a["query"], a["key"], a["value"], return_lse=True, precision=prec)
    return arrs, (), call


FL = ("f32", "f16", "bf16", "f64")
HALF = ("f32", "f16", "bf16")
Q = ("f32", "f16", "bf16", "int8", "int4")
# (row id, builder, cache / operand dtypes, precisions)
ROWS = [
    ("sdpa", _sdpa, FL, (None, "bf16")),
    ("sdpa_decode", _sdpa_decode, FL, (None, "bf16")),
    ("sdpa_backward", _backward, ("f32", "f64", "f16"), (None,)),
    ("varlen", _varlen, FL, (None, "bf16")),
    ("varlen_backward", _varlen_backward, ("f32", "f64"), (None,)),
    ("kvcache_read", lambda d, p: _kvcache(d, p, new=False), FL + ("int8", "int4"), (None, "bf16")),
    ("kvcache_append", _kvcache, FL + ("int8", "int4"), (None, "bf16")),
    ("kvcache_rotary", lambda d, p: _kvcache(d, p, extra="rotary"), FL, (None, "bf16")),
    ("kvcache_leftpad_batch_idx", lambda d, p: _kvcache(d, p, extra="leftpad"), FL, (None, "bf16")),
    ("paged_read", lambda d, p: _paged(d, p, new=False), FL + ("int8", "int4"), (None, "bf16")),
    ("paged_append", _paged, FL + ("int8", "int4"), (None, "bf16")),
    ("packed_append", lambda d, p: _paged(d, p, extra="packed"), FL + ("int8", "int4"), (None, "bf16")),
    ("tree_append", lambda d, p: _paged(d, p, extra="tree"), FL + ("int8", "int4"), (None, "bf16")),
    ("matmul", _matmul, FL, (None, "bf16")),
    ("softmax", _softmax, FL, (None,)),
    ("softmax_backward", _softmax_backward, ("f32", "f64"), (None,)),
    ("merge_attention", _merge, ("f32", "f64", "f16"), (None,)),
    ("multi_head_attention", _mha, ("f32", "f64"), (None,)),
    ("quantize", _quantize, ("f32", "f16", "bf16", "f64"), ("int8", "int4")),
    ("dequantize", _dequantize, ("f32",), ("int8", "int4")),
    ("KVCache.attend", _kvcache_attend, HALF + ("f64",), (None, "bf16")),
    ("PagedKVCache.attend", _paged_attend, Q, (None, "bf16")),
]


def _valid(row, dt, prec):
    if prec == "bf16" and dt in ("f64", "int8", "int4"):
        return False            # refused by contract (precision="bf16": float32 and 16-bit only)
    return True


def _dt(name):
    return FLOATS.get(name, name)


def _cases():
    for rid, build, dts, precs in ROWS:
        for d, p in itertools.product(dts, precs):
            if not _valid(rid, d, p):
                continue
            arrs, _, _ = build(_dt(d), p)
            for name, kind in itertools.product(sorted(arrs), KINDS):
                if _applies(arrs[name], kind):
                    yield pytest.param(rid, d, p, name, kind, id=f"{rid}-{d}-{p}-{name}-{kind}")


def _flat(res):
    if isinstance(res, np.ndarray):
        return [res]
    if isinstance(res, (tuple, list)):
        return [x for r in res for x in _flat(r)]
    return [np.asarray(res)]


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype.newbyteorder("=") == b.dtype.newbyteorder("=")
    if a.dtype.kind == "V":     # bfloat16: its bits
        a, b = a.view(np.uint16), b.view(np.uint16)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rid,d,prec,name,kind", list(_cases()))
def test_layout_gives_the_same_bits(rid, d, prec, name, kind):
    build = {r[0]: r[1] for r in ROWS}[rid]
    base, written, call = build(_dt(d), prec)
    numbers, view = layout(base[name], kind)
    ref_args = {k: (numbers if k == name else v).copy() for k, v in base.items()}
    args = {k: (view if k == name else v.copy()) for k, v in base.items()}
    try:
        want = call(ref_args)
    except (ValueError, TypeError, NotImplementedError) as e:
        # the numbers themselves are refused (e.g. a broadcast table): so must the view be
        with pytest.raises(type(e)):
            call(args)
        return
    cannot_write = name in written and kind in ("zero", "readonly")
    before = {k: np.array(args[k], copy=True) for k in written if k != name}
    if cannot_write:
        with pytest.raises((ValueError, TypeError)) as ei:
            call(args)
        assert name in str(ei.value), f"the error does not name {name}: {ei.value}"
        for k, v in before.items():
            _same(args[k], v)                       # nothing written
        return
    try:
        got = call(args)
    except (ValueError, TypeError) as e:
        # a written array in a layout that cannot be written in place (unaligned,
        # byte-swapped) may be refused: clearly, naming it, writing nothing
        if not (name in written and kind in ("unaligned", "bigendian")):
            raise
        assert name in str(e), f"the error does not name {name}: {e}"
        for k, v in before.items():
            _same(args[k], v)
        return
    for g, w in zip(_flat(got), _flat(want), strict=True):
        _same(g, w)
    for k in written:
        _same(args[k], ref_args[k])                 # the same numbers written
