"""Paged int8 / int4 caches (API.md, "Quantized KV caches" with "Paged and
mixed-length KV caches"): attention_with_kvcache(block_table=, k_scale=,
v_scale=) over quantized pools and their scale pools equals the contiguous
quantized cache bit for bit (rows path and tiled path, any block size, random
tables), new rows are quantized into their pages and nothing else changes,
errors write nothing, and PagedKVCache(dtype="int8" | "int4") forks and
copies on write with its scales."""
import numpy as np
import pytest

import pyattn
from pyattn import _C
from pyattn import _reference as R

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def qcache(rng, B, H, S, E, dtype, G):
    """an int8 / int4 cache (B, H, S, .) and its scales, from normal values"""
    return pyattn.quantize(rng.standard_normal((B, H, S, E)).astype(np.float32), dtype, group_size=G)


def to_pools(arrs, bs, rng, extra=3):
    """Contiguous caches (B, H, S, .) (values and scales alike) as pools of
    blocks in one random order, unused blocks filled with noise; the table."""
    B, H, S = arrs[0].shape[:3]
    nb = S // bs
    N = B * nb + extra
    table = rng.permutation(N)[:B * nb].reshape(B, nb)
    pools = []
    for a in arrs:
        noise = rng.integers(0, 255, (N, H, bs) + a.shape[3:], np.uint8)
        pool = noise.view(np.int8) if a.dtype == np.int8 else noise.astype(a.dtype)
        pool = np.ascontiguousarray(pool)
        for b in range(B):
            for i in range(nb):
                pool[table[b, i]] = a[b, :, i * bs:(i + 1) * bs]
        pools.append(pool)
    return pools, table


def rows_of(pool, row, n):
    """the first n logical rows of one sequence of a pool: (H, n, .)"""
    bs = pool.shape[2]
    return np.concatenate([pool[row[i]] for i in range(-(-n // bs))], axis=1)[:, :n]


@pytest.mark.parametrize("kdt,vdt", [("int8", "int8"), ("int4", "int4"), ("int8", "int4"), ("int4", None)])
@pytest.mark.parametrize("bs", [1, 16, 256])
@pytest.mark.parametrize("T,new", [(1, True), (1, False), (12, True), (3, False)])
def test_paged_equals_contiguous(kdt, vdt, bs, T, new):
    rng = np.random.default_rng(bs + 7 * T + (3 if new else 0) + (1 if kdt == "int4" else 0))
    B, Hq, Hkv, E, Ev, S = 3, 4, 2, 32, 16, 512
    kc, ks = qcache(rng, B, Hkv, S, E, kdt, 16)
    if vdt is None:                                  # a float32 value cache beside an int4 key cache
        vc, vs = rng.standard_normal((B, Hkv, S, Ev)).astype(np.float32), None
    else:
        vc, vs = qcache(rng, B, Hkv, S, Ev, vdt, 8)
    n = np.array([37, 256 - T, 480]) if new else np.array([37, 256, 500])
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    kn = vn = None
    if new:
        kn, vn = (rng.standard_normal((B, Hkv, T, D)).astype(np.float32) for D in (E, Ev))
    arrs = [x for x in (kc, vc, ks, vs) if x is not None]
    pools, tab = to_pools(arrs, bs, rng)
    kp, vp, ksp = pools[:3]
    vsp = pools[3] if vs is not None else None
    before = [p.copy() for p in pools]
    ref = pyattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=n, return_lse=True,
                                       k_scale=ks, v_scale=vs)
    got = pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab,
                                       return_lse=True, k_scale=ksp, v_scale=vsp)
    same_bits(got[0], ref[0])
    same_bits(got[1], ref[1])
    # only the asked rows changed: each pool is its old self with the new
    # rows of the contiguous cache (values and scales) put in their pages
    for pool, old, c in zip(pools, before, arrs):
        want = old.copy()
        if new:
            for b in range(B):
                for r in range(n[b], n[b] + T):
                    want[tab[b, r // bs], :, r % bs] = c[b, :, r]
        same_bits(pool, want)


def test_tiled_and_rows_paths_with_options():
    """prefill (the tiled path's gathered, dequantized tiles) and decode with
    GQA, a window, ALiBi, softcap and sinks: the contiguous cache's bits"""
    rng = np.random.default_rng(5)
    B, Hq, Hkv, E, S, bs = 2, 8, 2, 64, 384, 32
    kc, ks = qcache(rng, B, Hkv, S, E, "int4", 32)
    vc, vs = qcache(rng, B, Hkv, S, E, "int8", 16)
    (kp, vp, ksp, vsp), tab = to_pools([kc, vc, ks, vs], bs, rng)
    n = np.array([300, 171])
    for T, kw in ((40, dict(window=(50, 0))), (1, dict(alibi_slopes=rng.uniform(0.01, 0.2, Hq))),
                  (9, dict(softcap=4.0, sinks=rng.standard_normal(Hq))), (20, dict(is_causal=False))):
        q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
        ref = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs, **kw)
        got = pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=n, block_table=tab, k_scale=ksp,
                                           v_scale=vsp, **kw)
        same_bits(got, ref)


@pytest.mark.parametrize("paged", [True, False])
def test_packed_sequences_equal_one_call_each(paged):
    """cu_seqlens_q: sequences bringing 1, 0, 7 and 3 tokens (one kernel call
    per count) give each sequence's own contiguous call's bits; over pools,
    or over the contiguous caches themselves (no block_table)"""
    rng = np.random.default_rng(8)
    B, Hq, Hkv, E, S, bs = 4, 4, 2, 32, 64, 8
    kc, ks = qcache(rng, B, Hkv, S, E, "int8", 32)
    vc, vs = qcache(rng, B, Hkv, S, E, "int4", 32)
    if paged:
        (kp, vp, ksp, vsp), tab = to_pools([kc, vc, ks, vs], bs, rng)
    else:                                                # one block of S rows per sequence
        (kp, vp, ksp, vsp), tab = [x.copy() for x in (kc, vc, ks, vs)], np.arange(B)[:, None]
    Ts = np.array([1, 0, 7, 3])
    cu = np.concatenate([[0], np.cumsum(Ts)])
    n = np.array([10, 20, 40, 63 - 3])
    q = rng.standard_normal((cu[-1], Hq, E)).astype(np.float32)
    kn, vn = rng.standard_normal((2, cu[-1], Hkv, E)).astype(np.float32)
    got = pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab if paged else None,
                                       cu_seqlens_q=cu, k_scale=ksp, v_scale=vsp)
    for b in range(B):
        if not Ts[b]:
            continue
        sl = slice(cu[b], cu[b + 1])
        caches = [x[b:b + 1].copy() for x in (kc, vc, ks, vs)]
        one = pyattn.attention_with_kvcache(q[None, sl].transpose(0, 2, 1, 3), caches[0], caches[1],
                                           kn[None, sl].transpose(0, 2, 1, 3), vn[None, sl].transpose(0, 2, 1, 3),
                                           cache_seqlens=n[b:b + 1], k_scale=caches[2], v_scale=caches[3])
        same_bits(got[sl], one[0].transpose(1, 0, 2))
        for pool, c in zip((kp, vp, ksp, vsp), caches):   # the pages hold the contiguous rows
            same_bits(rows_of(pool, tab[b], n[b] + Ts[b]), c[0, :, :n[b] + Ts[b]])


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_paged_kvcache_fork_and_copy_on_write(dtype):
    rng = np.random.default_rng(3)
    H, Hq, E, bs = 2, 4, 32, 4
    cache = pyattn.PagedKVCache(num_blocks=12, block_size=bs, num_kv_heads=H, head_dim=E, dtype=dtype,
                                group_size=16)
    assert cache.k.dtype == (np.int8 if dtype == "int8" else np.uint8)
    assert cache.k.shape == (12, H, bs, E if dtype == "int8" else E // 2)
    assert cache.k_scale.shape == cache.v_scale.shape == (12, H, bs, 2) and cache.k_scale.dtype == np.float32
    assert f"dtype={dtype}, group_size=16" in repr(cache)
    flat = pyattn.KVCache(1, H, 32, E, dtype=dtype, group_size=16)     # the contiguous twin of a, then b
    a = cache.add_sequence()
    q, k, v = rng.standard_normal((3, 1, Hq, 6, E)).astype(np.float32)
    same_bits(cache.attend([a], q, k[:, :H], v[:, :H]), flat.attend(q, k[:, :H], v[:, :H]))
    b = cache.fork(a)                                    # shares a's 2 blocks (the second half full)
    snap = [x.copy() for x in (cache.k, cache.v, cache.k_scale, cache.v_scale)]
    twin = pyattn.KVCache(1, H, 32, E, dtype=dtype, group_size=16)
    for x, y in ((twin.k, flat.k), (twin.v, flat.v), (twin.k_scale, flat.k_scale), (twin.v_scale, flat.v_scale)):
        x[...] = y
    twin.lengths[:] = flat.lengths
    qa, ka, va, qb, kb, vb = rng.standard_normal((6, 1, Hq, 1, E)).astype(np.float32)
    ob = cache.attend([b], qb, kb[:, :H], vb[:, :H])     # b writes row 6: block 1 is copied first
    same_bits(ob, twin.attend(qb, kb[:, :H], vb[:, :H]))
    blocks_a = cache._seqs[a][0]
    for now, old in zip((cache.k, cache.v, cache.k_scale, cache.v_scale), snap):
        same_bits(now[blocks_a], old[blocks_a])          # a's blocks, rows and scales, untouched
    oa = cache.attend([a], qa, ka[:, :H], va[:, :H])
    same_bits(oa, flat.attend(qa, ka[:, :H], va[:, :H]))
    for s, twin_cache in ((a, flat), (b, twin)):
        rows = cache._seqs[s][0]
        for pool, c in ((cache.k, twin_cache.k), (cache.v_scale, twin_cache.v_scale)):
            same_bits(rows_of(pool, rows, 7), c[0, :, :7])


def test_layer_with_a_quantized_paged_cache():
    from pyattn.nn import MultiHeadAttention
    rng = np.random.default_rng(6)
    m = MultiHeadAttention(32, 32, 4, rng=0).eval()
    x = rng.standard_normal((1, 9, 32)).astype(np.float32)
    for dtype in ("int8", "int4"):
        paged = pyattn.PagedKVCache(num_blocks=6, block_size=4, num_kv_heads=4, head_dim=8, dtype=dtype,
                                    group_size=8)
        flat = m.new_cache(1, 16, dtype=dtype, group_size=8)
        s = paged.add_sequence()
        same_bits(m(x[:, :5], cache=paged, seqs=[s]), m(x[:, :5], cache=flat))
        for t in range(5, 9):
            same_bits(m(x[:, t:t + 1], cache=paged, seqs=[s]), m(x[:, t:t + 1], cache=flat))


def test_thread_counts_give_the_same_bits():
    rng = np.random.default_rng(11)
    kc, ks = qcache(rng, 1, 2, 4608, 64, "int4", 32)
    vc, vs = qcache(rng, 1, 2, 4608, 64, "int8", 32)
    (kp, vp, ksp, vsp), tab = to_pools([kc, vc, ks, vs], 64, rng)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    n = pyattn.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 5):
            pyattn.set_num_threads(t)
            outs.append(pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=4500, block_table=tab,
                                                      k_scale=ksp, v_scale=vsp))
    finally:
        pyattn.set_num_threads(n)
    for o in outs[1:]:
        same_bits(o, outs[0])
    same_bits(outs[0], pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=4500, k_scale=ks, v_scale=vs))


def _pools(rng):
    kc, ks = qcache(rng, 2, 2, 16, 32, "int8", 16)
    vc, vs = qcache(rng, 2, 2, 16, 32, "int4", 16)
    return to_pools([kc, vc, ks, vs], 4, rng)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_new_rows_write_nothing(bad):
    rng = np.random.default_rng(2)
    (kp, vp, ksp, vsp), tab = _pools(rng)
    before = [x.copy() for x in (kp, vp, ksp, vsp)]
    q = rng.standard_normal((3, 2, 32)).astype(np.float32)
    kn, vn = rng.standard_normal((2, 3, 2, 32)).astype(np.float32)
    vn[2, 1, 5] = bad                                     # the second sequence's (a later call's) row
    with pytest.raises(ValueError, match="value holds NaN or infinity.*nothing was written"):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=[3, 5], block_table=tab,
                                      cu_seqlens_q=np.array([0, 2, 3]), k_scale=ksp, v_scale=vsp)
    for x, y in zip((kp, vp, ksp, vsp), before):
        same_bits(x, y)


def test_errors_name_the_argument_and_write_nothing():
    rng = np.random.default_rng(4)
    (kp, vp, ksp, vsp), tab = _pools(rng)
    before = [x.copy() for x in (kp, vp, ksp, vsp)]
    q = rng.standard_normal((2, 2, 1, 32)).astype(np.float32)
    kn, vn = rng.standard_normal((2, 2, 2, 1, 32)).astype(np.float32)
    call = dict(cache_seqlens=[3, 5], block_table=tab)
    with pytest.raises(ValueError, match="k_scale"):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, v_scale=vsp, **call)
    with pytest.raises(ValueError, match="v_scale has shape"):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, k_scale=ksp, v_scale=vsp[:, :, :, :1][:-1], **call)
    with pytest.raises(ValueError, match="k_scale has shape.*groups dividing"):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, k_scale=np.zeros(ksp.shape[:3] + (3,), np.float32),
                                      v_scale=vsp, **call)
    with pytest.raises(TypeError, match="k_scale must be a float32"):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, k_scale=ksp.astype(np.float64), v_scale=vsp, **call)
    with pytest.raises(ValueError, match="k_scale is given but k_cache is float32"):
        pyattn.attention_with_kvcache(q, kp.astype(np.float32), vp, kn, vn, k_scale=ksp, v_scale=vsp, **call)
    ro = ksp.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="k_scale is read-only"):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, k_scale=ro, v_scale=vsp, **call)
    # precision="bf16": accepted with int8 / int4 pools since issue 37 item 4 (was a
    # refusal; its rule: tests/test_precision_bf16_quant.py)
    assert np.isfinite(pyattn.attention_with_kvcache(q, kp.copy(), vp.copy(), kn, vn, k_scale=ksp.copy(),
                                                     v_scale=vsp.copy(), precision="bf16", **call)).all()
    bad = tab.copy()
    bad[1, 1] = 99
    with pytest.raises(ValueError, match=r"block_table\[1, 1\]"):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, k_scale=ksp, v_scale=vsp, cache_seqlens=[3, 5],
                                      block_table=bad)
    with pytest.raises(TypeError, match="PagedKVCache.attend takes no k_scale"):
        pyattn.PagedKVCache(4, 4, 2, 32, dtype="int8").attend([], q[:0], kn[:0], vn[:0], k_scale=ksp)
    for x, y in zip((kp, vp, ksp, vsp), before):
        same_bits(x, y)


def test_paged_kvcache_constructor_errors():
    with pytest.raises(ValueError, match="group_size 12 must divide head_dim 32"):
        pyattn.PagedKVCache(4, 4, 2, 32, dtype="int8", group_size=12)
    with pytest.raises(ValueError, match="even for int4"):
        pyattn.PagedKVCache(4, 4, 2, 3, dtype="int4", group_size=1)
    with pytest.raises(TypeError, match="'int8' or 'int4'"):
        pyattn.PagedKVCache(4, 4, 2, 32, dtype="int2")


def test_the_binding_checks_what_the_kernels_rely_on():
    """_C.sdpa directly: a quantized paged call without its scale pools, or
    with misshapen ones, raises; it never reads past them"""
    rng = np.random.default_rng(9)
    (kp, vp, ksp, vsp), tab = _pools(rng)
    q = rng.standard_normal((2, 2, 1, 32)).astype(np.float32)
    k = np.broadcast_to(kp[:1, :, :1], (2, 2, 16, 32))
    v = np.broadcast_to(vp[:1, :, :1], (2, 2, 16, 16))
    sk = np.broadcast_to(ksp[:1, :, :1], (2, 2, 16, 2))
    sv = np.broadcast_to(vsp[:1, :, :1], (2, 2, 16, 2))
    kw = dict(kv_len=np.array([16, 16, 16, 16], np.int64), k_scale=sk, v_scale=sv)
    out = _C.sdpa(q, k, v, paged=(kp, vp, tab.astype(np.int64), ksp, vsp), **kw)[0]
    assert out.shape == (2, 2, 1, 32)
    with pytest.raises(TypeError, match="k_scale_pool"):
        _C.sdpa(q, k, v, paged=(kp, vp, tab.astype(np.int64)), **kw)
    with pytest.raises(ValueError, match="v_scale pool must be"):
        _C.sdpa(q, k, v, paged=(kp, vp, tab.astype(np.int64), ksp, vsp[:-1]), **kw)
    with pytest.raises(TypeError, match="k_scale"):
        _C.sdpa(q, k, v, paged=(kp, vp, tab.astype(np.int64), ksp.astype(np.float64), vsp), **kw)


def test_tree_mask_over_quantized_pools_matches_the_dequantized_pools():
    """a token tree (tree_mask) over int8 / int4 pools: the float32 call over
    the dequantized pools, to float32 rounding (the float pools' own path)"""
    rng = np.random.default_rng(12)
    (kp, vp, ksp, vsp), tab = _pools(rng)
    kd, vd = pyattn.dequantize(kp, ksp, dtype="int8", group_size=16), pyattn.dequantize(vp, vsp, dtype="int4",
                                                                                       group_size=16)
    tree = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)[None, None]
    q = rng.standard_normal((2, 4, 4, 32)).astype(np.float32)
    kw = dict(cache_seqlens=[3, 9], block_table=tab, tree_mask=tree)
    o = pyattn.attention_with_kvcache(q, kp, vp, k_scale=ksp, v_scale=vsp, **kw)
    want = pyattn.attention_with_kvcache(q, kd, vd, **kw)
    assert np.max(np.abs(o - want)) <= 3e-6 * (1 + np.max(np.abs(want)))


@pytest.mark.parametrize("G", [1, 2])
def test_int4_head_dim_2(G):
    """Issue 40, bug 8: an int4 pool with head_dim 2 (one byte per row) was
    accepted by the constructor and refused by every attend ("a quantized
    key must be contiguous along its rows": the stand-ins' width-1 axis has
    stride 0). Now it attends, equal to attention over the dequantized rows."""
    rng = np.random.default_rng(8)
    H, Hq, bs = 2, 4, 4
    cache = pyattn.PagedKVCache(num_blocks=6, block_size=bs, num_kv_heads=H, head_dim=2, dtype="int4",
                                group_size=G)
    assert cache.k.shape == (6, H, bs, 1)
    flat = pyattn.KVCache(1, H, 16, 2, dtype="int4", group_size=G)
    a = cache.add_sequence()
    for T in (5, 1, 2):
        q = rng.standard_normal((1, Hq, T, 2)).astype(np.float32)
        k, v = rng.standard_normal((2, 1, H, T, 2)).astype(np.float32)
        got = cache.attend([a], q, k, v, is_causal=True)
        same_bits(got, flat.attend(q, k, v, is_causal=True))
        n = cache.length(a)
        kd, vd = (pyattn.dequantize(rows_of(p, cache._seqs[a][0], n), rows_of(s, cache._seqs[a][0], n),
                                    dtype="int4", group_size=G).astype(np.float64)
                  for p, s in ((cache.k, cache.k_scale), (cache.v, cache.v_scale)))
        want = R.scaled_dot_product_attention(q.astype(np.float64), np.repeat(kd, 2, 0)[None],
                                              np.repeat(vd, 2, 0)[None], None, 0.0, "bottom_right")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # packed, two sequences
    b = cache.fork(a)
    out = cache.attend([a, b], rng.standard_normal((3, Hq, 2)).astype(np.float32),
                       *rng.standard_normal((2, 3, H, 2)).astype(np.float32), cu_seqlens_q=[0, 1, 3])
    assert out.shape == (3, Hq, 2) and np.isfinite(out).all()


def test_int4_width_one_rows_with_any_stride():
    """A contiguous int4 cache of head_dim 2 (one byte per row) read through a
    view whose last axis has another stride: the stride of a length-1 axis
    is no layout; the same result as the contiguous copy."""
    rng = np.random.default_rng(9)
    kq, ks = qcache(rng, 1, 2, 8, 2, "int4", 2)
    vq, vs = qcache(rng, 1, 2, 8, 2, "int4", 1)
    wide = np.zeros((1, 2, 8, 3), np.uint8)
    wide[..., 1:2] = kq
    q = rng.standard_normal((1, 2, 1, 2)).astype(np.float32)
    n = np.array([8])
    want = pyattn.attention_with_kvcache(q, kq, vq, k_scale=ks, v_scale=vs, cache_seqlens=n)
    same_bits(pyattn.attention_with_kvcache(q, wide[..., 1::2], vq, k_scale=ks, v_scale=vs, cache_seqlens=n),
              want)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_pool_of_no_blocks(dtype):
    """PagedKVCache(num_blocks=0) int8 / int4 (found by test_paged_state):
    an attend with no new token ran for the float dtypes and was refused
    here ("the k_scale pool must be ... contiguous groups": NumPy gives an
    empty array zero strides); one new token is CacheFullError."""
    cache = pyattn.PagedKVCache(0, 2, 1, 4, dtype=dtype, group_size=2)
    a = cache.add_sequence()
    x = np.ones((1, 1, 0, 4), np.float32)
    out, lse = cache.attend([a], x, x, x, return_lse=True)
    assert out.shape == (1, 1, 0, 4) and lse.shape == (1, 1, 0)
    y = np.ones((1, 1, 1, 4), np.float32)
    with pytest.raises(pyattn.CacheFullError):
        cache.attend([a], y, y, y)
    assert cache.length(a) == 0 and cache.blocks_free == 0
