"""The dense backward's gradients start unzeroed: the binding allocates dq,
dk, dv without zeroing them and the backward's tasks zero the rows each one
alone adds into (csrc/ops/attn_backward.c, bwd_zero_rows), on every thread.
A row left out would keep whatever the allocator handed back: here the heap
is first filled with NaN blocks of the gradients' sizes, so such a row shows
up as NaN or as bits that differ from a call on a clean heap. Gradients of
1 MiB or more take their memory from the blocks earlier gradients freed
(kept, not handed back to the OS: csrc/bind_views.c, pa_new_array_kept),
so the kept blocks are poisoned too: gradients filled with NaN, then freed."""
import numpy as np
import pytest

import pyattn

# (B, q heads, key/value heads, L, S, E, Ev, options): one task per head,
# grouped heads (dK, dV summed over the query heads of a key/value head),
# key rows that no query sees (causal with S > L, top-left), the key-split
# (one key/value head: chunks with dQ partials), a window, L or S = 0
CASES = [
    (2, 3, 3, 37, 45, 16, 8, {}),
    (1, 6, 2, 50, 70, 8, 8, {"is_causal": True}),
    (1, 2, 2, 20, 130, 8, 8, {"is_causal": True}),
    (1, 4, 1, 64, 1000, 8, 8, {"is_causal": "bottom_right"}),
    (1, 2, 1, 90, 1100, 8, 8, {"window": (200, 30)}),
    (1, 2, 2, 0, 40, 8, 8, {}),
    (1, 2, 2, 30, 0, 8, 8, {}),
]


def _poison(nbytes, n=6):
    """Blocks of NaN of each size, freed again: the next allocations of
    those sizes are likely to get their memory back."""
    blocks = [np.full(max(b // 4, 1), np.nan, np.float32) for b in nbytes for _ in range(n)]
    del blocks


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_gradients_start_from_zeros(case, dtype):
    B, H, Hkv, L, S, E, Ev, kw = CASES[case]
    rng = np.random.default_rng(case)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, Hkv, S, E)).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, Ev)).astype(dtype)
    go = rng.standard_normal((B, H, L, Ev)).astype(dtype)
    kw = dict(kw, enable_gqa=H != Hkv)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    want = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)
    assert all(np.isfinite(x).all() for x in want)
    if L == 0 or S == 0:
        assert all(not x.any() for x in want[1 if L == 0 else 0:3 if L == 0 else 1])
    for _ in range(3):
        _poison([x.nbytes for x in want])
        got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)
        for w, g in zip(want, got):
            assert w.tobytes() == g.tobytes()


def _handler_name(*a):
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import get_handler_name
    return get_handler_name(*a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_kept_gradient_memory_starts_from_zeros(dtype, causal):
    """Gradients of 1 MiB and more (kept memory): the blocks of earlier
    gradients, filled with NaN and freed, come back to the next call's
    gradients, which hold the bits of the first call all the same; the
    arrays are ordinary ones (own their data, writeable, resizable)."""
    rng = np.random.default_rng(7)
    shapes = [(1, 4, 1, 1024, 1024, 64, 64), (1, 2, 2, 1100, 900, 128, 96)]   # key-split; dense
    for B, H, Hkv, L, S, E, Ev in shapes:
        q = rng.standard_normal((B, H, L, E)).astype(dtype)
        k = rng.standard_normal((B, Hkv, S, E)).astype(dtype)
        v = rng.standard_normal((B, Hkv, S, Ev)).astype(dtype)
        go = rng.standard_normal((B, H, L, Ev)).astype(dtype)
        kw = dict(is_causal=causal, enable_gqa=H != Hkv)
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        want = [x.copy() for x in pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)]
        for _ in range(3):
            got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)
            for w, g in zip(want, got):
                assert g.flags.writeable and g.flags.c_contiguous
                assert w.tobytes() == g.tobytes()
                g[...] = np.nan                     # poison the block it gives back
            del got
        g = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)[0]
        while g.base is not None:                   # the array that owns the memory
            g = g.base
        assert g.flags.owndata
        assert _handler_name(g) == "pyattn_kept"   # and the default one stays NumPy's
        assert _handler_name() == _handler_name(q)
        n = g.size
        g.resize(2 * n, refcheck=False)             # the kept memory's realloc: contents kept
        assert g[:n].tobytes() == want[0].tobytes()
        g.resize(n // 3, refcheck=False)
        assert g.tobytes() == want[0].reshape(-1)[:n // 3].tobytes()
