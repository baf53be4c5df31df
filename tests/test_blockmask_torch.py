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
