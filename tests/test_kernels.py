"""Every kernel kind of every family this CPU can run, on its own, against
its portable twin (pyattn._C._kernel_check, csrc/kernel_check.c): GEMM
micro-kernels on every edge tile, the bfloat16 GEMM, the tile steps, softmax
rows, the decode kernels, softcap, the accumulator rescale, widen on every
16-bit pattern, the exp on special values and across its range, the
vocabulary's rules. Bit for bit where the contract fixes the bits
(csrc/README.md); a failure names the family, the kernel's symbol and the
case.

The checks are listed by the registry (csrc/registry.h: a kernel kind
registered without a check does not compile), and the sweep must run every
kernel the family's table holds (config()["kernels"]).

Under PYATTN_ISA (CI runs this file once per family) only that family is
checked; without it, every family the CPU can run."""
import os

import pytest

import pyattn
from pyattn import _C

FAMILIES = list(pyattn._ISA_CODES)
KINDS = list(_C._kernel_check(0, [])[1])       # the kinds kernel_check.c registers
REQUESTED = os.environ.get("PYATTN_ISA", "").strip().lower()


def _run(family, kinds):
    if REQUESTED in FAMILIES and family != REQUESTED:
        pytest.skip(f"PYATTN_ISA={REQUESTED}: this run checks that family")
    ran, counts, failures, kernels = _C._kernel_check(pyattn._ISA_CODES[family], kinds)
    if ran != family:
        pytest.skip(f"this CPU cannot run the {family} family (it would run {ran})")
    return counts, failures, kernels


@pytest.fixture
def config_of():
    """The config() of a family, then back to what PYATTN_ISA asked for."""
    def get(family):
        _C.select_isa(pyattn._ISA_CODES[family])
        return _C.config()
    yield get
    _C.select_isa(pyattn._env_isa_code(warn=False))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_against_its_twin(family, kind):
    counts, failures, _ = _run(family, [kind])
    assert not failures, f"{family} {kind}: " + "\n".join(failures)
    # every kind checks something; only the generic family has no vector vocabulary
    assert counts[kind] > 0 or (counts[kind] == -1 and family == "generic" and kind == "vocab") \
        or (counts[kind] == -1 and family in ("generic", "neon") and kind == "bf16_pack_p"), counts
    assert all(n == 0 for k, n in counts.items() if k != kind), counts


@pytest.mark.parametrize("family", FAMILIES)
def test_the_sweep_runs_every_kernel_of_the_family(family, config_of):
    counts, failures, kernels = _run(family, None)
    assert not failures, "\n".join(failures)
    assert set(counts) == set(KINDS) and all(n != 0 for n in counts.values()), counts
    # every kernel of the family's table (one per kind and dtype) ran in some check
    assert sorted(kernels) == sorted(config_of(family)["kernels"])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="isa"):
        _C._kernel_check(99)
    with pytest.raises(ValueError, match="unknown kernel kind 'gemmm'"):
        _C._kernel_check(0, ["gemmm"])
    with pytest.raises(TypeError, match="kinds"):
        _C._kernel_check(0, 3)
    with pytest.raises(TypeError, match="kinds must hold str"):
        _C._kernel_check(0, [1])
