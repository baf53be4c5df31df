"""block_mask= on the varlen functions (issue #26, API.md "Programmable masks"):
mask_mod's b is the sequence number and q_idx / kv_idx count from each
sequence's start. Sequence i's result must equal, bit for bit, the dense
call on it alone with its slab's top-left L_i x S_i -- given as that dense
bool mask, and as a BlockMask built for the sequence alone -- forward and
backward; vs the float64 reference; threads; errors that write nothing."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as ref
from pyattn import masks as M
from conftest import DTYPES, check
import varlen_util as vu
from varlen_util import seq

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

BM = pyattn.BlockMask
# empty, one row, a long one crossing tile rows and columns (96 x 60), keys
# without queries, queries without keys, a decode-shaped one (the key-split path)
LQ = [0, 1, 250, 3, 4, 1, 130]
LK = [0, 1, 200, 5, 0, 4100, 190]
H, HKV, E = 4, 2, 16
N = len(LQ)


def packed(rng, dtype):
    return vu.packed(rng, dtype, LQ, LK, H, HKV, E)


def _doc_ids(rng):
    """per-sequence document ids (N, max L): document() with b the sequence"""
    return np.sort(rng.integers(0, 4, (N, max(max(LQ), max(LK)))), axis=1)


def _mods(rng):
    ids = _doc_ids(rng)
    salt = int(rng.integers(1, 1000))
    return {
        "causal": (M.causal, None, None),
        "window_document": (M.and_masks(M.sliding_window(40), M.document(ids[:, :max(LQ)], ids[:, :max(LK)])),
                            N, None),
        "prefix_lm_per_seq": (M.prefix_lm(np.arange(N) * 30), N, None),
        "chunked_causal": (M.chunked_causal(70), None, None),
        "random_per_head": (lambda b, h, q, k: (q * 7919 + k * 104729 + b * 31 + h * 17 + salt) % 11 < 5, N, H),
        "seq_dependent": (lambda b, h, q, k: (q + 2 * k + b) % 3 != 0, N, None),
        "all_empty": (lambda b, h, q, k: np.zeros(np.broadcast_shapes(q.shape, k.shape), bool), None, None),
    }


def _dense_slab(d, i, lq, lk):
    """sequence i's mask from the block mask's dense one d"""
    return d[i if d.shape[0] > 1 else 0, :, :lq, :lk]


def _per_seq_bm(mod, B, Hm, i, lq, lk):
    """the BlockMask of sequence i alone (b fixed at i)"""
    return BM.from_mask_mod(lambda b, h, q, k: mod(np.int64(i if B else 0), h, q, k), None, Hm, lq, lk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["causal", "window_document", "prefix_lm_per_seq", "chunked_causal",
                                  "random_per_head", "seq_dependent", "all_empty"])
def test_forward_bit_identical_per_sequence(rng, dtype, name):
    q, k, v, cq, ck = packed(rng, dtype)
    mod, B, Hm = _mods(rng)[name]
    bm = BM.from_mask_mod(mod, B, Hm, max(LQ), max(LK))
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, block_mask=bm,
                                                        return_lse=True)
    d = bm.to_dense()
    for i in range(N):
        if LQ[i] == 0:
            continue
        qi, ki, vi = seq(q, cq, i), seq(k, ck, i), seq(v, ck, i)
        want = pyattn.scaled_dot_product_attention(qi, ki, vi, enable_gqa=True, return_lse=True,
                                                   attn_mask=_dense_slab(d, i, LQ[i], LK[i]))
        assert np.array_equal(seq(o, cq, i), want[0]), (name, i)
        assert np.array_equal(lse[cq[i]:cq[i + 1]].T, want[1]), (name, i)
        if LK[i]:
            got = pyattn.scaled_dot_product_attention(qi, ki, vi, enable_gqa=True,
                                                      block_mask=_per_seq_bm(mod, B, Hm, i, LQ[i], LK[i]))
            assert np.array_equal(seq(o, cq, i), got), (name, i)
    w = ref.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, block_mask=bm)
    check(o, w, 1.0 + np.abs(w), inexact=2)
    if name == "all_empty":
        assert not o.any() and np.isneginf(lse).all()


@pytest.mark.parametrize("options", [{}, {"is_causal": True}, {"is_causal": "bottom_right", "softcap": 2.0},
                                     {"window": (30, 10), "alibi_slopes": np.linspace(0.1, 1, H)},
                                     {"sinks": np.array([0.5, -1.0, 2.0, 0.0])}])
def test_backward_bit_identical_per_sequence(rng, options):
    q, k, v, cq, ck = packed(rng, np.float64)
    mod, B, Hm = _mods(rng)["window_document"]
    bm = BM.from_mask_mod(mod, B, Hm, max(LQ), max(LK))
    kw = dict(enable_gqa=True, block_mask=bm, **options)
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, return_lse=True, **kw)
    go = rng.standard_normal(o.shape)
    g = pyattn.scaled_dot_product_attention_varlen_backward(go, q, k, v, o, lse, cq, ck, **kw)
    d = bm.to_dense()
    ds = 0.0
    for i in range(N):
        qi, ki, vi = seq(q, cq, i), seq(k, ck, i), seq(v, ck, i)
        dkw = dict(options, enable_gqa=True, attn_mask=_dense_slab(d, i, LQ[i], LK[i]))
        od, ld = pyattn.scaled_dot_product_attention(qi, ki, vi, return_lse=True, **dkw)
        assert np.array_equal(seq(o, cq, i), od)
        gd = pyattn.scaled_dot_product_attention_backward(seq(go, cq, i), qi, ki, vi, od, ld, **dkw)
        for a, b, c in ((g[0], gd[0], cq), (g[1], gd[1], ck), (g[2], gd[2], ck)):
            assert np.array_equal(seq(a, c, i), b), i
        if "sinks" in options:
            ds = ds + gd[3]
    if "sinks" in options:
        assert np.array_equal(g[3], ds)
    out, back = pyattn.scaled_dot_product_attention_varlen_vjp(q, k, v, cq, ck, **kw)
    assert np.array_equal(out, o)
    for a, b in zip(back(go), g):
        assert np.array_equal(a, b)


def test_threads_bit_identical():
    rng = np.random.default_rng(5)
    q, k, v, cq, ck = packed(rng, np.float32)
    mod, B, Hm = _mods(rng)["random_per_head"]
    bm = BM.from_mask_mod(mod, B, Hm, max(LQ), max(LK))
    go = rng.standard_normal((cq[-1], H, E)).astype(np.float32)
    vu.assert_threads_bit_identical(q, k, v, cq, ck, go, enable_gqa=True, is_causal=True, block_mask=bm,
                                    dropout_p=0.2, rng=9)


def test_errors_write_nothing(rng):
    q, k, v, cq, ck = packed(rng, np.float32)
    f = pyattn.scaled_dot_product_attention_varlen
    out = np.full((cq[-1], H, E), 7.0, np.float32)
    cases = [
        (TypeError, "block_mask must be a pyattn.BlockMask", np.ones((max(LQ), max(LK)), bool)),
        (ValueError, "cover the longest sequence", BM.from_mask_mod(M.causal, None, None, max(LQ) - 1, max(LK))),
        (ValueError, "cover the longest sequence", BM.from_mask_mod(M.causal, None, None, max(LQ), max(LK) - 1)),
        (ValueError, r"\(sequences, query heads\)", BM.from_mask_mod(M.causal, N + 1, None, max(LQ), max(LK))),
        (ValueError, r"\(sequences, query heads\)", BM.from_mask_mod(M.causal, None, HKV, max(LQ), max(LK))),
    ]
    for exc, msg, bm in cases:
        with pytest.raises(exc, match=msg):
            f(q, k, v, cq, ck, enable_gqa=True, block_mask=bm, out=out)
        assert (out == 7.0).all()
        o, lse = f(q, k, v, cq, ck, enable_gqa=True, return_lse=True)
        with pytest.raises(exc, match=msg):
            pyattn.scaled_dot_product_attention_varlen_backward(o, q, k, v, o, lse, cq, ck, enable_gqa=True,
                                                                block_mask=bm)


def test_larger_mask_and_no_sequences(rng):
    """a block mask larger than every sequence reads each one's top-left
    corner; no sequences at all is fine"""
    q, k, v, cq, ck = packed(rng, np.float64)
    big = BM.from_mask_mod(M.sliding_window(25, 3), None, None, 1000, 5000)
    fit = BM.from_mask_mod(M.sliding_window(25, 3), None, None, max(LQ), max(LK))
    a = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, block_mask=big)
    b = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, block_mask=fit)
    c = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, window=(25, 3))
    assert np.array_equal(a, b) and np.array_equal(a, c)
    e = np.zeros((0, H, E))
    o = pyattn.scaled_dot_product_attention_varlen(e, e, e, [0], [0], block_mask=big)
    assert o.shape == (0, H, E)
