"""The backward's key-split (csrc/ops/attn_backward.c): a call with fewer
than 8 key/value heads splits each head's keys into chunks, each with its
own dQ partial, summed in a fixed order. The split follows from the shape
alone, so the result is bit-identical for every thread count; dK and dV
(and the sinks' gradient) keep the bits of the unsplit backward; every
gradient matches the float64 oracle."""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from conftest import check, fail_allocations_in_turn, frozen, unchanged
from test_backward import grad_mags

# (q heads, key/value heads, L, S, E, options): one key/value head (MQA,
# B = 1: the call that ran on one thread), two, key ranges that are not a
# multiple of the 60-key tile; 2 to 4 chunks (at least 8 tiles a chunk)
CASES = [
    (8, 1, 200, 1000, 32, {}),
    (8, 1, 200, 1000, 32, {"is_causal": True}),
    (4, 2, 300, 1219, 24, {"is_causal": "bottom_right"}),
    (2, 1, 150, 1900, 16, {"window": (300, 40), "softcap": 5.0}),
    (4, 1, 120, 1500, 16, {"dropout_p": 0.2, "rng": 3, "sinks": np.array([0.5, -1.0, 0.0, 2.0])}),
]


@pytest.fixture
def restore_threads():
    n = pyattn.get_num_threads()
    yield
    pyattn.set_num_threads(n)


def _inputs(H, Hkv, L, S, E, dtype, seed=0, B=1):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, Hkv, S, E)).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, E)).astype(dtype)
    go = rng.standard_normal((B, H, L, E)).astype(dtype)
    return q, k, v, go


def _bwd(q, k, v, go, kw):
    kw = dict(kw, enable_gqa=q.shape[1] != k.shape[1])
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    return pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw)


def _bits(xs):
    return [np.asarray(x).tobytes() for x in xs]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_split_bits_do_not_depend_on_threads(case, dtype, restore_threads):
    H, Hkv, L, S, E, kw = CASES[case]
    q, k, v, go = _inputs(H, Hkv, L, S, E, dtype, seed=case)
    before = frozen(q, k, v, go)
    pyattn.set_num_threads(1)
    want = _bits(_bwd(q, k, v, go, kw))
    for n in (2, 3, 4):
        pyattn.set_num_threads(n)
        assert _bits(_bwd(q, k, v, go, kw)) == want, n
    unchanged(before, (q, k, v, go))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_split_matches_the_reference(case, restore_threads):
    H, Hkv, L, S, E, kw = CASES[case]
    q, k, v, go = _inputs(H, Hkv, L, S, E, np.float32, seed=10 + case)
    pyattn.set_num_threads(2)
    got = _bwd(q, k, v, go, kw)
    rkw = dict(kw, enable_gqa=H != Hkv)
    if "rng" in rkw:
        from pyattn._checks import dropout_key
        rkw["dropout_key"] = dropout_key(rkw.pop("rng"))
    want = R.scaled_dot_product_attention_backward(go, q, k, v, **rkw)
    sc = 1 / np.sqrt(E)
    mkw = {n: kw[n] for n in ("is_causal", "window", "softcap", "sinks") if n in kw}
    mags = grad_mags(q, k, v, go, sc, kw.get("dropout_p", 0.0), enable_gqa=H != Hkv, **mkw)
    for g, w, m in zip(got[:3], want[:3], mags):
        check(g, w, m)


@pytest.mark.parametrize("nan", [False, True])
def test_split_keeps_dk_dv_bits_of_the_unsplit_call(nan, restore_threads):
    """The same head in a call with 8 key/value heads (no split): dK and dV
    bit for bit, dQ within rounding (its chunk partials are summed in
    another order). With a NaN key in a later chunk (bottom-right causal:
    the rows that see it turn NaN, the others stay finite) the same
    gradient elements are NaN."""
    H, Hkv, L, S, E = 4, 1, 130, 1000, 32
    q, k, v, go = _inputs(H, Hkv, L, S, E, np.float32, seed=7, B=8)
    kw = {"sinks": np.linspace(-1, 1, H)}
    if nan:
        k[:, :, 900, 5] = np.nan                 # in the second chunk: rows 30.. see key 900
        kw["is_causal"] = "bottom_right"
    pyattn.set_num_threads(2)
    full = _bwd(q, k, v, go, kw)                                      # 8 heads: not split
    one = _bwd(q[:1], k[:1], v[:1], go[:1], kw)                       # 1 head: split
    for name, a, b in zip(("dk", "dv"), one[1:3], full[1:3]):
        assert a.tobytes() == b[:1].tobytes(), name
    dq1, dq8 = one[0], full[0][:1]
    np.testing.assert_array_equal(np.isnan(dq1), np.isnan(dq8))
    assert np.isnan(dq1).any() == nan and not np.isnan(dq1[:, :, :30]).any()
    ok = ~np.isnan(dq8)
    np.testing.assert_allclose(dq1[ok], dq8[ok], rtol=1e-5, atol=1e-6)
    assert dq1[ok].tobytes() != dq8[ok].tobytes()    # the split did run (its own order of sums)


def test_split_memory_error(restore_threads):
    """Each allocation of a split call failing in turn: MemoryError, no crash,
    no input modified, then a clean call gives the usual bits."""
    q, k, v, go = _inputs(8, 1, 100, 1000, 16, np.float32)
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, enable_gqa=True)
    before = frozen(q, k, v, go, o, lse)
    pyattn.set_num_threads(2)
    want = _bits(pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, enable_gqa=True))
    failed = fail_allocations_in_turn(
        lambda: pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, enable_gqa=True), limit=12)
    assert failed >= 3        # the chunks' work array, the partials, the workspace
    unchanged(before, (q, k, v, go, o, lse))
    assert _bits(pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, enable_gqa=True)) == want


def test_split_in_several_passes(restore_threads):
    """A split call whose query heads take several passes (attn_backward.c:
    as many heads a pass as 8 MiB of packed query sides and dQ partials
    hold; here about 1.3 MB a head in float64 (2 chunks), so a pass of 6
    of the 8 heads, then one of 2): the same bits for any thread count, and
    the float64 oracle's gradients."""
    H, Hkv, L, S, E = 8, 1, 1000, 1024, 32
    q, k, v, go = _inputs(H, Hkv, L, S, E, np.float64, seed=21)
    kw = {"is_causal": "bottom_right"}
    pyattn.set_num_threads(1)
    got = _bwd(q, k, v, go, kw)
    pyattn.set_num_threads(2)
    assert _bits(_bwd(q, k, v, go, kw)) == _bits(got)
    want = R.scaled_dot_product_attention_backward(go, q, k, v, enable_gqa=True, **kw)
    mags = grad_mags(q, k, v, go, 1 / np.sqrt(E), 0.0, enable_gqa=True, **kw)
    for g, w, m in zip(got[:3], want[:3], mags):
        check(g, w, m)
