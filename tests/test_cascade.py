"""Shared-prefix (cascade) reads (API.md wave 4, "Serving throughput"): a
paged decode call whose sequences hold the same blocks (forks) reads each
shared key tile once for all of them -- and its results are bit for bit those
of the same call with every sequence on blocks of its own (the same rows,
copied). Every cache dtype, block sizes that do and do not divide the key
tiles and chunks, GQA ratios, several query rows (causal), windows that
differ per sequence, 1 and 2 threads; PagedKVCache's forks with a
copy-on-write inside a block; the counter that says what was shared."""
import numpy as np
import pytest

import pyattn
from pyattn import _C

pytestmark = [pytest.mark.frame]

try:
    import ml_dtypes
    BF16 = [ml_dtypes.bfloat16]
except ImportError:            # optional: the bfloat16 cases need it
    BF16 = []

GS = 16                        # the quantized pools' group size


def shared_blocks():                 # block reads saved by shared reads, so far
    return _C.config()["shared_reads_saved"]


def rows(rng, n, Hkv, E, kind):
    """n key (or value) rows (n, Hkv, E') of a pool of kind, with their
    scales (n, Hkv, E / GS) for a quantized kind (else None)"""
    if kind == "int8":
        return (rng.integers(-127, 128, (n, Hkv, E), dtype=np.int8),
                rng.uniform(0.001, 0.02, (n, Hkv, E // GS)).astype(np.float32))
    if kind == "int4":
        return (rng.integers(0, 256, (n, Hkv, E // 2), dtype=np.uint8),
                rng.uniform(0.05, 0.3, (n, Hkv, E // GS)).astype(np.float32))
    if kind in ("fp8_e4m3", "fp8_e5m2"):
        return pyattn.quantize(rng.standard_normal((n, Hkv, E)).astype(np.float32), kind, group_size=GS)
    return rng.standard_normal((n, Hkv, E)).astype(kind), None


def pools(per_seq, tables, nblocks, bs):
    """A pool (nblocks, Hkv, bs, ...) holding sequence b's rows per_seq[b]
    (n_b, Hkv, ...) where its table says (rows of a block several sequences
    hold are the same in each), the unused rows filled with noise"""
    x = per_seq[0]
    pool = np.full((nblocks, x.shape[1], bs) + x.shape[2:], 3, x.dtype)
    for r, t in zip(per_seq, tables):
        j = np.arange(len(r))
        pool[t[j // bs], :, j % bs] = r
    return pool


def layouts(rng, B, Hkv, E, bs, prefix, owns, kind):
    """Sequences of prefix common rows and owns[b] rows of their own, as
    (k, v, k_scale, v_scale, table) twice: on shared blocks (the prefix's
    whole blocks held by all, the block where they diverge copied, as a
    fork's copy-on-write leaves it), and each on blocks of its own."""
    seqs = []
    common = [rows(rng, prefix, Hkv, E, kind) for _ in range(2)]
    for o in owns:
        own = [rows(rng, o, Hkv, E, kind) for _ in range(2)]
        seqs.append([(np.concatenate([c[0], w[0]]), None if c[1] is None else np.concatenate([c[1], w[1]]))
                     for c, w in zip(common, own)])
    lens = np.array([prefix + o for o in owns], np.int32)
    width = int(-(-lens.max() // bs)) + 1
    nsh = prefix // bs                                    # whole blocks of the prefix
    sh_t = np.full((B, width), -1, np.int64)
    un_t = np.full((B, width), -1, np.int64)
    nxt_sh, nxt_un = nsh, 0
    for b in range(B):
        need = int(-(-lens[b] // bs))
        sh_t[b, :nsh] = np.arange(nsh)
        sh_t[b, nsh:need] = nxt_sh + np.arange(need - nsh)
        nxt_sh += need - nsh
        un_t[b, :need] = nxt_un + np.arange(need)
        nxt_un += need
    S = width * bs                                        # the same rows as a contiguous cache
    cont = []
    for i in range(4):
        src = [s[i // 2][i % 2] for s in seqs]
        if src[0] is None:
            cont.append(None)
            continue
        c = np.zeros((B, Hkv, S) + src[0].shape[2:], src[0].dtype)
        for b, r in enumerate(src):
            c[b, :, :len(r)] = r.swapaxes(0, 1)
        cont.append(c)
    out = []
    for t, n in ((sh_t, nxt_sh + 2), (un_t, nxt_un + 2)):
        perm = rng.permutation(n)                         # blocks in any order
        t = np.where(t >= 0, perm[np.maximum(t, 0)], -1)
        k = pools([s[0][0] for s in seqs], t, n, bs)
        v = pools([s[1][0] for s in seqs], t, n, bs)
        ks = vs = None
        if seqs[0][0][1] is not None:
            ks = pools([s[0][1] for s in seqs], t, n, bs)
            vs = pools([s[1][1] for s in seqs], t, n, bs)
        out.append((k, v, ks, vs, t))
    return out[0], out[1], lens, (cont[0], cont[2], cont[1], cont[3], None)


CASES = [
    # kind, bs, Hq, Hkv, T, window, threads, prefix
    (np.float32, 16, 8, 2, 1, None, 1, 4800),
    (np.float32, 16, 8, 2, 1, None, 2, 4800),
    (np.float32, 48, 2, 2, 1, None, 2, 4500),
    (np.float32, 256, 16, 2, 1, None, 1, 4700),
    (np.float32, 16, 4, 1, 3, None, 2, 4400),
    (np.float32, 16, 8, 2, 2, (1500, 0), 1, 4400),
    (np.float32, 7, 3, 3, 1, (2500, 0), 2, 4300),
    (np.float64, 16, 8, 2, 1, None, 2, 4400),
    (np.float64, 32, 2, 1, 2, None, 1, 4400),
    (np.float16, 16, 8, 2, 1, None, 2, 4400),
    (np.float16, 64, 4, 4, 1, (3000, 0), 1, 4400),
    ("int8", 16, 8, 2, 1, None, 2, 4800),
    ("int8", 48, 4, 1, 2, None, 1, 4400),
    ("int4", 16, 8, 2, 1, None, 2, 4800),
    ("int4", 128, 2, 2, 1, (2000, 0), 1, 4400),
] + [(bf, 16, 8, 2, 1, None, 2, 4400) for bf in BF16] + (
    [("fp8_e4m3", 16, 8, 2, 1, None, 2, 4800), ("fp8_e5m2", 48, 4, 1, 2, (2000, 0), 1, 4400)] if BF16 else [])


@pytest.mark.parametrize("kind,bs,Hq,Hkv,T,window,threads,prefix", CASES)
def test_shared_reads_equal_unshared(rng, kind, bs, Hq, Hkv, T, window, threads, prefix):
    B, E = 5, 32
    owns = [40 + 23 * b for b in range(B)]                # lengths differ: rules per sequence
    sh, un, lens, cont = layouts(rng, B, Hkv, E, bs, prefix, owns, kind)
    qdt = np.float64 if kind is np.float64 else np.float32
    q = rng.standard_normal((B, Hq, T, E)).astype(qdt)

    def call(lay):
        k, v, ks, vs, t = lay
        return pyattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=t, k_scale=ks,
                                             v_scale=vs, window=window, return_lse=True)

    old = pyattn.get_num_threads()
    pyattn.set_num_threads(threads)
    try:
        c0 = shared_blocks()
        o_sh, l_sh = call(sh)
        c1 = shared_blocks()
        o_un, l_un = call(un)
        c2 = shared_blocks()
        o_c, l_c = call(cont)              # a contiguous cache: nothing shared
        c3 = shared_blocks()
    finally:
        pyattn.set_num_threads(old)
    # on blocks of their own, only the query heads of a key/value head that
    # are not stacked as rows (T > 1 with GQA) share their reads
    assert c1 - c0 > c2 - c1, "the shared blocks were not read once"
    assert c2 - c1 == 0 or (T > 1 and Hq > Hkv)
    assert c3 == c2
    assert np.isfinite(o_sh).all()
    np.testing.assert_array_equal(o_sh, o_un)
    np.testing.assert_array_equal(l_sh, l_un)
    np.testing.assert_array_equal(o_sh, o_c)
    np.testing.assert_array_equal(l_sh, l_c)


def test_shared_reads_thread_independent(rng):
    B, Hq, Hkv, E, bs = 6, 8, 2, 32, 16
    sh, _, lens, _ = layouts(rng, B, Hkv, E, bs, 6200, [10 * b + 1 for b in range(B)], np.float32)
    q = rng.standard_normal((B, Hq, 1, E)).astype(np.float32)
    k, v, _, _, t = sh
    outs = []
    old = pyattn.get_num_threads()
    try:
        for n in (1, 2, 3):
            pyattn.set_num_threads(n)
            outs.append(pyattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=t))
    finally:
        pyattn.set_num_threads(old)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_one_sequence_alone_equals_its_share(rng):
    """A sequence's rows do not depend on who else shares its blocks: alone
    (no sharing) or in the shared call, the same bits"""
    B, Hq, Hkv, E, bs = 4, 4, 2, 32, 16
    sh, _, lens, _ = layouts(rng, B, Hkv, E, bs, 4500, [5, 9, 70, 3], np.float32)
    k, v, _, _, t = sh
    q = rng.standard_normal((B, Hq, 1, E)).astype(np.float32)
    full = pyattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=t)
    for b in range(B):
        one = pyattn.attention_with_kvcache(q[b:b + 1], k, v, cache_seqlens=lens[b:b + 1],
                                            block_table=t[b:b + 1])
        np.testing.assert_array_equal(one[0], full[b])


@pytest.mark.parametrize("dtype", [np.float32, "int8"])
def test_paged_cache_forks_share_reads(rng, dtype):
    """PagedKVCache: a prompt, forks that diverge inside its last block
    (copy-on-write) and write a few tokens each; a decode step for all of
    them equals the same step on a cache where each sequence was written on
    its own (nothing shared), and the counter says blocks were shared."""
    Hq, Hkv, E, bs, P, nf = 4, 2, 32, 16, 4100, 4
    kw = dict(num_blocks=2 * (P // bs + 8) * (nf + 1), block_size=bs, num_kv_heads=Hkv, head_dim=E,
              dtype=dtype, group_size=GS)
    q0, k0, v0 = (rng.standard_normal((1, h, P, E)).astype(np.float32) for h in (Hq, Hkv, Hkv))
    own = [tuple(rng.standard_normal((1, h, 3 + i, E)).astype(np.float32) for h in (Hq, Hkv, Hkv))
           for i in range(nf)]
    step = [rng.standard_normal((nf, h, 1, E)).astype(np.float32) for h in (Hq, Hkv, Hkv)]

    forked = pyattn.PagedKVCache(**kw)
    root = forked.add_sequence()
    forked.attend([root], q0, k0, v0)
    fs = [forked.fork(root) for _ in range(nf)]
    for s, (q, k, v) in zip(fs, own):
        forked.attend([s], q, k, v)
    alone = pyattn.PagedKVCache(**kw)
    al = []
    for q, k, v in own:
        s = alone.add_sequence()
        alone.attend([s], q0, k0, v0)
        alone.attend([s], q, k, v)
        al.append(s)
    c0 = shared_blocks()
    a = forked.attend(fs, *step)
    c1 = shared_blocks()
    b = alone.attend(al, *step)
    assert shared_blocks() == c1 > c0
    np.testing.assert_array_equal(a, b)


def test_show_config_reports_shared_reads(capsys):
    pyattn.show_config()
    assert "shared reads" in capsys.readouterr().out
