"""Property tests (hypothesis): random shapes, strides, dtypes and masks
against the NumPy reference, and the invariants every softmax must keep."""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import pyattn  # noqa: E402
from pyattn import _reference as R  # noqa: E402
from pyattn._checks import dropout_key  # noqa: E402
from conftest import LAYOUTS, check, mag_attention, mag_matmul, mag_softmax, make  # noqa: E402

N_EXAMPLES = 150
PROFILE = settings(max_examples=N_EXAMPLES, deadline=None, derandomize=True)
dtypes = st.sampled_from([np.float32, np.float64])
layouts = st.sampled_from(LAYOUTS)


@PROFILE
@given(seed=st.integers(0, 2**32 - 1), dtype=dtypes, lq=layouts, lk=layouts, lv=layouts,
       B=st.integers(1, 3), L=st.integers(1, 70), S=st.integers(1, 130), E=st.integers(1, 40),
       Ev=st.integers(1, 40), causal=st.sampled_from([False, True, "bottom_right"]),
       mask=st.sampled_from([None, "bool", "float", "bool_row"]), p=st.sampled_from([0.0, 0.0, 0.25]),
       scale=st.sampled_from([None, 0.1, 1.0]))
def test_sdpa_matches_reference(seed, dtype, lq, lk, lv, B, L, S, E, Ev, causal, mask, p, scale):
    rng = np.random.default_rng(seed)
    q, k, v = make(rng, (B, L, E), dtype, lq), make(rng, (B, S, E), dtype, lk), make(rng, (1, S, Ev), dtype, lv)
    m = None
    if mask == "bool":
        m = rng.random((B, L, S)) > 0.3
    elif mask == "float":
        m = np.where(rng.random((L, S)) > 0.2, rng.standard_normal((L, S)), -np.inf)
    elif mask == "bool_row":
        m = rng.random((S,)) > 0.5
    key = dropout_key(seed) if p > 0 else 0
    out, w = pyattn.scaled_dot_product_attention(q, k, v, m, p, causal, scale, rng=seed, return_weights=True)
    fused = pyattn.scaled_dot_product_attention(q, k, v, m, p, causal, scale, rng=seed)
    want, ww = R.scaled_dot_product_attention(q, k, v, m, p, causal, scale, dropout_key=key, return_weights=True)
    sc = (1 / np.sqrt(E)) if scale is None else scale
    mag = mag_attention(q, k, np.broadcast_to(v, (B, S, Ev)), ww, sc)
    check(out, want, mag)
    check(fused, want, mag)
    s = np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2).astype(np.float64)) * sc
    check(w, ww, mag_softmax(s, ww) / (1 - p))


@PROFILE
@given(seed=st.integers(0, 2**32 - 1), dtype=dtypes, la=layouts, lb=layouts,
       batch_a=st.sampled_from([(), (1,), (3,), (2, 1)]), batch_b=st.sampled_from([(), (1,), (3,), (1, 3)]),
       M=st.integers(1, 90), N=st.integers(1, 90), K=st.integers(0, 300))
def test_matmul_matches_numpy(seed, dtype, la, lb, batch_a, batch_b, M, N, K):
    rng = np.random.default_rng(seed)
    a = make(rng, batch_a + (M, K), dtype, la)
    b = make(rng, batch_b + (K, N), dtype, lb)
    got = pyattn.matmul(a, b)
    check(got, R.matmul(a, b), mag_matmul(a, b))


@PROFILE
@given(seed=st.integers(0, 2**32 - 1), dtype=dtypes, shape=st.sampled_from([(7,), (3, 40), (2, 5, 129), (4, 1)]),
       spread=st.sampled_from([1.0, 10.0, 1e3]), shift=st.sampled_from([-50.0, 3.0, 60.0]),
       masked=st.booleans())
def test_softmax_invariants(seed, dtype, shape, spread, shift, masked):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * spread).astype(dtype)
    mask = (rng.random(shape) > 0.4) if masked else None
    w = pyattn.softmax(x, attn_mask=mask)
    sums = w.sum(-1)
    tol = 64 * np.finfo(dtype).eps * shape[-1]
    assert np.all((np.abs(sums - 1) <= tol) | (sums == 0)), sums
    assert np.all(w >= 0)
    if masked:
        assert np.all(w[~np.broadcast_to(mask, shape)] == 0)
    # shifting a row by a constant does not change it (up to the rounding of x + c)
    xs = (x.astype(np.float64) + shift).astype(dtype)
    ws = pyattn.softmax(xs, attn_mask=mask)
    exact = R.softmax(xs, attn_mask=mask)
    s = xs.astype(np.float64) if mask is None else np.where(np.broadcast_to(mask, shape), xs, -np.inf)
    check(ws, exact, mag_softmax(s, exact))
    # x + c is rounded: each difference of two entries moves by up to twice that
    # rounding, which moves a weight by at most w * (exp(2 * rounding) - 1)
    rounding = np.abs(xs.astype(np.float64) - shift - x).max()
    assert np.allclose(ws, w, rtol=0, atol=2 * tol + np.expm1(2 * rounding) + 1e-300)


@PROFILE
@given(seed=st.integers(0, 2**32 - 1), dtype=dtypes, L=st.integers(1, 60), E=st.integers(1, 70),
       Ev=st.integers(1, 70), causal=st.sampled_from([False, "bottom_right"]))
def test_single_key_returns_its_value(seed, dtype, L, E, Ev, causal):
    rng = np.random.default_rng(seed)
    q = make(rng, (2, L, E), dtype)
    k = make(rng, (2, 1, E), dtype)
    v = make(rng, (2, 1, Ev), dtype, "negative")
    out = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # bottom-right: only the last query row sees the key (j <= i + S - L); the rows
    # before it have no admissible key and are 0
    first = L - 1 if causal else 0
    assert np.array_equal(out[:, first:], np.broadcast_to(v, out[:, first:].shape))
    assert np.array_equal(out[:, :first], np.zeros_like(out[:, :first]))


@PROFILE
@given(seed=st.integers(0, 2**32 - 1), dtype=dtypes, lq=layouts, lk=layouts, lv=layouts,
       L=st.integers(1, 70), S=st.integers(1, 130), E=st.integers(1, 40), Ev=st.integers(1, 24),
       causal=st.sampled_from([False, True, "bottom_right"]),
       left=st.sampled_from([None, 0, 3, 40]), right=st.sampled_from([None, 0, 5]),
       alibi=st.booleans(), softcap=st.sampled_from([None, 0.5, 20.0]), sinks=st.booleans(),
       mask=st.sampled_from([None, "bool", "float"]), groups=st.sampled_from([1, 2]))
def test_structured_sdpa_matches_reference(seed, dtype, lq, lk, lv, L, S, E, Ev, causal, left, right,
                                           alibi, softcap, sinks, mask, groups):
    rng = np.random.default_rng(seed)
    H = 2 * groups
    q = make(rng, (2, H, L, E), dtype, lq)
    k = make(rng, (2, 2, S, E), dtype, lk)
    v = make(rng, (2, 2, S, Ev), dtype, lv)
    kw = dict(is_causal=causal, enable_gqa=groups > 1, return_lse=True)
    if left is not None or right is not None:
        kw["window"] = (left, right)
    slopes = rng.uniform(0, 0.3, H) if alibi else None
    if alibi:
        kw["alibi_slopes"] = slopes
    if softcap:
        kw["softcap"] = softcap
    if sinks:
        kw["sinks"] = rng.standard_normal(H)
    if mask == "bool":
        kw["attn_mask"] = rng.random((L, S)) > 0.3
    elif mask == "float":
        kw["attn_mask"] = rng.standard_normal((H, L, S))
    out, lse = pyattn.scaled_dot_product_attention(q, k, v, **kw)
    want, ww, wl = R.scaled_dot_product_attention(q, k, v, return_weights=True, **kw)
    kk, vv = np.repeat(k, groups, 1), np.repeat(v, groups, 1)
    bias = 1 + (0.3 * (L + S) if alibi else 0)
    check(out, want, mag_attention(q, kk, vv, ww, 1 / np.sqrt(E)) * bias)
    fin = np.abs(np.where(np.isfinite(wl), wl, 0))
    check(lse, wl, (4 + fin + np.log1p(S)) * np.sqrt(S + 1) * bias)
    # splitting the keys in two and merging gives the whole (sinks go with one part)
    cut = int(rng.integers(0, S + 1))
    kw1 = dict(kw)
    kw2 = {x: y for x, y in kw.items() if x != "sinks"}
    m = kw.get("attn_mask")
    if m is not None:
        kw1["attn_mask"], kw2["attn_mask"] = m[..., :cut], m[..., cut:]
    if causal or "window" in kw or alibi:
        return      # positions depend on S: the parts would need a shifted query position
    o1, l1 = pyattn.scaled_dot_product_attention(q, k[..., :cut, :], v[..., :cut, :], **kw1)
    o2, l2 = pyattn.scaled_dot_product_attention(q, k[..., cut:, :], v[..., cut:, :], **kw2)
    mo, ml = pyattn.merge_attention([o1, o2], [l1, l2])
    check(mo, want, 2 * mag_attention(q, kk, vv, ww, 1 / np.sqrt(E)))
    check(ml, wl, 2 * (4 + fin + np.log1p(S)) * np.sqrt(S + 1))


@PROFILE
@given(seed=st.integers(0, 2**32 - 1), dtype=dtypes, lq=layouts, lk=layouts, lv=layouts,
       B=st.integers(1, 2), L=st.integers(1, 60), S=st.integers(1, 130), E=st.integers(1, 40),
       Ev=st.integers(1, 40), causal=st.sampled_from([False, True, "bottom_right"]),
       mask=st.sampled_from([None, "bool", "float"]), p=st.sampled_from([0.0, 0.0, 0.25]),
       window=st.sampled_from([None, (5, 0), (None, 3)]), softcap=st.sampled_from([None, 3.0]))
def test_backward_matches_reference(seed, dtype, lq, lk, lv, B, L, S, E, Ev, causal, mask, p, window, softcap):
    from test_backward import grad_mags
    rng = np.random.default_rng(seed)
    q, k, v = make(rng, (B, L, E), dtype, lq), make(rng, (B, S, E), dtype, lk), make(rng, (1, S, Ev), dtype, lv)
    m = None
    if mask == "bool":
        m = rng.random((B, L, S)) > 0.3
    elif mask == "float":
        m = np.where(rng.random((L, S)) > 0.2, rng.standard_normal((L, S)), -np.inf)
    kw = dict(attn_mask=m, dropout_p=p, is_causal=causal, window=window, softcap=softcap)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, rng=seed, return_lse=True, **kw)
    go = make(rng, o.shape, dtype, lq)
    got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, rng=seed, **kw)
    want = R.scaled_dot_product_attention_backward(go, q, k, v, dropout_key=dropout_key(seed) if p > 0 else 0, **kw)
    mags = grad_mags(q, k, v, go, 1 / np.sqrt(E), p, **{n: x for n, x in kw.items() if n != "dropout_p" and x is not None})
    for g, w, mg in zip(got, want, mags):
        assert g.shape == w.shape
        check(g, w, mg)
