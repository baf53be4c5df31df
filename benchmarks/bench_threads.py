"""pyattn thread scaling: the same work on 1, 2, 4, 8, 16 ... threads.

    python benchmarks/bench_threads.py                    # 1, 2 and all cores
    python benchmarks/bench_threads.py --threads 1,2,4,8,16 --md RESULTS_threads.md

For the issue "Fast, part 2" (thread scaling beyond 2 where a bigger machine
is at hand). Each thread count runs in its own process (PYATTN_NUM_THREADS,
OPENBLAS_NUM_THREADS set to it); inside it every case is timed `--repeat`
times after a warm-up and the minimum is kept. Besides the speed-up over
1 thread, each row gives the rate against what that many cores can do:
GFLOP/s against the float32 FMA peak of that many cores (the FMA probe run
on n threads at once at the start of the process: all-core clocks are
lower than one core's) and, for the decode rows, the bytes of K
and V read per second against the read bandwidth probed on those threads
(_C.read_probe). NumPy's matmul (its BLAS, with the thread count set the
same way) is timed beside pyattn's. Never a timing in a test: this prints.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from bench import _cpu_name   # benchmarks/bench.py, beside this file


def _best(fn, repeat):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _cases():
    """(name, flops, bytes read or 0, builder returning {impl: fn})"""
    import numpy as np
    import pyattn
    rng = np.random.default_rng(0)
    out = []

    def mm(M, K, N):
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        name = f"matmul {M}^3" if M == K == N else f"matmul ({M}x{K}) @ ({K}x{N})"
        out.append((name, 2.0 * M * K * N, 0,
                    {"pyattn": lambda: pyattn.matmul(a, b), "numpy": lambda: np.matmul(a, b)}))

    def sdpa(H, L, E, causal):
        q, k, v = (rng.standard_normal((1, H, L, E), dtype=np.float32) for _ in range(3))
        fl = 4.0 * H * L * L * E * (0.5 if causal else 1.0)
        out.append((f"sdpa B=1 H={H} L=S={L} E={E}{' causal' if causal else ''}", fl, 0,
                    {"pyattn": lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=causal)}))

    def decode(Hq, Hkv, S, E):
        q = rng.standard_normal((1, Hq, 1, E), dtype=np.float32)
        k, v = (rng.standard_normal((1, Hkv, S, E), dtype=np.float32) for _ in range(2))
        out.append((f"decode B=1 Hq={Hq} Hkv={Hkv} S={S} E={E}", 4.0 * Hq * S * E, k.nbytes + v.nbytes,
                    {"pyattn": lambda: pyattn.attention_with_kvcache(q, k, v, cache_seqlens=S)}))

    mm(2048, 2048, 2048)
    mm(4096, 4096, 4096)
    mm(2048, 768, 2304)
    mm(2048, 768, 768)
    sdpa(8, 2048, 64, False)
    sdpa(8, 2048, 64, True)
    sdpa(8, 2048, 128, False)
    sdpa(32, 4096, 64, True)
    decode(32, 32, 8192, 128)
    decode(32, 8, 65536, 128)
    return out


def worker(repeat):
    import numpy as np
    from pyattn import _C
    import pyattn
    import threading
    n = pyattn.get_num_threads()
    peak = 0.0                                  # float32 FMA peak of n cores busy at once
    for _ in range(5):
        go = threading.Barrier(n + 1)
        got = []

        def probe():
            go.wait()
            got.append(_C.fma_probe(5_000_000) or 0.0)

        ts = [threading.Thread(target=probe) for _ in range(n)]
        for th in ts:
            th.start()
        go.wait()
        t = time.perf_counter()
        for th in ts:
            th.join()
        peak = max(peak, sum(got) / (time.perf_counter() - t))
    buf = np.ones(128 << 20, np.float32)        # 512 MB
    _C.read_probe(buf)
    bw = 0.0
    for _ in range(5):
        t = time.perf_counter()
        _C.read_probe(buf)
        bw = max(bw, buf.nbytes / (time.perf_counter() - t))
    del buf
    print("INFO " + json.dumps({"threads": n, "peak": peak,
                                "bandwidth": bw}), flush=True)
    for name, flops, nbytes, impls in _cases():
        for impl, fn in impls.items():
            t = _best(fn, repeat)
            print("ROW " + json.dumps({"case": name, "impl": impl, "s": t, "flops": flops,
                                       "bytes": nbytes}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1, 2, all)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--md", default=None, help="also write the table to this Markdown file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.repeat)
        return
    ncpu = os.cpu_count() or 1
    counts = ([int(x) for x in args.threads.split(",")] if args.threads
              else sorted({1, min(2, ncpu), ncpu}))
    info, rows = {}, []
    for n in counts:
        env = dict(os.environ, PYATTN_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n),
                   OMP_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n))
        for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):   # NumPy's own kernel for the CPU
            env.pop(var, None)
        sys.stderr.write(f"  {n} threads ...\n")
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--repeat", str(args.repeat)],
                           env=env, stdout=subprocess.PIPE, text=True, cwd="/", check=True)
        for line in p.stdout.splitlines():
            if line.startswith("INFO "):
                info[n] = json.loads(line[5:])
            elif line.startswith("ROW "):
                rows.append(dict(json.loads(line[4:]), threads=n))
    import numpy as np
    head = [f"- CPU: {_cpu_name()}, {ncpu} logical CPUs; {platform.machine()}",
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- command: python benchmarks/bench_threads.py --threads {','.join(map(str, counts))}",
            "- float32 FMA peak, probed with n cores busy at once (the FMA chains of _C.fma_probe "
            "on n threads): " + ", ".join(f"{n}: {info[n]['peak'] / 1e9:.0f} GFLOP/s" for n in counts)
            + f"; NumPy {np.__version__}",
            "- read bandwidth by threads: " + ", ".join(f"{n}: {info[n]['bandwidth'] / 1e9:.1f} GB/s"
                                                        for n in counts),
            "- each cell: min time of the case; speed-up over 1 thread; % of the n-core FMA peak "
            "(decode: % of the read bandwidth on n threads)", ""]
    hdr = "| case | impl | " + " | ".join(f"{n} thr" for n in counts) + " |"
    lines = [hdr, "|---|---|" + "---|" * len(counts)]
    seen = []
    for r in rows:
        if (r["case"], r["impl"]) not in seen:
            seen.append((r["case"], r["impl"]))
    for case, impl in seen:
        by = {r["threads"]: r for r in rows if r["case"] == case and r["impl"] == impl}
        t1 = by[counts[0]]["s"]
        cells = []
        for n in counts:
            r = by[n]
            if r["bytes"]:
                pct = 100 * r["bytes"] / r["s"] / info[n]["bandwidth"]
                what = f"{pct:.0f} % bw"
            else:
                pct = 100 * r["flops"] / r["s"] / info[n]["peak"]
                what = f"{pct:.0f} % pk"
            cells.append(f"{r['s'] * 1e3:.2f} ms, {t1 / r['s']:.2f}x, {what}")
        lines.append(f"| {case} | {impl} | " + " | ".join(cells) + " |")
    text = "\n".join(head + lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write("# pyattn thread scaling\n\n" + text)


if __name__ == "__main__":
    main()
