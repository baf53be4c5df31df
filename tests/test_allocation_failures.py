"""Nothing written on any error (issue 28, "Reliability v3", item 2): every
check and allocation before any write -- each C allocation of a call made to
fail in turn (_C._alloc_hook), after which the arrays the call would write
are unchanged and no block is left allocated."""
import numpy as np
import pytest

import pyattn
from pyattn import _C

# the shared case builders of the entry points' limit tests (this file was split from them)
from test_entry_point_limits import BF16, CACHE_DTYPES, _kv_case, _snap  # noqa: E402,F401


# ---- item 2: every check and allocation before any write -------------------------

def _sweep(call, watched):
    """Make allocation 1, 2, ... of call() fail, one per run, until a run makes
    fewer allocations; after each failure the watched arrays are unchanged
    and no C block is left allocated."""
    live0 = _C._alloc_hook(0)[1]
    n = 0
    while True:
        n += 1
        before = _snap(*watched)
        _C._alloc_hook(n)
        try:
            call()
        except MemoryError:
            pending, live = _C._alloc_hook(0)
            assert pending == 0
            assert _snap(*watched) == before, f"written before allocation {n} failed"
            assert live == live0, "a block leaked"
            continue
        pending, live = _C._alloc_hook(0)
        assert pending > 0, f"allocation {n} failed but no MemoryError was raised"
        assert live == live0
        return n - 1


@pytest.mark.parametrize("cdt", CACHE_DTYPES, ids=str)
@pytest.mark.parametrize("S,T,bf16", [(16, 1, False), (16, 3, False), (4200, 1, False), (300, 130, True)])
def test_kvcache_allocation_failures_write_nothing(cdt, S, T, bf16):
    if bf16 and cdt == np.float64:
        pytest.skip("bf16 needs float32 compute")
    q, kc, vc, k, v = _kv_case(cdt, S=S, T=T, B=2, H=2)
    kw = dict(precision="bf16") if bf16 else {}
    out = np.zeros((2, 2, T, 3), np.float64 if cdt == np.float64 else np.float32)
    n = _sweep(lambda: pyattn.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=[1, S - T], out=out,
                                                     return_lse=True, **kw), (kc, vc, out))
    assert n >= 2
    cache = pyattn.KVCache(2, 2, S, 4, 3, dtype=cdt)
    cache.attend(q, k, v, **kw)
    assert _sweep(lambda: cache.attend(q, k, v, **kw), (cache.k, cache.v, cache.lengths)) >= 2


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_out_allocation_failures_write_nothing(dt):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 70, 8)).astype(dt) for _ in range(3))
    out = np.full((2, 3, 70, 8), 7, dt)
    assert _sweep(lambda: pyattn.scaled_dot_product_attention(q, k, v, out=out, return_lse=True), (out,)) >= 1
    a = rng.standard_normal((300, 300)).astype(dt)
    mo = np.full((300, 300), 7, dt)
    assert _sweep(lambda: pyattn.matmul(a, a, out=mo), (mo,)) >= 1
    so = np.full((300, 300), 7, dt)
    _sweep(lambda: pyattn.softmax(a, out=so, is_causal=True), (so,))
    if dt == np.float32:
        bo = np.full((2, 3, 70, 8), 7, dt)
        assert _sweep(lambda: pyattn.scaled_dot_product_attention(q, k, v, out=bo, precision="bf16"), (bo,)) >= 1


def test_allocation_failures_in_the_backward():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 20, 8)) for _ in range(3))
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    snap = _snap(q, k, v, o, lse)
    assert _sweep(lambda: pyattn.scaled_dot_product_attention_backward(o, q, k, v, o, lse, sinks=np.zeros(3)),
                  ()) >= 4
    assert _snap(q, k, v, o, lse) == snap


def test_alloc_hook_is_off_by_default():
    assert _C._alloc_hook(0)[0] == 0
    with pytest.raises(ValueError):
        _C._alloc_hook(-1)
