"""precision="bf16" (API.md "Reduced-precision compute"): bfloat16 products
with float32 accumulation -- matmul so far. Against the reference's rounding
model, and the exact emulation against AVX512_BF16's vdpbf16ps bit for bit
where the CPU has it."""
import numpy as np
import pytest

import pyattn
from pyattn import _C, _reference as R
from conftest import check, mag_matmul

ISA = {"generic": 0, "avx2": 1, "avx512": 2, "avx512emu": 3}


def native_bf16():
    return "avx512bf16" in _C.config()["gemm_bf16"]


@pytest.fixture
def family():
    """Restores the kernel family a test switches."""
    cfg = _C.config()["isa"]
    yield
    _C.select_isa({"neon": 4}.get(cfg, ISA.get(cfg, -1)))


@pytest.mark.parametrize("M, K, N", [(1, 1, 1), (7, 5, 3), (33, 2, 17), (130, 257, 70), (64, 600, 45),
                                     (3, 1030, 5)])
def test_matmul_bf16_matches_the_rounding_model(rng, M, K, N):
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    got = pyattn.matmul(a, b, precision="bf16")
    want = R.matmul(a, b, precision="bf16")
    assert got.dtype == np.float32
    check(got, want, mag_matmul(R.round_bf16(a), R.round_bf16(b)))
    # the rounding matters: the float32 product differs from it (the test can fail)
    if K > 4:
        assert not np.array_equal(got, pyattn.matmul(a, b))


def test_matmul_bf16_batches_strides_out_and_16bit_inputs(rng):
    a = rng.standard_normal((3, 40, 70)).astype(np.float32)
    b = rng.standard_normal((70, 50)).astype(np.float32)
    got = pyattn.matmul(a, b, precision="bf16")
    for i in range(3):
        assert np.array_equal(got[i], pyattn.matmul(a[i], b, precision="bf16"))
    out = np.empty((3, 40, 50), np.float32)
    pyattn.matmul(a, b, out=out, precision="bf16")
    assert np.array_equal(out, got)
    bt = b.T.copy().T                                  # column-major
    t = pyattn.matmul(a[0][::-1], bt[:, ::-1], precision="bf16")
    check(t, R.matmul(a[0][::-1], b[:, ::-1], precision="bf16"),
          mag_matmul(np.abs(R.round_bf16(a[0])), np.abs(R.round_bf16(b))))
    h = a.astype(np.float16)
    assert np.array_equal(pyattn.matmul(h, b, precision="bf16"),
                          pyattn.matmul(h.astype(np.float32), b, precision="bf16"))
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (bfloat16 arrays) is not installed")
    ab = a.astype(ml.bfloat16)
    assert np.array_equal(pyattn.matmul(ab, b, precision="bf16"),
                          pyattn.matmul(ab.astype(np.float32), b, precision="bf16"))


def test_matmul_bf16_bit_identical_across_threads(rng):
    a = rng.standard_normal((300, 700)).astype(np.float32)
    b = rng.standard_normal((700, 260)).astype(np.float32)
    n0 = pyattn.get_num_threads()
    try:
        res = []
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            res.append(pyattn.matmul(a, b, precision="bf16"))
    finally:
        pyattn.set_num_threads(n0)
    assert all(np.array_equal(res[0], r) for r in res[1:])


def test_precision_errors():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="precision"):
        pyattn.matmul(a, a.T, precision="fp8")
    with pytest.raises(ValueError, match="precision"):
        pyattn.matmul(a, a.T, precision=16)
    with pytest.raises(ValueError, match="float64"):
        pyattn.matmul(a.astype(np.float64), a.T, precision="bf16")
    assert np.array_equal(pyattn.matmul(a, a.T, precision="highest"), pyattn.matmul(a, a.T))


def bits(x):
    """The bits of x, every NaN made one NaN: a NaN's sign and payload carry
    no meaning (the instruction's invalid-operation NaN is +qNaN, x86's FMA
    gives -qNaN)."""
    return np.where(np.isnan(x), np.float32(np.nan), x).tobytes()


def edge_operands(rng, M, K, N):
    """Values that exercise the instruction's corners: bfloat16 subnormals
    (read as 0), products below the normal range (flushed), huge products
    (overflow to inf), exact cancellations, signed zeros, inf and NaN."""
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    scale_a = np.float32(2.0) ** rng.integers(-140, 128, size=(M, K)).astype(np.float32)
    scale_b = np.float32(2.0) ** rng.integers(-140, 128, size=(K, N)).astype(np.float32)
    with np.errstate(over="ignore"):
        a = np.where(rng.random((M, K)) < 0.3, a * scale_a, a).astype(np.float32)
        b = np.where(rng.random((K, N)) < 0.3, b * scale_b, b).astype(np.float32)
    a[0, :3] = [0.0, -0.0, 1e-39][:min(3, K)]
    b[:2, 0] = [np.inf, -1e-40][:min(2, K)]
    a[M - 1, K - 1] = np.nan
    return a, b


@pytest.mark.parametrize("M, K, N", [(13, 7, 33), (50, 513, 40), (1, 1030, 1), (97, 64, 65)])
def test_emulation_is_the_instruction_bit_for_bit(rng, family, M, K, N):
    if not native_bf16():
        pytest.skip("this CPU has no AVX512_BF16 (vdpbf16ps): the emulation runs, with nothing to compare it to")
    for a, b in ((rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)),
                 edge_operands(rng, M, K, N)):
        with np.errstate(all="ignore"):
            native = pyattn.matmul(a, b, precision="bf16")
        for isa in ("avx2", "generic", "avx512emu"):
            _C.select_isa(ISA[isa])
            assert "emul" in _C.config()["gemm_bf16"]
            with np.errstate(all="ignore"):
                emu = pyattn.matmul(a, b, precision="bf16")
            assert bits(native) == bits(emu), isa
        _C.select_isa(ISA["avx512"])


def test_every_family_gives_the_same_bits(rng, family):
    a, b = edge_operands(rng, 40, 300, 37)
    want = None
    for isa in ("generic", "avx2", "avx512", "avx512emu"):
        got_isa = _C.select_isa(ISA[isa])
        if got_isa != ISA[isa]:
            continue
        with np.errstate(all="ignore"):
            r = pyattn.matmul(a, b, precision="bf16")
        if want is None:
            want = r
        assert bits(r) == bits(want), isa
