"""Plans for a step of a PagedKVCache (issue 38, item 2; pyattn/_paged.py,
PagedPlan): a plan made once per step and run by the caches of every layer
gives the unplanned call's result bit for bit (outputs, lse, pools and the
caches' bookkeeping), across layers and steps, with forks (copy-on-write),
packed steps, trees and every cache dtype; a plan used with other sequences,
tokens, offsets, or a cache in another state is a clear error that writes
nothing; the nn layers take it. The Hugging Face backend (pyattn/
transformers.py) derives a call once per step for every layer, bit for bit
the call derived anew."""
import numpy as np
import pytest

import pyattn
from pyattn import _kvfast
from pyattn.nn import MultiHeadAttention

pytestmark = pytest.mark.frame

try:
    import ml_dtypes
except ImportError:                     # the bfloat16 cache alone is skipped
    ml_dtypes = None

DTYPES = [np.float32, np.float64, np.float16, "int8", "int4"] + (
    [ml_dtypes.bfloat16, "fp8_e4m3", "fp8_e5m2"] if ml_dtypes else [])


def bits_equal(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def state(c):
    """Everything a PagedKVCache holds: pools (bits) and bookkeeping."""
    pools = [x.copy() for x in (c.k, c.v, c.k_scale, c.v_scale) if x is not None]
    return pools, {s: (list(b), n) for s, (b, n) in c._seqs.items()}, list(c._free), c._refs.copy(), c._next


def same_state(a, b):
    pa, sa, fa, ra, na = a
    pb, sb, fb, rb, nb = b
    return (len(pa) == len(pb) and all(bits_equal(x, y) for x, y in zip(pa, pb)) and sa == sb and fa == fb
            and np.array_equal(ra, rb) and na == nb)


def make(n, dtype=np.float32, num_blocks=24, block_size=4, Hkv=2, E=8):
    return [pyattn.PagedKVCache(num_blocks, block_size, Hkv, E, dtype=dtype, group_size=4) for _ in range(n)]


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def qkv(rng, B, T, Hq=4, Hkv=2, E=8, packed_total=None):
    if packed_total is not None:
        return (rand(rng, (packed_total, Hq, E)), rand(rng, (packed_total, Hkv, E)),
                rand(rng, (packed_total, Hkv, E)))
    return rand(rng, (B, Hq, T, E)), rand(rng, (B, Hkv, T, E)), rand(rng, (B, Hkv, T, E))


def equal_results(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(bits_equal(x, y) for x, y in zip(a, b))
    return bits_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d if isinstance(d, str) else np.dtype(d).name)
def test_layers_and_steps_bit_for_bit(dtype):
    """Three layers' caches stepped with one plan per step, beside three twins
    stepped without plans: the same outputs, lse, pools and bookkeeping after
    every call, through prompts, decode steps, a fork (copy-on-write), a
    packed step and a freed sequence."""
    rng = np.random.default_rng(0)
    L = 3
    planned, twins = make(L, dtype), make(L, dtype)
    for cs in (planned, twins):
        assert [c.add_sequence() for c in cs] == [0] * L
        assert [c.add_sequence() for c in cs] == [1] * L
    seqs = [0, 1]
    steps = [("T", 3), ("T", 1), ("fork", 1), ("T", 1), ("cu", [0, 2, 2, 3]), ("T", 2), ("free", 0), ("T", 1)]
    for what, arg in steps:
        if what == "fork":
            for cs in (planned, twins):
                assert len({c.fork(arg) for c in cs}) == 1
            seqs = seqs + [2]
            continue
        if what == "free":
            for cs in (planned, twins):
                for c in cs:
                    c.free(arg)
            seqs = [s for s in seqs if s != arg]
            continue
        kw = {"return_lse": True} if what == "cu" else {}
        if what == "T":
            plan = planned[0].plan(seqs, new_tokens=arg)
            assert plan.new_tokens == arg and plan.cu_seqlens_q is None
        else:
            plan = planned[0].plan(seqs, cu_seqlens_q=arg)
            kw["cu_seqlens_q"] = np.array(arg)
        assert plan.seqs == tuple(seqs)
        for layer in range(L):
            q, k, v = qkv(rng, len(seqs), arg, packed_total=arg[-1] if what == "cu" else None)
            args = [a.copy() for a in (q, k, v)]
            got = planned[layer].attend(plan.seqs, q, k, v, plan=plan, **kw)
            want = twins[layer].attend(seqs, q, k, v, **kw)
            assert equal_results(got, want), (what, arg, layer)
            assert all(bits_equal(a, b) for a, b in zip(args, (q, k, v)))       # inputs unchanged
            assert same_state(state(planned[layer]), state(twins[layer]))
    for c in planned + twins:
        assert c.blocks_free == planned[0].blocks_free


def test_equals_attention_with_kvcache_on_the_pools():
    """A planned step is attention_with_kvcache over the pools with the
    plan's block table and lengths (the plan's arrays, as documented)."""
    rng = np.random.default_rng(1)
    (c,) = make(1)
    a, b = c.add_sequence(), c.add_sequence()
    c.attend([a, b], *qkv(rng, 2, 5))
    plan = c.plan([b, a], new_tokens=1)
    q, k, v = qkv(rng, 2, 1)
    kp, vp = c.k.copy(), c.v.copy()
    want = pyattn.attention_with_kvcache(q, kp, vp, k, v, cache_seqlens=plan.cache_seqlens,
                                         block_table=plan.block_table)
    assert bits_equal(c.attend(plan.seqs, q, k, v, plan=plan), want)
    assert bits_equal(c.k, kp) and bits_equal(c.v, vp)
    assert plan.cache_seqlens.tolist() == [5, 5]
    assert not plan.block_table.flags.writeable and not plan.cache_seqlens.flags.writeable


@pytest.mark.parametrize("kw", [dict(is_causal=False), dict(window=(2, 0)), dict(softcap=5.0), dict(scale=0.3),
                                dict(return_lse=True), dict(precision="bf16"), dict(alibi_slopes=[0.5] * 4),
                                dict(sinks=[0.1] * 4), "out", "tree"])
def test_keywords(kw):
    """Every keyword of attend, with a plan: the unplanned result, bit for bit."""
    rng = np.random.default_rng(2)
    planned, twins = make(2), make(2)
    for cs in (planned, twins):
        for c in cs:
            c.add_sequence(), c.add_sequence()
            c.attend([0, 1], *qkv(np.random.default_rng(3), 2, 6))
    T = 3 if kw == "tree" else 1
    plan = planned[0].plan([0, 1], new_tokens=T)
    for layer in range(2):
        q, k, v = qkv(rng, 2, T)
        if kw == "out":
            o1, o2 = np.full((2, 4, T, 8), np.nan, np.float32), np.full((2, 4, T, 8), np.nan, np.float32)
            r1 = planned[layer].attend([0, 1], q, k, v, plan=plan, out=o1)
            r2 = twins[layer].attend([0, 1], q, k, v, out=o2)
            assert r1 is o1 and r2 is o2
        else:
            extra = dict(tree_mask=np.tril(np.ones((1, 1, T, T), bool))[..., ::-1, :]) if kw == "tree" else kw
            r1 = planned[layer].attend([0, 1], q, k, v, plan=plan, **extra)
            r2 = twins[layer].attend([0, 1], q, k, v, **extra)
        assert equal_results(r1, r2)
        assert same_state(state(planned[layer]), state(twins[layer]))


def test_fast_path_taken():
    """After a layer's first call of a signature, the planned calls run the
    kernel call of the signature's memo (pyattn/_kvfast.py)."""
    rng = np.random.default_rng(4)
    caches = make(4)
    for c in caches:
        c.add_sequence()
    for step in range(3):
        plan = caches[0].plan([0], new_tokens=1)
        before = _kvfast.stats["fast"]
        for c in caches:
            c.attend([0], *qkv(rng, 1, 1), plan=plan)
        if step:
            assert _kvfast.stats["fast"] - before == len(caches)


def test_plan_used_twice_or_stale_is_an_error_that_writes_nothing():
    rng = np.random.default_rng(5)
    (c,) = make(1)
    a = c.add_sequence()
    plan = c.plan([a], new_tokens=2)
    c.attend([a], *qkv(rng, 1, 2), plan=plan)
    before = state(c)
    with pytest.raises(ValueError, match=r"plan: the cache is not in the state .*sequence 0 has 2 rows"):
        c.attend([a], *qkv(rng, 1, 2), plan=plan)
    assert same_state(state(c), before)
    plan2 = c.plan([a])                             # a later change to the cache: the plan is stale
    b = c.fork(a)
    before = state(c)
    with pytest.raises(ValueError, match=r"plan: .*block 0, which the step writes, has 2 holders; the plan "
                                         r"was made when it had 1"):
        c.attend([a], *qkv(rng, 1, 1), plan=plan2)
    assert same_state(state(c), before)
    c.free(b)                                       # back to the state plan2 was made from, by another path
    out = c.attend([a], *qkv(np.random.default_rng(6), 1, 1), plan=plan2)
    (twin,) = make(1)
    twin.add_sequence()
    twin.attend([0], *qkv(np.random.default_rng(5), 1, 2))
    assert bits_equal(out, twin.attend([0], *qkv(np.random.default_rng(6), 1, 1)))


def test_other_history_same_state_runs_and_other_state_refuses():
    """A cache that reached the plan's state by another path runs it (checked
    entry by entry); one whose sequences, holders or free blocks differ is
    refused, naming what differs."""
    rng = np.random.default_rng(7)
    p, q_ = make(2)
    p.add_sequence()
    q_.add_sequence()
    p.attend([0], *qkv(rng, 1, 3))
    q_.attend([0], *qkv(rng, 1, 2))
    q_.attend([0], *qkv(rng, 1, 1))                 # 3 rows too, in one block
    assert p._stamp != q_._stamp
    plan = p.plan([0])
    (twin,) = make(1)
    twin.add_sequence()
    twin.attend([0], *qkv(rng, 1, 3))
    x = qkv(rng, 1, 1)
    assert bits_equal(q_.attend([0], *x, plan=plan), pyattn.attention_with_kvcache(
        x[0], q_.k, q_.v, cache_seqlens=4, block_table=plan.block_table))
    # holders differ: three holders of block 0 here, two there
    r, s = make(2)
    for c in (r, s):
        c.add_sequence()
        c.attend([0], *qkv(rng, 1, 3))
        c.fork(0)
    r.fork(0)
    s.add_sequence()                                # the same ids, another history
    plan = r.plan([0])
    before = state(s)
    with pytest.raises(ValueError, match=r"plan: .*block 0, which the step writes, has 2 holders; the plan was "
                                         r"made when it had 3"):
        s.attend([0], *qkv(rng, 1, 1), plan=plan)
    assert same_state(state(s), before)
    # free blocks differ
    u, w = make(2)
    for c in (u, w):
        c.add_sequence()
    w.add_sequence()
    w.attend([1], *qkv(rng, 1, 1))                  # takes block 0 in w: not free there
    plan = u.plan([0], new_tokens=1)
    assert plan.block_table.tolist() == [[0]]
    before = state(w)
    with pytest.raises(ValueError, match=r"plan: .*the free blocks differ from the plan's \(it takes \[0\]\)"):
        w.attend([0], *qkv(rng, 1, 1), plan=plan)
    assert same_state(state(w), before)
    w.free(1)                                       # block 0 back, at the end of w's free list: the plan's state
    w.attend([0], *qkv(rng, 1, 1), plan=plan)
    assert w.length(0) == 1
    # not a live sequence; another geometry
    v1, v2 = make(2)
    v1.add_sequence()
    plan = v1.plan([0])
    with pytest.raises(ValueError, match=r"plan: .*sequence 0 is not a live sequence of it"):
        v2.attend([0], *qkv(rng, 1, 1), plan=plan)
    (g,) = make(1, block_size=8)
    g.add_sequence()
    with pytest.raises(ValueError, match=r"plan: .*24 blocks of 8 rows; the plan was made for 24 blocks of 4"):
        g.attend([0], *qkv(rng, 1, 1), plan=plan)


def test_arguments_other_than_the_plans():
    rng = np.random.default_rng(8)
    (c,) = make(1)
    a, b = c.add_sequence(), c.add_sequence()
    plan = c.plan([a, b], new_tokens=2)
    before = state(c)
    bad = [
        (dict(seqs=[b, a]), ValueError, r"seqs is \[1, 0\], but the plan was made for seqs \[0, 1\]"),
        (dict(seqs=0), TypeError, r"seqs must be a sequence"),
        (dict(seqs=None), TypeError, r"seqs must be a sequence of sequence ids \(a list\), got NoneType"),
        (dict(T=1), ValueError, r"query has shape \(2, 4, 1, 8\); the plan was made for 2 sequences of 2 new tokens"),
        (dict(B=1), ValueError, r"query has shape \(1, 4, 2, 8\); the plan was made for 2 sequences"),
        (dict(Tk=3), ValueError, r"key has shape \(2, 2, 3, 8\)"),
        (dict(cu=[0, 1, 2]), ValueError, r"cu_seqlens_q is given, but the plan was made for new_tokens=2"),
        (dict(plan="x"), TypeError, r"plan must be a PagedPlan"),
        (dict(kw={"block_table": plan.block_table}), TypeError, r"takes no block_table"),
        (dict(E=4), ValueError, r"query"),           # the kernel call's own check
    ]
    for spec, err, msg in bad:
        B, T = spec.get("B", 2), spec.get("T", 2)
        q, k, v = qkv(rng, B, T, E=spec.get("E", 8))
        if "Tk" in spec:
            k, v = qkv(rng, B, spec["Tk"])[1:]
        kw = dict(spec.get("kw", {}))
        if "cu" in spec:
            kw["cu_seqlens_q"] = spec["cu"]
        with pytest.raises(err, match=msg):
            c.attend(spec.get("seqs", [a, b]), q, k, v, plan=spec.get("plan", plan), **kw)
        assert same_state(state(c), before), spec
    # the plan survives the refused calls: the cache never moved
    c.attend([a, b], *qkv(rng, 2, 2), plan=plan)
    assert c.length(a) == c.length(b) == 2
    # a packed plan
    cu = np.array([0, 3, 4])
    plan = c.plan([a, b], cu_seqlens_q=cu)
    before = state(c)
    for kw, q in ((dict(cu_seqlens_q=[0, 2, 4]), rand(rng, (4, 4, 8))), ({}, rand(rng, (5, 4, 8))),
                  ({}, rand(rng, (1, 4, 4, 8)))):
        with pytest.raises(ValueError, match=r"cu_seqlens_q is \[0, 2, 4\], but|plan was made for a packed step "
                                             r"of 4 tokens"):
            c.attend([a, b], q, rand(rng, (4, 2, 8)), rand(rng, (4, 2, 8)), plan=plan, **kw)
        assert same_state(state(c), before)
    q, k, v = qkv(rng, 2, 0, packed_total=4)
    out = c.attend([a, b], q, k, v, plan=plan, cu_seqlens_q=cu)
    assert out.shape == (4, 4, 8) and (c.length(a), c.length(b)) == (5, 3)


def test_plan_arguments():
    (c,) = make(1, num_blocks=2, block_size=4)
    a = c.add_sequence()
    with pytest.raises(TypeError, match="seqs must be a sequence"):
        c.plan(a)
    with pytest.raises(TypeError, match="seqs must be a sequence of sequence ids .a list., got float"):
        c.plan(1.5)
    with pytest.raises(ValueError, match="seqs has a repeated sequence id"):
        c.plan([a, a])
    with pytest.raises(ValueError, match="seqs entry 5 is not a live sequence"):
        c.plan([5])
    with pytest.raises(ValueError, match="new_tokens must be >= 0"):
        c.plan([a], new_tokens=-1)
    with pytest.raises(TypeError, match="new_tokens must be an integer, got the bool"):
        c.plan([a], new_tokens=True)
    with pytest.raises(TypeError, match="new_tokens .* or cu_seqlens_q .*not both"):
        c.plan([a], new_tokens=1, cu_seqlens_q=[0, 1])
    with pytest.raises(ValueError, match="cu_seqlens_q has shape"):
        c.plan([a], cu_seqlens_q=[0, 1, 2])
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        c.plan([a, c.add_sequence()], cu_seqlens_q=[0, 2, 1])
    with pytest.raises(TypeError, match="cu_seqlens_q must be an integer array"):
        c.plan([a], cu_seqlens_q=[0.0, 1.0])
    with pytest.raises(TypeError, match="made by PagedKVCache.plan"):
        pyattn._paged.PagedPlan()
    before = state(c)
    with pytest.raises(pyattn.CacheFullError, match="needs 3 free blocks, 2 are free"):
        c.plan([a], new_tokens=9)
    assert same_state(state(c), before)
    plan = c.plan([a], new_tokens=0)                # nothing new: nothing taken
    assert plan.block_table.shape == (1, 1) and plan.block_table[0, 0] == -1
    assert repr(plan) == "PagedPlan(seqs=(0,), new_tokens=0, blocks_taken=0, blocks_copied=0)"
    assert repr(c.plan([a])) == "PagedPlan(seqs=(0,), new_tokens=1, blocks_taken=1, blocks_copied=0)"


def test_error_in_the_kernel_call_puts_copies_back():
    """A step that copies a shared block and then fails (here: a NaN key into
    an int8 pool) leaves the pools and bookkeeping as they were; the plan
    then still runs."""
    rng = np.random.default_rng(9)
    (c,) = make(1, dtype="int8")
    a = c.add_sequence()
    c.attend([a], *qkv(rng, 1, 2))
    b = c.fork(a)
    plan = c.plan([b])
    assert len(plan._copies) == 1
    before = state(c)
    q, k, v = qkv(rng, 1, 1)
    k[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        c.attend([b], q, k, v, plan=plan)
    assert same_state(state(c), before)
    k[0, 0, 0, 0] = 1.0
    c.attend([b], q, k, v, plan=plan)
    assert c.length(b) == 3 and c.length(a) == 2


def test_nn_layers_share_a_plan():
    """MultiHeadAttention layers, one PagedKVCache each, one plan per step:
    the outputs of the unplanned calls, bit for bit; a plan's own seqs and
    cu_seqlens_q are the defaults; context_length is checked from the plan."""
    rng = np.random.default_rng(10)
    layers = [MultiHeadAttention(16, 16, 2, context_length=8, rng=i).eval() for i in range(2)]
    planned = [pyattn.PagedKVCache(16, 4, 2, 8) for _ in layers]
    twins = [pyattn.PagedKVCache(16, 4, 2, 8) for _ in layers]
    for cs in (planned, twins):
        for c in cs:
            c.add_sequence(), c.add_sequence()
    for T, cu in ((3, None), (1, None), (None, [0, 2, 3])):
        plan = planned[0].plan([0, 1], new_tokens=T) if cu is None else planned[0].plan([0, 1], cu_seqlens_q=cu)
        x = rand(rng, (2, T, 16) if cu is None else (cu[-1], 16))
        y1 = y2 = x
        for layer, c1, c2 in zip(layers, planned, twins):
            y1 = layer(y1, cache=c1, plan=plan)
            y2 = layer(y2, cache=c2, seqs=[0, 1], cu_seqlens_q=cu)
            assert bits_equal(y1, y2)
    plan = planned[0].plan([0, 1], new_tokens=3)     # 6 + 3 > context_length = 8
    with pytest.raises(ValueError, match="sequence 0 holds 6 tokens; 3 more exceed context_length=8"):
        layers[0](rand(rng, (2, 3, 16)), cache=planned[0], plan=plan)
    with pytest.raises(TypeError, match="plan goes with cache=pyattn.PagedKVCache"):
        layers[0](rand(rng, (2, 1, 16)), cache=layers[0].new_cache(2, 8), plan=plan)


def test_unplanned_calls_of_caches_in_lockstep_share_one_plan(monkeypatch):
    """attend without plan= on the caches of several layers (in the same
    state, the same seqs and token counts) makes the step's plan once; a
    cache in another state, or other tokens, makes its own."""
    made = []
    real = pyattn._paged.PagedPlan._make.__func__

    def counting(cls, *a):
        made.append(a[1])
        return real(cls, *a)

    monkeypatch.setattr(pyattn._paged.PagedPlan, "_make", classmethod(counting))
    rng = np.random.default_rng(11)
    caches, twins = make(3), make(3)
    for c in caches + twins:
        c.add_sequence(), c.add_sequence()
    for T, cu in ((2, None), (1, None), (None, [0, 1, 3]), (None, np.array([0, 1, 3]))):
        del made[:]
        for c, t in zip(caches, twins):
            x = qkv(rng, 2, T, packed_total=None if cu is None else 3)
            plan = t.plan([0, 1], new_tokens=T) if cu is None else t.plan([0, 1], cu_seqlens_q=cu)
            assert equal_results(c.attend([0, 1], *x, cu_seqlens_q=cu), t.attend((0, 1), *x, plan=plan))
        assert len(made) == 1 + len(twins), (T, cu)    # one for the three caches, one per explicit plan
    caches[1].fork(0)                                 # caches[1] leaves the lockstep
    del made[:]
    for c in caches:
        c.attend([0, 1], *qkv(rng, 2, 1))
    assert len(made) == 2



def test_stamps_forgotten_then_checked_entry_by_entry(monkeypatch):
    """With the stamps' memo forgetting often (a tiny one), caches in lockstep
    may carry different stamps for equal states: a plan then runs on them by
    its entry-by-entry check, still bit for bit, and still refuses a cache
    in another state."""
    from pyattn import _paged
    monkeypatch.setattr(_paged, "_STAMP_MEMO_MAX", 2)
    rng = np.random.default_rng(12)
    planned, twins = make(3), make(3)
    for step in range(6):
        for cs in (planned, twins):
            for c in cs:
                c.add_sequence()
                for _ in range(3):                      # churn the memo between the layers' calls
                    _paged._stamp_after(object(), "x")
        seqs = list(range(step + 1))
        plan = planned[0].plan(seqs, new_tokens=2)
        for c, t in zip(planned, twins):
            x = qkv(rng, len(seqs), 2)
            assert equal_results(c.attend(seqs, *x, plan=plan), t.attend(seqs, *x))
            assert same_state(state(c), state(t))
    planned[1].fork(0)                              # another state, but not where the step reads
    plan = planned[0].plan([0])
    planned[1].attend([0], *qkv(rng, 1, 1), plan=plan)
    planned[2].free(5)                              # its blocks back on the free list: the step's block differs
    with pytest.raises(ValueError, match=r"plan: .*the free blocks differ"):
        planned[2].attend([0], *qkv(rng, 1, 1), plan=plan)


# ---- the Hugging Face backend: one plan per step, reused by the layers (pyattn/transformers.py) ------

def _tiny_llama(layers=4, dtype=None):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import pyattn.transformers  # noqa: F401  (registers "pyattn")
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    if dtype is not None:
        m = m.to(dtype)
    m.set_attn_implementation("pyattn")
    return torch, m


@pytest.mark.nofamily
@pytest.mark.nosan
@pytest.mark.parametrize("padded", [False, True])
def test_hf_backend_plans_once_per_step(monkeypatch, padded):
    """Greedy generation with attn_implementation="pyattn": the calls of a
    step's layers share one derivation (a plan per step, not per layer), and
    the scores equal, bit for bit, those of a run that derives every call."""
    torch, m = _tiny_llama()
    import pyattn.transformers as pht
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    am = torch.ones_like(ids)
    if padded:
        am[1, :3] = 0                               # left padding: a key-padding row in every step
    derived = []
    real = pht._derive

    def counting(*a, **k):
        derived.append(1)
        return real(*a, **k)

    monkeypatch.setattr(pht, "_derive", counting)

    def generate():
        del pht._steps[:]
        del derived[:]
        with torch.no_grad():
            g = m.generate(ids, attention_mask=am, max_new_tokens=6, do_sample=False, output_scores=True,
                           return_dict_in_generate=True, pad_token_id=0)
        return g.sequences, torch.stack(g.scores), len(derived)

    seq, scores, n = generate()
    assert n <= 1 + 6, n                              # the prefill and each decode step: one plan each
    monkeypatch.setattr(pht, "_step_key", lambda *a: object())      # no plan found: every call derives
    seq2, scores2, n2 = generate()
    assert n2 == 4 * 6
    assert torch.equal(seq, seq2) and torch.equal(scores, scores2)


@pytest.mark.nofamily
@pytest.mark.nosan
def test_hf_step_plan_bit_for_bit_and_keyed_by_the_mask():
    """attention_forward through a step's plan equals pyattn.torch's call on
    the same tensors (the decode call without a mask, with a key-padding
    mask, a prefill), for each dtype; a plan is found again only for the same
    mask in the same version and the same shapes and options."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import pyattn.transformers as pht
    from pyattn import torch as pt
    mod = torch.nn.Module()
    g = torch.Generator().manual_seed(2)
    dtypes = [torch.float32, torch.float64, torch.float16] + ([torch.bfloat16] if ml_dtypes else [])
    for dt in dtypes:
        q = torch.randn(2, 4, 1, 8, generator=g).to(dt)
        k, v = (torch.randn(2, 2, 5, 8, generator=g).to(dt) for _ in range(2))
        want = pt.scaled_dot_product_attention(q.reshape(2, 2, 2, 8), k, v, scale=0.3).reshape(2, 1, 4, 8)
        for _ in range(3):                            # derived, then found twice
            got, w = pht.attention_forward(mod, q, k, v, None, scaling=0.3)
            assert w is None and got.dtype == dt and torch.equal(got, want)
        pad = torch.ones(2, 1, 1, 5, dtype=torch.bool)
        pad[0, ..., :2] = False
        want = pt.scaled_dot_product_attention(q.reshape(2, 2, 2, 8), k, v, pad, scale=0.3).reshape(2, 1, 4, 8)
        for _ in range(2):
            assert torch.equal(pht.attention_forward(mod, q, k, v, pad, scaling=0.3)[0], want)
        qp = torch.randn(2, 4, 5, 8, generator=g).to(dt)
        want = pt.scaled_dot_product_attention(qp, k, v, is_causal="bottom_right", scale=0.3, enable_gqa=True)
        for _ in range(2):
            assert torch.equal(pht.attention_forward(mod, qp, k, v, None, scaling=0.3)[0], want.transpose(1, 2))
    # the mask's identity and version are part of a plan's key
    q = torch.randn(1, 4, 3, 8, generator=g)
    k = v = torch.randn(1, 2, 3, 8, generator=g)
    causal = torch.tril(torch.ones(3, 3, dtype=torch.bool))[None, None]
    a = pht.attention_forward(mod, q, k, v, causal, scaling=0.3)[0]
    causal[..., 2, 0] = False                         # changed in place: another mask, found by its version
    b = pht.attention_forward(mod, q, k, v, causal, scaling=0.3)[0]
    assert torch.equal(b, pt.scaled_dot_product_attention(q, k, v, causal, scale=0.3, enable_gqa=True)
                       .transpose(1, 2))
    assert not torch.equal(a, b)
