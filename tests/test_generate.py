"""Generation features (API.md wave 2): structured masks (window, ALiBi, softcap,
sinks), return_lse, merge_attention, attention_with_kvcache, KVCache and the
layers' caches -- against the plain-NumPy oracle (pyattn._reference) here,
against PyTorch in test_torch_generate.py."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from pyattn.nn import CausalAttention, MultiHeadAttention
from conftest import DTYPES, LAYOUTS, TOL, check, frozen, make, mag_attention, unchanged


def mag(q, k, v, w, scale, slopes=None, L=None, S=None):
    """mag_attention, with ALiBi's bias magnitude in the scores' error: the bias
    slope * |d - j| is rounded to the compute dtype like any score."""
    m = mag_attention(q, k, v, w, scale)
    if slopes is not None:
        bias = np.max(np.abs(np.asarray(slopes, np.float64))) * (L + S)
        m = m * (1.0 + bias)
    return m


def lse_mag(lse, S):
    """Error scale of a log-sum-exp: |lse| plus the sum's log(S) growth."""
    a = np.abs(np.where(np.isfinite(lse), lse, 0.0)).astype(np.float64)
    return (4.0 + a + np.log1p(S)) * np.sqrt(S + 1.0)


CASES = {
    "window": dict(window=(5, 2)),
    "window_left_causal": dict(window=(7, 0), is_causal=True),
    "window_br": dict(window=(3, None), is_causal="bottom_right"),
    "window_right_only": dict(window=(None, 1)),
    "alibi": dict(alibi=True),
    "alibi_causal_br": dict(alibi=True, is_causal="bottom_right"),
    "softcap": dict(softcap=2.5),
    "sinks": dict(sinks=True),
    "sinks_causal": dict(sinks=True, is_causal=True),
    "all": dict(window=(9, 3), alibi=True, softcap=4.0, sinks=True, is_causal="bottom_right"),
    "all_bool_mask": dict(window=(6, 0), alibi=True, softcap=3.0, sinks=True, mask="bool"),
    "float_mask_softcap": dict(softcap=1.5, mask="float"),
}


def _kw(rng, case, H, B, L, S, dtype):
    c = dict(CASES[case])
    kw = {}
    if "window" in c:
        kw["window"] = c["window"]
    if "is_causal" in c:
        kw["is_causal"] = c["is_causal"]
    if c.get("alibi"):
        kw["alibi_slopes"] = rng.uniform(0.01, 0.5, (B, H)) if rng.random() < 0.5 else rng.uniform(0.01, 0.5, H)
    if "softcap" in c:
        kw["softcap"] = c["softcap"]
    if c.get("sinks"):
        kw["sinks"] = rng.standard_normal(H) * 2
    if c.get("mask") == "bool":
        m = rng.random((L, S)) > 0.3
        kw["attn_mask"] = m
    elif c.get("mask") == "float":
        kw["attn_mask"] = rng.standard_normal((H, L, S)).astype(dtype)
    return kw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("L, S", [(1, 1), (3, 40), (8, 5000), (37, 53), (130, 97), (64, 300)])
def test_structured_vs_reference(rng, dtype, case, L, S):
    B, H, E, Ev = 2, 3, 16, 8
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, Ev)).astype(dtype)
    kw = _kw(rng, case, H, B, L, S, dtype)
    before = frozen(q, k, v)
    out, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    unchanged(before, (q, k, v))
    ro, rw, rl = R.scaled_dot_product_attention(q, k, v, return_weights=True, return_lse=True, **kw)
    sc = 1 / np.sqrt(E)
    m = mag(q, k, v, rw, sc, kw.get("alibi_slopes"), L, S)
    check(out, ro, m)
    check(lse, rl, lse_mag(rl, S) * (1 + (np.max(kw["alibi_slopes"]) * (L + S) if "alibi_slopes" in kw else 0)))
    # the weights path (the exact C path) agrees too, and its weights are the reference's
    o2, w2, l2 = pyattn.scaled_dot_product_attention(q, k, v, return_weights=True, return_lse=True, **kw)
    check(o2, ro, m)
    check(w2, rw, (np.max(rw, axis=-1, keepdims=True) + rw) * (8 + np.log1p(S)) * np.sqrt(E + 1)
          * (1 + (np.max(kw["alibi_slopes"]) * (L + S) if "alibi_slopes" in kw else 0))
          * (1 + np.max(np.abs(np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2))))) + 1e-300)
    check(l2, rl, lse_mag(rl, S) * (1 + (np.max(kw["alibi_slopes"]) * (L + S) if "alibi_slopes" in kw else 0)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_structured_layouts_and_gqa(rng, layout):
    dtype = np.float32
    q = make(rng, (2, 8, 33, 16), dtype, layout)
    k = make(rng, (2, 2, 70, 16), dtype, layout)
    v = make(rng, (2, 2, 70, 12), dtype, layout)
    kw = dict(window=(11, 4), alibi_slopes=rng.uniform(0, 0.3, 8), softcap=5.0,
              sinks=rng.standard_normal(8), is_causal="bottom_right")
    out, lse = pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True, **kw)
    ro, rw, rl = R.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_weights=True,
                                                return_lse=True, **kw)
    check(out, ro, mag(q, np.repeat(k, 4, -3), np.repeat(v, 4, -3), rw, 0.25, kw["alibi_slopes"], 33, 70))
    check(lse, rl, lse_mag(rl, 70) * (1 + 0.3 * 103))


def test_window_skips_rows_with_nothing(rng):
    """A window that leaves a row nothing: output 0, lse -inf, never NaN;
    with a sink, still 0 output (sink values are zero) and lse = sink."""
    q = rng.standard_normal((1, 6, 8))
    k = rng.standard_normal((1, 10, 8))
    v = rng.standard_normal((1, 10, 4))
    # right window of -? use a window that excludes everything for early rows:
    # causal top-left with left=0 right=0 and a bool mask removing the diagonal
    mask = ~np.eye(6, 10, dtype=bool)
    out, lse = pyattn.scaled_dot_product_attention(q, k, v, mask, window=(0, 0), return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)
    sinks = np.array([1.5])
    out, lse = pyattn.scaled_dot_product_attention(q[None], k[None], v[None], mask, window=(0, 0),
                                                   sinks=sinks, return_lse=True)
    assert np.all(out == 0) and np.allclose(lse, 1.5)


def test_sink_weights_sum_below_one(rng):
    q, k, v = rng.standard_normal((3, 2, 5, 7, 8))
    sinks = np.array([0.0, 3.0, -2.0, 10.0, -50.0])
    o, w = pyattn.scaled_dot_product_attention(q, k, v, sinks=sinks, return_weights=True)
    tot = w.sum(-1)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(8)
    expect = np.exp(s).sum(-1) / (np.exp(s).sum(-1) + np.exp(sinks)[:, None])
    assert np.allclose(tot, expect, rtol=1e-12, atol=0)
    assert np.allclose(o, np.matmul(w, v), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lse_matches_logsumexp_and_dropout_leaves_it(rng, dtype):
    q = rng.standard_normal((2, 40, 16)).astype(dtype)
    k = rng.standard_normal((2, 60, 16)).astype(dtype)
    v = rng.standard_normal((2, 60, 16)).astype(dtype)
    _, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    s = np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2).astype(np.float64)) / 4
    s = np.where(np.tril(np.ones((40, 60), bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    want = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
    check(lse, want, lse_mag(want, 60))
    _, lse_d = pyattn.scaled_dot_product_attention(q, k, v, dropout_p=0.4, rng=3, is_causal=True,
                                                   return_lse=True)
    assert np.array_equal(lse, lse_d)


def test_return_order(rng):
    q = k = v = rng.standard_normal((4, 8))
    r = pyattn.scaled_dot_product_attention(q, k, v, return_weights=True, return_lse=True)
    assert len(r) == 3 and r[0].shape == (4, 8) and r[1].shape == (4, 4) and r[2].shape == (4,)
    r = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert len(r) == 2 and r[1].shape == (4,)


# ---- merge_attention ---------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("parts", range(1, 8))
def test_merge_random_disjoint_parts(rng, dtype, parts):
    """Keys split into `parts` random disjoint sets (bool masks), each attended
    with return_lse, merged: equals attention over all keys; rows where every
    part is empty give 0 and -inf."""
    B, H, L, S, E = 2, 2, 19, 45, 8
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, E)).astype(dtype)
    base = rng.random((L, S)) > 0.4
    base[3] = False                            # a row with nothing anywhere
    owner = rng.integers(0, parts, S)
    outs, lses = [], []
    for p in range(parts):
        o, l = pyattn.scaled_dot_product_attention(q, k, v, base & (owner == p), return_lse=True)
        outs.append(o)
        lses.append(l)
    before = frozen(*outs, *lses)
    out, lse = pyattn.merge_attention(outs, lses)
    unchanged(before, outs + lses)
    whole, wl = pyattn.scaled_dot_product_attention(q, k, v, base, return_lse=True)
    ro, rw, rl = R.scaled_dot_product_attention(q, k, v, base, return_weights=True, return_lse=True)
    assert out.dtype == dtype and lse.dtype == dtype
    check(out, ro, mag_attention(q, k, v, rw, E ** -0.5) * parts)
    check(lse, rl, lse_mag(rl, S) * parts)
    assert np.all(out[:, :, 3] == 0) and np.all(lse[:, :, 3] == -np.inf)
    # the stacked-array form and the reference merge agree
    o2, l2 = pyattn.merge_attention(np.stack(outs), np.stack(lses))
    assert np.array_equal(o2, out) and np.array_equal(l2, lse)
    mo, ml = R.merge_attention(outs, lses)
    check(out, mo, mag_attention(q, k, v, rw, E ** -0.5) * parts)


def test_merge_nan_part_with_no_keys_does_not_spread():
    o = np.zeros((2, 1, 3, 4))
    o[1] = np.nan
    l = np.zeros((2, 1, 3))
    l[1] = -np.inf
    out, lse = pyattn.merge_attention(o, l)
    assert np.all(out == 0) and np.all(lse == 0)
    l[0, 0, 1] = np.nan
    out, lse = pyattn.merge_attention(o, l)
    assert np.isnan(lse[0, 1]) and np.isnan(out[0, 1]).all() and not np.isnan(out[0, 0]).any()


def test_merge_errors():
    with pytest.raises(ValueError, match="lses"):
        pyattn.merge_attention(np.zeros((2, 3, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="outputs"):
        pyattn.merge_attention(np.zeros((3, 4)), np.zeros((3,)))
    with pytest.raises(ValueError, match="different shapes"):
        pyattn.merge_attention([np.zeros((3, 4)), np.zeros((2, 4))], [np.zeros(3), np.zeros(2)])
    with pytest.raises(TypeError, match="outputs"):
        pyattn.merge_attention(np.zeros((2, 3, 4), complex), np.zeros((2, 3)))


# ---- attention_with_kvcache --------------------------------------------------

def _fill(rng, B, Hkv, S_max, E, Ev, n, dtype):
    kc = np.zeros((B, Hkv, S_max, E), dtype)
    vc = np.zeros((B, Hkv, S_max, Ev), dtype)
    for b in range(B):
        kc[b, :, :n[b]] = rng.standard_normal((Hkv, n[b], E))
        vc[b, :, :n[b]] = rng.standard_normal((Hkv, n[b], Ev))
    return kc, vc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq, Hkv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("new", [True, False])
def test_kvcache_vs_reference(rng, dtype, Hq, Hkv, T, new):
    B, S_max, E, Ev = 3, 5000, 16, 8
    n = np.array([0, 17, 4100]) if new else np.array([5, 17, 4100])
    kc, vc = _fill(rng, B, Hkv, S_max, E, Ev, n, dtype)
    q = rng.standard_normal((B, Hq, T, E)).astype(dtype)
    key = rng.standard_normal((B, Hkv, T, E)).astype(dtype) if new else None
    val = rng.standard_normal((B, Hkv, T, Ev)).astype(dtype) if new else None
    n_before = n.copy()
    kc0, vc0 = kc.copy(), vc.copy()
    out, lse = pyattn.attention_with_kvcache(q, kc, vc, key, val, cache_seqlens=n, return_lse=True)
    assert np.array_equal(n, n_before)
    ro, rk, rv, rl = R.attention_with_kvcache(q, kc0, vc0, key, val, cache_seqlens=n, return_lse=True)
    assert np.array_equal(kc, rk) and np.array_equal(vc, rv)   # only the new rows changed
    for b in range(B):
        nb = n[b] + (T if new else 0)
        kk = np.repeat(rk[b, :, :nb], Hq // Hkv, 0)
        vv = np.repeat(rv[b, :, :nb], Hq // Hkv, 0)
        w = R.scaled_dot_product_attention(q[b], kk, vv, None, 0.0, "bottom_right", None,
                                           qoff=int(nb) - T, return_weights=True)[1]
        check(out[b], ro[b], mag_attention(q[b], kk, vv, w, E ** -0.5))
        check(lse[b], rl[b], lse_mag(rl[b], max(int(nb), 1)))


def test_kvcache_structured(rng):
    B, Hq, Hkv, S_max, E = 2, 4, 2, 300, 8
    n = np.array([100, 250])
    kc, vc = _fill(rng, B, Hkv, S_max, E, E, n, np.float64)
    q = rng.standard_normal((B, Hq, 3, E))
    key = rng.standard_normal((B, Hkv, 3, E))
    val = rng.standard_normal((B, Hkv, 3, E))
    kw = dict(window=(20, 0), alibi_slopes=rng.uniform(0, 0.2, (B, Hq)), softcap=6.0,
              sinks=rng.standard_normal(Hq))
    kc0, vc0 = kc.copy(), vc.copy()
    out = pyattn.attention_with_kvcache(q, kc, vc, key, val, cache_seqlens=n, **kw)
    ro = R.attention_with_kvcache(q, kc0, vc0, key, val, cache_seqlens=n, **kw)[0]
    assert np.allclose(out, ro, rtol=1e-12, atol=1e-12)


def test_kvcache_equals_full_causal(rng):
    """Token by token through a cache == one causal call over the whole sequence."""
    B, H, L, E = 2, 4, 40, 16
    q, k, v = rng.standard_normal((3, B, H, L, E)).astype(np.float32)
    full = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    cache = pyattn.KVCache(B, H, 64, E)
    outs = [cache.attend(q[:, :, :7], k[:, :, :7], v[:, :, :7])]
    for t in range(7, L):
        outs.append(cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
    inc = np.concatenate(outs, axis=2)
    w = R.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)[1]
    check(inc, full, 2 * mag_attention(q, k, v, w, E ** -0.5))
    assert cache.lengths.tolist() == [L, L]
    cache.reset()
    assert cache.lengths.tolist() == [0, 0]


def test_kvcache_threads_bit_identical(rng):
    B, Hq, Hkv, S_max, E = 1, 8, 2, 20000, 64
    n = np.array([19000])
    kc, vc = _fill(rng, B, Hkv, S_max, E, E, n, np.float32)
    q = rng.standard_normal((B, Hq, 1, E)).astype(np.float32)
    t0 = pyattn.get_num_threads()
    try:
        res = []
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            res.append(pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, window=(5000, 0),
                                                     sinks=np.ones(8), return_lse=True))
        for r in res[1:]:
            assert np.array_equal(r[0], res[0][0]) and np.array_equal(r[1], res[0][1])
    finally:
        pyattn.set_num_threads(t0)


def test_kvcache_int_and_python_int_seqlens(rng):
    kc, vc = _fill(rng, 2, 1, 10, 4, 4, [3, 3], np.float32)
    q = rng.standard_normal((2, 1, 1, 4)).astype(np.float32)
    a = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=3)
    b = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=np.array([3, 3], np.int32))
    assert np.array_equal(a, b)


def test_kvcache_converts_new_rows_to_cache_dtype(rng):
    kc = np.zeros((1, 1, 8, 4), np.float32)
    vc = np.zeros((1, 1, 8, 4), np.float32)
    key = rng.standard_normal((1, 1, 2, 4))      # float64
    val = rng.standard_normal((1, 1, 2, 4))
    q = rng.standard_normal((1, 1, 2, 4))
    out = pyattn.attention_with_kvcache(q, kc, vc, key, val, cache_seqlens=[1])
    assert out.dtype == np.float32
    assert np.array_equal(kc[0, 0, 1:3], key[0, 0].astype(np.float32))
    assert np.all(kc[0, 0, 0] == 0) and np.all(kc[0, 0, 3:] == 0)


BAD = [
    (dict(cache_seqlens=-1), ValueError, "cache_seqlens"),
    (dict(cache_seqlens=[1, 2, 3]), ValueError, "cache_seqlens"),
    (dict(cache_seqlens=1.5), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=np.array([1.0, 2.0])), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=[9, 2]), ValueError, "S_max"),
    (dict(cache_seqlens=2, window=(-1, 0)), ValueError, "window"),
    (dict(cache_seqlens=2, window=(1.5, 0)), TypeError, "window"),
    (dict(cache_seqlens=2, window=3), TypeError, "window"),
    (dict(cache_seqlens=2, softcap=0.0), ValueError, "softcap"),
    (dict(cache_seqlens=2, softcap=-1.0), ValueError, "softcap"),
    (dict(cache_seqlens=2, alibi_slopes=np.ones(3)), ValueError, "alibi_slopes"),
    (dict(cache_seqlens=2, sinks=np.ones((2, 2, 4))), ValueError, "sinks"),
    (dict(cache_seqlens=2, is_causal="bottom_right"), TypeError, "is_causal"),
]


@pytest.mark.parametrize("kw, exc, match", BAD)
def test_kvcache_bad_input_writes_nothing(rng, kw, exc, match):
    kc, vc = _fill(rng, 2, 2, 10, 4, 4, [2, 2], np.float32)
    q = rng.standard_normal((2, 4, 2, 4)).astype(np.float32)
    key = rng.standard_normal((2, 2, 2, 4)).astype(np.float32)
    val = rng.standard_normal((2, 2, 2, 4)).astype(np.float32)
    before = frozen(kc, vc, q, key, val)
    with pytest.raises(exc, match=match):
        pyattn.attention_with_kvcache(q, kc, vc, key, val, **kw)
    unchanged(before, (kc, vc, q, key, val))


def test_kvcache_bad_caches(rng):
    kc, vc = _fill(rng, 2, 2, 10, 4, 4, [2, 2], np.float32)
    q = rng.standard_normal((2, 4, 1, 4)).astype(np.float32)
    key = rng.standard_normal((2, 2, 1, 4)).astype(np.float32)
    ro = kc.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache is read-only"):
        pyattn.attention_with_kvcache(q, ro, vc, key, key, cache_seqlens=2)
    assert np.all(vc[:, :, 2] == 0)
    pyattn.attention_with_kvcache(q, ro, vc, cache_seqlens=2)   # reading a read-only cache is fine
    with pytest.raises(TypeError, match="k_cache must be float32, float64, float16 or bfloat16"):
        pyattn.attention_with_kvcache(q, kc.astype(np.int32), vc, cache_seqlens=2)
    with pytest.raises(ValueError, match="multiple of the cache heads"):
        pyattn.attention_with_kvcache(q[:, :3], kc, vc, cache_seqlens=2)
    with pytest.raises(ValueError, match="key has shape"):
        pyattn.attention_with_kvcache(q, kc, vc, key[:, :1], key, cache_seqlens=2)
    with pytest.raises(ValueError, match="both key and value"):
        pyattn.attention_with_kvcache(q, kc, vc, key, cache_seqlens=2)
    with pytest.raises(ValueError, match="v_cache has shape"):
        pyattn.attention_with_kvcache(q, kc, vc[:, :, :5], cache_seqlens=2)
    with pytest.raises(TypeError, match="k_cache must be a numpy.ndarray"):
        pyattn.attention_with_kvcache(q, kc.tolist(), vc, cache_seqlens=2)
    with pytest.raises(ValueError, match="query must be"):
        pyattn.attention_with_kvcache(q[0], kc, vc, cache_seqlens=2)
    with pytest.raises(TypeError, match="cache_seqlens is required"):
        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=None)


def test_kvcache_overflow_through_KVCache_writes_nothing(rng):
    c = pyattn.KVCache(1, 1, 4, 2)
    x = rng.standard_normal((1, 1, 3, 2)).astype(np.float32)
    c.attend(x, x, x)
    k0 = c.k.copy()
    with pytest.raises(pyattn.CacheFullError, match="max_len=4"):     # API.md: a MemoryError
        c.attend(x, x, x)
    assert np.array_equal(c.k, k0) and c.lengths.tolist() == [3]


def test_KVCache_constructor_errors():
    with pytest.raises(TypeError, match="dtype"):
        pyattn.KVCache(1, 1, 4, 2, dtype=np.int32)
    with pytest.raises(ValueError, match="max_len"):
        pyattn.KVCache(1, 1, -4, 2)
    with pytest.raises(TypeError, match="batch"):
        pyattn.KVCache(1.5, 1, 4, 2)
    c = pyattn.KVCache(2, 3, 5, 4, value_dim=6, dtype=np.float64)
    assert c.k.shape == (2, 3, 5, 4) and c.v.shape == (2, 3, 5, 6) and c.max_len == 5
    assert "KVCache(batch=2" in repr(c)


# ---- structured-mask argument errors on the main entry point -------------------

@pytest.mark.parametrize("kw, exc, match", [
    (dict(window=(-2, 0)), ValueError, "window"),
    (dict(window=(1, 2, 3)), TypeError, "window"),
    (dict(window=(True, 0)), TypeError, "window"),
    (dict(softcap=0), ValueError, "softcap"),
    (dict(softcap=float("inf")), ValueError, "softcap"),
    (dict(softcap="x"), TypeError, "softcap"),
    (dict(alibi_slopes=np.ones(5)), ValueError, "alibi_slopes"),
    (dict(alibi_slopes=np.ones((3, 4))), ValueError, "alibi_slopes"),
    (dict(alibi_slopes=np.ones(4, complex)), TypeError, "alibi_slopes"),
    (dict(sinks=np.ones((4, 1))), ValueError, "sinks"),
    (dict(sinks=np.array(["a"] * 4)), TypeError, "sinks"),
])
def test_structured_errors(rng, kw, exc, match):
    q = rng.standard_normal((2, 4, 5, 8))
    with pytest.raises(exc, match=match):
        pyattn.scaled_dot_product_attention(q, q, q, **kw)


def test_slopes_need_a_head_axis(rng):
    q = rng.standard_normal((5, 8))
    with pytest.raises(ValueError, match="alibi_slopes"):
        pyattn.scaled_dot_product_attention(q, q, q, alibi_slopes=np.ones(1))


def test_structured_threads_bit_identical(rng):
    q = rng.standard_normal((2, 4, 300, 32)).astype(np.float32)
    k = rng.standard_normal((2, 4, 300, 32)).astype(np.float32)
    kw = dict(window=(50, 10), alibi_slopes=np.linspace(0.1, 0.4, 4), softcap=8.0,
              sinks=np.zeros(4), is_causal=True, return_lse=True)
    t0 = pyattn.get_num_threads()
    try:
        pyattn.set_num_threads(1)
        a = pyattn.scaled_dot_product_attention(q, k, k, **kw)
        pyattn.set_num_threads(2)
        b = pyattn.scaled_dot_product_attention(q, k, k, **kw)
        # a head alone gives the same bits as in the batch
        one = dict(kw, alibi_slopes=kw["alibi_slopes"][2:3], sinks=kw["sinks"][2:3])
        c = pyattn.scaled_dot_product_attention(q[1:2, 2:3], k[1:2, 2:3], k[1:2, 2:3], **one)
    finally:
        pyattn.set_num_threads(t0)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.array_equal(c[0][0, 0], a[0][1, 2]) and np.array_equal(c[1][0, 0], a[1][1, 2])


# ---- layers with a cache -----------------------------------------------------

@pytest.mark.parametrize("make_layer", [
    lambda: MultiHeadAttention(32, 32, 4, context_length=64, rng=0),
    lambda: MultiHeadAttention(24, 48, 6, rng=1, out_bias=False, qkv_bias=True),
    lambda: CausalAttention(32, 16, 64, rng=2),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_cache_equals_full_sequence(rng, make_layer, dtype):
    m = make_layer().eval()
    x = rng.standard_normal((2, 30, m.d_in)).astype(dtype)
    full = m(x)
    c = m.new_cache(2, 40, dtype=dtype)
    outs = [m(x[:, :4], cache=c)] + [m(x[:, t:t + 1], cache=c) for t in range(4, 27)] + [m(x[:, 27:], cache=c)]
    inc = np.concatenate(outs, axis=1)
    assert inc.dtype == dtype
    # both are chains of float ops on the same inputs: a few ulps of the result's scale
    assert np.max(np.abs(inc - full)) <= 64 * TOL[np.dtype(dtype)] * (1 + np.max(np.abs(full)))
    assert c.lengths.tolist() == [30, 30]


def test_layer_cache_errors(rng):
    m = MultiHeadAttention(8, 8, 2, context_length=6, dropout=0.1, rng=0)
    x = rng.standard_normal((1, 3, 8))
    c = m.new_cache(1, 10)
    with pytest.raises(ValueError, match="eval"):
        m(x, cache=c)
    m.eval()
    with pytest.raises(ValueError, match="attn_mask"):
        m(x, attn_mask=np.ones((3, 3), bool), cache=c)
    with pytest.raises(TypeError, match="KVCache"):
        m(x, cache="cache")
    with pytest.raises(ValueError, match="does not fit"):
        m(x, cache=pyattn.KVCache(2, 2, 10, 4))
    m(x, cache=c)
    with pytest.raises(ValueError, match="context_length"):
        m(rng.standard_normal((1, 4, 8)), cache=c)
    assert c.lengths.tolist() == [3]


def test_gqa_decode_stacked_rows_into_out(rng):
    """Decoding with GQA runs a key/value head's query heads as rows of one call;
    the result lands in a given out= (also a transposed one) and lse matches."""
    q = rng.standard_normal((2, 8, 1, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 50, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 50, 12)).astype(np.float32)
    want, wl = pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal="bottom_right",
                                                   return_lse=True)
    rw, rl = R.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal="bottom_right", return_lse=True)
    check(want, rw, mag_attention(q, np.repeat(k, 4, 1), np.repeat(v, 4, 1),
                                  R.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal="bottom_right",
                                                                 return_weights=True)[1], 0.25))
    for out in (np.full((2, 8, 1, 12), 7, np.float32), np.full((2, 1, 8, 12), 7, np.float32).transpose(0, 2, 1, 3)):
        r = pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal="bottom_right", out=out)
        assert r is out and np.array_equal(out, want)
    o, lse = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=50, return_lse=True,
                                           out=np.empty((2, 8, 1, 12), np.float32))
    assert np.array_equal(o, want) and np.array_equal(lse, wl)
