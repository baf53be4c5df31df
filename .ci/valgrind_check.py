"""A short workout of every entry point, for valgrind memcheck (.ci/run)."""
import numpy as np

import pyattn
from pyattn.nn import MultiHeadAttention

rng = np.random.default_rng(0)
for dt in (np.float32, np.float64):
    q = rng.standard_normal((2, 4, 37, 24)).astype(dt)
    k = rng.standard_normal((2, 2, 70, 24)).astype(dt)
    v = rng.standard_normal((2, 2, 70, 20)).astype(dt)
    m = rng.random((37, 70)) > 0.3
    pyattn.scaled_dot_product_attention(q, k, v, m, 0.2, "bottom_right", enable_gqa=True, rng=0)
    pyattn.scaled_dot_product_attention(q[:, :2], k, v, return_weights=True, is_causal=True)
    pyattn.scaled_dot_product_attention(q[:, :2, :, :1], k[..., :1], v, np.where(m, 0.0, -np.inf))
    pyattn.softmax(q, attn_mask=q > 0, is_causal=True, scale=0.5)
    a = rng.standard_normal((70, 130)).astype(dt)
    pyattn.matmul(a, a.T[::-1])
    pyattn.matmul(a[0], a.T)
    layer = MultiHeadAttention(24, 24, 3, context_length=40, dropout=0.1, qkv_bias=True, rng=0)
    layer(q[0, 0]), layer.eval()(q[0])
    for bad in (lambda: pyattn.matmul(a, a), lambda: pyattn.scaled_dot_product_attention(q, k, v[..., :5, :]),
                lambda: pyattn.softmax(a, out=np.empty(3))):
        try:
            bad()
        except (ValueError, TypeError):
            pass
    # generation: structured masks, log-sum-exp and merge, KV caches, decode (split, GQA rows)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, window=(9, 2),
                                                 alibi_slopes=np.linspace(0.1, 0.4, 4), softcap=5.0,
                                                 sinks=np.zeros(4), return_lse=True)
    pyattn.merge_attention([o, o], [lse, lse])
    kc = np.zeros((2, 2, 5000, 24), dt)
    vc = np.zeros((2, 2, 5000, 20), dt)
    kc[:, :, :4990] = rng.standard_normal((2, 2, 4990, 24))
    pyattn.attention_with_kvcache(q[:, :, :1], kc, vc, k[:, :, :1], v[:, :, :1], cache_seqlens=[4990, 100],
                                  window=(3000, 0), return_lse=True)
    pyattn.attention_with_kvcache(q[:, :, :3], kc, vc, cache_seqlens=4000, sinks=np.ones(4))
    try:
        pyattn.attention_with_kvcache(q[:, :, :1], kc, vc, k[:, :, :1], v[:, :, :1], cache_seqlens=5000)
    except ValueError:
        pass
    cache = layer.eval().new_cache(4, 8, dtype=dt)
    layer(q[0, :, :3], cache=cache), layer(q[0, :, 3:4], cache=cache)
    # gradients: the fused backward (GQA, structured options, dropout), vjp, softmax, layers
    kw = dict(is_causal=True, enable_gqa=True, window=(9, 2), alibi_slopes=np.linspace(0.1, 0.4, 4),
              softcap=5.0, sinks=np.zeros(4))
    pyattn.scaled_dot_product_attention_backward(np.ones_like(o), q, k, v, o, lse, **kw)
    out, bwd = pyattn.scaled_dot_product_attention_vjp(q, q, q, dropout_p=0.2, rng=3, attn_mask=q[..., :1] > 0)
    bwd(out), bwd(out)
    pyattn.softmax_backward(q, pyattn.softmax(q), axis=1)
    if dt == np.float32:
        pyattn.matmul(q[0, 0], k[0, 0, :7].T, precision="bf16")
    y = layer.train()(q[0])
    layer.backward(y)
    try:
        layer.backward(y)
    except RuntimeError:
        pass
# 16-bit storage
for d16 in (np.float16,):
    q16 = rng.standard_normal((1, 4, 2, 40)).astype(d16)
    k16 = rng.standard_normal((1, 2, 4100, 40)).astype(d16)
    pyattn.scaled_dot_product_attention(q16, k16, k16, enable_gqa=True, is_causal="bottom_right")
    pyattn.scaled_dot_product_attention(q16[:, :, :1].astype(np.float32), k16, k16[..., ::2], enable_gqa=True)
    pyattn.matmul(q16[0, 0], k16[0, 0].T)
    c = pyattn.KVCache(1, 2, 64, 40, dtype=d16)
    c.attend(q16.astype(np.float32), q16[:, :2], q16[:, :2])
# wave 3: packed sequences, paged and quantized caches, block masks
qp = rng.standard_normal((37, 4, 16)).astype(np.float32)
kp = rng.standard_normal((41, 2, 16)).astype(np.float32)
cu_q, cu_k = np.array([0, 0, 17, 37]), np.array([0, 5, 5, 41])
o, lse = pyattn.scaled_dot_product_attention_varlen(qp, kp, kp, cu_q, cu_k, is_causal="bottom_right",
                                                    enable_gqa=True, return_lse=True)
pyattn.scaled_dot_product_attention_varlen_backward(np.ones_like(o), qp, kp, kp, o, lse, cu_q, cu_k,
                                                    is_causal="bottom_right", enable_gqa=True)
pool = pyattn.PagedKVCache(16, 4, 2, 16)
s0 = pool.add_sequence()
pool.attend([s0], qp[None, :5].transpose(0, 2, 1, 3), kp[None, :5].transpose(0, 2, 1, 3),
            kp[None, :5].transpose(0, 2, 1, 3))
s1 = pool.fork(s0)
pool.attend([s0, s1], qp[:2, :, None], kp[:2, :, None], kp[:2, :, None])
for qd in ("int8", "int4"):
    c = pyattn.KVCache(1, 2, 64, 16, dtype=qd, group_size=8)
    c.attend(qp[None, :3].transpose(0, 2, 1, 3), kp[None, :3].transpose(0, 2, 1, 3),
             kp[None, :3].transpose(0, 2, 1, 3))
    pyattn.dequantize(*pyattn.quantize(kp, qd, group_size=8), dtype=qd, group_size=8)
bm = pyattn.BlockMask.from_mask_mod(pyattn.masks.and_masks(pyattn.masks.causal, pyattn.masks.sliding_window(50)),
                                    None, None, 300, 300)
x = rng.standard_normal((1, 2, 300, 16)).astype(np.float32)
o, lse = pyattn.scaled_dot_product_attention(x, x, x, block_mask=bm, return_lse=True)
pyattn.scaled_dot_product_attention_backward(np.ones_like(o), x, x, x, o, lse, block_mask=bm)
print("valgrind workout done")
