"""The public functions of pyattn (argument handling; the arithmetic is in C)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _C, _kvextra, _kvfast
from ._spec import attn_spec
from ._checks import (
    as_array, bcast, broadcast_shapes, causal_code, check_numeric, check_out, compute_dtype,
    dropout_key, index_value, int8_precision, is16, number, out_for_kernel, precision_value, prep_mask, real_scalar,
    split_axis, store16, to_dtype,
)

__all__ = ["matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
           "merge_attention", "attention_with_kvcache"]


def matmul(a, b, /, *, out=None, precision=None):
    """Matrix product with the semantics of ``np.matmul``, computed by pyattn's GEMM.

    Shapes: ``a (..., M, K) @ b (..., K, N) -> (..., M, N)``. A 1-D ``a`` is
    treated as ``(1, K)`` and a 1-D ``b`` as ``(K, 1)``, the added axis removed
    from the result; leading (batch) axes broadcast. Any strides are read in
    place (transposes, negative strides, broadcast views).

    Parameters
    ----------
    a, b : array_like
        Operands; float32 stays float32, float64 or a mix gives float64,
        integers and bools give float64. float16 and bfloat16
        (``ml_dtypes.bfloat16``) compute and return float32: they are read in
        place and widened as the kernel packs them (no converted copy), unless
        the other operand is float64.
    out : ndarray, optional
        Receives the result; exact result shape and dtype (or the 16-bit
        dtype of an operand: the float32 result is rounded into it), writeable.
    precision : None, "highest" or "bf16"
        ``None`` / ``"highest"``: float32 (float64) products and sums.
        ``"bf16"`` (opt-in, float32 and 16-bit operands only): every element
        of ``a`` and ``b`` is rounded to bfloat16 (nearest even), the
        products are exact and summed in float32 -- on AVX512_BF16's
        ``vdpbf16ps`` where the CPU has it, elsewhere by its exact emulation
        (the same bits): on float32 FMAs in the avx2, avx512 and neon
        families (measured on a Zen 5 at 1.05-1.35x the float32 time for
        matmul 2048^3 and attention L=S=2048; NEON not timed on an ARM CPU
        yet), in scalar C in the portable family (much slower);
        ``show_config()`` names the kernel and says native or emulated.
        The result stays float32.

    Returns
    -------
    ndarray (a NumPy scalar when both operands are 1-D, as ``np.matmul``).

    Raises
    ------
    ValueError
        Scalars, mismatched inner dimensions, batch axes that do not broadcast,
        an unknown ``precision``, ``precision="bf16"`` with a float64 operand.
    TypeError
        Complex, object, string or datetime operands.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> pyattn.matmul(np.ones((2, 3)), np.ones((3, 4))).shape
    (2, 4)
    >>> pyattn.matmul(np.full((1, 2), 1.001, np.float32), np.ones((2, 1), np.float32), precision="bf16")
    array([[2.]], dtype=float32)
    """
    a = as_array(a, "a")
    b = as_array(b, "b")
    for x, n in ((a, "a"), (b, "b")):
        if x.ndim == 0:
            raise ValueError(f"matmul: {n} is a scalar (shape ()); use * to multiply by a scalar")
    dt = compute_dtype((a, "a"), (b, "b"))
    bf16 = precision_value(precision, dt)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(
            f"matmul: a has shape {a.shape} and b has shape {b.shape}; the last axis of a "
            f"({a2.shape[-1]}) must equal the {'only' if b.ndim == 1 else 'second-to-last'} "
            f"axis of b ({b2.shape[-2]})"
        )
    batch = broadcast_shapes([(a2.shape[:-2], "a"), (b2.shape[:-2], "b")], "batch axes of a and b")
    shape = batch + ((a2.shape[-2],) if a.ndim > 1 else ()) + ((b2.shape[-1],) if b.ndim > 1 else ())
    a3 = bcast(store16(a2, dt), batch + a2.shape[-2:])
    b3 = bcast(store16(b2, dt), batch + b2.shape[-2:])
    if out is not None:
        check_out(out, shape, dt, tuple(x.dtype for x in (a, b) if is16(x.dtype)))
        if out.dtype == dt and out_for_kernel(out, (a, b)):
            _C.matmul(a3, b3, _expand(out, a.ndim, b.ndim), bf16=bf16)
        else:
            out[...] = _squeeze(_C.matmul(a3, b3, bf16=bf16), a.ndim, b.ndim)
        return out
    return _squeeze(_C.matmul(a3, b3, bf16=bf16), a.ndim, b.ndim)


def _expand(out, a_nd, b_nd):
    """View of out with the axes that 1-D operands removed put back."""
    if a_nd == 1:
        out = out[..., None, :] if b_nd > 1 else out[..., None]
    if b_nd == 1:
        out = out[..., None]
    return out


def _squeeze(res, a_nd, b_nd):
    if a_nd == 1 and b_nd == 1:
        return res[..., 0, 0][()]
    if a_nd == 1:
        return res[..., 0, :]
    if b_nd == 1:
        return res[..., 0]
    return res


def softmax(x, /, axis=-1, *, dim=None, attn_mask=None, is_causal=False, scale=None, out=None):
    """Masked, scaled softmax: ``softmax(x * scale + additive_mask)`` along ``axis``.

    Numerically stable for any finite input (the row maximum is subtracted).
    Masks follow ``scaled_dot_product_attention``: a bool ``attn_mask`` keeps
    the entries where it is True; a float ``attn_mask`` is added after
    scaling (``-inf`` removes an entry); ``is_causal`` (True / ``"top_left"``
    or ``"bottom_right"``) treats the last two axes as ``(L, S)``. Masks need
    ``axis=-1`` and broadcast against ``x``. A float mask is cast to the
    compute dtype of ``x``; it does not change the result dtype.

    A row whose entries are all masked (or all ``-inf``) gives zeros, never
    NaN; a NaN among a row's admissible entries makes that row NaN.

    Parameters
    ----------
    x : array_like, at least 1-D
    axis : int, default -1
    dim : int, optional
        PyTorch's name for ``axis`` (``torch.softmax(x, dim=-1)``), accepted
        as an alias; give one of the two.
    attn_mask : array_like of bool or float, optional
    is_causal : bool or {"top_left", "bottom_right"}, default False
    scale : float, optional
        Multiplies ``x`` before the mask is added; ``None`` means 1.
    out : ndarray, optional
        Exact shape of ``x`` and the result dtype, writeable.

    Returns
    -------
    ndarray of x's shape; float32 for float16/float32 input, else float64.

    Raises
    ------
    ValueError
        A scalar ``x``, an axis out of bounds, both ``axis`` and ``dim``, a mask
        that does not broadcast, masks with ``axis`` other than the last.
    TypeError
        Complex, object, string or datetime input.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> pyattn.softmax(np.zeros((3, 3)), is_causal=True)[2]
    array([0.33333333, 0.33333333, 0.33333333])
    """
    x = as_array(x, "x")
    if x.ndim == 0:
        raise ValueError("softmax: x is a scalar (shape ()); it needs at least one axis")
    if dim is not None:
        if axis != -1:
            raise ValueError(f"softmax: give axis or dim (its PyTorch name), not both: axis={axis}, dim={dim}")
        axis = dim
    axis = index_value(axis, "dim" if dim is not None else "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of bounds for x of shape {x.shape}")
    axis %= x.ndim
    causal = causal_code(is_causal)
    if (causal or attn_mask is not None) and axis != x.ndim - 1:
        raise ValueError(f"attn_mask and is_causal need axis=-1 (the key axis), got axis={axis}")
    if causal and x.ndim < 2:
        raise ValueError(f"is_causal needs x with at least 2 dimensions (L, S), got shape {x.shape}")
    sc = 1.0 if scale is None else real_scalar(scale, "scale")
    dt = compute_dtype((x, "x"))
    xc = np.moveaxis(to_dtype(x, dt), axis, -1)
    mask = None if attn_mask is None else prep_mask(attn_mask, xc.shape, dt)
    if out is not None:
        check_out(out, x.shape, dt)
        if out_for_kernel(out, (x, attn_mask if isinstance(attn_mask, np.ndarray) else None)):
            _C.softmax(xc, np.moveaxis(out, axis, -1), mask, causal, sc)
        else:
            out[...] = np.moveaxis(_C.softmax(xc, None, mask, causal, sc), -1, axis)
        return out
    res = _C.softmax(xc, None, mask, causal, sc)
    return np.moveaxis(res, -1, axis) if axis != x.ndim - 1 else res


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 rng=None, return_weights=False, out=None, window=None,
                                 alibi_slopes=None, softcap=None, sinks=None, return_lse=False,
                                 precision=None, align=None, block_mask=None):
    """Fused attention ``softmax(query @ key.T * scale + mask) @ value``, in one C kernel.

    Argument names and defaults match ``torch.nn.functional.scaled_dot_product_attention``.

    Shapes: ``query (..., L, E)``, ``key (..., S, E)``, ``value (..., S, Ev)``
    -> ``(..., L, Ev)``; leading axes broadcast. The ``(L, S)`` score matrix is
    never built unless ``return_weights=True``: the kernel streams key tiles
    through an online softmax (FlashAttention-2 order).

    Parameters
    ----------
    query, key, value : array_like, at least 2-D
    attn_mask : array_like, optional
        Broadcasts to ``(..., L, S)``. Bool: True means "may attend".
        Float: added to the scaled scores (cast to the compute dtype).
    dropout_p : float in [0, 1)
        Inverted dropout on the weights (kept weights scaled by ``1/(1-p)``).
        The keep/drop pattern comes from ``rng`` and the element's position
        only, so a seed gives the same result on any thread count.
    is_causal : bool or {"top_left", "bottom_right"}
        True / "top_left": key j is kept for query i when ``j <= i``
        (PyTorch's ``tril(ones(L, S))``). "bottom_right": ``j <= i + S - L``
        (FlashAttention; decoding with a cache). Intersects with attn_mask.
    scale : float, optional
        ``None`` means ``1/sqrt(E)`` (1 when E = 0). Scalars (``scale``,
        ``dropout_p``, ``softcap``) take any real number -- Python or NumPy,
        a 0-d array -- but not a string (``"0.5"``) or a bool (a bool here is
        an argument in the wrong place): ``TypeError``.
    enable_gqa : bool
        Axis -3 of key/value may hold ``Hkv`` heads with ``Hq % Hkv == 0``;
        query head h uses key/value head ``h // (Hq // Hkv)``, read in place.
    rng : None, int or numpy.random.Generator
        Source of the dropout key, as NumPy's random API takes it (a seed,
        or a Generator that is advanced); used only when ``dropout_p > 0``.
    return_weights : bool
        Also return the ``(..., L, S)`` weights applied to value (after
        masking and dropout; sink weights are not part of them).
    out : ndarray, optional
        Exact result shape and dtype, writeable.
    window : (left, right), optional
        Sliding window: query i sees keys ``d(i) - left <= j <= d(i) + right``
        where ``d(i) = i`` (``i + S - L`` with ``is_causal="bottom_right"``);
        ``None`` in either place is unbounded, and so is a side of at least
        ``S + L`` (any int is taken). Mistral: ``window=(4095, 0)``
        with ``is_causal=True``. Key tiles outside every row's window are
        skipped, not masked.
    alibi_slopes : array_like, optional
        ``(Hq,)`` or ``(B, Hq)`` (a trailing part of the query's batch axes,
        heads last): adds ``-slope[h] * |d(i) - j|`` to the scores (ALiBi,
        FlashAttention's convention).
    softcap : float > 0, optional
        ``s = softcap * tanh(s / softcap)`` on the scaled scores, before
        any mask (Gemma 2, Grok).
    sinks : array_like, optional
        ``(Hq,)`` (or a trailing part of the batch axes, like the slopes): one
        extra logit per head in every row's softmax denominator, a key whose
        value is zero (gpt-oss attention sinks); a row may give weight to
        nothing. Sink weights are not part of ``weights``.
    return_lse : bool
        Also return ``lse (..., L)``: ``log(sum_j exp(s_ij))`` over the
        admissible keys (plus the sink term), before dropout; ``-inf`` for a
        row with nothing admissible. Feed it to :func:`merge_attention`.
    precision : None, "highest" or "bf16"
        ``"bf16"`` (opt-in; float32 and 16-bit inputs; not with
        ``return_weights``): query, key and value are rounded to bfloat16
        and multiplied on bfloat16 products with float32 sums (AVX512_BF16's
        ``vdpbf16ps`` where the CPU has it, else its exact emulation, as in
        :func:`matmul`); the
        scale is applied to the float32 scores; the unnormalised weights
        ``exp(s - m)`` of each 60-key tile (``m``: the running row max over
        the tiles so far) are rounded to bfloat16 before they multiply
        ``value``, as PyTorch's bfloat16 flash kernel rounds them; the
        softmax sums stay float32. ``pyattn._reference`` models it.
        Decode shapes (at most 8 query rows, or GQA's query heads stacked as
        up to 32 rows per key/value head) take a decode kernel with the same
        roundings: bfloat16 query, key and value, their products exact in
        float32 and summed in float32 (16 partial sums, not ``vdpbf16ps``'s
        pair order: the last bits differ from the tiled kernel's, the same on
        every SIMD family), weights rounded per 60-key tile against the same
        running max; for long ``S`` and few heads per thread its scores are
        computed by key chunks in parallel and the rest runs in key order, so
        the bits do not depend on the split or the thread count.
    align : None, "top_left" or "bottom_right"
        Where query row i sits on the key axis, ``d(i)``, for the causal
        rule, the window and ALiBi. ``None`` (default): ``i``, or ``i + S - L``
        with ``is_causal="bottom_right"``. ``"bottom_right"``: ``i + S - L``
        for all three, also without causal (FlashAttention's placement when
        ``L != S``; ``is_causal=True`` is then bottom-right causal).
        ``"top_left"`` with ``is_causal="bottom_right"`` is a ``ValueError``.
    block_mask : pyattn.BlockMask, optional
        A mask given as a map of tiles (:meth:`pyattn.BlockMask.from_mask_mod`,
        :mod:`pyattn.masks`), of shape ``(B or 1, H or 1, L, S)`` broadcasting
        to the batch axes (heads last): empty tiles are never computed, full
        ones take no mask test. Intersects with every other mask and option.

    Returns
    -------
    ndarray, or a tuple ``(output[, weights][, lse])`` when ``return_weights``
    or ``return_lse`` is set. Dtype: float32
    when query, key and value are all float32 (or float16, computed in
    float32); float64 when any of them is float64, integer or bool (NumPy
    promotion). A float mask is cast to that dtype and does not change it.

    Raises
    ------
    ValueError
        Operands under 2-D; key and query head dims (E) or key and value
        lengths (S) that differ; batch axes that do not broadcast (with a hint
        when only the head counts differ: ``enable_gqa=True``); query heads
        not a multiple of the key/value heads with ``enable_gqa``; a mask
        that does not broadcast to ``(..., L, S)``; ``dropout_p`` outside
        [0, 1); an ``is_causal`` string other than the two above; an ``out``
        of the wrong shape or dtype; a negative window size; ``softcap <= 0``;
        slopes or sinks whose shape does not match the query heads.
    TypeError
        An operand that is not array-like, or complex, object, string or
        datetime; a mask that is neither bool nor numeric; a Python bool
        as ``attn_mask`` (PyTorch's ``sdpa(q, k, v, True)`` habit: pass
        ``is_causal=True``); a bad ``rng``; a scalar that is not a real
        number (window sides: not an integer).

    A query row with no admissible key gives weights 0 and an output row of 0.
    NaN in query/key (or a float mask) spreads to the rows it touches; a key
    whose weight is exactly 0 (masked or dropped) contributes nothing.

    Results are bit-identical whatever the thread count, and a row's result
    does not depend on the batch it was computed in. Calls with few queries
    (L <= 8, decoding) run a row kernel (and split long key sequences into
    fixed chunks over threads), so the same row can differ in the last bits
    from a call with more queries.

    Notes
    -----
    Scores follow API.md's order: ``scale * q.k``, softcap, a float mask is
    added, ALiBi is added, then the bool mask, causal rule and window decide
    which keys are admissible; softmax over them (and the sink).

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> q = k = v = np.random.default_rng(0).standard_normal((2, 4, 8, 16))
    >>> pyattn.scaled_dot_product_attention(q, k, v, is_causal=True).shape
    (2, 4, 8, 16)
    >>> o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, window=(3, 0),
    ...                                              return_lse=True)
    >>> lse.shape
    (2, 4, 8)
    """
    # a repeated plain call (a decode step's): its signature's plan (pyattn/_kvfast.py)
    sig = _kvfast.sdpa_signature(query, key, value, out, dropout_p, is_causal, scale, enable_gqa, window,
                                 softcap, return_lse, precision, align) if (
        attn_mask is None and alibi_slopes is None and sinks is None and block_mask is None
        and return_weights is False) else None
    if sig is not None:
        res = _kvfast.sdpa_run(sig, query, key, value, out)
        if res is not None:
            return res
    spec = attn_spec(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     rng=rng, window=window, alibi_slopes=alibi_slopes, softcap=softcap,
                     sinks=sinks, precision=precision, return_weights=return_weights,
                     return_lse=return_lse, align=align, block_mask=block_mask)
    res = _sdpa(spec, out)
    if sig is not None:
        _kvfast.sdpa_remember(sig, spec, out)
    return res


def _sdpa(spec, out=None, *, nthreads=0, append=None, paged=None):
    """Run the forward of an attention call described by spec (_spec.attn_spec):
    out receives the result (checked here); append is attention_with_kvcache's
    new rows (_C.sdpa's append: written once the call has checked and allocated
    everything); nthreads is the task's share of a worker (pyattn.dask)."""
    dt, L, S, E, Ev = spec.dtype, spec.L, spec.S, spec.E, spec.Ev
    groups, hkv, full_batch = spec.groups, spec.hkv, spec.full_batch
    qkv = spec.kv_scales is not None               # int8 / int4 k, v and their scales
    q = store16(spec.query, dt)
    sk, sv = spec.kv_scales if qkv else (None, None)
    k = spec.key if sk is not None else store16(spec.key, dt)
    v = spec.value if sv is not None else store16(spec.value, dt)
    mask = spec.mask
    if groups > 1:
        q = split_axis(q, -3, hkv, groups)
        k = k[..., None, :, :]
        v = v[..., None, :, :]
        sk = None if sk is None else sk[..., None, :, :]
        sv = None if sv is None else sv[..., None, :, :]
        batch = full_batch[:-1] + (hkv, groups)
        if mask is not None:
            mask = split_axis(mask, -3, hkv, groups)
    else:
        batch = full_batch
    # decoding with GQA (one query per head): the query heads of each key/value
    # head become rows of one call, so every key/value tile is read once for
    # the group (row_div: rows per query position); per-head options keep
    # the head-by-head layout
    stack = (groups > 1 and L == 1 and mask is None and spec.dropout_p == 0 and not spec.return_weights
             and spec.slopes is None and spec.sinks is None
             and spec.cu_seqlens_q is None and spec.block_mask is None)
    q = bcast(q, batch + (L, E))
    k = bcast(k, batch + (S, k.shape[-1] if qkv else E))      # int4: E / 2 bytes
    v = bcast(v, batch + (S, v.shape[-1] if qkv else Ev))
    sk = None if sk is None else bcast(sk, batch + sk.shape[-2:])
    sv = None if sv is None else bcast(sv, batch + sv.shape[-2:])
    if stack:
        q, k, v = q[..., 0, :], k[..., 0, :, :], v[..., 0, :, :]
        sk = None if sk is None else sk[..., 0, :, :]
        sv = None if sv is None else sv[..., 0, :, :]
        batch = batch[:-1]
    shape = spec.out_shape
    extra = spec.c_kwargs()
    if stack:
        extra["row_div"] = groups
    if spec.bf16:
        extra["bf16"] = True
    if spec.int8:
        extra["int8"] = True
    if spec.kv_len is not None:
        a = spec.kv_len
        if stack:
            a = np.ascontiguousarray(a.reshape(full_batch[:-1] + (hkv, groups))[..., 0])
        extra["kv_len"] = a.reshape(-1)
    if spec.qoff is not None:
        extra["qoff"] = spec.qoff
    if append is not None:
        extra["append"] = append
    if paged is not None:                    # a paged cache (pyattn/_paged.py)
        extra["paged"] = paged
    if sk is not None:
        extra["k_scale"] = sk
    if sv is not None:
        extra["v_scale"] = sv
    if nthreads:
        extra["nthreads"] = int(nthreads)
    if spec.dropout_p > 0:
        extra["dropout_key"] = dropout_key(spec.rng)
    if spec.return_weights:
        extra["want_weights"] = True
    if spec.return_lse:
        extra["want_lse"] = True
    kout = None
    if out is not None:
        check_out(out, shape, dt, spec.narrow)
        if out.dtype == dt and out_for_kernel(out, (q, k, v, mask)):
            kout = split_axis(out, -3, hkv, groups) if groups > 1 else out
            if stack:
                kout = kout[..., 0, :]
    res, w, lse = _C.sdpa(q, k, v, kout, mask, **extra)
    if groups > 1:
        res = res.reshape(shape) if kout is None else out
        if w is not None:
            w = w.reshape(full_batch + (L, S))
        if lse is not None:
            lse = lse.reshape(full_batch + (L,))
    if out is not None:
        if kout is None:
            out[...] = res
        res = out
    if not (spec.return_weights or spec.return_lse):
        return res
    return (res,) + ((w,) if spec.return_weights else ()) + ((lse,) if spec.return_lse else ())


def _linear(x, w, b, dt):
    """x (B, T, d_in) @ w.T (+ b) with w (d_out, d_in): torch.nn.Linear's layout,
    read through strides (w.T is a view, broadcast over B with stride 0)."""
    wt = np.broadcast_to(to_dtype(w, dt).T, x.shape[:-2] + (w.shape[1], w.shape[0]))
    return _C.matmul(x, wt, None, None if b is None else to_dtype(b, dt))


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o=None,
                         b_q=None, b_k=None, b_v=None, b_o=None, *, attn_mask=None,
                         is_causal=False, dropout_p=0.0, scale=None, rng=None,
                         return_weights=False):
    """Multi-head attention, batch first, with ``torch.nn.Linear`` weight layout.

    ``q = query @ w_q.T + b_q`` (likewise k, v); heads are split from the last
    axis (``view(B, L, H, d/H).transpose(1, 2)``), attended with
    :func:`scaled_dot_product_attention`, concatenated back and projected by
    ``w_o``/``b_o`` when given. PyTorch state-dict tensors drop in unchanged.

    Shapes: ``query (B, L, d_q)``, ``key (B, S, d_k)``, ``value (B, S, d_v)``
    (the batch axis is optional); ``w_q (d_out, d_q)``, ``w_k (d_out, d_k)``,
    ``w_v (d_vo, d_v)``, ``w_o (d_model, d_vo)``, biases 1-D. ``d_out`` and
    ``d_vo`` must be multiples of ``num_heads``. Result ``(B, L, d_model)``
    (``(B, L, d_vo)`` without ``w_o``); weights ``(B, H, L, S)`` when
    ``return_weights``. Masks broadcast against ``(B, H, L, S)``; ``scale``
    defaults to ``1/sqrt(d_out / num_heads)``.

    Parameters
    ----------
    query, key, value : array_like
        ``(B, L, d_q)``, ``(B, S, d_k)``, ``(B, S, d_v)``.
    num_heads : int
        Heads; ``d_out`` and ``d_vo`` must be multiples of it.
    w_q, w_k, w_v, w_o : array_like
        Projection weights, ``torch.nn.Linear`` layout (``w_o`` optional).
    b_q, b_k, b_v, b_o : array_like, optional
        Projection biases.
    attn_mask, is_causal, dropout_p, scale, rng : option
        As :func:`scaled_dot_product_attention`, per head.
    return_weights : bool, default False
        Also return the attention weights ``(B, H, L, S)``.

    Returns
    -------
    ndarray, or a tuple ``(output, weights)``
        ``(B, L, d_model)`` (``(B, L, d_vo)`` without ``w_o``).

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((2, 5, 8)); w = rng.standard_normal((4, 8, 8))
    >>> pyattn.multi_head_attention(x, x, x, 2, w[0], w[1], w[2], w[3], is_causal=True).shape
    (2, 5, 8)
    """
    names = ("query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")
    vals = [None if a is None else as_array(a, n)
            for a, n in zip((query, key, value, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o), names)]
    x_q, x_k, x_v, wq, wk, wv, wo, bq, bk, bv, bo = vals
    h = index_value(num_heads, "num_heads")
    if h < 1:
        raise ValueError(f"num_heads must be positive, got {h}")
    for x, n in ((x_q, "query"), (x_k, "key"), (x_v, "value")):
        if x.ndim not in (2, 3):
            raise ValueError(f"{n} must be (B, T, d) or (T, d), got shape {x.shape}")
    if not x_q.ndim == x_k.ndim == x_v.ndim:
        raise ValueError(f"query {x_q.shape}, key {x_k.shape} and value {x_v.shape} must all have a batch axis or none")
    for w, n in ((wq, "w_q"), (wk, "w_k"), (wv, "w_v"), (wo, "w_o")):
        if w is not None and w.ndim != 2:
            raise ValueError(f"{n} must be 2-D (d_out, d_in), got shape {w.shape}")
    for w, x, n, xn in ((wq, x_q, "w_q", "query"), (wk, x_k, "w_k", "key"), (wv, x_v, "w_v", "value")):
        if w.shape[1] != x.shape[-1]:
            raise ValueError(f"{n} has shape {w.shape} but {xn} has shape {x.shape}: {n}.shape[1] must equal {xn}.shape[-1]")
    if wk.shape[0] != wq.shape[0]:
        raise ValueError(f"w_k has shape {wk.shape} but w_q has shape {wq.shape}: their d_out must match")
    d_out, d_vo = wq.shape[0], wv.shape[0]
    if d_out % h or d_vo % h:
        raise ValueError(f"num_heads ({h}) must divide d_out (w_q shape {wq.shape}, w_v shape {wv.shape})")
    if x_k.shape[-2] != x_v.shape[-2]:
        raise ValueError(f"key has shape {x_k.shape} and value has shape {x_v.shape}: their lengths S must match")
    if wo is not None and wo.shape[1] != d_vo:
        raise ValueError(f"w_o has shape {wo.shape} but the heads concatenate to {d_vo}: w_o.shape[1] must be {d_vo}")
    if wo is None and bo is not None:
        raise ValueError("b_o was given without w_o")
    for b, w, n in ((bq, wq, "b_q"), (bk, wk, "b_k"), (bv, wv, "b_v"), (bo, wo, "b_o")):
        if b is not None and b.shape != (w.shape[0],):
            raise ValueError(f"{n} has shape {b.shape}, expected ({w.shape[0]},)")
    dt = compute_dtype(*[(a, n) for a, n in zip(vals, names) if a is not None])

    unbatched = x_q.ndim == 2
    if unbatched:
        x_q, x_k, x_v = x_q[None], x_k[None], x_v[None]
    B = broadcast_shapes([(x_q.shape[:1], "query"), (x_k.shape[:1], "key"), (x_v.shape[:1], "value")],
                         "batch axes of query, key and value")
    x_q = bcast(to_dtype(x_q, dt), B + x_q.shape[1:])
    x_k = bcast(to_dtype(x_k, dt), B + x_k.shape[1:])
    x_v = bcast(to_dtype(x_v, dt), B + x_v.shape[1:])
    L, S = x_q.shape[1], x_k.shape[1]
    hd, hdv = d_out // h, d_vo // h
    qh = _linear(x_q, wq, bq, dt).reshape(B + (L, h, hd)).transpose(0, 2, 1, 3)
    kh = _linear(x_k, wk, bk, dt).reshape(B + (S, h, hd)).transpose(0, 2, 1, 3)
    vh = _linear(x_v, wv, bv, dt).reshape(B + (S, h, hdv)).transpose(0, 2, 1, 3)
    ctx = np.empty(B + (L, h, hdv), dtype=dt)
    r = scaled_dot_product_attention(qh, kh, vh, attn_mask, dropout_p, is_causal, scale, rng=rng,
                                     return_weights=return_weights, out=ctx.transpose(0, 2, 1, 3))
    ctx = ctx.reshape(B + (L, d_vo))
    res = ctx if wo is None else _linear(ctx, wo, bo, dt)
    if unbatched:
        res = res[0]
    if return_weights:
        w = r[1][0] if unbatched else r[1]
        return res, w
    return res


def merge_attention(outputs, lses, /):
    """Combine attention results over disjoint key sets into the result over their union.

    ``out = sum_p exp(lse_p - lse) * out_p`` and ``lse = logaddexp`` over the
    parts ``p`` (split-KV / ring attention): each part is a
    ``scaled_dot_product_attention(..., return_lse=True)`` result over some
    of the keys. Rows with every ``lse_p = -inf`` (nothing admissible in any
    part) give 0 and ``-inf``; a part with ``lse_p = -inf`` is not read for
    that row, so NaN there does not spread. Sinks belong to exactly one part.
    Computed in C, parts combined in order.

    Parameters
    ----------
    outputs : array_like ``(P, ..., L, Ev)``, or a sequence of P ``(..., L, Ev)`` arrays (stacked)
    lses : array_like ``(P, ..., L)``, or a sequence of P ``(..., L)`` arrays

    Returns
    -------
    (out ``(..., L, Ev)``, lse ``(..., L)``): float32 when both are float32
    (or float16), float64 otherwise.

    Raises
    ------
    ValueError
        ``outputs`` under 3-D (after stacking); ``lses`` whose shape is not
        ``outputs.shape[:-1]``; sequences of arrays whose shapes differ.
    TypeError
        Non-numeric input.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> q, k, v = np.random.default_rng(0).standard_normal((3, 4, 8, 16))
    >>> o1, l1 = pyattn.scaled_dot_product_attention(q, k[:, :5], v[:, :5], return_lse=True)
    >>> o2, l2 = pyattn.scaled_dot_product_attention(q, k[:, 5:], v[:, 5:], return_lse=True)
    >>> out, lse = pyattn.merge_attention([o1, o2], [l1, l2])
    >>> bool(np.allclose(out, pyattn.scaled_dot_product_attention(q, k, v)))
    True
    """
    def stacked(x, name):
        if isinstance(x, (list, tuple)):
            parts = [as_array(p, f"{name}[{i}]") for i, p in enumerate(x)]
            if len({p.shape for p in parts}) > 1:
                raise ValueError(f"{name}: the parts have different shapes {[p.shape for p in parts]}")
            if not parts:
                raise ValueError(f"{name} is an empty sequence; give at least one part")
            return np.stack(parts)
        return as_array(x, name)
    o = stacked(outputs, "outputs")
    ls = stacked(lses, "lses")
    if o.ndim < 3:
        raise ValueError(f"outputs must be (P, ..., L, Ev) with at least 3 dimensions, got shape {o.shape}")
    if ls.shape != o.shape[:-1]:
        raise ValueError(f"lses has shape {ls.shape}; expected outputs.shape[:-1] = {o.shape[:-1]}")
    dt = compute_dtype((o, "outputs"), (ls, "lses"))
    return _C.merge(to_dtype(o, dt), to_dtype(ls, dt))


def _cache_array(x, name, writeable):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray (it is read, and written, in place), "
                        f"got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64, np.int8, np.uint8) and not is16(x.dtype):
        raise TypeError(f"{name} must be float32, float64, float16 or bfloat16, or int8 / uint8 (int4 "
                        f"pairs) with its scales, got dtype {x.dtype}")
    if x.ndim != 4:
        raise ValueError(f"{name} must be (B, Hkv, S_max, E), got shape {x.shape}")
    if writeable and not x.flags.writeable:
        raise ValueError(f"{name} is read-only, but key/value were given to be written into it")
    return x


def _seqlens(cache_seqlens, B, limit, T):
    """(B,) int64 from an int or a (B,) integer array (never modified), each
    entry in [0, limit] (limit: S_max, or S_max - T with T new rows): compared
    as they are, never summed, so nothing wraps however large they are."""
    if cache_seqlens is None:
        raise TypeError("cache_seqlens is required: an int or a (B,) integer array of filled rows")
    name = "cache_seqlens"
    if isinstance(cache_seqlens, (list, tuple)):
        vals = [number(x, "cache_seqlens entries", integer=True) for x in cache_seqlens]
    elif isinstance(cache_seqlens, (numbers.Number, np.generic, bool, str, bytes)):
        vals = number(cache_seqlens, name, integer=True)
    else:
        a = as_array(cache_seqlens, name)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
        vals = int(a[()]) if a.ndim == 0 else a
    if isinstance(vals, int):
        vals = [vals] * B
    if isinstance(vals, list) and len(vals) != B:
        raise ValueError(f"{name} has {len(vals)} entries; expected an int or shape ({B},)")
    if isinstance(vals, np.ndarray):
        if vals.shape != (B,):
            raise ValueError(f"{name} has shape {vals.shape}; expected an int or shape ({B},)")
        bad = np.ones(B, bool) if limit < 0 else (vals < 0) | (vals > limit)
    else:
        bad = np.array([not 0 <= x <= limit for x in vals], bool)
    if bad.any():
        shown = vals.tolist() if isinstance(vals, np.ndarray) else vals
        raise ValueError(f"{name} must be in [0, S_max{' - T' if T else ''}] = [0, {limit}] "
                         f"(S_max = {limit + T}{f', T = {T} new rows' if T else ''}), got {shown}; "
                         "nothing was written")
    return np.array(vals, dtype=np.int64)


def _qcache(c):
    """Values per stored element of a quantized cache: 1 (int8), 2 (int4 in
    uint8); 0 for a float cache."""
    return 1 if c.dtype == np.int8 else 2 if c.dtype == np.uint8 else 0


def attention_with_kvcache(query, k_cache, v_cache, key=None, value=None, *, cache_seqlens,
                           is_causal=True, scale=None, window=None, alibi_slopes=None,
                           softcap=None, sinks=None, return_lse=False, out=None, precision=None,
                           rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                           cache_leftpad=None, cache_batch_idx=None, block_table=None, cu_seqlens_q=None,
                           tree_mask=None, k_scale=None, v_scale=None,
                           block_mask=None):
    """Attention over a KV cache, appending new keys/values in place first (FlashAttention's
    ``flash_attn_with_kvcache``).

    Shapes: ``query (B, Hq, T, E)``; ``k_cache (B, Hkv, S_max, E)``,
    ``v_cache (B, Hkv, S_max, Ev)`` with ``Hq % Hkv == 0`` (GQA / MQA: the
    caches are read in place, never repeated); ``key``/``value (B, Hkv, T, E/Ev)``
    -> ``(B, Hq, T, Ev)``. The new rows may be ``Tk != T``: ``key``/``value
    (B, Hkv, Tk, E/Ev)``.

    With ``key``/``value``, they are written (converted to the cache dtype)
    into rows ``[n_b, n_b + Tk)`` of each sequence ``b`` (``n = cache_seqlens``),
    then query row ``t`` sits at position ``n_b + Tk - T + t`` and sees keys
    ``[0, n_b + Tk)``; without them, keys ``[0, n_b)`` with query ``t`` at
    ``n_b - T + t``. ``is_causal`` is bottom-right causal on those positions.
    The caches may have any strides (views, reversed or strided axes: read
    and written in place); a cache the kernels cannot address in place -- big-
    endian, unaligned, or an int8 / int4 cache or scale array whose last axis
    is not unit-stride -- is copied once for the call (C order, its own dtype)
    and, when rows are written, copied back after the call succeeds.
    Only those cache rows are written; ``cache_seqlens`` is not modified (see
    :class:`pyattn.KVCache`, which advances its lengths). Everything is
    checked and every array the call needs is allocated before the new rows
    are written: a call that raises (``MemoryError`` included) leaves the
    caches as they were. A ``KeyboardInterrupt`` (Ctrl-C) leaves each cache as
    it was or with all the new rows written, never part of them (the rows are
    written in C in one step, before the attention runs).

    Decode (``T = 1``) over long caches splits the keys into fixed chunks
    across threads (bit-identical for any thread count).

    Parameters
    ----------
    query : array_like, converted to the caches' compute dtype (float32 for
        16-bit caches; a 16-bit query is read in place)
    k_cache, v_cache : ndarray, float32 or float64 (one dtype for both), or
        float16 / bfloat16 (``ml_dtypes.bfloat16``): half the bytes to read,
        widened in the kernel, float32 arithmetic and result
    key, value : array_like, optional (both or neither)
    cache_seqlens : int or (B,) integer array
    is_causal : bool, default True
    scale, window, alibi_slopes, softcap, sinks, return_lse, precision :
        As in :func:`scaled_dot_product_attention` (positions are cache positions;
        ``precision="bf16"`` with float32 / float16 / bfloat16 caches runs the
        bfloat16 decode kernel on decode steps -- bfloat16 caches read in place
        -- and the tiled bfloat16 path on longer query blocks).
        ``precision="int8"``, with an int8 / int4 ``k_cache`` only (any other
        cache: ``ValueError``): each query row of each head is quantized to
        int8 per group of the cache's group size ``G`` exactly as
        ``quantize(q, "int8", group_size=G)`` does (its own float32 scale
        ``s_q,g`` per group; the query as float32 first); each key product is
        the exact integer sum of a group's products, ``fma((float)isum,
        s_q,g * s_k,g, acc)`` summed over the groups in order in float32, times
        ``scale``; then the softmax and the value products as at the default
        precision (AVX512_VNNI ``vpdpbusd`` where the CPU has it). Every query
        length works (longer blocks run the decode kernels row by row). The
        same bits on every kernel family and thread count. The bound: a
        score differs from the default precision's by at most
        ``|scale| * sum_g (s_q,g / 2) * sum_{e in g} |k_e|`` (half a query
        step per element times the dequantized key's magnitudes), plus the
        float32 rounding of the two scores; so each softmax weight moves by a
        factor within ``exp(+-2 D)`` (``D`` the largest such bound of the row)
        and the output by at most ``(exp(2 D) - 1) * max |v|``.
    block_mask : pyattn.BlockMask, optional
        Over the cache: ``kv_idx`` is the cache row, ``q_idx`` the query's
        cache position; its S must be ``S_max`` and its L at least the
        filled length (``n_b + T``).
    out : ndarray, optional
    rotary_cos, rotary_sin : array_like ``(R, rotary_dim / 2)``, optional
        Rotary embedding (RoPE), with ``key``/``value`` only: the new keys are
        rotated at positions ``n_b + t`` as they are written (the cache holds
        rotated keys; nothing else in it is read or copied), and the queries
        at ``n_b + t`` when ``is_causal`` or a ``window`` is given, else all at
        ``n_b`` (FlashAttention's rule). The first ``rotary_dim`` features
        rotate, in C: each new key as it is written, the queries into a
        scratch of their size. With a float32 / 16-bit cache the result is
        the exactly rounded value of ``x1 cos - x2 sin`` (inputs as float32)
        in the cache dtype (keys; int8 / int4: float32, then quantized) and in
        a 16-bit query's own dtype (else float32); with float64, NumPy's
        float64 expression bit for bit. Positions ``>= R`` are a
        ``ValueError``. Also with ``block_table`` and ``cu_seqlens_q``
        (packed: row ``t`` of sequence ``b`` at ``n_b + t``), rotated before
        the paged write; not with ``tree_mask`` (``NotImplementedError``: a
        tree's tokens have no positions ``n_b + t``).
    rotary_interleaved : bool, default False
        False: features ``i`` and ``i + rotary_dim/2`` form a pair (GPT-NeoX,
        Llama, Hugging Face); True: ``2i`` and ``2i + 1`` (GPT-J;
        FlashAttention's default).
    cache_leftpad : (B,) integer array, optional
        Sequence b's keys start at cache row ``cache_leftpad[b]``
        (``<= cache_seqlens[b]``): rows before it are not attended. Positions
        (causal rule, window, ALiBi, rotary) stay the cache rows.
    cache_batch_idx : (B,) integer array, optional
        Sequence b reads (and writes) cache entry ``cache_batch_idx[b]``; the
        caches may hold more entries than the query's B. Repeated entries
        with new keys: the last sequence's rows are written last.
        With ``cache_leftpad`` or ``cache_batch_idx`` the call runs one
        sequence at a time on views of the caches (every per-sequence value
        is checked before the first row is written). Both index contiguous
        caches: with ``block_table``, ``cu_seqlens_q`` or ``tree_mask`` they
        raise ``ValueError`` (FlashAttention refuses
        ``cache_batch_idx`` with a paged cache too).
    block_table : (B, max_blocks) integer array, optional
        Paged caches: ``k_cache (num_blocks, Hkv, block_size, E)``, ``v_cache
        (num_blocks, Hkv, block_size, Ev)`` (any strides: FlashAttention's
        token-major pool as ``.transpose(0, 2, 1, 3)``); sequence ``b``'s row
        ``r`` is row ``r % block_size`` of block ``block_table[b, r //
        block_size]``, read (and written) in place. Entries a sequence does not
        reach are ignored (-1 allowed). ``key``/``value (B, Hkv, Tk, E/Ev)``
        may bring ``Tk != T`` rows here too (not with ``cu_seqlens_q`` or
        ``tree_mask``). Decode calls (few query rows, 4096 keys or more)
        read the blocks several sequences hold (forks: a shared prompt) once
        for all of them, key tile by key tile; the results are bit for bit
        those of the same call on unshared copies of the blocks.
    cu_seqlens_q : (B + 1,) integer array, optional
        Packed queries: ``query (total_q, Hq, E)``, ``key``/``value (total_q,
        Hkv, E/Ev)``, sequence ``b`` bringing ``cu[b+1] - cu[b]`` tokens (0
        allowed); ``out (total_q, Hq, Ev)``, ``lse (total_q, Hq)``. Sequences
        with different counts run in one kernel call per distinct count.
    tree_mask : (B or 1, Hq or 1, T, T) bool array, optional
        Among the T new tokens (T: the most of any sequence; sequence ``b``
        uses the top-left ``T_b x T_b`` corner), which may see which (True);
        every cached row before them stays visible; combined with
        ``is_causal``. See :class:`pyattn.PagedKVCache` for a managed pool.
    k_scale, v_scale : ndarray, float32 ``(B, Hkv, S_max, E / group)``, optional
        The scales of an int8 cache (``np.int8 (B, Hkv, S_max, E)``) or an
        int4 cache (``np.uint8 (B, Hkv, S_max, E / 2)``, two values per byte
        as :func:`pyattn.quantize` packs them): required with such a cache
        (with ``block_table``: int8 / int4 pools and scale pools ``(num_blocks,
        Hkv, block_size, E / group)``, read per block in place),
        the group size is ``E / k_scale.shape[-1]``. New keys/values are
        rounded to float32 and quantized as they are written (the rule of
        :func:`pyattn.quantize`: only their rows and scales change; NaN or
        inf in them is a ValueError and nothing is written); the kernels
        read the rows and scales in place and dequantize in registers. The
        result equals attention over ``dequantize(cache)`` to float32
        tolerance. Not with ``precision="bf16"`` or head dims over 512; with
        ``precision="int8"`` (above), integer key products.

    Returns
    -------
    ndarray ``(B, Hq, T, Ev)`` of the caches' compute dtype, or ``(out, lse)``.

    Raises
    ------
    ValueError
        Shapes that do not match (caches, query, key/value); query heads
        not a multiple of the cache heads; ``cache_seqlens`` negative, of
        the wrong shape, or past ``S_max`` (with the new rows: ``n_b + T >
        S_max``, compared without a sum that could wrap); ``precision="int8"``
        with a cache that is not int8 / int4; a read-only cache when key/value are given; only one of
        key and value; and the structured-mask errors of
        :func:`scaled_dot_product_attention`. With ``block_table``: an entry
        a call reads or writes out of ``[0, num_blocks)`` (or -1), two
        sequences that would write one row, a cache too short for the new
        rows; ``cu_seqlens_q`` not starting at 0, decreasing or not ending at
        ``total_q``; a misshapen ``tree_mask``. Nothing is written then.
    TypeError
        Caches that are not float32/float64/float16/bfloat16 ndarrays,
        ``cache_seqlens`` not integers (floats, bools, strings), non-numeric
        key/value, a scalar that is not a real number.
    MemoryError
        A result that does not fit in memory (nothing is written then).

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> kc = np.zeros((1, 2, 16, 8), np.float32); vc = np.zeros_like(kc)
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 1, 2, 4, 8)).astype(np.float32)
    >>> o = pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=0)
    >>> bool(np.allclose(o, pyattn.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6))
    True
    """
    # a decode step's call: its signature's plan, made when the full path first accepted a call of
    # that signature (pyattn/_kvfast.py); every other call takes the full path
    sig = None
    if (alibi_slopes is None and sinks is None and rotary_cos is None and rotary_sin is None
            and cache_leftpad is None and cache_batch_idx is None and cu_seqlens_q is None
            and tree_mask is None and k_scale is None and v_scale is None and block_mask is None):
        sig = _kvfast.signature(query, k_cache, v_cache, key, value, out, is_causal, scale, window, softcap,
                                return_lse, precision) if block_table is None else \
            _kvfast.paged_signature(query, k_cache, v_cache, key, value, out, block_table, is_causal, scale,
                                    window, softcap, return_lse, precision)
    if sig is not None:
        res = _kvfast.run(sig, query, k_cache, v_cache, key, value, out, cache_seqlens, block_table)
        if res is not None:
            return res
    args = {k: v for k, v in locals().items() if k not in ("sig", "res")}
    res = _kvcache_full(**args)
    if sig is not None:
        _kvfast.remember(sig, query, k_cache, v_cache, key, out, is_causal, scale, window, softcap,
                         return_lse, precision, block_table)
    return res


def _kvcache_full(query, k_cache, v_cache, key=None, value=None, *, cache_seqlens,
                  is_causal=True, scale=None, window=None, alibi_slopes=None,
                  softcap=None, sinks=None, return_lse=False, out=None, precision=None,
                  rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                  cache_leftpad=None, cache_batch_idx=None, block_table=None, cu_seqlens_q=None,
                  tree_mask=None, k_scale=None, v_scale=None,
                  block_mask=None):
    """attention_with_kvcache's full path: every check, every kind of call."""
    args = dict(locals())
    if (key is None) != (value is None):
        raise ValueError("give both key and value to append, or neither")
    laid = _kvextra.cache_layouts((k_cache, v_cache, k_scale, v_scale), ("k_cache", "v_cache", "k_scale", "v_scale"),
                                  key is not None)
    if laid is not None:                        # one copy of a cache the kernels cannot take in place
        (args["k_cache"], args["v_cache"], args["k_scale"], args["v_scale"]), write_back = laid
        res = attention_with_kvcache(**args)
        write_back()
        return res
    if (k_scale is not None or v_scale is not None) and any(
            x is not None for x in (cache_leftpad, cache_batch_idx)):
        raise NotImplementedError("quantized caches (k_scale, v_scale) with cache_leftpad or cache_batch_idx "
                                  "are not supported yet")
    if block_mask is not None and any(
            x is not None for x in (cache_leftpad, cache_batch_idx, block_table, cu_seqlens_q, tree_mask)):
        raise NotImplementedError("block_mask with cache_leftpad, cache_batch_idx, block_table, cu_seqlens_q "
                                  "or tree_mask is not supported yet")
    if (cache_leftpad is not None or cache_batch_idx is not None) and any(
            x is not None for x in (block_table, cu_seqlens_q, tree_mask)):
        raise ValueError(
            "cache_leftpad and cache_batch_idx index contiguous caches (B, Hkv, S_max, E): they are not "
            "supported with block_table, cu_seqlens_q or tree_mask (as FlashAttention refuses "
            "cache_batch_idx with a paged cache); with a block table, point each table row at the "
            "sequence's own blocks instead")
    if cache_leftpad is not None or cache_batch_idx is not None:
        return _kvextra.per_sequence(
            attention_with_kvcache, query, k_cache, v_cache, key, value, cache_seqlens, cache_batch_idx,
            cache_leftpad, alibi_slopes, return_lse, out,
            dict(is_causal=is_causal, scale=scale, window=window, softcap=softcap, sinks=sinks,
                 precision=precision, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                 rotary_interleaved=rotary_interleaved))
    if block_table is not None or cu_seqlens_q is not None or tree_mask is not None:
        if tree_mask is not None and (rotary_cos is not None or rotary_sin is not None):
            raise NotImplementedError("rotary_cos/rotary_sin with tree_mask: a tree's tokens have no "
                                      "positions n_b + t (rotate the query and keys at their tree "
                                      "positions before the call)")
        from ._paged import kvcache_paged           # paged / packed / tree calls
        return kvcache_paged(query, k_cache, v_cache, key, value, cache_seqlens, block_table,
                             cu_seqlens_q, tree_mask, is_causal=is_causal, scale=scale, window=window,
                             alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks,
                             return_lse=return_lse, out=out, precision=precision,
                             k_scale=k_scale, v_scale=v_scale, rotary=(rotary_cos, rotary_sin, rotary_interleaved))
    new = key is not None
    kc = _cache_array(k_cache, "k_cache", new)
    vc = _cache_array(v_cache, "v_cache", new)
    kq, vq = _qcache(kc), _qcache(vc)
    for c, sc, nm, sn in ((kc, k_scale, "k_cache", "k_scale"), (vc, v_scale, "v_cache", "v_scale")):
        if _qcache(c) and sc is None:
            raise ValueError(f"{nm} is an {'int8' if _qcache(c) == 1 else 'int4'} cache: {sn} (its float32 "
                             "scales, (B, Hkv, S_max, E / group)) is required")
        if not _qcache(c) and sc is not None:
            raise ValueError(f"{sn} is given but {nm} is {c.dtype}, not an int8 / int4 cache")
        if sc is not None and not (isinstance(sc, np.ndarray) and sc.dtype == np.float32):
            raise TypeError(f"{sn} must be a float32 numpy.ndarray, got "
                            f"{getattr(sc, 'dtype', type(sc).__name__)}")
    cd = np.dtype(np.float32) if is16(kc.dtype) or kq else kc.dtype    # the compute dtype
    if (np.dtype(np.float32) if is16(vc.dtype) or vq else vc.dtype) != cd:
        raise TypeError(f"k_cache ({kc.dtype}) and v_cache ({vc.dtype}) must compute in one dtype")
    B, Hkv, S_max, E = kc.shape
    E *= kq or 1
    if vc.shape[:3] != (B, Hkv, S_max):
        raise ValueError(f"v_cache has shape {vc.shape} and k_cache {kc.shape}: their first three "
                         "axes (B, Hkv, S_max) must match")
    Ev = vc.shape[3] * (vq or 1)
    q = as_array(query, "query")
    check_numeric(q, "query")
    if q.ndim != 4:
        raise ValueError(f"query must be (B, Hq, T, E), got shape {q.shape}")
    if q.shape[0] != B or q.shape[3] != E:
        raise ValueError(f"query has shape {q.shape} and k_cache {kc.shape}: B and E must match")
    Hq, T = q.shape[1], q.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"the query heads ({Hq}) must be a multiple of the cache heads "
                         f"(k_cache shape {kc.shape})")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool here (bottom-right causal on cache positions), "
                        f"got {is_causal!r}")
    append = None
    if new:
        kn, vn = as_array(key, "key"), as_array(value, "value")
        Tk = kn.shape[2] if kn.ndim == 4 else T
        for x, nm, last in ((kn, "key", E), (vn, "value", Ev)):
            check_numeric(x, nm)
            if x.shape != (B, Hkv, Tk, last):
                raise ValueError(f"{nm} has shape {x.shape}; expected {(B, Hkv, Tk, last)} "
                                 "(B, cache heads, the new rows Tk, head dim; key and value alike)")
        n = _seqlens(cache_seqlens, B, S_max - Tk, Tk)
        rope = None
        if rotary_cos is not None or rotary_sin is not None:    # queries rotated in C (a scratch)
            q, rope = _kvextra.rotary(q, kn, n, rotary_cos, rotary_sin, rotary_interleaved,
                                      bool(is_causal) or window is not None, cd)
        # the new rows in the caches' storage (a copy: never a view of a cache);
        # _C.sdpa writes them once everything is checked and allocated
        # (quantized caches: float32 rows, quantized as they are written;
        # rotary: keys in cd, rotated as they are written)
        rows = [x.astype(np.float32 if _qcache(c) else cd if rope and i == 0 else c.dtype, order="C", copy=True)
                for i, (x, c) in enumerate(((kn, kc), (vn, vc)))]
        kv = [c.view(np.uint16) if c.dtype.kind == "V" else c for c in (kc, vc)]
        rows = [r.view(np.uint16) if r.dtype.kind == "V" else r for r in rows]
        append = (kv[0], kv[1], rows[0], rows[1], n) + ((k_scale, v_scale) if kq or vq else ()) + \
            ((rope,) if rope else ())
        n = n + Tk
    else:
        if rotary_cos is not None or rotary_sin is not None:
            _kvextra.tables(rotary_cos, rotary_sin, None, E, None, "", cd)     # raises: no new keys
        n = _seqlens(cache_seqlens, B, S_max, 0)
    sc = (1.0 / math.sqrt(E) if E > 0 else 1.0) if scale is None else real_scalar(scale, "scale")
    # a 16-bit query is read in place (bfloat16 as such: _sdpa views its bits);
    # anything else is converted to the caches' compute dtype
    qd = q if is16(q.dtype) and cd == np.float32 else to_dtype(q, cd)
    q8 = int8_precision(precision, kc)          # precision="int8": an int8 / int4 k_cache
    # a quantized cache is described by a float32 stand-in of its shape (the
    # spec's checks), then the spec carries the cache and its scales
    ks = np.broadcast_to(np.float32(0), kc.shape[:3] + (E,)) if kq else kc
    vs = np.broadcast_to(np.float32(0), vc.shape[:3] + (Ev,)) if vq else vc
    spec = attn_spec(qd, ks, vs, None, 0.0, "bottom_right" if is_causal else False, sc, Hq != Hkv,
                     window=window, alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks,
                     precision=None if q8 else precision, return_lse=return_lse, kv_len=n[:, None],
                     block_mask=block_mask)
    if kq or vq:
        if spec.bf16:
            raise ValueError("precision='bf16' is not available with int8 / int4 caches")
        spec = spec._replace(key=kc, value=vc, kv_scales=(k_scale, v_scale), int8=q8)
    return _sdpa(spec, out, append=append)
