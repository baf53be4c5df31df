"""attention_with_kvcache: the KV cache front (issue 39, item 3: out of
``_api.py``). A decode step's call runs by its signature's plan
(``_kvfast``); any other call takes the full path: ``_kvextra.cache_layouts``
(a copy of a cache the kernels cannot take in place), else one
``CacheSpec`` (``_cachespec.cache_spec``; ``cache_leftpad`` /
``cache_batch_idx`` are its fields, applied in C) run here (contiguous
caches) or by ``_kvpaged`` (block tables, packed and tree calls).
"""
from __future__ import annotations

import inspect

import numpy as np

from . import _kvextra, _kvfast
from ._api import _sdpa
from ._cachespec import _qcache, cache_spec
from ._kvpaged import kvcache_paged

__all__ = ["attention_with_kvcache"]


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
        ``precision="bf16"`` with an int8 / int4 / fp8 ``k_cache`` (its
        values exact in bfloat16: read as stored; ``k_e`` below is the stored
        value, an fp8 code's exact value, unscaled): the query rounded to
        bfloat16 (nearest even), each product ``bf16(q_e) * k_e`` exact in
        float32 (an fma: one rounding per term), summed per
        group in float32 in 16 partial sums (element ``e`` into sum ``e %
        16``), each partial sum times the key's group scale by one fma into
        its total, the groups in order, then the 16 totals pairwise; the
        score is that times ``scale`` (float32); the softmax and the value
        products as at the default precision (the weights not rounded; fp8
        values: the float32 kernels over the dequantized value tile). Every
        query length (the decode kernels row by row); the same bits on every
        kernel family and thread count, paged = contiguous; float keys with
        quantized values are a ``ValueError``.
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
        Both are applied in C, in one call over every sequence (as on views
        ``k_cache[cache_batch_idx[b], :, cache_leftpad[b]:]``), for every
        cache dtype (float, 16-bit, int8 / int4, fp8: the result is that of
        the same call on ``dequantize(cache)``, bit for bit). Both index
        contiguous caches: with ``block_table``, ``cu_seqlens_q`` or ``tree_mask`` they
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
        tolerance. Not with head dims over 512; with ``precision="int8"``
        (above), integer key products; with ``precision="bf16"`` (above),
        the query rounded to bfloat16. An fp8 cache
        (``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2 (B, Hkv, S_max, E)``,
        :func:`pyattn.quantize`'s fp8 rule) takes its scales the same way;
        its rows are widened to float32 per key tile as ``dequantize`` gives
        them and the float32 kernels read those: the result is that of the
        float32 cache ``dequantize(cache)``, bit for bit. Not with
        ``precision="int8"``; with ``precision="bf16"`` the key products
        take the rule above on the codes (the group scales after the sums).

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
    sig = opts = None
    if (alibi_slopes is None and sinks is None and rotary_cos is None and rotary_sin is None
            and cache_leftpad is None and cache_batch_idx is None and cu_seqlens_q is None
            and tree_mask is None and k_scale is None and v_scale is None and block_mask is None):
        opts = (is_causal, scale, window, softcap, return_lse, precision)
        sig = _kvfast.signature(query, k_cache, v_cache, key, value, out, opts) if block_table is None else \
            _kvfast.paged_signature(query, k_cache, v_cache, key, value, out, block_table, opts)
    if sig is not None:
        res = _kvfast.run(sig, query, k_cache, v_cache, key, value, out, cache_seqlens, block_table)
        if res is not None:
            return res
    args = {k: v for k, v in locals().items() if k not in ("sig", "opts", "res")}
    res = _kvcache_full(**args)
    if sig is not None:
        _kvfast.remember(sig, query, k_cache, v_cache, key, out, opts, block_table)
    return res


def _kvcache_full(query, k_cache, v_cache, key=None, value=None, **kw):
    """attention_with_kvcache's full path: every check, every kind of call
    (kw: its keywords; those not given take its defaults)."""
    args = dict(_DEFAULTS, query=query, k_cache=k_cache, v_cache=v_cache, key=key, value=value, **kw)
    if (key is None) != (value is None):
        raise ValueError("give both key and value to append, or neither")
    laid = _kvextra.cache_layouts((k_cache, v_cache, args["k_scale"], args["v_scale"]),
                                  ("k_cache", "v_cache", "k_scale", "v_scale"), key is not None)
    if laid is not None:                        # one copy of a cache the kernels cannot take in place
        (args["k_cache"], args["v_cache"], args["k_scale"], args["v_scale"]), write_back = laid
        res = attention_with_kvcache(**args)
        write_back()
        return res
    leftpad, batch_idx = args["cache_leftpad"], args["cache_batch_idx"]
    paged_args = tuple(args[x] for x in ("block_table", "cu_seqlens_q", "tree_mask"))
    if args["block_mask"] is not None and any(x is not None for x in (leftpad, batch_idx) + paged_args):
        raise NotImplementedError("block_mask with cache_leftpad, cache_batch_idx, block_table, cu_seqlens_q "
                                  "or tree_mask is not supported yet")
    if (leftpad is not None or batch_idx is not None) and any(x is not None for x in paged_args):
        raise ValueError(
            "cache_leftpad and cache_batch_idx index contiguous caches (B, Hkv, S_max, E): they are not "
            "supported with block_table, cu_seqlens_q or tree_mask (as FlashAttention refuses "
            "cache_batch_idx with a paged cache); with a block table, point each table row at the "
            "sequence's own blocks instead")
    rotary = args["rotary_cos"] is not None or args["rotary_sin"] is not None
    if args["tree_mask"] is not None and rotary:
        raise NotImplementedError("rotary_cos/rotary_sin with tree_mask: a tree's tokens have no "
                                  "positions n_b + t (rotate the query and keys at their tree "
                                  "positions before the call)")
    cs = cache_spec(query, k_cache, v_cache, key, value, args)
    if cs.table is not None:                    # paged / packed / tree calls
        return kvcache_paged(cs, args["out"])
    return _contiguous(cs, args["out"])


# attention_with_kvcache's defaults (_kvcache_full's keywords not given)
_DEFAULTS = {name: p.default for name, p in inspect.signature(attention_with_kvcache).parameters.items()
             if p.default is not p.empty}


def _contiguous(cs, out):
    """A call on contiguous caches (B, Hkv, S_max, E): one kernel call."""
    # the new rows in the caches' storage (a copy: never a view of a cache);
    # _C.sdpa writes them once everything is checked and allocated
    append = None if cs.key is None else cs.c_append(cs.rows(cs.key, cs.value), cs.n)
    kc, vc = cs.k_cache, cs.v_cache
    # a quantized cache is described by a float32 stand-in of its shape (the
    # spec's checks), then the spec carries the cache and its scales; with
    # cache_batch_idx any cache is (its B the query's: the C call picks
    # each sequence's entry, csrc/bind_call.c)
    rows = None if cs.leftpad is None and cs.batch_idx is None else (cs.leftpad, cs.batch_idx)
    B = cs.B if rows is not None and cs.batch_idx is not None else kc.shape[0]
    ks = np.broadcast_to(np.zeros((), np.float32 if _qcache(kc) else kc.dtype), (B,) + kc.shape[1:3] + (cs.E,)) \
        if _qcache(kc) or B != kc.shape[0] else kc
    vs = np.broadcast_to(np.zeros((), np.float32 if _qcache(vc) else vc.dtype), (B,) + vc.shape[1:3] + (cs.Ev,)) \
        if _qcache(vc) or B != vc.shape[0] else vc
    spec = cs.attn(cs.query, ks, vs, kv_len=cs.kv_len[:, None], slopes=cs.opts["alibi_slopes"])
    if rows is not None:
        spec = spec._replace(key=kc, value=vc, cache_rows=rows)
    if cs.quant:
        spec = spec._replace(key=kc, value=vc, kv_scales=(cs.k_scale, cs.v_scale), int8=cs.int8)
    return _sdpa(spec, out, append=append)
