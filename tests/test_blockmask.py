"""Block masks (issue #26): pyattn.BlockMask, pyattn.masks and block_mask=.

The oracle of a block mask is its dense bool mask: a call with block_mask=bm
must give the bits of the same call with attn_mask=bm.to_dense() (the frame
skips tiles the block mask leaves empty -- their weights would be exactly 0,
which changes no sum -- and tests the rest as a bool mask does). Where they may
differ: a NaN or inf in a value row the mask excludes for a whole frame tile;
the dense path meets it (0 * NaN in the GEMM) and recomputes the row on the
exact path, the block-mask path never reads it, so the two agree to
tolerance only (test_nan_in_skipped_values). Everything else here is
compared bit for bit, forward and backward, float32 and float64.
"""
import pickle
import tracemalloc

import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from pyattn import masks as M
from conftest import check, mag_attention

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

BM = pyattn.BlockMask


def _qkv(rng, shape_q, shape_k, dtype, Ev=None):
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_k).astype(dtype)
    v = rng.standard_normal(shape_k[:-1] + (Ev or shape_k[-1],)).astype(dtype)
    return q, k, v


def _dense_of(mask_mod, B, H, L, S):
    """The mask_mod on the whole (L, S) grid (small shapes only: the test's own oracle)."""
    qi, ki = np.arange(L)[:, None], np.arange(S)[None, :]
    return np.stack([np.stack([np.broadcast_to(mask_mod(np.int64(b), np.int64(h), qi, ki), (L, S))
                               for h in range(H or 1)]) for b in range(B or 1)])


def _ready_made(L, S, rng):
    ids_q = np.sort(rng.integers(0, 5, L))
    ids_k = np.sort(rng.integers(0, 5, S))
    return {
        "causal": M.causal,
        "sliding_window": M.sliding_window(70, 5),
        "window_unbounded_left": M.sliding_window(None, 0),
        "document": M.document(ids_q, ids_k),
        "document_unsorted": M.document(rng.integers(0, 3, L), rng.integers(0, 3, S)),
        "prefix_lm": M.prefix_lm(130),
        "prefix_lm_per_batch": M.prefix_lm(np.array([0, 200])),
        "chunked_causal": M.chunked_causal(100),
        "window_and_document": M.and_masks(M.sliding_window(100), M.document(ids_q, ids_k)),
        "causal_or_prefix": M.or_masks(M.causal, M.prefix_lm(50)),
        "and_with_lambda": M.and_masks(M.causal, lambda b, h, q, k: (q + k + h) % 3 != 0),
    }


def _random_mods(rng, L, S):
    table = rng.random((2, 3, L, S)) < 0.3
    blocks = rng.random((L // 40 + 1, S // 40 + 1)) < 0.5
    cut = int(rng.integers(1, S))
    return {
        "random_bools": lambda b, h, q, k: table[b, h, q, k],
        "random_blocks": lambda b, h, q, k: blocks[q // 40, k // 40] & (k >= q % 7),
        "boundary": lambda b, h, q, k: (k < cut) & (q % 97 != 3),
        "all_empty": lambda b, h, q, k: np.zeros(np.broadcast_shapes(q.shape, k.shape), bool),
        "all_full": lambda b, h, q, k: np.ones((1, 1), bool),
    }


L0, S0 = 301, 250      # not multiples of the tile (96 x 60): edge tiles


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masks_forward_backward_bits(dtype):
    """Every ready-made mask and random mask_mods: the dense mask is the
    mask_mod's, and forward and backward equal the dense-mask call bit for bit."""
    rng = np.random.default_rng(1)
    B, H = 2, 3
    q, k, v = _qkv(rng, (B, H, L0, 32), (B, H, S0, 32), dtype)
    mods = {**_ready_made(L0, S0, rng), **_random_mods(rng, L0, S0)}
    for name, mm in mods.items():
        per_head = name in ("random_bools", "and_with_lambda")
        bm = BM.from_mask_mod(mm, B, H if per_head else None, L0, S0)
        d = bm.to_dense()
        assert d.shape == (B, H if per_head else 1, L0, S0), name
        assert np.array_equal(d, _dense_of(mm, B, H if per_head else None, L0, S0)), name
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
        od, lsed = pyattn.scaled_dot_product_attention(q, k, v, attn_mask=d, return_lse=True)
        assert np.array_equal(o, od) and np.array_equal(lse, lsed), name
        go = rng.standard_normal(o.shape).astype(dtype)
        g = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, block_mask=bm)
        gd = pyattn.scaled_dot_product_attention_backward(go, q, k, v, od, lsed, attn_mask=d)
        for a, b_ in zip(g, gd):
            assert np.array_equal(a, b_), name
        if name == "all_empty":
            assert not o.any() and np.all(lse == -np.inf)
            assert all(not x.any() for x in g)


def test_reference_oracle():
    """The float64 oracle (block_mask as its dense mask) against the kernels."""
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (2, 2, 150, 16), (2, 2, 130, 16), np.float64)
    bm = BM.from_mask_mod(M.and_masks(M.sliding_window(40, 10), M.prefix_lm(np.array([20, 70]))), 2, None, 150, 130)
    o, w = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, return_weights=True)
    ro, rw = R.scaled_dot_product_attention(q, k, v, block_mask=bm, return_weights=True)
    check(o, ro, mag_attention(q, k, v, rw, 0.25))
    assert np.array_equal(w == 0, rw == 0)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
    go = rng.standard_normal(o.shape)
    g = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, block_mask=bm)
    rg = R.scaled_dot_product_attention_backward(go, q, k, v, block_mask=bm)
    for a, b_ in zip(g, rg):
        assert np.allclose(a, b_, rtol=0, atol=1e-12 * max(1.0, np.abs(b_).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_intersects_every_option(dtype):
    """causal, window, bool and float masks, ALiBi, softcap, sinks, dropout,
    GQA, weights, 16-bit storage and precision='bf16': bits of the dense call."""
    rng = np.random.default_rng(3)
    B, H, L, S = 2, 4, 200, 190
    q, k, v = _qkv(rng, (B, H, L, 16), (B, H, S, 16), dtype)
    bm = BM.from_mask_mod(M.and_masks(M.or_masks(M.causal, M.prefix_lm(40)),
                                      M.document(np.arange(L) // 70, np.arange(S) // 70)), None, None, L, S)
    d = bm.to_dense()
    boolm = rng.random((L, S)) < 0.8
    floatm = rng.standard_normal((H, L, S)).astype(dtype)
    opts = [dict(is_causal=True), dict(window=(50, 3)), dict(is_causal="bottom_right", window=(30, 0)),
            dict(alibi_slopes=np.linspace(0.1, 0.5, H)), dict(softcap=5.0), dict(sinks=np.ones(H)),
            dict(dropout_p=0.3, rng=7), dict(return_weights=True)]
    for kw in opts:
        a = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, **kw)
        b = pyattn.scaled_dot_product_attention(q, k, v, attn_mask=d, **kw)
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert np.array_equal(x, y), kw
    a = pyattn.scaled_dot_product_attention(q, k, v, boolm, block_mask=bm)
    assert np.array_equal(a, pyattn.scaled_dot_product_attention(q, k, v, boolm & d))
    a = pyattn.scaled_dot_product_attention(q, k, v, floatm, block_mask=bm)
    assert np.array_equal(a, pyattn.scaled_dot_product_attention(q, k, v, floatm + np.where(d, 0, -np.inf)))
    kv = (k[:, :2], v[:, :2])
    a = pyattn.scaled_dot_product_attention(q, *kv, enable_gqa=True, block_mask=bm)
    assert np.array_equal(a, pyattn.scaled_dot_product_attention(q, *kv, d, enable_gqa=True))
    if dtype == np.float32:
        a = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, precision="bf16")
        assert np.array_equal(a, pyattn.scaled_dot_product_attention(q, k, v, d, precision="bf16"))
        h = [x.astype(np.float16) for x in (q, k, v)]
        assert np.array_equal(pyattn.scaled_dot_product_attention(*h, block_mask=bm),
                              pyattn.scaled_dot_product_attention(*h, d))
    for kw in (dict(is_causal=True, softcap=4.0), dict(window=(20, 20), sinks=np.zeros(H)),
               dict(dropout_p=0.2, rng=3), dict(alibi_slopes=np.full(H, 0.2))):
        o, bwd = pyattn.scaled_dot_product_attention_vjp(q, k, v, block_mask=bm, **kw)
        od, bwdd = pyattn.scaled_dot_product_attention_vjp(q, k, v, d, **kw)
        assert np.array_equal(o, od), kw
        go = np.ones_like(o)
        for x, y in zip(bwd(go), bwdd(go)):
            assert np.array_equal(x, y), kw


def test_decode_rows_and_split():
    """Few queries (the rows path) and long keys (the split decode): the bits
    of the dense call."""
    rng = np.random.default_rng(4)
    for L, S in ((3, 700), (1, 9000), (6, 4500)):
        q, k, v = _qkv(rng, (2, L, 32), (2, S, 32), np.float32)
        bm = BM.from_mask_mod(M.or_masks(M.sliding_window(None, 0), M.prefix_lm(10)), None, None, L, S)
        bm2 = BM.from_mask_mod(lambda b, h, qq, kk: (kk < 500) | (kk > S - 300), None, None, L, S)
        for m in (bm, bm2):
            assert np.array_equal(pyattn.scaled_dot_product_attention(q, k, v, block_mask=m),
                                  pyattn.scaled_dot_product_attention(q, k, v, m.to_dense()[0]))


def test_nan_in_skipped_values():
    """A NaN in value rows of an empty tile: never read (finite result, equal
    to the dense call to tolerance -- the dense call recomputes on the exact path)."""
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, (2, 200, 16), (2, 200, 16), np.float64)
    bm = BM.from_mask_mod(M.causal, None, None, 200, 200)
    v[:, 190] = np.nan
    o = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm)
    od = pyattn.scaled_dot_product_attention(q, k, v, bm.to_dense()[0])
    assert np.isfinite(o[:, :190]).all() and np.isnan(o[:, 190:]).all()
    assert np.allclose(o[:, :190], od[:, :190], rtol=0, atol=1e-14)


@pytest.mark.parametrize("nt", [2, 3])
def test_threads_bits(nt):
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, (2, 2, 400, 32), (2, 2, 400, 32), np.float32)
    bm = BM.from_mask_mod(M.and_masks(M.causal, M.document(np.arange(400) // 130)), None, None, 400, 400)
    old = pyattn.get_num_threads()
    try:
        pyattn.set_num_threads(1)
        o1, l1 = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
        g1 = pyattn.scaled_dot_product_attention_backward(np.ones_like(o1), q, k, v, o1, l1, block_mask=bm)
        pyattn.set_num_threads(nt)
        o2, l2 = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
        g2 = pyattn.scaled_dot_product_attention_backward(np.ones_like(o2), q, k, v, o2, l2, block_mask=bm)
    finally:
        pyattn.set_num_threads(old)
    assert np.array_equal(o1, o2) and np.array_equal(l1, l2)
    assert all(np.array_equal(a, b) for a, b in zip(g1, g2))


def test_kvcache():
    """Over a cache: kv_idx the cache row, q_idx the query's position."""
    rng = np.random.default_rng(7)
    B, Hq, Hkv, Smax, E, T = 2, 4, 2, 300, 16, 4
    kc = rng.standard_normal((B, Hkv, Smax, E)).astype(np.float32)
    vc = rng.standard_normal((B, Hkv, Smax, E)).astype(np.float32)
    bm = BM.from_mask_mod(M.and_masks(M.causal, M.document(np.arange(Smax) // 64)), None, None, Smax, Smax)
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    kn = rng.standard_normal((B, Hkv, T, E)).astype(np.float32)
    vn = rng.standard_normal((B, Hkv, T, E)).astype(np.float32)
    seq = np.array([100, 250])
    k1, v1 = kc.copy(), vc.copy()
    o = pyattn.attention_with_kvcache(q, k1, v1, kn, vn, cache_seqlens=seq, block_mask=bm)
    ro = R.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seq, block_mask=bm)[0]
    assert np.allclose(o, ro, rtol=0, atol=1e-5)
    o = pyattn.attention_with_kvcache(q, k1, v1, cache_seqlens=seq + T, block_mask=bm)
    assert np.allclose(o, ro, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="block_mask"):
        small = BM.from_mask_mod(M.causal, None, None, 200, Smax)
        pyattn.attention_with_kvcache(q, k1, v1, cache_seqlens=seq + T, block_mask=small)


def test_dask():
    da = pytest.importorskip("dask.array")
    import dask
    import pyattn.dask
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, (2, 2, 240, 16), (2, 2, 240, 16), np.float64)
    bm = BM.from_mask_mod(M.and_masks(M.causal, M.document(np.arange(240) // 80)), None, 2, 240, 240)
    qd = da.from_array(q, chunks=(1, 1, 80, 16))
    kd = da.from_array(k, chunks=(2, 2, 80, 16))
    vd = da.from_array(v, chunks=(2, 2, 80, 16))
    out = pyattn.dask.scaled_dot_product_attention(qd, kd, vd, block_mask=bm)
    tasks = [str(key) for key in dict(out.__dask_graph__()) if str(key).startswith("pyattn-attention")]
    # per (batch, head) chunk: 9 (query chunk, key chunk) pairs of 80 x 80; the
    # block mask's tiles (96 x 60) cover (query chunk 0, key chunk 2) with empty
    # tiles only; every other pair meets a non-empty tile (tiles reach past the
    # chunks' edges), so 8 of them get a task
    assert len(tasks) == 4 * 8, tasks
    assert not any(t.endswith("-0-2") for t in tasks)
    with dask.config.set(scheduler="synchronous"):
        res = out.compute()
    assert np.allclose(res, pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm), rtol=0, atol=1e-13)


def test_build_never_allocates_L_by_S():
    """tracemalloc: a build at L = S = 65536 (ready-made masks: closed forms)
    and a mask_mod called on batches of tiles stay far below L * S bytes."""
    ids = np.repeat(np.arange(16), 4096)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        bm = BM.from_mask_mod(M.and_masks(M.causal, M.document(ids)), None, None, 65536, 65536)
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < 65536 * 65536 // 64, peak       # 64 MB: a bool (L, S) is 4 GB
        assert 0.9 < bm.sparsity() < 0.99
        L = S = 8192
        tracemalloc.reset_peak()
        bm2 = BM.from_mask_mod(lambda b, h, q, k: (q - k) % 5 != 1, None, None, L, S)
        peak2 = tracemalloc.get_traced_memory()[1]
        assert peak2 < L * S // 2, peak2               # a bool (L, S) is L * S bytes
    finally:
        tracemalloc.stop()
    assert bm2.sparsity() == 0.0
    # the check can fail: a mask_mod that builds an (L, S) array is seen
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        BM.from_mask_mod(lambda b, h, q, k: np.ones((L, S), bool)[q, k], None, None, 1000, 1000)
        assert tracemalloc.get_traced_memory()[1] >= L * S
    finally:
        tracemalloc.stop()


def test_blockmask_object():
    bm = BM.from_mask_mod(M.causal, None, None, 300, 300)
    assert bm.shape == (1, 1, 300, 300) and bm.sparsity() == 0.2
    assert bm.TILE == (96, 60)
    r = repr(bm)
    assert r.startswith("BlockMask(shape=(1, 1, 300, 300)") and "█" in r and "░" in r
    assert r.splitlines()[1] == "|░░   |"
    b2 = pickle.loads(pickle.dumps(bm))
    assert b2 == bm and np.array_equal(b2.to_dense(), bm.to_dense())
    assert bm != BM.from_mask_mod(M.sliding_window(3), None, None, 300, 300)
    assert bm == BM.from_mask_mod(lambda b, h, q, k: k <= q, None, None, 300, 300)
    assert pickle.loads(pickle.dumps(M.and_masks(M.causal, M.document([0, 1])))) is not None
    big = BM.from_mask_mod(M.causal, 2, 3, 9000, 9000)
    assert len(repr(big).splitlines()) == 33
    empty = BM.from_mask_mod(M.causal, None, None, 0, 5)
    assert empty.to_dense().shape == (1, 1, 0, 5) and empty.sparsity() == 0.0


def test_errors():
    q = np.zeros((2, 3, 100, 8), np.float32)
    bm = BM.from_mask_mod(M.causal, None, None, 100, 100)
    with pytest.raises(TypeError, match="block_mask"):
        pyattn.scaled_dot_product_attention(q, q, q, block_mask=bm.to_dense())
    with pytest.raises(ValueError, match="block_mask"):
        pyattn.scaled_dot_product_attention(q, q[..., :90, :], q[..., :90, :], block_mask=bm)
    with pytest.raises(ValueError, match="block_mask"):
        pyattn.scaled_dot_product_attention(q, q, q, block_mask=BM.from_mask_mod(M.causal, 4, None, 100, 100))
    with pytest.raises(TypeError, match="not vectorised"):
        BM.from_mask_mod(lambda b, h, qq, kk: qq > kk if qq > 0 else False, None, None, 100, 100)
    with pytest.raises(TypeError, match="dtype int64"):
        BM.from_mask_mod(lambda b, h, qq, kk: qq - kk, None, None, 100, 100)
    with pytest.raises(ValueError, match="shape"):
        BM.from_mask_mod(lambda b, h, qq, kk: np.ones((3, 3), bool), None, None, 100, 100)
    with pytest.raises(TypeError, match="list"):
        BM.from_mask_mod(lambda b, h, qq, kk: [True], None, None, 100, 100)

    class Boom(Exception):
        pass

    def bad(b, h, qq, kk):
        raise Boom("from the mask")
    with pytest.raises(Boom):
        BM.from_mask_mod(bad, None, None, 100, 100)
    with pytest.raises(TypeError, match="callable"):
        BM.from_mask_mod(3, None, None, 10, 10)
    with pytest.raises(TypeError, match="L"):
        BM.from_mask_mod(M.causal, None, None, 1.5, 10)
    with pytest.raises(ValueError, match="B"):
        BM.from_mask_mod(M.causal, 0, None, 10, 10)
    with pytest.raises(ValueError, match="doc_ids"):
        BM.from_mask_mod(M.document(np.zeros(5, int)), None, None, 10, 10)
    with pytest.raises(TypeError, match="doc_ids_q"):
        M.document([0.5, 1.0])
    with pytest.raises(ValueError, match="chunk"):
        M.chunked_causal(0)
    with pytest.raises(ValueError, match="left"):
        M.sliding_window(-1)
    with pytest.raises(ValueError, match="prefix_len"):
        M.prefix_lm(-3)
    with pytest.raises(TypeError, match="and_masks"):
        M.and_masks(M.causal, 3)
    with pytest.raises(ValueError, match="or_masks"):
        M.or_masks()
    # a broken tuple at the private binding raises, never reads outside its arrays
    arg = list(bm._c_arg((2, 3)))
    arg[1] = np.full_like(arg[1], 10 ** 6)
    arg[0] = np.full_like(arg[0], 2)
    with pytest.raises(ValueError, match="block_mask"):
        pyattn._C.sdpa(q, q, q, block_mask=tuple(arg))
    arg = list(bm._c_arg((2, 3)))
    arg[3] = np.full(6, 5, np.int64)
    with pytest.raises(ValueError, match="block_mask"):
        pyattn._C.sdpa(q, q, q, block_mask=tuple(arg))
    assert dir(M) == sorted(M.__all__)
    assert "BlockMask" in dir(pyattn) and "masks" in dir(pyattn)


def test_property_random_tables():
    """hypothesis: random shapes and random bool tables (as a mask_mod),
    forward and lse equal the dense call bit for bit."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=15, deadline=None, derandomize=True)
    @given(L=st.integers(1, 200), S=st.integers(1, 130), p=st.floats(0, 1), seed=st.integers(0, 2 ** 16))
    def run(L, S, p, seed):
        rng = np.random.default_rng(seed)
        table = rng.random((L, S)) < p
        bm = BM.from_mask_mod(lambda b, h, q, k: table[q, k], None, None, L, S)
        assert np.array_equal(bm.to_dense()[0, 0], table)
        q, k, v = _qkv(rng, (L, 8), (S, 8), np.float32)
        a = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
        b = pyattn.scaled_dot_product_attention(q, k, v, table, return_lse=True)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    run()
