"""The entry points' arguments at their limits (issue 28, "Reliability v3"):
the bugs found from outside (1, 4, 6, 7, 8 and three contract breaks),
integer limits, and scalar arguments that must be numbers. Nothing written
on an allocation failure: tests/test_allocation_failures.py."""
import sys

import numpy as np
import pytest

import pyattn
from pyattn import _C

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
BIG = (2**63 - 1, 2**62)           # the integer limits every size / position is tried at
CACHE_DTYPES = [np.float32, np.float64, np.float16, BF16]


def _kv_case(dt=np.float32, B=2, H=2, S=8, E=4, Ev=3, T=1, seed=0):
    rng = np.random.default_rng(seed)
    kc = rng.standard_normal((B, H, S, E)).astype(dt)
    vc = rng.standard_normal((B, H, S, Ev)).astype(dt)
    q = rng.standard_normal((B, H, T, E)).astype(np.float32)
    k = rng.standard_normal((B, H, T, E)).astype(np.float32)
    v = rng.standard_normal((B, H, T, Ev)).astype(np.float32)
    return q, kc, vc, k, v


def _snap(*arrays):
    return [a.tobytes() for a in arrays]


# ---- bug 1: a bfloat16 query to the cache entry points ----------------------

@pytest.mark.parametrize("cdt", CACHE_DTYPES, ids=str)
@pytest.mark.parametrize("new", [False, True])
def test_bf16_query_to_kvcache_is_read_as_numbers(cdt, new):
    q, kc, vc, k, v = _kv_case(cdt, T=2)
    qb = q.astype(BF16)
    q32 = qb.astype(np.float32)                 # the same numbers
    kw = dict(cache_seqlens=[3, 5], return_lse=True)
    args = (k, v) if new else ()
    o1, l1 = pyattn.attention_with_kvcache(qb, kc.copy(), vc.copy(), *args, **kw)
    o2, l2 = pyattn.attention_with_kvcache(q32, kc.copy(), vc.copy(), *args, **kw)
    np.testing.assert_allclose(l1, l2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o1, o2, rtol=1e-5, atol=1e-6)


def test_bf16_query_issue_example():
    q = np.array([[[[1, .5]]]], BF16)
    kc = np.random.default_rng(1).standard_normal((1, 1, 4, 2)).astype(np.float32)
    vc = np.ones((1, 1, 4, 2), np.float32)
    _, lse = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=4, return_lse=True)
    _, ref = pyattn.attention_with_kvcache(q.astype(np.float32), kc, vc, cache_seqlens=4, return_lse=True)
    assert abs(float(lse[0, 0, 0]) - float(ref[0, 0, 0])) < 1e-5


@pytest.mark.parametrize("cdt", CACHE_DTYPES, ids=str)
def test_bf16_query_to_KVCache_attend(cdt):
    q, _, _, k, v = _kv_case(T=1)
    c1, c2 = pyattn.KVCache(2, 2, 8, 4, 3, dtype=cdt), pyattn.KVCache(2, 2, 8, 4, 3, dtype=cdt)
    for c in (c1, c2):                      # three rows to attend over
        c.attend(*_kv_case(T=3, seed=7)[0:1], *_kv_case(T=3, seed=8)[3:])
    o1 = c1.attend(q.astype(BF16), k, v)
    o2 = c2.attend(q.astype(BF16).astype(np.float32), k, v)
    np.testing.assert_allclose(o1, o2, rtol=1e-5, atol=1e-6)


# ---- bug 4: windows near 2**63 ------------------------------------------------

def _qkv(L=6, S=6, E=4, dt=np.float64, seed=2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, L, E)).astype(dt), rng.standard_normal((2, S, E)).astype(dt),
            rng.standard_normal((2, S, 3)).astype(dt))


@pytest.mark.parametrize("w", list(BIG) + [2**64, 10**30])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_huge_window_is_unbounded(w, causal):
    q, k, v = _qkv(L=5, S=7)
    for win, ref in (((0, w), (0, None)), ((w, 0), (None, 0)), ((w, w), None), ((1, w), (1, None))):
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, window=win, return_lse=True)
        o2, lse2 = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, window=ref, return_lse=True)
        assert np.array_equal(o, o2) and np.array_equal(lse, lse2), (win, causal)
        g = pyattn.scaled_dot_product_attention_backward(np.ones_like(o), q, k, v, o, lse,
                                                         is_causal=causal, window=win)
        g2 = pyattn.scaled_dot_product_attention_backward(np.ones_like(o), q, k, v, o, lse,
                                                          is_causal=causal, window=ref)
        for a, b in zip(g, g2):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("w", BIG)
def test_huge_window_kvcache_and_decode(w):
    q, kc, vc, k, v = _kv_case(np.float32, S=16, T=1)
    for win, ref in (((0, w), (0, None)), ((w, 0), (None, 0))):
        o = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=[9, 16], window=win)
        o2 = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=[9, 16], window=ref)
        assert np.array_equal(o, o2)
    # the split decode path (S >= 4096)
    rng = np.random.default_rng(3)
    q1, k1, v1 = rng.standard_normal((1, 4)), rng.standard_normal((4100, 4)), rng.standard_normal((4100, 2))
    a = pyattn.scaled_dot_product_attention(q1, k1, v1, window=(w, w))
    assert np.array_equal(a, pyattn.scaled_dot_product_attention(q1, k1, v1))


def test_private_window_arguments_stay_defined():
    """_C.sdpa directly (no Python normalisation): the C entry normalises too."""
    q, k, v = _qkv(L=5, S=7)
    base = _C.sdpa(q, k, v, None, None, 1)[0]
    for left, right in ((sys.maxsize, sys.maxsize), (-1, sys.maxsize), (sys.maxsize, -1), (2**62, 2**62)):
        assert np.array_equal(_C.sdpa(q, k, v, None, None, 1, left=left, right=right)[0], base)
    with pytest.raises(ValueError, match="qoff"):
        _C.sdpa(q, k, v, qoff=2**63 - 1)


@pytest.mark.parametrize("bad", [-1, -(2**63)])
def test_negative_window_is_a_value_error(bad):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window"):
        pyattn.scaled_dot_product_attention(q, k, v, window=(bad, 0))
    with pytest.raises(ValueError, match="window"):
        pyattn.scaled_dot_product_attention(q, k, v, window=(0, bad))


# ---- bugs 6, 7, 8: the cache entry points --------------------------------------

@pytest.mark.parametrize("lens", [[0, 2**63 - 1], [2**63 - 1, 0], [0, 2**62], [2**62, 2**62], [0, -1],
                                  [0, 7], [8, 0]])
def test_seqlens_past_the_cache_write_nothing(lens):
    q, kc, vc, k, v = _kv_case(T=2)
    before = _snap(kc, vc)
    with pytest.raises(ValueError, match="cache_seqlens"):
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens)
    assert _snap(kc, vc) == before


@pytest.mark.parametrize("n", [2**63 - 1, 2**62, -1, 2**64])
def test_seqlens_limits_without_new_keys(n):
    q, kc, vc, _, _ = _kv_case()
    with pytest.raises(ValueError, match="cache_seqlens"):
        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n)
    with pytest.raises(ValueError, match="cache_seqlens"):
        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=[0, n])


def test_memory_error_after_checks_writes_nothing():
    """Bug 7: a stride-0 query with 2**34 heads: the result cannot be allocated."""
    kc = np.zeros((1, 1, 8, 4), np.float32)
    vc = np.zeros((1, 1, 8, 4), np.float32)
    q = np.broadcast_to(np.ones(4, np.float32), (1, 2**34, 1, 4))
    k = np.ones((1, 1, 1, 4), np.float32)
    before = _snap(kc, vc)
    with pytest.raises(MemoryError):
        pyattn.attention_with_kvcache(q, kc, vc, k, k, cache_seqlens=2)
    assert _snap(kc, vc) == before
    cache = pyattn.KVCache(1, 1, 8, 4)
    with pytest.raises(MemoryError):
        cache.attend(q, k, k)
    assert not cache.k.any() and not cache.v.any() and cache.lengths.tolist() == [0]


@pytest.mark.parametrize("new", [False, True])
def test_empty_batch(new):
    """Bug 8: B = 0 is valid, with or without new keys."""
    q, kc, vc, k, v = _kv_case(B=0, T=2)
    args = (k, v) if new else ()
    o, lse = pyattn.attention_with_kvcache(q, kc, vc, *args, cache_seqlens=0, return_lse=True)
    assert o.shape == (0, 2, 2, 3) and lse.shape == (0, 2, 2)
    o = pyattn.attention_with_kvcache(q, kc, vc, *args, cache_seqlens=np.zeros(0, np.int64))
    assert o.shape == (0, 2, 2, 3)
    cache = pyattn.KVCache(0, 2, 8, 4, 3)
    assert cache.attend(q, k, v).shape == (0, 2, 2, 3)


def test_new_rows_are_written_as_before():
    """The write moved into C after every allocation: same rows, same rounding."""
    for cdt in CACHE_DTYPES:
        q, kc, vc, k, v = _kv_case(cdt, T=3)
        k = k.astype(np.float64) * 1.2345678901
        v = v[..., ::-1] * 3.3                         # a strided value
        kc0, vc0 = kc.copy(), vc.copy()
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=[1, 4])
        for b, n in enumerate((1, 4)):
            kc0[b, :, n:n + 3] = k[b]
            vc0[b, :, n:n + 3] = v[b]
        assert kc.tobytes() == kc0.tobytes() and vc.tobytes() == vc0.tobytes(), cdt


def test_new_rows_overlapping_the_cache():
    """key given as a view of the cache itself (rows it is about to overwrite)."""
    q, kc, vc, _, _ = _kv_case(T=2, S=8)
    kc0, vc0 = kc.copy(), vc.copy()
    k, v = kc[:, :, 3:5], vc[:, :, 2:4]
    pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=4)
    kc0[:, :, 4:6] = kc0[:, :, 3:5].copy()
    vc0[:, :, 4:6] = vc0[:, :, 2:4].copy()
    assert kc.tobytes() == kc0.tobytes() and vc.tobytes() == vc0.tobytes()


# ---- the three contract breaks ------------------------------------------------

@pytest.mark.parametrize("name,val", [("scale", "0.5"), ("softcap", "5"), ("dropout_p", "0.1"),
                                      ("scale", b"1"), ("scale", [0.5]), ("scale", 1 + 0j),
                                      ("scale", np.complex64(1)), ("softcap", True), ("scale", np.bool_(1)),
                                      ("scale", np.array(["1"]))])
def test_scalars_are_numbers(name, val):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=name):
        pyattn.scaled_dot_product_attention(q, k, v, **{name: val})
    qc, kc, vc, _, _ = _kv_case()
    if name != "dropout_p":
        with pytest.raises(TypeError, match=name):
            pyattn.attention_with_kvcache(qc, kc, vc, cache_seqlens=2, **{name: val})
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match=name):
        pyattn.scaled_dot_product_attention_backward(o, q, k, v, o, lse, **{name: val})


@pytest.mark.parametrize("val", [0.5, 2, np.float32(0.5), np.float16(0.5), np.int64(2), np.uint8(3),
                                 np.array(0.5), np.array(2, np.int32)])
def test_real_numbers_are_accepted(val):
    q, k, v = _qkv()
    for name in ("scale", "softcap"):
        a = pyattn.scaled_dot_product_attention(q, k, v, **{name: val})
        b = pyattn.scaled_dot_product_attention(q, k, v, **{name: float(val)})
        assert np.array_equal(a, b)
    assert np.array_equal(pyattn.softmax(q, scale=val), pyattn.softmax(q, scale=float(val)))


@pytest.mark.parametrize("val", [np.int64(3), np.uint16(3), np.array(3)])
def test_integer_scalars_for_windows_and_seqlens(val):
    q, k, v = _qkv()
    a = pyattn.scaled_dot_product_attention(q, k, v, window=(val, None))
    assert np.array_equal(a, pyattn.scaled_dot_product_attention(q, k, v, window=(3, None)))
    qc, kc, vc, _, _ = _kv_case()
    a = pyattn.attention_with_kvcache(qc, kc, vc, cache_seqlens=val)
    assert np.array_equal(a, pyattn.attention_with_kvcache(qc, kc, vc, cache_seqlens=3))


@pytest.mark.parametrize("val", [3.0, "3", True, np.float64(3), None, 2.5])
def test_window_sides_must_be_integers(val):
    q, k, v = _qkv()
    if val is None:
        pyattn.scaled_dot_product_attention(q, k, v, window=(val, 0))
        return
    with pytest.raises(TypeError, match="window"):
        pyattn.scaled_dot_product_attention(q, k, v, window=(val, 0))


@pytest.mark.parametrize("val", [3.0, "3", True, [1.0, 2.0], np.array([True, False]), ["1", "2"]])
def test_seqlens_must_be_integers(val):
    qc, kc, vc, _, _ = _kv_case()
    with pytest.raises(TypeError, match="cache_seqlens"):
        pyattn.attention_with_kvcache(qc, kc, vc, cache_seqlens=val)


def test_KVCache_attend_without_new_rows_raises_before_attending():
    q, _, _, k, v = _kv_case()
    cache = pyattn.KVCache(2, 2, 8, 4, 3)
    cache.attend(q, k, v)
    k0, v0, n0 = cache.k.copy(), cache.v.copy(), cache.lengths.copy()
    for kk, vv in ((None, None), (k, None), (None, v)):
        with pytest.raises(TypeError, match="key|value"):
            cache.attend(q, kk, vv)
    assert np.array_equal(cache.k, k0) and np.array_equal(cache.v, v0) and np.array_equal(cache.lengths, n0)


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="no extended precision here")
@pytest.mark.parametrize("which", ["grad_out", "out"])
def test_backward_rejects_extended_precision(which):
    q, k, v = _qkv()
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    go = np.ones_like(o)
    args = {"grad_out": go, "out": o}
    args[which] = args[which].astype(np.longdouble)
    with pytest.raises(TypeError, match=which):
        pyattn.scaled_dot_product_attention_backward(args["grad_out"], q, k, v, args["out"], lse)
    with pytest.raises(TypeError, match=which):
        pyattn.scaled_dot_product_attention_vjp(q, k, v)[1](args["grad_out"].astype(np.longdouble))


# ---- item 3: integer limits ----------------------------------------------------

@pytest.mark.parametrize("n", list(BIG) + [-1])
@pytest.mark.parametrize("which", ["batch", "num_kv_heads", "max_len", "head_dim", "value_dim"])
def test_KVCache_sizes_at_the_limits(n, which):
    dims = dict(batch=1, num_kv_heads=1, max_len=4, head_dim=2, value_dim=2)
    dims[which] = n
    with pytest.raises(ValueError, match=which):
        pyattn.KVCache(**dims)
    if which == "batch" and n > 0:          # empty rows, but the lengths (B,) still too large
        with pytest.raises(ValueError, match="batch"):
            pyattn.KVCache(n, 1, 4, 0)


@pytest.mark.parametrize("n", list(BIG) + [-1, 0])
def test_num_heads_at_the_limits(n):
    x = np.ones((1, 3, 4))
    w = np.ones((4, 4))
    with pytest.raises(ValueError, match="num_heads"):
        pyattn.multi_head_attention(x, x, x, n, w, w, w)


@pytest.mark.parametrize("n", BIG)
def test_stride0_batches_at_the_limits(n):
    """Batch / head counts near 2**63 through stride-0 views: a clear error, no wrap."""
    q = np.broadcast_to(np.ones((1, 1, 1), np.float32), (n // 16, 1, 1))
    k = np.ones((1, 2, 1), np.float32)
    v = np.ones((1, 2, 1), np.float32)
    with pytest.raises(MemoryError):
        pyattn.scaled_dot_product_attention(q, k, v)
    o = np.empty((0, 1, 1), np.float32)
    with pytest.raises(ValueError, match="out"):
        pyattn.scaled_dot_product_attention(q, k, v, out=o)


@pytest.mark.parametrize("n", list(BIG) + [-(2**63)])
def test_softmax_axis_at_the_limits(n):
    with pytest.raises(ValueError, match="axis"):
        pyattn.softmax(np.ones((2, 3)), axis=n)
    with pytest.raises(ValueError, match="dim|axis"):
        pyattn.softmax(np.ones((2, 3)), dim=n)


@pytest.mark.parametrize("n", [2**63 - 1, 2**63, 2**64 - 1])
def test_seqlens_integer_arrays_at_the_limits(n):
    q, kc, vc, k, v = _kv_case()
    before = _snap(kc, vc)
    dt = np.uint64 if n >= 2**63 else np.int64
    for args in ((), (k, v)):
        with pytest.raises(ValueError, match="cache_seqlens"):
            pyattn.attention_with_kvcache(q, kc, vc, *args, cache_seqlens=np.array([0, n], dt))
        with pytest.raises(ValueError, match="cache_seqlens"):
            pyattn.attention_with_kvcache(q, kc, vc, *args, cache_seqlens=dt(n))
    assert _snap(kc, vc) == before


@pytest.mark.parametrize("w", BIG)
def test_huge_window_dask(w):
    da = pytest.importorskip("dask.array")
    import pyattn.dask as pdask
    q, k, v = _qkv(L=64, S=64)
    qd, kd, vd = (da.from_array(x, chunks=(1, 16, 4)) for x in (q, k, v))
    for win, ref in (((0, w), (0, None)), ((w, 3), (None, 3))):
        a = pdask.scaled_dot_product_attention(qd, kd, vd, is_causal=True, window=win).compute()
        b = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, window=ref)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_append_private_entry_checks():
    """_C.sdpa's append, called directly: every check before anything is written."""
    q, kc, vc, k, v = _kv_case(T=2)
    before = _snap(kc, vc)
    pos = np.array([0, 7], np.int64)
    kv_len = np.array([2, 8, 2, 8], np.int64)       # one per (batch, head)
    bad = [((kc, vc, k, v, pos), ValueError),                          # 7 + 2 > 8
           ((kc, vc, k.astype(np.float64), v, np.zeros(2, np.int64)), TypeError),
           ((kc, vc, k[:, :1], v, np.zeros(2, np.int64)), ValueError),
           ((kc, vc, k, v, np.zeros(3, np.int64)), ValueError),
           ((kc, vc, k, v, np.array([0, 2**63 - 1], np.int64)), ValueError),
           ((kc, vc, k, v, np.array([-1, 0], np.int64)), ValueError),
           ((kc, np.zeros_like(vc)[..., :0, :], k, v, np.zeros(2, np.int64)), ValueError),
           ((kc, vc, k, v), TypeError)]
    for app, exc in bad:
        with pytest.raises(exc):
            _C.sdpa(q, kc, vc, causal=2, kv_len=kv_len, append=app)
        assert _snap(kc, vc) == before
    ro = kc.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        _C.sdpa(q, kc, vc, causal=2, kv_len=kv_len, append=(ro, vc, k, v, np.zeros(2, np.int64)))


@pytest.mark.parametrize("qoff", [2**62, -(2**62), 2**62 - 3, 5])
def test_private_positions_at_the_limits(qoff):
    """_C.sdpa with a position offset near 2**62 and windows up to 2**63 - 1:
    the key ranges (whose sums saturate, UBSan-clean) equal a bool mask built
    from Python ints."""
    q, k, v = _qkv(L=4, S=6)
    L, S = 4, 6
    for causal in (0, 1):
        for left in (-1, 0, 2, 2**61, 2**62, sys.maxsize):
            for right in (-1, 0, 2**62, sys.maxsize):
                d = [i + qoff for i in range(L)]
                m = np.array([[(not causal or j <= d[i]) and (left < 0 or j >= d[i] - left) and
                               (right < 0 or j <= d[i] + right) for j in range(S)] for i in range(L)])
                got = _C.sdpa(q, k, v, causal=causal, left=left, right=right, qoff=qoff, want_lse=True)
                ref = _C.sdpa(q, k, v, mask=np.broadcast_to(m, (2, L, S)).copy(), want_lse=True)
                np.testing.assert_allclose(got[0], ref[0], rtol=1e-13, atol=1e-15)
                np.testing.assert_array_equal(np.isinf(got[2]), np.isinf(ref[2]))
    with pytest.raises(ValueError, match="qoff"):
        _C.sdpa(q, k, v, qoff=2**62 + 1)
