"""pyattn benchmark: pyattn vs NumPy, PyTorch, ONNX Runtime and OpenVINO, side by side in one run
(ONNX Runtime and OpenVINO where installed, each optional: benchmarks/peers.py).

    python benchmarks/bench.py            # the full table (about 10 minutes on a 2-vCPU Zen 4)
    python benchmarks/bench.py --quick    # a smaller set of cases (a few minutes there)
    python benchmarks/bench.py --plot gflops.png --md RESULTS.md

Each thread count runs in its own worker process, started with the thread
variables of every library set (PYATTN_NUM_THREADS, OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, torch.set_num_threads, and, when
threadpoolctl is installed, threadpool_limits on every BLAS and OpenMP pool it
finds), so all three use the same number of cores and none oversubscribes them.
`--quick` leaves out the bfloat16 rows where they run on the portable family (its
exact emulation is slow: most of a --quick run's time there); `--only bf16`
runs them anyway. Inside a worker the implementations of a case
run interleaved (round robin, `--repeat` rounds) and the table reports the
median and the minimum; before each timed call the worker sleeps `--settle`
seconds, so that the worker threads of the library timed just before (which
spin for a while after a call: OpenBLAS, OpenMP) have gone to sleep and do
not steal the cores from the next one. GFLOP/s counts 2 flops per multiply-add: matmul
2MNK; attention 4·B·H·L·S·E (QKᵀ and PV), halved for causal. The peak is
measured by a float32 FMA probe at the start (per core, times threads), at
the vector width of pyattn's kernels in use (16 lanes on AVX-512, else 8);
the 1-thread worker also times the GEMM micro-kernel alone on L1-resident
panels (_C.gemm_probe), the ceiling for everything built on it.

Decode rows (sections decode, generation / kvdecode, quant, paged, flash) also
get their roofline (issue 37): bound = max(bytes / read bandwidth,
multiply-adds / peak of the instruction used), from the probes of the same
worker, and the time as % of it (a column, the "Decode roofline" table with
each cache dtype's speed against the float32 cache, and roof_* fields in the
JSON rows): see _roof and _roofline. `--only percall` times the fixed cost of
a tiny decode call per entry point against PyTorch's SDPA, with a breakdown
of attention_with_kvcache (issue 38); `--only hfgen` (run only when named)
times Hugging Face `model.generate` with "pyattn", "sdpa" and "eager"
(benchmarks/_bench_hfgen.py, issue 38). The worker imports pyattn from outside
the source tree: to time a build in place, put its folder on PYTHONPATH
(`PYTHONPATH=$PWD python benchmarks/bench.py ...`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers  # noqa: E402  (benchmarks/peers.py: ONNX Runtime and OpenVINO beside torch)


# ---------------------------------------------------------------- worker side

def _timeit(fn, settle):
    time.sleep(settle)
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _peak(pyattn):
    from pyattn import _C
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        flops = _C.fma_probe(5_000_000)
        dt = time.perf_counter() - t
        if flops is None:
            return None
        best = max(best, flops / dt)
    return best


def _bandwidth(pyattn):
    """Read bandwidth on the threads in use, GB/s: the best of 5 reads of a
    512 MB float32 buffer (far larger than any cache) by _C.read_probe."""
    import numpy as np
    from pyattn import _C
    buf = np.ones(128 << 20, np.float32)
    _C.read_probe(buf)                          # touch it (and start the threads)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        _C.read_probe(buf)
        best = max(best, buf.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def _wakeup():
    """What handing a tiny job to the pool costs, in ms: after 0.2 s of rest
    (the benchmark's --settle; the workers asleep, and on a virtual machine
    their vCPUs too) and back to back (workers still spinning). The job is
    _C.read_probe over 8 MiB, two tasks of 4 MiB; the median of 21."""
    import numpy as np
    from pyattn import _C
    buf = np.ones(2 << 20, np.float32)
    _C.read_probe(buf)
    out = {}
    for name, rest in (("idle_ms", 0.2), ("hot_ms", 0.0)):
        ts = [_timeit(lambda: _C.read_probe(buf), rest) for _ in range(21)]
        out[name] = 1e3 * statistics.median(ts)
    return out


def _blas_kernel():
    """The kernel NumPy's BLAS runs ('SkylakeX', 'Haswell', ...), via threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i.get('internal_api')} {i.get('architecture', '?')}" for i in info) or "none found"


ROOF_SECTIONS = ("decode", "generation", "kvdecode", "quant", "paged", "flash")   # rows with a roofline
KERNEL_CASES = (("float32", 256), ("float32", 64), ("float64", 256))


def _kernel_round(best):
    """One round of the GEMM micro-kernel alone, on panels that stay in L1
    (_C.gemm_probe), next to the FMA peak probe; keeps in `best` the highest
    rate of each (the worker runs a round before every case, so the best
    comes from quiet moments anywhere in the run). What the kernel can do
    before memory, packing and softmax take a share."""
    from pyattn import _C
    t = time.perf_counter()
    flops = _C.fma_probe(3_000_000)
    if flops is None:
        return
    best["peak"] = max(best.get("peak", 0.0), flops / (time.perf_counter() - t))
    for dt, kc in KERNEL_CASES:
        per_call = _C.gemm_probe(dt, kc, 1)      # 2 MR NR kc: the kernel's own tile
        t = time.perf_counter()
        f = _C.gemm_probe(dt, kc, int(2e9 / per_call))
        best[dt, kc] = max(best.get((dt, kc), 0.0), f / (time.perf_counter() - t))


def _kernel_pct(best):
    """% of the FMA peak (float64: of half of it) from _kernel_round's bests"""
    if "peak" not in best:
        return None
    pk = best["peak"]
    return {f"{dt} KC={kc}": 100 * best[dt, kc] / (pk if dt == "float32" else pk / 2)
            for dt, kc in KERNEL_CASES}


# ---- the decode roofline (issue 37): what a decode row must read and multiply
ROOF_ELEM = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5, "fp8_e4m3": 1.0,
             "fp8_e5m2": 1.0}
ROOF_SCALED = ("int8", "int4", "fp8_e4m3", "fp8_e5m2")      # caches with float32 scales per group


def _roof(B, Hkv, rows, G, E, Ev, cache="float32", precision=None, group=32):
    """What the roofline of one decode call counts (the driver's _roofline
    turns it into a bound from the probed peak and bandwidth): bytes = the
    K and V rows read, (E + Ev) x element size (+ int8 / int4 / fp8: the float32
    scales, (E + Ev) / group x 4) x rows x KV heads x batch; multiply-adds =
    G x (E + Ev) x rows x KV heads x batch (G: query heads per KV head; the
    query's own bytes and the output are left out: a few KiB). `peak` names
    the instruction the products run on: "fma" (float32 FMAs: every cache
    dtype is widened to float32 today) or "bf16" (precision="bf16": bfloat16
    dot products); precision="int8" counts at the FMA peak too (its key
    products run on integer dot products, its value products on FMAs)."""
    per_row = (E + Ev) * ROOF_ELEM[cache] + ((E + Ev) / group * 4.0 if cache in ROOF_SCALED else 0.0)
    n = float(rows) * Hkv * B
    return {"bytes": per_row * n, "madds": float(G) * (E + Ev) * n, "cache": cache,
            "precision": precision or "default", "peak": "bf16" if precision == "bf16" else "fma"}


# the products of a transformer layer: (B*T, D) @ (D, 3D) and (B*T, D) @ (D, D)
TALL = ((2048, 768, 2304), (2048, 768, 768))


def _cases(quick, target_shapes=False):
    if target_shapes:                     # the shapes issue 23's targets name (plus L = 512, 1024)
        return [2048], [(1, 8, L, E, causal) for L in (512, 1024, 2048) for E in (64, 128)
                        for causal in (False, True)]
    mm = [512, 1024] if quick else [512, 1024, 2048]
    attn = []
    Ls = [512, 1024] if quick else [128, 512, 1024, 2048, 4096]
    Es = [64] if quick else [32, 64, 128]
    for L in Ls:
        for E in Es:
            for causal in (False, True):
                attn.append((1, 8, L, E, causal))
    if not quick:                         # the other common head dims
        attn += [(1, 8, 1024, 80, False), (1, 8, 1024, 96, False)]
    return mm, attn


def _mm_shape(M, K, N):
    return f"{M}^3" if M == K == N else f"({M}x{K}) @ ({K}x{N})"


def worker(args):
    import numpy as np
    import pyattn
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    pyattn.set_num_threads(args.threads)
    try:                              # every BLAS / OpenMP pool, whatever the env variables reached
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=args.threads, user_api="blas")
        threadpool_limits(limits=args.threads, user_api="openmp")
    except ImportError:
        pass
    rng = np.random.default_rng(0)
    rows = []
    peak1 = _peak(pyattn)
    emit = lambda r: print("ROW " + json.dumps(r), flush=True)
    emit({"kind": "impls", "torch": None if torch is None else torch.__version__, "threads": args.threads,
          "blas": _blas_kernel(), "numpy_env": args.numpy_only, "avx2_peers": args.avx2_peers})
    if args.numpy_only:               # NumPy's matmul alone, in this process's environment
        mm, _ = _cases(args.quick, args.target_shapes)
        for M, K, N in [(n, n, n) for n in mm] + ([] if args.quick else list(TALL)):
            a = rng.standard_normal((M, K), dtype=np.float32)
            b = rng.standard_normal((K, N), dtype=np.float32)
            ts = []
            for _ in range(args.repeat + 1):
                ts.append(_timeit(lambda: np.matmul(a, b), args.settle))
            ts = ts[1:]
            emit(dict(op="matmul", shape=_mm_shape(M, K, N), impl="numpy, OPENBLAS_CORETYPE unset",
                      threads=args.threads, flops=2.0 * M * N * K, median_ms=1e3 * statistics.median(ts),
                      min_ms=1e3 * min(ts)))
        return
    emit({"kind": "bandwidth", "gbs": _bandwidth(pyattn), "threads": args.threads})
    if args.threads > 1:
        emit(dict(_wakeup(), kind="wakeup", threads=args.threads))
    emit({"kind": "peak", "gflops_core": None if peak1 is None else peak1 / 1e9, "threads": args.threads})
    kbest = {}
    mm, attn = _cases(args.quick, args.target_shapes)
    want = lambda section: args.only is None or section in args.only.split(",")  # noqa: E731
    if any(want(x) for x in ROOF_SECTIONS):   # the bfloat16 dot-product peak, for the decode roofline
        from pyattn import _C
        best = None
        for _ in range(3):
            t = time.perf_counter()
            fl = _C.bf16_probe(3_000_000)
            if fl is not None:
                best = max(best or 0.0, fl / (time.perf_counter() - t) / 1e9)
        emit({"kind": "bf16peak", "threads": args.threads, "gflops_core": best,
              "kernel": _C.config()["gemm_bf16"], "isa": _C.config()["isa"]})
    rep = args.repeat

    probe_buf = []                        # the read probe's buffer, made once

    def read_side():
        """(bytes, fn): the read-bandwidth probe, to time beside a
        memory-bound case in the same rounds (the machine's bandwidth drifts
        with its neighbours: a figure from the start of the run can be far
        from the one at the time of the case)"""
        from pyattn import _C
        if not probe_buf:
            probe_buf.append(np.ones(128 << 20, np.float32))
        buf = probe_buf[0]
        return buf.nbytes, lambda: _C.read_probe(buf)

    def run(case, flops, impls, bytes_of=None, rounds=None, side=None, roof=None):
        if args.avx2_peers:               # the peers pinned to AVX2 (AVX2_PINS), labelled so
            impls = {(k if k == "pyattn" else AVX2_LABELS.get(k, k)): f for k, f in impls.items()}
            case = dict(case, run="avx2")
        if args.threads == 1:
            _kernel_round(kbest)
        times = {k: [] for k in impls}
        side_ts = []
        for f in impls.values():          # warm-up
            f()
        if side:
            side[1]()
        for _ in range(rounds or rep):
            for k, f in impls.items():    # interleaved
                times[k].append(_timeit(f, args.settle))
            if side:
                side_ts.append(_timeit(side[1], args.settle))
        if side:
            emit({"kind": "side_bw", "op": case["op"], "shape": case["shape"], "threads": args.threads,
                  "gbs": side[0] / min(side_ts) / 1e9})
        for k, ts in times.items():
            r = dict(case, impl=k, threads=args.threads, flops=flops,
                     median_ms=1e3 * statistics.median(ts), min_ms=1e3 * min(ts))
            if bytes_of and bytes_of.get(k):
                r["bytes"] = bytes_of[k]
            if roof and roof.get(k):      # a decode row: what its roofline counts (driver: _roofline)
                r["roof"] = roof[k]
            rows.append(r)
            emit(r)

    for M, K, N in ([(n, n, n) for n in mm] + ([] if args.quick else list(TALL))) if want("matmul") else []:
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        impls = {"pyattn": lambda: pyattn.matmul(a, b), "numpy": lambda: np.matmul(a, b)}
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            impls["torch"] = lambda: torch.matmul(ta, tb)
        run({"op": "matmul", "shape": _mm_shape(M, K, N)}, 2.0 * M * N * K, impls)

    for B, H, L, E, causal in attn if want("sdpa") else []:
        q, k, v = (rng.standard_normal((B, H, L, E), dtype=np.float32) for _ in range(3))
        impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal)}
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
            F = torch.nn.functional
            impls["torch"] = lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        impls.update(peers.attention_impls(q, k, v, causal, args.threads))     # ONNX Runtime, OpenVINO
        peers.check(impls, impls["pyattn"]())
        if L <= 2048:
            tril = np.tril(np.ones((L, L), bool))

            def naive():                  # the seeds' way, in NumPy
                s = q @ np.swapaxes(k, -1, -2) / np.sqrt(E)
                if causal:
                    s = np.where(tril, s, -np.inf)
                s = np.exp(s - s.max(-1, keepdims=True))
                return (s / s.sum(-1, keepdims=True)) @ v
            impls["numpy"] = naive
        flops = 4.0 * B * H * L * L * E * (0.5 if causal else 1.0)
        shape = f"B={B} H={H} L=S={L} E={E}" + (" causal" if causal else "")
        run({"op": "sdpa", "shape": shape}, flops, impls)
        # and back to back, no rest between calls: the pool's threads still
        # awake (a training or generation loop), for the thread-scaling rows
        # (one rest first, so that the other libraries' threads are asleep
        # and leave the cores to pyattn's, then one untimed call)
        f = impls["pyattn"]
        time.sleep(args.settle)
        f()
        emit({"kind": "hot", "op": "sdpa", "shape": shape, "threads": args.threads,
              "min_ms": 1e3 * min(_timeit(f, 0.0) for _ in range(max(5, rep)))})

    if want("decode"):
        # decode: one new query against a long cache of keys (the keys split over threads)
        S = 8192 if args.quick else 32768
        q = rng.standard_normal((1, 8, 1, 64), dtype=np.float32)
        k, v = (rng.standard_normal((1, 8, S, 64), dtype=np.float32) for _ in range(2))
        impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal="bottom_right")}
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
            impls["torch"] = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
        rf = _roof(1, 8, S, 1, 64, 64)
        run({"op": "sdpa", "shape": f"decode B=1 H=8 L=1 S={S} E=64"}, 4.0 * 8 * S * 64, impls,
            roof={n: rf for n in impls})
        del q, k, v, impls
        if not args.quick:                # the decode step of the issues: 32 heads, E=128, 8192 keys
            H, S, E = 32, 8192, 128
            q = rng.standard_normal((1, H, 1, E), dtype=np.float32)
            k, v = (rng.standard_normal((1, H, S, E), dtype=np.float32) for _ in range(2))
            impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal="bottom_right")}
            if torch is not None:
                tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
                impls["torch"] = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
            rf = _roof(1, H, S, 1, E, E)
            run({"op": "sdpa", "shape": f"decode B=1 H={H} L=1 S={S} E={E}", "bytes": k.nbytes + v.nbytes},
                4.0 * H * S * E, impls, side=read_side(), roof={n: rf for n in impls})
            del q, k, v, impls

    if want("generation"):
        generation(args, rng, run, torch, read_side)
    elif want("kvdecode"):                # the generation section's decode rows alone
        kv_decode(args, rng, run, torch, read_side)
    if want("flash"):
        flash(args, rng, run, torch)
    if want("quant"):
        quant_caches(args, rng, run, read_side)
    if want("training"):
        training(args, rng, run, torch)
    if want("varlen"):
        varlen(args, rng, run, torch)
    if want("paged"):
        paged(args, rng, run)
    if want("groups"):                    # issue 41: MQA / MLA decode, large head dims
        group_decode(args, rng, run)
    if want("shared"):                    # issue 38: shared-prefix (cascade) reads
        shared_prefix(args, rng, run)
    if want("percall"):                   # issue 38: the fixed cost of a tiny decode call
        percall(args, rng, torch, emit)
    if want("hf"):                        # pyattn in PyTorch and transformers: benchmarks/_bench_hf.py
        sys.path.insert(0, HERE)
        from _bench_hf import hf
        hf(args, rng, run, torch)
    if args.only and "hfgen" in args.only.split(","):   # issue 38: HF generation (only when named)
        sys.path.insert(0, HERE)
        from _bench_hfgen import hfgen
        hfgen(args, emit, torch)
    from pyattn import _C
    bf16_emulated = _C.config()["gemm_bf16"].endswith("_ref")      # the portable scalar emulation
    if want("bf16") and args.quick and bf16_emulated and not args.only:
        print("bench: --quick leaves out the bfloat16 rows: the portable family runs them, and its "
              "exact emulation is slow (--only bf16 runs them)", file=sys.stderr, flush=True)
    elif want("bf16"):
        t = time.perf_counter()
        fl = _C.bf16_probe(5_000_000)
        emit({"kind": "bf16peak", "threads": args.threads,
              "gflops_core": None if fl is None else fl / (time.perf_counter() - t) / 1e9,
              "kernel": _C.config()["gemm_bf16"]})
        bf16(args, rng, run, torch)

    if want("mha"):
        # MultiHeadAttention forward, B=4, T=512, D=768, 12 heads
        from pyattn.nn import MultiHeadAttention
        B, T, D, H = (2, 256, 768, 12) if args.quick else (4, 512, 768, 12)
        x = rng.standard_normal((B, T, D), dtype=np.float32)
        impls = {}
        if torch is not None:
            ref = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
            layer = MultiHeadAttention(D, D, H, qkv_bias=True, causal=False).load_state_dict(ref.state_dict()).eval()
            tx = torch.from_numpy(x)

            def torch_mha():
                with torch.no_grad():
                    return ref(tx, tx, tx, need_weights=False)
            impls["pyattn"] = lambda: layer(x)
            impls["torch"] = torch_mha
        else:
            layer = MultiHeadAttention(D, D, H, qkv_bias=True, causal=False, rng=0).eval()
            impls["pyattn"] = lambda: layer(x)
        flops = 2.0 * B * T * D * D * 4 + 4.0 * B * T * T * D
        run({"op": "mha", "shape": f"B={B} T={T} D={D} H={H}"}, flops, impls)
    if want("blockmask") and args.threads == 1:
        blockmask(args, rng, run, emit)
    if args.threads == 1:
        emit({"kind": "kernel", "threads": 1, "rounds": len(mm) + len(attn) + 2, "kernel_pct": _kernel_pct(kbest)})


def _blockmask_cases(L, rng):
    """The issue's masks (issue #26): 16 documents of random lengths, prefix-LM
    (L/4), chunked causal (L/8), sliding window (L/8) + documents."""
    import numpy as np
    import pyattn
    M = pyattn.masks
    cuts = np.sort(rng.choice(np.arange(1, L), 15, replace=False))
    ids = np.searchsorted(cuts, np.arange(L), side="right")
    return {"document (16 docs)": M.document(ids), f"prefix-LM {L // 4}": M.prefix_lm(L // 4),
            f"chunked causal {L // 8}": M.chunked_causal(L // 8),
            f"window {L // 8} + document": M.and_masks(M.sliding_window(L // 8), M.document(ids))}


def blockmask(args, rng, run, emit):
    """Block masks, 1 thread, B1 H8 E64 (L = S = 8192; 2048 with --quick): per
    mask the forward and the backward with block_mask=, with no mask (the
    dense kernel) and with the same mask as a dense bool array; the tile
    share; the BlockMask build time (the targets are in targets())."""
    import numpy as np
    import pyattn
    L, E, H = (2048 if args.quick else 8192), 64, 8
    q, k, v = (rng.standard_normal((1, H, L, E), dtype=np.float32) for _ in range(3))
    fl = 4.0 * H * L * L * E
    for name, mm in _blockmask_cases(L, rng).items():
        t0 = time.perf_counter()
        bm = pyattn.BlockMask.from_mask_mod(mm, None, None, L, L)
        build = time.perf_counter() - t0
        for _ in range(2):
            t0 = time.perf_counter()
            pyattn.BlockMask.from_mask_mod(mm, None, None, L, L)
            build = min(build, time.perf_counter() - t0)
        dense = bm.to_dense()[0, 0]
        emit({"kind": "blockmask", "mask": name, "L": L, "share": 1.0 - bm.sparsity(), "sparsity": bm.sparsity(),
              "build_ms": 1e3 * build, "threads": 1})
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
        od, lsed = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
        go = np.ones_like(o)
        case = {"op": "blockmask fwd", "shape": f"B=1 H={H} L=S={L} E={E} {name}"}
        run(case, fl, {"block_mask": lambda: pyattn.scaled_dot_product_attention(q, k, v, block_mask=bm),
                       "no mask": lambda: pyattn.scaled_dot_product_attention(q, k, v),
                       "bool mask": lambda: pyattn.scaled_dot_product_attention(q, k, v, dense)})
        case = {"op": "blockmask bwd", "shape": f"B=1 H={H} L=S={L} E={E} {name}"}
        bwd = pyattn.scaled_dot_product_attention_backward
        run(case, 2.5 * fl, {"block_mask": lambda: bwd(go, q, k, v, o, lse, block_mask=bm),
                             "no mask": lambda: bwd(go, q, k, v, od, lsed),
                             "bool mask": lambda: bwd(go, q, k, v, o, lse, dense)})


def generation(args, rng, run, torch, read_side):
    """The rows of the issue "Generate": decode over KV caches of three dtypes
    (kv_decode: `--only kvdecode` runs them alone), a sliding window, and
    prefill with ALiBi / softcap / sinks."""
    import numpy as np
    import pyattn
    kv_decode(args, rng, run, torch, read_side)
    # a sliding window over a long causal sequence, against full causal attention
    # and against plain attention with as many keys per row as the window holds
    H, E = 8, 64
    L, W = (8192, 1024) if args.quick else (32768, 4096)
    q, k, v = (rng.standard_normal((1, H, L, E), dtype=np.float32) for _ in range(3))
    kw_ = k[:, :, :W].copy()
    vw_ = v[:, :, :W].copy()
    impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, window=(W - 1, 0)),
             "pyattn full causal": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=True),
             f"pyattn {W} keys, no mask": lambda: pyattn.scaled_dot_product_attention(q, kw_, vw_)}
    run({"op": "window", "shape": f"B=1 H={H} L=S={L} E={E} causal window={W}"}, 4.0 * H * L * W * E, impls,
        rounds=2 if not args.quick else None)
    del q, k, v, kw_, vw_
    # prefill with the structured masks, against the plain kernel on the same shape
    H, L, E = 8, 2048, 64
    q, k, v = (rng.standard_normal((1, H, L, E), dtype=np.float32) for _ in range(3))
    slopes = 2.0 ** -np.arange(1, H + 1)
    impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=True),
             "pyattn alibi": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, alibi_slopes=slopes),
             "pyattn softcap": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, softcap=30.0),
             "pyattn sinks": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=np.zeros(H))}
    run({"op": "prefill", "shape": f"B=1 H={H} L=S={L} E={E} causal"}, 2.0 * H * L * L * E, impls)


def kv_decode(args, rng, run, torch, read_side):
    """Decode (GQA 32/8, E=128, one new query) over float32, float16 and
    bfloat16 caches (and the bfloat16 cache with precision="bf16"), PyTorch's
    SDPA on the float32 cache beside them."""
    import numpy as np
    import pyattn
    try:
        import ml_dtypes
        bf16 = ml_dtypes.bfloat16
    except ImportError:
        bf16 = None
    # decode: B=1, 32 query heads over 8 cache heads (GQA), E=128, one new query
    Hq, Hkv, E = 32, 8, 128
    for S in ([4096, 16384] if args.quick else [4096, 16384, 65536]):
        q = rng.standard_normal((1, Hq, 1, E), dtype=np.float32)
        k32 = rng.standard_normal((1, Hkv, S, E), dtype=np.float32)
        v32 = rng.standard_normal((1, Hkv, S, E), dtype=np.float32)
        caches = {"pyattn": (k32, v32), "pyattn float16 cache": (k32.astype(np.float16), v32.astype(np.float16))}
        if bf16 is not None:
            caches["pyattn bfloat16 cache"] = (k32.astype(bf16), v32.astype(bf16))
        impls = {name: (lambda kc=kc, vc=vc: pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S))
                 for name, (kc, vc) in caches.items()}
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(x) for x in (q, k32, v32))
            impls["torch"] = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
        roof = {"pyattn": _roof(1, Hkv, S, Hq // Hkv, E, E), "torch": _roof(1, Hkv, S, Hq // Hkv, E, E)}
        for dt in ("float16", "bfloat16"):
            roof[f"pyattn {dt} cache"] = _roof(1, Hkv, S, Hq // Hkv, E, E, dt)
        if bf16 is not None:                  # precision="bf16" on the bfloat16 cache: bfloat16 dot products
            kc, vc = caches["pyattn bfloat16 cache"]
            name = "pyattn bfloat16 cache, precision=bf16"
            impls[name] = lambda kc=kc, vc=vc: pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S,
                                                                             precision="bf16")
            roof[name] = _roof(1, Hkv, S, Hq // Hkv, E, E, "bfloat16", "bf16")
        run({"op": "decode", "shape": f"B=1 Hq={Hq} Hkv={Hkv} L=1 S={S} E={E}"}, 4.0 * Hq * S * E, impls,
            {n: kc.nbytes + vc.nbytes for n, (kc, vc) in caches.items()}, side=read_side(), roof=roof)
        del caches, impls, k32, v32


def flash(args, rng, run, torch):
    """The rows of the issue "FlashAttention's Python API": pyattn.flash's
    flash_attn_func and flash_attn_with_kvcache against the same computation
    through pyattn's own API on the same token-major memory (transposed views:
    what the adapter passes), and a decode step with rotary embedding on the
    appended key against the same step without it."""
    import numpy as np
    import pyattn
    from pyattn import flash as fl
    B, H, L, E = 1, 8, (1024 if args.quick else 2048), 64
    q, k, v = (rng.standard_normal((B, L, H, E), dtype=np.float32) for _ in range(3))
    t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True),
             "pyattn.flash": lambda: fl.flash_attn_func(q, k, v, causal=True)}
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        impls["pyattn.flash, torch tensors"] = lambda: fl.flash_attn_func(tq, tk, tv, causal=True)
    run({"op": "flash fwd", "shape": f"B={B} L=S={L} H={H} E={E} causal"}, 2.0 * B * H * L * L * E, impls)
    del q, k, v, impls
    # decode: one new token per step, 32 query heads over 8 cache heads, E = 128
    Hq, Hkv, E, S = 32, 8, 128, (8192 if args.quick else 16384)
    kc = rng.standard_normal((1, S, Hkv, E), dtype=np.float32)
    vc = rng.standard_normal((1, S, Hkv, E), dtype=np.float32)
    q = rng.standard_normal((1, 1, Hq, E), dtype=np.float32)
    kn, vn = (rng.standard_normal((1, 1, Hkv, E), dtype=np.float32) for _ in range(2))
    ang = rng.random((S, E // 2)) * 6.28
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    n = S - 1
    kw = dict(cache_seqlens=n, is_causal=True)
    impls = {"pyattn": lambda: pyattn.attention_with_kvcache(t(q), t(kc), t(vc), t(kn), t(vn), **kw),
             "pyattn.flash": lambda: fl.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=n, causal=True),
             "pyattn, rotary": lambda: pyattn.attention_with_kvcache(
                 t(q), t(kc), t(vc), t(kn), t(vn), rotary_cos=cos, rotary_sin=sin, **kw)}
    rf = _roof(1, Hkv, S, Hq // Hkv, E, E)               # n = S - 1 cached rows + the one appended
    run({"op": "flash kvcache", "shape": f"B=1 Hq={Hq} Hkv={Hkv} T=1 S={S} E={E} token-major"},
        4.0 * Hq * S * E, impls, roof={n: rf for n in impls})


def paged(args, rng, run):
    """The rows of the issue "Serve" for paged caches: decode through a block
    table (block sizes 16 and 256, blocks in random order) against the
    contiguous cache holding the same rows, and a mixed batch (2 prefill
    chunks of 512 tokens + 30 decode steps, caches of 4096 rows, one call with
    cu_seqlens_q) against its two parts called separately."""
    import numpy as np
    import pyattn

    def pool(c, bs, tab):                      # the rows of cache c in blocks of bs, at tab
        B, H, S, E = c.shape
        p = np.empty((B * (S // bs), H, bs, E), c.dtype)
        for b in range(B):
            p[tab[b]] = c[b].reshape(H, S // bs, bs, E).transpose(1, 0, 2, 3)
        return p

    B, Hq, Hkv, E, S = 4, 32, 8, 128, 4096
    q = rng.standard_normal((B, Hq, 1, E), dtype=np.float32)
    kc = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
    vc = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
    impls = {"pyattn contiguous": lambda: pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S)}
    for bs in (16, 256):
        tab = rng.permutation(B * (S // bs)).reshape(B, S // bs)      # blocks in random order
        kp, vp = pool(kc, bs, tab), pool(vc, bs, tab)
        impls[f"pyattn paged bs={bs}"] = (lambda kp=kp, vp=vp, tab=tab: pyattn.attention_with_kvcache(
            q, kp, vp, cache_seqlens=S, block_table=tab))
    rf = _roof(B, Hkv, S, Hq // Hkv, E, E)
    run({"op": "paged decode", "shape": f"B={B} Hq={Hq} Hkv={Hkv} L=1 S={S} E={E}"}, 4.0 * B * Hq * S * E, impls,
        roof={n: rf for n in impls})
    del impls, kc, vc
    # mixed: 2 sequences bring a prefill chunk of 512 after 3584 cached rows, 30 decode one token after 4095
    Hq, Hkv, E, bs, P, D = 8, 2, 64, 16, 2, 30
    n = np.array([S - 512] * P + [S - 1] * D)
    Ts = np.array([512] * P + [1] * D)
    cu = np.concatenate([[0], np.cumsum(Ts)])
    N = (P + D) * S // bs
    kp = rng.standard_normal((N, Hkv, bs, E), dtype=np.float32)
    vp = rng.standard_normal((N, Hkv, bs, E), dtype=np.float32)
    tab = rng.permutation(N).reshape(P + D, S // bs)
    tot = int(cu[-1])
    q, kn, vn = (rng.standard_normal((tot, h, E), dtype=np.float32) for h in (Hq, Hkv, Hkv))
    pre = slice(0, 512 * P)

    def parts():
        pyattn.attention_with_kvcache(q[pre].reshape(P, 512, Hq, E).transpose(0, 2, 1, 3), kp, vp,
                                      kn[pre].reshape(P, 512, Hkv, E).transpose(0, 2, 1, 3),
                                      vn[pre].reshape(P, 512, Hkv, E).transpose(0, 2, 1, 3),
                                      cache_seqlens=n[:P], block_table=tab[:P])
        pyattn.attention_with_kvcache(q[512 * P:, :, None], kp, vp, kn[512 * P:, :, None], vn[512 * P:, :, None],
                                      cache_seqlens=n[P:], block_table=tab[P:])
    impls = {"pyattn mixed, one call": lambda: pyattn.attention_with_kvcache(
                 q, kp, vp, kn, vn, cache_seqlens=n, block_table=tab, cu_seqlens_q=cu),
             "pyattn parts, two calls": parts}
    flops = 4.0 * Hq * E * (P * 512 * (S - 256) + D * S)
    run({"op": "paged mixed", "shape": f"{P}x512 prefill + {D} decode, S={S} Hq={Hq} Hkv={Hkv} E={E} bs={bs}"},
        flops, impls)


def shared_prefix(args, rng, run):
    """Issue 38 item 3, shared-prefix (cascade) reads: 16 sequences forked
    from one 8192-token prompt, 64 tokens of their own each (blocks of 16
    rows), one decode step for all 16 in one paged call. "pyattn shared
    reads": the forks' block table (the prompt's blocks held by all 16, read
    once for all of them); "pyattn 16 unshared copies": the same rows with
    every sequence on blocks of its own (the step without shared reads: the
    same bits). float32 and int8 caches, MHA (8 heads) and GQA (32 query heads
    on 8), with each kernel family of this CPU (its best, and avx2 where that
    is another one): the family in the shape's brackets."""
    import numpy as np
    import pyattn
    from pyattn import _C

    B, Hkv, E, bs, P, own = 16, 8, 128, 16, 8192, 64
    nsh, nown = P // bs, -(-own // bs)
    tab_sh = np.array([np.concatenate([np.arange(nsh), nsh + b * nown + np.arange(nown)]) for b in range(B)])
    tab_un = np.arange(B * (nsh + nown)).reshape(B, nsh + nown)
    lens = np.full(B, P + own, np.int32)
    codes = {w: c for w, c, built in _C.families() if built}
    best = _C.config()["isa"]
    fams = [best] + (["avx2"] if best.startswith("avx512") and "avx2" in codes else [])
    for kind in ("float32", "int8"):
        N = nsh + B * nown
        if kind == "int8":
            kp, vp = (rng.integers(-127, 128, (N, Hkv, bs, E), dtype=np.int8) for _ in range(2))
            ks, vs = (rng.uniform(0.001, 0.02, (N, Hkv, bs, E // 32)).astype(np.float32) for _ in range(2))
        else:
            kp, vp = (rng.standard_normal((N, Hkv, bs, E), dtype=np.float32) for _ in range(2))
            ks = vs = None
        un = [None if x is None else x[tab_sh.ravel()] for x in (kp, vp, ks, vs)]   # copies, in table order
        row = E * kp.itemsize + (0 if ks is None else E // 32 * 4)       # bytes of a K (or V) row
        for Hq in (8, 32):
            q = rng.standard_normal((B, Hq, 1, E), dtype=np.float32)
            for fam in fams:
                _C.select_isa(codes[fam])
                try:
                    impls = {"pyattn shared reads": lambda: pyattn.attention_with_kvcache(
                                 q, kp, vp, cache_seqlens=lens, block_table=tab_sh, k_scale=ks, v_scale=vs),
                             "pyattn 16 unshared copies": lambda: pyattn.attention_with_kvcache(
                                 q, un[0], un[1], cache_seqlens=lens, block_table=tab_un, k_scale=un[2],
                                 v_scale=un[3])}
                    nbytes = {"pyattn shared reads": 2 * row * Hkv * (P + B * own),
                              "pyattn 16 unshared copies": 2 * row * Hkv * B * (P + own)}
                    run({"op": "shared prefix", "shape": f"16 forks of {P} + {own} tokens, Hq={Hq} Hkv={Hkv} "
                         f"E={E} bs={bs} {kind} cache [{fam}]"}, 4.0 * B * Hq * (P + own) * E, impls,
                        bytes_of=nbytes, rounds=max(3, args.repeat // 2))
                finally:
                    _C.select_isa(codes[best])
        del kp, vp, ks, vs, un


def group_decode(args, rng, run):
    """Issue 41 item 4: decode where a key/value head serves many query heads
    (MQA: 32 and 128 query heads on one; DeepSeek's latent attention: 128
    query heads, one key head of E = 576 = 512 + 64 rotary dims, the value a
    view of its first 512), float32 and bfloat16 caches, S = 8192 -- compute-
    bound shapes, GFLOP/s against the FMA peak; and head dims 64 ... 1024
    (32 query heads on one key head) against the rate at E = 256."""
    import numpy as np
    import pyattn
    try:
        import ml_dtypes
        bf = ml_dtypes.bfloat16
    except ImportError:
        bf = None
    S = 8192
    cases = [(32, 128, 128, False, np.float32), (128, 128, 128, False, np.float32),
             (128, 576, 512, True, np.float32)]
    if bf is not None:
        cases += [(128, 576, 512, True, bf)]
    cases += [(32, E, E, False, np.float32) for E in (64, 256, 512, 768, 1024)]
    for Hq, E, Ev, view, dt in cases:
        q = rng.standard_normal((1, Hq, 1, E), dtype=np.float32).astype(dt)
        k = rng.standard_normal((1, 1, S, E), dtype=np.float32).astype(dt)
        v = k[..., :Ev] if view else rng.standard_normal((1, 1, S, Ev), dtype=np.float32).astype(dt)
        name = "MLA" if view else "MQA"
        run({"op": "group decode", "shape": f"{name} Hq={Hq} Hkv=1 E={E} Ev={Ev} S={S} "
             f"{np.dtype(dt).name} cache" + (" (v = k[..., :512])" if view else "")},
            2.0 * Hq * S * (E + Ev), {"pyattn": lambda: pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S)},
            rounds=max(3, args.repeat // 2))


def quant_caches(args, rng, run, read_side):
    """The rows of issue #25, quantized KV caches: decode (GQA 32/8, E=128,
    one new query) over float32, int8 and int4 caches (scales per 32), the
    bytes of values and scales read against the read bandwidth probed in the
    same rounds; the same int8 step writing one new token (the cost of
    quantizing on append); and the int8 / int4 caches with precision="int8"
    (the query quantized to int8, integer key products: vpdpbusd with
    AVX512_VNNI) against the default precision's float32 products; fp8
    (e4m3, e5m2) caches too where ml_dtypes is installed (their tiles
    widened to float32 in the frame, then the float32 kernels)."""
    import numpy as np
    import pyattn
    Hq, Hkv, E, G = 32, 8, 128, 32
    for S in ([16384] if args.quick else [16384, 65536]):
        q = rng.standard_normal((1, Hq, 1, E), dtype=np.float32)
        k32 = rng.standard_normal((1, Hkv, S, E), dtype=np.float32)
        v32 = rng.standard_normal((1, Hkv, S, E), dtype=np.float32)
        caches = {"pyattn": (k32, v32, None, None)}
        try:
            import ml_dtypes  # noqa: F401  (the fp8 caches' dtypes)
            fp8 = ("fp8_e4m3", "fp8_e5m2")
        except ImportError:
            fp8 = ()
        for dt in ("int8", "int4") + fp8:
            (kq, ks), (vq, vs) = pyattn.quantize(k32, dt, group_size=G), pyattn.quantize(v32, dt, group_size=G)
            caches[f"pyattn {dt} cache"] = (kq, vq, ks, vs)
        impls = {name: (lambda kc=kc, vc=vc, ks=ks, vs=vs: pyattn.attention_with_kvcache(
                     q, kc, vc, cache_seqlens=S, k_scale=ks, v_scale=vs))
                 for name, (kc, vc, ks, vs) in caches.items()}
        for dt in ("int8", "int4"):
            kc, vc, ks, vs = caches[f"pyattn {dt} cache"]
            impls[f"pyattn {dt} cache, precision=int8"] = (lambda kc=kc, vc=vc, ks=ks, vs=vs: pyattn.attention_with_kvcache(
                q, kc, vc, cache_seqlens=S, k_scale=ks, v_scale=vs, precision="int8"))
            impls[f"pyattn {dt} cache, precision=bf16"] = (lambda kc=kc, vc=vc, ks=ks, vs=vs: pyattn.attention_with_kvcache(
                q, kc, vc, cache_seqlens=S, k_scale=ks, v_scale=vs, precision="bf16"))
        nbytes = {n: sum(a.nbytes for a in c if a is not None) for n, c in caches.items()}
        for dt in ("int8", "int4"):
            for p in ("int8", "bf16"):
                nbytes[f"pyattn {dt} cache, precision={p}"] = nbytes[f"pyattn {dt} cache"]
        kq, vq, ks, vs = (a.copy() for a in caches["pyattn int8 cache"])
        k1, v1 = rng.standard_normal((2, 1, Hkv, 1, E), dtype=np.float32)
        impls["pyattn int8 cache, appending a token"] = lambda: pyattn.attention_with_kvcache(
            q, kq, vq, k1, v1, cache_seqlens=S - 1, k_scale=ks, v_scale=vs)
        roof = {"pyattn": _roof(1, Hkv, S, Hq // Hkv, E, E),
                "pyattn int8 cache": _roof(1, Hkv, S, Hq // Hkv, E, E, "int8", group=G),
                "pyattn int4 cache": _roof(1, Hkv, S, Hq // Hkv, E, E, "int4", group=G),
                "pyattn int8 cache, appending a token": _roof(1, Hkv, S, Hq // Hkv, E, E, "int8", group=G),
                "pyattn int8 cache, precision=int8": _roof(1, Hkv, S, Hq // Hkv, E, E, "int8", "int8", G),
                "pyattn int4 cache, precision=int8": _roof(1, Hkv, S, Hq // Hkv, E, E, "int4", "int8", G)}
        for dt in fp8:
            roof[f"pyattn {dt} cache"] = _roof(1, Hkv, S, Hq // Hkv, E, E, dt, group=G)
        for dt in ("int8", "int4"):           # precision="bf16": bfloat16 query rows, float32 FMAs (qrowdot)
            roof[f"pyattn {dt} cache, precision=bf16"] = dict(_roof(1, Hkv, S, Hq // Hkv, E, E, dt, group=G),
                                                             precision="bf16")
        run({"op": "qdecode", "shape": f"B=1 Hq={Hq} Hkv={Hkv} L=1 S={S} E={E} G={G}"}, 4.0 * Hq * S * E,
            impls, nbytes, side=read_side(), roof=roof)
        del caches, impls, k32, v32, kq, vq, ks, vs


def training(args, rng, run, torch):
    """The rows of the issue "Train": the attention backward beside PyTorch's
    CPU backward on the same shapes (its graph built once, `out.backward(g,
    retain_graph=True)` timed), forward + backward through
    scaled_dot_product_attention_vjp, and the MultiHeadAttention layer's
    forward + backward. GFLOP/s count the backward as 2.5x the forward's
    flops (5 matrix products against 2)."""
    import numpy as np
    import pyattn
    # (H, L, E, causal, key/value heads): the last rows are MQA with B = 1
    # (one key/value head: the backward's key-split spreads it over threads)
    cases = [(8, 1024, 64, False, 8), (8, 1024, 64, True, 8), (8, 2048, 64, False, 8), (8, 2048, 64, True, 8),
             (4, 2048, 128, False, 4), (4, 2048, 128, True, 4), (8, 2048, 64, False, 1), (8, 2048, 64, True, 1)]
    if args.quick:
        cases = [(8, 1024, 64, False, 8), (8, 1024, 64, True, 8), (8, 1024, 64, True, 1)]
    for H, L, E, causal, Hkv in cases:
        q, g = (rng.standard_normal((1, H, L, E), dtype=np.float32) for _ in range(2))
        k, v = (rng.standard_normal((1, Hkv, L, E), dtype=np.float32) for _ in range(2))
        kw = {"is_causal": causal, "enable_gqa": Hkv != H}
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention_backward(g, q, k, v, o, lse, **kw)}
        fwdbwd = {"pyattn": lambda: pyattn.scaled_dot_product_attention_vjp(q, k, v, **kw)[1](g)}
        if torch is not None:
            F = torch.nn.functional
            tq, tk, tv = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
            tg = torch.from_numpy(g)
            tout = F.scaled_dot_product_attention(tq, tk, tv, **kw)

            def torch_bwd():
                tq.grad = tk.grad = tv.grad = None
                tout.backward(tg, retain_graph=True)

            def torch_fwdbwd():
                tq.grad = tk.grad = tv.grad = None
                F.scaled_dot_product_attention(tq, tk, tv, **kw).backward(tg)
            impls["torch"] = torch_bwd
            fwdbwd["torch"] = torch_fwdbwd
        fl = 4.0 * H * L * L * E * (0.5 if causal else 1.0)
        shape = f"B=1 H={H}" + (f"/{Hkv}" if Hkv != H else "") + f" L=S={L} E={E}" + (" causal" if causal else "")
        run({"op": "backward", "shape": shape}, 2.5 * fl, impls)
        run({"op": "fwd+bwd", "shape": shape}, 3.5 * fl, fwdbwd)
        del impls, fwdbwd
    # the layer: forward + backward in training mode (no dropout)
    from pyattn.nn import MultiHeadAttention
    B, T, D, H = (2, 256, 768, 12) if args.quick else (4, 512, 768, 12)
    x = rng.standard_normal((B, T, D), dtype=np.float32)
    gy = rng.standard_normal((B, T, D), dtype=np.float32)
    layer = MultiHeadAttention(D, D, H, qkv_bias=True, causal=False, rng=0)
    impls = {}
    if torch is not None:
        ref = torch.nn.MultiheadAttention(D, H, batch_first=True)
        layer.load_state_dict(ref.state_dict())
        tx = torch.from_numpy(x).requires_grad_(True)
        tgy = torch.from_numpy(gy)

        def torch_layer():
            ref.zero_grad(set_to_none=True)
            tx.grad = None
            ref(tx, tx, tx, need_weights=False)[0].backward(tgy)

    def pyattn_layer():
        layer.zero_grad()
        layer(x)
        return layer.backward(gy)
    impls["pyattn"] = pyattn_layer
    if torch is not None:
        impls["torch"] = torch_layer
    flops = 3.0 * (2.0 * B * T * D * D * 4) + 3.5 * 4.0 * B * T * T * D
    run({"op": "mha fwd+bwd", "shape": f"B={B} T={T} D={D} H={H}"}, flops, impls)


VARLEN_N, VARLEN_H, VARLEN_E = 16, 8, 64


def varlen(args, rng, run, torch):
    """The rows of issue 24 ("Serve", varlen): 16 causal sequences with
    lengths drawn from 64..2048 (fixed seed), H=8, E=64, float32, packed;
    against the dense kernel on one sequence of the mean length, against
    padding to the longest + a key-padding mask, and the backward against
    the dense backward on one sequence of equal work (L = sqrt(sum L_i^2)).
    GFLOP/s count real work only (causal: half of 4 H L^2 E per sequence)."""
    import numpy as np
    import pyattn
    N, H, E = VARLEN_N, VARLEN_H, VARLEN_E
    lens = np.random.default_rng(24).integers(64, 2049, N)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    T, Lmax = int(cu[-1]), int(lens.max())
    q, k, v, g = (rng.standard_normal((T, H, E), dtype=np.float32) for _ in range(4))
    work = float(sum(2.0 * H * int(n) * int(n) * E for n in lens))
    # padded: (N, H, Lmax, E) with keys past each length masked out
    qp, kp, vp = (np.zeros((N, H, Lmax, E), np.float32) for _ in range(3))
    for i, n in enumerate(lens):
        for x, xp in ((q, qp), (k, kp), (v, vp)):
            xp[i, :, :n] = x[cu[i]:cu[i + 1]].transpose(1, 0, 2)
    keymask = (np.arange(Lmax)[None, :] < lens[:, None])[:, None, None, :]
    shape = f"N={N} lengths 64..2048 (sum {T}, max {Lmax}) H={H} E={E} causal"
    run({"op": "varlen", "shape": shape}, work, {
        "pyattn": lambda: pyattn.scaled_dot_product_attention_varlen(q, k, v, cu, cu, is_causal=True),
        "pyattn padded + mask": lambda: pyattn.scaled_dot_product_attention(qp, kp, vp, keymask, is_causal=True)})
    del qp, kp, vp
    Lm = int(round(float(lens.mean())))
    qd, kd, vd = (rng.standard_normal((1, H, Lm, E), dtype=np.float32) for _ in range(3))
    run({"op": "varlen", "shape": f"dense B=1 H={H} L=S={Lm} (the mean) E={E} causal"}, 2.0 * H * Lm * Lm * E,
        {"pyattn": lambda: pyattn.scaled_dot_product_attention(qd, kd, vd, is_causal=True)})
    o, lse = pyattn.scaled_dot_product_attention_varlen(q, k, v, cu, cu, is_causal=True, return_lse=True)
    run({"op": "varlen bwd", "shape": shape}, 2.5 * work, {
        "pyattn": lambda: pyattn.scaled_dot_product_attention_varlen_backward(g, q, k, v, o, lse, cu, cu,
                                                                             is_causal=True)})
    Le = int(round(float(np.sqrt((lens.astype(np.float64) ** 2).sum()))))
    qd, kd, vd, gd = (rng.standard_normal((1, H, Le, E), dtype=np.float32) for _ in range(4))
    od, ld = pyattn.scaled_dot_product_attention(qd, kd, vd, is_causal=True, return_lse=True)
    run({"op": "varlen bwd", "shape": f"dense B=1 H={H} L=S={Le} (equal work) E={E} causal"},
        2.5 * 2.0 * H * Le * Le * E,
        {"pyattn": lambda: pyattn.scaled_dot_product_attention_backward(gd, qd, kd, vd, od, ld, is_causal=True)})


def bf16(args, rng, run, torch):
    """The rows of the issue "bfloat16 compute": precision="bf16" against
    pyattn's own "highest" on the same bfloat16 inputs (attention), and
    bfloat16 vs float32 matmul 2048^3; PyTorch's SDPA on bfloat16 tensors
    beside them. GFLOP/s of the bf16 rows are compared with the vdpbf16ps
    peak (the targets)."""
    import numpy as np
    import pyattn
    try:
        import ml_dtypes
    except ImportError:
        sys.stderr.write("  ml_dtypes is not installed: no bfloat16 rows\n")
        return
    cases = [(8, 2048, 64, False), (8, 2048, 64, True), (4, 2048, 128, False), (4, 2048, 128, True)]
    if args.quick:
        cases = [(8, 1024, 64, False)]
    for H, L, E, causal in cases:
        q, k, v = (rng.standard_normal((1, H, L, E), dtype=np.float32).astype(ml_dtypes.bfloat16) for _ in range(3))
        impls = {"pyattn": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal, precision="bf16"),
                 "pyattn highest": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal)}
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v))
            impls["torch bf16"] = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        fl = 4.0 * H * L * L * E * (0.5 if causal else 1.0)
        run({"op": "bf16 sdpa", "shape": f"B=1 H={H} L=S={L} E={E}" + (" causal" if causal else "")}, fl, impls)
    n = 1024 if args.quick else 2048
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    run({"op": "bf16 matmul", "shape": f"{n}^3"}, 2.0 * n ** 3,
        {"pyattn": lambda: pyattn.matmul(a, b, precision="bf16"), "pyattn float32": lambda: pyattn.matmul(a, b)})


PERCALL_REF = "torch SDPA (reference)"
PERCALL_KV = "pyattn.attention_with_kvcache, read only"
PERCALL_PLANNED = "PagedKVCache.attend with a plan (per layer: one plan per step, run by 8 layers' caches)"


def percall(args, rng, torch, emit):
    """Issue 38, item 1 (measurement): the fixed cost of a tiny decode call,
    B = 1, Hq = 8, Hkv = 2, E = 64, 64 cached rows, one new token (about
    1 us of arithmetic), per entry point: the median over thousands of calls,
    each timed alone (perf_counter_ns), the entries interleaved in blocks of
    calls. Rows appending a token start every call from 64 rows (KVCache:
    its lengths set back; PagedKVCache: a fresh fork of a 64-row sequence,
    freed after the call; both outside the timed span). The planned row: 8
    layers' PagedKVCaches in lockstep, each step a fork of the 64-row sequence
    in all of them and one PagedKVCache.plan (outside the timed span; the
    plan's making is a row of its own), then each layer's attend with that
    plan timed alone. With transformers: its attention function of a decode
    step, pyattn's (the step's plan found, as for every layer but the
    step's first) and its own SDPA one, on the same tensors. Then a breakdown of
    attention_with_kvcache (read only): the time spent in attn_spec, in
    _sdpa around the binding, in the _C.sdpa call, and the rest (checks
    before the spec), from timers wrapped around those functions; and the
    _C.sdpa call alone on the arguments captured from such a call."""
    import gc
    import numpy as np
    import pyattn
    import pyattn._api as api
    import pyattn._cachespec as cachespec
    import pyattn._kvapi as kvapi
    from pyattn import flash as fl
    B, Hq, Hkv, E, S, Smax = 1, 8, 2, 64, 64, 128
    f32 = np.float32
    q = rng.standard_normal((B, Hq, 1, E), dtype=f32)
    k, v = (rng.standard_normal((B, Hkv, S, E), dtype=f32) for _ in range(2))
    kc, vc = (np.zeros((B, Hkv, Smax, E), f32) for _ in range(2))
    kc[:, :, :S], vc[:, :, :S] = k, v
    k1, v1 = (rng.standard_normal((B, Hkv, 1, E), dtype=f32) for _ in range(2))
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3))               # token-major, for pyattn.flash
    kct, vct = (np.ascontiguousarray(c.transpose(0, 2, 1, 3)) for c in (kc, vc))
    cache = pyattn.KVCache(B, Hkv, Smax, E)
    cache.attend(np.repeat(k, Hq // Hkv, axis=1), k, v)               # 64 rows
    pc = pyattn.PagedKVCache(num_blocks=16, block_size=16, num_kv_heads=Hkv, head_dim=E)
    base = pc.add_sequence()
    pc.attend([base], np.repeat(k, Hq // Hkv, axis=1), k, v)
    fork = []
    qv = q[:, :, 0].reshape(B * 1, Hq, E)                             # varlen: packed (total, H, E)
    kv_, vv_ = (x[0].transpose(1, 0, 2).copy() for x in (k, v))       # (64, Hkv, E)
    cuq, cuk = np.array([0, 1], np.int64), np.array([0, S], np.int64)
    calls = {}                                                        # name: (before, fn, after)
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        F = torch.nn.functional
        calls[PERCALL_REF] = (None, lambda: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True), None)
    calls["pyattn.scaled_dot_product_attention (L=1, S=64)"] = (
        None, lambda: pyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True), None)
    calls[PERCALL_KV] = (None, lambda: pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S), None)
    calls["pyattn.attention_with_kvcache, full path (a signature's first call: no plan yet)"] = (
        None, lambda: kvapi._kvcache_full(q, kc, vc, cache_seqlens=S), None)
    calls["pyattn.attention_with_kvcache, appending one row"] = (
        None, lambda: pyattn.attention_with_kvcache(q, kc, vc, k1, v1, cache_seqlens=S), None)
    if torch is not None:
        import pyattn.torch as pt
        calls["pyattn.torch.scaled_dot_product_attention"] = (
            None, lambda: pt.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True), None)
    try:                                    # Hugging Face's attention function of a decode step, per layer
        import pyattn.transformers as pht   # (a step's plan found: every layer but the step's first)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:
        pht = None
    if torch is not None and pht is not None:
        hq = torch.from_numpy(q.transpose(0, 2, 1, 3).copy()).transpose(1, 2)       # (B, Hq, 1, E) as HF's
        mod = torch.nn.Module()
        mod.is_causal, mod.num_key_value_groups = True, Hq // Hkv
        calls["pyattn.transformers.attention_forward (decode, the step's plan found)"] = (
            None, lambda: pht.attention_forward(mod, hq, tk, tv, None, scaling=E ** -0.5), None)
        calls["transformers' sdpa_attention_forward (decode; PyTorch's SDPA)"] = (
            None, lambda: sdpa_attention_forward(mod, hq, tk, tv, None, scaling=E ** -0.5), None)
    calls["pyattn.flash.flash_attn_with_kvcache, read only"] = (
        None, lambda: fl.flash_attn_with_kvcache(qt, kct, vct, cache_seqlens=S), None)
    calls["KVCache.attend (appending one row)"] = (
        lambda: cache.lengths.fill(S), lambda: cache.attend(q, k1, v1), None)
    calls["PagedKVCache.attend (one sequence, appending one row)"] = (
        lambda: fork.append(pc.fork(base)), lambda: pc.attend([fork[-1]], q, k1, v1), lambda: pc.free(fork.pop()))
    # a step planned once (PagedKVCache.plan) and run by the caches of NL layers (one per layer, in lockstep,
    # as a model keeps them): the plan's making, and each layer's attend with it
    NL = 8
    layers = [pyattn.PagedKVCache(num_blocks=16, block_size=16, num_kv_heads=Hkv, head_dim=E) for _ in range(NL)]
    for c in layers:
        c.attend([c.add_sequence()], np.repeat(k, Hq // Hkv, axis=1), k, v)     # id `base` (0) in each
    step = {"i": 0, "plan": None, "seq": None}

    def step_before():
        if step["i"] % NL == 0:
            step["seq"] = [c.fork(base) for c in layers][0]
            step["plan"] = layers[0].plan([step["seq"]], new_tokens=1)

    def step_after():
        step["i"] += 1
        if step["i"] % NL == 0:
            for c in layers:
                c.free(step["seq"])

    calls[PERCALL_PLANNED] = (step_before, lambda: layers[step["i"] % NL].attend(
        step["plan"].seqs, q, k1, v1, plan=step["plan"]), step_after)
    # the same loop without plan=: attend takes the plan the step's first layer made (its own
    # caches, in lockstep too)
    layers2 = [pyattn.PagedKVCache(num_blocks=16, block_size=16, num_kv_heads=Hkv, head_dim=E) for _ in range(NL)]
    for c in layers2:
        c.attend([c.add_sequence()], np.repeat(k, Hq // Hkv, axis=1), k, v)
    step2 = {"i": 0, "seq": None}

    def step2_before():
        if step2["i"] % NL == 0:
            step2["seq"] = [[c.fork(base) for c in layers2][0]]

    def step2_after():
        step2["i"] += 1
        if step2["i"] % NL == 0:
            for c in layers2:
                c.free(step2["seq"][0])

    calls["PagedKVCache.attend without plan= (per layer: 8 layers' caches in lockstep; the step's first plans)"] = (
        step2_before, lambda: layers2[step2["i"] % NL].attend(step2["seq"], q, k1, v1), step2_after)
    calls["PagedKVCache.plan (one sequence, one new row: once per step for every layer)"] = (
        lambda: fork.append(pc.fork(base)), lambda: pc.plan([fork[-1]], new_tokens=1), lambda: pc.free(fork.pop()))
    calls["scaled_dot_product_attention_varlen (one sequence, L=1, S=64)"] = (
        None, lambda: pyattn.scaled_dot_product_attention_varlen(qv, kv_, vv_, cuq, cuk, enable_gqa=True), None)
    rounds, block = (4, 100) if args.quick else (20, 250)

    def timed(before, fn, after, n, into):
        ns = time.perf_counter_ns
        for _ in range(n):
            if before:
                before()
            t = ns()
            fn()
            into.append(ns() - t)
            if after:
                after()

    for before, fn, after in calls.values():                          # warm-up
        timed(before, fn, after, 50, [])
    ts = {name: [] for name in calls}
    gc.collect()
    for _ in range(rounds):
        for name, c in calls.items():
            timed(*c, block, ts[name])
    for name, t in ts.items():
        t = np.array(t) / 1e3
        emit({"kind": "percall", "call": name, "threads": args.threads, "calls": len(t),
              "median_us": float(np.median(t)), "p10_us": float(np.percentile(t, 10)),
              "p90_us": float(np.percentile(t, 90))})
    # the breakdown of attention_with_kvcache (read only): timers around its parts, on the full
    # path (a signature's first call: every check) and on the plan (pyattn/_kvfast.py: later calls)
    from pyattn import _kvfast
    real_spec, real_sdpa, real_C = cachespec.attn_spec, kvapi._sdpa, api._C
    acc, captured = {}, []

    def clocked(key, f):
        def w(*a, **kw):
            t = time.perf_counter_ns()
            try:
                return f(*a, **kw)
            finally:
                acc[key] = acc.get(key, 0) + time.perf_counter_ns() - t
        return w

    class CProxy:                         # _C with its sdpa timed (and its arguments kept)
        def __getattr__(self, name):
            return getattr(real_C, name)

        def sdpa(self, *a, **kw):
            if not captured:
                captured.append((a, kw))
            return clocked("c", real_C.sdpa)(*a, **kw)

    def clock_parts(fn):
        parts = {x: [] for x in ("total", "spec", "sdpa", "c")}
        cachespec.attn_spec, kvapi._sdpa, api._C = clocked("spec", real_spec), clocked("sdpa", real_sdpa), CProxy()
        _kvfast._C = api._C
        try:
            for i in range(rounds * block + 50):
                acc.clear()
                t = time.perf_counter_ns()
                fn()
                t = time.perf_counter_ns() - t
                if i >= 50:
                    parts["total"].append(t)
                    for x in ("spec", "sdpa", "c"):
                        parts[x].append(acc.get(x, 0))
        finally:
            cachespec.attn_spec, kvapi._sdpa, api._C = real_spec, real_sdpa, real_C
            _kvfast._C = real_C
        return {x: np.array(t) / 1e3 for x, t in parts.items()}

    P = clock_parts(lambda: kvapi._kvcache_full(q, kc, vc, cache_seqlens=S))
    F = clock_parts(calls[PERCALL_KV][1])
    a, kw = captured[0]
    alone = []
    timed(None, lambda: real_C.sdpa(*a, **kw), None, 50, [])
    timed(None, lambda: real_C.sdpa(*a, **kw), None, rounds * block, alone)
    phases = [("full path: argument checks before the spec (cache layouts, dtypes, shapes, seqlens, scale)",
               P["total"] - P["spec"] - P["sdpa"]),
              ("full path: attn_spec, the call's spec (shapes, GQA, causal, options)", P["spec"]),
              ("full path: _sdpa around the binding (views, GQA stacking, keyword dict)", P["sdpa"] - P["c"]),
              ("full path: _C.sdpa inside the call (binding parse + kernel + result)", P["c"]),
              ("full path: the whole call (a signature's first call), with the timers", P["total"]),
              ("plan: signature, seqlens, views, keyword dict (pyattn/_kvfast.py)", F["total"] - F["c"]),
              ("plan: _C.sdpa inside the call", F["c"]),
              ("plan: the whole call (every later call of the signature), with the timers", F["total"]),
              ("_C.sdpa alone, on pre-built arguments (50 warm-up calls, then as many as above)",
               np.array(alone) / 1e3)]
    for name, t in phases:
        emit({"kind": "percall_phase", "call": PERCALL_KV, "phase": name, "threads": args.threads,
              "median_us": float(np.median(t)), "calls": len(t)})


def memory_probe():
    """Peak RSS growth of causal attention, L=S=32768, E=64, one head: the
    peak resident memory during the call (Linux VmHWM, reset just before it
    through /proc/self/clear_refs) minus the resident memory before it, with
    inputs and output already allocated. None where /proc is missing."""
    code = (
        "import numpy as np, pyattn\n"
        "def status(key):\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(key):\n"
        "            return int(line.split()[1]) / 1024\n"
        "L, E = 32768, 64\n"
        "rng = np.random.default_rng(0)\n"
        "q, k, v = (rng.standard_normal((L, E), dtype=np.float32) for _ in range(3))\n"
        "out = np.full((L, E), 1.0, np.float32)  # written, so its pages are resident\n"
        "pyattn.scaled_dot_product_attention(q[:64], k[:64], v[:64], is_causal=True)  # start the threads\n"
        "before = status('VmRSS')\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, out=out)\n"
        "print(status('VmHWM') - before)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    return float(r.stdout.strip()) if r.returncode == 0 else None


# ---------------------------------------------------------------- driver side

OPENBLAS_PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

# The AVX2 family on a CPU with AVX-512 (PYATTN_ISA=avx2): the peers would run
# their AVX-512 code, not the comparison the targets mean ("the AVX2 family on
# an AVX2 CPU"). A second worker then runs them pinned to AVX2 as far as each
# library allows: OpenBLAS by its core type, PyTorch's ATen kernels by
# ATEN_CPU_CAPABILITY, its oneDNN by ONEDNN_MAX_CPU_ISA and its MKL by
# MKL_ENABLE_INSTRUCTIONS, OpenVINO's CPU plugin (its oneDNN) by
# ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA (measured: its SDPA takes 2x longer
# so pinned). ONNX Runtime has no such switch (MLAS picks its kernels by
# CPUID; only a build without AVX-512 would do): its rows there are unpinned
# and say so. pyattn is timed again in that worker, interleaved with them.
# The training section runs there too: its targets (backward and forward +
# backward >= 1.5x torch) are then reported against both torch runs, each
# row saying which.
AVX2_PINS = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "DNNL_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
AVX2_LABELS = {"numpy": "numpy (OpenBLAS Haswell kernel)", "torch": "torch (AVX2-pinned)",
               "openvino": "openvino (ONEDNN_MAX_CPU_ISA=AVX2)",
               "onnxruntime": "onnxruntime (AVX-512: cannot be pinned)"}
AVX2_SECTIONS = ("matmul", "sdpa", "mha", "training")


def _avx2_on_avx512():
    """True when the family in use is avx2 on a CPU that can run AVX-512"""
    try:
        import pyattn
        c = pyattn._C.config()
    except Exception:                 # no pyattn to ask: no pinned run
        return False
    return c["isa"] == "avx2" and c["isa_machine"].startswith("avx512")


def spawn(threads, args, first=True, numpy_only=False, avx2_peers=False):
    env = dict(os.environ, PYATTN_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    only = args.only
    if avx2_peers:
        env.pop("OPENBLAS_L2_SIZE", None)
        env.update(AVX2_PINS)
        only = ",".join(x for x in (args.only.split(",") if args.only else AVX2_SECTIONS) if x in AVX2_SECTIONS)
        if not only:
            return []
    if numpy_only:                    # NumPy with the OpenBLAS kernel it picks for this CPU
        for var in OPENBLAS_PINS:
            env.pop(var, None)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads", str(threads),
           "--repeat", str(args.repeat), "--settle", str(args.settle)] + (["--quick"] if args.quick else []) \
        + (["--target-shapes"] if args.target_shapes else [])
    if numpy_only:
        cmd.append("--numpy-only")
    if avx2_peers:
        cmd.append("--avx2-peers")
    if only:
        cmd += ["--only", only]
    # run outside the source tree so that the installed pyattn is imported
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd="/")
    rows = []
    if numpy_only:
        rows = [json.loads(line[4:]) for line in p.stdout if line.startswith("ROW ")]
        p.wait()
        if p.returncode:
            raise SystemExit(f"NumPy worker for {threads} threads failed ({p.returncode})")
        return rows
    t = 1                                   # 1 while PyTorch is there to compare with
    for line in p.stdout:
        if line.startswith("ROW "):
            rows.append(json.loads(line[4:]))
            if rows[-1].get("kind") == "impls" and rows[-1]["torch"] is None:
                t = 0
                if first:
                    sys.stderr.write("  PyTorch is not installed: comparing with NumPy only "
                                     "(pip install torch==2.13.0 to add its columns)\n")
            done = sum(1 for r in rows if "kind" not in r)
            mm, attn = _cases(args.quick, args.target_shapes)
            # pyattn + numpy (+ torch) per matmul and per attention shape up to
            # L = 2048 (the naive NumPy way stops there); decode and the layer:
            # pyattn (+ torch)
            nmm = len(mm) + (0 if args.quick else len(TALL))
            n_expected = (nmm * (2 + t) + sum((2 + t) if c[2] <= 2048 else (1 + t) for c in attn)
                          + (2 if args.quick else 3) * (1 + t))
            if only:                        # a subset: no total to show
                sys.stderr.write(f"\r  threads={threads} {done} rows ")
                sys.stderr.flush()
                continue
            frac = min(1.0, done / n_expected)
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r  threads={threads} [{bar:<30}] {done}/{n_expected} ")
            sys.stderr.flush()
    p.wait()
    sys.stderr.write("\n")
    if p.returncode:
        raise SystemExit(f"worker for {threads} threads failed ({p.returncode})")
    return rows


def _roofline(rows):
    """Issue 37's roofline, on every row that carries a "roof" (the decode
    rows: _roof): bound = max(bytes / read bandwidth, multiply-adds / peak of
    the instruction used), from the probes of the same worker: the read
    bandwidth probed at its start or beside the case in the same rounds,
    whichever is higher (the bound never flatters); the float32 FMA peak
    (fma_probe, per core x threads; 2 flops per multiply-add) or, for
    precision="bf16", the vdpbf16ps peak (bf16_probe) where the family has
    it, else the FMA peak (the bfloat16 products then run as float32 FMAs).
    Annotates the rows in place (roof_ms, roof_limit, roof_pct = bound /
    min time, in %; roof_gbs, roof_peak) -- they go into the JSON."""
    peak = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "peak"}
    bpk = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "bf16peak"}
    bw = {r["threads"]: r["gbs"] for r in rows if r.get("kind") == "bandwidth"}
    side = {(r["op"], r["shape"], r["threads"]): r["gbs"] for r in rows if r.get("kind") == "side_bw"}
    for r in rows:
        rf = r.get("roof")
        thr = r.get("threads")
        if "kind" in r or not rf or not peak.get(thr) or not bw.get(thr):
            continue
        gbs = max(bw[thr], side.get((r["op"], r["shape"], thr), 0.0))
        if rf["peak"] == "bf16" and bpk.get(thr):
            pk, src = bpk[thr], "bf16 dot (vdpbf16ps)"
        else:
            pk, src = peak[thr], "float32 FMA"
        t_mem = rf["bytes"] / (gbs * 1e9)
        t_cmp = rf["madds"] / (pk * 1e9 / 2 * thr)
        r["roof_ms"] = 1e3 * max(t_mem, t_cmp)
        r["roof_limit"] = "memory" if t_mem >= t_cmp else "compute"
        r["roof_pct"] = 100 * r["roof_ms"] / r["min_ms"]
        r["roof_gbs"] = gbs
        r["roof_peak"] = f"{src} {pk * thr:.0f} GFLOP/s"
    return rows


def _roof_base(rows, r):
    """The float32-cache row of r's case (same op, shape, threads, run): the
    contiguous cache for the paged rows"""
    for name in ("pyattn", "pyattn contiguous"):
        b = next((x for x in rows if "kind" not in x and x["op"] == r["op"] and x["shape"] == r["shape"]
                  and x["threads"] == r["threads"] and x.get("run") == r.get("run") and x["impl"] == name), None)
        if b:
            return b
    return None


def roofline_table(rows):
    """Every decode row with its roofline: what it reads and multiplies, the
    bound and what sets it, the time as % of the bound, and its speed
    against the float32 cache of the same shape (float32 time / its time;
    paged rows: against the contiguous cache)."""
    rr = [r for r in rows if "kind" not in r and r.get("roof_pct") is not None]
    if not rr:
        return ""
    out = ["| op | shape | thr | impl | cache | precision | MB read | M mult-adds | bound ms (limit; GB/s; peak) "
           "| min ms | % of roofline | pyattn float32-cache time / this time |", "|" + "---|" * 12]
    for r in rr:
        rf = r["roof"]
        b = _roof_base(rows, r)
        ratio = "" if b is None or b is r else f"{b['min_ms'] / r['min_ms']:.2f}x"
        if b is not None and b is not r and b["impl"] == "pyattn contiguous":
            ratio += " (vs contiguous)"
        impl = r["impl"] + (" (AVX2-pinned peers' run)" if r.get("run") else "")
        out.append(f"| {r['op']} | {r['shape']} | {r['threads']} | {impl} | {rf['cache']} | {rf['precision']} | "
                   f"{rf['bytes'] / 1e6:.1f} | {rf['madds'] / 1e6:.1f} | {r['roof_ms']:.3f} ({r['roof_limit']}; "
                   f"{r['roof_gbs']:.1f}; {r['roof_peak']}) | {r['min_ms']:.3f} | {r['roof_pct']:.0f} % | {ratio} |")
    return "\n".join(out)


def percall_tables(rows):
    """Issue 38's per-call table (median us, x PyTorch's SDPA in the same
    worker) and the breakdown of attention_with_kvcache, per thread count"""
    pcs = [r for r in rows if r.get("kind") == "percall"]
    if not pcs:
        return ""
    out = ["## Per-call cost (tiny decode: B=1 Hq=8 Hkv=2 E=64, 64 cached rows, one new token)", "",
           "| call | threads | median us | p10 us | p90 us | calls | x PyTorch (median) |", "|" + "---|" * 7]
    for r in pcs:
        ref = next((x for x in pcs if x["call"] == PERCALL_REF and x["threads"] == r["threads"]), None)
        x = f"{r['median_us'] / ref['median_us']:.2f}x" if ref else "n/a"
        out.append(f"| {r['call']} | {r['threads']} | {r['median_us']:.1f} | {r['p10_us']:.1f} | "
                   f"{r['p90_us']:.1f} | {r['calls']} | {x} |")
    ph = [r for r in rows if r.get("kind") == "percall_phase"]
    if ph:
        out += ["", f"Breakdown of `{PERCALL_KV}` (medians of each part over the same calls; the parts' medians "
                "need not add up to the whole's):", "", "| part | threads | median us |", "|---|---|---|"]
        out += [f"| {r['phase']} | {r['threads']} | {r['median_us']:.1f} |" for r in ph]
    return "\n".join(out)


def table(rows):
    out = []
    hdr = ("| op | shape | threads | impl | median ms | min ms | GFLOP/s | % of peak | pyattn speed-up "
           "| % of roofline |")
    out.append(hdr)
    out.append("|" + "---|" * 10)
    data = [r for r in rows if "kind" not in r]
    peak = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "peak"}
    bpeak = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "bf16peak"}
    key = lambda r: (r["op"], r["shape"], r["threads"], r.get("run", ""))
    groups = {}
    for r in data:
        groups.setdefault(key(r), []).append(r)
    for k, rs in groups.items():
        mine = next((r for r in rs if r["impl"] == "pyattn"), None)
        for r in rs:
            gf = r["flops"] / (r["min_ms"] / 1e3) / 1e9
            pk = peak.get(r["threads"])
            pct = f"{100 * gf / (pk * r['threads']):.0f} %" if pk else "n/a"
            if r["op"].startswith("bf16") and r["impl"] == "pyattn":    # bfloat16 products
                bp = bpeak.get(r["threads"])
                pct = f"{100 * gf / (bp * r['threads']):.0f} % (bf16 peak)" if bp else "n/a"
            sp = "" if (mine is None or r is mine) else f"{r['median_ms'] / mine['median_ms']:.2f}x"
            impl = r["impl"] + (" (beside the AVX2-pinned peers)" if r.get("run") and r is mine else "")
            roof = "" if r.get("roof_pct") is None else f"{r['roof_pct']:.0f} % ({r['roof_limit']})"
            out.append(f"| {r['op']} | {r['shape']} | {r['threads']} | {impl} | {r['median_ms']:.2f} | "
                       f"{r['min_ms']:.2f} | {gf:.1f} | {pct} | {sp} | {roof} |")
    return "\n".join(out)


def _scaling_goal(shape):
    """2 threads vs 1: issue 23 asks >= 1.9x for every attention and matmul row
    with L (or M) >= 1024; the smaller rows keep the earlier 1.85x"""
    import re
    m = re.search(r"L=S=(\d+)|L=(\d+)|^(\d+)\^3|^\((\d+)x", shape)
    n = int(next(g for g in m.groups() if g)) if m else 0
    return 1.9 if n >= 1024 else 1.85


def targets(rows, mem):
    """The performance targets (issues "Fast" and "Fast, part 2" of the
    project's tracker), each with the measured figure and whether it is met
    (min times; GFLOP/s against the probed peak; decode against the probed
    read bandwidth)."""
    peak = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "peak"}
    bw = {r["threads"]: r["gbs"] for r in rows if r.get("kind") == "bandwidth"}
    data = [r for r in rows if "kind" not in r and not r.get("run")]
    pinned = [r for r in rows if "kind" not in r and r.get("run") == "avx2"]
    thrs = sorted({r["threads"] for r in data})
    top = thrs[-1] if thrs else 1

    def get(op, shape, impl, thr):
        return next((r for r in data if r["op"] == op and r["shape"] == shape and r["impl"] == impl
                     and r["threads"] == thr), None)

    def pct(r):
        return 100 * r["flops"] / (r["min_ms"] / 1e3) / 1e9 / (peak[r["threads"]] * r["threads"])

    out = []

    def line(name, value, goal, ok):
        out.append(f"| {name} | {value} | {goal} | {'met' if ok else 'NOT met'} |")

    # matmul: % of peak, vs NumPy (every NumPy run: this environment's and, where the
    # environment pins OpenBLAS's kernel, the unpinned one), 2 threads vs 1
    mm_shapes = sorted({r["shape"] for r in data if r["op"] == "matmul"}, key=lambda x: (len(x), x))
    for shape in mm_shapes:
        me = get("matmul", shape, "pyattn", 1)
        if me and peak.get(1) and shape in ("1024^3", "2048^3"):
            goal = 88 if shape == "2048^3" else 80          # issue 23: >= 88 % at 2048^3
            line(f"matmul {shape}, 1 thread, % of peak", f"{pct(me):.0f} %", f">= {goal} %", pct(me) >= goal)
        if shape == "512^3":
            continue
        for thr in thrs:
            me = get("matmul", shape, "pyattn", thr)
            for impl in ("numpy", "numpy, OPENBLAS_CORETYPE unset"):
                npy = get("matmul", shape, impl, thr)
                if me and npy:
                    ratio = npy["min_ms"] / me["min_ms"]
                    line(f"matmul {shape}, {thr} thr, vs {impl}", f"{ratio:.2f}x", ">= 1.0x", ratio >= 1.0)
        one, two = get("matmul", shape, "pyattn", 1), get("matmul", shape, "pyattn", top)
        if one and two and top > 1:
            ratio = one["min_ms"] / two["min_ms"]
            g = _scaling_goal(shape)
            line(f"matmul {shape}: {top} threads vs 1", f"{ratio:.2f}x", f">= {g}x", ratio >= g)
    # attention: % of peak (part 2 for L >= 2048), vs torch, vs the seeds' NumPy
    for L in (1024, 2048, 4096):
        # issue 23 at L >= 2048: >= 82 % (E=64), >= 87 % (E=128), >= 78 % causal
        for E, causal, goal, goal2 in ((64, False, 65, 82), (64, True, 55, 78), (128, False, 70, 87),
                                       (128, True, 55, 78)):
            shape = f"B=1 H=8 L=S={L} E={E}" + (" causal" if causal else "")
            me = get("sdpa", shape, "pyattn", 1)
            g = goal2 if L >= 2048 else goal
            if me and peak.get(1):
                line(f"SDPA {shape}, 1 thread, % of peak", f"{pct(me):.0f} %", f">= {g} %", pct(me) >= g)
            for thr in thrs:
                me, th, npy = (get("sdpa", shape, i, thr) for i in ("pyattn", "torch", "numpy"))
                if me and th:
                    ratio = th["median_ms"] / me["median_ms"]
                    line(f"SDPA {shape}, {thr} thr, vs torch", f"{ratio:.2f}x", ">= 1.5x", ratio >= 1.5)
                if me and npy:
                    ratio = npy["median_ms"] / me["median_ms"]
                    line(f"SDPA {shape}, {thr} thr, vs naive NumPy", f"{ratio:.1f}x", ">= 20x", ratio >= 20)
    for r in data:
        if r["op"] == "mha" and r["impl"] == "pyattn":
            th = get("mha", r["shape"], "torch", r["threads"])
            if th:
                ratio = th["median_ms"] / r["median_ms"]
                line(f"MultiHeadAttention {r['shape']}, {r['threads']} thr, vs torch", f"{ratio:.2f}x",
                     ">= 1.3x", ratio >= 1.3)
    # threads: every attention row of the benchmark, top thread count vs 1
    if top > 1 and thrs[0] == 1:
        for r in data:
            if r["impl"] == "pyattn" and r["op"] == "sdpa" and r["threads"] == top and "decode" not in r["shape"]:
                one = get("sdpa", r["shape"], "pyattn", 1)
                if one:
                    ratio = one["min_ms"] / r["min_ms"]
                    g = _scaling_goal(r["shape"])
                    line(f"SDPA {r['shape']}: {top} threads vs 1", f"{ratio:.2f}x", f">= {g}x", ratio >= g)
        hot = {(r["shape"], r["threads"]): r["min_ms"] for r in rows if r.get("kind") == "hot"}
        for (shape, thr), ms in hot.items():
            if thr == top and (shape, 1) in hot:
                ratio = hot[shape, 1] / ms
                g = _scaling_goal(shape)
                line(f"SDPA {shape}: {top} threads vs 1, back to back", f"{ratio:.2f}x", f">= {g}x",
                     ratio >= g)
    # decode: bytes of K and V read per second against the read bandwidth,
    # probed in the same rounds as the case where the run did (side_bw), else
    # at the start of the worker
    side = {(r["op"], r["shape"], r["threads"]): r["gbs"] for r in rows if r.get("kind") == "side_bw"}
    for r in data:                        # (shared prefix: its own lines below, bytes in them)
        if r["impl"].startswith("pyattn") and r.get("bytes") and bw.get(r["threads"]) and r["op"] != "shared prefix":
            gbs = r["bytes"] / (r["min_ms"] / 1e3) / 1e9
            ref = side.get((r["op"], r["shape"], r["threads"]))
            frac = 100 * gbs / (ref or bw[r["threads"]])
            name = r["op"].upper() if r["op"] != "sdpa" else "SDPA"
            where = f" of {ref:.1f} GB/s probed beside it" if ref else ""
            line(f"{name} {r['shape']}{r['impl'][6:]}, {r['threads']} thr, % of read bandwidth",
                 f"{frac:.0f} % ({gbs:.1f} GB/s{where})", ">= 85 %", frac >= 85)
    # generation ("Generate"): 16-bit caches vs float32 at S >= 16384, vs torch;
    # the window vs full causal and vs plain attention over as many keys;
    # structured prefill vs the plain kernel
    for r in data:
        if r["op"] == "decode" and r["impl"] == "pyattn":
            S = int(r["shape"].split(" S=")[1].split()[0])
            for name in ("pyattn float16 cache", "pyattn bfloat16 cache"):
                h = get("decode", r["shape"], name, r["threads"])
                if h and S >= 16384:
                    ratio = r["min_ms"] / h["min_ms"]
                    line(f"DECODE {r['shape']}, {r['threads']} thr, {name[7:]} vs float32", f"{ratio:.2f}x",
                         ">= 1.8x", ratio >= 1.8)
            th = get("decode", r["shape"], "torch", r["threads"])
            if th:
                ratio = th["median_ms"] / r["median_ms"]
                line(f"DECODE {r['shape']}, {r['threads']} thr, float32 cache vs torch", f"{ratio:.2f}x",
                     ">= 1.5x", ratio >= 1.5)
        if r["op"] == "window" and r["impl"] == "pyattn":
            full = get("window", r["shape"], "pyattn full causal", r["threads"])
            W = r["shape"].split("window=")[1]
            plain = get("window", r["shape"], f"pyattn {W} keys, no mask", r["threads"])
            if full:
                ratio = full["min_ms"] / r["min_ms"]
                line(f"window {W}, {r['shape'].split(' causal')[0]}, {r['threads']} thr, vs full causal",
                     f"{ratio:.1f}x", ">= 6x", ratio >= 6)
            if plain:
                ratio = r["min_ms"] / plain["min_ms"]
                line(f"window {W}, {r['threads']} thr, time vs plain attention over {W} keys per row",
                     f"{ratio:.2f}x", "<= 1.10x", ratio <= 1.10)
        if r["op"] == "prefill" and r["impl"] != "pyattn":
            plain = get("prefill", r["shape"], "pyattn", r["threads"])
            if plain:
                ratio = r["min_ms"] / plain["min_ms"]
                line(f"prefill {r['shape']}, {r['threads']} thr, {r['impl'][7:]} time vs plain", f"{ratio:.2f}x",
                     "<= 1.10x", ratio <= 1.10)
    # training ("Train"): the backward vs torch and % of peak (2.5x the forward's
    # flops), forward + backward vs torch, the layer's forward + backward vs torch
    for r in data:
        if r["impl"] != "pyattn" or r["op"] not in ("backward", "fwd+bwd", "mha fwd+bwd"):
            continue
        th = get(r["op"], r["shape"], "torch", r["threads"])
        goal = 1.3 if r["op"] == "mha fwd+bwd" else 1.5
        if th:      # beside a pinned run (avx2 family on AVX-512), this torch ran its AVX-512 code: say so
            ratio = th["median_ms"] / r["median_ms"]
            which = "torch, not pinned (its AVX-512 code)" if pinned else "torch"
            line(f"{r['op']} {r['shape']}, {r['threads']} thr, vs {which}", f"{ratio:.2f}x", f">= {goal}x",
                 ratio >= goal)
        if r["op"] == "backward" and peak.get(r["threads"]):
            line(f"backward {r['shape']}, {r['threads']} thr, % of peak (2.5x forward flops)",
                 f"{pct(r):.0f} %", ">= 80 %", pct(r) >= 80)
        one = get(r["op"], r["shape"], "pyattn", 1)
        if r["op"] in ("backward", "fwd+bwd") and one and r["threads"] > 1:   # issue 23 (every row: L >= 1024)
            ratio = one["min_ms"] / r["min_ms"]
            line(f"{r['op']} {r['shape']}: {r['threads']} threads vs 1", f"{ratio:.2f}x", ">= 1.9x", ratio >= 1.9)
    # bfloat16 compute: bf16 vs "highest" on bfloat16 inputs, % of the vdpbf16ps peak,
    # bf16 matmul vs float32, threads
    bpk = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "bf16peak" and r.get("gflops_core")}
    bf16_emu = next((r["kernel"] for r in rows if r.get("kind") == "bf16peak"
                     and not r.get("kernel", "avx512bf16").endswith("avx512bf16")), None)
    for r in data:
        if r["impl"] != "pyattn" or r["op"] not in ("bf16 sdpa", "bf16 matmul"):
            continue
        other = get(r["op"], r["shape"], "pyattn highest" if r["op"] == "bf16 sdpa" else "pyattn float32",
                    r["threads"])
        if other and bf16_emu:       # issue 23 item 6: the emulation within 1.2x of float32
            slow = r["min_ms"] / other["min_ms"]
            line(f"{r['op']} {r['shape']}, {r['threads']} thr, precision='bf16' emulated ({bf16_emu}) "
                 f"time / {'highest' if r['op'] == 'bf16 sdpa' else 'float32'} time", f"{slow:.2f}x",
                 "<= 1.2x", slow <= 1.2)
        elif other:
            ratio = other["min_ms"] / r["min_ms"]
            goal = 1.7 if r["op"] == "bf16 sdpa" else 1.8
            line(f"{r['op']} {r['shape']}, {r['threads']} thr, precision='bf16' vs "
                 f"{'highest' if r['op'] == 'bf16 sdpa' else 'float32'}", f"{ratio:.2f}x", f">= {goal}x",
                 ratio >= goal)
        if r["op"] == "bf16 sdpa" and r["threads"] == 1 and bpk.get(1):
            frac = 100 * r["flops"] / (r["min_ms"] / 1e3) / 1e9 / bpk[1]
            line(f"bf16 sdpa {r['shape']}, 1 thr, % of the bfloat16 peak", f"{frac:.0f} %", ">= 85 %", frac >= 85)
        one = get(r["op"], r["shape"], "pyattn", 1)
        if one and r["threads"] > 1:
            ratio = one["min_ms"] / r["min_ms"]
            line(f"{r['op']} {r['shape']}: {r['threads']} threads vs 1", f"{ratio:.2f}x", ">= 1.85x", ratio >= 1.85)
    # varlen (issue 24): GFLOP/s of real work vs the dense kernel (mean length;
    # backward: equal work), time vs padding to the longest + masking
    gfs = lambda r: r["flops"] / r["min_ms"] / 1e6  # noqa: E731
    for r in data:
        if r["impl"] != "pyattn" or not r["op"].startswith("varlen") or r["shape"].startswith("dense"):
            continue
        dense = next((d for d in data if d["op"] == r["op"] and d["threads"] == r["threads"]
                      and d["shape"].startswith("dense")), None)
        goal = 0.95 if r["op"] == "varlen" else 0.9
        if dense:
            ratio = gfs(r) / gfs(dense)
            line(f"{r['op']} {r['shape']}, {r['threads']} thr, GFLOP/s vs {dense['shape'].split(' (')[0]}",
                 f"{ratio:.2f}x ({gfs(r):.1f} vs {gfs(dense):.1f})", f">= {goal}x", ratio >= goal)
        pad = get(r["op"], r["shape"], "pyattn padded + mask", r["threads"])
        if pad:
            ratio = pad["min_ms"] / r["min_ms"]
            line(f"varlen {r['shape']}, {r['threads']} thr, vs padded + mask", f"{ratio:.2f}x", ">= 1.8x",
                 ratio >= 1.8)
    # paged caches ("Serve"): paged decode vs the contiguous cache, the mixed
    # batch vs its parts called separately
    for r in data:
        if r["op"] == "paged decode" and r["impl"].startswith("pyattn paged"):
            c = get("paged decode", r["shape"], "pyattn contiguous", r["threads"])
            if c:
                ratio = c["min_ms"] / r["min_ms"]
                line(f"paged decode {r['shape']} {r['impl'][13:]}, {r['threads']} thr, vs contiguous",
                     f"{ratio:.2f}x", ">= 0.95x", ratio >= 0.95)
        if r["op"] == "paged mixed" and r["impl"] == "pyattn mixed, one call":
            c = get("paged mixed", r["shape"], "pyattn parts, two calls", r["threads"])
            if c:
                ratio = c["min_ms"] / r["min_ms"]
                line(f"mixed batch {r['shape']}, {r['threads']} thr, vs the parts", f"{ratio:.2f}x", ">= 0.9x",
                     ratio >= 0.9)
                line(f"issue 38: mixed prefill + decode batch {r['shape']}, {r['threads']} thr, vs the sum of its "
                     "parts", f"{ratio:.2f}x", ">= 0.95x", ratio >= 0.95)
    # MQA / MLA decode (issue 41): % of the FMA peak, head dims against E = 256
    for r in data:
        if r["op"] != "group decode" or not peak.get(r["threads"]):
            continue
        if "Hq=32 Hkv=1 E=" in r["shape"] and "E=128 " not in r["shape"]:
            base = next((x for x in data if x["op"] == "group decode" and x["threads"] == r["threads"]
                         and "Hq=32 Hkv=1 E=256 " in x["shape"]), None)
            if base and r is not base:
                rate = lambda x: x["flops"] / x["min_ms"]   # noqa: E731
                ratio = rate(r) / rate(base)
                line(f"group decode {r['shape']}, {r['threads']} thr, rate vs E=256", f"{ratio:.2f}x",
                     ">= 0.5x", ratio >= 0.5)
            continue
        if "E=256 " in r["shape"]:
            continue
        p = pct(r)
        line(f"group decode {r['shape']}, {r['threads']} thr, % of FMA peak", f"{p:.0f} %", ">= 70 %", p >= 70)
    # shared-prefix reads (issue 38): the forks' step vs the same step on unshared copies
    for r in data:
        if r["op"] == "shared prefix" and r["impl"] == "pyattn shared reads":
            c = get("shared prefix", r["shape"], "pyattn 16 unshared copies", r["threads"])
            if c:
                ratio = c["min_ms"] / r["min_ms"]
                mb = (r.get("bytes", 0) / 1e6, c.get("bytes", 0) / 1e6)
                line(f"shared prefix {r['shape']}, {r['threads']} thr, vs unshared copies "
                     f"({r['min_ms']:.1f} vs {c['min_ms']:.1f} ms; {mb[0]:.0f} vs {mb[1]:.0f} MB read)",
                     f"{ratio:.2f}x", ">= 6x", ratio >= 6)
    # quantized caches (issue #25): int8 / int4 vs float32 (the bandwidth rows come
    # from the generic loop above: values and scales read), quantizing on append
    for r in data:
        if r["op"] != "qdecode" or r["impl"] != "pyattn":
            continue
        for name, goal in (("pyattn int8 cache", 3.2), ("pyattn int4 cache", 5.0)):
            h = get("qdecode", r["shape"], name, r["threads"])
            if h:
                ratio = r["min_ms"] / h["min_ms"]
                line(f"QDECODE {r['shape']}, {r['threads']} thr, {name[7:]} vs float32", f"{ratio:.2f}x",
                     f">= {goal}x", ratio >= goal)
        a, b = (get("qdecode", r["shape"], n, r["threads"])
                for n in ("pyattn int8 cache, appending a token", "pyattn int8 cache"))
        if a and b:
            extra = 100 * (a["min_ms"] / b["min_ms"] - 1)
            line(f"QDECODE {r['shape']}, {r['threads']} thr, quantizing on append (int8)",
                 f"{extra:.1f} % of a decode step", "<= 5 %", extra <= 5)
        for dt in ("int8", "int4"):                  # issue 37: precision="int8" vs the default
            a, b = (get("qdecode", r["shape"], n, r["threads"])
                    for n in (f"pyattn {dt} cache, precision=int8", f"pyattn {dt} cache"))
            if a and b:
                ratio = b["min_ms"] / a["min_ms"]
                line(f"QDECODE {r['shape']}, {r['threads']} thr, {dt} cache precision=int8 vs default",
                     f"{ratio:.2f}x", "> 1x", ratio > 1.0)
    # block masks (issue #26), 1 thread: time <= 1.1 x (dense-kernel time x share of
    # non-empty tiles), >= 2x the same mask as a bool array where sparsity >= 50 %,
    # the build <= 5 % of one forward
    for b in (r for r in rows if r.get("kind") == "blockmask"):
        shape = f"B=1 H=8 L=S={b['L']} E=64 {b['mask']}"
        for op in ("blockmask fwd", "blockmask bwd"):
            bm_, nm, bo = (get(op, shape, i, 1) for i in ("block_mask", "no mask", "bool mask"))
            if not (bm_ and nm and bo):
                continue
            ratio = bm_["min_ms"] / (nm["min_ms"] * b["share"])
            line(f"{op[10:]} {b['mask']} (L=S={b['L']}, {100 * b['share']:.0f} % of tiles): time / (dense time x "
                 "tile share)", f"{ratio:.2f}", "<= 1.1", ratio <= 1.1)
            if b["sparsity"] >= 0.5:
                sp = bo["min_ms"] / bm_["min_ms"]
                line(f"{op[10:]} {b['mask']}: vs the mask as a bool array", f"{sp:.2f}x", ">= 2x", sp >= 2)
            if op == "blockmask fwd":
                frac = 100 * b["build_ms"] / bm_["min_ms"]
                line(f"BlockMask build, {b['mask']} (L=S={b['L']}): % of one forward",
                     f"{frac:.2f} % ({b['build_ms']:.1f} ms)", "<= 5 %", frac <= 5)
    # issue 37 (decode at the speed of memory): every pyattn decode row >= 85 % of
    # its roofline (_roofline); 16-bit caches >= 1.8x the float32 cache, int8
    # (default precision) >= 2.2x, at S >= 16384 (the issue's shapes);
    # precision="bf16" never slower than the default (>= 0.95x); paged 16-row
    # blocks >= 0.95x the contiguous cache
    for r in data:
        if r.get("roof_pct") is None or not r["impl"].startswith("pyattn"):
            continue
        rf = r["roof"]
        line(f"issue 37: {r['op']} {r['shape']} {r['impl']} ({rf['cache']} cache, precision {rf['precision']}), "
             f"{r['threads']} thr, % of roofline", f"{r['roof_pct']:.0f} % ({r['roof_limit']}-bound: "
             f"{r['roof_ms']:.3f} ms vs {r['min_ms']:.3f} ms)", ">= 85 %", r["roof_pct"] >= 85)
    for r in data:
        if r["op"] not in ("decode", "qdecode") or r["impl"] != "pyattn" or " S=" not in r["shape"]:
            continue
        if int(r["shape"].split(" S=")[1].split()[0]) < 16384:
            continue
        for name, goal in (("pyattn float16 cache", 1.8), ("pyattn bfloat16 cache", 1.8),
                           ("pyattn int8 cache", 2.2), ("pyattn int8 cache, precision=int8", 3.5),
                           ("pyattn int4 cache, precision=int8", 4.0), ("pyattn fp8_e4m3 cache", 3.0),
                           ("pyattn fp8_e5m2 cache", 3.0)):
            h = get(r["op"], r["shape"], name, r["threads"])
            if h:
                ratio = r["min_ms"] / h["min_ms"]
                line(f"issue 37: {r['op']} {r['shape']}, {r['threads']} thr, {name[7:]} vs float32 cache",
                     f"{ratio:.2f}x", f">= {goal}x", ratio >= goal)
    for r in data:
        if r.get("roof") and r["roof"]["precision"] == "bf16" and r["impl"].startswith("pyattn"):
            d = get(r["op"], r["shape"], r["impl"].split(", precision=")[0], r["threads"])
            if d:
                ratio = d["min_ms"] / r["min_ms"]
                line(f"issue 37: {r['op']} {r['shape']}, {r['threads']} thr, {r['impl'][7:]} vs the default "
                     "precision", f"{ratio:.2f}x", ">= 0.95x", ratio >= 0.95)
        if r["op"] == "paged decode" and r["impl"] == "pyattn paged bs=16":
            c = get("paged decode", r["shape"], "pyattn contiguous", r["threads"])
            if c:
                ratio = c["min_ms"] / r["min_ms"]
                line(f"issue 37: paged decode {r['shape']} bs=16, {r['threads']} thr, vs contiguous",
                     f"{ratio:.2f}x", ">= 0.95x", ratio >= 0.95)
    # issue 38: the fixed cost of a tiny decode call (medians, same worker)
    pcs = {(r["call"], r["threads"]): r["median_us"] for r in rows if r.get("kind") == "percall"}
    for thr in sorted({t for _, t in pcs}):
        ref, kv = pcs.get((PERCALL_REF, thr)), pcs.get((PERCALL_KV, thr))
        for name, goal in ((PERCALL_KV, 1.5), ("PagedKVCache.attend (one sequence, appending one row)", 2.0),
                           (PERCALL_PLANNED, 2.0)):
            me = pcs.get((name, thr))
            if me and ref:
                line(f"issue 38: {name}, {thr} thr, per call vs PyTorch SDPA", f"{me / ref:.2f}x ({me:.1f} vs "
                     f"{ref:.1f} us)", f"<= {goal}x", me / ref <= goal)
        for name in ("pyattn.torch.scaled_dot_product_attention", "pyattn.flash.flash_attn_with_kvcache, read only"):
            me = pcs.get((name, thr))
            if me and kv:
                line(f"issue 38: {name}, {thr} thr, per call minus attention_with_kvcache's",
                     f"{me - kv:+.1f} us ({me:.1f} vs {kv:.1f})", "<= +10 us", me - kv <= 10)
    peers.target_lines(data, line)                  # pyattn >= 1.15x ONNX Runtime, OpenVINO
    sys.path.insert(0, HERE)
    from _bench_hf import hf_targets      # pyattn in PyTorch and transformers
    hf_targets(data, get, line)
    from _bench_hfgen import hfgen_targets    # issue 38: HF generation
    hfgen_targets(rows, line)
    if mem is not None:
        line("causal L=S=32768 E=64: peak memory growth", f"{mem:.1f} MB", "< 64 MB", mem < 64)
    # FlashAttention's interface (pyattn.flash): within 5 % of pyattn's own API;
    # rotary on append within 5 % of a decode step
    for r in data:
        if r["op"] in ("flash fwd", "flash kvcache") and r["impl"] != "pyattn":
            me = get(r["op"], r["shape"], "pyattn", r["threads"])
            if me:
                extra = r["min_ms"] / me["min_ms"] - 1
                what = "rotary on append vs the same decode step" if "rotary" in r["impl"] else \
                    f"{r['impl']} vs pyattn's own API"
                line(f"{r['op']} {r['shape']}, {r['threads']} thr: {what}", f"{100 * extra:+.1f} %",
                     "<= +5 %", extra <= 0.05)
    _avx2_target_lines(pinned, line)
    return "| target | measured | goal | |\n|---|---|---|---|\n" + "\n".join(out)


def _avx2_target_lines(pinned, line):
    """The targets again for the avx2 family on a CPU with AVX-512, against the
    peers pinned to AVX2 (AVX2_PINS; ONNX Runtime cannot be: said in its row),
    each ratio within that worker's interleaved rounds (matmul: min times,
    the rest: median times, as the main rows)"""
    def get(op, shape, impl, thr):
        return next((r for r in pinned if r["op"] == op and r["shape"] == shape and r["impl"] == impl
                     and r["threads"] == thr), None)
    goals = {"matmul": 1.0, "sdpa": peers.GOAL, "mha": 1.3,
             "backward": 1.5, "fwd+bwd": 1.5, "mha fwd+bwd": 1.3}   # training: vs torch pinned to AVX2
    for r in pinned:
        if r["impl"] == "pyattn" or r["op"] not in goals or (r["op"] == "matmul" and r["shape"] == "512^3"):
            continue
        if r["op"] == "sdpa" and r["impl"].startswith("torch"):
            goal = 1.5
        else:
            goal = goals[r["op"]]
        me = get(r["op"], r["shape"], "pyattn", r["threads"])
        if not me:
            continue
        t = "min_ms" if r["op"] == "matmul" else "median_ms"
        ratio = r[t] / me[t]
        line(f"{r['op']} {r['shape']}, {r['threads']} thr, avx2 family vs {r['impl']}", f"{ratio:.2f}x",
             f">= {goal}x", ratio >= goal)


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.platform()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-shapes", action="store_true",
                    help="matmul 2048^3 and the tall shapes, attention L=S=512/1024/2048 at E=64/128 causal "
                         "or not, the other sections at their full sizes: the shapes the targets name")
    ap.add_argument("--quick", action="store_true",
                    help="small set of cases, no bfloat16 rows where they are emulated (a few minutes)")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all)")
    ap.add_argument("--repeat", type=int, default=None, help="interleaved rounds per case")
    ap.add_argument("--settle", type=float, default=0.2, help="seconds of rest before each timed call")
    ap.add_argument("--plot", default=None, help="write a GFLOP/s vs sequence length plot (matplotlib)")
    ap.add_argument("--md", default=None, help="also write the table with its context to this Markdown file")
    ap.add_argument("--no-memory", action="store_true", help="skip the 32768-token memory probe")
    ap.add_argument("--only", default=None, help="comma-separated sections to run: matmul, sdpa, decode, "
                    "generation (kvdecode: its decode rows alone), quant, training, varlen, bf16, mha, flash, paged, "
                    "percall, shared, groups, blockmask, hf (default: all); hfgen (Hugging Face generate, "
                    "issue 38: only when named)")
    ap.add_argument("--from-json", default=None, help="re-render the table, targets and plot from a saved "
                    "results.json instead of measuring")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--numpy-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--avx2-peers", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat is None:
        args.repeat = 3 if args.quick else 5
    if args.worker:
        args.threads = int(args.threads)
        worker(args)
        return
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count() or 1
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, ncpu})
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        rows, mem = saved["rows"], saved["memory_mb"]
        threads = sorted({r["threads"] for r in rows})
    else:
        rows = []
        pinned = [v for v in OPENBLAS_PINS if v in os.environ]
        for i, t in enumerate(threads):
            rows += spawn(t, args, first=i == 0)
            if pinned and (not args.only or "matmul" in args.only.split(",")):   # NumPy twice: as this environment runs it, and unpinned
                sys.stderr.write(f"  threads={t}: NumPy again with {', '.join(pinned)} unset\n")
                rows += spawn(t, args, numpy_only=True)
        if _avx2_on_avx512():
            for t in threads:
                sys.stderr.write(f"  threads={t}: the peers again, pinned to AVX2 ({', '.join(AVX2_PINS)})\n")
                rows += spawn(t, args, avx2_peers=True)
        mem = None if args.no_memory else memory_probe()
    _roofline(rows)
    tab = table(rows)
    peak = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "peak"}
    if args.from_json and "head" in saved:
        head = list(saved["head"])
        if len(head) > 2 and head[2].startswith("measured float32 FMA peak") and peak:   # every run's rows
            head[2] = "measured float32 FMA peak per core: " + ", ".join(
                f"{v:.1f} GFLOP/s ({k} thr run)" for k, v in peak.items() if v)
    else:
        head = [f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
                f"machine: {platform.machine()}, {ncpu} CPUs, {_cpu_name()}",
                "measured float32 FMA peak per core: " + ", ".join(
                    f"{v:.1f} GFLOP/s ({k} thr run)" for k, v in peak.items() if v),
                "command: python benchmarks/bench.py " + " ".join(a for a in sys.argv[1:])]
    head = head[:4] + [
            "speed-up column: that implementation's median time / pyattn's median time "
            "(above 1: pyattn is faster); numpy = the seeds' naive attention, L <= 2048"]
    bpk = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "bf16peak"}
    if bpk:
        head.append("measured bfloat16 peak (vdpbf16ps) per core: " + ", ".join(
            f"{v:.1f} GFLOP/s ({k} thr run)" if v else f"none: no AVX512_BF16 ({k} thr run)" for k, v in bpk.items()))
    bw = {r["threads"]: r["gbs"] for r in rows if r.get("kind") == "bandwidth"}
    if bw:
        head.append("measured read bandwidth: " + ", ".join(f"{v:.1f} GB/s ({k} thr)" for k, v in bw.items()))
    if any(r.get("roof_pct") is not None for r in rows):
        fam = next((r.get("isa") for r in rows if r.get("kind") == "bf16peak" and r.get("isa")), "?")
        bp = {r["threads"]: r["gflops_core"] for r in rows if r.get("kind") == "bf16peak"}
        bnote = ", ".join(f"{v:.1f} GFLOP/s per core = {v / peak[k]:.2f}x the float32 FMA peak ({k} thr run)"
                          if v and peak.get(k) else f"none in this family ({k} thr run): the float32 FMA peak"
                          for k, v in bp.items())
        head.append(f"decode roofline (issue 37; pyattn family {fam}): bound = max(bytes / read bandwidth, "
                    "multiply-adds / peak); bytes = K and V rows read ((E + Ev) x element size, + int8/int4 "
                    "scales (E + Ev) / group x 4) x rows x KV heads x batch; multiply-adds = G x (E + Ev) x rows x "
                    "KV heads x batch; the read bandwidth of the same worker (its start or beside the case, the "
                    "higher); the peak: the float32 FMA peak x threads (every cache dtype is widened to float32), "
                    "for precision=\"bf16\" the bfloat16 dot-product peak probed by _C.bf16_probe (vdpbf16ps "
                    f"chains): {bnote or 'not probed'}; % of roofline = bound / min time")
    for r in rows:
        if r.get("kind") == "wakeup":
            head.append(f"handing a small job to the pool of {r['threads']} threads (_C.read_probe of 8 MiB, 2 tasks): "
                        f"{r['idle_ms']:.3f} ms after 0.2 s of rest (the --settle every timed call gets), "
                        f"{r['hot_ms']:.3f} ms back to back; the 'back to back' thread rows time calls "
                        "with no rest between them")
    for r in rows:
        if r.get("kind") == "impls" and r.get("avx2_peers") and r["threads"] == threads[0]:
            head.append(f"peers pinned to AVX2 ({', '.join(f'{k}={v}' for k, v in AVX2_PINS.items())}; "
                        f"ONNX Runtime cannot be pinned): NumPy's BLAS {r['blas']}")
            continue
        if r.get("kind") == "impls" and (r["threads"] == threads[0] or r.get("numpy_env")):
            head.append(f"NumPy's BLAS{' with ' + '/'.join(OPENBLAS_PINS) + ' unset' if r.get('numpy_env') else ''}"
                        f": {r['blas']}")
    tv = next((r["torch"] for r in rows if r.get("kind") == "impls"), "unknown")
    head.append(f"PyTorch {tv}" if tv else "PyTorch: not installed, so no torch rows and no targets "
                "against it (pip install torch==2.13.0)")
    head.append(peers.versions())
    kern = next((r for r in rows if r.get("kind") == "kernel" and r.get("kernel_pct")), None)
    if kern:
        head.append(f"GEMM micro-kernel alone, panels in L1, 1 thread, best of {kern['rounds']} spread over "
                    "the run: " + ", ".join(
            f"{k} {v:.0f} %" for k, v in kern["kernel_pct"].items()) + " of the FMA peak (float64: of half of it)")
    if mem is not None:
        head.append(f"causal attention L=S=32768, E=64, one head: peak resident memory grew by {mem:.1f} MB "
                    "during the call, beyond its inputs and output (the (L, S) float32 matrix would be 4096 MB)")
    roof = roofline_table(rows)
    pc = percall_tables(rows)
    from _bench_hfgen import hfgen_tables
    hg = hfgen_tables(rows)
    text = "\n".join("- " + h for h in head) + "\n\n" + tab + \
        ("\n\n## Decode roofline\n\n" + roof if roof else "") + (("\n\n" + pc) if pc else "") + \
        (("\n\n" + hg) if hg else "") + \
        "\n\n## Performance targets\n\n" + targets(rows, mem) + "\n"
    if args.md and not args.from_json:
        with open(os.path.splitext(os.path.abspath(args.md))[0].lower() + ".json", "w") as f:
            json.dump({"rows": rows, "memory_mb": mem, "head": head[:4]}, f)
    print(text)
    if args.md:
        import pyattn
        import io
        import contextlib
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            pyattn.show_config()
        with open(args.md, "w") as f:
            f.write("# pyattn benchmark results\n\n" + text + "\n```\n" + buf.getvalue() + "```\n")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not installed: no plot")
            return
        fig, ax = plt.subplots(figsize=(7, 4))
        for impl in ("pyattn", "torch", "numpy"):
            for t in threads:
                pts = sorted((int(r["shape"].split("L=S=")[1].split()[0]), r["flops"] / r["min_ms"] / 1e6)
                             for r in rows if r.get("op") == "sdpa" and r.get("impl") == impl and r["threads"] == t
                             and "L=S=" in r["shape"] and "E=64" in r["shape"] and "causal" not in r["shape"])
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{impl}, {t} thr")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length L = S (H=8, E=64, float32)")
        ax.set_ylabel("GFLOP/s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
