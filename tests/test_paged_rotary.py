"""Rotary embedding and any number of new keys with paged and packed caches
(attention_with_kvcache(block_table=, cu_seqlens_q=, rotary_cos=, ...)):
bit-identical to the contiguous cache's call, the same rows written, and
nothing written on an error."""
import numpy as np
import pytest

import pyattn

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

B, HQ, HKV, E, S, BS = 3, 4, 2, 16, 40, 8
N = np.array([5, 0, 17])


def pools(rng, dtype):
    kc = rng.standard_normal((B, HKV, S, E)).astype(dtype)
    vc = rng.standard_normal((B, HKV, S, E)).astype(dtype)
    nb = B * (S // BS) + 2
    table = rng.permutation(nb)[:B * (S // BS)].reshape(B, S // BS)
    kp = np.zeros((nb, HKV, BS, E), dtype)
    vp = np.zeros_like(kp)
    for b in range(B):
        for j in range(S // BS):
            kp[table[b, j]] = kc[b, :, j * BS:(j + 1) * BS]
            vp[table[b, j]] = vc[b, :, j * BS:(j + 1) * BS]
    return kc, vc, kp, vp, table


def gather(pool, table):
    """The contiguous (B, H, S, E) caches a block table describes."""
    return np.concatenate([pool[table[:, j]] for j in range(table.shape[1])], axis=2)


def tables(rng, rot_dim=8, rows=64):
    return rng.standard_normal((rows, rot_dim // 2)), rng.standard_normal((rows, rot_dim // 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("T, Tk", [(3, 3), (3, 2), (1, 4), (2, 0)])
@pytest.mark.parametrize("opts", [dict(is_causal=True), dict(is_causal=False),
                                  dict(is_causal=False, window=(4, 1)), dict(is_causal=True, rotary_interleaved=True)])
def test_paged_rotary_and_tk_bit_identical_to_contiguous(rng, dtype, T, Tk, opts):
    kc, vc, kp, vp, table = pools(rng, dtype)
    q = rng.standard_normal((B, HQ, T, E)).astype(dtype)
    k = rng.standard_normal((B, HKV, Tk, E)).astype(dtype)
    v = rng.standard_normal((B, HKV, Tk, E)).astype(dtype)
    cos, sin = tables(rng)
    kw = dict(cache_seqlens=N, return_lse=True, **opts)
    if Tk:
        kw.update(rotary_cos=cos, rotary_sin=sin)
    o1, l1 = pyattn.attention_with_kvcache(q, kc, vc, k, v, **kw)
    o2, l2 = pyattn.attention_with_kvcache(q, kp, vp, k, v, block_table=table, **kw)
    assert np.array_equal(o1, o2, equal_nan=True) and np.array_equal(l1, l2)
    assert np.array_equal(gather(kp, table), kc) and np.array_equal(gather(vp, table), vc)
    if Tk:                                   # the rotation happened: keys differ from the raw ones
        assert not np.array_equal(kc[0, :, N[0]:N[0] + Tk], k[0].astype(kc.dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("opts", [dict(is_causal=True), dict(is_causal=False),
                                  dict(is_causal=False, window=(2, 2), rotary_interleaved=True)])
def test_packed_rotary_per_sequence(rng, dtype, opts):
    """Packed new tokens (cu_seqlens_q), a different count per sequence: each
    sequence equals the contiguous call on it alone, rotary at its own
    positions."""
    kc, vc, kp, vp, table = pools(rng, dtype)
    Ts = [2, 0, 3]
    cu = np.concatenate([[0], np.cumsum(Ts)])
    q = rng.standard_normal((cu[-1], HQ, E)).astype(dtype)
    k = rng.standard_normal((cu[-1], HKV, E)).astype(dtype)
    v = rng.standard_normal((cu[-1], HKV, E)).astype(dtype)
    cos, sin = tables(rng)
    kw = dict(rotary_cos=cos, rotary_sin=sin, **opts)
    o, lse = pyattn.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=N, block_table=table, cu_seqlens_q=cu,
                                           return_lse=True, **kw)
    for b in range(B):
        if Ts[b] == 0:
            continue
        t = lambda x: x[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None]  # noqa: E731
        od, ld = pyattn.attention_with_kvcache(t(q), kc[b:b + 1], vc[b:b + 1], t(k), t(v), cache_seqlens=N[b:b + 1],
                                               return_lse=True, **kw)
        assert np.array_equal(o[cu[b]:cu[b + 1]], od[0].transpose(1, 0, 2)), b
        assert np.array_equal(lse[cu[b]:cu[b + 1]], ld[0].T), b
    assert np.array_equal(gather(kp, table), kc) and np.array_equal(gather(vp, table), vc)


def test_paged_cache_class_with_rotary(rng):
    cache = pyattn.PagedKVCache(num_blocks=16, block_size=4, num_kv_heads=HKV, head_dim=E)
    a = cache.add_sequence()
    cos, sin = tables(rng)
    q, k, v = rng.standard_normal((3, 1, HQ, 5, E)).astype(np.float32)
    kc, vc = np.zeros((1, HKV, 16, E), np.float32), np.zeros((1, HKV, 16, E), np.float32)
    o1 = cache.attend([a], q, k[:, :HKV], v[:, :HKV], rotary_cos=cos, rotary_sin=sin)
    o2 = pyattn.attention_with_kvcache(q, kc, vc, k[:, :HKV], v[:, :HKV], cache_seqlens=0, rotary_cos=cos,
                                       rotary_sin=sin)
    assert np.array_equal(o1, o2)


def test_errors_write_nothing(rng):
    kc, vc, kp, vp, table = pools(rng, np.float32)
    q = rng.standard_normal((B, HQ, 2, E)).astype(np.float32)
    k = rng.standard_normal((B, HKV, 2, E)).astype(np.float32)
    cos, sin = tables(rng, rows=18)             # positions up to 18 needed (N[2] + 2 - 1)
    before = kp.copy()
    f = pyattn.attention_with_kvcache
    with pytest.raises(ValueError, match="rotary_cos/rotary_sin have 18 rows"):
        f(q, kp, vp, k, k, cache_seqlens=N, block_table=table, rotary_cos=cos, rotary_sin=sin)
    cu = np.arange(B + 1) * 2
    pk = lambda x: x.transpose(0, 2, 1, 3).reshape(-1, x.shape[1], E)  # noqa: E731
    with pytest.raises(ValueError, match="rotary_cos/rotary_sin have 18 rows"):
        f(pk(q), kp, vp, pk(k), pk(k), cache_seqlens=N, block_table=table, cu_seqlens_q=cu, rotary_cos=cos,
          rotary_sin=sin)
    with pytest.raises(ValueError, match="key and value must be given"):
        f(q, kp, vp, cache_seqlens=N, block_table=table, rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(ValueError, match="both rotary_cos and rotary_sin"):
        f(q, kp, vp, k, k, cache_seqlens=N, block_table=table, rotary_cos=cos)
    with pytest.raises(ValueError, match="exceeds the head dim"):
        f(q, kp, vp, k, k, cache_seqlens=N, block_table=table, rotary_cos=np.zeros((64, 9)),
          rotary_sin=np.zeros((64, 9)))
    with pytest.raises(NotImplementedError, match="tree_mask"):
        f(q, kp, vp, k, k, cache_seqlens=N, block_table=table, rotary_cos=cos, rotary_sin=sin,
          tree_mask=np.ones((1, 1, 2, 2), bool))
    with pytest.raises(ValueError, match="tree_mask needs as many new keys"):
        f(q, kp, vp, k[:, :, :1], k[:, :, :1], cache_seqlens=N, block_table=table,
          tree_mask=np.ones((1, 1, 2, 2), bool))
    with pytest.raises(ValueError, match="cache is too short"):      # Tk new rows past the table
        f(q[:, :, :1], kp, vp, np.zeros((B, HKV, 24, E), np.float32), np.zeros((B, HKV, 24, E), np.float32),
          cache_seqlens=N, block_table=table)
    with pytest.raises(ValueError, match="key and value alike"):
        f(q, kp, vp, k, k[:, :, :1], cache_seqlens=N, block_table=table)
    assert np.array_equal(kp, before)
