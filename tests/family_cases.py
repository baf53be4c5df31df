"""The bit-for-bit cases of the SIMD kernel families (avx2, avx512, avx512emu,
neon): matmul, softmax and attention on inputs built from integers, so the
same bits arise on every machine and NumPy version, and a SHA-256 of each
result. Every SIMD family must give the hashes in data/simd_hashes.json:
the kernel contract (csrc/README.md) fixes each element's arithmetic (KC
panels in order, one FMA per term, 60-key tiles, the shared vector exp, the
8-float / 4-double softmax pieces), not the tile shapes or the vector width.

Only shapes whose arithmetic avoids the C library's exp are here (the
generic family and the decode path use it, and libm's last bits may differ
between machines): no NaN rows, no L <= 8.

    python tests/family_cases.py --write    # record the hashes (x86 with AVX2)
"""
import hashlib
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
HASHES = os.path.join(HERE, "data", "simd_hashes.json")


def det(shape, seed, dtype):
    """Values in [-2, 2) with 24 significant bits (exact in float32), from a
    64-bit integer hash of the element index: the same on every machine."""
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    x = (z >> np.uint64(40)).astype(np.float64) / 2.0**24 * 4.0 - 2.0
    return x.reshape(shape).astype(dtype)


def cases():
    """(name, thunk) pairs; each thunk returns an ndarray."""
    import pyattn
    from pyattn import _C
    out = []
    for dt in (np.float32, np.float64):
        t = np.dtype(dt).name
        a, b = det((131, 600), 1, dt), det((600, 77), 2, dt)
        out.append((f"matmul_{t}", lambda a=a, b=b: pyattn.matmul(a, b)))
        out.append((f"matmul_T_{t}", lambda a=a, b=b: pyattn.matmul(b.T, a.T)))
        bb = det((3, 40, 70), 3, dt)
        out.append((f"matmul_batch_{t}", lambda x=bb, y=det((70, 50), 4, dt): pyattn.matmul(x, y)))
        x = det((7, 300), 5, dt) * 3
        m = det((7, 300), 6, np.float64) > -1.5
        out.append((f"softmax_{t}", lambda x=x: pyattn.softmax(x)))
        out.append((f"softmax_mask_{t}", lambda x=x, m=m: pyattn.softmax(x, attn_mask=m)))
        out.append((f"softmax_causal_{t}", lambda x=x: pyattn.softmax(x[:, :9], is_causal=True)))
        out.append((f"softmax_strided_{t}", lambda x=x: pyattn.softmax(x[:, ::3])))
        for L, S, E in [(150, 170, 40), (97, 300, 64), (300, 61, 128), (200, 200, 16), (64, 5000, 64)]:
            q, k = det((2, L, E), 7, dt), det((2, S, E), 8, dt)
            v = det((2, S, E + 3), 9, dt)
            for c in (False, True, "bottom_right"):
                out.append((f"sdpa_{L}x{S}x{E}_{c}_{t}",
                            lambda q=q, k=k, v=v, c=c: pyattn.scaled_dot_product_attention(q, k, v, is_causal=c)))
        q, k, v = det((2, 70, 32), 10, dt), det((2, 90, 32), 11, dt), det((2, 90, 24), 12, dt)
        bm = det((70, 90), 13, np.float64) > -1.0
        am = det((70, 90), 14, dt)
        out.append((f"sdpa_boolmask_{t}",
                    lambda q=q, k=k, v=v, m=bm: pyattn.scaled_dot_product_attention(q, k, v, attn_mask=m)))
        out.append((f"sdpa_addmask_{t}",
                    lambda q=q, k=k, v=v, m=am: pyattn.scaled_dot_product_attention(q, k, v, attn_mask=m)))
        out.append((f"sdpa_T_{t}",
                    lambda q=q, k=k, v=v: pyattn.scaled_dot_product_attention(
                        q.swapaxes(-1, -2).copy().swapaxes(-1, -2), k[:, ::-1], v[..., ::2])))
        out.append((f"sdpa_dropout_{t}",
                    lambda q=q, k=k, v=v: _C.sdpa(q, k, v, None, None, 1, 0.25, 0.3, 12345)[0]))
    return out


def digest(a):
    a = np.ascontiguousarray(a)
    return hashlib.sha256(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()).hexdigest()


def compute():
    return {name: digest(fn()) for name, fn in cases()}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    from pyattn import _C
    if _C.select_isa(1) != 1:
        sys.exit("recording needs the avx2 family (an x86-64 CPU with AVX2+FMA)")
    os.makedirs(os.path.dirname(HASHES), exist_ok=True)
    with open(HASHES, "w") as f:
        json.dump(compute(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {HASHES}")
