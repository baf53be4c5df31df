"""pyattn as an attention backend of Hugging Face transformers.

Importing this module registers the attention function ``"pyattn"`` (once);
:func:`register` does the same explicitly. Then

>>> import pyattn.transformers                                 # doctest: +SKIP
>>> from transformers import AutoModelForCausalLM              # doctest: +SKIP
>>> model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="pyattn")  # doctest: +SKIP

runs every attention layer on pyattn through :mod:`pyattn.torch` (autograd,
``torch.compile`` and ``torch.export`` included). The model's 4-D masks
(bool, or additive float of 0 and large negatives) are read for their
structure: a mask that is exactly causal, causal with a sliding window, and
either of those with key padding becomes ``is_causal`` / ``window`` and a
``(B, 1, 1, S)`` key-padding row (tiles outside the causal band and the
window are skipped); any other mask is passed as it is. Grouped-query heads
are read in place (no ``repeat_kv``), and the layer's ``scaling``,
``dropout`` (training), ``sliding_window``, ``softcap`` (Gemma 2) and
``s_aux`` sinks (gpt-oss) are honoured. Decode steps with transformers'
caches (a few new queries against the cached keys) run pyattn's decode
path.

A model calls the attention function once per layer per step with the same
shapes, mask and options: the first layer of a step works out the call (the
mask's structure, the causal rule and window, the kind of call -- a plan of
the step) and the other layers find it by those values (the mask by identity
and version) and only run it. A call that wants no gradient (inference,
``model.generate``) then goes straight to pyattn's NumPy call on the
tensors' memory, past the custom op's dispatch; a decode step on a static
cache with no key padded reads only the filled rows (its mask, which only
hides the unfilled ones, is dropped). A decode call reading under 4 MiB of
keys and values runs on the calling thread alone while PyTorch uses more
than one intra-op thread (its OpenMP workers spin on the other cores between
ops; a second pyattn thread beside one made such a call slower, not faster).
The results are those of working every call out anew, bit for bit, on any
number of threads.

Importing this module imports torch and transformers (``import pyattn``
alone does not).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Tuple

import torch

from . import _api, _kvfast, torch as _pt
from ._checks import causal_code, index_value, real_scalar, softcap_value, window_arg, window_value

__all__ = ["register", "attention_forward"]

NAME = "pyattn"
_registered = False
# the analyses of the last few masks (a model's layers share one or two):
# [weakref to the mask, its key, its analysis]
_recent: list = []


def _mask_key(mask, sliding_window):
    return (mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype, mask._version,
            sliding_window)


def _as_bool(mask):
    """A float additive mask of only 0 and large negatives (below half the
    dtype's lowest value: their weight is exactly 0) as a bool mask; None
    when it holds other values (then it stays a float mask)."""
    if mask.dtype == torch.bool:
        return mask
    keep = mask == 0
    drop = mask <= torch.finfo(mask.dtype).min / 2
    if not bool(torch.all(keep | drop)):
        return None
    return keep


def _sliding_left(sliding_window):
    """The left window side of transformers' sliding_window (the keys a
    query sees, itself included): sliding_window - 1, an int >= 0."""
    n = index_value(sliding_window, "sliding_window")
    if n < 1:
        raise ValueError(f"sliding_window must be >= 1 (or None or 0: no window), got {sliding_window!r}")
    return n - 1


def _analyse(mask, L, S, sliding_window):
    """(causal, window_left, key_padding) when the mask is exactly
    (bottom-right causal [& sliding window]) & key padding, or key padding
    alone (causal False); key_padding is None when no key is padded. None
    for any other mask."""
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-2] != L or mask.shape[-1] != S:
        return None
    m = _as_bool(mask)
    if m is None:
        return None
    if L == 1:
        # one query row (a decode step): a causal rule or window bottom-right leaves it every
        # key the row admits, so the row is the key padding (the general test below finds the
        # same); in NumPy, a few microseconds
        return False, None, (None if _np(m).all() else m)
    m = m[:, 0]                                           # (B, L, S)
    pad = m.any(dim=1)                                    # (B, S): keys some row may see
    i = torch.arange(L).view(L, 1) + (S - L)
    j = torch.arange(S).view(1, S)
    padded = pad[:, None, :].expand(m.shape)
    res = None
    if torch.equal(m, padded):
        res = (False, None, pad)
    else:
        lefts = [None] + ([_sliding_left(sliding_window)] if sliding_window else [])
        for left in lefts:
            band = j <= i if left is None else (j <= i) & (j >= i - left)
            if torch.equal(m, band[None] & padded):
                res = (True, left, pad)
                break
    if res is None:
        return None
    causal, left, pad = res
    return causal, left, (None if bool(pad.all()) else pad[:, None, None, :])


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, sliding_window: Optional[int] = None,
                      softcap: Optional[float] = None, s_aux: Optional[torch.Tensor] = None,
                      position_bias: Optional[torch.Tensor] = None,
                      **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """The attention function transformers calls for ``attn_implementation="pyattn"``.

    ``query (B, Hq, L, E)``, ``key (B, Hkv, S, E)``, ``value (B, Hkv, S, Ev)``
    (``Hq % Hkv == 0``), ``attention_mask`` ``(B, 1, L, S)`` bool or additive
    float, or None -> ``(B, L, Hq, Ev)`` (transformers' layout) and ``None``
    for the weights (pyattn never materialises them).

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer calling; its ``is_causal`` attribute (default
        True) is the causal rule when ``is_causal`` is None.
    query : torch.Tensor
        ``(B, Hq, L, E)``, CPU, float32, float64, float16 or bfloat16.
    key : torch.Tensor
        ``(B, Hkv, S, E)`` with ``Hq % Hkv == 0`` (grouped-query heads are
        read in place, no ``repeat_kv``); query's dtype.
    value : torch.Tensor
        ``(B, Hkv, S, Ev)``; query's dtype.
    attention_mask : torch.Tensor or None
        ``(B, 1, L, S)`` bool (True: may attend) or additive float (0 and
        large negatives), or None. A mask that is exactly causal, causal
        with a sliding window, and either of those with key padding becomes
        ``is_causal`` / ``window`` and a ``(B, 1, 1, S)`` key-padding row;
        any other mask is passed as it is. A mask with more than S columns
        (a static cache's) is cut to S.
    dropout : float, default 0.0
        Dropout probability on the attention weights (the layer's, in
        training), applied whenever it is above 0.
    scaling : float, optional
        The layer's score scale (default ``1/sqrt(E)``).
    is_causal : bool, optional
        Overrides ``module.is_causal``.
    sliding_window : int, optional
        The layer's window: each query sees its ``sliding_window`` most
        recent keys (itself included).
    softcap : float, optional
        Logit soft-capping (Gemma 2).
    s_aux : torch.Tensor, optional
        ``(Hq,)`` attention-sink logits (gpt-oss).
    position_bias : torch.Tensor, optional
        A position bias (T5-style), turned into an additive mask by
        transformers' ``create_position_bias_mask``.
    **kwargs
        Ignored (what transformers passes besides).

    Returns
    -------
    out : torch.Tensor
        ``(B, L, Hq, Ev)``, contiguous, of the query's dtype.
    weights : None
        pyattn never materialises the attention weights.

    Raises
    ------
    ValueError
        Tensors not on the CPU, and the shape errors of
        :func:`pyattn.torch.scaled_dot_product_attention`.
    TypeError
        Dtypes other than the four above, or differing.

    Examples
    --------
    >>> import torch
    >>> from pyattn.transformers import attention_forward
    >>> _ = torch.manual_seed(0)
    >>> q = torch.randn(1, 4, 3, 8)                 # 4 query heads
    >>> k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)   # 2 key/value heads
    >>> out, weights = attention_forward(torch.nn.Module(), q, k, v, None)
    >>> out.shape, weights
    (torch.Size([1, 3, 4, 8]), None)
    """
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if position_bias is None and not torch.compiler.is_compiling():
        # the step's plan: every layer of a step sees the same shapes and mask
        key_ = _step_key(query, key, value, attention_mask, causal, dropout, scaling, sliding_window, softcap,
                         s_aux)
        for e in _steps:
            if e[1] == key_ and (attention_mask is None or e[0]() is attention_mask):
                return e[2].run(query, key, value, scaling, dropout, softcap, s_aux)
        plan = _derive(query, key, value, attention_mask, causal, (sliding_window, scaling, softcap, dropout, s_aux))
        res = plan.run(query, key, value, scaling, dropout, softcap, s_aux)
        _steps.insert(0, [(lambda: None) if attention_mask is None else weakref.ref(attention_mask), key_, plan])
        del _steps[4:]
        return res
    L, S = query.shape[-2], key.shape[-2]
    mask = attention_mask
    if mask is not None and mask.dim() == 4 and mask.shape[-1] > S:
        mask = mask[..., :S]
    if position_bias is not None:
        from transformers.integrations.sdpa_attention import create_position_bias_mask
        if mask is None and causal and L > 1 and S > L:
            key, value, position_bias = key[:, :, :L], value[:, :, :L], position_bias[..., :L]
            S = L
        mask = create_position_bias_mask(position_bias, mask, bool(causal and mask is None), query, key)
        causal = False
    return _derive(query, key, value, mask, causal, (sliding_window, scaling, softcap, dropout, s_aux), sliced=True,
                   biased=position_bias is not None).run(query, key, value, scaling, dropout, softcap, s_aux)


# A decode step's plan (issue 38): what attention_forward derives from a call -- the causal rule,
# window and key-padding row read from the mask, the keys cut to a static cache's filled rows, the
# kind of call -- depends on the step (shapes, dtypes, the mask) and the layer's options, which
# every layer of a model shares but for a sliding window or softcap of its own. The first layer
# of a step derives it; the others find it here by those values (the mask by identity and
# version, as _recent) and run it: [weakref to the mask, key, plan], the last few steps' kinds.
_steps: list = []
# a decode call reading fewer key/value bytes than this runs on the calling thread alone when
# PyTorch's intra-op threads are more than 1 (_Step.run)
_ONE_THREAD_BYTES = 4 << 20


def _step_key(query, key, value, mask, causal, dropout, scaling, sliding_window, softcap, s_aux):
    """What a call's plan depends on (besides the mask's identity)."""
    return (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype, type(causal), causal,
            type(dropout), dropout, type(scaling), scaling,
            sliding_window, type(softcap), softcap, s_aux is None,
            None if mask is None else _mask_key(mask, sliding_window))


def _np(t):
    """pyattn.torch's _numpy (the tensor's memory), without its detach where
    no gradient is wanted."""
    return t.numpy() if not t.requires_grad and t.dtype != torch.bfloat16 else _pt._numpy(t)


class _Step:
    """A call's plan (attention_forward's derivation, see _steps): run it on a
    layer's query, key and value."""
    __slots__ = ("cut", "mask", "causal", "window", "decode", "one", "direct", "npmask", "causal_arg", "win", "scale",
                 "cap", "qshape", "oshape", "to")

    def run(self, query, key, value, scaling, dropout, softcap, s_aux):
        if self.direct and query.is_cpu and key.is_cpu and value.is_cpu and _pt._plain(query, key, value):
            # nothing for autograd, autocast, torch.compile or a mode to see: the NumPy call
            # pyattn.torch makes (the same arguments, on the tensors' memory) without the custom
            # op's dispatch (issue 38: a decode step's own cost), pyattn.torch's checks of
            # dtypes, devices and the mask made by _derive
            k, v = _np(key), _np(value)
            if self.cut is not None:        # a static cache: its filled rows
                k, v = k[:, :, :self.cut], v[:, :, :self.cut]
            # one query row (decode) reading a small cache: the call on this thread alone while
            # PyTorch's intra-op threads may be spinning on the other cores after the model's
            # last op (a second pyattn thread beside a spinning OpenMP worker made a 2 MB call
            # 2x slower, not faster; from about 8 MB on the second thread pays: measured)
            one = self.one and k.nbytes + v.nbytes < _ONE_THREAD_BYTES and torch.get_num_threads() > 1
            if one:
                _kvfast.call_threads = 1
            try:
                if self.decode:
                    res = _api.scaled_dot_product_attention(_np(query).reshape(self.qshape), k, v,
                                                            self.npmask, 0.0, False, self.scale, False,
                                                            window=None, softcap=self.cap, precision=None,
                                                            return_lse=False)
                    out = torch.from_numpy(res.reshape(self.oshape))
                else:
                    res = _api.scaled_dot_product_attention(_np(query), k, v, self.npmask, 0.0,
                                                            self.causal_arg, self.scale, query.shape[1] != key.shape[1],
                                                            window=self.win, softcap=self.cap, precision=None,
                                                            return_lse=False)
                    out = torch.from_numpy(res).transpose(1, 2).contiguous()
            finally:
                if one:
                    _kvfast.call_threads = 0
            return (out if self.to is None else out.to(self.to)), None
        if self.cut is not None:            # a static cache: its filled rows
            key, value = key[:, :, :self.cut], value[:, :, :self.cut]
        B, Hq, Hkv = query.shape[0], query.shape[1], key.shape[1]
        if self.decode:
            q = query.reshape(B, Hkv, Hq // Hkv, query.shape[-1])
            out = _pt.scaled_dot_product_attention(q, key, value, self.mask, scale=scaling, softcap=softcap)
            return out.reshape(B, 1, Hq, out.shape[-1]), None
        out = _pt.scaled_dot_product_attention(
            query, key, value, self.mask, dropout_p=float(dropout),
            is_causal="bottom_right" if self.causal else False, scale=scaling,
            enable_gqa=Hq != Hkv, window=self.window, softcap=softcap, sinks=s_aux)
        return out.transpose(1, 2).contiguous(), None


def _derive(query, key, value, mask, causal, opts, sliced=False, biased=False):
    """The plan of a call (mask: the model's, or with position_bias the mask
    it made, sliced; biased then; opts: the call's (sliding_window, scaling,
    softcap, dropout, s_aux))."""
    sliding_window, scaling, softcap, dropout, s_aux = opts
    L, S = query.shape[-2], key.shape[-2]
    p = _Step()
    p.cut = None
    if not sliced and mask is not None and mask.dim() == 4 and mask.shape[-1] > S:
        mask = mask[..., :S]
    window = None
    if mask is None:
        if causal and L > 1 and S > L and not biased:
            # prefill into an empty static cache: the rows past L are not filled yet
            # (transformers' sdpa path drops them the same way)
            p.cut, S = L, L
        if causal and sliding_window:
            window = window_arg(_sliding_left(sliding_window), 0)
        causal = bool(causal) and L > 1
    else:
        found = None
        if not torch.compiler.is_compiling():
            k = _mask_key(mask, sliding_window)
            hit = [e for e in _recent if e[0]() is mask and e[1] == k]
            if hit:
                found = hit[0][2]
            else:
                found = _analyse(mask, L, S, sliding_window)
                _recent.insert(0, [weakref.ref(mask), k, found])
                del _recent[4:]
        if found is None:
            causal = False
        else:
            causal, left, mask = found
            window = None if left is None else window_arg(left, 0)
        if (mask is not None and L == 1 and window is None and mask.dtype == torch.bool
                and mask.shape[1] == mask.shape[2] == 1):
            # a decode step on a static cache, no key padded: the mask only hides the
            # unfilled rows past the filled n; the keys cut to those n instead (the same
            # keys, weight 0 for the others either way), and no mask to pass
            row = _np(mask)[:, 0, 0, :]
            n = int(row[0].sum())
            if 0 < n < S and row[:, :n].all() and not row[:, n:].any():
                p.cut, S, mask = n, n, None
    Hq, Hkv = query.shape[1], key.shape[1]
    p.mask, p.causal, p.window = mask, causal, window
    p.one = L == 1
    p.decode = (L == 1 and Hq != Hkv and Hq % Hkv == 0 and window is None and s_aux is None and not dropout
                and (mask is None or (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1)))
    # a decode step with grouped heads: each key/value head's query heads as rows of one
    # (Hq/Hkv)-row query against it (key/value read once per group; as transformers'
    # sdpa path packs them); a mask for the keys only broadcasts over those rows
    # the direct NumPy call (_Step.run) where pyattn.torch would make it too: no dropout, no sinks,
    # query, key and value of one of its dtypes, a plain CPU mask (bool or float) wanting no gradient
    dts = (query.dtype, key.dtype, value.dtype)
    p.direct = (not dropout and s_aux is None and dts[0] == dts[1] == dts[2] and dts[0] in _pt._FLOATS
                and (mask is None or (type(mask) is torch.Tensor and mask.is_cpu and not mask.requires_grad
                                      and mask.dtype in (torch.bool, torch.float32, torch.float64))))
    p.npmask = _pt._numpy(mask) if p.direct and mask is not None else None
    p.causal_arg = _pt._CAUSAL[causal_code("bottom_right" if causal else False)]
    p.win = _pt._window(*window_value(window))
    B, E, Ev = query.shape[0], query.shape[-1], value.shape[-1]
    p.qshape, p.oshape = (B, Hkv, Hq // max(Hkv, 1), E), (B, 1, Hq, Ev)
    p.to = None if query.dtype in (torch.float32, torch.float64) else query.dtype
    p.scale = None if scaling is None else real_scalar(scaling, "scale")
    p.cap = softcap_value(softcap) or None
    return p


def register() -> None:
    """Add ``"pyattn"`` to transformers' ``AttentionInterface`` (and its mask
    builder, transformers' boolean SDPA masks, to ``AttentionMaskInterface``);
    then ``attn_implementation="pyattn"`` selects it. Idempotent.

    Examples
    --------
    >>> import pyattn.transformers as pht                 # doctest: +SKIP
    >>> pht.register()                                     # doctest: +SKIP
    """
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    _registered = True


register()
