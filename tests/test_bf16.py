"""precision="bf16" (API.md "Reduced-precision compute"): bfloat16 products
with float32 accumulation -- matmul so far. Against the reference's rounding
model, and the exact emulation against AVX512_BF16's vdpbf16ps bit for bit
where the CPU has it."""
import numpy as np
import pytest

import pyattn
from pyattn import _C, _reference as R
from conftest import check, mag_matmul

ISA = pyattn._ISA_CODES      # PYATTN_ISA's words -> codes (csrc/registry.h)
# the emulation of vdpbf16ps each family runs where the CPU lacks AVX512_BF16
EMULATION = {"generic": "pa_gemm_bf16_ref", "avx2": "pa_gemm_bf16_avx2", "avx512emu": "pa_gemm_bf16_avx2",
             "avx512": "pa_gemm_bf16_avx512"}


def native_bf16():
    return "avx512bf16" in _C.config()["gemm_bf16"]


@pytest.fixture
def family():
    """Restores the kernel family a test switches."""
    cfg = _C.config()["isa"]
    yield
    _C.select_isa(ISA.get(cfg, -1))


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


def test_matmul_bf16_float32_packing_is_the_16bit_one(rng):
    """float32 operands are rounded to bfloat16 as they are packed (a
    branch-free loop for whole panels, the element loop at the edges): the
    same words as bfloat16 operands rounded beforehand by pa_bf16_round's
    rule -- ties, NaN payloads (the quiet bit set), odd K, transposed views,
    whole and partial panels."""
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (bfloat16 arrays) is not installed")

    def rounded(x):
        u = x.view(np.uint32).astype(np.uint64)
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        r = np.where(nan, u | 0x400000, u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return r.astype(np.uint16).view(ml.bfloat16)

    for M, K, N in ((13, 7, 37), (30, 515, 70)):
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        a.view(np.uint32)[:, ::3] = (a.view(np.uint32)[:, ::3] & 0xFFFF0000) | 0x8000    # ties
        a.view(np.uint32)[2, 1] = 0x7F800001            # a signalling NaN: its payload, quieted
        b.view(np.uint32)[K - 1, 5] = 0xFFC12345        # a quiet NaN with low payload bits
        for x, y in ((a, b), (a[::-1], np.asfortranarray(b)), (np.asfortranarray(a), b[:, ::-1])):
            with np.errstate(all="ignore"):
                got = pyattn.matmul(x, y, precision="bf16")
                want = pyattn.matmul(rounded(np.ascontiguousarray(x)), rounded(np.ascontiguousarray(y)),
                                     precision="bf16")
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (M, K, N)


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
            assert _C.config()["gemm_bf16"] == EMULATION[isa]
            with np.errstate(all="ignore"):
                emu = pyattn.matmul(a, b, precision="bf16")
            assert bits(native) == bits(emu), isa
        _C.select_isa(ISA["avx512"])


_AVX512_EMU_CHILD = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import pyattn
from pyattn import _C
assert _C.config()["gemm_bf16"] == "pa_gemm_bf16_avx512", _C.config()["gemm_bf16"]
d = np.load(sys.argv[2])
with np.errstate(all="ignore"):
    outs = [pyattn.matmul(d["a"], d["b"], precision="bf16"), pyattn.matmul(d["e"], d["f"], precision="bf16"),
            pyattn.scaled_dot_product_attention(d["q"], d["k"], d["v"], is_causal=True, precision="bf16")]
np.savez(sys.argv[3], *outs)
"""


def test_avx512_emulation_is_the_instruction(rng, tmp_path):
    """The avx512 family's emulation (PYATTN_TEST_CPU=nobf16 makes this CPU
    take it) against vdpbf16ps, in a child process: normal and edge operands,
    matmul and attention."""
    import os
    import subprocess
    import sys
    if not native_bf16():
        pytest.skip("this CPU has no AVX512_BF16 (vdpbf16ps): nothing to compare the emulation to")
    a, b = rng.standard_normal((97, 700)).astype(np.float32), rng.standard_normal((700, 70)).astype(np.float32)
    e, f = edge_operands(rng, 40, 300, 37)
    q = rng.standard_normal((1, 2, 150, 64)).astype(np.float32)
    k = rng.standard_normal((1, 2, 170, 64)).astype(np.float32)
    v = rng.standard_normal((1, 2, 170, 40)).astype(np.float32)
    with np.errstate(all="ignore"):
        want = [pyattn.matmul(a, b, precision="bf16"), pyattn.matmul(e, f, precision="bf16"),
                pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, precision="bf16")]
    np.savez(tmp_path / "in.npz", a=a, b=b, e=e, f=f, q=q, k=k, v=v)
    root = os.path.dirname(os.path.dirname(pyattn.__file__))
    env = dict(os.environ, PYATTN_TEST_CPU="nobf16", PYATTN_ISA="avx512")
    r = subprocess.run([sys.executable, "-c", _AVX512_EMU_CHILD, root, str(tmp_path / "in.npz"),
                        str(tmp_path / "out.npz")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out.npz")
    for i, w in enumerate(want):
        assert bits(got[f"arr_{i}"]) == bits(w), i


def test_every_family_gives_the_same_bits(rng, family):
    a, b = edge_operands(rng, 40, 300, 37)
    want = None
    for isa in ("generic", "avx2", "avx512", "avx512emu", "neon"):
        got_isa = _C.select_isa(ISA[isa])
        if got_isa != ISA[isa]:
            continue
        with np.errstate(all="ignore"):
            r = pyattn.matmul(a, b, precision="bf16")
        if want is None:
            want = r
        assert bits(r) == bits(want), isa


# -- attention ---------------------------------------------------------------------

def bf16_attention_mag(q, k, v, scale, kw):
    """Error scale of precision="bf16" attention against the reference's
    rounding model (float64 on the rounded inputs), built from what the
    kernel rounds in float32: each score sums E exact products (and goes
    through scale, softcap, ALiBi, exp: a few ulps of |s|), which moves its
    weight by that much relative; the output sums S weighted values. Plus,
    for every weight whose unrounded value exp(s - M) lies within that
    float32 error of a bfloat16 rounding boundary -- it may round either way
    -- one bfloat16 step of it (2^-7 relative, covering a binade edge) times
    |v|. No other room: a kernel that does not round the weights fails."""
    from conftest import TOL
    eps = 2.0 ** -24
    qr, kr, vr = R.round_bf16(q), R.round_bf16(k), R.round_bf16(v)
    rk = {n: kw[n] for n in ("attn_mask", "is_causal", "window", "alibi_slopes", "softcap") if n in kw}
    rk.setdefault("is_causal", False)
    s = R._scores(qr, kr, rk.get("attn_mask"), rk["is_causal"], scale, rk.get("window"),
                  rk.get("alibi_slopes"), rk.get("softcap"), None, None)
    E, S = q.shape[-1], s.shape[-1]
    tmax = np.stack([np.max(s[..., t:t + 60], axis=-1) for t in range(0, S, 60)], axis=-1)
    M = np.repeat(np.maximum.accumulate(tmax, axis=-1), 60, axis=-1)[..., :S]
    fin = np.isfinite(s)
    sa = np.where(fin, np.abs(s), 0.0)
    Ma = np.where(np.isfinite(M), np.abs(M), 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(fin, np.exp(s - np.where(np.isfinite(M), M, 0.0)), 0.0)
    qk = np.matmul(np.abs(qr), np.swapaxes(np.abs(kr), -1, -2)) * abs(scale)
    ds = eps * ((E + 8) * qk + 16 * (sa + Ma) + 16)           # a score's float32 error, absolute
    r = R.round_bf16(e)
    ulp = np.where(r > 0, 2.0 ** (np.floor(np.log2(np.where(r > 0, r, 1.0))) - 7), 0.0)
    dist = np.abs(np.abs(e - r) - ulp / 2)
    amb = (e > 0) & (dist < ds * e)
    w = np.abs(R.scaled_dot_product_attention(qr, kr, vr, scale=scale, return_weights=True,
                                              **{n: x for n, x in kw.items() if n != "rng"})[1])
    av = np.abs(vr)
    wv = np.matmul(w, av)
    err = np.matmul(w * (ds + np.max(ds, axis=-1, keepdims=True)), av) + wv * (S + 8) * eps
    err = err + np.matmul(np.where(amb, w * 2.0 ** -7, 0.0), av)
    return err / TOL[np.dtype(np.float32)] + np.finfo(np.float64).tiny


ATT_CASES = {
    "plain": {}, "causal": {"is_causal": True}, "bottom_right": {"is_causal": "bottom_right"},
    "softcap": {"softcap": 3.0}, "sinks": {"sinks": np.array([0.3, -1.0, 2.0])},
    "window": {"window": (50, 10)}, "alibi": {"alibi_slopes": np.array([0.1, 0.2, 0.3])},
    "bool": "bool", "float": "float",
}


@pytest.mark.parametrize("case", list(ATT_CASES))
@pytest.mark.parametrize("L, S, E, Ev", [(1, 1, 2, 2), (130, 200, 64, 48), (37, 61, 17, 9), (100, 300, 128, 128)])
def test_attention_bf16_matches_the_rounding_model(rng, case, L, S, E, Ev):
    q = rng.standard_normal((2, 3, L, E)).astype(np.float32)
    k = rng.standard_normal((2, 3, S, E)).astype(np.float32)
    v = rng.standard_normal((2, 3, S, Ev)).astype(np.float32)
    kw = ATT_CASES[case]
    if kw == "bool":
        kw = {"attn_mask": rng.random((L, S)) > 0.3}
    elif kw == "float":
        kw = {"attn_mask": rng.standard_normal((3, L, S)).astype(np.float32)}
    got, lse = pyattn.scaled_dot_product_attention(q, k, v, precision="bf16", return_lse=True, **kw)
    want, wlse = R.scaled_dot_product_attention(q, k, v, precision="bf16", return_lse=True, **kw)
    assert got.dtype == np.float32
    check(got, want, bf16_attention_mag(q, k, v, 1 / np.sqrt(E), kw))
    if L > 1 and S > 8:            # the rounding is there: float32 attention differs
        assert not np.allclose(got, pyattn.scaled_dot_product_attention(q, k, v, **kw), rtol=1e-5, atol=1e-6)


def test_attention_bf16_dropout_gqa_kvcache_threads(rng):
    from pyattn._checks import dropout_key
    q = rng.standard_normal((2, 4, 70, 32)).astype(np.float32)
    k = rng.standard_normal((2, 2, 90, 32)).astype(np.float32)
    v = rng.standard_normal((2, 2, 90, 16)).astype(np.float32)
    got = pyattn.scaled_dot_product_attention(q, k, v, dropout_p=0.25, rng=3, enable_gqa=True,
                                              is_causal=True, precision="bf16")
    want = R.scaled_dot_product_attention(q, k, v, dropout_p=0.25, dropout_key=dropout_key(3), enable_gqa=True,
                                          is_causal=True, precision="bf16")
    kr, vr = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    mag = bf16_attention_mag(q, kr, vr, 32 ** -0.5, {"is_causal": True}) / 0.75
    check(got, want, mag)
    n0 = pyattn.get_num_threads()
    try:
        res = []
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            res.append(pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True,
                                                           precision="bf16"))
    finally:
        pyattn.set_num_threads(n0)
    assert all(np.array_equal(res[0], r) for r in res[1:])
    # a KV cache (decode steps, 16-bit storage): the same as the full call on the filled rows
    kc = np.zeros((2, 2, 128, 32), np.float16)
    vc = np.zeros((2, 2, 128, 16), np.float16)
    kc[:, :, :90], vc[:, :, :90] = k, v
    out = pyattn.attention_with_kvcache(q[:, :, -1:], kc, vc, cache_seqlens=90, precision="bf16")
    full = pyattn.scaled_dot_product_attention(q[:, :, -1:], kc[:, :, :90], vc[:, :, :90], enable_gqa=True,
                                               is_causal="bottom_right", precision="bf16")
    assert np.array_equal(out, full)
    with pytest.raises(ValueError, match="precision"):
        pyattn.attention_with_kvcache(q[:, :, -1:], kc, vc, cache_seqlens=90, precision="fp8")


def test_attention_bf16_errors_and_16bit_inputs(rng):
    q = rng.standard_normal((2, 10, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="return_weights"):
        pyattn.scaled_dot_product_attention(q, q, q, return_weights=True, precision="bf16")
    with pytest.raises(ValueError, match="float64"):
        pyattn.scaled_dot_product_attention(q.astype(np.float64), q, q, precision="bf16")
    with pytest.raises(ValueError, match="precision"):
        pyattn.scaled_dot_product_attention(q, q, q, precision="tf32")
    h = q.astype(np.float16)
    assert np.array_equal(pyattn.scaled_dot_product_attention(h, h, h, precision="bf16"),
                          pyattn.scaled_dot_product_attention(h.astype(np.float32), h.astype(np.float32),
                                                              h.astype(np.float32), precision="bf16"))


def test_attention_bf16_emulation_is_the_instruction(rng, family):
    if not native_bf16():
        pytest.skip("this CPU has no AVX512_BF16 (vdpbf16ps): the emulation runs, with nothing to compare it to")
    q = rng.standard_normal((2, 3, 150, 64)).astype(np.float32)
    k = rng.standard_normal((2, 3, 170, 64)).astype(np.float32)
    v = rng.standard_normal((2, 3, 170, 40)).astype(np.float32)
    kw = dict(is_causal=True, window=(100, 0), softcap=4.0, precision="bf16")
    native = pyattn.scaled_dot_product_attention(q, k, v, **kw)
    for isa in ("avx2", "avx512emu"):
        _C.select_isa(ISA[isa])
        assert _C.config()["gemm_bf16"] == EMULATION[isa]
        assert bits(pyattn.scaled_dot_product_attention(q, k, v, **kw)) == bits(native), isa


@pytest.mark.parametrize("causal", [False, True])
def test_attention_bf16_vs_torch_bfloat16(rng, causal):
    """PyTorch's SDPA on bfloat16 tensors rounds in other places (its output to
    bfloat16, possibly the scaled query, the weights per its own tiles): the
    two agree within a few bfloat16 steps of the sizes involved -- stated
    bound: |ours - torch| <= 4 * 2^-8 * (|w| @ |v| + |out|)."""
    torch = pytest.importorskip("torch")
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (bfloat16 arrays) is not installed")
    q, k, v = (rng.standard_normal((2, 4, 150, 64)).astype(np.float32).astype(ml.bfloat16) for _ in range(3))
    ours = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, precision="bf16")
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v))
    theirs = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).float().numpy()
    w = R.scaled_dot_product_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                                       is_causal=causal, return_weights=True)[1]
    bound = 4 * 2.0 ** -8 * (np.matmul(np.abs(w), np.abs(v.astype(np.float64))) + np.abs(theirs))
    assert (np.abs(ours - theirs) <= bound).all()
    # they do differ at the bfloat16 level (the comparison is not vacuous)
    assert not (np.abs(ours - theirs) <= bound / 64).all()


@pytest.mark.parametrize("layout", ["transposed", "negative", "fortran", "strided"])
def test_attention_bf16_any_layout(rng, layout):
    from conftest import make
    q = make(rng, (2, 3, 70, 32), np.float32, layout)
    k = make(rng, (2, 3, 90, 32), np.float32, layout)
    v = make(rng, (2, 3, 90, 24), np.float32, layout)
    got = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, precision="bf16")
    want = R.scaled_dot_product_attention(q, k, v, is_causal=True, precision="bf16")
    check(got, want, bf16_attention_mag(q, k, v, 32 ** -0.5, {"is_causal": True}))
    same = pyattn.scaled_dot_product_attention(np.ascontiguousarray(q), np.ascontiguousarray(k),
                                               np.ascontiguousarray(v), is_causal=True, precision="bf16")
    assert np.array_equal(got, same)


def test_attention_bf16_bfloat16_inputs_every_family(rng, family):
    """bfloat16-stored q, k, v (read as they are, a NaN quieted) give the bits
    of their float32 values, on every family, and every SIMD family the same
    bits (the vector P packers included; the portable family's exp differs):
    odd E and S, a NaN and infinities among the keys' and values' elements."""
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (bfloat16 arrays) is not installed")
    q = rng.standard_normal((2, 3, 75, 33)).astype(np.float32)
    k = rng.standard_normal((2, 3, 131, 33)).astype(np.float32)
    v = rng.standard_normal((2, 3, 131, 19)).astype(np.float32)
    k[1, 2, 7, 4], v[0, 1, 100, 3], v[1, 0, 130, 18], k[0, 0, 3, 32] = np.nan, np.inf, -np.inf, np.nan
    qb, kb, vb = (x.astype(ml.bfloat16) for x in (q, k, v))
    kb.view(np.uint16)[1, 1, 9, 5] = 0x7f81            # a signalling NaN's bits
    vb.view(np.uint16)[0, 2, 50, 0] = 0xff81
    wide = [x.astype(np.float32) for x in (qb, kb, vb)]
    want = {}
    for isa in ("generic", "avx2", "avx512", "avx512emu", "neon"):
        if _C.select_isa(ISA[isa]) != ISA[isa]:
            continue
        for causal in (False, True):
            with np.errstate(all="ignore"):
                got = pyattn.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, precision="bf16")
                same = pyattn.scaled_dot_product_attention(*wide, is_causal=causal, precision="bf16")
            assert bits(got) == bits(same), (isa, causal)
            if isa != "generic":
                assert bits(got) == bits(want.setdefault(causal, got)), (isa, causal)
            assert np.isnan(got).any() and not np.isnan(got).all()


# -- decode shapes: the rows path on bfloat16 values (issue 37) ---------------------

@pytest.mark.parametrize("L, G, S", [(1, 1, 300), (1, 4, 4500), (4, 2, 4500), (3, 8, 2100)])
@pytest.mark.parametrize("case", ["sinks", "window"])
def test_attention_bf16_decode_rows(rng, family, L, G, S, case):
    """precision="bf16" on decode shapes (L <= 8 query rows, or GQA's query heads
    stacked as up to 32 rows) runs the rows path on bfloat16 values, its scores split
    into key chunks for S >= 4096: the rounding model (each weight rounded against
    the running max of the 60-key tiles so far -- the scores rise along the keys, so
    the max moves from chunk to chunk), bit-identical for any thread count, the bits
    of the unsplit call (a varlen call does not split), the same bits on every SIMD
    family, bfloat16 storage = its float32 values, NaN in a value row of weight 0
    kept out."""
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (bfloat16 arrays) is not installed")
    Hkv, E, Ev = 2, 64, 40
    H = Hkv * G
    q = rng.standard_normal((1, H, L, E)).astype(np.float32)
    k = rng.standard_normal((1, Hkv, S, E)).astype(np.float32)
    v = rng.standard_normal((1, Hkv, S, Ev)).astype(np.float32)
    q[..., 0] = 3.0
    k[..., 0] += np.linspace(0.0, 4.0, S, dtype=np.float32)          # the max moves right
    kw = ({"sinks": np.linspace(-1.0, 2.0, H)} if case == "sinks"
          else {"is_causal": "bottom_right", "window": (S - 100, 0)})
    call = dict(kw, enable_gqa=G > 1, precision="bf16")
    got, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **call)
    want = R.scaled_dot_product_attention(q, k, v, enable_gqa=G > 1, precision="bf16", **kw)
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    check(got, want, bf16_attention_mag(q, kr, vr, E ** -0.5, {n: x for n, x in kw.items() if n != "sinks"}))
    assert not np.array_equal(got, pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=G > 1, **kw))
    n0 = pyattn.get_num_threads()
    try:
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            assert bits(pyattn.scaled_dot_product_attention(q, k, v, **call)) == bits(got), nt
    finally:
        pyattn.set_num_threads(n0)
    if case == "sinks":                                # varlen: one sequence, never split
        vo = pyattn.scaled_dot_product_attention_varlen(
            q[0].transpose(1, 0, 2).copy(), k[0].transpose(1, 0, 2).copy(), v[0].transpose(1, 0, 2).copy(),
            np.array([0, L]), np.array([0, S]), **call)
        assert bits(vo.transpose(1, 0, 2)[None]) == bits(got)
    qb, kb, vb = (x.astype(ml.bfloat16) for x in (q, k, v))
    wide = [x.astype(np.float32) for x in (qb, kb, vb)]
    first = None
    own = _C.config()["isa"]                               # the family this run checks (got's)
    for isa in ("avx2", "avx512", "avx512emu", "neon"):
        if _C.select_isa(ISA[isa]) != ISA[isa]:
            continue
        r = pyattn.scaled_dot_product_attention(qb, kb, vb, **call)
        assert bits(r) == bits(pyattn.scaled_dot_product_attention(*wide, **call)), isa
        assert bits(r) == bits(first if first is not None else r), isa
        first = r if first is None else first
    _C.select_isa(ISA.get(own, -1))                        # back to it: generic's bits are its own
    if case == "window":                               # a NaN value row outside every window
        vn = v.copy()
        vn[0, :, 50] = np.nan
        assert bits(pyattn.scaled_dot_product_attention(q, k, vn, **call)) == bits(got)


@pytest.mark.parametrize("S", [500, 5000])
def test_attention_bf16_decode_kvcache_bfloat16(rng, S):
    """attention_with_kvcache with bfloat16 caches and precision="bf16" on decode
    steps: the dense call on the filled rows, bit for bit, and a paged pool of the
    same rows (blocks shuffled) the same bits again."""
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (bfloat16 arrays) is not installed")
    B, Hq, Hkv, E, Smax, bs = 2, 8, 2, 32, S + 100, 64
    q = rng.standard_normal((B, Hq, 2, E)).astype(np.float32)
    kc = rng.standard_normal((B, Hkv, Smax, E)).astype(ml.bfloat16)
    vc = rng.standard_normal((B, Hkv, Smax, E)).astype(ml.bfloat16)
    out = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S, precision="bf16")
    full = pyattn.scaled_dot_product_attention(q, kc[:, :, :S], vc[:, :, :S], enable_gqa=True,
                                               is_causal="bottom_right", precision="bf16")
    assert bits(out) == bits(full)
    want = R.scaled_dot_product_attention(q, kc[:, :, :S].astype(np.float32), vc[:, :, :S].astype(np.float32),
                                          enable_gqa=True, is_causal="bottom_right", precision="bf16")
    kr, vr = (np.repeat(x[:, :, :S].astype(np.float32), 4, axis=1) for x in (kc, vc))
    check(out, want, bf16_attention_mag(q, kr, vr, E ** -0.5, {"is_causal": "bottom_right"}))
    nb = -(-Smax // bs)
    perm = rng.permutation(B * nb)
    table = perm.reshape(B, nb)
    kp = np.zeros((B * nb, Hkv, bs, E), ml.bfloat16)
    vp = np.zeros((B * nb, Hkv, bs, E), ml.bfloat16)
    for b in range(B):
        for i in range(nb):
            n = min(bs, Smax - i * bs)
            kp[table[b, i], :, :n] = kc[b, :, i * bs:i * bs + n]
            vp[table[b, i], :, :n] = vc[b, :, i * bs:i * bs + n]
    paged = pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=S, block_table=table, precision="bf16")
    assert bits(paged) == bits(out)


@pytest.mark.parametrize("L, G, S", [(1, 2, 4500), (3, 1, 700)])
def test_attention_bf16_decode_rows_dropout(rng, L, G, S):
    """Dropout on the bfloat16 rows path: weights dropped before their rounding, as
    the model has it; bit-identical for any thread count."""
    from pyattn._checks import dropout_key
    q = rng.standard_normal((2, 2 * G, L, 32)).astype(np.float32)
    k = rng.standard_normal((2, 2, S, 32)).astype(np.float32)
    v = rng.standard_normal((2, 2, S, 16)).astype(np.float32)
    kw = dict(dropout_p=0.25, enable_gqa=G > 1, precision="bf16")
    got = pyattn.scaled_dot_product_attention(q, k, v, rng=3, **kw)
    want = R.scaled_dot_product_attention(q, k, v, dropout_key=dropout_key(3), **kw)
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    check(got, want, bf16_attention_mag(q, kr, vr, 32 ** -0.5, {}) / 0.75)
    n0 = pyattn.get_num_threads()
    try:
        pyattn.set_num_threads(1)
        one = pyattn.scaled_dot_product_attention(q, k, v, rng=3, **kw)
        pyattn.set_num_threads(2)
        two = pyattn.scaled_dot_product_attention(q, k, v, rng=3, **kw)
    finally:
        pyattn.set_num_threads(n0)
    assert bits(one) == bits(got) and bits(two) == bits(got)
