"""align="bottom_right" on packed sequences (varlen): each sequence placed as
the dense call with align="bottom_right" places it (row i of sequence s at key
position i + S_s - L_s, for the causal rule, the window and ALiBi, also
without causal), bit for bit, forward, backward and vjp."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as ref
import varlen_util as vu
from varlen_util import seq

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

# L < S, L > S (rows before the first key), L == S, empty ones, a decode-shaped
# one (L = 1, S >= 4096: the dense op's key-split path)
LQ = [3, 9, 5, 0, 1, 2, 4]
LK = [11, 4, 5, 3, 4100, 0, 1]
H, HKV, E = 4, 2, 16


def packed(rng, dtype):
    return vu.packed(rng, dtype, LQ, LK, H, HKV, E)


OPTIONS = {
    "window": {"window": (2, 1)},
    "window_left": {"window": (3, None)},
    "window_wide": {"window": (4200, 4200)},
    "alibi": {"alibi_slopes": np.linspace(0.1, 1.0, H)},
    "alibi_window": {"alibi_slopes": np.linspace(0.3, 0.6, H), "window": (1, 2), "softcap": 2.5},
    "causal": {"is_causal": True},
    "bottom_right": {"is_causal": "bottom_right", "window": (2, 0)},
    "sinks": {"sinks": np.array([0.5, -1.0, 2.0, 0.0]), "window": (0, 3)},
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_forward_bit_identical_to_dense_align(rng, dtype, name):
    q, k, v, cq, ck = packed(rng, dtype)
    kw = OPTIONS[name]
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, return_lse=True,
                                                        align="bottom_right", **kw)
    for i in range(len(LQ)):
        od, ld = pyattn.scaled_dot_product_attention(seq(q, cq, i), seq(k, ck, i), seq(v, ck, i),
                                                     enable_gqa=True, return_lse=True, align="bottom_right", **kw)
        assert np.array_equal(seq(o, cq, i), od, equal_nan=True), (name, i)
        assert np.array_equal(lse[cq[i]:cq[i + 1]].T, ld), (name, i)
    # align="top_left" / None: the placement without align, also bit for bit
    if kw.get("is_causal") != "bottom_right":
        o0 = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, align="top_left", **kw)
        o1 = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, **kw)
        assert np.array_equal(o0, o1, equal_nan=True)
        if name != "window_wide":       # the placement changes the result where L_s != S_s
            assert not np.array_equal(seq(o0, cq, 0), seq(o, cq, 0))


def test_alignment_is_the_float64_oracles(rng):
    """The window and ALiBi at row i + S_s - L_s: against the float64
    reference given the same placement as an explicit additive mask."""
    q, k, v, cq, ck = packed(rng, np.float64)
    sl = np.linspace(0.2, 0.8, H)
    o = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, align="bottom_right",
                                                   window=(2, 1), alibi_slopes=sl)
    for i in range(len(LQ)):
        L, S = LQ[i], LK[i]
        if L == 0 or S == 0:
            continue
        d = np.arange(L)[:, None] + S - L - np.arange(S)[None, :]       # d(i) - j
        bias = -sl[:, None, None] * np.abs(d)[None]
        bias = np.where(((d <= 2) & (d >= -1))[None], bias, -np.inf)
        qi, ki, vi = seq(q, cq, i), np.repeat(seq(k, ck, i), 2, 0), np.repeat(seq(v, ck, i), 2, 0)
        want = ref.scaled_dot_product_attention(qi, ki, vi, attn_mask=bias)
        rows = np.isfinite(bias).any(-1)                                 # rows with a key
        np.testing.assert_allclose(seq(o, cq, i)[rows], want[rows], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["window", "alibi_window", "causal", "sinks"])
def test_backward_and_vjp_bit_identical_to_dense_align(rng, name):
    q, k, v, cq, ck = packed(rng, np.float64)
    kw = dict(OPTIONS[name], enable_gqa=True, align="bottom_right")
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, return_lse=True, **kw)
    go = rng.standard_normal(o.shape)
    g = pyattn.scaled_dot_product_attention_varlen_backward(go, q, k, v, o, lse, cq, ck, **kw)
    ds = 0.0
    for i in range(len(LQ)):
        qi, ki, vi = seq(q, cq, i), seq(k, ck, i), seq(v, ck, i)
        od, ld = pyattn.scaled_dot_product_attention(qi, ki, vi, return_lse=True, **kw)
        gd = pyattn.scaled_dot_product_attention_backward(seq(go, cq, i), qi, ki, vi, od, ld, **kw)
        for a, b, c in ((g[0], gd[0], cq), (g[1], gd[1], ck), (g[2], gd[2], ck)):
            assert np.array_equal(seq(a, c, i), b), (name, i)
        if "sinks" in kw:
            ds = ds + gd[3]
    if "sinks" in kw:
        assert np.array_equal(g[3], ds)
    out, back = pyattn.scaled_dot_product_attention_varlen_vjp(q, k, v, cq, ck, **kw)
    assert np.array_equal(out, o)
    for a, b in zip(back(go), g):
        assert np.array_equal(a, b)


def test_threads_bit_identical(rng):
    q, k, v, cq, ck = packed(rng, np.float32)
    kw = dict(enable_gqa=True, align="bottom_right", window=(2, 3), alibi_slopes=np.linspace(0.1, 1.0, H))
    old = pyattn.get_num_threads()
    try:
        pyattn.set_num_threads(1)
        a = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, **kw)
        pyattn.set_num_threads(3)
        b = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, **kw)
    finally:
        pyattn.set_num_threads(old)
    assert np.array_equal(a, b)


def test_align_errors_write_nothing(rng):
    q, k, v, cq, ck = packed(rng, np.float32)
    out = np.full((cq[-1], H, E), 7.0, np.float32)
    f = pyattn.scaled_dot_product_attention_varlen
    with pytest.raises(ValueError, match="align"):
        f(q, k, v, cq, ck, enable_gqa=True, align="bottom-right", out=out)
    with pytest.raises(ValueError, match="align='top_left' contradicts"):
        f(q, k, v, cq, ck, enable_gqa=True, align="top_left", is_causal="bottom_right", out=out)
    assert (out == 7).all()
    o, lse = f(q, k, v, cq, ck, enable_gqa=True, return_lse=True)
    with pytest.raises(ValueError, match="align"):
        pyattn.scaled_dot_product_attention_varlen_backward(np.ones_like(o), q, k, v, o, lse, cq, ck,
                                                            enable_gqa=True, align=1)
    with pytest.raises(ValueError, match="align"):
        pyattn.scaled_dot_product_attention_varlen_vjp(q, k, v, cq, ck, enable_gqa=True, align="x")
    # the private entry: seq_align only with packed sequences
    with pytest.raises(ValueError, match="seq_align needs cu_seqlens"):
        pyattn._C.sdpa(q.transpose(1, 0, 2)[:2], k.transpose(1, 0, 2), v.transpose(1, 0, 2), seq_align=True)
