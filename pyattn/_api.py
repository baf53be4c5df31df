"""The public functions of pyattn (argument handling; the arithmetic is in C)."""
from __future__ import annotations

import numpy as np

from . import _C, _kvfast
from ._spec import attn_spec
from ._checks import (
    as_array, bcast, broadcast_shapes, causal_code, check_out, compute_dtype,
    dropout_key, index_value, is16, out_for_kernel, precision_value, prep_mask, real_scalar,
    split_axis, store16, to_dtype,
)

__all__ = ["matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
           "merge_attention"]


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
    sig = _kvfast.sdpa_signature(query, key, value, out, (dropout_p, is_causal, scale, enable_gqa, window,
                                                          softcap, return_lse, precision, align)) if (
        attn_mask is None and alibi_slopes is None and sinks is None and block_mask is None
        and return_weights is False) else None
    if sig is not None:
        res = _kvfast.sdpa_run(sig, query, key, value, out)
        if res is not None:
            return res
    spec = attn_spec(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     {"rng": rng, "window": window, "alibi_slopes": alibi_slopes, "softcap": softcap,
                      "sinks": sinks, "precision": precision, "return_weights": return_weights,
                      "return_lse": return_lse, "align": align, "block_mask": block_mask})
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
    # cache_batch_idx: the caches keep their own entries on axis 0 (the binding picks them)
    kb = batch if spec.cache_rows is None or spec.cache_rows[1] is None else (k.shape[0],) + batch[1:]
    k = bcast(k, kb + (S, k.shape[-1] if qkv else E))      # int4: E / 2 bytes
    v = bcast(v, kb + (S, v.shape[-1] if qkv else Ev))
    sk = None if sk is None else bcast(sk, kb + sk.shape[-2:])
    sv = None if sv is None else bcast(sv, kb + sv.shape[-2:])
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
    if paged is not None:                    # a paged cache (pyattn/_kvpaged.py)
        extra["paged"] = paged
    if sk is not None:
        extra["k_scale"] = sk
    if sv is not None:
        extra["v_scale"] = sv
    if nthreads or _kvfast.call_threads:
        extra["nthreads"] = int(nthreads or _kvfast.call_threads)
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
