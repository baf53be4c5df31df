"""FP8 KV caches (issue 37 item 5; API.md "Decode precision and FP8 caches"):
quantize / dequantize with "fp8_e4m3" / "fp8_e5m2" against ml_dtypes (every
code, the rounding over a dense sample of float32 patterns and every
midpoint, saturation, zeros, refusals), and attention_with_kvcache over fp8
caches -- contiguous and paged, appends (with rotary), KVCache /
PagedKVCache(dtype="fp8_*") -- equal BIT FOR BIT to the same call over the
dequantized float32 cache: the frame widens fp8 tiles into float32 exactly
as dequantize() does and runs the float32 kernels on them."""
import sys

import numpy as np
import pytest

import pyattn
from pyattn import _reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

FMTS = ["fp8_e4m3", "fp8_e5m2"]
TYPE = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
QMAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
MAXCODE = {"fp8_e4m3": 0x7E, "fp8_e5m2": 0x7B}


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert a.tobytes() == b.tobytes()


def fp8_round(y, fmt):
    """ml_dtypes' conversion (to nearest even) of float32 values within the
    format's range, as bytes"""
    return np.asarray(y, np.float32).astype(TYPE[fmt]).view(np.uint8)


def anchored(y, fmt):
    """rows of 32: QMAX first (so the group's scale is exactly 1.0), then 31
    values of y each; quantize of them is the fp8 rounding of y itself"""
    y = np.asarray(y, np.float32).ravel()
    n = -(-y.size // 31)
    body = np.zeros(n * 31, np.float32)
    body[:y.size] = y
    x = np.concatenate([np.full((n, 1), QMAX[fmt], np.float32), body.reshape(n, 31)], axis=1)
    return x, y.size


# ---- quantize / dequantize ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("out", [np.float32, np.float64])
def test_every_code_dequantizes_to_ml_dtypes_value_times_the_scale(fmt, out):
    """(dequantize, the exact path and the frame's widening share pa_fp8_value)"""
    codes = np.arange(256, dtype=np.uint8).view(TYPE[fmt]).reshape(8, 32)
    scale = np.array([[1.0], [0.5], [3.0], [1e-3], [7.25], [2.0 ** -20], [1e4], [0.1]], np.float32)
    x = pyattn.dequantize(codes, scale, out_dtype=out)
    want = codes.astype(np.float32).astype(out) * scale.astype(out)
    assert x.dtype == out
    np.testing.assert_array_equal(x, want)              # NaN where the code is NaN, inf for e5m2's
    same_bits(np.isnan(x), np.isnan(want))
    if out == np.float32:
        same_bits(x, ref.dequantize(codes, scale, fmt, 32))


@pytest.mark.parametrize("fmt", FMTS)
def test_rounding_equals_ml_dtypes_over_float32_patterns_and_midpoints(fmt):
    top = np.float32(QMAX[fmt]).view(np.uint32)
    pats = np.arange(0, int(top) + 1, 997, dtype=np.uint32)      # dense: every exponent, subnormals too
    y = pats.view(np.float32)
    vals = np.arange(256, dtype=np.uint8).view(TYPE[fmt]).astype(np.float32)
    pos = np.unique(vals[np.isfinite(vals) & (vals >= 0)])
    mid = ((pos[:-1].astype(np.float64) + pos[1:]) / 2).astype(np.float32)    # exact in float32
    near = np.concatenate([mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf)), pos])
    for sample in (y, near):
        both = np.concatenate([sample, -sample])
        both = both[np.abs(both) <= QMAX[fmt]]
        x, n = anchored(both, fmt)
        q, s = pyattn.quantize(x, fmt)
        assert q.dtype == TYPE[fmt] and (s == 1).all()
        same_bits(q[:, 1:].ravel()[:n].view(np.uint8), fp8_round(both, fmt))
        same_bits(q, ref.quantize(x, fmt)[0])


@pytest.mark.parametrize("fmt", FMTS)
def test_the_group_max_saturates_to_the_largest_finite_value(fmt):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((500, 32)) * np.exp(rng.uniform(-20, 20, (500, 1)))).astype(np.float32)
    q, s = pyattn.quantize(x, fmt)
    i = np.argmax(np.abs(x), axis=1)
    top = q.view(np.uint8)[np.arange(500), i]
    assert ((top & 0x7F) == MAXCODE[fmt]).all()          # never NaN / inf, even where x / scale > QMAX
    np.testing.assert_array_equal(s[:, 0], (np.abs(x).max(1) / np.float32(QMAX[fmt])).astype(np.float32))
    assert np.isfinite(pyattn.dequantize(q, s)).all()


@pytest.mark.parametrize("fmt", FMTS)
def test_zero_groups_and_signed_zeros(fmt):
    x = np.zeros((2, 64), np.float32)
    x[0, :32] = -0.0
    x[1, 32] = 5.0
    x[1, 33] = -0.0
    q, s = pyattn.quantize(x, fmt)
    assert s.tolist() == [[0, 0], [0, np.float32(5.0) / np.float32(QMAX[fmt])]]
    b = q.view(np.uint8)
    assert (b[0] == 0).all() and (b[1, :32] == 0).all()   # scale 0: q = 0
    assert b[1, 33] == 0x80                               # -0 / scale: -0, as ml_dtypes rounds it
    same_bits(q, ref.quantize(x, fmt)[0])
    assert (pyattn.dequantize(q, s) == x).all()


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused(fmt, bad):
    x = np.ones((3, 32), np.float32)
    x[1, 7] = bad
    with pytest.raises(ValueError, match="NaN or infinity"):
        pyattn.quantize(x, fmt)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("G", [1, 4, 16, 64])
def test_group_sizes_axes_and_the_reference(fmt, G):
    rng = np.random.default_rng(G)
    x = (rng.standard_normal((3, 64, 5)) * 3).astype(np.float64)
    q, s = pyattn.quantize(x, fmt, group_size=G, axis=1)
    assert q.shape == x.shape and s.shape == (3, 64 // G, 5) and s.dtype == np.float32
    q2, s2 = pyattn.quantize(np.moveaxis(x, 1, -1), fmt, group_size=G)
    same_bits(np.moveaxis(q, 1, -1), q2)
    same_bits(np.moveaxis(s, 1, -1), s2)
    rq, rs = ref.quantize(x, fmt, G, axis=1)
    same_bits(q, rq)
    same_bits(s, rs)
    d = pyattn.dequantize(q, s, axis=1)                       # group size and format read from q, s
    same_bits(d, ref.dequantize(q, s, fmt, G, axis=1))
    same_bits(d, pyattn.dequantize(q, s, dtype=fmt, group_size=G, axis=1))
    # the error is at most half a step: 2^-4 (e4m3) / 2^-3 (e5m2) of the value, or of the scale's
    # subnormal step
    assert np.all(np.abs(d - x) <= np.abs(x) * (2.0 ** -4 if fmt == "fp8_e4m3" else 2.0 ** -3) + 1e-30 +
                  np.repeat(s, G, axis=1) * (2.0 ** -10 if fmt == "fp8_e4m3" else 2.0 ** -17))


def test_dequantize_argument_errors():
    q, s = pyattn.quantize(np.ones((2, 32), np.float32), "fp8_e4m3")
    with pytest.raises(ValueError, match="contradicts q"):
        pyattn.dequantize(q, s, dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="contradicts q"):
        pyattn.dequantize(q, s, dtype="int8")
    with pytest.raises(ValueError, match="group_size=8 contradicts"):
        pyattn.dequantize(q, s, group_size=8)
    with pytest.raises(ValueError, match="dtype must be"):
        pyattn.quantize(np.ones(32), "fp8")


def test_without_ml_dtypes_fp8_is_an_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)      # import ml_dtypes now raises ImportError
    x = np.ones((2, 32), np.float32)
    for fmt in FMTS:
        with pytest.raises(ImportError, match="ml_dtypes"):
            pyattn.quantize(x, fmt)
        with pytest.raises(ImportError, match="ml_dtypes"):
            pyattn.KVCache(1, 1, 8, 32, dtype=fmt)
        with pytest.raises(ImportError, match="ml_dtypes"):
            pyattn.PagedKVCache(4, 4, 1, 32, dtype=fmt)
    pyattn.quantize(x, "int8")                                # the rest needs NumPy only


# ---- attention over fp8 caches -----------------------------------------------------------------

def fcache(rng, B, H, S, E, fmt, G=32, scale=1.0):
    """(fp8 cache, its scales, the dequantized float32 cache)"""
    x = (rng.standard_normal((B, H, S, E)) * scale).astype(np.float32)
    q, s = pyattn.quantize(x, fmt, group_size=G)
    return q, s, pyattn.dequantize(q, s)


OPTIONS = [{}, {"window": (37, 0)}, {"softcap": 5.0}, {"is_causal": False}, {"alibi_slopes": "slopes"}]


@pytest.mark.parametrize("kf,vf", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"), ("fp8_e4m3", "int8"),
                                   ("fp8_e5m2", "float32")])
@pytest.mark.parametrize("T", [1, 3, 40])
@pytest.mark.parametrize("opt", range(len(OPTIONS)))
def test_attention_is_the_float32_cache_of_dequantize_bit_for_bit(kf, vf, T, opt):
    rng = np.random.default_rng(10 * T + opt)
    B, H, Hq, S, E = 2, 2, 8, 300, 64                        # GQA 4:1
    kq, ks, kd = fcache(rng, B, H, S, E, kf)
    if vf == "float32":
        vq = vd = rng.standard_normal((B, H, S, E)).astype(np.float32)
        vs = None
    else:
        vq, vs = pyattn.quantize(rng.standard_normal((B, H, S, E)).astype(np.float32), vf, group_size=16)
        vd = pyattn.dequantize(vq, vs)
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    kw = dict(OPTIONS[opt])
    if kw.get("alibi_slopes") == "slopes":
        kw["alibi_slopes"] = rng.uniform(0.01, 0.2, Hq)
    n = np.array([S - T - 9, 150 - T])
    before = [a.copy() for a in (kq, ks, vq)]
    o, lse = pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=n, k_scale=ks, v_scale=vs, return_lse=True,
                                           **kw)
    o2, lse2 = pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=n, return_lse=True, **kw)
    same_bits(o, o2)
    same_bits(lse, lse2)
    for b, a in zip(before, (kq, ks, vq)):
        same_bits(a, b)                                      # read only


@pytest.mark.parametrize("fmt", FMTS)
def test_long_decode_splits_and_the_reference(fmt):
    rng = np.random.default_rng(3)
    B, H, Hq, S, E = 1, 1, 4, 4200, 128                      # S >= 4096: the key chunks and their merge
    kq, ks, kd = fcache(rng, B, H, S, E, fmt, G=8, scale=2.0)
    vq, vs, vd = fcache(rng, B, H, S, E, fmt, G=128)
    q = rng.standard_normal((B, Hq, 1, E)).astype(np.float32)
    o = pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=S - 7, k_scale=ks, v_scale=vs)
    same_bits(o, pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=S - 7))
    want = ref.attention_with_kvcache(q, kq, vq, cache_seqlens=S - 7, k_scale=ks, v_scale=vs)[0]
    assert np.abs(o - want).max() <= 2e-5 * (1 + np.abs(want).max())


@pytest.mark.parametrize("fmt", FMTS)
def test_strided_caches_and_scales(fmt):
    rng = np.random.default_rng(7)
    B, H, S, E = 2, 3, 200, 64
    qb, sb = pyattn.quantize(rng.standard_normal((B, 2 * H, S + 40, E)).astype(np.float32), fmt, group_size=16)
    kq, ks = qb[:, ::2, 20:20 + S], sb[:, ::2, 20:20 + S]
    vq, vs = qb[::-1, 1::2, 40:], sb[::-1, 1::2, 40:]
    kd, vd = pyattn.dequantize(kq, ks), pyattn.dequantize(vq, vs)
    for T in (1, 10):
        q = rng.standard_normal((B, 2 * H, T, E)).astype(np.float32)[:, ::2]
        same_bits(pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=S - 3, k_scale=ks, v_scale=vs),
                  pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=S - 3))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rotary", [False, True])
def test_appends_are_quantized_by_the_rule(fmt, rotary):
    rng = np.random.default_rng(5)
    B, H, Hq, S, E, G = 2, 2, 4, 64, 32, 16
    kq, ks = pyattn.quantize(np.zeros((B, H, S, E), np.float32), fmt, group_size=G)
    vq, vs = kq.copy(), ks.copy()
    kf, vf = np.zeros((B, H, S, E), np.float32), np.zeros((B, H, S, E), np.float32)   # a float32 twin
    kw = {}
    if rotary:
        ang = rng.uniform(0, 6, (S, E // 2))
        kw = dict(rotary_cos=np.cos(ang).astype(np.float32), rotary_sin=np.sin(ang).astype(np.float32))
    n = np.array([0, 3])
    for T in (5, 1, 12, 1):
        q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
        k = rng.standard_normal((B, H, T, E)).astype(np.float32)
        v = rng.standard_normal((B, H, T, E)).astype(np.float32)
        o = pyattn.attention_with_kvcache(q, kq, vq, k, v, cache_seqlens=n, k_scale=ks, v_scale=vs, **kw)
        pyattn.attention_with_kvcache(q, kf, vf, k, v, cache_seqlens=n, **kw)      # the rotated rows, float32
        for b in range(B):
            rows = slice(n[b], n[b] + T)
            wk, wks = pyattn.quantize(kf[b, :, rows], fmt, group_size=G)
            wv, wvs = pyattn.quantize(vf[b, :, rows], fmt, group_size=G)
            same_bits(kq[b, :, rows], wk)
            same_bits(ks[b, :, rows], wks)
            same_bits(vq[b, :, rows], wv)
            same_bits(vs[b, :, rows], wvs)
        # the call attends over the rows as written: the float32 call over dequantize(cache)
        kd, vd = pyattn.dequantize(kq, ks), pyattn.dequantize(vq, vs)
        n = n + T
        if not rotary:                  # (with rotary the query is rotated too: no call without key to compare)
            same_bits(o, pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=n))
    with pytest.raises(ValueError, match="NaN or infinity"):
        bad = np.full((B, H, 1, E), np.nan, np.float32)
        pyattn.attention_with_kvcache(q[:, :, :1], kq, vq, bad, bad, cache_seqlens=n, k_scale=ks, v_scale=vs)


def to_pools(arrs, bs, rng, extra=3):
    """contiguous caches (B, H, S, .) as pools of blocks in a random order
    (unused blocks filled with noise), and the table"""
    B, H, S = arrs[0].shape[:3]
    nb = S // bs
    N = B * nb + extra
    table = rng.permutation(N)[:B * nb].reshape(B, nb)
    pools = []
    for a in arrs:
        if a.dtype.itemsize == 1:
            pool = rng.integers(0, 120, (N, H, bs) + a.shape[3:], np.uint8).view(a.dtype)
        else:
            pool = rng.uniform(0, 1, (N, H, bs) + a.shape[3:]).astype(a.dtype)
        for b in range(B):
            for i in range(nb):
                pool[table[b, i]] = a[b, :, i * bs:(i + 1) * bs]
        pools.append(pool)
    return pools, table


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("bs", [7, 16, 64])
@pytest.mark.parametrize("T", [1, 20])
def test_paged_equals_contiguous_bit_for_bit(fmt, bs, T):
    rng = np.random.default_rng(bs + T)
    B, H, Hq, E = 2, 2, 4, 64
    S = bs * (448 // bs)
    kq, ks, kd = fcache(rng, B, H, S, E, fmt)
    vq, vs, vd = fcache(rng, B, H, S, E, fmt, G=16)
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    n = np.array([S - T - 3, S // 2 - T])
    (kp, ksp, vp, vsp), table = to_pools([kq, ks, vq, vs], bs, rng)
    o = pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=n, k_scale=ks, v_scale=vs)
    same_bits(o, pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=n, k_scale=ksp, v_scale=vsp,
                                               block_table=table))
    same_bits(o, pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=n))
    # appends into pages: the same bytes as the contiguous append
    k = rng.standard_normal((B, H, T, E)).astype(np.float32)
    v = rng.standard_normal((B, H, T, E)).astype(np.float32)
    n2 = n - 40
    o1 = pyattn.attention_with_kvcache(q, kq, vq, k, v, cache_seqlens=n2, k_scale=ks, v_scale=vs)
    o2 = pyattn.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=n2, k_scale=ksp, v_scale=vsp,
                                       block_table=table)
    same_bits(o1, o2)
    for b in range(B):
        for i in range(S // bs):
            same_bits(kp[table[b, i]], kq[b, :, i * bs:(i + 1) * bs])
            same_bits(ksp[table[b, i]], ks[b, :, i * bs:(i + 1) * bs])
            same_bits(vp[table[b, i]], vq[b, :, i * bs:(i + 1) * bs])


@pytest.mark.parametrize("fmt", FMTS)
def test_kvcache_and_paged_kvcache_attend_and_fork(fmt):
    rng = np.random.default_rng(11)
    B, H, Hq, E = 2, 2, 4, 64
    c = pyattn.KVCache(B, H, 128, E, dtype=fmt, group_size=16)
    assert c.k.dtype == TYPE[fmt] and c.k_scale.shape == (B, H, 128, 4)
    assert f"dtype={fmt}" in repr(c) and "group_size=16" in repr(c)
    p = pyattn.PagedKVCache(64, 8, H, E, dtype=fmt, group_size=16)
    seqs = [p.add_sequence() for _ in range(B)]
    for T in (9, 1, 1, 30, 1):
        q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
        k = rng.standard_normal((B, H, T, E)).astype(np.float32)
        v = rng.standard_normal((B, H, T, E)).astype(np.float32)
        same_bits(c.attend(q, k, v), p.attend(seqs, q, k, v))
    # fork: the child reads the parent's blocks, then writes its own (copy on write, scales along)
    child = p.fork(seqs[0])
    q = rng.standard_normal((1, Hq, 1, E)).astype(np.float32)
    k = rng.standard_normal((1, H, 1, E)).astype(np.float32)
    v = rng.standard_normal((1, H, 1, E)).astype(np.float32)
    oc = p.attend([child], q, k, v)
    c1 = pyattn.KVCache(1, H, 128, E, dtype=fmt, group_size=16)
    c1.k[:], c1.v[:], c1.k_scale[:], c1.v_scale[:] = c.k[:1], c.v[:1], c.k_scale[:1], c.v_scale[:1]
    c1.lengths[:] = c.lengths[:1]
    same_bits(oc, c1.attend(q, k, v))
    op = p.attend([seqs[0]], q, k, v)                       # the parent: unchanged by the child's row
    same_bits(op, oc)


@pytest.mark.parametrize("fmt", FMTS)
def test_kvcache_attend_is_the_float32_call_over_dequantize(fmt):
    rng = np.random.default_rng(12)
    B, H, Hq, E = 2, 1, 4, 32
    c = pyattn.KVCache(B, H, 64, E, dtype=fmt)
    for T in (6, 1, 13):
        q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
        k = rng.standard_normal((B, H, T, E)).astype(np.float32)
        v = rng.standard_normal((B, H, T, E)).astype(np.float32)
        o = c.attend(q, k, v)
        kd, vd = pyattn.dequantize(c.k, c.k_scale), pyattn.dequantize(c.v, c.v_scale)
        same_bits(o, pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=c.lengths, is_causal=True))


def _views_call(q, kc, vc, ks, vs, k, v, n, pad, idx, **kw):
    """The call as it ran before cache_leftpad / cache_batch_idx were C's: one
    call per sequence on views k_cache[idx[b], :, pad[b]:] (the oracle)."""
    outs = []
    for b in range(q.shape[0]):
        i, p = int(idx[b]), int(pad[b])
        sl = lambda c: None if c is None else c[i:i + 1, :, p:]      # noqa: E731
        outs.append(pyattn.attention_with_kvcache(
            q[b:b + 1], sl(kc), sl(vc), None if k is None else k[b:b + 1], None if v is None else v[b:b + 1],
            cache_seqlens=int(n[b]) - p, k_scale=sl(ks), v_scale=sl(vs), **kw))
    return np.concatenate(outs)


@pytest.mark.parametrize("fmt", FMTS + ["int8", "int4"])
@pytest.mark.parametrize("T", [1, 3])
def test_leftpad_and_batch_idx_as_int8_caches_take_them(fmt, T):
    """int8 / int4 / fp8 caches take cache_leftpad / cache_batch_idx (C's, on
    the cache description): without new rows, the same call on the float32
    cache dequantize(cache) (fp8: bit for bit; int8 / int4: to float32
    tolerance), and bit for bit the call on views of the cache; with new
    rows (quantized as written into entry idx[b]), the views' call on a copy
    of the caches, result and caches bit for bit."""
    rng = np.random.default_rng(13)
    B, H, Hq, S, E = 3, 2, 4, 96, 64
    kq, ks, kd = fcache(rng, B, H, S, E, fmt)
    vq, vs, vd = fcache(rng, B, H, S, E, fmt, G=16)
    q = rng.standard_normal((2, Hq, T, E)).astype(np.float32)
    n = np.array([80, 50])
    for kw in (dict(cache_batch_idx=np.array([2, 0])), dict(cache_leftpad=np.array([5, 0]), cache_batch_idx=[1, 2]),
               dict(cache_leftpad=np.array([5, 50]), cache_batch_idx=[0, 1], window=(20, 0), softcap=4.0)):
        idx = np.asarray(kw["cache_batch_idx"])
        pad = np.asarray(kw.get("cache_leftpad", np.zeros(2, np.int64)))
        opts = {x: kw[x] for x in ("window", "softcap") if x in kw}
        o = pyattn.attention_with_kvcache(q, kq, vq, k_scale=ks, v_scale=vs, cache_seqlens=n, **kw)
        od = pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=n, **kw)
        if fmt in FMTS:
            same_bits(o, od)
        else:
            assert np.allclose(o, od, rtol=1e-5, atol=1e-5)
        same_bits(o, _views_call(q, kq, vq, ks, vs, None, None, n, pad, idx, **opts))
        k = rng.standard_normal((2, H, T, E)).astype(np.float32)
        v = rng.standard_normal((2, H, T, E)).astype(np.float32)
        caches = [a.copy() for a in (kq, vq, ks, vs)]
        o = pyattn.attention_with_kvcache(q, *caches[:2], k, v, k_scale=caches[2], v_scale=caches[3],
                                          cache_seqlens=n, **kw)
        ref = [a.copy() for a in (kq, vq, ks, vs)]
        o2 = _views_call(q, ref[0], ref[1], ref[2], ref[3], k, v, n, pad, idx, **opts)
        same_bits(o, o2)
        for a, b in zip(caches, ref):
            same_bits(a, b)


@pytest.mark.parametrize("fmt", FMTS)
def test_thread_counts_give_the_same_bits(fmt):
    rng = np.random.default_rng(14)
    kq, ks, _ = fcache(rng, 2, 2, 700, 64, fmt)
    vq, vs, _ = fcache(rng, 2, 2, 700, 64, fmt)
    x = rng.standard_normal((300, 256)).astype(np.float32)
    n = pyattn.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            pyattn.set_num_threads(t)
            got = [pyattn.quantize(x, fmt)[0].view(np.uint8)]
            for T in (1, 17):
                q = np.random.default_rng(T).standard_normal((2, 8, T, 64)).astype(np.float32)
                got.append(pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=[690, 321], k_scale=ks,
                                                         v_scale=vs))
            outs.append(got)
    finally:
        pyattn.set_num_threads(n)
    for o in outs[1:]:
        for a, b in zip(o, outs[0]):
            same_bits(a, b)


def test_errors():
    rng = np.random.default_rng(15)
    kq, ks, kd = fcache(rng, 1, 2, 16, 32, "fp8_e4m3")
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    f = pyattn.attention_with_kvcache
    with pytest.raises(ValueError, match="k_cache is an fp8_e4m3 cache: k_scale"):
        f(q, kq, kq, cache_seqlens=4, v_scale=ks)
    with pytest.raises(TypeError, match="k_scale must be a float32"):
        f(q, kq, kq, cache_seqlens=4, k_scale=ks.astype(np.float64), v_scale=ks)
    with pytest.raises(ValueError, match="k_scale"):
        f(q, kq, kq, cache_seqlens=4, k_scale=ks[..., :3, :], v_scale=ks)
    with pytest.raises(ValueError, match="k_scale"):
        f(q, kq, kq, cache_seqlens=4, k_scale=np.zeros((1, 2, 16, 5), np.float32), v_scale=ks)
    with pytest.raises(ValueError, match="v_scale is given but v_cache is float32"):
        f(q, kq, kd, cache_seqlens=4, k_scale=ks, v_scale=ks)
    with pytest.raises(ValueError, match="precision"):
        f(q, kq, kq, cache_seqlens=4, k_scale=ks, v_scale=ks, precision="int8")
    # precision="bf16" is no longer refused with fp8 caches (its rule: test_precision_bf16_quant.py)
    assert np.isfinite(f(q, kq, kq, cache_seqlens=4, k_scale=ks, v_scale=ks, precision="bf16")).all()
    with pytest.raises(ValueError, match="group_size 12 must divide"):
        pyattn.KVCache(1, 1, 8, 32, dtype="fp8_e5m2", group_size=12)
    c = pyattn.KVCache(1, 2, 8, 32, dtype="fp8_e4m3")
    with pytest.raises(ValueError, match="precision"):
        c.attend(q, q, q, precision="int8")
    assert c.lengths.tolist() == [0]
