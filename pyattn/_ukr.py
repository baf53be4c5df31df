"""The avx512 family's float32 GEMM micro-kernel shape (private): PYATTN_UKR and
show_config's line. The C side (csrc/ukr_select.c) probes the 512-bit against
the 256-bit FMA rate once at import, classifies the CPU's AVX-512 FMA hardware
and picks a shape for the class; every shape gives the same bits.
"""
import os
import warnings
from typing import Any, Dict, Optional

from . import _C

# what each class is, in words, and why its shape was chosen (csrc/README.md,
# "The AVX-512 micro-kernel", has the measurements)
_CLASS_WORDS = {
    "full": "two full 512-bit FMA ports",
    "half": "one 512-bit FMA per cycle (two 256-bit halves, or one port)",
    "unknown": "neither 2x nor 1x: a noisy probe or an unknown design",
}
_WHY = {
    "full": "on two full ports (measured on a Zen 5) every shape tried runs at 96-102 % of the peak "
            "alone, 12x32 was the fastest in matmul (6x48 level, 14x32 and 8x48 slower) and 6x48 "
            "much slower in attention",
    "half": "with one 512-bit FMA per cycle the FMA port is the limit (12x32: 24 FMAs per k step in "
            "24 cycles against 14 loads); 12x32 is the shape the family was tuned with on a Zen 4",
    "unknown": "the shape of both known classes",
}


def apply_env() -> None:
    """Force the shape PYATTN_UKR names (one of ``_C._ukr_info()['shapes']``);
    unset, empty or ``auto``: the probe's choice. Another word warns and is
    ignored. Called by pyattn's ``_init`` before the kernel family is chosen."""
    word = os.environ.get("PYATTN_UKR", "").strip().lower()
    if word in ("", "auto"):
        return
    shapes = _C._ukr_info()["shapes"]
    if word not in shapes:
        warnings.warn(f"PYATTN_UKR={word!r} is not one of 'auto', "
                      + ", ".join(repr(s) for s in shapes) + "; ignored", RuntimeWarning, stacklevel=3)
        return
    _C._ukr_select(word)


def describe(config: Dict[str, Any]) -> Optional[str]:
    """show_config's line on the AVX-512 micro-kernel, or None where the
    family in use is not avx512 (or the probe did not run)."""
    info = _C._ukr_info()
    if config["isa"] != "avx512" or not info["probed"]:
        return None
    r512, r256 = info["rate512"], info["rate256"]
    ratio = f"{r512 / r256:.1f}x" if r256 > 0 else "?"
    probe = (f"FMA probe: 512-bit at {ratio} the 256-bit rate ({r512 / 1e9:.0f} vs {r256 / 1e9:.0f} "
             f"GFLOP/s) = {_CLASS_WORDS[info['class']]}")
    why = "PYATTN_UKR" if info["forced"] else "chosen because " + _WHY[info["class"]]
    return f"{info['shape']} ({info['kernel']}; {probe}; {why})"
