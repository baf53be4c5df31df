"""Block masks against PyTorch (issue #26): F.scaled_dot_product_attention
with the dense mask, and FlexAttention's flex_attention with the same
mask_mod (eager on the CPU: slow, a few seconds; skipped with the reason
where this torch cannot run it). Apart from tests/test_blockmask.py so CI
runs it once, not once per kernel family."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from pyattn import masks as M
from conftest import check, mag_attention

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

BM = pyattn.BlockMask


def test_vs_torch():
    """F.scaled_dot_product_attention with the dense mask, and flex_attention
    (eager, CPU) with the same mask_mod where this torch runs it."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 2, 256, 32)) for _ in range(3))
    ids = np.arange(256) // 100
    bm = BM.from_mask_mod(M.and_masks(M.causal, M.document(ids)), None, None, 256, 256)
    o = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm)
    t = [torch.from_numpy(x) for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*t, attn_mask=torch.from_numpy(bm.to_dense())).numpy()
    w = R.scaled_dot_product_attention(q, k, v, block_mask=bm, return_weights=True)[1]
    check(o, ref, mag_attention(q, k, v, w, 32 ** -0.5), inexact=2)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        tid = torch.from_numpy(ids)

        def doc_causal(b, h, qi, ki):
            return (qi >= ki) & (tid[qi] == tid[ki])
        fbm = create_block_mask(doc_causal, None, None, 256, 256, device="cpu")
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fo = flex_attention(*t, block_mask=fbm).numpy()
    except Exception as exc:  # pragma: no cover - depends on the torch build
        pytest.skip(f"flex_attention does not run on this CPU / torch: {exc}")
    check(o, fo, mag_attention(q, k, v, w, 32 ** -0.5), inexact=2)


def test_varlen_vs_torch_dense_mask(rng):
    """block_mask= on the varlen function against F.scaled_dot_product_attention
    per sequence with the sequence's dense mask (rows with no key left are 0
    in pyattn, NaN in torch)"""
    torch = pytest.importorskip("torch")
    from test_blockmask_varlen import LK, LQ, N, _dense_slab, _mods, packed, seq
    q, k, v, cq, ck = packed(rng, np.float64)
    mod, B, Hm = _mods(rng)["window_document"]
    bm = BM.from_mask_mod(mod, B, Hm, max(LQ), max(LK))
    o = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, enable_gqa=True, block_mask=bm)
    d = bm.to_dense()
    for i in range(N):
        if LQ[i] == 0 or LK[i] == 0:
            continue
        m = _dense_slab(d, i, LQ[i], LK[i])
        t = [torch.from_numpy(np.ascontiguousarray(seq(x, c, i))) for x, c in ((q, cq), (k, ck), (v, ck))]
        want = torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=torch.from_numpy(m),
                                                                enable_gqa=True).numpy()
        want = np.where(m.any(-1, keepdims=True), want, 0.0)
        np.testing.assert_allclose(seq(o, cq, i), want, rtol=1e-12, atol=1e-12)


# ---- FlexAttention habits (issue 43 item 9) ----

def _flex_doc_mask(torch):
    """FlexAttention's document-causal mask_mod: closes over a torch tensor and
    uses torch's and_masks (torch ops on its index tensors)."""
    from torch.nn.attention.flex_attention import and_masks
    docs = torch.tensor([0] * 70 + [1] * 60 + [2] * 70)

    def doc(b, h, q_idx, kv_idx):
        return docs[q_idx] == docs[kv_idx]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    d = docs.numpy()
    return and_masks(causal, doc), (d[:, None] == d[None, :]) & np.tri(200, dtype=bool)


def test_mask_mod_of_torch_tensors_and_ops():
    torch = pytest.importorskip("torch")
    mm, dense = _flex_doc_mask(torch)
    bm = BM.from_mask_mod(mm, None, None, 200, 200)
    assert np.array_equal(bm.to_dense()[0, 0], dense)
    assert bm == BM.from_mask_mod(M.and_masks(M.causal, M.document(np.repeat([0, 1, 2], [70, 60, 70]))),
                                  None, None, 200, 200)


def test_pytorch_block_mask_is_rebuilt_from_its_mask_mod():
    torch = pytest.importorskip("torch")
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    mm, dense = _flex_doc_mask(torch)
    tbm = fa.create_block_mask(mm, None, None, 200, 200, device="cpu")
    q, k, v = (np.random.default_rng(i).standard_normal((1, 2, 200, 16)).astype(np.float32) for i in range(3))
    want = pyattn.scaled_dot_product_attention(q, k, v, block_mask=BM.from_mask_mod(mm, None, None, 200, 200))
    assert np.array_equal(pyattn.scaled_dot_product_attention(q, k, v, block_mask=tbm), want)
    check(want, pyattn.scaled_dot_product_attention(q, k, v, dense), 4 * np.abs(v).max())
    da = pytest.importorskip("dask.array")
    from pyattn import dask as pdask
    arrays = [da.from_array(x, chunks=(1, 2, 100, 16)) for x in (q, k, v)]
    got = pdask.scaled_dot_product_attention(*arrays, block_mask=tbm).compute(scheduler="synchronous")
    mine = pdask.scaled_dot_product_attention(*arrays, block_mask=BM.from_mask_mod(mm, None, None, 200, 200))
    assert np.array_equal(got, mine.compute(scheduler="synchronous"))     # the same graph, the same bits
    blocks = fa.BlockMask.from_kv_blocks(tbm.kv_num_blocks, tbm.kv_indices)     # no mask_mod to rebuild from
    with pytest.raises(TypeError, match="without a mask_mod.*pyattn.BlockMask.from_mask_mod"):
        pyattn.scaled_dot_product_attention(q, k, v, block_mask=blocks)
    with pytest.raises(TypeError, match="block_mask must be a pyattn.BlockMask .* or PyTorch's"):
        pyattn.scaled_dot_product_attention(q, k, v, block_mask=dense)


def test_torch_sdpa_takes_block_mask():
    torch = pytest.importorskip("torch")
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    import pyattn.torch as pt
    mm, dense = _flex_doc_mask(torch)
    bm = BM.from_mask_mod(mm, None, None, 200, 200)
    tbm = fa.create_block_mask(mm, None, None, 200, 200, device="cpu")
    g = torch.Generator().manual_seed(43)
    q, k, v = (torch.randn(1, 2, 200, 16, generator=g, requires_grad=True) for _ in range(3))
    o = pt.scaled_dot_product_attention(q, k, v, block_mask=bm)
    assert torch.equal(pt.scaled_dot_product_attention(q, k, v, block_mask=tbm), o)
    want = pyattn.scaled_dot_product_attention(*(t.detach().numpy() for t in (q, k, v)), block_mask=bm)
    assert np.array_equal(o.detach().numpy(), want)
    go = torch.randn_like(o, generator=g)
    got = torch.autograd.grad(o, (q, k, v), go)                 # the backward sees the block mask too
    ref = pyattn.scaled_dot_product_attention_backward(
        go.numpy(), *(t.detach().numpy() for t in (q, k, v)), o.detach().numpy(),
        pyattn.scaled_dot_product_attention(*(t.detach().numpy() for t in (q, k, v)), block_mask=bm,
                                            return_lse=True)[1], block_mask=bm)
    for a, b in zip(got, ref):
        assert np.array_equal(a.numpy(), b)
    c = torch.compile(lambda q, k, v: pt.scaled_dot_product_attention(q, k, v, block_mask=bm),
                      fullgraph=True, backend="aot_eager")
    assert torch.equal(c(q, k, v), o)
