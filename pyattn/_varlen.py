"""Packed sequences of different lengths ("varlen", API.md): FlashAttention's
``flash_attn_varlen_func`` layout on pyattn's kernels. The packed arrays are
read in place as head-major views ``(H, total, E)``; the C op
(csrc/ops/attn_varlen.c) runs each sequence as the dense call on it alone."""
from __future__ import annotations

import copy

import numpy as np

from ._api import _sdpa
from ._blockmask import check_block_mask_varlen
from ._checks import align_code, as_array, check_out, dropout_key, dropout_p_value, per_head
from ._grad import _backward
from ._spec import attn_spec

__all__ = ["scaled_dot_product_attention_varlen", "scaled_dot_product_attention_varlen_backward",
           "scaled_dot_product_attention_varlen_vjp"]


def _cu(x, name, total, of):
    """cu_seqlens as a contiguous int64 array, checked: 0 first, non-decreasing, total last."""
    a = as_array(x, name)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be a 1-D integer array (N + 1 offsets), got dtype {a.dtype} "
                        f"and shape {a.shape}")
    if a.size < 1:
        raise ValueError(f"{name} must hold N + 1 >= 1 offsets, got shape {a.shape}")
    if a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max:
        bad = int(np.argmax(a > np.iinfo(np.int64).max))
        raise ValueError(f"{name}[{bad}] = {a[bad]} is past the {total} rows of {of}")
    c = np.require(a, np.int64, ["C_CONTIGUOUS", "ALIGNED"])     # an unaligned or swapped array: one copy
    badm = np.zeros(c.shape, bool)
    badm[0] = c[0] != 0
    badm[1:] = c[1:] < c[:-1]
    badm |= (c < 0) | (c > total)
    badm[-1] |= c[-1] != total
    if badm.any():
        i = int(np.argmax(badm))
        raise ValueError(f"{name} must start at 0, never decrease and end at {total} (the rows of "
                         f"{of}); the first bad entry is at position {i}: {int(c[i])}")
    return c


def _spec(query, key, value, cu_seqlens_q, cu_seqlens_k, kw):
    """The AttnSpec of a varlen call: the dense spec of the head-major views
    (H, total, E), with the offsets, the per-sequence ALiBi slopes and the
    block mask (a slab per sequence and head). kw: the call's options by
    name (is_causal, scale, enable_gqa, dropout_p, rng, window,
    alibi_slopes, softcap, sinks, precision, return_lse, block_mask, align)."""
    q, k, v = as_array(query, "query"), as_array(key, "key"), as_array(value, "value")
    for x, n in ((q, "query"), (k, "key"), (v, "value")):
        if x.ndim != 3:
            raise ValueError(f"{n} must be 3-D (total, heads, features) for packed sequences, got shape {x.shape}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"key has shape {k.shape} and query has shape {q.shape}: their last axes (E) must match")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"value has shape {v.shape} and key has shape {k.shape}: their tokens and heads must match")
    if not kw["enable_gqa"] and k.shape[1] != q.shape[1]:
        raise ValueError(f"query has {q.shape[1]} heads (shape {q.shape}) and key {k.shape[1]} (shape {k.shape}): "
                         "they must match, or pass enable_gqa=True for grouped-query attention")
    cq = _cu(cu_seqlens_q, "cu_seqlens_q", q.shape[0], "query")
    ck = _cu(cu_seqlens_k, "cu_seqlens_k", k.shape[0], "key")
    if cq.shape != ck.shape:
        raise ValueError(f"cu_seqlens_q has {cq.size - 1} sequences and cu_seqlens_k {ck.size - 1}: they must match")
    t = (1, 0, 2)
    spec = attn_spec(q.transpose(t), k.transpose(t), v.transpose(t), None, kw["dropout_p"], kw["is_causal"],
                     kw["scale"], kw["enable_gqa"],
                     {x: kw[x] for x in ("rng", "window", "softcap", "sinks", "precision", "return_lse")})
    slopes = None
    alibi_slopes, block_mask = kw["alibi_slopes"], kw["block_mask"]
    if alibi_slopes is not None:
        slopes = per_head(alibi_slopes, "alibi_slopes", (cq.size - 1, q.shape[1]), "(Hq,) or (N, Hq)").reshape(-1)
    bm = None if block_mask is None else check_block_mask_varlen(block_mask, cq, ck, q.shape[1])
    return spec._replace(slopes=slopes, cu_seqlens_q=cq, cu_seqlens_k=ck, block_mask=bm,
                         seq_align=align_code(kw["align"], spec.causal))


def scaled_dot_product_attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, *, is_causal=False,
                                        scale=None, enable_gqa=False, dropout_p=0.0, rng=None, window=None,
                                        alibi_slopes=None, softcap=None, sinks=None, return_lse=False,
                                        precision=None, out=None, block_mask=None, align=None):
    """Attention over sequences of different lengths packed along the first axis.

    FlashAttention's ``flash_attn_varlen_func`` layout: sequence ``i`` is
    query rows ``[cu_seqlens_q[i], cu_seqlens_q[i+1])`` and key/value rows
    ``[cu_seqlens_k[i], cu_seqlens_k[i+1])``, and attends to its own keys
    only. Each sequence's result equals, bit for bit,
    :func:`scaled_dot_product_attention` on that sequence alone with the same
    options (``query[a:b].transpose(1, 0, 2)`` etc.); the work is
    ``sum_i L_i * S_i``, never a padded size. No copy of the packed arrays
    is made (any strides, negative ones too).

    Parameters
    ----------
    query : array_like ``(total_q, Hq, E)``
    key : array_like ``(total_k, Hkv, E)``
    value : array_like ``(total_k, Hkv, Ev)``
        Dtype rules as :func:`scaled_dot_product_attention` (float32,
        float64, 16-bit storage computed in float32).
    cu_seqlens_q, cu_seqlens_k : integer arrays ``(N + 1,)``
        Offsets: 0 first, non-decreasing, ``total_q`` / ``total_k`` last.
        Empty sequences are allowed.
    is_causal : bool or "top_left" / "bottom_right"
        Per sequence, as for the dense call (bottom-right aligns each
        sequence's last query with its last key).
    scale, enable_gqa, window, softcap, sinks, precision
        As :func:`scaled_dot_product_attention`, per sequence (window and
        ALiBi positions count from each sequence's start).
    alibi_slopes : array_like ``(Hq,)`` or ``(N, Hq)``, optional
    block_mask : pyattn.BlockMask, optional
        A mask as a function, per sequence: built with ``B = N`` (``b`` is
        the sequence number) or ``None``, ``H = Hq`` or ``None``, and
        ``L``, ``S`` at least the longest sequence's queries and keys;
        ``mask_mod``'s ``q_idx`` and ``kv_idx`` count from each sequence's
        start. Sequence ``i`` reads the top-left ``L_i x S_i`` of its
        slab; its empty tiles are never computed. Sequence ``i``'s result
        equals, bit for bit, the dense call on it alone with
        ``attn_mask=block_mask.to_dense()[i if B else 0, :, :L_i, :S_i]``.
    dropout_p, rng : float, seed or Generator
        One key is drawn from ``rng`` as the dense call draws it. Sequence
        ``i`` gets the dropout mask the dense call gives **batch entry i**:
        with ``qi = query[cu_q[i]:cu_q[i+1]].transpose(1, 0, 2)`` (and
        ``ki``, ``vi`` likewise), the same seed reproduces it as
        ``scaled_dot_product_attention(np.broadcast_to(qi, (i + 1,) + qi.shape),
        ki, vi, dropout_p=p, rng=seed)[i]``. Any thread count gives the same mask.
    align : None, "top_left" or "bottom_right"
        Where each sequence's query rows sit on its key axis, as the dense
        call's ``align``: ``"bottom_right"`` puts row ``i`` of sequence ``s``
        at key position ``i + S_s - L_s`` for the causal rule, the window and
        ALiBi (FlashAttention's placement when ``L_s != S_s``), also without
        causal; each sequence then equals the dense call with
        ``align="bottom_right"`` on it alone, bit for bit. ``"top_left"``
        with ``is_causal="bottom_right"`` is a ``ValueError``.
    return_lse : bool
        Also return ``lse (total_q, Hq)`` in the compute dtype.
    out : ndarray ``(total_q, Hq, Ev)``, optional
        Written in place (the compute dtype, or the inputs' 16-bit dtype).

    Returns
    -------
    ``out (total_q, Hq, Ev)``, or ``(out, lse)`` with ``return_lse``.

    Raises
    ------
    ValueError
        Operands not 3-D or of mismatched shapes; cu_seqlens that do not
        start at 0, decrease, or do not end at the total (the message names
        the argument and the first bad position); differing sequence counts;
        head counts that differ without ``enable_gqa``; a ``block_mask``
        whose ``(L, S)`` does not cover the longest sequence or whose
        ``(B, H)`` is not ``(N or 1, Hq or 1)``; and every option error of
        the dense call. Nothing is written to ``out`` on an error.
    TypeError
        Non-integer cu_seqlens; unsupported dtypes; a ``block_mask`` that is
        not a :class:`pyattn.BlockMask`.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> x = np.random.default_rng(0).standard_normal((7, 2, 4)).astype(np.float32)
    >>> cu = np.array([0, 3, 7])                      # two sequences: 3 and 4 tokens
    >>> pyattn.scaled_dot_product_attention_varlen(x, x, x, cu, cu, is_causal=True).shape
    (7, 2, 4)
    """
    spec = _spec(query, key, value, cu_seqlens_q, cu_seqlens_k, dict(
        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, dropout_p=dropout_p, rng=rng, window=window,
        alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, precision=precision, return_lse=return_lse,
        block_mask=block_mask, align=align))
    shape = (spec.L, spec.full_batch[-1], spec.Ev)
    if out is None:
        buf = np.empty(shape, spec.dtype)
    else:
        check_out(out, shape, spec.dtype, spec.narrow)
        buf = out
    res = _sdpa(spec, buf.transpose(1, 0, 2))
    if not return_lse:
        return buf
    return buf, np.ascontiguousarray(res[1].T)


def _packed_input(x, name, shape):
    a = as_array(x, name)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} has shape {a.shape}, but the packed attention output has shape {tuple(shape)}")
    return a


def scaled_dot_product_attention_varlen_backward(grad_out, query, key, value, out, lse, cu_seqlens_q,
                                                 cu_seqlens_k, *, is_causal=False, scale=None,
                                                 enable_gqa=False, dropout_p=0.0, rng=None, window=None,
                                                 alibi_slopes=None, softcap=None, sinks=None, block_mask=None, align=None):
    """Gradients of :func:`scaled_dot_product_attention_varlen`.

    Given the forward's ``out (total_q, Hq, Ev)`` and ``lse (total_q, Hq)``
    (``return_lse=True``) and the incoming ``grad_out (total_q, Hq, Ev)``,
    with the forward's other arguments (``rng`` as the forward got it: the
    same seed, or a Generator in the state it had then; ``align`` as the
    forward's). Each sequence's
    gradients equal, bit for bit, the dense backward on that sequence alone;
    the key/value heads of a GQA group are summed in a fixed order, so the
    results do not depend on the thread count.

    Parameters
    ----------
    grad_out : array_like, shape (total_q, Hq, Ev)
        The gradient of the loss with respect to the forward's output.
    query, key, value, cu_seqlens_q, cu_seqlens_k : array_like
        The forward's inputs.
    out, lse : ndarray
        The forward's output and log-sum-exp (``return_lse=True``).
    is_causal, scale, enable_gqa, dropout_p, rng, window, alibi_slopes, softcap, sinks, block_mask, align
        The forward's options, as it got them (``rng``: the same seed, or a
        Generator in the state it had then).

    Returns
    -------
    tuple of ndarray
        ``(grad_query, grad_key, grad_value)`` of the packed shapes, in the
    compute dtype; ``grad_sinks`` of ``sinks``' shape is added when ``sinks``
    is given (summed over the sequences in order).

    Raises
    ------
    As the forward; ``grad_out``, ``out`` or ``lse`` of the wrong shape is a
    ``ValueError``, of another dtype than the compute dtype a ``TypeError``.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> x = np.random.default_rng(0).standard_normal((7, 2, 4))
    >>> cu = np.array([0, 3, 7])
    >>> o, lse = pyattn.scaled_dot_product_attention_varlen(x, x, x, cu, cu, return_lse=True)
    >>> dq, dk, dv = pyattn.scaled_dot_product_attention_varlen_backward(
    ...     np.ones_like(o), x, x, x, o, lse, cu, cu)
    >>> dq.shape
    (7, 2, 4)
    """
    spec = _spec(query, key, value, cu_seqlens_q, cu_seqlens_k, dict(
        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, dropout_p=dropout_p, rng=rng, window=window,
        alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, precision=None, return_lse=False,
        block_mask=block_mask, align=align))
    hq = spec.full_batch[-1]
    oshape = (spec.L, hq, spec.Ev)
    go = _packed_input(grad_out, "grad_out", oshape)
    o = _packed_input(out, "out", oshape)
    ls = as_array(lse, "lse")
    if ls.shape != oshape[:2]:
        raise ValueError(f"lse has shape {ls.shape}, but the forward's lse has shape {oshape[:2]}")
    t = (1, 0, 2)
    res = _backward(spec, go.transpose(t), o.transpose(t), ls.T)
    grads = tuple(np.ascontiguousarray(g.transpose(t)) for g in res[:3])
    return grads + tuple(res[3:])


def scaled_dot_product_attention_varlen_vjp(query, key, value, cu_seqlens_q, cu_seqlens_k, *,
                                            is_causal=False, scale=None, enable_gqa=False, dropout_p=0.0,
                                            rng=None, window=None, alibi_slopes=None, softcap=None,
                                            sinks=None, block_mask=None, align=None):
    """Run :func:`scaled_dot_product_attention_varlen` and return ``(out, backward)``, as ``jax.vjp``.

    ``backward(grad_out) -> (grad_query, grad_key, grad_value[, grad_sinks])``
    is :func:`scaled_dot_product_attention_varlen_backward` for that call,
    callable any number of times; it keeps references to the inputs, the
    output and the ``(total_q, Hq)`` log-sum-exp. With dropout the pattern is
    drawn once (from ``rng``, advanced as the forward alone would).

    Parameters
    ----------
    query, key, value, cu_seqlens_q, cu_seqlens_k : array_like
        As :func:`scaled_dot_product_attention_varlen`.
    is_causal, scale, enable_gqa, dropout_p, rng, window, alibi_slopes, softcap, sinks, block_mask, align
        As :func:`scaled_dot_product_attention_varlen`.

    Returns
    -------
    out : ndarray
        The forward's output.
    backward : callable
        ``backward(grad_out)`` returns the gradients.

    Raises
    ------
    As :func:`scaled_dot_product_attention_varlen`.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> x = np.random.default_rng(0).standard_normal((5, 1, 3))
    >>> out, backward = pyattn.scaled_dot_product_attention_varlen_vjp(x, x, x, [0, 2, 5], [0, 2, 5])
    >>> [g.shape for g in backward(np.ones_like(out))]
    [(5, 1, 3), (5, 1, 3), (5, 1, 3)]
    """
    p = dropout_p_value(dropout_p)
    gen = saved = None
    if p > 0:
        is_gen = isinstance(rng, np.random.Generator)
        dropout_key(copy.deepcopy(rng) if is_gen else rng)   # a bad rng: TypeError naming it
        gen = rng if is_gen else np.random.default_rng(rng)
        saved = copy.deepcopy(gen)
    kw = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, dropout_p=p, window=window,
              alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, block_mask=block_mask, align=align)
    out, lse = scaled_dot_product_attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, rng=gen,
                                                   return_lse=True, **kw)

    def backward(grad_out):
        """Gradients of the forward call that made this function:
        (grad_query, grad_key, grad_value[, grad_sinks])."""
        return scaled_dot_product_attention_varlen_backward(
            grad_out, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k,
            rng=copy.deepcopy(saved) if p > 0 else None, **kw)

    return out, backward
