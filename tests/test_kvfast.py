"""attention_with_kvcache's fast path (pyattn/_kvfast.py): a call whose
signature has a plan makes the same kernel call the full path makes --
argument by argument -- and a call the plan cannot take (bad cache_seqlens,
another layout, another option type) gets the full path's answer or error."""
import itertools

import numpy as np
import pytest

import pyattn
from pyattn import _api, _kvfast

pytestmark = pytest.mark.frame

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:                     # bfloat16 rows skip
    BF16 = None


def _capture(monkeypatch):
    calls = []
    real = _api._C.sdpa

    class Spy:
        def __getattr__(self, name):
            return getattr(real_mod, name)

        @staticmethod
        def sdpa(*a, **k):
            calls.append((a, k))
            return real(*a, **k)

    real_mod = _api._C
    spy = Spy()
    monkeypatch.setattr(_api, "_C", spy)
    monkeypatch.setattr(_kvfast, "_C", spy)
    return calls


def _same(a, b, where):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        # a length-1 axis's stride (or an empty array's) is never used
        st = [tuple(s for s, n in zip(x.strides, x.shape) if n > 1 and x.size) for x in (a, b)]
        assert (a.shape, st[0], a.dtype) == (b.shape, st[1], b.dtype), where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, where


def _arrays(rng, B, Hq, Hkv, T, E, Ev, S, dt, qdt, new):
    def mk(shape, d):
        return rng.standard_normal(shape).astype(d)
    q = mk((B, Hq, T, E), qdt)
    kc, vc = mk((B, Hkv, S, E), dt), mk((B, Hkv, S, Ev), dt)
    kv = (mk((B, Hkv, T, E), dt), mk((B, Hkv, T, Ev), dt)) if new else (None, None)
    return q, kc, vc, kv


DTYPES = [("f32", np.float32, np.float32), ("f64", np.float64, np.float64), ("f16", np.float16, np.float16),
          ("f16q32", np.float16, np.float32), ("f32q64", np.float32, np.float64), ("bf16", "bf16", "bf16")]
SHAPES = [(1, 8, 2, 1, 64, 64), (2, 4, 4, 1, 32, 32), (2, 6, 2, 3, 16, 24), (1, 64, 1, 1, 16, 16),
          (3, 2, 1, 2, 40, 40), (2, 4, 2, 0, 16, 16)]
OPTS = [dict(), dict(is_causal=np.bool_(False)), dict(scale=0.3, window=(5, 0)), dict(softcap=12.5, return_lse=True),
        dict(precision="bf16"), dict(window=(3, None), return_lse=True)]


@pytest.mark.parametrize("dname,dt,qdt", DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("oi", range(len(OPTS)))
@pytest.mark.parametrize("new", [False, True])
def test_the_plan_makes_the_full_paths_kernel_call(monkeypatch, dname, dt, qdt, shape, oi, new):
    if "bf16" in (dt, qdt):
        if BF16 is None:
            pytest.skip("ml_dtypes is not installed")
        dt = qdt = BF16
    opts = OPTS[oi]
    if opts.get("precision") == "bf16" and np.dtype(dt) == np.float64:
        pytest.skip("precision='bf16' with float64 caches: refused (test_errors)")
    B, Hq, Hkv, T, E, S = shape
    Ev = E + 8 if E % 16 == 0 else E
    rng = np.random.default_rng(abs(hash((dname, shape, oi, new))) % 2**32)
    q, kc, vc, (kn, vn) = _arrays(rng, B, Hq, Hkv, T, E, Ev, S, dt, qdt, new)
    seq = rng.integers(0, S - T + 1, B).astype(np.int32) if B > 1 else S - T - 1
    _kvfast.clear()
    calls = _capture(monkeypatch)
    results, caches = [], []
    for _ in range(2):                      # the full path (and the plan made), then the plan
        kc1, vc1 = kc.copy(), vc.copy()
        fast0 = _kvfast.stats["fast"]
        results.append(pyattn.attention_with_kvcache(q, kc1, vc1, kn, vn, cache_seqlens=seq, **opts))
        caches.append((kc1, vc1))
    assert _kvfast.stats["fast"] == fast0 + 1, "the second call did not run by the plan"
    assert len(calls) == 2
    (a0, k0), (a1, k1) = calls
    assert set(k0) == set(k1)
    for i, (x, y) in enumerate(zip(a0, a1)):   # the caches are per-call copies, written alike
        _same(x, y, f"arg {i}")
    for name in k0:
        _same(k0[name], k1[name], name)
    _same(results[0], results[1], "result")
    for x, y in zip(caches[0], caches[1]):
        assert x.tobytes() == y.tobytes()


def _plan_for(q, kc, vc, kn=None, vn=None, **kw):
    _kvfast.clear()
    pyattn.attention_with_kvcache(q, kc, vc, kn, vn, **kw)      # the full path makes the plan
    assert _kvfast._plans, "no plan was made"


def test_bad_cache_seqlens_gets_the_full_paths_error_and_writes_nothing():
    rng = np.random.default_rng(1)
    q, kc, vc, (kn, vn) = _arrays(rng, 2, 4, 2, 1, 16, 16, 8, np.float32, np.float32, True)
    _plan_for(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=3)
    before = kc.copy(), vc.copy()
    for bad, msg in ((8, r"must be in \[0, S_max - T\] = \[0, 7\]"), (-1, r"\[0, 7\]"),
                     (np.array([0, 8]), r"got \[0, 8\]"), (np.array([2**63 - 1, 0], np.int64), r"\[0, 7\]"),
                     (np.array([2**64 - 1, 0], np.uint64), r"\[0, 7\]")):
        with pytest.raises(ValueError, match=msg):
            pyattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=bad)
        assert kc.tobytes() == before[0].tobytes() and vc.tobytes() == before[1].tobytes()
    with pytest.raises(ValueError, match=r"cache_seqlens must be in \[0, S_max\] = \[0, 8\]"):
        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=9)


def test_another_option_type_or_layout_gets_the_full_paths_answer():
    rng = np.random.default_rng(2)
    q, kc, vc, (kn, vn) = _arrays(rng, 1, 4, 2, 1, 16, 16, 8, np.float32, np.float32, True)
    _plan_for(q, kc, vc, cache_seqlens=4, is_causal=True)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=4, is_causal=1)
    ro = kc.copy()
    ro.flags.writeable = False
    _plan_for(q, kc, vc, kn, vn, cache_seqlens=4)
    with pytest.raises(ValueError, match="k_cache is read-only"):
        pyattn.attention_with_kvcache(q, ro, vc, kn, vn, cache_seqlens=4)
    # an unaligned cache of the same strides: the full path copies it and writes it back
    buf = np.zeros(kc.nbytes + 1, np.uint8)
    un = np.ndarray(kc.shape, kc.dtype, buf[1:].data)
    un[...] = kc
    assert not un.flags.aligned
    ref = pyattn.attention_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=4)
    got = pyattn.attention_with_kvcache(q, un, vc.copy(), kn, vn, cache_seqlens=4)
    assert got.tobytes() == ref.tobytes()
    assert np.array_equal(un[:, :, 4:5], kn)


@pytest.mark.parametrize("seq", [3, np.int64(3), [3, 5], (3, 5), np.array([3, 5], np.uint8)])
def test_every_cache_seqlens_form_gives_one_answer(seq):
    rng = np.random.default_rng(3)
    q, kc, vc, _ = _arrays(rng, 2, 4, 2, 1, 16, 16, 8, np.float32, np.float32, False)
    n = np.broadcast_to(np.asarray(seq, np.int64), (2,))
    _kvfast.clear()
    want = [pyattn.attention_with_kvcache(q[b:b + 1], kc[b:b + 1], vc[b:b + 1], cache_seqlens=int(n[b]))
            for b in range(2)]
    for _ in range(2):
        got = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=seq)
        for b in range(2):
            assert got[b:b + 1].tobytes() == want[b].tobytes()


def test_plans_are_bounded_and_thread_count_free():
    rng = np.random.default_rng(4)
    _kvfast.clear()
    for S in range(8, 8 + _kvfast._MAX_PLANS + 5):
        q, kc, vc, _ = _arrays(rng, 1, 2, 1, 1, 4, 4, S, np.float32, np.float32, False)
        pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S)
    assert len(_kvfast._plans) <= _kvfast._MAX_PLANS
    q, kc, vc, _ = _arrays(rng, 2, 8, 2, 1, 64, 64, 4096, np.float32, np.float32, False)
    old = pyattn.get_num_threads()
    try:
        outs = []
        for nt in itertools.chain([1, 2], [1, 2]):
            pyattn.set_num_threads(nt)
            outs.append(pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=4000).tobytes())
        assert len(set(outs)) == 1
    finally:
        pyattn.set_num_threads(old)


@pytest.mark.parametrize("dname,dt,qdt", DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("new", [False, True])
@pytest.mark.parametrize("lse", [False, True])
def test_token_major_views_and_out_equal_the_full_path(dname, dt, qdt, new, lse):
    """pyattn.flash's call: (B, T, H, E) arrays seen as (B, H, T, E), and out
    (of the compute dtype, or 16-bit): the plan's answer is the full path's."""
    if "bf16" in (dt, qdt):
        if BF16 is None:
            pytest.skip("ml_dtypes is not installed")
        dt = qdt = BF16
    rng = np.random.default_rng(5)
    B, Hq, Hkv, T, E, S = 2, 8, 2, 1, 32, 24
    t = lambda x: x.transpose(0, 2, 1, 3)      # noqa: E731
    q = rng.standard_normal((B, T, Hq, E)).astype(qdt)
    kc, vc = (rng.standard_normal((B, S, Hkv, E)).astype(dt) for _ in range(2))
    kn, vn = (rng.standard_normal((B, T, Hkv, E)).astype(dt) for _ in range(2)) if new else (None, None)
    cd = np.float32 if np.dtype(dt).itemsize <= 4 and np.dtype(dt) != np.float64 else np.float64
    for odt in (cd, dt):
        answers = []
        for run in range(3):                  # the full path (plan made), the plan, the plan again
            if run == 0:
                _kvfast.clear()
            fast0 = _kvfast.stats["fast"]
            out = np.full((B, T, Hq, E), 7, odt)
            k1, v1 = kc.copy(), vc.copy()
            res = pyattn.attention_with_kvcache(t(q), t(k1), t(v1), None if kn is None else t(kn),
                                                None if vn is None else t(vn), cache_seqlens=np.array([3, 9]),
                                                out=t(out), return_lse=lse)
            assert _kvfast.stats["fast"] == fast0 + (run > 0)
            o = res[0] if lse else res
            assert np.shares_memory(o, out)
            answers.append((out.tobytes(), res[1].tobytes() if lse else b"", k1.tobytes(), v1.tobytes()))
        assert answers[0] == answers[1] == answers[2]


SDPA_SHAPES = [((1, 8, 1, 64), (1, 2, 64, 64), 64), ((2, 4, 3, 16), (2, 4, 40, 16), 24),
               ((2, 3, 6, 1, 32), (2, 3, 2, 50, 32), 32), ((8, 2, 16), (8, 30, 16), 16),
               ((2, 64, 1, 16), (2, 1, 33, 16), 16), ((3, 4, 5, 8), (1, 4, 7, 8), 8)]
SDPA_OPTS = [dict(), dict(is_causal=True), dict(is_causal="bottom_right", window=(4, 0), return_lse=True),
             dict(align="bottom_right", softcap=5.0, scale=1 / np.sqrt(np.float32(16))),
             dict(precision="bf16", return_lse=True),
             dict(dropout_p=0.0, rng=7, is_causal="top_left")]


@pytest.mark.parametrize("dname,dt,qdt", DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("si", range(len(SDPA_SHAPES)))
@pytest.mark.parametrize("oi", range(len(SDPA_OPTS)))
@pytest.mark.parametrize("with_out", [False, True])
def test_scaled_dot_product_attention_by_a_plan_equals_the_full_path(dname, dt, qdt, si, oi, with_out):
    if "bf16" in (dt, qdt):
        if BF16 is None:
            pytest.skip("ml_dtypes is not installed")
        dt = qdt = BF16
    opts = dict(SDPA_OPTS[oi])
    qs, ks, Ev = SDPA_SHAPES[si]
    rng = np.random.default_rng(si * 100 + oi)
    q = rng.standard_normal(qs).astype(qdt)
    k = rng.standard_normal(ks).astype(dt)
    v = rng.standard_normal(ks[:-1] + (Ev,)).astype(dt)
    gqa = len(qs) >= 3 and qs[-3] != ks[-3]
    cd = np.float64 if np.float64 in (np.dtype(dt), np.dtype(qdt)) else np.float32
    if opts.get("precision") == "bf16" and cd == np.float64:
        pytest.skip("precision='bf16' with float64: refused (test_errors)")
    broadcast = qs[:-3] != ks[:-3] or (not gqa and qs[:-2] != ks[:-2])
    answers = []
    _kvfast.clear()
    for run in range(3):
        fast0 = _kvfast.stats["fast"]
        out = np.full(np.broadcast_shapes(qs[:-2], ks[:-2]) if not gqa else qs[:-2], 3, cd)
        out = np.full(out.shape + (qs[-2], Ev), 3, cd) if with_out else None
        res = pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, out=out, **opts)
        assert _kvfast.stats["fast"] == fast0 + (run > 0 and not broadcast)
        r = res if isinstance(res, tuple) else (res,)
        if with_out:
            assert r[0] is out
        answers.append(tuple(x.tobytes() for x in r) + tuple(x.shape for x in r))
    assert answers[0] == answers[1] == answers[2]
    if broadcast:                       # no plan: the batch axes broadcast (the full path's views)
        assert not _kvfast._plans


def test_scaled_dot_product_attention_plan_errors_are_the_full_paths():
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 4, 3, 8), dtype=np.float32) for _ in range(3))
    _kvfast.clear()
    pyattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert _kvfast._plans
    with pytest.raises(ValueError, match="is_causal must be True, False"):
        pyattn.scaled_dot_product_attention(q, k, v, is_causal=1.0)
    with pytest.raises(ValueError, match="dropout_p"):
        pyattn.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    ro = np.zeros((2, 4, 3, 8), np.float32)
    ro.flags.writeable = False
    pyattn.scaled_dot_product_attention(q, k, v, out=np.zeros((2, 4, 3, 8), np.float32))
    with pytest.raises(ValueError, match="out must be writeable"):
        pyattn.scaled_dot_product_attention(q, k, v, out=ro)


PAGED = [(1, 8, 2, 1, 64, 16, 5), (3, 4, 4, 1, 16, 4, 4), (2, 6, 2, 3, 24, 8, 3), (2, 64, 1, 1, 16, 2, 4)]


@pytest.mark.parametrize("dname,dt,qdt", DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("case", range(len(PAGED)))
@pytest.mark.parametrize("oi", [0, 1, 3, 4])
@pytest.mark.parametrize("new", [False, True])
def test_a_paged_plan_makes_the_full_paths_kernel_call(monkeypatch, dname, dt, qdt, case, oi, new):
    if "bf16" in (dt, qdt):
        if BF16 is None:
            pytest.skip("ml_dtypes is not installed")
        dt = qdt = BF16
    opts = OPTS[oi]
    if opts.get("precision") == "bf16" and np.dtype(dt) == np.float64:
        pytest.skip("precision='bf16' with float64 caches: refused (test_errors)")
    B, Hq, Hkv, T, E, bs, W = PAGED[case]
    rng = np.random.default_rng(case * 10 + oi)
    nblk = B * W + 3
    q = rng.standard_normal((B, Hq, T, E)).astype(qdt)
    kp, vp = (rng.standard_normal((nblk, Hkv, bs, E)).astype(dt) for _ in range(2))
    kn, vn = (rng.standard_normal((B, Hkv, T, E)).astype(dt) for _ in range(2)) if new else (None, None)
    table = rng.permutation(nblk)[:B * W].reshape(B, W).astype(np.int32)
    seq = rng.integers(0, W * bs - T + 1, B)
    _kvfast.clear()
    calls = _capture(monkeypatch)
    results, pools = [], []
    for _ in range(2):
        k1, v1 = kp.copy(), vp.copy()
        fast0 = _kvfast.stats["fast"]
        results.append(pyattn.attention_with_kvcache(q, k1, v1, kn, vn, cache_seqlens=seq, block_table=table,
                                                     **opts))
        pools.append((k1, v1))
    assert _kvfast.stats["fast"] == fast0 + 1, "the second call did not run by the plan"
    (a0, k0), (a1, k1_) = calls
    assert set(k0) == set(k1_)
    for i, (x, y) in enumerate(zip(a0, a1)):
        _same(x, y, f"arg {i}")
    for name in k0:
        _same(k0[name], k1_[name], name)
    _same(results[0], results[1], "result")
    for x, y in zip(pools[0], pools[1]):
        assert x.tobytes() == y.tobytes()


def test_a_paged_plan_refuses_what_the_full_path_refuses():
    rng = np.random.default_rng(6)
    B, Hq, Hkv, E, bs, W = 2, 4, 2, 8, 4, 3
    q = rng.standard_normal((B, Hq, 1, E)).astype(np.float32)
    kp, vp = (rng.standard_normal((10, Hkv, bs, E)).astype(np.float32) for _ in range(2))
    kn, vn = (rng.standard_normal((B, Hkv, 1, E)).astype(np.float32) for _ in range(2))
    table = np.array([[0, 1, 2], [3, 4, 5]])
    _kvfast.clear()
    pyattn.attention_with_kvcache(q, kp.copy(), vp.copy(), kn, vn, cache_seqlens=[5, 5], block_table=table)
    assert _kvfast._plans
    before = kp.tobytes(), vp.tobytes()
    cases = [(np.array([[0, 1, 2], [3, 1, 5]]), [5, 5], "would all write row 1 of block 1"),
             (np.array([[0, 1, 2], [3, 40, 5]]), [5, 5], r"block_table\[1, 1\] is 40"),
             (np.array([[0, 1, 2], [3, -4, 5]]), [5, 5], r"block_table\[1, 1\] is -4"),
             (table, [5, 12], "the cache is too short"), (table, [-1, 3], "cache_seqlens")]
    for tb, n, msg in cases:
        with pytest.raises(ValueError, match=msg):
            pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=np.array(n), block_table=tb)
        assert (kp.tobytes(), vp.tobytes()) == before
