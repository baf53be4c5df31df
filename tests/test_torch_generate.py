"""Generation features against PyTorch (API.md wave 2): a sliding window and
ALiBi equal F.scaled_dot_product_attention with the explicit mask they stand
for; softcap and sinks equal a few lines of torch; attention_with_kvcache
equals F.scaled_dot_product_attention on the filled prefix (bottom-right
causal). Both sides round: inexact=2."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from conftest import DTYPES, check, mag_attention

# CI (.ci/run): PyTorch's comparisons run per family, outside the sanitizers
pytestmark = [pytest.mark.nosan]

torch = pytest.importorskip("torch")
F = torch.nn.functional


def T(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _w(q, k, **kw):
    return R.scaled_dot_product_attention(q, k, k[..., :1], return_weights=True, **kw)[1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window, causal", [((16, 0), True), ((5, 7), False), ((None, 3), False),
                                            ((10, None), "bottom_right"), ((0, 0), False)])
@pytest.mark.parametrize("L, S", [(40, 40), (33, 90), (128, 200)])
def test_window_vs_torch_mask(rng, dtype, window, causal, L, S):
    q = rng.standard_normal((2, 3, L, 32)).astype(dtype)
    k = rng.standard_normal((2, 3, S, 32)).astype(dtype)
    v = rng.standard_normal((2, 3, S, 16)).astype(dtype)
    got = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, window=window)
    allowed = R.window_mask(L, S, window, causal)
    if causal:
        allowed &= R.causal_mask(L, S, causal)
    tm = T(allowed)
    want = F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=tm).numpy()
    want = np.where(allowed.any(-1)[:, None], want, 0.0)   # torch: NaN rows where nothing is allowed
    w = R.scaled_dot_product_attention(q, k, v, attn_mask=allowed, return_weights=True)[1]
    check(got, want.astype(dtype), mag_attention(q, k, v, w, 32 ** -0.5), inexact=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("slopes_shape", ["h", "bh"])
def test_alibi_vs_torch_float_mask(rng, dtype, causal, slopes_shape):
    B, H, L, S, E = 2, 4, 50, 70, 16
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, E)).astype(dtype)
    slopes = 2.0 ** -np.arange(1, H + 1) if slopes_shape == "h" else rng.uniform(0.01, 0.3, (B, H))
    got = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, alibi_slopes=slopes)
    bias = R.alibi_bias(slopes, L, S, causal)
    if causal:
        bias = np.where(R.causal_mask(L, S, causal), bias, -np.inf)
    want = F.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=T(bias.astype(dtype))).numpy()
    w = R.scaled_dot_product_attention(q, k, v, is_causal=causal, alibi_slopes=slopes, return_weights=True)[1]
    bias_mag = 1 + np.max(np.abs(slopes)) * (L + S)
    check(got, want, mag_attention(q, k, v, w, 0.25) * bias_mag, inexact=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_and_sinks_vs_torch_lines(rng, dtype):
    """softcap (Gemma 2) and sinks (gpt-oss) written out in torch."""
    B, H, L, S, E = 2, 4, 30, 45, 16
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, E)).astype(dtype)
    cap, sinks = 3.0, rng.standard_normal(H)
    got = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, softcap=cap, sinks=sinks)
    tq, tk, tv = T(q), T(k), T(v)
    s = tq @ tk.transpose(-1, -2) / E ** 0.5
    s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    sink_col = torch.as_tensor(sinks, dtype=s.dtype).view(1, H, 1, 1).expand(B, H, L, 1)
    p = torch.softmax(torch.cat([s, sink_col], dim=-1), dim=-1)[..., :-1]
    want = (p @ tv).numpy()
    w = R.scaled_dot_product_attention(q, k, v, is_causal=True, softcap=cap, sinks=sinks, return_weights=True)[1]
    check(got, want, mag_attention(q, k, v, w, 0.25), inexact=2)
    ref = R.scaled_dot_product_attention(q, k, v, is_causal=True, softcap=cap, sinks=sinks)
    check(got, ref, mag_attention(q, k, v, w, 0.25))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq, Hkv", [(32, 8), (8, 1), (4, 4)])
@pytest.mark.parametrize("T_new", [1, 6])
def test_kvcache_vs_torch_prefix(rng, dtype, Hq, Hkv, T_new):
    B, S_max, E = 3, 600, 32
    n = np.array([0, 37, 511])
    kc = np.zeros((B, Hkv, S_max, E), dtype)
    vc = np.zeros((B, Hkv, S_max, E), dtype)
    for b in range(B):
        kc[b, :, :n[b]] = rng.standard_normal((Hkv, n[b], E))
        vc[b, :, :n[b]] = rng.standard_normal((Hkv, n[b], E))
    q = rng.standard_normal((B, Hq, T_new, E)).astype(dtype)
    key = rng.standard_normal((B, Hkv, T_new, E)).astype(dtype)
    val = rng.standard_normal((B, Hkv, T_new, E)).astype(dtype)
    out = pyattn.attention_with_kvcache(q, kc, vc, key, val, cache_seqlens=n)
    for b in range(B):
        m = n[b] + T_new
        kk, vv = kc[b:b + 1, :, :m], vc[b:b + 1, :, :m]
        tmask = T(R.causal_mask(T_new, m, "bottom_right"))
        want = F.scaled_dot_product_attention(T(q[b:b + 1]), T(kk), T(vv), attn_mask=tmask,
                                              enable_gqa=Hq != Hkv).numpy()
        kr, vr = np.repeat(kk, Hq // Hkv, 1), np.repeat(vv, Hq // Hkv, 1)
        w = R.scaled_dot_product_attention(q[b:b + 1], kr, vr, is_causal="bottom_right", return_weights=True)[1]
        check(out[b:b + 1], want, mag_attention(q[b:b + 1], kr, vr, w, E ** -0.5), inexact=2)
