"""Issue 43 ("First hour v4"): the habits of PyTorch, FlashAttention and
FlexAttention users that hit walls, each a regression test."""
import numpy as np
import pytest

import pyattn

RNG = np.random.default_rng(43)


def _qkv(shape=(2, 3, 5, 8), dtype=np.float32):
    return tuple(RNG.standard_normal(shape).astype(dtype) for _ in range(3))


# --- item 5: a Python bool in a mask slot is a TypeError naming is_causal ---

@pytest.mark.parametrize("flag", [True, False, np.True_])
def test_bool_in_sdpa_mask_slot_names_is_causal(flag):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="attn_mask.*is_causal=True"):
        pyattn.scaled_dot_product_attention(q, k, v, flag)
    with pytest.raises(TypeError, match="attn_mask.*is_causal=True"):
        pyattn.scaled_dot_product_attention(q, k, v, attn_mask=flag)


def test_bool_mask_refused_by_every_mask_slot():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="attn_mask.*is_causal"):
        pyattn.softmax(q, attn_mask=True)
    out, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match="attn_mask.*is_causal"):
        pyattn.scaled_dot_product_attention_backward(np.ones_like(out), q, k, v, out, lse, True)
    w = RNG.standard_normal((8, 8))
    with pytest.raises(TypeError, match="attn_mask.*is_causal"):
        pyattn.multi_head_attention(q[0], k[0], v[0], 2, w, w, w, attn_mask=True)
    with pytest.raises(TypeError, match="attn_mask.*is_causal"):
        pyattn.nn.MultiHeadAttention(8, 8, 2, rng=0)(q[0], True)
    kc, vc = np.zeros((2, 3, 16, 8), np.float32), np.zeros((2, 3, 16, 8), np.float32)
    with pytest.raises(TypeError, match="tree_mask.*is_causal"):
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, tree_mask=True)
    assert not kc.any() and not vc.any()          # nothing written


def test_bool_mask_refused_by_dask_and_torch():
    q, k, v = _qkv()
    da = pytest.importorskip("dask.array")
    import pyattn.dask
    with pytest.raises(TypeError, match="attn_mask.*is_causal"):
        pyattn.dask.scaled_dot_product_attention(da.from_array(q), da.from_array(k), da.from_array(v), True)
    torch = pytest.importorskip("torch")
    import pyattn.torch
    t = torch.from_numpy(q)
    with pytest.raises(TypeError, match="attn_mask.*is_causal"):
        pyattn.torch.scaled_dot_product_attention(t, t, t, True)


def test_array_masks_still_accepted():
    q, k, v = _qkv()
    m = np.tril(np.ones((5, 5), bool))
    ref = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_array_equal(pyattn.scaled_dot_product_attention(q, k, v, m), ref)
    np.testing.assert_array_equal(pyattn.scaled_dot_product_attention(q, k, v, np.array(True)),
                                  pyattn.scaled_dot_product_attention(q, k, v))
