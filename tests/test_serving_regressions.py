"""The serving entry points' regressions: the bugs found from outside in the cache paths, strides and
dtypes of the wave-3 entry points, each reproduced by a few lines of NumPy.
(The generated stride / byte-order grid over every entry point is
tests/test_strides.py; PagedKVCache's stateful test tests/test_paged_state.py.)"""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as R

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---- bug 1: precision="bf16" with a value array whose key axis runs backwards --

@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16], ids=str)
@pytest.mark.parametrize("L,S", [(1, 40), (5, 41), (64, 200)])
@pytest.mark.parametrize("which", ["key", "value"])
def test_bf16_reversed_key_axis_equals_the_contiguous_call(dt, L, S, which):
    rng = _rng(1)
    q = rng.standard_normal((2, 3, L, 16)).astype(dt)
    kv = {n: rng.standard_normal((2, 3, S, 16)).astype(dt) for n in ("key", "value")}
    # the same numbers, read through a negative stride on the key axis
    kv_rev = dict(kv)
    kv_rev[which] = np.ascontiguousarray(kv[which][:, :, ::-1])[:, :, ::-1]
    assert kv_rev[which].strides[2] < 0
    want = pyattn.scaled_dot_product_attention(q, kv["key"], kv["value"], precision="bf16")
    got = pyattn.scaled_dot_product_attention(q, kv_rev["key"], kv_rev["value"], precision="bf16")
    np.testing.assert_array_equal(got, want)


def test_bf16_reversed_value_with_kvcache():
    rng = _rng(2)
    kc = rng.standard_normal((1, 2, 33, 8)).astype(np.float32)
    vc = rng.standard_normal((1, 2, 33, 8)).astype(np.float32)
    q = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    v_rev = np.ascontiguousarray(vc[:, :, ::-1])[:, :, ::-1]
    kw = dict(cache_seqlens=33, precision="bf16")
    np.testing.assert_array_equal(pyattn.attention_with_kvcache(q, kc, v_rev, **kw),
                                  pyattn.attention_with_kvcache(q, kc, vc, **kw))


# ---- bug 3: cache_leftpad / cache_batch_idx with a block table ----------------

@pytest.mark.parametrize("opt", ["cache_leftpad", "cache_batch_idx"])
@pytest.mark.parametrize("nblk", [2, 5])            # 2 == B: the pool was read as contiguous caches
@pytest.mark.parametrize("other", ["block_table", "cu_seqlens_q", "tree_mask"])
def test_leftpad_and_batch_idx_refuse_paged_packed_tree(opt, nblk, other):
    rng = _rng(3)
    pool = rng.standard_normal((nblk, 2, 4, 8)).astype(np.float32)
    q = rng.standard_normal((2, 2, 1, 8)).astype(np.float32)
    kw = {opt: np.array([1, 0])}
    if other == "block_table":
        kw["block_table"] = np.array([[0], [1]], np.int32)
    elif other == "cu_seqlens_q":
        q = q[:, :, 0].reshape(2, 2, 8)
        kw["cu_seqlens_q"] = np.array([0, 1, 2], np.int32)
    else:
        kw["tree_mask"] = np.ones((1, 1, 1, 1), bool)
    before = pool.copy()
    with pytest.raises(ValueError, match=f"{opt.split('_', 1)[1]}.*{other}|{other}.*{opt}|"
                                                  "cache_leftpad and cache_batch_idx"):
        pyattn.attention_with_kvcache(q, pool[:2] if other != "block_table" else pool,
                                      pool[:2] if other != "block_table" else pool,
                                      cache_seqlens=[2, 3], **kw)
    np.testing.assert_array_equal(pool, before)


# ---- bugs 4 and 5: rotary with an unaligned or a big-endian query -------------

def _rotary_case(dt, seed=4):
    rng = _rng(seed)
    B, H, S, E, T = 2, 2, 16, 8, 3
    kc = rng.standard_normal((B, H, S, E)).astype(dt)
    q = rng.standard_normal((B, H, T, E)).astype(dt)
    k = rng.standard_normal((B, H, T, E)).astype(dt)
    cos = rng.random((32, E // 2)).astype(np.float32)
    sin = rng.random((32, E // 2)).astype(np.float32)

    def call(qq, cos=cos, sin=sin, **kw):
        return pyattn.attention_with_kvcache(qq, kc.copy(), kc.copy(), k, k, cache_seqlens=[2, 5],
                                             rotary_cos=cos, rotary_sin=sin, **kw)
    return q, cos, sin, call


def _unaligned(a):
    buf = np.empty(a.nbytes + 1, np.uint8)[1:].view(a.dtype).reshape(a.shape)
    buf[...] = a
    assert not buf.flags.aligned
    return buf


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("what", ["query", "tables"])
def test_rotary_reads_unaligned_arrays(dt, what):
    q, cos, sin, call = _rotary_case(dt)
    want = call(q)
    got = call(_unaligned(q)) if what == "query" else call(q, cos=_unaligned(cos), sin=_unaligned(sin))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("what", ["query", "tables"])
def test_rotary_rounding_does_not_depend_on_byte_order(dt, what):
    q, cos, sin, call = _rotary_case(dt)
    want = call(q)
    swap = lambda a: a.astype(a.dtype.newbyteorder(">"))  # noqa: E731   the same numbers, big-endian
    got = call(swap(q)) if what == "query" else call(q, cos=swap(cos), sin=swap(sin))
    np.testing.assert_array_equal(got, want)


# ---- bug 7: an empty batch on the paged / packed path ------------------------

@pytest.mark.parametrize("cdt", ["float32", "int8", "int4"])
@pytest.mark.parametrize("new", [False, True])
@pytest.mark.parametrize("tree", [False, True])
def test_empty_batch_paged_keeps_T(cdt, new, tree):
    H, E, T = 2, 8, 3
    pool = np.zeros((4, H, 4, E), np.float32)
    ks = vs = None
    if cdt != "float32":
        pool, ks = pyattn.quantize(pool, cdt, group_size=4)
        vs = ks
    kw = dict(cache_seqlens=np.zeros(0, np.int32), block_table=np.zeros((0, 2), np.int32),
              k_scale=ks, v_scale=vs)
    if new:
        kw.update(key=np.zeros((0, H, T, E), np.float32), value=np.zeros((0, H, T, E), np.float32))
    if tree:
        kw["tree_mask"] = np.ones((1, 1, T, T), bool)
    q = np.zeros((0, H, T, E), np.float32)
    o = pyattn.attention_with_kvcache(q, pool.copy(), pool.copy(), **kw)
    assert o.shape == (0, H, T, E)
    out = np.empty((0, H, T, E), np.float32)             # a correct out= is taken
    assert pyattn.attention_with_kvcache(q, pool.copy(), pool.copy(), out=out, **kw) is out
    o, lse = pyattn.attention_with_kvcache(q, pool.copy(), pool.copy(), return_lse=True, **kw)
    assert o.shape == (0, H, T, E) and lse.shape == (0, H, T)


@pytest.mark.parametrize("cdt", ["float32", "int8", "int4"])
def test_empty_batch_packed(cdt):
    H, E = 2, 8
    pool = np.zeros((4, H, 4, E), np.float32)
    ks = vs = None
    if cdt != "float32":
        pool, ks = pyattn.quantize(pool, cdt, group_size=4)
        vs = ks
    o = pyattn.attention_with_kvcache(np.zeros((0, H, E), np.float32), pool, pool,
                                      cache_seqlens=np.zeros(0, np.int32), block_table=np.zeros((0, 2), np.int32),
                                      cu_seqlens_q=np.zeros(1, np.int32), k_scale=ks, v_scale=vs)
    assert o.shape == (0, H, E)


# ---- found by the serving grid under ASan: the split decode's exact NaN rows on a quantized cache --

@pytest.mark.parametrize("qdt", ["int8", "int4"])
@pytest.mark.parametrize("paged", [False, True])
def test_split_decode_nan_rows_read_the_quantized_cache_as_numbers(qdt, paged):
    """A NaN query row in a split decode (S >= 4096) is recomputed by the exact path, which
    read an int8 / int4 cache as 16-bit floats, past its end (ASan: heap-use-after-free);
    it reads dequantize()'s values now. The NaN row stays NaN, the others equal the
    float32 call over the dequantized cache."""
    rng = _rng(30)
    B, Hkv, S, E = 1, 1, 4200, 8
    kf = rng.standard_normal((B, Hkv, S, E)).astype(np.float32)
    vf = rng.standard_normal((B, Hkv, S, E)).astype(np.float32)
    kq, ks = pyattn.quantize(kf, qdt, group_size=4)
    vq, vs = pyattn.quantize(vf, qdt, group_size=4)
    q = rng.standard_normal((B, 4, 1, E)).astype(np.float32)
    q[0, 1, 0, 3] = np.nan
    kw = dict(cache_seqlens=[S], return_lse=True)
    if paged:
        bs = 64
        perm = rng.permutation(S // bs + 3)[:-(3 - (S % bs > 0))]
        table = perm[None].astype(np.int32)
        pools = []
        for a in (kq, vq, ks, vs):
            pool = np.zeros((S // bs + 3, Hkv, bs, a.shape[-1]), a.dtype)
            for j, blk in enumerate(table[0]):
                rows = a[0, :, j * bs:(j + 1) * bs]
                pool[blk, :, :rows.shape[1]] = rows
            pools.append(pool)
        o, lse = pyattn.attention_with_kvcache(q, pools[0], pools[1], k_scale=pools[2], v_scale=pools[3],
                                               block_table=table, **kw)
    else:
        o, lse = pyattn.attention_with_kvcache(q, kq, vq, k_scale=ks, v_scale=vs, **kw)
    kd = pyattn.dequantize(kq, ks, group_size=4)
    vd = pyattn.dequantize(vq, vs, group_size=4)
    want, wl = pyattn.attention_with_kvcache(q, kd, vd, **kw)
    assert np.isnan(o[0, 1]).all() and np.isnan(lse[0, 1]).all()
    ok = [0, 2, 3]
    np.testing.assert_allclose(o[0, ok], want[0, ok], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(lse[0, ok], wl[0, ok], rtol=2e-6, atol=2e-5)
