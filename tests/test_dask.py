"""pyattn.dask (API.md "Beyond one machine"): against local pyattn, to the
tolerance of the merge's reassociation, on every chunking, on the synchronous
and threaded schedulers and on a dask.distributed LocalCluster of processes."""
import subprocess
import sys
import time

import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from conftest import TOL, check, mag_attention

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
import pyattn.dask as pdask  # noqa: E402

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]


def _parts(x, chunks):
    return da.from_array(x, chunks=chunks)


def _want(q, k, v, **kw):
    """local pyattn, and the error scale of the reference"""
    gqa = kw.get("enable_gqa", False)
    out = pyattn.scaled_dot_product_attention(q, k, v, **kw)
    w = R.scaled_dot_product_attention(q, k, v, return_weights=True,
                                       **{x: y for x, y in kw.items()})[1]
    kk, vv = k, v
    if gqa and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        kk, vv = np.repeat(k, g, -3), np.repeat(v, g, -3)
    return out, mag_attention(q, kk, vv, w, kw.get("scale") or 1 / np.sqrt(q.shape[-1]))


CHUNKINGS = [
    # (query chunks, key/value chunks): batch, heads, L / S; uneven; size 1
    ((1, 4, 33), (2, 4, 25)),
    ((2, 1, 100), (2, 4, 100)),
    ((1, 1, 50), (1, 2, 7)),
    ((2, 4, 100), (1, 1, 30)),
    ((2, 3, 17), (2, 4, 1)),
]
CASES = {
    "plain": {},
    "causal": dict(is_causal=True),
    "bottom_right": dict(is_causal="bottom_right"),
    "window": dict(is_causal=True, window=(20, 0)),
    "window_two_sided": dict(window=(9, 13)),
    "structured": dict(is_causal=True, window=(30, 0), alibi_slopes=np.linspace(0.1, 0.4, 4), softcap=4.0,
                       sinks=np.array([0.0, 1.0, -1.0, 2.0])),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_matches_local(rng, dtype, case, chunks):
    B, H, L, S, E = 2, 4, 100, 90, 16
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, 12)).astype(dtype)
    qc, kc = chunks
    kw = CASES[case]
    out = pdask.scaled_dot_product_attention(_parts(q, qc + (E,)), _parts(k, kc + (E,)), _parts(v, kc + (12,)),
                                             **kw)
    assert out.chunks[:3] == _parts(q, qc + (E,)).chunks[:3]
    got = out.compute(scheduler="sync")
    want, mag = _want(q, k, v, **kw)
    assert got.dtype == dtype
    nparts = len(_parts(k, kc + (E,)).chunks[2])
    check(got, want, mag * (1 + nparts))


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_chunks_of_one(rng, causal):
    q = rng.standard_normal((2, 3, 6, 8))
    k = rng.standard_normal((2, 3, 5, 8))
    out = pdask.scaled_dot_product_attention(_parts(q, (1, 1, 1, 8)), _parts(k, (1, 1, 1, 8)),
                                             _parts(k, (2, 3, 1, 8)), is_causal=causal, window=(3, None))
    want, mag = _want(q, k, k, is_causal=causal, window=(3, None))
    check(out.compute(scheduler="sync"), want, mag * 6)


@pytest.mark.parametrize("mask_kind", ["bool", "float", "bool_dask"])
def test_masks_chunked_with_the_scores(rng, mask_kind):
    q = rng.standard_normal((2, 3, 40, 8))
    k = rng.standard_normal((2, 3, 50, 8))
    if mask_kind == "float":
        m = rng.standard_normal((3, 40, 50))
    else:
        m = rng.random((40, 50)) > 0.4
    dm = da.from_array(m, chunks=(7, 11)) if mask_kind == "bool_dask" else m
    out = pdask.scaled_dot_product_attention(_parts(q, (1, 3, 13, 8)), _parts(k, (2, 3, 16, 8)),
                                             _parts(k, (2, 3, 16, 8)), dm, is_causal=True)
    want, mag = _want(q, k, k, attn_mask=m, is_causal=True)
    check(out.compute(scheduler="threads"), want, mag * 5)


@pytest.mark.parametrize("qheads", [(8,), (2, 2, 4), (3, 5)])
def test_gqa_reads_kv_heads(rng, qheads):
    q = rng.standard_normal((1, 8, 30, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 45, 16)).astype(np.float32)
    v = rng.standard_normal((1, 2, 45, 16)).astype(np.float32)
    out = pdask.scaled_dot_product_attention(da.from_array(q, chunks=((1,), qheads, (15, 15), (16,))),
                                             _parts(k, (1, 1, 20, 16)), _parts(v, (1, 2, 9, 16)),
                                             enable_gqa=True, is_causal="bottom_right")
    want, mag = _want(q, k, v, enable_gqa=True, is_causal="bottom_right")
    check(out.compute(scheduler="sync"), want, mag * 4)


def test_numpy_inputs_and_broadcast_batch(rng):
    q = rng.standard_normal((3, 2, 20, 8))
    k = rng.standard_normal((1, 2, 20, 8))
    out = pdask.scaled_dot_product_attention(q, k, k)
    assert isinstance(out, da.Array)
    want, mag = _want(q, k, k)
    check(out.compute(), want, mag * 2)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_causal_tasks_are_n_n_plus_1_over_2(rng, n):
    L = 12 * n
    x = _parts(rng.standard_normal((1, 1, L, 8)), (1, 1, 12, 8))
    y = pdask.scaled_dot_product_attention(x, x, x, is_causal=True)
    keys = [str(kk[0] if isinstance(kk, tuple) else kk) for kk in dict(y.__dask_graph__())]
    attn = [kk for kk in keys if kk.startswith("pyattn-attention")]
    assert len(attn) == n * (n + 1) // 2
    y2 = pdask.scaled_dot_product_attention(x, x, x)
    keys2 = [str(kk[0] if isinstance(kk, tuple) else kk) for kk in dict(y2.__dask_graph__())]
    assert len([kk for kk in keys2 if kk.startswith("pyattn-attention")]) == n * n


def test_window_skips_key_chunks(rng):
    x = _parts(rng.standard_normal((1, 1, 120, 8)), (1, 1, 20, 8))
    y = pdask.scaled_dot_product_attention(x, x, x, is_causal=True, window=(19, 0))
    keys = [str(kk[0] if isinstance(kk, tuple) else kk) for kk in dict(y.__dask_graph__())]
    # each query chunk of 20 rows sees its own chunk and the one before
    assert len([kk for kk in keys if kk.startswith("pyattn-attention")]) == 1 + 2 * 5


def test_rows_with_nothing_to_see(rng):
    q = rng.standard_normal((1, 40, 8))
    k = rng.standard_normal((1, 10, 8))
    out = pdask.scaled_dot_product_attention(_parts(q, (1, 10, 8)), _parts(k, (1, 5, 8)), _parts(k, (1, 5, 8)),
                                             is_causal="bottom_right").compute()
    want = pyattn.scaled_dot_product_attention(q, k, k, is_causal="bottom_right")
    assert np.all(out[:, :30] == 0)
    assert np.allclose(out, want, rtol=0, atol=1e-13)


def test_multi_head_attention(rng):
    x = rng.standard_normal((4, 30, 16)).astype(np.float32)
    w = rng.standard_normal((4, 16, 16)).astype(np.float32) / 4
    b = rng.standard_normal((4, 16)).astype(np.float32)
    out = pdask.multi_head_attention(_parts(x, (2, 10, 8)), x, x, 4, *w, *b, is_causal=True)
    want = pyattn.multi_head_attention(x, x, x, 4, *w, *b, is_causal=True)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert np.allclose(out.compute(scheduler="threads"), want, rtol=0, atol=64 * TOL[np.dtype(np.float32)])


def test_bad_input(rng):
    x = _parts(rng.standard_normal((2, 10, 8)), (1, 5, 8))
    with pytest.raises(ValueError, match="dropout"):
        pdask.scaled_dot_product_attention(x, x, x, dropout_p=0.1)
    with pytest.raises(ValueError, match="key has shape"):
        pdask.scaled_dot_product_attention(x, x[..., :4], x)
    with pytest.raises(ValueError, match="window"):
        pdask.scaled_dot_product_attention(x, x, x, window=(-1, 0))
    with pytest.raises(ValueError, match="attn_mask"):
        pdask.scaled_dot_product_attention(x, x, x, np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="set_task_threads"):
        pdask.set_task_threads(0)


def test_value_chunked_differently_is_rechunked(rng):
    q = rng.standard_normal((1, 30, 8))
    k = rng.standard_normal((1, 40, 8))
    out = pdask.scaled_dot_product_attention(_parts(q, (1, 30, 8)), _parts(k, (1, 10, 8)), _parts(k, (1, 7, 8)))
    want, mag = _want(q, k, k)
    check(out.compute(), want, mag * 5)


def test_import_pyattn_does_not_import_dask():
    code = "import sys, pyattn; assert 'dask' not in sys.modules, 'dask imported'; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_task_threads_rule(monkeypatch):
    assert pdask._task_threads(3) == 3
    cpus = pdask._cpus()
    assert pdask._task_threads(None) == cpus         # this (main) thread: the synchronous scheduler
    pdask.set_task_threads(2)
    try:
        assert pdask._TASK_THREADS == 2
    finally:
        pdask.set_task_threads(None)


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    cl = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40)
    client = distributed.Client(cl)
    yield cl, client
    client.close()
    cl.close()


def test_on_a_local_cluster_of_processes(rng, cluster):
    cl, client = cluster
    q = rng.standard_normal((4, 2, 64, 16)).astype(np.float32)
    k = rng.standard_normal((4, 2, 64, 16)).astype(np.float32)
    y = pdask.scaled_dot_product_attention(_parts(q, (1, 2, 32, 16)), _parts(k, (2, 2, 16, 16)),
                                           _parts(k, (2, 2, 16, 16)), is_causal=True, window=(40, 0))
    got = client.compute(y).result(timeout=120)
    want, mag = _want(q, k, k, is_causal=True, window=(40, 0))
    check(got, want, mag * 5)
    # a task's pyattn threads on a 1-thread worker whose nanny set OMP_NUM_THREADS=1: one
    share = client.submit(pdask._task_threads, None, pure=False).result(timeout=60)
    assert share == 1


def test_worker_killed_mid_computation(rng, cluster):
    """A worker process terminated while tasks run: dask reschedules its tasks on
    the surviving worker (allowed-failures), so the result is complete and right;
    if dask gave up instead, it must be an error, never a wrong result."""
    cl, client = cluster
    q = rng.standard_normal((16, 4, 256, 32)).astype(np.float32)
    y = pdask.scaled_dot_product_attention(_parts(q, (1, 4, 64, 32)), _parts(q, (1, 4, 64, 32)),
                                           _parts(q, (1, 4, 64, 32)), is_causal=True)
    fut = client.compute(y)
    time.sleep(0.3)
    victim = list(cl.workers.values())[0]
    victim.process.process.terminate()            # the worker process dies mid-computation
    try:
        got = fut.result(timeout=300)
    except Exception as exc:                      # noqa: BLE001 -- an error is acceptable, a wrong result is not
        print(f"dask reported the lost worker as an error: {type(exc).__name__}: {exc}")
        return
    want = pyattn.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert np.allclose(got, want, rtol=0, atol=1e-5)   # completed on the surviving worker


def _lse_mag(q, k, scale=None):
    """error scale of a row's log-sum-exp: its largest |score| (plus the log's 1)"""
    s = np.abs(np.matmul(q, np.swapaxes(k, -1, -2))) * (scale or 1 / np.sqrt(q.shape[-1]))
    return s.max(axis=-1) + 1


def test_positional_order_and_return_lse_are_the_local_functions(rng):
    # API.md: the same positional order as pyattn.scaled_dot_product_attention
    # (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa),
    # and return_lse; a PyTorch-style positional call runs on both
    q = rng.standard_normal((2, 4, 30, 8))
    k = rng.standard_normal((2, 2, 26, 8))
    args = (q, k, k, None, 0.0, "bottom_right", 0.3, True)
    want, mag = _want(q, k, k, is_causal="bottom_right", scale=0.3, enable_gqa=True)
    wo, wl = pyattn.scaled_dot_product_attention(*args, window=(5, 0), return_lse=True)
    out = pdask.scaled_dot_product_attention(_parts(q, (1, 2, 10, 8)), _parts(k, (2, 2, 7, 8)), k, *args[3:])
    check(out.compute(), want, mag * 4)
    # L > S bottom-right with a window: query chunks with no key to see (lse -inf, output 0)
    o, lse = pdask.scaled_dot_product_attention(_parts(q, (1, 2, 10, 8)), _parts(k, (2, 2, 7, 8)), k,
                                                *args[3:], window=(5, 0), return_lse=True)
    assert isinstance(lse, da.Array) and lse.shape == (2, 4, 30) and lse.chunks == o.chunks[:-1]
    assert np.isinf(wl).any() and np.array_equal(np.isinf(lse.compute()), np.isinf(wl))
    _, mag = _want(q, k, k, is_causal="bottom_right", scale=0.3, enable_gqa=True, window=(5, 0))
    check(o.compute(), wo, mag * 4)
    check(lse.compute(), wl, 4 * _lse_mag(q, np.repeat(k, 2, -3), 0.3))
    # the old order's habit (is_causal in 5th place) says what the order is
    with pytest.raises(TypeError, match=r"positional order is the local function's"):
        pdask.scaled_dot_product_attention(q, k, k, None, True)
    with pytest.raises(ValueError, match="dropout is not offered"):
        pdask.scaled_dot_product_attention(q, k, k, None, 0.1)
