"""The bit-for-bit cases of the SIMD kernel families (avx2, avx512, avx512emu,
neon): matmul, softmax and attention on inputs built from integers, so the
same bits arise on every machine and NumPy version, and a SHA-256 of each
result. Every SIMD family must give the hashes in data/simd_hashes.json:
the kernel contract (csrc/README.md) fixes each element's arithmetic (KC
panels in order, one FMA per term, 60-key tiles, the shared vector exp, the
8-float / 4-double softmax pieces), not the tile shapes or the vector width.

Only shapes whose arithmetic avoids the C library's exp, tanh and log are
here (the generic family, the merge of split decode chunks, softcap, sinks
and the log-sum-exp use them, and libm's last bits may differ between
machines): no NaN rows, no decode over S >= 4096 keys.

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
        # the decode kernels (rows path): one and several queries, GQA heads stacked
        # as rows, E with a tail (40), a window, strided keys
        for L, S, E, Hq, Hkv in [(1, 3000, 64, 4, 4), (4, 1000, 40, 2, 2), (1, 2500, 128, 8, 2),
                                 (3, 700, 24, 6, 1)]:
            q = det((2, Hq, L, E), 15, dt)
            k, v = det((2, Hkv, S, E), 16, dt), det((2, Hkv, S, E + 5), 17, dt)
            out.append((f"decode_{L}x{S}x{E}_{Hq}/{Hkv}_{t}",
                        lambda q=q, k=k, v=v: pyattn.scaled_dot_product_attention(
                            q, k, v, is_causal="bottom_right", enable_gqa=True)))
            out.append((f"decode_window_{L}x{S}x{E}_{Hq}/{Hkv}_{t}",
                        lambda q=q, k=k, v=v: pyattn.scaled_dot_product_attention(
                            q, k[..., ::-1, :], v, is_causal="bottom_right", enable_gqa=True, window=(333, 0))))
        # structured masks on the tiled path: a window with ALiBi
        q, k, v = det((2, 3, 150, 32), 18, dt), det((2, 3, 170, 32), 19, dt), det((2, 3, 170, 16), 20, dt)
        out.append((f"sdpa_window_alibi_{t}",
                    lambda q=q, k=k, v=v: pyattn.scaled_dot_product_attention(
                        q, k, v, is_causal=True, window=(40, 0), alibi_slopes=np.array([0.5, 0.25, 0.125]))))
        # the backward on the tiled frame: a fixed lse (integers: no libm log in the
        # path), plain, causal, window + ALiBi, softcap, dropout, a bool mask, GQA
        # (sinks excluded: their gradient uses the C library's exp)
        q, k, v = det((2, 4, 130, 24), 25, dt), det((2, 2, 150, 24), 26, dt), det((2, 2, 150, 20), 27, dt)
        o, go = det((2, 4, 130, 20), 28, dt), det((2, 4, 130, 20), 29, dt)
        lse = det((2, 4, 130), 30, dt) + 6
        bm = det((130, 150), 31, np.float64) > -1.5
        for nm, kw in [("plain", {}), ("causal", {"is_causal": True}),
                       ("window_alibi", {"is_causal": "bottom_right", "window": (50, 0),
                                         "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625])}),
                       ("softcap", {"softcap": 3.0}), ("dropout", {"dropout_p": 0.25, "rng": 77}),
                       ("boolmask", {"attn_mask": bm})]:
            out.append((f"backward_{nm}_{t}",
                        lambda q=q, k=k, v=v, o=o, go=go, lse=lse, kw=kw: np.concatenate([
                            g.ravel() for g in pyattn.scaled_dot_product_attention_backward(
                                go, q, k, v, o, lse, enable_gqa=True, **kw)])))
    # bfloat16 products (precision="bf16"): the emulation where the family has no
    # AVX512_BF16, the instruction where it has: the same bits
    a, b = det((131, 1100), 32, np.float32), det((1100, 77), 33, np.float32)
    out.append(("matmul_bf16", lambda a=a, b=b: pyattn.matmul(a, b, precision="bf16")))
    out.append(("matmul_bf16_T", lambda a=a, b=b: pyattn.matmul(b.T, a.T[:, ::-1] * 1e-30, precision="bf16")))
    # 16-bit storage (float32 arithmetic): decode and tiled, a 16-bit KV cache
    q, k, v = det((2, 4, 1, 64), 21, np.float32), det((2, 2, 2000, 64), 22, np.float16), det((2, 2, 2000, 64), 23, np.float16)
    out.append(("decode_float16_cache", lambda q=q, k=k, v=v: pyattn.attention_with_kvcache(
        q, k, v, cache_seqlens=[1999, 1500])))
    q16 = det((2, 100, 48), 24, np.float16)
    out.append(("sdpa_float16", lambda q=q16: pyattn.scaled_dot_product_attention(q, q, q, is_causal=True)))
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
