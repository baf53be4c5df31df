"""pyattn.KVCache: preallocated key/value caches for generation."""
from __future__ import annotations

import numpy as np

from ._kvapi import attention_with_kvcache
from ._checks import cache_dtype, number
from ._paged import CacheFullError

__all__ = ["KVCache"]


class KVCache:
    """Key/value caches of ``batch`` sequences, filled token by token.

    ``k (B, Hkv, max_len, E)`` and ``v (B, Hkv, max_len, Ev)`` are allocated
    once (zeros); ``lengths (B,)`` int64 counts the rows filled per sequence.
    :meth:`attend` writes new keys/values after the filled rows, attends
    (bottom-right causal by default, GQA when the query has more heads) and
    advances ``lengths``. Nothing is written when a call raises, except
    on ``KeyboardInterrupt`` (Ctrl-C) during the attention: the new rows are
    then written past ``lengths``, which stays unchanged (they count as
    unfilled and the next call overwrites them).

    Parameters
    ----------
    batch, num_kv_heads, max_len, head_dim : int
    value_dim : int, optional (default ``head_dim``)
    dtype : float32 (default), float64, float16, ``ml_dtypes.bfloat16``, ``"int8"``, ``"int4"``, ``"fp8_e4m3"`` or ``"fp8_e5m2"``
        16-bit caches take half the memory and half the bytes to read per
        decode step; new rows are rounded into them, arithmetic stays float32.
        ``"int8"`` / ``"int4"``: quantized caches (``k`` is ``np.int8 (B,
        Hkv, max_len, E)`` or ``np.uint8 (B, Hkv, max_len, E / 2)``, two
        values per byte) with float32 scales ``k_scale (B, Hkv, max_len, E /
        group_size)`` (``v``, ``v_scale`` likewise): new rows are quantized
        as they are written (:func:`pyattn.quantize`'s rule), the kernels
        read them in place; 1.125 / 0.625 bytes per value with groups of 32.
        ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (needs ``ml_dtypes``): ``k`` is
        ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2 (B, Hkv, max_len, E)``
        with the same float32 scales (quantize's fp8 rule); the kernels widen
        its rows to float32 tile by tile (no dequantized copy), giving the
        bits of the float32 cache ``dequantize(k, k_scale)`` (at the default
        precision; ``precision="bf16"``: :meth:`attend`).
    group_size : int, default 32
        Values per scale of an int8 / int4 / fp8 cache (it must divide head_dim and
        value_dim). Ignored by float caches.

    Attributes
    ----------
    k, v : ndarray
    k_scale, v_scale : ndarray float32, or None for a float cache
    lengths : ndarray int64 (B,)

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> cache = pyattn.KVCache(1, 2, 32, 8)
    >>> rng = np.random.default_rng(0)
    >>> for t in range(3):
    ...     q, k, v = rng.standard_normal((3, 1, 2, 1, 8)).astype(np.float32)
    ...     o = cache.attend(q, k, v)
    >>> cache.lengths
    array([3])
    """

    def __init__(self, batch, num_kv_heads, max_len, head_dim, value_dim=None, dtype=np.float32,
                 group_size=32):
        dims = []
        names = ("batch", "num_kv_heads", "max_len", "head_dim", "value_dim")
        for n, name in zip((batch, num_kv_heads, max_len, head_dim,
                            head_dim if value_dim is None else value_dim), names):
            n = number(n, name, integer=True)
            if n < 0 or (n == 0 and name == "num_kv_heads"):
                raise ValueError(f"{name} must be {'positive' if name == 'num_kv_heads' else '>= 0'}, got {n}")
            dims.append(n)
        dt, quant = cache_dtype(dtype)
        B, H, S, E, Ev = dims
        G = 1
        if quant:
            G = number(group_size, "group_size", integer=True)
            if G < 1 or E % G or Ev % G or (quant == "int4" and (E % 2 or Ev % 2)):
                raise ValueError(f"group_size {G} must divide head_dim {E} and value_dim {Ev}"
                                 + (" (which must be even for int4)" if quant == "int4" else ""))
        limit = np.iinfo(np.intp).max                  # Python ints: nothing wraps
        for nbytes, what in ((B * H * S * E * max(dt.itemsize, 4 if quant else 1),
                              "batch, num_kv_heads, max_len, head_dim"),
                             (B * H * S * Ev * max(dt.itemsize, 4 if quant else 1),
                              "batch, num_kv_heads, max_len, value_dim"),
                             (B * 8, "batch")):
            if nbytes > limit:
                raise ValueError(f"KVCache(batch={B}, num_kv_heads={H}, max_len={S}, head_dim={E}, "
                                 f"value_dim={Ev}) would need more than {limit} bytes ({what} too large)")
        per = 2 if quant == "int4" else 1                # values per stored element
        self.k = np.zeros((B, H, S, E // per), dt)
        self.v = np.zeros((B, H, S, Ev // per), dt)
        self.k_scale = np.zeros((B, H, S, E // G), np.float32) if quant else None
        self.v_scale = np.zeros((B, H, S, Ev // G), np.float32) if quant else None
        self.lengths = np.zeros(B, np.int64)
        self._quant = quant

    @property
    def max_len(self) -> int:
        """Rows each sequence can hold."""
        return self.k.shape[2]

    def attend(self, query, key, value, *, is_causal=True, scale=None, window=None, alibi_slopes=None,
               softcap=None, sinks=None, return_lse=False, out=None, precision=None):
        """Write ``key``/``value (B, Hkv, T, E/Ev)`` at rows ``[lengths, lengths + T)``,
        attend ``query (B, Hq, T, E)`` over the filled rows, advance ``lengths`` by T.

        The keyword arguments are :func:`pyattn.attention_with_kvcache`'s
        (the lengths come from the cache: no ``cache_seqlens``). Any error
        (``MemoryError`` included) writes nothing and leaves ``lengths``
        unchanged.

        Parameters
        ----------
        query : array_like
            ``(B, Hq, T, E)`` with ``Hq % Hkv == 0`` (GQA / MQA: the cache's
            heads are shared, read in place), converted to the cache's
            compute dtype (float32 for 16-bit and int8 / int4 caches; a
            16-bit query is read in place). Query row ``t`` of sequence
            ``b`` sits at position ``lengths[b] + t``.
        key : array_like
            ``(B, Hkv, T, E)``, the T new keys: converted to the cache dtype
            as they are written (int8 / int4: rounded to float32, then
            quantized by :func:`pyattn.quantize`'s rule; NaN or inf there
            is a ``ValueError``).
        value : array_like
            ``(B, Hkv, T, Ev)``, the T new values, written as ``key``.
        is_causal : bool, default True
            Bottom-right causal: query row ``t`` sees the cached rows and the
            new rows up to its own.
        scale, window, alibi_slopes, softcap, sinks : optional
            As in :func:`pyattn.scaled_dot_product_attention`, on cache
            positions (see :func:`pyattn.attention_with_kvcache`).
        return_lse : bool, default False
            Also return ``lse (B, Hq, T)``.
        out : ndarray, optional
            ``(B, Hq, T, Ev)`` of the compute dtype, writeable: the result is
            written there.
        precision : None, "highest", "bf16" or "int8", optional
            As in :func:`pyattn.scaled_dot_product_attention`; ``"bf16"``
            with an int8 / int4 / fp8 cache: the query rounded to bfloat16,
            exact key products on the stored values (fp8: each code's value,
            unscaled) summed in float32 per group, the group scales after
            the group's sums, the values as at the default precision (see
            :func:`pyattn.attention_with_kvcache`).
            ``"int8"`` with an int8 /
            int4 cache only (else a ``ValueError``, nothing written): the
            query rows quantized to int8 per group as :func:`pyattn.quantize`
            does, integer key products per group scaled by the two scales and
            summed over the groups in float32, then softmax and values as at
            the default precision; the same bits on every kernel family. Each
            score differs from the default's by at most ``|scale| * sum_g
            (s_q,g / 2) * sum_{e in g} |k_e|`` (half a query step per element
            times the key's magnitudes) plus float32 rounding; see
            :func:`pyattn.attention_with_kvcache`.

        Returns
        -------
        out : ndarray
            ``(B, Hq, T, Ev)``, of the cache's compute dtype.
        lse : ndarray
            ``(B, Hq, T)``, only with ``return_lse=True`` (then the call
            returns ``(out, lse)``).

        Raises
        ------
        pyattn.CacheFullError
            (a ``MemoryError``) when the new rows do not fit
            (``lengths + T > max_len``: the message names the sequences, the
            rows they hold and the rows asked for).
        TypeError
            ``key`` or ``value`` is None, and the type errors of
            :func:`pyattn.attention_with_kvcache`.
        ValueError
            The shape and value errors of
            :func:`pyattn.attention_with_kvcache` (shapes that do not match
            the cache, query heads not a multiple of the cache heads, ...).

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.KVCache(batch=1, num_kv_heads=2, max_len=8, head_dim=4)
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((3, 1, 2, 3, 4)).astype(np.float32)
        >>> cache.attend(q, k, v).shape                      # a prompt of 3 tokens
        (1, 2, 3, 4)
        >>> q1, k1, v1 = rng.standard_normal((3, 1, 2, 1, 4)).astype(np.float32)
        >>> out, lse = cache.attend(q1, k1, v1, return_lse=True)   # one more token
        >>> out.shape, lse.shape, cache.lengths
        ((1, 2, 1, 4), (1, 2, 1), array([4]))
        """
        for x, name in ((key, "key"), (value, "value")):
            if x is None:
                raise TypeError(f"KVCache.attend writes new rows: {name} is None (to attend without "
                                "writing, call pyattn.attention_with_kvcache(query, cache.k, cache.v, "
                                "cache_seqlens=cache.lengths))")
        shape = np.shape(key)
        if len(shape) == 4:            # other shapes: attention_with_kvcache names the problem
            self._check_room(shape[2])
        res = attention_with_kvcache(query, self.k, self.v, key, value, cache_seqlens=self.lengths,
                                     is_causal=is_causal, scale=scale, window=window,
                                     alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks,
                                     return_lse=return_lse, out=out, precision=precision,
                                     k_scale=self.k_scale, v_scale=self.v_scale)
        self.lengths += np.shape(key)[2]
        return res

    def _check_room(self, T):
        """CacheFullError, in the cache's terms, when T new rows do not fit."""
        full = np.flatnonzero(self.lengths + T > self.max_len)
        if full.size:
            b = int(full[0])
            who = (f"sequence {b} holds {int(self.lengths[b])}" if full.size == 1 else
                   f"sequences {full.tolist()[:8]}{' ...' if full.size > 8 else ''} hold "
                   f"{self.lengths[full].tolist()[:8]}{' ...' if full.size > 8 else ''}")
            raise CacheFullError(
                f"KVCache is full: {who} of its max_len={self.max_len} rows and this call adds {T} "
                f"(key has {T} rows along axis 2); nothing was written. Make a cache with a larger "
                "max_len, or reset() it")

    def reset(self) -> None:
        """Forget every sequence (lengths to 0; the rows are overwritten later).

        Nothing is freed or zeroed: the arrays keep their size and contents,
        and the next :meth:`attend` writes from row 0 again.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.KVCache(batch=2, num_kv_heads=1, max_len=4, head_dim=2)
        >>> x = np.ones((2, 1, 3, 2), np.float32)
        >>> _ = cache.attend(x, x, x)
        >>> cache.lengths
        array([3, 3])
        >>> cache.reset(); cache.lengths
        array([0, 0])
        """
        self.lengths[:] = 0

    def __repr__(self) -> str:
        B, H, S, E = self.k.shape
        per = 2 if self._quant == "int4" else 1
        q = "" if not self._quant else f", group_size={E * per // self.k_scale.shape[3]}"
        return (f"KVCache(batch={B}, num_kv_heads={H}, max_len={S}, head_dim={E * per}, "
                f"value_dim={self.v.shape[3] * per}, dtype={self._quant or self.k.dtype}{q}, "
                f"lengths={self.lengths.tolist()})")
