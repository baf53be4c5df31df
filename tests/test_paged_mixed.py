"""A mixed batch in ONE kernel call (issue #24, serving part 2): a paged
attention_with_kvcache with cu_seqlens_q runs as one task list over
(sequence, head, query block) -- csrc/ops/paged_packed.c -- bit for bit as
each sequence called alone, on every thread count, with nothing written
when the call fails."""
import numpy as np
import pytest

import pyattn
from pyattn import _C, _paged
from conftest import fail_allocations_in_turn

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]


def rand(rng, shape, dt=np.float32):
    return rng.standard_normal(shape).astype(dt)


def case(rng, Ts, n, H=2, Hq=8, E=16, Ev=16, bs=16, S=4608, dt=np.float32):
    """Pools with room for every sequence (blocks in random order), packed q and new rows."""
    B = len(Ts)
    width = S // bs
    N = B * width + 3
    cu = np.concatenate([[0], np.cumsum(Ts)]).astype(np.int64)
    kp, vp = rand(rng, (N, H, bs, E), dt), rand(rng, (N, H, bs, Ev), dt)
    tab = rng.permutation(N)[:B * width].reshape(B, width)
    tot = int(cu[-1])
    return kp, vp, tab, cu, rand(rng, (tot, Hq, E), dt), rand(rng, (tot, H, E), dt), rand(rng, (tot, H, Ev), dt)


def alone(q, kp, vp, kn, vn, n, tab, cu, b, **kw):
    """Sequence b called on its own (the dense call of its shape)."""
    s = slice(cu[b], cu[b + 1])
    t = (1, 0, 2)
    new = {} if kn is None else dict(key=kn[s].transpose(t)[None], value=vn[s].transpose(t)[None])
    return pyattn.attention_with_kvcache(q[s].transpose(t)[None], kp, vp, cache_seqlens=n[b:b + 1],
                                         block_table=tab[b:b + 1], return_lse=True, **new, **kw)


# decode steps over > 4096 rows (key chunks and their merge, the G query heads
# stacked as rows), a chunk of 8 (split, not stacked), prefill chunks, a
# sequence only read (0 tokens)
TS = [40, 1, 1, 0, 8, 1, 130]
NS = [4000, 4300, 20, 77, 4500, 4607, 3000]


@pytest.mark.parametrize("kw", [{}, dict(alibi_slopes=np.linspace(0.05, 0.4, 8), softcap=7.0),
                                dict(window=(600, 0))])
def test_mixed_one_call_equals_each_sequence_alone(rng, kw):
    n = np.array(NS)
    kp, vp, tab, cu, q, kn, vn = case(rng, TS, n)
    kp2, vp2 = kp.copy(), vp.copy()
    out, lse = pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab,
                                             cu_seqlens_q=cu, return_lse=True, **kw)
    for b in range(len(TS)):
        if TS[b] == 0:
            continue
        o, l = alone(q, kp2, vp2, kn, vn, n, tab, cu, b, **kw)
        s = slice(cu[b], cu[b + 1])
        np.testing.assert_array_equal(out[s], o[0].transpose(1, 0, 2))
        np.testing.assert_array_equal(lse[s], l[0].T)
    np.testing.assert_array_equal(kp, kp2)          # the alone calls wrote the same rows
    np.testing.assert_array_equal(vp, vp2)


@pytest.mark.parametrize("dt", [np.float64, np.float16])
def test_mixed_read_only_and_dtypes(rng, dt):
    """No new rows (the last T rows of each cache are the queries'), other dtypes, no GQA."""
    Ts, n = [5, 1, 1], np.array([4200, 4100, 9])
    kp, vp, tab, cu, q, _, _ = case(rng, Ts, n, H=4, Hq=4, dt=dt)
    out, lse = pyattn.attention_with_kvcache(q, kp, vp, cache_seqlens=n, block_table=tab, cu_seqlens_q=cu,
                                             return_lse=True, is_causal=True)
    for b in range(len(Ts)):
        o, l = alone(q, kp, vp, None, None, n, tab, cu, b, is_causal=True)
        s = slice(cu[b], cu[b + 1])
        np.testing.assert_array_equal(out[s], o[0].transpose(1, 0, 2))
        np.testing.assert_array_equal(lse[s], l[0].T)


def test_mixed_is_one_kernel_call(rng, monkeypatch):
    n = np.array(NS)
    kp, vp, tab, cu, q, kn, vn = case(rng, TS, n)
    calls = []
    real = _C.sdpa

    def spy(*a, **k):
        calls.append(k.get("cu_seqlens_q") is not None)
        return real(*a, **k)
    monkeypatch.setattr(_paged._C, "sdpa", spy)
    pyattn.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab, cu_seqlens_q=cu)
    assert calls == [True]


def test_mixed_threads_bit_identical(rng):
    n = np.array(NS)
    kp, vp, tab, cu, q, kn, vn = case(rng, TS, n)
    t0 = pyattn.get_num_threads()
    res = []
    try:
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            res.append(pyattn.attention_with_kvcache(q, kp.copy(), vp.copy(), kn, vn, cache_seqlens=n,
                                                     block_table=tab, cu_seqlens_q=cu, return_lse=True))
    finally:
        pyattn.set_num_threads(t0)
    for r in res[1:]:
        for a, b in zip(r, res[0]):
            np.testing.assert_array_equal(a, b)


def test_failed_mixed_call_writes_nothing(rng):
    """Every allocation of the one call failing in turn: MemoryError and the
    pools unchanged (the rows are written after the last allocation)."""
    n = np.array(NS)
    kp, vp, tab, cu, q, kn, vn = case(rng, TS, n)
    k0, v0 = kp.copy(), vp.copy()

    def unchanged():
        np.testing.assert_array_equal(kp, k0)
        np.testing.assert_array_equal(vp, v0)
    failed = fail_allocations_in_turn(lambda: pyattn.attention_with_kvcache(
        q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab, cu_seqlens_q=cu), unchanged)
    assert failed >= 3                              # tasks, partials, workspaces
    assert not np.array_equal(kp, k0)               # the call that succeeded wrote


def test_private_entry_checks_packed_paged():
    """_C.sdpa(paged=..., cu_seqlens_q=...) checks what the op relies on."""
    kp = np.zeros((4, 2, 16, 8), np.float32)
    q = np.zeros((2, 3, 8), np.float32)
    kv = np.broadcast_to(kp[0, :, :1], (2, 32, 8))
    cu = np.array([0, 1, 3])
    tab = np.array([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] is 9"):      # another head's kv_len
        _C.sdpa(q, kv, kv, None, None, 2, 1.0, kv_len=np.array([5, 5, 5, 20]), cu_seqlens_q=cu,
                paged=(kp, kp.copy(), np.array([[0, 1], [2, 9]])))
    with pytest.raises(ValueError, match="give kv_len"):
        _C.sdpa(q, kv, kv, None, None, 2, 1.0, cu_seqlens_q=cu, paged=(kp, kp.copy(), tab))
    with pytest.raises(ValueError, match="one row per sequence"):
        _C.sdpa(q, kv, kv, None, None, 2, 1.0, kv_len=np.array([5, 5]), cu_seqlens_q=np.array([0, 3]),
                paged=(kp, kp.copy(), tab))
    with pytest.raises(ValueError, match="differs from kv_len"):
        _C.sdpa(q, kv, kv, None, None, 2, 1.0, kv_len=np.array([5, 5, 5, 5]), cu_seqlens_q=cu,
                paged=(kp, kp.copy(), tab),
                append=(np.zeros((3, 2, 8), np.float32), np.zeros((3, 2, 8), np.float32), np.array([4, 4])))
    with pytest.raises(ValueError, match="row_div"):
        _C.sdpa(q, kv, kv, None, None, 2, 1.0, kv_len=np.array([5, 5, 5, 5]), cu_seqlens_q=cu, row_div=2,
                paged=(kp, kp.copy(), tab))
