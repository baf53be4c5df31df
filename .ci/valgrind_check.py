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
print("valgrind workout done")
