"""Property tests of the quantized paths (issue #25, "Tests": hypothesis):

- quantize / dequantize: bit for bit pyattn._reference's float32 rule on any
  finite float32 values (subnormal, huge, mixed magnitudes in a group), the
  integers within +-QMAX (0 where the scale is 0), and the roundtrip error
  of each value within its bound: half a step (0.5 * scale) plus the
  float32 roundings of the division and of q * scale, plus what a subnormal
  scale's own rounding can add (QMAX * 2**-150);
- attention over int8 / int4 caches (contiguous or paged, new rows or not,
  rows path T <= 8 and tiled path T > 8, GQA, window, ALiBi, softcap, sinks,
  a float32 cache beside a quantized one) equals the float64 oracle over the
  dequantized caches (the new rows quantized by the reference rule) within
  the float32 tolerance of conftest (TOL x mag_attention: the error model is
  the float32 sums, not the quantization), and the caches hold exactly the
  reference's quantized rows and scales.

The hypothesis profile is bounded and derandomized (reproducible in CI).
"""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import pyattn  # noqa: E402
from pyattn import _reference as R  # noqa: E402
from conftest import check, mag_attention  # noqa: E402
from test_quant_paged import rows_of, to_pools  # noqa: E402

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]


def profile(n):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


QMAX = {"int8": 127, "int4": 7}
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def quant_case(draw):
    dtype = draw(st.sampled_from(["int8", "int4"]))
    G = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32]))
    ng = draw(st.integers(1, 4))
    if dtype == "int4" and (G * ng) % 2:
        ng *= 2
    rows = draw(st.integers(1, 3))
    x = draw(hnp.arrays(np.float32, (rows, G * ng), elements=finite32))
    # a group of one magnitude now and then: a scale of any exponent
    if draw(st.booleans()):
        x = (x / np.float32(2.0) ** draw(st.integers(0, 120))).astype(np.float32)
    return dtype, G, x


@profile(150)
@given(quant_case())
def test_quantize_roundtrip_bounds(case):
    dtype, G, x = case
    q, s = pyattn.quantize(x, dtype, group_size=G)
    rq, rs = R.quantize(x, dtype, G)
    same_bits(q, rq)
    same_bits(s, rs)
    y = pyattn.dequantize(q, s, dtype=dtype, group_size=G)
    same_bits(y, R.dequantize(q, s, dtype, G))
    v = (R.unpack_int4(q) if dtype == "int4" else q).astype(np.int64)
    qmax = QMAX[dtype]
    assert np.all(np.abs(v) <= qmax)
    step = np.repeat(s.astype(np.float64), G, axis=-1)
    assert np.all(v[step == 0] == 0)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    u = 2.0 ** -24
    bound = 0.5 * step + u * (np.abs(x64) + 1.001 * np.abs(y64)) + (qmax + 2) * 2.0 ** -150
    err = np.abs(x64 - y64)
    assert np.all(err <= bound), (err - bound).max()
    # the group's largest value comes back as +-QMAX steps (exact up to the scale's rounding)
    amax = np.abs(x64).reshape(x.shape[0], -1, G).max(-1)
    big = amax > 2.0 ** -100
    assert np.all(np.abs(v).reshape(x.shape[0], -1, G).max(-1)[big] == qmax)


@st.composite
def attn_case(draw):
    kdt = draw(st.sampled_from(["int8", "int4", None]))
    vdt = draw(st.sampled_from(["int8", "int4"] + ([None] if kdt else [])))
    G = draw(st.sampled_from([8, 16, 32]))
    E = G * draw(st.integers(1, 3))
    Ev = G * draw(st.integers(1, 2))
    B, Hkv, groups = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4]))
    T = draw(st.sampled_from([1, 2, 5, 9, 13]))
    new = draw(st.booleans())
    n = draw(st.lists(st.integers(0 if new else T, 70), min_size=B, max_size=B))
    bs = draw(st.sampled_from([None, 1, 4, 16, 64]))    # None: a contiguous cache
    opt = draw(st.sampled_from(["", "window", "alibi", "softcap", "sinks", "noncausal"]))
    seed = draw(st.integers(0, 2**32 - 1))
    return kdt, vdt, G, E, Ev, B, Hkv, groups, T, new, n, bs, opt, seed


def cache(rng, B, H, S, D, dtype, G):
    x = rng.standard_normal((B, H, S, D)).astype(np.float32)
    if dtype is None:
        return x, None
    return pyattn.quantize(x, dtype, group_size=G)


def dq(c, s, dtype, G):
    return c if dtype is None else R.dequantize(c, s, dtype, G)


@profile(150)
@given(attn_case())
def test_attention_over_quantized_caches_matches_the_dequantized_oracle(case):
    kdt, vdt, G, E, Ev, B, Hkv, groups, T, new, n, bs, opt, seed = case
    rng = np.random.default_rng(seed)
    Hq = Hkv * groups
    n = np.array(n, np.int64)
    need = int((n + (T if new else 0)).max())
    S = max(need, 1) if bs is None else -(-max(need, 1) // bs) * bs
    kc, ks = cache(rng, B, Hkv, S, E, kdt, G)
    vc, vs = cache(rng, B, Hkv, S, Ev, vdt, G)
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    kn = vn = None
    if new:
        kn = rng.standard_normal((B, Hkv, T, E)).astype(np.float32)
        vn = rng.standard_normal((B, Hkv, T, Ev)).astype(np.float32)
    kw = {"is_causal": opt != "noncausal"}
    if opt == "window":
        kw["window"] = (int(rng.integers(0, 40)), 0)
    elif opt == "alibi":
        kw["alibi_slopes"] = rng.uniform(0.01, 0.3, Hq)
    elif opt == "softcap":
        kw["softcap"] = 3.0
    elif opt == "sinks":
        kw["sinks"] = rng.standard_normal(Hq)
    # the expected caches: the new rows quantized by the reference rule
    want = [None if x is None else x.copy() for x in (kc, vc, ks, vs)]
    if new:
        for b in range(B):
            for x, (c, sc, dt) in ((kn, (0, 2, kdt)), (vn, (1, 3, vdt))):
                rows = slice(n[b], n[b] + T)
                if dt is None:
                    want[c][b, :, rows] = x[b]
                else:
                    want[c][b, :, rows], want[sc][b, :, rows] = R.quantize(x[b], dt, G)
    arrs = [a for a in (kc, vc, ks, vs) if a is not None]
    if bs is None:
        got = pyattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=n, k_scale=ks, v_scale=vs,
                                           return_lse=True, **kw)
        for a, w in zip((kc, vc, ks, vs), want):
            if a is not None:
                same_bits(a, w)
    else:
        pools, tab = to_pools(arrs, bs, rng)
        it = iter(pools)
        kp, vp = next(it), next(it)
        ksp = next(it) if ks is not None else None
        vsp = next(it) if vs is not None else None
        got = pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab,
                                           k_scale=ksp, v_scale=vsp, return_lse=True, **kw)
        m = n + (T if new else 0)
        for b in range(B):
            for p, w in zip((kp, vp, ksp, vsp), want):
                if p is not None:
                    same_bits(rows_of(p, tab[b], int(m[b])), w[b, :, :m[b]])
    kd, vd = dq(want[0], want[2], kdt, G), dq(want[1], want[3], vdt, G)
    m = n + (T if new else 0)
    scale = 1 / np.sqrt(E)
    for b in range(B):
        o, w, lse = R.scaled_dot_product_attention(
            q[b].astype(np.float64), kd[b, :, :m[b]].astype(np.float64), vd[b, :, :m[b]].astype(np.float64),
            None, 0.0, "bottom_right" if kw["is_causal"] else False, None, enable_gqa=True,
            window=kw.get("window"), alibi_slopes=kw.get("alibi_slopes"), softcap=kw.get("softcap"),
            sinks=kw.get("sinks"), return_weights=True, return_lse=True, qoff=int(m[b]) - T)
        kk = np.repeat(kd[b, :, :m[b]], groups, axis=0)
        vv = np.repeat(vd[b, :, :m[b]], groups, axis=0)
        mag = mag_attention(q[b], kk, vv, w, scale)
        check(got[0][b], o.astype(np.float32), mag)
        S_b = int(m[b])                                  # the log-sum-exp's error scale (test_properties_product)
        lmag = (4 + np.abs(np.where(np.isfinite(lse), lse, 0)) + np.log1p(S_b)) * np.sqrt(S_b + 1)
        check(got[1][b], lse.astype(np.float32), lmag)
