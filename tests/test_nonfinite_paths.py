"""Reliability v3 (issue 28): no silent wrong answer on any path.

Section "frame": NaN and +-inf reach exactly the results whose *visible*
inputs hold them, on every path of the C frame -- the tiled flash forward,
the decode rows, the split decode (S >= 4096) with its chunk merge,
precision="bf16", the exact path (weights, head dims > 512), the KV-cache
decode and merge_attention. A value nobody may see (hidden by the causal
rule, a bool or -inf float mask, a window, the unfilled part of a cache, or
dropped) does not matter: a key of weight exactly 0 contributes nothing,
not even 0 * NaN. pyattn._reference is the oracle; CI runs this file once
per kernel family (PYATTN_ISA) and under the sanitizers.
"""
import itertools

import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from pyattn._checks import dropout_key
from conftest import check, mag_attention

# ---------------------------------------------------------------- section "frame"

# (L, S, E, Ev, kwargs) of each path; "bf16kvp": several query blocks (K, V
# packed once per head); "split*": L <= 8 with S >= 4096 (key chunks, merged)
PATHS = {
    "tiled": (20, 130, 16, 8, {}),
    "rows": (3, 130, 16, 8, {}),
    "split": (2, 4100, 8, 4, {}),
    "weights": (5, 70, 8, 4, {"return_weights": True}),
    "exact_E513": (3, 70, 513, 4, {}),
    "tiled_f16": (20, 130, 16, 8, {"storage": np.float16}),
    "split_f16": (3, 4100, 8, 8, {"storage": np.float16}),
    "bf16": (20, 130, 16, 8, {"precision": "bf16"}),
    "bf16_rows": (3, 130, 16, 8, {"precision": "bf16"}),
    "bf16kvp": (100, 130, 16, 8, {"precision": "bf16"}),
}
HIDE = ["causal", "bottom_right", "bool", "window", "float_ninf", "none"]
PLACE = ["q", "k_last", "v_last", "k_mid", "v_mid", "mask"]


def _hiding(rng, hide, L, S, dt):
    if hide == "causal":
        return {"is_causal": True}
    if hide == "bottom_right":
        return {"is_causal": "bottom_right"}
    if hide == "bool":
        return {"attn_mask": rng.random((L, S)) > 0.4}
    if hide == "window":
        return {"window": (7, 3)}
    if hide == "float_ninf":
        return {"attn_mask": np.where(rng.random((L, S)) > 0.4, 0.0, -np.inf).astype(dt)}
    return {}


def _place(q, k, v, kw, place, val, dt):
    """Put val at one element of q, k, v or a float mask (made if needed)."""
    L, S = q.shape[-2], k.shape[-2]
    if place == "mask":
        m = kw.pop("attn_mask", None)
        if m is None:
            m = np.zeros((L, S), dt)
        elif m.dtype == bool:
            m = np.where(m, 0.0, -np.inf).astype(dt)
        m = m.copy()
        m[L // 2, S - 2] = val
        kw["attn_mask"] = m
    elif place == "q":
        q[..., L // 2, q.shape[-1] // 2] = val
    else:
        j = S - 1 if place.endswith("last") else S // 2
        (k if place[0] == "k" else v)[..., j, 0] = val


def _same_nonfinite(got, want, what):
    for f in (np.isnan, np.isposinf, np.isneginf):
        a, b = f(got), f(want)
        assert np.array_equal(a, b), (
            f"{what}: {f.__name__} at {np.argwhere(a & ~b)[:4].tolist()} (not the reference's), "
            f"missing at {np.argwhere(b & ~a)[:4].tolist()}")


def _clean(x):
    return None if x is None else np.where(np.isfinite(x), x, 0).astype(x.dtype)


@pytest.mark.parametrize("path", list(PATHS))
def test_nonfinite_reaches_exactly_the_rows_that_see_it(rng, path):
    """Every path x how keys are hidden x where the NaN / inf sits: NaN and
    inf positions of out and lse are the reference's, finite values within
    the tolerance (f32/f64 paths: against the reference; bf16: bit for bit
    the same call with the non-finite value replaced by 0, except where the
    reference is non-finite -- so a hidden value cannot matter at all)."""
    L, S, E, Ev, kw0 = PATHS[path]
    kw0 = dict(kw0)
    storage = kw0.pop("storage", None)
    bf16 = kw0.get("precision") == "bf16"
    dts = [np.float32] if (bf16 or storage) else [np.float32, np.float64]
    for hide, place, val, dt in itertools.product(HIDE, PLACE, [np.nan, np.inf, -np.inf], dts):
        if path == "exact_E513" and (val != np.nan or place in ("k_mid", "v_mid")):
            continue                                   # the big head dim: a cheaper subset
        q = rng.standard_normal((L, E)).astype(dt)
        k = rng.standard_normal((S, E)).astype(dt)
        v = rng.standard_normal((S, Ev)).astype(dt)
        kw = dict(kw0, **_hiding(rng, hide, L, S, dt))
        _place(q, k, v, kw, place, val, dt)
        ks, vs = (k.astype(storage), v.astype(storage)) if storage else (k, v)
        tag = f"{path} {hide} {place}={val} {np.dtype(dt).name}"
        got = pyattn.scaled_dot_product_attention(q, ks, vs, return_lse=True, **kw)
        with np.errstate(all="ignore"):
            want = R.scaled_dot_product_attention(q, ks, vs, return_lse=True, **kw)
        o, lse, wo, wlse = got[0], got[-1], want[0], want[-1]
        _same_nonfinite(o, wo, tag + " out")
        _same_nonfinite(lse, wlse, tag + " lse")
        if kw.get("return_weights"):
            _same_nonfinite(got[1], want[1], tag + " weights")
        fin = np.isfinite(wo)
        if bf16:
            ck = dict(kw)
            if "attn_mask" in ck and ck["attn_mask"].dtype != bool:
                ck["attn_mask"] = np.where(np.isnan(ck["attn_mask"]) | np.isposinf(ck["attn_mask"]),
                                           0, ck["attn_mask"]).astype(dt)
            clean = pyattn.scaled_dot_product_attention(_clean(q), _clean(ks), _clean(vs), **ck)
            # the rows that see the value: those a NaN there makes NaN
            qn, kn, vn, kwn = q.copy(), k.copy(), v.copy(), dict(kw)
            _place(qn, kn, vn, kwn, place, np.nan, dt)
            with np.errstate(all="ignore"):
                sees = np.isnan(R.scaled_dot_product_attention(qn, kn, vn, **kwn)).any(-1)
            assert np.array_equal(o[~sees], clean[~sees]), tag + ": a value changed rows that do not see it"
        else:
            qc, kc, vc = _clean(q), _clean(k), _clean(v)
            mk = {n: x for n, x in kw.items() if n != "return_weights"}
            if "attn_mask" in mk and mk["attn_mask"].dtype != bool:
                mk["attn_mask"] = np.where(np.isfinite(mk["attn_mask"]), mk["attn_mask"], -np.inf)
            w = R.scaled_dot_product_attention(qc, kc, vc, return_weights=True, **mk)[1]
            mag = mag_attention(qc, kc, vc, w, 1 / np.sqrt(E))
            check(np.where(fin, o, 0), np.where(fin, wo, 0), mag)


@pytest.mark.parametrize("S", [4000, 4096, 6000])
def test_split_decode_keeps_a_nan_query_row_nan(rng, S):
    """Bug 2: L <= 8 with S >= 4096 keys splits them into chunks; a NaN query
    row gave 0 and lse -inf there (the merge's `mc > m` skipped it) where S =
    4000 gives NaN. Also a row whose only admissible keys, in one chunk, have
    NaN scores; and the KV-cache decode over such a cache."""
    for dt in (np.float32, np.float64):
        q = rng.standard_normal((2, 3, 16)).astype(dt)
        k = rng.standard_normal((2, S, 16)).astype(dt)
        v = rng.standard_normal((2, S, 8)).astype(dt)
        q[1, 1, 5] = np.nan
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
        assert np.isnan(o[1, 1]).all() and np.isnan(lse[1, 1])
        nan = np.zeros(o.shape, bool)
        nan[1, 1] = True
        assert not np.isnan(o[~nan]).any() and np.isfinite(np.delete(lse.ravel(), 4)).all()
        want, wlse = R.scaled_dot_product_attention(q, k, v, return_lse=True)
        qc = np.where(np.isnan(q), 0, q)
        check(np.where(nan, 0, o), np.where(nan, 0, want),
              mag_attention(qc, k, v, R.scaled_dot_product_attention(qc, k, v, return_weights=True)[1],
                            0.25))
        # row 0 sees only key S - 10 (in the last chunk), whose key holds NaN
        mask = np.zeros((3, S), bool)
        mask[0, S - 10] = True
        mask[1:] = True
        k2 = k.copy()
        k2[:, S - 10, 0] = np.nan
        o, lse = pyattn.scaled_dot_product_attention(q[0], k2[0], v[0], attn_mask=mask, return_lse=True)
        wo, wl = R.scaled_dot_product_attention(q[0], k2[0], v[0], attn_mask=mask, return_lse=True)
        _same_nonfinite(o, wo, "mask out")
        _same_nonfinite(lse, wl, "mask lse")
        assert np.isnan(o[0]).all() and np.isnan(o[1:]).all()   # rows 1, 2 see key S - 10 too
    # the KV-cache decode (T = 1) over a long cache
    kc = rng.standard_normal((2, 2, S + 7, 16)).astype(np.float32)
    vc = rng.standard_normal((2, 2, S + 7, 8)).astype(np.float32)
    q = rng.standard_normal((2, 4, 1, 16)).astype(np.float32)
    q[0, 3, 0, 2] = np.nan
    o, lse = pyattn.attention_with_kvcache(q, kc, vc, cache_seqlens=S, return_lse=True)
    nan = np.isnan(o).any(-1)
    assert nan[0, 3, 0] and nan.sum() == 1 and np.isnan(lse[0, 3, 0]) and np.isnan(lse).sum() == 1


@pytest.mark.parametrize("L, hide", [(6, "causal"), (6, "bool"), (6, "window"), (20, "causal"),
                                     (130, "causal"), (130, "bool"), (3, "dropout")])
@pytest.mark.parametrize("val", [np.nan, np.inf])
def test_bf16_hidden_value_rows_do_not_spread(rng, L, hide, val):
    """Bug 3: precision="bf16" multiplied weights of 0 with hidden value rows
    (0 * NaN in the bfloat16 products): causal L = S = 6 with v[5] = NaN gave
    6 of 6 rows NaN (the float32 path: row 5 only). Rows that do not see the
    value are the same bits as with a finite value there."""
    S = L if hide != "dropout" else 90
    q = rng.standard_normal((2, L, 16)).astype(np.float32)
    k = rng.standard_normal((2, S, 16)).astype(np.float32)
    v = rng.standard_normal((2, S, 8)).astype(np.float32)
    kw = {"causal": {"is_causal": True}, "window": {"window": (2, 0)},
          "bool": {"attn_mask": np.tril(np.ones((L, S), bool)) & (rng.random((L, S)) > 0.3)},
          "dropout": {"dropout_p": 0.5, "rng": 7}}[hide]
    if hide == "bool":
        kw["attn_mask"][-1, -1] = True
    if hide == "dropout":                       # a key row 0 sees, dropped for row 0
        keep = R.dropout_keep(dropout_key(7), (2, L, S), 0.5)
        j = int(np.argmin(keep[1, 0]))
        assert not keep[1, 0, j]
    else:
        j = S - 1                               # seen by the last row only
    vn = v.copy()
    vn[1, j, 3] = val
    got = pyattn.scaled_dot_product_attention(q, k, vn, precision="bf16", **kw)
    clean = pyattn.scaled_dot_product_attention(q, k, v, precision="bf16", **kw)
    rk = {n: x for n, x in kw.items() if n != "rng"}
    if hide == "dropout":
        rk["dropout_key"] = dropout_key(7)
    with np.errstate(all="ignore"):
        want = R.scaled_dot_product_attention(q, k, vn, precision="bf16", **rk)
    _same_nonfinite(got, want, "out")
    fin = np.isfinite(want)
    assert np.array_equal(got[fin], clean[fin])
    if hide != "dropout":
        assert not np.isfinite(got[1, -1, 3])    # the row that sees it
        assert np.isfinite(got[1, :-1]).all()
    else:
        assert np.isfinite(got[1, 0]).all()


def test_bf16_head_dim_zero_is_initialised(rng):
    """Bug 5: precision="bf16" with E = 0 read uninitialised memory (the pad
    pair of each packed key was never written): 4 of 12 identical calls gave
    lse NaN. Zero scores: uniform weights, lse = log(S), as the float32 path."""
    for S, L in [(61, 3), (61, 130), (1, 1), (200, 9)]:
        q = np.ones((2, L, 0), np.float32)
        k = np.ones((2, S, 0), np.float32)
        v = rng.standard_normal((2, S, 5)).astype(np.float32)
        ref_o, ref_l = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
        first = None
        for _ in range(6):
            # E = 2 with NaN keys first: the same workspace sizes, left holding NaN
            # bits for the allocator to hand out again
            pyattn.scaled_dot_product_attention(np.ones((2, L, 2), np.float32), np.full((2, S, 2), np.nan, np.float32),
                                                v, precision="bf16")
            o, lse = pyattn.scaled_dot_product_attention(q, k, v, precision="bf16", return_lse=True)
            assert np.array_equal(lse, ref_l) and np.allclose(lse, np.log(S), rtol=1e-6, atol=0)
            if first is None:
                first = o
            assert np.array_equal(o, first)
        want = R.scaled_dot_product_attention(q, k, v, precision="bf16")
        check(first, want, mag_attention(q, k, R.round_bf16(v), np.full((L, S), 1.0 / S), 1.0))
        assert np.allclose(first, ref_o, rtol=2 ** -7, atol=2 ** -7 * np.abs(v).max())
        o = pyattn.attention_with_kvcache(q[None, :, -1:], k[None], v[None], cache_seqlens=S,
                                          precision="bf16")
        assert np.isfinite(o).all()


# the KV cache: the unfilled part (garbage of np.empty, here NaN / inf)
# never matters -- the same bits as a cache of zeros there
@pytest.mark.parametrize("T, Smax", [(1, 300), (1, 4300), (5, 4300), (100, 300)])
@pytest.mark.parametrize("cdt", ["float32", "float64", "float16", "bfloat16"])
def test_kvcache_unfilled_part_never_matters(rng, T, Smax, cdt):
    if cdt == "bfloat16":
        ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes (bfloat16 arrays) is not installed")
        dtype = np.dtype(ml.bfloat16)
    else:
        dtype = np.dtype(cdt)
    B, Hq, Hk = 2, 4, 2
    lens = np.array([Smax // 2 - 7, Smax - T - 3 if T < Smax // 2 else 50])
    qdt = np.float64 if dtype == np.float64 else np.float32
    precs = [None] if dtype == np.float64 else [None, "bf16"]
    for garbage, new, prec in itertools.product([np.nan, np.inf], [False, True], precs):
        kz = np.zeros((B, Hk, Smax, 8), dtype)
        vz = np.zeros((B, Hk, Smax, 4), dtype)
        for b in range(B):
            kz[b, :, :lens[b]] = rng.standard_normal((Hk, lens[b], 8))
            vz[b, :, :lens[b]] = rng.standard_normal((Hk, lens[b], 4))
        kg, vg = kz.copy(), vz.copy()
        for b in range(B):
            kg[b, :, lens[b]:] = garbage
            vg[b, :, lens[b]:] = garbage
        q = rng.standard_normal((B, Hq, T, 8)).astype(qdt)
        kn = vn = None
        if new:
            kn = rng.standard_normal((B, Hk, T, 8)).astype(qdt)
            vn = rng.standard_normal((B, Hk, T, 4)).astype(qdt)
        o, lse = pyattn.attention_with_kvcache(q, kg, vg, kn, vn, cache_seqlens=lens, return_lse=True,
                                               precision=prec)
        oz, lz = pyattn.attention_with_kvcache(q, kz, vz, kn, vn, cache_seqlens=lens, return_lse=True,
                                               precision=prec)
        assert np.isfinite(o).all() and np.isfinite(lse).all(), (garbage, new, prec)
        assert np.array_equal(o, oz) and np.array_equal(lse, lz), (garbage, new, prec)
        # a NaN the rows do see: only the query heads of that cache head
        if not new:
            kg[0, 1, 3, 1] = np.nan
            o = pyattn.attention_with_kvcache(q, kg, vg, cache_seqlens=lens, precision=prec)
            nan = np.isnan(o).any(-1)
            assert nan[0, 2:].all() and nan.sum() == 2 * T, (garbage, prec)


@pytest.mark.parametrize("opt", ["gqa", "sinks", "softcap", "alibi", "dropout"])
@pytest.mark.parametrize("L, S", [(3, 130), (20, 130), (2, 4200)])
def test_nonfinite_rule_with_options(rng, opt, L, S):
    """GQA (rows of a key/value head stacked), sinks, softcap, ALiBi and
    dropout on the tiled, rows and split paths, float32 and bf16."""
    for place, val, prec in itertools.product(["q", "k_last", "v_last", "v_mid"], [np.nan, np.inf],
                                              [None, "bf16"]):
        H, Hk = 4, (2 if opt == "gqa" else 4)
        q = rng.standard_normal((H, L, 8)).astype(np.float32)
        k = rng.standard_normal((Hk, S, 8)).astype(np.float32)
        v = rng.standard_normal((Hk, S, 4)).astype(np.float32)
        if place == "q":
            q[1, L // 2, 3] = val
        else:
            j = S - 1 if place.endswith("last") else S // 2
            (k if place[0] == "k" else v)[1, j, 0] = val
        kw = {"is_causal": "bottom_right" if L < S else True}
        rk = {}
        if opt == "gqa":
            kw["enable_gqa"] = True
        elif opt == "sinks":
            kw["sinks"] = np.array([0.5, -1, 2, 0], np.float32)
        elif opt == "softcap":
            kw["softcap"] = 2.0
        elif opt == "alibi":
            kw["alibi_slopes"] = np.array([0.1, 0.2, 0.3, 0.4])
        o, lse = pyattn.scaled_dot_product_attention(
            q, k, v, return_lse=True, precision=prec, **kw,
            **({"dropout_p": 0.3, "rng": 5} if opt == "dropout" else {}))
        if opt == "dropout":
            rk = {"dropout_p": 0.3, "dropout_key": dropout_key(5)}
        with np.errstate(all="ignore"):
            wo, wl = R.scaled_dot_product_attention(q, k, v, return_lse=True, precision=prec, **kw, **rk)
        tag = f"{opt} {place}={val} {prec}"
        _same_nonfinite(o, wo, tag + " out")
        _same_nonfinite(lse, wl, tag + " lse")
        fin = np.isfinite(wo)
        assert np.allclose(o[fin], wo[fin], rtol=0, atol=(3e-2 if prec else 1e-4) * np.abs(_clean(v)).max()), tag


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_merge_attention_nonfinite(rng, dt):
    """merge_attention against the reference: NaN in an lse spreads to its
    row, NaN in a part of lse -inf does not, +inf lse gives lse +inf."""
    cases = ["lse_nan", "out_nan_lse_ninf", "out_nan", "lse_inf", "all_ninf", "ninf_and_nan"]
    for case in cases:
        outs = [rng.standard_normal((2, 5, 4)).astype(dt) for _ in range(3)]
        lses = [rng.standard_normal((2, 5)).astype(dt) for _ in range(3)]
        if case == "lse_nan":
            lses[1][0, 2] = np.nan
        elif case == "out_nan_lse_ninf":
            outs[1][0, 2, 1] = np.nan
            lses[1][0, 2] = -np.inf
        elif case == "out_nan":
            outs[2][1, 3, 0] = np.nan
        elif case == "lse_inf":
            lses[0][1, 1] = np.inf
        elif case == "all_ninf":
            for x in lses:
                x[0, 0] = -np.inf
        else:
            lses[0][0, 0] = lses[1][0, 0] = -np.inf
            lses[2][0, 0] = np.nan
        o, lse = pyattn.merge_attention(outs, lses)
        with np.errstate(all="ignore"):
            wo, wl = R.merge_attention(outs, lses)
        _same_nonfinite(o, wo, case + " out")
        _same_nonfinite(lse, wl, case + " lse")
        fin = np.isfinite(wo)
        assert np.allclose(o[fin], wo[fin], rtol=1e-5, atol=1e-6), case


@pytest.mark.parametrize("opt", ["plain_causal", "bool", "window", "softcap", "gqa", "dropout", "sinks"])
@pytest.mark.parametrize("L, S", [(6, 6), (20, 130), (70, 200)])
def test_backward_nonfinite_reaches_exactly_what_sees_it(rng, opt, L, S):
    """The backward: a weight (or dS) of 0 passes nothing back, not even
    0 * NaN -- gradients of rows and keys that do not see a NaN / inf stay
    finite (the GEMMs of dQ += dS K, dK += dS^T Q, dV += P^T dO spread NaN
    of hidden keys and of NaN query rows before), and NaN rows give NaN
    exactly where they see keys. Against the reference backward."""
    for place, val, dt in itertools.product(["q", "k_last", "v_last", "k_mid", "v_mid", "grad_out"],
                                            [np.nan, np.inf], [np.float32, np.float64]):
        H, Hk = 4, (2 if opt == "gqa" else 4)
        q = rng.standard_normal((H, L, 8)).astype(dt)
        k = rng.standard_normal((Hk, S, 8)).astype(dt)
        v = rng.standard_normal((Hk, S, 4)).astype(dt)
        kw, ex, rk = {"is_causal": True}, {}, {}
        if opt == "bool":
            kw = {"attn_mask": rng.random((L, S)) > 0.5}
        elif opt == "window":
            kw = {"window": (2, 1)}
        elif opt == "softcap":
            kw["softcap"] = 1.5
        elif opt == "gqa":
            kw["enable_gqa"] = True
        elif opt == "sinks":
            kw["sinks"] = np.array([0.5, -1, 2, 0], dt)
        elif opt == "dropout":
            ex = {"dropout_p": 0.3, "rng": 9}
            rk = {"dropout_p": 0.3, "dropout_key": dropout_key(9)}
        if place == "q":
            q[1, L // 2, 3] = val
        elif place != "grad_out":
            j = S - 1 if place.endswith("last") else S // 2
            (k if place[0] == "k" else v)[1, j, 0] = val
        o, lse = pyattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw, **ex)
        go = rng.standard_normal(o.shape).astype(dt)
        if place == "grad_out":
            go[1, L // 2, 1] = val
        got = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, **kw, **ex)
        with np.errstate(all="ignore"):
            want = R.scaled_dot_product_attention_backward(go, q, k, v, **kw, **rk)
        tol = 2e-3 if dt == np.float32 else 1e-9
        for name, a, b in zip(["dq", "dk", "dv", "dsinks"], got, want):
            tag = f"{opt} {place}={val} {np.dtype(dt).name} {name}"
            _same_nonfinite(a, b, tag)
            fin = np.isfinite(b)
            assert np.allclose(a[fin], b[fin], rtol=tol, atol=tol), tag
        # the rows of dq that see nothing non-finite are finite (the rule, stated
        # without the reference): rows whose output is finite, in the plain case
        if place in ("k_last", "k_mid", "v_last", "v_mid") and opt == "plain_causal":
            fin_rows = np.isfinite(o).all(-1)
            assert np.isfinite(got[0][fin_rows]).all(), f"{place}={val}: dq of rows that do not see it"


def test_nonfinite_results_do_not_depend_on_the_thread_count(rng):
    """The redone rows (bf16), the split merge's exact rows and the
    backward's added terms: the same bits on 1, 2 and 3 threads."""
    q = rng.standard_normal((3, 130, 16)).astype(np.float32)
    k = rng.standard_normal((3, 130, 16)).astype(np.float32)
    v = rng.standard_normal((3, 130, 8)).astype(np.float32)
    v[1, 100, 2] = np.nan
    q[2, 7, 0] = np.inf
    qd = rng.standard_normal((4, 2, 16)).astype(np.float32)
    kd = rng.standard_normal((4, 5000, 16)).astype(np.float32)
    qd[1, 1, 3] = np.nan
    go = rng.standard_normal((3, 130, 8)).astype(np.float32)
    n0 = pyattn.get_num_threads()
    res = []
    try:
        for nt in (1, 2, 3):
            pyattn.set_num_threads(nt)
            o16 = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, precision="bf16")
            od = pyattn.scaled_dot_product_attention(qd, kd, kd, return_lse=True)
            o, lse = pyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
            g = pyattn.scaled_dot_product_attention_backward(go, q, k, v, o, lse, is_causal=True)
            res.append((o16,) + od + (o, lse) + g)
    finally:
        pyattn.set_num_threads(n0)
    for r in res[1:]:
        for a, b in zip(res[0], r):
            assert np.array_equal(a, b, equal_nan=True)
    assert np.isnan(res[0][0][1, 100:]).any() and not np.isnan(res[0][0][1, :100]).any()
