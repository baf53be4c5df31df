"""Ready-made masks as functions (``mask_mod``) for :class:`pyattn.BlockMask`.

A ``mask_mod(b, h, q_idx, kv_idx)`` is called with broadcastable NumPy
int64 arrays (``b`` and ``h`` 0-d: the batch and head the mask is built
for, 0 when the BlockMask has no such axis) and returns a bool array, True
where query ``q_idx`` may attend key ``kv_idx`` (PyTorch FlexAttention's
convention). Every mask here is such a callable, and
:meth:`pyattn.BlockMask.from_mask_mod` also knows its structure: it
classifies the tiles in closed form and calls the mask only on the tiles
that are neither empty nor full (a few calls on batches of tiles, never one
per tile).

Examples
--------
>>> import pyattn
>>> m = pyattn.masks.and_masks(pyattn.masks.causal, pyattn.masks.document([0] * 100 + [1] * 156))
>>> bm = pyattn.BlockMask.from_mask_mod(m, None, None, 256, 256)
>>> bm.to_dense().shape
(1, 1, 256, 256)
"""
from __future__ import annotations

import operator

import numpy as np

__all__ = ["causal", "sliding_window", "document", "prefix_lm", "chunked_causal", "and_masks", "or_masks"]

_EMPTY, _FULL, _PARTIAL = 0, 1, 2


def _states(full, empty):
    """Tile states from the closed form's full / empty tests (else: evaluate)."""
    return np.where(full, _FULL, np.where(empty, _EMPTY, _PARTIAL)).astype(np.uint8)


def _int(x, name, lo=0):
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {x!r}") from None
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {x!r}")
    if v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return v


class _MaskMod:
    """A mask_mod whose tile states have a closed form: _tiles(b, h, q0, q1, k0,
    k1) gives, for tiles of positions [q0, q1) (column (nq, 1)) and keys [k0, k1)
    (row (1, nk)), 0 empty, 1 full, 2 to be evaluated."""

    def __call__(self, b, h, q_idx, kv_idx):  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):  # pragma: no cover
        raise NotImplementedError


def tile_states(mask_mod, b, h, q0, q1, k0, k1, L, S):
    """The closed-form states of a mask_mod's tiles (2 everywhere when it
    has no structure: every tile is evaluated)."""
    if isinstance(mask_mod, _MaskMod):
        return mask_mod._tiles(b, h, q0, q1, k0, k1, L, S)
    return np.full(np.broadcast_shapes(q0.shape, k0.shape), _PARTIAL, np.uint8)


class _Causal(_MaskMod):
    def __call__(self, b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):
        return _states(k1 - 1 <= q0, k0 > q1 - 1)

    def __repr__(self):
        return "pyattn.masks.causal"

    def __reduce__(self):
        return "causal"


causal = _Causal()
causal.__doc__ = """Top-left causal: ``kv_idx <= q_idx`` (as ``is_causal=True``).

A ready-made ``mask_mod``: pass it itself (not a call of it) to
:meth:`pyattn.BlockMask.from_mask_mod` or to :func:`and_masks`.

Parameters
----------
b, h : int or ndarray
    Batch and head indices (unused).
q_idx, kv_idx : ndarray
    Broadcastable query and key positions.

Returns
-------
ndarray of bool
    True where ``kv_idx <= q_idx``.

Examples
--------
>>> import numpy as np, pyattn
>>> pyattn.masks.causal(0, 0, np.arange(3)[:, None], np.arange(3)).astype(int).tolist()
[[1, 0, 0], [1, 1, 0], [1, 1, 1]]
"""


class _Window(_MaskMod):
    def __init__(self, left, right):
        self.left, self.right = left, right

    def __call__(self, b, h, q_idx, kv_idx):
        # the bounds on the (small) query side: no int64 (q, k) temporaries
        return (kv_idx >= q_idx - self.left) & (kv_idx <= q_idx + self.right)

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):
        lo, hi = self.left, self.right
        full = (k0 >= q1 - 1 - lo) & (k1 - 1 <= q0 + hi)
        empty = (k1 - 1 < q0 - lo) | (k0 > q1 - 1 + hi)
        return _states(full, empty)

    def __repr__(self):
        return f"pyattn.masks.sliding_window({self.left}, {self.right})"


def sliding_window(left, right=0):
    """Sliding window: query ``q`` sees keys ``q - left <= kv <= q + right``
    (``window=(left, right)`` of :func:`pyattn.scaled_dot_product_attention`;
    ``right=0``: causal within the window). ``None`` on a side: unbounded.

    Parameters
    ----------
    left : int or None
        Keys before the query that it sees (``None``: all of them).
    right : int or None, default 0
        Keys after the query that it sees (``None``: all of them).

    Returns
    -------
    mask_mod
        A callable ``mask_mod(b, h, q_idx, kv_idx)`` with a closed form for
        :meth:`pyattn.BlockMask.from_mask_mod`.

    Raises
    ------
    TypeError
        A side that is not an integer.
    ValueError
        A negative side.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> pyattn.masks.sliding_window(1)(0, 0, np.arange(3)[:, None], np.arange(3)).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    big = np.iinfo(np.int64).max // 4
    lo = big if left is None else _int(left, "left")
    hi = big if right is None else _int(right, "right")
    return _Window(min(lo, big), min(hi, big))


class _Document(_MaskMod):
    def __init__(self, ids_q, ids_k):
        self.ids_q, self.ids_k = ids_q, ids_k

    def _ids(self, ids, b):
        return ids if ids.ndim == 1 else ids[b if ids.shape[0] > 1 else 0]

    def __call__(self, b, h, q_idx, kv_idx):
        if self.ids_q.ndim == 1 and self.ids_k.ndim == 1:
            return self.ids_q[q_idx] == self.ids_k[kv_idx]
        bq = np.asarray(b) if self.ids_q.shape[0] > 1 else 0
        bk = np.asarray(b) if self.ids_k.shape[0] > 1 else 0
        iq = self.ids_q[q_idx] if self.ids_q.ndim == 1 else self.ids_q[bq, q_idx]
        ik = self.ids_k[kv_idx] if self.ids_k.ndim == 1 else self.ids_k[bk, kv_idx]
        return iq == ik

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):
        iq, ik = self._ids(self.ids_q, b), self._ids(self.ids_k, b)
        if iq.shape[-1] != L or ik.shape[-1] != S:
            raise ValueError(f"document: doc_ids_q has {iq.shape[-1]} positions and doc_ids_k "
                             f"{ik.shape[-1]}; the BlockMask has L={L}, S={S}")
        qs, ks = q0[:, 0], k0[0]
        qmin, qmax = np.minimum.reduceat(iq, qs), np.maximum.reduceat(iq, qs)
        kmin, kmax = np.minimum.reduceat(ik, ks), np.maximum.reduceat(ik, ks)
        qmin, qmax, kmin, kmax = qmin[:, None], qmax[:, None], kmin[None], kmax[None]
        full = (qmin == qmax) & (kmin == kmax) & (qmin == kmin)
        empty = (qmax < kmin) | (kmax < qmin)
        return _states(full, empty)

    def __repr__(self):
        return f"pyattn.masks.document(<ids {self.ids_q.shape}>, <ids {self.ids_k.shape}>)"


def _ids_array(x, name):
    a = np.asarray(x)
    if a.dtype.kind not in "iub" or a.dtype.kind == "b":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim not in (1, 2):
        raise ValueError(f"{name} must be (L,) or (B, L), got shape {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.size and np.iinfo(np.int32).min <= a.min() and a.max() <= np.iinfo(np.int32).max:
        a = a.astype(np.int32)              # compared on every evaluated tile: half the bytes
    return a


def document(doc_ids_q, doc_ids_k=None):
    """Document masking for packed sequences: query ``q`` sees key ``kv`` when
    ``doc_ids_q[q] == doc_ids_k[kv]`` (ids ``(L,)``, or ``(B, L)`` per batch
    row; ``doc_ids_k`` defaults to ``doc_ids_q``). Not causal by itself:
    ``and_masks(causal, document(ids))`` for packed causal training.

    Parameters
    ----------
    doc_ids_q : array_like of int, shape (L,) or (B, L)
        The document of each query position.
    doc_ids_k : array_like of int, shape (S,) or (B, S), optional
        The document of each key position; defaults to ``doc_ids_q``.

    Returns
    -------
    mask_mod
        A callable ``mask_mod(b, h, q_idx, kv_idx)`` with a closed form.

    Raises
    ------
    TypeError
        Ids that are not integers.
    ValueError
        Ids of another rank (and, when the BlockMask is built, of another
        length than its L / S).

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> m = pyattn.masks.document([0, 0, 1])
    >>> m(0, 0, np.arange(3)[:, None], np.arange(3)).astype(int).tolist()
    [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    iq = _ids_array(doc_ids_q, "doc_ids_q")
    ik = iq if doc_ids_k is None else _ids_array(doc_ids_k, "doc_ids_k")
    return _Document(iq, ik)


class _PrefixLM(_MaskMod):
    def __init__(self, n):
        self.n = n

    def __call__(self, b, h, q_idx, kv_idx):
        n = self.n if self.n.ndim == 0 else self.n[np.asarray(b) if self.n.shape[0] > 1 else 0]
        return (kv_idx < n) | (kv_idx <= q_idx)

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):
        n = int(self.n if self.n.ndim == 0 else self.n[b if self.n.shape[0] > 1 else 0])
        return _states((k1 <= n) | (k1 - 1 <= q0), (k0 >= n) & (k0 > q1 - 1))

    def __repr__(self):
        return f"pyattn.masks.prefix_lm({self.n.tolist()})"


def prefix_lm(prefix_len):
    """Prefix-LM: every query sees the first ``prefix_len`` keys (the
    bidirectional prompt) and is causal after them: ``kv < n or kv <= q``.

    Parameters
    ----------
    prefix_len : int or array_like of int, shape (B,)
        The prefix length, or one per batch row.

    Returns
    -------
    mask_mod
        A callable ``mask_mod(b, h, q_idx, kv_idx)`` with a closed form.

    Raises
    ------
    TypeError
        Non-integers.
    ValueError
        Negative lengths or another shape.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> pyattn.masks.prefix_lm(2)(0, 0, np.arange(3)[:, None], np.arange(3)).astype(int).tolist()
    [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    """
    a = np.asarray(prefix_len)
    if a.dtype.kind not in "iu":
        raise TypeError(f"prefix_len must be an int or (B,) ints, got dtype {a.dtype}")
    if a.ndim > 1:
        raise ValueError(f"prefix_len must be an int or (B,), got shape {a.shape}")
    if (a < 0).any():
        raise ValueError("prefix_len must be >= 0")
    return _PrefixLM(a.astype(np.int64))


class _Chunked(_MaskMod):
    def __init__(self, chunk):
        self.chunk = chunk

    def __call__(self, b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx // self.chunk == q_idx // self.chunk)

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):
        c = self.chunk
        full = (k1 - 1 <= q0) & (k0 >= (q1 - 1) // c * c)
        empty = (k0 > q1 - 1) | (k1 - 1 < q0 // c * c)
        return _states(full, empty)

    def __repr__(self):
        return f"pyattn.masks.chunked_causal({self.chunk})"


def chunked_causal(chunk):
    """Chunked causal attention (Llama 4's local layers): causal within
    chunks of ``chunk`` positions, ``kv <= q`` and ``kv // chunk == q // chunk``.

    Parameters
    ----------
    chunk : int
        Positions per chunk (at least 1).

    Returns
    -------
    mask_mod
        A callable ``mask_mod(b, h, q_idx, kv_idx)`` with a closed form.

    Raises
    ------
    TypeError
        A non-integer.
    ValueError
        ``chunk < 1``.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> pyattn.masks.chunked_causal(2)(0, 0, np.arange(3)[:, None], np.arange(3)).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    return _Chunked(_int(chunk, "chunk", 1))


def _check_mods(mods, name):
    if not mods:
        raise ValueError(f"{name} needs at least one mask_mod")
    for m in mods:
        if not callable(m):
            raise TypeError(f"{name}: {m!r} is not a mask_mod (a callable)")
    return tuple(mods)


class _And(_MaskMod):
    def __init__(self, mods):
        self.mods = mods

    def __call__(self, b, h, q_idx, kv_idx):
        r = self.mods[0](b, h, q_idx, kv_idx)
        for m in self.mods[1:]:
            r = r & m(b, h, q_idx, kv_idx)
        return r

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):
        st = [tile_states(m, b, h, q0, q1, k0, k1, L, S) for m in self.mods]
        empty = np.logical_or.reduce([s == _EMPTY for s in st])
        full = np.logical_and.reduce([s == _FULL for s in st])
        return _states(full, empty)

    def __repr__(self):
        return "pyattn.masks.and_masks(" + ", ".join(map(repr, self.mods)) + ")"


class _Or(_And):
    def __call__(self, b, h, q_idx, kv_idx):
        r = self.mods[0](b, h, q_idx, kv_idx)
        for m in self.mods[1:]:
            r = r | m(b, h, q_idx, kv_idx)
        return r

    def _tiles(self, b, h, q0, q1, k0, k1, L, S):
        st = [tile_states(m, b, h, q0, q1, k0, k1, L, S) for m in self.mods]
        empty = np.logical_and.reduce([s == _EMPTY for s in st])
        full = np.logical_or.reduce([s == _FULL for s in st])
        return _states(full, empty)

    def __repr__(self):
        return "pyattn.masks.or_masks(" + ", ".join(map(repr, self.mods)) + ")"


def and_masks(*mask_mods):
    """The intersection of mask_mods (True where all are True); the builder
    combines their tile states in closed form where they have one.

    Parameters
    ----------
    *mask_mods : callable
        One or more ``mask_mod(b, h, q_idx, kv_idx)`` functions.

    Returns
    -------
    mask_mod
        Their intersection.

    Raises
    ------
    ValueError
        No mask given.
    TypeError
        A mask that is not callable.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> m = pyattn.masks.and_masks(pyattn.masks.causal, pyattn.masks.document([0, 1, 1]))
    >>> m(0, 0, np.arange(3)[:, None], np.arange(3)).astype(int).tolist()
    [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    """
    return _And(_check_mods(mask_mods, "and_masks"))


def or_masks(*mask_mods):
    """The union of mask_mods (True where any is True); as :func:`and_masks`.

    Parameters
    ----------
    *mask_mods : callable
        One or more ``mask_mod(b, h, q_idx, kv_idx)`` functions.

    Returns
    -------
    mask_mod
        Their union.

    Raises
    ------
    ValueError
        No mask given.
    TypeError
        A mask that is not callable.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> m = pyattn.masks.or_masks(pyattn.masks.causal, pyattn.masks.prefix_lm(2))
    >>> m(0, 0, np.arange(3)[:, None], np.arange(3)).astype(int).tolist()
    [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    """
    return _Or(_check_mods(mask_mods, "or_masks"))


def __dir__():
    return sorted(__all__)
