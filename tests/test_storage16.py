"""16-bit storage (API.md "16-bit storage"): float16 and bfloat16 (ml_dtypes)
query/key/value, KV caches and matmul operands are read in place and widened
in the kernels; arithmetic is float32. Widening is exact, so every result
must equal -- bit for bit -- the float32 computation on the widened inputs.
No converted copy of an input may exist (peak traced memory)."""
import tracemalloc

import numpy as np
import pytest

import pyattn
from conftest import LAYOUTS, frozen, make, unchanged

try:                              # bfloat16 needs the optional ml_dtypes; float16 runs without
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except Exception:                 # missing, or built for another NumPy
    BF16 = None
F16 = np.dtype(np.float16)
D16 = [F16, pytest.param(BF16, marks=pytest.mark.skipif(BF16 is None, reason="ml_dtypes not installed"))]
IDS = ["float16", "bfloat16"]
needs_bf16 = pytest.mark.skipif(BF16 is None, reason="ml_dtypes not installed")


def w32(*xs):
    return [None if x is None else np.asarray(x).astype(np.float32) for x in xs]


@pytest.mark.parametrize("d16", D16, ids=IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("L, S, E, Ev", [(37, 53, 16, 8), (130, 200, 64, 40), (1, 5000, 64, 64),
                                         (5, 300, 24, 24), (9, 17, 600, 8)])
def test_sdpa_equals_float32_on_widened_inputs(rng, d16, layout, L, S, E, Ev):
    q = make(rng, (2, 4, L, E), d16, layout)
    k = make(rng, (2, 2, S, E), d16, layout)
    v = make(rng, (2, 2, S, Ev), d16, layout)
    before = frozen(q, k, v)
    for kw in (dict(), dict(is_causal="bottom_right", window=(40, 0), softcap=5.0,
                            alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4]), sinks=np.zeros(4))):
        got = pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True, **kw)
        want = pyattn.scaled_dot_product_attention(*w32(q, k, v), enable_gqa=True, return_lse=True, **kw)
        assert got[0].dtype == np.float32
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    unchanged(before, (q, k, v))


@pytest.mark.parametrize("d16", D16, ids=IDS)
def test_sdpa_masks_weights_dropout(rng, d16):
    q, k, v = (rng.standard_normal((2, 3, 20, 16)).astype(d16) for _ in range(3))
    m = rng.random((20, 20)) > 0.3
    fm = rng.standard_normal((20, 20)).astype(d16)        # a 16-bit float mask is cast to float32
    for kw in (dict(attn_mask=m, is_causal=True), dict(attn_mask=fm), dict(dropout_p=0.3, rng=5)):
        got = pyattn.scaled_dot_product_attention(q, k, v, return_weights=True, **kw)
        kw32 = {**kw, "attn_mask": w32(kw["attn_mask"])[0]} if kw.get("attn_mask") is not None and \
            kw["attn_mask"].dtype != bool else kw
        want = pyattn.scaled_dot_product_attention(*w32(q, k, v), return_weights=True, **kw32)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@needs_bf16
def test_mixed_storage(rng):
    q = rng.standard_normal((2, 33, 16)).astype(np.float32)
    k = rng.standard_normal((2, 40, 16)).astype(BF16)
    v = rng.standard_normal((2, 40, 16)).astype(F16)
    got = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert got.dtype == np.float32
    assert np.array_equal(got, pyattn.scaled_dot_product_attention(*w32(q, k, v), is_causal=True))
    # with a float64 operand everything computes in float64 (converted)
    assert pyattn.scaled_dot_product_attention(q.astype(np.float64), k, v).dtype == np.float64


@pytest.mark.parametrize("d16", D16, ids=IDS)
def test_out_narrowed_into_16bit(rng, d16):
    q, k, v = (rng.standard_normal((3, 10, 8)).astype(d16) for _ in range(3))
    out = np.empty((3, 10, 8), d16)
    r = pyattn.scaled_dot_product_attention(q, k, v, out=out)
    assert r is out
    assert np.array_equal(out, pyattn.scaled_dot_product_attention(*w32(q, k, v)).astype(d16))
    with pytest.raises(ValueError, match="out has shape"):
        pyattn.scaled_dot_product_attention(q, k, v, out=np.empty((3, 10, 8), np.float64))


@pytest.mark.parametrize("d16", D16, ids=IDS)
@pytest.mark.parametrize("Hq, Hkv, T", [(8, 2, 1), (4, 4, 3), (6, 1, 1)])
def test_kvcache_16bit(rng, d16, Hq, Hkv, T):
    B, S_max, E = 2, 9000, 32
    n = np.array([4500, 8000])
    kc = np.zeros((B, Hkv, S_max, E), d16)
    vc = np.zeros((B, Hkv, S_max, E), d16)
    kc[:, :, :8000] = rng.standard_normal((B, Hkv, 8000, E))
    vc[:, :, :8000] = rng.standard_normal((B, Hkv, 8000, E))
    q = rng.standard_normal((B, Hq, T, E)).astype(np.float32)
    key = rng.standard_normal((B, Hkv, T, E)).astype(np.float32)
    val = rng.standard_normal((B, Hkv, T, E)).astype(np.float32)
    k0, v0 = kc.copy(), vc.copy()
    out, lse = pyattn.attention_with_kvcache(q, kc, vc, key, val, cache_seqlens=n, return_lse=True)
    assert out.dtype == np.float32
    for b in range(B):     # the new rows, rounded to the cache dtype; nothing else changed
        assert np.array_equal(kc[b, :, n[b]:n[b] + T], key[b].astype(d16))
        assert np.array_equal(vc[b, :, n[b]:n[b] + T], val[b].astype(d16))
        k0[b, :, n[b]:n[b] + T] = key[b].astype(d16)
        v0[b, :, n[b]:n[b] + T] = val[b].astype(d16)
    assert np.array_equal(kc, k0) and np.array_equal(vc, v0)
    k32, v32 = w32(kc, vc)
    want = pyattn.attention_with_kvcache(q, k32, v32, cache_seqlens=n + T, return_lse=True)
    assert np.array_equal(out, want[0]) and np.array_equal(lse, want[1])


@pytest.mark.parametrize("d16", D16, ids=IDS)
def test_KVCache_and_layer_16bit(rng, d16):
    from pyattn.nn import MultiHeadAttention
    m = MultiHeadAttention(32, 32, 4, rng=0).eval()
    x = rng.standard_normal((2, 12, 32)).astype(np.float32)
    c = m.new_cache(2, 16, dtype=d16)
    assert c.k.dtype == d16
    inc = np.concatenate([m(x[:, t:t + 1], cache=c) for t in range(12)], axis=1)
    full = m(x)
    eps = float(np.finfo(np.float16).eps) if d16 == F16 else 2.0 ** -8
    assert np.max(np.abs(inc - full)) <= 8 * eps * (1 + np.max(np.abs(full)))


@pytest.mark.parametrize("d16", D16, ids=IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matmul_16bit(rng, d16, layout):
    a = make(rng, (3, 70, 300), d16, layout)
    b = make(rng, (300, 90), d16, layout)
    before = frozen(a, b)
    r = pyattn.matmul(a, b)
    assert r.dtype == np.float32
    assert np.array_equal(r, pyattn.matmul(*w32(a, b)))
    assert np.array_equal(pyattn.matmul(a, b.astype(np.float32)), pyattn.matmul(*w32(a, b)))
    o = np.empty((3, 70, 90), d16)
    pyattn.matmul(a, b, out=o)
    assert np.array_equal(o, r.astype(d16))
    assert pyattn.matmul(a[0, 0], b).shape == (90,)
    unchanged(before, (a, b))


def _peak(fn):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        res = fn()
        return tracemalloc.get_traced_memory()[1] - base, res
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("d16", D16, ids=IDS)
def test_no_converted_copy(rng, d16):
    """Traced memory (NumPy's allocations) during a call stays far below the
    size of one float32 copy of the 16-bit cache (the kernels' own tile
    buffers are a few hundred KB and not traced)."""
    S, E = 1 << 18, 64                                # 32 MB of 16-bit keys, as many values
    k = np.ones((1, 2, S, E), d16)
    v = np.ones((1, 2, S, E), d16)
    q = np.ones((1, 8, 1, E), np.float32)
    copy32 = k.size * 4
    peak, _ = _peak(lambda: pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S - 5))
    assert peak < copy32 / 16, peak
    peak, _ = _peak(lambda: pyattn.scaled_dot_product_attention(q[..., :4, :, :].astype(d16), k, v,
                                                                 enable_gqa=True))
    assert peak < copy32 / 16, peak
    a = np.ones((2048, 4096), d16)
    peak, _ = _peak(lambda: pyattn.matmul(a, np.ones((4096, 8), d16)))
    assert peak < a.size * 4 / 16, peak
    # the check can fail: a converted copy shows up
    peak, _ = _peak(lambda: k.astype(np.float32).sum())
    assert peak >= copy32


@needs_bf16
def test_torch_and_ml_dtypes_bfloat16_agree(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((3, 2, 4, 30, 16)).astype(np.float32)
    via_ml = x.astype(BF16)
    via_torch = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(BF16)
    assert np.array_equal(via_ml.view(np.uint16), via_torch.view(np.uint16))
    a = pyattn.scaled_dot_product_attention(*via_ml, is_causal=True)
    b = pyattn.scaled_dot_product_attention(*via_torch, is_causal=True)
    assert np.array_equal(a, b)
    # and against PyTorch computing on the same bfloat16 values in float32
    t = torch.from_numpy(x).to(torch.bfloat16).float()
    want = torch.nn.functional.scaled_dot_product_attention(t[0], t[1], t[2], is_causal=True).numpy()
    assert np.max(np.abs(a - want)) <= 64 * np.finfo(np.float32).eps * (1 + np.max(np.abs(want)))


@needs_bf16
def test_float16_and_bfloat16_every_value():
    h = np.array([0.0, -0.0, 1.0, 65504.0, 6e-8, -6e-8, np.inf, -np.inf, 2.0 ** -14, 1e-5], np.float16)
    a = h.reshape(1, 10)
    r = pyattn.matmul(a.T, np.ones((1, 1), np.float16))
    assert np.array_equal(r[:, 0], h.astype(np.float32))
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    every = bits.view(np.float16).reshape(-1, 1)
    fin = np.isfinite(every[:, 0])
    r = pyattn.matmul(every[fin], np.ones((1, 1), np.float16))
    assert np.array_equal(r[:, 0], every[fin, 0].astype(np.float32))
    every_bf = bits.view(BF16).reshape(-1, 1)
    fin = np.isfinite(every_bf[:, 0].astype(np.float32))
    r = pyattn.matmul(every_bf[fin], np.ones((1, 1), BF16))
    assert np.array_equal(r[:, 0], every_bf[fin, 0].astype(np.float32))
