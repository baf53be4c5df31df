"""precision="bf16" with int8 / int4 caches (API.md "Decode precision and FP8
caches"; issue 37 item 4): int8 / int4 values are exact in bfloat16, so the
query is rounded to bfloat16 and the key products bf16(q_e) * k_e are exact
in float32; they are summed per group in float32 (qrowdot's 16 partial sums,
element e into sum e % 16, each partial times the key's group scale by one
fma, over the groups in order, then the 16 sums pairwise: csrc/README.md,
qrowdot), then times the softmax scale; the softmax and the value products
as at the default precision.

Checked against a NumPy model of that rule (the scores bit for bit through
the lse of one-key calls; outputs to float32 tolerance), the same bits on
every kernel family and thread count, contiguous = paged = KVCache =
PagedKVCache (planned too) = the nn layers, bit for bit.

fp8 caches (the last section): fp8_e4m3 / fp8_e5m2 codes are exact in
bfloat16 too, so the same rule runs on the codes' exact values, unscaled (the
products fused: exact but where they leave float32's normal range); the
values as at the default precision (the dequantized tile)."""
import numpy as np
import pytest

import pyattn
from pyattn import _C
from conftest import TOL
from test_precision_int8 import FAMILIES, ISA, family, fma32, key_ints, out_mag, qcache  # noqa: F401

ml_dtypes = pytest.importorskip("ml_dtypes")


def bf16(x):
    """float32 x rounded to bfloat16 (to nearest even), as float32."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def model_scores(q, kc, ks, scale):
    """Scores (T, S) of query rows q (T, E) against one head's cache rows kc
    and scales ks (S, ng) by the rule (float32)."""
    q = bf16(q)
    ki = key_ints(kc, ks).astype(np.float32)                   # (S, E), exact
    T, E = q.shape
    S, ng = ks.shape
    G = E // ng
    p = np.zeros((16, T, S), np.float32)
    for g in range(ng):
        gp = np.zeros((16, T, S), np.float32)
        for e in range(g * G, (g + 1) * G):
            prod = q[:, e, None] * ki[None, :, e]                # exact in float32
            gp[e % 16] = (gp[e % 16] + prod).astype(np.float32)
        for t in range(16):
            p[t] = fma32(gp[t], ks[None, :, g], p[t])
    for w in (8, 4, 2, 1):
        for t in range(w):
            p[t] = p[t] + p[t + w]
    return p[0] * np.float32(scale)


def model_attention(q, kc, ks, vc, vs, n, scale):
    """Outputs (B, Hq, T, Ev) of causal calls on contiguous quantized caches:
    the scores by the rule, then softmax and P V in float64."""
    B, Hq, T, E = q.shape
    Hkv = kc.shape[1]
    vf = pyattn.dequantize(vc, vs, out_dtype=np.float64)
    out = np.zeros((B, Hq, T, vf.shape[-1]))
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            L = int(n[b])
            s = model_scores(q[b, h], kc[b, hk, :L], ks[b, hk, :L], scale).astype(np.float64)
            pos = L - T + np.arange(T)
            s = np.where(np.arange(L)[None, :] <= pos[:, None], s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            out[b, h] = (w / w.sum(-1, keepdims=True)) @ vf[b, hk, :L]
    return out


# ---- the rule -------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("E, G", [(64, 32), (128, 32), (128, 64), (40, 8), (64, 16), (96, 96), (12, 2)])
def test_scores_are_the_rule_bit_for_bit(rng, dtype, E, G):
    """One filled key per call: lse is that key's score, exactly."""
    Hkv, T = 3, 5
    kc, ks, vc, vs = qcache(rng, 1, Hkv, 1, E, dtype, G)
    q = (rng.standard_normal((1, 2 * Hkv, T, E)) * rng.uniform(0.1, 5, (1, 2 * Hkv, T, 1))).astype(np.float32)
    scale = 0.37
    _, lse = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=1, k_scale=ks, v_scale=vs, is_causal=False,
                                           scale=scale, return_lse=True, precision="bf16")
    for h in range(2 * Hkv):
        want = model_scores(q[0, h], kc[0, h // 2], ks[0, h // 2], scale)[:, 0]
        assert np.array_equal(lse[0, h], want), (h, lse[0, h], want)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("T", [1, 3, 40])
def test_outputs_match_the_model(rng, dtype, T):
    """Decode (T = 1, GQA rows stacked) and longer query blocks (the rows
    path takes every L here)."""
    B, Hkv, Hq, S, E = 2, 2, 4, 150, 64
    kc, ks, vc, vs = qcache(rng, B, Hkv, S, E, dtype, 32)
    n = np.array([S, max(97, T)])
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    got = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs, precision="bf16")
    want = model_attention(q, kc, ks, vc, vs, n, 1 / np.sqrt(E))
    err = np.abs(got - want).max()
    assert err <= TOL[np.dtype(np.float32)] * out_mag(vc, vs, S), err
    base = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs)
    assert not np.array_equal(got, base)                 # the rounding of q is there


def test_bfloat16_queries_are_read_as_they_are(rng):
    """A bfloat16 query is already rounded: the same bits as the float32 one
    rounded to bfloat16, and as the unrounded float32 one."""
    kc, ks, vc, vs = qcache(rng, 1, 2, 64, 32, "int8", 16)
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    kw = dict(cache_seqlens=50, k_scale=ks, v_scale=vs, precision="bf16", window=(20, 0), softcap=3.0)
    a = pyattn.attention_with_kvcache(q, kc, vc, **kw)
    b = pyattn.attention_with_kvcache(q.astype(ml_dtypes.bfloat16), kc, vc, **kw)
    c = pyattn.attention_with_kvcache(bf16(q), kc, vc, **kw)
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_a_float_v_cache_beside_an_int8_k_cache(rng):
    """Only the key side changes: an int8 k_cache with a float32 v_cache."""
    kc, ks, _, _ = qcache(rng, 1, 2, 40, 32, "int8", 16)
    v = rng.standard_normal((1, 2, 40, 32)).astype(np.float32)
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    got = pyattn.attention_with_kvcache(q, kc, v, cache_seqlens=40, k_scale=ks, precision="bf16")
    mag = float(np.abs(v).max()) * (8.0 + np.log1p(40) + np.sqrt(41.0))
    for h in range(4):
        s = model_scores(q[0, h], kc[0, h // 2], ks[0, h // 2], 1 / np.sqrt(32)).astype(np.float64)
        w = np.exp(s - s.max())
        want = (w / w.sum()) @ v[0, h // 2].astype(np.float64)
        assert np.abs(got[0, h] - want).max() <= TOL[np.dtype(np.float32)] * mag


def test_a_nan_query_row_gives_nan(rng):
    kc, ks, vc, vs = qcache(rng, 1, 1, 20, 32, "int8", 32)
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    q[0, 1, 0, 3] = np.nan
    o = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=20, k_scale=ks, v_scale=vs, precision="bf16")
    assert np.isfinite(o[0, 0]).all() and np.isnan(o[0, 1]).all()


# ---- same bits: families, threads, layouts -----------------------------------
def cases(rng):
    """(name, call) pairs: contiguous and paged, int8 and int4, SIMD group
    sizes and portable ones, decode, the split of long caches, forks."""
    out = []
    for dtype, G, E, S in (("int8", 32, 128, 300), ("int4", 32, 64, 200), ("int8", 8, 40, 130),
                           ("int4", 16, 128, 4700), ("int8", 32, 128, 9000)):
        kc, ks, vc, vs = qcache(rng, 2, 2, S, E, dtype, G)
        q = rng.standard_normal((2, 8, 1, E)).astype(np.float32)
        n = np.array([S, S - 37])
        out.append((f"{dtype}-G{G}-E{E}-S{S}", lambda q=q, kc=kc, vc=vc, ks=ks, vs=vs, n=n:
                    pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs,
                                                  precision="bf16", return_lse=True)))
    kc, ks, vc, vs = qcache(rng, 1, 2, 100, 64, "int8", 32)
    qs = rng.standard_normal((1, 4, 2, 64)).astype(np.float32) * 4
    out.append(("softcap-window", lambda: pyattn.attention_with_kvcache(
        qs, kc, vc, cache_seqlens=100, k_scale=ks, v_scale=vs, precision="bf16", softcap=2.0, window=(50, 0))))
    q3 = rng.standard_normal((1, 4, 20, 64)).astype(np.float32)
    out.append(("int8-T20", lambda: pyattn.attention_with_kvcache(q3, kc, vc, cache_seqlens=90, k_scale=ks,
                                                                  v_scale=vs, precision="bf16")))
    paged = pyattn.PagedKVCache(num_blocks=40, block_size=16, num_kv_heads=2, head_dim=64, dtype="int4",
                                group_size=32)
    seqs = [paged.add_sequence() for _ in range(2)]
    k, v = rng.standard_normal((2, 2, 2, 150, 64)).astype(np.float32)
    paged.attend(seqs, rng.standard_normal((2, 4, 150, 64)).astype(np.float32), k, v)
    qp = rng.standard_normal((2, 4, 1, 64)).astype(np.float32)
    bt = np.array([paged._seqs[s][0] for s in seqs])
    lens = np.array([paged.length(s) for s in seqs])
    out.append(("paged-int4", lambda: pyattn.attention_with_kvcache(
        qp, paged.k, paged.v, cache_seqlens=lens, block_table=bt, k_scale=paged.k_scale, v_scale=paged.v_scale,
        precision="bf16")))
    # forks of a long prompt: the split's shared (cascade) reads of their common blocks
    shared = pyattn.PagedKVCache(num_blocks=80, block_size=64, num_kv_heads=2, head_dim=64, dtype="int8",
                                 group_size=32)
    root = shared.add_sequence()
    kr, vr = rng.standard_normal((2, 1, 2, 4200, 64)).astype(np.float32)
    shared.attend([root], rng.standard_normal((1, 2, 4200, 64)).astype(np.float32), kr, vr)
    forks = [root] + [shared.fork(root) for _ in range(3)]
    qf = rng.standard_normal((4, 4, 1, 64)).astype(np.float32)
    tf = np.array([shared._seqs[s][0][:66] for s in forks])
    out.append(("paged-forks", lambda: pyattn.attention_with_kvcache(
        qf, shared.k, shared.v, cache_seqlens=np.full(4, 4200), block_table=tf, k_scale=shared.k_scale,
        v_scale=shared.v_scale, precision="bf16", softcap=30.0)))
    return out


def _same(cs, a, b, what):
    for (name, _), x, y in zip(cs, a, b):
        for u, w in zip(x if isinstance(x, tuple) else (x,), y if isinstance(y, tuple) else (y,)):
            assert np.array_equal(u, w, equal_nan=True), f"{name}: {what}"


@pytest.mark.parametrize("kind", ["int", "fp8"])
def test_same_bits_on_every_family(rng, family, kind):
    cs = cases(rng) if kind == "int" else fp8_cases(rng)
    ref = None
    ran = []
    for fam in FAMILIES:
        _C.select_isa(ISA[fam])
        if _C.config()["isa"] != fam:
            continue
        ran.append(fam)
        res = [c() for _, c in cs]
        if ref is None:
            ref = (fam, res)
            continue
        _same(cs, ref[1], res, f"{fam} differs from {ref[0]}")
    assert "generic" in ran and len(ran) >= 2 or len(FAMILIES) == 1, ran


@pytest.mark.parametrize("kind", ["int", "fp8"])
def test_same_bits_for_any_thread_count(rng, kind):
    cs = cases(rng) if kind == "int" else fp8_cases(rng)
    n0 = pyattn.get_num_threads()
    try:
        runs = []
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            runs.append([c() for _, c in cs])
    finally:
        pyattn.set_num_threads(n0)
    for r in runs[1:]:
        _same(cs, runs[0], r, "threads")


def _forks_read_once(rng, dtype):
    """Forks of a 4200-row sequence reading their common blocks once (one
    call) = each fork's own call, precision="bf16"."""
    shared = pyattn.PagedKVCache(num_blocks=80, block_size=64, num_kv_heads=2, head_dim=64, dtype=dtype,
                                 group_size=32)
    root = shared.add_sequence()
    kr, vr = rng.standard_normal((2, 1, 2, 4200, 64)).astype(np.float32)
    shared.attend([root], rng.standard_normal((1, 2, 4200, 64)).astype(np.float32), kr, vr)
    forks = [root] + [shared.fork(root) for _ in range(2)]
    qf = rng.standard_normal((3, 4, 1, 64)).astype(np.float32)
    kw = dict(k_scale=shared.k_scale, v_scale=shared.v_scale, precision="bf16")
    tf = np.array([shared._seqs[s][0][:66] for s in forks])
    all3 = pyattn.attention_with_kvcache(qf, shared.k, shared.v, cache_seqlens=np.full(3, 4200), block_table=tf, **kw)
    for i in range(3):
        one = pyattn.attention_with_kvcache(qf[i:i + 1], shared.k, shared.v, cache_seqlens=[4200],
                                            block_table=tf[i:i + 1], **kw)
        assert np.array_equal(all3[i:i + 1], one)


def test_the_split_and_the_forks_are_the_unsplit_unshared_call(rng):
    """A long cache (the split's chunks, merged) against the model; forks
    reading their common blocks once = each fork's own call."""
    kc, ks, vc, vs = qcache(rng, 1, 2, 5000, 64, "int8", 32)
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    got = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=5000, k_scale=ks, v_scale=vs, precision="bf16")
    want = model_attention(q, kc, ks, vc, vs, [5000], 1 / 8)
    assert np.abs(got - want).max() <= TOL[np.dtype(np.float32)] * out_mag(vc, vs, 5000)
    _forks_read_once(rng, "int4")


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_caches_and_the_paged_pool_agree(rng, dtype):
    """KVCache.attend, PagedKVCache.attend (with and without a plan) and
    attention_with_kvcache with precision="bf16": the same bits, prompt and
    decode steps; the model."""
    def model(q, flat):
        want = model_attention(q, flat.k, flat.k_scale, flat.v, flat.v_scale, flat.lengths, 1 / np.sqrt(64))
        return want, TOL[np.dtype(np.float32)] * out_mag(flat.v, flat.v_scale, 64)
    _caches_agree(rng, dtype, 16, model)


def _caches_agree(rng, dtype, bs, model):
    """KVCache.attend = PagedKVCache.attend (blocks of bs rows, with and
    without a plan) = attention_with_kvcache, precision="bf16", bit for bit,
    prompt and decode steps; model(q, flat) -> (the model's output, its
    bound)."""
    H, Hq, E = 2, 4, 64
    flat = pyattn.KVCache(1, H, 64, E, dtype=dtype, group_size=32)
    nb = 64 // bs + 2
    paged = pyattn.PagedKVCache(num_blocks=nb, block_size=bs, num_kv_heads=H, head_dim=E, dtype=dtype,
                                group_size=32)
    twin = pyattn.PagedKVCache(num_blocks=nb, block_size=bs, num_kv_heads=H, head_dim=E, dtype=dtype,
                               group_size=32)
    s, s2 = paged.add_sequence(), twin.add_sequence()
    for T in (20, 1, 1, 7):
        q = rng.standard_normal((1, Hq, T, E)).astype(np.float32)
        k, v = rng.standard_normal((2, 1, H, T, E)).astype(np.float32)
        a = flat.attend(q, k, v, precision="bf16")
        b = paged.attend([s], q, k, v, precision="bf16")
        assert np.array_equal(a, b)
        p = twin.plan([s2], new_tokens=T)
        assert np.array_equal(a, twin.attend([s2], q, k, v, plan=p, precision="bf16"))
        c = pyattn.attention_with_kvcache(q, flat.k, flat.v, cache_seqlens=flat.lengths, k_scale=flat.k_scale,
                                          v_scale=flat.v_scale, precision="bf16")
        assert np.array_equal(a, c)
        want, bound = model(q, flat)
        assert np.abs(a - want).max() <= bound


def test_a_float_k_cache_beside_an_int8_v_cache_is_refused(rng):
    """precision="bf16" reads int8 / int4 keys; float keys with int8 values
    are refused (a clear ValueError), as before."""
    _, _, vc, vs = qcache(rng, 1, 2, 16, 32, "int8", 16)
    k = rng.standard_normal((1, 2, 16, 32)).astype(np.float32)
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    try:
        pyattn.attention_with_kvcache(q, k, vc, cache_seqlens=4, v_scale=vs)
    except ValueError:
        pytest.skip("float keys with int8 values are refused at every precision")
    with pytest.raises(ValueError, match="bf16"):
        pyattn.attention_with_kvcache(q, k, vc, cache_seqlens=4, v_scale=vs, precision="bf16")


# ---- fp8 caches (fp8_e4m3 / fp8_e5m2) ------------------------------------------
# Their codes are exact in bfloat16 as int8 / int4 values are: the same rule,
# each product bf16(q_e) * x_e with x_e the code's exact (unscaled) value, the
# key's group scale after each group's sum; P V as at the default precision
# (the float32 kernels over the dequantized value tile).
FMTS = ["fp8_e4m3", "fp8_e5m2"]


def key_codes(kc, ks):
    """A quantized cache's stored values, unscaled, as float32 (exact)."""
    return pyattn.dequantize(kc, np.ones_like(ks), out_dtype=np.float32)


def fp8_scores(q, kc, ks, scale):
    """model_scores on any quantized cache: the codes' exact values as keys."""
    q = bf16(q)
    kf = key_codes(kc, ks)
    T, E = q.shape
    S, ng = ks.shape
    G = E // ng
    p = np.zeros((16, T, S), np.float32)
    for g in range(ng):
        gp = np.zeros((16, T, S), np.float32)
        for e in range(g * G, (g + 1) * G):                     # fma (exact products: + q k)
            gp[e % 16] = fma32(q[:, e, None], kf[None, :, e], gp[e % 16])
        for t in range(16):
            p[t] = fma32(gp[t], ks[None, :, g], p[t])
    for w in (8, 4, 2, 1):
        for t in range(w):
            p[t] = p[t] + p[t + w]
    return p[0] * np.float32(scale)


def fp8_attention(q, kc, ks, vf, n, scale, causal=True):
    """Outputs (B, Hq, T, Ev) in float64: scores by the rule, softmax and
    P V over the float64 values vf (B, Hkv, S, Ev)."""
    B, Hq, T, E = q.shape
    Hkv = kc.shape[1]
    out = np.zeros((B, Hq, T, vf.shape[-1]))
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            L = int(n[b])
            s = fp8_scores(q[b, h], kc[b, hk, :L], ks[b, hk, :L], scale).astype(np.float64)
            if causal:
                pos = L - T + np.arange(T)
                s = np.where(np.arange(L)[None, :] <= pos[:, None], s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            out[b, h] = (w / w.sum(-1, keepdims=True)) @ vf[b, hk, :L]
    return out


def fcache(rng, B, H, S, E, fmt, G=32, scale=1.0):
    x = (rng.standard_normal((B, H, S, E)) * scale).astype(np.float32)
    return pyattn.quantize(x, fmt, group_size=G)


def vmag(vf, S):
    return float(np.abs(vf).max()) * (8.0 + np.log1p(S) + np.sqrt(S + 1.0))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("E, G", [(64, 32), (128, 32), (128, 64), (40, 8), (64, 16), (96, 96), (12, 2)])
def test_fp8_scores_are_the_rule_bit_for_bit(rng, fmt, E, G):
    """One filled key per call: lse is that key's score, exactly (queries of
    many magnitudes, tiny and huge ones included: the fma rule throughout)."""
    Hkv, T = 3, 5
    kc, ks = fcache(rng, 1, Hkv, 1, E, fmt, G)
    q = (rng.standard_normal((1, 2 * Hkv, T, E)) * rng.uniform(0.1, 5, (1, 2 * Hkv, T, 1))).astype(np.float32)
    q[0, 0, 0, :G] = 0
    q[0, 1, 1, :] *= np.float32(1e-37)                    # subnormal products
    q[0, 2, 2, :] *= np.float32(2.0 ** 101)              # past qbf16_dot's fast path
    scale = 0.37
    _, lse = pyattn.attention_with_kvcache(q, kc, kc, cache_seqlens=1, k_scale=ks, v_scale=ks, is_causal=False,
                                           scale=scale, return_lse=True, precision="bf16")
    for h in range(2 * Hkv):
        want = fp8_scores(q[0, h], kc[0, h // 2], ks[0, h // 2], scale)[:, 0]
        assert np.array_equal(lse[0, h], want), (h, lse[0, h], want)


@pytest.mark.parametrize("kf, vf", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"), ("fp8_e4m3", "int8"),
                                    ("int8", "fp8_e5m2"), ("int4", "fp8_e4m3"), ("fp8_e5m2", "float32")])
@pytest.mark.parametrize("T", [1, 3, 40])
def test_fp8_outputs_match_the_model(rng, kf, vf, T):
    """Decode (GQA rows stacked) and longer query blocks, fp8 keys or values
    beside int8 / int4 / float32 ones; the default precision differs."""
    B, Hkv, Hq, S, E = 2, 2, 4, 150, 64
    kc, ks = fcache(rng, B, Hkv, S, E, kf)
    if vf == "float32":
        vc = rng.standard_normal((B, Hkv, S, E)).astype(np.float32)
        vs, vd = None, vc.astype(np.float64)
    else:
        vc, vs = fcache(rng, B, Hkv, S, E, vf, 16)
        vd = pyattn.dequantize(vc, vs, out_dtype=np.float64)
    n = np.array([S, max(97, T)])
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    kw = dict(cache_seqlens=n, k_scale=ks, v_scale=vs)
    got = pyattn.attention_with_kvcache(q, kc, vc, precision="bf16", **kw)
    want = fp8_attention(q, kc, ks, vd, n, 1 / np.sqrt(E))
    err = np.abs(got - want).max()
    assert err <= TOL[np.dtype(np.float32)] * vmag(vd, S), err
    assert not np.array_equal(got, pyattn.attention_with_kvcache(q, kc, vc, **kw))
    if kf in ("int8", "int4") and vf != "float32":        # int8 / int4 keys: the scores of the int8 rule,
        _, l1 = pyattn.attention_with_kvcache(q, kc, vc, precision="bf16", return_lse=True, **kw)
        vq, vqs = pyattn.quantize(vd.astype(np.float32), "int8", group_size=16)
        _, l2 = pyattn.attention_with_kvcache(q, kc, vq, cache_seqlens=n, k_scale=ks, v_scale=vqs,
                                              precision="bf16", return_lse=True)
        assert np.array_equal(l1, l2)                     # whatever the values' dtype


def test_fp8_options_and_bfloat16_queries(rng):
    """softcap, window, ALiBi, sinks over the rule's scores; a bfloat16 query
    is read as it is (the float32 one's bits)."""
    kc, ks = fcache(rng, 1, 2, 64, 32, "fp8_e4m3", 16)
    vc, vs = fcache(rng, 1, 2, 64, 32, "fp8_e5m2", 16)
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    kw = dict(cache_seqlens=50, k_scale=ks, v_scale=vs, precision="bf16", window=(20, 0), softcap=3.0)
    a = pyattn.attention_with_kvcache(q, kc, vc, **kw)
    assert np.array_equal(a, pyattn.attention_with_kvcache(q.astype(ml_dtypes.bfloat16), kc, vc, **kw))
    assert np.array_equal(a, pyattn.attention_with_kvcache(bf16(q), kc, vc, **kw))
    vd = pyattn.dequantize(vc, vs, out_dtype=np.float64)
    for h in range(4):
        s = fp8_scores(q[0, h], kc[0, h // 2, :50], ks[0, h // 2, :50], 1 / np.sqrt(32))[0].astype(np.float64)
        s = 3.0 * np.tanh(s / 3.0)
        s[:29] = -np.inf                                  # the window: keys 29 ... 49
        w = np.exp(s - s.max())
        want = (w / w.sum()) @ vd[0, h // 2, :50]
        assert np.abs(a[0, h, 0] - want).max() <= 1e-4 * vmag(vd, 50)


def test_fp8_nan_codes_and_nan_queries(rng):
    """A NaN query row gives NaN (the other rows are finite); a NaN key code
    (e4m3's 0x7f) is a NaN score, as at the default precision."""
    kc, ks = fcache(rng, 1, 1, 20, 32, "fp8_e4m3", 32)
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    q[0, 1, 0, 3] = np.nan
    o = pyattn.attention_with_kvcache(q, kc, kc, cache_seqlens=20, k_scale=ks, v_scale=ks, precision="bf16")
    assert np.isfinite(o[0, 0]).all() and np.isnan(o[0, 1]).all()
    kn = kc.copy()
    kn.view(np.uint8)[0, 0, 5, 7] = 0x7F
    q[0, 1, 0, 3] = 1
    o = pyattn.attention_with_kvcache(q, kn, kc, cache_seqlens=20, k_scale=ks, v_scale=ks, precision="bf16")
    d = pyattn.attention_with_kvcache(q, kn, kc, cache_seqlens=20, k_scale=ks, v_scale=ks)
    assert np.array_equal(np.isnan(o), np.isnan(d)) and np.isnan(o).all()


def fp8_cases(rng):
    """(name, call) pairs over fp8 caches: contiguous and paged (block sizes
    7, 16, 64), SIMD and portable group sizes, decode and longer blocks, the
    split of long caches, forks' shared reads."""
    out = []
    for fmt, vfmt, G, E, S in (("fp8_e4m3", "fp8_e4m3", 32, 128, 300), ("fp8_e5m2", "int8", 16, 64, 200),
                               ("fp8_e4m3", "fp8_e5m2", 8, 40, 130), ("int4", "fp8_e4m3", 32, 64, 700),
                               ("fp8_e5m2", "fp8_e5m2", 32, 128, 9000)):
        kc, ks = fcache(rng, 2, 2, S, E, fmt, G)
        vc, vs = fcache(rng, 2, 2, S, E, vfmt, G)
        n = np.array([S, S - 37])
        for T in (1, 5):
            q = rng.standard_normal((2, 8, T, E)).astype(np.float32)
            out.append((f"{fmt}-{vfmt}-G{G}-E{E}-S{S}-T{T}", lambda q=q, kc=kc, vc=vc, ks=ks, vs=vs, n=n:
                        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs,
                                                      precision="bf16", return_lse=True, softcap=20.0)))
    for bs in (7, 16, 64):
        paged = pyattn.PagedKVCache(num_blocks=400 // bs + 4, block_size=bs, num_kv_heads=2, head_dim=64,
                                    dtype="fp8_e4m3", group_size=32)
        seqs = [paged.add_sequence() for _ in range(2)]
        k, v = rng.standard_normal((2, 2, 2, 150, 64)).astype(np.float32)
        paged.attend(seqs, rng.standard_normal((2, 4, 150, 64)).astype(np.float32), k, v)
        qp = rng.standard_normal((2, 4, 1, 64)).astype(np.float32)
        out.append((f"paged-bs{bs}", lambda paged=paged, seqs=seqs, qp=qp: pyattn.attention_with_kvcache(
            qp, paged.k, paged.v, cache_seqlens=[paged.length(s) for s in seqs],
            block_table=np.array([paged._seqs[s][0] for s in seqs]), k_scale=paged.k_scale,
            v_scale=paged.v_scale, precision="bf16")))
    shared = pyattn.PagedKVCache(num_blocks=80, block_size=64, num_kv_heads=2, head_dim=64, dtype="fp8_e5m2",
                                 group_size=32)
    root = shared.add_sequence()
    kr, vr = rng.standard_normal((2, 1, 2, 4200, 64)).astype(np.float32)
    shared.attend([root], rng.standard_normal((1, 2, 4200, 64)).astype(np.float32), kr, vr)
    forks = [root] + [shared.fork(root) for _ in range(3)]
    qf = rng.standard_normal((4, 4, 1, 64)).astype(np.float32)
    tf = np.array([shared._seqs[s][0][:66] for s in forks])
    out.append(("paged-forks", lambda: pyattn.attention_with_kvcache(
        qf, shared.k, shared.v, cache_seqlens=np.full(4, 4200), block_table=tf, k_scale=shared.k_scale,
        v_scale=shared.v_scale, precision="bf16", softcap=30.0)))
    return out


def test_fp8_long_cache_split_and_forks(rng):
    """A long cache (the split's chunks, merged) against the model; forks
    reading their common blocks once = each fork's own call."""
    kc, ks = fcache(rng, 1, 2, 5000, 64, "fp8_e4m3")
    vc, vs = fcache(rng, 1, 2, 5000, 64, "fp8_e4m3")
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    got = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=5000, k_scale=ks, v_scale=vs, precision="bf16")
    vd = pyattn.dequantize(vc, vs, out_dtype=np.float64)
    want = fp8_attention(q, kc, ks, vd, [5000], 1 / 8)
    assert np.abs(got - want).max() <= TOL[np.dtype(np.float32)] * vmag(vd, 5000)
    _forks_read_once(rng, "fp8_e5m2")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("bs", [7, 16, 64])
def test_fp8_caches_and_the_paged_pool_agree(rng, fmt, bs):
    """KVCache.attend, PagedKVCache.attend (block sizes 7, 16, 64; with and
    without a plan) and attention_with_kvcache with precision="bf16": the
    same bits, prompt and decode steps; the model."""
    def model(q, flat):
        vd = pyattn.dequantize(flat.v, flat.v_scale, out_dtype=np.float64)
        want = fp8_attention(q, flat.k, flat.k_scale, vd, flat.lengths, 1 / np.sqrt(64))
        return want, TOL[np.dtype(np.float32)] * vmag(vd[:, :, :int(flat.lengths[0])], 64)
    _caches_agree(rng, fmt, bs, model)


@pytest.mark.parametrize("fmt", FMTS)
def test_fp8_nn_layer_with_a_cache(rng, fmt):
    """A layer's cached calls with precision="bf16" over an fp8 cache: its
    cache's attend (the same bits as the KVCache call on the layer's q, k,
    v: checked through a float32-cache twin of the layer being different)
    and close to the layer at the default precision."""
    from pyattn.nn import MultiHeadAttention
    m = MultiHeadAttention(64, 64, 2, context_length=64, rng=0).eval()
    x = rng.standard_normal((2, 12, 64)).astype(np.float32)
    c1, c2 = m.new_cache(2, 40, dtype=fmt), m.new_cache(2, 40, dtype=fmt)
    steps = [(0, 8), (8, 9), (9, 12)]
    a = np.concatenate([m(x[:, i:j], cache=c1, precision="bf16") for i, j in steps], axis=1)
    b = np.concatenate([m(x[:, i:j], cache=c2) for i, j in steps], axis=1)
    assert np.array_equal(c1.k, c2.k) and np.array_equal(c1.k_scale, c2.k_scale)
    assert not np.array_equal(a, b)
    assert np.abs(a - b).max() <= 0.05 * (1 + np.abs(b).max())
    paged = pyattn.PagedKVCache(num_blocks=12, block_size=7, num_kv_heads=2, head_dim=32, dtype=fmt)
    seqs = [paged.add_sequence() for _ in range(2)]
    p = np.concatenate([m(x[:, i:j], cache=paged, seqs=seqs, precision="bf16") for i, j in steps], axis=1)
    assert np.array_equal(a, p)
