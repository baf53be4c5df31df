"""pyattn.dask on a LocalCluster of single-threaded worker processes, against
local pyattn with as many threads (the rows of the issue "Beyond one machine").

    python benchmarks/bench_dask.py                 # both rows (a few minutes)
    python benchmarks/bench_dask.py --quick         # smaller shapes
    python benchmarks/bench_dask.py --md benchmarks/RESULTS_dask.md

Rows (float32, causal, E=64):
  batch:  64 sequences x (H=8, L=S=2048), one sequence per chunk, on 1 and on 2
          workers, and local pyattn with 1 and 2 threads;
  long:   one sequence L=S=65536, H=8, split into 8 chunks along L and S (36
          attention tasks instead of 64: causal skipping), on 2 workers, and
          local pyattn with 2 threads; the results are compared.
The inputs are created on the workers from a seed (dask.array.random) and the
results stay there (client.persist, then wait: a distributed workload keeps
its data distributed), so the timings include neither shipping the inputs nor
gathering the outputs to the client; the local runs use the same values.
Each measurement is the best of --repeat runs. Targets: 2 workers >= 1.7x one
worker; 2 workers within 1.25x (batch) and 1.3x (long) of local pyattn on 2
threads.
"""
import argparse
import os
import platform
import sys
import time

import numpy as np


def best(fn, repeat):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import pyattn
    import pyattn.dask as pdask

    nseq, H, L, E = (16, 8, 1024, 64) if args.quick else (64, 8, 2048, 64)
    Llong = 16384 if args.quick else 65536
    rows, lines = [], []

    def data(shape, chunks, seed):
        return da.random.default_rng(seed).standard_normal(shape, chunks=chunks, dtype=np.float32)

    q = data((nseq, H, L, E), (1, H, L, E), 1)
    k = data((nseq, H, L, E), (1, H, L, E), 2)
    v = data((nseq, H, L, E), (1, H, L, E), 3)
    ql, kl, vl = (x.compute() for x in (q, k, v))
    ch = Llong // 8
    qL = data((1, H, Llong, E), (1, H, ch, E), 4)
    kL = data((1, H, Llong, E), (1, H, ch, E), 5)
    vL = data((1, H, Llong, E), (1, H, ch, E), 6)
    qLl, kLl, vLl = (x.compute() for x in (qL, kL, vL))

    t_local = {}
    for nt in (1, 2):
        pyattn.set_num_threads(nt)
        t_local[nt] = best(lambda: pyattn.scaled_dot_product_attention(ql, kl, vl, is_causal=True), args.repeat)
        rows.append(("batch", f"local pyattn, {nt} thread(s)", t_local[nt]))
    pyattn.set_num_threads(2)
    want_long = pyattn.scaled_dot_product_attention(qLl, kLl, vLl, is_causal=True)
    t_long_local = best(lambda: pyattn.scaled_dot_product_attention(qLl, kLl, vLl, is_causal=True),
                        max(1, args.repeat - 1))
    rows.append(("long", "local pyattn, 2 threads", t_long_local))

    t_dask, t_long = {}, None
    for nw in (1, 2):
        with LocalCluster(n_workers=nw, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None, silence_logs=40) as cl, Client(cl) as client:
            qp, kp, vp = client.persist([q, k, v])           # inputs made on the workers
            wait([qp, kp, vp])

            def run_batch():                                # a new graph each time (new keys:
                y = pdask.scaled_dot_product_attention(qp, kp, vp, is_causal=True)   # no reuse)
                wait(client.persist(y))
            run_batch()                                     # warm-up
            t_dask[nw] = best(run_batch, args.repeat)
            rows.append(("batch", f"pyattn.dask, {nw} worker(s) x 1 thread", t_dask[nw]))
            if nw == 2:
                qp, kp, vp = client.persist([qL, kL, vL])
                wait([qp, kp, vp])
                yl = pdask.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
                tasks = len([kk for kk in dict(yl.__dask_graph__())
                             if str(kk[0] if isinstance(kk, tuple) else kk).startswith("pyattn-attention")])
                got = client.compute(yl).result()
                del yl

                def run_long():
                    wait(client.persist(pdask.scaled_dot_product_attention(qp, kp, vp, is_causal=True)))
                t_long = best(run_long, max(1, args.repeat - 1))
                rows.append(("long", f"pyattn.dask, 2 workers x 1 thread ({tasks} attention tasks)", t_long))
                err = float(np.max(np.abs(got - want_long)))
    flops = 4.0 * nseq * H * L * L * E * 0.5
    flops_long = 4.0 * H * Llong * Llong * E * 0.5

    def line(name, value, goal, ok):
        lines.append(f"| {name} | {value} | {goal} | {'met' if ok else 'NOT met'} |")

    r = t_dask[1] / t_dask[2]
    line(f"batch {nseq} x (H={H}, L=S={L}), 2 workers vs 1", f"{r:.2f}x", ">= 1.7x", r >= 1.7)
    r = t_dask[2] / t_local[2]
    line("batch, 2 workers vs local pyattn 2 threads (time ratio)", f"{r:.2f}x", "<= 1.25x", r <= 1.25)
    r = t_long / t_long_local
    line(f"long L=S={Llong}, 8 x 8 chunks, 2 workers vs local 2 threads (time ratio)", f"{r:.2f}x", "<= 1.3x",
         r <= 1.3)
    tol = 1e-4 * float(np.max(np.abs(want_long)))
    line("long: max |dask - local|", f"{err:.2e}", f"<= {tol:.1e} (merge reassociation)", err <= tol)
    table = ["| row | run | seconds (best) | GFLOP/s |", "|---|---|---|---|"]
    for kind, name, t in rows:
        f = flops if kind == "batch" else flops_long
        table.append(f"| {kind} | {name} | {t:.3f} | {f / t / 1e9:.1f} |")
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(x.split(":", 1)[1].strip() for x in fh if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    head = [f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {cpu}",
            "command: python benchmarks/bench_dask.py " + " ".join(sys.argv[1:]),
            "float32, causal, E=64; LocalCluster(processes=True, threads_per_worker=1) on the loopback "
            "interface; inputs persisted on the workers before timing"]
    text = ("\n".join("- " + h for h in head) + "\n\n" + "\n".join(table) +
            "\n\n## Targets\n\n| target | measured | goal | |\n|---|---|---|---|\n" + "\n".join(lines) + "\n")
    print(text)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write("# pyattn.dask benchmark results\n\n" + text)


if __name__ == "__main__":
    main()
