"""pyattn.nn layers: construction, modes, state dicts, forward vs the reference."""
import numpy as np
import pytest

from pyattn import _reference as R
from pyattn.nn import CausalAttention, MultiHeadAttention, SelfAttention
from conftest import check, mag_attention, mag_matmul, mag_softmax


def test_attributes_and_init():
    m = MultiHeadAttention(6, 8, 2, context_length=10, qkv_bias=True, rng=0)
    for n in ("W_query", "W_key", "W_value"):
        w = getattr(m, n)
        assert w.shape == (8, 6) and w.dtype == np.float32
        assert np.abs(w).max() <= 1 / np.sqrt(6)
    assert m.b_query.shape == (8,) and m.out_proj_weight.shape == (8, 8) and m.out_proj_bias.shape == (8,)
    assert np.abs(m.out_proj_weight).max() <= 1 / np.sqrt(8)
    assert MultiHeadAttention(6, 8, 2, out_bias=False).out_proj_bias is None
    s = SelfAttention(3, 2)
    assert s.b_query is None and s.out_proj_weight is None
    # rng: same seed, same weights
    assert np.array_equal(SelfAttention(3, 2, rng=4).W_key, SelfAttention(3, 2, rng=4).W_key)
    assert not np.array_equal(SelfAttention(3, 2, rng=4).W_key, SelfAttention(3, 2, rng=5).W_key)


def test_state_dict_roundtrip():
    a = MultiHeadAttention(6, 8, 2, qkv_bias=True, rng=0)
    sd = a.state_dict()
    assert set(sd) == {"W_query.weight", "W_key.weight", "W_value.weight", "W_query.bias", "W_key.bias",
                       "W_value.bias", "out_proj.weight", "out_proj.bias"}
    sd["W_query.weight"][:] = 0                   # a copy: the layer is untouched
    assert not np.array_equal(a.W_query, sd["W_query.weight"])
    b = MultiHeadAttention(6, 8, 2, qkv_bias=True, rng=1).load_state_dict(dict(a.state_dict(), mask=np.ones(3)))
    x = np.random.default_rng(0).standard_normal((2, 5, 6)).astype(np.float32)
    assert np.array_equal(a(x), b(x))


def test_torch_multihead_keys():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 8))
    bias = rng.standard_normal(24)
    sd = {"in_proj_weight": w, "in_proj_bias": bias, "out_proj.weight": np.eye(8), "out_proj.bias": np.zeros(8)}
    m = MultiHeadAttention(8, 8, 2, qkv_bias=True, causal=False).load_state_dict(sd)
    assert np.array_equal(m.W_key, w[8:16]) and np.array_equal(m.b_value, bias[16:])
    sd2 = {"q_proj_weight": w[:8], "k_proj_weight": w[8:16], "v_proj_weight": w[16:], "in_proj_bias": bias,
           "projection.weight": np.eye(8), "projection.bias": np.zeros(8)}
    m2 = MultiHeadAttention(8, 8, 2, qkv_bias=True, causal=False).load_state_dict(sd2)
    assert all(np.array_equal(m.state_dict()[k], m2.state_dict()[k]) for k in m.state_dict())


@pytest.mark.parametrize("cls", ["self", "causal", "mha"])
def test_forward_matches_reference(cls):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 9, 12))
    if cls == "self":
        layer, H, causal = SelfAttention(12, 10, qkv_bias=True, rng=0), 1, False
    elif cls == "causal":
        layer, H, causal = CausalAttention(12, 10, context_length=9, rng=0), 1, True
    else:
        layer, H, causal = MultiHeadAttention(12, 10, 5, context_length=9, rng=0), 5, True
    out, w = layer(x, return_weights=True)
    sd = layer.state_dict()
    want, ww = R.multi_head_attention(x, x, x, H, sd["W_query.weight"], sd["W_key.weight"], sd["W_value.weight"],
                                      sd.get("out_proj.weight"), sd.get("W_query.bias"), sd.get("W_key.bias"),
                                      sd.get("W_value.bias"), sd.get("out_proj.bias"), is_causal=causal,
                                      return_weights=True)
    assert out.dtype == np.float64 and out.shape == want.shape
    hd = 10 // H
    heads = lambda t: t.reshape(3, 9, H, hd).swapaxes(1, 2)
    q, k, v = (heads(R.linear(x, sd[f"W_{n}.weight"], sd.get(f"W_{n}.bias"))) for n in ("query", "key", "value"))
    lin = mag_matmul(np.abs(x), np.abs(sd["W_query.weight"].T).astype(float)).max() * 4
    att = (mag_attention(q, k, v, ww, hd ** -0.5) * (1 + lin) + lin).swapaxes(1, 2).reshape(3, 9, 10)
    if "out_proj.weight" in sd:
        att = mag_matmul(att, np.abs(sd["out_proj.weight"].T).astype(float))
    check(out, want, att)
    sc = np.matmul(q, np.swapaxes(k, -1, -2)) * hd ** -0.5
    wmag = mag_softmax(sc, ww) * (1 + lin)
    if H == 1:
        assert w.shape == (3, 9, 9)             # single head: the head axis is dropped
        check(w, ww[:, 0], wmag[:, 0])
    else:
        assert w.shape == (3, H, 9, 9)
        check(w, ww, wmag)


def test_train_eval_dropout():
    x = np.random.default_rng(2).standard_normal((2, 8, 16)).astype(np.float32)
    m = MultiHeadAttention(16, 16, 4, context_length=8, dropout=0.5, rng=0)
    assert m.training
    a, b = m(x), m(x)                       # training: dropout draws anew each call
    assert not np.array_equal(a, b)
    assert m.eval() is m and not m.training
    c, d = m(x), m(x)
    assert np.array_equal(c, d)
    assert m.train() is m and m.training
    _, w = m(x, return_weights=True)
    assert (w == 0).any()


def test_unbatched_and_mask():
    rng = np.random.default_rng(3)
    m = MultiHeadAttention(8, 8, 2, causal=False, rng=0)
    x = rng.standard_normal((5, 8))
    assert np.array_equal(m(x), m(x[None])[0])
    mask = np.tril(np.ones((5, 5), bool))
    causal = MultiHeadAttention(8, 8, 2, causal=True, rng=0)
    assert np.array_equal(m(x, attn_mask=mask), causal(x))
