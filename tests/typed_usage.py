"""Typed use of pyattn's public API, checked with `mypy --strict` in CI
(.ci/run) against the stubs (pyattn/*.pyi): a user's annotated code must
type-check without casts. Also runs as a plain script."""
from typing import Any, Optional, Tuple

import numpy as np
from numpy.typing import NDArray

import pyattn
from pyattn.nn import CausalAttention, MultiHeadAttention, SelfAttention


def attend(q: NDArray[np.float32], k: NDArray[np.float32], v: NDArray[np.float32]) -> NDArray[np.floating]:
    return pyattn.scaled_dot_product_attention(q, k, v, is_causal="bottom_right", scale=0.125)


def attend_with_weights(x: NDArray[np.float64]) -> Tuple[NDArray[np.floating], NDArray[np.floating]]:
    out, w = pyattn.scaled_dot_product_attention(x, x, x, return_weights=True, rng=0, dropout_p=0.1)
    return out, w


def main() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 8, 16), dtype=np.float32)
    y = attend(q, q, q)
    o, w = attend_with_weights(rng.standard_normal((5, 3)))
    p = pyattn.softmax(q, dim=-1, is_causal=True)
    m = pyattn.matmul(q, np.swapaxes(q, -1, -2))
    pyattn.set_num_threads(pyattn.get_num_threads())
    mha = MultiHeadAttention(d_in=16, d_out=16, num_heads=4, context_length=8, rng=0).eval()
    z = mha(rng.standard_normal((2, 8, 16)).astype(np.float32))
    z2, zw = mha(np.zeros((8, 16), np.float32), return_weights=True)
    sa = SelfAttention(3, 2, rng=1)
    ca = CausalAttention(3, 2, context_length=6, dropout=0.0, rng=2)
    shapes = [a.shape for a in (y, o, w, p, m, z, z2, zw, sa(np.ones((6, 3))), ca(np.ones((6, 3))))]
    print(shapes)


if __name__ == "__main__":
    main()


def gradients() -> None:
    q = np.ones((2, 4, 8), np.float32)
    o, lse = pyattn.scaled_dot_product_attention(q, q, q, is_causal=True, return_lse=True)
    dq, dk, dv = pyattn.scaled_dot_product_attention_backward(np.ones_like(o), q, q, q, o, lse, is_causal=True)
    out, backward = pyattn.scaled_dot_product_attention_vjp(q, q, q)
    grads = backward(np.ones_like(out))
    gx = pyattn.softmax_backward(np.ones((3, 3)), pyattn.softmax(np.zeros((3, 3))))
    layer = MultiHeadAttention(8, 8, 2)
    y = layer(q)
    g: np.ndarray = layer.backward(np.ones_like(y))
    layer.zero_grad()
    for name, p in layer.parameters().items():
        p -= 0.1 * layer.grads[name]
    print(dq.shape, dk.shape, dv.shape, len(grads), gx.shape, g.shape)
    cu = np.array([0, 3, 8])
    x = np.ones((8, 2, 4), np.float32)
    vo, vl = pyattn.scaled_dot_product_attention_varlen(x, x, x, cu, cu, is_causal=True, return_lse=True)
    vg = pyattn.scaled_dot_product_attention_varlen_backward(np.ones_like(vo), x, x, x, vo, vl, cu, cu,
                                                            is_causal=True)
    vout, vback = pyattn.scaled_dot_product_attention_varlen_vjp(x, x, x, cu, cu)
    print(vg[0].shape, len(vback(np.ones_like(vout))))


def first_hour(flag: bool) -> None:
    """Issue 30's stub items: a plain bool as return_lse, KVCache.attend's
    and pyattn.dask's return types, precision as a Literal, from_torch."""
    q = np.ones((1, 2, 4, 8), np.float32)
    r = pyattn.scaled_dot_product_attention(q, q, q, return_lse=flag)     # a bool variable
    out = r[0] if isinstance(r, tuple) else r
    r2 = pyattn.attention_with_kvcache(q, q, q, cache_seqlens=4, return_lse=flag)
    cache = pyattn.KVCache(1, 2, 16, 8)
    a: NDArray[np.floating] = cache.attend(q, q, q, is_causal=True, precision="bf16")
    b, lse = cache.attend(q[:, :, :1], q[:, :, :1], q[:, :, :1], return_lse=True)
    c = cache.attend(q[:, :, :1], q[:, :, :1], q[:, :, :1], return_lse=flag)
    m = pyattn.matmul(q, np.swapaxes(q, -1, -2), precision="highest")
    mha = MultiHeadAttention(8, 8, 2, causal=False, batch_first=False)
    y = mha(np.ones((4, 1, 8), np.float32), attn_mask=np.ones((4, 4), bool))
    y2 = mha(np.ones((4, 1, 8), np.float32), return_weights=flag)
    print(out.shape, type(r2), a.shape, b.shape, lse.shape, type(c), m.shape, y.shape, type(y2))


def first_hour_dask() -> None:
    import dask.array as da
    import pyattn.dask
    x = da.ones((2, 4, 64, 16), chunks=(1, 4, 32, 16))
    o: da.Array = pyattn.dask.scaled_dot_product_attention(x, x, x, None, 0.0, True)
    o2, lse = pyattn.dask.scaled_dot_product_attention(x, x, x, is_causal=True, return_lse=True)
    h = da.ones((2, 8, 4), chunks=(1, 8, 4))
    z: da.Array = pyattn.dask.multi_head_attention(h, h, h, 2, np.eye(4), np.eye(4), np.eye(4))
    print(o.shape, o2.shape, lse.shape, z.shape)


def block_masks(x: NDArray[np.float32]) -> None:
    """pyattn.BlockMask and pyattn.masks (issue #26)."""
    m = pyattn.masks.and_masks(pyattn.masks.causal, pyattn.masks.document([0, 0, 1, 1]))
    bm: pyattn.BlockMask = pyattn.BlockMask.from_mask_mod(m, None, None, 4, 4)
    d: NDArray[np.bool_] = bm.to_dense()
    s: float = bm.sparsity()
    o = pyattn.scaled_dot_product_attention(x, x, x, block_mask=bm)
    print(d.shape, s, o.shape, bm.shape)


def rejected_by_the_stubs(x: NDArray[np.float32]) -> None:
    """What mypy must refuse (--strict warns about an unused ignore, so each
    line fails the check if the stubs stop rejecting it). Never called."""
    pyattn.matmul(x, x, precision="tf32")  # type: ignore[arg-type]
    pyattn.scaled_dot_product_attention(x, x, x, precision="fp8")  # type: ignore[call-overload]


def quantized_cache(x: NDArray[np.float32]) -> None:
    """int8 / int4 caches (issue #25): quantize, dequantize, KVCache's scales."""
    q, s = pyattn.quantize(x, "int4", group_size=16)
    y: NDArray[Any] = pyattn.dequantize(q, s, dtype="int4", group_size=16, out_dtype=np.float64)
    c = pyattn.KVCache(1, 2, 32, 16, dtype="int8", group_size=8)
    ks: Optional[NDArray[np.float32]] = c.k_scale
    o = pyattn.attention_with_kvcache(x, c.k, c.v, cache_seqlens=0, k_scale=c.k_scale, v_scale=c.v_scale)
    print(y.shape, ks, o.shape)
    pyattn.quantize(x, "int2")  # type: ignore[arg-type]


def planned_steps(x: NDArray[np.float32]) -> None:
    """A step planned once for every layer's PagedKVCache (issue #38)."""
    caches = [pyattn.PagedKVCache(8, 4, 2, 16) for _ in range(2)]
    seq = [c.add_sequence() for c in caches][0]
    plan = caches[0].plan([seq], new_tokens=1)
    table: NDArray[np.int64] = plan.block_table
    seqs: Tuple[int, ...] = plan.seqs
    for c in caches:
        c.attend(plan.seqs, x, x[:, :2], x[:, :2], plan=plan)
    layer = pyattn.nn.MultiHeadAttention(32, 32, 2).eval()
    layer(np.zeros((1, 1, 32), np.float32), cache=caches[0], plan=caches[0].plan([seq]))
    print(table.shape, seqs)
