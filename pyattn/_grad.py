"""Gradients: the attention backward, its vjp, and the softmax backward
(API.md "Gradients"; the arithmetic is in C: csrc/ops/attn_backward.c)."""
from __future__ import annotations

import copy

import numpy as np

from . import _C
from ._api import _sdpa
from ._spec import attn_spec
from ._checks import (
    as_array, bcast, compute_dtype, dropout_key, dropout_p_value, index_value, is16, real_scalar,
    split_axis, to_dtype,
)

__all__ = ["scaled_dot_product_attention_backward", "scaled_dot_product_attention_vjp",
           "softmax_backward"]


def _sum_to(g, shape):
    """Sum a gradient over the axes its operand was broadcast along (in
    NumPy's fixed order), back to the operand's shape."""
    if g.shape == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _grad_input(x, name, shape, dt):
    """grad_out / out: a float array of exactly `shape`, in the compute dtype."""
    a = as_array(x, name)
    if not ((a.dtype.kind == "f" and a.dtype.itemsize <= 8) or is16(a.dtype)):
        raise TypeError(f"{name} must be a float16/bfloat16/float32/float64 array, got dtype {a.dtype} "
                        "(extended precision is not computed)")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} has shape {a.shape}, but the attention output has shape {tuple(shape)}")
    return to_dtype(a, dt)


def scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask=None,
                                          dropout_p=0.0, is_causal=False, scale=None,
                                          enable_gqa=False, *, rng=None, window=None,
                                          alibi_slopes=None, softcap=None, sinks=None, align=None,
                                          block_mask=None):
    """Gradients of :func:`scaled_dot_product_attention` (its vector-Jacobian product).

    Given the forward's arguments, its output ``out`` and log-sum-exp ``lse``
    (``return_lse=True``) and the gradient ``grad_out`` of a loss with respect
    to ``out``, returns the loss's gradients with respect to ``query``,
    ``key`` and ``value`` (and the ``sinks`` logits). Fused, FlashAttention-2
    style: the attention weights are recomputed tile by tile from ``lse``,
    never stored as an ``(L, S)`` matrix; results are bit-identical for any
    thread count. A task owns one key/value head (with GQA, its group of
    query heads), so ``B * Hkv`` bounds the threads used.

    Parameters
    ----------
    grad_out : array_like, ``(..., L, Ev)``
        The output's shape exactly (float).
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window, alibi_slopes, softcap, sinks, align, block_mask
        Exactly as given to the forward (shapes ``(..., L, E)``, ``(..., S, E)``,
        ``(..., S, Ev)``; broadcasting as there).
    out : array_like, ``(..., L, Ev)``
        The forward's result.
    lse : ndarray, ``(..., L)``
        The forward's log-sum-exp, in the compute dtype (float32, or float64
        when an input is float64).
    rng : None, int or numpy.random.Generator
        The value the forward got when ``dropout_p > 0``: the same int seed, or
        a Generator in the state it had then (``copy.deepcopy`` it before the
        forward); the dropout pattern is regenerated from it.

    Returns
    -------
    ``(grad_query, grad_key, grad_value)``, plus ``grad_sinks`` when ``sinks``
    is given: the shapes of ``query``, ``key``, ``value`` (``sinks``) as
    passed -- axes they were broadcast along are summed, and with GQA the
    query heads' gradients are summed into their key/value head -- in the
    compute dtype (float16 and bfloat16 inputs give float32).
    Fully masked rows give zero gradients; a weight of exactly 0 passes no
    gradient (not even a NaN from its value row). No gradient is computed for
    a float ``attn_mask`` or for ``alibi_slopes``.

    Raises
    ------
    ValueError
        ``grad_out``, ``out`` or ``lse`` whose shape is not the forward's, and
        every error of the forward.
    TypeError
        ``lse`` not of the compute dtype; ``grad_out`` / ``out`` not float16,
        bfloat16, float32 or float64 (extended precision included).

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> q = k = v = np.random.default_rng(0).standard_normal((2, 5, 4))
    >>> o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    >>> dq, dk, dv = pyattn.scaled_dot_product_attention_backward(
    ...     np.ones_like(o), q, k, v, o, lse, is_causal=True)
    >>> dq.shape, dv.shape
    ((2, 5, 4), (2, 5, 4))
    """
    spec = attn_spec(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     {"rng": rng, "window": window, "alibi_slopes": alibi_slopes, "softcap": softcap, "sinks": sinks,
                      "align": align, "block_mask": block_mask})
    return _backward(spec, grad_out, out, lse)


def _backward(spec, grad_out, out, lse):
    """The backward of the attention call described by spec (_spec.attn_spec)."""
    dt, oshape = spec.dtype, spec.out_shape
    go = _grad_input(grad_out, "grad_out", oshape, dt)
    o = _grad_input(out, "out", oshape, dt)
    ls = as_array(lse, "lse")
    if ls.dtype.newbyteorder("=") != dt:         # any byte order: the numbers are what count
        raise TypeError(f"lse must have the compute dtype {dt} (from return_lse=True), got {ls.dtype}")
    if ls.shape != oshape[:-1]:
        raise ValueError(f"lse has shape {ls.shape}, but the forward's lse has shape {oshape[:-1]}")
    ls = to_dtype(ls, dt)
    q, k, v = (to_dtype(x, dt) for x in (spec.query, spec.key, spec.value))
    L, S, E, Ev = spec.L, spec.S, spec.E, spec.Ev
    full_batch = spec.full_batch
    nbf = len(full_batch)
    groups, hkv = spec.groups, spec.hkv
    # key/value aligned to the full batch: the axes both broadcast along are
    # summed in C (reduce), in a fixed order; the others here
    def padded(shape):
        s = tuple(shape[:-2])
        return (1,) * (nbf - len(s)) + s
    kb, vb = padded(k.shape), padded(v.shape)
    if groups > 1:
        batch = full_batch[:-1] + (hkv, groups)
        split = lambda a, tail: split_axis(bcast(a, full_batch + tail), -1 - len(tail), hkv, groups)  # noqa: E731
        qx, gox, ox = split(q, (L, E)), split(go, (L, Ev)), split(o, (L, Ev))
        lsx = split(ls, (L,))
        kx, vx = bcast(k[..., None, :, :], batch + (S, E)), bcast(v[..., None, :, :], batch + (S, Ev))
        reduce = [kb[d] == 1 and vb[d] == 1 and full_batch[d] > 1 for d in range(nbf - 1)] + [False, True]
    else:
        batch = full_batch
        qx, gox, ox, lsx = bcast(q, batch + (L, E)), go, o, ls
        kx, vx = bcast(k, batch + (S, E)), bcast(v, batch + (S, Ev))
        reduce = [kb[d] == 1 and vb[d] == 1 and batch[d] > 1 for d in range(nbf)]
    mask = spec.mask
    if mask is not None and groups > 1:
        mask = split_axis(mask, -3, hkv, groups)
    key_ = dropout_key(spec.rng) if spec.dropout_p > 0 else 0
    ckw = spec.c_kwargs()
    if spec.qoff is not None:
        ckw["qoff"] = spec.qoff
    dq, dk, dv, ds = _C.sdpa_backward(qx, kx, vx, ox, gox, lsx, mask, dropout_key=key_, reduce=reduce,
                                      **ckw)
    if groups > 1:
        dq = dq.reshape(full_batch + (L, E))
        dk = dk.reshape(dk.shape[:-3] + (S, E))
        dv = dv.reshape(dv.shape[:-3] + (S, Ev))
    res = (_sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape))
    if spec.sinks is not None:
        res = res + (_sum_to(ds.reshape(full_batch), spec.sinks_shape).astype(dt),)
    return res


def scaled_dot_product_attention_vjp(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False, *, rng=None,
                                     window=None, alibi_slopes=None, softcap=None, sinks=None,
                                     align=None, block_mask=None):
    """Run the forward and return ``(out, backward)``, as ``jax.vjp``.

    ``out`` is :func:`scaled_dot_product_attention` of the arguments;
    ``backward(grad_out) -> (grad_query, grad_key, grad_value[, grad_sinks])``
    is :func:`scaled_dot_product_attention_backward` for that call, callable
    any number of times. What it keeps: references to the inputs (not copies:
    modify them in place and the gradients follow the new values), the output
    and the ``(..., L)`` log-sum-exp -- never an ``(L, S)`` matrix. With
    dropout the pattern is drawn once (from ``rng``, advanced as the forward
    alone would) and every backward call reuses it.

    Parameters
    ----------
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa : array_like or option
        As :func:`scaled_dot_product_attention`.
    rng, window, alibi_slopes, softcap, sinks, align, block_mask : option
        As :func:`scaled_dot_product_attention`.

    Returns
    -------
    out : ndarray
        As the forward's (dtype rules, shapes).
    backward : callable
        ``backward(grad_out)`` returns the gradients.

    Raises
    ------
    As :func:`scaled_dot_product_attention`; ``backward`` raises as
    :func:`scaled_dot_product_attention_backward` (a ``grad_out`` of the
    wrong shape is a ``ValueError``).

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> x = np.random.default_rng(0).standard_normal((3, 4))
    >>> out, backward = pyattn.scaled_dot_product_attention_vjp(x, x, x)
    >>> [g.shape for g in backward(np.ones_like(out))]
    [(3, 4), (3, 4), (3, 4)]
    """
    p = dropout_p_value(dropout_p)
    gen = None
    if p > 0:                  # one dropout pattern for the forward and every backward
        is_gen = isinstance(rng, np.random.Generator)
        dropout_key(copy.deepcopy(rng) if is_gen else rng)   # a bad rng: TypeError naming it
        gen = rng if is_gen else np.random.default_rng(rng)
        saved = copy.deepcopy(gen)
    out, lse = _sdpa(attn_spec(query, key, value, attn_mask, p, is_causal, scale, enable_gqa,
                               {"rng": gen, "window": window, "alibi_slopes": alibi_slopes, "softcap": softcap,
                                "sinks": sinks, "return_lse": True, "align": align, "block_mask": block_mask}))

    def backward(grad_out):
        """Gradients of the forward call that made this function (see
        scaled_dot_product_attention_vjp): (grad_query, grad_key,
        grad_value[, grad_sinks])."""
        return scaled_dot_product_attention_backward(
            grad_out, query, key, value, out, lse, attn_mask, p, is_causal, scale, enable_gqa,
            rng=copy.deepcopy(saved) if p > 0 else None, window=window,
            alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, align=align, block_mask=block_mask)

    return out, backward


def softmax_backward(grad_y, y, /, axis=-1, *, scale=None):
    """Gradient of :func:`softmax` with respect to its input.

    For ``y = softmax(x, axis, scale=scale, attn_mask=..., is_causal=...)``
    and the gradient ``grad_y`` of a loss with respect to ``y``:
    ``grad_x = scale * y * (grad_y - sum(grad_y * y, axis))``; entries where
    ``y`` is 0 (masked) get 0, so masks need not be passed again.

    Parameters
    ----------
    grad_y, y : array_like, same shape
        float32 stays float32; float64 (or a mix) gives float64; float16 and
        integers as in :func:`softmax`.
    axis : int, default -1
    scale : float, optional
        The forward's ``scale`` (None: 1).

    Returns
    -------
    ndarray of ``y``'s shape.

    Raises
    ------
    ValueError
        Shapes that differ, an axis out of bounds, a scalar ``y``.
    TypeError
        Complex, object, string or datetime input.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> y = pyattn.softmax(np.array([1.0, 2.0, 3.0]))
    >>> g = pyattn.softmax_backward(np.array([1.0, 0.0, 0.0]), y)
    >>> bool(abs(g.sum()) < 1e-12)
    True
    """
    gy = as_array(grad_y, "grad_y")
    yy = as_array(y, "y")
    if yy.ndim == 0:
        raise ValueError("softmax_backward: y is a scalar (shape ()); it needs at least one axis")
    if gy.shape != yy.shape:
        raise ValueError(f"grad_y has shape {gy.shape}, which does not match y of shape {yy.shape}")
    axis = index_value(axis, "axis")
    if not -yy.ndim <= axis < yy.ndim:
        raise ValueError(f"axis {axis} is out of bounds for y of shape {yy.shape}")
    axis %= yy.ndim
    sc = 1.0 if scale is None else real_scalar(scale, "scale")
    dt = compute_dtype((gy, "grad_y"), (yy, "y"))
    res = _C.softmax_backward(np.moveaxis(to_dtype(gy, dt), axis, -1),
                              np.moveaxis(to_dtype(yy, dt), axis, -1), sc)
    return np.moveaxis(res, -1, axis) if axis != yy.ndim - 1 else res
