"""Gradients against torch.autograd (PyTorch installed: CI requires it via
PYATTN_REQUIRE_TORCH=1). Both sides round: comparisons allow both error
budgets (inexact=2) on the error scales of test_backward.grad_mags."""
import numpy as np
import pytest

import pyattn
from conftest import check
from test_backward import grad_mags
from test_torch import SeedMultiHeadAttention          # the seeds' class, verbatim in behaviour

# CI (.ci/run): PyTorch's comparisons run per family, outside the sanitizers
pytestmark = [pytest.mark.nosan]

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [np.float32, np.float64]


def T(x, grad=False):
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.requires_grad_(True) if grad else t


def torch_grads(q, k, v, go, **kw):
    tq, tk, tv = T(q, True), T(k, True), T(v, True)
    out = F.scaled_dot_product_attention(tq, tk, tv, **kw)
    out.backward(T(go))
    return out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["plain", "causal", "bottom_right", "bool", "float", "broadcast_mask", "scale"])
@pytest.mark.parametrize("L, S, E, Ev", [(1, 1, 1, 1), (3, 17, 64, 3), (17, 3, 17, 17), (64, 64, 64, 64),
                                         (127, 257, 64, 127), (257, 127, 3, 64)])
def test_gradients_vs_torch(rng, dtype, case, L, S, E, Ev):
    q = rng.standard_normal((2, 3, L, E)).astype(dtype)
    k = rng.standard_normal((2, 3, S, E)).astype(dtype)
    v = rng.standard_normal((2, 3, S, Ev)).astype(dtype)
    kw, tkw = {}, {}
    if case == "causal":
        kw["is_causal"] = tkw["is_causal"] = True
    if case == "bottom_right":
        kw["is_causal"] = "bottom_right"
        if S < L:
            pytest.skip("bottom-right rows with no key give NaN in torch")
        tkw["attn_mask"] = T(np.tril(np.ones((L, S), bool), S - L))
    if case in ("bool", "broadcast_mask"):
        m = rng.random((3, L, S) if case == "bool" else (L, 1)) > 0.3
        m = np.broadcast_to(m, (3, L, S)).copy()
        m[..., 0] = True                    # torch gives NaN for rows with no key
        if case == "broadcast_mask":
            m = m[0, :, :1]
        kw["attn_mask"] = m
        tkw["attn_mask"] = T(m)
    if case == "float":
        m = rng.standard_normal((1, 3, L, S)).astype(dtype)
        kw["attn_mask"] = m
        tkw["attn_mask"] = T(m)
    if case == "scale":
        kw["scale"] = tkw["scale"] = 0.29
    go = rng.standard_normal((2, 3, L, Ev)).astype(dtype)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)
    want = torch_grads(q, k, v, go, **tkw)
    sc = kw.get("scale", 1 / np.sqrt(E))
    mags = grad_mags(q, k, v, go, sc, **{n: kw[n] for n in ("attn_mask", "is_causal") if n in kw})
    for g, w, m in zip(got, want[1:], mags):
        check(g, w, m, inexact=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, causal", [(8, 2, False), (4, 1, True), (6, 3, True)])
def test_gqa_gradients_vs_torch(rng, dtype, hq, hkv, causal):
    q = rng.standard_normal((2, hq, 33, 16)).astype(dtype)
    k = rng.standard_normal((2, hkv, 40, 16)).astype(dtype)
    v = rng.standard_normal((2, hkv, 40, 8)).astype(dtype)
    go = rng.standard_normal((2, hq, 33, 8)).astype(dtype)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, is_causal=causal, enable_gqa=True)
    want = torch_grads(q, k, v, go, is_causal=causal, enable_gqa=True)
    for g, w, m in zip(got, want[1:], grad_mags(q, k, v, go, 0.25, enable_gqa=True, is_causal=causal)):
        assert g.shape == w.shape
        check(g, w, m, inexact=2)


def test_structured_options_vs_torch_autograd(rng):
    """Window, ALiBi, softcap and sinks against a few lines of torch (float64)."""
    L, S, E, H = 20, 26, 8, 2
    q = rng.standard_normal((2, H, L, E))
    k = rng.standard_normal((2, H, S, E))
    v = rng.standard_normal((2, H, S, 5))
    go = rng.standard_normal((2, H, L, 5))
    slopes, sinks, cap = np.array([0.3, 0.05]), np.array([0.5, -0.2]), 2.0
    kw = dict(is_causal="bottom_right", window=(7, 0), alibi_slopes=slopes, softcap=cap, sinks=sinks)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)
    tq, tk, tv, ts = T(q, True), T(k, True), T(v, True), T(sinks, True)
    s = cap * torch.tanh((tq @ tk.transpose(-1, -2)) * E ** -0.5 / cap)
    d = torch.arange(L)[:, None] + (S - L)
    j = torch.arange(S)[None, :]
    s = s - T(slopes)[:, None, None] * (d - j).abs()
    s = s.masked_fill(~((j <= d) & (j >= d - 7)), float("-inf"))
    full = torch.cat([s, ts[None, :, None, None].expand(2, H, L, 1)], dim=-1)
    w = torch.softmax(full, dim=-1)[..., :-1]
    out = w @ tv
    out.backward(T(go))
    assert np.allclose(out.detach().numpy(), o, rtol=1e-12, atol=1e-13)
    for g, want in zip(got, (tq.grad, tk.grad, tv.grad, ts.grad)):
        assert np.allclose(g, want.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("d_in, d_out, heads", [(32, 32, 4), (24, 48, 3)])
def test_layer_gradients_vs_seed_class(rng, qkv_bias, d_in, d_out, heads):
    torch.manual_seed(7)
    ref = SeedMultiHeadAttention(d_in, d_out, 12, 0.0, heads, qkv_bias).double()
    layer = pyattn.nn.MultiHeadAttention(d_in, d_out, heads, context_length=12, qkv_bias=qkv_bias)
    layer.load_state_dict(ref.state_dict())
    x = rng.standard_normal((3, 10, d_in))
    tx = T(x, True)
    ty = ref(tx)
    y = layer(x)
    gy = rng.standard_normal(y.shape)
    ty.backward(T(gy))
    gx = layer.backward(gy)
    assert np.allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert np.allclose(gx, tx.grad.numpy(), rtol=1e-11, atol=1e-12)
    tgrads = {k: p.grad.numpy() for k, p in ref.named_parameters()}
    assert set(tgrads) == set(layer.grads)
    for k, g in layer.grads.items():
        assert np.allclose(g, tgrads[k], rtol=1e-11, atol=1e-12), k


@pytest.mark.parametrize("causal", [False, True])
def test_layer_gradients_vs_torch_multiheadattention(rng, causal):
    E, H = 24, 4
    torch.manual_seed(11)
    ref = torch.nn.MultiheadAttention(E, H, bias=True, batch_first=True, dtype=torch.float64)
    layer = pyattn.nn.MultiHeadAttention(E, E, H, qkv_bias=True, causal=causal).load_state_dict(ref.state_dict())
    x = rng.standard_normal((2, 9, E))
    tx = T(x, True)
    mask = torch.triu(torch.ones(9, 9, dtype=torch.bool), 1) if causal else None
    ty, _ = ref(tx, tx, tx, attn_mask=mask, need_weights=False)
    y = layer(x)
    gy = rng.standard_normal(y.shape)
    ty.backward(T(gy))
    gx = layer.backward(gy)
    assert np.allclose(gx, tx.grad.numpy(), rtol=1e-11, atol=1e-12)
    gw = ref.in_proj_weight.grad.numpy()
    gb = ref.in_proj_bias.grad.numpy()
    for i, n in enumerate(("W_query", "W_key", "W_value")):
        assert np.allclose(layer.grads[f"{n}.weight"], gw[i * E:(i + 1) * E], rtol=1e-11, atol=1e-12)
        assert np.allclose(layer.grads[f"{n}.bias"], gb[i * E:(i + 1) * E], rtol=1e-11, atol=1e-12)
    assert np.allclose(layer.grads["out_proj.weight"], ref.out_proj.weight.grad.numpy(), rtol=1e-11, atol=1e-12)
    assert np.allclose(layer.grads["out_proj.bias"], ref.out_proj.bias.grad.numpy(), rtol=1e-11, atol=1e-12)
