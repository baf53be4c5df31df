"""The documentation's plots, drawn from data (never by hand).

``python docs/plots.py [OUTDIR]`` (default ``docs/_generated``); ``docs/conf.py``
runs it on every build. Sources:

- ``benchmarks/results.json``: the saved benchmark run that ``benchmarks/RESULTS.md``
  tabulates (its header names the CPU and date): attention GFLOP/s against sequence
  length per implementation, and decode GB/s per cache dtype;
- ``pyattn.BlockMask``: the tile map of a block mask, computed when the plot is drawn;
- ``pyattn.attention_with_kvcache`` with a block table: which pool rows two sequences'
  keys were written to, read back from the pool after the calls;
- ``benchmarks/results_generate.json`` (``benchmarks/bench_generate.py``): tokens per
  second of a small decoder's generation loop per attention implementation and context.
"""
import json
import re
import sys
from pathlib import Path

import numpy as np
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _results():
    data = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    head = [h for h in data["head"] if h.startswith(("date", "machine"))]
    return data["rows"], "; ".join(head)


def sdpa_gflops(out, rows, head):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        for impl in ("pyattn", "torch", "numpy"):
            pts = []
            for r in rows:
                if r.get("op") != "sdpa" or r.get("kind") or r.get("impl") != impl or r["threads"] != 1:
                    continue
                m = re.fullmatch(r"B=1 H=8 L=S=(\d+) E=64( causal)?", r["shape"])
                if m and bool(m.group(2)) == causal:
                    pts.append((int(m.group(1)), r["flops"] / r["min_ms"] / 1e6))
            if pts:
                pts.sort()
                ax.plot(*zip(*pts), marker="o", label={"torch": "PyTorch", "numpy": "NumPy (seeds' way)"}.get(impl, impl))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length L = S")
        ax.set_title(("causal" if causal else "full") + " attention, B=1 H=8 E=64, 1 thread")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GFLOP/s (best of runs)")
    axes[0].legend()
    fig.suptitle(head, fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sdpa_gflops.png", dpi=90)
    plt.close(fig)


def decode_gbs(out, rows, head):
    impls = ["torch", "pyattn", "pyattn float16 cache", "pyattn bfloat16 cache"]
    shapes = sorted({r["shape"] for r in rows if r.get("op") == "decode" and "impl" in r
                     and "Hkv=8" in r["shape"]}, key=lambda s: int(re.search(r"S=(\d+)", s).group(1)))
    fig, ax = plt.subplots(figsize=(9.5, 3.8))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        ys = []
        for s in shapes:
            t = [r["min_ms"] for r in rows if r.get("op") == "decode" and r.get("impl") == impl
                 and r["shape"] == s and r["threads"] == 1 and "kind" not in r]
            dims = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", s)}
            size = 2 if ("float16" in impl or "bfloat16" in impl) else 4
            cache_bytes = 2 * dims["B"] * dims["Hkv"] * dims["S"] * dims["E"] * size   # K and V
            ys.append(cache_bytes / (t[0] * 1e6) if t else np.nan)                     # GB/s
        ax.bar(np.arange(len(shapes)) + i * width, ys, width,
               label={"torch": "PyTorch, float32 cache", "pyattn": "pyattn, float32 cache"}.get(impl, impl))
    ax.set_xticks(np.arange(len(shapes)) + 0.4 - width / 2)
    ax.set_xticklabels(["S=" + re.search(r"S=(\d+)", s).group(1) for s in shapes])
    ax.set_ylabel("GB/s: K and V bytes / best time")
    ax.set_title("decode, GQA 32/8 heads, E=128, 1 thread", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(head, fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "decode_gbs.png", dpi=90)
    plt.close(fig)


def block_mask_map(out):
    import pyattn
    from pyattn import BlockMask, masks
    L = 2048
    ids = np.repeat(np.arange(4), L // 4)
    cases = [("causal", masks.causal),
             ("causal + 4 documents", masks.and_masks(masks.causal, masks.document(ids))),
             ("sliding window 256", masks.sliding_window(256))]
    fig, axes = plt.subplots(1, len(cases), figsize=(11, 3.8))
    for ax, (name, mod) in zip(axes, cases):
        bm = BlockMask.from_mask_mod(mod, None, None, L, L)
        dense = bm.to_dense().reshape(L, L)
        tq, tk = BlockMask.TILE if isinstance(BlockMask.TILE, tuple) else (96, 60)
        nq, nk = -(-L // tq), -(-L // tk)
        cls = np.zeros((nq, nk))
        for i in range(nq):
            for j in range(nk):
                t = dense[i * tq:(i + 1) * tq, j * tk:(j + 1) * tk]
                cls[i, j] = 2 if t.all() else (1 if t.any() else 0)
        ax.imshow(cls, cmap=matplotlib.colors.ListedColormap(["white", "#9ecae1", "#08519c"]),
                  vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        ax.set_title(f"{name}\n{100 * (cls > 0).mean():.0f} % of tiles computed", fontsize=9)
        ax.set_xlabel(f"key tiles ({tk} keys)")
        ax.set_ylabel(f"query tiles ({tq} queries)")
    fig.suptitle("BlockMask tiles at L = S = 2048: empty (white), partial (light), full (dark)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "blockmask_tiles.png", dpi=90)
    plt.close(fig)
    del pyattn


def block_table_map(out):
    import pyattn
    bs, nb = 16, 8
    kp = np.zeros((nb, 1, bs, 4), np.float32)
    vp = np.zeros_like(kp)
    table = np.array([[3, 7, -1], [5, -1, -1]])         # the serving guide's block table
    for seq, n in ((0, 21), (1, 4)):                       # write n keys of each sequence
        mark = np.full((1, 1, n, 4), seq + 1, np.float32)
        q = np.zeros((1, 1, n, 4), np.float32)
        pyattn.attention_with_kvcache(q, kp, vp, mark, mark, cache_seqlens=[0],
                                      block_table=table[seq:seq + 1])
    owner = kp[:, 0, :, 0]                                 # (num_blocks, block_size): 0 free
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.2), gridspec_kw={"width_ratios": [1, 3]})
    ax0.axis("off")
    ax0.table(cellText=[[str(x) for x in row] for row in table], rowLabels=["seq 0", "seq 1"],
              colLabels=[f"rows {16 * i}-{16 * i + 15}" for i in range(table.shape[1])],
              loc="center", cellLoc="center")
    ax0.set_title("block_table", fontsize=10)
    ax1.imshow(owner, cmap=matplotlib.colors.ListedColormap(["#f0f0f0", "#3182bd", "#e6550d"]),
               vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    ax1.set_yticks(range(nb))
    ax1.set_yticklabels([f"block {i}" for i in range(nb)], fontsize=8)
    ax1.set_xlabel(f"row within the block (block_size = {bs})")
    ax1.set_title("the pool after writing 21 keys of seq 0 (blue) and 4 of seq 1 (orange)",
                  fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "block_table.png", dpi=90)
    plt.close(fig)


def generate_tokens(out):
    data = json.loads((ROOT / "benchmarks" / "results_generate.json").read_text())
    h = data["head"]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    impls = list(dict.fromkeys(r["impl"] for r in data["rows"]))
    for impl in impls:
        pts = sorted((r["context"], r["tokens_per_s"]) for r in data["rows"] if r["impl"] == impl)
        ax.plot(*zip(*pts), marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens already in the cache")
    ax.set_ylabel("tokens / s (best of runs)")
    ax.set_title(f"generation loop: {h['model']}, {h['threads']} thread", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{h['machine']}; {h['date']}; load before the run {h['load_before']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "generate_tokens.png", dpi=90)
    plt.close(fig)


def main(out=None):
    out = Path(out) if out else Path(__file__).resolve().parent / "_generated"
    out.mkdir(parents=True, exist_ok=True)
    rows, head = _results()
    sdpa_gflops(out, rows, head)
    decode_gbs(out, rows, head)
    block_mask_map(out)
    block_table_map(out)
    generate_tokens(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
