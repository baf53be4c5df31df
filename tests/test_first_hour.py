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


# --- item 6: a full KVCache is a CacheFullError in the cache's terms ---

@pytest.mark.parametrize("dtype", [np.float32, np.float16, "int8", "int4", "fp8_e4m3", "fp8_e5m2"])
def test_full_kvcache_is_cache_full_error_and_writes_nothing(dtype):
    if str(dtype).startswith("fp8"):
        pytest.importorskip("ml_dtypes")
    c = pyattn.KVCache(2, 1, 6, 8, dtype=dtype, group_size=4)
    x = RNG.standard_normal((2, 1, 4, 8)).astype(np.float32)
    c.attend(x, x, x)
    before = [a.copy() for a in (c.k, c.v, c.k_scale, c.v_scale) if a is not None]
    with pytest.raises(pyattn.CacheFullError) as ei:
        c.attend(x[:, :, :3], x[:, :, :3], x[:, :, :3])
    assert isinstance(ei.value, MemoryError)
    msg = str(ei.value)
    assert "hold [4, 4]" in msg and "max_len=6" in msg and "adds 3" in msg, msg
    assert "cache_seqlens" not in msg and "S_max" not in msg, msg      # arguments the user never passed
    after = [a for a in (c.k, c.v, c.k_scale, c.v_scale) if a is not None]
    assert all(np.array_equal(a, b) for a, b in zip(after, before))
    assert c.lengths.tolist() == [4, 4]
    c.attend(x[:, :, :2], x[:, :, :2], x[:, :, :2])                    # what still fits is accepted
    assert c.lengths.tolist() == [6, 6]


def test_full_kvcache_names_the_one_full_sequence():
    c = pyattn.KVCache(1, 1, 3, 4)
    x = np.ones((1, 1, 4, 4), np.float32)
    with pytest.raises(pyattn.CacheFullError, match="sequence 0 holds 0 of its max_len=3 rows"):
        c.attend(x, x, x)


def test_full_kvcache_through_a_layer():
    m = pyattn.nn.MultiHeadAttention(8, 8, 2, rng=0).eval()
    cache = m.new_cache(1, 4)
    x = RNG.standard_normal((1, 3, 8)).astype(np.float32)
    m(x, cache=cache)
    with pytest.raises(pyattn.CacheFullError, match="holds 3 of its max_len=4"):
        m(x, cache=cache)
    assert cache.lengths.tolist() == [3]


# --- item 11: `python -m pyattn --config | head -3` ends quietly ---

@pytest.mark.parametrize("args", [["--config"], []])
def test_main_into_a_closed_pipe_prints_no_traceback(args):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(pyattn.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r, w = os.pipe()
    os.close(r)                          # the reader is gone before the first line (head -0)
    try:
        p = subprocess.run([sys.executable, "-m", "pyattn"] + args, stdout=w, stderr=subprocess.PIPE,
                           env=env, cwd=root, timeout=120, text=True)
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    assert p.returncode == 1             # Python's documented status for EPIPE
