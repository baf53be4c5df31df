"""pyattn.flash (FlashAttention's interface) and the pyattn features behind it
(align=, attention_with_kvcache's rotary / cache_leftpad / cache_batch_idx /
Tk != T), in float32 and float64 against the float64 oracle
(pyattn._reference), where FlashAttention's own test rule (compare with a
same-dtype PyTorch computation) does not apply."""
import math

import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from pyattn.flash import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, \
    flash_attn_with_kvcache, flash_attn_varlen_func

from conftest import DTYPES, check, mag_attention

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

torch = pytest.importorskip("torch")


def _ref(q, k, v, causal=False, window=None, slopes=None, softcap=None, scale=None):
    """The float64 oracle on FlashAttention's layout: q (B, L, H, E) ... -> out
    (B, L, H, Ev), pyattn's lse (B, H, L), the weights; bottom-right positions."""
    t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    L, S = q.shape[1], k.shape[1]
    o, w, lse = R.scaled_dot_product_attention(
        t(q), t(k), t(v), is_causal=causal, scale=scale, enable_gqa=True, window=window,
        alibi_slopes=slopes, softcap=softcap, qoff=S - L, return_weights=True, return_lse=True)
    return np.swapaxes(o, 1, 2), lse, w


def _mag(q, k, v, w, scale):
    t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    kk, vv = t(k), t(v)
    g = q.shape[2] // k.shape[2]
    kk, vv = np.repeat(kk, g, axis=1), np.repeat(vv, g, axis=1)
    return np.swapaxes(mag_attention(t(q), kk, vv, w, scale), 1, 2)


CASES = [  # (L, S, causal, window, alibi, softcap)
    (5, 9, False, None, False, None),
    (9, 5, True, None, False, None),
    (7, 12, False, (3, 2), True, None),
    (12, 7, False, (2, 1), True, None),
    (6, 6, True, (2, 0), False, 5.0),
    (10, 4, True, None, True, None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("as_tensor", [False, True])
def test_flash_attn_func_vs_float64(dtype, case, as_tensor):
    L, S, causal, window, alibi, softcap = case
    rng = np.random.default_rng(L * 31 + S)
    B, Hq, Hkv, E = 2, 4, 2, 8
    q = rng.standard_normal((B, L, Hq, E)).astype(dtype)
    k = rng.standard_normal((B, S, Hkv, E)).astype(dtype)
    v = rng.standard_normal((B, S, Hkv, E)).astype(dtype)
    slopes = (rng.random((B, Hq)) * 0.5) if alibi else None
    ws = (-1, -1) if window is None else window
    args = [torch.from_numpy(x) for x in (q, k, v)] if as_tensor else [q, k, v]
    out, lse, s_dmask = flash_attn_func(*args, causal=causal, window_size=ws, softcap=softcap or 0.0,
                                        alibi_slopes=slopes, return_attn_probs=True)
    assert s_dmask is None
    out, lse = np.asarray(out), np.asarray(lse)
    assert out.dtype == dtype and out.shape == (B, L, Hq, E) and lse.shape == (B, Hq, L)
    ro, rlse, w = _ref(q, k, v, causal, window, slopes, softcap)
    check(out, ro.astype(dtype), _mag(q, k, v, w, 1 / math.sqrt(E)))
    # FlashAttention's lse: +inf where nothing is admissible; causal ALiBi (no
    # left window) adds slope * d(i), d(i) = i + S - L
    want = rlse.copy()
    if alibi and causal and window is None:
        want = want + slopes[:, :, None] * (np.arange(L) + S - L)
    want[np.isneginf(want)] = np.inf
    assert np.array_equal(np.isinf(lse), np.isinf(want))
    fin = np.isfinite(want)
    assert np.allclose(lse[fin], want[fin], rtol=0, atol=64 * np.finfo(dtype).eps * (1 + np.abs(want[fin])))
    if L > S and causal:
        assert np.isposinf(lse[:, :, 0]).all() and not out[:, 0].any()     # rows with no key


def test_packed_variants_match_unpacked():
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((2, 6, 3, 2, 8))
    o = flash_attn_qkvpacked_func(qkv, causal=True)
    assert np.array_equal(o, flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True))
    q, kv = rng.standard_normal((2, 4, 2, 8)), rng.standard_normal((2, 7, 2, 1, 8))
    o = flash_attn_kvpacked_func(q, kv, window_size=(2, 1))
    assert np.array_equal(o, flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], window_size=(2, 1)))


@pytest.mark.parametrize("causal,window,alibi", [(False, None, False), (True, None, True),
                                                 (False, (2, 1), True)])
def test_autograd_float64_gradcheck(causal, window, alibi):
    """The backward (pyattn's, through torch.autograd) against finite differences."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 7, 1, 4, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(1, 7, 1, 3, dtype=torch.float64, generator=g, requires_grad=True)
    slopes = torch.tensor([0.3, 0.1], dtype=torch.float64) if alibi else None
    ws = (-1, -1) if window is None else window
    f = lambda q, k, v: flash_attn_func(q, k, v, causal=causal, window_size=ws, alibi_slopes=slopes)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-7)


def test_dropout_s_dmask_encodes_the_pattern():
    """S_dmask: probabilities over their row maximum, negative where dropped;
    the output is the kept weights (scaled by 1/(1-p)) times v."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 6, 2, 8, dtype=torch.float64) for _ in range(3))
    p = 0.3
    torch.manual_seed(4)
    out, lse, s = flash_attn_func(q, k, v, p, causal=True, return_attn_probs=True)
    s = s.numpy()
    P = np.abs(s) / np.abs(s).sum(-1, keepdims=True)
    keep = s >= 0
    want = np.einsum("bhls,bshe->blhe", P * keep / (1 - p), v.numpy())
    assert np.allclose(out.numpy(), want, atol=1e-12)
    assert 0.1 < (~keep & (np.abs(s) > 0)).sum() / (np.abs(s) > 0).sum() < 0.5
    torch.manual_seed(4)
    out2 = flash_attn_func(q, k, v, p, causal=True)
    # the same pattern (the seed comes from torch); S_dmask's call runs pyattn's
    # exact weights path, the other the tiled one: equal to rounding
    assert np.allclose(out.numpy(), out2.numpy(), rtol=0, atol=1e-12)


def _rope(x, cos, sin, pos, interleaved):
    """float64 rotary of x (B, H, T, E) at positions pos (B, T)."""
    x = np.array(x, np.float64)
    half = cos.shape[1]
    c, s = np.asarray(cos, np.float64)[pos][:, None], np.asarray(sin, np.float64)[pos][:, None]
    i1 = np.arange(0, 2 * half, 2) if interleaved else np.arange(half)
    i2 = i1 + 1 if interleaved else i1 + half
    x1, x2 = x[..., i1].copy(), x[..., i2].copy()
    x[..., i1], x[..., i2] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (False, (3, 1))])
@pytest.mark.parametrize("extra", ["none", "leftpad", "batch_idx"])
def test_kvcache_rotary_leftpad_batch_idx(dtype, interleaved, causal, window, extra):
    rng = np.random.default_rng(7)
    B, Hq, Hkv, T, Tk, S_max, E = 2, 4, 2, 3, 2, 16, 8
    Bc = 3 if extra == "batch_idx" else B
    kc = rng.standard_normal((Bc, Hkv, S_max, E)).astype(dtype)
    vc = rng.standard_normal((Bc, Hkv, S_max, E)).astype(dtype)
    q = rng.standard_normal((B, Hq, T, E)).astype(dtype)
    k, v = (rng.standard_normal((B, Hkv, Tk, E)).astype(dtype) for _ in range(2))
    n = np.array([5, 9])
    ang = rng.random((S_max, 3)) * 2 * np.pi
    cos, sin = np.cos(ang), np.sin(ang)
    idx = np.array([2, 0]) if extra == "batch_idx" else np.arange(B)
    pad = np.array([2, 4]) if extra == "leftpad" else np.zeros(B, int)
    slopes = rng.random(Hq) * 0.3
    k0, v0 = kc.copy(), vc.copy()
    kw = {"cache_leftpad": pad} if extra == "leftpad" else {"cache_batch_idx": idx} if extra == "batch_idx" else {}
    out, lse = pyattn.attention_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=n, is_causal=causal, window=window, alibi_slopes=slopes,
        rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved, return_lse=True, **kw)
    assert out.dtype == dtype
    # the oracle: rotate in float64, write, attend over [pad, n + Tk) at cache positions
    kr = _rope(k, cos, sin, n[:, None] + np.arange(Tk), interleaved)
    qpos = n[:, None] + (np.arange(T) if causal or window else np.zeros(T, int))
    qr = _rope(q, cos, sin, qpos, interleaved)
    for b in range(B):
        rows = slice(n[b], n[b] + Tk)
        check(kc[idx[b], :, rows], kr[b].astype(dtype), np.abs(kr[b]) + 1)
        assert np.array_equal(vc[idx[b], :, rows], v[b])
        kref = np.array(k0[idx[b]], np.float64)
        vref = np.array(v0[idx[b]], np.float64)
        kref[:, rows], vref[:, rows] = kr[b], v[b]
        m = n[b] + Tk
        o, w, ls = R.scaled_dot_product_attention(
            qr[b], kref[:, pad[b]:m], vref[:, pad[b]:m], is_causal=causal, enable_gqa=True,
            window=window, alibi_slopes=slopes, qoff=m - T - pad[b], return_weights=True,
            return_lse=True)
        kk = np.repeat(kref[:, pad[b]:m], Hq // Hkv, axis=0)
        vv = np.repeat(vref[:, pad[b]:m], Hq // Hkv, axis=0)
        # the query was rotated in the compute dtype: its rounding widens the oracle's scale
        check(out[b], o.astype(dtype), 4 * mag_attention(qr[b], kk, vv, w, 1 / math.sqrt(E)))
        assert np.allclose(lse[b], ls, rtol=1e-4 if dtype == np.float32 else 1e-12)
    untouched = np.ones(Bc, bool)
    untouched[idx] = False
    assert np.array_equal(kc[untouched], k0[untouched])


def test_kvcache_errors_write_nothing():
    rng = np.random.default_rng(0)
    kc, vc = np.zeros((2, 1, 8, 4)), np.zeros((2, 1, 8, 4))
    q, k, v = rng.standard_normal((2, 1, 2, 4)), rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((2, 1, 3, 4))
    cos = sin = np.ones((6, 2))
    with pytest.raises(ValueError, match="rotary_cos"):        # positions up to 5 + 3 - 1 >= 6
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=[1, 5], rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(ValueError, match="cache_leftpad"):
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=[1, 2], cache_leftpad=[0, 3])
    with pytest.raises(ValueError, match="cache_batch_idx"):
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=[1, 2], cache_batch_idx=[0, 2])
    with pytest.raises(ValueError, match="cache_seqlens"):
        pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=[1, 6], cache_batch_idx=[1, 0])
    with pytest.raises(ValueError, match="key and value"):
        pyattn.attention_with_kvcache(q, kc, vc, rotary_cos=cos, rotary_sin=sin, cache_seqlens=2)
    with pytest.raises(ValueError, match="value has shape"):
        pyattn.attention_with_kvcache(q, kc, vc, k, v[:, :, :2], cache_seqlens=1)
    assert not kc.any() and not vc.any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_with_kvcache_tensors_in_place(dtype):
    """Token-major torch caches are written in place (no copy), Tk != T."""
    torch.manual_seed(0)
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    kc, vc = torch.zeros(2, 10, 2, 8, dtype=tdt), torch.zeros(2, 10, 2, 8, dtype=tdt)
    q, k, v = torch.randn(2, 3, 4, 8, dtype=tdt), torch.randn(2, 2, 2, 8, dtype=tdt), torch.randn(2, 2, 2, 8, dtype=tdt)
    sl = torch.tensor([0, 4], dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=sl, causal=True, return_softmax_lse=True)
    assert torch.equal(kc[1, 4:6], k[1]) and torch.equal(vc[0, 0:2], v[0]) and not kc[0, 2:].any()
    assert out.dtype == tdt and out.shape == (2, 3, 4, 8) and lse.shape == (2, 4, 3)
    assert torch.isposinf(lse[0, :, 0]).all()          # query 0 of seq 0 sits at position -1: no key
    ro, rlse, _ = _ref(q[1:].numpy(), kc[1:, :6].numpy(), vc[1:, :6].numpy(), causal=True)
    assert np.allclose(out[1:].numpy(), ro, atol=10 * np.finfo(dtype).eps)


def test_align_keyword():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 9, 4))
    o = pyattn.scaled_dot_product_attention(q, k, v, window=(1, 1), align="bottom_right")
    assert np.allclose(o, R.scaled_dot_product_attention(q, k, v, window=(1, 1), qoff=3), atol=1e-14)
    assert np.array_equal(pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, align="bottom_right"),
                          pyattn.scaled_dot_product_attention(q, k, v, is_causal="bottom_right"))
    with pytest.raises(ValueError, match="align"):
        pyattn.scaled_dot_product_attention(q, k, v, align="middle")
    with pytest.raises(ValueError, match="align"):
        pyattn.scaled_dot_product_attention(q, k, v, is_causal="bottom_right", align="top_left")


def test_numpy_in_numpy_out_and_errors():
    q = np.zeros((1, 2, 2, 4), np.float32)
    assert isinstance(flash_attn_func(q, q, q), np.ndarray)
    with pytest.raises(TypeError, match="one dtype"):
        flash_attn_func(q, q.astype(np.float64), q)
    with pytest.raises(ValueError, match="q must be"):
        flash_attn_func(q[0], q, q)
    if not hasattr(pyattn, "scaled_dot_product_attention_varlen"):
        with pytest.raises(NotImplementedError, match="varlen"):
            flash_attn_varlen_func(q[0], q[0], q[0], [0, 2], [0, 2], 2, 2)


# ---- issue 43 item 8: FlashAttention's dtypes, names and layouts; bert_padding ----

@pytest.mark.parametrize("bad", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_flash_refuses_dtypes_flashattention_refuses(bad):
    from pyattn.flash import _DtypeError
    q = torch.ones(2, 5, 4, 8, dtype=bad)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    calls = [lambda: flash_attn_func(q, q, q),
             lambda: flash_attn_func(q.numpy(), q.numpy(), q.numpy()),
             lambda: flash_attn_qkvpacked_func(torch.stack([q, q, q], 2)),
             lambda: flash_attn_varlen_func(q.reshape(10, 4, 8), q.reshape(10, 4, 8), q.reshape(10, 4, 8),
                                            cu, cu, 5, 5),
             lambda: flash_attn_with_kvcache(q, q, q, cache_seqlens=5)]
    for call in calls:
        with pytest.raises(TypeError, match="q has dtype .*FlashAttention takes float16 or bfloat16") as ei:
            call()
        assert isinstance(ei.value, RuntimeError)       # what FlashAttention raises
        assert isinstance(ei.value, _DtypeError)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_flash_takes_its_float_dtypes(dtype):
    q = torch.randn(1, 3, 2, 8).to(dtype)
    out = flash_attn_func(q, q, q, causal=True)
    assert out.dtype == dtype and out.shape == (1, 3, 2, 8)


def test_flash_errors_speak_flashattention():
    q = torch.randn(2, 8, 4, 16)
    k = v = torch.randn(2, 8, 3, 16)
    with pytest.raises(ValueError, match=r"nheads_k = 3\) must divide number of heads in query "
                                         r"\(nheads = 4\).*q \(2, 8, 4, 16\) \(batch, seqlen_q, nheads, headdim\)") as ei:
        flash_attn_func(q, k, v)
    assert isinstance(ei.value, RuntimeError) and "enable_gqa" not in str(ei.value)
    with pytest.raises(ValueError, match=r"same headdim.*k \(2, 8, 4, 8\)"):
        flash_attn_func(q, torch.randn(2, 8, 4, 8), torch.randn(2, 8, 4, 16))
    with pytest.raises(ValueError, match=r"same batch size"):
        flash_attn_func(q, torch.randn(1, 8, 4, 16), torch.randn(1, 8, 4, 16))
    with pytest.raises(ValueError, match=r"same seqlen and nheads_k.*v \(2, 7, 4, 16\)"):
        flash_attn_func(q, q, torch.randn(2, 7, 4, 16))
    with pytest.raises(ValueError, match=r"q must be \(batch, seqlen_q, nheads, headdim\), got shape \(8, 4, 16\)"):
        flash_attn_func(q[0], q, q)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"nheads_k = 3\).*q \(8, 4, 16\) \(total_q, nheads, headdim\)"):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8)
    kc = torch.zeros(2, 8, 3, 16)
    with pytest.raises(ValueError, match=r"nheads_k = 3\).*k_cache \(2, 8, 3, 16\)"):
        flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=2)
    kc = torch.zeros(2, 8, 2, 16)
    with pytest.raises(ValueError, match=r"k and v must be \(batch, seqlen_new"):
        flash_attn_with_kvcache(q[:, :1], kc, kc, torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 16),
                                cache_seqlens=2)
    with pytest.raises(ValueError, match=r"k and v must be given together"):
        flash_attn_with_kvcache(q[:, :1], kc, kc, torch.randn(2, 1, 2, 16), cache_seqlens=2)
    assert not kc.any()


def test_bert_padding_import_paths():
    import importlib
    import pyattn.flash
    from pyattn.flash import pad_input, unpad_input
    from pyattn.flash.bert_padding import index_first_axis, pad_input as p2, unpad_input as u2
    m = importlib.import_module("pyattn.flash.bert_padding")
    assert m is pyattn.flash.bert_padding and (p2, u2) == (pad_input, unpad_input) == (m.pad_input, m.unpad_input)
    assert callable(index_first_axis)


def _fa_helpers():
    """tests/flash_attn/fa_helpers.py: FlashAttention's bert_padding in plain PyTorch"""
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location(
        "fa_helpers", os.path.join(os.path.dirname(__file__), "flash_attn", "fa_helpers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unpad_pad_as_flashattention():
    fa_helpers = _fa_helpers()
    from pyattn.flash.bert_padding import pad_input, unpad_input
    rng = torch.Generator().manual_seed(43)
    x = torch.randn(3, 7, 2, 4, generator=rng)
    lens = torch.tensor([7, 3, 0])
    mask = torch.arange(7)[None, :] < lens[:, None]
    unused = torch.zeros(3, 7, dtype=torch.bool)
    unused[1, 3:5] = True
    for um in (None, unused):
        got, want = unpad_input(x, mask, um), fa_helpers.unpad_input(x, mask, um)
        for g, w in zip(got, want):
            if isinstance(w, int):
                assert g == w and isinstance(g, int)
            else:
                assert g.dtype == w.dtype and torch.equal(g, w)
        rows, idx = got[0], got[1]
        assert torch.equal(pad_input(rows, idx, 3, 7), fa_helpers.pad_input(rows, idx, 3, 7))
        # NumPy in, NumPy out, the same values
        npg = unpad_input(x.numpy(), mask.numpy().astype(np.int32), None if um is None else um.numpy())
        for g, w in zip(npg, got):
            assert (g == w) if isinstance(w, int) else np.array_equal(g, w.numpy()) and g.dtype == w.numpy().dtype
        assert np.array_equal(pad_input(npg[0], npg[1], 3, 7), pad_input(rows, idx, 3, 7).numpy())
    # differentiable, as FlashAttention's (gradient of the kept rows only)
    xg = x.clone().requires_grad_(True)
    rows, idx, *_ = unpad_input(xg, mask)
    pad_input(rows * 2, idx, 3, 7).sum().backward()
    assert torch.equal(xg.grad, 2.0 * mask[:, :, None, None].expand_as(x).float())
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, seqlen\) = \(3, 7\)"):
        unpad_input(x, mask[:, :5])
    with pytest.raises(ValueError, match=r"indices must be in \[0, batch \* seqlen\) = \[0, 21\)"):
        pad_input(rows, idx + 21, 3, 7)


def test_varlen_through_unpad_equals_the_padded_call():
    from pyattn.flash import pad_input, unpad_input
    rng = np.random.default_rng(8)
    B, S, H, E = 3, 6, 2, 8
    q, k, v = (torch.from_numpy(rng.standard_normal((B, S, H, E))) for _ in range(3))
    lens = [6, 2, 4]
    mask = torch.arange(S)[None, :] < torch.tensor(lens)[:, None]
    qu, idx, cu, mx, _ = unpad_input(q, mask)
    ku, _, _, _, _ = unpad_input(k, mask)
    vu, _, _, _, _ = unpad_input(v, mask)
    out = pad_input(flash_attn_varlen_func(qu, ku, vu, cu, cu, mx, mx, causal=True), idx, B, S)
    for b, n in enumerate(lens):
        ref = flash_attn_func(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n], causal=True)
        assert torch.equal(out[b:b + 1, :n], ref)          # varlen: each sequence as alone, bit for bit
        assert not out[b, n:].any()
