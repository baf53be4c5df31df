"""pyattn.torch.scaled_dot_product_attention without the custom op's dispatch
when nothing needs it (plain CPU tensors, no gradient wanted, no autocast,
compile, mode or functorch transform): the same bits as through the op."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import pyattn.torch as pt  # noqa: E402

pytestmark = [pytest.mark.nosan]


def _via_op(monkeypatch, *a, **k):
    with monkeypatch.context() as m:
        m.setattr(pt, "_plain", lambda *ts: False)
        return pt.scaled_dot_product_attention(*a, **k)


CASES = [((1, 8, 1, 64), (1, 2, 64, 64), True), ((2, 4, 5, 16), (2, 4, 9, 16), False),
         ((3, 7, 8), (3, 11, 8), False), ((2, 6, 3, 32), (2, 2, 3, 32), True)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("opts", [dict(), dict(is_causal=True, return_lse=True),
                                  dict(window=(2, None), softcap=4.0, scale=0.5)])
def test_plain_tensors_skip_the_op_with_the_same_bits(monkeypatch, dtype, case, opts):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    qs, ks, gqa = CASES[case]
    g = torch.Generator().manual_seed(case)
    dt = getattr(torch, dtype)
    q = torch.randn(qs, generator=g).to(dt)
    k = torch.randn(ks, generator=g).to(dt)
    v = torch.randn(ks, generator=g).to(dt)
    calls = []
    real = pt._api.scaled_dot_product_attention
    monkeypatch.setattr(pt._api, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = pt.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, **opts)
    assert calls, "the plain call did not take the NumPy entry"
    n = len(calls)
    with torch.inference_mode():
        inf = pt.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, **opts)
    assert len(calls) == n + 1
    want = _via_op(monkeypatch, q, k, v, enable_gqa=gqa, **opts)
    for res in (got, inf):
        a = res if isinstance(res, tuple) else (res,)
        b = want if isinstance(want, tuple) else (want,)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert np.array_equal(x.view(torch.int16).numpy() if x.dtype == torch.bfloat16 else x.numpy(),
                                  y.view(torch.int16).numpy() if y.dtype == torch.bfloat16 else y.numpy())


def test_gradients_autocast_and_vmap_still_go_through_the_op(monkeypatch):
    q = torch.randn(2, 3, 4, 8, requires_grad=True)
    k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    assert not pt._plain(q, k, v)
    out = pt.scaled_dot_product_attention(q, k, v)
    assert out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None
    with torch.no_grad():
        assert pt._plain(q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not pt._plain(q.detach(), k, v)
    seen = []
    torch.vmap(lambda x: seen.append(pt._plain(x)) or x)(k)
    assert seen == [False]
