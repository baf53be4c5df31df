"""Paged KV caches (API.md, "Paged and mixed-length KV caches"):
:class:`pyattn.PagedKVCache`, its step plans (:class:`pyattn.PagedPlan`) and
:class:`pyattn.CacheFullError`. A step runs through
``attention_with_kvcache(block_table=, cu_seqlens_q=)`` (pyattn/_kvapi.py;
the paged, packed and tree calls' runner is pyattn/_kvpaged.py) or, for a
planned decode step, its signature's plan (pyattn/_kvfast.py).
"""
from __future__ import annotations

import itertools

import numpy as np

from . import _C, _kvfast  # noqa: F401  (_C: tests patch _C.sdpa through this module)
from ._cachespec import _cu_seqlens
from ._kvapi import attention_with_kvcache
from ._checks import as_array, cache_dtype, number

__all__ = ["PagedKVCache", "PagedPlan", "CacheFullError"]


class CacheFullError(MemoryError):
    """A :class:`PagedKVCache` has too few free blocks for a call, or a
    :class:`KVCache` too few rows left (``lengths + T > max_len``); raised
    before anything is written (the cache is unchanged). A ``MemoryError``.

    Raised by :meth:`KVCache.attend` and :meth:`PagedKVCache.attend` (and the
    :mod:`pyattn.nn` layers' calls with a cache); its message says what the
    call needs and what the cache has left.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> cache = pyattn.KVCache(batch=1, num_kv_heads=1, max_len=2, head_dim=4)
    >>> x = np.zeros((1, 1, 3, 4), np.float32)          # 3 new rows, room for 2
    >>> try:
    ...     cache.attend(x, x, x)
    ... except pyattn.CacheFullError as e:
    ...     print(isinstance(e, MemoryError), cache.lengths)
    True [0]
    """


# ---- a step planned once for the caches of every layer (PagedPlan) --------------------------
#
# A PagedKVCache's bookkeeping (its sequences' block lists and lengths, the free list, the
# reference counts, the next id) changes only through add_sequence, fork, free and a step
# (attend), each deterministic: two caches with equal bookkeeping that take the same operation
# end with equal bookkeeping. So a cache carries a *stamp*, a number standing for its state:
# the constructor's is drawn from (num_blocks, block_size), each operation's from (the stamp
# before, the operation and its arguments), through one memo shared by every cache -- the
# caches of a model's layers, driven in lockstep, carry the same stamps. A stamp is never
# given to two different states (a memo entry forgotten only makes a new number), so equal
# stamps mean equal bookkeeping, exactly: a plan whose stamp is the cache's runs with no
# further check; any other cache is compared, entry by entry, with what the plan read.
_stamps = itertools.count(1)
_stamp_memo: dict = {}
_STAMP_MEMO_MAX = 4096


def _stamp_after(pre, op):
    """The stamp of the state that operation op leads to from the state stamped pre."""
    key = (pre, op)
    s = _stamp_memo.get(key)
    if s is None:
        if len(_stamp_memo) >= _STAMP_MEMO_MAX:           # forget the older half (a lockstep
            for k in list(_stamp_memo)[:_STAMP_MEMO_MAX // 2]:      # group's operations are recent)
                _stamp_memo.pop(k, None)
        s = _stamp_memo[key] = next(_stamps)
    return s


# the plans attend made without one, by (stamp, seqs, tokens): the caches of a model's other layers,
# in the same state, take the same step with it (a plan made once per step even without plan=)
_recent: dict = {}
_RECENT_MAX = 16


def _recent_key(cache, seqs, query, cu):
    """The key of _recent for an attend call, or None: seqs a list or tuple of
    ints, query an ndarray (B, Hq, T, E), or packed (total, Hq, E) with cu a
    list or integer ndarray (its values in the key; a plan made with them
    checked them, and the total is checked here)."""
    if type(seqs) not in (list, tuple) or type(query) is not np.ndarray:
        return None
    for s in seqs:
        if type(s) is not int:
            return None
    if cu is None:
        if query.ndim != 4 or query.shape[0] != len(seqs):
            return None
        return (cache._stamp, tuple(seqs), query.shape[2])
    if type(cu) is np.ndarray:
        if cu.dtype.kind not in "iu" or cu.ndim != 1:
            return None
        cu = cu.tolist()
    elif type(cu) is not list or not all(type(x) is int for x in cu):
        return None
    if query.ndim != 3 or not cu or query.shape[0] != cu[-1]:
        return None
    return (cache._stamp, tuple(seqs), tuple(cu))


def _seq_list(seqs):
    """seqs (the argument) as a list, or TypeError naming it."""
    if type(seqs) is list:
        return seqs
    if isinstance(seqs, (int, np.integer)):
        raise TypeError("seqs must be a sequence of sequence ids (a list), got an int")
    try:
        return list(seqs)
    except TypeError:
        raise TypeError(f"seqs must be a sequence of sequence ids (a list), got {type(seqs).__name__}") from None


class PagedPlan:
    """One step of some sequences of a :class:`PagedKVCache`, worked out once
    and run by the caches of every layer (FlashInfer's ``plan`` / ``run``).

    Made by :meth:`PagedKVCache.plan`, not constructed directly. It holds the
    step's bookkeeping: the sequences (checked live, each once), the new
    tokens of each, the blocks the step takes from the free list (checked
    to suffice: :class:`CacheFullError` is raised by ``plan``), the shared
    blocks it copies before writing them (copy-on-write), the block table
    ``(len(seqs), max_blocks)`` and the lengths before the step. Then
    ``cache.attend(plan.seqs, query, key, value, plan=plan)`` for each layer's
    cache only checks that the cache is in the state the plan was made from
    and that the arrays fit it, copies the shared blocks in that cache's pools,
    runs the kernel and advances that cache's sequences (each cache keeps its
    own bookkeeping). The result is the unplanned call's, bit for bit:
    :meth:`PagedKVCache.attend` without a plan makes one and runs it.

    A model keeps one :class:`PagedKVCache` per layer, created alike and
    given the same :meth:`~PagedKVCache.add_sequence`, :meth:`~PagedKVCache.fork`
    and :meth:`~PagedKVCache.free` calls (the caches then hand out the same
    ids and blocks): a plan made from any of them serves all of them for one
    step. Whether a cache is in the plan's state is known at no cost when the
    caches went through the same operations (each cache carries a stamp of
    its state, equal for equal histories); otherwise the plan compares the
    sequences, reference counts and free blocks it read with the cache's.
    A plan is for one step: once a cache has run it, that cache has moved
    on, and running the plan there again (or after any other change to the
    cache's sequences) is a ``ValueError`` -- make the next step's plan then.

    Parameters
    ----------
    *args, **kwargs
        Not taken: constructing a plan directly is a ``TypeError`` (make one
        with :meth:`PagedKVCache.plan`).

    Attributes
    ----------
    seqs : tuple of int
        The sequence ids, in the order of the query's rows.
    new_tokens : int or None
        The new tokens of every sequence (``query (len(seqs), Hq, T, E)``),
        or None for a packed step (``cu_seqlens_q``).
    cu_seqlens_q : ndarray int64 ``(len(seqs) + 1,)`` or None
        The packed step's offsets (read-only).
    block_table : ndarray int64 ``(len(seqs), max_blocks)``
        Each sequence's blocks after the step (-1 past its last), read-only:
        the ``block_table`` of :func:`pyattn.attention_with_kvcache`.
    cache_seqlens : ndarray int64 ``(len(seqs),)``
        The rows each sequence holds before the step (read-only).

    Examples
    --------
    Two layers' caches, one plan per step, run by both:

    >>> import numpy as np, pyattn
    >>> caches = [pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=4)
    ...           for _ in range(2)]
    >>> a = [c.add_sequence() for c in caches][0]            # the same id in each
    >>> rng = np.random.default_rng(0)
    >>> plan = caches[0].plan([a], new_tokens=3)              # a prompt of 3 tokens
    >>> for c in caches:
    ...     q, k, v = rng.standard_normal((3, 1, 1, 3, 4)).astype(np.float32)
    ...     out = c.attend(plan.seqs, q, k, v, plan=plan)
    >>> plan, [c.length(a) for c in caches]
    (PagedPlan(seqs=(0,), new_tokens=3, blocks_taken=1, blocks_copied=0), [3, 3])

    Used again, the plan finds the cache moved on:

    >>> caches[0].attend([a], q, k, v, plan=plan)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: plan: the cache is not in the state this plan was made from (sequence 0 has 3 rows ...
    """
    __slots__ = ("seqs", "new_tokens", "cu_seqlens_q", "_table", "_n", "_bs", "_nblk", "_pre",
                 "_post", "_before", "_looked", "_taken", "_after", "_copies", "_inc", "_dec", "_Ts", "_total",
                 "_lens")
    seqs: tuple
    new_tokens: "int | None"
    cu_seqlens_q: "np.ndarray | None"
    _table: np.ndarray
    _n: np.ndarray
    _bs: int
    _nblk: int
    _pre: int
    _post: int
    _before: list
    _looked: dict
    _taken: list
    _after: list
    _copies: list
    _inc: list
    _dec: list
    _Ts: list
    _total: int
    _lens: dict

    def __init__(self, *args, **kwargs):
        raise TypeError("a PagedPlan is made by PagedKVCache.plan(seqs, new_tokens=... or cu_seqlens_q=...)")

    @classmethod
    def _make(cls, cache, ids, Ts, new_tokens, cu):
        """The plan of writing Ts[i] rows to sequence ids[i] of cache (ids
        checked live and distinct): raises CacheFullError; changes nothing."""
        self = object.__new__(cls)
        lists, copies, taken, looked = cache._plan(ids, Ts)
        B = len(ids)
        width = max([len(b) for b in lists] + [1])
        if all(len(b) == width for b in lists):
            table = np.array(lists, np.int64).reshape(B, width)
        else:
            table = np.full((B, width), -1, np.int64)
            for i, b in enumerate(lists):
                table[i, :len(b)] = b
        seqs = cache._seqs
        before = [seqs[s] for s in ids]              # [blocks, length]: replaced, never changed in place
        n = np.array([x[1] for x in before], np.int64)
        self.seqs = tuple(ids)
        self.new_tokens = new_tokens
        if cu is not None:
            cu.flags.writeable = False
        self.cu_seqlens_q = cu
        self._table = table                           # (shown read-only by the properties)
        self._n = n
        self._Ts = Ts
        self._total = sum(Ts)
        self._bs, self._nblk = cache.block_size, cache.k.shape[0]
        self._before = before
        self._looked = looked                        # {block: its reference count}, as read
        self._taken = taken
        self._copies = copies
        self._after = [[b, x[1] + t] for b, x, t in zip(lists, before, Ts)]
        inc = []
        for b, (old, _) in zip(lists, before):       # new blocks and copy-on-write copies: one more holder
            if len(b) != len(old) or b is not old:
                inc += b[len(old):] + [x for x, y in zip(b, old) if x != y]
        self._inc = inc
        self._dec = [src for src, _ in copies]        # the writers leave the shared blocks
        self._lens = {}                               # kv lengths repeated per head (pyattn/_kvfast.py)
        self._pre = pre = cache._stamp
        self._post = _stamp_after(pre, ("step", self.seqs, tuple(Ts)))
        return self

    @property
    def block_table(self) -> np.ndarray:
        """The step's block table, ``(len(seqs), max_blocks)`` int64, read-only.

        Examples
        --------
        >>> import pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=4)
        >>> cache.plan([cache.add_sequence()], new_tokens=6).block_table      # 6 rows: 2 blocks
        array([[0, 1]])
        """
        v = self._table.view()
        v.flags.writeable = False
        return v

    @property
    def cache_seqlens(self) -> np.ndarray:
        """The rows each sequence holds before the step, ``(len(seqs),)`` int64, read-only.

        Examples
        --------
        >>> import pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=4)
        >>> cache.plan([cache.add_sequence()], new_tokens=1).cache_seqlens    # a new sequence
        array([0])
        """
        v = self._n.view()
        v.flags.writeable = False
        return v

    @property
    def _kv_len(self):
        """(B,) int64: the rows each sequence holds after the step."""
        return self._n + np.array(self._Ts, np.int64)

    def _mismatch(self, cache):
        """None when cache is in the state the plan was made from, else what differs."""
        if cache.block_size != self._bs or cache.k.shape[0] != self._nblk:
            return (f"the cache has {cache.k.shape[0]} blocks of {cache.block_size} rows; the plan was made "
                    f"for {self._nblk} blocks of {self._bs}")
        get = cache._seqs.get
        for s, b in zip(self.seqs, self._before):
            now = get(s)
            if now != b:
                have = "is not a live sequence of it" if now is None else f"has {now[1]} rows in blocks {now[0]}"
                return (f"sequence {s} {have}; the plan was made when it had {b[1]} rows in blocks {b[0]}")
        refs = cache._refs
        for blk, r in self._looked.items():
            if refs[blk] != r:
                return (f"block {blk}, which the step writes, has {int(refs[blk])} holders; the plan was made "
                        f"when it had {r}")
        need = len(self._taken)
        if need and (len(cache._free) < need or cache._free[len(cache._free) - need:] != self._taken):
            return f"the free blocks differ from the plan's (it takes {self._taken[::-1]})"
        return None

    def _check(self, cache):
        """True when cache carries the plan's stamp; False when its state
        matches the plan's entry by entry; else ValueError naming plan."""
        if cache._stamp == self._pre:
            return True
        why = self._mismatch(cache)
        if why is not None:
            raise ValueError(f"plan: the cache is not in the state this plan was made from ({why}): a plan "
                             "serves one step -- make a new one (cache.plan(seqs, ...)) for each step")
        return False

    def _commit(self, cache, same):
        """Advance cache's bookkeeping by the step (its kernel call succeeded)."""
        seqs = cache._seqs
        for s, (b, n) in zip(self.seqs, self._after):
            seqs[s] = [b, n]                          # the block list shared: never changed in place
        refs = cache._refs
        for b in self._inc:
            refs[b] += 1
        for src in self._dec:
            refs[src] -= 1
        need = len(self._taken)
        if need:
            del cache._free[len(cache._free) - need:]
        cache._stamp = self._post if same else next(_stamps)

    def __repr__(self) -> str:
        what = (f"new_tokens={self.new_tokens}" if self.cu_seqlens_q is None else
                f"cu_seqlens_q={self.cu_seqlens_q.tolist()}")
        return (f"PagedPlan(seqs={self.seqs}, {what}, blocks_taken={len(self._taken)}, "
                f"blocks_copied={len(self._copies)})")


class PagedKVCache:
    """Key/value caches of many sequences in one pool of fixed-size blocks
    (vLLM's paged attention, on NumPy arrays).

    ``k (num_blocks, Hkv, block_size, E)`` and ``v (num_blocks, Hkv,
    block_size, Ev)`` are allocated once (zeros): pyattn's head-major block
    layout, read in place by :func:`pyattn.attention_with_kvcache` through a
    block table. A sequence of length n holds ``ceil(n / block_size)`` blocks
    from a free list; :meth:`fork` makes a sequence that shares its parent's
    blocks (nothing is copied) and the first write into a shared block
    copies that block first (copy-on-write, by reference counts), so the
    parent's rows never change. A model keeps one cache per layer, all given
    the same calls; the bookkeeping of a step (the blocks it takes and
    copies, the block table, the lengths) is then the same in each, and
    :meth:`plan` works it out once for all of them (``attend(..., plan=)``).

    Parameters
    ----------
    num_blocks, block_size, num_kv_heads, head_dim : int
    value_dim : int, optional (default ``head_dim``)
    dtype : float32 (default), float64, float16, ``ml_dtypes.bfloat16``, ``"int8"``, ``"int4"``, ``"fp8_e4m3"`` or ``"fp8_e5m2"``
        ``"int8"`` / ``"int4"``: quantized pools (``k`` is ``np.int8
        (num_blocks, Hkv, block_size, E)`` or ``np.uint8 (..., E / 2)``, two
        values per byte) with float32 scale pools ``k_scale (num_blocks, Hkv,
        block_size, E / group_size)`` (``v``, ``v_scale`` likewise): new rows
        are quantized into their pages as they are written
        (:func:`pyattn.quantize`'s rule), the kernels read rows and scales
        per block in place; a copied-on-write block takes its scales along.
        ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (needs ``ml_dtypes``): pools of
        ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2`` with the same scale
        pools (quantize's fp8 rule), widened to float32 per tile as they
        are read (``precision="bf16"``: :meth:`attend`).
    group_size : int, default 32
        Values per scale of an int8 / int4 / fp8 pool (it must divide head_dim and
        value_dim); unused by the float dtypes.

    Attributes
    ----------
    k, v : ndarray, the pools
    k_scale, v_scale : ndarray float32 (their scale pools), or None for a float cache

    Raises
    ------
    ValueError
        A negative size, ``block_size`` or ``num_kv_heads`` below 1; a
        ``group_size`` that does not divide the head dims (int4: odd head dims).
    TypeError
        A dtype other than the eight above, sizes that are not integers.
    ImportError
        An fp8 dtype without ``ml_dtypes`` installed.

    Examples
    --------
    >>> import numpy as np, pyattn
    >>> cache = pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=2, head_dim=8)
    >>> a = cache.add_sequence()
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 1, 2, 5, 8)).astype(np.float32)
    >>> cache.attend([a], q, k, v).shape            # a prompt of 5 tokens
    (1, 2, 5, 8)
    >>> b = cache.fork(a)                            # shares a's 2 blocks
    >>> cache.length(b), cache.blocks_free
    (5, 6)
    """

    def __init__(self, num_blocks, block_size, num_kv_heads, head_dim, value_dim=None,
                 dtype=np.float32, group_size=32):
        names = ("num_blocks", "block_size", "num_kv_heads", "head_dim", "value_dim")
        dims = []
        for x, name in zip((num_blocks, block_size, num_kv_heads, head_dim,
                            head_dim if value_dim is None else value_dim), names):
            x = number(x, name, integer=True)
            low = 1 if name in ("block_size", "num_kv_heads") else 0
            if x < low:
                raise ValueError(f"{name} must be >= {low}, got {x}")
            dims.append(x)
        gs = number(group_size, "group_size", integer=True)
        if gs < 1:
            raise ValueError(f"group_size must be >= 1, got {gs}")
        dt, quant = cache_dtype(dtype)
        N, bs, H, E, Ev = dims
        if quant and (E % gs or Ev % gs or (quant == "int4" and (E % 2 or Ev % 2))):
            raise ValueError(f"group_size {gs} must divide head_dim {E} and value_dim {Ev}"
                             + (" (which must be even for int4)" if quant == "int4" else ""))
        limit = np.iinfo(np.intp).max
        for D, what in ((E, "head_dim"), (Ev, "value_dim")):
            if N * H * bs * D * max(dt.itemsize, 4 if quant else 1) > limit:
                raise ValueError(f"PagedKVCache(num_blocks={N}, block_size={bs}, num_kv_heads={H}, "
                                 f"{what}={D}) would need more than {limit} bytes")
        per = 2 if quant == "int4" else 1             # values per stored element
        self.k = np.zeros((N, H, bs, E // per), dt)
        self.v = np.zeros((N, H, bs, Ev // per), dt)
        self.k_scale = np.zeros((N, H, bs, E // gs), np.float32) if quant else None
        self.v_scale = np.zeros((N, H, bs, Ev // gs), np.float32) if quant else None
        self.group_size = gs
        self._quant = quant
        self._free = list(range(N - 1, -1, -1))   # pop() hands out the lowest block first
        self._refs = np.zeros(N, np.int64)
        self._seqs = {}                            # id -> [blocks (list), length]
        self._next = 0
        self._stamp = _stamp_after(0, ("init", N, bs))     # its state's stamp (PagedPlan)

    @property
    def block_size(self) -> int:
        """Rows per block."""
        return self.k.shape[2]

    @property
    def blocks_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    def add_sequence(self) -> int:
        """A new, empty sequence (no block yet); returns its id.

        Ids count up from 0 and are never reused (not even after
        :meth:`free`).

        Returns
        -------
        int
            The new sequence's id, to pass to :meth:`attend`, :meth:`fork`,
            :meth:`free` and :meth:`length`.

        Examples
        --------
        >>> import pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a, b = cache.add_sequence(), cache.add_sequence()
        >>> a, b, cache.length(b), cache.blocks_free
        (0, 1, 0, 4)
        """
        sid = self._next
        self._next += 1
        self._seqs[sid] = [[], 0]
        self._stamp = _stamp_after(self._stamp, "add")
        return sid

    def _get(self, seq, name="seq"):
        if type(seq) is int and seq in self._seqs:
            return seq
        s = number(seq, name, integer=True)
        if s not in self._seqs:
            raise ValueError(f"{name} {s} is not a live sequence of this cache (ids: "
                             f"{sorted(self._seqs)})")
        return s

    def fork(self, seq) -> int:
        """A new sequence sharing ``seq``'s blocks and length (nothing copied;
        a shared block is copied on its first write, by either sequence; when
        every sequence holding it writes it in one :meth:`attend`, all but
        the last of them copy it and the last writes it in place).

        A decode step of sequences that share blocks (forks: parallel
        samples, beams, a common prompt) reads each shared block once for
        all of them (shared-prefix reads, in :meth:`attend` and
        :func:`pyattn.attention_with_kvcache` with ``block_table``; the same
        bits as on unshared copies; :func:`pyattn.show_config` counts them).

        Parameters
        ----------
        seq : int
            The id of a live sequence of this cache (the parent).

        Returns
        -------
        int
            The new sequence's id.

        Raises
        ------
        ValueError
            ``seq`` is not a live sequence of this cache.
        TypeError
            ``seq`` is not an integer.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a = cache.add_sequence()
        >>> x = np.ones((1, 1, 3, 4), np.float32)
        >>> _ = cache.attend([a], x, x, x)                  # 3 rows: 2 blocks
        >>> b = cache.fork(a)                               # shares them
        >>> cache.length(b), cache.blocks_free
        (3, 2)
        >>> y = np.ones((1, 1, 1, 4), np.float32)
        >>> _ = cache.attend([b], y, y, y)                  # b copies the shared last block
        >>> cache.length(a), cache.length(b), cache.blocks_free
        (3, 4, 1)
        """
        parent = self._get(seq)
        blocks, length = self._seqs[parent]
        pre = self._stamp
        sid = self.add_sequence()
        self._seqs[sid] = [list(blocks), length]
        self._refs[blocks] += 1
        self._stamp = _stamp_after(pre, ("fork", parent))
        return sid

    def free(self, seq) -> None:
        """Forget ``seq``: its blocks go back to the free list once no other
        sequence shares them.

        Parameters
        ----------
        seq : int
            The id of a live sequence of this cache; it is not live
            afterwards (ids are not reused).

        Raises
        ------
        ValueError
            ``seq`` is not a live sequence of this cache (for instance,
            freed already).
        TypeError
            ``seq`` is not an integer.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a = cache.add_sequence()
        >>> x = np.ones((1, 1, 3, 4), np.float32)
        >>> _ = cache.attend([a], x, x, x)
        >>> b = cache.fork(a)
        >>> cache.free(a); cache.blocks_free                # b still holds the blocks
        2
        >>> cache.free(b); cache.blocks_free
        4
        """
        s = self._get(seq)
        blocks, _ = self._seqs.pop(s)
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)
        self._stamp = _stamp_after(self._stamp, ("free", s))

    def length(self, seq) -> int:
        """Rows filled in ``seq``.

        Parameters
        ----------
        seq : int
            The id of a live sequence of this cache.

        Returns
        -------
        int
            The rows written into ``seq`` so far (a fork starts with its
            parent's).

        Raises
        ------
        ValueError
            ``seq`` is not a live sequence of this cache.
        TypeError
            ``seq`` is not an integer.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=4)
        >>> a = cache.add_sequence()
        >>> x = np.ones((1, 1, 3, 4), np.float32)
        >>> _ = cache.attend([a], x, x, x)
        >>> cache.length(a)
        3
        """
        return self._seqs[self._get(seq)][1]

    def _plan(self, ids, Ts):
        """Block lists after writing Ts[i] rows to sequence ids[i]: new blocks
        from the free list and copy-on-write copies of shared blocks. Returns
        (lists, copies, taken, looked): copies (shared block, its copy),
        taken the free list's entries the step uses (its last ones), looked
        the blocks whose reference counts were read, with them; nothing
        changes here.

        A shared block that every sequence holding it writes in this call is
        copied for all of them but the last, which writes it in place (else
        the block would be left with no holder and off the free list)."""
        bs = self.block_size
        left = {}                                    # holders of a shared block not yet moved off it
        need = 0
        seqs, refs = self._seqs, self._refs
        for s, t in zip(ids, Ts):
            blocks, n = seqs[s]
            if t:
                need += -(-(n + t) // bs) - len(blocks)
                for b in blocks[n // bs:]:           # blocks written: n // bs .. end
                    if b not in left:
                        left[b] = int(refs[b])
                    if left[b] > 1:
                        need += 1
                        left[b] -= 1
        if need > len(self._free):
            raise CacheFullError(f"PagedKVCache: the call needs {need} free blocks, {len(self._free)} "
                                 f"are free (of {self.k.shape[0]}); nothing was written")
        taken = self._free[len(self._free) - need:]
        free = list(taken)                           # popped from the end, as they are taken
        looked = {b: int(refs[b]) for b in left}
        left = {}
        lists, copies = [], []
        for s, t in zip(ids, Ts):
            blocks, n = seqs[s]
            if t:
                blocks = list(blocks)
                for j in range(n // bs, len(blocks)):
                    if blocks[j] not in left:
                        left[blocks[j]] = int(refs[blocks[j]])
                    if left[blocks[j]] > 1:          # shared: copied before the write
                        left[blocks[j]] -= 1
                        nb = free.pop()
                        copies.append((blocks[j], nb))
                        blocks[j] = nb
                while len(blocks) * bs < n + t:
                    blocks.append(free.pop())
            lists.append(blocks)
        return lists, copies, taken, looked

    def _ids(self, seqs):
        """seqs as a list of live, distinct ids."""
        seqs = _seq_list(seqs)
        ids = [self._get(s, "seqs entry") for s in seqs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"seqs has a repeated sequence id: {ids}")
        return ids

    def plan(self, seqs, new_tokens=None, *, cu_seqlens_q=None) -> "PagedPlan":
        """Plan one step of ``seqs`` -- the blocks it takes, the shared blocks it
        copies, its block table and lengths -- once, for the caches of every
        layer (see :class:`PagedPlan`).

        Nothing changes here: each cache's :meth:`attend` with ``plan=``
        takes the blocks, makes the copies and advances its sequences.

        Parameters
        ----------
        seqs : sequence of int
            Live sequence ids of this cache, each at most once (a list, not
            a single int), in the order of the query's rows.
        new_tokens : int, optional
            The new tokens of every sequence (``query (len(seqs), Hq, T, E)``
            with ``T = new_tokens``); default 1 (a decode step), 0 allowed.
        cu_seqlens_q : (len(seqs) + 1,) integer array, optional
            Instead of ``new_tokens``: a packed step (``query (total_q, Hq,
            E)``), sequence ``i`` bringing ``cu_seqlens_q[i + 1] -
            cu_seqlens_q[i]`` tokens; starts at 0, does not decrease.

        Returns
        -------
        PagedPlan
            To pass to :meth:`attend` (``plan=``) of this cache and of the
            other layers' caches, for this step.

        Raises
        ------
        CacheFullError
            (a ``MemoryError``) when the free blocks do not suffice for the
            step.
        ValueError
            Unknown or repeated sequence ids, a negative ``new_tokens``, a
            ``cu_seqlens_q`` of the wrong length, not starting at 0 or
            decreasing.
        TypeError
            ``seqs`` an int, ``new_tokens`` not an integer or given with
            ``cu_seqlens_q``, ``cu_seqlens_q`` not integers.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=4)
        >>> a, b = cache.add_sequence(), cache.add_sequence()
        >>> plan = cache.plan([a, b], cu_seqlens_q=[0, 5, 6])     # 5 tokens for a, 1 for b
        >>> plan.block_table, plan.cache_seqlens
        (array([[ 0,  1],
               [ 2, -1]]), array([0, 0]))
        >>> cache.blocks_free                                      # taken when a cache runs it
        8
        >>> q, k, v = np.ones((3, 6, 1, 4), np.float32)
        >>> cache.attend([a, b], q, k, v, plan=plan).shape
        (6, 1, 4)
        >>> cache.length(a), cache.length(b), cache.blocks_free
        (5, 1, 5)
        """
        ids = self._ids(seqs)
        if cu_seqlens_q is not None:
            if new_tokens is not None:
                raise TypeError("give new_tokens (the same count for every sequence) or cu_seqlens_q (a packed "
                                "step), not both")
            cu = _cu_seqlens(cu_seqlens_q, len(ids), None)
            return PagedPlan._make(self, ids, np.diff(cu).tolist(), None, cu)
        T = 1 if new_tokens is None else number(new_tokens, "new_tokens", integer=True)
        if T < 0:
            raise ValueError(f"new_tokens must be >= 0, got {T}")
        return PagedPlan._make(self, ids, [T] * len(ids), T, None)

    def attend(self, seqs, query, key, value, *, cu_seqlens_q=None, plan=None, **kw):
        """Write ``key``/``value`` after each sequence's rows, attend, advance the lengths.

        Any error leaves the cache's sequences as they were (blocks it took
        go back to the free list) and its pools bit for bit (the blocks a
        copy-on-write had copied into are put back).

        With ``plan`` (from :meth:`plan`, of this cache or of another layer's
        cache in the same state) the step's bookkeeping is the plan's: the
        call checks that this cache is in the state the plan was made from
        and that ``seqs``, ``cu_seqlens_q`` and the arrays' token counts are
        the plan's, then runs the kernel; the result is the call without a
        plan, bit for bit (which makes a plan and runs it).

        Parameters
        ----------
        seqs : sequence of int
            Live sequence ids of this cache, each at most once (a list, not
            a single int): the rows of ``query`` belong to them in this
            order.
        query : array_like
            ``(len(seqs), Hq, T, E)`` (one T for all), or packed
            ``(total_q, Hq, E)`` in ``seqs`` order with ``cu_seqlens_q``;
            ``Hq`` a multiple of the cache's heads. Converted to the cache's
            compute dtype, as :func:`pyattn.attention_with_kvcache` does.
        key : array_like
            The new keys, one per query row, likewise with the cache heads:
            ``(len(seqs), Hkv, T, E)`` or packed ``(total_q, Hkv, E)``;
            converted to the pools' dtype (int8 / int4: quantized) as they
            are written.
        value : array_like
            The new values, as ``key`` with ``Ev``.
        cu_seqlens_q : (len(seqs) + 1,) integer array, optional
            Packed rows: sequence ``i`` brings rows ``cu_seqlens_q[i]`` to
            ``cu_seqlens_q[i + 1]`` of ``query``/``key``/``value`` (0
            allowed); starts at 0, does not decrease, ends at ``total_q``.
            With ``plan``: None (the plan's) or equal to the plan's.
        plan : PagedPlan, optional
            This step of ``seqs``, planned by :meth:`plan` (of any layer's
            cache in this cache's state): ``seqs`` must be ``plan.seqs``.
        **kw
            Other keywords are :func:`pyattn.attention_with_kvcache`'s
            (``is_causal``, ``scale``, ``window``, ``tree_mask``,
            ``return_lse``, ...); not ``block_table``, ``cache_seqlens``,
            ``k_scale`` or ``v_scale`` (the cache holds them).
            ``precision="int8"`` with an int8 / int4 pool (else a
            ``ValueError``, nothing written): the query rows quantized to
            int8 per group as :func:`pyattn.quantize` does, integer key
            products per group scaled by the two scales and summed over the
            groups in float32; the same bits as a :class:`pyattn.KVCache`
            with the same rows, on every kernel family. Each score differs
            from the default precision's by at most ``|scale| * sum_g (s_q,g
            / 2) * sum_{e in g} |k_e|`` plus float32 rounding (see
            :func:`pyattn.attention_with_kvcache`). ``precision="bf16"``
            with an int8 / int4 / fp8 pool: the query rounded to bfloat16,
            exact key products on the stored values (fp8: each code's value,
            unscaled) summed in float32 per group, the group scales after the
            group's sums, the bits of a :class:`pyattn.KVCache` (see
            :func:`pyattn.attention_with_kvcache`).

        Returns
        -------
        out : ndarray
            Shaped as ``query`` with ``Ev``: ``(len(seqs), Hq, T, Ev)`` or
            ``(total_q, Hq, Ev)``.
        lse : ndarray
            Only with ``return_lse=True`` (then the call returns ``(out,
            lse)``): ``(len(seqs), Hq, T)`` or ``(total_q, Hq)``.

        Raises
        ------
        CacheFullError
            (a ``MemoryError``) when the free blocks do not suffice.
        ValueError
            Unknown or repeated sequence ids, a ``query`` that is neither
            ``(len(seqs), Hq, T, E)`` nor packed, a ``key`` whose T is not
            the query's, and the errors of
            :func:`pyattn.attention_with_kvcache`. With ``plan``: ``seqs``
            or ``cu_seqlens_q`` other than the plan's, a ``query`` whose
            sequences or tokens are not the plan's, a cache not in the state
            the plan was made from (a plan used twice, or after the cache's
            sequences changed; the message says what differs).
        TypeError
            ``seqs`` an int, ``key`` or ``value`` None, a ``block_table``,
            ``cache_seqlens``, ``k_scale`` or ``v_scale`` keyword, a ``plan``
            that is not a :class:`PagedPlan`, and the type errors of
            :func:`pyattn.attention_with_kvcache`.

        Examples
        --------
        >>> import numpy as np, pyattn
        >>> cache = pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=4)
        >>> a, b = cache.add_sequence(), cache.add_sequence()
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.standard_normal((3, 2, 1, 3, 4)).astype(np.float32)
        >>> cache.attend([a, b], q, k, v).shape             # 3 tokens each
        (2, 1, 3, 4)

        Packed rows, a different count per sequence (2 for ``a``, 1 for ``b``):

        >>> q, k, v = rng.standard_normal((3, 3, 1, 4)).astype(np.float32)
        >>> out, lse = cache.attend([a, b], q, k, v, cu_seqlens_q=[0, 2, 3], return_lse=True)
        >>> out.shape, lse.shape, cache.length(a), cache.length(b)
        ((3, 1, 4), (3, 1), 5, 4)

        A decode step planned once (for every layer's cache, see :class:`PagedPlan`):

        >>> plan = cache.plan([a, b], new_tokens=1)
        >>> q, k, v = rng.standard_normal((3, 2, 1, 1, 4)).astype(np.float32)
        >>> cache.attend(plan.seqs, q, k, v, plan=plan).shape
        (2, 1, 1, 4)
        """
        if plan is not None:
            return self._attend_planned(seqs, query, key, value, cu_seqlens_q, plan, kw)
        rkey = _recent_key(self, seqs, query, cu_seqlens_q)
        plan = _recent.get(rkey) if rkey is not None else None
        if plan is not None:                # another layer's cache, in this state, planned this step
            self._kw_check(key, value, kw)
            if cu_seqlens_q is None:
                self._key_check(key, query)
            return self._run(plan, True, query, key, value, cu_seqlens_q, kw)
        ids = self._ids(seqs)
        self._kw_check(key, value, kw)
        q = as_array(query, "query")
        if cu_seqlens_q is not None:
            cu = _cu_seqlens(cu_seqlens_q, len(ids), q.shape[0] if q.ndim else -1)
            plan = PagedPlan._make(self, ids, np.diff(cu).tolist(), None, cu)
        else:
            if q.ndim != 4 or q.shape[0] != len(ids):
                raise ValueError(f"query must be (len(seqs), Hq, T, E) = ({len(ids)}, Hq, T, E), got "
                                 f"shape {q.shape} (or packed, with cu_seqlens_q)")
            self._key_check(key, q)
            plan = PagedPlan._make(self, ids, [q.shape[2]] * len(ids), q.shape[2], None)
        if rkey is not None:
            if len(_recent) >= _RECENT_MAX:
                _recent.pop(next(iter(_recent), None), None)
            _recent[rkey] = plan
        return self._run(plan, True, query, key, value, cu_seqlens_q, kw)

    @staticmethod
    def _kw_check(key, value, kw):
        for x, name in ((key, "key"), (value, "value")):
            if x is None:
                raise TypeError(f"PagedKVCache.attend writes new rows: {name} is None")
        if kw:
            for name in ("block_table", "cache_seqlens", "k_scale", "v_scale"):
                if name in kw:
                    raise TypeError(f"PagedKVCache.attend takes no {name} (the cache holds them)")

    @staticmethod
    def _key_check(key, q):
        kx = key if type(key) is np.ndarray else as_array(key, "key")
        if kx.ndim == 4 and kx.shape[2] != q.shape[2]:     # the cache's lengths advance by T
            raise ValueError(f"key has shape {kx.shape}: PagedKVCache.attend appends one new key "
                             f"per query row (T = {q.shape[2]}, query shape {q.shape})")

    def _attend_planned(self, seqs, query, key, value, cu, plan, kw):
        """attend with a plan: the arguments checked against it, then the step."""
        if type(plan) is not PagedPlan:
            raise TypeError(f"plan must be a PagedPlan (from PagedKVCache.plan), got {type(plan).__name__}")
        if seqs is not plan.seqs:
            if _seq_list(seqs) != list(plan.seqs):
                raise ValueError(f"seqs is {list(seqs)}, but the plan was made for seqs {list(plan.seqs)} (pass "
                                 "plan.seqs)")
        self._kw_check(key, value, kw)
        pcu = plan.cu_seqlens_q
        if cu is not None and cu is not pcu:
            if pcu is None:
                raise ValueError("cu_seqlens_q is given, but the plan was made for new_tokens="
                                 f"{plan.new_tokens} (not a packed step)")
            c = np.asarray(cu)
            if c.shape != pcu.shape or not np.array_equal(c, pcu):
                raise ValueError(f"cu_seqlens_q is {c.tolist()}, but the plan was made for cu_seqlens_q "
                                 f"{pcu.tolist()}")
        q = query if type(query) is np.ndarray else as_array(query, "query")
        B = len(plan.seqs)
        if pcu is None:
            T = plan.new_tokens
            if q.ndim != 4 or q.shape[0] != B or q.shape[2] != T:
                raise ValueError(f"query has shape {q.shape}; the plan was made for {B} sequences of {T} new "
                                 f"tokens each: (len(seqs), Hq, T, E) = ({B}, Hq, {T}, E)")
            self._key_check(key, q)
        elif q.ndim != 3 or q.shape[0] != plan._total:
            raise ValueError(f"query has shape {q.shape}; the plan was made for a packed step of {plan._total} "
                             f"tokens (cu_seqlens_q {pcu.tolist()}): (total_q, Hq, E) = ({plan._total}, Hq, E)")
        same = plan._check(self)
        return self._run(plan, same, query, key, value, pcu, kw)

    def _run(self, plan, same, query, key, value, cu, kw):
        """The step of plan on this cache (in the plan's state: same when it
        carries the plan's stamp): copy-on-write copies, the kernel call, the
        bookkeeping advanced; on an error the pools are put back."""
        copies = plan._copies
        if copies:
            pools = [x for x in (self.k, self.v, self.k_scale, self.v_scale) if x is not None]
            dst = [d for _, d in copies]
            before = [p[dst] for p in pools]         # the free blocks, put back on an error
        try:
            for src, d in copies:                    # into free blocks: no live row changes
                for p in pools:                      # (the scales of a quantized block with it)
                    p[d] = p[src]
            res = None
            if cu is None and self.k_scale is None and "tree_mask" not in kw:
                # a decode step's kernel call by its signature (pyattn/_kvfast.py): the table and the
                # lengths are the plan's, checked when it was made
                res = _kvfast.run_planned(query, self.k, self.v, key, value, plan._n, plan._table, kw, plan._lens)
            if res is None:
                res = attention_with_kvcache(query, self.k, self.v, key, value, cache_seqlens=plan._n,
                                             block_table=plan._table, cu_seqlens_q=cu, k_scale=self.k_scale,
                                             v_scale=self.v_scale, **kw)
        except BaseException:
            if copies:
                for p, old in zip(pools, before):
                    p[dst] = old
            raise
        plan._commit(self, same)
        return res

    def __repr__(self) -> str:
        N, H, bs, E = self.k.shape
        per = 2 if self._quant == "int4" else 1
        q = f", group_size={self.group_size}" if self._quant else ""
        return (f"PagedKVCache(num_blocks={N}, block_size={bs}, num_kv_heads={H}, head_dim={E * per}, "
                f"value_dim={self.v.shape[3] * per}, dtype={self._quant or self.k.dtype}{q}, "
                f"sequences={len(self._seqs)}, blocks_free={self.blocks_free})")
