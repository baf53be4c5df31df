"""How decode reads a float cache (PYATTN_DECODE_READ, pyattn._C.set_decode_read:
in place behind the hardware's prefetchers, in place with non-temporal
software prefetches, or each key tile copied once) changes no result: every
decode shape and cache kind gives the same bits in every mode, on every
family and thread count; bad modes are clear errors; the environment
variable chooses the mode at import."""
import os
import subprocess
import sys

import numpy as np
import pytest

import pyattn
from pyattn import _C

pytestmark = [pytest.mark.frame]

MODES = ("hw", "t2", "nta", "gather")


@pytest.fixture
def restore_mode():
    old = _C.config()["decode_read"]
    yield
    _C.set_decode_read(old)


def _calls(rng):
    """(name, fn) decode calls over the cache kinds the rows path reads"""
    import ml_dtypes
    out = []
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        for (Hq, Hk, S, E) in ((4, 4, 700, 64), (8, 2, 1300, 128), (32, 1, 900, 64), (3, 3, 333, 40)):
            q = rng.standard_normal((2, Hq, 1, E)).astype(dt)
            k = rng.standard_normal((2, Hk, S, E)).astype(dt)
            v = rng.standard_normal((2, Hk, S, E)).astype(dt)
            lens = np.array([S, S // 2 + 3], np.int32)
            out.append((f"{np.dtype(dt).name} {Hq}/{Hk} S={S} E={E}",
                        lambda q=q, k=k, v=v, lens=lens: pyattn.attention_with_kvcache(q, k, v, cache_seqlens=lens)))
    # a strided cache (every other row of a larger one), a window, two query rows
    big = rng.standard_normal((1, 4, 2000, 64)).astype(np.float32)
    q = rng.standard_normal((1, 8, 2, 64)).astype(np.float32)
    out.append(("strided rows, window, L=2", lambda: pyattn.attention_with_kvcache(
        q, big[:, :, ::2], big[:, :, 1::2], cache_seqlens=1000, window=(300, 0))))
    # a paged cache, 16-row blocks in shuffled order
    nb, bs, Hk, E = 40, 16, 2, 64
    kp = rng.standard_normal((nb, bs, Hk, E)).astype(np.float32)
    vp = rng.standard_normal((nb, bs, Hk, E)).astype(np.float32)
    tab = rng.permutation(nb).astype(np.int32).reshape(2, 20)
    qp = rng.standard_normal((2, 1, 8, E)).astype(np.float32)
    import pyattn.flash
    out.append(("paged 16-row blocks", lambda: pyattn.flash.flash_attn_with_kvcache(
        qp, kp, vp, cache_seqlens=np.array([320, 77], np.int32), block_table=tab)))
    return out


def test_every_mode_same_bits(rng, restore_mode):
    calls = _calls(rng)
    first = {}
    for m in MODES:
        assert _C.set_decode_read(m) in MODES
        assert _C.config()["decode_read"] == m
        for name, f in calls:
            o = np.asarray(f(), dtype=np.float64)
            assert np.isfinite(o).all(), name
            if name in first:
                np.testing.assert_array_equal(o, first[name], err_msg=f"{name}: {m}")
            else:
                first[name] = o


def test_modes_every_family_and_thread_count(rng, restore_mode):
    q = rng.standard_normal((1, 8, 1, 128)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5000, 128)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5000, 128)).astype(np.float32)
    codes = {w: c for w, c, _ in _C.families()}
    isa = _C.config()["isa"]
    threads = pyattn.get_num_threads()
    base = None
    try:
        for w, c, built in _C.families():
            if not built or w == "generic" or _C.select_isa(c) != c:
                continue
            for m in MODES:
                _C.set_decode_read(m)
                for t in (1, 2, 3):
                    pyattn.set_num_threads(t)
                    o = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=5000)
                    if base is None:
                        base = o
                    np.testing.assert_array_equal(o, base, err_msg=f"{w} {m} threads={t}")
    finally:
        _C.select_isa(codes[isa])
        pyattn.set_num_threads(threads)
    if base is None:
        pytest.skip("no SIMD family on this CPU")


def test_bad_modes(restore_mode):
    before = _C.config()["decode_read"]
    with pytest.raises(ValueError, match="'hw', 't2', 'nta' or 'gather'"):
        _C.set_decode_read("fast")
    with pytest.raises(TypeError, match="mode must be a str"):
        _C.set_decode_read(1)
    assert _C.config()["decode_read"] == before


@pytest.mark.parametrize("mode", MODES)
def test_environment_chooses(mode):
    env = dict(os.environ, PYATTN_DECODE_READ=mode)
    code = "import pyattn; from pyattn import _C; print(_C.config()['decode_read']); pyattn.show_config()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == mode
    assert f"decode reads      : {mode} (" in out and "PYATTN_DECODE_READ" in out


def test_unknown_environment_word_keeps_the_default():
    env = {k: v for k, v in os.environ.items() if k != "PYATTN_DECODE_READ"}
    code = "from pyattn import _C; print(_C.config()['decode_read'])"
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
    assert default in MODES
    env["PYATTN_DECODE_READ"] = "warp"
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other == default
