"""FlashAttention's ``flash_attn.bert_padding`` helpers, importable as
``pyattn.flash.bert_padding`` (and from ``pyattn.flash``): padded batches
``(B, S, ...)`` with a ``(B, S)`` mask to the packed rows the varlen
functions take, and back.

On CPU ``torch.Tensor``s (torch ops: differentiable, as FlashAttention's)
or on NumPy arrays (NumPy results). The same shapes, dtypes and return
values as FlashAttention's.
"""
from __future__ import annotations

import numpy as np

__all__ = ["unpad_input", "pad_input", "index_first_axis"]


def _is_tensor(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def _check_mask(m, name, hshape):
    if m.ndim != 2 or tuple(m.shape) != tuple(hshape[:2]):
        raise ValueError(f"{name} must be (batch, seqlen) = {tuple(hshape[:2])} as hidden_states "
                         f"{tuple(hshape)}, got shape {tuple(m.shape)}")


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """The rows of a padded batch that ``attention_mask`` keeps, packed.

    Returns what FlashAttention 2's ``unpad_input`` returns; tensors in,
    tensors out.

    Parameters
    ----------
    hidden_states : (batch, seqlen, ...) tensor or array
        The padded batch, any dtype (a CPU ``torch.Tensor`` or anything
        ``np.asarray`` takes).
    attention_mask : (batch, seqlen) bool or int
        Nonzero = a real token.
    unused_mask : (batch, seqlen) bool or int, optional
        Rows allocated but unused (packed too, not counted in ``seqused``).

    Returns
    -------
    hidden_states : (total, ...)
        The kept rows, in order (``hidden_states``' dtype).
    indices : (total,) int64
        The kept rows' positions in the flattened ``(batch * seqlen)`` input.
    cu_seqlens : (batch + 1,) int32
        Offsets of each sequence's rows.
    max_seqlen_in_batch : int
        The most rows of any sequence.
    seqused : (batch,) int32
        Each sequence's real tokens (``attention_mask``'s count).

    Raises
    ------
    ValueError
        A mask that is not ``(batch, seqlen)`` of ``hidden_states``, or
        ``hidden_states`` under 2-D.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.flash.bert_padding import unpad_input
    >>> x = np.arange(6.0).reshape(2, 3, 1)
    >>> rows, idx, cu, mx, used = unpad_input(x, np.array([[1, 1, 0], [1, 0, 0]]))
    >>> rows[:, 0], idx, cu, mx
    (array([0., 1., 3.]), array([0, 1, 3]), array([0, 2, 3], dtype=int32), 2)
    >>> used
    array([2, 1], dtype=int32)
    """
    if _is_tensor(hidden_states):
        import torch
        if hidden_states.ndim < 2:
            raise ValueError(f"hidden_states must be (batch, seqlen, ...), got shape {tuple(hidden_states.shape)}")
        m = torch.as_tensor(attention_mask, device=hidden_states.device)
        _check_mask(m, "attention_mask", hidden_states.shape)
        keep = m != 0
        used = keep.sum(dim=-1, dtype=torch.int32)
        if unused_mask is not None:
            u = torch.as_tensor(unused_mask, device=hidden_states.device)
            _check_mask(u, "unused_mask", hidden_states.shape)
            keep = keep | (u != 0)
        seqlens = keep.sum(dim=-1, dtype=torch.int32)
        indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
        max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
        cu = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
        flat = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
        return flat[indices], indices, cu, max_seqlen, used
    h = np.asarray(hidden_states)
    if h.ndim < 2:
        raise ValueError(f"hidden_states must be (batch, seqlen, ...), got shape {h.shape}")
    m = np.asarray(attention_mask)
    _check_mask(m, "attention_mask", h.shape)
    keep = m != 0
    used = keep.sum(axis=-1, dtype=np.int32)
    if unused_mask is not None:
        u = np.asarray(unused_mask)
        _check_mask(u, "unused_mask", h.shape)
        keep = keep | (u != 0)
    seqlens = keep.sum(axis=-1, dtype=np.int32)
    indices = np.flatnonzero(keep).astype(np.int64)
    cu = np.zeros(len(seqlens) + 1, np.int32)
    np.cumsum(seqlens, dtype=np.int32, out=cu[1:])
    max_seqlen = int(seqlens.max()) if seqlens.size else 0
    return h.reshape((-1,) + h.shape[2:])[indices], indices, cu, max_seqlen, used


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse of :func:`unpad_input`: packed rows ``(total, ...)`` back to
    ``(batch, seqlen, ...)``, zeros where no row was kept.

    Parameters
    ----------
    hidden_states : (total, ...) tensor or array
        The packed rows, any dtype (a CPU ``torch.Tensor`` or anything
        ``np.asarray`` takes).
    indices : (total,) integers
        Each row's position in the flattened ``(batch * seqlen)`` batch, as
        :func:`unpad_input` returns them.
    batch : int
        Sequences of the padded batch.
    seqlen : int
        Positions per sequence of the padded batch.

    Returns
    -------
    (batch, seqlen, ...) tensor or array
        ``hidden_states``' dtype, zeros where no row was kept. Tensors in:
        a tensor out, differentiable with respect to ``hidden_states``.

    Raises
    ------
    ValueError
        ``indices`` does not have one entry per row or holds a position
        outside ``[0, batch * seqlen)``.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.flash.bert_padding import pad_input
    >>> pad_input(np.array([[1.0], [2.0], [3.0]]), np.array([0, 1, 3]), 2, 3)[..., 0]
    array([[1., 2., 0.],
           [3., 0., 0.]])
    """
    n = int(batch) * int(seqlen)
    if _is_tensor(hidden_states):
        import torch
        idx = torch.as_tensor(indices, device=hidden_states.device)
        _check_indices(tuple(idx.shape), hidden_states.shape, n,
                       (int(idx.min()), int(idx.max())) if idx.numel() else None)
        out = torch.zeros((n,) + tuple(hidden_states.shape[1:]), dtype=hidden_states.dtype,
                          device=hidden_states.device)
        out = out.index_put((idx.long(),), hidden_states)
        return out.reshape((int(batch), int(seqlen)) + tuple(hidden_states.shape[1:]))
    h = np.asarray(hidden_states)
    idx = np.asarray(indices)
    _check_indices(idx.shape, h.shape, n, (int(idx.min()), int(idx.max())) if idx.size else None)
    out = np.zeros((n,) + h.shape[1:], h.dtype)
    out[idx] = h
    return out.reshape((int(batch), int(seqlen)) + h.shape[1:])


def _check_indices(ishape, hshape, n, lohi):
    if len(ishape) != 1 or len(hshape) < 1 or ishape[0] != hshape[0]:
        raise ValueError(f"indices must be (total,) with one entry per row of hidden_states "
                         f"{tuple(hshape)}, got shape {tuple(ishape)}")
    if lohi is not None and (lohi[0] < 0 or lohi[1] >= n):
        raise ValueError(f"indices must be in [0, batch * seqlen) = [0, {n}), got values in "
                         f"[{lohi[0]}, {lohi[1]}]")


def index_first_axis(x, indices):
    """``x.reshape`` ... ``[indices]`` along the first axis: FlashAttention's
    ``index_first_axis`` (differentiable for tensors), e.g.
    ``index_first_axis(x.reshape(B * S, -1), indices)``.

    >>> import numpy as np
    >>> from pyattn.flash.bert_padding import index_first_axis
    >>> index_first_axis(np.arange(4.0), np.array([3, 1]))
    array([3., 1.])
    """
    if _is_tensor(x):
        import torch
        return x[torch.as_tensor(indices, device=x.device).long()]
    return np.asarray(x)[np.asarray(indices)]
