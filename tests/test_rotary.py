"""Rotary embedding (RoPE) in C (issue 29, csrc/ops/rotary.h): the queries
rotated by _C.rotary into a scratch, the new keys rotated as the appends
(contiguous, paged, packed, quantized) write them. Bit for bit against a
NumPy float64 reference rounded once to the storage dtype (float32 / 16-bit:
exact products in float64, then one rounding; float64: NumPy's own float64
expression ``x1 * c - x2 * s``), the rest of the features unchanged, only
the asked cache rows written, bad input a clear error with nothing written."""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import pyattn
from pyattn import _C

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.float32, np.float64, np.float16, BF16]


def cd_of(dt):
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)


FORMATS = {np.dtype(np.float32): (24, -126), np.dtype(np.float16): (11, -14), BF16: (8, -126)}


def round_exact(v, dt):
    """The Fraction v rounded to nearest even in dt (precision p, least
    exponent emin; no overflow in these tests), as a float64."""
    p, emin = FORMATS[np.dtype(dt)]
    if v == 0:
        return 0.0
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, emin) - p + 1)
    n, r = divmod(a, ulp)
    n = int(n) + (r > ulp / 2 or (r == ulp / 2 and int(n) % 2))
    return float(n * ulp) * (1 if v > 0 else -1)


def ref_rotate(x, pos, cos, sin, interleaved, out_dt, cd):
    """x (A, H, T, E) at pos (A, T); inputs taken in cd. float64: NumPy's
    float64 x1 * c - x2 * s; float32: the exact value (fractions) rounded
    once to out_dt."""
    half = cos.shape[1]
    x64 = x.astype(cd).astype(np.float64)
    c = cos.astype(cd).astype(np.float64)[pos][:, None]
    s = sin.astype(cd).astype(np.float64)[pos][:, None]
    y = x64.copy()
    if interleaved:
        a, b = slice(0, 2 * half, 2), slice(1, 2 * half, 2)
    else:
        a, b = slice(0, half), slice(half, 2 * half)
    x1, x2 = x64[..., a], x64[..., b]
    if cd == np.float64:
        y[..., a] = x1 * c - x2 * s
        y[..., b] = x1 * s + x2 * c
        return y.astype(out_dt)
    cb, sb, x1b, x2b = (np.broadcast_to(t, x1.shape).ravel() for t in (c, s, x1, x2))
    F = Fraction
    y1 = [round_exact(F(u) * F(cc) - F(w) * F(ss), out_dt) for u, w, cc, ss in zip(x1b, x2b, cb, sb)]
    y2 = [round_exact(F(u) * F(ss) + F(w) * F(cc), out_dt) for u, w, cc, ss in zip(x1b, x2b, cb, sb)]
    y[..., a] = np.reshape(y1, x1.shape)
    y[..., b] = np.reshape(y2, x1.shape)
    return y.astype(out_dt)


def u16(a):
    return a.view(np.uint16) if a.dtype == BF16 else a


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(u16(a)).view(np.uint8), np.ascontiguousarray(u16(b)).view(np.uint8))


def tabs(rng, R, half):
    ang = rng.uniform(0, 6.3, (R, half))
    return np.cos(ang), np.sin(ang)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("E, half", [(16, 8), (24, 4), (7, 3), (130, 65)])
def test_kernel_matches_float64_reference(rng, dt, interleaved, E, half):
    cd = cd_of(dt)
    A, H, T, R = 2, 2, 3, 40
    x = rng.standard_normal((A, H, T, 2 * E)).astype(dt)[..., ::2]      # strided rows
    cos, sin = tabs(rng, R, half)
    cos, sin = cos.astype(cd), sin.astype(cd)
    pos = rng.integers(0, R, (A, T))
    x0 = x.copy()
    y = np.empty(x.shape, dt)
    _C.rotary(u16(x), pos, cos, sin, interleaved, u16(y))
    assert same_bits(y, ref_rotate(x, pos, cos, sin, interleaved, dt, cd))
    assert same_bits(x, x0)                                           # the input untouched
    assert same_bits(y[..., 2 * half:], x[..., 2 * half:])            # past rotary_dim: copied


# x1, x2 (16-bit values), cos, sin (float32 values) whose float32 result
# lies on a 16-bit tie: rounding the float32 value again gives `twice`,
# one unit from the exactly rounded `once` (found by a search)
TIES = [(np.float16, -0.29150390625, -0.03656005859375, 0.5836267471313477, 0.8120220899581909,
         -0.140380859375, -0.1405029296875),
        (BF16, -0.77734375, 0.78125, 0.5578421354293823, 0.8299471139907837, -1.078125, -1.0859375)]


@pytest.mark.parametrize("dt, x1, x2, c, s, twice, once", TIES, ids=["float16", "bfloat16"])
def test_kernel_rounds_once(dt, x1, x2, c, s, twice, once):
    x = np.array([x1, x2], dt).reshape(1, 1, 1, 2)
    y = np.empty_like(x)
    _C.rotary(u16(x), np.zeros((1, 1), np.int64), np.array([[c]], np.float32), np.array([[s]], np.float32),
              False, u16(y))
    assert np.float32(c) == c and np.float32(s) == s and x[0, 0, 0, 0] == x1 and x[0, 0, 0, 1] == x2
    assert np.array(x1 * c - x2 * s).astype(np.float32).astype(dt) == np.array(twice).astype(dt)
    assert round_exact(Fraction(x1) * Fraction(c) - Fraction(x2) * Fraction(s), dt) == once
    assert float(y[0, 0, 0, 0]) == once


def test_kernel_bad_input_raises(rng):
    x = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    cos, sin = (a.astype(np.float32) for a in tabs(rng, 4, 4))
    pos = np.zeros((1, 3), np.int64)
    y = np.zeros_like(x)
    with pytest.raises(ValueError, match="rotary_cos/rotary_sin have 4 rows"):
        _C.rotary(x, pos + 4, cos, sin, False, y)
    with pytest.raises(TypeError, match="rotary_cos and rotary_sin must be float32"):
        _C.rotary(x, pos, cos.astype(np.float64), sin, False, y)
    with pytest.raises(ValueError, match="rotary_dim <= the head dim"):
        _C.rotary(x, pos, np.zeros((4, 5), np.float32), np.zeros((4, 5), np.float32), False, y)
    with pytest.raises(ValueError, match="overlap"):
        _C.rotary(x, pos, cos, sin, False, x)
    with pytest.raises(ValueError, match="positions must be"):
        _C.rotary(x, pos[:, :2], cos, sin, False, y)
    with pytest.raises(TypeError, match="float64, or neither"):
        _C.rotary(x, pos, cos, sin, False, y.astype(np.float64))
    assert not y.any()


B, HQ, HKV, E, S = 3, 4, 2, 16, 24
N = np.array([4, 0, 9])


def make_case(rng, dt, T=3, Tk=3, half=4, R=32):
    kc = rng.standard_normal((B, HKV, S, E)).astype(dt)
    vc = rng.standard_normal((B, HKV, S, E)).astype(dt)
    q = rng.standard_normal((B, HQ, T, E)).astype(dt)
    k = rng.standard_normal((B, HKV, Tk, E)).astype(dt)
    v = rng.standard_normal((B, HKV, Tk, E)).astype(dt)
    cos, sin = tabs(rng, R, half)
    return kc, vc, q, k, v, cos, sin


@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("causal, interleaved", [(True, False), (False, True), (False, False)])
def test_kvcache_rows_and_queries(rng, dt, causal, interleaved):
    """The cache rows [n_b, n_b + Tk) hold the keys rotated at n_b + t (no
    other row changes); the result is the call without rotary on the
    reference-rotated query (at n_b + t when causal, else n_b) and keys."""
    kc, vc, q, k, v, cos, sin = make_case(rng, dt)
    cd = cd_of(dt)
    kc0, vc0 = kc.copy(), vc.copy()
    o = pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=N, is_causal=causal,
                                      rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    T = q.shape[2]
    kpos = N[:, None] + np.arange(3)
    kref = ref_rotate(k, kpos, cos, sin, interleaved, dt, cd)
    qpos = N[:, None] + (np.arange(T) if causal else np.zeros(T, np.int64))
    qref = ref_rotate(q, qpos, cos, sin, interleaved, dt, cd)
    want_k = kc0.copy()
    for b in range(B):
        want_k[b, :, N[b]:N[b] + 3] = kref[b]
    assert same_bits(kc, want_k)
    vw = vc0.copy()
    for b in range(B):
        vw[b, :, N[b]:N[b] + 3] = v[b]
    assert same_bits(vc, vw)
    kc2, vc2 = kc0.copy(), vc0.copy()
    o2 = pyattn.attention_with_kvcache(qref, kc2, vc2, kref, v, cache_seqlens=N, is_causal=causal)
    assert same_bits(kc2, kc) and same_bits(o, o2)


@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=str)
def test_leftpad_and_batch_idx_positions_are_cache_rows(rng, dt):
    kc, vc, q, k, v, cos, sin = make_case(rng, dt, T=2, Tk=2)
    cd = cd_of(dt)
    kc = np.concatenate([kc, kc[:1]])                   # 4 cache entries for 3 sequences
    vc = np.concatenate([vc, vc[:1]])
    idx, pad = np.array([3, 0, 2]), np.array([1, 0, 5])
    kc0 = kc.copy()
    pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=N, cache_leftpad=pad, cache_batch_idx=idx,
                                  rotary_cos=cos, rotary_sin=sin)
    want = kc0.copy()
    kref = ref_rotate(k, N[:, None] + np.arange(2), cos, sin, False, dt, cd)
    for b in range(B):
        want[idx[b], :, N[b]:N[b] + 2] = kref[b]
    assert same_bits(kc, want)                          # entry 1 untouched


@pytest.mark.parametrize("dt", [np.float32, BF16, "int8"], ids=str)
def test_paged_write_matches_reference(rng, dt):
    bs, nblk = 4, 20
    quant = dt == "int8"
    cache = pyattn.PagedKVCache(num_blocks=nblk, block_size=bs, num_kv_heads=HKV, head_dim=E,
                                dtype=dt, group_size=8)
    fdt = np.float32 if quant else dt
    kc, vc, q, k, v, cos, sin = make_case(rng, fdt)
    table = rng.permutation(nblk)[:B * 6].reshape(B, 6)
    kp0 = cache.k.copy()
    pyattn.attention_with_kvcache(q, cache.k, cache.v, k, v, cache_seqlens=N, block_table=table,
                                  rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True,
                                  **(dict(k_scale=cache.k_scale, v_scale=cache.v_scale) if quant else {}))
    kref = ref_rotate(k, N[:, None] + np.arange(3), cos, sin, True, np.float32 if quant else fdt,
                      np.dtype(np.float32))
    changed = set()
    for b in range(B):
        for t in range(3):
            r = N[b] + t
            blk, row = table[b, r // bs], r % bs
            changed.add((blk, row))
            if quant:
                qk, sk = pyattn.quantize(kref[b, :, t], "int8", group_size=8)
                assert np.array_equal(cache.k[blk, :, row], qk) and np.array_equal(cache.k_scale[blk, :, row], sk)
            else:
                assert same_bits(cache.k[blk, :, row], kref[b, :, t])
    for blk in range(nblk):
        for row in range(bs):
            if (blk, row) not in changed:
                assert same_bits(cache.k[blk, :, row], kp0[blk, :, row])


def test_packed_queries_and_keys(rng):
    """cu_seqlens_q: row t of sequence b at n_b + t (keys and causal
    queries); the same rows as one padded call per sequence."""
    dt = np.float32
    kc, vc, _, _, _, cos, sin = make_case(rng, dt)
    Ts = np.array([2, 0, 3])
    cu = np.concatenate([[0], np.cumsum(Ts)])
    q = rng.standard_normal((cu[-1], HQ, E)).astype(dt)
    k = rng.standard_normal((cu[-1], HKV, E)).astype(dt)
    v = rng.standard_normal((cu[-1], HKV, E)).astype(dt)
    kc2, vc2 = kc.copy(), vc.copy()
    o = pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=N, cu_seqlens_q=cu,
                                      rotary_cos=cos, rotary_sin=sin)
    for b in range(B):
        sl = slice(cu[b], cu[b + 1])
        if Ts[b] == 0:
            continue
        kref = ref_rotate(k[sl].transpose(1, 0, 2)[None], N[b] + np.arange(Ts[b])[None], cos, sin, False,
                          dt, np.dtype(dt))[0]
        assert same_bits(kc[b, :, N[b]:N[b] + Ts[b]], kref)
        ob = pyattn.attention_with_kvcache(q[sl].transpose(1, 0, 2)[None], kc2[b:b + 1], vc2[b:b + 1],
                                           k[sl].transpose(1, 0, 2)[None], v[sl].transpose(1, 0, 2)[None],
                                           cache_seqlens=int(N[b]), rotary_cos=cos, rotary_sin=sin)
        assert np.allclose(o[sl], ob[0].transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
    assert same_bits(kc, kc2)


@pytest.mark.parametrize("paged", [False, True])
def test_bad_input_names_argument_and_writes_nothing(rng, paged):
    kc, vc, q, k, v, cos, sin = make_case(rng, np.float32, R=11)   # N[2] + 3 > 11: too few rows
    kw = {}
    if paged:
        kw["block_table"] = np.arange(B * 6).reshape(B, 6)
        kc, vc = (np.ascontiguousarray(np.concatenate([c[:, :, 4 * j:4 * j + 4] for j in range(6)])
                                       .reshape(6, B, HKV, 4, E).transpose(1, 0, 2, 3, 4)
                                       .reshape(B * 6, HKV, 4, E)) for c in (kc, vc))
    kc0, vc0 = kc.copy(), vc.copy()
    cases = [
        (dict(rotary_cos=cos, rotary_sin=sin), ValueError, "rotary_cos/rotary_sin have 11 rows"),
        (dict(rotary_cos=cos[:20], rotary_sin=sin[:20, :3]), ValueError, "rotary_sin"),
        (dict(rotary_cos=cos[:20, 0], rotary_sin=sin[:20, 0]), ValueError, "rotary_cos must be"),
        (dict(rotary_cos=np.ones((20, 9)), rotary_sin=np.ones((20, 9))), ValueError, "rotary_dim = 18 exceeds"),
        (dict(rotary_cos=cos), ValueError, "give both rotary_cos and rotary_sin"),
        (dict(rotary_cos=np.full((20, 4), "a"), rotary_sin=sin), TypeError, "rotary_cos"),
    ]
    for extra, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=N, **kw, **extra)
        assert np.array_equal(kc, kc0) and np.array_equal(vc, vc0)
    with pytest.raises(ValueError, match="key and value must be given"):
        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=N, rotary_cos=cos, rotary_sin=sin, **kw)


def test_odd_head_dim_and_partial_rotary(rng):
    """rotary_dim is twice the tables' columns (never odd): on an odd head
    dim E = 7, 3 columns rotate 6 features and copy the 7th; 4 columns
    (rotary_dim 8 > 7) are rejected naming rotary_cos."""
    kc = np.zeros((1, 1, 8, 7), np.float32)
    vc = np.zeros_like(kc)
    q, k, v = rng.standard_normal((3, 1, 1, 2, 7)).astype(np.float32)
    cos, sin = tabs(rng, 8, 3)
    pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=1, rotary_cos=cos, rotary_sin=sin)
    ref = ref_rotate(k, np.array([[1, 2]]), cos, sin, False, np.float32, np.dtype(np.float32))
    assert same_bits(kc[:, :, 1:3], ref) and same_bits(kc[..., 6], np.pad(k[..., 6], ((0, 0), (0, 0), (1, 5))))
    kc[:] = 0
    with pytest.raises(ValueError, match="rotary_cos has shape \\(8, 4\\): rotary_dim = 8 exceeds the head dim 7"):
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=1, rotary_cos=np.ones((8, 4)),
                                      rotary_sin=np.ones((8, 4)))
    assert not kc.any()
