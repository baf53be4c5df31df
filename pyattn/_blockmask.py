"""pyattn.BlockMask: a mask as a map of tiles (issue #26, API.md "Programmable
masks: BlockMask").

The grid is the attention frame's: tiles of ``TILE = (96, 60)`` (query
positions x keys; 60 = the flash frame's key tile, 96 = a multiple of every
kernel family's query block), from (0, 0). Each tile is empty, full or
partial; only partial tiles keep their bits (one 64-bit word per row, bit c =
key c of the tile). The frame (csrc/ops/blockmask.h) never computes an empty
tile, runs a full one without a mask test and tests a partial one's bits.
"""
from __future__ import annotations

import operator
import sys

import numpy as np

from . import _C
from .masks import tile_states

__all__ = ["BlockMask"]

QB, KB = 96, 60
_BATCH_TILES = 128          # tiles per mask_mod call: 128 x 96 x 60 bools (0.7 MB)
_NOT_VECTORISED = ("truth value of an array", "only length-1 arrays", "only integer scalar arrays",
                   "can only convert an array of size 1")


def _dim(x, name, allow_none):
    if x is None and allow_none:
        return None
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int{' or None' if allow_none else ''}, got {x!r}")
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an int{' or None' if allow_none else ''}, got {x!r}") from None
    if v < (1 if allow_none else 0):
        raise ValueError(f"{name} must be >= {1 if allow_none else 0}, got {v}")
    return v


def _mask_name(m):
    return getattr(m, "__name__", None) or repr(m)


def _evaluate(mask_mod, b, h, tq, tk, L, S):
    """mask_mod on tiles (tq[k], tk[k]): bools (n, QB, KB), uint8, indices
    clipped into [0, L) x [0, S) (the packer ignores what lies outside)."""
    qi = np.minimum(tq[:, None, None] * QB + np.arange(QB)[None, :, None], L - 1)
    ki = np.minimum(tk[:, None, None] * KB + np.arange(KB)[None, None, :], S - 1)
    shape = (len(tq), QB, KB)
    try:
        r = mask_mod(np.asarray(b, dtype=np.int64), np.asarray(h, dtype=np.int64), qi, ki)
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        r = _torch_call(mask_mod, b, h, qi, ki, exc)    # a FlexAttention mask_mod: torch tensors in it
        if r is not None:
            pass
        elif any(s in str(exc) for s in _NOT_VECTORISED):
            raise TypeError(f"mask_mod {_mask_name(mask_mod)} is not vectorised: it is called with NumPy "
                            f"int64 arrays q_idx {qi.shape} and kv_idx {ki.shape} and must return a bool "
                            f"array (use &, |, ~ and np.where, not and / or / if) ({exc})") from exc
        else:
            raise
    r = _from_torch(r)
    if not isinstance(r, (np.ndarray, np.bool_, bool)):
        raise TypeError(f"mask_mod {_mask_name(mask_mod)} returned {type(r).__name__}; it must return "
                        "a bool NumPy array")
    r = np.asarray(r)
    if r.dtype != np.bool_:
        raise TypeError(f"mask_mod {_mask_name(mask_mod)} returned dtype {r.dtype}; it must return bool "
                        "(True: may attend)")
    try:
        r = np.broadcast_to(r, shape)
    except ValueError:
        raise ValueError(f"mask_mod {_mask_name(mask_mod)} returned shape {r.shape}, which does not "
                         f"broadcast to its indices' shape {shape}") from None
    return np.ascontiguousarray(r).view(np.uint8)


def _from_torch(r):
    """A CPU torch.Tensor result as a NumPy array (a mask_mod written for
    FlexAttention returns tensors); anything else unchanged."""
    if type(r).__module__.split(".")[0] == "torch" and hasattr(r, "detach") and hasattr(r, "numpy"):
        return r.detach().cpu().numpy()
    return r


def _torch_call(mask_mod, b, h, qi, ki, exc):
    """mask_mod called with torch int64 index tensors, when NumPy indices
    failed and torch is in use (a mask_mod that closes over torch tensors
    -- documents, lengths -- and uses torch ops, as FlexAttention's take
    them); None where that does not apply or fails too (the NumPy error is
    then the one reported)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(exc, (TypeError, IndexError, ValueError, AttributeError)):
        return None
    try:
        return mask_mod(torch.tensor(int(b)), torch.tensor(int(h)), torch.from_numpy(np.ascontiguousarray(qi)),
                        torch.from_numpy(np.ascontiguousarray(ki)))
    except Exception:
        return None


def as_block_mask(block_mask, name="block_mask"):
    """block_mask as a pyattn BlockMask: itself, or PyTorch FlexAttention's
    BlockMask rebuilt from its mask_mod and shape (TypeError with the fix
    where it has none to rebuild from, or for anything else)."""
    if isinstance(block_mask, BlockMask):
        return block_mask
    t = type(block_mask)
    if t.__module__.startswith("torch.") and t.__name__ == "BlockMask":
        mm = getattr(block_mask, "mask_mod", None)
        if mm is None or getattr(mm, "__name__", "") == "noop_mask":
            raise TypeError(f"{name} is a PyTorch BlockMask without a mask_mod (made from blocks, e.g. "
                            "BlockMask.from_kv_blocks): pyattn rebuilds a PyTorch BlockMask from its "
                            "mask_mod; build it with pyattn.BlockMask.from_mask_mod(mask_mod, B, H, L, S) "
                            "or torch's create_block_mask(mask_mod, ...)")
        B, H, L, S = (int(x) for x in block_mask.shape)
        return BlockMask.from_mask_mod(mm, None if B == 1 else B, None if H == 1 else H, L, S)
    raise TypeError(f"{name} must be a pyattn.BlockMask (BlockMask.from_mask_mod) or PyTorch's "
                    f"FlexAttention BlockMask (create_block_mask), got {t.__name__}")


class BlockMask:
    """A mask as a map of tiles: PyTorch FlexAttention's ``BlockMask`` for
    pyattn's kernels, built without a compiler.

    Build one with :meth:`from_mask_mod`; pass it as ``block_mask=`` to
    :func:`pyattn.scaled_dot_product_attention`, its backward and vjp,
    :func:`pyattn.attention_with_kvcache` and :func:`pyattn.dask.scaled_dot_product_attention`.
    Tiles are ``TILE = (96, 60)`` (query positions x keys, the attention
    frame's grid); each is empty (never computed), full (no mask test) or
    partial (its bits kept, packed). Memory: a byte and an index per tile and
    96 words per partial tile, never ``L * S``.

    Besides ``shape``, :meth:`sparsity` (the share of empty tiles) and
    :meth:`to_dense` (the bool mask), a BlockMask supports ``==``, pickling
    (so it travels to dask workers), and its ``repr`` draws the tile map of
    batch 0, head 0 (``' '`` empty, ``'░'`` partial, ``'█'`` full).

    The constructor is internal: its parameters are the arrays that
    :meth:`from_mask_mod` computes.

    Parameters
    ----------
    shape : tuple of 4 ints
        ``(B or 1, H or 1, L, S)``.
    state : ndarray of uint8, ``(B * H, ceil(L / 96), ceil(S / 60))``
        Each tile's state: 0 empty, 1 full, 2 partial.
    index : ndarray of int64, ``state``'s shape
        The row of ``bits`` that holds each partial tile (-1 elsewhere).
    bits : ndarray of uint64, ``(partial tiles, 96)``
        One word per query row of each partial tile, bit c = key c of the
        tile.

    Attributes
    ----------
    shape : tuple
        ``(B or 1, H or 1, L, S)``, the shape of :meth:`to_dense`.
    TILE : tuple
        ``(96, 60)``: query positions x keys per tile.

    See Also
    --------
    pyattn.masks : Mask functions with closed forms (``causal``,
        ``sliding_window``, ``document``, ...).

    Examples
    --------
    >>> import pyattn
    >>> bm = pyattn.BlockMask.from_mask_mod(pyattn.masks.causal, None, None, 300, 300)
    >>> bm.sparsity()   # 4 of the 4 x 5 tiles are empty
    0.2
    >>> bm.shape, bm.TILE
    ((1, 1, 300, 300), (96, 60))
    >>> print(bm)
    BlockMask(shape=(1, 1, 300, 300), tile=(96, 60), sparsity=20.0%, partial tiles=8)
    |░░   |
    |█░░░ |
    |███░░|
    |████░|
    """

    TILE = (QB, KB)

    def __init__(self, shape, state, index, bits):
        """Internal: use :meth:`from_mask_mod`."""
        self._shape = tuple(shape)
        self._state = state
        self._index = index
        self._bits = bits

    @classmethod
    def from_mask_mod(cls, mask_mod, B, H, L, S):
        """Build a BlockMask from ``mask_mod(b, h, q_idx, kv_idx) -> bool``.

        ``mask_mod`` is called with NumPy int64 arrays (``b``, ``h`` 0-d;
        ``q_idx (n, 96, 1)``, ``kv_idx (n, 1, 60)`` for a batch of n tiles,
        indices within ``[0, L) x [0, S)``) and returns a bool array that
        broadcasts to their shape. It is evaluated batch of tiles by batch of
        tiles (at most 128 tiles, 0.7 MB of bools, at a time; never an ``(L,
        S)`` array); each tile is classified and packed in C. The masks of
        :mod:`pyattn.masks` (and their ``and_masks`` / ``or_masks``) have
        closed forms: only their tiles that are neither empty nor full are
        evaluated.

        Shapes: ``B``, ``H``: ints, or ``None`` (the same mask for every
        batch row / head: stored once); ``L`` query positions, ``S`` keys.

        Parameters
        ----------
        mask_mod : callable
            ``mask_mod(b, h, q_idx, kv_idx) -> bool array``, vectorised.
        B, H : int or None
            Batch rows and heads the mask differs over (``None``: one mask
            for all).
        L, S : int
            Query positions and keys.

        Returns
        -------
        BlockMask
            The classified tiles and the bits of the partial ones.

        Raises
        ------
        TypeError
            ``mask_mod`` not callable, not vectorised (it used ``and``,
            ``if``... on arrays), or returning something other than bool;
            ``B``, ``H``, ``L``, ``S`` not ints.
        ValueError
            A result that does not broadcast to the indices' shape; negative
            sizes. An exception ``mask_mod`` raises otherwise propagates.

        Examples
        --------
        >>> import pyattn
        >>> bm = pyattn.BlockMask.from_mask_mod(lambda b, h, q, k: (q - k) % 7 == 0, 2, None, 128, 128)
        >>> bm.shape
        (2, 1, 128, 128)
        """
        if not callable(mask_mod):
            raise TypeError(f"mask_mod must be a callable mask_mod(b, h, q_idx, kv_idx), got {mask_mod!r}")
        B, H = _dim(B, "B", True), _dim(H, "H", True)
        L, S = _dim(L, "L", False), _dim(S, "S", False)
        Bm, Hm = B or 1, H or 1
        nqt, nkt = -(-L // QB), -(-S // KB)
        q0 = (np.arange(nqt, dtype=np.int64) * QB)[:, None]
        k0 = (np.arange(nkt, dtype=np.int64) * KB)[None, :]
        q1, k1 = np.minimum(q0 + QB, L), np.minimum(k0 + KB, S)
        state = np.empty((Bm * Hm, nqt, nkt), np.uint8)
        bits = []
        for s in range(Bm * Hm):
            b, h = divmod(s, Hm)
            st = state[s]
            st[...] = np.broadcast_to(tile_states(mask_mod, b, h, q0, q1, k0, k1, L, S), (nqt, nkt))
            todo = np.flatnonzero(st == 2)
            for c in range(0, len(todo), _BATCH_TILES):
                part = todo[c:c + _BATCH_TILES]
                tq, tk = part // nkt, part % nkt
                m = _evaluate(mask_mod, b, h, tq, tk, L, S)
                got = np.empty(len(part), np.uint8)
                w = np.empty((len(part), QB), np.uint64)
                _C._bm_pack(m, np.ascontiguousarray(tq), np.ascontiguousarray(tk), L, S, got, w)
                st.reshape(-1)[part] = got
                bits.append((s * nqt * nkt + part[got == 2], w[got == 2]))
        index = np.full(state.shape, -1, np.int64)
        if bits:        # positions come in order (slab, row, column): the canonical order
            pos = np.concatenate([p for p, _ in bits])
            index.reshape(-1)[pos] = np.arange(len(pos))
            words = np.concatenate([w for _, w in bits])
        else:
            words = np.zeros((0, QB), np.uint64)
        return cls((Bm, Hm, L, S), state, index, words)

    # ---- inspection -------------------------------------------------------
    @property
    def shape(self):
        """``(B or 1, H or 1, L, S)``: the shape of :meth:`to_dense`."""
        return self._shape

    def sparsity(self):
        """The share of empty tiles (over every batch row and head), in [0, 1].

        Returns
        -------
        float
            Empty tiles / all tiles.

        Examples
        --------
        >>> import pyattn
        >>> pyattn.BlockMask.from_mask_mod(pyattn.masks.causal, None, None, 300, 300).sparsity()
        0.2
        """
        n = self._state.size
        return float(np.count_nonzero(self._state == 0)) / n if n else 0.0

    def to_dense(self):
        """The element mask, bool ``(B or 1, H or 1, L, S)`` (True: may attend).

        Returns
        -------
        ndarray of bool
            The dense mask: ``attn_mask=bm.to_dense()`` gives the bits of
            ``block_mask=bm``.

        Examples
        --------
        >>> import pyattn
        >>> pyattn.BlockMask.from_mask_mod(pyattn.masks.causal, None, None, 3, 3).to_dense()[0, 0]
        array([[ True, False, False],
               [ True,  True, False],
               [ True,  True,  True]])
        """
        Bm, Hm, L, S = self._shape
        ns, nqt, nkt = self._state.shape
        d = np.zeros((ns, nqt, QB, nkt, KB), np.bool_)
        d[...] = (self._state == 1)[:, :, None, :, None]
        sl, tq, tk = np.nonzero(self._state == 2)
        if len(sl):
            w = self._bits[self._index[sl, tq, tk]]                  # (n, QB)
            bits = np.unpackbits(w.astype("<u8").view(np.uint8).reshape(len(sl), QB, 8), axis=-1,
                                 bitorder="little")[:, :, :KB].astype(np.bool_)
            d[sl, tq, :, tk, :] = bits
        return d.reshape(ns, nqt * QB, nkt * KB)[:, :L, :S].reshape(Bm, Hm, L, S)

    def __eq__(self, other):
        if not isinstance(other, BlockMask):
            return NotImplemented
        return (self._shape == other._shape and np.array_equal(self._state, other._state)
                and np.array_equal(self._index, other._index) and np.array_equal(self._bits, other._bits))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self):
        B, H, L, S = self._shape
        head = (f"BlockMask(shape={self._shape}, tile={self.TILE}, sparsity={self.sparsity():.1%}, "
                f"partial tiles={len(self._bits)})")
        if self._state.size == 0:
            return head
        st = self._state[0]
        rows, cols = min(st.shape[0], 32), min(st.shape[1], 64)
        sub = st[:rows * (st.shape[0] // rows)].reshape(rows, -1, st.shape[1])   # rows of tiles, grouped
        sub = sub[:, :, :cols * (st.shape[1] // cols)].reshape(rows, sub.shape[1], cols, -1)
        full, empty = (sub == 1).all(axis=(1, 3)), (sub == 0).all(axis=(1, 3))
        pic = np.where(full, "█", np.where(empty, " ", "░"))
        note = "" if (rows, cols) == st.shape else f" (tiles {st.shape[0]}x{st.shape[1]} drawn {rows}x{cols})"
        return head + note + "\n" + "\n".join("|" + "".join(r) + "|" for r in pic)

    # ---- what the kernels take ---------------------------------------------
    def _slabs(self, full_batch, what="the batch axes"):
        """int64 (count,): the slab (b, h) of each flat index of full_batch."""
        Bm, Hm = self._shape[:2]
        m = np.arange(Bm * Hm, dtype=np.int64).reshape(Bm, Hm)
        if Bm == 1:
            m = m[0]
            if Hm == 1:
                m = m[0]
        try:
            return np.ascontiguousarray(np.broadcast_to(m, tuple(full_batch))).reshape(-1)
        except ValueError:
            raise ValueError(f"block_mask has shape {self._shape}: (B, H) = {(Bm, Hm)} does not broadcast "
                             f"to {what} {tuple(full_batch)} (heads last)") from None

    def _c_arg(self, full_batch, q_extra=0, k_extra=0, slabs=None):
        """The tuple _C.sdpa / _C.sdpa_backward take as block_mask (slabs: the
        slab of each flat index, when not those of full_batch: pyattn.dask's
        blocks of a larger batch)."""
        sl = self._slabs(full_batch) if slabs is None else np.ascontiguousarray(slabs, dtype=np.int64).reshape(-1)
        return (self._state, self._index, self._bits, sl, self._shape[2], self._shape[3], int(q_extra),
                int(k_extra))

    def _any(self, slabs, q0, q1, k0, k1):
        """Whether a tile of slabs (an int64 array) meets positions [q0, q1) x
        keys [k0, k1) and is not empty (pyattn.dask: which key chunks get a task)."""
        if q0 >= q1 or k0 >= k1:
            return False
        st = self._state[np.unique(slabs), q0 // QB:(q1 - 1) // QB + 1, k0 // KB:(k1 - 1) // KB + 1]
        return bool((st != 0).any())


def check_block_mask(block_mask, L, S, full_batch, kv_len=None, q_extra=0, k_extra=0):
    """attn_spec's check of block_mask= for a call of L queries over S keys
    (with kv_len, a cache's: its rows are the keys, the queries sit at
    positions kv_len - L + i): the tuple the binding takes."""
    block_mask = as_block_mask(block_mask)
    bL, bS = block_mask.shape[2:]
    if kv_len is not None:
        top = int(kv_len.max()) if kv_len.size else 0
        if bS != S or top > bL:
            raise ValueError(f"block_mask has shape {block_mask.shape}: with a cache its S must be the "
                             f"cache's rows ({S}) and its L cover the query positions (up to {top})")
    elif (bL, bS) != (L, S) and (q_extra, k_extra) == (0, 0):
        raise ValueError(f"block_mask has shape {block_mask.shape}: its (L, S) must be the call's ({L}, {S})")
    return block_mask._c_arg(full_batch, q_extra, k_extra)


def check_block_mask_varlen(block_mask, cu_q, cu_k, hq):
    """The varlen functions' check of block_mask= (cu_q, cu_k: the checked
    offsets; hq: the query heads): the tuple the binding takes, with a slab
    per (sequence, head). mask_mod's b is the sequence number and its
    q_idx / kv_idx count from each sequence's start, so the block mask must
    cover the longest sequence's queries and keys."""
    block_mask = as_block_mask(block_mask)
    n = len(cu_q) - 1
    lq = int(np.diff(cu_q).max()) if n else 0
    lk = int(np.diff(cu_k).max()) if n else 0
    bL, bS = block_mask.shape[2:]
    if bL < lq or bS < lk:
        raise ValueError(f"block_mask has shape {block_mask.shape}: with cu_seqlens its (L, S) must cover the "
                         f"longest sequence's queries and keys ({lq}, {lk}); positions count from each "
                         "sequence's start")
    sl = block_mask._slabs((n, hq), "(sequences, query heads)")
    return block_mask._c_arg(None, slabs=sl)
