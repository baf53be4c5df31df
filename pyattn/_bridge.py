"""The tensor bridge (Architecture v4, issue 39 item 4): NumPy views of
PyTorch tensors and DLPack arrays, and tensors of NumPy arrays, written once
for ``_checks.as_array``, ``pyattn.flash``, ``pyattn.torch`` and
``pyattn.transformers``. Never a copy: a CPU tensor's memory is viewed (a
bfloat16 tensor's bits as ml_dtypes' bfloat16, which NumPy lacks); torch
and ml_dtypes are imported only when a tensor or a bfloat16 array is met."""
from __future__ import annotations

import sys

import numpy as np

__all__ = []  # private


def is_tensor(x) -> bool:
    """A torch tensor (found by its module: torch stays optional)."""
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def bf16_numpy(t) -> np.ndarray:
    """A CPU bfloat16 tensor's memory as ml_dtypes' bfloat16 (its bits, no
    copy); ImportError when ml_dtypes is not installed."""
    import ml_dtypes
    import torch
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def tensor_numpy(t) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array, never a copy (detached;
    bfloat16 as ml_dtypes' bfloat16: the same bits)."""
    t = t.detach()
    if t.dtype == sys.modules["torch"].bfloat16:    # (a tensor: torch is imported; per call, no import)
        try:
            return bf16_numpy(t)
        except ImportError:
            raise TypeError("bfloat16 tensors need ml_dtypes, NumPy's bfloat16 "
                            "(pip install \"pyattn[bf16]\")") from None
    return t.numpy()


def to_tensor(a):
    """A torch tensor of a NumPy array's memory (ml_dtypes' bfloat16 as
    torch.bfloat16: the same bits), never a copy."""
    import torch
    if a.dtype.kind == "V" and a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def from_dlpack(x):
    """A view of x's memory through DLPack (a torch tensor, a JAX array),
    never a copy; a PyTorch bfloat16 tensor as ml_dtypes' bfloat16 (NumPy's
    DLPack import has no bfloat16) when ml_dtypes is installed. None when
    NumPy cannot view x that way (another device, a tensor that requires
    grad, a dtype NumPy lacks): np.asarray then decides, or names the problem."""
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError, AttributeError):
        pass
    if type(x).__module__.split(".")[0] == "torch" and "bfloat16" in str(getattr(x, "dtype", "")) \
            and getattr(getattr(x, "device", None), "type", None) == "cpu" \
            and not getattr(x, "requires_grad", False):
        try:
            return bf16_numpy(x)
        except ImportError:
            return None
    return None


def torch_bf16_hint(x):
    """The fix for a PyTorch bfloat16 tensor (NumPy has no bfloat16 of its own,
    so tensor.numpy() fails with "unsupported ScalarType BFloat16"), else ''."""
    if type(x).__module__.split(".")[0] != "torch" or "bfloat16" not in str(getattr(x, "dtype", "")):
        return ""
    return ("; it is a PyTorch bfloat16 tensor, which NumPy cannot hold: pass t.float() "
            "(float32, exact), or the same bits without a copy as ml_dtypes' bfloat16: "
            "t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) (pip install \"pyattn[bf16]\")")
