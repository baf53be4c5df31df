"""The property grid of the dense entry points
(test_properties_product.py) extended to every wave-3 entry point: varlen
(forward, backward, vjp), paged caches, packed mixed batches, tree masks,
quantized caches, block masks, rotary / cache_leftpad / cache_batch_idx,
``pyattn.flash`` and ``pyattn.torch``: storage dtype x NaN/inf placement x
precision x path (tiled, decode rows, split decode), with

- the dense twin of each call checked against the float64 oracle and the NaN
  rule exactly as test_properties_product checks it (``check_cache_result`` /
  ``check_forward``);
- the wave-3 entry point equal to that dense twin **bit for bit** (API.md: a
  row's result does not depend on the batch it was computed in, nor on how
  the cache is laid out), the caches it writes included -- quantized caches
  are attention over ``dequantize(cache)`` to float32 tolerance instead;
- results independent of the thread count (1 and 2 threads, bit for bit);
- nothing written on an error: every allocation of the writing entry points
  made to fail in turn (test_allocation_failures's sweep).

The hypothesis profile is bounded and derandomized (reproducible in CI).
"""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

import pyattn  # noqa: E402
from conftest import examples  # noqa: E402
from test_properties_product import (  # noqa: E402
    DT, admissible, cache_case, check_cache_result, check_forward, paths, places, poison, poisons,
    seeds, sizes, storage)
from test_properties_product import profile as _profile  # noqa: E402


def profile(n):
    """test_properties_product's bounded, derandomized profile; n scaled by PYATTN_EXAMPLES."""
    return _profile(examples(n))
from test_allocation_failures import _sweep  # noqa: E402

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

precisions = st.sampled_from(["highest", "bf16"])


def same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
    assert np.array_equal(a, b, equal_nan=True), f"{what}: differs at {np.argwhere(~((a == b) | (np.isnan(a) & np.isnan(b))))[:4].tolist()}"


def threads(call):
    """call() on 1 and on 2 threads: the same bits; returns the result."""
    n0 = pyattn.get_num_threads()
    try:
        pyattn.set_num_threads(1)
        with np.errstate(all="ignore"):
            r1 = call()
        pyattn.set_num_threads(2)
        with np.errstate(all="ignore"):
            r2 = call()
    finally:
        pyattn.set_num_threads(n0)
    for i, (a, b) in enumerate(zip(r1 if isinstance(r1, tuple) else (r1,), r2 if isinstance(r2, tuple) else (r2,))):
        same(a, b, f"result {i}: 1 thread vs 2")
    return r1


def to_pool(rng, cache, bs, spare=2, table=None):
    """A (B, Hkv, S_max, D) cache as a shuffled pool of bs-row blocks and its
    block table (B, ceil(S_max / bs)), or laid out by the given table (the
    other operands of one call); the pool's other rows hold garbage."""
    B, H, S, D = cache.shape
    nb = -(-S // bs)
    pool = rng.standard_normal((B * nb + spare, H, bs, D)).astype(cache.dtype)
    if table is None:
        table = rng.permutation(B * nb + spare)[:B * nb].reshape(B, nb).astype(np.int32)
    for b in range(B):
        for j in range(nb):
            rows = cache[b, :, j * bs:(j + 1) * bs]
            pool[table[b, j], :, :rows.shape[1]] = rows
    return pool, table


def from_pool(pool, table, S):
    B, nb = table.shape
    return np.stack([np.concatenate([pool[table[b, j]] for j in range(nb)], axis=1)[:, :S] for b in range(B)])


def dense_cache_call(c, dt, precision, new):
    """The v3 kvcache product's call (checked against the oracle here): returns
    the caches as the call left them, the new rows, the query, and (out, lse)."""
    T, n = c["T"], c["n"]
    ks, vs = c["kc"].astype(dt), c["vc"].astype(dt)
    kc0, vc0 = ks.copy(), vs.copy()
    key = value = None
    if new:
        key = np.stack([ks[b, :, n[b]:n[b] + T] for b in range(c["B"])])
        value = np.stack([vs[b, :, n[b]:n[b] + T] for b in range(c["B"])])
        for b in range(c["B"]):
            kc0[b, :, n[b]:n[b] + T] = 0
            vc0[b, :, n[b]:n[b] + T] = 0
    qs = c["q"].astype(dt)
    kcache, vcache = kc0.copy(), vc0.copy()
    with np.errstate(all="ignore"):
        out, lse = pyattn.attention_with_kvcache(qs, kcache, vcache, key, value, cache_seqlens=n,
                                                 window=c["window"], return_lse=True, precision=precision)
    check_cache_result(out, lse, c, dt, precision)
    return dict(kc0=kc0, vc0=vc0, kc=kcache, vc=vcache, key=key, value=value, q=qs, out=out, lse=lse)


def skip_f64_bf16(dt, precision):
    if precision == "bf16" and dt == np.float64:
        hypothesis.assume(False)


# -- paged caches, packed mixed batches, tree masks ----------------------------------------

@profile(40)
@given(seed=seeds, sname=storage, path=paths, place=places, value=poisons, precision=precisions,
       new=st.booleans(), bs=st.sampled_from([1, 3, 16, 64]), form=st.sampled_from(["paged", "packed", "tree"]))
def test_paged_packed_tree_product(seed, sname, path, place, value, precision, new, bs, form):
    """paged / packed (mixed T_b) / tree-mask calls equal the dense cache call bit for bit,
    write the same rows into the pool, and do not depend on the thread count."""
    dt = DT[sname]
    skip_f64_bf16(dt, precision)
    rng = np.random.default_rng(seed)
    if form == "tree":                     # a tree mask attends over its new rows: causal, no window
        new = True
    c = cache_case(rng, path, dt, place, value, new)
    if form == "tree":
        c["window"] = None
        c["A"] = np.broadcast_to(
            admissible(c["T"], c["S_max"], True, None, None, c["length"] - c["T"])[:, None]
            & (np.arange(c["S_max"]) < c["length"][:, None, None, None]), c["A"].shape)
    d = dense_cache_call(c, dt, precision, new)
    B, T, n, S_max = c["B"], c["T"], c["n"], c["S_max"]
    kp, table = to_pool(rng, d["kc0"], bs)
    vp, _ = to_pool(np.random.default_rng(seed), d["vc0"], bs, table=table)
    kw = dict(cache_seqlens=n, block_table=table, window=c["window"], return_lse=True, precision=precision)
    if form == "packed":
        Ts = np.full(B, T) if new else rng.integers(0, T + 1, size=B)      # mixed: the last T_b rows
        cu = np.concatenate([[0], np.cumsum(Ts)]).astype(np.int32)
        q = np.concatenate([d["q"][b, :, T - Ts[b]:].transpose(1, 0, 2) for b in range(B)])
        key = value = None
        if new:
            key = np.concatenate([d["key"][b].transpose(1, 0, 2) for b in range(B)])
            value = np.concatenate([d["value"][b].transpose(1, 0, 2) for b in range(B)])

        def call():
            k2, v2 = kp.copy(), vp.copy()
            o, lse = pyattn.attention_with_kvcache(q, k2, v2, key, value, cu_seqlens_q=cu, **kw)
            return o, lse, k2, v2
        o, lse, k2, v2 = threads(call)
        for b in range(B):
            same(o[cu[b]:cu[b + 1]].transpose(1, 0, 2), d["out"][b, :, T - Ts[b]:], f"out of sequence {b}")
            same(lse[cu[b]:cu[b + 1]].T, d["lse"][b, :, T - Ts[b]:], f"lse of sequence {b}")
    else:
        if form == "tree":
            kw["tree_mask"] = np.tril(np.ones((T, T), bool))[None, None]

        def call():
            k2, v2 = kp.copy(), vp.copy()
            o, lse = pyattn.attention_with_kvcache(d["q"], k2, v2, d["key"], d["value"], **kw)
            return o, lse, k2, v2
        o, lse, k2, v2 = threads(call)
        same(o, d["out"], "out")
        same(lse, d["lse"], "lse")
    same(from_pool(k2, table, S_max), d["kc"], "k pool rows")
    same(from_pool(v2, table, S_max), d["vc"], "v pool rows")


# -- quantized caches --------------------------------------------------------------------

@profile(30)
@given(seed=seeds, path=paths, place=st.sampled_from(["none", "query"]), value=poisons,
       qdt=st.sampled_from(["int8", "int4"]), new=st.booleans(), paged=st.booleans())
def test_quantized_cache_product(seed, path, place, value, qdt, new, paged):
    """int8 / int4 caches: attention over dequantize(cache) (the oracle and NaN rule,
    to float32 tolerance); the rows written are quantize()'s; thread count free."""
    rng = np.random.default_rng(seed)
    c = cache_case(rng, path, np.float32, "none", value, new)
    if c["E"] % 2 or c["Ev"] % 2 or c["E"] == 0:
        hypothesis.assume(False)
    if place == "query":
        poison(rng, c["q"], c["kc"], c["vc"], c["A"], "query", value)
    g = 2 if min(c["E"], c["Ev"]) % 4 else 4
    T, n, B = c["T"], c["n"], c["B"]
    kq, ks = pyattn.quantize(c["kc"].astype(np.float32), qdt, group_size=g)
    vq, vs = pyattn.quantize(c["vc"].astype(np.float32), qdt, group_size=g)
    key = value_ = None
    if new:                                 # new rows as float32: quantized as they are written
        key = np.stack([c["kc"][b, :, n[b]:n[b] + T] for b in range(B)]).astype(np.float32)
        value_ = np.stack([c["vc"][b, :, n[b]:n[b] + T] for b in range(B)]).astype(np.float32)
    kw = dict(cache_seqlens=n, window=c["window"], return_lse=True)
    arrs = [kq, vq, ks, vs]
    if paged:                               # one table for the four pools
        kw["block_table"] = to_pool(np.random.default_rng(seed), kq, 4)[1]
        arrs = [to_pool(np.random.default_rng(seed), a, 4, table=kw["block_table"])[0] for a in arrs]

    def call():
        w = [a.copy() for a in arrs]
        o, lse = pyattn.attention_with_kvcache(c["q"].astype(np.float32), w[0], w[1], key, value_,
                                               k_scale=w[2], v_scale=w[3], **kw)
        return (o, lse) + tuple(w)
    o, lse, *w = threads(call)
    if paged:
        w = [from_pool(a, kw["block_table"], c["S_max"]) for a in w]
    kd = pyattn.dequantize(w[0], w[2], dtype=qdt, group_size=g)
    vd = pyattn.dequantize(w[1], w[3], dtype=qdt, group_size=g)
    if new:                                 # the written rows are quantize()'s of the new rows
        kn, ksn = pyattn.quantize(key, qdt, group_size=g)
        for b in range(B):
            same(w[0][b, :, n[b]:n[b] + T], kn[b], "written key rows")
            same(w[2][b, :, n[b]:n[b] + T], ksn[b], "written key scales")
    cq = dict(c, kc=kd.astype(np.float64), vc=vd.astype(np.float64))
    check_cache_result(o, lse, cq, np.dtype(np.float32), "highest")


# -- rotary, cache_leftpad, cache_batch_idx ------------------------------------------------

@profile(30)
@given(seed=seeds, sname=storage, path=st.sampled_from(["tiled", "rows"]), place=places, value=poisons,
       precision=precisions, opt=st.sampled_from(["rotary", "leftpad", "batch_idx"]))
def test_rotary_leftpad_batch_idx_product(seed, sname, path, place, value, precision, opt):
    """rotary = the dense call on queries and keys rotated first; leftpad = the dense call
    on the caches from the pad on (positions shift alike); batch_idx = the dense call on
    the caches in that order: bit for bit, caches written alike, thread count free."""
    dt = DT[sname]
    skip_f64_bf16(dt, precision)
    rng = np.random.default_rng(seed)
    c = cache_case(rng, path, dt, place, value, True)
    d = dense_cache_call(c, dt, precision, True)
    B, T, n = c["B"], c["T"], c["n"]
    kw = dict(window=c["window"], return_lse=True, precision=precision)
    if opt == "rotary":
        from pyattn import _kvextra
        E = c["E"]
        if E < 2:
            hypothesis.assume(False)
        cd = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
        half = int(rng.integers(1, E // 2 + 1))
        R = int(n.max()) + T
        cos = rng.standard_normal((R, half)).astype(cd)
        sin = rng.standard_normal((R, half)).astype(cd)
        il = bool(rng.integers(2))
        pos = n[:, None] + np.arange(T)
        qr = _kvextra.rotate_rows(d["q"], pos, cos, sin, il, cd)
        kr = _kvextra.rotate_rows(d["key"], pos, cos, sin, il, cd)

        def call():
            k2, v2 = d["kc0"].copy(), d["vc0"].copy()
            o, lse = pyattn.attention_with_kvcache(d["q"], k2, v2, d["key"], d["value"], cache_seqlens=n,
                                                   rotary_cos=cos, rotary_sin=sin, rotary_interleaved=il, **kw)
            return o, lse, k2, v2
        o, lse, k2, v2 = threads(call)
        k3, v3 = d["kc0"].copy(), d["vc0"].copy()
        with np.errstate(all="ignore"):
            want, wl = pyattn.attention_with_kvcache(qr, k3, v3, kr.astype(dt), d["value"], cache_seqlens=n, **kw)
        same(o, want, "out")
        same(lse, wl, "lse")
        same(k2, k3, "k_cache")
        same(v2, v3, "v_cache")
        return
    if opt == "leftpad":
        pad = np.array([int(rng.integers(0, m + 1)) for m in n])

        def call():
            k2, v2 = d["kc0"].copy(), d["vc0"].copy()
            o, lse = pyattn.attention_with_kvcache(d["q"], k2, v2, d["key"], d["value"], cache_seqlens=n,
                                                   cache_leftpad=pad, **kw)
            return o, lse, k2, v2
        o, lse, k2, v2 = threads(call)
        for b in range(B):
            p = pad[b]
            k3, v3 = d["kc0"][b:b + 1].copy(), d["vc0"][b:b + 1].copy()
            with np.errstate(all="ignore"):
                want, wl = pyattn.attention_with_kvcache(d["q"][b:b + 1], k3[:, :, p:], v3[:, :, p:],
                                                         d["key"][b:b + 1], d["value"][b:b + 1],
                                                         cache_seqlens=int(n[b]) - p, **kw)
            same(o[b:b + 1], want, f"out of sequence {b}")
            same(lse[b:b + 1], wl, f"lse of sequence {b}")
            same(k2[b:b + 1], k3, f"k_cache of sequence {b}")
        return
    idx = rng.permutation(B)                 # sequence b reads and writes cache entry idx[b]
    inv = np.argsort(idx)

    def call():
        k2, v2 = d["kc0"][inv].copy(), d["vc0"][inv].copy()
        o, lse = pyattn.attention_with_kvcache(d["q"], k2, v2, d["key"], d["value"], cache_seqlens=n,
                                               cache_batch_idx=idx, **kw)
        return o, lse, k2, v2
    o, lse, k2, v2 = threads(call)
    same(o, d["out"], "out")
    same(lse, d["lse"], "lse")
    same(k2[idx], d["kc"], "k_cache")
    same(v2[idx], d["vc"], "v_cache")


# -- varlen: forward, backward, vjp; block masks --------------------------------------------

def varlen_case(rng, path, dt, place, value):
    B, Hkv, g, L, S, E, Ev = sizes(rng, path)
    B = int(rng.integers(1, 4))
    H = Hkv * g
    Ls = rng.integers(0 if path != "tiled" else 9, L + 1, size=B)
    Ss = rng.integers(0, S + 1, size=B)
    causal = bool(rng.integers(2))
    seqs = []
    for b in range(B):
        q = rng.standard_normal((1, H, Ls[b], E))
        k = rng.standard_normal((1, Hkv, Ss[b], E))
        v = rng.standard_normal((1, Hkv, Ss[b], Ev))
        A = np.broadcast_to(admissible(Ls[b], Ss[b], causal, None, None, 0), (1, H, Ls[b], Ss[b]))
        if b == 0:
            poison(rng, q, k, v, A, place, value)
        seqs.append((q.astype(dt), k.astype(dt), v.astype(dt)))
    cq = np.concatenate([[0], np.cumsum(Ls)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(Ss)]).astype(np.int64)
    pack = lambda i, D, h: np.concatenate([s[i][0].transpose(1, 0, 2) for s in seqs]) if seqs else \
        np.zeros((0, h, D), dt)  # noqa: E731
    return seqs, cq, ck, causal, g, (pack(0, E, H), pack(1, E, Hkv), pack(2, Ev, Hkv))


@profile(30)
@given(seed=seeds, sname=storage, path=paths, place=places, value=poisons, precision=precisions)
def test_varlen_product(seed, sname, path, place, value, precision):
    """varlen forward, backward and vjp = the dense calls of each sequence bit for bit
    (the dense forward checked against the oracle and the NaN rule); thread count free."""
    dt = DT[sname]
    skip_f64_bf16(dt, precision)
    rng = np.random.default_rng(seed)
    seqs, cq, ck, causal, g, (q, k, v) = varlen_case(rng, path, dt, place, value)
    kw = dict(is_causal=causal, enable_gqa=g > 1)
    o, lse = threads(lambda: pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, return_lse=True,
                                                                        precision=precision, **kw))
    cd = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    for b, (qb, kb, vb) in enumerate(seqs):
        with np.errstate(all="ignore"):
            ob, lb = pyattn.scaled_dot_product_attention(qb, kb, vb, return_lse=True, precision=precision, **kw)
        same(o[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None], ob, f"out of sequence {b}")
        same(lse[cq[b]:cq[b + 1]].T[None], lb, f"lse of sequence {b}")
        A = np.broadcast_to(admissible(qb.shape[2], kb.shape[2], causal, None, None, 0), ob.shape[:-1] + (kb.shape[2],))
        check_forward(ob, lb, *(x.astype(cd) for x in (qb, kb, vb)), dict(is_causal=causal), precision, g, A, cd)
    if precision == "bf16":
        return
    go = rng.standard_normal(o.shape).astype(o.dtype)
    grads = threads(lambda: pyattn.scaled_dot_product_attention_varlen_backward(go, q, k, v, o, lse, cq, ck, **kw))
    out2, bwd = pyattn.scaled_dot_product_attention_varlen_vjp(q, k, v, cq, ck, **kw)
    same(out2, o, "vjp's out")
    with np.errstate(all="ignore"):
        for a, b_ in zip(bwd(go), grads):
            same(a, b_, "vjp's gradients")
    for b, (qb, kb, vb) in enumerate(seqs):
        with np.errstate(all="ignore"):
            ob, lb = pyattn.scaled_dot_product_attention(qb, kb, vb, return_lse=True, **kw)
            gb = pyattn.scaled_dot_product_attention_backward(
                go[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None], qb, kb, vb, ob, lb, **kw)
        for name, x, y, cu in zip(("grad_query", "grad_key", "grad_value"), grads, gb, (cq, ck, ck)):
            same(x[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None], y, f"{name} of sequence {b}")


@profile(25)
@given(seed=seeds, sname=storage, path=st.sampled_from(["tiled", "rows"]), place=places, value=poisons,
       precision=precisions)
def test_block_mask_product(seed, sname, path, place, value, precision):
    """A BlockMask from a mask_mod = the same bool mask given densely (forward, and the
    backward at the default precision): the oracle through the dense call; thread count free."""
    dt = DT[sname]
    skip_f64_bf16(dt, precision)
    rng = np.random.default_rng(seed)
    B, Hkv, g, L, S, E, Ev = sizes(rng, path)
    H = Hkv * g
    q, k, v = rng.standard_normal((B, H, L, E)), rng.standard_normal((B, Hkv, S, E)), rng.standard_normal((B, Hkv, S, Ev))
    period, shift = int(rng.integers(2, 9)), int(rng.integers(0, 5))
    mod = lambda b, h, i, j: ((i // period) >= (j // period)) | ((j + shift) % 3 == 0)  # noqa: E731
    bm = pyattn.BlockMask.from_mask_mod(mod, None, None, L, S)
    mask = np.asarray(mod(0, 0, np.arange(L)[:, None], np.arange(S)[None, :]))
    A = np.broadcast_to(mask, (B, H, L, S))
    poison(rng, q, k, v, A, place, value)
    qs, ks, vs = q.astype(dt), k.astype(dt), v.astype(dt)
    kw = dict(enable_gqa=g > 1)
    o, lse = threads(lambda: pyattn.scaled_dot_product_attention(qs, ks, vs, block_mask=bm, return_lse=True,
                                                                 precision=precision, **kw))
    with np.errstate(all="ignore"):
        od, ld = pyattn.scaled_dot_product_attention(qs, ks, vs, mask, return_lse=True, precision=precision, **kw)
    cd = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    check_forward(od, ld, *(x.astype(dt).astype(cd) for x in (q, k, v)), dict(attn_mask=mask), precision, g, A, cd)
    # the block mask skips whole tiles the dense mask also hides: the same rows, to float32 rounding
    fin = ~np.isnan(od)
    assert np.array_equal(np.isnan(o), np.isnan(od)), "NaN elsewhere than the dense mask's call"
    np.testing.assert_allclose(o[fin], od[fin], rtol=2e-6 if cd == np.float32 else 1e-13,
                               atol=2e-6 if cd == np.float32 else 1e-13)


# -- pyattn.flash and pyattn.torch -----------------------------------------------------------

@pytest.mark.nosan                # PyTorch: outside the sanitizers, as its other comparisons
@profile(25)
@given(seed=seeds, sname=st.sampled_from(["float32", "float16", "float64"]), path=paths, place=places,
       value=poisons, api=st.sampled_from(["flash_func", "flash_kvcache", "torch_sdpa"]))
def test_flash_and_torch_product(seed, sname, path, place, value, api):
    """pyattn.flash and pyattn.torch give the NumPy entry points' bits on the same numbers."""
    torch = pytest.importorskip("torch")
    import pyattn.flash as F
    import pyattn.torch as PT
    dt = DT[sname]
    rng = np.random.default_rng(seed)
    if api == "flash_kvcache":
        c = cache_case(rng, path, dt, place, value, True)
        d = dense_cache_call(c, dt, "highest", True)
        kc, vc = torch.from_numpy(d["kc0"].transpose(0, 2, 1, 3).copy()), torch.from_numpy(d["vc0"].transpose(0, 2, 1, 3).copy())
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))  # noqa: E731
        win = c["window"]
        fw = (-1, -1) if win is None else tuple(-1 if w is None or w >= 2**62 else w for w in win)
        if fw[0] < 0 and win is not None and win[0] is not None and win[0] < 2**62:
            hypothesis.assume(False)
        with np.errstate(all="ignore"):
            o, lse = F.flash_attn_with_kvcache(t(d["q"]), kc, vc, t(d["key"]), t(d["value"]),
                                               cache_seqlens=torch.from_numpy(np.asarray(c["n"], np.int32)),
                                               causal=True, window_size=fw, return_softmax_lse=True)
        if win is not None and win[1] is not None and win[1] < 2**62 and win[1] > 0:
            pass                                          # FlashAttention's causal right side is 0
        with np.errstate(all="ignore"):
            k3, v3 = d["kc0"].copy(), d["vc0"].copy()
            want = pyattn.attention_with_kvcache(d["q"], k3, v3, d["key"], d["value"], cache_seqlens=c["n"],
                                                 window=None if fw == (-1, -1) else (
                                                     None if fw[0] < 0 else fw[0], 0))
        same(o.numpy().transpose(0, 2, 1, 3), want.astype(o.numpy().dtype), "out")
        same(kc.numpy().transpose(0, 2, 1, 3), k3, "k_cache")
        return
    B, Hkv, g, L, S, E, Ev = sizes(rng, path)
    if E == 0:
        hypothesis.assume(False)
    H = Hkv * g
    q, k, v = rng.standard_normal((B, H, L, E)), rng.standard_normal((B, Hkv, S, E)), rng.standard_normal((B, Hkv, S, Ev))
    causal = bool(rng.integers(2))
    A = np.broadcast_to(admissible(L, S, causal, None, None, 0), (B, H, L, S))
    poison(rng, q, k, v, A, place, value)
    qs, ks, vs = q.astype(dt), k.astype(dt), v.astype(dt)
    with np.errstate(all="ignore"):
        want = pyattn.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=g > 1)
    if api == "torch_sdpa":
        with np.errstate(all="ignore"):
            got = PT.scaled_dot_product_attention(torch.from_numpy(qs), torch.from_numpy(ks), torch.from_numpy(vs),
                                                  is_causal=causal, enable_gqa=g > 1).numpy()
    else:
        if Ev != E:
            hypothesis.assume(False)
        tt = lambda a: torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))  # noqa: E731
        if causal and L > S:                              # FlashAttention's causal is bottom-right
            hypothesis.assume(False)
        with np.errstate(all="ignore"):
            got = F.flash_attn_func(tt(qs), tt(ks), tt(vs), causal=causal).numpy().transpose(0, 2, 1, 3)
            want = pyattn.scaled_dot_product_attention(qs, ks, vs, is_causal="bottom_right" if causal else False,
                                                       enable_gqa=g > 1)
    same(got, want.astype(got.dtype), api)


# -- nothing written on an error: every allocation of the writing entry points ----------------

def _write_case(kind, dt=np.float32):
    rng = np.random.default_rng(21)
    B, H, S, E, T = 2, 2, 24, 8, 3
    q = rng.standard_normal((B, 4, T, E)).astype(np.float32)
    k = rng.standard_normal((B, H, T, E)).astype(np.float32)
    v = rng.standard_normal((B, H, T, E)).astype(np.float32)
    n = np.array([4, 9])
    if kind in ("int8", "int4"):
        kc, ks = pyattn.quantize(rng.standard_normal((B, H, S, E)).astype(np.float32), kind, group_size=4)
        vc, vs = pyattn.quantize(rng.standard_normal((B, H, S, E)).astype(np.float32), kind, group_size=4)
        return (kc, vc, ks, vs), lambda: pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=n,
                                                                        k_scale=ks, v_scale=vs, return_lse=True)
    kc = rng.standard_normal((B, H, S, E)).astype(dt)
    vc = rng.standard_normal((B, H, S, E)).astype(dt)
    if kind == "rotary":
        cos, sin = rng.random((40, 4)).astype(np.float32), rng.random((40, 4)).astype(np.float32)
        return (kc, vc), lambda: pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=n, rotary_cos=cos,
                                                                rotary_sin=sin, return_lse=True)
    if kind == "leftpad":
        return (kc, vc), lambda: pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=n,
                                                                cache_leftpad=[1, 2], cache_batch_idx=[1, 0])
    kp, table = to_pool(rng, kc, 4)
    vp, _ = to_pool(np.random.default_rng(21), vc, 4, table=table)
    if kind == "paged":
        return (kp, vp), lambda: pyattn.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=n, block_table=table)
    if kind == "tree":
        tm = np.tril(np.ones((T, T), bool))[None, None]
        return (kp, vp), lambda: pyattn.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=n, block_table=table,
                                                                tree_mask=tm)
    cu = np.array([0, 1, 3], np.int32)                   # packed, mixed T_b
    qp, kn, vn = q[:, :, 0][[0, 0, 1]], k[:, :, 0][[0, 0, 1]], v[:, :, 0][[0, 0, 1]]
    return (kp, vp), lambda: pyattn.attention_with_kvcache(qp, kp, vp, kn, vn, cache_seqlens=n, block_table=table,
                                                            cu_seqlens_q=cu)


@pytest.mark.parametrize("kind", ["paged", "packed", "tree", "int8", "int4", "rotary", "leftpad"])
def test_writing_entry_points_write_nothing_on_allocation_failure(kind):
    watched, call = _write_case(kind)
    assert _sweep(call, watched) >= 1



def test_paged_kvcache_attend_writes_nothing_on_allocation_failure():
    c = pyattn.PagedKVCache(16, 4, 2, 8, dtype="int8", group_size=4)
    s0 = c.add_sequence()
    rng = np.random.default_rng(22)
    c.attend([s0], rng.standard_normal((1, 4, 5, 8)).astype(np.float32),
             *rng.standard_normal((2, 1, 2, 5, 8)).astype(np.float32))
    s1 = c.fork(s0)
    q = rng.standard_normal((2, 4, 2, 8)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 2, 2, 8)).astype(np.float32)
    free0 = c.blocks_free
    lens0 = (c.length(s0), c.length(s1))
    watched = [a for a in vars(c).values() if isinstance(a, np.ndarray)]
    _sweep(lambda: c.attend([s0, s1], q, k, v), watched)
    assert c.blocks_free <= free0 and (c.length(s0), c.length(s1)) == (lens0[0] + 2, lens0[1] + 2)

