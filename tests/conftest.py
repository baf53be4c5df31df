"""Shared test helpers: the tolerance table, error scales, array layouts."""
import numpy as np
import pytest

# One table per dtype (the project's design notes: a tolerance is never widened
# to make a test pass, and scales with the values involved): a result may differ from the exact
# value by TOL[dtype] times the op's error scale (see the mag_* helpers), which
# grows with the magnitudes involved, never by a hand-picked absolute number.
TOL = {
    np.dtype(np.float32): 4 * float(np.finfo(np.float32).eps),
    np.dtype(np.float64): 4 * float(np.finfo(np.float64).eps),
}

DTYPES = [np.float32, np.float64]


def check(actual, expected, mag, inexact=1):
    """actual vs expected (from the float64 oracle, or another float library when
    inexact=2: then both sides carry their own rounding). NaN and inf must sit
    in the same places; finite values within inexact * TOL * mag."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    dt = actual.dtype
    na, ne = np.isnan(actual), np.isnan(expected)
    assert np.array_equal(na, ne), f"NaN positions differ: {np.argwhere(na != ne)[:5]}"
    ia, ie = np.isinf(actual), np.isinf(expected)
    assert np.array_equal(ia, ie) and np.array_equal(actual[ia], expected[ie].astype(dt)), "inf differ"
    fin = ~(na | ia)
    err = np.abs(actual[fin].astype(np.float64) - expected[fin].astype(np.float64))
    lim = inexact * TOL[dt] * np.broadcast_to(mag, actual.shape)[fin]
    bad = err > lim
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} values off; worst error {err.max():.3e} "
        f"(limit there {lim[np.argmax(err - lim)]:.3e})")


def mag_matmul(a, b):
    """Error scale of a dot product of length K: sqrt(K) * (|a| @ |b|)."""
    a64, b64 = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
    K = a64.shape[-1]
    return np.sqrt(K + 1.0) * np.matmul(a64, b64) + np.finfo(np.float64).tiny


def mag_softmax(s, w):
    """Error scale of softmax weights w of (scaled, masked) scores s: exp's
    relative error grows with |s - max|, the sum's with log(S)."""
    s = np.asarray(s, np.float64)
    w = np.asarray(w, np.float64)
    with np.errstate(invalid="ignore"):
        m = np.max(np.where(np.isfinite(s), s, -np.inf), axis=-1, keepdims=True)
        spread = np.where(np.isfinite(s), np.abs(s - m), 0.0)
    S = s.shape[-1]
    rowmax = np.max(spread, axis=-1, keepdims=True)
    rowmax = np.where(np.isfinite(rowmax), rowmax, 0.0)
    return (w + np.max(w, axis=-1, keepdims=True)) * (4.0 + rowmax + np.log1p(S)) + np.finfo(np.float64).tiny


def mag_attention(q, k, v, w, scale):
    """Error scale of attention outputs: the weights' errors (scores carry a
    dot product of length E, amplified by exp) times |v|, plus the P @ V sum."""
    q = np.abs(np.asarray(q, np.float64))
    k = np.abs(np.asarray(k, np.float64))
    v = np.abs(np.asarray(v, np.float64))
    w = np.asarray(w, np.float64)
    E, S = q.shape[-1], k.shape[-2]
    qk = np.matmul(q, np.swapaxes(k, -1, -2)) * abs(scale) * np.sqrt(E + 1.0)
    row = np.max(np.where(w != 0, qk, 0.0), axis=-1, keepdims=True)
    vmax = np.max(v, axis=(-2, -1), keepdims=True) if v.size else 0.0
    return (np.matmul(w, v) + vmax * np.max(w, axis=-1, keepdims=True)) * (
        4.0 + 2 * row + np.log1p(S)) * np.sqrt(S + 1.0) + np.finfo(np.float64).tiny


LAYOUTS = ["c", "transposed", "negative", "fortran", "strided"]


def make(rng, shape, dtype, layout="c"):
    """Random array of `shape` and dtype, laid out in memory as `layout`."""
    shape = tuple(shape)
    def draw(s):
        x = rng.standard_normal(s)
        return x.astype(dtype)
    if layout == "c" or len(shape) < 2:
        return draw(shape)
    if layout == "transposed":
        return np.swapaxes(draw(shape[:-2] + (shape[-1], shape[-2])), -1, -2)
    if layout == "negative":
        return draw(shape)[..., ::-1, ::-1]
    if layout == "fortran":
        return np.asfortranarray(draw(shape))
    if layout == "strided":
        big = draw(shape[:-2] + (2 * shape[-2], 3 * shape[-1]))
        return big[..., ::2, 1::3]
    raise ValueError(layout)


@pytest.fixture
def rng(request):
    # a fixed seed per test, so a failure reproduces
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def frozen(*arrays):
    """Copies to compare against after a call: inputs must never change."""
    return [np.array(a, copy=True) for a in arrays]


def unchanged(before, after):
    for b, a in zip(before, after):
        assert np.array_equal(b, np.asarray(a), equal_nan=True), "an input was modified"


def pytest_configure(config):
    # CI sets PYATTN_REQUIRE_TORCH=1 so the PyTorch comparisons cannot be
    # skipped silently there; elsewhere they skip when torch is absent, and under
    # the sanitizers (PYATTN_SANITIZED=1, below) torch is kept out on purpose.
    import os
    if os.environ.get("PYATTN_REQUIRE_TORCH") == "1" and os.environ.get("PYATTN_SANITIZED") != "1":
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise pytest.UsageError(f"PYATTN_REQUIRE_TORCH=1 but torch cannot be imported: {exc}")


def fail_allocations_in_turn(call, on_failure=lambda: None, limit=20):
    """call() with its i-th C allocation failing, i = 1, 2, ... (pyattn._C._alloc_hook),
    until a call succeeds: each failure must raise MemoryError, after which on_failure()
    runs its checks. Returns how many calls failed; fails the test if none succeeded."""
    from pyattn import _C
    for i in range(1, limit):
        _C._alloc_hook(i)
        try:
            call()
        except MemoryError:
            _C._alloc_hook(0)
            on_failure()
            continue
        finally:
            _C._alloc_hook(0)
        return i - 1
    pytest.fail("every allocation failed")


# ---- under the sanitizers: no PyTorch ----------------------------------------------------
# .ci/run's sanitizer steps set PYATTN_SANITIZED=1: PyTorch's own code aborts under the
# preloaded ASan runtime, so `import torch` fails there (its comparisons skip through
# importorskip, and pyattn's optional torch paths see no torch); they run in every other step.
if __import__("os").environ.get("PYATTN_SANITIZED") == "1":
    class _NoTorchUnderSanitizers:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError("torch is not imported under the sanitizers (PYATTN_SANITIZED=1)",
                                          name=name)
            return None

    __import__("sys").meta_path.insert(0, _NoTorchUnderSanitizers())


# ---- test selection for CI (.ci/run): markers and a generated subset -------------------
# Markers, set by a file's `pytestmark` (a new file carries none, and so runs
# everywhere by default):
#   nofamily  -- does not depend on the kernel family (install, notebooks, Hugging
#                Face, Dask, CI tools): run once, not in the per-family loop;
#   nosan     -- not under the sanitizers (PyTorch, subprocesses, compilers);
#   frame     -- a frame path or an entry-point grid (varlen, paged, block masks,
#                the v4 grids): whole on the CPU's own family, a subset elsewhere.
# tests/flash_attn/ (FlashAttention's own file, ported) is nofamily and nosan.
# `--subset N` keeps a deterministic 1/N of each test function's cases (by a
# hash of the case's id, at least one case per function; `--subset-only frame`
# thins only the frame tests): the other families, the sanitizer and the qemu
# steps run every test function, on fewer parameter combinations.

def pytest_addoption(parser):
    parser.addoption("--subset", type=int, default=1, metavar="N",
                     help="keep a deterministic 1/N of each test function's parametrized cases")
    parser.addoption("--subset-only", default=None, metavar="MARKER",
                     help="apply --subset only to the tests carrying this marker (e.g. frame)")


@pytest.hookimpl(tryfirst=True)             # before -m selects by the markers added here
def pytest_collection_modifyitems(config, items):
    import zlib
    for item in items:                      # FlashAttention's ported file (kept as upstream's)
        if item.nodeid.startswith("tests/flash_attn/") or "/flash_attn/" in item.nodeid:
            item.add_marker(pytest.mark.nofamily)
            item.add_marker(pytest.mark.nosan)
    n = config.getoption("--subset")
    if n <= 1:
        return
    only = config.getoption("--subset-only")
    groups = {}
    for item in items:
        if only and item.get_closest_marker(only) is None:
            continue                        # kept whole
        groups.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    keep = {id(i) for i in items if only and i.get_closest_marker(only) is None}
    for cases in groups.values():
        chosen = [c for c in cases if zlib.crc32(c.nodeid.encode()) % n == 0] or cases[:1]
        keep.update(id(c) for c in chosen)
    deselected = [i for i in items if id(i) not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [i for i in items if id(i) in keep]


def examples(n):
    """A hypothesis test's example count, scaled by PYATTN_EXAMPLES (a factor,
    default 1; the sanitizer steps of .ci/run run 0.25 of them: derandomized,
    so the first quarter of the same examples), never below 1."""
    import os
    return max(1, int(round(n * float(os.environ.get("PYATTN_EXAMPLES", "1")))))
