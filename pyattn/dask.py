"""pyattn on Dask arrays: attention beyond one machine (API.md "Beyond one machine").

``import pyattn.dask`` needs the optional ``dask`` extra (``pip install
"pyattn[dask]"``: ``dask[array]`` and ``distributed``); ``import pyattn``
never imports dask.

Attention splits exactly. Chunks of the query along its leading axes (batch,
heads) and along ``L`` are independent tasks. Chunks of the keys along ``S``
are attended separately with ``return_lse=True`` and combined by
:func:`pyattn.merge_attention` in a tree (split-KV / ring attention); key
chunks that the causal rule or the window exclude for a query chunk produce
no task at all. The result is a lazy dask array whose chunks follow the
query's (the last axis in one chunk) and runs on whatever scheduler is
active: threads, processes, or a ``dask.distributed`` cluster.

Threads: each task calls pyattn with its share of the process it runs in,
``max(1, budget // tasks that run at once)``, so a worker is never
oversubscribed. In a ``dask.distributed`` worker the budget is the worker's
``OMP_NUM_THREADS`` (which distributed's nanny sets to 1 by default: dask's
own rule of one thread per task, parallelism from the tasks) or else its
CPUs, shared by its ``nthreads`` tasks; the local threaded scheduler shares
the CPUs among its pool, the synchronous scheduler gives its one task all of
them. :func:`set_task_threads` fixes the number instead (it is recorded in
the graph, so it reaches remote workers).

Results equal local pyattn up to the reassociation of the merge (the
per-chunk log-sum-exp combination), never bit for bit when ``S`` is split.

A worker lost while tasks run: dask.distributed reschedules its tasks on
the workers left (its nanny restarts the process), and the computation
completes with the right result; this is what tests/test_dask.py observes
when it terminates a worker process of a LocalCluster mid-computation. Past
``distributed.scheduler.allowed-failures`` lost attempts of a task, dask
raises ``KilledWorker`` instead: an error, never a wrong result (the tasks
are pure functions of their inputs).

>>> import numpy as np, dask.array as da, pyattn, pyattn.dask
>>> x = da.from_array(np.random.default_rng(0).standard_normal((2, 4, 64, 16)), chunks=(1, 4, 32, 16))
>>> y = pyattn.dask.scaled_dot_product_attention(x, x.rechunk((2, 4, 64, 16)), x, is_causal=True)
>>> bool(np.allclose(y.compute(), pyattn.scaled_dot_product_attention(*(x.compute(),) * 3, is_causal=True)))
True
"""
from __future__ import annotations

import itertools
import os
import threading
import uuid

import numpy as np

try:
    import dask
    import dask.array as da
except ImportError as exc:  # pragma: no cover - exercised without dask installed
    raise ImportError("pyattn.dask needs dask: pip install \"pyattn[dask]\" (dask[array] and "
                      "distributed)") from exc

from . import _C
from ._api import _linear, _sdpa
from ._blockmask import as_block_mask
from ._spec import attn_spec
from ._checks import as_array, causal_code, index_value, not_flag_mask, window_value

__all__ = ["scaled_dot_product_attention", "multi_head_attention", "set_task_threads"]

_TASK_THREADS = None


def set_task_threads(n=None):
    """Threads each pyattn call inside a Dask task uses: an int >= 1, or None
    (the default) for the worker's per-task share of its CPUs. Recorded in the
    graphs built afterwards (so it reaches remote workers).

    Parameters
    ----------
    n : int or None, optional
        Threads per task, at least 1; ``None`` restores the default.

    Raises
    ------
    TypeError
        ``n`` is not an integer or None.
    ValueError
        ``n < 1``.

    Examples
    --------
    >>> import pyattn.dask
    >>> pyattn.dask.set_task_threads(1)
    >>> pyattn.dask.set_task_threads(None)
    """
    global _TASK_THREADS
    if n is not None:
        n = index_value(n, "n")
        if n < 1:
            raise ValueError(f"set_task_threads: n must be >= 1 or None, got {n}")
    _TASK_THREADS = n


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _task_threads(fixed):
    """The threads of one task: fixed, else this process's thread budget over the
    tasks it runs at once (see the module docstring)."""
    if fixed:
        return fixed
    budget, running = _cpus(), None
    try:
        from distributed import get_worker
        running = get_worker().state.nthreads
        omp = os.environ.get("OMP_NUM_THREADS", "")
        if omp.isdigit() and int(omp) >= 1:
            budget = int(omp)
    except (ImportError, ValueError, AttributeError):
        running = None
    if running is None:
        if threading.current_thread() is threading.main_thread():
            return budget                       # the synchronous scheduler: one task at a time
        running = dask.config.get("num_workers", None) or budget
    return max(1, budget // max(1, int(running)))


def _partial(q, k, v, m, kw, threads, bm=None):
    """Attention of one query block over one key block: (out, lse). kw: the
    block's attn_spec keywords (is_causal, scale, enable_gqa, window,
    alibi_slopes, softcap, sinks, qoff); bm: (BlockMask, the block's slabs,
    its first position, its first key) or None."""
    o = dict(kw, return_lse=True)
    spec = attn_spec(q, k, v, m, 0.0, o.pop("is_causal", False), o.pop("scale", None), o.pop("enable_gqa", False), o)
    if bm is not None:
        spec = spec._replace(block_mask=bm[0]._c_arg(None, bm[2], bm[3], slabs=bm[1]))
    return _sdpa(spec, nthreads=_task_threads(threads))


def _merge2(a, b, threads):
    """Two partial results over disjoint keys -> their union (merge_attention, in order)."""
    (oa, la), (ob, lb) = a, b
    dt = np.result_type(oa.dtype, ob.dtype)
    return _C.merge(np.stack([oa, ob]).astype(dt, copy=False), np.stack([la, lb]).astype(dt, copy=False),
                    nthreads=_task_threads(threads))


def _empty_pair(shape, dt):
    """A query block with no key block to see: output 0, lse -inf (API: no admissible key)."""
    return np.zeros(shape, dt), np.full(shape[:-1], -np.inf, dt)


def _first(pair):
    return pair[0]


def _second(pair):
    return pair[1]


def _wrap(x, name):
    if isinstance(x, da.Array):
        return x
    return da.from_array(as_array(x, name), chunks=-1)


def _round_heads(chunks, g):
    """Head chunks whose boundaries are multiples of g (a query chunk must hold whole
    groups of the query heads that share a key/value head)."""
    out, acc = [], 0
    for c in chunks:
        acc += c
        if acc % g == 0:
            out.append(acc)
            acc = 0
    if acc:
        out.append(acc)
    return tuple(out)


def _key_range(i, S, g, causal, left, right):
    """pyattn.h's pa_key_range on global positions: the keys query row i may see."""
    d = i + g
    lo, hi = 0, S
    if causal:
        hi = min(hi, d + 1)
    if right >= 0:
        hi = min(hi, d + right + 1)
    if left >= 0:
        lo = max(lo, d - left)
    return lo, max(lo, hi)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, *, window=None, alibi_slopes=None,
                                 softcap=None, sinks=None, return_lse=False, block_mask=None):
    """Lazy :func:`pyattn.scaled_dot_product_attention` on Dask arrays.

    The local function's positional order (``query, key, value, attn_mask,
    dropout_p, is_causal, scale, enable_gqa``, then keywords), so a call
    written for one runs on the other. Shapes, conventions and errors are the
    local function's (it validates the arguments, on stand-ins without
    memory, before any graph is built): ``query (..., L, E)``, ``key (..., S,
    E)``, ``value (..., S, Ev)`` -> ``(..., L, Ev)``; ``attn_mask`` (dask or
    NumPy) broadcasts to ``(..., L, S)``. ``return_lse=True`` also returns the
    rows' log-sum-exp ``(..., L)`` (a dask array, chunks as the output's
    leading axes; ``-inf`` for rows with no admissible key), as the local
    function: ``(out, lse)``.

    Chunking: the result's chunks follow the query's (its last axis in one
    chunk). Chunks of ``key`` along ``S`` are attended separately and merged
    by their log-sum-exp; ``value`` is rechunked to ``key``'s ``S`` chunks when
    they differ (and the feature axes to one chunk). With ``enable_gqa`` the
    query's head chunks are rounded to whole groups of heads. Key chunks that
    the causal rule or ``window`` exclude for a query chunk are not computed:
    causal ``L = S`` split into n x n chunks makes n(n+1)/2 attention tasks.
    ``sinks`` go with the first key chunk each query chunk attends to.
    ``block_mask`` (a :class:`pyattn.BlockMask`, pickled into the graph)
    decides likewise: a key chunk whose tiles are all empty for a query chunk
    gets no task.

    Parameters
    ----------
    query, key, value : dask.array.Array or array_like
        As the local function's.
    attn_mask, dropout_p, is_causal, scale, enable_gqa : option
        As the local function's (``dropout_p`` must be 0).
    window, alibi_slopes, softcap, sinks, return_lse, block_mask : option
        As the local function's.

    Returns
    -------
    dask.array.Array, or a tuple ``(out, lse)`` with ``return_lse``
        Lazy; ``.compute()`` runs it on any scheduler.

    Raises
    ------
    ValueError
        ``dropout_p > 0`` (dropout is not offered on Dask), and every error
        of the local function (with its message).

    Examples
    --------
    >>> import numpy as np, dask.array as da, pyattn.dask
    >>> q = da.ones((8, 4, 256, 32), chunks=(2, 4, 128, 32))
    >>> kv = da.ones((8, 4, 256, 32), chunks=(8, 4, 64, 32))
    >>> out = pyattn.dask.scaled_dot_product_attention(q, kv, kv, is_causal=True)
    >>> out.chunks[:3]
    ((2, 2, 2, 2), (4,), (128, 128))
    """
    if not isinstance(dropout_p, (int, float, np.integer, np.floating)) or isinstance(dropout_p, bool):
        raise TypeError(f"dropout_p must be a number (0.0: dropout is not offered on Dask), got "
                        f"{type(dropout_p).__name__}; the positional order is the local function's: "
                        "(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)")
    if dropout_p:
        raise ValueError("dropout is not offered by pyattn.dask (dropout_p must be 0): use local "
                         "pyattn.scaled_dot_product_attention for training")
    return_lse = bool(return_lse)       # as the local function
    q, k, v = _wrap(query, "query"), _wrap(key, "key"), _wrap(value, "value")
    not_flag_mask(attn_mask, "attn_mask")
    m = None if attn_mask is None else _wrap(attn_mask, "attn_mask")
    for x, n in ((q, "query"), (k, "key"), (v, "value")):
        if x.ndim < 2:
            raise ValueError(f"{n} must have at least 2 dimensions (..., rows, features), got shape {x.shape}")
    if block_mask is not None:       # PyTorch's BlockMask: rebuilt once here, pickled into the graph
        block_mask = as_block_mask(block_mask)
    # the local checks, on zero-stride stand-ins (no memory, no arithmetic)
    stand = [np.broadcast_to(np.zeros((), x.dtype), x.shape) for x in (q, k, v)]
    mstand = None if m is None else np.broadcast_to(np.zeros((), m.dtype), m.shape)
    spec = attn_spec(*stand, mstand, 0.0, is_causal, scale, enable_gqa,
                     {"window": window, "alibi_slopes": alibi_slopes, "softcap": softcap, "sinks": sinks,
                      "block_mask": block_mask})
    dt, shape = spec.dtype, spec.out_shape
    causal = causal_code(is_causal)
    left, right = window_value(window)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    full_batch = shape[:-2]
    nb = len(full_batch)
    groups = 1
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
    qf = da.broadcast_to(q, full_batch + (L, E))
    if groups > 1:
        kvb = full_batch[:-1] + (k.shape[-3],)
        qf = qf.rechunk(qf.chunks[:nb - 1] + (_round_heads(qf.chunks[nb - 1], groups),) + (qf.chunks[-2], E))
    else:
        kvb = full_batch
        qf = qf.rechunk(qf.chunks[:-1] + (E,))
    kf = da.broadcast_to(k, kvb + (S, E))
    kf = kf.rechunk(kf.chunks[:-1] + (E,))
    vf = da.broadcast_to(v, kvb + (S, Ev)).rechunk(kf.chunks[:-1] + (Ev,))
    mf = None
    if m is not None:
        mf = da.broadcast_to(m, full_batch + (L, S)).rechunk(qf.chunks[:-1] + (kf.chunks[-2],))
    sc = scale
    slopes_full = None if alibi_slopes is None else np.broadcast_to(
        np.asarray(alibi_slopes, np.float64), full_batch)
    sinks_full = None if sinks is None else np.broadcast_to(np.asarray(sinks, np.float64), full_batch)
    g = (S - L) if causal == 2 else 0                 # d(i) = i + g, global positions
    slabs_full = None if block_mask is None else spec.block_mask[3].reshape(full_batch)
    bm_node = None if block_mask is None else dask.delayed(block_mask, pure=True)
    threads = _TASK_THREADS
    token = uuid.uuid4().hex[:12]

    def bounds(chunks):
        edges = [0] + list(itertools.accumulate(chunks))
        return list(zip(edges[:-1], edges[1:]))

    lead_bounds = [bounds(c) for c in qf.chunks[:nb]]
    l_bounds = bounds(qf.chunks[-2])
    s_bounds = bounds(kf.chunks[-2])

    def piece(arr, sl, cache={}):
        """arr[sl] as a task argument: the chunk itself when sl is exactly one chunk
        (no copy, no extra task), else a slice of the array."""
        key = id(arr)
        if key not in cache:
            cache[key] = (arr.to_delayed(), [dict((b, i) for i, b in enumerate(bounds(c))) for c in arr.chunks])
        blocks_, index = cache[key]
        idx = []
        for d, x in enumerate(sl):
            b = (0, arr.shape[d]) if x == slice(None) else (x.start, x.stop)
            if b not in index[d]:
                return arr[tuple(sl)]
            idx.append(index[d][b])
        return blocks_[tuple(idx)]

    blocks = np.empty(tuple(len(b) for b in lead_bounds) + (len(l_bounds),), dtype=object)
    lse_blocks = np.empty(blocks.shape, dtype=object)
    for lead_idx in itertools.product(*[range(len(b)) for b in lead_bounds]):
        lead = [slice(*lead_bounds[d][i]) for d, i in enumerate(lead_idx)]
        if groups > 1:
            h = lead[-1]
            kv_lead = lead[:-1] + [slice(h.start // groups, h.stop // groups)]
        else:
            kv_lead = lead
        for li, (l0, l1) in enumerate(l_bounds):
            lo = _key_range(l0, S, g, causal, left, right)[0]
            hi = _key_range(l1 - 1, S, g, causal, left, right)[1]
            qb = piece(qf, lead + [slice(l0, l1), slice(None)])
            bshape = tuple(s.stop - s.start for s in lead) + (l1 - l0, Ev)
            parts = []
            for si, (s0, s1) in enumerate(s_bounds):
                if s0 >= hi or s1 <= lo:
                    continue                      # excluded by the causal rule / the window
                bm = None
                if block_mask is not None:
                    bsl = np.ascontiguousarray(slabs_full[tuple(lead)])
                    if not block_mask._any(bsl, l0, l1, s0, s1):
                        continue                  # every tile empty under the block mask
                    bm = (bm_node, bsl, l0, s0)
                kb = piece(kf, kv_lead + [slice(s0, s1), slice(None)])
                vb = piece(vf, kv_lead + [slice(s0, s1), slice(None)])
                mb = None if mf is None else piece(mf, lead + [slice(l0, l1), slice(s0, s1)])
                sl = None if slopes_full is None else np.ascontiguousarray(slopes_full[tuple(lead)])
                sk = None if (sinks_full is None or parts) else np.ascontiguousarray(sinks_full[tuple(lead)])
                name = f"pyattn-attention-{token}-{'-'.join(map(str, lead_idx))}-{li}-{si}"
                kw = dict(is_causal=bool(causal), scale=sc, enable_gqa=groups > 1, window=window,
                          alibi_slopes=sl, softcap=softcap, sinks=sk, qoff=l0 + g - s0)
                parts.append(dask.delayed(_partial, pure=False)(qb, kb, vb, mb, kw, threads, bm,
                                                                dask_key_name=name))
            if not parts:
                pair = dask.delayed(_empty_pair)(bshape, dt, dask_key_name=f"pyattn-empty-{token}-"
                                                 f"{'-'.join(map(str, lead_idx))}-{li}")
            else:
                level = 0
                while len(parts) > 1:             # the merge tree: neighbours, in key order
                    nxt = []
                    for p in range(0, len(parts) - 1, 2):
                        nxt.append(dask.delayed(_merge2, pure=False)(
                            parts[p], parts[p + 1], threads,
                            dask_key_name=f"pyattn-merge-{token}-{'-'.join(map(str, lead_idx))}-{li}-{level}-{p}"))
                    if len(parts) % 2:
                        nxt.append(parts[-1])
                    parts = nxt
                    level += 1
                pair = parts[0]
            tag = f"{token}-{'-'.join(map(str, lead_idx))}-{li}"
            out = dask.delayed(_first)(pair, dask_key_name=f"pyattn-out-{tag}")
            blocks[lead_idx + (li,)] = [da.from_delayed(out, shape=bshape, dtype=dt)]   # (, Ev)
            if return_lse:
                lse = dask.delayed(_second)(pair, dask_key_name=f"pyattn-lse-{tag}")
                lse_blocks[lead_idx + (li,)] = da.from_delayed(lse, shape=bshape[:-1], dtype=dt)
    out = da.block(blocks.tolist()) if blocks.size else da.zeros(shape, dtype=dt)
    if not return_lse:
        return out
    lse = da.block(lse_blocks.tolist()) if lse_blocks.size else da.full(shape[:-1], -np.inf, dtype=dt)
    return out, lse


def multi_head_attention(query, key, value, num_heads, w_q, w_k, w_v, w_o=None, b_q=None, b_k=None,
                         b_v=None, b_o=None, *, attn_mask=None, is_causal=False, scale=None):
    """Lazy :func:`pyattn.multi_head_attention` on Dask arrays (batch first).

    ``query (B, L, d_q)``, ``key (B, S, d_k)``, ``value (B, S, d_v)`` (dask or
    NumPy; the feature axis is rechunked to one chunk), weights NumPy arrays in
    ``torch.nn.Linear``'s layout. The projections run per chunk with pyattn's
    matmul, the heads through :func:`scaled_dot_product_attention` above
    (chunks along B, L and S as the inputs'). Returns ``(B, L, d_model)``.

    Parameters
    ----------
    query, key, value : dask.array.Array or array_like
        ``(B, L, d_q)``, ``(B, S, d_k)``, ``(B, S, d_v)``.
    num_heads : int
        Heads.
    w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o : array_like
        As :func:`pyattn.multi_head_attention`.
    attn_mask, is_causal, scale : option
        As :func:`pyattn.multi_head_attention`.

    Returns
    -------
    dask.array.Array
        ``(B, L, d_model)``, lazy.

    Examples
    --------
    >>> import numpy as np, dask.array as da, pyattn.dask
    >>> x = da.ones((4, 64, 32), chunks=(2, 32, 32)); w = np.eye(32)
    >>> pyattn.dask.multi_head_attention(x, x, x, 4, w, w, w, w, is_causal=True).shape
    (4, 64, 32)
    """
    xq, xk, xv = _wrap(query, "query"), _wrap(key, "key"), _wrap(value, "value")
    ws = [None if a is None else as_array(a, n) for a, n in
          zip((w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o), ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"))]
    wq, wk, wv, wo, bq, bk, bv, bo = ws
    # the local checks on stand-ins
    from ._api import multi_head_attention as local
    stand = [np.broadcast_to(np.zeros((), x.dtype), x.shape[:-2] + (min(x.shape[-2], 1), x.shape[-1]))
             for x in (xq, xk, xv)]
    res = local(*stand, num_heads, wq, wk, wv, wo, bq, bk, bv, bo, is_causal=False, scale=scale)
    dt = res.dtype
    h = index_value(num_heads, "num_heads")
    unbatched = xq.ndim == 2
    if unbatched:
        xq, xk, xv = xq[None], xk[None], xv[None]
    d_vo = wv.shape[0]

    def proj(x, w, b):
        x = x.rechunk(x.chunks[:-1] + (x.shape[-1],))
        return da.map_blocks(lambda xb: _linear(np.ascontiguousarray(xb, dtype=dt), w, b, dt),
                             x, dtype=dt, chunks=x.chunks[:-1] + ((w.shape[0],),))

    def heads(t):
        B, T, d = t.shape
        return t.reshape(B, T, h, d // h).transpose(0, 2, 1, 3)

    qh, kh, vh = heads(proj(xq, wq, bq)), heads(proj(xk, wk, bk)), heads(proj(xv, wv, bv))
    o = scaled_dot_product_attention(qh, kh, vh, attn_mask, is_causal=is_causal, scale=scale)
    o = o.transpose(0, 2, 1, 3)
    o = o.reshape(o.shape[0], o.shape[1], d_vo)
    if wo is not None:
        o = proj(o, wo, bo)
    return o[0] if unbatched else o


def __dir__():
    return sorted(__all__)
