"""Write the teaching notebooks and execute them, so they are committed with
their outputs (they read well on GitHub).

    pip install -e ".[notebooks]"
    python notebooks/build_notebooks.py          # write + execute all
    python notebooks/build_notebooks.py --no-run # write only
    python notebooks/build_notebooks.py 07_generation   # write + execute the named ones

Each notebook is a list of (kind, source) cells below; edit here, rebuild.
"""
import argparse
import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

# timing helpers several notebooks define in their first code cell (each notebook
# stays self-contained); spliced into the cells' sources
CPU_NAME = """def cpu_name():
    \"\"\"The processor's name on Linux, else what the platform module knows.\"\"\"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"
"""
BEST = """def best(fn, n=3):
    \"\"\"The shortest of n runs of fn(), in seconds.\"\"\"
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts)
"""


SETUP = """\
import numpy as np
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
import pyattn
np.set_printoptions(precision=4, suppress=True)
try:                                       # thread pools that do not fight over the cores:
    from threadpoolctl import threadpool_limits  # NumPy's BLAS (OpenBLAS, MKL) on one thread
    threadpool_limits(limits=1, user_api="blas")  # (pyattn keeps its pool; torch: one thread
except ImportError:                        # where a notebook uses it), so the BLAS's spinning
    pass                                   # workers do not slow pyattn's next call
MASKED = "lightgrey"                       # the colour of masked-out (-inf) cells

def heatmap(ax, m, rows=None, cols=None, title="", fmt="{:.2f}", cmap="viridis",
            xlabel="key", ylabel="query", colorbar=True, legend=None, vmin=None, vmax=None):
    \"\"\"Draw matrix m on ax: rows are queries, columns keys (unless told otherwise), with the
    values written in the cells when m is small. Non-finite cells (-inf: masked) are grey.
    Colours are explained by a colorbar (a string names it), or, for a mask, by
    legend={value: meaning}. Returns the image, e.g. for one colorbar shared by several panels.\"\"\"
    m = np.asarray(m, dtype=float)
    cm = plt.get_cmap(cmap).copy()
    cm.set_bad(MASKED)
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cm, vmin=vmin, vmax=vmax)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # row and column numbers
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if rows is not None:
        ax.set_yticks(range(len(rows)), rows)
    if cols is not None:
        ax.set_xticks(range(len(cols)), cols, rotation=45)
    colour = lambda x: cm(im.norm(x)) if np.isfinite(x) else MASKED
    if legend is not None:
        ax.legend(handles=[Patch(facecolor=colour(v), edgecolor="grey", label=text) for v, text in legend.items()],
                  loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=8)
    elif colorbar:
        label = colorbar if isinstance(colorbar, str) else ""
        if not np.isfinite(m).all():
            label = (label + "; " if label else "") + "grey: -inf (masked)"
        ax.figure.colorbar(im, ax=ax, shrink=0.8, label=label)
    if m.size <= 64:
        for (i, j), x in np.ndenumerate(m):
            r, g, b = to_rgb(colour(x))
            ax.text(j, i, fmt.format(x), ha="center", va="center", fontsize=8,
                    color="k" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "w")
    return im
"""

NB = {}
import nb10_masks  # noqa: E402  (notebook 10's cells live in nb10_masks.py)
NB["10_masks"] = nb10_masks.cells(SETUP, CPU_NAME, BEST)

# ---------------------------------------------------------------------------
NB["01_self_attention_from_scratch"] = [
("md", """# 01 · Self-attention from scratch, with pyattn

This retells seed notebook **001** ("Your journey starts with one step"). The seed
builds attention step by step in PyTorch: dot products → softmax → context vectors,
then trainable query/key/value matrices. Here every step is a pyattn call on NumPy
arrays, and each printed number is checked against the figure the seed printed."""),
("code", SETUP),
("md", """## Six words, six 3-d embeddings
The seed's inputs, one row per word."""),
("code", """words = ["Your", "journey", "starts", "with", "one", "step"]
inputs = np.array([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                   [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]], dtype=np.float32)
inputs"""),
("md", """## Attention scores for one query: dot products
The seed loops over the words and computes `dot(query, x_i)`. One `pyattn.matmul` of the
(6, 3) inputs with the query vector does all six."""),
("code", """query = inputs[1]                      # "journey"
scores = pyattn.matmul(inputs, query)
print(scores)                          # seed: [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865]
assert np.allclose(scores, [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865], atol=5e-5)"""),
("md", """## From scores to weights
Dividing by the sum makes the weights sum to 1 (the seed's naive normalisation); the
softmax does the same but keeps every weight positive and stresses the large scores."""),
("code", """naive = scores / scores.sum()
weights = pyattn.softmax(scores, axis=0)
print("naive  ", naive)                # seed: [0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656]
print("softmax", weights, weights.sum())   # seed: [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]
assert np.allclose(weights, [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581], atol=5e-5)"""),
("md", """## The context vector
A weighted sum of all inputs. The seed loops; `pyattn.matmul(weights, inputs)` is the same sum."""),
("code", """context = pyattn.matmul(weights, inputs)
print(context)                         # seed: [0.4419, 0.6515, 0.5683]
assert np.allclose(context, [0.4419, 0.6515, 0.5683], atol=5e-5)"""),
("md", """## All queries at once: one fused call
`scaled_dot_product_attention` computes scores, softmax and the weighted sum in one C kernel
that never builds the score matrix (it streams keys through an online softmax). The seed
used no scaling here, so `scale=1.0`; `return_weights=True` also returns the 6×6 weights."""),
("code", """ctx, w = pyattn.scaled_dot_product_attention(inputs, inputs, inputs, scale=1.0, return_weights=True)
print(w)
print(ctx)
seed_w = np.array([[0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
                   [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
                   [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
                   [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
                   [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
                   [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896]])
assert np.allclose(w, seed_w, atol=5e-5)
fig, ax = plt.subplots(figsize=(5, 4.5))
heatmap(ax, w, words, words, "attention weights (row: query, column: key)")
plt.show()"""),
("md", """## Trainable weights
The seed draws `W_q, W_k, W_v` of shape `(d_in, d_out) = (3, 2)` with `torch.manual_seed(123)`
and prints them. pyattn's layers store weights the way `torch.nn.Linear` does,
`(d_out, d_in)`, so that PyTorch state dicts drop in unchanged: the printed matrices go in
transposed. The scale is `1/sqrt(d_k)` with `d_k = 2`."""),
("code", """from pyattn.nn import SelfAttention
W_q = np.array([[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]])
W_k = np.array([[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]])
W_v = np.array([[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]])
print(pyattn.matmul(inputs[1], W_q))   # seed: [0.4306, 1.4551]
layer = SelfAttention(3, 2).load_state_dict(
    {"W_query.weight": W_q.T, "W_key.weight": W_k.T, "W_value.weight": W_v.T})
ctx2, w2 = layer(inputs, return_weights=True)
print(ctx2)                            # seed: [[0.2996, 0.8053], [0.3061, 0.8210], ...]
assert np.allclose(ctx2[0], [0.2996, 0.8053], atol=2e-4)   # the printed W are rounded to 4 decimals
fig, ax = plt.subplots(figsize=(5, 4.5))
heatmap(ax, w2, words, words, "weights with trainable W_q, W_k (scaled by 1/sqrt(2))")
plt.show()"""),
("md", """With projections the weights are flatter than before: the 2-d queries and keys,
scaled by `1/sqrt(2)`, give closer scores. That scaling keeps the softmax from
saturating when the head dimension grows."""),
]

# ---------------------------------------------------------------------------
NB["02_causal_attention_and_masking"] = [
("md", """# 02 · Causal attention and masking

Seeds **000** and **004** build causal attention: each token may look only at itself and
the tokens before it. This notebook shows the same ideas with pyattn, with pictures, and
where pyattn goes further: bottom-right causal masks for `L != S` and rows with nothing
to attend to."""),
("code", SETUP),
("md", """## The prefix mean through `tril`
Seed 000 averages each token with the tokens before it. A lower-triangular matrix of equal
weights does it in one matmul; a softmax over zeros with a causal mask gives exactly those
weights."""),
("code", """b = np.array([[2., 9.], [7., 9.], [4., 4.]])
a = pyattn.softmax(np.zeros((3, 3)), is_causal=True)
print(a)                       # seed: [[1, 0, 0], [0.5, 0.5, 0], [0.3333, 0.3333, 0.3333]]
print(pyattn.matmul(a, b))     # seed: [[2, 9], [4.5, 9], [4.3333, 7.3333]]
x = np.array([[[-2.0260, -2.0655], [-1.2054, -0.9122], [-1.2502, 0.8032]]])
z = np.zeros((1, 3, 1))        # equal scores for every key -> equal weights
print(pyattn.scaled_dot_product_attention(z, z, x, is_causal=True))   # seed: [-1.6157, -1.4889] in row 1"""),
("md", """## Masking after vs before the softmax (seed 004, exercises 1 and 2)
After: softmax, zero the future, renormalise. Before: set the future scores to `-inf`,
then softmax. Both give the seed's figures."""),
("code", """QKT = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]])
after = pyattn.softmax(QKT, scale=0.1) * np.tril(np.ones((3, 3)))
after /= after.sum(-1, keepdims=True)
before = pyattn.softmax(QKT, scale=0.1, is_causal=True)
print(after)
print(before)                  # seed: [[1, 0, 0], [0.4975, 0.5025, 0], [0.33, 0.3333, 0.3367]]
assert np.allclose(after, before)"""),
("md", """## Three ways to say "causal"
* `is_causal=True` — no mask array at all;
* a **boolean** mask: `True` means *may attend* (as `torch.nn.functional.scaled_dot_product_attention`;
  careful: `torch.nn.MultiheadAttention`'s boolean mask means the opposite);
* a **float** mask added to the scores: `0` keeps, `-inf` removes."""),
("code", """rng = np.random.default_rng(0)
T = 6
scores = rng.standard_normal((T, T))
allowed = np.tril(np.ones((T, T), bool))
additive = np.where(allowed, 0.0, -np.inf)
w1 = pyattn.softmax(scores, is_causal=True)
w2 = pyattn.softmax(scores, attn_mask=allowed)
w3 = pyattn.softmax(scores, attn_mask=additive)
assert np.array_equal(w1, w2) and np.array_equal(w1, w3)
from matplotlib.colors import ListedColormap
may_attend = ListedColormap([MASKED, "yellowgreen"])     # 0 / False: grey, 1 / True: green
fig, axs = plt.subplots(1, 3, figsize=(15, 3.8), layout="constrained")
heatmap(axs[0], allowed, title="bool mask (True = may attend)", fmt="{:.0f}", cmap=may_attend,
        legend={1: "1 (True): may attend", 0: "0 (False): masked"})
heatmap(axs[1], additive, title="float mask (added to the scores)", fmt="{:.0f}",
        cmap=ListedColormap(["yellowgreen"]), legend={0: "0: kept", -np.inf: "-inf: masked"})
heatmap(axs[2], w1, title="causal softmax weights", colorbar="attention weight")
plt.show()"""),
("md", """## Dropout on the weights
In training, dropout zeroes some weights and scales the rest by `1/(1-p)` ("inverted
dropout"), so the expected output is unchanged. pyattn draws the pattern from `rng`: the
same seed gives the same pattern, on any number of threads."""),
("code", """q = k = rng.standard_normal((1, T, 4))
v = np.eye(T)[None]
_, wd = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.5, rng=1, return_weights=True)
_, wd2 = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.5, rng=1, return_weights=True)
assert np.array_equal(wd, wd2)
fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
heatmap(ax, wd[0], title="weights after dropout p=0.5 (kept ones doubled)", colorbar="attention weight")
plt.show()"""),
("md", """## When the number of queries differs from the number of keys
With a cache of past keys, `L` new queries see `S > L` keys. PyTorch's `is_causal=True`
aligns the mask to the **top left** (`j <= i`), which is right for `L == S` but lets the new
queries see almost nothing of the cache. FlashAttention aligns it to the **bottom right**
(`j <= i + S - L`): the last query sees every key. pyattn offers both. In NumPy the two
masks are `np.tril` with the diagonal shifted by `S - L`, and pyattn's causal softmax over
equal scores gives weight exactly where they say `True`."""),
("code", """L, S = 3, 6
top_left = np.tril(np.ones((L, S), bool))                 # j <= i
bottom_right = np.tril(np.ones((L, S), bool), k=S - L)    # j <= i + S - L
assert np.array_equal(pyattn.softmax(np.zeros((L, S)), is_causal="top_left") > 0, top_left)
assert np.array_equal(pyattn.softmax(np.zeros((L, S)), is_causal="bottom_right") > 0, bottom_right)
fig, axs = plt.subplots(1, 2, figsize=(11, 2.8), layout="constrained")
heatmap(axs[0], top_left, title='is_causal=True / "top_left"', fmt="{:.0f}", cmap=may_attend,
        legend={1: "may attend", 0: "masked"})
heatmap(axs[1], bottom_right, title='is_causal="bottom_right"', fmt="{:.0f}", cmap=may_attend,
        legend={1: "may attend", 0: "masked"})
plt.show()
q = rng.standard_normal((L, 4)); k = rng.standard_normal((S, 4)); v = rng.standard_normal((S, 2))
print(pyattn.scaled_dot_product_attention(q, k, v, is_causal="bottom_right"))"""),
("md", """## A row with nothing to attend to
If every key of a row is masked, the softmax is `0/0`. PyTorch returns NaN there, which then
spreads through the network. pyattn returns weights of 0 and an output row of 0 — and NaN in
the *inputs* still shows up where it belongs."""),
("code", """mask = np.tril(np.ones((4, 4), bool))
mask[2] = False                        # row 2 may attend to nothing
q = k = v = rng.standard_normal((4, 3))
out, w = pyattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True)
print(w)
print(out)"""),
("md", """## Where the seeds slipped (kindly)
* **Seed 000's `SelfAttention`** scales the scores by `C**-0.5`, the embedding size (32),
  instead of the head size (16). The weights then come out flatter than intended. The
  scale belongs to the dot products, whose size grows with the head dimension:"""),
("code", """x = rng.standard_normal((1, 8, 32)); C, head = 32, 16
Wq, Wk, Wv = (rng.uniform(-C**-0.5, C**-0.5, (head, C)) for _ in range(3))
q, k, v = x @ Wq.T, x @ Wk.T, x @ Wv.T
_, w_seed = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=C**-0.5, return_weights=True)
_, w_right = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)  # 1/sqrt(16)
print("largest weight in the last row, seed's scale:", w_seed[0, -1].max().round(4),
      " head-size scale:", w_right[0, -1].max().round(4))"""),
("md", """* **Seed 004's `CausalAttention.forward`** divides by `d_out ** 0.5` — the *global* variable
  `d_out` of the notebook, not `self.d_out`. It works only while the two agree. pyattn's
  `CausalAttention` uses its own head size:"""),
("code", """from pyattn.nn import CausalAttention
layer = CausalAttention(512, 768, context_length=100, rng=0).eval()
print(layer(rng.standard_normal((2, 100, 512)).astype(np.float32)).shape)   # seed: (20, 100, 768) for 20 rows"""),
]

# ---------------------------------------------------------------------------
NB["03_multi_head_attention"] = [
("md", """# 03 · Multi-head attention

Seeds **002**, **003** and **004** build multi-head attention twice: as a list of single
heads whose outputs are concatenated, and as one module that splits the projected
vectors into heads with a reshape. pyattn does the second, in C, with no per-head loop."""),
("code", SETUP),
("md", """## Heads are a reshape
`view(b, T, H, d/H).transpose(1, 2)` turns `(B, T, d_out)` into `(B, H, T, head_dim)`. In NumPy
that is `reshape` + `transpose` — a *view*, no copy — and pyattn reads the strided view in place."""),
("code", """rng = np.random.default_rng(0)
B, T, d_in, d_out, H = 2, 5, 8, 12, 3
x = rng.standard_normal((B, T, d_in)).astype(np.float32)
Wq, Wk, Wv = (rng.standard_normal((d_out, d_in)).astype(np.float32) / 3 for _ in range(3))
q = pyattn.matmul(x, Wq.T).reshape(B, T, H, d_out // H).transpose(0, 2, 1, 3)
k = pyattn.matmul(x, Wk.T).reshape(B, T, H, d_out // H).transpose(0, 2, 1, 3)
v = pyattn.matmul(x, Wv.T).reshape(B, T, H, d_out // H).transpose(0, 2, 1, 3)
print(q.shape, q.flags["C_CONTIGUOUS"])    # (2, 3, 5, 4) False: a view
all_heads = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True)
one_by_one = np.stack([pyattn.scaled_dot_product_attention(q[:, h], k[:, h], v[:, h], is_causal=True)
                       for h in range(H)], axis=1)
print(np.abs(all_heads - one_by_one).max())   # the same numbers
concat = all_heads.transpose(0, 2, 1, 3).reshape(B, T, d_out)   # heads side by side again"""),
("md", """## The layer
`pyattn.nn.MultiHeadAttention` mirrors the seeds' class: `W_query`, `W_key`, `W_value`
`(d_out, d_in)`, an output projection, dropout in training mode, a causal mask. The seeds'
calls give the seeds' shapes:"""),
("code", """from pyattn.nn import MultiHeadAttention
mha = MultiHeadAttention(d_in=32, d_out=32, num_heads=4, context_length=8, dropout=0.1, rng=0)
print(mha(rng.standard_normal((4, 8, 32)).astype(np.float32)).shape)          # seed 000: (4, 8, 32)
big = MultiHeadAttention(768, 1536, num_heads=3, context_length=80, rng=0).eval()
print(big(rng.standard_normal((40, 80, 768)).astype(np.float32)).shape)       # seed 004: (40, 80, 1536)"""),
("md", """## The seeds' PyTorch class, loaded into pyattn
`load_state_dict` takes the seed class's state dict as it is (the `mask` buffer is ignored),
and `torch.nn.MultiheadAttention`'s too. The outputs agree to float32 rounding. (Skipped
when PyTorch is not installed.)"""),
("code", """try:
    import torch
except ImportError:
    torch = None
    print("PyTorch is not installed: skipping the comparison")

if torch is not None:
    class SeedMultiHeadAttention(torch.nn.Module):          # seed 000 / 002, as printed
        def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
            super().__init__()
            self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
            self.W_query = torch.nn.Linear(d_in, d_out, bias=qkv_bias)
            self.W_key = torch.nn.Linear(d_in, d_out, bias=qkv_bias)
            self.W_value = torch.nn.Linear(d_in, d_out, bias=qkv_bias)
            self.out_proj = torch.nn.Linear(d_out, d_out)
            self.dropout = torch.nn.Dropout(dropout)
            self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
        def forward(self, x):
            b, n, _ = x.shape
            split = lambda t: t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
            q, k, v = split(self.W_query(x)), split(self.W_key(x)), split(self.W_value(x))
            s = (q @ k.transpose(2, 3)).masked_fill(self.mask.bool()[:n, :n], -torch.inf)
            w = self.dropout(torch.softmax(s / k.shape[-1] ** 0.5, dim=-1))
            return self.out_proj((w @ v).transpose(1, 2).contiguous().view(b, n, self.d_out))

    torch.manual_seed(3333)
    seed_model = SeedMultiHeadAttention(32, 48, context_length=8, dropout=0.1, num_heads=4, qkv_bias=True).eval()
    ours = MultiHeadAttention(32, 48, 4, context_length=8, qkv_bias=True).load_state_dict(seed_model.state_dict()).eval()
    xb = torch.randn(4, 8, 32)
    with torch.no_grad():
        want = seed_model(xb).numpy()
    got = ours(xb.numpy())
    print("largest difference:", np.abs(got - want).max())"""),
("md", """## What each head looks at
Each head has its own projections, so its own pattern of weights."""),
("code", """heads_layer = MultiHeadAttention(16, 16, 4, context_length=10, rng=1).eval()
xs = rng.standard_normal((10, 16)).astype(np.float32)
_, w = heads_layer(xs, return_weights=True)        # (H, T, T) for one sequence
fig, axs = plt.subplots(1, 4, figsize=(15, 3.6), layout="constrained")
for h in range(4):      # one colour scale, 0 to 1, for all heads
    im = heatmap(axs[h], w[h], title=f"head {h}", colorbar=False, vmin=0, vmax=1)
fig.colorbar(im, ax=axs, shrink=0.8, label="attention weight")
plt.show()"""),
("md", """## Where a seed slipped (kindly)
Seed **003** writes `weights.masked_fill(tril == 0, float==('-inf'))`. `float==('-inf')`
compares the *type* `float` with a string and is simply `False`, so the "mask" fills with
`0`: the future is not masked at all, and the weights after the softmax still look at future
tokens. The intended line is `masked_fill(tril == 0, float('-inf'))`:"""),
("code", """T = 4
scores = rng.standard_normal((T, T))
slip = np.where(np.tril(np.ones((T, T))) == 0, float == ('-inf'), scores)    # fills with False == 0
print("with the slip, row 0 attends to", np.count_nonzero(pyattn.softmax(slip)[0]), "tokens")
print("with float('-inf'), row 0 attends to", np.count_nonzero(pyattn.softmax(scores, is_causal=True)[0]), "token")"""),
]

# ---------------------------------------------------------------------------
NB["04_performance"] = [
("md", """# 04 · Performance: fused attention vs the seeds' NumPy vs PyTorch

The seeds compute attention the direct way: the whole `(L, S)` score matrix, a softmax,
a matmul. pyattn's kernel streams key tiles through an online softmax instead
(FlashAttention-2), so it never holds the score matrix, and runs on packed SIMD tiles.

**Whose numbers are these?** The timings and memory figures below are measured when the
notebook runs (small, single thread). The outputs committed with this notebook come from the
run that produced it, on the CPU printed by the next cell and named in each figure's title;
they are not your machine's. Re-running the notebook re-measures everything on your machine.
`benchmarks/bench.py` measures the full table; `benchmarks/RESULTS.md` holds the committed one."""),
("code", SETUP + """import os, platform, subprocess, sys, time
try:
    import torch
    torch.set_num_threads(1)
except ImportError:
    torch = None
pyattn.set_num_threads(1)

def cpu_name():
    \"\"\"The processor's name as the operating system reports it, else the architecture.\"\"\"
    try:
        if os.path.exists("/proc/cpuinfo"):                             # Linux
            for line in open("/proc/cpuinfo"):
                if line.split(":")[0].strip() in ("model name", "Hardware", "cpu model"):
                    return line.split(":", 1)[1].strip()
            for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
                if line.startswith("Model name:"):                      # e.g. ARM cores
                    return line.split(":", 1)[1].strip()
        if sys.platform == "darwin":                                    # macOS
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"    # Windows: processor()

CPU = f"{cpu_name()} ({os.cpu_count()} logical CPUs, {platform.system()} {platform.machine()})"
print("measured on:", CPU, "on", time.strftime("%Y-%m-%d"))"""),
("code", """def naive_attention(q, k, v, causal):      # the seeds' way
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v

def best(fn, n=3):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts)

rng = np.random.default_rng(0)
H, E = 4, 64
rows = []
for L in (128, 256, 512, 1024):
    q, k, v = (rng.standard_normal((1, H, L, E), dtype=np.float32) for _ in range(3))
    flops = 4 * H * L * L * E
    r = {"L": L,
         "pyattn": flops / best(lambda: pyattn.scaled_dot_product_attention(q, k, v)) / 1e9,
         "numpy (seeds)": flops / best(lambda: naive_attention(q, k, v, False)) / 1e9}
    if torch is not None:
        tq, tk, tv = map(torch.from_numpy, (q, k, v))
        r["torch"] = flops / best(lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)) / 1e9
    rows.append(r)
fig, ax = plt.subplots(figsize=(6.5, 4.2))
for name in rows[0]:
    if name != "L":
        ax.plot([r["L"] for r in rows], [r[name] for r in rows], marker="o", label=name)
ax.set_xscale("log", base=2); ax.set_xlabel("sequence length L = S  (H=4, E=64, float32, 1 thread)")
ax.set_title(f"measured when this notebook ran, on {cpu_name()}\\n(re-run to measure your machine)", fontsize=10)
ax.set_ylabel("GFLOP/s"); ax.legend(); plt.show()
for r in rows:
    print(r["L"], {k: round(x, 1) for k, x in r.items() if k != "L"})"""),
("md", """## Memory: the score matrix is what grows
The naive way holds `B·H·L·S` scores (and their exponentials); the fused kernel holds a few
tiles per thread. Each measurement runs in a fresh process and reports how far the peak
resident memory rose during the call above what was resident just before it (inputs and
output already allocated). On Linux that is `VmHWM` from `/proc/self/status`, its peak
first reset through `/proc/self/clear_refs`. Without `/proc` (macOS, BSD) it is the rise of
`resource.getrusage(...).ru_maxrss` over the call: the same peak without the reset, so a
rise of 0 means no more than the process had already used. On Windows, whose standard
library has no such counter, the measurement is skipped with a note."""),
("code", """code = '''
import sys, numpy as np, pyattn
L, fused = int(sys.argv[1]), sys.argv[2] == "fused"
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, L, 64), dtype=np.float32) for _ in range(3))
out = np.full((1, 1, L, 64), 1.0, np.float32)      # written: resident before the call

def status(key):                                   # Linux: /proc/self/status, in MB
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
try:
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                               # peak := current
    how, peak = "Linux_VmHWM", lambda: status("VmHWM")
except OSError:                                    # no /proc: macOS, BSD, Windows
    try:
        import resource
    except ImportError:                            # Windows
        print("none 0"); sys.exit()
    unit = 1 if sys.platform == "darwin" else 1024     # ru_maxrss: bytes on macOS, kB elsewhere
    how, peak = "ru_maxrss", lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit / 2**20
    before = peak()
if fused:
    pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, out=out)
else:
    s = q @ np.swapaxes(k, -1, -2) / 8.0
    s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True)); out[...] = (s / s.sum(-1, keepdims=True)) @ v
print(how, peak() - before)
'''
# started through a small Python: a child may begin with its parent's (this kernel's) peak
# as its own ru_maxrss, which would hide the growth; the small one's peak is below the child's
launch = "import subprocess, sys; print(subprocess.run(sys.argv[1:], capture_output=True, text=True, check=True).stdout)"
mem = {"fused": [], "naive": []}
Ls = [1024, 2048, 4096, 8192]
for L in Ls:
    for kind in mem:
        r = subprocess.run([sys.executable, "-c", launch, sys.executable, "-c", code, str(L), kind],
                           capture_output=True, text=True, check=True)
        how, mb = r.stdout.split()
        mem[kind].append(float(mb))
if how == "none":
    print("Memory not measured: this system has neither /proc nor Python's resource module",
          "(Windows), so the standard library cannot read a process's peak memory here.")
else:
    how = how.replace("_", " ")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for kind, ys in mem.items():
        ax.plot(Ls, ys, marker="o", label=kind)
    ax.plot(Ls, [L * L * 4 / 2**20 for L in Ls], "k--", label="one (L, L) float32 matrix")
    ax.set_xscale("log", base=2); ax.set_yscale("symlog"); ax.set_xlabel("L = S (one head, E = 64)")
    ax.set_title(f"measured when this notebook ran, on {cpu_name()}\\n({how}; re-run to measure your machine)",
                 fontsize=10)
    ax.set_ylabel("peak memory growth, MB"); ax.legend(); plt.show()
    print(how, {k: [round(x, 1) for x in ys] for k, ys in mem.items()})"""),
("md", """## The committed benchmark
`python benchmarks/bench.py` runs matmul, attention over `L ∈ {128 … 4096}`, `E ∈ {32, 64, 128}`,
causal and not, on 1 and all threads, interleaved and repeated, against NumPy and PyTorch.
Its last committed picture and table follow. Unlike the measurements above, they are files in
the repository: re-running this notebook shows them again as they are, from the machine named
in their header, and does not re-measure them. Run `python benchmarks/bench.py` for your own."""),
("code", """from IPython.display import Image, display
path = os.path.join("..", "benchmarks", "RESULTS.md")
results = open(path).read() if os.path.exists(path) else ""
about = {line[2:].split(":", 1)[0]: line.split(":", 1)[1].strip()
         for line in results.splitlines() if line.startswith("- ") and ":" in line}
print(f"committed bench.py run of {about.get('date', '?')} on {about.get('machine', '?')}",
      "(not this notebook's run, not re-measured here)")
png = os.path.join("..", "benchmarks", "gflops.png")
if os.path.exists(png):
    display(Image(filename=png))          # GFLOP/s vs L, from the committed bench.py run
print(results[:4000] if results else "no RESULTS.md yet: run benchmarks/bench.py")"""),
]

# ---------------------------------------------------------------------------
NB["05_tiny_char_model"] = [
("md", """# 05 · A tiny next-character model from `pyattn.nn`

Seed **004** ends with `BadLM`: embeddings → attention → a linear layer to the vocabulary.
Here is a character-level version built from pyattn layers on NumPy arrays, over a short
text shipped with the repository (`notebooks/data/tiny_corpus.txt`). The attention weights
are random; the read-out (from the current and previous character and the attention
output) is *fitted with NumPy* (least squares) so the model really predicts. Then it generates text and shows what its heads attend to in a real sentence."""),
("code", SETUP + """from pyattn.nn import MultiHeadAttention
text = open("data/tiny_corpus.txt").read().replace("\\n", " ")
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
ids = np.array([stoi[c] for c in text])
V, T, D, H = len(chars), 32, 64, 4
print(f"{len(text)} characters, vocabulary of {V}")"""),
("md", """## The model
Token embeddings plus **positional embeddings sized by the context length**, a causal
multi-head attention layer, and a linear read-out. (Seed 004's `BadLM` sizes its positional
embedding table by the *vocabulary* — 50257 rows for 4 positions. It runs, since the
vocabulary is larger than the context, but wastes memory and would break for a context
longer than the vocabulary. The table needs one row per position.)"""),
("code", """rng = np.random.default_rng(0)
tok_emb = rng.standard_normal((V, D)).astype(np.float32)
pos_emb = rng.standard_normal((T, D)).astype(np.float32) * 0.5     # one row per position
attn = MultiHeadAttention(D, D, H, context_length=T, rng=1).eval()
attn.W_query *= 4; attn.W_key *= 4        # larger random scores: sharper, more varied heads

def features(batch_ids):                                 # (B, t) -> (B, t, 2V + D)
    t = batch_ids.shape[1]
    h = tok_emb[batch_ids] + pos_emb[:t]
    prev = np.concatenate([np.zeros_like(batch_ids[:, :1]), batch_ids[:, :-1]], axis=1)
    # the current and previous character, and what attention gathered from the context
    return np.concatenate([np.eye(V)[batch_ids], np.eye(V)[prev], attn(h)], axis=-1)

# windows of T characters; target = the next character at every position
starts = np.arange(0, len(ids) - T - 1)
X = np.stack([ids[s:s + T] for s in starts]); Y = np.stack([ids[s + 1:s + T + 1] for s in starts])
F = features(X).reshape(X.size, -1).astype(np.float64)
onehot = np.eye(V)[Y.reshape(-1)]
W_out = np.linalg.lstsq(np.c_[F, np.ones(len(F))], onehot, rcond=None)[0]   # fitted with NumPy
pred = (np.c_[F, np.ones(len(F))] @ W_out).argmax(-1)
print(f"next-character accuracy on the text: {np.mean(pred == Y.reshape(-1)):.1%} "
      f"(always guessing the commonest character: {np.mean(Y == np.bincount(ids).argmax()):.1%})")"""),
("md", """## Generation
The fitted scores become probabilities through a (temperature-scaled) `pyattn.softmax`,
and the next character is drawn from them."""),
("code", """def generate(prompt, n=70, temperature=0.04, seed=0):
    g = np.random.default_rng(seed)
    s = [stoi[c] for c in prompt]
    for _ in range(n):
        window = np.array(s[-T:])[None]
        f = features(window)[0, -1].astype(np.float64)
        p = pyattn.softmax(np.r_[f, 1.0] @ W_out, scale=1 / temperature)
        s.append(int(g.choice(V, p=p / p.sum())))
    return "".join(chars[i] for i in s)

print(generate("the cat "))
print(generate("your journey "))"""),
("md", """## What the heads look at in a real sentence
Weights of each head for the sentence below (rows, the queries: the character being predicted
from; columns, the keys: the characters it may look at; causal, so the upper triangle is empty)."""),
("code", """sentence = "the dog saw the cat"
h = tok_emb[[stoi[c] for c in sentence]] + pos_emb[:len(sentence)]
_, w = attn(h, return_weights=True)                     # (H, t, t)
fig, axs = plt.subplots(1, H, figsize=(17, 4.6), layout="constrained")
labels = list(sentence.replace(" ", "_"))
for i in range(H):      # one colour scale, 0 to 1, for all heads
    im = heatmap(axs[i], w[i], labels, labels, f"head {i}", xlabel="key: character looked at",
                 ylabel="query: character predicting" if i == 0 else "", colorbar=False, vmin=0, vmax=1)
fig.colorbar(im, ax=axs, shrink=0.8, label="attention weight")
plt.show()"""),
]

# ---------------------------------------------------------------------------
NB["06_training"] = [
("md", """# 06 · Training a small transformer: hand-written backprop around pyattn's attention backward

Until now the notebooks only ran attention forward. Here a small character-level
transformer **learns**: token and position embeddings, two blocks of
LayerNorm → causal `pyattn.nn.MultiHeadAttention` → LayerNorm → MLP (each with a residual
connection, as in GPT), a final LayerNorm and a linear head, trained with cross-entropy and
AdamW. Everything is NumPy. The backward pass of the embeddings, LayerNorms, MLPs, head and
loss is written **by hand** below, one step at a time; the attention's backward is pyattn's
(`layer.backward`, the fused FlashAttention-2 style kernel). When PyTorch is installed, the
same model, built in PyTorch from the same initial weights, trains alongside on the same
batches, and the two loss curves must agree.

The corpus is `notebooks/data/training_corpus.txt`: about 120 KB of English prose taken
from the docstrings of Python's standard library (Python Software Foundation licence) — text
that ships with every Python, so nothing has to be downloaded."""),
("code", SETUP + """import time
text = open("data/training_corpus.txt").read()
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = np.array([stoi[c] for c in text])
n = int(0.9 * len(data))
train_ids, val_ids = data[:n], data[n:]                 # 90 % to learn from, 10 % to check on
V = len(chars)
print(f"{len(text):,} characters, vocabulary of {V}; {len(train_ids):,} for training, {len(val_ids):,} for validation")"""),
("md", """## A baseline to beat: the bigram model

The simplest model predicts the next character from the current one only, from counts. Its
cross-entropy on the validation text is the number a model with attention has to beat (a
model that knows nothing scores `log V`)."""),
("code", """counts = np.ones((V, V))                                # add-one smoothing
np.add.at(counts, (train_ids[:-1], train_ids[1:]), 1)
bigram = counts / counts.sum(1, keepdims=True)
bigram_val = -np.mean(np.log(bigram[val_ids[:-1], val_ids[1:]]))
print(f"uniform guess: {np.log(V):.3f} nats; bigram model on validation: {bigram_val:.3f} nats")"""),
("md", """## The model and its parameters

`D = 64` features, `H = 4` heads, a context of `T = 64` characters, batches of `B = 16`.
Linear layers use `torch.nn.Linear`'s layout and initialisation; the attention layers are
`pyattn.nn.MultiHeadAttention` (causal, with biases), in float64 here so that the comparison
with PyTorch can be exact to 1e-8. Their parameters live in the layers
(`layer.parameters()`, the live arrays); the rest in the dict `P`."""),
("code", """from pyattn.nn import MultiHeadAttention
T, D, H, B, L = 64, 64, 4, 16, 2                        # context, width, heads, batch, blocks
rng = np.random.default_rng(0)

def linear_init(fan_in, fan_out):                       # torch.nn.Linear's uniform(+-1/sqrt(fan_in))
    b = 1 / np.sqrt(fan_in)
    return rng.uniform(-b, b, (fan_out, fan_in)), rng.uniform(-b, b, fan_out)

P = {"tok": rng.standard_normal((V, D)) * 0.1, "pos": rng.standard_normal((T, D)) * 0.1}
attn = []
for l in range(L):
    P[f"W1.{l}"], P[f"b1.{l}"] = linear_init(D, 4 * D)   # MLP: D -> 4D -> D
    P[f"W2.{l}"], P[f"b2.{l}"] = linear_init(4 * D, D)
    layer = MultiHeadAttention(D, D, H, context_length=T, qkv_bias=True, rng=l)   # causal
    layer.load_state_dict({k: v.astype(np.float64) for k, v in layer.state_dict().items()})
    attn.append(layer)
P["Wh"], P["bh"] = linear_init(D, V)                    # the head: D -> vocabulary

def all_params():                                       # every trainable array, by name
    ps = dict(P)
    for l, layer in enumerate(attn):
        ps.update({f"attn{l}.{k}": v for k, v in layer.parameters().items()})
    return ps
print(f"{sum(p.size for p in all_params().values()):,} parameters")

def batch(src, rng):                                    # B windows of T characters and their next characters
    s = rng.integers(0, len(src) - T - 1, B)
    return np.stack([src[i:i + T] for i in s]), np.stack([src[i + 1:i + T + 1] for i in s])"""),
("md", """## Forward

Each block: `h = h + attention(LN(h))`, then `h = h + W2 relu(W1 LN(h) + b1) + b2`. The
forward keeps what the backward will need (the LayerNorms' normalised inputs and scales, the
MLP's pre-activations); the attention layers keep their own (a call in training mode
remembers its input, its q, k, v, output and log-sum-exp — never the `(T, T)` weights)."""),
("code", """def layer_norm(x, eps=1e-5):                             # no learned gain and bias (they start at 1 and 0)
    mu = x.mean(-1, keepdims=True)
    sigma = np.sqrt(x.var(-1, keepdims=True) + eps)
    return (x - mu) / sigma, sigma

def forward(ids, targets=None):
    t = ids.shape[1]
    h = P["tok"][ids] + P["pos"][:t]                    # (B, t, D)
    saved = []
    for l in range(L):
        a_in, s1 = layer_norm(h)
        h = h + attn[l](a_in)                           # pyattn: causal multi-head attention
        m_in, s2 = layer_norm(h)
        z = m_in @ P[f"W1.{l}"].T + P[f"b1.{l}"]
        r = np.maximum(z, 0)
        h = h + r @ P[f"W2.{l}"].T + P[f"b2.{l}"]
        saved.append((a_in, s1, m_in, s2, z, r))
    f, sf = layer_norm(h)
    logits = f @ P["Wh"].T + P["bh"]                    # (B, t, V)
    if targets is None:
        return logits
    z = logits - logits.max(-1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    picked = np.take_along_axis(probs, targets[..., None], -1)[..., 0]
    return -np.mean(np.log(picked)), (ids, targets, saved, f, sf, probs)"""),
("md", """## Backward, by hand

Backpropagation walks the forward in reverse, turning the gradient of the loss with respect
to each output into gradients for the inputs and parameters:

1. **Cross-entropy over softmax**: with probabilities `p` and one-hot targets `y`,
   `dloss/dlogits = (p - y) / N` (N = number of predicted characters).
2. **Linear layer** `y = x Wᵀ + b`: `dW = dyᵀ x`, `db = Σ dy`, `dx = dy W`.
3. **LayerNorm** `x̂ = (x - μ) / σ`: `dx = (dx̂ - mean(dx̂) - x̂ · mean(dx̂ · x̂)) / σ`.
4. **ReLU**: the gradient passes where the input was positive.
5. **Residual** `h + f(h)`: the gradient flows both ways and adds up.
6. **Attention**: `dx = layer.backward(dy)` — pyattn's fused backward; it also adds the
   gradients of `W_query`, `W_key`, `W_value`, `out_proj` into `layer.grads`.
7. **Embeddings**: each row used gets the gradient of its uses (`np.add.at`)."""),
("code", """def layer_norm_backward(dy, xhat, sigma):
    return (dy - dy.mean(-1, keepdims=True) - xhat * (dy * xhat).mean(-1, keepdims=True)) / sigma

def backward(state):
    ids, targets, saved, f, sf, probs = state
    G = {k: np.zeros_like(v) for k, v in P.items()}
    dlogits = probs.copy()                                          # 1. softmax + cross-entropy
    np.put_along_axis(dlogits, targets[..., None], np.take_along_axis(probs, targets[..., None], -1) - 1, -1)
    dlogits /= ids.size
    G["Wh"] = dlogits.reshape(-1, V).T @ f.reshape(-1, D)           # 2. the head
    G["bh"] = dlogits.sum((0, 1))
    dh = layer_norm_backward(dlogits @ P["Wh"], f, sf)              # 3. final LayerNorm
    for l in reversed(range(L)):
        a_in, s1, m_in, s2, z, r = saved[l]
        G[f"W2.{l}"] = dh.reshape(-1, D).T @ r.reshape(-1, 4 * D)   # 2. MLP out
        G[f"b2.{l}"] = dh.sum((0, 1))
        dz = (dh @ P[f"W2.{l}"]) * (z > 0)                          # 4. ReLU
        G[f"W1.{l}"] = dz.reshape(-1, 4 * D).T @ m_in.reshape(-1, D)
        G[f"b1.{l}"] = dz.sum((0, 1))
        dh = dh + layer_norm_backward(dz @ P[f"W1.{l}"], m_in, s2)  # 5. residual + 3.
        dh = dh + layer_norm_backward(attn[l].backward(dh), a_in, s1)   # 6. pyattn's attention backward
    np.add.at(G["tok"], ids, dh)                                    # 7. embeddings
    G["pos"][:ids.shape[1]] = dh.sum(0)
    for l, layer in enumerate(attn):
        G.update({f"attn{l}.{k}": v for k, v in layer.grads.items()})
    return G"""),
("md", """## Is the hand-written backward right? Finite differences

Nudge a parameter by ±ε, recompute the loss, and compare `(loss(+ε) - loss(-ε)) / 2ε` with
the gradient from `backward` — for a few entries of every parameter, attention included."""),
("code", """check_rng = np.random.default_rng(1)
x, y = batch(train_ids, check_rng)
x, y = x[:2, :16], y[:2, :16]          # a small batch: fewer ReLU kinks for the +-eps to straddle
for layer in attn:
    layer.zero_grad()
loss, state = forward(x, y)
G = backward(state)
worst = 0.0
for name, p in all_params().items():
    for _ in range(3):
        i = tuple(check_rng.integers(0, s) for s in p.shape)
        old = p[i]
        p[i] = old + 1e-6; lp = forward(x, y)[0]
        p[i] = old - 1e-6; lm = forward(x, y)[0]
        p[i] = old
        num = (lp - lm) / 2e-6
        # relative to the gradient's size, with a floor for the finite difference's own
        # rounding (about 1e-16 * loss / 1e-6 = 5e-10): the key bias, for one, has a zero
        # gradient -- adding the same number to every score of a row changes no softmax
        worst = max(worst, abs(num - G[name][i]) / (abs(num) + abs(G[name][i]) + 1e-4))
print(f"largest relative difference, backward vs finite differences: {worst:.1e}")
assert worst < 1e-5"""),
("md", """## AdamW in a few lines

PyTorch's `torch.optim.AdamW` formula: decoupled weight decay, then the bias-corrected Adam
step. The parameters are updated **in place** (`p -= ...`), which for the attention layers
updates the layers themselves."""),
("code", """class AdamW:
    def __init__(self, lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.lr, (self.b1, self.b2), self.eps, self.wd, self.t = lr, betas, eps, weight_decay, 0
        self.m, self.v = {}, {}

    def step(self, params, grads):
        self.t += 1
        for k, p in params.items():
            g = grads[k]
            m = self.m.setdefault(k, np.zeros_like(p))
            v = self.v.setdefault(k, np.zeros_like(p))
            p *= 1 - self.lr * self.wd                                   # decoupled weight decay
            m *= self.b1; m += (1 - self.b1) * g
            v *= self.b2; v += (1 - self.b2) * g * g
            denom = np.sqrt(v) / np.sqrt(1 - self.b2 ** self.t) + self.eps
            p -= (self.lr / (1 - self.b1 ** self.t)) * m / denom"""),
("md", """## The same model in PyTorch (when it is installed)

Built from the **same initial weights** (the attention layers' state dicts load into
`torch.nn.MultiheadAttention`), trained with `torch.optim.AdamW` on the same batches."""),
("code", """try:
    import torch
    F = torch.nn.functional
    torch.set_num_threads(1)        # PyTorch's pool beside pyattn's: one thread, no oversubscription
except ImportError:
    torch = None
    print("PyTorch is not installed: the pyattn model trains alone")
if torch is not None:
    tP = {k: torch.tensor(v, requires_grad=True) for k, v in P.items()}
    tattn = []
    for layer in attn:
        m = torch.nn.MultiheadAttention(D, H, bias=True, batch_first=True, dtype=torch.float64)
        sd = layer.state_dict()
        with torch.no_grad():
            m.in_proj_weight.copy_(torch.tensor(np.concatenate([sd[f"W_{n}.weight"] for n in ("query", "key", "value")])))
            m.in_proj_bias.copy_(torch.tensor(np.concatenate([sd[f"W_{n}.bias"] for n in ("query", "key", "value")])))
            m.out_proj.weight.copy_(torch.tensor(sd["out_proj.weight"]))
            m.out_proj.bias.copy_(torch.tensor(sd["out_proj.bias"]))
        tattn.append(m)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)       # True = masked, in this module

    def torch_loss(ids, targets):
        h = tP["tok"][ids] + tP["pos"][:ids.shape[1]]
        for l in range(L):
            a_in = F.layer_norm(h, (D,))
            h = h + tattn[l](a_in, a_in, a_in, attn_mask=causal, need_weights=False)[0]
            m_in = F.layer_norm(h, (D,))
            h = h + F.linear(F.relu(F.linear(m_in, tP[f"W1.{l}"], tP[f"b1.{l}"])), tP[f"W2.{l}"], tP[f"b2.{l}"])
        logits = F.linear(F.layer_norm(h, (D,)), tP["Wh"], tP["bh"])
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    topt = torch.optim.AdamW(list(tP.values()) + [p for m in tattn for p in m.parameters()],
                             lr=3e-3, weight_decay=0.01)"""),
("md", """## Before training

What the untrained model writes, and what its first head attends to on a validation
snippet (kept for the comparison at the end)."""),
("code", """def generate(prompt, n, seed=0):
    g = np.random.default_rng(seed)
    for layer in attn:
        layer.eval()                                    # inference: nothing is kept for a backward
    ids = [stoi[c] for c in prompt]
    for _ in range(n):
        logits = forward(np.array([ids[-T:]]))[0, -1]
        p = np.exp(logits - logits.max()); p /= p.sum()
        ids.append(g.choice(V, p=p))
    for layer in attn:
        layer.train()
    return "".join(chars[i] for i in ids)

def head_weights(snippet, l=0):
    ids = np.array([[stoi[c] for c in snippet]])
    h = P["tok"][ids] + P["pos"][:len(snippet)]
    for k in range(l):                                  # run the blocks below layer l
        a_in, _ = layer_norm(h); h = h + attn[k].eval()(a_in); attn[k].train()
        m_in, _ = layer_norm(h); h = h + np.maximum(m_in @ P[f"W1.{k}"].T + P[f"b1.{k}"], 0) @ P[f"W2.{k}"].T + P[f"b2.{k}"]
    a_in, _ = layer_norm(h)
    w = attn[l].eval()(a_in, return_weights=True)[1][0]    # (H, t, t)
    attn[l].train()
    return w

snippet = text[n + 1000:n + 1024]
before = [head_weights(snippet, l) for l in range(L)]
print("before training:", repr(generate("The ", 120)))"""),
("md", """## Training

600 steps of 16 windows of 64 characters. Every step: forward, hand-written backward
(with pyattn's attention backward inside), AdamW; the PyTorch twin does the same on the same
batch. Every 50 steps the validation loss is measured on 16 fixed validation windows."""),
("code", """opt = AdamW()
data_rng, val_rng = np.random.default_rng(5), np.random.default_rng(6)
val_batches = [batch(val_ids, val_rng) for _ in range(4)]
steps, history, torch_history, val_history = 600, [], [], []
t0 = time.perf_counter()
for step in range(steps):
    x, y = batch(train_ids, data_rng)
    for layer in attn:
        layer.zero_grad()
    loss, state = forward(x, y)
    opt.step(all_params(), backward(state))
    history.append(loss)
    if torch is not None:
        topt.zero_grad()
        tl = torch_loss(torch.tensor(x), torch.tensor(y))
        tl.backward()
        topt.step()
        torch_history.append(tl.item())
    if step % 50 == 0 or step == steps - 1:
        for layer in attn:
            layer.eval()
        val_history.append((step, np.mean([forward(vx, vy)[0] for vx, vy in val_batches])))
        for layer in attn:
            layer.train()
print(f"{steps} steps in {time.perf_counter() - t0:.1f} s")
if torch is not None:
    rel = np.abs(np.array(history[:20]) - np.array(torch_history[:20])) / np.array(torch_history[:20])
    print(f"first 20 steps, pyattn vs PyTorch (float64): largest relative difference of the losses {rel.max():.1e}")
    assert rel.max() < 1e-8"""),
("code", """fig, ax = plt.subplots(figsize=(8, 4))
smooth = lambda a, w=20: np.convolve(a, np.ones(w) / w, mode="valid")
ax.plot(np.arange(len(smooth(history))) + 19, smooth(history), label="pyattn: training loss (mean of 20 steps)")
if torch_history:
    ax.plot(np.arange(len(smooth(torch_history))) + 19, smooth(torch_history), "--",
            label="PyTorch twin: training loss")
ax.plot(*zip(*val_history), "o-", label="pyattn: validation loss")
ax.axhline(bigram_val, color="grey", ls=":", label=f"bigram model, validation ({bigram_val:.2f})")
ax.set_xlabel("step"); ax.set_ylabel("cross-entropy (nats per character)")
ax.legend(); ax.set_title("Training a 2-block character transformer in NumPy + pyattn")
plt.show()
final_val = val_history[-1][1]
print(f"validation loss after {steps} steps: {final_val:.3f} nats per character; bigram baseline: {bigram_val:.3f}"
      f" -> the transformer is {'better' if final_val < bigram_val else 'not better'} than the bigram model by {bigram_val - final_val:+.3f}")"""),
("md", """## After training

The same prompt and seed as before training, and the attention of the first head of each
block on the same validation snippet: before training the weights are spread by chance;
after, the heads have learned where to look (printed numbers above say how far the loss
went; the pictures show how the heads changed)."""),
("code", """print("after training:", repr(generate("The ", 120)))
after = [head_weights(snippet, l) for l in range(L)]
fig, axes = plt.subplots(L, 2, figsize=(11, 5.5 * L))
labels = list(snippet)
for l in range(L):
    heatmap(axes[l, 0], before[l][0], labels, labels, f"block {l}, head 0, before training", colorbar=False)
    heatmap(axes[l, 1], after[l][0], labels, labels, f"block {l}, head 0, after training", colorbar=False)
plt.tight_layout(); plt.show()
print("mean absolute change of these weights:",
      [float(np.abs(after[l][0] - before[l][0]).mean().round(4)) for l in range(L)])"""),
]


NB["07_generation"] = [
("md", """# 07 · Generate with a KV cache

A language model writes one token at a time: it reads the text so far, predicts the next
token, appends it, and starts again. In causal attention a token's key and value depend
only on the tokens up to it, so they never change once computed. A **KV cache** keeps
them: each layer stores the keys and values of every token it has seen, and a new step
computes the query, key and value of the *new* token only, appends its key and value to
the cache, and lets the new query attend over everything cached. Without a cache, step `t`
re-runs the model over all `t` tokens (projections `O(t)`, attention `O(t²)`); with one, it
runs the model on one token and reads `t` cached rows.

This notebook builds a small character model from `pyattn.nn` layers, generates with
`pyattn.KVCache`, checks the result against re-running the whole prefix, times both ways,
counts the cache's bytes in float32, 16-bit, int8 and int4 (and what quantized caches do to
speed and to the next-token distribution), and pictures the attention variants that
`pyattn.attention_with_kvcache` takes (sliding window, ALiBi, softcap, sinks) and
`pyattn.merge_attention`."""),
("code", SETUP + """import os, platform, time
from pyattn.nn import MultiHeadAttention
try:
    import ml_dtypes                       # optional: NumPy's bfloat16
except ImportError:
    ml_dtypes = None
    print("ml_dtypes is not installed (pip install ml_dtypes): the bfloat16 parts are skipped")
pyattn.set_num_threads(1)                  # one thread: timings less disturbed by whatever else runs

""" + CPU_NAME + """"""),
("md", """## A tiny character model
Token embeddings plus position embeddings (one row per position), two pre-LayerNorm blocks
(`x + attention(LayerNorm(x))`, then `x + MLP(LayerNorm(x))`, with a causal
`pyattn.nn.MultiHeadAttention`), a final LayerNorm and a linear head over the characters
of `notebooks/data/tiny_corpus.txt`.

**The weights are random**: nothing here is trained. Only the head is fitted, by ridge least
squares on the corpus (as notebook 05 fits its read-out), so that the samples look a little
like the text. What matters is the mechanics: `hidden(ids, caches)` takes only the new
tokens when given one cache per layer, and places them after the tokens the caches hold."""),
("code", """text = open("data/tiny_corpus.txt").read().replace("\\n", " ")
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
V, D, H, N_LAYERS, MAX_LEN = len(chars), 64, 4, 2, 512
rng = np.random.default_rng(0)

def randn(*shape, std=1.0):
    return (rng.standard_normal(shape) * std).astype(np.float32)

tok_emb = randn(V, D)
pos_emb = randn(MAX_LEN, D, std=0.1)               # one row per position

def layer_norm(x, eps=1e-5):                       # no learned gain and bias (they start at 1 and 0)
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)

class Block:
    \"\"\"x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)).\"\"\"
    def __init__(self, seed):
        self.attn = MultiHeadAttention(D, D, H, context_length=MAX_LEN, rng=seed).eval()
        self.W1 = randn(D, 4 * D, std=D ** -0.5)
        self.W2 = randn(4 * D, D, std=0.3 * (4 * D) ** -0.5)

    def __call__(self, x, cache=None):
        x = x + self.attn(layer_norm(x), cache=cache)          # with a cache: x holds the new tokens only
        return x + pyattn.matmul(np.maximum(pyattn.matmul(layer_norm(x), self.W1), 0), self.W2)

blocks = [Block(seed) for seed in range(1, N_LAYERS + 1)]

def hidden(ids, caches=None):
    \"\"\"ids (B, T) -> final hidden states (B, T, D). With caches (one per layer), ids are the
    new tokens only, at the positions after those the caches hold.\"\"\"
    start = 0 if caches is None else int(caches[0].lengths[0])
    x = tok_emb[ids] + pos_emb[start:start + ids.shape[1]]
    for block, cache in zip(blocks, caches or [None] * N_LAYERS):
        x = block(x, cache)
    return layer_norm(x)

# the head, fitted by ridge least squares on windows of the corpus (teacher forcing)
ids = np.array([stoi[c] for c in text])
starts = range(0, len(ids) - 65, 4)
X = np.stack([ids[s:s + 64] for s in starts]); Y = np.stack([ids[s + 1:s + 65] for s in starts])
A = np.c_[hidden(X).reshape(-1, D), np.ones(X.size)].astype(np.float64)
W = np.linalg.solve(A.T @ A + np.eye(D + 1), A.T @ np.eye(V)[Y.ravel()])  # ridge: LayerNorm leaves A a direction short
W_head, b_head = W[:-1].astype(np.float32), W[-1].astype(np.float32)

def logits(ids, caches=None):
    return pyattn.matmul(hidden(ids, caches), W_head) + b_head

print(f"vocabulary of {V}, {N_LAYERS} blocks, {H} heads of {D // H}; "
      f"next-character accuracy of the fitted head on the corpus: {np.mean((A @ W).argmax(-1) == Y.ravel()):.0%}")"""),
("md", """## Generating, token by token
`layer.new_cache(batch, max_len)` allocates a `KVCache` for one attention layer: `k` and `v`
of shape `(batch, heads, max_len, head_dim)`, zeros, and `lengths`, the rows filled per
sequence. The first call reads the whole prompt (the *prefill*) and fills the caches; every
later call reads **one token**, whose key and value are appended in place, and its query
attends over all cached rows."""),
("code", """prompt = "the cat "
caches = [block.attn.new_cache(1, MAX_LEN) for block in blocks]
print(caches[0])
seq = [stoi[c] for c in prompt]
new = list(seq)                                    # what the model reads at this step
for step in range(5):
    before = int(caches[0].lengths[0])
    lg = logits(np.array([new]), caches)[0, -1]    # the last position predicts the next character
    print(f"step {step}: the model reads {len(new)} token(s), positions {before}..{before + len(new) - 1}; "
          f"each cache now holds {caches[0].lengths[0]} rows (without a cache it would read all {len(seq)})")
    seq.append(int(lg.argmax()))
    new = seq[-1:]
print(repr("".join(chars[i] for i in seq)))"""),
("md", """A generator that samples either way: with caches, or re-running the model over the whole
text at every step. It also returns each step's logits and time. (The fitted head's scores
are small, like probabilities, hence the low temperature.)"""),
("code", """def generate(prompt, n, use_cache=True, temperature=0.05, seed=0, dtype=np.float32):
    \"\"\"Sample n characters after prompt -> (text, logits of each step (n, V), seconds per step (n,)).\"\"\"
    g = np.random.default_rng(seed)
    seq = [stoi[c] for c in prompt]
    caches = [block.attn.new_cache(1, MAX_LEN, dtype) for block in blocks] if use_cache else None
    new, rows, times = list(seq), [], []
    for _ in range(n):
        t0 = time.perf_counter()
        lg = logits(np.array([new]), caches)[0, -1]
        p = pyattn.softmax(lg, scale=1 / temperature)
        seq.append(int(g.choice(V, p=p / p.sum())))
        times.append(time.perf_counter() - t0)
        rows.append(lg)
        new = seq[-1:] if use_cache else seq
    return "".join(chars[i] for i in seq), np.array(rows), np.array(times)

sample, step_logits, _ = generate(prompt, 150)
print(sample)"""),
("md", """## The same logits as re-running the whole prefix
One call without a cache over the whole generated text gives, at every position, the logits
from the prefix up to it (the mask is causal): exactly what each generation step computed.
They agree to float32 rounding. (Not to the bit: a one-query decode step sums in a
different order from the many-query kernel.)"""),
("code", """full = logits(np.array([[stoi[c] for c in sample[:-1]]]))[0, len(prompt) - 1:]   # no cache, one call
print("logits:", step_logits.shape, "largest difference, cached steps vs the whole prefix at once:",
      np.abs(full - step_logits).max())
assert np.allclose(full, step_logits, atol=1e-4)"""),
("md", """## Tokens per second as the text grows
Generate up to 512 characters both ways and time every step. Without a cache, step `t` runs
the model over `t` tokens (its time grows with the length, and the attention part with its
square); with a cache it runs one token and reads `t` cached rows (nearly flat here:
the small model's time goes to Python and the per-call overhead; the first cached step is
the prefill of the 8-character prompt). Thin lines are single steps, thick ones a running
median over 15 steps. **The times depend on the machine** (and on what else it runs): the
committed figure comes from the run that built this notebook, on the CPU named in its
title; re-run it to measure yours."""),
("code", """n = MAX_LEN - len(prompt)
text_cached, lg_cached, t_cached = generate(prompt, n, use_cache=True)
text_full, lg_full, t_full = generate(prompt, n, use_cache=False)
assert text_full == text_cached and np.allclose(lg_full, lg_cached, atol=1e-4)   # the same text either way
length = len(prompt) + np.arange(n)                   # tokens read so far when the step starts

def running_median(x, w=15):
    return np.median(np.lib.stride_tricks.sliding_window_view(np.r_[[x[0]] * (w // 2), x, [x[-1]] * (w // 2)], w), axis=1)

fig, axs = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
for ts, name, colour in ((t_full, "no cache: re-run the whole prefix", "C3"), (t_cached, "KVCache: one new token", "C0")):
    axs[0].plot(length, ts * 1e3, color=colour, alpha=0.25, lw=0.7)
    axs[0].plot(length, running_median(ts) * 1e3, color=colour, lw=2, label=name)
    axs[1].plot(length, 1 / running_median(ts), color=colour, lw=2, label=name)
axs[0].set_ylabel("ms per generated token"); axs[0].set_ylim(0, np.percentile(t_full, 99) * 1e3 * 1.1)
axs[1].set_ylabel("tokens per second"); axs[1].set_ylim(0, None)
for ax in axs:
    ax.set_xlabel("length of the text so far (tokens)"); ax.legend()
fig.suptitle(f"measured when this notebook ran, on {cpu_name()}, 1 thread (re-run to measure your machine)", fontsize=10)
plt.show()
for L in (64, 128, 256, 511):
    a, b = running_median(t_full)[L - len(prompt)], running_median(t_cached)[L - len(prompt)]
    print(f"at {L:3d} tokens: {a * 1e3:5.2f} ms without a cache, {b * 1e3:5.2f} ms with one ({a / b:4.1f}x)")
print(f"all {n} tokens: {n / t_full.sum():.0f} tokens/s without a cache, {n / t_cached.sum():.0f} with one")"""),
("md", """## How much memory the cache takes, and why decode is memory-bound
The cache holds, per layer, a key and a value vector for every KV head and every token:
`2 × layers × kv_heads × head_dim × tokens × bytes per number`. For the shape of an 8-billion
parameter model such as Llama 3 8B (32 layers, 8 KV heads of 128 dimensions, grouped-query
attention: 32 query heads share them) that is 256 KiB per token in float32.

A decode step reads **every byte of the cache** once, to do one multiply-add per number
for each query head that shares it: for float32 and 4 query heads per KV head, about 2
floating-point operations per byte loaded, while a processor's cores together can do ten
or more in the time the memory delivers one byte. So the step waits for memory, and its time is roughly the cache's bytes divided by the
memory bandwidth: at 8192 tokens a float32 cache is 2 GiB to read *per generated token*.
Storing the cache in 16 bits (`dtype=np.float16` or `ml_dtypes.bfloat16`) halves both the
memory and the bytes to read; pyattn widens each tile to float32 in the kernel and does the
arithmetic in float32. (Whether that also halves a step's time depends on the machine:
widening costs some arithmetic, which on a single core may matter more than the bytes.)"""),
("code", """layers, kv_heads, head_dim = 32, 8, 128
itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}
for name, size in itemsize.items():
    per_token = 2 * layers * kv_heads * head_dim * size          # K and V
    print(f"{name:8s}: {per_token / 2**10:4.0f} KiB per token, {per_token * 8192 / 2**30:.0f} GiB for 8192 tokens, "
          f"{per_token * 131072 / 2**30:3.0f} GiB for 128k tokens (one sequence)")
tokens = np.array([1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072])
fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
for name in ("float32", "bfloat16"):
    ax.plot(tokens, 2 * layers * kv_heads * head_dim * itemsize[name] * tokens / 2**30, marker="o",
            label=f"KV cache, {name}" + (" (or float16)" if name == "bfloat16" else ""))
ax.axhline(8.0e9 * 2 / 2**30, color="grey", ls="--", label="the model's 8B weights in bfloat16")
ax.set_xscale("log"); ax.set_yscale("log"); ax.minorticks_off()
ax.set_xticks(tokens, [f"{t // 1024}k" for t in tokens])
gib = [0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32]
ax.set_yticks(gib, [f"{g:g}" for g in gib])
ax.set_xlabel("tokens in the cache (one sequence)"); ax.set_ylabel("GiB")
ax.set_title("32 layers x 8 KV heads x 128 dims (Llama 3 8B's shape), computed", fontsize=10)
ax.legend(); plt.show()"""),
("md", """The small model's own caches, the real arrays, in each dtype, and how close 16-bit
caches keep the logits: the generated text is replayed through caches of each dtype, one
token at a time, and compared with the float32 caches. New keys and values are rounded
when they are written (bfloat16 keeps 8 significant bits, float16 11), the rest is float32."""),
("code", """def replay(text, dtype):
    \"\"\"Logits of each step when the model reads text through caches of dtype, one token at a
    time after the prompt (teacher forcing: the same tokens whatever the dtype).\"\"\"
    ids = [stoi[c] for c in text]
    caches = [block.attn.new_cache(1, MAX_LEN, dtype) for block in blocks]
    rows = [logits(np.array([ids[:len(prompt)]]), caches)[0, -1]]
    rows += [logits(np.array([ids[t:t + 1]]), caches)[0, -1] for t in range(len(prompt), len(ids) - 1)]
    return np.array(rows), caches

dtypes = {"float32": np.float32, "float16": np.float16}
if ml_dtypes is not None:
    dtypes["bfloat16"] = ml_dtypes.bfloat16
else:
    print("(bfloat16 skipped: ml_dtypes is not installed)")
ref, _ = replay(text_cached, np.float32)
p = pyattn.softmax(ref, scale=1 / 0.05)                # the sampling probabilities (temperature 0.05)
print(f"logits range over [{ref.min():.2f}, {ref.max():.2f}]")
for name, dt in dtypes.items():
    lg, caches = replay(text_cached, dt)
    nbytes = sum(c.k.nbytes + c.v.nbytes for c in caches)
    print(f"{name:8s} caches: {nbytes / 2**10:3.0f} KiB (k and v, {N_LAYERS} layers x {MAX_LEN} tokens, {caches[0].k.dtype})", end="")
    if dt is not np.float32:
        print(f"; vs float32: logits differ by at most {np.abs(lg - ref).max():.1e}, sampling probabilities by "
              f"{np.abs(pyattn.softmax(lg, scale=1 / 0.05) - p).max():.1e}, same likeliest character at "
              f"{np.mean(lg.argmax(-1) == ref.argmax(-1)):.0%} of {len(ref)} steps", end="")
    print()"""),
("md", """## Quantized caches: int8 and int4
A cache can be stored in fewer bits still. `dtype="int8"` or `"int4"` (in `KVCache`,
`layer.new_cache`, `PagedKVCache`) keeps each key and value row as small integers plus one
float32 **scale per group** of `group_size` numbers along the head dimension:
`scale = max|x| / 127` (int4: `/ 7`), `q = round(x / scale)`, read back as `q × scale`
(`pyattn.quantize` / `pyattn.dequantize`; llama.cpp's `q8_0` and `q4_0` caches work the same
way). New rows are quantized as they are written; the decode kernels read the integers and
scales in place and dequantize in registers, so a step reads about 1.125 bytes per number
(int8, groups of 32) or 0.625 (int4) instead of 4.

First the bytes, for Llama 3 8B's shape as above, and what that does to a decode step: one
attention layer of that shape (32 query heads over 8 KV heads of 128) reads a cache of `S`
tokens for one new token, timed here on one thread for each cache type. A decode step is
memory-bound, so fewer bytes should mean more tokens per second: the right panel shows
how many steps per second the attention of a 32-layer model would allow (one layer's time
× 32; the rest of the model not counted). The time is the step's **CPU time** (one thread,
the least of 15 steps), which on a machine busy with other work is steadier than the wall
clock and on an idle one the same. **The times depend on the machine** (its memory
bandwidth, its caches); re-run to measure yours. Where a type with fewer bytes is not
faster, its step is bound by arithmetic (unpacking and scaling the integers: int4 has two
numbers per byte to shift and sign-extend) rather than by memory, as one thread on a
machine with fast memory can show; more threads, or longer caches than the processor's
caches hold, tilt it back towards memory."""),
("code", """CACHE_TYPES = ["float32", "bfloat16", "int8", "int4"] if ml_dtypes is not None else ["float32", "int8", "int4"]
G32 = 32                                           # values per scale (int8 / int4)
COLOUR = {"float32": "C0", "bfloat16": "C1", "int8": "C2", "int4": "C3"}
bytes_per_value = {"float32": 4.0, "bfloat16": 2.0, "int8": 1 + 4 / G32, "int4": 0.5 + 4 / G32}

def kv_cache(kind, S, H_kv, E, g, data):
    \"\"\"A KVCache of one sequence, S rows filled from data (k, v float32 (1, H_kv, S, E)).\"\"\"
    dt = ml_dtypes.bfloat16 if kind == "bfloat16" else np.float32 if kind == "float32" else kind
    c = pyattn.KVCache(1, H_kv, S, E, dtype=dt, group_size=g)
    for arr, sc, x in ((c.k, c.k_scale, data[0]), (c.v, c.v_scale, data[1])):
        if sc is None:
            arr[...] = x.astype(arr.dtype)
        else:
            arr[...], sc[...] = pyattn.quantize(x, kind, group_size=g)
    return c

def decode_seconds(c, q, kn, vn, reps=15):
    \"\"\"The least CPU time of reps decode steps (write one token after S - 1 rows, attend over
    all S): CPU time, not wall time, so that other programs sharing the cores do not count.\"\"\"
    ts = []
    for _ in range(reps):
        c.lengths[:] = c.max_len - 1
        t = time.process_time(); c.attend(q, kn, vn); ts.append(time.process_time() - t)
    return min(ts)

g = np.random.default_rng(2)
H_q, H_kv, E128 = 32, 8, 128
lengths = [1024, 4096, 16384]
steps = {kind: [] for kind in CACHE_TYPES}
for S in lengths:
    data = g.standard_normal((2, 1, H_kv, S, E128), dtype=np.float32)
    q1 = g.standard_normal((1, H_q, 1, E128), dtype=np.float32)
    kn, vn = g.standard_normal((2, 1, H_kv, 1, E128), dtype=np.float32)
    for kind in CACHE_TYPES:
        steps[kind].append(decode_seconds(kv_cache(kind, S, H_kv, E128, G32, data), q1, kn, vn))
    del data

fig, axs = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
kinds = list(CACHE_TYPES)
per_token = [2 * layers * kv_heads * head_dim * bytes_per_value[k] for k in kinds]   # K and V, all layers
bars = axs[0].bar(kinds, [b * 8192 / 2**30 for b in per_token], color=[COLOUR[k] for k in kinds])
axs[0].bar_label(bars, [f"{b * 8192 / 2**30:.2f} GiB" for b in per_token])
axs[0].set_ylabel("GiB"); axs[0].set_title("KV cache of 8192 tokens, Llama 3 8B's shape (computed)", fontsize=10)
for kind in kinds:
    axs[1].plot(lengths, [1 / (layers * t) for t in steps[kind]], marker="o", color=COLOUR[kind], label=kind)
axs[1].set_xscale("log", base=2); axs[1].set_yscale("log")
axs[1].set_xticks(lengths, [f"{S // 1024}k" for S in lengths])
axs[1].set_xlabel("tokens in the cache"); axs[1].set_ylabel("tokens per second (attention only, 32 layers)")
axs[1].set_title(f"measured: one layer (GQA {H_q}/{H_kv}, head dim {E128}) x 32, 1 thread, CPU time", fontsize=10)
axs[1].legend()
fig.suptitle(f"when this notebook ran, on {cpu_name()} (re-run to measure your machine)", fontsize=10)
plt.show()
for kind in kinds:
    print(f"{kind:8s}: {bytes_per_value[kind]:5.3f} bytes per number; decode step of one layer at "
          + ", ".join(f"{S // 1024}k: {t * 1e3:6.2f} ms" for S, t in zip(lengths, steps[kind]))
          + f"  ({steps['float32'][-1] / steps[kind][-1]:.1f}x float32 at {lengths[-1] // 1024}k)")"""),
("md", """Fewer bits are not free: every key and value is now off by up to half a step
(`scale / 2`), and the model's next-token distribution moves. How far is the trade-off a
user has to judge, so measure it: the small model reads a **held-out text** (a passage of
`training_corpus.txt`, which the head was not fitted on, lower-cased and kept to the
model's characters) through caches of each type, one token at a time (teacher forcing:
every cache type sees the same tokens), and at every step the next-character distribution
(the sampling distribution at temperature 0.05, as above) is compared with the one from the
float32 cache by the **KL divergence** `KL(p_float32 ‖ p_cache) = Σ p_float32 log(p_float32 / p_cache)`
(0: the same distribution; in nats). The small model's heads have 16 dimensions, so its
int8 / int4 caches take one scale per 16 numbers (`group_size=16`)."""),
("code", """held = " ".join(open("data/training_corpus.txt").read().lower().split())
held = "".join(c for c in held if c in stoi)[5000:5400]          # 400 characters the head never saw
print(repr(held[:120]) + " ...")

def replay_cache(text, kind, group_size=16):
    \"\"\"Logits of each step (teacher forcing) through caches of kind, and the caches.\"\"\"
    dt = ml_dtypes.bfloat16 if kind == "bfloat16" else np.float32 if kind == "float32" else kind
    ids = [stoi[c] for c in text]
    caches = [block.attn.new_cache(1, MAX_LEN, dt, group_size) for block in blocks]
    rows = [logits(np.array([ids[:len(prompt)]]), caches)[0, -1]]
    rows += [logits(np.array([ids[t:t + 1]]), caches)[0, -1] for t in range(len(prompt), len(ids) - 1)]
    return np.array(rows, np.float64), caches

def log_probs(lg, temperature=0.05):
    z = lg / temperature
    return z - np.logaddexp.reduce(z, axis=-1, keepdims=True)

ref_lg, _ = replay_cache(held, "float32")
lp_ref = log_probs(ref_lg)
kl, agree = {}, {}
for kind in CACHE_TYPES:
    lg, caches = replay_cache(held, kind)
    kl[kind] = np.sum(np.exp(lp_ref) * (lp_ref - log_probs(lg)), axis=-1)
    agree[kind] = np.mean(lg.argmax(-1) == ref_lg.argmax(-1))
    nbytes = sum(a.nbytes for c in caches for a in (c.k, c.v, c.k_scale, c.v_scale) if a is not None)
    print(f"{kind:8s}: caches {nbytes / 2**10:4.0f} KiB (scales included); KL vs float32 per step: mean "
          f"{kl[kind].mean():.1e}, largest {kl[kind].max():.1e} nats; same likeliest character at "
          f"{agree[kind]:.0%} of {len(ref_lg)} steps")
assert np.all(kl["float32"] == 0)                    # the float32 cache against itself
assert kl["int4"].mean() > kl["int8"].mean()         # fewer bits, a larger change

fig, ax = plt.subplots(figsize=(10, 4), layout="constrained")
for kind in CACHE_TYPES[1:]:
    ax.plot(np.maximum(kl[kind], 1e-12), color=COLOUR[kind], lw=0.6, alpha=0.3)
    mean15 = np.convolve(kl[kind], np.ones(15) / 15, mode="same")     # a running mean over 15 steps
    ax.plot(mean15, color=COLOUR[kind], lw=2, label=f"{kind}: mean {kl[kind].mean():.1e} nats")
ax.set_yscale("log"); ax.set_ylim(1e-9, None)
ax.set_xlabel("step of the held-out text (characters read)"); ax.set_ylabel("KL(float32 || cache type), nats")
ax.set_title("how far each cache type moves the next-character distribution (temperature 0.05); "
             "thin: each step, thick: running mean", fontsize=10)
ax.legend(); plt.show()"""),
("md", """## Attention variants, pictured
The cached call takes the same structured masks as `scaled_dot_product_attention`, with
positions counted in the cache.

**Sliding window.** `window=(left, right)`: query `i` sees keys `i - left … i + right`.
With `is_causal=True` and `window=(3, 0)` each token sees itself and the 3 before it (Mistral
uses `(4095, 0)`). Information still travels further through the layers. The kernel skips
the key tiles outside the window, so a decode step reads only the rows near the end of the
cache however long it is (the `KVCache` itself still keeps every row). Below, the weights
for `L = S = 12`; the same rule applied token by token through a `KVCache` gives the same
rows."""),
("code", """L = S = 12
rng = np.random.default_rng(1)
q, k, v = (rng.standard_normal((1, 1, L, 8), dtype=np.float32) for _ in range(3))
out, w = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, window=(3, 0), return_weights=True)
i, j = np.indices((L, S))
allowed = (j <= i) & (j >= i - 3)
assert np.array_equal(w[0, 0] > 0, allowed)
cache = pyattn.KVCache(1, 1, L, 8)                    # the same, one token at a time
steps = np.concatenate([cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], window=(3, 0))
                        for t in range(L)], axis=2)
print("decoding through a KVCache vs the whole sequence at once, largest difference:", np.abs(steps - out).max())
assert np.allclose(steps, out, atol=1e-6)
fig, ax = plt.subplots(figsize=(6, 5), layout="constrained")
heatmap(ax, np.where(allowed, w[0, 0], -np.inf), colorbar="attention weight",
        title="window=(3, 0), is_causal=True:\\neach query sees itself and the 3 keys before it")
plt.show()"""),
("md", """**ALiBi.** Instead of position embeddings, ALiBi adds a penalty proportional to distance
to every score: `-slope[h] × |i - j|`, one slope per head (a geometric series: `2^(-8h/H)`
for heads `h = 1 … H`). Steep heads look near, gentle heads far, and the rule extends to any
length. `alibi_slopes=` adds it inside the kernel; below, the biases of heads 1, 2 and 4
of eight (future keys masked by causality), and a check that the weights equal a softmax
of scores plus these biases."""),
("code", """H8 = 8
slopes = 2.0 ** (-8.0 * np.arange(1, H8 + 1) / H8)
bias = np.where(j <= i, -slopes[:, None, None] * np.abs(i - j), -np.inf)        # (H, L, S), causal
q8, k8, v8 = (rng.standard_normal((H8, L, 8), dtype=np.float32) for _ in range(3))
_, w8 = pyattn.scaled_dot_product_attention(q8, k8, v8, is_causal=True, alibi_slopes=slopes, return_weights=True)
by_hand = pyattn.softmax(q8 @ k8.transpose(0, 2, 1) / np.sqrt(8) + bias)
print("alibi_slopes vs softmax(scores + bias) by hand, largest difference:", np.abs(w8 - by_hand).max())
assert np.allclose(w8, by_hand, atol=1e-5)
fig, axs = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
for ax, h in zip(axs, (0, 1, 3)):
    im = heatmap(ax, bias[h], title=f"head {h + 1} of 8: slope {slopes[h]:.3g}", colorbar=False,
                 vmin=bias[0][np.isfinite(bias[0])].min(), vmax=0)
fig.colorbar(im, ax=axs, shrink=0.8, label="bias added to the score; grey: masked (causal)")
plt.show()"""),
("md", """**Softcap.** `softcap=c` replaces each scaled score `s` by `c · tanh(s / c)` before the
softmax (Gemma 2 uses `c = 50`): small scores pass almost unchanged, large ones are squashed
below `c`, so no single key can take all the weight through one huge score."""),
("code", """s = np.linspace(-60, 60, 241)
scores_q, scores_k = np.ones((1, 1)), np.array([[40.0], [20.0], [0.0], [-10.0]])   # E = 1, scale 1: scores 40, 20, 0, -10
print("weights without softcap:", pyattn.scaled_dot_product_attention(scores_q, scores_k, np.eye(4), scale=1.0)[0])
print("weights, softcap=20:    ", pyattn.scaled_dot_product_attention(scores_q, scores_k, np.eye(4), scale=1.0, softcap=20.0)[0])
fig, ax = plt.subplots(figsize=(5.5, 3.8), layout="constrained")
ax.plot(s, s, "k--", lw=1, label="no softcap")
for c in (10, 20, 50):
    ax.plot(s, c * np.tanh(s / c), label=f"softcap={c}")
ax.set_xlabel("scaled score"); ax.set_ylabel("score the softmax sees"); ax.set_ylim(-62, 62); ax.legend()
plt.show()"""),
("md", """**Sinks.** A softmax always hands out a total weight of 1, even when no key is a good
match, so a head that has nothing to say still mixes some values in. `sinks=` (gpt-oss) adds
one learned logit per head to every row's denominator, a key whose value is zero: the
weights of the real keys may now sum to less than 1. Below, row 4's scores are all very
negative: without a sink its weights still sum to 1; with a sink (logit 0) they nearly
vanish, and so does its output. Row 2 has every key masked (a bool mask row all `False`):
weights 0 and an output of 0 either way. The sink's own weight is not among the weights
returned."""),
("code", """T = 6
k6 = rng.standard_normal((1, T, 4), dtype=np.float32); k6[..., 0] = 3.0       # every key points one way...
q6 = 0.3 * rng.standard_normal((1, T, 4), dtype=np.float32); q6[0, 4] = [-4, 0, 0, 0]   # ...query 4 the other
v6 = rng.standard_normal((1, T, 3), dtype=np.float32)
mask = np.tril(np.ones((T, T), bool)); mask[2] = False                          # row 2: nothing to attend to
o0, w0 = pyattn.scaled_dot_product_attention(q6, k6, v6, attn_mask=mask, return_weights=True)
o1, w1 = pyattn.scaled_dot_product_attention(q6, k6, v6, attn_mask=mask, sinks=np.zeros(1, np.float32),
                                             return_weights=True)
print("row sums without a sink:", w0[0].sum(-1))
print("row sums with a sink:   ", w1[0].sum(-1))
print("output row 4 without / with a sink:", o0[0, 4], o1[0, 4])
fig, axs = plt.subplots(1, 2, figsize=(13, 4.6), layout="constrained")
for ax, wt, name in ((axs[0], w0[0], "without a sink"), (axs[1], w1[0], "with a sink (logit 0)")):
    im = heatmap(ax, np.where(mask, wt, -np.inf), rows=[f"{r}: sum {x:.2f}" for r, x in enumerate(wt.sum(-1))],
                 title=name, colorbar=False, vmin=0, vmax=1)
fig.colorbar(im, ax=axs, shrink=0.8, label="attention weight; grey: masked")
plt.show()"""),
("md", """## Merging partial results: the log-sum-exp
With `return_lse=True` attention also returns, per row, `lse = log Σ_j exp(s_j)` over the keys
it saw. Two results over disjoint sets of keys then combine exactly into the result over
their union: `out = e^(lse₁ - lse) out₁ + e^(lse₂ - lse) out₂` with `lse = logaddexp(lse₁, lse₂)`.
`pyattn.merge_attention` does it; that is how a long cache is split over threads in a
decode step, and how ring attention spreads keys over machines."""),
("code", """q, k, v = (rng.standard_normal((4, 10, 16), dtype=np.float32) for _ in range(3))
whole, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
o1, l1 = pyattn.scaled_dot_product_attention(q, k[:, :6], v[:, :6], return_lse=True)   # keys 0..5
o2, l2 = pyattn.scaled_dot_product_attention(q, k[:, 6:], v[:, 6:], return_lse=True)   # keys 6..9
merged, lse_m = pyattn.merge_attention([o1, o2], [l1, l2])
by_hand = np.exp(l1 - lse_m)[..., None] * o1 + np.exp(l2 - lse_m)[..., None] * o2
print("merged vs whole:", np.abs(merged - whole).max(), " lse:", np.abs(lse_m - lse).max(),
      " by hand vs merged:", np.abs(by_hand - merged).max())
assert np.allclose(merged, whole, atol=1e-5) and np.allclose(lse_m, lse, atol=1e-5)"""),
]


# ---------------------------------------------------------------------------
NB["08_scale_out"] = [
("md", """# 08 · Beyond one machine: pyattn on Dask
pyattn works on NumPy arrays in one process. `pyattn.dask` builds the same attention as a
[Dask](https://docs.dask.org) task graph over chunked arrays, so the work can spread over the
worker processes of a cluster: the threads of one machine, several processes, or many
machines. It needs the optional extra (`pip install "pyattn[dask]"`: `dask[array]` and
`distributed`); `import pyattn` alone never imports dask.

This notebook starts a small cluster of worker processes **on this machine**, runs a batch of
sequences on it, splits one long causal sequence along its queries and its keys, times one
and two workers against local pyattn, and ends with the three lines that point the same
code at a real cluster."""),
("code", SETUP + """import os, platform, time
import dask
import dask.array as da
from dask.distributed import Client, LocalCluster, wait
import pyattn.dask                         # needs the dask extra: pip install "pyattn[dask]"

""" + CPU_NAME + "\n" + BEST + """
def task_names(arr, prefix):
    \"\"\"The keys of arr's task graph whose name starts with prefix.\"\"\"
    names = (key[0] if isinstance(key, tuple) else key for key in arr.__dask_graph__())
    return [n for n in names if isinstance(n, str) and n.startswith(prefix)]

print(f"dask {dask.__version__}, {os.cpu_count()} CPUs here: {cpu_name()}")"""),
("md", """## Why attention splits exactly
Row `i` of the output is `out_i = Σ_j softmax(s_i)_j v_j`, with scores `s_ij = q_i · k_j × scale`.
It depends on query `i` and on the keys and values, never on another query. So chunks of the
query, along the batch, the heads or the rows `L`, are **independent tasks**: each runs the
ordinary kernel on its rows, and nothing passes between them.

Chunks of the **keys** need one more number per row. Attention over a chunk `A` of keys with
`return_lse=True` also returns `lse_A = log Σ_{j∈A} exp(s_ij)`, and two chunks combine exactly:

    lse = logaddexp(lse_A, lse_B)
    out = exp(lse_A - lse) · out_A + exp(lse_B - lse) · out_B

(`pyattn.merge_attention`; notebook 07 checks it by hand). `pyattn.dask` makes one task per
(query chunk, key chunk) pair and merges each query chunk's partial results in a tree,
neighbours first. The arithmetic is the same; only the order in which the sums are added
changes, so results equal local pyattn up to float rounding."""),
("md", """## A cluster on this machine
`LocalCluster(processes=True)` starts a scheduler and worker *processes*, as a real cluster
would have, here two workers of one thread each. They talk over TCP on the loopback
interface (127.0.0.1): nothing outside this machine can reach them (`dashboard_address` is
pinned to 127.0.0.1 too, on any free port). The dashboard shows the tasks live while they
run (its pages need the `bokeh` package, which this notebook does not)."""),
("code", """cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                       dashboard_address="127.0.0.1:0")      # loopback only, any free port
client = Client(cluster)
print("scheduler:", cluster.scheduler_address)
print("dashboard:", client.dashboard_link)
print("workers (address: threads):", client.nthreads())"""),
("md", """## A batch of sequences
32 sequences of 8 heads, `L = S = 1024`, head size 64, causal, in chunks of 4 sequences:
8 query chunks, so 8 independent attention tasks. The inputs are made **by the workers**
(`dask.array.random`) and kept in their memory (`persist`): nothing passes through this
notebook. (A NumPy array wrapped with `da.from_array` travels inside the task graph: fine
when small, slow when big. Real data would be read by the workers themselves, e.g. with
`da.from_zarr`.)

`pyattn.dask.scaled_dot_product_attention` takes the arguments of the local function and
returns a lazy dask array whose chunks follow the query's; `compute()` runs the tasks on the
cluster and gathers the result here."""),
("code", """B, H, L, E = 32, 8, 1024, 64
rng = da.random.default_rng(0)
q, k, v = (rng.standard_normal((B, H, L, E), dtype=np.float32, chunks=(4, H, L, E)) for _ in range(3))
q, k, v = client.persist([q, k, v])                  # made by the workers, kept in their memory
wait([q, k, v])

y = pyattn.dask.scaled_dot_product_attention(q, k, v, is_causal=True)
print(y)                                             # lazy: nothing has run yet
print("chunks along the batch:", y.chunks[0], "|", len(task_names(y, "pyattn-attention")), "attention tasks")
t = time.perf_counter()
out = y.compute()                                    # runs on the cluster, result gathered here
print(f"computed on the cluster in {time.perf_counter() - t:.2f} s: {type(out).__name__} {out.shape} {out.dtype}")

qn, kn, vn = dask.compute(q, k, v)                   # the same inputs, brought here
ref = pyattn.scaled_dot_product_attention(qn, kn, vn, is_causal=True)
print("cluster vs local pyattn, largest difference:", np.abs(out - ref).max())
assert np.allclose(out, ref)"""),
("md", """Chunks along the batch split nothing inside a sequence: each task runs the local kernel on
whole rows, so the result is the local one (here to the last bit)."""),
("md", """## One long sequence, split along queries and keys
One sequence of `L = S = 8192` tokens, 4 heads, split into 8 chunks of 1024 along both `L`
and `S`: 8 × 8 = 64 (query chunk, key chunk) pairs. Without a mask, query chunk `i` attends
to all 8 key chunks and merges 8 partial results (7 merges). **Causal** attention lets query
chunk `i` see only key chunks `0 … i`: the pairs above the diagonal are entirely masked, and
`pyattn.dask` makes no task for them. That leaves `n(n+1)/2 = 36` attention tasks instead of
64, and `i` merges for query chunk `i`, 28 in all: nearly half the work is never scheduled,
the same half a causal kernel skips tile by tile on one machine. The tasks are named
`pyattn-attention-…` and `pyattn-merge-…` in the graph; the count below reads them there."""),
("code", """n = 8
L2 = S2 = 8192
rng = da.random.default_rng(1)
q2, k2, v2 = client.persist([rng.standard_normal((1, 4, L2, E), dtype=np.float32, chunks=(1, 4, L2 // n, E))
                             for _ in range(3)])
wait([q2, k2, v2])
y2 = pyattn.dask.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
y2_full = pyattn.dask.scaled_dot_product_attention(q2, k2, v2)          # no mask: every pair
attn, merges = task_names(y2, "pyattn-attention"), task_names(y2, "pyattn-merge")
print(f"causal:    {len(attn):2d} attention tasks (n(n+1)/2 = {n * (n + 1) // 2}), {len(merges)} merges")
print(f"no mask:   {len(task_names(y2_full, 'pyattn-attention')):2d} attention tasks (n*n = {n * n}), "
      f"{len(task_names(y2_full, 'pyattn-merge'))} merges")
assert len(attn) == n * (n + 1) // 2 and len(task_names(y2_full, "pyattn-attention")) == n * n

# which (query chunk, key chunk) pairs became tasks: the last two numbers of each task's name
def tiles(names, causal):
    m = np.full((n, n), np.nan)                     # nan: no task
    for name in names:
        i, j = map(int, name.rsplit("-", 2)[-2:])
        m[i, j] = 1.0 if causal and i == j else 0.0
    return m

fig, axs = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
legend = {0.0: "a task: every key visible", 1.0: "a task: causal mask inside", np.nan: "no task"}
heatmap(axs[0], tiles(task_names(y2_full, "pyattn-attention"), False), fmt="", colorbar=False, vmin=0, vmax=1,
        xlabel="key chunk (1024 keys)", ylabel="query chunk (1024 queries)",
        title=f"no mask: {n * n} attention tasks")
m = tiles(attn, True)
heatmap(axs[1], m, fmt="", colorbar=False, vmin=0, vmax=1, legend=legend,
        rows=[f"{i}: {i} merge{'s' if i != 1 else ''}" for i in range(n)],
        xlabel="key chunk (1024 keys)", ylabel="query chunk: merges",
        title=f"is_causal=True: {np.isfinite(m).sum()} attention tasks, {len(merges)} merges")
plt.show()"""),
("md", """On the cluster, and against local pyattn on the same inputs. Where a query chunk has one
key chunk (chunk 0) nothing is merged and the rows are the local ones; elsewhere **the merge
reassociates the sums** (a log-sum-exp of per-chunk sums instead of one running sum), so
results differ by float32 rounding: `np.allclose` with `rtol=1e-5, atol=1e-6` (float32 keeps
about 7 significant digits)."""),
("code", """t = time.perf_counter()
out2 = y2.compute()
print(f"computed on the cluster in {time.perf_counter() - t:.2f} s")
q2n, k2n, v2n = dask.compute(q2, k2, v2)
ref2 = pyattn.scaled_dot_product_attention(q2n, k2n, v2n, is_causal=True)
diff = np.abs(out2 - ref2).reshape(4, n, L2 // n, E).max(axis=(0, 2, 3))
print("largest difference per query chunk:", ", ".join(f"{d:.1e}" for d in diff))
print(f"largest difference overall: {diff.max():.1e} (values up to {np.abs(ref2).max():.2f})")
assert np.allclose(out2, ref2, rtol=1e-5, atol=1e-6)     # the merge reassociates the sums"""),
("md", """## Threads: one rule per worker
A worker with `k` threads runs up to `k` tasks at once. Each task's pyattn call takes its
share of the worker's thread budget, `max(1, budget // k)`, so a worker is never
oversubscribed. The budget is the worker's `OMP_NUM_THREADS` when set, else its CPUs. The
*nanny* that `LocalCluster(processes=True)` and `dask worker` use to start worker processes
sets `OMP_NUM_THREADS=1` by default: that is dask's own rule, one thread per task and
parallelism from the tasks. So here each task runs pyattn on one thread, and one worker uses
one core. `pyattn.dask.set_task_threads(n)` fixes the number instead (it is recorded in the
graphs built afterwards, so it reaches remote workers), e.g. for workers started with one
task thread on machines with many cores."""),
("code", """print("OMP_NUM_THREADS in each worker:", client.run(lambda: os.environ.get("OMP_NUM_THREADS")))"""),
("md", """## Timings: one worker, two workers, local pyattn
**The machine that built this notebook has 2 CPU cores, so two workers of one thread each is
the most that can help**: at best two workers halve one worker's time (the figure's title
names the CPUs of the machine that ran it). The same graph on a real cluster spreads over as
many workers as it has chunks. The batch above, timed (best of 3) on a second cluster with
one worker and on the two-worker cluster, both ways: the result left on the workers
(`persist`, as a pipeline that goes on computing there would), and gathered into this
notebook (`compute`, which also copies the 64 MiB result between processes). Local pyattn
on the same inputs, in this process with 1 and 2 threads, for comparison.

**The timings are illustrative**: they were measured when this notebook ran, on a small
shared machine, and they are not yours. Re-running the notebook re-measures everything."""),
("code", """def time_batch(client, n=3):
    \"\"\"Best of n runs of the batch's attention on client's cluster, in seconds:
    (result kept on the workers, result gathered here).\"\"\"
    rng = da.random.default_rng(2)
    q, k, v = client.persist([rng.standard_normal((B, H, L, E), dtype=np.float32, chunks=(4, H, L, E))
                              for _ in range(3)])
    wait([q, k, v])
    attn = lambda: pyattn.dask.scaled_dot_product_attention(q, k, v, is_causal=True)   # a fresh graph
    kept = lambda: wait(client.persist(attn()))
    gathered = lambda: client.compute(attn()).result()
    kept()                                            # warm-up: the workers import pyattn
    return best(kept, n), best(gathered, n)

times = {}
with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0") as one, \\
        Client(one) as client1:
    times["1 worker"] = time_batch(client1)
times["2 workers"] = time_batch(client)

threads = pyattn.get_num_threads()
local = {}
for nt in (1, 2):
    pyattn.set_num_threads(nt)
    local[f"local pyattn, {nt} thread{'s' if nt > 1 else ''}"] = best(
        lambda: pyattn.scaled_dot_product_attention(qn, kn, vn, is_causal=True))
pyattn.set_num_threads(threads)

labels, secs, colours = [], [], []
for name, t in local.items():
    labels.append(name); secs.append(t); colours.append("C0")
for name, (kept, gathered) in times.items():
    labels += [f"Dask, {name}: result kept there", f"Dask, {name}: gathered here"]
    secs += [kept, gathered]; colours += ["C1" if name == "1 worker" else "C2"] * 2
fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
bars = ax.barh(labels[::-1], secs[::-1], color=colours[::-1])
ax.bar_label(bars, fmt="%.2f s", padding=3)
ax.set_xlabel(f"seconds (best of 3): {B} sequences x {H} heads, L = S = {L}, E = {E}, causal, float32")
ax.set_xlim(0, max(secs) * 1.2)
ax.set_title(f"measured when this notebook ran, on {cpu_name()}, {os.cpu_count()} CPUs\\n"
             "(illustrative: re-run to measure your machine)", fontsize=10)
plt.show()
for name, t in zip(labels, secs):
    print(f"{name:38s} {t:.3f} s")"""),
("md", """What the bars show on a machine this small: the cluster's times include work a single
process does not do: the scheduler's round trips, moving chunks between processes, and for
"gathered here" copying the whole result into the notebook. With two cores, two workers
can at most halve one worker's time, and local pyattn already uses both cores in one
process, without any of those costs. Dask pays off when the data or the work outgrows one
machine: more cores than one machine has, or arrays larger than its memory, which then
never need to exist in one place."""),
("md", """## The same code on a real cluster
Start a scheduler (`dask scheduler`) and workers (`dask worker scheduler-address:8786`) on
machines that have `pyattn[dask]` installed (the same version everywhere: tasks call pyattn
by name), then connect to it instead of starting a `LocalCluster`:

```python
from dask.distributed import Client
client = Client("scheduler-address:8786")
y = pyattn.dask.scaled_dot_product_attention(q, k, v, is_causal=True)   # the same calls as above
```

Everything else in this notebook stays as it is: the graph does not depend on where it runs.
Load the inputs on the workers (`da.from_zarr`, `da.random`, …) rather than from NumPy
arrays in the notebook. `pyattn.dask.multi_head_attention` does the projections and the
heads of `pyattn.multi_head_attention` the same way, per chunk."""),
("code", """client.close()
cluster.close()
print("client and cluster closed")"""),
]


NB["11_pytorch"] = [
("md", """# 11 · pyattn inside PyTorch and Hugging Face transformers

Most people who run a transformer on a CPU run it through PyTorch, and most load it with
Hugging Face `transformers`. pyattn offers both a door:

- `pyattn.torch.scaled_dot_product_attention` takes CPU tensors with the arguments of
  `torch.nn.functional.scaled_dot_product_attention` (plus pyattn's `window`, `softcap`,
  `sinks`, `alibi_slopes`). It reads the tensors in place and is a `torch.library` custom op
  with a backward, so autograd, `torch.compile(fullgraph=True)` and `torch.export` take it.
- `import pyattn.transformers` registers `"pyattn"` as an attention implementation: any
  model that supports `attn_implementation=` then runs its attention layers on pyattn.

This notebook trains through the op and checks the gradients against PyTorch's, then builds
a small Llama from a config (random weights: nothing is downloaded) and generates with
`"sdpa"` and `"pyattn"`: the same tokens, and the time of each. (Needs
`pip install "pyattn[transformers]"`.)"""),
("code", SETUP + """import time, warnings
warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm without ipywidgets
import torch
import torch.nn.functional as F
import transformers
import pyattn.torch as pt
import pyattn.transformers                  # registers attn_implementation="pyattn"
transformers.utils.logging.disable_progress_bar()
torch.manual_seed(0)
torch.set_num_threads(1); pyattn.set_num_threads(1)   # one thread each: fair, quiet timings
print("torch", torch.__version__, "| transformers", transformers.__version__)"""),
("md", """## A training step through `pyattn.torch`

A small causal self-attention block written with PyTorch layers; its attention call is a
parameter, so the same weights run once through PyTorch's SDPA and once through pyattn's
op. The gradients of every parameter agree to float32 rounding."""),
("code", """class Block(torch.nn.Module):
    def __init__(self, d=64, heads=4, kv_heads=2, sdpa=F.scaled_dot_product_attention):
        super().__init__()
        self.h, self.hkv, self.e, self.sdpa = heads, kv_heads, d // heads, sdpa
        self.q = torch.nn.Linear(d, d)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.e)
        self.o = torch.nn.Linear(d, d)

    def forward(self, x):                                   # x (B, T, d)
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.h, self.e).transpose(1, 2)        # (B, H, T, E)
        k, v = self.kv(x).view(B, T, 2, self.hkv, self.e).permute(2, 0, 3, 1, 4)
        y = self.sdpa(q, k, v, is_causal=True, enable_gqa=True)          # grouped-query heads
        return self.o(y.transpose(1, 2).reshape(B, T, -1))

ref = Block()
mine = Block(sdpa=pt.scaled_dot_product_attention)
mine.load_state_dict(ref.state_dict())
x = torch.randn(8, 48, 64)
target = torch.randn(8, 48, 64)
for m in (ref, mine):
    F.mse_loss(m(x), target).backward()
for (name, a), b in zip(ref.named_parameters(), mine.parameters()):
    print(f"{name:10s} grad {tuple(a.grad.shape)!s:12s} max |pyattn - torch| = {float((a.grad - b.grad).abs().max()):.1e}")
opt = torch.optim.SGD(mine.parameters(), lr=0.1)
opt.step()                                                   # an ordinary optimizer step
with torch.no_grad():
    print("loss after one step:", float(F.mse_loss(mine(x), target)))"""),
("md", """## `attn_implementation="pyattn"` in transformers

A Llama with grouped-query attention (8 query heads share 2 key/value heads) from a config.
`generate()` runs the prompt through every layer once (prefill: causal attention over the
prompt) and then one token per step against transformers' KV cache (decode: one query per
layer against all cached keys; pyattn's decode path). Greedy decoding gives the same tokens
with both implementations."""),
("code", """cfg = transformers.LlamaConfig(vocab_size=2000, hidden_size=256, intermediate_size=512,
                               num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                               max_position_embeddings=2048)
model = transformers.LlamaForCausalLM(cfg).eval()
prompt = torch.randint(0, 2000, (1, 1024))
tokens, seconds = {}, {}
for impl in ("sdpa", "pyattn", "sdpa", "pyattn"):              # twice each, the second timed
    model.set_attn_implementation(impl)
    t = time.perf_counter()
    tokens[impl] = model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    seconds[impl] = time.perf_counter() - t
print("same tokens:", torch.equal(tokens["sdpa"], tokens["pyattn"]))
print("new tokens:", tokens["pyattn"][0, -32:].tolist())
for impl, s in seconds.items():
    print(f"{impl:7s} generate (1024-token prompt + 32 tokens): {s:.2f} s")"""),
("md", """Where does the time go? The attention functions, timed inside the model (each layer's call
summed), for the prefill of the prompt: attention is the part that grows with the square of
the length, and the part pyattn replaces. The rest (projections, MLP, the vocabulary head)
runs in PyTorch either way."""),
("code", """from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
spent = {}

def timed(name, fn):
    def f(*a, **kw):
        t = time.perf_counter(); r = fn(*a, **kw); spent[name] += time.perf_counter() - t
        return r
    return f

rows = {}
for name, fn in (("sdpa", sdpa_attention_forward), ("pyattn", pyattn.transformers.attention_forward)):
    AttentionInterface.register(name + "_timed", timed(name, fn))
    AttentionMaskInterface.register(name + "_timed", sdpa_mask)
    model.set_attn_implementation(name + "_timed")
    best = None
    for _ in range(3):
        spent[name] = 0.0
        t = time.perf_counter()
        with torch.no_grad():
            model(prompt, logits_to_keep=1)
        total = time.perf_counter() - t
        if best is None or total < best[0]:
            best = (total, spent[name])
    rows[name] = best
fig, ax = plt.subplots(figsize=(9, 2.4))
for i, (name, (total, attn)) in enumerate(rows.items()):
    ax.barh(i, attn * 1e3, color="tab:orange", label="attention" if i == 0 else None)
    ax.barh(i, (total - attn) * 1e3, left=attn * 1e3, color="tab:blue", label="everything else" if i == 0 else None)
    ax.text(total * 1e3, i, f" {total * 1e3:.0f} ms (attention {attn * 1e3:.0f} ms)", va="center")
ax.set_yticks(range(len(rows)), list(rows))
ax.set_xlabel("prefill of 1024 tokens, 4 layers, 1 thread (ms)")
ax.set_xlim(0, max(t for t, _ in rows.values()) * 1e3 * 1.6)
ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0)); plt.tight_layout(); plt.show()"""),
("md", """The 4-D masks transformers builds are read for their structure: a mask that is exactly
causal, causal with a sliding window, or either with padded keys becomes `is_causal`,
`window` and a `(B, 1, 1, S)` key-padding row, so pyattn skips the tiles outside the band
instead of reading an `(L, S)` mask. Below: a left-padded sliding-window mask (Mistral's
kind) and what pyattn is handed instead; any other mask goes to pyattn as it is."""),
("code", """from transformers.masking_utils import sliding_window_causal_mask_function
L = 12
pad = torch.ones(1, L, dtype=torch.bool); pad[0, :3] = False
mask = sdpa_mask(batch_size=1, q_length=L, kv_length=L, mask_function=sliding_window_causal_mask_function(5),
                 attention_mask=pad, allow_is_causal_skip=False)
causal, left, key_padding = pyattn.transformers._analyse(mask, L, L, 5)
print(f"is_causal={causal}, window=({left}, 0), key padding row {tuple(key_padding.shape)}: "
      f"{key_padding.int().flatten().tolist()}")
i, j = np.arange(L)[:, None], np.arange(L)[None, :]
rebuilt = (j <= i) & (j >= i - left) & key_padding[0, 0].numpy()      # what those three pieces admit
print("the same mask:", np.array_equal(rebuilt, mask[0, 0].numpy()))
fig, axs = plt.subplots(1, 2, figsize=(9, 3.8))
heatmap(axs[0], mask[0, 0].int().numpy(), title="the model's mask (B, 1, L, S)", fmt="{:.0f}",
        cmap="Greens", colorbar=False)
heatmap(axs[1], rebuilt.astype(int), title=f"is_causal, window=({left}, 0), padding row", fmt="{:.0f}",
        cmap="Greens", colorbar=False, ylabel="", legend={1: "may attend", 0: "masked"})
plt.tight_layout(); plt.show()"""),
]


def sync_sources(name, cells, path):
    """Put this script's cell sources into the committed notebook, keeping its
    outputs (for edits that change no output); any change of the cells' kinds
    or number needs a full run instead."""
    nb = nbformat.read(path, as_version=4)
    kinds = ["markdown" if kind == "md" else "code" for kind, _ in cells]
    if [c.cell_type for c in nb.cells] != kinds:
        sys.exit(f"{name}: the cells differ in number or kind from the committed notebook; "
                 f"run `python build_notebooks.py {name}` instead")
    changed = 0
    for cell, (_, src) in zip(nb.cells, cells):
        changed += cell.source != src
        cell.source = src
    nbformat.write(nb, path)
    print(f"synced {changed} cell source(s) of {path}; outputs kept")


# ---------------------------------------------------------------------------
NB["09_serving"] = [
("md", """# 09 · Serving many requests at once: paged caches, continuous batching, token trees

Notebook 07 generated one text with one `KVCache`. A server has many requests: they arrive
at different times with prompts of different lengths, some are still reading their prompt
(*prefill*) while others write one token per step (*decode*), and they finish at different
times. This notebook builds such a server in plain NumPy around the character model trained
in notebook 06, with pyattn doing the attention:

* a `pyattn.PagedKVCache` per layer: every sequence's keys and values live in fixed-size
  **blocks** of one shared pool, found through a **block table**;
* **continuous batching**: each step packs prefill chunks of new requests and decode steps
  of running ones into **one** attention call per layer (`cu_seqlens_q`);
* a shared prompt prefilled once and **forked** (copy-on-write) into two requests;
* a **speculative step**: a small tree of guessed tokens verified in one call with `tree_mask`.

Every request's text is checked against generating it alone, and three pictures show tokens
per second against batch size, packed against padded attention, and blocks in use over time."""),
("code", SETUP + """import os, platform, time
pyattn.set_num_threads(1)                  # one thread: timings less disturbed by whatever else runs

""" + CPU_NAME + """"""),
("md", """## The model: notebook 06's, in plain NumPy
`data/char_model_06.npz` holds the weights notebook 06 trained (float32, 436 KB;
`python build_notebooks.py --save-char-model` retrains and rewrites it): token and position
embeddings (`T = 64` positions, so a text is at most 64 characters), two blocks of
LayerNorm → multi-head causal attention → LayerNorm → MLP, a final LayerNorm and the head.

`model(ids, pos, attend)` runs it on a **packed** list of tokens, `ids (n,)` at positions
`pos (n,)`, from any number of sequences one after another. Everything but attention works
token by token, so packing changes nothing for it. Attention is the one place where tokens
meet, and it is left to `attend(layer, q, k, v)`, with `q, k, v (n, heads, head_dim)`: the
layout of FlashAttention's varlen functions. `alone(prompt, n)` is the reference: greedy
generation of one request, re-running the whole text at every step with the dense causal
`pyattn.scaled_dot_product_attention`, no cache at all."""),
("code", """W = np.load("data/char_model_06.npz")
chars = list(str(W["chars"]))
stoi = {c: i for i, c in enumerate(chars)}
T_MAX, D, H, N_LAYERS = (int(W[n]) for n in ("T", "D", "H", "L"))
E, V = D // H, len(chars)
P = {k: W[k] for k in W.files if W[k].ndim}           # the weight arrays, float32

def layer_norm(x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)

def linear(x, name, bias):                              # torch.nn.Linear's layout: x W^T + b
    return x @ P[name].T + P[bias]

def model(ids, pos, attend):
    \"\"\"Packed tokens ids (n,) at positions pos (n,) -> logits (n, V). attend(l, q, k, v)
    does layer l's attention, q, k, v (n, H, E) -> (n, H, E).\"\"\"
    x = P["tok"][ids] + P["pos"][pos]
    for l in range(N_LAYERS):
        a = layer_norm(x)
        q, k, v = (linear(a, f"attn{l}.W_{n}.weight", f"attn{l}.W_{n}.bias").reshape(-1, H, E)
                   for n in ("query", "key", "value"))
        x = x + linear(attend(l, q, k, v).reshape(-1, D), f"attn{l}.out_proj.weight", f"attn{l}.out_proj.bias")
        x = x + linear(np.maximum(linear(layer_norm(x), f"W1.{l}", f"b1.{l}"), 0), f"W2.{l}", f"b2.{l}")
    return linear(layer_norm(x), "Wh", "bh")

def dense(l, q, k, v):                                  # one sequence, all of it, causal
    t = lambda a: a.transpose(1, 0, 2)                  # (n, H, E) <-> (H, n, E)
    return t(pyattn.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True))

def alone(prompt, n, gaps=None):
    \"\"\"Greedy: the n characters after prompt, the whole text re-run at every step
    (gaps: a list to which each step's lead of the best logit over the second is added).\"\"\"
    ids = [stoi[c] for c in prompt]
    for _ in range(n):
        lg = model(np.array(ids), np.arange(len(ids)), dense)[-1]
        ids.append(int(lg.argmax()))
        if gaps is not None:
            top2 = np.sort(lg)[-2:]
            gaps.append(top2[1] - top2[0])
    return "".join(chars[i] for i in ids[len(prompt):])

print(f"{sum(p.size for p in P.values()):,} parameters, vocabulary of {V}, {N_LAYERS} blocks of {H} heads x {E}, "
      f"context {T_MAX}")
print(repr("The value of " + alone("The value of ", 40)))"""),
("md", """## Block tables
A contiguous cache reserves `max_len` rows for every sequence, used or not. A **paged**
cache cuts the rows into blocks of `block_size` rows and keeps all blocks in one pool,
`k (num_blocks, kv_heads, block_size, head_dim)` (and `v`). Each sequence owns a list of
blocks, its row of the **block table**: its logical row `r` is row `r % block_size` of block
`block_table[b, r // block_size]`. A sequence takes a new block only when its last one is
full, so memory follows the tokens actually held, in any order in the pool, and a finished
sequence's blocks go straight to the next one.

`pyattn.attention_with_kvcache` reads the pool in place through the table. Below, two
sequences of 11 and 5 rows in a pool of 8 blocks of 4 rows, their blocks scattered: the
result is the one a contiguous cache gives, to the bit."""),
("code", """rng = np.random.default_rng(0)
bs, lengths = 4, np.array([11, 5])
table = np.array([[6, 1, 3], [4, 0, -1]])               # -1: not used (5 rows need 2 blocks)
contiguous_k, contiguous_v = (rng.standard_normal((2, H, 12, E), dtype=np.float32) for _ in range(2))
pool_k, pool_v = np.zeros((8, H, bs, E), np.float32), np.zeros((8, H, bs, E), np.float32)
for b in range(2):
    for r in range(lengths[b]):                         # logical row r -> (block, row in block)
        pool_k[table[b, r // bs], :, r % bs] = contiguous_k[b, :, r]
        pool_v[table[b, r // bs], :, r % bs] = contiguous_v[b, :, r]
q = rng.standard_normal((2, H, 1, E), dtype=np.float32)     # one new query per sequence
paged = pyattn.attention_with_kvcache(q, pool_k, pool_v, cache_seqlens=lengths, block_table=table)
flat = pyattn.attention_with_kvcache(q, contiguous_k, contiguous_v, cache_seqlens=lengths)
print("paged vs contiguous, bit-identical:", np.array_equal(paged, flat))
assert np.array_equal(paged, flat)
owner = np.full(8, np.nan)
for b in range(2):
    owner[table[b, :-(-lengths[b] // bs)]] = b
fig, ax = plt.subplots(figsize=(8, 1.8), layout="constrained")
heatmap(ax, owner[None], fmt="", colorbar=False, cmap="tab10", vmin=0, vmax=9, xlabel="block of the pool",
        ylabel="", legend={0.0: "sequence 0 (11 rows)", 1.0: "sequence 1 (5 rows)", np.nan: "free"},
        title="the pool: block_table = [[6, 1, 3], [4, 0, -1]]")
ax.set_yticks([]); plt.show()"""),
("md", """## One call for a whole step: `cu_seqlens_q`
`PagedKVCache` keeps the block lists, the free list and the lengths, and `attend(seqs, q, k,
v, cu_seqlens_q=cu)` does one step for the sequences `seqs`: it writes the new keys and
values after each sequence's rows (taking blocks from the free list as needed), and the new
queries attend to everything their sequence holds. The new tokens are **packed**:
`q (total, heads, head_dim)`, sequence `i`'s tokens are rows `cu[i] … cu[i+1] - 1`, so one
sequence may bring a prefill chunk of 12 tokens, the next a single decode token, another
none. With `is_causal=True` (the default) each new token sees the cached rows and the new
tokens up to itself. One cache per layer (each layer has its own keys and values); the
sequences are added, forked and freed in all of them alike, so their ids agree.

`step(caches, seqs, chunks)` runs the model on one packed step and returns the logits of every
new token; a sequence's next character is the argmax of its last token's logits."""),
("code", """def new_caches(num_blocks, block_size=8):
    return [pyattn.PagedKVCache(num_blocks, block_size, num_kv_heads=H, head_dim=E) for _ in range(N_LAYERS)]

def add(caches, parent=None):
    \"\"\"A new sequence in every layer's cache, or a fork of parent.\"\"\"
    ids = {c.add_sequence() if parent is None else c.fork(parent) for c in caches}
    assert len(ids) == 1                                # the same id in every layer
    return ids.pop()

def free(caches, seq):
    for c in caches:
        c.free(seq)

def step(caches, seqs, chunks, tree_mask=None, pos=None):
    \"\"\"chunks[i]: the new tokens of sequence seqs[i] -> (logits (total, V), cu_seqlens_q).\"\"\"
    cu = np.r_[0, np.cumsum([len(c) for c in chunks])]
    if pos is None:                                     # after the rows each sequence holds
        pos = np.concatenate([caches[0].length(s) + np.arange(len(c)) for s, c in zip(seqs, chunks)])
    attend = lambda l, q, k, v: caches[l].attend(seqs, q, k, v, cu_seqlens_q=cu, tree_mask=tree_mask)
    return model(np.concatenate(chunks).astype(np.int64), pos, attend), cu

caches = new_caches(num_blocks=16)
a, b = add(caches), add(caches)
prompts = ["The value of ", "Return "]
logits, cu = step(caches, [a, b], [[stoi[c] for c in p] for p in prompts])      # two prefills, one call
nxt = [int(logits[e - 1].argmax()) for e in cu[1:]]
print("cu_seqlens_q:", cu, " next characters:", [chars[i] for i in nxt])
c = add(caches)
logits, cu = step(caches, [a, b, c], [[nxt[0]], [nxt[1]], [stoi[ch] for ch in "A list "]])  # 2 decodes + a prefill
print("cu_seqlens_q:", cu, " lengths now:", [caches[0].length(s) for s in (a, b, c)],
      " blocks in use:", 16 - caches[0].blocks_free, "of 16")
print(caches[0])"""),
("md", """## Continuous batching
Requests arrive over time: a prompt cut from the training text (4 to 30 characters) and a
number of characters to write. Every step, the scheduler

1. admits the requests that have arrived (a new sequence each),
2. gives every running request in decode its one token, then fills a **token budget** of 32
   per step with **prefill chunks** of at most 12 prompt tokens (chunked prefill: a long
   prompt does not stall the decodes of the others),
3. runs the model once on the packed tokens: **one `attend` call per layer** for all of them,
4. appends the argmax of each sequence's last logits where its prompt is done, and frees
   the sequences that wrote all their characters (their blocks go back to the pool).

Two requests share a prompt prefix, `"Return the "`: it is prefilled **once**, into a
sequence of its own, before the loop. Each of the two requests starts as `fork` of it: the
fork shares the prefix's blocks (nothing is copied) and only its own suffix is prefilled.
The prefix's last block is only partly full; the first write of a fork into it copies that
block first (**copy-on-write**), so the prefix and the other fork keep their rows."""),
("code", """text = open("data/training_corpus.txt").read()
rng = np.random.default_rng(0)
requests = []
for i in range(14):
    n = int(rng.integers(4, 31))
    s = int(rng.integers(0, len(text) - n))
    requests.append(dict(name=f"r{i}", arrive=int(rng.integers(0, 30)), prompt=text[s:s + n],
                         new=int(rng.integers(8, T_MAX + 2 - n))))
PREFIX = "Return the "
requests += [dict(name="fork A", arrive=6, prompt=PREFIX + "value", new=24),
             dict(name="fork B", arrive=8, prompt=PREFIX + "list of", new=24)]
requests.sort(key=lambda r: r["arrive"])
assert all(len(r["prompt"]) + r["new"] - 1 <= T_MAX for r in requests)   # positions the model knows

NUM_BLOCKS, BUDGET, CHUNK = 64, 32, 12
caches = new_caches(NUM_BLOCKS)
prefix_seq = add(caches)
step(caches, [prefix_seq], [[stoi[c] for c in PREFIX]])        # the shared prefix, once

waiting, running, log, t = list(requests), [], [], 0
t_start = time.perf_counter()
while waiting or running:
    while waiting and waiting[0]["arrive"] <= t:                 # 1. admit
        r = waiting.pop(0)
        shared = r["prompt"].startswith(PREFIX)
        r["seq"] = add(caches, prefix_seq if shared else None)
        r["todo"] = [stoi[c] for c in r["prompt"][len(PREFIX) if shared else 0:]]
        r["out"], r["start"] = [], t
        running.append(r)
    batch, chunks, budget = [], [], BUDGET                      # 2. decodes first, then prefill chunks
    for r in sorted(running, key=lambda r: len(r["todo"]) > 1):
        n = min(len(r["todo"]), CHUNK, budget)
        if n:
            batch.append(r); chunks.append(r["todo"][:n]); budget -= n
    if batch:
        t0 = time.perf_counter()
        logits, cu = step(caches, [r["seq"] for r in batch], chunks)   # 3. one call per layer
        seconds = time.perf_counter() - t0
        decoding = sum(1 for r in batch if r["out"])            # past their prompt
        for r, chunk, end in zip(batch, chunks, cu[1:]):          # 4. next characters, finished requests
            r["todo"] = r["todo"][len(chunk):]
            if not r["todo"]:
                r["out"].append(int(logits[end - 1].argmax()))
                if len(r["out"]) < r["new"]:
                    r["todo"] = r["out"][-1:]
                else:
                    running.remove(r); free(caches, r["seq"]); r["end"] = t
        log.append(dict(t=t, seqs=len(batch), tokens=int(cu[-1]), decode=decoding,
                        blocks=NUM_BLOCKS - caches[0].blocks_free, seconds=seconds))
    t += 1
elapsed = time.perf_counter() - t_start
generated = sum(r["new"] for r in requests)
print(f"{len(requests)} requests served in {t} steps, {elapsed:.2f} s: {generated} characters written, "
      f"{sum(x['tokens'] for x in log)} tokens run through the model")
print(f"most sequences in one call: {max(x['seqs'] for x in log)}; most blocks in use: {max(x['blocks'] for x in log)} "
      f"of {NUM_BLOCKS}")"""),
("md", """## Every request, checked against generating it alone
Each request's characters are generated again alone (greedy, the whole text re-run at
every step, no cache) and must be the same. Batched with others, chunked, forked or not,
a request gets the text it would get by itself. (Its logits are not bit-identical to the
ones alone: packed, the matrix products and the attention add in other orders, which moves
logits by a few millionths. Greedy choices are still equal unless two logits tie that closely;
the smallest lead of a chosen character over the next, printed below, says how far from a
tie this run came.)"""),
("code", """gaps = []
for r in requests:
    got = "".join(chars[i] for i in r["out"])
    ref = alone(r["prompt"], r["new"], gaps)
    print(f"{r['name']:>6s} steps {r['start']:2d}-{r['end']:2d}: {r['prompt']!r:34s} -> {got!r}")
    assert got == ref, (r["name"], got, ref)
print(f"every request equals generating it alone; smallest lead of the chosen logit over the next: {min(gaps):.1e}")"""),
("md", """## Blocks in use over time
The pool's blocks in use at each step, with the sequences in the call and how many of them
were decoding (the rest brought prefill chunks). Blocks are taken as sequences grow, by 8
rows at a time, and returned the moment a request finishes: the pool needs the memory of
the tokens actually held at once, not `max_len` rows for every request. The two forks read
the prefix's blocks; their own rows start in a copy of its last, partly filled block."""),
("code", """steps_ = [x["t"] for x in log]
fig, axs = plt.subplots(2, 1, figsize=(10, 6), sharex=True, layout="constrained")
axs[0].step(steps_, [x["blocks"] for x in log], where="post", color="C0", lw=2, label="blocks in use")
axs[0].axhline(NUM_BLOCKS, color="grey", ls="--", lw=1, label=f"pool: {NUM_BLOCKS} blocks of 8 rows")
contiguous = [sum(1 for r in requests if r["start"] <= x["t"] <= r["end"]) * T_MAX // 8 for x in log]
axs[0].step(steps_, contiguous, where="post", color="C3", lw=1, ls=":",
            label=f"a contiguous cache of {T_MAX} rows per running request, in blocks")
axs[0].set_ylabel("blocks (one layer)"); axs[0].legend(loc="upper right", fontsize=8)
axs[1].bar(steps_, [x["decode"] for x in log], color="C2", label="sequences decoding (1 token)")
axs[1].bar(steps_, [x["seqs"] - x["decode"] for x in log], bottom=[x["decode"] for x in log], color="C1",
           label="sequences with a prefill chunk")
for r in requests:
    axs[1].plot(r["arrive"], -0.6, "k^", ms=4)
axs[1].set_ylabel("sequences in the call"); axs[1].set_xlabel("step (triangles: arrivals)")
axs[1].legend(loc="upper right", fontsize=8)
fig.suptitle("continuous batching: one attend call per layer per step")
plt.show()"""),
("md", """## A speculative step: verifying a token tree
Decoding writes one token per step, and each step reads the whole cache. **Speculative
decoding** guesses several tokens cheaply (here from bigram counts of the training text)
and lets the model check all the guesses in **one** call. Guessing a *tree* keeps several
alternatives: below, from the last written character, its 2 likeliest successors, each with
2 successors, each with 1 more: 11 tokens in all, the first being the last written one.

`tree_mask (1, 1, n, n)`, True = may attend, says which new token sees which: a token sees
itself and its ancestors in the tree, never a sibling's branch (and every cached row).
Each token sits at position `length + depth`. The model's argmax at each node says which
child (if any) it would have written; walking down from the root while a child matches
gives the accepted tokens, and the argmax at the last accepted node is one more, for free.

The tree is written into a **fork** of the sequence, which is then freed: the rejected
branches never reach the sequence itself (its partly filled last block is copied on the
fork's first write). The accepted tokens then go into the sequence as one chunk in the next
step, whose last logits give the next character."""),
("code", """counts = np.zeros((V, V))
ids = np.array([stoi[c] for c in text])
np.add.at(counts, (ids[:-1], ids[1:]), 1)
guess = np.argsort(-counts, axis=1)                     # bigram: likeliest successors first

def draft_tree(root, widths=(2, 2, 1)):
    \"\"\"Tokens, parents (-1: none) and depths of a tree of guesses under root.\"\"\"
    tokens, parent, depth, level = [root], [-1], [0], [0]
    for d, w in enumerate(widths, 1):
        nxt = []
        for node in level:
            for tok in guess[tokens[node], :w]:
                tokens.append(int(tok)); parent.append(node); depth.append(d); nxt.append(len(tokens) - 1)
        level = nxt
    return tokens, parent, depth

def tree_mask_of(parent):
    n = len(parent)
    m = np.eye(n, dtype=bool)
    for i in range(n):
        j = parent[i]
        while j >= 0:                                   # i sees its ancestors
            m[i, j] = True; j = parent[j]
    return m

def speculate(caches, seq, last):
    \"\"\"Verify a tree of guesses after seq's rows + the written-but-not-yet-cached token last:
    returns (accepted guesses, the next token, tokens, parents, mask).\"\"\"
    tokens, parent, depth = draft_tree(last)
    mask = tree_mask_of(parent)
    fork = add(caches, seq)
    logits, _ = step(caches, [fork], [tokens], tree_mask=mask[None, None],
                     pos=caches[0].length(seq) + np.array(depth))
    free(caches, fork)                                   # the tree's rows go with the fork
    node, accepted = 0, []
    while True:
        best = int(logits[node].argmax())
        child = [i for i in range(len(tokens)) if parent[i] == node and tokens[i] == best]
        if not child:
            return accepted, best, tokens, parent, mask
        accepted.append(best); node = child[0]

prompt = "The value of the "
caches = new_caches(NUM_BLOCKS)
seq = add(caches)
logits, _ = step(caches, [seq], [[stoi[c] for c in prompt]])
out, calls = [int(logits[-1].argmax())], 0
feed = out[-1:]                                          # written, not yet in the cache
first = None
while len(out) < 40:
    accepted, nxt, tokens, parent, mask = speculate(caches, seq, feed[-1])
    calls += 1
    first = first or (tokens, mask, accepted)
    logits, _ = step(caches, [seq], [feed + accepted])   # the accepted tokens, as one chunk
    assert int(logits[-1].argmax()) == nxt               # the same next token as the tree's
    out += accepted + [nxt]
    feed = [nxt]
out = out[:40]
got = "".join(chars[i] for i in out)
print(f"{prompt!r} -> {got!r}: 40 characters in {calls} verification calls "
      f"({40 / calls:.1f} characters per call instead of 1)")
assert got == alone(prompt, 40)
print("equals generating it alone, one character at a time")
tokens, mask, accepted = first
labels = [f"{i}:{chars[tok]!r}" for i, tok in enumerate(tokens)]
fig, ax = plt.subplots(figsize=(7, 6), layout="constrained")
heatmap(ax, mask.astype(float), labels, labels, fmt="{:.0f}", colorbar=False, cmap="Blues",
        legend={1.0: "may attend (True)", 0.0: "masked (False)"},
        title=f"tree_mask of the first speculative step\\n(accepted: {''.join(chars[i] for i in accepted)!r})")
plt.show()"""),
("md", """## Tokens per second against batch size
A decode step of one sequence runs the whole model for one token: the weights are read,
the Python and NumPy calls are made, for one row of work. Packed with `B` sequences, the same
calls do `B` rows. Below, `B` sequences each hold a 24-character prompt, and each decode step
writes one token for all of them in one packed call (the fastest of 16 steps: the least
disturbed by whatever else the machine runs); the dashed line is
`B` sequences served one at a time (`B` calls of one token). **The times depend on the
machine** (and on what else it runs): the figure comes from the run that built this
notebook, on the CPU named in its title; re-run it to measure yours."""),
("code", """def decode_rate(B, steps=16):
    \"\"\"Tokens per second of packed decode steps for B sequences of 24 cached tokens.\"\"\"
    caches = new_caches(B * (T_MAX // 8))
    seqs = [add(caches) for _ in range(B)]
    starts = rng.integers(0, len(text) - 24, B)
    logits, cu = step(caches, seqs, [[stoi[c] for c in text[s:s + 24]] for s in starts])
    last = [[int(logits[e - 1].argmax())] for e in cu[1:]]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits, cu = step(caches, seqs, last)
        times.append(time.perf_counter() - t0)
        last = [[int(x)] for x in logits.argmax(-1)]
    return B / min(times)

sizes = [1, 2, 4, 8, 16, 32, 64]
rates = [decode_rate(B) for B in sizes]
fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
ax.plot(sizes, rates, "o-", lw=2, label="one packed call per step (continuous batching)")
ax.plot(sizes, [rates[0]] * len(sizes), "k--", lw=1, label="one sequence per call")
ax.set_xscale("log", base=2); ax.set_xticks(sizes, [str(b) for b in sizes]); ax.minorticks_off()
ax.set_xlabel("sequences decoding together (batch size)"); ax.set_ylabel("tokens per second")
ax.set_ylim(0, None); ax.legend()
ax.set_title(f"measured when this notebook ran, on {cpu_name()}, 1 thread\\n"
             "(re-run to measure your machine)", fontsize=10)
plt.show()
for B, r in zip(sizes, rates):
    print(f"batch {B:2d}: {r:8.0f} tokens/s ({r / rates[0]:4.1f}x one at a time)")"""),
("md", """## Packed against padded
Before varlen, a batch of texts of different lengths was **padded** to the longest and a mask
hid the padding: the kernel computes scores for every padded row and column and throws them
away. `pyattn.scaled_dot_product_attention_varlen` takes the texts **packed**, `(total,
heads, head_dim)` with `cu_seqlens`, and does only the real work, `Σ L_i²` (halved by the
causal mask) instead of `B × L_max²`. Below: 16 sequences with lengths drawn from 16 to 1024
(a fixed seed), 4 heads of 64, causal, float32; padded = `(16, 4, L_max, 64)` with a boolean mask
`(16, 1, L_max, L_max)` that is causal and hides the padded keys. Best of 5 runs, 1 thread.
The rows that are real agree between the two."""),
("code", """lens = np.sort(np.random.default_rng(3).integers(16, 1025, 16))[::-1]
Hb, Eb, Lmax = 4, 64, int(lens.max())
cu = np.r_[0, np.cumsum(lens)]
qp, kp, vp = (np.random.default_rng(i).standard_normal((int(cu[-1]), Hb, Eb), dtype=np.float32) for i in range(3))
pad = lambda x: np.stack([np.pad(x[a:b], ((0, Lmax - (b - a)), (0, 0), (0, 0))).transpose(1, 0, 2)
                          for a, b in zip(cu[:-1], cu[1:])])             # (16, Hb, Lmax, Eb), zeros after
qd, kd, vd = pad(qp), pad(kp), pad(vp)
i, j = np.indices((Lmax, Lmax))
mask = (j <= i)[None, None] & (j[None, None] < lens[:, None, None, None])    # causal, real keys only

def best(fn, n=5):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return min(ts)

packed = pyattn.scaled_dot_product_attention_varlen(qp, kp, vp, cu, cu, is_causal=True)
padded = pyattn.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask)
diff = max(np.abs(padded[b, :, :n].transpose(1, 0, 2) - packed[a:a + n]).max() for b, (a, n) in enumerate(zip(cu, lens)))
print(f"lengths {lens.tolist()}\\nreal rows, packed vs padded: largest difference {diff:.1e}")
assert diff < 1e-5
t_packed = best(lambda: pyattn.scaled_dot_product_attention_varlen(qp, kp, vp, cu, cu, is_causal=True))
t_padded = best(lambda: pyattn.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask))
useful = (lens * (lens + 1) / 2).sum() / (len(lens) * Lmax * Lmax)
fig, ax = plt.subplots(figsize=(7.5, 2.8), layout="constrained")
bars = ax.barh(["padded to the longest + mask", "packed (varlen)"], [t_padded * 1e3, t_packed * 1e3], color=["C3", "C0"])
ax.bar_label(bars, fmt="%.1f ms", padding=3); ax.set_xlim(0, t_padded * 1e3 * 1.25)
ax.set_xlabel(f"ms (best of 5): 16 causal sequences of {lens.min()}..{Lmax} tokens, {Hb} heads x {Eb}, float32")
ax.set_title(f"measured when this notebook ran, on {cpu_name()}, 1 thread (re-run to measure yours)", fontsize=10)
plt.show()
print(f"padded: {t_padded * 1e3:.1f} ms, packed: {t_packed * 1e3:.1f} ms ({t_padded / t_packed:.1f}x); "
      f"the real (causal) work is {useful:.0%} of the padded batch's B x L_max^2 scores")"""),
("md", """## When the pool is full, and the same with `pyattn.nn` layers
A step that needs more blocks than are free raises `pyattn.CacheFullError` (a `MemoryError`)
**before** anything is written: the lengths, the blocks and the rows stay as they were, so a
scheduler can catch it, finish or preempt some request, and retry the step.

`pyattn.nn.MultiHeadAttention` takes a paged cache too, `layer(x, cache=paged, seqs=seqs,
cu_seqlens_q=cu)` with `x (total, d_in)` packed: loaded with the same weights, its layers
give the logits of the hand-written attention above (to float32 rounding: the projections
are computed by another matrix product)."""),
("code", """small = new_caches(num_blocks=4)                         # 32 rows in all
s1, s2 = add(small), add(small)
step(small, [s1], [[stoi[c] for c in "The value of the "]])     # 17 rows: 3 blocks
before = (small[0].blocks_free, small[0].length(s1), small[0].k.copy())
try:
    step(small, [s1, s2], [[stoi["a"]], [stoi[c] for c in "Return a new list"]])   # needs 3 more
except pyattn.CacheFullError as e:
    print("CacheFullError:", e)
assert (small[0].blocks_free, small[0].length(s1)) == before[:2] and np.array_equal(small[0].k, before[2])
print("nothing was written: blocks free", small[0].blocks_free, "length", small[0].length(s1))

from pyattn.nn import MultiHeadAttention
layers = []
for l in range(N_LAYERS):
    layer = MultiHeadAttention(D, D, H, context_length=T_MAX, qkv_bias=True).eval()
    layer.load_state_dict({k[len(f"attn{l}."):]: w for k, w in P.items() if k.startswith(f"attn{l}.")})
    layers.append(layer)

def step_nn(caches, seqs, chunks):
    \"\"\"step() with pyattn.nn layers doing the attention (projections included).\"\"\"
    cu = np.r_[0, np.cumsum([len(c) for c in chunks])]
    pos = np.concatenate([caches[0].length(s) + np.arange(len(c)) for s, c in zip(seqs, chunks)])
    x = P["tok"][np.concatenate(chunks).astype(np.int64)] + P["pos"][pos]
    for l in range(N_LAYERS):
        x = x + layers[l](layer_norm(x), cache=caches[l], seqs=seqs, cu_seqlens_q=cu)
        x = x + linear(np.maximum(linear(layer_norm(x), f"W1.{l}", f"b1.{l}"), 0), f"W2.{l}", f"b2.{l}")
    return linear(layer_norm(x), "Wh", "bh")

ca, cb = new_caches(16), new_caches(16)
sa, sb = [add(ca) for _ in range(3)], [add(cb) for _ in range(3)]
for chunks in ([[stoi[c] for c in "The value"], [stoi[c] for c in "Return"], []],
               [[stoi["s"]], [stoi[c] for c in " a new"], [stoi[c] for c in "Every"]]):
    hand, _ = step(ca, sa, chunks)
    with_nn = step_nn(cb, sb, chunks)
    print(f"{len(chunks)} sequences, {sum(map(len, chunks))} tokens: hand-written vs pyattn.nn, "
          f"largest logit difference {np.abs(hand - with_nn).max():.1e}")
    assert np.allclose(hand, with_nn, atol=1e-4)"""),
("md", """## A shared system prompt, 16 parallel samples
Sampling 16 answers to one prompt (or beam search, or a system prompt every request starts
with) makes 16 sequences that begin with the same rows. `PagedKVCache.fork` gives each sample
the prompt's **blocks**, not copies: their block tables start with the same block numbers. A
decode step reads the whole cache of every sequence, and on a CPU that reading is its cost (the
arithmetic per key row is small), so pyattn reads a key tile that several sequences of the
call hold **once** for all of them: their query rows are stacked against it. Each row keeps
its own arithmetic, so the result is the same, bit for bit, as the step on 16 separate copies.

Below, pools you own (as in "Block tables" above): a prompt of `prompt` rows in blocks of 16,
held by 16 samples that have 32 rows of their own each (the tables a fork makes), and the
same rows with every sample's blocks copied. One decode step of attention for the 16 (4 heads
of 64, one layer): the bytes of K and V it must read, and tokens per second. (Shared reads
start at 4096 cached rows, where a decode call splits its keys into chunks.)"""),
("code", """import time
Hs, Es, bss, own, n = 4, 64, 16, 32, 16
rng = np.random.default_rng(5)
prompts, res = [4096, 8192, 16384], {"shared reads": [], "16 copies": []}
for prompt in prompts:
    nsh, nown = prompt // bss, own // bss                 # the prompt's blocks, each sample's own
    shared = np.array([np.r_[np.arange(nsh), nsh + i * nown + np.arange(nown)] for i in range(n)])
    copies = np.arange(n * (nsh + nown)).reshape(n, nsh + nown)
    kp, vp = (rng.standard_normal((nsh + n * nown, Hs, bss, Es), dtype=np.float32) for _ in range(2))
    kc, vc = kp[shared.ravel()], vp[shared.ravel()]       # the same rows, every sample's blocks copied
    lens, q = np.full(n, prompt + own), rng.standard_normal((n, Hs, 1, Es), dtype=np.float32)
    calls = {"shared reads": (kp, vp, shared), "16 copies": (kc, vc, copies)}
    outs = {}
    for name, (k, v, tab) in calls.items():
        f = lambda: pyattn.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=tab)
        outs[name] = f()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        secs = min(ts)                                   # the fastest of 5 steps
        rows = prompt + n * own if name == "shared reads" else n * (prompt + own)
        res[name].append((rows * Hs * Es * 4 * 2 / 1e6, n / secs))
    assert np.array_equal(outs["shared reads"], outs["16 copies"])    # the same bits
    (a, ta), (b, tb) = res["shared reads"][-1], res["16 copies"][-1]
    print(f"prompt {prompt:5d}: K and V read {a:6.1f} MB vs {b:6.1f} MB; "
          f"{ta:8.0f} vs {tb:7.0f} tokens/s ({ta / tb:.1f}x)")

fig, axs = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
x = np.arange(len(prompts))
for i, (name, r) in enumerate(res.items()):
    axs[0].bar(x + (i - 0.5) * 0.38, [m for m, _ in r], 0.38, label=name, color=f"C{i}")
    axs[1].plot(prompts, [t for _, t in r], "o-", label=name, color=f"C{i}")
axs[0].set_xticks(x, [str(p) for p in prompts]); axs[0].set_xlabel("prompt rows")
axs[0].set_ylabel("MB of K and V read per step"); axs[0].legend()
axs[1].set_xscale("log", base=2); axs[1].set_xticks(prompts, [str(p) for p in prompts])
axs[1].set_xlabel("prompt rows"); axs[1].set_ylabel("tokens / s (attention, one layer)"); axs[1].legend()
fig.suptitle("16 samples of one prompt: one decode step, shared reads vs copies")
plt.show()"""),
("md", """## What a real server adds
This loop is the skeleton of vLLM-style serving. A real server also samples (temperature,
top-p: only the choice of the next token changes), stops at end-of-text tokens, admits a
request only when the pool can hold it (and preempts one on a `CacheFullError`), keeps a
prefix cache of common prompts (forks of their sequences), and uses positions that do not
run out (rotary embeddings, `rotary_cos=`/`rotary_sin=`) instead of this model's 64 learned
ones."""),
]


SAVE_CHAR_MODEL = """\
np.savez_compressed("data/char_model_06.npz", chars=np.array("".join(chars)), T=T, D=D, H=H, L=L,
                    **{k: v.astype(np.float32) for k, v in all_params().items()})
print("saved data/char_model_06.npz")"""


def save_char_model():
    """Train notebook 06's model (its code cells, run on a fresh kernel; the notebook
    itself is not rewritten) and save its weights, as float32, in
    data/char_model_06.npz: the model that notebook 09 serves."""
    from nbclient import NotebookClient
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell(src) for kind, src in NB["06_training"] if kind == "code"]
    nb.cells.append(new_code_cell(SAVE_CHAR_MODEL))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": HERE}}).execute()
    print("".join(o.get("text", "") for o in nb.cells[-1].outputs))


def build(run=True, names=None, sources_only=False):
    for name, cells in NB.items():
        if names and name not in names:
            continue
        path = os.path.join(HERE, name + ".ipynb")
        if sources_only:
            sync_sources(name, cells, path)
            continue
        nb = new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
        if run:
            from nbclient import NotebookClient
            NotebookClient(nb, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": HERE}}).execute()
        nbformat.write(nb, path)
        print("wrote", path)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-run", action="store_true")
    ap.add_argument("--sources-only", action="store_true",
                    help="update the committed notebooks' cell sources, keep their outputs")
    ap.add_argument("--save-char-model", action="store_true",
                    help="train notebook 06's model and save data/char_model_06.npz (for notebook 09)")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    if a.save_char_model:
        save_char_model()
        sys.exit()
    build(not a.no_run, a.names, a.sources_only)
