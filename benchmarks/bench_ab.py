"""Two builds of pyattn side by side: the --quick shapes of bench.py timed on
an old and a new source tree (each with its extension built in place:
`python setup.py build_ext --inplace` there), in alternating subprocesses,
so that a change can be shown to leave the speed alone (or not).

    git worktree add /tmp/old <rev> && (cd /tmp/old && python setup.py -q build_ext --inplace)
    python benchmarks/bench_ab.py --old /tmp/old --new . --rounds 12

One thread, the minimum of several calls per process and of the rounds per
build; OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset in the subprocesses (as
bench.py does) and the other libraries' pools held at one thread. Prints
old ms, new ms and new/old per case. A shared machine moves single figures
by several per cent: read ratios near 1 as "unchanged within noise".
"""
import argparse
import json
import os
import subprocess
import sys

CASES = r'''
import sys, time, json
sys.path.insert(0, sys.argv[1])
import numpy as np, pyattn
assert pyattn.__file__.startswith(sys.argv[1]), pyattn.__file__
pyattn.set_num_threads(1)
rng = np.random.default_rng(0)
f32 = np.float32

def t(fn, n=7):
    fn(); best = 1e9
    for _ in range(n):
        t0 = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t0)
    return best * 1e3

res = {}
for n in (512, 1024):
    a, b = rng.standard_normal((n, n), dtype=f32), rng.standard_normal((n, n), dtype=f32)
    res[f"matmul {n}^3"] = t(lambda: pyattn.matmul(a, b))
for L in (512, 1024):
    q, k, v = (rng.standard_normal((1, 8, L, 64), dtype=f32) for _ in range(3))
    for c in (False, True):
        res[f"sdpa B1 H8 L={L} E64{' causal' if c else ''}"] = t(
            lambda: pyattn.scaled_dot_product_attention(q, k, v, is_causal=c))
    o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    res[f"backward L={L} causal"] = t(
        lambda: pyattn.scaled_dot_product_attention_backward(o, q, k, v, o, lse, is_causal=True), 3)
qd = rng.standard_normal((1, 32, 1, 128), dtype=f32)
kd, vd = (rng.standard_normal((1, 8, 8192, 128), dtype=f32) for _ in range(2))
res["decode GQA 32/8 S=8192 E128"] = t(
    lambda: pyattn.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True), 15)
x = rng.standard_normal((2048, 4096), dtype=f32)
res["softmax 2048x4096"] = t(lambda: pyattn.softmax(x))
from pyattn.nn import MultiHeadAttention
m = MultiHeadAttention(768, 768, 12, rng=0).eval()
xx = rng.standard_normal((2, 256, 768), dtype=f32)
res["MHA B2 T256 D768"] = t(lambda: m(xx))
print(json.dumps(res))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="source tree of the old build (extension built in place)")
    ap.add_argument("--new", required=True, help="source tree of the new build")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per build (default 6)")
    args = ap.parse_args()
    trees = [os.path.abspath(args.old), os.path.abspath(args.new)]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    runs = {p: [] for p in trees}
    for r in range(args.rounds):
        for p in (trees if r % 2 == 0 else trees[::-1]):
            out = subprocess.run([sys.executable, "-c", CASES, p], capture_output=True, text=True,
                                 cwd=os.path.dirname(p) or "/", env=env, check=True)
            runs[p].append(json.loads(out.stdout.strip().splitlines()[-1]))
    old, new = (runs[p] for p in trees)
    print(f"{'case':32s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}  "
          f"(min over {args.rounds} alternating rounds, 1 thread)")
    for k in old[0]:
        a, b = min(x[k] for x in old), min(x[k] for x in new)
        print(f"{k:32s} {a:9.3f} {b:9.3f} {b / a:8.3f}")


if __name__ == "__main__":
    main()
