"""Paged and mixed-length KV caches (API.md, "Paged and mixed-length KV
caches"): attention_with_kvcache(block_table=, cu_seqlens_q=, tree_mask=)
bit for bit against the contiguous cache, writes only where asked, the
errors with nothing written, PagedKVCache's fork and copy-on-write, and the
float64 oracle (pyattn._reference.attention_with_kvcache_paged)."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from conftest import fail_allocations_in_turn

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]


def to_pool(kc, bs, rng, extra=3):
    """A contiguous cache (B, H, S, D) as a pool of blocks in random order
    (plus unused blocks filled with noise) and its block table."""
    B, H, S, D = kc.shape
    nb = S // bs
    N = B * nb + extra
    perm = rng.permutation(N)
    pool = rng.standard_normal((N, H, bs, D)).astype(kc.dtype)
    table = perm[:B * nb].reshape(B, nb)
    for b in range(B):
        for i in range(nb):
            pool[table[b, i]] = kc[b, :, i * bs:(i + 1) * bs]
    return pool, table


def rand(rng, shape, dt=np.float32):
    return rng.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("bs", [1, 16, 256])
@pytest.mark.parametrize("T,new", [(1, True), (1, False), (5, True), (20, True), (3, False)])
def test_paged_equals_contiguous(rng, bs, T, new):
    B, Hq, Hkv, E, Ev, S = 3, 4, 2, 16, 8, 512
    kc, vc = rand(rng, (B, Hkv, S, E)), rand(rng, (B, Hkv, S, Ev))
    n = np.array([37, 256 - T, 480]) if new else np.array([37, 256, 500])
    q = rand(rng, (B, Hq, T, E))
    kn = vn = None
    if new:
        kn, vn = rand(rng, (B, Hkv, T, E)), rand(rng, (B, Hkv, T, Ev))
    kp, tab = to_pool(kc, bs, rng)
    vp, _ = to_pool(vc, bs, np.random.default_rng(0))
    vp = np.zeros((kp.shape[0], Hkv, bs, Ev), np.float32)
    for b in range(B):
        for i in range(S // bs):
            vp[tab[b, i]] = vc[b, :, i * bs:(i + 1) * bs]
    ref = pyattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=n, return_lse=True)
    got = pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab,
                                       return_lse=True)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    if new:                                      # the pages hold the rows the cache holds
        for b in range(B):
            np.testing.assert_array_equal(R.paged_rows(kp, tab[b], n[b] + T), kc[b, :, :n[b] + T])
            np.testing.assert_array_equal(R.paged_rows(vp, tab[b], n[b] + T), vc[b, :, :n[b] + T])


@pytest.mark.parametrize("dt", [np.float64, np.float16])
def test_paged_dtypes_and_long_decode(rng, dt):
    """float64 and 16-bit pools; a decode over 4096+ rows (the split over threads)."""
    B, H, E, S, bs = 2, 2, 16, 4608, 256
    kc, vc = rand(rng, (B, H, S, E), dt), rand(rng, (B, H, S, E), dt)
    n = np.array([4500, 3000])
    q = rand(rng, (B, 4, 1, E), dt)
    kp, tab = to_pool(kc, bs, rng)
    vp = np.empty_like(kp)
    for b in range(B):
        for i in range(S // bs):
            vp[tab[b, i]] = vc[b, :, i * bs:(i + 1) * bs]
    ref = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=n)
    got = pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=n, block_table=tab)
    np.testing.assert_array_equal(got, ref)


def test_token_major_pool_transposed_in_place(rng):
    """FlashAttention's pool (num_blocks, block_size, Hkv, E) as .transpose(0, 2, 1, 3):
    read and written in place, the same bits as the head-major pool."""
    N, bs, H, E, B = 12, 16, 2, 8, 2
    tm_k, tm_v = rand(rng, (N, bs, H, E)), rand(rng, (N, bs, H, E))
    hm_k, hm_v = np.ascontiguousarray(tm_k.transpose(0, 2, 1, 3)), np.ascontiguousarray(tm_v.transpose(0, 2, 1, 3))
    tab = np.array([[3, 7, 1, -1], [0, 11, 5, 9]])
    n = np.array([40, 50])
    q, kn, vn = rand(rng, (B, 4, 6, E)), rand(rng, (B, H, 6, E)), rand(rng, (B, H, 6, E))
    kt, vt = tm_k.transpose(0, 2, 1, 3), tm_v.transpose(0, 2, 1, 3)
    a = pyattn.attention_with_kvcache(q, kt, vt, kn, vn, cache_seqlens=n, block_table=tab)
    b = pyattn.attention_with_kvcache(q, hm_k, hm_v, kn, vn, cache_seqlens=n, block_table=tab)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(kt, hm_k)
    np.testing.assert_array_equal(vt, hm_v)


def test_writes_land_only_in_the_asked_rows(rng):
    N, H, bs, E, B, T = 20, 2, 16, 8, 3, 5
    kp, vp = rand(rng, (N, H, bs, E)), rand(rng, (N, H, bs, E))
    tab = np.array([[4, 9, -1], [2, 17, 13], [0, -1, -1]])
    n = np.array([14, 30, 0])
    k0, v0 = kp.copy(), vp.copy()
    q, kn, vn = rand(rng, (B, 4, T, E)), rand(rng, (B, H, T, E)), rand(rng, (B, H, T, E))
    pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab)
    touched = np.zeros((N, bs), bool)
    for b in range(B):
        for t in range(T):
            r = n[b] + t
            touched[tab[b, r // bs], r % bs] = True
            np.testing.assert_array_equal(kp[tab[b, r // bs], :, r % bs], kn[b, :, t])
            np.testing.assert_array_equal(vp[tab[b, r // bs], :, r % bs], vn[b, :, t])
    for x, x0 in ((kp, k0), (vp, v0)):
        np.testing.assert_array_equal(x.transpose(0, 2, 1, 3)[~touched], x0.transpose(0, 2, 1, 3)[~touched])


def packed_case(rng, Ts, n, H=2, Hq=4, E=8, Ev=8, N=40, bs=16, width=6):
    B = len(Ts)
    cu = np.concatenate([[0], np.cumsum(Ts)])
    kp, vp = rand(rng, (N, H, bs, E)), rand(rng, (N, H, bs, Ev))
    tab = rng.permutation(N)[:B * width].reshape(B, width)
    tot = int(cu[-1])
    return kp, vp, tab, cu, rand(rng, (tot, Hq, E)), rand(rng, (tot, H, E)), rand(rng, (tot, H, Ev))


def test_mixed_prefill_and_decode_equals_separate_calls(rng):
    Ts = [20, 1, 0, 1, 7, 1]
    n = np.array([10, 50, 33, 0, 60, 80])
    kp, vp, tab, cu, q, kn, vn = packed_case(rng, Ts, n)
    kp2, vp2 = kp.copy(), vp.copy()
    out, lse = pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab,
                                             cu_seqlens_q=cu, return_lse=True)
    assert out.shape == (q.shape[0], 4, 8) and lse.shape == (q.shape[0], 4)
    for b, T in enumerate(Ts):                   # one sequence at a time
        s = slice(cu[b], cu[b + 1])
        o, l = pyattn.attention_with_kvcache(q[s].transpose(1, 0, 2)[None], kp2, vp2,
                                             kn[s].transpose(1, 0, 2)[None], vn[s].transpose(1, 0, 2)[None],
                                             cache_seqlens=n[b:b + 1], block_table=tab[b:b + 1],
                                             return_lse=True)
        np.testing.assert_array_equal(out[s], o[0].transpose(1, 0, 2))
        np.testing.assert_array_equal(lse[s], l[0].T)
    np.testing.assert_array_equal(kp, kp2)
    np.testing.assert_array_equal(vp, vp2)
    ref = R.attention_with_kvcache_paged(q, kp2, vp2, kn, vn, cache_seqlens=n, block_table=tab,
                                         cu_seqlens_q=cu)[0]           # (rewrites the same rows)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_packed_vs_reference_with_options(rng):
    Ts = [3, 1, 12]
    n = np.array([5, 40, 17])
    kp, vp, tab, cu, q, kn, vn = packed_case(rng, Ts, n)
    kw = dict(window=(20, None), softcap=5.0, alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4]))
    out = pyattn.attention_with_kvcache(q, kp.copy(), vp.copy(), kn, vn, cache_seqlens=n, block_table=tab,
                                        cu_seqlens_q=cu, **kw)
    ref = R.attention_with_kvcache_paged(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab,
                                         cu_seqlens_q=cu, **kw)[0]
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_contiguous_cache_with_cu_seqlens(rng):
    """cu_seqlens_q without a block table: each sequence its own (B, Hkv, S_max) row."""
    B, H, S, E = 3, 2, 64, 8
    kc, vc = rand(rng, (B, H, S, E)), rand(rng, (B, H, S, E))
    Ts = [4, 0, 1]
    cu = np.array([0, 4, 4, 5])
    n = np.array([3, 9, 60])
    q, kn, vn = rand(rng, (5, 4, E)), rand(rng, (5, H, E)), rand(rng, (5, H, E))
    kc2, vc2 = kc.copy(), vc.copy()
    out = pyattn.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=n, cu_seqlens_q=cu)
    for b, T in enumerate(Ts):
        if not T:
            continue
        s = slice(cu[b], cu[b + 1])
        o = pyattn.attention_with_kvcache(q[s].transpose(1, 0, 2)[None], kc2[b:b + 1], vc2[b:b + 1], kn[s].transpose(1, 0, 2)[None],
                                          vn[s].transpose(1, 0, 2)[None], cache_seqlens=n[b])
        np.testing.assert_array_equal(out[s], o[0].transpose(1, 0, 2))
    np.testing.assert_array_equal(kc, kc2)


@pytest.mark.parametrize("new", [True, False])
def test_tree_mask_equals_explicit_mask(rng, new):
    B, Hq, H, E, T = 2, 4, 2, 8, 5
    kp, vp, tab, cu, _, _, _ = packed_case(rng, [T] * B, None)
    n = np.array([21, 40])
    q, kn, vn = rand(rng, (B, Hq, T, E)), rand(rng, (B, H, T, E)), rand(rng, (B, H, T, E))
    parent = [-1, 0, 0, 1, 2]                   # a token tree: each sees itself and its ancestors
    tree = np.zeros((T, T), bool)
    for i in range(T):
        j = i
        while j >= 0:
            tree[i, j] = True
            j = parent[j]
    tm = np.broadcast_to(tree, (1, 1, T, T))
    kw = dict(key=kn, value=vn) if new else {}
    kp2, vp2 = kp.copy(), vp.copy()
    out = pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=n, block_table=tab, tree_mask=tm, **kw)
    nn = n + T if new else n
    for b in range(B):
        if new:
            pyattn.attention_with_kvcache(q[b:b + 1], kp2, vp2, kn[b:b + 1], vn[b:b + 1],
                                          cache_seqlens=n[b:b + 1], block_table=tab[b:b + 1])
        K, V = R.paged_rows(kp2, tab[b], nn[b]), R.paged_rows(vp2, tab[b], nn[b])
        mask = np.ones((T, nn[b]), bool)
        mask[:, nn[b] - T:] = tree
        dense = pyattn.scaled_dot_product_attention(q[b], K, V, attn_mask=mask, is_causal="bottom_right",
                                                    enable_gqa=True)
        np.testing.assert_allclose(out[b], dense, rtol=1e-6, atol=1e-6)
    ref = R.attention_with_kvcache_paged(q, kp2 if not new else kp2, vp2, None, None,
                                         cache_seqlens=nn, block_table=tab, tree_mask=tm)[0]
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_tree_mask_packed_uses_the_corner(rng):
    Ts = [3, 5]
    n = np.array([4, 9])
    kp, vp, tab, cu, q, kn, vn = packed_case(rng, Ts, n)
    tm = rng.random((2, 1, 5, 5)) < 0.5
    tm[:, :, np.arange(5), np.arange(5)] = True
    out = pyattn.attention_with_kvcache(q, kp.copy(), vp.copy(), kn, vn, cache_seqlens=n, block_table=tab,
                                        cu_seqlens_q=cu, tree_mask=tm)
    ref = R.attention_with_kvcache_paged(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab,
                                         cu_seqlens_q=cu, tree_mask=tm)[0]
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_threads_bit_identical(rng):
    B, H, E, S, bs = 2, 2, 16, 4608, 16
    kc, vc = rand(rng, (B, H, S, E)), rand(rng, (B, H, S, E))
    kp, tab = to_pool(kc, bs, rng)
    vp, _ = to_pool(vc, bs, np.random.default_rng(5))
    vp = np.empty_like(kp)
    for b in range(B):
        for i in range(S // bs):
            vp[tab[b, i]] = vc[b, :, i * bs:(i + 1) * bs]
    n = np.array([4400, 700])
    t0 = pyattn.get_num_threads()
    res = []
    try:
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            res.append([pyattn.attention_with_kvcache(rand(np.random.default_rng(1), (B, 4, T, E)), kp, vp,
                                                      cache_seqlens=n, block_table=tab) for T in (1, 70)])
    finally:
        pyattn.set_num_threads(t0)
    for r in res[1:]:
        for a, b in zip(r, res[0]):
            np.testing.assert_array_equal(a, b)


ERRORS = [
    (dict(tab_entry=(1, 1, 99)), ValueError, r"block_table\[1, 1\] is 99"),
    (dict(tab_entry=(1, 2, -1)), ValueError, r"block_table\[1, 2\] is -1"),
    (dict(tab_entry=(1, 1, 5), n=[10, 26]), ValueError, r"sequences \[0, 1\] would all write row 10 of block 5"),
    (dict(cu=[0, 2, 4]), ValueError, "cu_seqlens_q ends at 4"),
    (dict(cu=[1, 2, 5]), ValueError, "must start at 0"),
    (dict(cu=[0, 3, 2, 5][:3]), ValueError, "non-decreasing"),
    (dict(n=[40, 47]), ValueError, "too short"),
    (dict(tree=np.ones((1, 1, 3, 3))), TypeError, "tree_mask must be bool"),
    (dict(tree=np.ones((1, 1, 2, 2), bool)), ValueError, "tree_mask has shape"),
]


@pytest.mark.parametrize("kw,exc,match", ERRORS)
def test_errors_write_nothing(rng, kw, exc, match):
    N, H, bs, E = 12, 2, 16, 8
    kp, vp = rand(rng, (N, H, bs, E)), rand(rng, (N, H, bs, E))
    tab = np.array([[5, 6, 7], [1, 2, 3]])
    if "tab_entry" in kw:
        b, i, v = kw["tab_entry"]
        tab[b, i] = v
    n = np.array(kw.get("n", [10, 30]))
    cu = np.array(kw.get("cu", [0, 2, 5]))
    q, kn, vn = rand(rng, (5, 4, E)), rand(rng, (5, H, E)), rand(rng, (5, H, E))
    k0, v0 = kp.copy(), vp.copy()
    with pytest.raises(exc, match=match):
        pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab, cu_seqlens_q=cu,
                                      tree_mask=kw.get("tree"))
    np.testing.assert_array_equal(kp, k0)
    np.testing.assert_array_equal(vp, v0)


def test_memory_error_in_a_later_group_puts_the_rows_back(rng):
    Ts = [1, 20]                                 # two kernel calls
    n = np.array([5, 30])
    kp, vp, tab, cu, q, kn, vn = packed_case(rng, Ts, n)
    k0, v0 = kp.copy(), vp.copy()

    def unchanged():
        np.testing.assert_array_equal(kp, k0)
        np.testing.assert_array_equal(vp, v0)
    fail_allocations_in_turn(lambda: pyattn.attention_with_kvcache(
        q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab, cu_seqlens_q=cu), unchanged, limit=12)


# ---- PagedKVCache

def test_paged_cache_equals_kvcache(rng):
    E, H = 8, 2
    pc = pyattn.PagedKVCache(12, 4, H, E)
    kv = pyattn.KVCache(2, H, 32, E)
    a, b = pc.add_sequence(), pc.add_sequence()
    for T in (5, 1, 1, 3):
        q, k, v = rand(rng, (2, 4, T, E)), rand(rng, (2, H, T, E)), rand(rng, (2, H, T, E))
        np.testing.assert_array_equal(pc.attend([a, b], q, k, v), kv.attend(q, k, v))
    assert pc.length(a) == pc.length(b) == 10
    assert pc.blocks_free == 12 - 2 * 3


def test_fork_copy_on_write_leaves_the_parent(rng):
    E, H, bs = 8, 2, 4
    pc = pyattn.PagedKVCache(10, bs, H, E)
    a = pc.add_sequence()
    q, k, v = rand(rng, (1, 2, 6, E)), rand(rng, (1, H, 6, E)), rand(rng, (1, H, 6, E))
    pc.attend([a], q, k, v)
    free = pc.blocks_free
    c = pc.fork(a)
    assert pc.blocks_free == free and pc.length(c) == 6           # nothing copied
    ka, va = pc.k.copy(), pc.v.copy()
    parent_rows = R.paged_rows(pc.k, pc._seqs[a][0], 6)
    # the child writes into the shared, half-filled block: copied first
    q2, k2, v2 = rand(rng, (1, 2, 3, E)), rand(rng, (1, H, 3, E)), rand(rng, (1, H, 3, E))
    oc = pc.attend([c], q2, k2, v2)
    np.testing.assert_array_equal(R.paged_rows(pc.k, pc._seqs[a][0], 6), parent_rows)
    assert pc._seqs[a][0] == list(pc._seqs[a][0]) and pc._seqs[c][0][0] == pc._seqs[a][0][0]
    assert pc._seqs[c][0][1] != pc._seqs[a][0][1]
    for blk in pc._seqs[a][0]:
        np.testing.assert_array_equal(pc.k[blk], ka[blk])
        np.testing.assert_array_equal(pc.v[blk], va[blk])
    # the child's result equals a contiguous cache holding the same rows
    kv = pyattn.KVCache(1, H, 16, E)
    kv.attend(q, k, v)
    np.testing.assert_array_equal(oc, kv.attend(q2, k2, v2))
    # the parent then writes: its block is no longer shared, no copy
    free = pc.blocks_free
    pc.attend([a], q2, k2, v2)
    assert pc.blocks_free == free - 1            # one new block for rows 8.., none copied
    pc.free(c)
    pc.free(a)
    assert pc.blocks_free == 10


def test_cache_full_writes_nothing(rng):
    E, H = 8, 2
    pc = pyattn.PagedKVCache(3, 4, H, E)
    a, b = pc.add_sequence(), pc.add_sequence()
    pc.attend([a], rand(rng, (1, 2, 6, E)), rand(rng, (1, H, 6, E)), rand(rng, (1, H, 6, E)))
    k0, v0, st = pc.k.copy(), pc.v.copy(), repr(pc)
    with pytest.raises(pyattn.CacheFullError, match="needs 2 free blocks, 1 are free"):
        pc.attend([a, b], rand(rng, (2, 2, 3, E)), rand(rng, (2, H, 3, E)), rand(rng, (2, H, 3, E)))
    assert isinstance(pyattn.CacheFullError(), MemoryError)
    np.testing.assert_array_equal(pc.k, k0)
    np.testing.assert_array_equal(pc.v, v0)
    assert repr(pc) == st and pc.length(a) == 6 and pc.length(b) == 0
    with pytest.raises(ValueError, match="query must be"):   # a bad call leaves it as well
        pc.attend([a, b], rand(rng, (3, 2, 1, E)), rand(rng, (2, H, 1, E)), rand(rng, (2, H, 1, E)))
    with pytest.raises(ValueError, match="key has shape"):
        pc.attend([a, b], rand(rng, (2, 2, 1, E)), rand(rng, (2, H, 2, E)), rand(rng, (2, H, 1, E)))
    assert repr(pc) == st


def test_paged_cache_packed_and_errors(rng):
    E, H = 8, 2
    pc = pyattn.PagedKVCache(20, 4, H, E, value_dim=6)
    a, b, c = (pc.add_sequence() for _ in range(3))
    cu = np.array([0, 7, 8, 8])
    out = pc.attend([a, b, c], rand(rng, (8, 4, E)), rand(rng, (8, H, E)), rand(rng, (8, H, 6)),
                    cu_seqlens_q=cu)
    assert out.shape == (8, 4, 6)
    assert [pc.length(s) for s in (a, b, c)] == [7, 1, 0]
    with pytest.raises(ValueError, match="repeated"):
        pc.attend([a, a], rand(rng, (2, 4, 1, E)), rand(rng, (2, H, 1, E)), rand(rng, (2, H, 1, 6)))
    with pytest.raises(ValueError, match="not a live sequence"):
        pc.attend([99], rand(rng, (1, 4, 1, E)), rand(rng, (1, H, 1, E)), rand(rng, (1, H, 1, 6)))
    with pytest.raises(TypeError, match="dtype"):
        pyattn.PagedKVCache(4, 4, 1, 8, dtype=np.int8)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        pyattn.PagedKVCache(4, 0, 1, 8)


# ---- pyattn.nn layers with a PagedKVCache

def test_layer_with_paged_cache_equals_kvcache(rng):
    from pyattn.nn import MultiHeadAttention
    m = MultiHeadAttention(16, 16, 4, rng=0).eval()
    pc = pyattn.PagedKVCache(16, 4, 4, 4)
    kv = m.new_cache(2, 32)
    seqs = [pc.add_sequence(), pc.add_sequence()]
    for T in (6, 1, 1):
        x = rand(rng, (2, T, 16))
        np.testing.assert_array_equal(m(x, cache=pc, seqs=seqs), m(x, cache=kv))
    # packed: one sequence prefills 3 tokens while the other decodes 1
    x = rand(rng, (4, 16))
    out = m(x, cache=pc, seqs=seqs, cu_seqlens_q=[0, 3, 4])
    assert out.shape == (4, 16)
    kv2 = pyattn.KVCache(1, 4, 32, 4)
    kv2.k[0], kv2.v[0] = kv.k[0], kv.v[0]
    kv2.lengths[0] = kv.lengths[0]
    np.testing.assert_array_equal(out[:3], m(x[None, :3], cache=kv2)[0])
    with pytest.raises(TypeError, match="seqs"):
        m(rand(rng, (2, 1, 16)), cache=pc)
    with pytest.raises(TypeError, match="PagedKVCache"):
        m(rand(rng, (2, 1, 16)), cache=kv, seqs=seqs)


def test_private_entry_checks_the_table():
    """_C.sdpa(paged=...) repeats the checks the C code relies on: a direct
    call with a bad entry raises, never reads out of the pool."""
    from pyattn import _C
    kp = np.zeros((4, 2, 16, 8), np.float32)
    q = np.zeros((2, 2, 1, 8), np.float32)
    kv = np.broadcast_to(kp[:1, :, :1], (2, 2, 32, 8))
    for bad in (9, -1):
        with pytest.raises(ValueError, match=rf"block_table\[0, 1\] is {bad}"):
            _C.sdpa(q, kv, kv, None, None, 2, 1.0, kv_len=np.array([20, 20, 5, 5]),
                    paged=(kp, kp.copy(), np.array([[0, bad], [1, 2]])))
    with pytest.raises(ValueError, match="exceeds the block table"):
        _C.sdpa(q, kv, kv, None, None, 2, 1.0, kv_len=np.array([20, 20, 5, 5]),
                paged=(kp, kp.copy(), np.array([[0, 1], [1, 2]])),
                append=(np.zeros((2, 2, 2, 8), np.float32), np.zeros((2, 2, 2, 8), np.float32), np.array([31, 3])))


def test_fork_and_parent_write_their_shared_block_in_one_call(rng):
    """Issue 40, bug 2: a sequence and its fork both writing into their
    shared, half-filled block in one attend: one of them copies it, the other
    writes it in place (no block leaks; every block returns after free)."""
    E, H, bs, N = 8, 2, 4, 6
    pc = pyattn.PagedKVCache(N, bs, H, E)
    a = pc.add_sequence()
    q, k, v = rand(rng, (1, 2, 6, E)), rand(rng, (1, H, 6, E)), rand(rng, (1, H, 6, E))
    pc.attend([a], q, k, v)
    b = pc.fork(a)
    assert pc.blocks_free == N - 2
    kv = pyattn.KVCache(2, H, 16, E)
    kv.attend(np.concatenate([q, q]), np.concatenate([k, k]), np.concatenate([v, v]))
    for T in (1, 3):
        q2, k2, v2 = rand(rng, (2, 2, T, E)), rand(rng, (2, H, T, E)), rand(rng, (2, H, T, E))
        np.testing.assert_array_equal(pc.attend([a, b], q2, k2, v2), kv.attend(q2, k2, v2))
    # 10 rows each: block 0 shared, a's and b's blocks 1 and 2 their own
    assert pc._seqs[a][0][0] == pc._seqs[b][0][0]
    assert len({*pc._seqs[a][0], *pc._seqs[b][0]}) == 5
    assert pc.blocks_free == N - 5
    pc.free(a)
    assert pc.blocks_free == N - 3
    pc.free(b)
    assert pc.blocks_free == N
    assert sorted(pc._free) == list(range(N)) and not pc._refs.any()


def test_a_failing_copy_on_write_call_leaves_the_pools_bit_for_bit(rng):
    """An attend that copies a shared block and then fails (a bad keyword)
    leaves every pool as it was, the free blocks it copied into included."""
    E, H, bs = 8, 2, 4
    for dt in (np.float32, "int8"):
        pc = pyattn.PagedKVCache(6, bs, H, E, dtype=dt, group_size=4)
        a = pc.add_sequence()
        pc.attend([a], rand(rng, (1, 2, 6, E)), rand(rng, (1, H, 6, E)), rand(rng, (1, H, 6, E)))
        b = pc.fork(a)
        pools = [x.copy() for x in (pc.k, pc.v, pc.k_scale, pc.v_scale) if x is not None]
        st = repr(pc)
        with pytest.raises(TypeError, match="window"):
            pc.attend([b], rand(rng, (1, 2, 1, E)), rand(rng, (1, H, 1, E)), rand(rng, (1, H, 1, E)),
                      window=(1, 2, 3))
        for x, y in zip((pc.k, pc.v, pc.k_scale, pc.v_scale), pools):
            assert np.array_equal(x.view(np.uint8), y.view(np.uint8))
        assert repr(pc) == st and pc.length(b) == 6
