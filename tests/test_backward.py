"""The attention backward, its vjp, softmax_backward and the layers' backward,
against the plain-NumPy oracle (_reference) and float64 finite differences."""
import copy
import os
import subprocess
import sys

import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from conftest import LAYOUTS, TOL, check, frozen, make, unchanged

DTYPES = [np.float32, np.float64]


def _sum_to(g, shape):
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def grad_mags(q, k, v, go, scale, dropout_p=0.0, enable_gqa=False, **kw):
    """Error scales of (dq, dk, dv): the recomputed weights carry the scores'
    error (a dot product of length E, amplified by exp as in mag_attention);
    dS = P (dP - D) sums Ev products; dq, dk, dv sum S or L products of
    those. Built from absolute values in float64, summed back like the
    gradients (broadcast axes, GQA groups)."""
    q64, k64, v64, g64 = (np.abs(np.asarray(x, np.float64)) for x in (q, k, v, go))
    if enable_gqa and q64.shape[-3] != k64.shape[-3]:
        g = q64.shape[-3] // k64.shape[-3]
        k64, v64 = np.repeat(k64, g, axis=-3), np.repeat(v64, g, axis=-3)
    P = R.scaled_dot_product_attention(np.asarray(q, np.float64), np.asarray(k, np.float64),
                                       np.asarray(v, np.float64), enable_gqa=enable_gqa, scale=scale,
                                       return_weights=True, **kw)[1]
    P = np.abs(P) / (1.0 - dropout_p)
    E, Ev, S, L = q64.shape[-1], v64.shape[-1], k64.shape[-2], q64.shape[-2]
    qk = np.matmul(q64, np.swapaxes(k64, -1, -2)) * abs(scale) * np.sqrt(E + 1.0)
    amp = 4.0 + 2 * np.max(np.where(P != 0, qk, 0.0), axis=-1, keepdims=True) + np.log1p(S)
    Pm = (P + np.max(P, axis=-1, keepdims=True)) * amp
    dP = np.matmul(g64, np.swapaxes(v64, -1, -2)) * np.sqrt(Ev + 1.0)
    D = (g64 * np.abs(np.matmul(P, v64))).sum(-1, keepdims=True) * np.sqrt(Ev + 1.0)
    dS = Pm * (dP + D + np.max(dP, axis=-1, keepdims=True)) * abs(scale)
    tiny = np.finfo(np.float64).tiny
    mq = np.matmul(dS, k64) * np.sqrt(S + 1.0) + tiny
    mk = np.matmul(np.swapaxes(dS, -1, -2), q64) * np.sqrt(L + 1.0) + tiny
    mv = np.matmul(np.swapaxes(Pm, -1, -2), g64) * np.sqrt(L + 1.0) + tiny
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        mk = mk.reshape(mk.shape[:-3] + (-1, g) + mk.shape[-2:]).sum(-3)
        mv = mv.reshape(mv.shape[:-3] + (-1, g) + mv.shape[-2:]).sum(-3)
    return _sum_to(mq, np.shape(q)), _sum_to(mk, np.shape(k)), _sum_to(mv, np.shape(v))


def run_backward(q, k, v, go=None, rng_seed=0, **kw):
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    if go is None:
        go = np.random.default_rng(rng_seed).standard_normal(o.shape).astype(o.dtype)
    return o, lse, go, pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)


def ref_kw(kw):
    r = dict(kw)
    if "rng" in r:
        from pyattn._checks import dropout_key
        r["dropout_key"] = dropout_key(r.pop("rng"))
    return r


CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "bottom_right": {"is_causal": "bottom_right"},
    "bool": "bool",
    "float": "float",
    "bool_broadcast": "bool_broadcast",
    "scale": {"scale": 0.3},
    "window": {"window": (9, 3)},
    "window_causal": {"window": (20, 0), "is_causal": True},
    "alibi": {"alibi_slopes": np.array([0.5, 0.125])},
    "softcap": {"softcap": 2.5},
    "sinks": {"sinks": np.array([0.7, -1.0])},
    "dropout": {"dropout_p": 0.3, "rng": 11},
}


def case_kw(case, rng, L, S, dt):
    c = CASES[case]
    if c == "bool":
        m = rng.random((2, 2, L, S)) > 0.3
        return {"attn_mask": m}
    if c == "float":
        return {"attn_mask": rng.standard_normal((2, 1, L, S)).astype(dt)}
    if c == "bool_broadcast":
        return {"attn_mask": rng.random((L, S)) > 0.4, "is_causal": True}
    return dict(c)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("L, S, E, Ev", [(1, 1, 8, 8), (17, 33, 16, 24), (130, 70, 64, 64), (97, 257, 40, 3)])
def test_backward_matches_reference(rng, dtype, case, L, S, E, Ev):
    q = rng.standard_normal((2, 2, L, E)).astype(dtype)
    k = rng.standard_normal((2, 2, S, E)).astype(dtype)
    v = rng.standard_normal((2, 2, S, Ev)).astype(dtype)
    kw = case_kw(case, rng, L, S, dtype)
    before = frozen(q, k, v)
    o, lse, go, got = run_backward(q, k, v, **kw)
    unchanged(before, (q, k, v))
    want = R.scaled_dot_product_attention_backward(go, q, k, v, **ref_kw(kw))
    assert len(got) == len(want)
    sc = kw.get("scale", 1 / np.sqrt(E))
    mkw = {n: kw[n] for n in ("attn_mask", "is_causal", "window", "alibi_slopes", "softcap", "sinks") if n in kw}
    mags = grad_mags(q, k, v, go, sc, kw.get("dropout_p", 0.0), **mkw)
    for g, w, m in zip(got, want, mags):
        assert g.dtype == dtype and g.shape == w.shape
        check(g, w, m)
    if "sinks" in kw:               # dsink = -sum_i p_sink,i D_i: a sum of L terms of |D|
        D = np.abs(np.asarray(go, np.float64) * np.asarray(o, np.float64)).sum(-1)
        check(got[3], want[3], (D.sum(axis=(0, 2)) + 1e-300) * (L + Ev + 8))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_any_layout(rng, layout, dtype):
    q = make(rng, (2, 3, 40, 16), dtype, layout)
    k = make(rng, (2, 3, 50, 16), dtype, layout)
    v = make(rng, (2, 3, 50, 12), dtype, layout)
    o, lse, _, _ = run_backward(q, k, v, is_causal=True)
    go = make(rng, o.shape, dtype, layout)
    got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, is_causal=True)
    want = R.scaled_dot_product_attention_backward(go, q, k, v, is_causal=True)
    for g, w, m in zip(got, want, grad_mags(q, k, v, go, 0.25, is_causal=True)):
        check(g, w, m)
    # the same bits as from contiguous copies
    again = pyattn.scaled_dot_product_attention_backward(
        np.ascontiguousarray(go), np.ascontiguousarray(q), np.ascontiguousarray(k),
        np.ascontiguousarray(v), o, lse, is_causal=True)
    for a, b in zip(got, again):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qs, ks, vs", [
    ((2, 3, 20, 8), (1, 3, 25, 8), (3, 25, 6)),        # key/value broadcast over the batch
    ((3, 20, 8), (2, 3, 25, 8), (2, 3, 25, 6)),        # query broadcast
    ((2, 3, 20, 8), (2, 1, 25, 8), (2, 3, 25, 6)),     # only key broadcast over heads
    ((20, 8), (4, 25, 8), (25, 6)),
])
def test_backward_broadcast_batch_axes(rng, dtype, qs, ks, vs):
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs))
    o, lse, go, got = run_backward(q, k, v, is_causal="bottom_right")
    want = R.scaled_dot_product_attention_backward(go, q, k, v, is_causal="bottom_right")
    for g, w, x, m in zip(got, want, (q, k, v), grad_mags(q, k, v, go, 8 ** -0.5, is_causal="bottom_right")):
        assert g.shape == x.shape
        check(g, w, m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, kw", [(8, 2, {}), (4, 1, {"is_causal": True}), (6, 3, {"window": (5, 5)}),
                                         (4, 2, {"sinks": np.array([0.1, 0.2, -0.3, 1.0])})])
def test_backward_gqa_sums_into_kv_heads(rng, dtype, hq, hkv, kw):
    q = rng.standard_normal((2, hq, 30, 16)).astype(dtype)
    k = rng.standard_normal((2, hkv, 41, 16)).astype(dtype)
    v = rng.standard_normal((2, hkv, 41, 8)).astype(dtype)
    o, lse, go, got = run_backward(q, k, v, enable_gqa=True, **kw)
    want = R.scaled_dot_product_attention_backward(go, q, k, v, enable_gqa=True, **kw)
    assert got[1].shape == k.shape and got[2].shape == v.shape
    mags = grad_mags(q, k, v, go, 0.25, enable_gqa=True, **{n: x for n, x in kw.items() if n != "sinks"},
                     **({"sinks": kw["sinks"]} if "sinks" in kw else {}))
    for g, w, m in zip(got[:3], want[:3], mags):
        check(g, w, m)
    # bit for bit the same as the repeated heads' gradients summed in group order
    g = hq // hkv
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    rep = pyattn.scaled_dot_product_attention_backward(go, q, kr, vr, o, lse, **kw)
    assert np.array_equal(rep[0], got[0])


def _fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = f()
        x[i] = old - eps
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"softcap": 1.5}, {"window": (2, 1)},
                                {"alibi_slopes": np.array([0.3])}, {"sinks": np.array([0.4])},
                                {"attn_mask": np.array([[1.0, -0.5, 0.0, 2.0, 0.1]] * 4)}])
def test_backward_finite_differences(rng, kw):
    q = rng.standard_normal((1, 4, 3))
    k = rng.standard_normal((1, 5, 3))
    v = rng.standard_normal((1, 5, 2))
    sinks = kw.get("sinks")
    go = rng.standard_normal((1, 4, 2))
    got = run_backward(q, k, v, go=go, **kw)[3]

    def loss():
        kk = dict(kw)
        if sinks is not None:
            kk["sinks"] = sinks
        return float((pyattn.scaled_dot_product_attention(q, k, v, **kk) * go).sum())

    for g, x in zip(got, (q, k, v) + ((sinks,) if sinks is not None else ())):
        num = _fd(loss, x)
        assert np.allclose(g, num, rtol=1e-6, atol=1e-8), (g, num)


def test_dropout_backward_regenerates_the_pattern(rng):
    q = rng.standard_normal((2, 3, 50, 16))
    k = rng.standard_normal((2, 3, 60, 16))
    v = rng.standard_normal((2, 3, 60, 8))
    gen = np.random.default_rng(2024)
    saved = copy.deepcopy(gen)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, dropout_p=0.4, rng=gen, return_lse=True)
    go = rng.standard_normal(o.shape)
    got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, dropout_p=0.4,
                                                       rng=copy.deepcopy(saved))
    from pyattn._checks import dropout_key
    want = R.scaled_dot_product_attention_backward(go, q, k, v, dropout_p=0.4,
                                                   dropout_key=dropout_key(copy.deepcopy(saved)))
    for g, w, m in zip(got, want, grad_mags(q, k, v, go, 0.25, 0.4)):
        check(g, w, m)
    # a different pattern gives different gradients (the test can fail)
    other = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, dropout_p=0.4, rng=7)
    assert not np.allclose(other[2], got[2])
    # the same seed gives the same bits on any thread count
    n0 = pyattn.get_num_threads()
    try:
        res = []
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            res.append(pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, dropout_p=0.4, rng=5))
    finally:
        pyattn.set_num_threads(n0)
    for r in res[1:]:
        for a, b in zip(res[0], r):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_bit_identical_across_threads_and_batches(rng, dtype):
    q = rng.standard_normal((3, 4, 150, 32)).astype(dtype)
    k = rng.standard_normal((3, 2, 170, 32)).astype(dtype)
    v = rng.standard_normal((3, 2, 170, 24)).astype(dtype)
    kw = {"is_causal": True, "enable_gqa": True, "window": (100, 0), "softcap": 5.0}
    o, lse, go, _ = run_backward(q, k, v, **kw)
    n0 = pyattn.get_num_threads()
    try:
        res = []
        for nt in (1, 2, 3, 5):
            pyattn.set_num_threads(nt)
            res.append(pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw))
    finally:
        pyattn.set_num_threads(n0)
    for r in res[1:]:
        for a, b in zip(res[0], r):
            assert np.array_equal(a, b)
    # one batch entry (its query heads and their key/value heads) alone: the same bits
    alone = pyattn.scaled_dot_product_attention_backward(go[1:2], q[1:2], k[1:2], v[1:2], o[1:2], lse[1:2], **kw)
    for a, b in zip(alone, res[0]):
        assert np.array_equal(a[0], b[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_give_zero_gradients(rng, dtype):
    q = rng.standard_normal((2, 10, 8)).astype(dtype)
    k = rng.standard_normal((2, 12, 8)).astype(dtype)
    v = rng.standard_normal((2, 12, 4)).astype(dtype)
    m = rng.random((10, 12)) > 0.5
    m[3] = False
    o, lse, go, (dq, dk, dv) = run_backward(q, k, v, attn_mask=m)
    assert np.all(lse[:, 3] == -np.inf)
    assert np.all(dq[:, 3] == 0)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    # window=(0, 0) with bottom-right causal where L > S: leading rows see nothing
    o, lse, go, (dq, dk, dv) = run_backward(q, k[:, :5], v[:, :5], is_causal="bottom_right")
    assert np.all(dq[:, :5] == 0) and np.isfinite(dk).all()


def test_nan_propagates_and_masked_nan_does_not(rng):
    q = rng.standard_normal((6, 8))
    k = rng.standard_normal((7, 8))
    v = rng.standard_normal((7, 4))
    q[2, 1] = np.nan
    o, lse, go, (dq, dk, dv) = run_backward(q, k, v)
    assert np.isnan(dq[2]).all() and np.isnan(dk).any()
    assert not np.isnan(dq[[0, 1, 3, 4, 5]]).any()
    # a NaN value row that no query may see passes nothing back
    q[2, 1] = 0.5
    v[6] = np.nan
    m = np.ones((6, 7), bool)
    m[:, 6] = False
    o, lse, go, (dq, dk, dv) = run_backward(q, k, v, attn_mask=m)
    assert np.isfinite(dq).all() and np.isfinite(dk).all()
    assert np.all(dv[6] == 0)


@pytest.mark.parametrize("shapes", [((0, 4), (5, 4), (5, 3)), ((3, 4), (0, 4), (0, 3)),
                                    ((3, 0), (5, 0), (5, 3)), ((3, 4), (5, 4), (5, 0)),
                                    ((0, 3, 4), (0, 5, 4), (0, 5, 3))])
def test_zero_size_axes(shapes):
    q, k, v = (np.ones(s, np.float32) for s in shapes)
    o, lse, go, got = run_backward(q, k, v)
    for g, x in zip(got, (q, k, v)):
        assert g.shape == x.shape and g.dtype == np.float32
        assert not np.isnan(g).any()
    if shapes[1][0] == 0 and shapes[0][0] == 3:        # no keys: no gradient
        assert np.all(got[0] == 0)


def test_backward_bad_input(rng):
    q = rng.standard_normal((2, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 6, 4)).astype(np.float32)
    v = rng.standard_normal((2, 6, 3)).astype(np.float32)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    go = np.ones_like(o)
    bwd = pyattn.scaled_dot_product_attention_backward
    with pytest.raises(ValueError, match="grad_out"):
        bwd(go[:, :4], q, k, v, o, lse)
    with pytest.raises(ValueError, match="out"):
        bwd(go, q, k, v, o[..., :2], lse)
    with pytest.raises(ValueError, match="lse"):
        bwd(go, q, k, v, o, lse[:, :3])
    with pytest.raises(TypeError, match="lse"):
        bwd(go, q, k, v, o, lse.astype(np.float64))
    with pytest.raises(TypeError, match="grad_out"):
        bwd(go.astype(np.int64), q, k, v, o, lse)
    with pytest.raises(ValueError, match="dropout_p"):
        bwd(go, q, k, v, o, lse, dropout_p=1.0)
    with pytest.raises(ValueError, match="window"):
        bwd(go, q, k, v, o, lse, window=(-1, 0))
    with pytest.raises(ValueError, match="key"):
        bwd(go, q, k[..., :3], v, o, lse)
    before = frozen(go, q, k, v, o, lse)
    bwd(go, q, k, v, o, lse)
    unchanged(before, (go, q, k, v, o, lse))


def test_float16_inputs_give_float32_gradients(rng):
    q = rng.standard_normal((2, 20, 8)).astype(np.float16)
    o, lse, go, got = run_backward(q, q, q, is_causal=True)
    q32 = q.astype(np.float32)
    want = run_backward(q32, q32, q32, go=go, is_causal=True)[3]
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        assert np.array_equal(g, _sum_to(w, g.shape))


def test_vjp_matches_forward_and_backward(rng):
    q = rng.standard_normal((2, 2, 30, 8))
    k = rng.standard_normal((2, 2, 35, 8))
    v = rng.standard_normal((2, 2, 35, 5))
    kw = {"is_causal": "bottom_right", "sinks": np.array([0.2, -0.4]), "softcap": 4.0}
    out, backward = pyattn.scaled_dot_product_attention_vjp(q, k, v, **kw)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    assert np.array_equal(out, o)
    go = rng.standard_normal(o.shape)
    g1 = backward(go)
    g2 = backward(go)                                          # callable again
    want = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)
    assert len(g1) == 4
    for a, b, c in zip(g1, g2, want):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    with pytest.raises(ValueError, match="grad_out"):
        backward(go[:, :, :3])


def test_vjp_dropout_uses_one_pattern(rng):
    q = rng.standard_normal((2, 40, 8))
    gen = np.random.default_rng(99)
    saved = copy.deepcopy(gen)
    out, backward = pyattn.scaled_dot_product_attention_vjp(q, q, q, dropout_p=0.5, rng=gen)
    # the generator advanced as the forward alone would advance it
    ref = pyattn.scaled_dot_product_attention(q, q, q, dropout_p=0.5, rng=saved)
    assert np.array_equal(out, ref)
    assert gen.integers(0, 2**62) == saved.integers(0, 2**62)
    go = np.ones_like(out)
    a, b = backward(go), backward(go)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    from pyattn._checks import dropout_key
    want = R.scaled_dot_product_attention_backward(go, q, q, q, dropout_p=0.5,
                                                   dropout_key=dropout_key(np.random.default_rng(99)))
    for g, w, m in zip(a, want, grad_mags(q, q, q, go, 8 ** -0.5, 0.5)):
        check(g, w, m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_backward(rng, dtype, axis):
    x = rng.standard_normal((5, 7, 9)).astype(dtype)
    y = pyattn.softmax(x, axis=axis, scale=0.7)
    gy = rng.standard_normal(y.shape).astype(dtype)
    got = pyattn.softmax_backward(gy, y, axis=axis, scale=0.7)
    want = R.softmax_backward(gy, y, axis=axis, scale=0.7)
    n = y.shape[axis]
    mag = 0.7 * np.abs(y.astype(np.float64)) * (np.abs(gy) + (np.abs(gy) * y).sum(axis=axis, keepdims=True)) * (n + 2)
    check(got, want, mag + np.finfo(np.float64).tiny)
    assert got.dtype == dtype


def test_softmax_backward_finite_differences_and_masks(rng):
    x = rng.standard_normal((4, 6))
    m = rng.random((4, 6)) > 0.3
    m[:, 0] = True
    gy = rng.standard_normal((4, 6))
    y = pyattn.softmax(x, attn_mask=m, scale=1.3)
    got = pyattn.softmax_backward(gy, y, scale=1.3)
    num = _fd(lambda: float((pyattn.softmax(x, attn_mask=m, scale=1.3) * gy).sum()), x)
    assert np.allclose(got, num, rtol=1e-6, atol=1e-9)
    assert np.all(got[~m] == 0)
    with pytest.raises(ValueError, match="grad_y"):
        pyattn.softmax_backward(gy[:, :3], y)
    with pytest.raises(ValueError, match="axis"):
        pyattn.softmax_backward(gy, y, axis=2)
    with pytest.raises(ValueError, match="scalar"):
        pyattn.softmax_backward(np.float64(1.0), np.float64(1.0))


# -- layers ----------------------------------------------------------------------

def _layer_ref_grads(layer, x, gy, mask=None):
    """The layer's gradients from finite differences of the reference layer
    (float64, no dropout): grad_x and each parameter's gradient."""
    sd = {k: v.astype(np.float64) for k, v in layer.state_dict().items()}

    def f():
        o = R.multi_head_attention(x, x, x, layer.num_heads, sd["W_query.weight"], sd["W_key.weight"],
                                   sd["W_value.weight"], sd.get("out_proj.weight"), sd.get("W_query.bias"),
                                   sd.get("W_key.bias"), sd.get("W_value.bias"), sd.get("out_proj.bias"),
                                   attn_mask=mask, is_causal=bool(layer.causal))
        return float((o * gy).sum())

    return _fd(f, x), {k: _fd(f, a) for k, a in sd.items()}


@pytest.mark.parametrize("make_layer", [
    lambda: pyattn.nn.MultiHeadAttention(6, 4, 2, qkv_bias=True, rng=0),
    lambda: pyattn.nn.MultiHeadAttention(5, 6, 3, causal=False, out_bias=False, rng=1),
    lambda: pyattn.nn.CausalAttention(4, 3, context_length=8, rng=2),
    lambda: pyattn.nn.SelfAttention(4, 5, qkv_bias=True, rng=3),
])
def test_layer_backward_finite_differences(rng, make_layer):
    layer = make_layer()
    layer.load_state_dict({k: v.astype(np.float64) for k, v in layer.state_dict().items()})
    x = rng.standard_normal((2, 5, layer.d_in))
    y = layer(x)
    gy = rng.standard_normal(y.shape)
    gx = layer.backward(gy)
    num_x, num_p = _layer_ref_grads(layer, x, gy)
    assert np.allclose(gx, num_x, rtol=1e-6, atol=1e-8)
    assert set(layer.grads) == set(layer.state_dict())
    for k, g in layer.grads.items():
        assert np.allclose(g, num_p[k], rtol=1e-6, atol=1e-8), k


def test_layer_training_api(rng):
    layer = pyattn.nn.MultiHeadAttention(8, 8, 2, context_length=6, rng=0)
    x = rng.standard_normal((3, 6, 8)).astype(np.float32)
    with pytest.raises(RuntimeError):
        layer.backward(np.ones((3, 6, 8), np.float32))          # before any call
    y = layer(x)
    with pytest.raises(ValueError, match="grad_y"):
        layer.backward(np.ones((3, 5, 8), np.float32))
    gy = rng.standard_normal(y.shape).astype(np.float32)
    layer.backward(gy)
    with pytest.raises(RuntimeError):
        layer.backward(gy)                                      # twice for one call
    first = {k: g.copy() for k, g in layer.grads.items()}
    layer(x)
    layer.backward(gy)                                          # accumulates
    for k in first:
        assert np.allclose(layer.grads[k], 2 * first[k], rtol=1e-5, atol=1e-6)
    layer.zero_grad()
    assert all(not g.any() for g in layer.grads.values())
    layer.eval()(x)
    with pytest.raises(RuntimeError):
        layer.backward(gy)                                      # the last call was in eval mode
    # parameters are live: an update changes the layer's output
    params = layer.parameters()
    assert params["W_query.weight"] is layer.W_query
    params["W_query.weight"] -= 0.1
    assert not np.array_equal(layer(x), y)
    # unbatched input
    layer.train()
    y1 = layer(x[0])
    g1 = layer.backward(np.ones_like(y1))
    assert g1.shape == x[0].shape


def test_layer_dropout_is_part_of_the_gradient(rng):
    layer = pyattn.nn.MultiHeadAttention(8, 8, 2, context_length=10, dropout=0.5, qkv_bias=True, rng=4)
    layer.load_state_dict({k: v.astype(np.float64) for k, v in layer.state_dict().items()})
    x = rng.standard_normal((2, 10, 8))
    state = copy.deepcopy(layer._rng)
    y = layer(x)
    gy = rng.standard_normal(y.shape)
    gx = layer.backward(gy)
    # the same call through the functions, with the generator in the same state
    sd = layer.state_dict()
    H, hd = 2, 4

    def heads(w, b):
        return (x @ sd[w].T + sd[b]).reshape(2, 10, H, hd).transpose(0, 2, 1, 3)

    q, k, v = heads("W_query.weight", "W_query.bias"), heads("W_key.weight", "W_key.bias"), heads("W_value.weight", "W_value.bias")
    out, backward = pyattn.scaled_dot_product_attention_vjp(q, k, v, dropout_p=0.5, is_causal=True, rng=state)
    ctx = out.transpose(0, 2, 1, 3).reshape(2, 10, 8)
    assert np.allclose(ctx @ sd["out_proj.weight"].T + sd["out_proj.bias"], y, rtol=1e-12, atol=1e-12)
    gctx = (gy @ sd["out_proj.weight"]).reshape(2, 10, H, hd).transpose(0, 2, 1, 3)
    dq, dk, dv = backward(gctx)
    want = sum(d.transpose(0, 2, 1, 3).reshape(2, 10, 8) @ sd[w] for d, w in
               zip((dq, dk, dv), ("W_query.weight", "W_key.weight", "W_value.weight")))
    assert np.allclose(gx, want, rtol=1e-10, atol=1e-12)


def test_backward_memory_stays_small():
    """Causal L=S=16384, E=64: the backward's peak RSS grows by less than 64 MB
    beyond its inputs and outputs (no (L, S) buffer: that would be 1 GB)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc/self/status on this platform: peak RSS cannot be read")
    if "ASAN_OPTIONS" in os.environ:
        pytest.skip("under AddressSanitizer RSS includes its shadow memory and quarantine")
    code = r"""
import numpy as np, pyattn
def kb(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1])
L, E = 16384, 64
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, L, E), dtype=np.float32) for _ in range(3))
o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
go = np.ones_like(o)
outs = [np.ones_like(q) for _ in range(3)]      # room for the outputs, then freed
del outs
base = kb('VmHWM:')
g = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, is_causal=True)
grown = kb('VmHWM:') - base
print(grown)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    grown_mb = int(r.stdout.split()[-1]) / 1024
    assert grown_mb < 64, f"peak RSS grew by {grown_mb:.1f} MB"


def test_vjp_bad_rng_names_it():
    q = np.ones((3, 4))
    with pytest.raises(TypeError, match="rng"):
        pyattn.scaled_dot_product_attention_vjp(q, q, q, dropout_p=0.1, rng="abc")


def test_layer_backward_after_a_cached_call_is_refused(rng):
    layer = pyattn.nn.MultiHeadAttention(8, 8, 2, rng=0)
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    y = layer(x)                                        # training mode: kept
    cache = layer.new_cache(1, 8)
    layer(x, cache=cache)                               # the last call: inference with a cache
    with pytest.raises(RuntimeError):
        layer.backward(np.ones_like(y))
