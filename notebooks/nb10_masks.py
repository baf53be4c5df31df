"""Notebook 10_masks's cells (issue #26): masks as functions, pyattn.BlockMask.

Kept apart from build_notebooks.py (which imports it) so that notebooks
written at the same time do not edit the same lines; cells(SETUP, CPU_NAME, BEST)
gives the list of (kind, source) build_notebooks.py expects (CPU_NAME and BEST: the
timing helpers' sources that build_notebooks.py shares between notebooks).
"""


def cells(SETUP, CPU_NAME, BEST):
    return [
("md", """# 10 · Masks as functions: `pyattn.BlockMask`

Attention patterns are rarely just causal-or-nothing: packed training runs several
documents in one sequence (a token sees only its own document), prefix-LM models read their
prompt both ways and answer causally, Llama 4 attends causally within chunks, sliding
windows cap the cost of long sequences. PyTorch's FlexAttention lets you write such a mask
as a small function `mask_mod(b, h, q_idx, kv_idx) -> bool` and builds a **block mask** from
it: a map of tiles that says which tiles of the score matrix are empty (skipped), full (no
mask test) or partial (tested element by element).

pyattn does the same without a compiler: `pyattn.BlockMask.from_mask_mod(mask_mod, B, H, L, S)`
evaluates a *vectorised* NumPy `mask_mod` tile by tile, and `block_mask=` makes the kernels
skip every empty tile, in the forward and the backward. `pyattn.masks` holds the common
masks, built in closed form (no Python call per tile).

This notebook draws each ready-made mask as its tile map and its dense mask, times it
against the same mask given as a dense bool array and against the ideal (the unmasked time
× the share of non-empty tiles), trains a small model on packed documents and checks that
the loss is the one of training the documents one by one, and rewrites FlexAttention's
examples for pyattn, compared with PyTorch's `flex_attention` when PyTorch is installed.

**The timings are illustrative**: they are measured when this notebook runs (one thread,
small shapes) on the CPU named in the figures; re-running the notebook re-measures them.
`benchmarks/bench.py` measures the issue's full-size targets."""),
("code", SETUP + """import os, platform, time, warnings
from pyattn import masks
try:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    torch.set_num_threads(1)
except ImportError:
    torch = None
    print("PyTorch is not installed: the FlexAttention comparison is skipped (pyattn's side still runs)")
pyattn.set_num_threads(1)                  # one thread: timings less disturbed by whatever else runs

""" + CPU_NAME + "\n" + BEST + """
print(f"pyattn {pyattn.__version__}, torch {torch.__version__ if torch else '-'}, on {cpu_name()}")"""),
("md", """## A mask is a function
`mask_mod(b, h, q_idx, kv_idx)` returns True where query `q_idx` may attend key `kv_idx`
(batch row `b`, head `h`). pyattn calls it with NumPy integer arrays that broadcast, so it
must be written with `&`, `|`, `~` and `np.where` (not `and`, `or`, `if`). The block mask
keeps, per tile of `BlockMask.TILE` = (96 queries × 60 keys), whether it is empty, full or
partial, and the bits of partial tiles only. Its `repr` draws the tiles of batch 0, head 0:
`' '` empty, `'░'` partial, `'█'` full."""),
("code", """def every_third(b, h, q_idx, kv_idx):      # any vectorised function is a mask
    return (kv_idx <= q_idx) & ((q_idx - kv_idx) % 3 == 0)

print("tile:", pyattn.BlockMask.TILE)
print(pyattn.BlockMask.from_mask_mod(masks.causal, None, None, 700, 700))
bm = pyattn.BlockMask.from_mask_mod(every_third, None, None, 700, 700)
print(bm)
print("dense mask:", bm.to_dense().shape, bm.to_dense().dtype)"""),
("md", """## The gallery
Six masks over `L = S = 2048` positions (a grid of 22 × 35 tiles): causal, a sliding window
of 256 keys, packed documents (causal within each of 8 documents of random length), a prefix
LM (the first 512 positions see each other), chunked causal attention (chunks of 512, as
Llama 4) and a sliding window combined with the documents (`and_masks`). Left of each pair:
the tile map (white empty, light partial, dark full); right: the dense mask (dark: may
attend). Above each: the share of empty tiles (`sparsity()`) and how long building the
block mask took."""),
("code", """L = S = 2048
rng = np.random.default_rng(0)
doc_len = np.diff(np.concatenate([[0], np.sort(rng.choice(np.arange(64, L - 64), 7, replace=False)), [L]]))
doc_ids = np.repeat(np.arange(len(doc_len)), doc_len)          # (L,): the document of each position
gallery = {
    "causal": masks.causal,
    "sliding_window(256)": masks.sliding_window(256),
    "causal documents": masks.and_masks(masks.causal, masks.document(doc_ids)),
    "prefix_lm(512)": masks.prefix_lm(512),
    "chunked_causal(512)": masks.chunked_causal(512),
    "window 256 + documents": masks.and_masks(masks.sliding_window(256), masks.document(doc_ids)),
}
print("document lengths:", doc_len.tolist())
built, build_s = {}, {}
for name, mod in gallery.items():
    build_s[name] = best(lambda: pyattn.BlockMask.from_mask_mod(mod, None, None, L, S))
    built[name] = pyattn.BlockMask.from_mask_mod(mod, None, None, L, S)

def tile_map(dense, tile=pyattn.BlockMask.TILE):
    \"\"\"0 empty, 1 partial, 2 full per tile of a dense (L, S) mask (tiles cut at the edges).\"\"\"
    (qb, kb), (n, m) = tile, dense.shape
    pad = np.zeros((-(-n // qb) * qb, -(-m // kb) * kb), np.int8) - 1     # -1: outside the mask
    pad[:n, :m] = dense
    t = pad.reshape(pad.shape[0] // qb, qb, pad.shape[1] // kb, kb).transpose(0, 2, 1, 3)
    inside = t >= 0
    ones, cells = (t == 1).sum(axis=(2, 3)), inside.sum(axis=(2, 3))
    return np.where(ones == 0, 0, np.where(ones == cells, 2, 1))

fig, axs = plt.subplots(2, 6, figsize=(20, 7.4), layout="constrained")
for col, (name, bm) in enumerate(built.items()):
    dense = bm.to_dense()[0, 0]
    tm = tile_map(dense)
    qb, kb = pyattn.BlockMask.TILE                 # the tile map drawn over the positions it covers
    axs[0, col].imshow(tm, cmap="Blues", vmin=0, vmax=2.6, interpolation="nearest",
                       extent=(0, tm.shape[1] * kb, tm.shape[0] * qb, 0))
    axs[0, col].set_title(f"{name}\\nsparsity {bm.sparsity():.0%}, built in {build_s[name] * 1e3:.1f} ms",
                          fontsize=10)
    axs[0, col].set_xlabel(f"key ({tm.shape[1]} tiles of {kb})")
    axs[0, col].set_ylabel(f"query ({tm.shape[0]} tiles of {qb})")
    axs[1, col].imshow(dense, cmap="Greys", vmin=0, vmax=1.6, interpolation="nearest")
    axs[1, col].set_xlabel("key"); axs[1, col].set_ylabel("query")
    assert bm.sparsity() == (tm == 0).mean()         # the map the kernels use is the dense mask's
fig.legend(handles=[Patch(facecolor=plt.get_cmap("Blues")(x / 2.6), edgecolor="grey", label=t)
                    for x, t in ((0, "empty tile: never computed"), (1, "partial tile: bits tested"),
                                 (2, "full tile: no mask test"))], loc="outside lower center", ncols=3)
plt.show()"""),
("md", """## Time: block mask vs dense bool mask vs the ideal
One call of `scaled_dot_product_attention` on `(1, 4, 2048, 64)` float32 inputs, one
thread, best of 3: with `block_mask=bm`, with the same mask as a dense bool array
(`attn_mask=bm.to_dense()`: read element by element, every tile computed), and the ideal: the
unmasked call's time × the share of non-empty tiles (the work a kernel that skips empty
tiles cannot avoid). The block-mask call gives the same bits as the dense-mask call (the
skipped tiles' weights would be exactly 0), checked below.

The ideal counts every non-empty tile at a full tile's cost, so the block mask can beat it:
inside a partial tile the kernel narrows each group of a few query rows to the keys their
bits let them see, so the diagonal tiles of causal masks cost about half a tile. Masks
whose non-empty tiles are mostly partial and cut across the tile grid (window edges,
document boundaries) pay a whole tile plus the bit test for each, and land above it. A
dense bool mask reads `L·S` bytes and computes every tile, whatever it excludes."""),
("code", """H, E = 4, 64
q, k, v = (rng.standard_normal((1, H, L, E), dtype=np.float32) for _ in range(3))
sdpa = pyattn.scaled_dot_product_attention
t_none = best(lambda: sdpa(q, k, v))
rows = []
for name, bm in built.items():
    dense = bm.to_dense()
    out_bm, out_dense = sdpa(q, k, v, block_mask=bm), sdpa(q, k, v, attn_mask=dense)
    assert np.array_equal(out_bm, out_dense), name            # the same bits
    rows.append((name, best(lambda: sdpa(q, k, v, block_mask=bm)),
                 best(lambda: sdpa(q, k, v, attn_mask=dense)), t_none * (1 - bm.sparsity())))

print(f"no mask: {t_none * 1e3:.1f} ms")
print(f"{'mask':24s} {'block mask':>10s} {'dense bool':>10s} {'ideal':>8s}  vs ideal  vs dense")
for name, t_bm, t_d, ideal in rows:
    print(f"{name:24s} {t_bm * 1e3:8.1f} ms {t_d * 1e3:7.1f} ms {ideal * 1e3:5.1f} ms  "
          f"{t_bm / ideal:6.2f} x  {t_d / t_bm:5.1f} x faster")

fig, ax = plt.subplots(figsize=(11, 4.5), layout="constrained")
x = np.arange(len(rows))
for off, i, label, colour in ((-0.27, 1, "block_mask=", "C0"), (0, 2, "attn_mask= dense bool", "C1"),
                              (0.27, 3, "ideal: no-mask time x non-empty share", "C2")):
    bars = ax.bar(x + off, [r[i] * 1e3 for r in rows], 0.27, label=label, color=colour)
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
ax.axhline(t_none * 1e3, color="grey", ls="--", lw=1, label=f"no mask ({t_none * 1e3:.0f} ms)")
ax.set_xticks(x, [r[0] for r in rows], fontsize=9)
ax.set_ylabel("ms (best of 3)")
ax.legend(fontsize=9)
ax.set_title(f"(1, {H}, {L}, {E}) float32, 1 thread, measured when this notebook ran on {cpu_name()}\\n"
             "(illustrative: re-run to measure your machine)", fontsize=10)
plt.show()"""),
("md", """## Training on packed documents
Packing puts several documents in one sequence so no position is wasted on padding; the
document mask (with `causal`) keeps each token inside its own document, so training on the
packed sequence is training on each document alone. Below, a one-layer attention model
(projections, 2 heads, an output projection; float64) learns to map random inputs to random
targets by gradient descent, through `scaled_dot_product_attention_vjp`: once on four
documents packed with `block_mask=`, once on the four documents one by one with
`is_causal=True`, from the same start. The losses (summed squared errors over every token)
and the weights agree to float64 rounding: the sums only come in another order."""),
("code", """lens = [37, 120, 64, 203]
T, D, Hm, Em = sum(lens), 24, 2, 12
cu = np.concatenate([[0], np.cumsum(lens)])
ids = np.repeat(np.arange(len(lens)), lens)
r = np.random.default_rng(1)
x, target = r.standard_normal((T, D)), r.standard_normal((T, D))
start = {n: r.standard_normal(s) / np.sqrt(s[0]) for n, s in
         (("wq", (D, Hm * Em)), ("wk", (D, Hm * Em)), ("wv", (D, Hm * Em)), ("wo", (Hm * Em, D)))}
packed_mask = pyattn.BlockMask.from_mask_mod(masks.and_masks(masks.causal, masks.document(ids)),
                                             None, None, T, T)

def heads(a):                              # (t, Hm * Em) -> (Hm, t, Em)
    return a.reshape(len(a), Hm, Em).transpose(1, 0, 2)

def loss_and_grads(w, xs, ts, **attn):
    \"\"\"Summed squared error of one sequence and its gradients by hand (the attention's from pyattn).\"\"\"
    q, k, v = heads(xs @ w["wq"]), heads(xs @ w["wk"]), heads(xs @ w["wv"])
    o, attn_backward = pyattn.scaled_dot_product_attention_vjp(q, k, v, **attn)
    h = o.transpose(1, 0, 2).reshape(len(xs), Hm * Em)
    err = h @ w["wo"] - ts
    dh = 2 * err @ w["wo"].T
    dq, dk, dv = attn_backward(dh.reshape(len(xs), Hm, Em).transpose(1, 0, 2))
    flat = lambda g: g.transpose(1, 0, 2).reshape(len(xs), Hm * Em)
    return (err ** 2).sum(), {"wq": xs.T @ flat(dq), "wk": xs.T @ flat(dk), "wv": xs.T @ flat(dv),
                              "wo": h.T @ (2 * err)}

def train(steps, packed, lr=2e-3):
    w, losses = {n: a.copy() for n, a in start.items()}, []
    for _ in range(steps):
        if packed:
            loss, g = loss_and_grads(w, x, target, block_mask=packed_mask)
        else:                                              # each document alone, summed
            parts = [loss_and_grads(w, x[a:b], target[a:b], is_causal=True) for a, b in zip(cu[:-1], cu[1:])]
            loss = sum(p[0] for p in parts)
            g = {n: sum(p[1][n] for p in parts) for n in w}
        losses.append(loss)
        for n in w:
            w[n] -= lr * g[n]
    return np.array(losses), w

steps = 30
t0 = time.perf_counter(); loss_p, w_p = train(steps, True); t_p = time.perf_counter() - t0
t0 = time.perf_counter(); loss_s, w_s = train(steps, False); t_s = time.perf_counter() - t0
rel = np.abs(loss_p - loss_s).max() / loss_s.max()
wdiff = max(np.abs(w_p[n] - w_s[n]).max() for n in w_p)
print(f"loss: step 0 {loss_p[0]:.6f} -> step {steps - 1} {loss_p[-1]:.6f} (packed)")
print(f"      step 0 {loss_s[0]:.6f} -> step {steps - 1} {loss_s[-1]:.6f} (one by one)")
print(f"largest relative loss difference {rel:.1e}, largest weight difference {wdiff:.1e}")
print(f"{steps} steps: packed {t_p:.2f} s, one by one {t_s:.2f} s")
assert rel < 1e-12 and wdiff < 1e-10

fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
ax.plot(loss_s, "o", ms=7, mfc="none", label="four documents one by one (is_causal=True)")
ax.plot(loss_p, ".-", label="packed, block_mask = causal & document")
ax.set_xlabel("step"); ax.set_ylabel("summed squared error"); ax.legend()
ax.set_title(f"the same training, packed or not (largest relative difference {rel:.0e})", fontsize=10)
plt.show()"""),
("md", """The same packing in FlashAttention's layout: `scaled_dot_product_attention_varlen` takes the
documents packed along the first axis with their offsets `cu_seqlens`, and `block_mask=` there
is a mask **per sequence**: `mask_mod`'s `b` is the sequence number and `q_idx`, `kv_idx` count
from each sequence's start. Below, each document gets its own prefix length (a prefix-LM per
document); each document's rows equal, bit for bit, the call on that document alone."""),
("code", """prefix = np.array([5, 40, 0, 100])                          # one prefix length per document
per_doc = pyattn.BlockMask.from_mask_mod(masks.prefix_lm(prefix), len(lens), None, max(lens), max(lens))
tok = lambda a: a.reshape(T, Hm, Em)                       # (T, Hm * Em) -> (T, Hm, Em): token-major
qp, kp, vp = tok(x @ w_p["wq"]), tok(x @ w_p["wk"]), tok(x @ w_p["wv"])
out_v = pyattn.scaled_dot_product_attention_varlen(qp, kp, vp, cu, cu, block_mask=per_doc)
for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
    alone = pyattn.BlockMask.from_mask_mod(masks.prefix_lm(int(prefix[i])), None, None, b - a, b - a)
    o_i = pyattn.scaled_dot_product_attention(*(t[a:b].transpose(1, 0, 2) for t in (qp, kp, vp)), block_mask=alone)
    assert np.array_equal(out_v[a:b], o_i.transpose(1, 0, 2))
print(per_doc)
print("each document's rows: the same bits as the document alone")"""),
("md", """## FlexAttention's examples, in pyattn
The examples of PyTorch's FlexAttention introduction, each written for pyattn next to
PyTorch's version. Masks (`mask_mod`) become `BlockMask.from_mask_mod`; FlexAttention's
`score_mod`s that pyattn has as options become those options: ALiBi is `alibi_slopes=`
(`-slope * |i - j|`, which is FlexAttention's `slope * (kv_idx - q_idx)` under a causal
mask) and tanh soft-capping is `softcap=`. A mask FlexAttention writes with tensor indexing
(the documents' ids) is the same function on NumPy arrays here; NATTEN-style neighbourhood
attention on a 2-D grid shows a mask that is not ready-made. Each example runs on
`(1, 4, 1024, 64)` float32 inputs; PyTorch's runs `flex_attention` **eagerly** (without
`torch.compile`, which on a CPU needs a C++ compiler at run time): its times measure that,
not compiled FlexAttention."""),
("code", """Lf = 1024
qf, kf, vf = (rng.standard_normal((1, 4, Lf, 64), dtype=np.float32) for _ in range(3))
ids_f = np.repeat(np.arange(6), np.diff(np.linspace(0, Lf, 7).astype(int)))
slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)          # ALiBi's slopes for 4 heads
W, G = 8, 32                                          # NATTEN: a 32 x 32 grid, 17 x 17 neighbourhoods

def natten(b, h, q_idx, kv_idx):
    qr, qc, kr, kc = q_idx // G, q_idx % G, kv_idx // G, kv_idx % G
    return (np.abs(qr - kr) <= W) & (np.abs(qc - kc) <= W)

# name: (pyattn mask_mod or None, pyattn keywords, torch mask_mod or None, torch score_mod or None)
if torch is not None:
    tid, tslopes = torch.from_numpy(ids_f), torch.from_numpy(slopes.astype(np.float32))
    t_causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
    t_window = lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx <= 256)
    t_prefix = lambda b, h, q_idx, kv_idx: (kv_idx <= 256) | (q_idx >= kv_idx)
    t_doc = lambda b, h, q_idx, kv_idx: (tid[q_idx] == tid[kv_idx]) & (q_idx >= kv_idx)
    t_natten = lambda b, h, q_idx, kv_idx: (((q_idx // G - kv_idx // G).abs() <= W)
                                           & ((q_idx % G - kv_idx % G).abs() <= W))
    t_alibi = lambda score, b, h, q_idx, kv_idx: score + tslopes[h] * (kv_idx - q_idx)
    t_softcap = lambda score, b, h, q_idx, kv_idx: 30 * torch.tanh(score / 30)
else:
    t_causal = t_window = t_prefix = t_doc = t_natten = t_alibi = t_softcap = None
examples = {
    "causal": (masks.causal, {}, t_causal, None),
    "sliding window 256": (masks.sliding_window(256), {}, t_window, None),
    "prefix LM 257": (masks.prefix_lm(257), {}, t_prefix, None),
    "document + causal": (masks.and_masks(masks.causal, masks.document(ids_f)), {}, t_doc, None),
    "NATTEN 17 x 17": (natten, {}, t_natten, None),
    "ALiBi + causal": (masks.causal, {"alibi_slopes": slopes}, t_causal, t_alibi),
    "softcap 30": (None, {"softcap": 30.0}, None, t_softcap),
}

results = []
for name, (mod, kw, t_mask, t_score) in examples.items():
    bm = None if mod is None else pyattn.BlockMask.from_mask_mod(mod, None, None, Lf, Lf)
    out = pyattn.scaled_dot_product_attention(qf, kf, vf, block_mask=bm, **kw)
    t_pa = best(lambda: pyattn.scaled_dot_product_attention(qf, kf, vf, block_mask=bm, **kw))
    diff = t_fx = float("nan")
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(a) for a in (qf, kf, vf))
        fbm = None if t_mask is None else create_block_mask(t_mask, None, None, Lf, Lf, device="cpu")
        with warnings.catch_warnings():                    # eager flex_attention warns that it is slow
            warnings.simplefilter("ignore")
            ref = flex_attention(tq, tk, tv, score_mod=t_score, block_mask=fbm).numpy()
            t_fx = best(lambda: flex_attention(tq, tk, tv, score_mod=t_score, block_mask=fbm), n=2)
        diff = np.abs(out - ref).max()
        assert diff < 2e-5, (name, diff)                   # float32: both sum in their own order
    results.append((name, 0.0 if bm is None else bm.sparsity(), t_pa, t_fx, diff))

print(f"{'example':20s} {'sparsity':>8s} {'pyattn':>9s} {'flex (eager)':>12s}  largest |difference|")
for name, sp, t_pa, t_fx, diff in results:
    print(f"{name:20s} {sp:8.0%} {t_pa * 1e3:6.1f} ms {t_fx * 1e3:9.1f} ms  {diff:.1e}")
if torch is None:
    print("(PyTorch not installed: no comparison)")

fig, axs = plt.subplots(1, 3, figsize=(14, 4.4), layout="constrained")
for ax, name in zip(axs, ("document + causal", "NATTEN 17 x 17", "prefix LM 257")):
    mod = examples[name][0]
    ax.imshow(pyattn.BlockMask.from_mask_mod(mod, None, None, Lf, Lf).to_dense()[0, 0, :384, :384],
              cmap="Greys", vmin=0, vmax=1.6, interpolation="nearest")
    ax.set_title(f"{name}: the first 384 x 384", fontsize=10)
    ax.set_xlabel("key"); ax.set_ylabel("query")
plt.show()"""),
("md", """What carries over and what does not: every `mask_mod` FlexAttention takes is a
`mask_mod` here once it is written on NumPy arrays (`&`, `|`, `~`, `np.where`, indexing a NumPy
array instead of a tensor). `score_mod`s are not programmable in pyattn: the ones with an
option (ALiBi, soft-capping, and a float `attn_mask` for any additive bias) are covered;
others are not. The backward (`scaled_dot_product_attention_backward`, `_vjp`) skips the
same empty tiles as the forward."""),
]
