"""FlashAttention's Python interface on the CPU (``flash_attn_func`` and friends).

Code written against ``flash_attn`` runs on pyattn by changing one import::

    from flash_attn import flash_attn_func, flash_attn_with_kvcache   # CUDA / ROCm
    from pyattn.flash import flash_attn_func, flash_attn_with_kvcache # any CPU

The functions take FlashAttention's arguments, defaults, layouts and return
values, on CPU ``torch.Tensor``s (differentiable: pyattn's fused backward
runs under ``torch.autograd``) or on NumPy arrays (then NumPy results, no
autograd). Layouts are FlashAttention's token-major ones, read in place by
strides (never copied): ``q (B, L, Hq, E)``, ``k``/``v (B, S, Hkv, E)``,
``qkv (B, L, 3, H, E)``, ``kv (B, S, 2, Hkv, E)``, caches ``(B, S_max, Hkv,
E)``; results ``out (B, L, Hq, Ev)`` in q's dtype, ``softmax_lse (B, Hq, L)``
(float32; float64 for float64 inputs).

``unpad_input`` / ``pad_input`` (``from pyattn.flash.bert_padding import
unpad_input, pad_input``, as ``flash_attn.bert_padding``) turn a padded batch
and its mask into the varlen functions' packed rows and back.

What differs from FlashAttention on a GPU:

- dtypes: float16 and bfloat16 as FlashAttention (computed in float32,
  rounded into the result), and float32 / float64 too (pyattn's extension);
  any other dtype (integers, bool, complex) is a ``TypeError`` (also a
  ``RuntimeError``, what FlashAttention raises), as is a mix of dtypes.
- errors name FlashAttention's arguments and its token-major layouts
  ``(batch, seqlen, nheads, headdim)``; those FlashAttention raises as a
  ``RuntimeError`` are a ``ValueError`` that is also a ``RuntimeError``.
- conventions that are FlashAttention's, kept here (pyattn's own API keeps
  its documented ones): causal, the window and ALiBi are aligned to the
  bottom right when ``L != S`` (pyattn's ``align="bottom_right"``); the lse
  of a row with no admissible key is ``+inf``; under causal (without a left
  window) ALiBi adds ``slope * j`` (pyattn: ``-slope * (d(i) - j)``; the same
  outputs, an lse larger by ``slope * d(i)``).
- ``deterministic`` is accepted (pyattn is always deterministic: the same
  bits for any thread count); ``num_splits`` is accepted and ignored
  (pyattn splits long caches over threads by itself).
- dropout draws its seed from torch's CPU generator (tensors) or fresh
  entropy (NumPy arrays); the backward regenerates the same pattern.
- ``return_attn_probs=True`` with ``dropout_p > 0`` returns ``S_dmask``
  ``(B, Hq, L, S)``: the probabilities divided by their row maximum (one
  block per row, ``_get_block_size_n`` says so), negative where dropped
  (varlen: ``(N, Hq, max_seqlen_q, max_seqlen_k)``, zeros past each
  sequence's lengths).
- tensors on a GPU are a ``NotImplementedError`` (this is the CPU path).

Examples
--------
>>> import numpy as np
>>> from pyattn.flash import flash_attn_func
>>> q, k, v = np.random.default_rng(0).standard_normal((3, 2, 5, 4, 8)).astype(np.float32)
>>> flash_attn_func(q, k, v, causal=True).shape
(2, 5, 4, 8)
"""
from __future__ import annotations

import inspect
import math
import sys

import numpy as np

from . import _api, _grad, _kvapi
from ._bridge import bf16_numpy, is_tensor as _is_tensor, to_tensor as _tensor
from . import _bert_padding as bert_padding
from ._bert_padding import pad_input, unpad_input
from ._checks import is16, window_arg

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "unpad_input", "pad_input"]

# `from pyattn.flash.bert_padding import unpad_input` as `from flash_attn.bert_padding
# import ...` (a module registered under that name, as os.path is)
sys.modules.setdefault(__name__ + ".bert_padding", bert_padding)


# ---- tensors <-> arrays (views, never copies) -------------------------------

def _arr(x, name):
    """x as an ndarray sharing x's memory (a CPU tensor's, bfloat16 as
    ml_dtypes' bfloat16), or np.asarray(x)."""
    if x is None:
        return None
    if not _is_tensor(x):
        return np.asarray(x)
    if x.device.type != "cpu":
        raise NotImplementedError(f"{name} is on {x.device}: pyattn.flash runs on the CPU (move it "
                                  "with .cpu(), or use flash_attn itself on the GPU)")
    t = x.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if "bfloat16" in str(t.dtype):
        return bf16_numpy(t)
    return t.numpy()


def _seed(tensors):
    """A dropout seed: from torch's CPU generator for tensors (torch.manual_seed
    makes it repeatable), else fresh entropy."""
    if tensors:
        import torch
        return int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 2)


def _get_block_size_n(device=None, head_dim=None, is_dropout=None, is_causal=None):
    """The key block of ``S_dmask``'s scaling (FlashAttention's private helper of
    that name, which its tests call): pyattn scales each row of ``S_dmask`` by
    its maximum over the whole row, one block."""
    return 1 << 40


class _CheckError(ValueError, RuntimeError):
    """A bad argument FlashAttention rejects with a ``RuntimeError`` (its
    TORCH_CHECKs): a ``ValueError`` as pyattn's API raises, and a
    ``RuntimeError`` as code written against FlashAttention catches."""


# ---- options -----------------------------------------------------------------

def _window(window_size, causal, S):
    """FlashAttention's (left, right) as pyattn's window; (-1: unbounded; a
    side >= S is unbounded too, as FlashAttention normalises it) and whether
    FlashAttention runs it as causal (its ALiBi lse rule)."""
    if window_size is None:
        window_size = (-1, -1)
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints (-1: unbounded), got {window_size!r}") from None
    if causal:
        right = 0
    left = -1 if left < 0 or left >= S else left
    right = -1 if right < 0 or right >= S else right
    return window_arg(left, right), left < 0 and right == 0


def _softcap(softcap):
    return None if softcap is None or float(softcap) <= 0 else float(softcap)


def _slopes(alibi_slopes):
    a = _arr(alibi_slopes, "alibi_slopes")
    return None if a is None else np.asarray(a, np.float64)


def _fa_lse(lse, slopes, fa_causal, pos):
    """pyattn's lse -> FlashAttention's: +inf for a row with nothing admissible;
    plus slope * d(i) under causal ALiBi. lse (B, H, L); pos: d(i), (L,) or (B, 1, L)."""
    out = np.where(np.isneginf(lse), np.inf, lse) if np.isneginf(lse).any() else lse
    if slopes is not None and fa_causal:
        sl = slopes.reshape(slopes.shape + (1,))
        out = (out + (sl * pos).astype(lse.dtype)).astype(lse.dtype)
    return out


class _DtypeError(TypeError, RuntimeError):
    """A dtype FlashAttention refuses (its RuntimeError "FlashAttention only
    support fp16 and bf16 data type"): a ``TypeError`` as pyattn's API
    raises, and a ``RuntimeError`` as code written against FlashAttention
    catches."""


def _same_dtype(named):
    """Every array float16, bfloat16, float32 or float64 (FlashAttention's two
    and pyattn's), and one dtype for all; _DtypeError naming the argument."""
    for a, n in named:
        if a is not None and not (is16(a.dtype) or a.dtype in (np.float32, np.float64)):
            raise _DtypeError(f"{n} has dtype {a.dtype}: FlashAttention takes float16 or bfloat16 "
                              "(pyattn.flash also float32 and float64); convert it, e.g. "
                              f"{n}.to(torch.bfloat16) or {n}.astype(np.float32)")
    dts = {a.dtype for a, _ in named if a is not None}
    if len(dts) > 1:
        raise _DtypeError("FlashAttention takes one dtype for " + ", ".join(n for _, n in named) +
                          f"; got {', '.join(f'{n}: {a.dtype}' for a, n in named if a is not None)}")


def _shape_check(ok, what, named, layout):
    """_CheckError unless ok: what is wrong, with each named array's shape and
    FlashAttention's layout of it."""
    if not ok:
        shapes = ", ".join(f"{n} {tuple(a.shape)} {layout[n]}" for a, n in named if a is not None)
        raise _CheckError(f"{what} ({shapes})")


_FIXED = {"q": "(batch, seqlen_q, nheads, headdim)", "k": "(batch, seqlen_k, nheads_k, headdim)",
          "v": "(batch, seqlen_k, nheads_k, headdim_v)"}
_VARLEN = {"q": "(total_q, nheads, headdim)", "k": "(total_k, nheads_k, headdim)",
           "v": "(total_k, nheads_k, headdim_v)"}
_CACHE = {"q": "(batch, seqlen_q, nheads, headdim)",
          "k_cache": "(batch_cache, seqlen_cache, nheads_k, headdim) or (num_blocks, page_block_size, "
                     "nheads_k, headdim)",
          "v_cache": "(like k_cache, its last axis headdim_v)", "k": "(batch, seqlen_new, nheads_k, headdim)",
          "v": "(batch, seqlen_new, nheads_k, headdim_v)"}


def _qkv_shapes(q, k, v, layout):
    """FlashAttention's shape rules for q, k, v (token-major; the batch axis
    first when there is one), its names in the messages."""
    named = ((q, "q"), (k, "k"), (v, "v"))
    nd = 4 if layout is _FIXED else 3
    for x, n in named:
        if x.ndim != nd:
            raise _CheckError(f"{n} must be {layout[n]}, got shape {tuple(x.shape)}")
    h = nd - 2                                            # the heads axis
    if nd == 4:
        _shape_check(q.shape[0] == k.shape[0] == v.shape[0], "q, k and v must have the same batch size",
                     named, layout)
    _shape_check(k.shape[:h + 1] == v.shape[:h + 1], "k and v must have the same seqlen and nheads_k",
                 named, layout)
    _shape_check(q.shape[-1] == k.shape[-1], "q and k must have the same headdim", named, layout)
    _shape_check(k.shape[h] > 0 and q.shape[h] % k.shape[h] == 0,
                 f"number of heads in key/value (nheads_k = {k.shape[h]}) must divide number of heads in "
                 f"query (nheads = {q.shape[h]})", named, layout)


# ---- the fixed-length forward and backward (NumPy) ---------------------------

def _forward(q, k, v, o):
    """out (B, L, Hq, Ev) of q's dtype, FlashAttention's lse, pyattn's lse,
    S_dmask or None; q, k, v token-major arrays, o the options."""
    _same_dtype(((q, "q"), (k, "k"), (v, "v")))
    _qkv_shapes(q, k, v, _FIXED)
    B, L, Hq, _ = q.shape
    S, Hkv, Ev = k.shape[1], k.shape[2], v.shape[3]
    win, fa_causal = _window(o["window_size"], o["causal"], S)
    slopes = _slopes(o["alibi_slopes"])
    odt = q.dtype if (is16(q.dtype) or q.dtype in (np.float32, np.float64)) else np.dtype(np.float64)
    out = np.empty((B, L, Hq, Ev), odt)
    kw = dict(dropout_p=o["dropout_p"], is_causal="bottom_right" if o["causal"] else False,
              scale=o["softmax_scale"], enable_gqa=Hq != Hkv, rng=o["seed"], window=win,
              alibi_slopes=slopes, softcap=_softcap(o["softcap"]), align="bottom_right")
    qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    probs = o["return_attn_probs"] and o["dropout_p"] > 0
    res = _api.scaled_dot_product_attention(qt, kt, vt, out=out.transpose(0, 2, 1, 3), return_lse=True,
                                            return_weights=probs, **kw)
    lse = res[-1]
    s_dmask = None
    if probs:
        kw["dropout_p"] = 0.0
        p = _api.scaled_dot_product_attention(qt, kt, vt, return_weights=True, **kw)[1]
        top = p.max(axis=-1, keepdims=True)
        s = np.divide(p, top, out=np.zeros_like(p), where=top > 0)
        s_dmask = np.where((res[1] == 0) & (p > 0), -s, s).astype(odt)
    fa = _fa_lse(lse, slopes, fa_causal, np.arange(L) + (S - L))
    return out, fa, lse, s_dmask


def _backward(dout, q, k, v, out, lse, o):
    B, L, Hq, _ = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    win, _ = _window(o["window_size"], o["causal"], S)
    t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    g = _grad.scaled_dot_product_attention_backward(
        t(dout), t(q), t(k), t(v), t(out), lse, None, o["dropout_p"],
        "bottom_right" if o["causal"] else False, o["softmax_scale"], Hq != Hkv, rng=o["seed"],
        window=win, alibi_slopes=_slopes(o["alibi_slopes"]), softcap=_softcap(o["softcap"]),
        align="bottom_right")
    return tuple(t(x) for x in g)


_FN = {}


def _autograd_fn(kind):
    """A torch.autograd.Function running fwd/bwd (NumPy, in place on the
    tensors' memory) -- made once, on first use (torch stays optional)."""
    if kind in _FN:
        return _FN[kind]
    import torch

    fwd, bwd = _VARIANTS[kind]

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, opts):
            a = [_arr(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
            out, fa_lse, lse, s_dmask = fwd(*a, opts)
            ctx.save_for_backward(q, k, v)
            ctx.pa = (out, lse, opts)
            res = (_tensor(out), _tensor(np.ascontiguousarray(fa_lse)),
                   None if s_dmask is None else _tensor(s_dmask))
            ctx.mark_non_differentiable(*[r for r in res[1:] if r is not None])
            return res

        @staticmethod
        def backward(ctx, dout, *_unused):
            q, k, v = ctx.saved_tensors
            out, lse, opts = ctx.pa
            a = [_arr(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))]
            g = bwd(_arr(dout, "dout"), *a, out, lse, opts)
            return tuple(_tensor(np.ascontiguousarray(x)).to(t.dtype) for x, t in zip(g, (q, k, v))) + (None,)

    _FN[kind] = _Fn
    return _Fn


def _run(kind, q, k, v, opts):
    """FlashAttention's return: out, or (out, softmax_lse, S_dmask)."""
    tensors = [x for x in (q, k, v) if _is_tensor(x)]
    opts["seed"] = _seed(bool(tensors)) if opts["dropout_p"] > 0 else None
    if tensors:
        out, lse, s_dmask = _autograd_fn(kind).apply(q, k, v, opts)
    else:
        fwd = _VARIANTS[kind][0]
        out, lse, _, s_dmask = fwd(*(_arr(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"))), opts)
    return (out, lse, s_dmask) if opts["return_attn_probs"] else out


def _opts(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs):
    return dict(dropout_p=float(dropout_p), softmax_scale=softmax_scale, causal=bool(causal),
                window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                return_attn_probs=bool(return_attn_probs))


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention's ``flash_attn_func`` on the CPU (see the module docstring).

    Shapes: ``q (B, L, Hq, E)``, ``k (B, S, Hkv, E)``, ``v (B, S, Hkv, Ev)``
    with ``Hq % Hkv == 0`` (MQA/GQA: query head h uses key/value head
    ``h // (Hq // Hkv)``) -> ``out (B, L, Hq, Ev)`` of q's dtype.

    Parameters
    ----------
    q, k, v : CPU torch.Tensor or ndarray, one dtype (float16, bfloat16,
        float32 or float64), any strides (read in place)
    dropout_p : float in [0, 1)
    softmax_scale : float, optional (``1/sqrt(E)``)
    causal : bool -- bottom-right aligned (``j <= i + S - L``)
    window_size : (left, right), -1 = unbounded: query i sees keys
        ``[i + S - L - left, i + S - L + right]``
    softcap : float, ``<= 0`` means none
    alibi_slopes : ``(Hq,)`` or ``(B, Hq)``: adds ``-slope * |i + S - L - j|``
    deterministic : accepted (always deterministic)
    return_attn_probs : also return ``softmax_lse (B, Hq, L)`` and ``S_dmask``
        (``(B, Hq, L, S)`` with dropout, else None); testing only, as in
        FlashAttention

    Returns
    -------
    ``out``, or ``(out, softmax_lse, S_dmask)``. Tensors in: tensors out,
    differentiable with respect to q, k, v.

    Raises
    ------
    ValueError / TypeError as :func:`pyattn.scaled_dot_product_attention`
    (shapes, dtypes that differ); NotImplementedError for GPU tensors.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.flash import flash_attn_func
    >>> q = np.random.default_rng(0).standard_normal((1, 3, 2, 8)).astype(np.float32)
    >>> out, lse, _ = flash_attn_func(q, q, q, causal=True, return_attn_probs=True)
    >>> out.shape, lse.shape
    ((1, 3, 2, 8), (1, 2, 3))
    """
    return _run("fixed", q, k, v, _opts(dropout_p, softmax_scale, causal, window_size, softcap,
                                       alibi_slopes, return_attn_probs))


def _unbind(x, n, axis, name, what):
    if x is None or getattr(x, "ndim", 0) <= axis or x.shape[axis] != n:
        raise ValueError(f"{name} must be {what}, got shape {getattr(x, 'shape', None)}")
    if _is_tensor(x):
        return x.unbind(axis)
    return tuple(np.take(np.asarray(x), i, axis=axis) for i in range(n)) if not isinstance(x, np.ndarray) \
        else tuple(x[(slice(None),) * axis + (i,)] for i in range(n))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """:func:`flash_attn_func` with ``qkv (B, L, 3, H, E)`` packed (views of it
    are read in place; the gradient is ``dqkv`` of the same shape).

    Parameters
    ----------
    qkv : CPU torch.Tensor or ndarray, ``(B, L, 3, H, E)``
        Queries, keys and values stacked on axis 2 (``S = L``, ``Hq = Hkv =
        H``); float16, bfloat16, float32 or float64, any strides.
    dropout_p : float in [0, 1), default 0.0
        Dropout on the attention weights (seeded from torch's CPU generator
        for tensors, fresh entropy for arrays; the backward regenerates the
        pattern).
    softmax_scale : float, optional
        Default ``1/sqrt(E)``.
    causal : bool, default False
        Bottom-right aligned (``j <= i + S - L``).
    window_size : (left, right), default (-1, -1)
        -1 = unbounded: query i sees keys ``[i + S - L - left, i + S - L +
        right]``.
    softcap : float, default 0.0
        ``<= 0`` means none; else ``s = softcap * tanh(s / softcap)``.
    alibi_slopes : ``(H,)`` or ``(B, H)``, optional
        Adds ``-slope * |i + S - L - j|`` to the scores.
    deterministic : bool, default False
        Accepted (pyattn is always deterministic).
    return_attn_probs : bool, default False
        Also return ``softmax_lse`` and ``S_dmask`` (``(B, H, L, L)`` with dropout,
        else None); testing only, as in FlashAttention.

    Returns
    -------
    out : ``(B, L, H, E)``
        Of qkv's dtype (tensors in: a tensor, differentiable with respect to
        ``qkv``).
    softmax_lse : ``(B, H, L)``
        float32 (float64 for float64 inputs); only with
        ``return_attn_probs``.
    S_dmask : ``(B, H, L, L)`` or None
        Only with ``return_attn_probs``: ``(out, softmax_lse, S_dmask)``.

    Raises
    ------
    ValueError
        ``qkv`` not ``(B, L, 3, H, E)``, and the errors of
        :func:`flash_attn_func` (a ``ValueError`` that is also a
        ``RuntimeError`` where FlashAttention raises one).
    TypeError
        A dtype other than the four above (also a ``RuntimeError``).
    NotImplementedError
        Tensors on a GPU.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.flash import flash_attn_qkvpacked_func
    >>> qkv = np.zeros((1, 4, 3, 2, 8), np.float32)
    >>> flash_attn_qkvpacked_func(qkv).shape
    (1, 4, 2, 8)
    >>> out, lse, s_dmask = flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    >>> lse.shape, s_dmask is None
    ((1, 2, 4), True)
    """
    q, k, v = _unbind(qkv, 3, 2, "qkv", "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """:func:`flash_attn_func` with ``kv (B, S, 2, Hkv, E)`` packed.

    Parameters
    ----------
    q : CPU torch.Tensor or ndarray, ``(B, L, Hq, E)``
        float16, bfloat16, float32 or float64 (``kv``'s dtype), any strides.
    kv : CPU torch.Tensor or ndarray, ``(B, S, 2, Hkv, E)``
        Keys and values stacked on axis 2, ``Hq % Hkv == 0`` (MQA/GQA);
        views of it are read in place (the gradient is ``dkv`` of its
        shape).
    dropout_p : float in [0, 1), default 0.0
        Dropout on the attention weights (seeded from torch's CPU generator
        for tensors, fresh entropy for arrays; the backward regenerates the
        pattern).
    softmax_scale : float, optional
        Default ``1/sqrt(E)``.
    causal : bool, default False
        Bottom-right aligned (``j <= i + S - L``).
    window_size : (left, right), default (-1, -1)
        -1 = unbounded: query i sees keys ``[i + S - L - left, i + S - L +
        right]``.
    softcap : float, default 0.0
        ``<= 0`` means none; else ``s = softcap * tanh(s / softcap)``.
    alibi_slopes : ``(Hq,)`` or ``(B, Hq)``, optional
        Adds ``-slope * |i + S - L - j|`` to the scores.
    deterministic : bool, default False
        Accepted (pyattn is always deterministic).
    return_attn_probs : bool, default False
        Also return ``softmax_lse`` and ``S_dmask`` (``(B, Hq, L, S)`` with dropout,
        else None); testing only, as in FlashAttention.

    Returns
    -------
    out : ``(B, L, Hq, E)``
        Of q's dtype (tensors in: a tensor, differentiable with respect to
        ``q`` and ``kv``).
    softmax_lse : ``(B, Hq, L)``
        float32 (float64 for float64 inputs); only with
        ``return_attn_probs``.
    S_dmask : ``(B, Hq, L, S)`` or None
        Only with ``return_attn_probs``: ``(out, softmax_lse, S_dmask)``.

    Raises
    ------
    ValueError
        ``kv`` not ``(B, S, 2, Hkv, E)``, and the errors of
        :func:`flash_attn_func` (shapes: a ``ValueError`` that is also a
        ``RuntimeError``).
    TypeError
        Dtypes other than the four above, or differing (also a
        ``RuntimeError``).
    NotImplementedError
        Tensors on a GPU.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.flash import flash_attn_kvpacked_func
    >>> q, kv = np.zeros((1, 4, 2, 8), np.float32), np.zeros((1, 6, 2, 1, 8), np.float32)
    >>> flash_attn_kvpacked_func(q, kv).shape
    (1, 4, 2, 8)
    """
    k, v = _unbind(kv, 2, 2, "kv", "(batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


# ---- packed sequences (varlen): pyattn.scaled_dot_product_attention_varlen ----

def _varlen_api():
    import pyattn
    f = getattr(pyattn, "scaled_dot_product_attention_varlen", None)
    b = getattr(pyattn, "scaled_dot_product_attention_varlen_backward", None)
    if f is None or b is None:
        raise NotImplementedError("flash_attn_varlen_func needs pyattn's varlen support "
                                  "(pyattn.scaled_dot_product_attention_varlen), which this pyattn lacks")
    return f, b


def _varlen_kw(o, q, k):
    cq, ck = np.asarray(o["cu_seqlens_q"], np.int64), np.asarray(o["cu_seqlens_k"], np.int64)
    lq, lk = np.diff(cq), np.diff(ck)
    S = int(lk.max(initial=0))
    win, fa_causal = _window(o["window_size"], o["causal"], max(S, 1))
    slopes = _slopes(o["alibi_slopes"])
    kw = dict(is_causal="bottom_right" if o["causal"] else False, scale=o["softmax_scale"],
              enable_gqa=q.shape[1] != k.shape[1], dropout_p=o["dropout_p"], rng=o["seed"],
              window=win, alibi_slopes=slopes, softcap=_softcap(o["softcap"]))
    if not o["causal"] and (win is not None or slopes is not None) and (lq != lk).any():
        kw["align"] = "bottom_right"     # FlashAttention's placement when L_i != S_i
    return cq, ck, kw, slopes, fa_causal, lq, lk


def _varlen_forward(q, k, v, o):
    _same_dtype(((q, "q"), (k, "k"), (v, "v")))
    _qkv_shapes(q, k, v, _VARLEN)
    f, _ = _varlen_api()
    cq, ck, kw, slopes, fa_causal, lq, lk = _varlen_kw(o, q, k)
    odt = q.dtype if (is16(q.dtype) or q.dtype in (np.float32, np.float64)) else np.dtype(np.float64)
    out = np.empty(q.shape[:2] + (v.shape[2],), odt)
    res, lse = f(q, k, v, cq, ck, return_lse=True, out=out, **kw)
    s_dmask = None
    if o["return_attn_probs"] and o["dropout_p"] > 0:
        s_dmask = _varlen_s_dmask(q, k, v, cq, ck, kw, o, odt)
    pos = np.repeat(lk - lq, lq) + (np.arange(q.shape[0]) - np.repeat(cq[:-1], lq))   # d(i), (total_q,)
    fa = lse.T                                                                    # (Hq, total_q)
    if slopes is not None and fa_causal:
        seq = np.repeat(np.arange(len(lq)), lq)
        sl = slopes[:, None] if slopes.ndim == 1 else slopes[seq].T
        fa = fa + (sl * pos).astype(lse.dtype)
    fa = np.where(np.isneginf(fa), np.inf, fa)
    return out, fa, lse, s_dmask


def _varlen_s_dmask(q, k, v, cq, ck, kw, o, odt):
    """S_dmask of a varlen call with dropout, FlashAttention's padded
    (N, Hq, max_seqlen_q, max_seqlen_k) layout (zeros past each sequence's
    lengths), each sequence's block as _forward makes it. Sequence i's
    dropout pattern is the dense call's on batch entry i with the same seed
    (pyattn.scaled_dot_product_attention_varlen's rule), so its weights come
    from the dense call on i + 1 stride-0 copies of it: testing only (as
    FlashAttention says of return_attn_probs), O(N^2) in the sequences."""
    n = len(cq) - 1
    lq, lk = np.diff(cq), np.diff(ck)
    mq = max(int(lq.max(initial=0)), int(o.get("max_seqlen_q") or 0))
    mk = max(int(lk.max(initial=0)), int(o.get("max_seqlen_k") or 0))
    sd = np.zeros((n, q.shape[1], mq, mk), odt)
    sl = kw.get("alibi_slopes")
    for i in range(n):
        if lq[i] == 0 or lk[i] == 0:
            continue
        qi, ki, vi = (x[c[i]:c[i + 1]].transpose(1, 0, 2) for x, c in ((q, cq), (k, ck), (v, ck)))
        kwi = dict(kw, alibi_slopes=None if sl is None else (sl if sl.ndim == 1 else sl[i]))
        qb = np.broadcast_to(qi, (i + 1,) + qi.shape)
        wd = _api.scaled_dot_product_attention(qb, ki, vi, return_weights=True, **kwi)[1][i]
        kwi.update(dropout_p=0.0, rng=None)
        p = _api.scaled_dot_product_attention(qi, ki, vi, return_weights=True, **kwi)[1]
        top = p.max(axis=-1, keepdims=True)
        s = np.divide(p, top, out=np.zeros_like(p), where=top > 0)
        sd[i, :, :lq[i], :lk[i]] = np.where((wd == 0) & (p > 0), -s, s)
    return sd


def _varlen_backward(dout, q, k, v, out, lse, o):
    _, b = _varlen_api()
    cq, ck, kw, *_ = _varlen_kw(o, q, k)
    return b(dout, q, k, v, out, lse, cq, ck, **kw)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """FlashAttention's ``flash_attn_varlen_func``: sequences packed along the
    first axis, ``q (total_q, Hq, E)``, ``k``/``v (total_k, Hkv, E)``,
    ``cu_seqlens_q``/``cu_seqlens_k (N + 1,)`` int offsets -> ``out (total_q,
    Hq, Ev)``, ``softmax_lse (Hq, total_q)``. ``max_seqlen_*`` are accepted
    (pyattn reads the lengths from the offsets). Runs on
    ``pyattn.scaled_dot_product_attention_varlen`` (window and ALiBi
    bottom-right per sequence when ``L_i != S_i``, as FlashAttention).
    ``S_dmask`` (``return_attn_probs`` with dropout) is ``(N, Hq,
    max_seqlen_q, max_seqlen_k)``, zeros past each sequence's lengths.
    With ``block_table``, ``k``/``v`` are paged pools ``(num_blocks,
    block_size, Hkv, E)`` and sequence ``i`` has ``cu_seqlens_k[i+1] -
    cu_seqlens_k[i]`` keys; forward only (no dropout, no autograd).

    Parameters
    ----------
    q : CPU torch.Tensor or ndarray, ``(total_q, Hq, E)``
        The N sequences' queries, one after another; float16, bfloat16,
        float32 or float64 (one dtype for ``q``, ``k``, ``v``), any strides.
    k : CPU torch.Tensor or ndarray, ``(total_k, Hkv, E)``
        Keys, ``Hq % Hkv == 0`` (MQA/GQA); with ``block_table`` the paged
        pool ``(num_blocks, block_size, Hkv, E)``.
    v : CPU torch.Tensor or ndarray, ``(total_k, Hkv, Ev)``
        Values (with ``block_table``: ``(num_blocks, block_size, Hkv, Ev)``).
    cu_seqlens_q : ``(N + 1,)`` int32 or int64
        Query offsets: sequence i holds rows ``cu_seqlens_q[i]`` to
        ``cu_seqlens_q[i + 1]`` of ``q``; from 0 to ``total_q``, not
        decreasing.
    cu_seqlens_k : ``(N + 1,)`` int32 or int64
        Key offsets, likewise (with ``block_table``: only their differences,
        each sequence's key count, are read).
    max_seqlen_q, max_seqlen_k : int
        Accepted (pyattn reads the lengths from the offsets; they only
        widen ``S_dmask``).
    dropout_p : float in [0, 1), default 0.0
        Dropout on the attention weights (seeded from torch's CPU generator
        for tensors, fresh entropy for arrays; the backward regenerates the
        pattern).
    softmax_scale : float, optional
        Default ``1/sqrt(E)``.
    causal : bool, default False
        Bottom-right aligned (``j <= i + S - L``, per sequence, ``L``/``S`` its own lengths).
    window_size : (left, right), default (-1, -1)
        -1 = unbounded: query i sees keys ``[i + S - L - left, i + S - L +
        right]``, per sequence, ``L``/``S`` its own lengths.
    softcap : float, default 0.0
        ``<= 0`` means none; else ``s = softcap * tanh(s / softcap)``.
    alibi_slopes : ``(Hq,)`` or ``(N, Hq)``, optional
        Adds ``-slope * |i + S - L - j|`` to the scores.
    deterministic : bool, default False
        Accepted (pyattn is always deterministic).
    return_attn_probs : bool, default False
        Also return ``softmax_lse`` and ``S_dmask`` (``(N, Hq, max_seqlen_q, max_seqlen_k)``, zeros past each sequence's lengths, with dropout,
        else None); testing only, as in FlashAttention.
    block_table : ``(N, max_blocks)`` int32 or int64, optional
        Sequence i's key row r is row ``r % block_size`` of pool block
        ``block_table[i, r // block_size]``; forward only (no dropout, no
        autograd).

    Returns
    -------
    out : ``(total_q, Hq, Ev)``
        Of q's dtype (tensors in: a tensor, differentiable with respect to
        q, k, v without ``block_table``).
    softmax_lse : ``(Hq, total_q)``
        float32 (float64 for float64 inputs); only with
        ``return_attn_probs``.
    S_dmask : ``(N, Hq, max_seqlen_q, max_seqlen_k)`` or None
        Only with ``return_attn_probs``: ``(out, softmax_lse, S_dmask)``.

    Raises
    ------
    ValueError
        Shapes that do not fit (FlashAttention's names and layouts in the
        message; a ``ValueError`` that is also a ``RuntimeError``), offsets
        that do not start at 0, decrease or do not end at the row count,
        and the errors of ``pyattn.scaled_dot_product_attention_varlen``.
    TypeError
        Dtypes other than the four above, or differing (also a
        ``RuntimeError``).
    NotImplementedError
        Tensors on a GPU; ``dropout_p > 0`` with ``block_table``.

    Examples
    --------
    Two sequences of 2 and 3 tokens, packed:

    >>> import numpy as np
    >>> from pyattn.flash import flash_attn_varlen_func
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 5, 2, 8)).astype(np.float32)
    >>> cu = np.array([0, 2, 5], np.int32)
    >>> out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, causal=True, return_attn_probs=True)
    >>> out.shape, lse.shape
    ((5, 2, 8), (2, 5))

    Each sequence's first token sees only its own key:

    >>> bool(np.allclose(out[0], v[0])), bool(np.allclose(out[2], v[2]))
    (True, True)
    """
    if block_table is not None:
        if float(dropout_p) > 0:
            raise NotImplementedError("flash_attn_varlen_func: dropout_p > 0 with block_table (paged keys) "
                                      "is not offered (the paged path is forward-only inference)")
        return _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table,
                             (softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs))
    opts = _opts(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs)
    opts["cu_seqlens_q"], opts["cu_seqlens_k"] = _arr(cu_seqlens_q, "cu_seqlens_q"), _arr(cu_seqlens_k, "cu_seqlens_k")
    opts["max_seqlen_q"], opts["max_seqlen_k"] = max_seqlen_q, max_seqlen_k
    return _run("varlen", q, k, v, opts)


def _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, opts):
    """flash_attn_varlen_func with a paged k/v pool (num_blocks, block_size, Hkv, E):
    forward only (as FlashAttention: the result is not attached to autograd), on attention_with_kvcache(block_table=,
    cu_seqlens_q=) with no new rows: sequence b's queries sit at the bottom
    right of its keys [0, cu_k[b+1] - cu_k[b]). opts: (softmax_scale, causal,
    window_size, softcap, alibi_slopes, return_attn_probs)."""
    softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs = opts
    if not _paged_supported():
        raise NotImplementedError("flash_attn_varlen_func(block_table=...) needs pyattn's paged KV cache "
                                  "support (attention_with_kvcache(block_table=...)), which this pyattn lacks")
    qa, ka, va = _arr(q, "q"), _arr(k, "k"), _arr(v, "v")
    _same_dtype(((qa, "q"), (ka, "k"), (va, "v")))
    cq = np.asarray(_arr(cu_seqlens_q, "cu_seqlens_q"), np.int64)
    ck = np.asarray(_arr(cu_seqlens_k, "cu_seqlens_k"), np.int64)
    bt = _arr(block_table, "block_table")
    win, fa_causal = _window(window_size, causal, bt.shape[1] * ka.shape[1])
    slopes = _slopes(alibi_slopes)
    odt = qa.dtype if (is16(qa.dtype) or qa.dtype in (np.float32, np.float64)) else np.dtype(np.float64)
    out = np.empty(qa.shape[:2] + (va.shape[3],), odt)
    t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    lk, lq = np.diff(ck), np.diff(cq)
    _, lse = _kvapi.attention_with_kvcache(
        qa, t(ka), t(va), cache_seqlens=lk, block_table=bt, cu_seqlens_q=cq, is_causal=bool(causal),
        scale=softmax_scale, window=win, alibi_slopes=slopes, softcap=_softcap(softcap), return_lse=True,
        out=out)
    fa = lse.T
    if slopes is not None and fa_causal:
        pos = np.repeat(lk - lq, lq) + (np.arange(qa.shape[0]) - np.repeat(cq[:-1], lq))
        seq = np.repeat(np.arange(len(lq)), lq)
        sl = slopes[:, None] if slopes.ndim == 1 else slopes[seq].T
        fa = fa + (sl * pos).astype(lse.dtype)
    fa = np.where(np.isneginf(fa), np.inf, fa)
    if _is_tensor(q):
        out, fa = _tensor(out), _tensor(np.ascontiguousarray(fa))
    return (out, fa, None) if return_attn_probs else out


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False, num_splits=0):
    """FlashAttention's private ``flash_attn_interface._flash_attn_varlen_forward``
    (its tests call it): ``(out, softmax_lse, S_dmask, rng_state)``, forward
    only (no autograd). With ``block_table``, ``k``/``v`` are the paged pools
    ``(num_blocks, block_size, Hkv, E)`` and ``seqused_k`` (else the
    ``cu_seqlens_k`` differences) the keys of each sequence;
    ``num_splits > 1`` is FlashAttention's RuntimeError there. ``leftpad_k``,
    and ``seqused_k`` without ``block_table``, are a NotImplementedError.
    ``S_dmask`` is None unless ``return_softmax`` with dropout;
    ``rng_state`` is two zeros (pyattn's dropout is not replayed from it)."""
    if leftpad_k is not None:
        raise NotImplementedError("_flash_attn_varlen_forward: leftpad_k is not offered (use "
                                  "flash_attn_with_kvcache(cache_leftpad=))")
    window = (window_size_left, window_size_right)
    if block_table is not None:
        if int(num_splits) > 1:
            raise _CheckError("num_splits > 1 is not supported for varlen paged KV")
        if float(dropout_p) > 0:
            raise NotImplementedError("_flash_attn_varlen_forward: dropout_p > 0 with block_table is not offered")
        if seqused_k is not None:
            used = np.asarray(_arr(seqused_k, "seqused_k"), np.int64)
            cu_seqlens_k = np.concatenate([[0], np.cumsum(used)])
        out, lse, _ = _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table,
                                    (softmax_scale, causal, window, softcap, alibi_slopes, True))
        s_dmask = None
    else:
        if seqused_k is not None:
            raise NotImplementedError("_flash_attn_varlen_forward: seqused_k is offered with block_table only")
        res = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                     softmax_scale, causal, window, softcap, alibi_slopes,
                                     return_attn_probs=True)
        out, lse, s_dmask = (x.detach() if _is_tensor(x) else x for x in res)
        if not return_softmax:
            s_dmask = None
    state = np.zeros(2, np.int64)
    return out, lse, s_dmask, (_tensor(state) if _is_tensor(q) else state)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), softcap=0.0,
                                     alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """:func:`flash_attn_varlen_func` with ``qkv (total, 3, H, E)`` packed.

    Parameters
    ----------
    qkv : CPU torch.Tensor or ndarray, ``(total, 3, H, E)``
        The N sequences' queries, keys and values stacked on axis 1 (views
        read in place; the gradient is ``dqkv`` of its shape); float16,
        bfloat16, float32 or float64.
    cu_seqlens : ``(N + 1,)`` int32 or int64
        Offsets (for queries and keys alike): sequence i holds rows
        ``cu_seqlens[i]`` to ``cu_seqlens[i + 1]``.
    max_seqlen : int
        Accepted (pyattn reads the lengths from the offsets).
    dropout_p : float in [0, 1), default 0.0
        Dropout on the attention weights (seeded from torch's CPU generator
        for tensors, fresh entropy for arrays; the backward regenerates the
        pattern).
    softmax_scale : float, optional
        Default ``1/sqrt(E)``.
    causal : bool, default False
        Bottom-right aligned (``j <= i + S - L``, per sequence, ``L = S`` its length).
    window_size : (left, right), default (-1, -1)
        -1 = unbounded: query i sees keys ``[i + S - L - left, i + S - L +
        right]``, per sequence, ``L = S`` its length.
    softcap : float, default 0.0
        ``<= 0`` means none; else ``s = softcap * tanh(s / softcap)``.
    alibi_slopes : ``(H,)`` or ``(N, H)``, optional
        Adds ``-slope * |i + S - L - j|`` to the scores.
    deterministic : bool, default False
        Accepted (pyattn is always deterministic).
    return_attn_probs : bool, default False
        Also return ``softmax_lse`` and ``S_dmask`` (``(N, H, max_seqlen, max_seqlen)``, zeros past each sequence's lengths, with dropout,
        else None); testing only, as in FlashAttention.

    Returns
    -------
    out : ``(total, H, E)``
        Of qkv's dtype (tensors in: a tensor, differentiable with respect to
        ``qkv``).
    softmax_lse : ``(H, total)``
        float32 (float64 for float64 inputs); only with
        ``return_attn_probs``.
    S_dmask : ``(N, H, max_seqlen, max_seqlen)`` or None
        Only with ``return_attn_probs``: ``(out, softmax_lse, S_dmask)``.

    Raises
    ------
    ValueError
        ``qkv`` not ``(total, 3, H, E)``, and the errors of
        :func:`flash_attn_varlen_func`.
    TypeError
        A dtype other than the four above (also a ``RuntimeError``).
    NotImplementedError
        Tensors on a GPU.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.flash import flash_attn_varlen_qkvpacked_func
    >>> qkv = np.random.default_rng(0).standard_normal((5, 3, 2, 8)).astype(np.float32)
    >>> flash_attn_varlen_qkvpacked_func(qkv, np.array([0, 2, 5], np.int32), 3, causal=True).shape
    (5, 2, 8)
    """
    q, k, v = _unbind(qkv, 3, 1, "qkv", "(total, 3, nheads, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False):
    """:func:`flash_attn_varlen_func` with ``kv (total_k, 2, Hkv, E)`` packed.

    Parameters
    ----------
    q : CPU torch.Tensor or ndarray, ``(total_q, Hq, E)``
        The N sequences' queries; float16, bfloat16, float32 or float64
        (``kv``'s dtype).
    kv : CPU torch.Tensor or ndarray, ``(total_k, 2, Hkv, E)``
        Keys and values stacked on axis 1, ``Hq % Hkv == 0`` (views read in
        place; the gradient is ``dkv`` of its shape).
    cu_seqlens_q, cu_seqlens_k : ``(N + 1,)`` int32 or int64
        Query and key offsets: sequence i holds rows ``cu[i]`` to
        ``cu[i + 1]``.
    max_seqlen_q, max_seqlen_k : int
        Accepted (pyattn reads the lengths from the offsets).
    dropout_p : float in [0, 1), default 0.0
        Dropout on the attention weights (seeded from torch's CPU generator
        for tensors, fresh entropy for arrays; the backward regenerates the
        pattern).
    softmax_scale : float, optional
        Default ``1/sqrt(E)``.
    causal : bool, default False
        Bottom-right aligned (``j <= i + S - L``, per sequence, ``L``/``S`` its own lengths).
    window_size : (left, right), default (-1, -1)
        -1 = unbounded: query i sees keys ``[i + S - L - left, i + S - L +
        right]``, per sequence, ``L``/``S`` its own lengths.
    softcap : float, default 0.0
        ``<= 0`` means none; else ``s = softcap * tanh(s / softcap)``.
    alibi_slopes : ``(Hq,)`` or ``(N, Hq)``, optional
        Adds ``-slope * |i + S - L - j|`` to the scores.
    deterministic : bool, default False
        Accepted (pyattn is always deterministic).
    return_attn_probs : bool, default False
        Also return ``softmax_lse`` and ``S_dmask`` (``(N, Hq, max_seqlen_q, max_seqlen_k)``, zeros past each sequence's lengths, with dropout,
        else None); testing only, as in FlashAttention.

    Returns
    -------
    out : ``(total_q, Hq, E)``
        Of q's dtype (tensors in: a tensor, differentiable with respect to
        ``q`` and ``kv``).
    softmax_lse : ``(Hq, total_q)``
        float32 (float64 for float64 inputs); only with
        ``return_attn_probs``.
    S_dmask : ``(N, Hq, max_seqlen_q, max_seqlen_k)`` or None
        Only with ``return_attn_probs``: ``(out, softmax_lse, S_dmask)``.

    Raises
    ------
    ValueError
        ``kv`` not ``(total_k, 2, Hkv, E)``, and the errors of
        :func:`flash_attn_varlen_func`.
    TypeError
        Dtypes other than the four above, or differing (also a
        ``RuntimeError``).
    NotImplementedError
        Tensors on a GPU.

    Examples
    --------
    Two sequences: 1 and 2 queries over 3 and 4 keys, one key/value head:

    >>> import numpy as np
    >>> from pyattn.flash import flash_attn_varlen_kvpacked_func
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((3, 2, 8)).astype(np.float32)
    >>> kv = rng.standard_normal((7, 2, 1, 8)).astype(np.float32)
    >>> cu_q, cu_k = np.array([0, 1, 3], np.int32), np.array([0, 3, 7], np.int32)
    >>> flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 2, 4, causal=True).shape
    (3, 2, 8)
    """
    k, v = _unbind(kv, 2, 1, "kv", "(total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs)


_VARIANTS = {"fixed": (_forward, _backward), "varlen": (_varlen_forward, _varlen_backward)}


# ---- the KV cache ------------------------------------------------------------

def _paged_supported():
    return "block_table" in inspect.signature(_kvapi.attention_with_kvcache).parameters


def _table_bounds(cache_seqlens, Tk, S_max, tshape, pshape):
    """FlashAttention's guard: every sequence's rows (cache_seqlens + the new
    keys) within its block_table row's capacity, else a _CheckError naming
    block_table (pyattn would say so too, naming cache_seqlens)."""
    if cache_seqlens is None:
        return
    n = np.asarray(_arr(cache_seqlens, "cache_seqlens"))
    if n.dtype.kind not in "iu":
        return                                  # pyattn's TypeError follows
    over = np.nonzero(n.reshape(-1).astype(np.int64) > S_max - Tk)[0]
    if over.size:
        b = int(over[0])
        raise _CheckError(f"cache_seqlens[{b}] = {int(n.reshape(-1)[b])} plus {Tk} new keys exceeds the "
                          f"block_table capacity {S_max} (block_table shape {tuple(tshape)} x block size "
                          f"{pshape[1]}); nothing was written")


def _cache_shapes(q, kc, vc, k, v):
    """FlashAttention's shape rules for flash_attn_with_kvcache, its names."""
    named = ((q, "q"), (kc, "k_cache"), (vc, "v_cache"), (k, "k"), (v, "v"))
    for x, n in named:
        if x is not None and x.ndim != 4:
            raise _CheckError(f"{n} must be {_CACHE[n]}, got shape {tuple(x.shape)}")
    _shape_check(kc.shape[:3] == vc.shape[:3], "k_cache and v_cache must agree but for headdim",
                 named, _CACHE)
    _shape_check(q.shape[3] == kc.shape[3], "q and k_cache must have the same headdim", named, _CACHE)
    _shape_check(kc.shape[2] > 0 and q.shape[2] % kc.shape[2] == 0,
                 f"number of heads in key/value (nheads_k = {kc.shape[2]}) must divide number of heads "
                 f"in query (nheads = {q.shape[2]})", named, _CACHE)
    if (k is None) != (v is None):
        raise _CheckError("k and v must be given together (new keys and their values)")
    if k is not None:
        _shape_check(k.shape[0] == q.shape[0] and k.shape[2:] == kc.shape[2:] and v.shape[:3] == k.shape[:3]
                     and v.shape[3] == vc.shape[3],
                     "k and v must be (batch, seqlen_new, nheads_k, headdim[_v]) with q's batch and the "
                     "caches' nheads_k and headdims", named, _CACHE)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                            softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """FlashAttention's ``flash_attn_with_kvcache`` on the CPU, on
    :func:`pyattn.attention_with_kvcache` (no backward, as FlashAttention).

    Query row t sits at cache position ``n_b + Tk - T + t``; causal, the
    window and ALiBi use those positions; rotary rotates (in C) the new keys
    at ``n_b + t`` as they are written and the queries at ``n_b + t`` (causal
    or a window) or all at ``n_b`` (FlashAttention's rule).

    Parameters
    ----------
    q : CPU torch.Tensor or ndarray, ``(B, T, Hq, E)``
        Token-major, read in place; float16, bfloat16, float32 or float64,
        one dtype for ``q``, the caches and ``k``/``v``.
    k_cache : CPU torch.Tensor or ndarray, ``(B_cache, S_max, Hkv, E)``
        Or with ``block_table`` ``(num_blocks, block_size, Hkv, E)``;
        ``Hq % Hkv == 0``. Written in place where ``k`` is given (it must be
        writeable: a tensor, or a writeable array).
    v_cache : CPU torch.Tensor or ndarray, ``(B_cache, S_max, Hkv, Ev)``
        As ``k_cache`` (with ``block_table``: ``(num_blocks, block_size,
        Hkv, Ev)``).
    k : CPU torch.Tensor or ndarray, ``(B, Tk, Hkv, E)``, optional
        New rows (any Tk), written into the caches in place at rows
        ``cache_seqlens[b] + t`` before the attention; with ``v`` only.
    v : CPU torch.Tensor or ndarray, ``(B, Tk, Hkv, Ev)``, optional
        The new rows' values.
    rotary_cos, rotary_sin : ``(R, rotary_dim / 2)``, optional
        Rotary embedding (with ``k``/``v``): the first ``rotary_dim``
        features rotate.
    cache_seqlens : int or ``(B,)`` integers, optional
        Rows filled per sequence (``n_b``) before the call; None: the caches
        are full (``S_max`` rows).
    cache_batch_idx : ``(B,)`` integers, optional
        Sequence b reads (and writes) cache entry ``cache_batch_idx[b]``.
    cache_leftpad : ``(B,)`` integers, optional
        Sequence b's keys start at cache row ``cache_leftpad[b]``.
    block_table : ``(B, max_blocks)`` integers, optional
        Paged caches: sequence b's row r is row ``r % block_size`` of block
        ``block_table[b, r // block_size]``.
    softmax_scale : float, optional
        Default ``1/sqrt(E)``.
    causal : bool, default False
        Bottom-right causal on the cache positions.
    window_size : (left, right), default (-1, -1)
        -1 = unbounded: query row t sees keys ``[p - left, p + right]``,
        ``p`` its cache position.
    softcap : float, default 0.0
        ``<= 0`` means none.
    rotary_interleaved : bool, default True
        ``True`` (GPT-J pairs ``2i``, ``2i + 1``) is FlashAttention's
        default; ``False``: features ``i`` and ``i + rotary_dim / 2``
        (GPT-NeoX, Llama).
    alibi_slopes : ``(Hq,)`` or ``(B, Hq)``, optional
        ALiBi slopes, on the cache positions.
    num_splits : int, default 0
        Ignored (pyattn splits long caches over threads by itself).
    return_softmax_lse : bool, default False
        Also return ``softmax_lse``.

    Returns
    -------
    out : ``(B, T, Hq, Ev)``
        Of q's dtype (a tensor for tensors).
    softmax_lse : ``(B, Hq, T)``
        float32 (float64 for float64 inputs); only with
        ``return_softmax_lse`` (then ``(out, softmax_lse)``).

    Raises
    ------
    ValueError
        As :func:`pyattn.attention_with_kvcache` (shapes, lengths past the
        cache, a read-only cache with new rows, ...), with FlashAttention's
        names (a ``ValueError`` that is also a ``RuntimeError``).
    TypeError
        As :func:`pyattn.attention_with_kvcache`; dtypes other than the four
        above, or differing (also a ``RuntimeError``).
    NotImplementedError
        GPU tensors, or ``block_table`` where pyattn lacks paged caches.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.flash import flash_attn_with_kvcache
    >>> kc = np.zeros((1, 16, 2, 8), np.float32); vc = np.zeros_like(kc)
    >>> q, k, v = np.ones((3, 1, 1, 2, 8), np.float32)
    >>> flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, causal=True).shape
    (1, 1, 2, 8)

    The new row was written into the caches, in place:

    >>> float(kc[0, 0, 0, 0]), float(kc[0, 1, 0, 0])
    (1.0, 0.0)
    """
    qa, kca, vca = _arr(q, "q"), _arr(k_cache, "k_cache"), _arr(v_cache, "v_cache")
    ka, va = _arr(k, "k"), _arr(v, "v")
    _same_dtype(((qa, "q"), (kca, "k_cache"), (va, "v"), (ka, "k"), (vca, "v_cache")))
    _cache_shapes(qa, kca, vca, ka, va)
    B, T, Hq, _ = qa.shape
    t = lambda x: None if x is None else x.transpose(0, 2, 1, 3)  # noqa: E731
    kw = {}
    if block_table is not None:
        if not _paged_supported():
            raise NotImplementedError("block_table needs pyattn's paged KV cache support "
                                      "(attention_with_kvcache(block_table=...)), which this pyattn lacks")
        kw["block_table"] = _arr(block_table, "block_table")
        S_max = kw["block_table"].shape[1] * kca.shape[1]
        _table_bounds(cache_seqlens, 0 if ka is None else ka.shape[1], S_max, kw["block_table"].shape, kca.shape)
    else:
        S_max = kca.shape[1]
    if cache_seqlens is None:
        cache_seqlens = S_max
    elif _is_tensor(cache_seqlens):
        cache_seqlens = _arr(cache_seqlens, "cache_seqlens")
    Tk = 0 if ka is None else ka.shape[1]
    win, fa_causal = _window(window_size, causal, S_max)
    slopes = _slopes(alibi_slopes)
    odt = qa.dtype if (is16(qa.dtype) or qa.dtype in (np.float32, np.float64)) else np.dtype(np.float64)
    cd = np.dtype(np.float64) if np.float64 in (qa.dtype, kca.dtype) else np.dtype(np.float32)
    out = np.empty((B, T, Hq, vca.shape[3]), odt if (is16(odt) or odt == cd) else cd)
    res = _kvapi.attention_with_kvcache(
        t(qa), t(kca), t(vca), t(ka), t(va), cache_seqlens=cache_seqlens, is_causal=bool(causal),
        scale=softmax_scale, window=win, alibi_slopes=slopes, softcap=_softcap(softcap),
        return_lse=bool(return_softmax_lse), out=t(out), rotary_cos=_arr(rotary_cos, "rotary_cos"),
        rotary_sin=_arr(rotary_sin, "rotary_sin"), rotary_interleaved=bool(rotary_interleaved),
        cache_leftpad=_arr(cache_leftpad, "cache_leftpad"),
        cache_batch_idx=_arr(cache_batch_idx, "cache_batch_idx"), **kw)
    if return_softmax_lse:
        lse = res[1]
        n = np.broadcast_to(np.asarray(cache_seqlens, np.int64), (B,))
        pos = (n + Tk - T)[:, None, None] + np.arange(T)
        lse = _fa_lse(lse, slopes, fa_causal, pos)
    if _is_tensor(q):
        out = _tensor(out)
        if return_softmax_lse:
            lse = _tensor(np.ascontiguousarray(lse))
    return (out, lse) if return_softmax_lse else out
