"""One description of an attention call (Kernel architecture v3, item 1).

``attn_spec`` checks and normalises the arguments of an attention call once
-- for ``scaled_dot_product_attention``, its backward and vjp,
``attention_with_kvcache`` and ``pyattn.dask`` -- into one immutable
``AttnSpec``; ``_api._sdpa`` runs a spec (forward), ``_grad`` differentiates
one. The binding (csrc/bind_call.c) converts what ``AttnSpec.c_kwargs`` gives
into one C struct, ``pa_attn_call``. Adding an option: a field here, its
check in ``attn_spec``, its keyword in ``c_kwargs``, the struct field in C.

Shapes: query ``(..., L, E)``, key ``(..., S, E)``, value ``(..., S, Ev)``;
``full_batch`` is the result's batch axes (heads last), ``(..., L, Ev)`` the
result.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import numpy as np

from ._blockmask import check_block_mask
from ._checks import (
    align_code, as_array, broadcast_shapes, causal_code, compute_dtype, dropout_p_value, index_value, is16,
    per_head, precision_value, prep_mask, real_scalar, softcap_value, window_value,
)

__all__ = ["AttnSpec", "attn_spec"]


class AttnSpec(NamedTuple):
    """An attention call, checked and normalised (see the module docstring).
    Immutable (a NamedTuple: cheaper to build than a frozen dataclass,
    0.5 us against 4 us for its 34 fields, and built on every call)."""
    query: np.ndarray            # the operands as given (as arrays; 16-bit kept)
    key: np.ndarray
    value: np.ndarray
    dtype: np.dtype              # the compute dtype (float32 or float64)
    narrow: tuple                # the 16-bit storage dtypes among query, key, value
    L: int
    S: int
    E: int
    Ev: int
    full_batch: tuple            # the result's batch axes (query heads last)
    groups: int                  # GQA: query heads per key/value head (1: none)
    hkv: Optional[int]           # key/value heads when groups > 1
    mask: Optional[np.ndarray]   # attn_mask broadcast to full_batch + (L, S), or None
    causal: int                  # 0 none, 1 top-left, 2 bottom-right
    scale: float
    window: tuple                # (left, right), -1: unbounded
    softcap: float               # 0: none
    slopes: Optional[np.ndarray]   # ALiBi, float64, one per flat full_batch index
    sinks: Optional[np.ndarray]    # sink logits, likewise
    sinks_shape: Optional[tuple]   # the shape sinks were given in (their gradient's)
    dropout_p: float
    rng: Any                     # the dropout key's source (drawn when the call runs)
    bf16: bool                   # precision="bf16"
    kv_len: Optional[np.ndarray] = None   # int64 filled keys per flat index (KV cache)
    qoff: Optional[int] = None   # query row i at key position i + qoff (pyattn.dask)
    return_weights: bool = False
    return_lse: bool = False
    # room for wave 3, passed as None today: packed sequences, paged caches,
    # quantized caches and block masks
    cu_seqlens_q: Optional[np.ndarray] = None
    cu_seqlens_k: Optional[np.ndarray] = None
    block_table: Optional[np.ndarray] = None
    kv_scales: Optional[tuple] = None
    block_mask: Optional[tuple] = None   # BlockMask._c_arg(full_batch): the binding's tuple
    seq_align: bool = False      # varlen: each sequence bottom-right (align="bottom_right")
    int8: bool = False           # precision="int8" (int8 / int4 k caches): int8 query rows
    cache_rows: Optional[tuple] = None   # KV cache: (cache_leftpad, cache_batch_idx), (B,) int64 or None

    @property
    def out_shape(self) -> tuple:
        """The result's shape, full_batch + (L, Ev)."""
        return self.full_batch + (self.L, self.Ev)

    def c_kwargs(self) -> dict:
        """The options as _C.sdpa / _C.sdpa_backward take them (keywords of
        one converter in bind_call.c: pa_attn_call); those at their C default
        are left out (each keyword costs the C parser a search)."""
        kw: dict[str, Any] = {"scale": self.scale}
        if self.causal:
            kw["causal"] = self.causal
        if self.dropout_p:
            kw["dropout_p"] = self.dropout_p
        if self.window != (-1, -1):
            kw["left"], kw["right"] = self.window
        if self.softcap:
            kw["softcap"] = self.softcap
        if self.slopes is not None:
            kw["slopes"] = self.slopes
        if self.sinks is not None:
            kw["sinks"] = self.sinks
        if self.cu_seqlens_q is not None:
            kw["cu_seqlens_q"], kw["cu_seqlens_k"] = self.cu_seqlens_q, self.cu_seqlens_k
        if self.block_mask is not None:
            kw["block_mask"] = self.block_mask
        if self.seq_align:
            kw["seq_align"] = True
        if self.cache_rows is not None:
            pad, idx = self.cache_rows
            if pad is not None:
                kw["cache_leftpad"] = pad
            if idx is not None:
                kw["cache_batch_idx"] = idx
        return kw


# attn_spec's further options (its ``opts`` mapping) and their defaults:
# scaled_dot_product_attention's keyword-only ones, plus kv_len and qoff
SPEC_OPTIONS = {"rng": None, "window": None, "alibi_slopes": None, "softcap": None, "sinks": None,
                "precision": None, "return_weights": False, "return_lse": False, "kv_len": None,
                "qoff": None, "align": None, "block_mask": None}


def _options(opts):
    """opts merged over SPEC_OPTIONS; a name that is not one is a TypeError."""
    if not opts:
        return SPEC_OPTIONS
    o = {**SPEC_OPTIONS, **opts}
    if len(o) != len(SPEC_OPTIONS):
        bad = sorted(set(opts) - set(SPEC_OPTIONS))
        raise TypeError(f"attn_spec() got an unexpected option {bad[0]!r}")
    return o


def attn_spec(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False, opts=None) -> AttnSpec:
    """Check an attention call's arguments (scaled_dot_product_attention's
    positional ones; ``opts``: a mapping of its further options by name --
    SPEC_OPTIONS' names: rng, window, alibi_slopes, softcap, sinks,
    precision, return_weights, return_lse, align, block_mask, plus kv_len:
    int64 filled keys that broadcast to the batch axes, and qoff; those not
    given take SPEC_OPTIONS' defaults) and normalise them into an AttnSpec.
    Raises what scaled_dot_product_attention documents, naming the
    argument."""
    o = _options(opts)
    window, alibi_slopes, sinks, kv_len, qoff = o["window"], o["alibi_slopes"], o["sinks"], o["kv_len"], o["qoff"]
    return_weights, block_mask = o["return_weights"], o["block_mask"]
    q = as_array(query, "query")
    k = as_array(key, "key")
    v = as_array(value, "value")
    for x, n in ((q, "query"), (k, "key"), (v, "value")):
        if x.ndim < 2:
            raise ValueError(f"{n} must have at least 2 dimensions (..., rows, features), got shape {x.shape}")
    dt = compute_dtype((q, "query"), (k, "key"), (v, "value"))
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"key has shape {k.shape} and query has shape {q.shape}: their last axes (E) must match")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"value has shape {v.shape} and key has shape {k.shape}: their axis -2 (S) must match")
    p = dropout_p_value(dropout_p)
    causal = causal_code(is_causal)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if qoff is not None:
        qoff = index_value(qoff, "qoff")
    elif align_code(o["align"], causal):
        qoff = S - L                 # align="bottom_right": row i at key position i + S - L
    left, right = window_value(window, S + L + abs(qoff or 0))
    cap = softcap_value(o["softcap"])
    sc = (1.0 / math.sqrt(E) if E > 0 else 1.0) if scale is None else real_scalar(scale, "scale")
    bf16 = precision_value(o["precision"], dt)
    if bf16 and return_weights:
        raise ValueError("return_weights is not available with precision='bf16'")
    narrow = tuple(x.dtype for x in (q, k, v) if is16(x.dtype))

    groups, hkv = 1, None
    if enable_gqa:
        for x, n in ((q, "query"), (k, "key"), (v, "value")):
            if x.ndim < 3:
                raise ValueError(f"enable_gqa needs {n} with a head axis (-3), got shape {x.shape}")
        hq, hkv = q.shape[-3], k.shape[-3]
        if v.shape[-3] != hkv:
            raise ValueError(f"value has shape {v.shape} and key has shape {k.shape}: their head axes (-3) must match")
        if hkv == 0 or hq % hkv:
            raise ValueError(
                f"enable_gqa needs the query heads ({hq}, query shape {q.shape}) to be a multiple "
                f"of the key/value heads ({hkv}, key shape {k.shape})"
            )
        groups = hq // hkv
    if groups > 1:
        head_batch = broadcast_shapes([(q.shape[:-3], "query"), (k.shape[:-3], "key"),
                                       (v.shape[:-3], "value")], "batch axes of query, key and value")
        full_batch = head_batch + (q.shape[-3],)
    else:
        hkv = None
        try:
            full_batch = broadcast_shapes([(q.shape[:-2], "query"), (k.shape[:-2], "key"),
                                           (v.shape[:-2], "value")], "batch axes of query, key and value")
        except ValueError as exc:
            hq = q.shape[-3] if q.ndim >= 3 else None
            hk = k.shape[-3] if k.ndim >= 3 else None
            if not enable_gqa and hq and hk and hq != hk and hq % hk == 0:
                raise ValueError(f"{exc}. The query has {hq} heads and key/value {hk}: for grouped-query "
                                 "attention (each key/value head shared by a group of query heads) "
                                 "pass enable_gqa=True") from None
            raise
    mask = None if attn_mask is None else prep_mask(attn_mask, full_batch + (L, S), dt)
    slopes = None if alibi_slopes is None else \
        per_head(alibi_slopes, "alibi_slopes", full_batch, "(Hq,) or (B, Hq)").reshape(-1)
    sk = None if sinks is None else per_head(sinks, "sinks", full_batch, "(Hq,)").reshape(-1)
    sk_shape = None if sinks is None else as_array(sinks, "sinks").shape
    if kv_len is not None:
        kv_len = np.ascontiguousarray(np.broadcast_to(kv_len, full_batch), dtype=np.int64)
    bm = None if block_mask is None else check_block_mask(block_mask, L, S, full_batch, kv_len)
    return AttnSpec(q, k, v, dt, narrow, L, S, E, Ev, full_batch, groups, hkv, mask, causal, sc,
                    (left, right), cap, slopes, sk, sk_shape, p, o["rng"], bf16, kv_len=kv_len, qoff=qoff,
                    return_weights=bool(return_weights), return_lse=bool(o["return_lse"]), block_mask=bm)
