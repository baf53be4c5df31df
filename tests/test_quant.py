"""Quantized KV caches (issue #25): pyattn.quantize / dequantize against
the NumPy oracle bit for bit, their errors, the int4 packing, and llama.cpp's
q8_0 arithmetic."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as ref

RNG = np.random.default_rng(25)
QMAX = {"int8": 127, "int4": 7}


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("E", [64, 96, 128])
def test_every_group_size_matches_the_reference(dtype, E):
    x = (RNG.standard_normal((3, 5, E)) * RNG.uniform(0.01, 100, (3, 5, 1))).astype(np.float32)
    for g in [g for g in range(1, E + 1) if E % g == 0]:
        q, s = pyattn.quantize(x, dtype, group_size=g)
        rq, rs = ref.quantize(x, dtype, g)
        same_bits(q, rq)
        same_bits(s, rs)
        same_bits(pyattn.dequantize(q, s, dtype=dtype, group_size=g), ref.dequantize(rq, rs, dtype, g))


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_special_values(dtype):
    qm = QMAX[dtype]
    f32 = np.finfo(np.float32)
    rows = [
        np.zeros(32),                                          # scale 0: q 0
        np.full(32, f32.max), np.full(32, -f32.max),           # +-max
        np.r_[f32.max, -f32.max, np.zeros(30)],
        np.r_[np.full(16, f32.smallest_subnormal), np.full(16, 3e-45)],   # subnormal: scale 0
        np.linspace(-1, 1, 32) * 1e-39,                        # subnormal scales
        np.linspace(-1, 1, 32) * 1e-36,
        np.arange(-16, 16) * 0.5,                              # halves
    ]
    x = np.array(rows, np.float32)
    q, s = pyattn.quantize(x, dtype)
    rq, rs = ref.quantize(x, dtype)
    same_bits(q, rq)
    same_bits(s, rs)
    v = ref.unpack_int4(q) if dtype == "int4" else q
    assert (v[0] == 0).all() and s[0, 0] == 0
    assert (v[1] == qm).all() and (v[2] == -qm).all()
    assert s[4, 0] == 0 and (v[4] == 0).all()


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_ties_round_to_even(dtype):
    qm = QMAX[dtype]
    # scale = qm / qm = 1 exactly: x / scale = x, so k + 0.5 are exact ties
    halves = np.arange(-qm + 0.5, qm, 1.0)
    x = np.zeros((1, 2 * len(halves) + (len(halves) % 2) * 2), np.float32)
    x[0, :len(halves)] = halves
    x[0, -1] = qm
    g = x.shape[1]
    q, s = pyattn.quantize(x, dtype, group_size=g)
    assert s[0, 0] == 1
    v = (ref.unpack_int4(q) if dtype == "int4" else q)[0, :len(halves)]
    np.testing.assert_array_equal(v, np.rint(halves).astype(np.int8))
    assert (np.abs(v) % 2 == 0).all()


def test_int4_packing_order():
    x = np.array([[1, -2, 3, -4, 5, -6, 7, 0]], np.float32)     # scale 1: q = x
    q, s = pyattn.quantize(x, "int4", group_size=8)
    assert s[0, 0] == 1 and q.dtype == np.uint8 and q.shape == (1, 4)
    # even index in the low nibble, two's complement
    assert list(q[0]) == [1 | (0xE << 4), 3 | (0xC << 4), 5 | (0xA << 4), 7 | (0 << 4)]


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_any_axis_and_strides(dtype):
    x = RNG.standard_normal((64, 6, 8)).astype(np.float64)
    for axis in (0, 1, -1):
        for view in (x, x[::-1], x.transpose(2, 1, 0)[..., ::2].transpose(2, 1, 0)):
            if view.shape[axis] % 2:
                continue
            g = 2
            q, s = pyattn.quantize(view, dtype, group_size=g, axis=axis)
            rq, rs = ref.quantize(view, dtype, g, axis)
            same_bits(q, rq)
            same_bits(s, rs)
            qs = q[::-1] if axis != 0 else q           # strided inputs to dequantize too
            ss = s[::-1] if axis != 0 else s
            same_bits(pyattn.dequantize(qs, ss, dtype=dtype, group_size=g, axis=axis),
                      ref.dequantize(qs, ss, dtype, g, axis))


def test_threads_give_the_same_bits():
    x = RNG.standard_normal((40, 33, 128)).astype(np.float32)
    n = pyattn.get_num_threads()
    try:
        pyattn.set_num_threads(1)
        a = pyattn.quantize(x, "int4")
        pyattn.set_num_threads(3)
        b = pyattn.quantize(x, "int4")
    finally:
        pyattn.set_num_threads(n)
    same_bits(a[0], b[0])
    same_bits(a[1], b[1])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300])
def test_non_finite_is_a_value_error(bad):
    x = np.ones((70, 64))
    x[65, 3] = bad
    with pytest.raises(ValueError, match="NaN or infinity"):
        pyattn.quantize(x)


def test_argument_errors():
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="group_size 48 must divide"):
        pyattn.quantize(x, group_size=48)
    with pytest.raises(ValueError, match="dtype"):
        pyattn.quantize(x, "int2")
    with pytest.raises(TypeError, match="floating"):
        pyattn.quantize(np.ones((2, 64), np.int32))
    with pytest.raises(ValueError, match="axis"):
        pyattn.quantize(x, axis=2)
    with pytest.raises(ValueError, match="even"):
        pyattn.quantize(np.ones((2, 3), np.float32), "int4", group_size=1)
    q, s = pyattn.quantize(x)
    with pytest.raises(ValueError, match="dtype='int4' contradicts q"):   # API.md: a contradiction
        pyattn.dequantize(q, s, dtype="int4")
    with pytest.raises(ValueError, match="scale must have shape"):
        pyattn.dequantize(q, s[:1])                      # (s[:, :1] is group_size 64 now: inferred)
    with pytest.raises(ValueError, match="group_size=32 contradicts"):
        pyattn.dequantize(q, s[:, :1], group_size=32)
    with pytest.raises(TypeError, match="scale must be float32"):
        pyattn.dequantize(q, s.astype(np.float64))


def test_out_dtype():
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    q, s = pyattn.quantize(x)
    y = pyattn.dequantize(q, s)
    assert pyattn.dequantize(q, s, out_dtype=np.float64).dtype == np.float64
    same_bits(pyattn.dequantize(q, s, out_dtype=np.float16), y.astype(np.float16))
    assert np.abs(y - x).max() <= np.abs(x).max() / 127 / 2 * 1.0001


# ---- llama.cpp's q8_0 (ggml/src/ggml-quants.c, quantize_row_q8_0_ref), in
# our own words: per block of 32, d = amax / 127 (float32), id = d ? 1 / d : 0,
# the stored scale is d rounded to float16, q = roundf(x * id) (ties away
# from zero); dequantized q * float(fp16(d)).
def q8_0(x):
    b = np.asarray(x, np.float32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    y = (b * idv[:, None]).astype(np.float32)
    q = (np.sign(y) * np.floor(np.abs(y) + np.float32(0.5))).astype(np.int8)  # roundf
    return q.reshape(np.shape(x)), d.astype(np.float16)


def test_llama_cpp_q8_0_where_the_scale_rule_agrees():
    # amax = 127 * 2^k: d = 2^k exactly in float32 and float16, 1/d exact, so
    # x * id == x / d; values away from ties: the same integers and scales
    k = RNG.integers(-10, 10, (64, 1))
    x = (RNG.uniform(-126.9, 126.9, (64, 32)).astype(np.float32) * np.float32(2.0) ** k).astype(np.float32)
    x[:, 0] = 127 * np.float32(2.0) ** k[:, 0]
    frac = np.abs(x / np.float32(2.0) ** k) % 1
    x = np.where(np.abs(frac - 0.5) < 1e-3, x * np.float32(0.999), x).astype(np.float32)
    q, s = pyattn.quantize(x)
    lq, ld = q8_0(x)
    np.testing.assert_array_equal(q, lq)
    np.testing.assert_array_equal(s[:, 0], ld.astype(np.float32))
    same_bits(pyattn.dequantize(q, s), (lq.astype(np.float32) * ld.astype(np.float32)[:, None]))


def test_llama_cpp_q8_0_differences_are_the_documented_ones():
    x = RNG.standard_normal((512, 32)).astype(np.float32)
    q, s = pyattn.quantize(x)
    lq, ld = q8_0(x)
    # the integers: only where x / d and x * (1/d) round apart, or at a tie
    diff = q != lq
    assert diff.mean() < 0.01
    assert (np.abs(q.astype(int) - lq)[diff] == 1).all()
    # the scale: float32 here, float16 in q8_0 (relative error up to 2^-11)
    rel = np.abs(ld.astype(np.float32) - s[:, 0]) / s[:, 0]
    assert rel.max() <= 2.0 ** -11 and (rel > 0).any()


# ---- attention over int8 / int4 caches ---------------------------------------

def qcache(rng, B, H, S, E, dtype, G=32, scale=1.0):
    """(int k cache, its scales, the dequantized float32 cache)"""
    x = (rng.standard_normal((B, H, S, E)) * scale).astype(np.float32)
    q, s = pyattn.quantize(x, dtype, group_size=G)
    return q, s, pyattn.dequantize(q, s, dtype=dtype, group_size=G)


def close(a, b, tol=3e-6):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    err = np.max(np.abs(a - b)) if a.size else 0
    assert err <= tol * (1 + np.max(np.abs(b))), err


OPTIONS = [
    {},
    {"window": (37, 0)},
    {"alibi_slopes": "slopes"},
    {"softcap": 5.0},
    {"sinks": "sinks"},
    {"is_causal": False},
]


@pytest.mark.parametrize("kdt,vdt", [("int8", "int8"), ("int4", "int4"), ("int8", "int4")])
@pytest.mark.parametrize("T", [1, 3, 12])
@pytest.mark.parametrize("opt", range(len(OPTIONS)))
def test_attention_equals_attention_over_the_dequantized_cache(kdt, vdt, T, opt):
    rng = np.random.default_rng(100 * T + opt)
    B, H, Hq, S, E = 2, 2, 8, 300, 64
    kq, ks, kd = qcache(rng, B, H, S, E, kdt)
    vq, vs, vd = qcache(rng, B, H, S, E, vdt, G=16)
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    kw = dict(OPTIONS[opt])
    if kw.get("alibi_slopes") == "slopes":
        kw["alibi_slopes"] = rng.uniform(0.01, 0.2, Hq)
    if kw.get("sinks") == "sinks":
        kw["sinks"] = rng.standard_normal(Hq)
    n = np.array([S - T - 9, 150 - T])
    before = [a.copy() for a in (kq, ks, vq, vs)]
    o = pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=n, k_scale=ks, v_scale=vs, **kw)
    want = pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=n, **kw)
    close(o, want)
    for b, a in zip(before, (kq, ks, vq, vs)):
        same_bits(a, b)                                  # read only


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("G", [8, 32, 128])
def test_long_decode_splits_and_matches_the_float64_reference(dtype, G):
    rng = np.random.default_rng(G)
    B, H, Hq, S, E = 1, 1, 4, 4200, 128                   # S >= 4096: the key chunks and their merge
    kq, ks, kd = qcache(rng, B, H, S, E, dtype, G, scale=2.0)
    vq, vs, vd = qcache(rng, B, H, S, E, dtype, G)
    q = rng.standard_normal((B, Hq, 1, E)).astype(np.float32)
    o, lse = pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=S - 7, k_scale=ks, v_scale=vs,
                                           return_lse=True)
    want = ref.attention_with_kvcache(q, kq, vq, cache_seqlens=S - 7, k_scale=ks, v_scale=vs)[0]
    close(o, want.astype(np.float32), 2e-5)
    w2, l2 = pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=S - 7, return_lse=True)
    close(lse, l2)


def test_layouts_strided_caches_and_scales():
    rng = np.random.default_rng(7)
    B, H, S, E = 2, 3, 200, 64
    big = rng.standard_normal((B, 2 * H, S + 40, E)).astype(np.float32)
    for dtype in ("int8", "int4"):
        qb, sb = pyattn.quantize(big, dtype, group_size=16)
        kq, ks = qb[:, ::2, 20:20 + S], sb[:, ::2, 20:20 + S]           # views: strided batch and heads
        vq, vs = qb[::-1, 1::2, 40:], sb[::-1, 1::2, 40:]
        kd = pyattn.dequantize(kq, ks, dtype=dtype, group_size=16)
        vd = pyattn.dequantize(vq, vs, dtype=dtype, group_size=16)
        for T in (1, 10):
            q = rng.standard_normal((B, 2 * H, T, E)).astype(np.float32)[:, ::2]
            o = pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=S - 3, k_scale=ks, v_scale=vs)
            close(o, pyattn.attention_with_kvcache(q, kd, vd, cache_seqlens=S - 3))


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_appending_equals_quantizing_the_full_sequence(dtype):
    rng = np.random.default_rng(3)
    B, H, Hq, S, E, G = 2, 2, 4, 64, 32, 16
    full_k = rng.standard_normal((B, H, 40, E)).astype(np.float32)
    full_v = rng.standard_normal((B, H, 40, E)).astype(np.float32)
    cache = pyattn.KVCache(B, H, S, E, dtype=dtype, group_size=G)
    t = 0
    for T in (5, 1, 1, 12, 1, 20):
        q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
        k_before, s_before = cache.k.copy(), cache.k_scale.copy()
        o = cache.attend(q, full_k[:, :, t:t + T], full_v[:, :, t:t + T])
        # only the asked rows changed
        same_bits(cache.k[:, :, :t], k_before[:, :, :t])
        same_bits(cache.k[:, :, t + T:], k_before[:, :, t + T:])
        same_bits(cache.k_scale[:, :, t + T:], s_before[:, :, t + T:])
        t += T
        kq, ks = pyattn.quantize(full_k[:, :, :t], dtype, group_size=G)
        vq, vs = pyattn.quantize(full_v[:, :, :t], dtype, group_size=G)
        same_bits(cache.k[:, :, :t], kq)
        same_bits(cache.k_scale[:, :, :t], ks)
        same_bits(cache.v[:, :, :t], vq)
        same_bits(cache.v_scale[:, :, :t], vs)
        kd = pyattn.dequantize(kq, ks, dtype=dtype, group_size=G)
        vd = pyattn.dequantize(vq, vs, dtype=dtype, group_size=G)
        qq = rng.standard_normal((B, Hq, 1, E)).astype(np.float32)
        close(pyattn.attention_with_kvcache(qq, cache.k, cache.v, cache_seqlens=cache.lengths,
                                            k_scale=cache.k_scale, v_scale=cache.v_scale),
              pyattn.attention_with_kvcache(qq, kd, vd, cache_seqlens=t))
        del o
    assert cache.lengths.tolist() == [t, t]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nothing_is_written_on_an_error(bad):
    rng = np.random.default_rng(4)
    cache = pyattn.KVCache(1, 2, 16, 32, dtype="int8")
    q, k, v = rng.standard_normal((3, 1, 2, 2, 32)).astype(np.float32)
    cache.attend(q, k, v)
    saved = [a.copy() for a in (cache.k, cache.v, cache.k_scale, cache.v_scale, cache.lengths)]
    v2 = v.copy()
    v2[0, 1, 1, 5] = bad                                 # the value's last row: the key is fine
    with pytest.raises(ValueError, match="value holds NaN or infinity"):
        cache.attend(q, k, v2)
    for a, b in zip((cache.k, cache.v, cache.k_scale, cache.v_scale, cache.lengths), saved):
        same_bits(a, b)


def test_errors():
    rng = np.random.default_rng(5)
    kq, ks, kd = qcache(rng, 1, 2, 16, 32, "int8")
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    f = pyattn.attention_with_kvcache
    with pytest.raises(ValueError, match="k_scale .* is required"):
        f(q, kq, kq, cache_seqlens=4, v_scale=ks)
    with pytest.raises(ValueError, match="v_scale is given but v_cache is float32"):
        f(q, kq, kd, cache_seqlens=4, k_scale=ks, v_scale=ks)
    with pytest.raises(TypeError, match="k_scale must be a float32"):
        f(q, kq, kq, cache_seqlens=4, k_scale=ks.astype(np.float64), v_scale=ks)
    with pytest.raises(ValueError, match="k_scale"):
        f(q, kq, kq, cache_seqlens=4, k_scale=ks[:, :, :8], v_scale=ks)
    with pytest.raises(ValueError, match="must divide the head dim"):
        f(q, kq, kq, cache_seqlens=4, k_scale=np.ones((1, 2, 16, 3), np.float32), v_scale=ks)
    # precision="bf16": accepted with int8 / int4 caches since issue 37 item 4 (was a
    # refusal; its rule: tests/test_precision_bf16_quant.py)
    assert np.isfinite(f(q, kq, kq, cache_seqlens=4, k_scale=ks, v_scale=ks, precision="bf16")).all()
    # a quantized cache whose rows run backwards: read through one copy (API.md: any
    # strides; was a "must be contiguous along its rows" refusal before Reliability v4)
    np.testing.assert_array_equal(
        f(q, np.ascontiguousarray(kq[..., ::-1])[..., ::-1], kq, cache_seqlens=4, k_scale=ks, v_scale=ks),
        f(q, kq, kq, cache_seqlens=4, k_scale=ks, v_scale=ks))
    big = np.zeros((1, 1, 4, 640), np.int8)
    with pytest.raises(ValueError, match="head dims over 512"):
        f(np.zeros((1, 1, 1, 640), np.float32), big, big, cache_seqlens=2,
          k_scale=np.zeros((1, 1, 4, 20), np.float32), v_scale=np.zeros((1, 1, 4, 20), np.float32))
    with pytest.raises(ValueError, match="group_size 48 must divide"):
        pyattn.KVCache(1, 1, 4, 64, dtype="int4", group_size=48)
    with pytest.raises(TypeError, match="int8"):
        pyattn.KVCache(1, 1, 4, 64, dtype="int2")
    with pytest.raises(TypeError):                       # the backward does not take int8 operands
        pyattn._C.sdpa_backward(q, kq, kq, q, q, np.zeros((1, 2, 1), np.float32))


def _decode_case(rng, dtype):
    kq, ks, _ = qcache(rng, 1, 4, 4500, 128, dtype)
    vq, vs, _ = qcache(rng, 1, 4, 4500, 128, dtype)
    q = rng.standard_normal((1, 16, 1, 128)).astype(np.float32)
    return lambda: pyattn.attention_with_kvcache(q, kq, vq, cache_seqlens=4400, k_scale=ks, v_scale=vs)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_thread_counts_give_the_same_bits(dtype):
    run = _decode_case(np.random.default_rng(11), dtype)
    n = pyattn.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 5):
            pyattn.set_num_threads(t)
            outs.append(run())
    finally:
        pyattn.set_num_threads(n)
    for o in outs[1:]:
        same_bits(o, outs[0])


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_every_simd_family_gives_the_same_bits(dtype):
    from pyattn import _C
    run = _decode_case(np.random.default_rng(12), dtype)
    start = _C.config()["isa"]
    got = {}
    try:
        for word, code, built in _C.families():
            if built and word != "generic" and _C.select_isa(code) == code:
                got[word] = run()
        _C.select_isa(pyattn._ISA_CODES["generic"])
        generic = run()
    finally:
        _C.select_isa(pyattn._ISA_CODES[start])
    if not got:
        pytest.skip("no SIMD family on this CPU")
    first = next(iter(got.values()))
    for o in got.values():
        same_bits(o, first)
    close(generic, first)                                # the generic family's exp differs


def test_layer_new_cache_int8_int4():
    from pyattn.nn import MultiHeadAttention
    rng = np.random.default_rng(6)
    m = MultiHeadAttention(32, 32, 4, rng=0).eval()
    x = rng.standard_normal((2, 12, 32)).astype(np.float32)
    full = m(x)
    for dtype, tol in (("int8", 0.03), ("int4", 0.5)):
        c = m.new_cache(2, 16, dtype=dtype, group_size=8)
        inc = np.concatenate([m(x[:, :5], cache=c)] + [m(x[:, t:t + 1], cache=c) for t in range(5, 12)], axis=1)
        assert inc.dtype == np.float32 and c.lengths.tolist() == [12, 12]
        assert np.max(np.abs(inc - full)) <= tol * np.max(np.abs(full))   # quantization error only


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_appending_matches_the_reference(dtype):
    rng = np.random.default_rng(9)
    kq, ks, _ = qcache(rng, 2, 2, 24, 32, dtype, G=16)
    vq, vs, _ = qcache(rng, 2, 2, 24, 32, dtype, G=8)
    q = rng.standard_normal((2, 4, 3, 32)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 2, 3, 32))
    n = np.array([5, 17])
    want, (wk, wks), (wv, wvs) = ref.attention_with_kvcache(q, kq, vq, k, v, cache_seqlens=n,
                                                           k_scale=ks, v_scale=vs)
    o = pyattn.attention_with_kvcache(q, kq, vq, k, v, cache_seqlens=n, k_scale=ks, v_scale=vs)
    for a, b in ((kq, wk), (ks, wks), (vq, wv), (vs, wvs)):
        same_bits(a, b)
    close(o, want.astype(np.float32))


# ---- dequantize reads its arguments from q and scale (issue 43 item 7) ----

@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_dequantize_infers_dtype_and_group_size(dtype, axis):
    x = RNG.standard_normal((8, 16, 32)).astype(np.float32)
    E = x.shape[axis]
    for g in (1, 2, 4, E // 2, E):
        q, s = pyattn.quantize(x, dtype, group_size=g, axis=axis)
        same_bits(pyattn.dequantize(q, s, axis=axis),
                  pyattn.dequantize(q, s, dtype=dtype, group_size=g, axis=axis))
        same_bits(pyattn.dequantize(q, s, axis=axis), ref.dequantize(q, s, dtype, g, axis))


def test_dequantize_given_values_that_contradict_q_or_the_shapes():
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    q4, s4 = pyattn.quantize(x, "int4", group_size=16)
    with pytest.raises(ValueError, match="dtype='int8' contradicts q"):
        pyattn.dequantize(q4, s4, dtype="int8")
    with pytest.raises(ValueError, match="group_size=32 contradicts.*group size is 16"):
        pyattn.dequantize(q4, s4, group_size=32)
    same_bits(pyattn.dequantize(q4, s4, dtype="int4", group_size=16), pyattn.dequantize(q4, s4))
    with pytest.raises(ValueError, match="scale has 3 groups"):
        pyattn.dequantize(q4, np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match="scale must have q's 2 dimensions"):
        pyattn.dequantize(q4, s4[0])
    with pytest.raises(TypeError, match="q must be np.int8.*int16"):
        pyattn.dequantize(q4.astype(np.int16), s4)
    with pytest.raises(ValueError, match="dtype must be"):
        pyattn.dequantize(q4, s4, dtype="int2")
    q, s = pyattn.quantize(np.ones((2, 0), np.float32), "int4", group_size=8)     # empty axis
    assert pyattn.dequantize(q, s).shape == (2, 0)


# ---- issue 40 bug 6: bfloat16 input is rounded to float32 like float16 ----

def test_quantize_takes_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = (RNG.standard_normal((3, 64)) * 10).astype(ml_dtypes.bfloat16)
    for dtype in ("int8", "int4"):
        q, s = pyattn.quantize(x, dtype)
        rq, rs = pyattn.quantize(x.astype(np.float32), dtype)     # exact: bfloat16 is within float32
        same_bits(q, rq)
        same_bits(s, rs)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    q, s = pyattn.quantize(t)
    same_bits(q, pyattn.quantize(x)[0])


# ---- issue 40 bug 9: dequantize into float64 is the exact product ----

@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_dequantize_float64_is_the_exact_product(dtype):
    x = (RNG.standard_normal((5, 7, 64)) * RNG.uniform(1e-3, 1e3, (5, 7, 1))).astype(np.float32)
    q, s = pyattn.quantize(x, dtype, group_size=16)
    v = ref.unpack_int4(q, -1) if dtype == "int4" else q
    # an int8 (8 bits) times a float32 (24-bit significand) fits float64's 53 bits: exact
    exact = v.astype(np.float64) * np.repeat(s.astype(np.float64), 16, axis=-1)
    for qq, ss, ee in ((q, s, exact), (q[:, ::-2], s[:, ::-2], exact[:, ::-2]),
                       (q.transpose(1, 0, 2), s.transpose(1, 0, 2), exact.transpose(1, 0, 2))):
        y = pyattn.dequantize(qq, ss, out_dtype=np.float64)
        assert y.dtype == np.float64
        same_bits(y, np.ascontiguousarray(ee))
    assert not np.array_equal(pyattn.dequantize(q, s).astype(np.float64), exact)   # float32 rounds
    q, s = np.full((1, 16), 127, np.int8), np.full((1, 1), 3e36, np.float32)     # q * scale past float32
    y = pyattn.dequantize(q, s, out_dtype=np.float64)
    assert np.isfinite(y).all() and np.isinf(pyattn.dequantize(q, s)).all()
    same_bits(y, q.astype(np.float64) * np.float64(s[0, 0]))
