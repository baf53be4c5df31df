"""Every kernel kind of every family this CPU can run, on its own, against
its portable twin (csrc/check/kernel_check.c): GEMM micro-kernels on every
edge tile, the bfloat16 GEMM, the tile steps, softmax rows, the decode
kernels, softcap, the accumulator rescale, widen on every 16-bit pattern,
the exp on special values and across its range, the vocabulary's rules.
Bit for bit where the contract fixes the bits (csrc/README.md); a failure
names the family, the kernel's symbol and the case.

The checks are not in the shipped pyattn._C: tests/kcheck.py builds them
as the test-only extension `_kcheck` (a few seconds, cached in
build/kcheck/), which runs _C's own family tables (through the private
capsule _C._families_capsule). The cases are generated from the registry:
one named case per (family, kernel kind), test_kernel_against_its_twin[
<family>-<kind>], the families from _C.families(), the kinds from the
harness's own list (a kernel kind registered without a check does not
compile); and the sweep must run every kernel the family's table holds
(config()["kernels"]).

Under PYATTN_ISA (CI runs the suite once per family) only that family is
checked; without it, every family the CPU can run."""
import os

import pytest

import kcheck
import pyattn
from pyattn import _C

KC, WHY = kcheck.load()                   # (None, why) only where no C compiler is available
FAMILIES = [word for word, _, _ in _C.families()]
BUILT = {word: built for word, _, built in _C.families()}
KINDS = list(KC.kinds()) if KC is not None else []
REQUESTED = os.environ.get("PYATTN_ISA", "").strip().lower()


def _run(family, kinds):
    kc = kcheck.module_or_skip()
    if REQUESTED in FAMILIES and family != REQUESTED:
        pytest.skip(f"PYATTN_ISA={REQUESTED}: this run checks that family")
    if not BUILT[family]:
        pytest.skip(f"this build has no {family} family (another architecture's)")
    ran, counts, failures, kernels = kc.kernel_check(pyattn._ISA_CODES[family], kinds)
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


def test_the_checks_are_built():
    """The checks exist (else every case below is missing: say why)."""
    if KC is None:
        pytest.skip(WHY)
    assert KINDS and len(set(KINDS)) == len(KINDS), KINDS
    assert KC.kernel_check(0, [])[1] == dict.fromkeys(KINDS, 0)    # kinds(): the harness's own list


def test_the_shipped_module_has_no_checks():
    """The harness is test-only: the shipped _C lends its tables through a
    private capsule and holds no check entry of its own."""
    assert not hasattr(_C, "_kernel_check") and not hasattr(_C, "_vexp")
    assert type(_C._families_capsule).__name__ == "PyCapsule"
    assert "pyattn._C._families_capsule" in repr(_C._families_capsule)


@pytest.mark.parametrize("family, kind", [pytest.param(f, k, id=f"{f}-{k}") for f in FAMILIES for k in KINDS])
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
    kc = kcheck.module_or_skip()
    with pytest.raises(ValueError, match="isa"):
        kc.kernel_check(99)
    with pytest.raises(ValueError, match="unknown kernel kind 'gemmm'"):
        kc.kernel_check(0, ["gemmm"])
    with pytest.raises(TypeError, match="kinds"):
        kc.kernel_check(0, 3)
    with pytest.raises(TypeError, match="kinds must hold str"):
        kc.kernel_check(0, [1])
