"""The avx512 family's float32 GEMM micro-kernel shape per CPU class
(csrc/ukr_select.c, pyattn/_ukr.py): the decision on given probe figures (no
timing), PYATTN_UKR, show_config's line, and the same bits from every shape
kept -- each GEMM edge tile against its exact twin (the kernel checks'
test-only extension, tests/kcheck.py), matmul
and attention (forward and backward) against the 12x32 shape and the avx2
family, which the contract says give the same bits.

Under PYATTN_ISA (CI runs this file once per family) the shape checks run in
the avx512 run only (the other families have one shape)."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import kcheck
import pyattn
from pyattn import _C

REQUESTED = os.environ.get("PYATTN_ISA", "").strip().lower()
AVX512 = pyattn._ISA_CODES.get("avx512", -1)
SHAPES = list(_C._ukr_info()["shapes"])   # empty in a build without the x86 families (aarch64)


def _restore():
    _C._ukr_select(None)
    pyattn._ukr.apply_env()
    _C.select_isa(pyattn._env_isa_code(warn=False))


@pytest.fixture
def shape_of():
    """Run the avx512 family with a shape; back to the environment's choice after."""
    if REQUESTED and REQUESTED != "avx512":
        pytest.skip(f"PYATTN_ISA={REQUESTED}: the shapes are the avx512 family's")
    if _C.config()["isa_machine"] != "avx512":
        pytest.skip("this CPU cannot run the avx512 family")

    def use(shape):
        _C._ukr_select(shape)
        assert _C.select_isa(AVX512) == AVX512
        return _C.config()
    yield use
    _restore()


# ---- the decision, on injected figures ------------------------------------

@pytest.mark.parametrize("r512, r256, cls", [
    (272e9, 136e9, "full"),        # two full 512-bit ports (Zen 5, Intel server cores)
    (136e9, 136e9, "half"),        # one 512-bit FMA per cycle (Zen 4's halves, one port)
    (160e9, 136e9, "half"),
    (1.6, 1.0, "full"),            # the edges: from 1.6x, up to 1.3x
    (1.3, 1.0, "half"),
    (1.59, 1.0, "unknown"),
    (1.31, 1.0, "unknown"),
    (0.0, 136e9, "unknown"),       # a probe that did not run or failed
    (272e9, 0.0, "unknown"),
    (-1.0, 1.0, "unknown"),
    (math.nan, 1.0, "unknown"),
    (math.inf, 1.0, "unknown"),
    (1.0, math.inf, "unknown"),
])
def test_classification_of_probe_figures(r512, r256, cls):
    got = _C._ukr_classify(r512, r256)
    assert got[0] == cls
    assert got[1] in SHAPES if SHAPES else got[1] == ""     # no avx512 family: no shape
    assert _C._ukr_classify(r512, r256) == got          # deterministic


def test_every_class_runs_12x32():
    if not SHAPES:
        pytest.skip("this build has no avx512 family")
    # the choice, made explicit: one shape serves both classes (csrc/README.md)
    for fig in ((272e9, 136e9), (136e9, 136e9), (0.0, 0.0)):
        assert _C._ukr_classify(*fig)[1] == "12x32"


def test_info_says_what_runs_and_why():
    info = _C._ukr_info()
    assert set(info) == {"shape", "kernel", "mr", "nr", "forced", "probed", "rate512", "rate256",
                         "class", "shapes"}
    assert info["class"] in ("full", "half", "unknown")
    if SHAPES:
        assert info["shape"] in SHAPES
        assert f"{info['mr']}x{info['nr']}" == info["shape"]
    else:                                  # no avx512 family in this build: nothing to choose
        assert info["shape"] == "" and not info["forced"]
    if _C.config()["isa_machine"] == "avx512":
        assert info["probed"] and info["rate512"] > 0 and info["rate256"] > 0
        assert info["class"] == _C._ukr_classify(info["rate512"], info["rate256"])[0]
    else:
        assert not info["probed"] and info["class"] == "unknown"


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="shape must be a str or None"):
        _C._ukr_select(12)
    with pytest.raises(ValueError, match="shape must be one of"):
        _C._ukr_select("14x32")           # MR = 14 does not divide the key tile: not kept
    with pytest.raises(TypeError):
        _C._ukr_classify("a", 1.0)
    assert _C._ukr_info()["forced"] == ("PYATTN_UKR" in os.environ
                                        and os.environ["PYATTN_UKR"].strip().lower() not in ("", "auto"))


# ---- the same bits from every shape ---------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_passes_the_edge_tile_sweep(shape, shape_of):
    cfg = shape_of(shape)
    mr, nr = (int(x) for x in shape.split("x"))
    assert cfg["gemm_f32_blocking"][:2] == (mr, nr)
    ran, counts, failures, kernels = kcheck.module_or_skip().kernel_check(AVX512, ["gemm"])
    assert ran == "avx512" and counts["gemm"] > 0
    assert not failures, "\n".join(failures)
    assert cfg["gemm_f32"] in kernels


def _matmuls():
    rng = np.random.default_rng(7)
    out = []
    for M, K, N in ((1, 1, 1), (5, 3, 7), (13, 257, 49), (97, 300, 77), (300, 513, 130), (12, 256, 96)):
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        out.append(pyattn.matmul(a, b))
        out.append(pyattn.matmul(a, np.asfortranarray(b)))
    return out


def _attention():
    rng = np.random.default_rng(8)
    out = []
    for L, S, E, causal in ((7, 5, 3, False), (100, 130, 64, True), (250, 97, 40, False)):
        q = rng.standard_normal((2, 3, L, E), dtype=np.float32)
        k = rng.standard_normal((2, 3, S, E), dtype=np.float32)
        v = rng.standard_normal((2, 3, S, E), dtype=np.float32)
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
        do = rng.standard_normal(o.shape, dtype=np.float32)
        out += [o, lse]
        out.extend(pyattn.scaled_dot_product_attention_backward(do, q, k, v, o, lse, is_causal=causal))
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_gives_the_same_bits(shape, shape_of):
    shape_of("12x32")
    want_mm, want_at = _matmuls(), _attention()
    shape_of(shape)
    for got, want in zip(_matmuls() + _attention(), want_mm + want_at):
        assert got.tobytes() == want.tobytes()
    _C.select_isa(pyattn._ISA_CODES["avx2"])          # the contract: every SIMD family the same
    for got, want in zip(_matmuls(), want_mm):
        assert got.tobytes() == want.tobytes()


# ---- PYATTN_UKR and show_config --------------------------------------------

def _child(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("PYATTN_UKR", "PYATTN_ISA")}
    e.update(env)
    root = os.path.dirname(os.path.dirname(os.path.abspath(pyattn.__file__)))
    return subprocess.run([sys.executable, "-c", code], env=e, cwd=root, capture_output=True,
                          text=True, timeout=60)


def test_pyattn_ukr_forces_a_shape_and_warns_on_another_word():
    if _C.config()["isa_machine"] != "avx512":
        pytest.skip("this CPU cannot run the avx512 family")
    r = _child("import pyattn; from pyattn import _C; i = _C._ukr_info(); "
               "print(i['shape'], i['forced'], _C.config()['gemm_f32']); pyattn.show_config()",
               PYATTN_UKR="6x48")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first == "6x48 True pa_gemm_f32_avx512_6x48"
    assert "AVX-512 micro-kernel: 6x48 (pa_gemm_f32_avx512_6x48; FMA probe" in r.stdout
    assert "PYATTN_UKR)" in r.stdout
    r = _child("import pyattn; from pyattn import _C; print(_C._ukr_info()['forced'])",
               PYATTN_UKR="13x31")
    assert r.returncode == 0 and r.stdout.strip() == "False"
    assert "PYATTN_UKR='13x31' is not one of 'auto'" in r.stderr


def test_show_config_names_the_shape_and_the_probe(shape_of, capsys):
    shape_of(None)
    info = _C._ukr_info()
    pyattn.show_config()
    line = [s for s in capsys.readouterr().out.splitlines() if "AVX-512 micro-kernel" in s]
    assert len(line) == 1
    assert f": {info['shape']} ({info['kernel']}; FMA probe: 512-bit at " in line[0]
    ratio = info["rate512"] / info["rate256"]
    assert f"{ratio:.1f}x the 256-bit rate" in line[0]
    assert ("chosen because" in line[0]) != info["forced"]
    _C.select_isa(pyattn._ISA_CODES["avx2"])           # another family: no such line
    pyattn.show_config()
    assert "AVX-512 micro-kernel" not in capsys.readouterr().out
