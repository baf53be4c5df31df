"""Every error API.md names: the right exception, a message naming the argument."""
import numpy as np
import pytest

import pyattn
from pyattn import _C
from pyattn.nn import CausalAttention, MultiHeadAttention, SelfAttention

sdpa = pyattn.scaled_dot_product_attention


class BadArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("no array here")


Q = np.zeros((2, 3, 4))
K = np.zeros((2, 5, 4))
V = np.zeros((2, 5, 6))


@pytest.mark.parametrize("bad, name", [
    (np.zeros((2, 2), np.complex128), "a"), (np.array([["x"]]), "a"), (np.zeros((2, 2), object), "a"),
    (np.zeros((2, 2), "datetime64[s]"), "a"), (np.zeros((2, 2), np.longdouble), "a"),
])
def test_bad_dtypes_matmul(bad, name):
    if bad.dtype == np.longdouble and np.finfo(np.longdouble).bits == 64:
        pytest.skip("long double is float64 on this platform, so it is a valid input here")
    with pytest.raises(TypeError, match=name):
        pyattn.matmul(bad, np.ones((2, 2)))


@pytest.mark.parametrize("arg", ["query", "key", "value"])
@pytest.mark.parametrize("dtype", [np.complex64, object, "U3", "datetime64[ns]"])
def test_bad_dtypes_sdpa(arg, dtype):
    args = {"query": Q, "key": K, "value": V}
    args[arg] = args[arg].astype(dtype)
    with pytest.raises(TypeError, match=arg):
        sdpa(**args)


def test_bad_dtype_softmax():
    with pytest.raises(TypeError, match="x"):
        pyattn.softmax(np.zeros(3, complex))


def test_array_like_raising():
    with pytest.raises(TypeError, match="query"):
        sdpa(BadArray(), K, V)
    with pytest.raises(TypeError, match="b"):
        pyattn.matmul(np.ones((2, 2)), BadArray())
    with pytest.raises(TypeError, match="x"):
        pyattn.softmax([[1, 2], [3]])


def test_matmul_shapes():
    with pytest.raises(ValueError, match=r"a is a scalar"):
        pyattn.matmul(3.0, np.ones(3))
    with pytest.raises(ValueError, match=r"b is a scalar"):
        pyattn.matmul(np.ones(3), 2)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        pyattn.matmul(np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"a \(2,\).*b \(3,\)"):
        pyattn.matmul(np.ones((2, 4, 5)), np.ones((3, 5, 1)))


def test_sdpa_shapes():
    with pytest.raises(ValueError, match=r"query.*\(3,\)"):
        sdpa(np.ones(3), K, V)
    with pytest.raises(ValueError, match=r"key has shape \(2, 5, 3\).*query has shape \(2, 3, 4\)"):
        sdpa(Q, np.zeros((2, 5, 3)), V)
    with pytest.raises(ValueError, match=r"value has shape \(2, 4, 6\).*key has shape \(2, 5, 4\)"):
        sdpa(Q, K, np.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match=r"query \(2,\).*key \(3,\)"):
        sdpa(Q, np.zeros((3, 5, 4)), np.zeros((3, 5, 6)))


def test_masks():
    with pytest.raises(ValueError, match=r"attn_mask has shape \(4, 5\).*\(2, 3, 5\)"):
        sdpa(Q, K, V, np.ones((4, 5), bool))
    with pytest.raises(TypeError, match="attn_mask"):
        sdpa(Q, K, V, np.ones((3, 5), np.int64))
    with pytest.raises(TypeError, match="attn_mask"):
        pyattn.softmax(np.ones((3, 5)), attn_mask=np.ones((3, 5), complex))
    with pytest.raises(ValueError, match="axis"):
        pyattn.softmax(np.ones((3, 5)), axis=0, attn_mask=np.ones((3, 5), bool))
    with pytest.raises(ValueError, match="axis"):
        pyattn.softmax(np.ones((3, 5)), axis=0, is_causal=True)
    with pytest.raises(ValueError, match="is_causal"):
        pyattn.softmax(np.ones(5), is_causal=True)
    with pytest.raises(ValueError, match="is_causal"):
        sdpa(Q, K, V, is_causal="diagonal")
    with pytest.raises(ValueError, match="axis 2"):
        pyattn.softmax(np.ones((3, 5)), axis=2)
    with pytest.raises(ValueError, match="x is a scalar"):
        pyattn.softmax(1.0)


@pytest.mark.parametrize("p", [1.0, -0.1, 2, float("nan")])
def test_dropout_range(p):
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(Q, K, V, dropout_p=p)


def test_bad_scalars():
    with pytest.raises(TypeError, match="scale"):
        sdpa(Q, K, V, scale="big")
    with pytest.raises(TypeError, match="dropout_p"):
        sdpa(Q, K, V, dropout_p=None)
    with pytest.raises(TypeError, match="rng"):
        sdpa(Q, K, V, dropout_p=0.5, rng="seed")


def test_gqa():
    q = np.zeros((1, 6, 3, 4))
    kv = np.zeros((1, 4, 5, 4))
    with pytest.raises(ValueError, match=r"query heads \(6.*key/value heads \(4"):
        sdpa(q, kv, kv, enable_gqa=True)
    with pytest.raises(ValueError, match=r"query \(1, 6\).*key \(1, 4\)"):
        sdpa(q, kv, kv)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(np.zeros((3, 4)), np.zeros((5, 4)), np.zeros((5, 4)), enable_gqa=True)


def test_out():
    with pytest.raises(ValueError, match=r"out has shape \(2, 3\).*\(2, 3, 6\)"):
        sdpa(Q, K, V, out=np.empty((2, 3)))
    with pytest.raises(ValueError, match="out has .* dtype float32"):
        sdpa(Q, K, V, out=np.empty((2, 3, 6), np.float32))
    ro = np.empty((2, 3, 6))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        sdpa(Q, K, V, out=ro)
    with pytest.raises(TypeError, match="out"):
        pyattn.matmul(np.ones((2, 2)), np.ones((2, 2)), out=[[0, 0], [0, 0]])
    with pytest.raises(ValueError, match="out"):
        pyattn.softmax(np.ones((2, 2)), out=np.empty((2, 2), np.float32))


def test_memory_error_no_crash():
    big = np.broadcast_to(np.ones(1, np.float32), (2 ** 20, 2 ** 20))
    with pytest.raises(MemoryError):
        pyattn.matmul(big, big)
    q = np.broadcast_to(np.ones(1), (2 ** 20, 2 ** 20, 1))
    with pytest.raises(MemoryError):           # weights of 2**60 elements: size arithmetic overflows
        sdpa(q, q, q, return_weights=True)
    with pytest.raises(MemoryError):           # 8 TB output
        sdpa(q, q, q)


def test_mha_errors():
    x = np.zeros((2, 5, 8))
    w = np.zeros((8, 8))
    with pytest.raises(ValueError, match="num_heads"):
        pyattn.multi_head_attention(x, x, x, 3, w, w, w)
    with pytest.raises(ValueError, match="num_heads"):
        pyattn.multi_head_attention(x, x, x, 0, w, w, w)
    with pytest.raises(ValueError, match=r"w_q has shape \(8, 7\).*query has shape \(2, 5, 8\)"):
        pyattn.multi_head_attention(x, x, x, 2, np.zeros((8, 7)), w, w)
    with pytest.raises(ValueError, match="b_q"):
        pyattn.multi_head_attention(x, x, x, 2, w, w, w, b_q=np.zeros(3))
    with pytest.raises(ValueError, match="b_o"):
        pyattn.multi_head_attention(x, x, x, 2, w, w, w, b_o=np.zeros(8))
    with pytest.raises(ValueError, match="w_o"):
        pyattn.multi_head_attention(x, x, x, 2, w, w, w, np.zeros((8, 5)))
    with pytest.raises(ValueError, match="query"):
        pyattn.multi_head_attention(np.zeros(8), x, x, 2, w, w, w)
    with pytest.raises(TypeError, match="num_heads"):
        pyattn.multi_head_attention(x, x, x, 2.5, w, w, w)


def test_layer_errors():
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(8, 10, 3)
    with pytest.raises(ValueError, match="dropout"):
        CausalAttention(4, 4, 8, dropout=1.5)
    layer = CausalAttention(4, 6, context_length=5)
    with pytest.raises(ValueError, match="context_length"):
        layer(np.zeros((1, 6, 4)))
    with pytest.raises(ValueError, match=r"\(B, T, 4\)"):
        layer(np.zeros((1, 3, 5)))
    sd = layer.state_dict()
    with pytest.raises(ValueError, match="'W_key.weight'"):
        layer.load_state_dict({k: v for k, v in sd.items() if k != "W_key.weight"})
    bad = dict(sd, **{"W_query.weight": np.zeros((6, 5))})
    with pytest.raises(ValueError, match=r"'W_query.weight' has shape \(6, 5\), expected \(6, 4\)"):
        layer.load_state_dict(bad)
    with pytest.raises(ValueError, match="'W_query.bias'"):
        layer.load_state_dict(dict(sd, **{"W_query.bias": np.zeros(6)}))
    with pytest.raises(ValueError, match="'in_proj_weight'"):
        MultiHeadAttention(4, 4, 2).load_state_dict({"in_proj_weight": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="'W_value.weight'"):
        SelfAttention(2, 2).load_state_dict(dict(SelfAttention(2, 2).state_dict(), **{"W_value.weight": np.zeros((2, 2), complex)}))
    # a failed load leaves the layer as it was
    assert all(np.array_equal(layer.state_dict()[k], v) for k, v in sd.items())


def test_threads_errors():
    with pytest.raises(ValueError, match="n must be"):
        pyattn.set_num_threads(0)
    with pytest.raises(TypeError, match="n must be an integer"):
        pyattn.set_num_threads(1.5)


def test_private_module_never_crashes():
    """The checks in C repeat what the kernels rely on, for direct calls."""
    a = np.ones((3, 4))
    with pytest.raises(TypeError):
        _C.matmul([[1.0]], a)
    with pytest.raises(TypeError):
        _C.matmul(a.astype(np.float32), a.T)
    with pytest.raises(ValueError):
        _C.matmul(a, a)
    with pytest.raises(ValueError):
        _C.matmul(np.ones((2, 3, 4)), np.ones((3, 4, 2)))
    with pytest.raises(ValueError):
        _C.softmax(np.ones((2, 3)), None, np.ones((3, 3), bool))
    with pytest.raises(ValueError):
        _C.softmax(np.ones(3), None, None, 1)
    with pytest.raises(ValueError):
        _C.sdpa(Q, K, V, None, None, 5)
    with pytest.raises(ValueError):
        _C.sdpa(Q, K, V, None, None, 0, 1.0, 1.0)
    with pytest.raises(ValueError):
        _C.sdpa(Q, K, np.ones((2, 4, 6)))
    with pytest.raises(ValueError):
        _C.sdpa(Q, K, V, np.ones((2, 3, 6))[::1, ::1, ::1].copy().view(np.float64)[:, :2])
    with pytest.raises(ValueError):
        _C.softmax(np.ones((2, 3)), np.ones((2, 3)).view(np.float64)[:, ::1].copy()[::1].T)
    with pytest.raises(ValueError):
        _C.select_isa(7)


# ---- a new user's first hour: messages that say what to do next ----------

def test_head_count_mismatch_suggests_enable_gqa():
    q = np.zeros((1, 4, 5, 8), np.float32)
    k = np.zeros((1, 2, 5, 8), np.float32)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        pyattn.scaled_dot_product_attention(q, k, k)
    # not a GQA shape (4 is no multiple of 3): no such hint
    with pytest.raises(ValueError) as e:
        pyattn.scaled_dot_product_attention(q, np.zeros((1, 3, 5, 8), np.float32), np.zeros((1, 3, 5, 8)))
    assert "enable_gqa" not in str(e.value)
    out = pyattn.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    assert out.shape == q.shape


@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_none_operand_is_named(name):
    args = dict(query=np.zeros((2, 3)), key=np.zeros((2, 3)), value=np.zeros((2, 3)))
    args[name] = None
    with pytest.raises(TypeError, match=f"{name} is None"):
        pyattn.scaled_dot_product_attention(**args)


def test_num_heads_zero_is_a_clear_error():
    from pyattn.nn import MultiHeadAttention
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got 0"):
        MultiHeadAttention(8, 8, 0, 4)


def test_softmax_accepts_pytorchs_dim():
    x = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(pyattn.softmax(x, dim=0), pyattn.softmax(x, axis=0))
    assert np.array_equal(pyattn.softmax(x, dim=-1), pyattn.softmax(x))
    with pytest.raises(ValueError, match="not both"):
        pyattn.softmax(x, 0, dim=1)
    with pytest.raises(ValueError, match="out of bounds"):
        pyattn.softmax(x, dim=2)
    with pytest.raises(TypeError, match="dim"):
        pyattn.softmax(x, dim=1.5)


def test_dir_shows_only_the_public_names():
    import pyattn.nn
    assert dir(pyattn) == sorted(pyattn.__all__)
    assert dir(pyattn.nn) == sorted(pyattn.nn.__all__)
    for name in ("annotations", "np", "check_numeric", "compute_dtype", "index_value"):
        assert name not in dir(pyattn) and name not in dir(pyattn.nn)
