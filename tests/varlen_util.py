"""What the packed-sequence (varlen) test files share: cu_seqlens from lengths,
random packed q/k/v, one sequence as a dense (H, L, E) view, and the check
that forward + backward give the same bits at 1, 2 and 3 threads."""
import numpy as np

import pyattn


def cu(lens, dtype=np.int64):
    """cu_seqlens (len(lens) + 1,): 0 and the running sums of lens"""
    return np.concatenate([[0], np.cumsum(lens)]).astype(dtype)


def packed(rng, dtype, lq, lk, hq, hkv, e, cu_dtype=np.int64):
    """q (sum(lq), hq, e), k and v (sum(lk), hkv, e) standard normal, cu_q, cu_k"""
    q = rng.standard_normal((sum(lq), hq, e)).astype(dtype)
    k = rng.standard_normal((sum(lk), hkv, e)).astype(dtype)
    v = rng.standard_normal((sum(lk), hkv, e)).astype(dtype)
    return q, k, v, cu(lq, cu_dtype), cu(lk, cu_dtype)


def seq(x, c, i):
    """sequence i of the packed x, as the dense call's (heads, rows, features) view"""
    return x[c[i]:c[i + 1]].transpose(1, 0, 2)


def assert_threads_bit_identical(q, k, v, cq, ck, go, **kw):
    """forward (out, lse) and backward (dq, dk, dv) at 1, 2 and 3 threads: the same bytes"""
    res = []
    n0 = pyattn.get_num_threads()
    try:
        for n in (1, 2, 3):
            pyattn.set_num_threads(n)
            o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cq, ck, return_lse=True, **kw)
            g = pyattn.scaled_dot_product_attention_varlen_backward(go, q, k, v, o, lse, cq, ck, **kw)
            res.append([o, lse, *g])
    finally:
        pyattn.set_num_threads(n0)
    for r in res[1:]:
        for a, b in zip(r, res[0]):
            assert a.tobytes() == b.tobytes()
