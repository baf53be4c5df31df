"""Packed sequences (varlen): each sequence bit-identical to the dense call on
it alone, forward and backward; vs the float64 reference and PyTorch; every
option; packed arrays in any layout; thread counts; bad cu_seqlens."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as ref
from conftest import DTYPES, check, mag_attention
import varlen_util as vu
from varlen_util import seq

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]

# 0, 1, odd, one long among short, a decode-shaped one (L = 1, S >= 4096: the
# dense op's key-split path), an empty query against keys, queries without keys
LQ = [0, 1, 7, 130, 3, 1, 2, 5]
LK = [0, 1, 7, 130, 3, 4100, 0, 9]
H, HKV, E = 4, 2, 16


def packed(rng, dtype, lq=LQ, lk=LK, hq=H, hkv=HKV, e=E):
    return vu.packed(rng, dtype, lq, lk, hq, hkv, e)


OPTIONS = {
    "plain": {},
    "causal": {"is_causal": True},
    "bottom_right": {"is_causal": "bottom_right"},
    "window": {"is_causal": True, "window": (3, 0)},
    "window_both": {"window": (2, 5)},
    "alibi": {"alibi_slopes": np.linspace(0.1, 1.0, H)},
    "softcap": {"softcap": 3.0, "scale": 0.7},
    "sinks": {"sinks": np.array([0.5, -1.0, 2.0, 0.0])},
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_sequence_bit_identical_to_dense(rng, dtype, name):
    q, k, v, cq, ck = packed(rng, dtype)
    kw = OPTIONS[name]
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, return_lse=True, **kw)
    assert o.shape == (cq[-1], H, E) and lse.shape == (cq[-1], H) and o.dtype == dtype
    for i in range(len(LQ)):
        od, ld = pyattn.scaled_dot_product_attention(seq(q, cq, i), seq(k, ck, i), seq(v, ck, i),
                                                     enable_gqa=True, return_lse=True, **kw)
        assert np.array_equal(seq(o, cq, i), od), (name, i)
        assert np.array_equal(lse[cq[i]:cq[i + 1]].T, ld), (name, i)
    want = ref.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, **kw)
    for i in range(len(LQ)):        # the error scale per sequence, from the oracle's weights
        if LQ[i] == 0 or LK[i] == 0:
            assert np.array_equal(seq(o, cq, i), seq(want, cq, i))
            continue
        qi, ki, vi = seq(q, cq, i), np.repeat(seq(k, ck, i), 2, 0), np.repeat(seq(v, ck, i), 2, 0)
        _, w = ref.scaled_dot_product_attention(qi, ki, vi, return_weights=True, **kw)
        check(seq(o, cq, i), seq(want, cq, i), mag_attention(qi, ki, vi, w, kw.get("scale", E ** -0.5)))


def test_alibi_per_sequence_and_16bit(rng):
    q, k, v, cq, ck = packed(rng, np.float16)
    sl = rng.uniform(0.1, 1.0, (len(LQ), H))
    o = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, alibi_slopes=sl, is_causal=True)
    assert o.dtype == np.float32
    for i in range(len(LQ)):
        od = pyattn.scaled_dot_product_attention(seq(q, cq, i), seq(k, ck, i), seq(v, ck, i), enable_gqa=True,
                                                 alibi_slopes=sl[i], is_causal=True)
        assert np.array_equal(seq(o, cq, i), od), i
    out16 = np.full(o.shape, 7, np.float16)
    r = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, alibi_slopes=sl,
                                                   is_causal=True, out=out16)
    assert r is out16 and np.array_equal(out16, o.astype(np.float16))


def test_bf16_precision_bit_identical(rng):
    q, k, v, cq, ck = packed(rng, np.float32)
    o = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, is_causal=True,
                                                   precision="bf16")
    for i in range(len(LQ)):
        od = pyattn.scaled_dot_product_attention(seq(q, cq, i), seq(k, ck, i), seq(v, ck, i), enable_gqa=True,
                                                 is_causal=True, precision="bf16")
        assert np.array_equal(seq(o, cq, i), od), i


@pytest.mark.parametrize("layout", ["reversed", "strided", "head_major"])
def test_packed_layouts_read_in_place(rng, layout):
    q, k, v, cq, ck = packed(rng, np.float64)
    want = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, is_causal=True)

    def lay(x):
        if layout == "reversed":          # negative strides on every axis
            return np.ascontiguousarray(x[::-1, ::-1, ::-1])[::-1, ::-1, ::-1]
        if layout == "strided":
            big = np.zeros((x.shape[0], x.shape[1] * 2, x.shape[2] * 3), x.dtype)
            big[:, ::2, ::3] = x
            return big[:, ::2, ::3]
        return np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    qs, ks, vs = lay(q), lay(k), lay(v)
    assert not qs.flags.c_contiguous
    got = pyattn.scaled_dot_product_attention_varlen(qs, ks, vs, cq, ck, enable_gqa=True, is_causal=True)
    assert np.array_equal(got, want)
    g1 = pyattn.scaled_dot_product_attention_varlen_vjp(q, k, v, cq, ck, enable_gqa=True)[1](np.ones_like(want))
    g2 = pyattn.scaled_dot_product_attention_varlen_vjp(qs, ks, vs, cq, ck, enable_gqa=True)[1](np.ones_like(want))
    for a, b in zip(g1, g2):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("name", ["plain", "causal", "window", "sinks", "softcap", "alibi"])
def test_backward_bit_identical_to_dense(rng, name):
    q, k, v, cq, ck = packed(rng, np.float64)
    kw = OPTIONS[name]
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, return_lse=True, **kw)
    go = rng.standard_normal(o.shape)
    g = pyattn.scaled_dot_product_attention_varlen_backward(go, q, k, v, o, lse, cq, ck, enable_gqa=True, **kw)
    assert [x.shape for x in g[:3]] == [q.shape, k.shape, v.shape]
    ds = 0.0
    for i in range(len(LQ)):
        qi, ki, vi = seq(q, cq, i), seq(k, ck, i), seq(v, ck, i)
        od, ld = pyattn.scaled_dot_product_attention(qi, ki, vi, enable_gqa=True, return_lse=True, **kw)
        gd = pyattn.scaled_dot_product_attention_backward(seq(go, cq, i), qi, ki, vi, od, ld, enable_gqa=True, **kw)
        for a, b, c in ((g[0], gd[0], cq), (g[1], gd[1], ck), (g[2], gd[2], ck)):
            assert np.array_equal(seq(a, c, i), b), (name, i)
        if "sinks" in kw:
            ds = ds + gd[3]
    if "sinks" in kw:
        assert np.array_equal(g[3], ds)
    _, back = pyattn.scaled_dot_product_attention_varlen_vjp(q, k, v, cq, ck, enable_gqa=True, **kw)
    for a, b in zip(back(go), g):
        assert np.array_equal(a, b)


def test_threads_bit_identical():
    rng = np.random.default_rng(3)
    q, k, v, cq, ck = packed(rng, np.float32)
    go = rng.standard_normal((cq[-1], H, E)).astype(np.float32)
    vu.assert_threads_bit_identical(q, k, v, cq, ck, go, enable_gqa=True, is_causal=True,
                                    sinks=np.ones(H, np.float32), dropout_p=0.2, rng=9)


def test_dropout_reproducible_per_sequence(rng):
    lq = lk = [5, 5, 3, 8]
    q, k, v, cq, ck = packed(rng, np.float64, lq, lk, 2, 2, 8)
    o = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, dropout_p=0.4, rng=11)
    for i in range(len(lq)):       # the dense call's batch entry i, same seed
        qi = seq(q, cq, i)
        od = pyattn.scaled_dot_product_attention(np.broadcast_to(qi, (i + 1,) + qi.shape), seq(k, ck, i),
                                                 seq(v, ck, i), dropout_p=0.4, rng=11)[i]
        assert np.array_equal(seq(o, cq, i), od), i
    key = np.random.default_rng(11).integers(0, 2**64, dtype=np.uint64)
    want = ref.scaled_dot_product_attention_varlen(q, k, v, cq, ck, dropout_p=0.4, dropout_key=int(key))
    np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12)
    # two equal sequences with equal inputs get different masks
    q2, k2, v2 = (np.concatenate([x[:5], x[:5]]) for x in (q, k, v))
    o2 = pyattn.scaled_dot_product_attention_varlen(q2, k2, v2, [0, 5, 10], [0, 5, 10], dropout_p=0.4, rng=11)
    assert not np.array_equal(o2[:5], o2[5:])


def test_vs_torch_with_autograd(rng):
    torch = pytest.importorskip("torch")
    lq, lk = [1, 6, 0, 9], [3, 6, 2, 9]
    q, k, v, cq, ck = packed(rng, np.float64, lq, lk, 4, 2, 8)
    kw = dict(is_causal="bottom_right", enable_gqa=True)
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, return_lse=True, **kw)
    go = rng.standard_normal(o.shape)
    g = pyattn.scaled_dot_product_attention_varlen_backward(go, q, k, v, o, lse, cq, ck, **kw)
    for i in range(len(lq)):
        if lq[i] == 0:
            continue
        t = [torch.tensor(np.ascontiguousarray(seq(x, c, i)), requires_grad=True)
             for x, c in ((q, cq), (k, ck), (v, ck))]
        L, S = lq[i], lk[i]
        mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)
        ot = torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=mask, enable_gqa=True)
        ot.backward(torch.tensor(np.ascontiguousarray(seq(go, cq, i))))
        np.testing.assert_allclose(seq(o, cq, i), ot.detach().numpy(), rtol=1e-12, atol=1e-12)
        for a, c, tt in ((g[0], cq, t[0]), (g[1], ck, t[1]), (g[2], ck, t[2])):
            np.testing.assert_allclose(seq(a, c, i), tt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bad, where, pos", [
    ([1, 5, 10, 17], "cu_seqlens_q", 0),
    ([0, 5, 4, 17], "cu_seqlens_q", 2),
    ([0, 5, 10, 16], "cu_seqlens_q", 3),
    ([0, 5, 18, 17], "cu_seqlens_q", 2),
    ([0, -1, 10, 17], "cu_seqlens_q", 1),
])
def test_bad_cu_seqlens_name_the_position_and_write_nothing(rng, bad, where, pos):
    q, k, v, cq, ck = packed(rng, np.float32, [5, 5, 7], [5, 5, 7], 2, 2, 8)
    out = np.full((17, 2, 8), 3.0, np.float32)
    with pytest.raises(ValueError, match=rf"{where}.*position {pos}\b"):
        pyattn.scaled_dot_product_attention_varlen(q, k, v, np.array(bad), ck, out=out)
    with pytest.raises(ValueError, match=rf"cu_seqlens_k.*position {pos}\b"):
        pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, np.array(bad), out=out)
    assert (out == 3.0).all()


def test_other_errors(rng):
    q, k, v, cq, ck = packed(rng, np.float32, [5, 5], [5, 5], 2, 1, 8)
    f = pyattn.scaled_dot_product_attention_varlen
    with pytest.raises(ValueError, match="cu_seqlens_q has 2 sequences and cu_seqlens_k 1"):
        f(q, k, v, cq, [0, 10], enable_gqa=True)
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        f(q, k, v, cq.astype(float), ck, enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        f(q, k, v, cq, ck)
    with pytest.raises(ValueError, match="query must be 3-D"):
        f(q[0], k, v, cq, ck)
    with pytest.raises(ValueError, match="alibi_slopes"):
        f(q, k, v, cq, ck, enable_gqa=True, alibi_slopes=np.ones((3, 2)))
    out = np.zeros((10, 2, 8), np.float32)
    with pytest.raises(ValueError, match="out"):
        f(q, k, v, cq, ck, enable_gqa=True, out=out[:9])
    o, lse = f(q, k, v, cq, ck, enable_gqa=True, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        pyattn.scaled_dot_product_attention_varlen_backward(o, q, k, v, o, lse.T, cq, ck, enable_gqa=True)


def test_empty_calls(rng):
    q = np.zeros((0, 2, 4)); k = np.zeros((3, 2, 4))
    o = pyattn.scaled_dot_product_attention_varlen(q, q, q, [0], [0])
    assert o.shape == (0, 2, 4)
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, k, [0, 0, 0], [0, 3, 3], return_lse=True)
    assert o.shape == (0, 2, 4) and lse.shape == (0, 2)
    q1 = np.ones((2, 2, 4))
    o, lse = pyattn.scaled_dot_product_attention_varlen(q1, k, k, [0, 2], [0, 3],
                                                        return_lse=True)
    assert np.isfinite(o).all()
    o, lse = pyattn.scaled_dot_product_attention_varlen(q1, k[:0], k[:0], [0, 2], [0, 0], return_lse=True)
    assert (o == 0).all() and (lse == -np.inf).all()


def _sweep(call, watched):
    """Make allocation 1, 2, ... of call() fail, one per run: each failure is a
    MemoryError with the watched arrays unchanged and no C block left."""
    from pyattn import _C
    live0 = _C._alloc_hook(0)[1]
    n = 0
    while True:
        n += 1
        before = [w.tobytes() for w in watched]
        _C._alloc_hook(n)
        try:
            call()
        except MemoryError:
            pending, live = _C._alloc_hook(0)
            assert pending == 0 and live == live0
            assert [w.tobytes() for w in watched] == before, f"written before allocation {n} failed"
            continue
        pending, live = _C._alloc_hook(0)
        assert pending > 0 and live == live0
        return n - 1


@pytest.mark.parametrize("bf16", [False, True])
def test_allocation_failures_write_nothing(rng, bf16):
    q, k, v, cq, ck = packed(rng, np.float32)
    kw = dict(enable_gqa=True, is_causal=True, sinks=np.ones(H))
    out = np.zeros((cq[-1], H, E), np.float32)
    f = pyattn.scaled_dot_product_attention_varlen
    assert _sweep(lambda: f(q, k, v, cq, ck, out=out, return_lse=True,
                            precision="bf16" if bf16 else None, **kw), (q, k, v, out)) >= 3
    if not bf16:
        o, lse = f(q, k, v, cq, ck, return_lse=True, **kw)
        assert _sweep(lambda: pyattn.scaled_dot_product_attention_varlen_backward(o, q, k, v, o, lse, cq, ck, **kw),
                      (q, k, v, o, lse)) >= 4


def test_hypothesis_random_packings_match_dense():
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.settings(max_examples=25, deadline=None)
    @hyp.given(lq=st.lists(st.integers(0, 70), min_size=0, max_size=5), data=st.data(),
               causal=st.sampled_from([False, True, "bottom_right"]), dt=st.sampled_from(DTYPES))
    def run(lq, data, causal, dt):
        lk = [data.draw(st.integers(0, 70)) for _ in lq]
        r = np.random.default_rng(len(lq))
        q, k, v, cq, ck = packed(r, dt, lq, lk, 2, 1, 8)
        o = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, is_causal=causal, enable_gqa=True)
        for i in range(len(lq)):
            if lk[i] == 0 and lq[i] > 0:
                assert (seq(o, cq, i) == 0).all()
                continue
            od = pyattn.scaled_dot_product_attention(seq(q, cq, i), seq(k, ck, i), seq(v, ck, i),
                                                     is_causal=causal, enable_gqa=True)
            assert np.array_equal(seq(o, cq, i), od)
    run()
