"""pyattn against PyTorch, when it is installed (never a hard dependency).

Both sides round: a comparison allows both error budgets (inexact=2)."""
import numpy as np
import pytest

import pyattn
from pyattn.nn import MultiHeadAttention, SelfAttention
from conftest import DTYPES, check, mag_attention, mag_matmul, mag_softmax

# CI (.ci/run): PyTorch's comparisons run per family, outside the sanitizers
pytestmark = [pytest.mark.nosan]

torch = pytest.importorskip("torch")
F = torch.nn.functional
TDT = {np.float32: torch.float32, np.float64: torch.float64}


def T(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _ref_w(q, k, scale, mask=None, causal=False):
    from pyattn import _reference as R
    s = np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2).astype(np.float64)) * scale
    return R.softmax(s, attn_mask=mask, is_causal=causal), s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["plain", "causal", "bool", "float", "bool_causal", "scale"])
@pytest.mark.parametrize("L, S, E", [(1, 1, 8), (17, 17, 64), (64, 130, 32), (127, 127, 80)])
def test_sdpa_vs_torch(rng, dtype, case, L, S, E):
    q = rng.standard_normal((2, 3, L, E)).astype(dtype)
    k = rng.standard_normal((2, 3, S, E)).astype(dtype)
    v = rng.standard_normal((2, 3, S, 24)).astype(dtype)
    mask, causal, scale = None, False, None
    if case in ("causal", "bool_causal"):
        causal = True
    if case in ("bool", "bool_causal"):
        mask = rng.random((L, S)) > 0.3
        mask[:, 0] = True                  # torch gives NaN for rows with no key; keep one
    if case == "float":
        mask = rng.standard_normal((3, L, S)).astype(dtype)
    if case == "scale":
        scale = 0.37
    got = pyattn.scaled_dot_product_attention(q, k, v, mask, is_causal=causal, scale=scale)
    if mask is not None and causal:       # torch takes one or the other: intersect by hand
        tmask, tcausal = T(mask & np.tril(np.ones((L, S), bool))), False
    else:
        tmask, tcausal = (None if mask is None else T(mask)), causal
    want = F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=tmask, is_causal=tcausal,
                                          scale=scale).numpy()
    sc = scale if scale is not None else 1 / np.sqrt(E)
    w, _ = _ref_w(q, k, sc, mask, causal)
    check(got, want, mag_attention(q, k, v, w, sc), inexact=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv", [(8, 2), (4, 1), (6, 3)])
def test_sdpa_gqa_vs_torch(rng, dtype, hq, hkv):
    q = rng.standard_normal((2, hq, 20, 16)).astype(dtype)
    k = rng.standard_normal((2, hkv, 33, 16)).astype(dtype)
    v = rng.standard_normal((2, hkv, 33, 8)).astype(dtype)
    got = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = F.scaled_dot_product_attention(T(q), T(k), T(v), is_causal=True, enable_gqa=True).numpy()
    kk, vv = np.repeat(k, hq // hkv, 1), np.repeat(v, hq // hkv, 1)
    w, _ = _ref_w(q, kk, 0.25, causal=True)
    check(got, want, mag_attention(q, kk, vv, w, 0.25), inexact=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_vs_torch(rng, dtype, dim):
    x = (rng.standard_normal((5, 7, 33)) * 5).astype(dtype)
    x[1, 2, :2] = -np.inf              # (torch gives NaN for an all-masked row; pyattn 0)
    got = pyattn.softmax(x, axis=dim)
    want = torch.softmax(T(x), dim=dim).numpy()
    s = np.moveaxis(x.astype(np.float64), dim, -1)
    check(got, want, np.moveaxis(mag_softmax(s, np.moveaxis(want, dim, -1)), -1, dim), inexact=2)
    tril = np.tril(np.ones((7, 33)))
    masked = torch.softmax(T(x).masked_fill(T(tril) == 0, float("-inf")), dim=-1).numpy()
    s = np.where(tril == 1, x.astype(np.float64), -np.inf)
    check(pyattn.softmax(x, is_causal=True), masked, mag_softmax(s, masked), inexact=2)


def test_matmul_vs_torch(rng):
    a = rng.standard_normal((3, 1, 40, 70)).astype(np.float32)
    b = rng.standard_normal((5, 70, 33)).astype(np.float32)
    check(pyattn.matmul(a, b), torch.matmul(T(a), T(b)).numpy(), mag_matmul(a, b), inexact=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_torch_multihead_attention_state_dict(rng, dtype, causal):
    torch.manual_seed(0)
    E, H, B, Tn = 48, 6, 3, 11
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=TDT[dtype]).eval()
    layer = MultiHeadAttention(E, E, H, qkv_bias=True, causal=causal).load_state_dict(ref.state_dict()).eval()
    x = rng.standard_normal((B, Tn, E)).astype(dtype)
    mask = torch.triu(torch.ones(Tn, Tn, dtype=torch.bool), diagonal=1) if causal else None   # True = masked
    with torch.no_grad():
        want, want_w = ref(T(x), T(x), T(x), attn_mask=mask, need_weights=True, average_attn_weights=False)
    got, w = layer(x, return_weights=True)
    assert got.dtype == dtype
    # scale of the error: the attention's, pushed through out_proj
    from pyattn import _reference as R
    sd = layer.state_dict()
    q = R.linear(x, sd["W_query.weight"], sd["W_query.bias"]).reshape(B, Tn, H, 8).swapaxes(1, 2)
    k = R.linear(x, sd["W_key.weight"], sd["W_key.bias"]).reshape(B, Tn, H, 8).swapaxes(1, 2)
    v = R.linear(x, sd["W_value.weight"], sd["W_value.bias"]).reshape(B, Tn, H, 8).swapaxes(1, 2)
    ww, s = _ref_w(q, k, 8 ** -0.5, causal=causal)
    lin = mag_matmul(np.abs(x), np.abs(sd["W_query.weight"].T)).max() + mag_matmul(np.abs(x), np.abs(sd["W_key.weight"].T)).max()
    att = mag_attention(q, k, v, ww, 8 ** -0.5) * (1 + lin) + mag_matmul(np.abs(x), np.abs(sd["W_value.weight"].T)).max()
    att = att.swapaxes(1, 2).reshape(B, Tn, E)
    check(got, want.numpy(), mag_matmul(att, np.abs(sd["out_proj.weight"].T)) + 1, inexact=2)
    check(w, want_w.numpy(), mag_softmax(s, ww) * (1 + lin), inexact=2)


class SeedMultiHeadAttention(torch.nn.Module):
    """The seeds' MultiHeadAttention (000, 002, 004), verbatim in behaviour."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.W_query = torch.nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = torch.nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = torch.nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = torch.nn.Linear(d_out, d_out)
        self.dropout = torch.nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, n, _ = x.shape
        keys = self.W_key(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        queries = self.W_query(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        values = self.W_value(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        scores = queries @ keys.transpose(2, 3)
        scores.masked_fill_(self.mask.bool()[:n, :n], -torch.inf)
        w = self.dropout(torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1))
        ctx = (w @ values).transpose(1, 2).contiguous().view(b, n, self.d_out)
        return self.out_proj(ctx)


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("d_in, d_out, heads", [(32, 32, 4), (24, 48, 3), (64, 16, 2)])
def test_seed_multihead_class_state_dict(rng, qkv_bias, d_in, d_out, heads):
    torch.manual_seed(3333)
    ref = SeedMultiHeadAttention(d_in, d_out, context_length=12, dropout=0.1, num_heads=heads,
                                 qkv_bias=qkv_bias).eval()
    layer = MultiHeadAttention(d_in, d_out, heads, context_length=12, dropout=0.1, qkv_bias=qkv_bias)
    layer.load_state_dict(ref.state_dict()).eval()
    x = rng.standard_normal((4, 10, d_in)).astype(np.float32)
    with torch.no_grad():
        want = ref(T(x)).numpy()
    got = layer(x)
    from pyattn import _reference as R
    sd = layer.state_dict()
    hd = d_out // heads
    q = R.linear(x, sd["W_query.weight"], sd.get("W_query.bias")).reshape(4, 10, heads, hd).swapaxes(1, 2)
    k = R.linear(x, sd["W_key.weight"], sd.get("W_key.bias")).reshape(4, 10, heads, hd).swapaxes(1, 2)
    v = R.linear(x, sd["W_value.weight"], sd.get("W_value.bias")).reshape(4, 10, heads, hd).swapaxes(1, 2)
    ww, _ = _ref_w(q, k, hd ** -0.5, causal=True)
    lin = max(mag_matmul(np.abs(x), np.abs(sd[n].T)).max() for n in ("W_query.weight", "W_key.weight", "W_value.weight"))
    att = (mag_attention(q, k, v, ww, hd ** -0.5) * (1 + lin) + lin).swapaxes(1, 2).reshape(4, 10, d_out)
    check(got, want, mag_matmul(att, np.abs(sd["out_proj.weight"].T)) + 1, inexact=2)


def test_self_attention_matches_torch_linear_layers(rng):
    torch.manual_seed(1)
    lin = [torch.nn.Linear(8, 5, bias=True, dtype=torch.float64) for _ in range(3)]
    layer = SelfAttention(8, 5, qkv_bias=True).load_state_dict(
        {f"W_{n}.{p}": getattr(l, p) for n, l in zip(("query", "key", "value"), lin) for p in ("weight", "bias")})
    x = rng.standard_normal((2, 6, 8))
    with torch.no_grad():
        X = T(x)
        q, k, v = (l(X) for l in lin)
        want = (torch.softmax(q @ k.transpose(1, 2) / 5 ** 0.5, dim=-1) @ v).numpy()
    got = layer(x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=64 * np.finfo(np.float64).eps * np.abs(want).max() * 8)


def test_tensors_are_array_likes(rng):
    q = rng.standard_normal((2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 7, 8)).astype(np.float32)
    want = pyattn.scaled_dot_product_attention(q, k, k, is_causal=True)
    got = pyattn.scaled_dot_product_attention(T(q), T(k), T(k), is_causal=True)
    assert isinstance(got, np.ndarray) and np.array_equal(got, want)
    with pytest.raises(TypeError, match="query"):          # a tensor that needs grad cannot become an array
        pyattn.scaled_dot_product_attention(T(q).requires_grad_(), T(k), T(k))
