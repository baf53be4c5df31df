"""Every figure the seed notebooks print that can be recomputed from printed
inputs, to the printed 4 decimals (../shared/seeds/*.txt), and the output
shapes of every module call in the seeds.

A printed number is a rounding of the true one by up to half a unit in its
last digit; when a computation starts from printed (rounded) inputs, that
rounding moves its result too. `printed_bound` measures how far (first
order, by perturbing each rounded input by half a unit) so each comparison
allows exactly the rounding the printout implies, plus float32 arithmetic.
"""
import numpy as np
import pytest

import pyattn
from pyattn import _reference as R
from pyattn.nn import CausalAttention, MultiHeadAttention, SelfAttention

HALF = 0.5e-4            # half a unit of the 4th decimal
F32 = 2e-6               # float32 arithmetic on numbers of order 1

INPUTS = np.array([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                   [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]], np.float32)


def printed_bound(f, rounded):
    """Bound on |f(true inputs) - f(printed inputs)| + the output's own rounding."""
    rounded = [np.asarray(x, np.float64) for x in rounded]
    base = np.asarray(f(*rounded), np.float64)
    bound = np.zeros_like(base)
    for i, x in enumerate(rounded):
        for j in range(x.size):
            worst = np.zeros_like(base)
            for sgn in (1.0, -1.0):
                xs = x.copy().ravel()
                xs[j] += sgn * HALF
                args = list(rounded)
                args[i] = xs.reshape(x.shape)
                worst = np.maximum(worst, np.abs(np.asarray(f(*args), np.float64) - base))
            bound += worst
    return bound + HALF + F32


def close_to_print(actual, printed, bound=HALF + F32):
    actual = np.asarray(actual, np.float64)
    printed = np.asarray(printed, np.float64)
    assert actual.shape == printed.shape
    err = np.abs(actual - printed)
    assert (err <= bound).all(), f"max error {err.max():.2e} vs bound {np.min(bound):.2e}\n{actual}"


# ---- seed 001: "Your journey starts with one step" -------------------------

def test_journey_scores_and_weights():
    scores = pyattn.matmul(INPUTS, INPUTS[1])
    close_to_print(scores, [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])
    close_to_print(scores / scores.sum(), [0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656])
    w = pyattn.softmax(scores, axis=0)
    close_to_print(w, [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581])
    close_to_print(pyattn.matmul(w, INPUTS), [0.4419, 0.6515, 0.5683])
    ctx = pyattn.scaled_dot_product_attention(INPUTS[1:2], INPUTS, INPUTS, scale=1.0)
    close_to_print(ctx[0], [0.4419, 0.6515, 0.5683])


ALL_W = [[0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
         [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
         [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
         [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
         [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
         [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896]]
ALL_CTX = [[0.4421, 0.5931, 0.5790], [0.4419, 0.6515, 0.5683], [0.4431, 0.6496, 0.5671],
           [0.4304, 0.6298, 0.5510], [0.4671, 0.5910, 0.5266], [0.4177, 0.6503, 0.5645]]


def test_journey_all_pairs():
    ctx, w = pyattn.scaled_dot_product_attention(INPUTS, INPUTS, INPUTS, scale=1.0, return_weights=True)
    close_to_print(w, ALL_W)
    close_to_print(ctx, ALL_CTX)
    close_to_print(pyattn.softmax(pyattn.matmul(INPUTS, INPUTS.T)), ALL_W)
    close_to_print(pyattn.matmul(np.array(ALL_W, np.float32), INPUTS), ALL_CTX,
                   printed_bound(lambda a: a @ INPUTS, [ALL_W]))


W_Q = np.array([[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]])
W_K = np.array([[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]])
W_V = np.array([[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]])
KEYS = [[0.3669, 0.7646], [0.4433, 1.1419], [0.4361, 1.1156], [0.2408, 0.6706], [0.1827, 0.3292], [0.3275, 0.9642]]
VALUES = [[0.1855, 0.8812], [0.3951, 1.0037], [0.3879, 0.9831], [0.2393, 0.5493], [0.1492, 0.3346], [0.3221, 0.7863]]
QUERIES = [[0.2309, 1.0966], [0.4306, 1.4551], [0.4300, 1.4343], [0.2355, 0.7990], [0.2983, 0.6565], [0.2568, 1.0533]]
SCORES = [[0.9231, 1.3545, 1.3241, 0.7910, 0.4032, 1.1330],
          [1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440],
          [1.2544, 1.8284, 1.7877, 1.0654, 0.5508, 1.5238],
          [0.6973, 1.0167, 0.9941, 0.5925, 0.3061, 0.8475],
          [0.6114, 0.8819, 0.8626, 0.5121, 0.2707, 0.7307],
          [0.8995, 1.3165, 1.2871, 0.7682, 0.3937, 1.0996]]
WEIGHTS2 = [[0.1551, 0.2104, 0.2059, 0.1413, 0.1074, 0.1799],
            [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820],
            [0.1503, 0.2256, 0.2192, 0.1315, 0.0914, 0.1819],
            [0.1591, 0.1994, 0.1962, 0.1477, 0.1206, 0.1769],
            [0.1610, 0.1949, 0.1923, 0.1501, 0.1265, 0.1752],
            [0.1557, 0.2092, 0.2048, 0.1419, 0.1089, 0.1794]]
CTX2 = [[0.2996, 0.8053], [0.3061, 0.8210], [0.3058, 0.8203],
        [0.2948, 0.7939], [0.2927, 0.7891], [0.2990, 0.8040]]


def _scores(wq, wk):
    return (INPUTS @ wq) @ (INPUTS @ wk).T


def _weights(wq, wk):
    return R.softmax(_scores(wq, wk), scale=2 ** -0.5)


def _context(wq, wk, wv):
    return _weights(wq, wk) @ (INPUTS @ wv)


def test_trainable_weights_projections():
    x2 = INPUTS[1]
    for w, printed in ((W_Q, [0.4306, 1.4551]), (W_K, [0.4433, 1.1419]), (W_V, [0.3951, 1.0037])):
        close_to_print(pyattn.matmul(x2, w), printed, printed_bound(lambda m: x2 @ m, [w]))
    for w, printed in ((W_K, KEYS), (W_V, VALUES), (W_Q, QUERIES)):
        close_to_print(pyattn.matmul(INPUTS, w), printed, printed_bound(lambda m: INPUTS @ m, [w]))
    q, k = pyattn.matmul(INPUTS, W_Q), pyattn.matmul(INPUTS, W_K)
    close_to_print(pyattn.matmul(q, k.T), SCORES, printed_bound(_scores, [W_Q, W_K]))


def test_trainable_weights_attention_through_layer():
    # seed 001's SelfAttentionParameter holds W (d_in, d_out); pyattn layers
    # use torch.nn.Linear's (d_out, d_in), so the printed matrices go in transposed
    layer = SelfAttention(3, 2).load_state_dict(
        {"W_query.weight": W_Q.T, "W_key.weight": W_K.T, "W_value.weight": W_V.T})
    ctx, w = layer(INPUTS, return_weights=True)
    close_to_print(w, WEIGHTS2, printed_bound(_weights, [W_Q, W_K]))
    close_to_print(ctx, CTX2, printed_bound(_context, [W_Q, W_K, W_V]))
    # step 2 of the seed: softmax(scores / sqrt(d_k)) row by row
    s = pyattn.matmul(pyattn.matmul(INPUTS, W_Q), pyattn.matmul(INPUTS, W_K).T)
    close_to_print(pyattn.softmax(s, scale=2 ** -0.5), WEIGHTS2, printed_bound(_weights, [W_Q, W_K]))


def test_self_attention_linear_seed_789():
    torch = pytest.importorskip("torch")
    torch.manual_seed(789)
    lin = [torch.nn.Linear(3, 2, bias=False) for _ in range(3)]    # W_q, W_k, W_v in the seed's order
    layer = SelfAttention(3, 2).load_state_dict(
        {"W_query.weight": lin[0].weight, "W_key.weight": lin[1].weight, "W_value.weight": lin[2].weight})
    close_to_print(layer(INPUTS), [[-0.0739, 0.0713], [-0.0748, 0.0703], [-0.0749, 0.0702],
                                   [-0.0760, 0.0685], [-0.0763, 0.0679], [-0.0754, 0.0693]])


# ---- seed 000: the prefix mean ------------------------------------------------

def test_prefix_mean_small():
    b = np.array([[2.0, 9.0], [7.0, 9.0], [4.0, 4.0]])
    a = pyattn.softmax(np.zeros((3, 3)), is_causal=True)
    close_to_print(a, [[1, 0, 0], [0.5, 0.5, 0], [0.3333, 0.3333, 0.3333]])
    close_to_print(pyattn.matmul(a, b), [[2.0, 9.0], [4.5, 9.0], [4.3333, 7.3333]])


def test_prefix_mean_toy():
    x = np.array([[[-2.0260, -2.0655], [-1.2054, -0.9122], [-1.2502, 0.8032]]])
    printed = [[[-2.0260, -2.0655], [-1.6157, -1.4889], [-1.4939, -0.7248]]]
    bound = printed_bound(lambda t: np.cumsum(t, axis=1) / np.arange(1, 4)[:, None], [x])
    # version 2/3: weights from softmax over a causally masked zero matrix, then a matmul
    wei = pyattn.softmax(np.zeros((3, 3)), is_causal=True)
    close_to_print(pyattn.matmul(wei, x), printed, bound)
    # the fused kernel: equal scores (zero queries/keys) + causal = prefix mean
    z = np.zeros((1, 3, 1))
    close_to_print(pyattn.scaled_dot_product_attention(z, z, x, is_causal=True), printed, bound)


# ---- seed 004: masking after vs before the softmax ---------------------------

QKT = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]], np.float32)
MASKED = [[1.0, 0.0, 0.0], [0.4975, 0.5025, 0.0], [0.3300, 0.3333, 0.3367]]


def test_masking_after_softmax():
    w = pyattn.softmax(QKT, scale=0.1) * np.tril(np.ones((3, 3), np.float32))
    close_to_print(w / w.sum(axis=-1, keepdims=True), MASKED)


def test_masking_before_softmax():
    close_to_print(pyattn.softmax(QKT, is_causal=True, scale=0.1), MASKED)
    m = np.where(np.tril(np.ones((3, 3))) == 0, -np.inf, 0.0)
    close_to_print(pyattn.softmax(QKT, attn_mask=m, scale=0.1), MASKED)
    close_to_print(pyattn.softmax(QKT, attn_mask=np.tril(np.ones((3, 3), bool)), scale=0.1), MASKED)


# ---- output shapes of every module call in the seeds --------------------------

@pytest.mark.parametrize("build, x_shape, out_shape", [
    # seed 000: single head (head_size 16), SelfAttention(C, 16), MultiHeadSelfAttention(C, 2),
    # MultiHeadAttention(d_in=C, d_out=C, context_length=T, dropout=0.1, num_heads=4)
    (lambda: CausalAttention(32, 16, context_length=8, rng=0), (4, 8, 32), (4, 8, 16)),
    (lambda: MultiHeadAttention(32, 32, 2, rng=0), (4, 8, 32), (4, 8, 32)),
    (lambda: MultiHeadAttention(32, 32, 4, context_length=8, dropout=0.1, rng=0), (4, 8, 32), (4, 8, 32)),
    # seed 002: MultiHeadAttention on (30, 50, 512)
    (lambda: MultiHeadAttention(512, 512, 8, context_length=50, dropout=0.1, rng=0), (30, 50, 512), (30, 50, 512)),
    # seed 003: one head, value size 16
    (lambda: CausalAttention(32, 16, context_length=8, rng=0), (4, 8, 32), (4, 8, 16)),
    # seed 004: SelfAttentionV2(768, 1024), CausalAttention(512, 768, 100),
    # MultiHeadAttention(512, 768, 3, 100), MultiHeadAttentionOneModule(768, 1536, 3, 80)
    (lambda: SelfAttention(768, 1024, qkv_bias=True, rng=0), (40, 50, 768), (40, 50, 1024)),
    (lambda: CausalAttention(512, 768, context_length=100, rng=0), (20, 100, 512), (20, 100, 768)),
    (lambda: MultiHeadAttention(512, 768, 3, context_length=100, out_bias=True, rng=0), (20, 100, 512), (20, 100, 768)),
    (lambda: MultiHeadAttention(768, 1536, 3, context_length=80, rng=0), (40, 80, 768), (40, 80, 1536)),
])
def test_module_shapes(build, x_shape, out_shape):
    layer = build()
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    out = layer(x)
    assert out.shape == out_shape and out.dtype == np.float32
    assert np.isfinite(out).all()
