"""Property tests across the product of features (issue "Reliability v3",
item 4): storage dtype {float32, float64, float16, bfloat16} x entry point
{scaled_dot_product_attention, its backward, its vjp, attention_with_kvcache,
KVCache, merge_attention, pyattn.dask} x NaN/+-inf placement {none, a visible
key/value row, a hidden row (causal, bool mask, window, unfilled cache), the
query} x precision {"highest", "bf16"} x path {tiled (L > 8), decode rows
(L <= 8), split decode (L <= 8, S >= 4096)}.

Each example is checked three ways:
- against pyattn._reference (the float64 oracle) on the inputs as the
  kernels read them (16-bit storage widened, exactly), with the project's
  tolerance table (conftest.TOL x the mag_* error scales; precision="bf16"
  with test_bf16's rounding model bf16_attention_mag);
- against the same call on float64 inputs (float32 tolerance), and for
  16-bit storage bit for bit against the call on the widened float32 inputs
  (test_storage16's rule: widening is exact);
- NaN lands in exactly the rows (elements) whose *visible* inputs hold it,
  computed here from the admissibility rule of API.md (causal, bool mask,
  window, cache length), independently of the oracle: a NaN in q[i] or in a
  key row query i may see makes row i (out and lse) NaN; a NaN in value
  element v[j, e] makes out[i, e] NaN for the rows i that see j; nothing
  else. Values in the other rows are compared with the oracle run on the
  inputs with their NaNs replaced by 0 (hidden rows cannot matter).
  An inf is checked against the oracle on the inputs as given (NaN and inf
  in the same places), and the rows that cannot see it must stay finite.
The hypothesis profile is bounded and derandomized (reproducible in CI).
"""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import pyattn  # noqa: E402
from pyattn import _reference as R  # noqa: E402
from conftest import TOL, check, mag_attention  # noqa: E402
from test_backward import grad_mags  # noqa: E402
from test_bf16 import bf16_attention_mag  # noqa: E402

try:                              # bfloat16 needs the optional ml_dtypes
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except Exception:
    BF16 = None

STORAGE = ["float32", "float64", "float16"] + (["bfloat16"] if BF16 is not None else [])
DT = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64), "float16": np.dtype(np.float16),
      "bfloat16": BF16}
PATHS = ["tiled", "rows", "split"]
PLACES = ["none", "visible", "hidden", "query"]
HUGE = 2**63 - 1                  # a window size that means "unbounded" (no overflow allowed)


def profile(n):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


storage = st.sampled_from(STORAGE)
paths = st.sampled_from(PATHS)
places = st.sampled_from(PLACES)
poisons = st.sampled_from([np.nan, np.nan, np.inf, -np.inf])
seeds = st.integers(0, 2**32 - 1)


# -- shapes, options, admissibility ------------------------------------------------------

def sizes(rng, path):
    """(B, Hkv, groups, L, S, E, Ev) for a path: tiled L > 8; decode rows L <= 8,
    S < 4096; split decode L <= 8, S >= 4096 (few heads, small head dims)."""
    if path == "split":
        return (1, 1, int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(4096, 4400)),
                int(rng.choice([0, 1, 4, 8])), int(rng.choice([1, 3, 8])))
    L = int(rng.integers(9, 70)) if path == "tiled" else int(rng.integers(1, 9))
    S = int(rng.integers(1, 150))
    E = int(rng.choice([0, 1, 3, 8, 16, 24, 33], p=[.05, .1, .15, .2, .2, .15, .15]))
    return int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(1, 3)), L, S, E, \
        int(rng.choice([1, 3, 8, 16]))


def window_opt(rng):
    if rng.random() < 0.4:
        return None
    side = [None, 0, 3, 40, HUGE]
    return (side[rng.integers(5)], side[rng.integers(5)])


def ref_window(window):
    """The same window for the oracle: a size beyond any key distance is unbounded."""
    if window is None:
        return None
    return tuple(None if w is None or w >= 2**62 else w for w in window)


def admissible(L, S, causal, mask, window, qoff):
    """Bool (..., L, S), written here from API.md's rule (not the oracle's):
    query row i sits at position d(i) = i + qoff; key j is admissible when the
    bool mask allows it, j <= d(i) if causal, and d(i) - left <= j <= d(i) + right."""
    d = np.arange(L)[:, None] + np.asarray(qoff)[..., None, None]
    j = np.arange(S)
    ok = np.ones(d.shape[:-2] + (L, S), bool)
    if causal:
        ok &= j <= d
    if window is not None:
        left, right = window
        if left is not None:
            ok &= j >= d - min(left, 2**40)
        if right is not None:
            ok &= j <= d + min(right, 2**40)
    if mask is not None:
        ok = ok & mask
    return ok


def poison(rng, q, k, v, A, place, value):
    """Put `value` into q, k or v (float64 arrays, modified) per `place`:
    "visible": a key/value row some query may see; "hidden": a row some query
    (preferably every query) may not see; "query": a query row. A whole row
    or one element. A (B, H, L, S) is the admissibility, GQA-expanded."""
    if place == "none":
        return
    B, H, L, S = A.shape
    Hkv = k.shape[1]
    g = H // Hkv
    if place == "query":
        if q.shape[-1] == 0 or L == 0:
            return
        b, h, i = rng.integers(B), rng.integers(H), rng.integers(L)
        e = slice(None) if rng.random() < 0.3 else rng.integers(q.shape[-1])
        q[b, h, i, e] = value
        return
    Ag = A.reshape(B, Hkv, g, L, S)
    seen = Ag.any(axis=(2, 3))                         # (B, Hkv, S): some row sees it
    if place == "visible":
        cand = np.argwhere(seen)
    else:
        never = np.argwhere(~seen)
        cand = never if len(never) and rng.random() < 0.6 else np.argwhere(~Ag.all(axis=(2, 3)))
    if not len(cand):
        return
    b, h, j = cand[rng.integers(len(cand))]
    t = v if (k.shape[-1] == 0 or rng.random() < 0.5) else k
    e = slice(None) if rng.random() < 0.3 else rng.integers(t.shape[-1])
    t[b, h, j, e] = value


def nan_rows(A, q, k, v):
    """Expected NaN of out (B, H, L, Ev) and lse (B, H, L) from the NaNs in
    q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev): row i is NaN
    (out and lse) when q[i] or a key row it may see holds NaN, and a row with
    no admissible key is 0, never NaN; out[i, e] is NaN when a value row it
    may see holds NaN in element e."""
    g = A.shape[1] // k.shape[1]
    qn = np.isnan(q).any(-1)
    kn = np.repeat(np.isnan(k).any(-1), g, 1)
    vn = np.repeat(np.isnan(v), g, 1)
    st_ = (qn & A.any(-1)) | (A & kn[..., None, :]).any(-1)
    vt = np.matmul(A.astype(np.float64), vn.astype(np.float64)) > 0
    return st_[..., None] | vt, st_


def touched(A, q, k, v):
    """Rows (B, H, L) whose visible inputs hold a non-finite value."""
    g = A.shape[1] // k.shape[1]
    qn = ~np.isfinite(q).all(-1)
    kn = np.repeat(~np.isfinite(k).all(-1) | ~np.isfinite(v).all(-1), g, 1)
    return (qn & A.any(-1)) | (A & kn[..., None, :]).any(-1)


def clean(x):
    return np.where(np.isnan(x), 0.0, x)


def widen(x, dt):
    """Base float64 data as stored in dt, and what the kernels read (exact)."""
    s = x.astype(dt)
    cd = np.float64 if dt == np.float64 else np.float32
    return s, s.astype(cd)


def compare(got, want, mag, expect_nan, name):
    """got's NaN exactly where expect_nan says; elsewhere check() against want."""
    got = np.asarray(got)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    gn = np.isnan(got)
    assert np.array_equal(gn, expect_nan), (
        f"{name}: NaN in {np.argwhere(gn & ~expect_nan)[:4].tolist()} (not expected), "
        f"missing in {np.argwhere(~gn & expect_nan)[:4].tolist()}")
    fin = ~expect_nan
    check(got[fin], want[fin].astype(got.dtype), np.broadcast_to(mag, got.shape)[fin])


# -- the oracle ---------------------------------------------------------------------

def oracle(q, k, v, kw, precision, groups):
    """out, lse and their error scales from _reference on float inputs
    q (B, H, L, E), k/v (B, Hkv, S, E/Ev); kw: attn_mask, is_causal, window, qoff, kv_len."""
    kr, vr = np.repeat(k, groups, 1), np.repeat(v, groups, 1)
    E, S = q.shape[-1], k.shape[-2]
    sc = 1 / np.sqrt(E) if E else 1.0
    with np.errstate(all="ignore"):
        out, w, lse = R.scaled_dot_product_attention(
            q.astype(np.float64), kr.astype(np.float64), vr.astype(np.float64), scale=sc,
            return_weights=True, return_lse=True,
            precision=precision if precision == "bf16" else None, **kw)
        if precision == "bf16":
            mk = {n: x for n, x in kw.items() if n in ("attn_mask", "is_causal", "window")}
            if "qoff" in kw:         # a cache: bottom-right positions on the filled rows
                mk["is_causal"] = "bottom_right"
            mag = bf16_attention_mag(q.astype(np.float32), kr.astype(np.float32), vr.astype(np.float32), sc, mk)
        else:
            mag = mag_attention(q, kr, vr, w, sc)
    fin = np.abs(np.where(np.isfinite(lse), lse, 0))
    lmag = (4 + fin + np.log1p(S)) * np.sqrt(S + 1)
    if precision == "bf16":       # lse comes from the float32 scores (bfloat16 products)
        lmag = lmag * 4 * (E + 8)
    return out, lse, mag, lmag


def check_forward(out, lse, q, k, v, kw, precision, groups, A, ctype):
    no_lse = lse is None
    """out/lse of any forward entry point against the oracle and the NaN rule."""
    nan_out, nan_lse = nan_rows(A, q, k, v)
    poison_inf = np.isinf(q).any() or np.isinf(k).any() or np.isinf(v).any()
    assert out.dtype == ctype and (lse is None or lse.dtype == ctype)
    if lse is None:                    # an entry point without return_lse
        lse = np.zeros(out.shape[:-1], ctype)
    if poison_inf:                     # the oracle on the inputs as given
        want, wl, mag, lmag = oracle(q, k, v, kw, precision, groups)
        nan_out, nan_lse = np.isnan(want), np.isnan(wl)
        ok = ~touched(A, q, k, v)
        assert np.isfinite(out[ok]).all() and np.isfinite(np.where(lse[ok] == -np.inf, 0, lse[ok])).all(), \
            "a row that sees no inf is not finite"
    else:
        want, wl, mag, lmag = oracle(clean(q), clean(k), clean(v), kw, precision, groups)
    compare(out, want, mag, nan_out, "out")
    if not no_lse:
        compare(lse, wl, lmag, nan_lse, "lse")
    return nan_out, nan_lse


def base_inputs(rng, B, H, Hkv, L, S, E, Ev):
    return (rng.standard_normal((B, H, L, E)), rng.standard_normal((B, Hkv, S, E)),
            rng.standard_normal((B, Hkv, S, Ev)))


# -- scaled_dot_product_attention ---------------------------------------------------

@profile(70)
@given(seed=seeds, sname=storage, path=paths, place=places, value=poisons,
       precision=st.sampled_from(["highest", "bf16"]))
def test_sdpa_product(seed, sname, path, place, value, precision):
    """scaled_dot_product_attention (return_lse) on every storage dtype, path,
    NaN/inf placement and precision: the oracle, float64 inputs, widened
    float32 inputs, and NaN in exactly the rows that see it."""
    rng = np.random.default_rng(seed)
    dt = DT[sname]
    B, Hkv, g, L, S, E, Ev = sizes(rng, path)
    H = Hkv * g
    causal = [False, True, "bottom_right"][rng.integers(3)]
    window = window_opt(rng)
    mask = None
    if rng.random() < 0.4:
        mask = rng.random((L, S)) > 0.3
        if L > 1 and rng.random() < 0.3:
            mask[rng.integers(L)] = False             # a row with nothing admissible
    qoff = S - L if causal == "bottom_right" else 0
    A = np.broadcast_to(admissible(L, S, bool(causal), mask, window, qoff), (B, H, L, S))
    q, k, v = base_inputs(rng, B, H, Hkv, L, S, E, Ev)
    poison(rng, q, k, v, A, place, value)
    (qs, qw), (ks, kw_), (vs, vw) = widen(q, dt), widen(k, dt), widen(v, dt)
    kw = dict(attn_mask=mask, is_causal=causal, window=window, enable_gqa=g > 1)
    if precision == "bf16" and dt == np.float64:
        with pytest.raises(ValueError, match="float64"):
            pyattn.scaled_dot_product_attention(qs, ks, vs, precision="bf16", **kw)
        return
    with np.errstate(all="ignore"):
        out, lse = pyattn.scaled_dot_product_attention(qs, ks, vs, return_lse=True, precision=precision, **kw)
    rkw = dict(attn_mask=mask, is_causal=causal, window=ref_window(window))
    nan_out, _ = check_forward(out, lse, qw, kw_, vw, rkw, precision, g, A, qw.dtype)
    if dt in (np.float16, BF16):       # widening is exact: the float32 call, bit for bit
        o32, l32 = pyattn.scaled_dot_product_attention(qw, kw_, vw, return_lse=True, precision=precision, **kw)
        assert np.array_equal(out, o32, equal_nan=True) and np.array_equal(lse, l32, equal_nan=True)
    if precision == "highest" and dt != np.float64:      # the same call on float64 inputs
        with np.errstate(all="ignore"):
            o64, l64 = pyattn.scaled_dot_product_attention(*(x.astype(np.float64) for x in (qw, kw_, vw)),
                                                           return_lse=True, **kw)
        assert np.array_equal(np.isnan(o64), np.isnan(out)), "float64 call: NaN elsewhere"
        if not np.isinf(qw).any() and not np.isinf(kw_).any() and not np.isinf(vw).any():
            sc = 1 / np.sqrt(E) if E else 1.0
            kr, vr = np.repeat(clean(kw_), g, 1), np.repeat(clean(vw), g, 1)
            w = R.scaled_dot_product_attention(clean(qw), kr, vr, scale=sc, return_weights=True, **rkw)[1]
            fin = ~nan_out
            check(out[fin], o64[fin].astype(out.dtype), mag_attention(clean(qw), kr, vr, w, sc)[fin])


# -- the backward and the vjp -----------------------------------------------------------

def grad_nan(A, q, k, v, groups):
    """Expected NaN of (dq, dk, dv) rows: a weight of exactly 0 passes nothing
    back. Row i is tainted when its out is NaN (q[i], or a key or value row it
    may see, holds NaN); dq[i] is NaN for tainted rows; dk[j] when a tainted
    row may see key j; dv[j] when a row whose weights are NaN (q[i] or a key
    row it sees holds NaN) may see key j."""
    nan_out, st_ = nan_rows(A, q, k, v)
    tainted = nan_out.any(-1)
    B, H, L, S = A.shape
    Ag = A.reshape(B, H // groups, groups, L, S)
    tk = (Ag & tainted.reshape(B, H // groups, groups, L)[..., None]).any(axis=(2, 3))
    tv = (Ag & st_.reshape(B, H // groups, groups, L)[..., None]).any(axis=(2, 3))
    return tainted, tk, tv


@profile(40)
@given(seed=seeds, sname=storage, path=paths, place=places)
def test_backward_and_vjp_product(seed, sname, path, place):
    """scaled_dot_product_attention_backward and _vjp on every storage dtype,
    path and NaN placement: gradients against the oracle (test_backward's
    grad_mags), the vjp bit for bit equal to forward + backward, 16-bit
    storage equal to the widened float32 call, and NaN in exactly the
    gradient rows that a NaN reaches through a nonzero weight."""
    rng = np.random.default_rng(seed)
    dt = DT[sname]
    B, Hkv, g, L, S, E, Ev = sizes(rng, path)
    if path == "split":
        S = int(rng.integers(4096, 4200))
    E = max(E, 1)                      # zero-size gradients: test_backward.test_zero_size_axes
    H = Hkv * g
    causal = [False, True, "bottom_right"][rng.integers(3)]
    window = window_opt(rng)
    mask = (rng.random((L, S)) > 0.3) if rng.random() < 0.4 else None
    qoff = S - L if causal == "bottom_right" else 0
    A = np.broadcast_to(admissible(L, S, bool(causal), mask, window, qoff), (B, H, L, S))
    q, k, v = base_inputs(rng, B, H, Hkv, L, S, E, Ev)
    poison(rng, q, k, v, A, place, np.nan)
    (qs, qw), (ks, kw_), (vs, vw) = widen(q, dt), widen(k, dt), widen(v, dt)
    kw = dict(attn_mask=mask, is_causal=causal, window=window, enable_gqa=g > 1)
    with np.errstate(all="ignore"):
        out, backward = pyattn.scaled_dot_product_attention_vjp(qs, ks, vs, **kw)
        o2, lse = pyattn.scaled_dot_product_attention(qs, ks, vs, return_lse=True, **kw)
        assert np.array_equal(out, o2, equal_nan=True)
        go = rng.standard_normal(out.shape).astype(out.dtype)
        grads = pyattn.scaled_dot_product_attention_backward(go, qs, ks, vs, o2, lse, **kw)
        via_vjp = backward(go)
    for a, b in zip(grads, via_vjp):
        assert np.array_equal(a, b, equal_nan=True), "vjp differs from forward + backward"
    if dt in (np.float16, BF16):
        with np.errstate(all="ignore"):
            o32, l32 = pyattn.scaled_dot_product_attention(qw, kw_, vw, return_lse=True, **kw)
            g32 = pyattn.scaled_dot_product_attention_backward(go, qw, kw_, vw, o32, l32, **kw)
        for a, b in zip(grads, g32):
            assert a.dtype == np.float32 and np.array_equal(a, b, equal_nan=True)
    tq, tk, tv = grad_nan(A, qw, kw_, vw, g)
    rkw = dict(attn_mask=mask, is_causal=causal, window=ref_window(window))
    cq, ck, cv = clean(qw), clean(kw_), clean(vw)
    with np.errstate(all="ignore"):
        want = R.scaled_dot_product_attention_backward(go, cq, ck, cv, enable_gqa=g > 1, **rkw)
        mags = grad_mags(cq, ck, cv, go, 1 / np.sqrt(E) if E else 1.0, enable_gqa=g > 1, **rkw)
    for name, got, w, m, rows in zip(("grad_query", "grad_key", "grad_value"), grads, want, mags, (tq, tk, tv)):
        assert got.dtype == qw.dtype
        compare(got, w, m, np.broadcast_to(rows[..., None], got.shape), name)


# -- attention_with_kvcache and KVCache ---------------------------------------------------

def cache_case(rng, path, dt, place, value, new):
    """A cache of B sequences with lengths n_b, T new query rows (and new
    key/value rows when `new`), a window; the final cache contents (float64,
    poisoned) and the admissibility over all S_max rows (unfilled rows hidden)."""
    B, Hkv, g, T, S, E, Ev = sizes(rng, path)
    H = Hkv * g
    S_max = S + T + int(rng.integers(0, 20))
    lo = max(S - 60, 0) if path == "split" else 0
    n = rng.integers(lo, S + 1, size=B)                 # filled before the call
    if not new:
        n = np.maximum(n, T)
    if path == "split":
        n[:] = S
    length = n + T if new else n                        # rows attended
    window = window_opt(rng)
    qoff = length - T                                   # query t at cache position n_b + t
    A = admissible(T, S_max, True, None, window, qoff)[:, None]                # (B, 1, T, S_max)
    A = A & (np.arange(S_max) < length[:, None, None, None])
    A = np.broadcast_to(A, (B, H, T, S_max))
    q = rng.standard_normal((B, H, T, E))
    kc = rng.standard_normal((B, Hkv, S_max, E))       # rows past the length hold garbage too
    vc = rng.standard_normal((B, Hkv, S_max, Ev))
    poison(rng, q, kc, vc, A, place, value)
    return dict(B=B, Hkv=Hkv, g=g, T=T, E=E, Ev=Ev, S_max=S_max, n=n, length=length, window=window,
                qoff=qoff, A=A, q=q, kc=kc, vc=vc)


def check_cache_result(out, lse, c, dt, precision):
    """Per sequence: the oracle over its filled rows (bottom-right causal)."""
    cd = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    qw, kw_, vw = (x.astype(dt).astype(cd) for x in (c["q"], c["kc"], c["vc"]))
    for b in range(c["B"]):
        m = int(c["length"][b])
        A = c["A"][b:b + 1, :, :, :m]
        rkw = dict(is_causal="bottom_right", window=ref_window(c["window"]))
        check_forward(out[b:b + 1], lse[b:b + 1], qw[b:b + 1], kw_[b:b + 1, :, :m], vw[b:b + 1, :, :m],
                      rkw, precision, c["g"], A, cd)


@profile(50)
@given(seed=seeds, sname=storage, path=paths, place=places, value=poisons,
       precision=st.sampled_from(["highest", "bf16"]), new=st.booleans())
def test_kvcache_product(seed, sname, path, place, value, precision, new):
    """attention_with_kvcache (caches, query and new rows all of the storage
    dtype) on every path, placement (hidden: the causal rule, the window,
    the unfilled rows) and precision: the oracle over the filled rows, the
    caches written exactly at [n_b, n_b + T), NaN only in the rows that see it."""
    rng = np.random.default_rng(seed)
    dt = DT[sname]
    c = cache_case(rng, path, dt, place, value, new)
    T, n = c["T"], c["n"]
    ks, vs = c["kc"].astype(dt), c["vc"].astype(dt)
    kc0, vc0 = ks.copy(), vs.copy()
    key = value_ = None
    if new:                            # the new rows come as arguments; the cache holds garbage there
        key = np.stack([ks[b, :, n[b]:n[b] + T] for b in range(c["B"])])
        value_ = np.stack([vs[b, :, n[b]:n[b] + T] for b in range(c["B"])])
        for b in range(c["B"]):
            kc0[b, :, n[b]:n[b] + T] = 0
            vc0[b, :, n[b]:n[b] + T] = 0
    kcache, vcache = kc0.copy(), vc0.copy()
    qs = c["q"].astype(dt)
    if precision == "bf16" and dt == np.float64:
        with pytest.raises(ValueError, match="float64"):
            pyattn.attention_with_kvcache(qs, kcache, vcache, key, value_, cache_seqlens=n, precision="bf16")
        assert np.array_equal(kcache, kc0, equal_nan=True)
        return
    with np.errstate(all="ignore"):
        out, lse = pyattn.attention_with_kvcache(qs, kcache, vcache, key, value_, cache_seqlens=n,
                                                 window=c["window"], return_lse=True, precision=precision)
    # written: exactly the new rows
    assert np.array_equal(kcache, ks if new else kc0, equal_nan=True)
    assert np.array_equal(vcache, vs if new else vc0, equal_nan=True)
    check_cache_result(out, lse, c, dt, precision)
    if dt in (np.float16, BF16):       # widening is exact: the float32 call on the same values, bit for bit
        with np.errstate(all="ignore"):
            o32, l32 = pyattn.attention_with_kvcache(qs.astype(np.float32), kcache.astype(np.float32),
                                                     vcache.astype(np.float32), cache_seqlens=c["length"],
                                                     window=c["window"], return_lse=True, precision=precision)
        assert np.array_equal(out, o32, equal_nan=True) and np.array_equal(lse, l32, equal_nan=True)
    if precision == "highest" and dt != np.float64:
        with np.errstate(all="ignore"):
            o64 = pyattn.attention_with_kvcache(qs.astype(np.float64), kcache.astype(np.float64),
                                                vcache.astype(np.float64), cache_seqlens=c["length"],
                                                window=c["window"])
        assert np.array_equal(np.isnan(o64), np.isnan(out)), "float64 call: NaN elsewhere"


@profile(30)
@given(seed=seeds, sname=storage, path=paths, place=places, precision=st.sampled_from(["highest", "bf16"]))
def test_KVCache_product(seed, sname, path, place, precision):
    """KVCache.attend in two steps (a prefill, then T new rows) on every
    storage dtype, path, placement (NaN also left in rows past the lengths,
    as after reset()) and precision: the second step against the oracle over
    the filled rows, lengths advanced, the rows past them untouched."""
    if precision == "bf16" and sname == "float64":
        return                         # refused, as test_kvcache_product checks
    rng = np.random.default_rng(seed)
    dt = DT[sname]
    c = cache_case(rng, path, dt, place, np.nan, True)
    B, T = c["B"], c["T"]
    c["n"][:] = c["n"].min()          # one length for every sequence, as a KVCache fills them
    n0 = int(c["n"][0])
    c["length"] = c["n"] + T
    c["qoff"] = c["n"]
    A = admissible(T, c["S_max"], True, None, c["window"], n0) & (np.arange(c["S_max"]) < n0 + T)
    c["A"] = np.broadcast_to(A, (B, c["Hkv"] * c["g"], T, c["S_max"]))
    cache = pyattn.KVCache(B, c["Hkv"], c["S_max"], c["E"], c["Ev"], dtype=dt)
    ks, vs = c["kc"].astype(dt), c["vc"].astype(dt)
    cache.k[:, :, n0 + T:] = ks[:, :, n0 + T:]        # left-over rows (as after reset())
    cache.v[:, :, n0 + T:] = vs[:, :, n0 + T:]
    q0 = np.zeros((B, c["Hkv"] * c["g"], n0, c["E"]), dt)
    with np.errstate(all="ignore"):
        cache.attend(q0, ks[:, :, :n0], vs[:, :, :n0])
        assert cache.lengths.tolist() == [n0] * B
        out, lse = cache.attend(c["q"].astype(dt), ks[:, :, n0:n0 + T], vs[:, :, n0:n0 + T],
                                window=c["window"], return_lse=True, precision=precision)
    assert cache.lengths.tolist() == [n0 + T] * B
    assert np.array_equal(cache.k, ks, equal_nan=True) and np.array_equal(cache.v, vs, equal_nan=True)
    check_cache_result(out, lse, c, dt, precision)


# -- merge_attention ------------------------------------------------------------------

@profile(40)
@given(seed=seeds, sname=storage, path=paths, place=places, value=poisons, parts=st.integers(2, 3))
def test_merge_product(seed, sname, path, place, value, parts):
    """merge_attention of partial results over disjoint key ranges (each from
    scaled_dot_product_attention with return_lse, the causal rule and window
    given as a bool mask cut with the keys) on every storage dtype, path and
    placement: the merge equals the whole call's oracle, the NaN rule holds,
    and it agrees with the oracle's merge of the same partials."""
    rng = np.random.default_rng(seed)
    dt = DT[sname]
    B, Hkv, g, L, S, E, Ev = sizes(rng, path)
    H = Hkv * g
    causal = bool(rng.integers(2))
    window = window_opt(rng)
    mask = admissible(L, S, causal, (rng.random((L, S)) > 0.2) if rng.random() < 0.4 else None, window, 0)
    A = np.broadcast_to(mask, (B, H, L, S))
    q, k, v = base_inputs(rng, B, H, Hkv, L, S, E, Ev)
    poison(rng, q, k, v, A, place, value)
    (qs, qw), (ks, kw_), (vs, vw) = widen(q, dt), widen(k, dt), widen(v, dt)
    cuts = [0] + sorted(int(x) for x in rng.integers(0, S + 1, size=parts - 1)) + [S]
    outs, lses = [], []
    with np.errstate(all="ignore"):
        for a, b in zip(cuts[:-1], cuts[1:]):
            o, l_ = pyattn.scaled_dot_product_attention(qs, ks[:, :, a:b], vs[:, :, a:b], mask[:, a:b],
                                                        enable_gqa=g > 1, return_lse=True)
            outs.append(o)
            lses.append(l_)
        mo, ml = pyattn.merge_attention(outs, lses)
        ro, rl = R.merge_attention(outs, lses)
    check_forward(mo, ml, qw, kw_, vw, dict(attn_mask=mask), "highest", g, A, qw.dtype)
    # the same partials through the oracle's merge: NaN and inf in the same places
    sc = np.exp(np.where(np.isfinite(np.stack(lses)), np.stack(lses), -np.inf) -
                np.where(np.isfinite(rl), rl, 0)[None]).astype(np.float64)
    mag = (np.nan_to_num(sc)[..., None] * np.abs(np.nan_to_num(np.stack(outs), posinf=0, neginf=0))).sum(0)
    check(mo, ro, (mag + np.finfo(np.float64).tiny) * (4 + parts))
    check(ml, rl, (4 + np.abs(np.nan_to_num(rl, posinf=0, neginf=0))) * (4 + parts))


# -- pyattn.dask --------------------------------------------------------------------

@profile(20)
@given(seed=seeds, sname=storage, path=paths, place=places, value=poisons)
def test_dask_product(seed, sname, path, place, value):
    """pyattn.dask.scaled_dot_product_attention with small chunks
    along L and S (so key chunks are merged) on every storage dtype, path and
    placement, against the oracle and the NaN rule."""
    da = pytest.importorskip("dask.array")
    import dask
    import pyattn.dask as pd
    rng = np.random.default_rng(seed)
    dt = DT[sname]
    B, Hkv, g, L, S, E, Ev = sizes(rng, path)
    H = Hkv * g
    causal = [False, True, "bottom_right"][rng.integers(3)]
    window = window_opt(rng)
    mask = (rng.random((L, S)) > 0.3) if rng.random() < 0.3 else None
    qoff = S - L if causal == "bottom_right" else 0
    A = np.broadcast_to(admissible(L, S, bool(causal), mask, window, qoff), (B, H, L, S))
    q, k, v = base_inputs(rng, B, H, Hkv, L, S, E, Ev)
    poison(rng, q, k, v, A, place, value)
    (qs, qw), (ks, kw_), (vs, vw) = widen(q, dt), widen(k, dt), widen(v, dt)
    lc, sc_ = max(1, L // int(rng.integers(1, 4))), max(1, S // int(rng.integers(1, 4)))
    dq = da.from_array(qs, chunks=(1, H, lc, max(E, 1)))
    dk = da.from_array(ks, chunks=(B, Hkv, sc_, max(E, 1)))
    dv = da.from_array(vs, chunks=(B, Hkv, sc_, Ev))
    with np.errstate(all="ignore"):
        o = pd.scaled_dot_product_attention(dq, dk, dv, attn_mask=mask, is_causal=causal, enable_gqa=g > 1,
                                            window=window)
        with dask.config.set(scheduler="synchronous"):
            out = o.compute()
    rkw = dict(attn_mask=mask, is_causal=causal, window=ref_window(window))
    check_forward(out, None, qw, kw_, vw, rkw, "highest", g, A, qw.dtype)
