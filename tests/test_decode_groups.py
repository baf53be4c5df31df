"""Decode with large query groups and large head dims (issue 41 item 4):
MQA / GQA groups of any size stacked as rows of one call (each key/value
tile read once for the group, its rows in blocks), head dims past 512 on the
decode rows path (up to 4096), and multi-head latent attention's layout --
128 query heads over one key head of 576 dims whose value is a view of the
key's first 512 -- against the float64 reference; the same bits as the call
head by head, on every kernel family and for any thread count."""
import numpy as np
import pytest

import pyattn
from pyattn import _C

pytestmark = [pytest.mark.frame]


def ref(q, k, v, lens=None):
    """float64 attention of decode rows: q (B, Hq, T, E) bottom-right
    against k (B, Hkv, S, E), v (B, Hkv, S, Ev), keys [0, lens[b])"""
    B, Hq, T, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    out = np.zeros(q.shape[:3] + (v.shape[-1],))
    for b in range(B):
        n = S if lens is None else int(lens[b])
        for h in range(Hq):
            s = q[b, h].astype(np.float64) @ k[b, h // G, :n].astype(np.float64).T / np.sqrt(E)
            pos = n - T + np.arange(T)
            s[np.arange(n)[None, :] > pos[:, None]] = -np.inf
            w = np.exp(s - s.max(-1, keepdims=True))
            out[b, h] = (w / w.sum(-1, keepdims=True)) @ v[b, h // G, :n].astype(np.float64)
    return out


def each_family(fn):
    """{family: fn()} under every SIMD family this CPU runs (select_isa
    gives another where it cannot), then the first family back. (generic
    is left out: its exp is the C library's, family_cases.py)"""
    first = _C.config()["isa"]
    codes = {w: c for w, c, _ in _C.families()}
    outs = {}
    try:
        for w, c, built in _C.families():
            if built and w != "generic" and _C.select_isa(c) == c:
                outs[w] = fn()
    finally:
        _C.select_isa(codes[first])
    if not outs:
        pytest.skip("no SIMD family on this CPU")
    return outs


@pytest.mark.parametrize("G", [6, 49, 64, 97, 128])
@pytest.mark.parametrize("S", [300, 4500])
def test_large_groups_equal_head_by_head(rng, G, S):
    E, Hkv = 32, 2
    q = rng.standard_normal((1, Hkv * G, 1, E)).astype(np.float32)
    k, v = (rng.standard_normal((1, Hkv, S, E)).astype(np.float32) for _ in range(2))
    grouped = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S)
    # the same keys repeated per query head: no group, one row per head
    rep = [np.repeat(x, G, axis=1) for x in (k, v)]
    alone = pyattn.attention_with_kvcache(q, rep[0], rep[1], cache_seqlens=S)
    np.testing.assert_array_equal(grouped, alone)
    sd = pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    np.testing.assert_array_equal(sd, grouped)
    np.testing.assert_allclose(grouped, ref(q, k, v), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("E,Ev,S", [(576, 512, 300), (576, 512, 4500), (1024, 1024, 4200), (520, 40, 64)])
def test_large_head_dims_decode(rng, E, Ev, S):
    Hq, Hkv = 8, 2
    q = rng.standard_normal((2, Hq, 1, E)).astype(np.float32)
    k = rng.standard_normal((2, Hkv, S, E)).astype(np.float32)
    v = rng.standard_normal((2, Hkv, S, Ev)).astype(np.float32)
    lens = np.array([S, S - 17])
    out = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=lens)
    np.testing.assert_allclose(out, ref(q, k, v, lens), rtol=3e-5, atol=3e-5)
    # float64: the same path, closer to the reference
    out64 = pyattn.attention_with_kvcache(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                          cache_seqlens=lens)
    np.testing.assert_allclose(out64, ref(q, k, v, lens), rtol=1e-10, atol=1e-10)


def test_mla_value_a_view_of_key(rng):
    """DeepSeek's latent attention: 128 query heads, one key head of 576 =
    512 latent + 64 rotary dims, the value the latent itself (a view)"""
    S = 4300
    q = rng.standard_normal((1, 128, 1, 576)).astype(np.float32)
    k = rng.standard_normal((1, 1, S, 576)).astype(np.float32)
    v = k[..., :512]
    assert np.shares_memory(k, v)
    before = k.copy()
    outs = each_family(lambda: pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S))
    first = next(iter(outs.values()))
    for name, o in outs.items():
        np.testing.assert_array_equal(o, first, err_msg=name)
    base = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S)          # this run's family
    np.testing.assert_allclose(base, ref(q, k, v), rtol=3e-5, atol=3e-5)
    np.testing.assert_array_equal(k, before)
    old = pyattn.get_num_threads()
    try:
        pyattn.set_num_threads(1 if old > 1 else 2)
        again = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S)
    finally:
        pyattn.set_num_threads(old)
    np.testing.assert_array_equal(again, base)


@pytest.mark.parametrize("G,E,Ev", [(64, 64, 64), (16, 576, 512)])
def test_groups_and_dims_same_bits_every_family(rng, G, E, Ev):
    S = 4400
    q = rng.standard_normal((1, G, 1, E)).astype(np.float32)
    k = rng.standard_normal((1, 1, S, E)).astype(np.float32)
    v = rng.standard_normal((1, 1, S, Ev)).astype(np.float32)
    outs = each_family(lambda: pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S))
    first = next(iter(outs.values()))
    for name, o in outs.items():
        np.testing.assert_array_equal(o, first, err_msg=name)


def test_paged_large_head_dims_equal_contiguous(rng):
    E, Ev, S, bs = 576, 512, 4200, 16
    q = rng.standard_normal((2, 16, 1, E)).astype(np.float32)
    k = rng.standard_normal((2, 1, S, E)).astype(np.float32)
    v = rng.standard_normal((2, 1, S, Ev)).astype(np.float32)
    nb = S // bs + 1
    kp = np.zeros((2 * nb, 1, bs, E), np.float32)
    vp = np.zeros((2 * nb, 1, bs, Ev), np.float32)
    tab = rng.permutation(2 * nb).reshape(2, nb)
    for b in range(2):
        for i in range(S // bs + (S % bs > 0)):
            r = slice(i * bs, min(S, (i + 1) * bs))
            kp[tab[b, i], 0, :r.stop - r.start] = k[b, 0, r]
            vp[tab[b, i], 0, :r.stop - r.start] = v[b, 0, r]
    lens = np.array([S, S - 5])
    paged = pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=tab)
    cont = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=lens)
    np.testing.assert_array_equal(paged, cont)
