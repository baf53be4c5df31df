"""Plain-NumPy definitions of every pyattn op: the test oracle.

Each function says, in a few lines of NumPy, what the C kernel computes.
They compute in float64 (float32 results are rounded at the end), build the
full (L, S) score matrix and copy freely: they are meant to be read and
trusted, not to be fast.
"""
from __future__ import annotations

import math

import numpy as np

from ._checks import FP8, causal_code, compute_dtype, fp8_dtype, fp8_of

__all__ = ["matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
           "causal_mask", "dropout_keep", "linear", "merge_attention", "attention_with_kvcache",
           "window_mask", "alibi_bias", "scaled_dot_product_attention_backward",
           "softmax_backward", "round_bf16", "paged_rows", "attention_with_kvcache_paged", "quantize",
           "dequantize", "unpack_int4"]


def _f64(x):
    return np.asarray(x).astype(np.float64)


def round_bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), as float64: the
    rounding of precision="bf16". NaN stays NaN, +-inf stay."""
    f = np.asarray(x, np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    r = np.where(np.isnan(f), (u >> 16 << 16) | 0x400000, r).astype(np.uint32)
    return r.view(np.float32).astype(np.float64)


def matmul(a, b, precision=None):
    """np.matmul computed in float64, returned in pyattn's result dtype;
    precision="bf16" rounds a and b to bfloat16 first."""
    a, b = np.asarray(a), np.asarray(b)
    dt = compute_dtype((a, "a"), (b, "b"))
    if precision == "bf16":
        return np.asarray(np.matmul(round_bf16(_f64(a)), round_bf16(_f64(b)))).astype(dt)
    return np.asarray(np.matmul(_f64(a), _f64(b))).astype(dt)


def causal_mask(L, S, is_causal=True):
    """Bool (L, S): True where query i may see key j.
    top-left: j <= i (torch.tril(ones(L, S))); bottom-right: j <= i + S - L."""
    code = causal_code(is_causal)
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    if code == 0:
        return np.ones((L, S), bool)
    return j <= i if code == 1 else j <= i + (S - L)


def _positions(L, S, is_causal, qoff=None):
    """d(i): query row i's position on the key axis (API.md)."""
    if qoff is None:
        qoff = S - L if causal_code(is_causal) == 2 else 0
    return np.arange(L)[:, None] + qoff


def window_mask(L, S, window, is_causal=False, qoff=None):
    """Bool (L, S): True where window=(left, right) lets query i see key j:
    d(i) - left <= j <= d(i) + right (None: unbounded on that side)."""
    d = _positions(L, S, is_causal, qoff)
    j = np.arange(S)[None, :]
    left, right = window
    ok = np.ones((L, S), bool)
    if left is not None:
        ok &= j >= d - left
    if right is not None:
        ok &= j <= d + right
    return ok


def alibi_bias(slopes, L, S, is_causal=False, qoff=None):
    """ALiBi: -slope * |d(i) - j|, shape slopes.shape + (L, S) (float64)."""
    d = _positions(L, S, is_causal, qoff)
    dist = np.abs(d - np.arange(S)[None, :]).astype(np.float64)
    return -_f64(slopes)[..., None, None] * dist


def _masked_scores(s, attn_mask, is_causal):
    """Scores with bool masks as -inf and float masks added."""
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        s = np.where(m, s, -np.inf) if m.dtype == bool else s + _f64(m)
    if causal_code(is_causal):
        s = np.where(causal_mask(s.shape[-2], s.shape[-1], is_causal), s, -np.inf)
    return s


def _softmax_last(s):
    """Stable softmax over the last axis; rows with no finite maximum of -inf
    (all masked) give 0; NaN anywhere in a row makes it NaN."""
    m = np.max(s, axis=-1, keepdims=True)
    dead = m == -np.inf
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.where(dead, 0.0, m))
    e = np.where(s == -np.inf, 0.0, e)
    tot = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = e / tot
    return np.where(dead & ~np.isnan(m), 0.0, w)


def softmax(x, axis=-1, attn_mask=None, is_causal=False, scale=None):
    """softmax(x * scale + mask) along axis (masks need axis=-1)."""
    x = np.asarray(x)
    dt = compute_dtype((x, "x"))
    s = np.moveaxis(_f64(x), axis, -1) * (1.0 if scale is None else scale)
    s = _masked_scores(s, attn_mask, is_causal)
    return np.moveaxis(_softmax_last(s), -1, axis).astype(dt)


def dropout_keep(key, shape, p):
    """Keep-mask of inverted dropout for a weight tensor of `shape` (..., L, S):
    element with flat C-order index c is dropped when u(key, c) < p, where u
    is the splitmix64 finaliser of key + (c + 1) * 0x9e3779b97f4a7c15 turned
    into a double in [0, 1). The C kernels use the same function."""
    c = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64).reshape(shape)
    z = np.uint64(key) + (c + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return u >= p


def block_mask_dense(block_mask, ndim):
    """A pyattn.BlockMask as its dense bool mask (B or 1, H or 1, L, S), its
    leading axes of extent 1 dropped down to ndim axes (to broadcast
    against scores of ndim axes)."""
    d = block_mask.to_dense()
    while d.ndim > ndim and d.shape[0] == 1:
        d = d[0]
    return d


def _scores(q, k, attn_mask, is_causal, scale, window, alibi_slopes, softcap, qoff, kv_len):
    """The scores of scaled_dot_product_attention, in API.md's order, -inf
    where inadmissible (float64; q, k already repeated for GQA); a block
    mask, the last rule, is _block_hidden's."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    L, S = s.shape[-2], s.shape[-1]
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if attn_mask is not None and np.asarray(attn_mask).dtype != bool:
        s = s + _f64(attn_mask)
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, L, S, is_causal, qoff)
    if attn_mask is not None and np.asarray(attn_mask).dtype == bool:
        s = np.where(attn_mask, s, -np.inf)
    if causal_code(is_causal):
        d = _positions(L, S, is_causal, qoff)
        s = np.where(np.arange(S)[None, :] <= d, s, -np.inf)
    if window is not None:
        s = np.where(window_mask(L, S, window, is_causal, qoff), s, -np.inf)
    if kv_len is not None:
        s = np.where(np.arange(S) < np.asarray(kv_len)[..., None, None], s, -np.inf)
    return s


def _block_hidden(s, block_mask):
    """Scores s (_scores) with -inf where block_mask, a dense bool mask
    (block_mask_dense) or None, hides a key."""
    return s if block_mask is None else np.where(block_mask, s, -np.inf)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 dropout_key=0, return_weights=False, window=None,
                                 alibi_slopes=None, softcap=None, sinks=None,
                                 return_lse=False, qoff=None, kv_len=None, precision=None,
                                 block_mask=None):
    """softmax(q k^T * scale + mask) [dropout] @ v, materialising the weights.

    block_mask: a pyattn.BlockMask (its dense mask, one more bool mask), or
    a dense bool mask already.

    The score of query i and key j, in API.md's order: s = scale q.k;
    softcap * tanh(s / softcap); + a float mask; - slope |d(i) - j| (ALiBi);
    -inf where a bool mask, the causal rule or the window exclude it; then a
    softmax whose denominator also holds exp(sink) when sinks are given.
    ``qoff`` (row i at position i + qoff) and ``kv_len`` (keys [0, kv_len)
    only) describe a KV cache. Keys whose weight is exactly 0 (masked,
    dropped) contribute nothing to the output, so NaN in their value rows
    does not spread. lse = log(sum of exp over admissible scores [+ exp(sink)]).

    precision="bf16": q, k, v are rounded to bfloat16 first; the weights are
    rounded as the tiled kernel rounds them: key j of tile t = j // 60 (the
    kernel's fixed grid) gets P_j = bf16(exp(s_j - M_t)), M_t the row max of
    the scores of tiles 0..t, and out = sum_j P_j exp(M_t - m) v_j / l with
    m the row max and l = sum_j exp(s_j - m) unrounded (+ the sink term).
    """
    q, k, v = (np.asarray(t) for t in (query, key, value))
    dt = compute_dtype((q, "query"), (k, "key"), (v, "value"))
    q, k, v = _f64(q), _f64(k), _f64(v)
    if precision == "bf16":
        q, k, v = round_bf16(q), round_bf16(k), round_bf16(v)
    E = q.shape[-1]
    scale = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else scale
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, g, axis=-3)
        v = np.repeat(v, g, axis=-3)
    if block_mask is not None and not isinstance(block_mask, np.ndarray):
        block_mask = block_mask_dense(block_mask, q.ndim)
    s = _block_hidden(_scores(q, k, attn_mask, is_causal, scale, window, alibi_slopes, softcap, qoff, kv_len),
                      block_mask)
    if sinks is None:
        w = _softmax_last(s)
        m = np.max(s, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            lse = np.where(m == -np.inf, -np.inf,
                           m + np.log(np.exp(s - np.where(m == -np.inf, 0, m)[..., None]).sum(-1)))
    else:
        sk = np.broadcast_to(_f64(sinks)[..., None], s.shape[:-1])[..., None]
        full = np.concatenate([s, np.broadcast_to(sk, s.shape[:-1] + (1,))], axis=-1)
        w = _softmax_last(full)[..., :-1]
        m = np.max(full, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            lse = np.where(m == -np.inf, -np.inf,
                           m + np.log(np.exp(full - np.where(m == -np.inf, 0, m)[..., None]).sum(-1)))
    if dropout_p > 0:
        w = np.where(dropout_keep(dropout_key, w.shape, dropout_p), w / (1.0 - dropout_p), 0.0)
    if precision == "bf16":
        w = _bf16_weights(s, w, sinks, dropout_p, dropout_key)
    vb = np.broadcast_to(v, w.shape[:-2] + v.shape[-2:])
    if np.isfinite(vb).all():
        out = np.matmul(w, vb)
    else:
        prod = w[..., :, :, None] * vb[..., None, :, :]
        out = np.where(w[..., :, :, None] != 0, prod, 0.0).sum(axis=-2)
    out = out.astype(dt)
    res = (out,) + ((w.astype(dt),) if return_weights else ()) + ((lse.astype(dt),) if return_lse else ())
    return res[0] if len(res) == 1 else res


def _sum_to(g, shape):
    """Sum a broadcast gradient back to an operand's shape."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _matmul0(a, b):
    """a @ b where a term with a == 0 adds nothing (not 0 * NaN = NaN): the
    backward's zero-weight rule. np.matmul where b is finite."""
    if np.isfinite(b).all():
        return np.matmul(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        prod = a[..., :, :, None] * b[..., None, :, :]
        return np.where(a[..., :, :, None] != 0, prod, 0.0).sum(axis=-2)


def scaled_dot_product_attention_backward(grad_out, query, key, value, attn_mask=None,
                                          dropout_p=0.0, is_causal=False, scale=None,
                                          enable_gqa=False, *, dropout_key=0, window=None,
                                          alibi_slopes=None, softcap=None, sinks=None, block_mask=None):
    """The vector-Jacobian product of scaled_dot_product_attention, from the
    definitions, on the full (L, S) matrices (float64):

    z = scale q k^T; c = softcap tanh(z / softcap) (or z); s = c + masks;
    P = softmax(s) (the sink in the denominator); W = P x keep / (1 - p);
    out = W v. With dO = grad_out: dW = dO v^T, dP = dW x keep / (1 - p),
    D = rowsum(dO o out), dS = P (dP - D) (0 where P = 0), dz = dS (1 -
    (c / softcap)^2), dq = scale dz k, dk = scale dz^T q, dv = W^T dO,
    dsink = -sum_i exp(sink - lse_i) D_i. A weight or dS of 0 (a key the row
    may not see: also in a NaN row) passes nothing back, not even 0 * NaN.
    Gradients are summed back to the
    shapes of query, key and value (broadcast axes; GQA groups). Returns
    (dq, dk, dv[, dsinks]) in the compute dtype."""
    q0, k0, v0 = (np.asarray(t) for t in (query, key, value))
    dt = compute_dtype((q0, "query"), (k0, "key"), (v0, "value"))
    q, k, v, go = _f64(q0), _f64(k0), _f64(v0), _f64(grad_out)
    E = q.shape[-1]
    scale = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else scale
    g = 1
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, g, axis=-3)
        v = np.repeat(v, g, axis=-3)
    if block_mask is not None and not isinstance(block_mask, np.ndarray):
        block_mask = block_mask_dense(block_mask, q.ndim)
    out, w, lse = scaled_dot_product_attention(
        q, k, v, attn_mask, dropout_p, is_causal, scale, dropout_key=dropout_key,
        return_weights=True, return_lse=True, window=window, alibi_slopes=alibi_slopes,
        softcap=softcap, sinks=sinks, block_mask=block_mask)
    P = scaled_dot_product_attention(
        q, k, v, attn_mask, 0.0, is_causal, scale, return_weights=True, window=window,
        alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, block_mask=block_mask)[1]
    # a key a row may not see has weight 0 there, even in a NaN row (whose
    # admissible weights are NaN), and a weight of 0 passes nothing back
    with np.errstate(invalid="ignore", over="ignore"):
        hidden = _block_hidden(_scores(q, k, attn_mask, is_causal, scale, window, alibi_slopes, softcap,
                                       None, None), block_mask) == -np.inf
    P = np.where(hidden, 0.0, P)
    w = np.where(hidden, 0.0, w)
    kv = np.broadcast_to(v, P.shape[:-2] + v.shape[-2:])
    kk = np.broadcast_to(k, P.shape[:-2] + k.shape[-2:])
    qq = np.broadcast_to(q, P.shape[:-2] + q.shape[-2:])
    gob = np.broadcast_to(go, out.shape)
    keep = 1.0
    if dropout_p > 0:
        keep = dropout_keep(dropout_key, P.shape, dropout_p) / (1.0 - dropout_p)
    with np.errstate(invalid="ignore"):
        dP = np.matmul(gob, np.swapaxes(kv, -1, -2))
        dP = np.where(keep != 0, dP * keep, 0.0) if dropout_p > 0 else dP   # dropped: 0
        D = (gob * out).sum(-1)
        dS = np.where(P == 0, 0.0, P * (dP - D[..., None]))
    if softcap is not None:
        z = np.matmul(qq, np.swapaxes(kk, -1, -2)) * scale
        with np.errstate(invalid="ignore"):
            dS = np.where(dS == 0, 0.0, dS * (1.0 - np.tanh(z / softcap) ** 2))
    dS = dS * scale
    dq = _matmul0(dS, kk)
    dk = _matmul0(np.swapaxes(dS, -1, -2), qq)
    dv = _matmul0(np.swapaxes(w, -1, -2), gob)
    if g > 1:
        dk = dk.reshape(dk.shape[:-3] + (-1, g) + dk.shape[-2:]).sum(-3)
        dv = dv.reshape(dv.shape[:-3] + (-1, g) + dv.shape[-2:]).sum(-3)
    res = (_sum_to(dq, q0.shape).astype(dt), _sum_to(dk, k0.shape).astype(dt),
           _sum_to(dv, v0.shape).astype(dt))
    if sinks is not None:
        sk = np.broadcast_to(_f64(sinks)[..., None], lse.shape)
        ds = -(np.exp(sk - lse) * D)
        ds = ds.sum(-1)
        res = res + (_sum_to(ds, np.shape(sinks)).astype(dt),)
    return res


def softmax_backward(grad_y, y, axis=-1, scale=None):
    """grad_x = scale * y * (grad_y - sum(grad_y * y, axis)), 0 where y = 0."""
    gy, yy = _f64(grad_y), _f64(y)
    dt = compute_dtype((np.asarray(y), "y"))
    sc = 1.0 if scale is None else scale
    with np.errstate(invalid="ignore"):
        d = (gy * yy).sum(axis=axis, keepdims=True)
        gx = np.where(yy == 0, 0.0, sc * yy * (gy - d))
    return gx.astype(dt)


def _bf16_weights(s, w, sinks, dropout_p, dropout_key, tile=60):
    """The weights precision="bf16" applies to value (see
    scaled_dot_product_attention): per 60-key tile, exp(s - running max)
    rounded to bfloat16, rescaled to the final max, over the unrounded sum."""
    S = s.shape[-1]
    nt = -(-S // tile)
    tmax = np.stack([np.max(s[..., t * tile:(t + 1) * tile], axis=-1) for t in range(nt)], axis=-1)
    run = np.maximum.accumulate(tmax, axis=-1)                       # M_t
    M = np.repeat(run, tile, axis=-1)[..., :S]
    m = run[..., -1:]
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(s == -np.inf, 0.0, np.exp(s - np.where(M == -np.inf, 0.0, M)))
        l = np.where(s == -np.inf, 0.0, np.exp(s - np.where(m == -np.inf, 0.0, m))).sum(-1, keepdims=True)
    if sinks is not None:
        sk = np.broadcast_to(_f64(sinks)[..., None], s.shape[:-1])[..., None]
        mm = np.maximum(m, sk)
        den = l * np.exp(m - np.where(mm == -np.inf, 0.0, mm)) + np.exp(sk - mm)
        fac = np.exp(m - mm) / den
    else:
        with np.errstate(divide="ignore"):
            fac = 1.0 / l
    if dropout_p > 0:                                                # dropped before rounding
        e = np.where(dropout_keep(dropout_key, e.shape, dropout_p), e, 0.0)
    P = round_bf16(e) / (1.0 - dropout_p)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        r = P * np.exp(M - np.where(m == -np.inf, 0.0, m)) * fac
    return np.where(P == 0, 0.0, r)


def merge_attention(outputs, lses):
    """Combine partial results over disjoint key sets:
    out = sum_p exp(lse_p - lse) out_p, lse = logaddexp over p; rows with
    every lse_p = -inf give 0 and -inf."""
    o = _f64(np.stack([np.asarray(x) for x in outputs]))
    ls = _f64(np.stack([np.asarray(x) for x in lses]))
    dt = compute_dtype((np.asarray(outputs[0]), "outputs"))
    lse = np.logaddexp.reduce(ls, axis=0)
    with np.errstate(invalid="ignore"):
        wt = np.where(ls == -np.inf, 0.0, np.exp(ls - np.where(lse == -np.inf, 0, lse)))
    prod = np.where(wt[..., None] != 0, wt[..., None] * o, 0.0)
    return prod.sum(axis=0).astype(dt), lse.astype(dt)


def attention_with_kvcache(query, k_cache, v_cache, key=None, value=None, *, cache_seqlens,
                           is_causal=True, scale=None, window=None, alibi_slopes=None,
                           softcap=None, sinks=None, return_lse=False, k_scale=None, v_scale=None,
                           block_mask=None):
    """Write key/value at rows [n_b, n_b + T) of copies of the caches, then
    attend over the filled rows; returns (out, k_cache', v_cache'[, lse]).
    int8 / int4 caches (with k_scale / v_scale): the new rows quantized into
    copies of the caches and scales (returned as (cache, scale) pairs), the
    attention over the dequantized caches. block_mask: over cache positions
    (rows n_b - T + t, keys the cache rows)."""
    q = np.asarray(query)
    kc, vc = np.array(k_cache), np.array(v_cache)
    B, Hq, T = q.shape[:3]
    n = np.broadcast_to(np.asarray(cache_seqlens, dtype=np.int64), (B,)).copy()
    quant = []
    for c, s in ((kc, k_scale), (vc, v_scale)):
        if s is None:
            quant.append(None)
            continue
        dt = fp8_of(c.dtype) or ("int8" if c.dtype == np.int8 else "int4")
        G = c.shape[-1] * (2 if dt == "int4" else 1) // np.shape(s)[-1]
        quant.append((dt, G, np.array(s, np.float32)))
    if key is not None:
        for b in range(B):
            for c, x, qt in ((kc, key, quant[0]), (vc, value, quant[1])):
                if qt is None:
                    c[b, :, n[b]:n[b] + T] = x[b]
                else:
                    c[b, :, n[b]:n[b] + T], qt[2][b, :, n[b]:n[b] + T] = quantize(x[b], qt[0], qt[1])
        n = n + T
    kd, vd = kc, vc
    if quant[0]:
        kd = dequantize(kc, quant[0][2], quant[0][0], quant[0][1])
    if quant[1]:
        vd = dequantize(vc, quant[1][2], quant[1][0], quant[1][1])
    outs, lses = [], []
    dense = None if block_mask is None else block_mask.to_dense()
    for b in range(B):
        bmb = None
        if dense is not None:
            bmb = dense[b if dense.shape[0] > 1 else 0][:, int(n[b]) - T:int(n[b]), :int(n[b])]
        r = scaled_dot_product_attention(
            q[b].astype(kd.dtype), kd[b, :, :n[b]], vd[b, :, :n[b]], None, 0.0,
            "bottom_right" if is_causal else False, scale, enable_gqa=True, window=window,
            alibi_slopes=None if alibi_slopes is None else np.broadcast_to(alibi_slopes, (B, Hq))[b],
            softcap=softcap, sinks=sinks, return_lse=True, qoff=int(n[b]) - T, block_mask=bmb)
        outs.append(r[0])
        lses.append(r[1])
    out, lse = np.stack(outs), np.stack(lses)
    if quant[0]:
        kc = (kc, quant[0][2])
    if quant[1]:
        vc = (vc, quant[1][2])
    return (out, kc, vc, lse) if return_lse else (out, kc, vc)


def paged_rows(pool, table_row, n):
    """Logical rows [0, n) of one sequence of a paged pool (num_blocks, H,
    block_size, D): row r is row r % block_size of block table_row[r //
    block_size] -> (H, n, D), a copy."""
    bs = pool.shape[2]
    r = np.arange(n)
    return pool[np.asarray(table_row)[r // bs], :, r % bs, :].transpose(1, 0, 2).copy()


def attention_with_kvcache_paged(query, k_pool, v_pool, key=None, value=None, *, cache_seqlens,
                                 block_table, cu_seqlens_q=None, tree_mask=None, is_causal=True,
                                 scale=None, window=None, alibi_slopes=None, softcap=None,
                                 sinks=None, return_lse=False):
    """attention_with_kvcache over paged pools, one sequence at a time: its
    new rows written into copies of the pools through the block table, its
    rows gathered in logical order (paged_rows), then the dense reference
    with the tree mask among the new tokens as an explicit bool mask (the
    cached rows before them visible). query (B, Hq, T, E), or packed
    (total_q, Hq, E) with cu_seqlens_q (out packed the same way). Returns
    (out, k_pool', v_pool'[, lse])."""
    q = np.asarray(query)
    kp, vp = np.array(k_pool), np.array(v_pool)
    table = np.asarray(block_table)
    B, bs = table.shape[0], kp.shape[2]
    packed = cu_seqlens_q is not None
    cu = np.asarray(cu_seqlens_q) if packed else np.arange(B + 1) * q.shape[2]
    n = np.broadcast_to(np.asarray(cache_seqlens, dtype=np.int64), (B,))
    outs, lses = [], []
    for b in range(B):
        T = int(cu[b + 1] - cu[b])
        qb = q[cu[b]:cu[b + 1]].transpose(1, 0, 2) if packed else q[b]
        m = int(n[b])
        if key is not None:
            kb = key[cu[b]:cu[b + 1]].transpose(1, 0, 2) if packed else key[b]
            vb = value[cu[b]:cu[b + 1]].transpose(1, 0, 2) if packed else value[b]
            for t in range(T):
                r = m + t
                kp[table[b, r // bs], :, r % bs] = kb[:, t]
                vp[table[b, r // bs], :, r % bs] = vb[:, t]
            m += T
        mask = None
        if tree_mask is not None:
            tm = np.asarray(tree_mask)[b if tree_mask.shape[0] > 1 else 0, :, :T, :T]
            mask = np.ones((tm.shape[0], T, m), bool)
            mask[:, :, m - T:] = tm
        r = scaled_dot_product_attention(
            qb.astype(kp.dtype), paged_rows(kp, table[b], m), paged_rows(vp, table[b], m), mask, 0.0,
            "bottom_right" if is_causal else False, scale, enable_gqa=True, window=window,
            alibi_slopes=None if alibi_slopes is None else np.broadcast_to(alibi_slopes, (B, q.shape[-3 if not packed else 1]))[b],
            softcap=softcap, sinks=sinks, return_lse=True, qoff=m - T)
        outs.append(r[0].transpose(1, 0, 2) if packed else r[0])
        lses.append(r[1].T if packed else r[1])
    out, lse = (np.concatenate(outs), np.concatenate(lses)) if packed else (np.stack(outs), np.stack(lses))
    return (out, kp, vp, lse) if return_lse else (out, kp, vp)


def linear(x, w, b=None):
    """x @ w.T + b with torch.nn.Linear's (d_out, d_in) layout, in float64."""
    y = np.matmul(_f64(x), _f64(w).T)
    return y if b is None else y + _f64(b)


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o=None,
                         b_q=None, b_k=None, b_v=None, b_o=None, *, attn_mask=None,
                         is_causal=False, dropout_p=0.0, scale=None, dropout_key=0,
                         return_weights=False):
    """Project, split heads from the last axis, attend, concatenate, project."""
    arrs = [np.asarray(a) for a in (query, key, value, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o)
            if a is not None]
    dt = compute_dtype(*[(a, "x") for a in arrs])
    H = num_heads
    q, k, v = linear(query, w_q, b_q), linear(key, w_k, b_k), linear(value, w_v, b_v)

    def heads(t):
        return t.reshape(t.shape[:-1] + (H, t.shape[-1] // H)).swapaxes(-2, -3)

    o, w = scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask, dropout_p,
                                        is_causal, scale, dropout_key=dropout_key,
                                        return_weights=True)
    o = o.swapaxes(-2, -3)
    o = o.reshape(o.shape[:-2] + (-1,))
    if w_o is not None:
        o = linear(o, w_o, b_o)
    o = o.astype(dt)
    return (o, w.astype(dt)) if return_weights else o


def scaled_dot_product_attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, *,
                                        is_causal=False, scale=None, enable_gqa=False, dropout_p=0.0,
                                        dropout_key=0, window=None, alibi_slopes=None, softcap=None,
                                        sinks=None, return_lse=False, precision=None, block_mask=None):
    """Packed sequences (total, H, E): a loop over the sequences of the dense
    reference, sequence i with its own rows and keys; its dropout mask is the
    dense call's for batch entry i (the counters of (i, head, row, key)
    in a batch of i + 1 entries of its shape), ALiBi slopes (Hq,) or (N, Hq);
    block_mask (a pyattn.BlockMask of B = N or None): sequence i's slab's
    top-left L_i x S_i as one more bool mask."""
    q, k, v = (np.asarray(t) for t in (query, key, value))
    cq, ck = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    dt = compute_dtype((q, "query"), (k, "key"), (v, "value"))
    n, H = len(cq) - 1, q.shape[1]
    slopes = None if alibi_slopes is None else np.broadcast_to(_f64(alibi_slopes), (n, H))
    out = np.zeros(q.shape[:2] + v.shape[2:], dt)
    lse = np.zeros(q.shape[:2], dt)
    dense = None if block_mask is None else block_mask.to_dense()
    for i in range(n):
        if cq[i + 1] == cq[i]:
            continue
        if ck[i + 1] == ck[i]:       # no keys: output 0, lse -inf (or the sink's logit)
            lse[cq[i]:cq[i + 1]] = -np.inf if sinks is None else _f64(sinks)
            continue
        qi = q[cq[i]:cq[i + 1]].transpose(1, 0, 2)
        ki, vi = (t[ck[i]:ck[i + 1]].transpose(1, 0, 2) for t in (k, v))
        if dropout_p > 0:
            qi = np.broadcast_to(qi, (i + 1,) + qi.shape)
        o, ls = scaled_dot_product_attention(
            qi, ki, vi, None, dropout_p, is_causal, scale, enable_gqa, dropout_key=dropout_key,
            window=window, alibi_slopes=None if slopes is None else slopes[i], softcap=softcap,
            sinks=sinks, return_lse=True, precision=precision,
            block_mask=None if dense is None else dense[i if len(dense) > 1 else 0, :, :qi.shape[-2], :ki.shape[-2]])
        if dropout_p > 0:
            o, ls = o[i], ls[i]
        out[cq[i]:cq[i + 1]] = o.transpose(1, 0, 2)
        lse[cq[i]:cq[i + 1]] = ls.T
    return (out, lse) if return_lse else out


def quantize(x, dtype="int8", group_size=32, axis=-1):
    """pyattn.quantize in float32 NumPy, bit for bit: per group, scale =
    max|x_g| / qmax (float32 division), q = clip(rint(x / scale)) (float32
    division, ties to even), 0 where scale == 0; int4 packed two per byte
    (even index in the low nibble). fp8 ("fp8_e4m3", "fp8_e5m2"): qmax
    448 / 57344, q = x / scale (float32) clipped to +-qmax and rounded by
    ml_dtypes' astype (to nearest even: the clip makes it saturate). No
    NaN/inf check (the op raises)."""
    qmax = np.float32({"int8": 127, "int4": 7, "fp8_e4m3": 448, "fp8_e5m2": 57344}[dtype])
    x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    E = x.shape[-1]
    g = x.reshape(*x.shape[:-1], E // group_size, group_size)
    scale = (np.max(np.abs(g), axis=-1) / qmax).astype(np.float32)
    if dtype in FP8:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = (g / scale[..., None]).astype(np.float32)
        q = np.where(scale[..., None] == 0, np.float32(0), np.clip(r, -qmax, qmax)).astype(fp8_dtype(dtype))
        return np.moveaxis(q.reshape(x.shape), -1, axis), np.moveaxis(scale, -1, axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.rint(g / scale[..., None])
    q = np.where(scale[..., None] == 0, 0, np.clip(r, -qmax, qmax)).astype(np.int8)
    q = q.reshape(x.shape)
    if dtype == "int4":
        u = q.view(np.uint8) & 0xF
        q = (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)
    return np.moveaxis(q, -1, axis), np.moveaxis(scale, -1, axis)


def unpack_int4(q, axis=-1):
    """int4 bytes (uint8, two per byte) -> int8 values, twice as many along axis."""
    q = np.moveaxis(np.asarray(q, np.uint8), axis, -1)
    lo = (q & 0xF).astype(np.int8)
    hi = (q >> 4).astype(np.int8)
    v = np.stack([lo, hi], axis=-1).reshape(*q.shape[:-1], 2 * q.shape[-1])
    v = np.where(v >= 8, v - 16, v).astype(np.int8)
    return np.moveaxis(v, -1, axis)


def dequantize(q, scale, dtype="int8", group_size=32, axis=-1):
    """pyattn.dequantize in float32 NumPy: float32(q) * scale, bit for bit."""
    v = unpack_int4(q, axis) if dtype == "int4" else np.asarray(q) if dtype in FP8 else np.asarray(q, np.int8)
    v = np.moveaxis(v, axis, -1).astype(np.float32)
    s = np.repeat(np.moveaxis(np.asarray(scale, np.float32), axis, -1), group_size, axis=-1)
    return np.moveaxis((v * s).astype(np.float32), -1, axis)
