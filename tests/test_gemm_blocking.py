"""The GEMM frame's run-time choices (ops/matmul.c) never change a bit:
the cache blocking read from the OS (MC, NC), and a batch with a shared B
run as one product with batch x M rows (torch.nn.Linear's (B, T, d) @ w.T).
Each test compares against a layout or call that takes the other path."""
import numpy as np
import pytest

import pyattn
from pyattn import _C


@pytest.fixture
def threads():
    before = pyattn.get_num_threads()
    yield pyattn.set_num_threads
    pyattn.set_num_threads(before)


def test_blocking_is_reported_and_whole_panels():
    cfg = _C.config()
    for key in ("gemm_f32_blocking", "gemm_f64_blocking"):
        mr, nr, kc, mc, nc = cfg[key]
        assert kc == 256                                   # the contract: KC fixes the bits
        assert mc % mr == 0 and 4 * mr <= mc <= 480, cfg[key]
        assert nc % nr == 0 and 8 * nr <= nc <= 4096, cfg[key]
    note = cfg["gemm_blocking_from"]
    assert note.startswith("MC: ") and "; NC: " in note
    l2, l3 = cfg["l2_bytes"], cfg["l3_bytes"]
    if l2:
        assert f"L2 {l2 >> 10} KiB" in note
    if l3:
        assert f"L3 {l3 >> 10} KiB" in note


def _unfoldable(x, pad=1):
    """x's values in a layout whose batch items do not run on (one spare row
    between them): the frame multiplies it batch item by batch item"""
    big = np.zeros(x.shape[:-2] + (x.shape[-2] + pad, x.shape[-1]), x.dtype)
    big[..., :x.shape[-2], :] = x
    return big[..., :x.shape[-2], :]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("lead,T,D,N", [((4,), 37, 50, 70), ((2, 3), 13, 300, 33), ((3, 1, 2), 100, 17, 130)])
def test_shared_b_batch_gives_the_bits_of_each_item(threads, dt, lead, T, D, N):
    rng = np.random.default_rng(T + D)
    x = rng.standard_normal(lead + (T, D)).astype(dt)
    w = rng.standard_normal((N, D)).astype(dt)                 # torch.nn.Linear's layout
    bias = rng.standard_normal(N).astype(dt)
    wt = np.broadcast_to(w.T, lead + (D, N))
    xu = _unfoldable(x)
    assert not xu.flags.c_contiguous and np.array_equal(xu, x)
    want = None
    for t in (1, 2, 3, 7):
        threads(t)
        got = pyattn.matmul(x, wt)
        gotb = _C.matmul(x, wt, None, bias)
        if want is None:
            want = pyattn.matmul(xu, wt)                         # item by item
            wantb = _C.matmul(xu, wt, None, bias)
            for idx in np.ndindex(*lead):                         # each item alone
                assert np.array_equal(pyattn.matmul(x[idx], w.T), want[idx])
        assert np.array_equal(got, want) and np.array_equal(gotb, wantb)
    np.testing.assert_allclose(want, x.astype(np.float64) @ w.T.astype(np.float64),
                               rtol=1e-4 if dt == np.float32 else 1e-12, atol=1e-3 if dt == np.float32 else 1e-10)


def test_shared_b_batch_other_layouts(threads):
    # a shared B with the batch axis of A reversed, or C written into out= with
    # spare rows: neither runs on, both give the item-by-item bits
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 40, 24)).astype(np.float32)
    w = rng.standard_normal((24, 30)).astype(np.float32)
    want = np.stack([pyattn.matmul(x[i], w) for i in range(5)])
    for t in (1, 2):
        threads(t)
        assert np.array_equal(pyattn.matmul(x[::-1], w), want[::-1])
        out = _unfoldable(np.zeros((5, 40, 30), np.float32))
        pyattn.matmul(x, w, out=out)
        assert np.array_equal(out, want)
        out2 = np.zeros((5, 40, 30), np.float32)
        pyattn.matmul(x, w, out=out2)
        assert np.array_equal(out2, want)
        xs = rng.standard_normal((5, 24, 40)).astype(np.float32).swapaxes(1, 2)   # rows not contiguous
        assert np.array_equal(pyattn.matmul(xs, w), np.stack([pyattn.matmul(xs[i], w) for i in range(5)]))


def test_shared_b_batch_16bit_and_bf16(threads):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 33, 40)).astype(np.float32)
    w = rng.standard_normal((40, 50)).astype(np.float32)
    for xx in (x.astype(np.float16), x.astype(ml_dtypes.bfloat16)):
        want = np.stack([pyattn.matmul(xx[i], w) for i in range(3)])
        assert np.array_equal(pyattn.matmul(xx, w), want)
    want = np.stack([pyattn.matmul(x[i], w, precision="bf16") for i in range(3)])
    for t in (1, 2):
        threads(t)
        assert np.array_equal(pyattn.matmul(x, w, precision="bf16"), want)


@pytest.mark.parametrize("M", [2048, 1001, 133])
def test_row_blocks_dealt_evenly_keep_the_bits(threads, M):
    # the MC blocks get whole MR panels dealt out evenly (2048 rows: 171
    # panels of 12 in 18 blocks of 9 or 10): every thread count, each row
    # alone, and the shared-B path (one product, several threads) agree
    rng = np.random.default_rng(M)
    a = rng.standard_normal((M, 260)).astype(np.float32)
    b = rng.standard_normal((260, 40)).astype(np.float32)
    outs = []
    for t in (1, 2, 3, 4):
        threads(t)
        outs.append(pyattn.matmul(a, b))
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    for i in (0, 119, 120, 121, M // 2, M - 9, M - 1):
        assert np.array_equal(pyattn.matmul(a[i:i + 1], b)[0], outs[0][i])
