"""Reference counts and resident memory stay flat over many calls, on the
success paths and the error paths."""
import gc
import sys

import numpy as np
import pytest

import pyattn
from pyattn import _C


def _rss_kb():
    try:
        with open("/proc/self/statm") as f:
            import os
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError):
        pytest.skip("no /proc/self/statm on this platform: RSS cannot be read")


def _calls():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 9, 8))
    k = rng.standard_normal((2, 3, 11, 8))
    v = rng.standard_normal((2, 3, 11, 5)).astype(np.float32)
    m = rng.random((9, 11)) > 0.3
    a = rng.standard_normal((7, 6))
    out = np.empty((2, 3, 9, 5))
    kc = np.zeros((2, 3, 10, 8))
    kn = rng.standard_normal((2, 3, 9, 8))[:, :, :2]
    q16 = q.astype(np.float16)
    ok = [
        (lambda: pyattn.scaled_dot_product_attention(q, k, v, m, 0.1, True, rng=1, return_weights=True), (q, k, v, m)),
        (lambda: pyattn.scaled_dot_product_attention(q, k, v, out=out), (q, k, v, out)),
        (lambda: pyattn.softmax(a, attn_mask=a > 0, is_causal=True), (a,)),
        (lambda: pyattn.matmul(a, a.T), (a,)),
        (lambda: _C.sdpa(q, k, v.astype(np.float64)), (q, k)),
        (lambda: pyattn.scaled_dot_product_attention(q, k, v, window=(2, 1), alibi_slopes=np.ones(3),
                                                     softcap=2.0, sinks=np.zeros(3), return_lse=True), (q, k, v)),
        (lambda: pyattn.merge_attention([out, out], np.zeros((2, 2, 3, 9))), (out,)),
        (lambda: pyattn.attention_with_kvcache(q, kc, kc, kn, kn, cache_seqlens=[3, 4]), (q, kc, kn)),
        (lambda: pyattn.scaled_dot_product_attention(q16, q16, q16), (q16,)),
        (lambda: pyattn.matmul(q16, q16.swapaxes(-1, -2)), (q16,)),
    ]
    bad = [
        (lambda: pyattn.scaled_dot_product_attention(q, k, v[..., :3, :]), (q, k, v)),
        (lambda: pyattn.scaled_dot_product_attention(q, k, v, dropout_p=2.0), (q, k, v)),
        (lambda: pyattn.softmax(a, out=np.empty((2, 2))), (a,)),
        (lambda: pyattn.matmul(a, a), (a,)),
        (lambda: _C.matmul(a, a), (a,)),
        (lambda: _C.sdpa(q, k, np.ones((2, 3, 4, 5))), (q, k)),
        (lambda: _C.softmax(a, None, np.ones((3, 3), bool)), (a,)),
        (lambda: pyattn.attention_with_kvcache(q, kc, kc, kn, kn, cache_seqlens=[8, 9]), (q, kc, kn)),
        (lambda: pyattn.scaled_dot_product_attention(q, k, v, sinks=np.ones(4)), (q, k, v)),
        (lambda: pyattn.merge_attention(np.zeros((2, 3, 4)), np.zeros(5)), ()),
        (lambda: _C.sdpa(q, k, v, kv_len=np.zeros(6, np.int64) + 99), (q, k, v)),
        (lambda: _C.sdpa(q, k, v, slopes=np.zeros(5)), (q, k, v)),
    ]
    return ok, bad


def test_refcounts_flat():
    ok, bad = _calls()
    for fn, args in ok + bad:
        for _ in range(10):                       # warm caches
            try:
                fn()
            except (ValueError, TypeError):
                pass
        gc.collect()
        before = [sys.getrefcount(x) for x in args]
        for _ in range(1000):
            try:
                fn()
            except (ValueError, TypeError):
                pass
        gc.collect()
        after = [sys.getrefcount(x) for x in args]
        assert before == after, (fn, before, after)


def test_rss_flat_over_10000_calls():
    import os
    if "ASAN_OPTIONS" in os.environ:
        pytest.skip("under AddressSanitizer freed memory sits in its quarantine, so RSS grows by design; "
                    "the normal run measures RSS")
    ok, bad = _calls()
    calls = [fn for fn, _ in ok + bad]

    def burst(n):
        for i in range(n):
            try:
                calls[i % len(calls)]()
            except (ValueError, TypeError):
                pass

    burst(2000)                                    # reach the steady state
    gc.collect()
    r0 = _rss_kb()
    burst(10000)
    gc.collect()
    grown = _rss_kb() - r0
    # a leak of even 100 bytes per call would show as ~1000 kB here
    assert grown < 512, f"resident memory grew by {grown} kB over 10,000 calls"
