"""Plain-NumPy definitions of every pyattn op: the test oracle.

Each function says, in a few lines of NumPy, what the C kernel computes.
They compute in float64 (float32 results are rounded at the end), build the
full (L, S) score matrix and copy freely: they are meant to be read and
trusted, not to be fast.
"""
from __future__ import annotations

import math

import numpy as np

from ._checks import causal_code, compute_dtype

__all__ = ["matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
           "causal_mask", "dropout_keep", "linear"]


def _f64(x):
    return np.asarray(x).astype(np.float64)


def matmul(a, b):
    """np.matmul computed in float64, returned in pyattn's result dtype."""
    a, b = np.asarray(a), np.asarray(b)
    dt = compute_dtype((a, "a"), (b, "b"))
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


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 dropout_key=0, return_weights=False):
    """softmax(q k^T * scale + mask) [dropout] @ v, materialising the weights.

    Keys whose weight is exactly 0 (masked, dropped) contribute nothing to the
    output, so NaN in their value rows does not spread.
    """
    q, k, v = (np.asarray(t) for t in (query, key, value))
    dt = compute_dtype((q, "query"), (k, "key"), (v, "value"))
    q, k, v = _f64(q), _f64(k), _f64(v)
    E = q.shape[-1]
    scale = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else scale
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, g, axis=-3)
        v = np.repeat(v, g, axis=-3)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    s = _masked_scores(s, attn_mask, is_causal)
    w = _softmax_last(s)
    if dropout_p > 0:
        w = np.where(dropout_keep(dropout_key, w.shape, dropout_p), w / (1.0 - dropout_p), 0.0)
    vb = np.broadcast_to(v, w.shape[:-2] + v.shape[-2:])
    if np.isfinite(vb).all():
        out = np.matmul(w, vb)
    else:
        prod = w[..., :, :, None] * vb[..., None, :, :]
        out = np.where(w[..., :, :, None] != 0, prod, 0.0).sum(axis=-2)
    out = out.astype(dt)
    return (out, w.astype(dt)) if return_weights else out


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
