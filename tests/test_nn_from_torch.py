"""Layers built from PyTorch modules (issue 30, item 4): from_torch for
torch.nn.MultiheadAttention and the seed notebooks' classes, outputs equal to
the module's; load_state_dict errors that name the constructor argument; a clear
TypeError for a PyTorch-style m(x, x) (the second array is not a mask)."""
import numpy as np
import pytest

from pyattn import _reference as R
from pyattn.nn import CausalAttention, MultiHeadAttention, SelfAttention
from conftest import check, mag_attention, mag_matmul

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

torch = pytest.importorskip("torch")
nn = torch.nn


def T(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def scale_of(layer, x, H, causal):
    """The error scale of the layer's output (float64 oracle's terms, as in
    test_torch.py): the attention's, through the projections."""
    sd = layer.state_dict()
    B, L = x.shape[:2]
    hd = layer.d_out // H
    heads = lambda t: t.reshape(B, L, H, hd).swapaxes(1, 2)
    q, k, v = (heads(R.linear(x, sd[f"W_{n}.weight"], sd.get(f"W_{n}.bias"))) for n in ("query", "key", "value"))
    _, w = R.scaled_dot_product_attention(q, k, v, is_causal=causal, return_weights=True)
    lin = 4 * max(mag_matmul(np.abs(x), np.abs(sd[f"W_{n}.weight"].T)).max() for n in ("query", "key", "value"))
    att = (mag_attention(q, k, v, w, hd ** -0.5) * (1 + lin) + lin).swapaxes(1, 2).reshape(B, L, layer.d_out)
    if "out_proj.weight" in sd:
        att = mag_matmul(att, np.abs(sd["out_proj.weight"].T)) + 1
    return att


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_multihead_attention(batch_first, bias):
    torch.manual_seed(0)
    E, H, B, L = 24, 4, 3, 7
    t = nn.MultiheadAttention(E, H, dropout=0.25, bias=bias, batch_first=batch_first, dtype=torch.float64)
    layer = MultiHeadAttention.from_torch(t)
    assert (layer.d_in, layer.d_out, layer.num_heads) == (E, E, H)
    assert layer.causal is False and layer.qkv_bias is bias and layer.dropout == 0.25
    assert layer.batch_first is batch_first and layer.training          # the module's mode
    assert (layer.out_proj_bias is not None) is bias
    t.eval()
    layer.eval()
    x = np.random.default_rng(1).standard_normal((B, L, E))
    xin = x if batch_first else x.swapaxes(0, 1)
    with torch.no_grad():
        want = t(T(xin), T(xin), T(xin), need_weights=False)[0].numpy()
    got = layer(xin)
    assert got.shape == want.shape
    # the same layer as built by hand (the path test_torch.py checks against torch)
    hand = MultiHeadAttention(E, E, H, qkv_bias=bias, causal=False, out_bias=bias).load_state_dict(t.state_dict())
    assert np.array_equal(got, hand.eval()(x) if batch_first else hand.eval()(x).swapaxes(0, 1))
    sc = scale_of(layer, x, H, False)
    check(got, want, sc if batch_first else sc.swapaxes(0, 1), inexact=2)
    # weights are (B, H, L, S) whatever the layout, as PyTorch's
    _, w = layer(xin, return_weights=True)
    assert w.shape == (B, H, L, L)


def test_from_torch_seq_first_backward_is_the_batch_first_one():
    torch.manual_seed(0)
    t = nn.MultiheadAttention(8, 2, dtype=torch.float64)               # batch_first=False
    a, b = MultiHeadAttention.from_torch(t), MultiHeadAttention.from_torch(t)
    b.batch_first = True
    x = np.random.default_rng(2).standard_normal((5, 3, 8))           # (T, B, E)
    g = np.random.default_rng(3).standard_normal((5, 3, 8))
    ya, yb = a(x), b(x.swapaxes(0, 1))
    assert np.array_equal(ya, yb.swapaxes(0, 1))
    ga, gb = a.backward(g), b.backward(g.swapaxes(0, 1))
    assert np.array_equal(ga, gb.swapaxes(0, 1))
    assert all(np.array_equal(a.grads[k], b.grads[k]) for k in a.grads)
    a(x)
    with pytest.raises(ValueError, match=r"grad_y has shape \(3, 5, 8\).*\(5, 3, 8\)"):
        a.backward(g.swapaxes(0, 1))


def test_from_torch_rejects_what_pyattn_lacks():
    with pytest.raises(ValueError, match="kdim/vdim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match="MultiHeadAttention.from_torch: Linear is not a module it knows"):
        MultiHeadAttention.from_torch(nn.Linear(3, 3))
    with pytest.raises(TypeError, match="from_torch takes a torch.nn.Module"):
        SelfAttention.from_torch(np.eye(3))


# the seed notebooks' classes (seeds 000 and 004, 001), as written there
class SeedMHA(nn.Module):                        # seed 000 MultiHeadAttention
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, n, _ = x.shape
        split = lambda t: t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        q, k, v = split(self.W_query(x)), split(self.W_key(x)), split(self.W_value(x))
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask.bool()[:n, :n], -torch.inf)
        w = self.dropout(torch.softmax(s / k.shape[-1] ** 0.5, dim=-1))
        return self.out_proj((w @ v).transpose(1, 2).contiguous().view(b, n, self.d_out))


class SeedCausal(nn.Module):                     # seed 004 CausalAttention (its scale: d_out)
    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False):
        super().__init__()
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(context_length, context_length)))

    def forward(self, x):
        n = x.shape[1]
        s = (self.W_query(x) @ self.W_key(x).transpose(1, 2)).masked_fill(self.mask[:n, :n] == 0, -torch.inf)
        return self.dropout(torch.softmax(s / self.d_out ** 0.5, dim=-1)) @ self.W_value(x)


class SeedParameter(nn.Module):                  # seed 001 SelfAttentionParameter
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_q, self.W_k, self.W_v = (nn.Parameter(torch.rand(d_in, d_out, dtype=torch.float64)) for _ in range(3))

    def forward(self, x):
        q, k, v = x.matmul(self.W_q), x.matmul(self.W_k), x.matmul(self.W_v)
        return torch.softmax(q.matmul(k.transpose(-2, -1)) / k.shape[-1] ** 0.5, dim=-1).matmul(v)


class SeedLinear(nn.Module):                     # seed 001 SelfAttentionLinear / seed 004 SelfAttentionV2
    def __init__(self, d_in, d_out, bias=False):
        super().__init__()
        self.W_q = nn.Linear(d_in, d_out, bias=bias)
        self.W_k = nn.Linear(d_in, d_out, bias=bias)
        self.W_v = nn.Linear(d_in, d_out, bias=bias)

    def forward(self, x):
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        return torch.softmax(q.matmul(k.transpose(-2, -1)) / k.shape[-1] ** 0.5, dim=-1).matmul(v)


@pytest.mark.parametrize("kind", ["mha", "mha_bias", "causal", "param", "linear", "linear_bias"])
def test_from_torch_seed_classes(kind):
    torch.manual_seed(0)
    d_in, d_out, L, B = 6, 8, 5, 2
    if kind.startswith("mha"):
        mod, cls, H, causal = SeedMHA(d_in, d_out, 7, 0.0, 2, qkv_bias=kind == "mha_bias"), MultiHeadAttention, 2, True
    elif kind == "causal":
        mod, cls, H, causal = SeedCausal(d_in, d_out, 7, qkv_bias=True), CausalAttention, 1, True
    elif kind == "param":
        mod, cls, H, causal = SeedParameter(d_in, d_out), SelfAttention, 1, False
    else:
        mod, cls, H, causal = SeedLinear(d_in, d_out, bias=kind == "linear_bias"), SelfAttention, 1, False
    mod = mod.double().eval()
    layer = cls.from_torch(mod)
    assert type(layer) is cls and not layer.training and layer.causal == causal
    assert layer.qkv_bias == (kind in ("mha_bias", "causal", "linear_bias"))
    if cls is not SelfAttention:
        assert layer.context_length == 7
    x = np.random.default_rng(4).standard_normal((B, L, d_in))
    with torch.no_grad():
        want = mod(T(x)).numpy()
    check(layer(x), want, scale_of(layer, x, H, causal), inexact=2)


def test_from_torch_seed_mismatches_name_the_fix():
    with pytest.raises(TypeError, match="SelfAttention.from_torch: SeedMHA has an output projection"):
        SelfAttention.from_torch(SeedMHA(4, 4, 3, 0.0, 2))
    with pytest.raises(TypeError, match="no output projection"):
        MultiHeadAttention.from_torch(SeedCausal(4, 4, 3))


def test_load_state_dict_errors_name_the_constructor_argument():
    torch.manual_seed(0)
    t = nn.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match=r"unexpected key 'W_query.bias'.*qkv_bias=True.*from_torch"):
        MultiHeadAttention(8, 8, 2).load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match=r"missing key 'W_query.bias'.*qkv_bias=False"):
        MultiHeadAttention(8, 8, 2, qkv_bias=True).load_state_dict(nn.MultiheadAttention(8, 2, bias=False).state_dict())
    with pytest.raises(ValueError, match=r"unexpected key 'out_proj.bias'.*out_bias=True"):
        MultiHeadAttention(8, 8, 2, qkv_bias=True, out_bias=False).load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match=r"'in_proj_weight' has shape \(24, 8\).*d_in=8, d_out=8"):
        MultiHeadAttention(6, 6, 2, qkv_bias=True).load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match=r"'W_query.weight' has shape \(4, 6\).*d_in=6, d_out=4"):
        SelfAttention(6, 8).load_state_dict({f"W_{n}.weight": np.zeros((4, 6)) for n in ("query", "key", "value")})
    with pytest.raises(ValueError, match=r"'out_proj.weight'.*SelfAttention has no output projection"):
        SelfAttention(8, 8).load_state_dict(SeedMHA(8, 8, 3, 0.0, 2).state_dict())


def test_readme_drop_in_line():
    # README: "weights from PyTorch drop in: MultiHeadAttention.from_torch(torch_module)"
    torch.manual_seed(0)
    torch_module = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    mha = MultiHeadAttention.from_torch(torch_module)
    x = np.random.default_rng(5).standard_normal((2, 6, 32)).astype(np.float32)
    with torch.no_grad():
        want = torch_module(T(x), T(x), T(x), need_weights=False)[0].numpy()
    check(mha(x), want, scale_of(mha, x.astype(np.float64), 4, False), inexact=2)


def test_second_positional_array_is_an_error_not_a_mask():
    m = MultiHeadAttention(8, 8, 2, causal=False, rng=0).eval()
    x = np.random.default_rng(6).standard_normal((2, 5, 8))
    for args in ((x,), (x, x), (x.copy(),), (None, x)):
        with pytest.raises(TypeError, match=r"second input array where a mask belongs.*m\(x, x\) is m\(x\)"):
            m(x, *args)
    # a mask may be positional, as API.md's layer(x, attn_mask=None, return_weights=False) says
    mask = np.tril(np.ones((5, 5), bool))
    assert np.array_equal(m(x, mask), m(x, attn_mask=mask))
    # x of a (T, T)-like shape (d_in == T) passed again is still caught by identity
    m8 = MultiHeadAttention(5, 5, 1, causal=False, rng=0).eval()
    y = np.ones((2, 5, 5))
    with pytest.raises(TypeError, match="mask belongs"):
        m8(y, y)
    mask = np.tril(np.ones((5, 5), bool))
    assert np.array_equal(m(x, attn_mask=mask), MultiHeadAttention(8, 8, 2, rng=0).eval()(x))
    assert np.array_equal(m.forward(x, attn_mask=mask), m(x, attn_mask=mask))


# ---- cross-attention (issue 43 item 11): layer(x, context=ctx) = module(x, ctx, ctx) ----

@pytest.mark.parametrize("batch_first", [True, False])
def test_cross_attention_equals_torch_multihead_attention(batch_first):
    torch.manual_seed(43)
    E, H, B, L, S = 24, 4, 3, 5, 9
    t = nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=torch.float64).eval()
    layer = MultiHeadAttention.from_torch(t).eval()
    rng = np.random.default_rng(43)
    x, c = rng.standard_normal((B, L, E)), rng.standard_normal((B, S, E))
    xin, cin = (x, c) if batch_first else (x.swapaxes(0, 1), c.swapaxes(0, 1))
    mask = rng.random((L, S)) < 0.8
    mask[:, 0] = True
    with torch.no_grad():
        want, ww = t(T(xin), T(cin), T(cin), attn_mask=T(~mask), average_attn_weights=False)
    got, w = layer(xin, mask, True, context=cin)
    assert got.shape == want.shape and w.shape == (B, H, L, S)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-13)
    np.testing.assert_allclose(w, ww.numpy(), rtol=0, atol=1e-14)
    # the causal flag of a seed-style layer is not applied to cross-attention (as PyTorch's)
    causal = MultiHeadAttention(E, E, H, causal=True, rng=0).eval()
    plain = MultiHeadAttention(E, E, H, causal=False, rng=0).eval()
    assert np.array_equal(causal(x, context=c), plain(x, context=c))


def test_cross_attention_backward_equals_torch_autograd():
    torch.manual_seed(44)
    E, H, B, L, S = 16, 2, 2, 4, 6
    t = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    layer = MultiHeadAttention.from_torch(t).train()
    rng = np.random.default_rng(44)
    x = torch.tensor(rng.standard_normal((B, L, E)), requires_grad=True)
    c = torch.tensor(rng.standard_normal((B, S, E)), requires_grad=True)
    y = t(x, c, c, need_weights=False)[0]
    gy = torch.tensor(rng.standard_normal(y.shape))
    y.backward(gy)
    out = layer(x.detach().numpy(), context=c.detach().numpy())
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=0, atol=1e-13)
    gx, gc = layer.backward(gy.numpy())
    np.testing.assert_allclose(gx, x.grad.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(gc, c.grad.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([layer.grads[f"W_{n}.weight"] for n in ("query", "key", "value")]),
                               t.in_proj_weight.grad.numpy(), rtol=0, atol=1e-12)


def test_cross_attention_argument_errors():
    m = MultiHeadAttention(8, 8, 2, rng=0).eval()
    x = np.ones((2, 5, 8))
    with pytest.raises(ValueError, match=r"context must have shape \(B, S, d_in\) with x's batch"):
        m(x, context=np.ones((3, 7, 8)))
    with pytest.raises(ValueError, match="context must have shape"):
        m(x, context=np.ones((2, 7, 4)))
    with pytest.raises(ValueError, match="not available with a cache"):
        m(x[:, :1], context=np.ones((2, 7, 8)), cache=m.new_cache(2, 8))
    with pytest.raises(TypeError, match=r"m\(x, ctx, ctx\) is m\(x, context=ctx\)"):
        m(x, x, x)


def test_from_torch_bfloat16_weights_through_the_bridge():
    """A bfloat16 module's weights are read through the one tensor bridge
    (pyattn/_bridge.py: ml_dtypes' bfloat16, the same bits) and held in
    float32, exactly the module's values (without ml_dtypes: a ValueError
    naming the entry and the fix)."""
    pytest.importorskip("ml_dtypes")
    torch.manual_seed(0)
    t = nn.MultiheadAttention(16, 4, batch_first=True).to(torch.bfloat16).eval()
    layer = MultiHeadAttention.from_torch(t)
    sd = layer.state_dict()
    want = t.in_proj_weight.detach().float().numpy()
    got = np.concatenate([sd[f"W_{n}.weight"] for n in ("query", "key", "value")], axis=0)
    assert got.dtype == np.float32
    assert np.array_equal(got, want)
