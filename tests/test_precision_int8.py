"""precision="int8" (API.md "Decode precision and FP8 caches"): with int8 /
int4 caches each query row is quantized to int8 per group of the cache's
group_size exactly as pyattn.quantize does, the key products are exact
integer sums per group, scaled by the two scales and summed over the groups
in float32 (fmaf((float)isum, q_scale * k_scale, acc) in group order, then
times the softmax scale: csrc/README.md, q8rowdot); the softmax and the
value products as at the default precision.

Checked here against a NumPy model of that rule (the scores bit for bit,
through the lse of one-key calls; the outputs to float32 tolerance), the
documented bound against the default precision, the same bits on every
kernel family and thread count, contiguous and paged caches, int4, and the
errors."""
import numpy as np
import pytest

import pyattn
from pyattn import _C
from conftest import TOL

ISA = pyattn._ISA_CODES
FAMILIES = [word for word, _, built in _C.families() if built]


# ---- the NumPy model ------------------------------------------------------
def fma32(a, b, c):
    """float32 fma(a, b, c), rounded once: a * b is exact in float64 (24-bit
    operands), the sum's float64 rounding error is recovered (TwoSum) and a
    float64 sum that lands on a float32 tie is moved off it toward the error."""
    a, b, c = (np.asarray(x, np.float32).astype(np.float64) for x in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    dn = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    other = np.where(s > r64, up, dn)
    tie = (s != r64) & (np.abs(s - r64) == np.abs(other - s)) & (err != 0)
    fix = tie & (np.sign(err) == np.sign(other - s))
    return np.where(fix, other.astype(np.float32), r).astype(np.float32)


def key_ints(kc, ks):
    """A cache's stored integers (int8, or int4 unpacked) as int64."""
    return pyattn.dequantize(kc, np.ones_like(ks), out_dtype=np.float64).astype(np.int64)


def model_scores(q, kc, ks, scale):
    """Scores (..., T, S) of query rows q (..., T, E) against one head's
    cache rows kc / scales ks (S, ...) by the rule (float32)."""
    ng = ks.shape[-1]
    E = q.shape[-1]
    G = E // ng
    qi, qs = pyattn.quantize(np.asarray(q, np.float32), "int8", group_size=G)
    ki = key_ints(kc, ks)
    T, S = q.shape[0], ki.shape[0]
    isum = np.einsum("tgi,sgi->tsg", qi.astype(np.int64).reshape(T, ng, G), ki.reshape(S, ng, G))
    acc = np.zeros((T, S), np.float32)
    for g in range(ng):
        t = qs[:, None, g] * ks[None, :, g]                      # float32: rounded once
        acc = fma32(isum[:, :, g].astype(np.float32), t, acc)
    return acc * np.float32(scale)


def model_attention(q, kc, ks, vc, vs, n, scale, causal=True):
    """Outputs (B, Hq, T, Ev) of decode calls on contiguous quantized caches:
    the scores by the rule, then softmax and P V in float64, and the scores."""
    B, Hq, T, E = q.shape
    Hkv = kc.shape[1]
    vf = pyattn.dequantize(vc, vs, out_dtype=np.float64)
    out = np.zeros((B, Hq, T, vf.shape[-1]))
    sc = []
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            L = int(n[b])
            s = model_scores(q[b, h], kc[b, hk, :L], ks[b, hk, :L], scale).astype(np.float64)
            if causal:
                pos = L - T + np.arange(T)
                s = np.where(np.arange(L)[None, :] <= pos[:, None], s, -np.inf)
            sc.append(s)
            w = np.exp(s - s.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            out[b, h] = w @ vf[b, hk, :L]
    return out


def out_mag(vc, vs, S):
    """The error scale of outputs whose scores are exact: the softmax's sum
    and the P V sums (length S) times the values' magnitude."""
    vmax = float(np.abs(pyattn.dequantize(vc, vs, out_dtype=np.float64)).max())
    return vmax * (8.0 + np.log1p(S) + np.sqrt(S + 1.0))


def qcache(rng, B, H, S, E, dtype, G, Ev=None):
    k = rng.standard_normal((B, H, S, E)).astype(np.float32)
    v = rng.standard_normal((B, H, S, Ev or E)).astype(np.float32)
    kc, ks = pyattn.quantize(k, dtype, group_size=G)
    vc, vs = pyattn.quantize(v, dtype, group_size=G)
    return kc, ks, vc, vs


@pytest.fixture
def family():
    """Restores the kernel family a test switches."""
    cfg = _C.config()["isa"]
    yield
    _C.select_isa(ISA.get(cfg, -1))


def use(fam):
    _C.select_isa(ISA[fam])
    if _C.config()["isa"] != fam:
        pytest.skip(f"this CPU cannot run the {fam} family")


# ---- the rule -------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("E, G", [(64, 32), (128, 32), (128, 64), (40, 8), (64, 16), (96, 96), (12, 2)])
def test_scores_are_the_rule_bit_for_bit(rng, dtype, E, G):
    """One filled key per call: lse is that key's score, exactly."""
    Hkv, T = 3, 5
    kc, ks, vc, vs = qcache(rng, 1, Hkv, 1, E, dtype, G)
    q = (rng.standard_normal((1, 2 * Hkv, T, E)) * rng.uniform(0.1, 5, (1, 2 * Hkv, T, 1))).astype(np.float32)
    q[0, 0, 0, :G] = 0                                    # an all-zero group: scale 0
    scale = 0.37
    _, lse = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=1, k_scale=ks, v_scale=vs, is_causal=False,
                                           scale=scale, return_lse=True, precision="int8")
    for h in range(2 * Hkv):
        want = model_scores(q[0, h], kc[0, h // 2], ks[0, h // 2], scale)[:, 0]
        assert np.array_equal(lse[0, h], want), (h, lse[0, h], want)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("T", [1, 3, 9, 40, 130])
def test_outputs_match_the_model(rng, dtype, T):
    """Decode (T = 1, GQA rows stacked) and longer query blocks (the rows
    path takes every L with precision="int8")."""
    B, Hkv, Hq, S, E = 2, 2, 4, 150, 64
    kc, ks, vc, vs = qcache(rng, B, Hkv, S, E, dtype, 32)
    n = np.array([S, max(97, T)])
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    got = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs, precision="int8")
    want = model_attention(q, kc, ks, vc, vs, n, 1 / np.sqrt(E))
    err = np.abs(got - want).max()
    assert err <= TOL[np.dtype(np.float32)] * out_mag(vc, vs, S), err
    # the rule matters: the default precision differs
    base = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs)
    assert not np.array_equal(got, base)


def test_options_and_the_default_path_agree_on_what_int8_leaves_alone(rng):
    """window, softcap and float16 queries run through the same rule; a
    float16 query is the float32 one (quantize reads the same values)."""
    kc, ks, vc, vs = qcache(rng, 1, 2, 64, 32, "int8", 16)
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float16)
    a = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=50, k_scale=ks, v_scale=vs, precision="int8",
                                      window=(20, 0), softcap=3.0)
    b = pyattn.attention_with_kvcache(q.astype(np.float32), kc, vc, cache_seqlens=50, k_scale=ks, v_scale=vs,
                                      precision="int8", window=(20, 0), softcap=3.0)
    assert np.array_equal(a, b)
    c = pyattn.attention_with_kvcache(q.astype(np.float64), kc, vc, cache_seqlens=50, k_scale=ks, v_scale=vs,
                                      precision="int8", window=(20, 0), softcap=3.0)
    assert np.array_equal(a, c)                            # a float64 query: converted to float32 first


# ---- the bound against the default precision -------------------------------
def score_bound(q, kc, ks, scale):
    """The docstring's bound on |score(int8) - score(default)| per (row, key):
    |scale| * sum over groups of q_scale_g / 2 * sum_{e in g} |k_e|, plus
    float32 rounding of both scores (scale * sum |q| |k| * 2 E eps)."""
    ng = ks.shape[-1]
    E = q.shape[-1]
    G = E // ng
    _, qs = pyattn.quantize(q, "int8", group_size=G)
    kd = np.abs(pyattn.dequantize(kc, ks, out_dtype=np.float64))          # (S, E)
    kg = kd.reshape(kd.shape[0], ng, G).sum(-1)                         # (S, ng)
    step = qs.astype(np.float64) / 2 @ kg.T                            # (T, S)
    fl = np.abs(q.astype(np.float64)) @ kd.T * 2 * (E + ng + 2) * float(np.finfo(np.float32).eps)
    return abs(scale) * (step + fl)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_documented_bound_holds(rng, dtype):
    E, G, Hkv, T = 64, 32, 4, 16
    kc, ks, vc, vs = qcache(rng, 1, Hkv, 1, E, dtype, G)
    q = rng.standard_normal((1, Hkv, T, E)).astype(np.float32) * 3
    kw = dict(cache_seqlens=1, k_scale=ks, v_scale=vs, is_causal=False, return_lse=True)
    _, l8 = pyattn.attention_with_kvcache(q, kc, vc, precision="int8", **kw)
    _, l0 = pyattn.attention_with_kvcache(q, kc, vc, **kw)
    for h in range(Hkv):
        bound = score_bound(q[0, h], kc[0, h], ks[0, h], 1 / np.sqrt(E))[:, 0]
        d = np.abs(l8[0, h].astype(np.float64) - l0[0, h])
        assert (d <= bound).all(), (d / bound).max()
        assert d.max() > 0                                 # the rounding is there to bound
    # outputs: weights move by at most a factor exp(2 D) (D: the largest
    # score bound), so |out8 - out| <= (exp(2 D) - 1) * max|v| (+ float32)
    S = 300
    kc, ks, vc, vs = qcache(rng, 1, Hkv, S, E, dtype, G)
    q = rng.standard_normal((1, Hkv, 1, E)).astype(np.float32)
    o8 = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S, k_scale=ks, v_scale=vs, precision="int8")
    o0 = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S, k_scale=ks, v_scale=vs)
    vmax = np.abs(pyattn.dequantize(vc, vs)).max()
    for h in range(Hkv):
        D = score_bound(q[0, h], kc[0, h], ks[0, h], 1 / np.sqrt(E)).max()
        lim = np.expm1(2 * D) * vmax + 2 * TOL[np.dtype(np.float32)] * out_mag(vc, vs, S)
        assert np.abs(o8[0, h] - o0[0, h]).max() <= lim


# ---- same bits: families, threads, layouts -----------------------------------
def cases(rng):
    """(name, call) pairs covering contiguous and paged, int8 and int4, SIMD
    group sizes and portable ones, decode and the split of long caches."""
    out = []
    for dtype, G, E, S in (("int8", 32, 128, 300), ("int4", 32, 64, 200), ("int8", 8, 40, 130),
                           ("int4", 16, 128, 4700)):
        kc, ks, vc, vs = qcache(rng, 2, 2, S, E, dtype, G)
        q = rng.standard_normal((2, 8, 1, E)).astype(np.float32)
        n = np.array([S, S - 37])
        out.append((f"{dtype}-G{G}-E{E}-S{S}", lambda q=q, kc=kc, vc=vc, ks=ks, vs=vs, n=n:
                    pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs,
                                                  precision="int8", return_lse=True)))
    kc, ks, vc, vs = qcache(rng, 1, 2, 100, 64, "int8", 32)
    qs = rng.standard_normal((1, 4, 2, 64)).astype(np.float32) * 4
    out.append(("softcap-window", lambda qs=qs, kc=kc, vc=vc, ks=ks, vs=vs: pyattn.attention_with_kvcache(
        qs, kc, vc, cache_seqlens=100, k_scale=ks, v_scale=vs, precision="int8", softcap=2.0, window=(50, 0))))
    qx = rng.standard_normal((1, 4, 3, 64)).astype(np.float32) * 3   # scores far apart: exp's tails, flushes
    out.append(("extreme-scale", lambda qx=qx, kc=kc, vc=vc, ks=ks, vs=vs: pyattn.attention_with_kvcache(
        qx, kc, vc, cache_seqlens=100, k_scale=ks, v_scale=vs, precision="int8", scale=9.0, return_lse=True)))
    q3 = rng.standard_normal((2, 4, 20, 64)).astype(np.float32)
    kc, ks, vc, vs = qcache(rng, 2, 2, 90, 64, "int8", 32)
    out.append(("int8-T20", lambda: pyattn.attention_with_kvcache(q3, kc, vc, cache_seqlens=90, k_scale=ks,
                                                                  v_scale=vs, precision="int8")))
    paged = pyattn.PagedKVCache(num_blocks=40, block_size=16, num_kv_heads=2, head_dim=64, dtype="int4",
                                group_size=32)
    seqs = [paged.add_sequence() for _ in range(2)]
    k, v = rng.standard_normal((2, 2, 2, 150, 64)).astype(np.float32)
    paged.attend(seqs, rng.standard_normal((2, 4, 150, 64)).astype(np.float32), k, v)
    qp, kp, vp = rng.standard_normal((3, 2, 4, 1, 64)).astype(np.float32)
    bt = np.array([paged._seqs[s][0] for s in seqs])
    lens = np.array([paged.length(s) for s in seqs])
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
        v_scale=shared.v_scale, precision="int8", softcap=30.0)))
    out.append(("paged-int4", lambda: pyattn.attention_with_kvcache(
        qp, paged.k, paged.v, cache_seqlens=lens, block_table=bt, k_scale=paged.k_scale, v_scale=paged.v_scale,
        precision="int8")))
    return out


def test_same_bits_on_every_family(rng, family):
    cs = cases(rng)
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
        for (name, _), a, b in zip(cs, ref[1], res):
            for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                assert np.array_equal(x, y, equal_nan=True), f"{name}: {fam} differs from {ref[0]}"
    assert "generic" in ran and len(ran) >= 2 or len(FAMILIES) == 1, ran


def test_same_bits_for_any_thread_count(rng):
    cs = cases(rng)
    n0 = pyattn.get_num_threads()
    try:
        runs = []
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            runs.append([c() for _, c in cs])
    finally:
        pyattn.set_num_threads(n0)
    for r in runs[1:]:
        for (name, _), a, b in zip(cs, runs[0], r):
            for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                assert np.array_equal(x, y), name


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_caches_and_the_paged_pool_agree(rng, dtype):
    """KVCache.attend, PagedKVCache.attend and attention_with_kvcache with
    precision="int8": the same bits, prompt and decode steps."""
    H, Hq, E = 2, 4, 64
    flat = pyattn.KVCache(1, H, 64, E, dtype=dtype, group_size=32)
    paged = pyattn.PagedKVCache(num_blocks=8, block_size=16, num_kv_heads=H, head_dim=E, dtype=dtype,
                                group_size=32)
    s = paged.add_sequence()
    for T in (20, 1, 1, 7):
        q = rng.standard_normal((1, Hq, T, E)).astype(np.float32)
        k, v = rng.standard_normal((2, 1, H, T, E)).astype(np.float32)
        before = flat.lengths.copy()
        a = flat.attend(q, k, v, precision="int8")
        b = paged.attend([s], q, k, v, precision="int8")
        assert np.array_equal(a, b)
        c = pyattn.attention_with_kvcache(q, flat.k, flat.v, cache_seqlens=flat.lengths, k_scale=flat.k_scale,
                                          v_scale=flat.v_scale, precision="int8")
        assert np.array_equal(a, c)
        assert flat.lengths[0] == before[0] + T
        want = model_attention(q, flat.k, flat.k_scale, flat.v, flat.v_scale, flat.lengths, 1 / np.sqrt(E))
        assert np.abs(a - want).max() <= TOL[np.dtype(np.float32)] * out_mag(flat.v, flat.v_scale, 64)


def test_a_float_v_cache_beside_an_int8_k_cache(rng):
    """Only the key side changes: an int8 k_cache with a float32 v_cache."""
    kc, ks, _, _ = qcache(rng, 1, 2, 40, 32, "int8", 16)
    v = rng.standard_normal((1, 2, 40, 32)).astype(np.float32)
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    got = pyattn.attention_with_kvcache(q, kc, v, cache_seqlens=40, k_scale=ks, precision="int8")
    mag = float(np.abs(v).max()) * (8.0 + np.log1p(40) + np.sqrt(41.0))
    for h in range(4):
        s = model_scores(q[0, h], kc[0, h // 2], ks[0, h // 2], 1 / np.sqrt(32)).astype(np.float64)
        w = np.exp(s - s.max())
        want = (w / w.sum()) @ v[0, h // 2].astype(np.float64)
        assert np.abs(got[0, h] - want).max() <= TOL[np.dtype(np.float32)] * mag


def test_strided_float_values_leave_the_int8_query_alone(rng):
    """A strided float v_cache is gathered tile by tile into the frame's
    workspace: the int8 query rows live apart from it (the same bits as a
    contiguous v_cache), decode and longer query blocks."""
    kc, ks, _, _ = qcache(rng, 1, 2, 70, 32, "int8", 16)
    v = rng.standard_normal((1, 2, 70, 64)).astype(np.float32)[..., ::2]
    for T in (1, 12):
        q = rng.standard_normal((1, 4, T, 32)).astype(np.float32)
        a = pyattn.attention_with_kvcache(q, kc, v, cache_seqlens=70, k_scale=ks, precision="int8")
        b = pyattn.attention_with_kvcache(q, kc, np.ascontiguousarray(v), cache_seqlens=70, k_scale=ks,
                                          precision="int8")
        assert np.array_equal(a, b)


def test_a_nan_query_row_gives_nan(rng):
    kc, ks, vc, vs = qcache(rng, 1, 1, 20, 32, "int8", 32)
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    q[0, 1, 0, 3] = np.nan
    o = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=20, k_scale=ks, v_scale=vs, precision="int8")
    assert np.isfinite(o[0, 0]).all() and np.isnan(o[0, 1]).all()


# ---- errors -----------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16])
def test_float_caches_refuse_int8(rng, dt):
    kc = np.zeros((1, 2, 8, 16), dt)
    q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="precision='int8'"):
        pyattn.attention_with_kvcache(q, kc, kc.copy(), cache_seqlens=3, precision="int8")
    cache = pyattn.KVCache(1, 2, 8, 16, dtype=dt)
    with pytest.raises(ValueError, match="precision='int8'"):
        cache.attend(q, q[:, :2], q[:, :2], precision="int8")
    assert cache.lengths[0] == 0
    paged = pyattn.PagedKVCache(num_blocks=2, block_size=8, num_kv_heads=2, head_dim=16, dtype=dt)
    s = paged.add_sequence()
    with pytest.raises(ValueError, match="precision='int8'"):
        paged.attend([s], q, q[:, :2], q[:, :2], precision="int8")
    assert paged.length(s) == 0


def test_other_calls_refuse_int8(rng):
    q = rng.standard_normal((1, 2, 4, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="precision"):
        pyattn.scaled_dot_product_attention(q, q, q, precision="int8")
    with pytest.raises(ValueError, match="precision"):
        pyattn.matmul(q[0, 0], q[0, 0].T, precision="int8")
    kc, ks, vc, vs = qcache(rng, 1, 2, 8, 16, "int8", 16)
    with pytest.raises(ValueError, match="precision"):
        pyattn.attention_with_kvcache(q[:, :, :1], kc, vc, cache_seqlens=3, k_scale=ks, v_scale=vs,
                                      precision="int4")
    with pytest.raises(ValueError, match="int8"):         # the kernel entry checks it too
        _C.sdpa(q, q, q, None, None, int8=True)


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_layers_with_quantized_caches(rng, precision):
    """pyattn.nn layers pass precision= ("int8", and "bf16" on these caches:
    tests/test_precision_bf16_quant.py) to their cache's attend: the same
    bits as the caches' own calls, contiguous and paged."""
    from pyattn.nn import MultiHeadAttention
    m = MultiHeadAttention(64, 64, 4, rng=0).eval()
    x = rng.standard_normal((1, 7, 64)).astype(np.float32)
    for dtype in ("int8", "int4"):
        flat = m.new_cache(1, 16, dtype=dtype, group_size=8)
        paged = pyattn.PagedKVCache(num_blocks=6, block_size=4, num_kv_heads=4, head_dim=16, dtype=dtype,
                                    group_size=8)
        s = paged.add_sequence()
        a = m(x[:, :5], cache=flat, precision=precision)
        b = m(x[:, :5], cache=paged, seqs=[s], precision=precision)
        assert np.array_equal(a, b)
        for t in (5, 6):
            a = m(x[:, t:t + 1], cache=flat, precision=precision)
            b = m(x[:, t:t + 1], cache=paged, seqs=[s], precision=precision)
            assert np.array_equal(a, b)
        # the rule reached the cache: the default precision differs
        base = m.new_cache(1, 16, dtype=dtype, group_size=8)
        assert not np.array_equal(m(x, cache=base), m(x, cache=m.new_cache(1, 16, dtype=dtype, group_size=8),
                                                       precision=precision))
    with pytest.raises(ValueError, match="precision"):
        m(x, precision="int8")                              # no cache
    with pytest.raises(ValueError, match="precision='int8'"):
        m(x, cache=m.new_cache(1, 16), precision="int8")     # a float32 cache
