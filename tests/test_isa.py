"""Kernel families switched inside one process: the 12-row kernel bodies
(AVX-512, run through their AVX2-pair build where the CPU lacks AVX-512;
NEON on aarch64) on shapes that cut every tile edge, the real AVX-512
kernels against that build bit for bit where the CPU has AVX-512, every
SIMD family against recorded bits, and the vectorised exp's accuracy."""
import numpy as np
import pytest

import pyattn
import pyattn._C as C
from pyattn import _reference as R
from conftest import DTYPES, check, mag_attention, mag_matmul

GENERIC, AVX2, AVX512, AVX512_EMU, NEON = (pyattn._ISA_CODES[w] for w in
                                           ("generic", "avx2", "avx512", "avx512emu", "neon"))
MACHINE = C.config()["isa_machine"]


@pytest.fixture
def family():
    """Select a family for one test, then restore what PYATTN_ISA asked for."""
    def select(code):
        got = C.select_isa(code)
        return got, C.config()
    yield select
    C.select_isa(pyattn._env_isa_code(warn=False))


needs_avx2 = pytest.mark.skipif(MACHINE not in ("avx2", "avx512"),
                                reason="the AVX-512 emulation needs an x86 CPU with AVX2")
# the 12-row family this machine can run: the AVX-512 bodies (emulated on
# x86, so every x86 CPU with AVX2 tests them) or NEON on aarch64
WIDE = {"avx2": AVX512_EMU, "avx512": AVX512_EMU, "neon": NEON}.get(MACHINE)
needs_wide = pytest.mark.skipif(WIDE is None, reason="no SIMD family on this CPU")


@needs_avx2
def test_emulated_family_is_installed(family):
    got, cfg = family(AVX512_EMU)
    assert got == AVX512_EMU and cfg["isa"] == "avx512emu"
    assert cfg["gemm_f32"] == "pa_gemm_f32_avx512emu" and cfg["gemm_f32_blocking"][:2] == (12, 32)
    assert cfg["gemm_f64"] == "pa_gemm_f64_avx512emu" and cfg["gemm_f64_blocking"][:2] == (12, 16)
    assert cfg["attn_f32"] == "pyattn_attn_f32_flash_96x60"
    assert cfg["tilesm_f32"] == "pa_tilesm_f32_avx512emu"
    assert cfg["tilesm_f64"] == "pa_tilesm_f64_avx512emu"
    # every kernel of the family is its own (the registry's names are the symbols)
    assert all(n.endswith("_avx512emu") for n in cfg["kernels"][:-1])


@pytest.mark.skipif(MACHINE != "neon", reason="the neon family is aarch64's")
def test_neon_family_is_chosen_on_aarch64(family):
    got, cfg = family(-1)
    assert got == NEON and cfg["isa"] == "neon"
    assert cfg["gemm_f32"] == "pa_gemm_f32_neon" and cfg["gemm_f32_blocking"][:2] == (12, 8)
    assert cfg["gemm_f64"] == "pa_gemm_f64_neon" and cfg["gemm_f64_blocking"][:2] == (12, 4)
    assert cfg["tilesm_f32"] == "pa_tilesm_f32_neon"
    assert cfg["softmax_f32"] == "pa_softmax_f32_neon"
    for code in (AVX2, AVX512, AVX512_EMU):              # x86 families: not here
        assert family(code)[0] == NEON
    assert family(GENERIC)[1]["gemm_f32"] == "pa_gemm_f32_ref"


def test_avx512_request_is_capped_by_the_machine(family):
    got, cfg = family(AVX512)
    if MACHINE == "avx512":
        assert cfg["gemm_f32"] == "pa_gemm_f32_avx512" and cfg["gemm_f32_blocking"][:2] == (12, 32)
        assert cfg["tilesm_f32"] == "pa_tilesm_f32_avx512"
    else:
        assert cfg["isa"] == MACHINE and "avx512" not in cfg["gemm_f32"]


# M around MR = 12, N around NR (AVX-512 32 / 16, NEON 8 / 4) and NC, K around KC = 256
@needs_wide
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 11, 12, 13, 97])
@pytest.mark.parametrize("N", [1, 3, 5, 8, 9, 15, 16, 17, 31, 32, 33, 100])
@pytest.mark.parametrize("K", [1, 7, 256, 300])
def test_wide_gemm_edges(family, rng, dtype, M, N, K):
    assert family(WIDE)[0] == WIDE
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    got = pyattn.matmul(a, b)
    check(got, np.matmul(a.astype(np.float64), b.astype(np.float64)), mag_matmul(a, b))
    got_t = pyattn.matmul(b.T, a.T)                       # strided operands
    check(got_t, got.T.astype(np.float64), 2 * mag_matmul(b.T, a.T))


@needs_wide
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L,S", [(9, 700), (95, 61), (96, 96), (97, 130), (200, 59), (300, 300)])
@pytest.mark.parametrize("E", [1, 31, 33, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_wide_attention_edges(family, rng, dtype, L, S, E, causal):
    assert family(WIDE)[0] == WIDE
    q = rng.standard_normal((2, L, E)).astype(dtype)
    k = rng.standard_normal((2, S, E)).astype(dtype)
    v = rng.standard_normal((2, S, E + 3)).astype(dtype)
    got = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
    want, w = R.scaled_dot_product_attention(q, k, v, is_causal=causal, return_weights=True)
    check(got, want, mag_attention(q, k, v, w, 1 / np.sqrt(E)))
    before = pyattn.get_num_threads()
    pyattn.set_num_threads(1)
    try:
        one = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
    finally:
        pyattn.set_num_threads(before)
    assert np.array_equal(one, got)                       # any thread count, same bits


# Every element's arithmetic is fixed by the contract, not by the tile shape:
# each GEMM element sums its KC=256 panels in order, one FMA per term; the
# flash kernel's key tiles are 60 wide in every family, and its tile step works
# column by column with the same exp in every lane. So the AVX2 family and the
# AVX-512 one (6x16 vs 12x32 tiles, 8- vs 16-lane tile step, query blocks of
# 48 vs 96) give the same bits.
@needs_avx2
@pytest.mark.parametrize("dtype", DTYPES)
def test_avx2_and_avx512_families_agree_bit_for_bit(family, rng, dtype):
    cases = []
    for L, S, E in [(150, 170, 40), (97, 300, 64), (5, 9000, 64), (300, 61, 128), (1, 20, 7), (200, 200, 16)]:
        q = rng.standard_normal((2, L, E)).astype(dtype)
        k = rng.standard_normal((2, S, E)).astype(dtype)
        v = rng.standard_normal((2, S, E + 3)).astype(dtype)
        cases.append((q, k, v))
    a = rng.standard_normal((131, 600)).astype(dtype)
    b = rng.standard_normal((600, 77)).astype(dtype)
    x = rng.standard_normal((7, 300)).astype(dtype)
    outs = {}
    for code in (AVX2, AVX512_EMU):
        family(code)
        outs[code] = [pyattn.scaled_dot_product_attention(q, k, v, is_causal=c)
                      for q, k, v in cases for c in (False, True)]
        outs[code] += [pyattn.matmul(a, b), pyattn.softmax(x)]
    for got, want in zip(outs[AVX512_EMU], outs[AVX2]):
        assert np.array_equal(got, want)


@needs_avx2
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_rows_agree_across_families(family, rng, dtype):
    """The softmax row kernel at 16 lanes (two 32-byte pieces per vector:
    avx512, its emulation) gives the avx2 family's bits: every row length
    around the vector and piece sizes, contiguous and strided rows, scales,
    masks and limits, and rows with NaN, +-inf and nothing admissible."""
    xs = []
    for n in list(range(1, 70)) + [127, 128, 129, 255, 1000, 1001]:
        x = (rng.standard_normal((3, n)) * 4).astype(dtype)
        xs.append(x)
    special = (rng.standard_normal((6, 40)) * 3).astype(dtype)
    special[0, 17] = np.nan
    special[1, 5] = np.inf
    special[2, :] = -np.inf
    special[3, 33] = -np.inf
    special[4, 0] = np.nan
    special[4, 39] = np.inf
    special[5, 20:] = np.float32(-0.0)
    xs.append(special)
    wide = (rng.standard_normal((5, 3 * 211)) * 4).astype(dtype)
    mask = rng.random((5, 211)) > 0.3
    outs = {}
    codes = [AVX2, AVX512_EMU] + ([AVX512] if MACHINE == "avx512" else [])
    for code in codes:
        family(code)
        got = []
        for x in xs:
            got.append(pyattn.softmax(x))
            got.append(pyattn.softmax(x, scale=0.37))
            got.append(pyattn.softmax(x, is_causal=True))
        got.append(pyattn.softmax(wide[:, ::3]))                     # strided rows
        got.append(pyattn.softmax(wide[:, :211], attn_mask=mask))
        got.append(pyattn.softmax(wide[:, :211], attn_mask=np.where(mask, 0.5, -np.inf).astype(dtype)))
        out = np.empty((211, 5), dtype).T                          # strided output
        got.append(pyattn.softmax(wide[:, 1::3], out=out))
        outs[code] = got
    for code in codes[1:]:
        for a, b in zip(outs[code], outs[AVX2]):
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.skipif(MACHINE != "avx512", reason="this CPU has no AVX-512: only the emulated build can run")
@pytest.mark.parametrize("dtype", DTYPES)
def test_real_avx512_matches_emulation_bit_for_bit(family, rng, dtype):
    a = rng.standard_normal((131, 300)).astype(dtype)
    b = rng.standard_normal((300, 77)).astype(dtype)
    q = rng.standard_normal((2, 150, 40)).astype(dtype)
    kv = rng.standard_normal((2, 170, 40)).astype(dtype)
    outs = {}
    for code in (AVX512, AVX512_EMU):
        family(code)
        outs[code] = (pyattn.matmul(a, b), pyattn.scaled_dot_product_attention(q, kv, kv, is_causal=True))
    for x, y in zip(outs[AVX512], outs[AVX512_EMU]):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("code", [GENERIC, AVX2])
def test_exp_accuracy_through_softmax(family, dtype, code):
    """softmax([0, x]) = [1, e^x] / (1 + e^x); for x this negative 1 + e^x
    rounds to 1, so the second weight is the kernel's exp(x) itself, and
    the flash kernel's output with v = [0, 1] is too."""
    family(code)
    lo = {np.float32: -87.3, np.float64: -708.3}[dtype]
    cut = {np.float32: -20.0, np.float64: -40.0}[dtype]
    x = np.linspace(lo, cut, 4001).astype(dtype)
    rows = np.stack([np.zeros_like(x), x], axis=1)
    got = pyattn.softmax(rows)[:, 1].astype(np.float64)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(np.exp(x)).astype(np.float64)        # one unit in the dtype
    assert np.all(np.abs(got - want) <= 4 * ulp), np.max(np.abs(got - want) / ulp)
    # below the smallest normal result: exactly 0 (never a garbage subnormal)
    deep = np.array([[0, 2 * lo], [0, -np.inf]], dtype)
    assert np.array_equal(pyattn.softmax(deep)[:, 1], [0, 0])
    # the same exp in the flash kernel's tile step: query x, keys [0, 1],
    # values [0, 1], scale 1 -> scores [0, x], output e^x / (1 + e^x)
    q = x[:, None]
    k = np.array([[0], [1]], dtype)
    out = pyattn.scaled_dot_product_attention(q, k, k, scale=1.0)[:, 0].astype(np.float64)
    assert np.all(np.abs(out - want) <= 4 * ulp), np.max(np.abs(out - want) / ulp)


# the benchmark's probes, in every family this machine can select
@pytest.mark.parametrize("code", [GENERIC, AVX2, AVX512, AVX512_EMU])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_probe_counts_the_kernels_flops(family, code, dtype):
    if code == AVX512_EMU and MACHINE == "generic":
        pytest.skip("the AVX-512 emulation needs AVX2")
    _, cfg = family(code)
    mr, nr = cfg["gemm_f" + dtype[-2:] + "_blocking"][:2]
    for kc in (1, 5, 64, 256):
        assert C.gemm_probe(dtype, kc, 3) == 2 * mr * nr * kc * 3
    assert C.gemm_probe(dtype, 7, 0) == 0


def test_probes_reject_bad_arguments():
    with pytest.raises(ValueError, match="dtype"):
        C.gemm_probe("float16", 64, 1)
    with pytest.raises(ValueError, match="kc"):
        C.gemm_probe("float32", 0, 1)
    with pytest.raises(ValueError, match="kc"):
        C.gemm_probe("float32", 4097, 1)
    with pytest.raises(ValueError, match="iters"):
        C.gemm_probe("float64", 8, -1)
    with pytest.raises(ValueError, match="iters"):
        C.fma_probe(-1)
    with pytest.raises(TypeError):
        C.gemm_probe("float32", 64)


def test_fma_probe_width_follows_the_family(family):
    # 12 chains x 2 flops per round at the family's float32 width; the
    # generic family has no SIMD probe
    lanes = {"generic": None, "avx2": 8, "avx512emu": 8, "avx512": 16, "neon": 4}
    for code in (GENERIC, AVX2, AVX512, AVX512_EMU, NEON):
        got, cfg = family(code)
        flops = C.fma_probe(10)
        want = lanes[cfg["isa"]]
        assert flops == (None if want is None else 10 * 12 * want * 2)


# The recorded bits (tests/family_cases.py, data/simd_hashes.json, made by the
# avx2 family): every SIMD family on every machine must give them, because
# the kernel contract fixes each element's arithmetic. This ties the real
# AVX-512 and NEON kernels, which only some machines can run, to the AVX2 ones.
@pytest.mark.parametrize("name", [w for w, _, _ in C.families() if w != "generic"])   # csrc/registry.h
def test_simd_family_gives_the_recorded_bits(family, name):
    import json
    import family_cases
    got, cfg = family(pyattn._ISA_CODES[name])
    if cfg["isa"] != name:
        pytest.skip(f"the {name} family cannot run on this CPU ({MACHINE})")
    with open(family_cases.HASHES) as f:
        want = json.load(f)
    have = family_cases.compute()
    assert sorted(have) == sorted(want)
    bad = [k for k in want if have[k] != want[k]]
    assert not bad, f"{len(bad)} of {len(want)} results changed bits: {bad[:8]}"


def test_read_probe_sums_what_it_reads(family):
    # small integers: every partial sum is exact in float32, so the probe's sum
    # is exact whatever its order -- and wrong if it skipped any element
    x = (np.arange(3 << 20) % 7).astype(np.float32)          # 3 chunks of 4 MB
    before = pyattn.get_num_threads()
    try:
        for code in (GENERIC, AVX2, AVX512, AVX512_EMU, NEON):
            family(code)
            for thr in (1, 2):
                pyattn.set_num_threads(thr)
                for n in (0, 1, 63, 64, 65, 1000, (1 << 20) + 5, x.size):
                    assert C.read_probe(x[:n]) == float(x[:n].astype(np.float64).sum())
    finally:
        pyattn.set_num_threads(before)
    with pytest.raises(ValueError, match="buf"):
        C.read_probe(x[::2])
    with pytest.raises(ValueError, match="buf"):
        C.read_probe(x.astype(np.float64))


def test_config_names_caches_and_blocking(family):
    for code in (GENERIC, AVX2, AVX512, AVX512_EMU, NEON):
        _, cfg = family(code)
        for key in ("l1d_bytes", "l2_bytes", "l3_bytes"):
            assert isinstance(cfg[key], int) and cfg[key] >= 0
        for dt in ("f32", "f64"):
            mr, nr, kc, mc, nc = cfg[f"gemm_{dt}_blocking"]
            assert cfg[f"gemm_{dt}"] == f"pa_gemm_{dt}_" + ("ref" if cfg["isa"] == "generic" else cfg["isa"])
            assert cfg[f"gemm_{dt}"] in cfg["kernels"]
            assert kc == 256                       # the contract's K panel, every family
            assert mc % mr == 0 and nc % nr == 0
            bq, bk = cfg[f"attn_{dt}_tile"]
            assert bk == 60 and bq % mr == 0 and bq % nr == 0
            assert cfg[f"attn_{dt}"].endswith(f"_{bq}x{bk}")


def test_registry_lists_every_kernel_of_every_family(family):
    # csrc/registry.h: the families and kernel kinds are listed once; every
    # family's table holds one kernel per kind and index, named by its symbol
    rows = C.families()
    assert [code for _, code, _ in rows] == list(range(len(rows)))
    assert pyattn._ISA_CODES == {word: code for word, code, _ in rows}
    assert {w for w, _, built in rows if built} >= {"generic"}
    lists = {}
    for word, code, built in rows:
        got, cfg = family(code)
        if not built or cfg["isa"] != word:
            continue
        sym = "ref" if word == "generic" else word
        # (the avx512 tables for CPUs with AVX512_VNNI: q8rowdot's variant pa_q8rowdot_avx512vnni)
        names = [n[:-len("vnni")] if n.endswith("_" + sym + "vnni") else n for n in cfg["kernels"]]
        assert len(set(names)) == len(names)
        assert all(n.startswith("pa_") and n.endswith("_" + sym) for n in names[:-1]), names
        assert names[-1].startswith("pa_gemm_bf16_")            # the family's bfloat16 products
        lists[word] = [n[:-len(sym)] for n in names[:-1]]
    assert len(lists) >= 2, lists.keys()
    first = next(iter(lists.values()))
    assert all(v == first for v in lists.values())               # the same kinds, in list order
