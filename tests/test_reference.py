"""pyattn against its NumPy oracle (pyattn/_reference.py) on every layout:
C order, transposed, negative strides, Fortran order, strided slices,
broadcast batch axes; odd and size-1 sizes; both dtypes; NaN and inf."""
import itertools

import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from pyattn._checks import dropout_key
from conftest import (DTYPES, LAYOUTS, check, frozen, mag_attention, mag_matmul, mag_softmax,
                      make, unchanged)

SIZES = [1, 3, 17, 64, 127, 257]
# (L, S, E): every size appears in every position
LSE = [(SIZES[i], SIZES[(i + 1) % 6], SIZES[(i + 3) % 6]) for i in range(6)] + [(1, 1, 1), (257, 257, 64)]


# ---- matmul -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout_a, layout_b", [(la, lb) for la in LAYOUTS for lb in ("c", "transposed", "negative")])
def test_matmul_layouts(rng, dtype, layout_a, layout_b):
    a = make(rng, (2, 37, 19), dtype, layout_a)
    b = make(rng, (2, 19, 41), dtype, layout_b)
    keep = frozen(a, b)
    got = pyattn.matmul(a, b)
    assert got.dtype == dtype
    check(got, R.matmul(a, b), mag_matmul(a, b))
    unchanged(keep, (a, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, N, K", [(1, 1, 1), (3, 17, 64), (127, 1, 257), (257, 127, 3), (64, 257, 17), (300, 290, 600), (800, 130, 700)])
def test_matmul_sizes(rng, dtype, M, N, K):
    a, b = make(rng, (M, K), dtype), make(rng, (K, N), dtype, "transposed")
    check(pyattn.matmul(a, b), R.matmul(a, b), mag_matmul(a, b))


@pytest.mark.parametrize("sa, sb", [((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((2, 1, 4, 5), (3, 5, 2)),
                                    ((5,), (2, 3, 5, 4)), ((1, 4, 0), (0, 3)), ((0, 4, 5), (5, 2)), ((2, 4, 5), (1, 5, 3))])
def test_matmul_numpy_semantics(rng, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    got = pyattn.matmul(a, b)
    want = np.matmul(a, b)
    assert np.shape(got) == want.shape
    check(np.asarray(got), want, mag_matmul(a[None] if a.ndim == 1 else a, b[..., None] if b.ndim == 1 else b).reshape(want.shape) if want.size else 0)


def test_matmul_broadcast_stride0(rng):
    a = np.broadcast_to(rng.standard_normal((1, 7, 5)), (4, 7, 5))
    b = rng.standard_normal((4, 5, 6))[::-1]
    check(pyattn.matmul(a, b), R.matmul(a, b), mag_matmul(a, b))


@pytest.mark.parametrize("dt_a, dt_b, want", [(np.float32, np.float32, np.float32), (np.float32, np.float64, np.float64),
                                              (np.float16, np.float16, np.float32), (np.int64, np.int64, np.float64),
                                              (np.bool_, np.bool_, np.float64), (np.int8, np.float32, np.float32)])
def test_matmul_dtypes(rng, dt_a, dt_b, want):
    a = (rng.standard_normal((4, 6)) * 3).astype(dt_a)
    b = (rng.standard_normal((6, 5)) * 3).astype(dt_b)
    got = pyattn.matmul(a, b)
    assert got.dtype == want
    check(got, R.matmul(a, b), mag_matmul(a, b))


def test_matmul_nonnative_and_lists(rng):
    a = rng.standard_normal((3, 4)).astype(">f8")
    b = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]
    got = pyattn.matmul(a, b)
    check(got, np.asarray(a, float) @ np.asarray(b), mag_matmul(a, np.asarray(b)))


def test_matmul_nan_inf():
    a = np.array([[1.0, np.nan], [1.0, 2.0], [np.inf, 1.0]])
    b = np.array([[1.0, 0.0], [1.0, 1.0]])
    with np.errstate(invalid="ignore"):
        want = a @ b                                   # inf * 0 -> NaN, as in NumPy
    check(pyattn.matmul(a, b), want, mag_matmul(np.nan_to_num(a, posinf=1.0), b))


# ---- softmax ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_layouts(rng, dtype, layout, axis):
    x = make(rng, (3, 17, 64), dtype, layout) * 4
    keep = frozen(x)
    got = pyattn.softmax(x, axis=axis, scale=0.7)
    want = R.softmax(x, axis=axis, scale=0.7)
    s = np.moveaxis(np.asarray(x, np.float64) * 0.7, axis, -1)
    check(got, want, np.moveaxis(mag_softmax(s, np.moveaxis(want, axis, -1)), -1, axis))
    unchanged(keep, (x,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float", "bool_bcast"])
@pytest.mark.parametrize("L, S", [(1, 1), (3, 17), (17, 3), (64, 257), (257, 127)])
def test_softmax_masks(rng, dtype, causal, mask_kind, L, S):
    x = make(rng, (2, L, S), dtype, "transposed") * 3
    mask = None
    if mask_kind == "bool":
        mask = rng.random((2, L, S)) > 0.4
    elif mask_kind == "float":
        mask = np.where(rng.random((L, S)) > 0.3, rng.standard_normal((L, S)), -np.inf)
    elif mask_kind == "bool_bcast":
        mask = (rng.random((1, S)) > 0.5)
    got = pyattn.softmax(x, attn_mask=mask, is_causal=causal)
    want = R.softmax(x, attn_mask=mask, is_causal=causal)
    s = np.asarray(x, np.float64)
    if mask is not None and mask.dtype != bool:
        s = s + mask.astype(dtype)
    check(got, want, mag_softmax(s, want))
    # every row sums to 1 or is all 0 (no admissible key)
    sums = got.sum(-1)
    assert np.all((np.abs(sums - 1) < 1e-5) | (sums == 0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_extremes(dtype):
    big = np.finfo(dtype).max / 4
    x = np.array([[1e30, -1e30, 0.0], [-np.inf, -np.inf, -np.inf], [np.nan, 1.0, 2.0],
                  [np.inf, 1.0, 0.0], [-big, -big, -big], [big, big, 0.0]]).astype(dtype)
    got = pyattn.softmax(x)
    want = R.softmax(x)
    check(got, want, mag_softmax(np.zeros_like(x), np.nan_to_num(want)))
    assert np.array_equal(got[1], [0, 0, 0])          # all masked: zeros, not NaN
    assert np.isnan(got[2]).all()                     # NaN propagates to its row
    assert np.isnan(got[3]).all()                     # inf - inf


def test_softmax_float16_and_int():
    x16 = np.array([[1, 2, 3]], np.float16)
    assert pyattn.softmax(x16).dtype == np.float32
    xi = np.array([[1, 2, 3]])
    got = pyattn.softmax(xi)
    assert got.dtype == np.float64
    check(got, R.softmax(xi), mag_softmax(xi, R.softmax(xi)))


# ---- scaled dot-product attention ------------------------------------------------

def _sdpa_check(rng, q, k, v, **kw):
    keep = frozen(q, k, v)
    rw = kw.pop("return_weights", True)
    p = kw.get("dropout_p", 0.0)
    seed = int(rng.integers(1 << 30))
    got = pyattn.scaled_dot_product_attention(q, k, v, rng=seed, return_weights=rw, **kw)
    fused = pyattn.scaled_dot_product_attention(q, k, v, rng=seed, **kw)
    key = dropout_key(seed) if p > 0 else 0
    want_o, want_w = R.scaled_dot_product_attention(q, k, v, dropout_key=key, return_weights=True, **kw)
    E = np.shape(q)[-1]
    scale = kw.get("scale") or (1 / np.sqrt(E))
    qq, kk = np.nan_to_num(np.asarray(q, np.float64)), np.nan_to_num(np.asarray(k, np.float64))
    kg, vg = kk, np.nan_to_num(np.asarray(v, np.float64))
    if kw.get("enable_gqa") and qq.shape[-3] != kg.shape[-3]:
        g = qq.shape[-3] // kg.shape[-3]
        kg, vg = np.repeat(kg, g, -3), np.repeat(vg, g, -3)
    mag = mag_attention(qq, kg, vg, np.nan_to_num(want_w), scale)
    out, w = got
    check(out, want_o, mag)
    s = np.matmul(qq, np.swapaxes(kg, -1, -2)) * scale
    check(w, want_w, mag_softmax(s, np.nan_to_num(want_w)) / max(1e-300, 1 - p))
    check(fused, want_o, mag)
    unchanged(keep, (q, k, v))
    return out, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L, S, E", LSE)
def test_sdpa_sizes(rng, dtype, L, S, E):
    q = make(rng, (2, L, E), dtype)
    k = make(rng, (2, S, E), dtype, "transposed")
    v = make(rng, (2, S, max(1, E // 2 + 1)), dtype, "negative")
    _sdpa_check(rng, q, k, v)
    _sdpa_check(rng, q, k, v, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lq, lk, lv", [l for l in itertools.product(LAYOUTS, repeat=3) if len(set(l)) <= 2][::4])
def test_sdpa_layouts(rng, dtype, lq, lk, lv):
    q = make(rng, (3, 33, 24), dtype, lq)
    k = make(rng, (3, 70, 24), dtype, lk)
    v = make(rng, (3, 70, 20), dtype, lv)
    _sdpa_check(rng, q, k, v, is_causal="bottom_right")


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_broadcast_batch(rng, dtype):
    q = make(rng, (2, 1, 9, 16), dtype)
    k = np.broadcast_to(make(rng, (1, 4, 12, 16), dtype), (2, 4, 12, 16))
    v = make(rng, (4, 12, 8), dtype)[::-1]
    out, _ = _sdpa_check(rng, q, k, v)
    assert out.shape == (2, 4, 9, 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True, "top_left", "bottom_right"])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float", "bool_heads"])
@pytest.mark.parametrize("L, S", [(5, 9), (9, 5), (16, 16), (70, 130)])
def test_sdpa_masks(rng, dtype, causal, mask_kind, L, S):
    q, k, v = make(rng, (2, 3, L, 8), dtype), make(rng, (2, 3, S, 8), dtype), make(rng, (2, 3, S, 6), dtype)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((L, S)) > 0.5
        mask[0] = False                        # a row with no admissible key
    elif mask_kind == "float":
        mask = np.where(rng.random((2, 1, L, S)) > 0.5, rng.standard_normal((2, 1, L, S)), -np.inf)
    elif mask_kind == "bool_heads":
        mask = rng.random((3, 1, S)) > 0.3
    out, w = _sdpa_check(rng, q, k, v, attn_mask=mask, is_causal=causal)
    if mask_kind == "bool":
        assert np.array_equal(out[..., 0, :], np.zeros_like(out[..., 0, :]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv", [(4, 1), (4, 2), (6, 3), (8, 8)])
def test_sdpa_gqa(rng, dtype, hq, hkv):
    q = make(rng, (2, hq, 11, 16), dtype)
    k = make(rng, (2, hkv, 13, 16), dtype, "transposed")
    v = make(rng, (2, hkv, 13, 12), dtype)
    mask = rng.random((hq, 11, 13)) > 0.2
    out, w = _sdpa_check(rng, q, k, v, attn_mask=mask, enable_gqa=True, is_causal="bottom_right")
    assert out.shape == (2, hq, 11, 12) and w.shape == (2, hq, 11, 13)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_sdpa_dropout(rng, dtype, p):
    q, k, v = make(rng, (2, 2, 20, 8), dtype), make(rng, (2, 2, 30, 8), dtype), make(rng, (2, 2, 30, 4), dtype)
    out, w = _sdpa_check(rng, q, k, v, dropout_p=p, is_causal=True)
    frac = np.mean(w[..., np.tril(np.ones((20, 30), bool))] == 0)
    assert abs(frac - p) < 0.1
    # same seed, same result; another seed, another pattern
    a = pyattn.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=7)
    b = pyattn.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=7)
    c = pyattn.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=8)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    assert np.array_equal(pyattn.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=g1),
                          pyattn.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=g2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_nan_inf(rng, dtype):
    q, k, v = make(rng, (12, 8), dtype), make(rng, (20, 8), dtype), make(rng, (20, 5), dtype)
    q[3, 2] = np.nan                 # row 3 NaN
    k[5, 0] = np.inf                 # +-inf scores in every row: NaN rows (inf - inf)
    v[7, 1] = np.nan                 # NaN in a value row spreads to rows that weigh key 7
    got, w = pyattn.scaled_dot_product_attention(q, k, v, return_weights=True)
    want, ww = R.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[3]).all()
    # masked keys do not spread NaN from their values
    q2, k2, v2 = make(rng, (6, 4), dtype), make(rng, (6, 4), dtype), make(rng, (6, 3), dtype)
    v2[5] = np.nan
    out = pyattn.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    assert np.isfinite(out[:5]).all() and np.isnan(out[5]).all()
    check(out, R.scaled_dot_product_attention(q2, k2, v2, is_causal=True),
          mag_attention(q2, k2, np.nan_to_num(v2), R.softmax(q2 @ k2.T / 2, is_causal=True), 0.5))


def test_sdpa_zero_sizes(rng):
    q, k, v = rng.standard_normal((2, 0, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    assert pyattn.scaled_dot_product_attention(q, k, v).shape == (2, 0, 3)
    q = rng.standard_normal((2, 3, 4))
    out, w = pyattn.scaled_dot_product_attention(q, k[:, :0], v[:, :0], return_weights=True)
    assert out.shape == (2, 3, 3) and np.array_equal(out, np.zeros_like(out)) and w.shape == (2, 3, 0)
    assert pyattn.scaled_dot_product_attention(q, k, v[..., :0]).shape == (2, 3, 0)


def test_sdpa_out_and_overlap(rng):
    q, k, v = rng.standard_normal((3, 10, 6)), rng.standard_normal((3, 12, 6)), rng.standard_normal((3, 12, 6))
    want = pyattn.scaled_dot_product_attention(q, k, v)
    out = np.empty((3, 10, 6))[..., ::-1]            # strided out
    res = pyattn.scaled_dot_product_attention(q, k, v, out=out)
    assert res is out and np.array_equal(out, want)
    q2 = q.copy()
    res = pyattn.scaled_dot_product_attention(q2, k, v, out=q2)   # out is an input
    assert res is q2 and np.array_equal(q2, want)


def test_softmax_and_matmul_out(rng):
    x = rng.standard_normal((4, 5))
    out = np.empty((5, 4)).T
    assert pyattn.softmax(x, out=out) is out and np.array_equal(out, pyattn.softmax(x))
    pyattn.softmax(x, out=x)                                      # in place
    assert np.array_equal(x, out)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 4))
    want = pyattn.matmul(a, b)
    o = np.empty((3, 4))
    assert pyattn.matmul(a, b, out=o) is o and np.array_equal(o, want)
    a2 = a.copy()
    pyattn.matmul(a2[:, :4], b, out=a2)                           # overlapping out
    assert np.array_equal(a2, want)
    o1 = np.empty(4)
    pyattn.matmul(a[0], b, out=o1)
    assert np.array_equal(o1, want[0])


# ---- multi-head attention ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_mha(rng, dtype, causal, bias):
    B, L, S, d_in, d_out, H = 2, 7, 9, 12, 16, 4
    xq, xk, xv = make(rng, (B, L, d_in), dtype), make(rng, (B, S, d_in), dtype), make(rng, (B, S, 10), dtype)
    wq, wk, wv, wo = (make(rng, s, dtype) for s in ((d_out, d_in), (d_out, d_in), (8, 10), (5, 8)))
    bs = [make(rng, (n,), dtype) if bias else None for n in (d_out, d_out, 8, 5)]
    keep = frozen(xq, xk, xv, wq, wk, wv, wo)
    got, w = pyattn.multi_head_attention(xq, xk, xv, H, wq, wk, wv, wo, *bs, is_causal=causal, return_weights=True)
    want, ww = R.multi_head_attention(xq, xk, xv, H, wq, wk, wv, wo, *bs, is_causal=causal, return_weights=True)
    assert got.shape == (B, L, 5) and w.shape == (B, H, L, S)
    # error scale: the projections' and the attention's, pushed through w_o
    q = R.linear(xq, wq, bs[0]).reshape(B, L, H, 4).swapaxes(1, 2)
    k = R.linear(xk, wk, bs[1]).reshape(B, S, H, 4).swapaxes(1, 2)
    v = R.linear(xv, wv, bs[2]).reshape(B, S, H, 2).swapaxes(1, 2)
    lin_mag = lambda x, w_: mag_matmul(x, np.abs(w_.T.astype(np.float64)))
    att = mag_attention(q, k, v, ww, 0.5).swapaxes(1, 2).reshape(B, L, 8)
    att = att * (1 + np.max(lin_mag(xq, wq)) + np.max(lin_mag(xk, wk))) + np.max(lin_mag(xv, wv))
    check(got, want, mag_matmul(att, np.abs(wo.T.astype(np.float64))) * 4)
    unchanged(keep, (xq, xk, xv, wq, wk, wv, wo))
    # unbatched input
    got1, w1 = pyattn.multi_head_attention(xq[0], xk[0], xv[0], H, wq, wk, wv, wo, *bs, is_causal=causal,
                                           return_weights=True)
    assert np.array_equal(got1, got[0]) and np.array_equal(w1, w[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("E, Ev", [(600, 8), (8, 700), (513, 513)])
def test_sdpa_head_dims_past_the_tiled_kernel(rng, dtype, E, Ev):
    # head dims above the tiled kernel's limit run the reference kernel
    q, k, v = make(rng, (2, 20, E), dtype), make(rng, (2, 33, E), dtype, "transposed"), make(rng, (2, 33, Ev), dtype)
    _sdpa_check(rng, q, k, v, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_nan_values_across_tiles(rng, dtype):
    # several key tiles; NaN in value rows that are masked, dropped or live
    L, S = 100, 250
    q, k, v = make(rng, (2, L, 16), dtype), make(rng, (2, S, 16), dtype), make(rng, (2, S, 24), dtype)
    v[0, 200] = np.nan              # only rows i >= 200 - (S - L) see it (bottom-right)
    v[1, 7, 3] = np.nan             # every row sees it
    mask = np.ones((L, S), bool)
    mask[:, 120] = False
    v[0, 120] = np.nan              # masked everywhere: must not spread
    for p in (0.0, 0.3):
        _sdpa_check(rng, q, k, v, attn_mask=mask, is_causal="bottom_right", dropout_p=p)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L, S", [(1, 4096), (1, 9000), (3, 5000), (8, 4097)])
@pytest.mark.parametrize("kw", [{}, {"is_causal": "bottom_right"}, {"dropout_p": 0.2}, {"mask": True}])
def test_sdpa_decode_split(rng, dtype, L, S, kw):
    # few queries, many keys: keys are split in chunks over threads and merged
    kw = dict(kw)
    if kw.pop("mask", False):
        kw["attn_mask"] = np.where(rng.random((L, S)) > 0.5, rng.standard_normal((L, S)), -np.inf)
    q, k, v = make(rng, (2, L, 16), dtype), make(rng, (2, S, 16), dtype, "transposed"), make(rng, (2, S, 8), dtype)
    if L == 3:
        v[1, 4500] = np.nan                    # one chunk holds a NaN value row
    _sdpa_check(rng, q, k, v, **kw)
