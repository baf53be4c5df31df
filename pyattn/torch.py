"""pyattn for PyTorch: a differentiable ``torch.library`` custom op.

``pyattn.torch.scaled_dot_product_attention`` takes and returns CPU
``torch.Tensor``s with the arguments of
``torch.nn.functional.scaled_dot_product_attention`` plus pyattn's keywords
(``window``, ``alibi_slopes``, ``softcap``, ``sinks``, ``precision``,
``return_lse``). The tensors are read in place (NumPy views of their memory,
bfloat16 through ``ml_dtypes``); the forward and pyattn's fused backward are
registered as the custom ops ``pyattn::sdpa`` and ``pyattn::sdpa_backward``
with fake (shape) implementations, so ``torch.compile(fullgraph=True)`` and
``torch.export`` take a model that uses it.

Importing this module imports torch (``import pyattn`` alone does not).

>>> import torch, pyattn.torch as pt
>>> q = torch.randn(2, 4, 16, 32, requires_grad=True)
>>> k = v = torch.randn(2, 4, 16, 32)
>>> out = pt.scaled_dot_product_attention(q, k, v, is_causal=True)
>>> out.sum().backward(); q.grad.shape
torch.Size([2, 4, 16, 32])
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch

from . import _api, _grad
from ._blockmask import BlockMask, as_block_mask
from ._bridge import tensor_numpy
from ._checks import (causal_code, dropout_p_value, not_flag_mask, real_scalar, softcap_value, window_arg,
                      window_value)

__all__ = ["scaled_dot_product_attention"]

_Tensor = torch.Tensor
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


_numpy = tensor_numpy        # the tensor's memory (pyattn/_bridge.py)


def _opt(t: Optional[_Tensor]) -> Optional[np.ndarray]:
    return None if t is None else _numpy(t)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_window = window_arg         # the op's (left, right) ints as pyattn's window (pyattn/_checks.py)


_CAUSAL = (False, "top_left", "bottom_right")


def _seed(seed: Optional[_Tensor]):
    return None if seed is None else int(seed.item())


def _bm_tensors(block_mask) -> Tuple[Optional[_Tensor], Optional[_Tensor], Optional[_Tensor], Optional[List[int]]]:
    """A BlockMask (pyattn's, or PyTorch's rebuilt from its mask_mod) as what
    the custom op takes: its tile states, partial-tile index and bits as
    tensors (views, no copy) and its shape."""
    if block_mask is None:
        return None, None, None, None
    bm = as_block_mask(block_mask)
    return (torch.from_numpy(bm._state), torch.from_numpy(bm._index), torch.from_numpy(bm._bits.view(np.int64)),
            [int(x) for x in bm.shape])


def _bm(state: Optional[_Tensor], index: Optional[_Tensor], bits: Optional[_Tensor],
        shape: Optional[List[int]]) -> Optional[BlockMask]:
    """The op's block-mask arguments back as a pyattn BlockMask (views)."""
    if state is None:
        return None
    return BlockMask(tuple(shape), _numpy(state), _numpy(index), _numpy(bits).view(np.uint64))


@torch.library.custom_op("pyattn::sdpa", mutates_args=(), device_types="cpu")
def _sdpa_op(query: _Tensor, key: _Tensor, value: _Tensor, attn_mask: Optional[_Tensor],
             dropout_p: float, is_causal: int, scale: Optional[float], enable_gqa: bool,
             seed: Optional[_Tensor], window_left: int, window_right: int,
             alibi_slopes: Optional[_Tensor], softcap: Optional[float], sinks: Optional[_Tensor],
             precision: Optional[str], bm_state: Optional[_Tensor] = None, bm_index: Optional[_Tensor] = None,
             bm_bits: Optional[_Tensor] = None, bm_shape: Optional[List[int]] = None) -> Tuple[_Tensor, _Tensor]:
    """Forward: (out, lse) in the compute dtype (float64 for float64 inputs, else float32)."""
    out, lse = _api.scaled_dot_product_attention(
        _numpy(query), _numpy(key), _numpy(value), _opt(attn_mask), dropout_p, _CAUSAL[is_causal], scale,
        enable_gqa, rng=_seed(seed), window=_window(window_left, window_right),
        alibi_slopes=_opt(alibi_slopes), softcap=softcap, sinks=_opt(sinks), precision=precision,
        return_lse=True, block_mask=_bm(bm_state, bm_index, bm_bits, bm_shape))
    return torch.from_numpy(out), torch.from_numpy(lse)


def _batch(query: _Tensor, key: _Tensor, value: _Tensor, enable_gqa: bool):
    if enable_gqa and key.dim() >= 3 and query.dim() >= 3 and query.shape[-3] != key.shape[-3]:
        return tuple(torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])) \
            + (query.shape[-3],)
    return tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2]))


@_sdpa_op.register_fake
def _sdpa_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed,
               window_left, window_right, alibi_slopes, softcap, sinks, precision, bm_state=None,
               bm_index=None, bm_bits=None, bm_shape=None):
    batch = _batch(query, key, value, enable_gqa)
    dt = _compute_dtype(query.dtype)
    L, Ev = query.shape[-2], value.shape[-1]
    return query.new_empty(batch + (L, Ev), dtype=dt), query.new_empty(batch + (L,), dtype=dt)


@torch.library.custom_op("pyattn::sdpa_backward", mutates_args=(), device_types="cpu")
def _sdpa_backward_op(grad_out: _Tensor, query: _Tensor, key: _Tensor, value: _Tensor,
                      out: _Tensor, lse: _Tensor, attn_mask: Optional[_Tensor], dropout_p: float,
                      is_causal: int, scale: Optional[float], enable_gqa: bool,
                      seed: Optional[_Tensor], window_left: int, window_right: int,
                      alibi_slopes: Optional[_Tensor], softcap: Optional[float],
                      sinks: Optional[_Tensor], bm_state: Optional[_Tensor] = None,
                      bm_index: Optional[_Tensor] = None, bm_bits: Optional[_Tensor] = None,
                      bm_shape: Optional[List[int]] = None) -> List[_Tensor]:
    """pyattn's fused backward: [grad_query, grad_key, grad_value, grad_sinks]
    in the inputs' dtypes (grad_sinks empty without sinks); dropout is
    regenerated from the forward's seed."""
    res = _grad.scaled_dot_product_attention_backward(
        _numpy(grad_out), _numpy(query), _numpy(key), _numpy(value), _numpy(out), _numpy(lse),
        _opt(attn_mask), dropout_p, _CAUSAL[is_causal], scale, enable_gqa, rng=_seed(seed),
        window=_window(window_left, window_right), alibi_slopes=_opt(alibi_slopes),
        softcap=softcap, sinks=_opt(sinks), block_mask=_bm(bm_state, bm_index, bm_bits, bm_shape))
    grads = [torch.from_numpy(np.ascontiguousarray(g)).to(t.dtype)
             for g, t in zip(res[:3], (query, key, value))]
    if sinks is None:
        grads.append(query.new_empty((0,)))
    else:
        grads.append(torch.from_numpy(np.ascontiguousarray(res[3])).to(sinks.dtype))
    return grads


@_sdpa_backward_op.register_fake
def _sdpa_backward_fake(grad_out, query, key, value, out, lse, attn_mask, dropout_p, is_causal,
                        scale, enable_gqa, seed, window_left, window_right, alibi_slopes, softcap,
                        sinks, bm_state=None, bm_index=None, bm_bits=None, bm_shape=None):
    return [torch.empty_like(query, memory_format=torch.contiguous_format),
            torch.empty_like(key, memory_format=torch.contiguous_format),
            torch.empty_like(value, memory_format=torch.contiguous_format),
            query.new_empty((0,)) if sinks is None else torch.empty_like(sinks)]


def _setup_context(ctx, inputs, output):
    (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, wl, wr,
     alibi_slopes, softcap, sinks, _precision, bm_state, bm_index, bm_bits, bm_shape) = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, attn_mask, seed, alibi_slopes, sinks,
                          bm_state, bm_index, bm_bits)
    ctx.opts = (dropout_p, is_causal, scale, enable_gqa, wl, wr, softcap, bm_shape)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    query, key, value, out, lse, attn_mask, seed, alibi_slopes, sinks, bm_state, bm_index, bm_bits = \
        ctx.saved_tensors
    dropout_p, is_causal, scale, enable_gqa, wl, wr, softcap, bm_shape = ctx.opts
    dq, dk, dv, ds = torch.ops.pyattn.sdpa_backward(
        grad_out, query, key, value, out, lse, attn_mask, dropout_p, is_causal, scale, enable_gqa,
        seed, wl, wr, alibi_slopes, softcap, sinks, bm_state, bm_index, bm_bits, bm_shape)
    return (dq, dk, dv, None, None, None, None, None, None, None, None, None, None,
            None if sinks is None else ds, None, None, None, None, None)


_sdpa_op.register_autograd(_backward, setup_context=_setup_context)


# Autocast, as PyTorch's SDPA (a "lower precision" op on the CPU): inside
# torch.autocast("cpu", dtype=d), floating query, key, value and a float
# attn_mask that are not float64 are cast to d, then the op runs with autocast
# off (the casts are ordinary differentiable ops: gradients reach the
# original dtypes). pyattn's own tensors (alibi_slopes, sinks) are read as given.
_AUTOCAST_LIB = torch.library.Library("pyattn", "IMPL")


def _autocast_dtype(t: Optional[_Tensor]) -> Optional[torch.dtype]:
    """The dtype t has inside the op: the CPU autocast dtype for a floating,
    non-float64 tensor while CPU autocast is on, else its own."""
    if t is None:
        return None
    if torch.is_autocast_enabled("cpu") and t.is_floating_point() and t.dtype != torch.float64:
        return torch.get_autocast_dtype("cpu")
    return t.dtype


def _sdpa_autocast(keyset, query, key, value, attn_mask, *rest):
    dt = torch.get_autocast_dtype("cpu")

    def cast(t):
        return t.to(dt) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
    with torch.autocast("cpu", enabled=False):
        return torch.ops.pyattn.sdpa.default(cast(query), cast(key), cast(value), cast(attn_mask), *rest)


_AUTOCAST_LIB.impl("sdpa", _sdpa_autocast, "AutocastCPU", with_keyset=True)


def _plain(*ts) -> bool:
    """True when a call on these tensors needs nothing of the dispatcher: plain
    CPU tensors (no subclass: fake, functional or traced ones are), no gradient
    wanted, no autocast, no torch.compile tracing, no torch function or
    dispatch mode and no functorch transform (vmap, grad) active."""
    if any(type(t) is not _Tensor for t in ts):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return False
    return not (torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling()
                or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0
                or torch._C._are_functorch_transforms_active())


def _check_tensor(t, name, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} "
                        "(NumPy arrays go to pyattn.scaled_dot_product_attention)")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on device {t.device}; pyattn runs on the CPU: pass "
                         f"{name}.cpu() (meta tensors have no data to read)")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} and query on {device}: all tensors must be on one CPU device")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, *, window=None, alibi_slopes=None,
                                 softcap=None, sinks=None, precision=None, block_mask=None, return_lse=False):
    """``torch.nn.functional.scaled_dot_product_attention`` on pyattn's kernels.

    Shapes as PyTorch's: ``query (..., L, E)``, ``key (..., S, E)``,
    ``value (..., S, Ev)`` -> ``(..., L, Ev)`` (leading axes broadcast).
    CPU tensors of one dtype: float32, float64, float16 or bfloat16, read in
    place (no copy). The result has the query's dtype; 16-bit inputs are
    computed in float32 and the result rounded from it, as PyTorch's SDPA
    does. Inside ``torch.autocast("cpu", dtype=d)`` floating query, key,
    value and a float ``attn_mask`` (not float64) are cast to ``d`` first and
    the result has dtype ``d``, as PyTorch's SDPA (its autocast rule).
    Differentiable with respect to query, key, value (and ``sinks``)
    through pyattn's fused backward; a custom op ``pyattn::sdpa`` that
    ``torch.compile(fullgraph=True)`` and ``torch.export`` accept.

    The arguments mean what they mean in ``pyattn.scaled_dot_product_attention``.

    Parameters
    ----------
    query : torch.Tensor
        ``(..., L, E)``, on the CPU; float32, float64, float16 or bfloat16
        (bfloat16 needs ``ml_dtypes``), the dtype of ``key`` and ``value``.
    key : torch.Tensor
        ``(..., S, E)``, query's dtype and device.
    value : torch.Tensor
        ``(..., S, Ev)``, query's dtype and device.
    attn_mask : torch.Tensor, optional
        Broadcasts to ``(..., L, S)``: a bool ``attn_mask`` is True where a
        query may attend, a float one is added. Not differentiable (one
        that requires grad is a ``ValueError``).
    dropout_p : float in [0, 1), default 0.0
        ``dropout_p > 0`` applies dropout whenever it is given (as
        PyTorch's function; pass 0 in evaluation); its pattern is drawn
        from torch's generator (``torch.manual_seed`` reproduces it) and
        regenerated in the backward.
    is_causal : bool or {"top_left", "bottom_right"}, default False
        True / ``"top_left"`` / ``"bottom_right"`` (it may be combined with a
        mask: the two intersect).
    scale : float, optional
        Default ``1/sqrt(E)``.
    enable_gqa : bool, default False
        Shares each key/value head among a group of query heads (axis -3:
        ``Hq % Hkv == 0``).
    window : (left, right), optional
        pyattn's sliding window (``None`` in either place: unbounded).
    alibi_slopes : torch.Tensor, optional
        ``(Hq,)`` ALiBi slopes (or ``(B, Hq)``); not differentiable.
    softcap : float, optional
        ``s = softcap * tanh(s / softcap)`` on the scaled scores.
    sinks : torch.Tensor, optional
        ``(Hq,)`` attention-sink logits (differentiable).
    precision : None, "highest" or "bf16", optional
        As in ``pyattn.scaled_dot_product_attention``.
    block_mask : pyattn.BlockMask or FlexAttention's BlockMask, optional
        A :class:`pyattn.BlockMask`, or FlexAttention's ``BlockMask`` from
        ``create_block_mask``, rebuilt from its ``mask_mod``: a
        ``mask_mod`` of torch ops over torch tensors is evaluated with torch
        index tensors; a PyTorch BlockMask made from blocks alone, without a
        mask_mod, is a ``TypeError`` saying how to build one.
    return_lse : bool, default False
        Also return the ``(..., L)`` log-sum-exp, float32 or float64, not
        differentiable.

    Returns
    -------
    out : torch.Tensor
        ``(..., L, Ev)`` of the query's dtype (the autocast dtype inside
        ``torch.autocast``), differentiable with respect to query, key,
        value and ``sinks``.
    lse : torch.Tensor
        ``(..., L)``, only with ``return_lse=True`` (then ``(out, lse)``).

    Raises
    ------
    ValueError
        Tensors not on the CPU (CUDA, meta) or on different devices;
        ``attn_mask`` / ``alibi_slopes`` that require grad (pyattn computes
        no gradient for them); and whatever
        ``pyattn.scaled_dot_product_attention`` raises for shapes and
        options.
    TypeError
        Non-tensors and dtypes other than the four above or differing
        between query, key and value; an ``attn_mask`` neither bool nor
        float; a PyTorch BlockMask without a ``mask_mod``; and the type
        errors of ``pyattn.scaled_dot_product_attention``.

    Examples
    --------
    >>> import torch, pyattn.torch as pt
    >>> q = k = v = torch.randn(1, 8, 10, 16)
    >>> pt.scaled_dot_product_attention(q, k, v, is_causal=True, window=(3, 0)).shape
    torch.Size([1, 8, 10, 16])

    The same result as PyTorch's function, and a gradient through pyattn's
    backward:

    >>> _ = torch.manual_seed(0)
    >>> q = torch.randn(2, 3, 4, requires_grad=True)
    >>> k, v = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    >>> out, lse = pt.scaled_dot_product_attention(q, k, v, return_lse=True)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    >>> torch.allclose(out, ref, atol=1e-6), lse.shape
    (True, torch.Size([2, 3]))
    >>> out.sum().backward(); q.grad.shape
    torch.Size([2, 3, 4])
    """
    _check_tensor(query, "query")
    dev = query.device
    _check_tensor(key, "key", dev)
    _check_tensor(value, "value", dev)
    for t, name in ((query, "query"), (key, "key"), (value, "value")):
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} has dtype {t.dtype}; pyattn.torch takes float32, float64, "
                            "float16 or bfloat16 tensors")
    dts = [_autocast_dtype(t) for t in (query, key, value)]       # torch.autocast("cpu") casts
    if not (dts[0] == dts[1] == dts[2]):
        raise TypeError(f"query, key and value must have one dtype (as PyTorch's SDPA), got "
                        f"{query.dtype}, {key.dtype} and {value.dtype}"
                        + (f" (under torch.autocast: {dts[0]}, {dts[1]} and {dts[2]})"
                           if dts != [query.dtype, key.dtype, value.dtype] else ""))
    not_flag_mask(attn_mask, "attn_mask")
    for t, name in ((attn_mask, "attn_mask"), (alibi_slopes, "alibi_slopes"), (sinks, "sinks")):
        if t is None:
            continue
        _check_tensor(t, name, dev)
        if name != "sinks" and t.requires_grad:
            raise ValueError(f"{name} requires grad, but pyattn computes no gradient for it: "
                             f"pass {name}.detach()")
    if attn_mask is not None and attn_mask.dtype != torch.bool and attn_mask.dtype not in _FLOATS:
        raise TypeError(f"attn_mask must be bool (True = may attend) or float (added), got {attn_mask.dtype}")
    code = causal_code(is_causal)
    wl, wr = window_value(window)
    p = dropout_p_value(dropout_p)
    scale = None if scale is None else real_scalar(scale, "scale")
    softcap = softcap_value(softcap) or None
    if (p == 0 and attn_mask is None and alibi_slopes is None and sinks is None and block_mask is None
            and _plain(query, key, value)):
        # nothing for autograd, autocast, torch.compile or a mode to see: the NumPy entry on the
        # tensors' memory, without the custom op's dispatch (a decode step's per-call cost)
        res = _api.scaled_dot_product_attention(
            _numpy(query), _numpy(key), _numpy(value), None, 0.0, _CAUSAL[code], scale, bool(enable_gqa),
            window=_window(wl, wr), softcap=softcap, precision=precision, return_lse=bool(return_lse))
        out, lse = (res if return_lse else (res, None))
        out, lse = torch.from_numpy(out), None if lse is None else torch.from_numpy(lse)
        if out.dtype != dts[0]:
            out = out.to(dts[0])
        return (out, lse) if return_lse else out
    seed = None
    if p > 0:
        seed = torch.randint(0, 2**63 - 1, (), dtype=torch.int64)
    out, lse = torch.ops.pyattn.sdpa(
        query, key, value, attn_mask, p, code, scale, bool(enable_gqa), seed, wl, wr, alibi_slopes,
        softcap, sinks, precision, *_bm_tensors(block_mask))
    if out.dtype != dts[0]:
        out = out.to(dts[0])
    return (out, lse) if return_lse else out
