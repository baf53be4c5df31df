"""The tiled forward's short last query block (a block of nq rows computes
round_up(nq, NR) score columns, P read up to round_up(nq, MR) with the
columns past the scores kept 0), the causal diagonal's -inf written along the
tile's rows, and the accumulator rescale kernel: every SIMD family this CPU
runs gives the same bits (their blocks differ: 96 rows on the 12-row
families, 48 on avx2), and the results follow the float64 reference."""
import numpy as np
import pytest

import pyattn
import pyattn._C as C
from pyattn import _reference as R

# CI (.ci/run): does not depend on the kernel family (or switches the families itself)
pytestmark = [pytest.mark.nofamily]

CODES = pyattn._ISA_CODES
MACHINE = C.config()["isa_machine"]
SIMD = [w for w in ("avx2", "avx512", "avx512emu", "neon")
        if w in CODES and C.select_isa(CODES[w]) == CODES[w]]
C.select_isa(pyattn._env_isa_code(warn=False))

# L = 512: blocks of 96 + a last one of 32 rows (12-row families; 36 rows of
# P for 32 of scores on avx2's 6 x 16); 100, 176, 272: other short ends; a
# window and a bottom-right causal shift move the diagonal off the grid
SHAPES = [(512, 512, 64, True), (512, 512, 64, False), (100, 130, 32, True),
          (176, 176, 128, False), (272, 300, 48, "bottom_right")]


@pytest.fixture
def restore():
    yield
    C.select_isa(pyattn._env_isa_code(warn=False))


def _case(L, S, E, dt, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, L, E)).astype(dt)
    k = rng.standard_normal((2, S, E)).astype(dt)
    v = rng.standard_normal((2, S, E + 5)).astype(dt)
    return q, k, v


@pytest.mark.skipif(len(SIMD) < 2, reason="fewer than two SIMD families run on this CPU")
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("L,S,E,causal", SHAPES)
def test_families_same_bits(restore, L, S, E, causal, dt):
    q, k, v = _case(L, S, E, dt, L + S + E)
    kw = dict(is_causal=causal)
    if causal is True and L == S == 512:
        kw["window"] = (100, 0)                      # the diagonal and a window's left edge
    outs = {}
    for w in SIMD:
        C.select_isa(CODES[w])
        outs[w] = pyattn.scaled_dot_product_attention(q, k, v, **kw)
    first = SIMD[0]
    for w in SIMD[1:]:
        assert np.array_equal(outs[w], outs[first]), (w, first, np.abs(outs[w] - outs[first]).max())
    ref = R.scaled_dot_product_attention(q.astype(np.float64), k.astype(np.float64),
                                         v.astype(np.float64), **kw)
    tol = 2e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(outs[first], ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("L", [512, 100])
def test_short_block_nan_and_inf_values(L):
    """A NaN / inf value row of weight 0 (past the causal limit) reaches no
    row, in the short last block too."""
    q, k, v = _case(L, L, 64, np.float32, 7)
    v[:, L - 1, :] = np.nan
    v[:, L - 2, :] = np.inf
    out = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert np.isfinite(out[:, : L - 2]).all()
    assert np.isnan(out[:, L - 1]).all()
