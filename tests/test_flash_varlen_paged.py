"""pyattn.flash's varlen and paged mappings (issue 29): FlashAttention's
bottom-right placement per sequence without causal, S_dmask of a varlen call
with dropout, rotary with paged caches, FlashAttention's block_table guard."""
import numpy as np
import pytest

from pyattn import _reference as ref
from pyattn.flash import (_flash_attn_varlen_forward, flash_attn_func, flash_attn_varlen_func,
                          flash_attn_with_kvcache)
import varlen_util as vu

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

LQ, LK = [3, 6, 1, 4], [7, 2, 5, 4]
H, HKV, E = 4, 2, 16


def packed(rng, dtype=np.float32):
    return vu.packed(rng, dtype, LQ, LK, H, HKV, E, np.int32)


@pytest.mark.parametrize("opts", [dict(window_size=(2, 1)), dict(alibi_slopes=np.linspace(0.1, 0.5, H)),
                                  dict(window_size=(3, 0), causal=True), dict(window_size=(1, 1), softcap=2.0)])
def test_varlen_is_flash_attn_func_per_sequence(rng, opts):
    """Each sequence of flash_attn_varlen_func equals flash_attn_func on it
    alone, bit for bit (window and ALiBi bottom-right when L_i != S_i; window
    sides below every S_i: FlashAttention drops a side >= max_seqlen_k, per call)."""
    q, k, v, cq, ck = packed(rng)
    o, lse, _ = flash_attn_varlen_func(q, k, v, cq, ck, max(LQ), max(LK), return_attn_probs=True, **opts)
    for i in range(len(LQ)):
        qi, ki, vi = q[cq[i]:cq[i + 1]][None], k[ck[i]:ck[i + 1]][None], v[ck[i]:ck[i + 1]][None]
        od, ld, _ = flash_attn_func(qi, ki, vi, return_attn_probs=True, **opts)
        assert np.array_equal(o[cq[i]:cq[i + 1]], od[0]), i
        assert np.array_equal(lse[:, cq[i]:cq[i + 1]], ld[0]), i


def test_varlen_s_dmask_is_the_dropout_applied(rng):
    """S_dmask (N, H, max L, max S): >= 0 where kept; the output is the float64
    reference's probabilities, kept ones scaled by 1/(1-p), times v."""
    q, k, v, cq, ck = packed(rng, np.float64)
    p = 0.3
    o, _, sd = flash_attn_varlen_func(q, k, v, cq, ck, max(LQ), max(LK), dropout_p=p, causal=True,
                                      return_attn_probs=True)
    assert sd.shape == (len(LQ), H, max(LQ), max(LK))
    dropped = 0
    for i in range(len(LQ)):
        L, S = LQ[i], LK[i]
        assert not sd[i, :, L:].any() and not sd[i, :, :, S:].any()      # zeros past the lengths
        qi = q[cq[i]:cq[i + 1]].transpose(1, 0, 2)
        ki = np.repeat(k[ck[i]:ck[i + 1]].transpose(1, 0, 2), 2, 0)
        vi = np.repeat(v[ck[i]:ck[i + 1]].transpose(1, 0, 2), 2, 0)
        _, w = ref.scaled_dot_product_attention(qi, ki, vi, is_causal="bottom_right", return_weights=True)
        keep = sd[i, :, :L, :S] >= 0
        dropped += int((~keep & (w > 0)).sum())
        want = np.where(keep, w, 0) / (1 - p) @ vi
        np.testing.assert_allclose(o[cq[i]:cq[i + 1]].transpose(1, 0, 2), want, rtol=1e-10, atol=1e-10)
        top = w.max(-1, keepdims=True)              # rows with no key (L > S): zeros
        scaled = np.divide(w, top, out=np.zeros_like(w), where=top > 0)
        np.testing.assert_allclose(np.abs(sd[i, :, :L, :S]), scaled, rtol=1e-12, atol=1e-15)
    assert dropped > 0


def _pool(rng, kc, bs):
    B, S = kc.shape[:2]
    nb = B * (S // bs)
    table = rng.permutation(nb).reshape(B, S // bs).astype(np.int32)
    kp = np.zeros((nb, bs) + kc.shape[2:], kc.dtype)
    for b in range(B):
        for j in range(S // bs):
            kp[table[b, j]] = kc[b, j * bs:(j + 1) * bs]
    return kp, table


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("Tk", [1, 3])
def test_kvcache_paged_rotary_equals_contiguous(rng, interleaved, Tk):
    B, T, S, bs = 2, 2, 32, 8
    kc = rng.standard_normal((B, S, HKV, E)).astype(np.float32)
    vc = rng.standard_normal((B, S, HKV, E)).astype(np.float32)
    kp, table = _pool(rng, kc, bs)
    vp, _ = _pool(np.random.default_rng(0), vc, bs)
    vp = np.zeros_like(kp)
    for b in range(B):
        for j in range(S // bs):
            vp[table[b, j]] = vc[b, j * bs:(j + 1) * bs]
    q = rng.standard_normal((B, T, H, E)).astype(np.float32)
    k = rng.standard_normal((B, Tk, HKV, E)).astype(np.float32)
    v = rng.standard_normal((B, Tk, HKV, E)).astype(np.float32)
    cos, sin = rng.standard_normal((2, S, 4))
    n = np.array([4, 19], np.int32)
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=n, causal=True, rotary_interleaved=interleaved,
              return_softmax_lse=True)
    o1, l1 = flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    o2, l2 = flash_attn_with_kvcache(q, kp, vp, k, v, block_table=table, **kw)
    assert np.array_equal(o1, o2) and np.array_equal(l1, l2)
    for b in range(B):
        for j in range(S // bs):
            assert np.array_equal(kp[table[b, j]], kc[b, j * bs:(j + 1) * bs])


def test_block_table_guard_is_value_and_runtime_error(rng):
    kp = rng.standard_normal((4, 8, 1, E)).astype(np.float32)
    before = kp.copy()
    q = rng.standard_normal((1, 1, 1, E)).astype(np.float32)
    table = np.zeros((1, 1), np.int32)
    for new, n in ((None, 9), (q, 8)):
        with pytest.raises(ValueError, match="block_table") as ei:
            flash_attn_with_kvcache(q, kp, kp, new, new, cache_seqlens=np.array([n], np.int32), block_table=table)
        assert isinstance(ei.value, RuntimeError)
    assert np.array_equal(kp, before)
    cq, ck = np.array([0, 1], np.int32), np.array([0, 8], np.int32)
    with pytest.raises(RuntimeError, match="num_splits > 1"):
        _flash_attn_varlen_forward(q[0], kp, kp, cq, ck, 1, 8, 0.0, None, False, block_table=table, num_splits=2)
    with pytest.raises(NotImplementedError, match="dropout_p > 0 with block_table"):
        flash_attn_varlen_func(q[0], kp, kp, cq, ck, 1, 8, dropout_p=0.1, block_table=table)
    with pytest.raises(NotImplementedError, match="leftpad_k"):
        _flash_attn_varlen_forward(q[0], kp, kp, cq, ck, 1, 8, 0.0, None, False, leftpad_k=np.zeros(1, np.int32))
