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
    with pytest.raises(TypeError, match="q must be uint8"):
        pyattn.dequantize(q, s, dtype="int4")
    with pytest.raises(ValueError, match="scale must have shape"):
        pyattn.dequantize(q, s[:, :1])
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
