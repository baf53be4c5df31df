"""pyattn.torch: the torch.library custom op pyattn::sdpa against PyTorch's SDPA.

Values and gradients against torch.nn.functional.scaled_dot_product_attention
on each of its options (masks, causal, scale, GQA, dropout through pyattn's
NumPy API with the same seed), pyattn's own options against the same
attention written in torch, gradcheck in float64, torch.compile(fullgraph)
and torch.export, zero-copy reads, 16-bit dtypes and the errors.
"""
import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import pyattn  # noqa: E402
import pyattn.torch as pt  # noqa: E402

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _qkv(dtype, B=2, Hq=4, Hkv=4, L=13, S=17, E=16, Ev=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, E, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, S, E, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, S, Ev, generator=g, dtype=dtype, requires_grad=True)
    return q, k, v


def _cmp(fa, fb, args, dtype):
    """Values and gradients of fa and fb, with a random output gradient."""
    oa, ob = fa(*args), fb(*args)
    assert oa.dtype == ob.dtype and oa.shape == ob.shape
    tol = TOL[dtype]
    assert torch.allclose(oa, ob, rtol=tol, atol=tol), float((oa - ob).abs().max())
    go = torch.randn_like(oa)
    diff = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    ga = torch.autograd.grad(oa, diff, go)
    gb = torch.autograd.grad(ob, diff, go)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=tol, atol=tol), float((x - y).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["plain", "causal", "bool", "float", "scale", "gqa", "gqa_causal",
                                  "square_causal", "broadcast_mask", "transposed"])
def test_matches_torch_sdpa(dtype, case):
    Hkv = 2 if case.startswith("gqa") else 4
    L, S = (17, 17) if case == "square_causal" else (13, 17)
    q, k, v = _qkv(dtype, Hkv=Hkv, L=L, S=S)
    kw = {}
    if case in ("causal", "gqa_causal", "square_causal"):
        kw["is_causal"] = True
    if case == "bool":
        m = torch.rand(2, 4, L, S) > 0.3
        m[..., 0] = True                    # torch gives NaN for a row with no key
        kw["attn_mask"] = m
    if case == "float":
        kw["attn_mask"] = torch.randn(L, S, dtype=dtype)
    if case == "broadcast_mask":
        kw["attn_mask"] = torch.rand(2, 1, 1, S) > 0.2
        kw["attn_mask"][..., 0] = True
    if case == "scale":
        kw["scale"] = 0.37
    if case.startswith("gqa"):
        kw["enable_gqa"] = True
    if case == "transposed":                # (B, L, H, E) memory, as transformers' projections
        q = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
        k = k.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    _cmp(lambda q, k, v: pt.scaled_dot_product_attention(q, k, v, **kw),
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), (q, k, v), dtype)


def _eager(q, k, v, *, scale=None, window=None, softcap=None, sinks=None, alibi=None, causal="bottom_right"):
    """The same attention written in torch ops (differentiable), for pyattn's options."""
    n = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(n, -3), v.repeat_interleave(n, -3)
    L, S = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    d = torch.arange(L)[:, None] + (S - L if causal == "bottom_right" else 0)
    j = torch.arange(S)[None]
    if alibi is not None:
        s = s - alibi.view(-1, 1, 1).to(s.dtype) * (d - j).abs().to(s.dtype)
    ok = torch.ones(L, S, dtype=torch.bool)
    if causal:
        ok &= j <= d
    if window is not None:
        ok &= (j >= d - window[0]) & (j <= d + window[1])
    s = s.masked_fill(~ok, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(s.shape[0], -1, L, 1)], -1)
    w = torch.softmax(s, -1)
    return (w[..., :S] if sinks is not None else w) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("opt", ["window", "softcap", "sinks", "alibi", "all"])
def test_pyattn_options_match_torch_math(dtype, opt):
    q, k, v = _qkv(dtype, Hkv=2)
    sinks = torch.randn(4, dtype=dtype, requires_grad=True)
    alibi = torch.rand(4, dtype=dtype)
    kw = {"window": (5, 0)} if opt in ("window", "all") else {}
    if opt in ("softcap", "all"):
        kw["softcap"] = 2.5
    if opt in ("alibi", "all"):
        kw["alibi"] = alibi
    use_sinks = opt in ("sinks", "all")

    def mine(q, k, v, s):
        extra = {("alibi_slopes" if a == "alibi" else a): b for a, b in kw.items()}
        return pt.scaled_dot_product_attention(q, k, v, is_causal="bottom_right", enable_gqa=True,
                                               sinks=s if use_sinks else None, **extra)

    def ref(q, k, v, s):
        return _eager(q, k, v, sinks=s if use_sinks else None, **kw)

    _cmp(mine, ref, (q, k, v, sinks) if use_sinks else (q, k, v, None), dtype)


def test_gradcheck_float64():
    q, k, v = _qkv(torch.float64, B=1, Hq=4, Hkv=2, L=5, S=7, E=6, Ev=5)
    sinks = torch.randn(4, dtype=torch.float64, requires_grad=True)
    m = torch.rand(1, 1, 5, 7, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: pt.scaled_dot_product_attention(q, k, v, m, is_causal=True, enable_gqa=True,
                                                           sinks=s, softcap=3.0), (q, k, v, sinks))

    def dropped(q, k, v):
        torch.manual_seed(7)                # the same dropout pattern in every evaluation
        return pt.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True)
    assert torch.autograd.gradcheck(dropped, (q, k, v))


def test_dropout_seeded_from_torch():
    q, k, v = _qkv(torch.float64, Hkv=2)
    torch.manual_seed(11)
    out = pt.scaled_dot_product_attention(q, k, v, dropout_p=0.4, is_causal=True, enable_gqa=True)
    torch.manual_seed(11)
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    want, back = pyattn.scaled_dot_product_attention_vjp(
        q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), dropout_p=0.4, is_causal=True,
        enable_gqa=True, rng=seed)
    assert np.array_equal(out.detach().numpy(), want)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), go)
    for g, w in zip(got, back(go.numpy())):
        assert np.array_equal(g.numpy(), w)     # the backward regenerates the forward's pattern
    a = pt.scaled_dot_product_attention(q, k, v, dropout_p=0.4, enable_gqa=True)
    b = pt.scaled_dot_product_attention(q, k, v, dropout_p=0.4, enable_gqa=True)
    assert not torch.equal(a, b)                # a fresh pattern per call


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit(dtype):
    pytest.importorskip("ml_dtypes")
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in _qkv(torch.float32, Hkv=2))
    out = pt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.dtype == dtype
    wide = pt.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    assert torch.equal(out, wide.to(dtype))      # rounded from the float32 result
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(out.float(), ref.float(), atol=2e-2)
    out.sum().backward()
    assert q.grad.dtype == dtype and k.grad.shape == k.shape


def test_reads_in_place(monkeypatch):
    pytest.importorskip("ml_dtypes")
    seen = []
    real = pyattn._api.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        seen.append((q, k, v))
        return real(q, k, v, *a, **kw)
    monkeypatch.setattr(pyattn._api, "scaled_dot_product_attention", spy)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        q = torch.randn(2, 9, 3, 8).to(dtype).transpose(1, 2)      # a strided view
        k = torch.randn(2, 3, 11, 8).to(dtype)
        v = torch.randn(2, 3, 11, 4).to(dtype)[..., ::1]
        seen.clear()
        pt.scaled_dot_product_attention(q, k, v)
        (a, b, c), = seen
        for arr, t in ((a, q), (b, k), (c, v)):
            assert arr.ctypes.data == t.data_ptr() and arr.shape == tuple(t.shape)
            assert arr.strides == tuple(s * t.element_size() for s in t.stride())


def test_dlpack_numpy_api_no_copy(monkeypatch):
    from pyattn._checks import as_array
    t = torch.randn(4, 6, 8).transpose(0, 1)
    a = as_array(t, "query")
    assert a.ctypes.data == t.data_ptr() and a.strides == (32, 192, 4)
    assert np.array_equal(pyattn.scaled_dot_product_attention(t, t, t),
                          pyattn.scaled_dot_product_attention(t.numpy(), t.numpy(), t.numpy()))
    if pytest.importorskip("ml_dtypes"):
        b = torch.randn(3, 5, dtype=torch.bfloat16)
        ab = as_array(b, "key")
        assert ab.dtype.name == "bfloat16" and ab.ctypes.data == b.data_ptr()
    with pytest.raises(TypeError, match="query"):
        pyattn.scaled_dot_product_attention(torch.ones(3, 4, requires_grad=True), t, t)


def test_dlpack_jax():
    jnp = pytest.importorskip("jax.numpy")
    from pyattn._checks import as_array
    x = jnp.arange(24.0, dtype=jnp.float32).reshape(4, 6)
    a = as_array(x, "query")
    assert a.ctypes.data == x.unsafe_buffer_pointer()
    assert pyattn.scaled_dot_product_attention(x, x, x).shape == (4, 6)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        return pt.scaled_dot_product_attention(q, k, v, is_causal=True, window=(4, 0)).sum(1)


def test_torch_compile_fullgraph():
    torch.manual_seed(0)
    m = _Block()
    x = torch.randn(2, 10, 16)
    want = m(x)
    want.sum().backward()
    gw = m.proj.weight.grad.clone()
    m.zero_grad()
    c = torch.compile(m, fullgraph=True, backend="aot_eager")
    got = c(x)
    got.sum().backward()
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(m.proj.weight.grad, gw, atol=1e-5)


def test_torch_export():
    torch.manual_seed(0)
    m = _Block().eval()
    x = torch.randn(2, 10, 16)
    ep = torch.export.export(m, (x,))
    assert "pyattn.sdpa" in str(ep.graph)
    assert torch.allclose(ep.module()(x), m(x))


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(3, 1, 4, 5, 16)
        k = torch.empty(2, 4, 7, 16)
        out, lse = torch.ops.pyattn.sdpa(q, k, k[..., :6], None, 0.0, 0, None, False, None, -1, -1,
                                         None, None, None, None)
    real = pyattn.scaled_dot_product_attention(np.zeros((3, 1, 4, 5, 16), np.float32),
                                               np.zeros((2, 4, 7, 16), np.float32),
                                               np.zeros((2, 4, 7, 6), np.float32))
    assert tuple(out.shape) == real.shape and tuple(lse.shape) == real.shape[:-1]


def test_errors():
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match="query is on device meta"):
        pt.scaled_dot_product_attention(q.to("meta"), k, v)
    with pytest.raises(ValueError, match="key is on device meta"):
        pt.scaled_dot_product_attention(q, k.to("meta"), v)
    with pytest.raises(TypeError, match="key has dtype torch.int32"):
        pt.scaled_dot_product_attention(q, k.int(), v)
    with pytest.raises(TypeError, match="complex"):
        pt.scaled_dot_product_attention(q.to(torch.complex64), k, v)
    with pytest.raises(TypeError, match="one dtype"):
        pt.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(TypeError, match="torch.Tensor"):
        pt.scaled_dot_product_attention(q.detach().numpy(), k, v)
    m = torch.zeros(13, 17, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        pt.scaled_dot_product_attention(q, k, v, m)
    with pytest.raises(ValueError, match="alibi_slopes requires grad"):
        pt.scaled_dot_product_attention(q, k, v, alibi_slopes=torch.ones(4, requires_grad=True))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        pt.scaled_dot_product_attention(q, k, v, torch.zeros(13, 17, dtype=torch.int64))
    with pytest.raises(ValueError, match="attn_mask has shape"):
        pt.scaled_dot_product_attention(q, k, v, torch.zeros(5, 5))
    with pytest.raises(ValueError, match="dropout_p"):
        pt.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(TypeError, match="scale"):
        pt.scaled_dot_product_attention(q, k, v, scale="0.5")
    with pytest.raises(ValueError, match="softcap"):
        pt.scaled_dot_product_attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="is_causal"):
        pt.scaled_dot_product_attention(q, k, v, is_causal="diagonal")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_error():
    q, k, v = (t.detach().cuda() for t in _qkv(torch.float32))
    with pytest.raises(ValueError, match="query is on device cuda"):
        pt.scaled_dot_product_attention(q, k, v)


def test_import_pyattn_imports_neither_torch_nor_transformers():
    code = ("import sys, pyattn, pyattn.nn; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---- autocast (issue 43 item 10): PyTorch's SDPA rule, inputs cast to the autocast dtype ----

@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_autocast_casts_inputs_as_torch_sdpa(dt):
    q, k, v = _qkv(torch.float32)
    qd = q.detach().to(dt).requires_grad_(True)
    m = torch.randn(13, 17)                          # a float mask is cast too
    with torch.autocast("cpu", dtype=dt):
        got = pt.scaled_dot_product_attention(qd, k, v, m)     # mixed dtypes
        ref = F.scaled_dot_product_attention(qd, k, v, m)
        raw = torch.ops.pyattn.sdpa(q, k, v, None, 0.0, 0, None, False, None, -1, -1, None, None, None, None)
    assert got.dtype == ref.dtype == dt
    want = pt.scaled_dot_product_attention(qd, k.to(dt), v.to(dt), m.to(dt))
    assert torch.equal(got, want)                    # the casts, then the 16-bit call
    plain = torch.ops.pyattn.sdpa(q.to(dt), k.to(dt), v.to(dt), None, 0.0, 0, None, False, None, -1, -1,
                                  None, None, None, None)
    assert torch.equal(raw[0], plain[0])             # the rule sits on the op itself
    got.float().sum().backward()                     # gradients reach the float32 keys through the casts
    assert k.grad.dtype == torch.float32 and v.grad.dtype == torch.float32 and qd.grad.dtype == dt
    assert k.grad.abs().sum() > 0


def test_autocast_leaves_float64_and_is_off_outside():
    q, k, v = _qkv(torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert pt.scaled_dot_product_attention(q, k, v).dtype == torch.float64   # autocast skips float64
        with pytest.raises(TypeError, match="one dtype.*under torch.autocast"):
            pt.scaled_dot_product_attention(q, k.float(), v)                   # float64 with bfloat16
    with pytest.raises(TypeError, match="one dtype"):
        pt.scaled_dot_product_attention(q.bfloat16(), k.float(), v.float())    # no autocast: refused


class _MixedBlock(torch.nn.Module):
    """Under autocast the query (from a Linear) is bfloat16, the keys and
    values (x itself) float32: PyTorch's SDPA takes that mix."""
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        q = self.proj(x).view(2, 10, 2, 8).transpose(1, 2)
        kv = x.view(2, 10, 2, 8).transpose(1, 2)
        return pt.scaled_dot_product_attention(q, kv, kv, is_causal=True)


def test_autocast_under_torch_compile():
    torch.manual_seed(0)
    m = _MixedBlock()
    x = torch.randn(2, 10, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = m(x)
        got = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    assert want.dtype == got.dtype == torch.bfloat16
    assert torch.equal(got, want)
