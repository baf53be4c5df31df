"""Attention layers holding NumPy arrays, mirroring the seed notebooks' classes
("seed 000" to "seed 004": the five notebooks pyattn grew out of, listed in
the README's section "The seed notebooks").

Weights use ``torch.nn.Linear``'s layout ``(d_out, d_in)``; ``load_state_dict``
takes the seed classes' keys (``W_query.weight``, ..., ``out_proj.weight``)
and ``torch.nn.MultiheadAttention``'s (``in_proj_weight``, ...), as NumPy
arrays or tensors; ``Layer.from_torch(module)`` builds the layer that matches a
PyTorch module (``torch.nn.MultiheadAttention`` or a seed class) and loads its
weights. Layers are called as ``layer(x, attn_mask=None, return_weights=False)``
(a second input array where the mask belongs, ``m(x, x)``, is a ``TypeError``). Layers start in training mode, as in PyTorch.

>>> import numpy as np
>>> from pyattn.nn import MultiHeadAttention
>>> mha = MultiHeadAttention(d_in=32, d_out=32, num_heads=4, context_length=8, rng=0)
>>> mha(np.zeros((4, 8, 32), np.float32)).shape
(4, 8, 32)
"""
from __future__ import annotations

import copy

import numpy as np

from ._api import _linear, matmul, multi_head_attention, scaled_dot_product_attention
from ._bridge import is_tensor, tensor_numpy, torch_bf16_hint
from ._checks import as_array, check_numeric, compute_dtype, fp8_of, index_value, is16, number, to_dtype
from ._grad import scaled_dot_product_attention_backward
from ._kvcache import KVCache
from ._paged import PagedKVCache, PagedPlan

__all__ = ["SelfAttention", "CausalAttention", "MultiHeadAttention"]

_QKV = (("W_query", "b_query"), ("W_key", "b_key"), ("W_value", "b_value"))


def _to_numpy(x, key):
    """Copy of a NumPy array or tensor (any device: copied to the CPU) in a
    compute dtype; a tensor read through the one bridge, _bridge.tensor_numpy."""
    try:
        if is_tensor(x):
            x = tensor_numpy(x.detach().cpu())
        a = np.array(x, copy=True)
    except Exception as exc:
        raise ValueError(f"state dict entry {key!r} could not be converted to an array: {exc}"
                         f"{torch_bf16_hint(x)}") from exc
    try:
        check_numeric(a, repr(key))
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return a.astype(compute_dtype((a, key)), copy=False)


def _input_not_mask(a, x):
    """True when a layer call's mask (or flag) slot holds the input itself or
    an array of its shape that cannot be a (T, T) mask (d_in != T): the
    PyTorch habit m(x, x), not a mask."""
    if a is None or isinstance(a, (bool, np.bool_)):
        return False
    if a is x:
        return True
    shape = np.shape(a)
    return x.ndim >= 2 and shape == x.shape and x.shape[-1] != x.shape[-2]


class _Attention:
    """Shared machinery: parameters, modes, state dicts, the forward call."""

    def __init__(self, d_in, d_out, num_heads, context_length, dropout, *, qkv_bias, causal,
                 out_proj, out_bias, rng):
        self.d_in = index_value(d_in, "d_in")
        self.d_out = index_value(d_out, "d_out")
        self.num_heads = index_value(num_heads, "num_heads")
        if self.d_in < 1 or self.d_out < 1:
            raise ValueError(f"d_in and d_out must be positive, got {self.d_in} and {self.d_out}")
        if self.num_heads < 1:
            raise ValueError(f"num_heads must be a positive integer, got {self.num_heads}")
        if self.d_out % self.num_heads:
            raise ValueError(f"d_out ({self.d_out}) must be divisible by num_heads ({self.num_heads})")
        self.context_length = None if context_length is None else index_value(context_length, "context_length")
        if self.context_length is not None and self.context_length < 1:
            raise ValueError(f"context_length must be positive, got {self.context_length}")
        self.dropout = number(dropout, "dropout")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.qkv_bias = bool(qkv_bias)
        self.causal = causal
        self.batch_first = True
        self.training = True
        self._rng = np.random.default_rng(rng)
        bound = 1.0 / np.sqrt(self.d_in)
        for w, b in _QKV:
            setattr(self, w, self._uniform((self.d_out, self.d_in), bound))
            setattr(self, b, self._uniform((self.d_out,), bound) if self.qkv_bias else None)
        self.out_proj_weight = self.out_proj_bias = None
        self._tape = None
        self.grads = {}
        self._has_out = out_proj
        self._has_out_bias = out_proj and out_bias
        if out_proj:
            ob = 1.0 / np.sqrt(self.d_out)
            self.out_proj_weight = self._uniform((self.d_out, self.d_out), ob)
            self.out_proj_bias = self._uniform((self.d_out,), ob) if out_bias else None
        self.zero_grad()

    def _uniform(self, shape, bound):
        return self._rng.uniform(-bound, bound, size=shape).astype(np.float32)

    # -- modes --------------------------------------------------------------
    def train(self, mode=True):
        """Dropout on (``mode=True``) or off; returns the layer.

        Parameters
        ----------
        mode : bool, default True
            Training mode (dropout on, the forward keeps what
            :meth:`backward` needs) or eval mode.

        Returns
        -------
        layer
            The layer itself.

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> layer.train().training, layer.train(False).training
        (True, False)
        """
        self.training = bool(mode)
        return self

    def eval(self):
        """Dropout off (inference); returns the layer.

        Returns
        -------
        layer
            The layer itself, in eval mode (``train(False)``).

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> layer.eval().training
        False
        """
        return self.train(False)

    # -- state ----------------------------------------------------------------
    def _expected(self):
        """key -> (attribute, shape) for every parameter this layer holds."""
        e = {}
        for (w, b), name in zip(_QKV, ("W_query", "W_key", "W_value")):
            e[f"{name}.weight"] = (w, (self.d_out, self.d_in))
            if self.qkv_bias:
                e[f"{name}.bias"] = (b, (self.d_out,))
        if self._has_out:
            e["out_proj.weight"] = ("out_proj_weight", (self.d_out, self.d_out))
            if self._has_out_bias:
                e["out_proj.bias"] = ("out_proj_bias", (self.d_out,))
        return e

    def parameters(self):
        """The live parameter arrays, keyed as :meth:`state_dict` (not copies:
        ``p -= lr * g`` updates the layer in place).

        Returns
        -------
        dict of str to ndarray
            The layer's own arrays.

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> sorted(layer.parameters())[:2]
        ['W_key.weight', 'W_query.weight']
        """
        return {k: getattr(self, attr) for k, (attr, _) in self._expected().items()}

    def zero_grad(self):
        """Set every entry of ``grads`` to zeros of its parameter's shape and dtype.

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> layer.zero_grad()
        >>> float(abs(layer.grads["W_query.weight"]).sum())
        0.0
        """
        self.grads = {k: np.zeros_like(p) for k, p in self.parameters().items()}

    def state_dict(self):
        """Copies of the parameters as NumPy arrays, under the seed classes' keys.

        Returns
        -------
        dict of str to ndarray
            ``W_query.weight``, ``W_key.weight``, ``W_value.weight`` (and their
            ``.bias`` with ``qkv_bias``), ``out_proj.weight`` / ``.bias`` where
            the layer has them.

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> layer.state_dict()["out_proj.weight"].shape
        (8, 8)
        """
        return {k: getattr(self, attr).copy() for k, (attr, _) in self._expected().items()}

    def load_state_dict(self, state_dict):
        """Load parameters from a mapping of NumPy arrays or tensors.

        Accepts the seed classes' keys (``W_query.weight``, ``W_key.weight``,
        ``W_value.weight``, optional ``.bias``, ``out_proj.weight``,
        ``out_proj.bias``; ``projection.*`` as an alias of ``out_proj.*``; a
        ``mask`` buffer is ignored) and ``torch.nn.MultiheadAttention``'s
        (``in_proj_weight``, ``in_proj_bias`` or ``q_proj_weight``,
        ``k_proj_weight``, ``v_proj_weight``; ``out_proj.*``). Missing,
        unexpected or misshapen keys raise ``ValueError`` naming the key and
        the constructor argument to change (``qkv_bias``, ``out_bias``,
        ``d_in``/``d_out``). A state dict holds no causality: a
        ``torch.nn.MultiheadAttention`` attends to every key unless called with
        a mask, so its weights match a layer built with ``causal=False``, which
        is what :meth:`from_torch` builds.

        Parameters
        ----------
        state_dict : mapping of str to array_like or torch.Tensor
            The parameters, under either family of keys above.

        Returns
        -------
        layer
            The layer itself.

        Raises
        ------
        ValueError
            A missing, unexpected or misshapen key.

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> other = MultiHeadAttention(8, 8, 2, rng=1).load_state_dict(layer.state_dict())
        >>> bool((other.W_query == layer.W_query).all())
        True
        """
        d = {str(k): v for k, v in dict(state_dict).items()}
        d.pop("mask", None)
        for k in list(d):
            if k.startswith("projection."):
                d["out_proj." + k[len("projection."):]] = d.pop(k)
        names = ("W_query", "W_key", "W_value")
        if "in_proj_weight" in d:
            w = _to_numpy(d.pop("in_proj_weight"), "in_proj_weight")
            if w.shape != (3 * self.d_out, self.d_in):
                hint = (f": construct the layer with d_in={w.shape[1]}, d_out={w.shape[0] // 3}"
                        if w.ndim == 2 and w.shape[0] % 3 == 0 else "")
                raise ValueError(f"state dict entry 'in_proj_weight' has shape {w.shape}, "
                                 f"expected {(3 * self.d_out, self.d_in)}{hint}")
            for i, n in enumerate(names):
                d[f"{n}.weight"] = w[i * self.d_out:(i + 1) * self.d_out]
        for n, t in zip(names, ("q", "k", "v")):
            if f"{t}_proj_weight" in d:
                d[f"{n}.weight"] = d.pop(f"{t}_proj_weight")
        if "in_proj_bias" in d:
            b = _to_numpy(d.pop("in_proj_bias"), "in_proj_bias")
            if b.shape != (3 * self.d_out,):
                raise ValueError(f"state dict entry 'in_proj_bias' has shape {b.shape}, "
                                 f"expected {(3 * self.d_out,)}")
            for i, n in enumerate(names):
                d[f"{n}.bias"] = b[i * self.d_out:(i + 1) * self.d_out]
        expected = self._expected()
        for k in d:
            if k not in expected:
                raise ValueError(f"unexpected key {k!r} in state dict (this layer holds: "
                                 f"{', '.join(expected)}){self._fix_hint(k, present=True)}")
        new = {}
        for k, (attr, shape) in expected.items():
            if k not in d:
                raise ValueError(f"missing key {k!r} in state dict{self._fix_hint(k, present=False)}")
            a = _to_numpy(d[k], k)
            if a.shape != shape:
                raise ValueError(f"state dict entry {k!r} has shape {a.shape}, expected {shape}"
                                 f"{self._shape_hint(k, a.shape)}")
            new[attr] = a
        for attr, a in new.items():
            setattr(self, attr, a)
        self.zero_grad()
        self._tape = None
        return self

    def _fix_hint(self, key, present):
        """Which constructor argument makes a layer that holds (present=True)
        or lacks key."""
        cls = type(self).__name__
        if key.endswith(".bias") and key.split(".")[0] in ("W_query", "W_key", "W_value"):
            return (f": construct the layer with qkv_bias={present} "
                    f"({cls}(..., qkv_bias={present}), or {cls}.from_torch(module))")
        if key == "out_proj.bias" and self._has_out:
            return (f": construct the layer with out_bias={present} "
                    f"({cls}(..., out_bias={present}), or {cls}.from_torch(module))")
        if key.startswith("out_proj.") and present and not self._has_out:
            return f": {cls} has no output projection; MultiHeadAttention (num_heads=1 for one head) has"
        return ""

    def _shape_hint(self, key, shape):
        """Which constructor arguments give a parameter of this shape."""
        if key.endswith(".weight") and len(shape) == 2 and key != "out_proj.weight":
            return f": construct the layer with d_in={shape[1]}, d_out={shape[0]}"
        if key == "out_proj.weight" and len(shape) == 2:
            return f": construct the layer with d_out={shape[0]}"
        return ""

    # -- from PyTorch ------------------------------------------------------------
    @classmethod
    def from_torch(cls, module, *, rng=None):
        """The layer matching a PyTorch module, its weights copied (as NumPy arrays).

        ``MultiHeadAttention.from_torch`` takes a ``torch.nn.MultiheadAttention``
        (self-attention: ``kdim = vdim = embed_dim``, no ``add_bias_kv`` or
        ``add_zero_attn``), giving ``causal=False``, its biases, dropout and
        ``batch_first``, so that ``layer(x)`` equals ``module(x, x, x)[0]``
        and ``layer(x, context=ctx)`` equals ``module(x, ctx, ctx)[0]``
        (cross-attention) (eval mode; with a causal ``attn_mask`` there: build with
        ``causal=True``), or a seed notebook's ``MultiHeadAttention`` /
        ``MultiHeadAttentionOneModule`` (``W_query``, ``W_key``, ``W_value``,
        ``out_proj`` or ``projection`` as ``torch.nn.Linear``, ``num_heads``;
        causal). ``CausalAttention.from_torch`` takes the seeds'
        ``CausalAttention``; ``SelfAttention.from_torch`` their
        ``SelfAttentionV2`` / ``SelfAttentionLinear`` (``W_query`` or ``W_q``
        as ``torch.nn.Linear``) or ``SelfAttentionParameter`` (``W_q``, ``W_k``,
        ``W_v`` as ``(d_in, d_out)`` parameters). The layer's mode (training
        or eval) is the module's. Other modules are a ``TypeError`` naming
        what is accepted; settings pyattn does not have are a ``ValueError``.

        Parameters
        ----------
        module : torch.nn.Module
            One of the PyTorch modules above (CPU or not): its weights are
            copied into NumPy arrays, as :meth:`load_state_dict` takes them.
        rng : int, numpy.random.Generator or None, optional
            Seeds the layer's dropout draws (the initial weights it would
            draw are replaced by the module's).

        Returns
        -------
        layer : SelfAttention, CausalAttention or MultiHeadAttention
            A layer of the class ``from_torch`` is called on, in the
            module's mode, holding copies of its weights.

        Raises
        ------
        TypeError
            Not a ``torch.nn.Module``, or a module this class does not take
            (the message names what it accepts): no ``W_query`` / ``W_key`` /
            ``W_value``, no output projection or ``num_heads`` for
            ``MultiHeadAttention``, an output projection for the single-head
            layers, no ``context_length`` (or mask buffer) for
            ``CausalAttention``.
        ValueError
            Settings pyattn does not have (``kdim`` / ``vdim`` other than
            ``embed_dim``, ``add_bias_kv``, ``add_zero_attn``); weights that
            cannot be converted to arrays.

        Examples
        --------
        >>> import numpy as np, torch
        >>> from pyattn.nn import MultiHeadAttention
        >>> _ = torch.manual_seed(0)
        >>> t = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
        >>> layer = MultiHeadAttention.from_torch(t)
        >>> layer.causal, layer.qkv_bias, layer.batch_first, layer.training
        (False, True, True, False)
        >>> x = torch.randn(2, 5, 16)
        >>> bool(np.allclose(layer(x.numpy()), t(x, x, x)[0].detach().numpy(), atol=1e-5))
        True
        """
        name = type(module).__name__
        sd = dict(module.state_dict()) if hasattr(module, "state_dict") else None
        if sd is None:
            raise TypeError(f"from_torch takes a torch.nn.Module, got {name}")
        training = bool(getattr(module, "training", True))

        def linear(*names):
            for n in names:
                lin = getattr(module, n, None)
                if lin is not None and hasattr(lin, "weight"):
                    return n, lin
            return None, None

        def dropout_p():
            d = getattr(module, "dropout", 0.0)
            return float(getattr(d, "p", d))

        if cls is MultiHeadAttention and hasattr(module, "in_proj_bias") and hasattr(module, "embed_dim"):
            # torch.nn.MultiheadAttention
            if not getattr(module, "_qkv_same_embed_dim", True):
                raise ValueError("from_torch: the module's kdim/vdim differ from embed_dim "
                                 f"({module.kdim}, {module.vdim} vs {module.embed_dim}); pyattn's "
                                 "MultiHeadAttention projects queries, keys and values from inputs "
                                 "of one width d_in (cross-attention: layer(x, context=ctx) with ctx "
                                 "of that width)")
            if getattr(module, "bias_k", None) is not None or getattr(module, "add_zero_attn", False):
                raise ValueError("from_torch: add_bias_kv and add_zero_attn have no pyattn equivalent")
            E = int(module.embed_dim)
            layer = cls(E, E, int(module.num_heads), None, dropout_p(), module.in_proj_bias is not None,
                        causal=False, out_bias=module.out_proj.bias is not None,
                        batch_first=bool(getattr(module, "batch_first", False)), rng=rng)
            return layer.load_state_dict(sd).train(training)
        qn, q = linear("W_query", "W_q", "query")
        kn, k = linear("W_key", "W_k", "key")
        vn, v = linear("W_value", "W_v", "value")
        out_name, out = linear("out_proj", "projection")
        transposed = False
        if q is None and cls is SelfAttention and all(
                getattr(getattr(module, n, None), "ndim", 0) == 2 for n in ("W_q", "W_k", "W_v")):
            transposed = True             # seed 001 SelfAttentionParameter: x @ W_q, W (d_in, d_out)
        elif q is None or k is None or v is None:
            raise TypeError(f"{cls.__name__}.from_torch: {name} is not a module it knows: "
                            + _FROM_TORCH_ACCEPTS[cls.__name__])
        if transposed:
            w = {n: _to_numpy(getattr(module, m), m).T
                 for n, m in (("W_query", "W_q"), ("W_key", "W_k"), ("W_value", "W_v"))}
            d_in, d_out = w["W_query"].shape[1], w["W_query"].shape[0]
            state = {f"{n}.weight": a for n, a in w.items()}
            qkv_bias = False
        else:
            d_out, d_in = (int(n) for n in q.weight.shape)
            qkv_bias = q.bias is not None
            state = {}
            for new, lin in (("W_query", q), ("W_key", k), ("W_value", v)):
                state[f"{new}.weight"] = lin.weight
                if lin.bias is not None:
                    state[f"{new}.bias"] = lin.bias
        if cls is MultiHeadAttention:
            if out is None or not hasattr(module, "num_heads"):
                raise TypeError(f"MultiHeadAttention.from_torch: {name} has no output projection "
                                "(out_proj or projection) or no num_heads: "
                                + _FROM_TORCH_ACCEPTS[cls.__name__])
            state["out_proj.weight"] = out.weight
            if out.bias is not None:
                state["out_proj.bias"] = out.bias
            layer = cls(d_in, d_out, int(module.num_heads), _context_length(module), dropout_p(),
                        qkv_bias, causal=True, out_bias=out.bias is not None, rng=rng)
        else:
            if out is not None:
                raise TypeError(f"{cls.__name__}.from_torch: {name} has an output projection "
                                f"({out_name}); use MultiHeadAttention.from_torch")
            if cls is CausalAttention:
                ctx = _context_length(module)
                if ctx is None:
                    raise TypeError("CausalAttention.from_torch: the module has no context_length "
                                    "(or mask buffer) to take it from")
                layer = cls(d_in, d_out, ctx, dropout_p(), qkv_bias, rng=rng)
            else:
                layer = cls(d_in, d_out, qkv_bias, rng=rng)
        return layer.load_state_dict(state).train(training)

    # -- generation -----------------------------------------------------------
    def new_cache(self, batch, max_len, dtype=np.float32, group_size=32):
        """A :class:`pyattn.KVCache` for this layer: ``batch`` sequences of up to
        ``max_len`` tokens, one cache head per attention head (``d_out / num_heads``
        features), float32 (default), float64, float16, bfloat16, or quantized
        ``"int8"`` / ``"int4"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (fp8: needs
        ``ml_dtypes``) with a float32 scale per ``group_size`` values.

        Parameters
        ----------
        batch : int
            Sequences.
        max_len : int
            Tokens per sequence.
        dtype : dtype or {"int8", "int4", "fp8_e4m3", "fp8_e5m2"}, default numpy.float32
            The cache's storage.
        group_size : int, default 32
            Values per scale of a quantized cache.

        Returns
        -------
        KVCache
            An empty cache to pass as ``layer(x, cache=...)``.

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> layer.new_cache(batch=2, max_len=16).k.shape
        (2, 2, 16, 4)
        """
        hd = self.d_out // self.num_heads
        return KVCache(batch, self.num_heads, max_len, hd, hd, dtype, group_size)

    def _call_cached(self, x, cache, attn_mask, return_weights, precision=None):
        """x (B, T, d_in) or (T, d_in): only the new tokens; their keys and
        values are appended to cache, and they attend to everything cached."""
        if isinstance(cache, tuple):                  # (PagedKVCache, seqs, cu_seqlens_q, plan)
            return self._call_paged(x, *cache, attn_mask, return_weights, precision)
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a pyattn.KVCache (layer.new_cache(...)) or a "
                            f"pyattn.PagedKVCache with seqs=, got {type(cache).__name__}")
        if attn_mask is not None or return_weights:
            raise ValueError("attn_mask and return_weights are not available with a cache")
        if self.training and self.dropout > 0:
            raise ValueError("a cache is for inference: call layer.eval() first (dropout is on in training mode)")
        H, hd = self.num_heads, self.d_out // self.num_heads
        B = 1 if x.ndim == 2 else x.shape[0]
        per = 2 if cache.k.dtype == np.uint8 else 1             # int4: two values per byte
        if cache.k.shape[:2] != (B, H) or cache.k.shape[3] * per != hd or cache.v.shape[3] * per != hd:
            raise ValueError(f"cache {cache!r} does not fit this layer and input: expected batch {B}, "
                             f"{H} heads of {hd} features (layer.new_cache(batch, max_len))")
        T = x.shape[-2]
        if self.context_length is not None and (cache.lengths + T > self.context_length).any():
            raise ValueError(f"the cache holds {cache.lengths.tolist()} tokens; {T} more exceed "
                             f"context_length={self.context_length}")
        dt = np.dtype(np.float32) if is16(cache.k.dtype) or cache.k.dtype.kind in "iu" or fp8_of(cache.k.dtype) \
            else cache.k.dtype
        x3 = to_dtype(x if x.ndim == 3 else x[None], dt)
        q, k, v = self._qkv(x3, dt)
        ctx = np.empty((B, T, H, hd), dt)
        cache.attend(q, k, v, is_causal=bool(self.causal), out=ctx.transpose(0, 2, 1, 3), precision=precision)
        out = ctx.reshape(B, T, self.d_out)
        if self._has_out:
            out = _linear(out, self.out_proj_weight, self.out_proj_bias, dt)
        return out if x.ndim == 3 else out[0]

    def _call_paged(self, x, cache, seqs, cu, plan, attn_mask, return_weights, precision=None):
        """x (len(seqs), T, d_in), or packed (total, d_in) with cu_seqlens_q:
        the new tokens of the sequences seqs of a PagedKVCache."""
        if attn_mask is not None or return_weights:
            raise ValueError("attn_mask and return_weights are not available with a cache")
        if self.training and self.dropout > 0:
            raise ValueError("a cache is for inference: call layer.eval() first (dropout is on in training mode)")
        if seqs is None:
            raise TypeError("a PagedKVCache needs seqs=[sequence ids] (one per row of x)")
        H, hd = self.num_heads, self.d_out // self.num_heads
        per = 2 if cache.k.dtype == np.uint8 else 1             # int4: two values per byte
        if cache.k.shape[1] != H or cache.k.shape[3] * per != hd or cache.v.shape[3] * per != hd:
            raise ValueError(f"cache {cache!r} does not fit this layer: expected {H} heads of {hd} features")
        if cu is None and x.ndim != 3:
            raise ValueError(f"x must be (len(seqs), T, d_in) with a PagedKVCache (or packed (total, d_in) "
                             f"with cu_seqlens_q), got shape {x.shape}")
        if cu is not None and x.ndim != 2:
            raise ValueError(f"x must be packed (total, d_in) with cu_seqlens_q, got shape {x.shape}")
        dt = np.dtype(np.float32) if is16(cache.k.dtype) or cache.k.dtype.kind in "iu" or fp8_of(cache.k.dtype) \
            else cache.k.dtype
        x3 = to_dtype(x if x.ndim == 3 else x[None], dt)
        q, k, v = self._qkv(x3, dt)
        if cu is not None:                            # (1, H, total, hd) -> (total, H, hd)
            q, k, v = (t[0].transpose(1, 0, 2) for t in (q, k, v))
        if self.context_length is not None:
            if plan is not None and type(plan) is PagedPlan:      # (anything else: attend says what it is)
                over = np.flatnonzero(plan._kv_len > self.context_length)
                if over.size:
                    i = int(over[0])
                    raise ValueError(f"sequence {plan.seqs[i]} holds {int(plan.cache_seqlens[i])} tokens; "
                                     f"{plan._Ts[i]} more exceed context_length={self.context_length}")
            else:
                ids = list(seqs)
                Ts = np.diff(np.asarray(cu)) if cu is not None else [x.shape[1]] * len(ids)
                for s, t in zip(ids, Ts):
                    if cache.length(s) + int(t) > self.context_length:
                        raise ValueError(f"sequence {s} holds {cache.length(s)} tokens; {int(t)} more exceed "
                                         f"context_length={self.context_length}")
        ctx = cache.attend(seqs, q, k, v, cu_seqlens_q=cu, is_causal=bool(self.causal), plan=plan,
                           precision=precision)
        out = ctx.reshape(-1, self.d_out) if cu is not None else \
            ctx.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], self.d_out)
        if self._has_out:
            out = _linear(out[None] if cu is not None else out, self.out_proj_weight, self.out_proj_bias, dt)
            out = out[0] if cu is not None else out
        return out

    def _qkv(self, x3, dt, kv3=None):
        """The heads' q, k, v (B, H, T, head dim) of x3 (B, T, d_in): the
        projections, split from the last axis as the seeds do; k and v from
        kv3 (B, S, d_in) when given (cross-attention)."""
        H, hd = self.num_heads, self.d_out // self.num_heads
        kv3 = x3 if kv3 is None else kv3
        return tuple(_linear(a, w, b, dt).reshape(a.shape[0], a.shape[1], H, hd).transpose(0, 2, 1, 3)
                     for a, w, b in ((x3, self.W_query, self.b_query), (kv3, self.W_key, self.b_key),
                                     (kv3, self.W_value, self.b_value)))

    # -- forward --------------------------------------------------------------
    def __call__(self, x, attn_mask=None, return_weights=False, *args, context=None, cache=None,
                 seqs=None, cu_seqlens_q=None, plan=None, precision=None):
        """x (B, T, d_in) or (T, d_in) -> (B, T, d_out) [, weights (B, H, T, T)].

        Self-attention: queries, keys and values all come from ``x``.
        A PyTorch-style ``m(x, x, x)`` or ``m(x, x)`` -- a second array that is
        ``x`` itself or has ``x``'s shape with ``d_in != T``, so it cannot be
        a mask -- is a ``TypeError`` that says so, never ``x`` read as a mask.
        ``layer.forward(...)`` is the same call.

        With ``cache`` (from :meth:`new_cache`), ``x`` holds only the new
        tokens: their keys and values are appended to the cache and they
        attend to every cached token (causally within themselves for causal
        layers), so generating token by token gives the rows of the
        full-sequence call. Inference only (eval mode or no dropout), no
        ``attn_mask`` or weights; the result has the cache's compute dtype
        (float32 for 16-bit caches).

        Parameters
        ----------
        x : array_like
            ``(B, T, d_in)`` or ``(T, d_in)`` (unbatched); with
            ``batch_first=False`` (layers from a ``torch.nn.MultiheadAttention``
            made so) a 3-d ``x`` is ``(T, B, d_in)``. Float dtypes as
            :func:`pyattn.multi_head_attention` takes them; ``T`` at most
            ``context_length`` (when the layer has one).
        attn_mask : array_like, optional
            Positional or keyword, as in API.md: bool (``True`` = may
            attend) or float (added), broadcast to ``(B, H, T, T)``
            (``(B, H, T, S)`` with ``context``). Combined with the layer's
            causal rule.
        return_weights : bool, default False
            Also return the attention weights.
        *args
            Not accepted: a positional argument after ``return_weights`` is
            a ``TypeError`` naming the fix (the other arguments are
            keyword-only).
        context : array_like, optional
            Cross-attention (PyTorch's ``mha(query, key, value)`` with key =
            value): ``context (B, S, d_in)`` (``(S, d_in)`` beside a 2-d
            ``x``) -- the keys and values are projected from ``context``, the
            queries from ``x``, the layer's ``causal`` is not applied (as
            PyTorch's cross-attention), masks and weights are ``(..., T,
            S)``; not with a cache. ``ValueError`` for a ``context`` whose
            batch or ``d_in`` is not ``x``'s.
        cache : pyattn.KVCache or pyattn.PagedKVCache, optional
            A :class:`pyattn.KVCache` from :meth:`new_cache` (``x`` holds the
            new tokens, one row per cache sequence). A
            :class:`pyattn.PagedKVCache` (heads and head dim as the layer's)
            takes ``seqs``.
        seqs : sequence of int, optional
            With a :class:`pyattn.PagedKVCache`: its sequence ids, one per
            row of ``x (len(seqs), T, d_in)``.
        cu_seqlens_q : (len(seqs) + 1,) integer array, optional
            With a :class:`pyattn.PagedKVCache`: ``x`` packed ``(total,
            d_in)`` (different token counts per sequence), sequence ``i``'s
            tokens in rows ``cu_seqlens_q[i]`` to ``cu_seqlens_q[i + 1]``.
        plan : PagedPlan, optional
            With a :class:`pyattn.PagedKVCache`: this step, planned once for
            the caches of every layer (:meth:`pyattn.PagedKVCache.plan`);
            ``seqs`` and ``cu_seqlens_q`` default to the plan's (given, they
            must be the plan's). The result is the call without it, bit for
            bit.
        precision : None, "highest", "bf16" or "int8", optional
            With a cache only (else a ``ValueError``): the cache's
            ``attend``'s (``"int8"``: int8 / int4 caches, int8 query rows and
            integer key products; ``"bf16"`` with int8 / int4 / fp8 caches:
            the query rounded to bfloat16, exact key products; see
            :func:`pyattn.attention_with_kvcache`).

        Returns
        -------
        out : ndarray
            ``(B, T, d_out)`` (``(T, d_out)`` for a 2-d ``x``, ``(T, B,
            d_out)`` with ``batch_first=False``); with a
            :class:`pyattn.PagedKVCache`, shaped as ``x`` with ``d_out``.
        weights : ndarray
            Only with ``return_weights=True`` (then ``(out, weights)``):
            ``(B, H, T, T)``, or ``(B, T, T)`` for the single-head layers
            without an output projection (:class:`SelfAttention`,
            :class:`CausalAttention`); ``(..., T, S)`` with ``context``.

        Raises
        ------
        TypeError
            A second input array where a mask belongs, extra positional
            arguments, ``seqs`` / ``cu_seqlens_q`` / ``plan`` without a
            :class:`pyattn.PagedKVCache`, a ``cache`` of another type, a
            :class:`pyattn.PagedKVCache` without ``seqs``.
        ValueError
            ``x`` not ``(B, T, d_in)`` or ``(T, d_in)``; ``T`` (or the cached
            tokens plus ``T``) over ``context_length``; a ``context`` that
            does not fit ``x``, or given with a cache; a cache that does not
            fit the layer; ``attn_mask`` or ``return_weights`` with a cache,
            or a cache in training mode with dropout; and the errors of
            :func:`pyattn.multi_head_attention` (masks that do not
            broadcast, ...).
        pyattn.CacheFullError
            The cache has no room for the new tokens.

        Examples
        --------
        >>> import numpy as np
        >>> from pyattn.nn import MultiHeadAttention
        >>> m = MultiHeadAttention(8, 8, 2, rng=0).eval()
        >>> x = np.ones((1, 3, 8), np.float32)
        >>> m(x, attn_mask=np.tril(np.ones((3, 3), bool))).shape
        (1, 3, 8)
        >>> out, w = m(x, return_weights=True)
        >>> w.shape, w[0, 0, 0]                        # causal: row 0 sees token 0 only
        ((1, 2, 3, 3), array([1., 0., 0.], dtype=float32))

        Cross-attention, and generation token by token with a cache:

        >>> m(x, context=np.ones((1, 5, 8), np.float32)).shape
        (1, 3, 8)
        >>> cache = m.new_cache(batch=1, max_len=8)
        >>> steps = [m(x[:, t:t + 1], cache=cache) for t in range(3)]
        >>> bool(np.allclose(np.concatenate(steps, axis=1), m(x), atol=1e-6))
        True

        Layers with a :class:`pyattn.PagedKVCache` each, one plan per step:

        >>> import pyattn
        >>> layers = [MultiHeadAttention(8, 8, 2, rng=i).eval() for i in range(2)]
        >>> caches = [pyattn.PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=2, head_dim=4)
        ...           for _ in layers]
        >>> seq = [c.add_sequence() for c in caches][0]
        >>> h = x
        >>> plan = caches[0].plan([seq], new_tokens=3)
        >>> for layer, c in zip(layers, caches):
        ...     h = layer(h, cache=c, plan=plan)
        >>> h.shape, caches[1].length(seq)
        ((1, 3, 8), 3)
        """
        x = np.asarray(x) if not isinstance(x, np.ndarray) else x
        if isinstance(cache, PagedKVCache) or seqs is not None or cu_seqlens_q is not None or plan is not None:
            if not isinstance(cache, PagedKVCache):
                raise TypeError("seqs, cu_seqlens_q and plan go with cache=pyattn.PagedKVCache(...)" if
                                plan is None else "plan goes with cache=pyattn.PagedKVCache(...) (a plan of "
                                "PagedKVCache.plan), not with " + type(cache).__name__)
            if plan is not None:
                seqs = plan.seqs if seqs is None else seqs
                cu_seqlens_q = plan.cu_seqlens_q if cu_seqlens_q is None else cu_seqlens_q
            cache = (cache, seqs, cu_seqlens_q, plan)
        if args or _input_not_mask(attn_mask, x) or _input_not_mask(return_weights, x):
            raise TypeError(
                f"{type(self).__name__}(x, attn_mask=None, return_weights=False) got a second input "
                "array where a mask belongs: a PyTorch-style m(x, x, x) or m(x, x) is m(x) "
                "(self-attention), and m(x, ctx, ctx) is m(x, context=ctx) (cross-attention: keys and "
                "values from another sequence); a mask is bool or float, broadcast to (B, H, T, S) "
                "(attn_mask=...)")
        if x.ndim not in (2, 3) or x.shape[-1] != self.d_in:
            lead = "(B, T" if self.batch_first else "(T, B"
            raise ValueError(f"x must have shape {lead}, {self.d_in}) or (T, {self.d_in}), got {x.shape}")
        if context is not None:
            context = self._check_context(context, x, cache)
        if precision is not None and cache is None:
            raise ValueError("precision= goes with a cache (the cache's attend); without one the layer "
                             "computes at the default precision")
        if self.batch_first or x.ndim == 2:
            return self._forward(x, attn_mask, return_weights, cache, context, precision)
        res = self._forward(x.swapaxes(0, 1), attn_mask, return_weights, cache,
                            None if context is None else context.swapaxes(0, 1), precision)   # (T, B, .)
        if self._tape is not None:
            self._tape["seq_first"] = True
        if isinstance(res, tuple):
            return (res[0].swapaxes(0, 1),) + tuple(res[1:])
        return res.swapaxes(0, 1)

    def _check_context(self, context, x, cache):
        """context as an array that fits x: the same number of axes, batch
        (axis 0 batch-first, 1 otherwise) and d_in."""
        c = as_array(context, "context")
        check_numeric(c, "context")
        if cache is not None:
            raise ValueError("context= (cross-attention) is not available with a cache: the cache holds "
                             "the keys and values of x's own tokens")
        lead = "(S, d_in)" if x.ndim == 2 else "(B, S, d_in)" if self.batch_first else "(S, B, d_in)"
        bax = 0 if self.batch_first else 1
        if c.ndim != x.ndim or c.shape[-1] != self.d_in or (x.ndim == 3 and c.shape[bax] != x.shape[bax]):
            raise ValueError(f"context must have shape {lead} with x's batch and d_in={self.d_in} "
                             f"(x has shape {x.shape}), got {c.shape}")
        return c

    def _forward(self, x, attn_mask, return_weights, cache, context=None, precision=None):
        """The call on x (B, T, d_in) or (T, d_in) (and context (B, S, d_in) or (S, d_in))."""
        self._tape = None                  # backward goes back through this call only
        if cache is not None:
            return self._call_cached(x, cache, attn_mask, return_weights, precision)
        T = x.shape[-2]
        if self.context_length is not None and T > self.context_length:
            raise ValueError(f"x has {T} tokens (shape {x.shape}), more than context_length={self.context_length}")
        p = self.dropout if self.training else 0.0
        if self.training:
            return self._call_train(x, attn_mask, return_weights, p, context)
        kv = x if context is None else context
        res = multi_head_attention(
            x, kv, kv, self.num_heads, self.W_query, self.W_key, self.W_value,
            self.out_proj_weight, self.b_query, self.b_key, self.b_value, self.out_proj_bias,
            attn_mask=attn_mask, is_causal=self.causal and context is None, dropout_p=p,
            rng=self._rng if p > 0 else None, return_weights=return_weights)
        if return_weights and self.num_heads == 1 and not self._has_out:
            out, w = res
            return out, w[..., 0, :, :]
        return res

    forward = __call__

    # -- training -------------------------------------------------------------
    def _call_train(self, x, attn_mask, return_weights, p, context=None):
        """The forward of multi_head_attention (same arithmetic, same
        result), keeping what backward needs: the input, the heads' q, k, v,
        the attention output and its log-sum-exp, the dropout generator's
        state before the call. Never an (L, S) matrix (unless the weights
        are asked for)."""
        params = [a for a in (self.W_query, self.W_key, self.W_value, self.out_proj_weight,
                              self.b_query, self.b_key, self.b_value, self.out_proj_bias) if a is not None]
        named = [(x, "x")] + ([] if context is None else [(context, "context")])
        dt = compute_dtype(*named, *[(a, "parameter") for a in params])
        x3 = to_dtype(x if x.ndim == 3 else x[None], dt)
        kv3 = None if context is None else to_dtype(context if context.ndim == 3 else context[None], dt)
        B, T = x3.shape[:2]
        H, hd = self.num_heads, self.d_out // self.num_heads
        q, k, v = self._qkv(x3, dt, kv3)
        causal = self.causal and context is None
        ctx = np.empty((B, T, H, hd), dt)
        rng = copy.deepcopy(self._rng) if p > 0 else None
        r = scaled_dot_product_attention(q, k, v, attn_mask, p, causal, rng=self._rng if p > 0 else None,
                                         return_weights=return_weights, return_lse=True,
                                         out=ctx.transpose(0, 2, 1, 3))
        lse = r[-1]
        ctx = ctx.reshape(B, T, self.d_out)
        out = ctx if not self._has_out else _linear(ctx, self.out_proj_weight, self.out_proj_bias, dt)
        self._tape = dict(x=x3, kv=kv3, q=q, k=k, v=v, ctx=ctx, lse=lse, mask=attn_mask, p=p, rng=rng,
                          dt=dt, unbatched=x.ndim == 2, causal=causal)
        if x.ndim == 2:
            out = out[0]
        if not return_weights:
            return out
        w = r[1] if x.ndim == 3 else r[1][0]
        if self.num_heads == 1 and not self._has_out:
            w = w[..., 0, :, :]
        return out, w

    def backward(self, grad_y):
        """Backpropagate through the last call (made in training mode).

        ``grad_y``: the gradient of a loss with respect to that call's output
        (its shape). Returns the gradient with respect to that call's input
        ``x`` and adds each parameter's gradient into ``grads`` (keys of
        :meth:`state_dict`; accumulated until :meth:`zero_grad`, as PyTorch's
        ``.grad``). Dropout is part of the gradient (the call's pattern is
        regenerated). The attention part runs
        :func:`pyattn.scaled_dot_product_attention_backward`; the projections
        are matrix products.

        Parameters
        ----------
        grad_y : array_like
            The gradient of the loss with respect to the last call's output.

        Returns
        -------
        ndarray or tuple of ndarray
            The gradient with respect to that call's input ``x``; after a
            cross-attention call (``context=``), ``(grad_x, grad_context)``.

        Raises
        ------
        RuntimeError
            There is no training-mode call to go back through (none yet, an
            eval-mode call since, or its backward already ran).
        ValueError
            ``grad_y``'s shape is not the output's.

        Examples
        --------
        >>> from pyattn.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 2, rng=0)
        >>> import numpy as np
        >>> y = layer(np.ones((1, 3, 8), np.float32))
        >>> layer.backward(np.ones_like(y)).shape
        (1, 3, 8)
        """
        t = self._tape
        if t is None:
            raise RuntimeError("backward needs a preceding call in training mode (layer.train()), "
                               "and runs once per call")
        dt, x3, ctx = t["dt"], t["x"], t["ctx"]
        B, T = x3.shape[:2]
        H, hd = self.num_heads, self.d_out // self.num_heads
        seq_first = t.get("seq_first", False)
        oshape = (T, self.d_out) if t["unbatched"] else (T, B, self.d_out) if seq_first else (B, T, self.d_out)
        gy = as_array(grad_y, "grad_y")
        if gy.shape != oshape:
            raise ValueError(f"grad_y has shape {gy.shape}, but the layer's output has shape {oshape}")
        if seq_first:
            gy = gy.swapaxes(0, 1)
        if gy.dtype.kind != "f":
            raise TypeError(f"grad_y must be a float array, got dtype {gy.dtype}")
        gy = to_dtype(gy, dt).reshape(B * T, self.d_out)
        self._tape = None
        new = {}
        if self._has_out:
            new["out_proj.weight"] = matmul(gy.T, ctx.reshape(B * T, self.d_out))
            if self._has_out_bias:
                new["out_proj.bias"] = gy.sum(axis=0)
            gctx = matmul(gy, to_dtype(self.out_proj_weight, dt))
        else:
            gctx = gy
        go = gctx.reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        o = ctx.reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        dq, dk, dv = scaled_dot_product_attention_backward(
            go, t["q"], t["k"], t["v"], o, t["lse"], t["mask"], t["p"], t.get("causal", self.causal),
            rng=t["rng"])
        kv3 = t.get("kv")
        S = T if kv3 is None else kv3.shape[1]
        x2 = x3.reshape(B * T, self.d_in)
        kv2 = x2 if kv3 is None else kv3.reshape(B * S, self.d_in)
        gin = {"x": None, "kv": None}         # gradients of x and (cross-attention) of context
        for g, (w, b), name in zip((dq, dk, dv), _QKV, ("W_query", "W_key", "W_value")):
            n = T if name == "W_query" else S
            src, to = (x2, "x") if name == "W_query" or kv3 is None else (kv2, "kv")
            g2 = g.transpose(0, 2, 1, 3).reshape(B * n, self.d_out)
            new[f"{name}.weight"] = matmul(g2.T, src)
            if self.qkv_bias:
                new[f"{name}.bias"] = g2.sum(axis=0)
            part = matmul(g2, to_dtype(getattr(self, w), dt))
            gin[to] = part if gin[to] is None else gin[to] + part
        gx = gin["x"]
        for key_, g in new.items():
            acc = self.grads.get(key_)
            param = self.parameters()[key_]
            if acc is None or acc.shape != param.shape or acc.dtype != param.dtype:
                acc = self.grads[key_] = np.zeros_like(param)
            acc += g.astype(acc.dtype, copy=False)
        def shaped(g, n):
            g = g.reshape(B, n, self.d_in)
            return g[0] if t["unbatched"] else g.swapaxes(0, 1) if seq_first else g
        if kv3 is None:
            return shaped(gx, T)
        return shaped(gx, T), shaped(gin["kv"], S)

    def __repr__(self):
        extra = f", context_length={self.context_length}" if self.context_length is not None else ""
        return (f"{type(self).__name__}(d_in={self.d_in}, d_out={self.d_out}, num_heads={self.num_heads}"
                f"{extra}, dropout={self.dropout}, qkv_bias={self.qkv_bias}, causal={self.causal!r}"
                f"{'' if self.batch_first else ', batch_first=False'})")


class SelfAttention(_Attention):
    """Single-head self-attention (seed 001 ``SelfAttentionLinear``, seed 004 ``SelfAttentionV2``).

    ``out = softmax((x W_q^T)(x W_k^T)^T / sqrt(d_out)) (x W_v^T)``; every
    token attends to every token. Input ``(B, T, d_in)`` or ``(T, d_in)``,
    output ``(B, T, d_out)``; with ``return_weights=True`` also the weights
    ``(B, T, T)``.

    Parameters
    ----------
    d_in : int
        Input features.
    d_out : int
        Output features (the query/key/value width).
    qkv_bias : bool, default False
        Biases in the query, key and value projections.
    rng : int, numpy.random.Generator or None, optional
        Seeds the weights' uniform initialisation (PyTorch's ``nn.Linear``
        bounds) and the dropout draws.

    Raises
    ------
    ValueError
        Non-positive sizes, ``d_out`` not divisible by ``num_heads``, dropout
        outside ``[0, 1)``.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.nn import SelfAttention
    >>> SelfAttention(3, 2, rng=0)(np.ones((6, 3))).shape
    (6, 2)
    """

    def __init__(self, d_in, d_out, qkv_bias=False, *, rng=None):
        super().__init__(d_in, d_out, 1, None, 0.0, qkv_bias=qkv_bias, causal=False,
                         out_proj=False, out_bias=False, rng=rng)


class CausalAttention(_Attention):
    """Single-head causal attention with dropout (seed 004 ``CausalAttention``).

    Token t attends to tokens ``<= t``; dropout on the weights in training
    mode. ``T > context_length`` is a ``ValueError``. Input ``(B, T, d_in)``
    or ``(T, d_in)``, output ``(B, T, d_out)`` [, weights ``(B, T, T)``].

    Parameters
    ----------
    d_in : int
        Input features.
    d_out : int
        Output features (the query/key/value width).
    context_length : int
        The longest sequence a call takes (``T > context_length`` is a
        ``ValueError``).
    dropout : float, default 0.0
        Dropout on the attention weights in training mode, in ``[0, 1)``.
    qkv_bias : bool, default False
        Biases in the query, key and value projections.
    rng : int, numpy.random.Generator or None, optional
        Seeds the weights' uniform initialisation (PyTorch's ``nn.Linear``
        bounds) and the dropout draws.

    Raises
    ------
    ValueError
        Non-positive sizes, ``d_out`` not divisible by ``num_heads``, dropout
        outside ``[0, 1)``.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.nn import CausalAttention
    >>> CausalAttention(512, 768, context_length=100, rng=0)(np.zeros((2, 100, 512))).shape
    (2, 100, 768)
    """

    def __init__(self, d_in, d_out, context_length, dropout=0.0, qkv_bias=False, *, rng=None):
        super().__init__(d_in, d_out, 1, context_length, dropout, qkv_bias=qkv_bias, causal=True,
                         out_proj=False, out_bias=False, rng=rng)


class MultiHeadAttention(_Attention):
    """Multi-head attention with an output projection (seeds 000, 002, 004 ``MultiHeadAttention``).

    Heads are split from the projected last axis
    (``view(B, T, H, d_out/H).transpose(1, 2)``), attended (causally unless
    ``causal=False``), concatenated and projected by ``out_proj`` (with bias
    unless ``out_bias=False``). Input ``(B, T, d_in)`` or ``(T, d_in)``,
    output ``(B, T, d_out)`` [, weights ``(B, H, T, T)``]; with
    ``batch_first=False`` (PyTorch's ``nn.MultiheadAttention`` default) the
    3-d input and output are ``(T, B, ...)``. ``from_torch(module)`` builds
    the layer matching a ``torch.nn.MultiheadAttention`` (``causal=False``,
    its biases, dropout, ``batch_first``) with its weights.

    Parameters
    ----------
    d_in : int
        Input features.
    d_out : int
        Output features (the query/key/value width).
    num_heads : int
        Heads; ``d_out`` must be divisible by it.
    context_length : int or None, optional
        The longest sequence a call takes (``T > context_length`` is a
        ``ValueError``); ``None``: no limit.
    dropout : float, default 0.0
        Dropout on the attention weights in training mode, in ``[0, 1)``.
    qkv_bias : bool, default False
        Biases in the query, key and value projections.
    causal : bool, default True
        Causal attention (the seeds' layer); ``False`` as
        ``torch.nn.MultiheadAttention`` without a mask.
    out_bias : bool, default True
        A bias in the output projection.
    batch_first : bool, default True
        3-d inputs and outputs are ``(B, T, ...)``; ``False``: ``(T, B, ...)``.
    rng : int, numpy.random.Generator or None, optional
        Seeds the weights' uniform initialisation (PyTorch's ``nn.Linear``
        bounds) and the dropout draws.

    Raises
    ------
    ValueError
        Non-positive sizes, ``d_out`` not divisible by ``num_heads``, dropout
        outside ``[0, 1)``.

    Examples
    --------
    >>> import numpy as np
    >>> from pyattn.nn import MultiHeadAttention
    >>> MultiHeadAttention(32, 32, 4, context_length=8, dropout=0.1, rng=0)(np.zeros((4, 8, 32))).shape
    (4, 8, 32)
    """

    def __init__(self, d_in, d_out, num_heads, context_length=None, dropout=0.0,
                 qkv_bias=False, *, causal=True, out_bias=True, batch_first=True, rng=None):
        super().__init__(d_in, d_out, num_heads, context_length, dropout, qkv_bias=qkv_bias,
                         causal=bool(causal), out_proj=True, out_bias=out_bias, rng=rng)
        self.batch_first = bool(batch_first)


_FROM_TORCH_ACCEPTS = {
    "MultiHeadAttention": "it takes torch.nn.MultiheadAttention, or a module with W_query, W_key, "
                          "W_value and out_proj (or projection) as torch.nn.Linear and num_heads "
                          "(the seeds' MultiHeadAttention, MultiHeadAttentionOneModule)",
    "CausalAttention": "it takes a module with W_query, W_key, W_value as torch.nn.Linear and "
                       "context_length (the seeds' CausalAttention)",
    "SelfAttention": "it takes a module with W_query, W_key, W_value (or W_q, W_k, W_v) as "
                     "torch.nn.Linear, or W_q, W_k, W_v as (d_in, d_out) parameters (the seeds' "
                     "SelfAttentionV2, SelfAttentionLinear, SelfAttentionParameter)",
}


def _context_length(module):
    """A seed module's context length: its attribute, else its mask buffer's size."""
    n = getattr(module, "context_length", None)
    if n is None and getattr(module, "mask", None) is not None:
        n = module.mask.shape[-1]
    return None if n is None else int(n)


def __dir__():
    """The public names only (PEP 562): no helper imports in tab completion."""
    return sorted(__all__)
