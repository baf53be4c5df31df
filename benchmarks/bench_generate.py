"""Tokens per second in a generation loop: a small decoder's attention layers
decoding token after token over a growing KV cache, with pyattn and with its
peers doing the attention, everything else (the projections, in NumPy) the same.

    python benchmarks/bench_generate.py [--out benchmarks/results_generate.json]
                                        [--contexts 512 2048 8192] [--tokens 32]

Model: 4 layers, d_model 1024, 16 query heads over 4 KV heads (GQA 4), head dim 64,
batch 1, float32, 1 thread (pyattn, PyTorch and NumPy's BLAS: threadpoolctl). For each context length a prompt of that many cached rows
(random keys/values written into the caches), then ``--tokens`` decode steps, each
step: per layer, x -> q, k, v (NumPy matmul), attention over the cache with the new
row appended, the output projection. Implementations, interleaved, best of 3:

- ``pyattn``: ``pyattn.KVCache.attend`` (appends in place, GQA read in place);
- ``pyattn int8 cache``: the same with ``KVCache(dtype="int8")``;
- ``PyTorch SDPA``: a preallocated torch cache, the new row copied in,
  ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` on the
  filled rows (torch's threads set to 1);
- ``NumPy``: the seeds' way -- scores, softmax, weights @ values, in NumPy.

Writes the JSON the docs' plot reads (docs/plots.py): the machine, the date, and a
row per (implementation, context) with tokens/s. Timings vary with the machine's
load: the JSON records the load average before the run.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import time

import numpy as np

import pyattn

L_LAYERS, D, HQ, HKV, E = 4, 1024, 16, 4, 64


def _cpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name"))
    except Exception:
        return platform.processor() or "unknown"


class Weights:
    def __init__(self, rng):
        s = 1 / np.sqrt(D)
        self.qkv = [(rng.standard_normal((D, (HQ + 2 * HKV) * E)) * s).astype(np.float32)
                    for _ in range(L_LAYERS)]
        self.o = [(rng.standard_normal((HQ * E, D)) * s).astype(np.float32) for _ in range(L_LAYERS)]


def _split(x, w):
    y = x @ w                                           # (1, (HQ + 2 HKV) E)
    q = y[:, :HQ * E].reshape(1, HQ, 1, E)
    k = y[:, HQ * E:(HQ + HKV) * E].reshape(1, HKV, 1, E)
    v = y[:, (HQ + HKV) * E:].reshape(1, HKV, 1, E)
    return q, k, v


def run_pyattn(W, ctx, tokens, rng, dtype=np.float32):
    caches = [pyattn.KVCache(1, HKV, ctx + tokens, E, dtype=dtype) for _ in range(L_LAYERS)]
    for c in caches:                                    # the prompt's rows
        c.attend(rng.standard_normal((1, HQ, 1, E)).astype(np.float32),
                 *rng.standard_normal((2, 1, HKV, ctx, E)).astype(np.float32), is_causal=False)
    x = rng.standard_normal((1, D)).astype(np.float32)
    t0 = time.perf_counter()
    for _ in range(tokens):
        h = x
        for i, c in enumerate(caches):
            q, k, v = _split(h, W.qkv[i])
            o = c.attend(q, k, v)
            h = h + o.reshape(1, HQ * E) @ W.o[i]
        x = h / np.linalg.norm(h)
    return time.perf_counter() - t0


def run_torch(W, ctx, tokens, rng):
    import torch
    import torch.nn.functional as F
    kc = [torch.zeros(1, HKV, ctx + tokens, E) for _ in range(L_LAYERS)]
    vc = [torch.zeros(1, HKV, ctx + tokens, E) for _ in range(L_LAYERS)]
    for i in range(L_LAYERS):
        kc[i][:, :, :ctx] = torch.from_numpy(rng.standard_normal((1, HKV, ctx, E)).astype(np.float32))
        vc[i][:, :, :ctx] = torch.from_numpy(rng.standard_normal((1, HKV, ctx, E)).astype(np.float32))
    x = rng.standard_normal((1, D)).astype(np.float32)
    n = ctx
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(tokens):
            h = x
            for i in range(L_LAYERS):
                q, k, v = _split(h, W.qkv[i])
                kc[i][:, :, n:n + 1] = torch.from_numpy(k)
                vc[i][:, :, n:n + 1] = torch.from_numpy(v)
                o = F.scaled_dot_product_attention(torch.from_numpy(q), kc[i][:, :, :n + 1], vc[i][:, :, :n + 1],
                                                   enable_gqa=True).numpy()
                h = h + o.reshape(1, HQ * E) @ W.o[i]
            n += 1
            x = h / np.linalg.norm(h)
    return time.perf_counter() - t0


def run_numpy(W, ctx, tokens, rng):
    kc = [np.zeros((1, HKV, ctx + tokens, E), np.float32) for _ in range(L_LAYERS)]
    vc = [np.zeros((1, HKV, ctx + tokens, E), np.float32) for _ in range(L_LAYERS)]
    for i in range(L_LAYERS):
        kc[i][:, :, :ctx] = rng.standard_normal((1, HKV, ctx, E))
        vc[i][:, :, :ctx] = rng.standard_normal((1, HKV, ctx, E))
    x = rng.standard_normal((1, D)).astype(np.float32)
    n, g = ctx, HQ // HKV
    t0 = time.perf_counter()
    for _ in range(tokens):
        h = x
        for i in range(L_LAYERS):
            q, k, v = _split(h, W.qkv[i])
            kc[i][:, :, n:n + 1] = k
            vc[i][:, :, n:n + 1] = v
            kk = np.repeat(kc[i][:, :, :n + 1], g, axis=1)
            vv = np.repeat(vc[i][:, :, :n + 1], g, axis=1)
            s = q @ kk.swapaxes(-1, -2) / np.sqrt(E)
            p = np.exp(s - s.max(-1, keepdims=True))
            o = (p / p.sum(-1, keepdims=True)) @ vv
            h = h + o.reshape(1, HQ * E) @ W.o[i]
        n += 1
        x = h / np.linalg.norm(h)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results_generate.json"))
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    pyattn.set_num_threads(1)
    impls = {"pyattn": lambda W, c, t, r: run_pyattn(W, c, t, r),
             "pyattn int8 cache": lambda W, c, t, r: run_pyattn(W, c, t, r, "int8"),
             "NumPy": run_numpy}
    try:
        import torch
        torch.set_num_threads(1)
        impls["PyTorch SDPA"] = run_torch
    except ImportError:
        pass
    try:                                                # NumPy's BLAS on one thread too
        from threadpoolctl import threadpool_limits
        limits = threadpool_limits(1)
    except ImportError:
        limits = None
    load = os.getloadavg()[0]
    W = Weights(np.random.default_rng(0))
    rows = []
    for ctx in a.contexts:
        best = {k: float("inf") for k in impls}
        for _ in range(a.repeats):                      # interleaved
            for name, fn in impls.items():
                best[name] = min(best[name], fn(W, ctx, a.tokens, np.random.default_rng(1)))
        for name, sec in best.items():
            rows.append(dict(impl=name, context=ctx, tokens=a.tokens, seconds=sec, tokens_per_s=a.tokens / sec))
            print(f"context {ctx:6d}  {name:20s} {a.tokens / sec:8.1f} tokens/s")
    if limits is not None:
        limits.restore_original_limits()
    head = dict(machine=_cpu(), date=datetime.date.today().isoformat(), threads=1, load_before=round(load, 2),
                model=f"{L_LAYERS} layers, d_model {D}, {HQ}/{HKV} heads, E {E}, batch 1, float32",
                numpy=np.__version__, pyattn=pyattn.__version__)
    with open(a.out, "w") as f:
        json.dump(dict(head=head, rows=rows), f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
