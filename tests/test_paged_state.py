"""A stateful property test of PagedKVCache (issue 40, item 3): hypothesis
drives add_sequence / fork / attend (random token counts, several sequences
per call, packed or 4-D, causal or not, lse or not, windows, ALiBi slopes,
attention sinks, token-tree masks, GQA) / free, and runs out of blocks
(pools of 0 to 10 blocks), for every cache dtype the constructor takes
(float32, float64, float16, bfloat16, int8, int4; head dims 2 to 64, int8 /
int4 group sizes 1 to 32), against an independent model:

- each live sequence's history: the rows the cache should hold, in the
  cache's storage (16-bit: the new rows rounded as ``astype`` rounds; int8 /
  int4: ``pyattn.quantize`` of the new rows per row and group, and
  ``pyattn.dequantize`` of them for the values attended over);
- its blocks as abstract ids: a fork shares its parent's, a write into a
  block that another live sequence holds takes a new one for the writer
  (copy-on-write), unless every holder writes it in the same call (then the
  last writes it in place: the fewest blocks that keep every sequence's rows);
  a new row past the last block takes a new block.

Invariants after every step: ``blocks_free`` equals the blocks no live
sequence references (the number of distinct abstract blocks; also the
cache's own tables: the free list is exactly the unreferenced blocks, the
reference counts the holders); every live sequence's rows, read from the
pools through its blocks, equal its history bit for bit (the values and,
quantized, the scales); lengths equal the model's. After every attend: each
query row's output (and lse) equals float64 attention over the history,
within the float32 (float64 for a float64 cache) accumulation bound below.
A call the model says needs more blocks than are free raises
``CacheFullError`` and leaves every pool bit for bit, the lengths and the
free count unchanged; a call that fits never raises it.

The tolerance (per query row; u = 2^-24, or 2^-53 for a float64 cache; S the
row's visible keys, E the head dim, q the row, k_j, v_j the model's keys and
values, w_j the float64 softmax weights):
- a score s_j = scale * q.k_j computed in float arithmetic is off by at most
  d_j = scale * (E + 2) * u * sum_i |q_i k_ji| (a length-E dot product, the
  products, the scale; a quantized key's q * scale product is one more
  rounding of each term, inside the E + 2); an ALiBi bias b_j adds
  u (2 |b_j| + |s_j|) (the bias and the sum rounded);
- the kernel's weight p_j = exp(s_j - m) is then off relatively by
  e_j = d_j + u |s_j - m| (the subtraction) + 2u (exp within 1 ULP); the
  common shift m cancels in the normalisation;
- the output sum_j p_j v_j / sum_j p_j with weights off by e_j moves by at
  most 2 max|v| sum_j w_j e_j, and its sums of S terms (with the online
  softmax's rescales and the division) add at most (3S + 4) u max|v|;
- lse = m + log sum_j p_j is off by at most sum_j w_j e_j + (S + 2) u + 2u|lse|;
- a sink is one more weight in both (S + 1 terms), its e also holding
  u |sink| (the sink rounded to the compute dtype).
These are first-order bounds with no factor added; the largest error seen
is about a tenth of them (0.06 to 0.13 of the bound per dtype over 60
examples), so an error ten times the usual fails.
"""
import math

import numpy as np
import pytest

import pyattn
from conftest import examples

# CI (.ci/run): a frame path / entry-point grid -- whole on the CPU's own family, a generated subset elsewhere
pytestmark = [pytest.mark.frame]
from pyattn import _reference as R

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, settings, strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,  # noqa: E402
                                 rule)

try:
    import ml_dtypes
except ImportError:                     # the bfloat16 cache alone is skipped (below)
    ml_dtypes = None

DTYPES = [np.float32, np.float64, np.float16] + ([ml_dtypes.bfloat16] if ml_dtypes else []) + ["int8", "int4"]
MAX_SEQS = 5


def bits_equal(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def oracle(q, kd, vd, n, causal, window, slopes, sinks, tree, scale, u):
    """float64 attention of q (Hq, T, E) over kd, vd (Hkv, n + T, .) with
    query t at position n + t (window: (left, right), None unbounded;
    slopes (Hq,): ALiBi; sinks (Hq,): a logit in each denominator; tree
    (Hq or 1, T, T) bool: which new tokens see which, the cached rows all
    visible); returns (out, lse, out_bound, lse_bound)."""
    Hq, T, E = q.shape
    G = Hq // kd.shape[0]
    k, v = np.repeat(kd, G, 0), np.repeat(vd, G, 0)
    S = n + T
    s = np.einsum("hte,hse->hts", q, k) * scale
    d = np.einsum("hte,hse->hts", np.abs(q), np.abs(k)) * scale * (E + 2) * u
    if slopes is not None:              # the bias and its sum with the score, each rounded once more
        bias = -slopes[:, None, None] * np.abs(n + np.arange(T)[:, None] - np.arange(S)[None, :])
        d = d + u * (2 * np.abs(bias) + np.abs(s + bias))
        s = s + bias
    vis = np.ones((1, T, S), bool)
    if causal:
        vis = vis & (np.arange(S)[None, :] <= n + np.arange(T)[:, None])
    if window is not None:
        vis = vis & R.window_mask(T, S, window, qoff=n)
    if tree is not None:
        vis = vis & np.concatenate([np.ones(tree.shape[:2] + (n,), bool), tree], axis=-1)
    vis = np.broadcast_to(vis, (Hq, T, S))
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks[:, None, None])
    p = np.exp(s - m)
    z = p.sum(-1, keepdims=True)
    if sinks is not None:
        ps = np.exp(sinks[:, None, None] - m)
        z = z + ps
    w = p / z
    out = w @ v
    lse = m[..., 0] + np.log(z[..., 0])
    diff = np.where(vis, np.abs(s - m), 0.0)
    e = np.where(vis, d + u * diff + 2 * u, 0.0)
    we = (w * e).sum(-1)                                       # (Hq, T)
    nvis = vis.sum(-1)                                         # (Hq, T)
    if sinks is not None:               # the sink: one more weight (rounded to float32, u|sink|)
        we = we + (ps / z)[..., 0] * (u * np.abs(sinks)[:, None] + u * np.abs(sinks[:, None, None] - m)[..., 0]
                                      + 2 * u)
        nvis = nvis + 1
    vmax = np.array([[np.abs(v[h][vis[h, t]]).max(initial=0.0) for t in range(T)] for h in range(Hq)])
    out_b = 2 * vmax * we + (3 * nvis + 4) * u * vmax
    lse_b = we + (nvis + 2) * u + 2 * u * np.abs(lse)
    return out, lse, out_b, lse_b


class PagedCacheMachine(RuleBasedStateMachine):
    dtype = np.float32

    @initialize(bs=st.sampled_from([1, 2, 3, 4, 16]), N=st.integers(0, 10), hkv=st.sampled_from([1, 2]),
                G=st.sampled_from([1, 2, 3]), E=st.sampled_from([2, 4, 6, 8, 64]),
                Ev=st.sampled_from([2, 4, 6, 32]), data=st.data())
    def setup(self, bs, N, hkv, G, E, Ev, data):
        self.quant = self.dtype if isinstance(self.dtype, str) else None
        gs = 32
        if self.quant:
            gs = data.draw(st.sampled_from([g for g in (1, 2, 3, 4, 6, 8, 32) if E % g == 0 and Ev % g == 0]),
                           label="group_size")
        self.cache = pyattn.PagedKVCache(N, bs, hkv, E, value_dim=Ev, dtype=self.dtype, group_size=gs)
        self.N, self.bs, self.hkv, self.hq, self.E, self.Ev, self.gs = N, bs, hkv, hkv * G, E, Ev, gs
        self.f64 = np.dtype(self.dtype) == np.float64 if not self.quant else False
        self.u = 2.0 ** -53 if self.f64 else 2.0 ** -24
        self.seqs = {}          # sid -> {"n", "blocks" (abstract ids), "k"/"v": stored rows, "ks"/"vs", "kd"/"vd"}
        self.next_block = 0

    # ---- the model

    def store(self, x):
        """new rows x (Hkv, T, D) float32/64 -> (stored, scales or None, values float64)"""
        if self.quant:
            q, s = pyattn.quantize(x, self.quant, group_size=self.gs)
            return q, s, pyattn.dequantize(q, s, dtype=self.quant, group_size=self.gs).astype(np.float64)
        y = x.astype(self.cache.k.dtype)
        return y, None, y.astype(np.float64)

    def holders(self, blk):
        return sum(blk in s["blocks"] for s in self.seqs.values())

    def live_blocks(self):
        return {b for s in self.seqs.values() for b in s["blocks"]}

    def pick(self, data, label):
        return data.draw(st.sampled_from(sorted(self.seqs)), label=label)

    # ---- rules

    @precondition(lambda self: len(self.seqs) < MAX_SEQS)
    @rule()
    def add(self):
        sid = self.cache.add_sequence()
        assert sid not in self.seqs and self.cache.length(sid) == 0
        z = lambda D: np.zeros((self.hkv, 0, D))   # noqa: E731
        self.seqs[sid] = {"n": 0, "blocks": [], "kd": z(self.E), "vd": z(self.Ev),
                          **{name: None if pool is None else np.empty((self.hkv, 0, pool.shape[3]), pool.dtype)
                             for name, pool in (("k", self.cache.k), ("v", self.cache.v),
                                                ("ks", self.cache.k_scale), ("vs", self.cache.v_scale))}}

    @precondition(lambda self: 0 < len(self.seqs) < MAX_SEQS)
    @rule(data=st.data())
    def fork(self, data):
        parent = self.pick(data, "parent")
        free = self.cache.blocks_free
        sid = self.cache.fork(parent)
        assert self.cache.blocks_free == free                      # nothing copied
        p = self.seqs[parent]
        self.seqs[sid] = {key: (list(x) if key == "blocks" else x) for key, x in p.items()}

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = self.pick(data, "freed")
        self.cache.free(sid)
        del self.seqs[sid]
        with pytest.raises(ValueError, match="not a live sequence"):
            self.cache.length(sid)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), causal=st.booleans(), want_lse=st.booleans(), seed=st.integers(0, 2 ** 32 - 1),
          window=st.none() | st.tuples(st.integers(0, 6), st.none() | st.integers(0, 3)),
          alibi=st.sampled_from([None, "heads", "sequences"]), sinks=st.booleans(),
          tree=st.sampled_from([None, (1, 1), (1, "h"), ("b", 1), ("b", "h")]))
    def attend(self, data, causal, want_lse, seed, window, alibi, sinks, tree):
        ids = data.draw(st.permutations(sorted(self.seqs)), label="order")
        ids = ids[:data.draw(st.integers(1, len(ids)), label="count")]
        big = data.draw(st.booleans(), label="long")           # now and then past the free blocks
        top = 3 * self.bs + 2 if big else self.bs + 1
        Ts = [data.draw(st.integers(0, top), label="T") for _ in ids]
        packed = len(set(Ts)) > 1 or data.draw(st.booleans(), label="packed")
        rng = np.random.default_rng(seed)
        ft = np.float64 if self.f64 else np.float32
        total = sum(Ts)
        q = rng.standard_normal((total, self.hq, self.E)).astype(ft)
        kn = rng.standard_normal((total, self.hkv, self.E)).astype(ft)
        vn = rng.standard_normal((total, self.hkv, self.Ev)).astype(ft) * 2
        if self.quant and total and rng.random() < 0.3:        # a zero row (its scales 0)
            kn[rng.integers(total)] = 0
        cu = np.concatenate([[0], np.cumsum(Ts)]).astype(np.int64)
        if packed:
            args = (q, kn, vn)
        else:
            T = Ts[0]
            args = tuple(x.reshape(len(ids), T, *x.shape[1:]).transpose(0, 2, 1, 3) for x in (q, kn, vn))

        # the model's blocks after the call (copy-on-write, the last writer in place)
        before_free = self.N - len(self.live_blocks())
        assert self.cache.blocks_free == before_free
        left, need, plans = {}, 0, []
        for s, t in zip(ids, Ts):
            sq = self.seqs[s]
            blocks = list(sq["blocks"])
            if t:
                for j in range(sq["n"] // self.bs, len(blocks)):
                    left.setdefault(blocks[j], self.holders(blocks[j]))
                    if left[blocks[j]] > 1:
                        left[blocks[j]] -= 1
                        blocks[j] = ("new", j)
                        need += 1
                while len(blocks) * self.bs < sq["n"] + t:
                    blocks.append(("new", len(blocks)))
                    need += 1
            plans.append(blocks)

        pools = [x.copy() for x in (self.cache.k, self.cache.v, self.cache.k_scale, self.cache.v_scale)
                 if x is not None]
        lengths = {s: self.cache.length(s) for s in self.seqs}
        kw = dict(is_causal=causal, return_lse=want_lse, window=window)
        slopes = None
        if alibi:                           # powers of two, as ALiBi's, (Hq,) or one row per sequence
            slopes = 2.0 ** -rng.integers(0, 6, (len(ids), self.hq) if alibi == "sequences" else self.hq)
            kw["alibi_slopes"] = slopes
        if sinks:
            sinks = rng.standard_normal(self.hq) * 2
            kw["sinks"] = sinks
        else:
            sinks = None
        if tree is not None:                # a token tree (its diagonal set: every row sees itself)
            Tm = max(Ts)
            tree = rng.random((len(ids) if tree[0] == "b" else 1, self.hq if tree[1] == "h" else 1, Tm, Tm)) < 0.5
            tree[..., np.arange(Tm), np.arange(Tm)] = True
            kw["tree_mask"] = tree
        if packed:
            kw["cu_seqlens_q"] = cu
        if need > before_free:
            with pytest.raises(pyattn.CacheFullError):
                self.cache.attend(ids, *args, **kw)
            now = [x for x in (self.cache.k, self.cache.v, self.cache.k_scale, self.cache.v_scale) if x is not None]
            assert all(bits_equal(a, b) for a, b in zip(now, pools)), "CacheFullError changed a pool"
            assert {s: self.cache.length(s) for s in self.seqs} == lengths
            assert self.cache.blocks_free == before_free
            event("attend: CacheFullError")
            return
        event(f"attend: {'packed' if packed else '4-D'}, {len(ids)} sequences"
              + (", a shared block written" if any(isinstance(x, tuple) for p in plans for x in p[:-1]) else ""))
        res = self.cache.attend(ids, *args, **kw)
        out, lse = res if want_lse else (res, None)
        if packed:
            assert out.shape == (total, self.hq, self.Ev)
            assert lse is None or lse.shape == (total, self.hq)
        else:
            assert out.shape == (len(ids), self.hq, Ts[0], self.Ev)
            out = out.transpose(0, 2, 1, 3).reshape(total, self.hq, self.Ev)
            if lse is not None:
                assert lse.shape == (len(ids), self.hq, Ts[0])
                lse = lse.transpose(0, 2, 1).reshape(total, self.hq)
        assert out.dtype == (np.float64 if self.f64 else np.float32)

        for i, (s, t) in enumerate(zip(ids, Ts)):
            sq = self.seqs[s]
            n = sq["n"]
            sl = slice(cu[i], cu[i + 1])
            new = dict(sq)
            for name, x in (("k", kn[sl]), ("v", vn[sl])) if t else ():
                st_, sc, val = self.store(x.transpose(1, 0, 2))
                new[name] = np.concatenate([sq[name], st_], axis=1)
                new[name + "s"] = None if sc is None else np.concatenate([sq[name + "s"], sc], axis=1)
                new[name + "d"] = np.concatenate([sq[name + "d"], val], axis=1)
            new["n"] = n + t
            new["blocks"] = []
            for b in plans[i]:                     # the new blocks' abstract ids
                if isinstance(b, tuple):
                    b, self.next_block = self.next_block, self.next_block + 1
                new["blocks"].append(b)
            if t:
                want, wlse, ob, lb = oracle(q[sl].transpose(1, 0, 2).astype(np.float64), new["kd"], new["vd"],
                                            n, causal, window,
                                            None if slopes is None else slopes[i] if slopes.ndim == 2 else slopes,
                                            sinks, None if tree is None else tree[i if tree.shape[0] > 1 else 0, :, :t, :t],
                                            1.0 / math.sqrt(self.E), self.u)
                got = out[sl].transpose(1, 0, 2).astype(np.float64)
                err = np.abs(got - want)
                assert (err <= ob[..., None]).all(), (
                    f"sequence {s} (n={n}, T={t}): output off by {err.max():.3e}, bound "
                    f"{ob[..., None].repeat(self.Ev, -1)[err > ob[..., None]].min():.3e}")
                if lse is not None:
                    lerr = np.abs(lse[sl].T.astype(np.float64) - wlse)
                    assert (lerr <= lb).all(), f"sequence {s}: lse off by {lerr.max():.3e}"
            self.seqs[s] = new

    # ---- invariants

    @invariant()
    def blocks_and_rows(self):
        if not hasattr(self, "cache"):
            return
        c = self.cache
        assert c.blocks_free == self.N - len(self.live_blocks())
        held = {}
        for s, sq in self.seqs.items():
            assert c.length(s) == sq["n"]
            blocks = c._seqs[s][0]
            assert len(blocks) == -(-sq["n"] // self.bs)
            for b in blocks:
                held[b] = held.get(b, 0) + 1
            for name, pool in (("k", c.k), ("v", c.v), ("ks", c.k_scale), ("vs", c.v_scale)):
                if pool is not None:
                    assert bits_equal(R.paged_rows(pool, np.asarray(blocks, np.int64), sq["n"]), sq[name]), (
                        f"sequence {s}: its {name} rows in the pool differ from what it wrote")
        assert c.blocks_free == self.N - len(held)
        assert sorted(c._free) == sorted(set(range(self.N)) - set(held))
        assert all(c._refs[b] == h for b, h in held.items()) and not c._refs[list(c._free)].any()


def _machine(dtype):
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    cls = type(f"PagedCache_{name}", (PagedCacheMachine,), {"dtype": dtype})
    cls.TestCase.settings = settings(max_examples=examples(40), stateful_step_count=25, deadline=None,
                                     derandomize=True, database=None,
                                     suppress_health_check=[HealthCheck.too_slow,
                                                            HealthCheck.filter_too_much])
    return name, cls.TestCase


for _dt in DTYPES:
    _name, _tc = _machine(_dt)
    globals()[f"TestPagedCache_{_name}"] = _tc
del _dt, _name, _tc

if ml_dtypes is None:
    def test_bfloat16_cache():
        pytest.skip("ml_dtypes (bfloat16 arrays) is not installed")
