"""The shared vector exp (csrc/kernels/vec/exp_vec.inc) of every SIMD family
this CPU runs, against exp correctly rounded: float32 over its whole range
(bit patterns swept evenly, the flush edge and the small arguments densely)
against np.exp in float64 rounded to float32; float64 against np.exp in
long double rounded to float64. The rule (csrc/README.md, numerics): within
1 ULP for x >= the lowest x with a nonzero result (-87.683 / -708.743, just
above -(bias + 1/2) ln 2; subnormal results counted in their own ULP),
exactly +0 below it and for -inf (masked keys), NaN for NaN, 1 for -0, +0
and subnormal x; the arguments the kernels pass are <= 0, and a little
above 0 in the backward (s - lse), so the positive side is checked up to
88.37 (float32: 2^127 times p(r)). The exp runs through the kernel checks'
test-only extension (tests/kcheck.py: `_kcheck.vexp`)."""
import numpy as np
import pytest

import kcheck
import pyattn
from pyattn import _C

SIMD = [w for w, _, _ in _C.families() if w != "generic"]
LOWEST = {np.float32: np.float32(-87.6831131), np.float64: -708.74299212254402}
HI = {np.float32: 88.37, np.float64: 709.4}


def vexp(word, x):
    x = np.ascontiguousarray(x)
    pad = (-x.size) % 16
    ran, out = kcheck.module_or_skip().vexp(pyattn._ISA_CODES[word], np.concatenate([x, np.zeros(pad, x.dtype)]))
    if ran != word:
        pytest.skip(f"this CPU cannot run the {word} family (it would run {ran})")
    return np.frombuffer(out, x.dtype)[: x.size]


def ulps(a, b):
    """|a - b| in units in the last place, by bit patterns (both >= 0)"""
    it = np.int32 if a.dtype == np.float32 else np.int64
    return np.abs(a.view(it).astype(np.int64) - b.view(it).astype(np.int64))


def args_f32():
    neg = np.arange(0x80000000, 0xFF800001, 1021, dtype=np.uint64).astype(np.uint32).view(np.float32)
    pos = np.arange(0, np.float32(HI[np.float32]).view(np.uint32), 1021, dtype=np.uint32).view(np.float32)
    lo = LOWEST[np.float32].view(np.uint32)
    edge = np.arange(lo - 20000, lo + 20000, dtype=np.uint32).view(np.float32)          # the flush edge
    small = -np.arange(0, 0x3F000000, 509, dtype=np.uint32).view(np.float32)            # |x| < 0.5
    ln2 = (np.arange(-260, 256) * np.log(2) / 2).astype(np.float32)                  # the rounding of n
    ln2 = np.concatenate([ln2, np.nextafter(ln2, np.float32(np.inf)), np.nextafter(ln2, np.float32(-np.inf))])
    return np.concatenate([neg, pos, edge, small, ln2])


@pytest.mark.parametrize("word", SIMD)
def test_float32_whole_range_within_one_ulp(word):
    x = args_f32()
    x = x[~np.isnan(x) & (x <= HI[np.float32])]
    got = vexp(word, x)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    live = x >= LOWEST[np.float32]
    assert np.all(got[~live].view(np.uint32) == 0), x[~live][got[~live] != 0][:5]
    d = ulps(got[live], want[live])
    assert d.max() <= 1, (x[live][np.argmax(d)], d.max())
    assert live.sum() > 2_000_000 and (~live).sum() > 1_000_000


@pytest.mark.parametrize("word", SIMD)
def test_float64_within_one_ulp(word):
    rng = np.random.default_rng(5)
    lo = np.float64(LOWEST[np.float64])
    x = np.concatenate([rng.uniform(lo, 0, 200_000), -rng.exponential(1.0, 50_000), rng.uniform(0, HI[np.float64], 20_000),
                        lo + np.arange(-200, 200) * np.spacing(lo)])
    got = vexp(word, x)
    want = np.exp(x.astype(np.longdouble)).astype(np.float64)
    live = x >= lo
    assert np.all(got[~live].view(np.uint64) == 0)
    d = ulps(got[live], want[live])
    assert d.max() <= 1, (x[live][np.argmax(d)], d.max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("word", SIMD)
def test_specials(word, dtype):
    fi = np.finfo(dtype)
    x = np.array([np.nan, -np.nan, -np.inf, -0.0, 0.0, -fi.smallest_subnormal, fi.smallest_subnormal, -fi.tiny,
                  -fi.max, LOWEST[dtype], np.nextafter(dtype(LOWEST[dtype]), dtype(-np.inf)),
                  np.log(fi.tiny), np.log(fi.smallest_subnormal)], dtype)
    got = vexp(word, x)
    assert np.isnan(got[:2]).all()
    assert got[2:4].tolist() == [0.0, 1.0]
    assert np.signbit(got[2:]).sum() == 0                        # never a -0
    assert got[3:8].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]
    assert got[8] == 0 and got[10] == 0                          # -max, and just below the lowest
    assert 0 < got[9] < fi.tiny                                  # the lowest: a subnormal
    assert got[11] > 0 and ulps(got[11:12], np.exp(x[11:12].astype(np.longdouble)).astype(dtype))[0] <= 1
    assert got[12] == 0


def test_generic_has_no_vector_exp():
    kc = kcheck.module_or_skip()
    with pytest.raises(ValueError, match="no vector exp"):
        kc.vexp(pyattn._ISA_CODES["generic"], np.zeros(16, np.float32))
    with pytest.raises(ValueError, match="multiple of 16"):
        kc.vexp(-1, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="float32 or float64"):
        kc.vexp(-1, np.zeros(16, np.int32))


@pytest.mark.parametrize("word", SIMD)
def test_masked_keys_and_nan_rows_through_softmax(word):
    """-inf scores (masked keys) weigh exactly 0, a NaN score makes its row NaN,
    a row whose scores span the flush edge keeps its tiny weights."""
    old = _C.config()["isa"]
    if _C.select_isa(pyattn._ISA_CODES[word]) != pyattn._ISA_CODES[word]:
        _C.select_isa(pyattn._ISA_CODES.get(old, -1))
        pytest.skip(f"this CPU cannot run the {word} family")
    try:
        x = np.array([[0.0, -np.inf, -87.0, -87.7, -200.0] + [-np.inf] * 11,
                      [0.0, np.nan, -1.0, -2.0] + [-np.inf] * 12], np.float32)
        w = pyattn.softmax(x)
        assert w[0, 1] == 0 and w[0, 4] == 0 and np.all(w[0, 5:] == 0) and w[0, 3] == 0
        assert w[0, 2] > 0
        assert np.isnan(w[1]).all()
    finally:
        _C.select_isa(pyattn._ISA_CODES.get(old, -1))
