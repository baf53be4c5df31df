from typing import Any, Callable, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import nn as nn
from . import masks as masks
from ._blockmask import BlockMask as BlockMask

__version__: str
__all__ = [
    "matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
    "merge_attention", "attention_with_kvcache", "KVCache",
    "scaled_dot_product_attention_backward", "scaled_dot_product_attention_vjp", "softmax_backward",
    "set_num_threads", "get_num_threads", "show_config", "nn", "__version__",
    "scaled_dot_product_attention_varlen", "scaled_dot_product_attention_varlen_backward",
    "scaled_dot_product_attention_varlen_vjp",
    "PagedKVCache", "PagedPlan", "CacheFullError",
    "quantize", "dequantize",
    "BlockMask", "masks",
]

_Causal = Union[bool, Literal["top_left", "bottom_right"]]
_Rng = Union[None, int, np.random.Generator]
_Precision = Optional[Literal["highest", "bf16"]]
_KVPrecision = Optional[Literal["highest", "bf16", "int8"]]   # "int8": int8 / int4 caches
_Align = Optional[Literal["top_left", "bottom_right"]]

def matmul(a: ArrayLike, b: ArrayLike, /, *, out: Optional[NDArray[Any]] = ...,
           precision: _Precision = ...) -> NDArray[np.floating[Any]]: ...
def softmax(
    x: ArrayLike, /, axis: int = ..., *, dim: Optional[int] = ..., attn_mask: Optional[ArrayLike] = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ..., out: Optional[NDArray[Any]] = ...,
) -> NDArray[np.floating[Any]]: ...
_F = NDArray[np.floating[Any]]
_Window = Optional[Tuple[Optional[int], Optional[int]]]

@overload
def scaled_dot_product_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., return_weights: Literal[False] = ...,
    out: Optional[NDArray[Any]] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _Precision = ..., return_lse: Literal[False] = ...,
    align: _Align = ...,
    block_mask: Optional[BlockMask] = ...,
) -> _F: ...
@overload
def scaled_dot_product_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., return_weights: Literal[True],
    out: Optional[NDArray[Any]] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _Precision = ..., return_lse: Literal[False] = ...,
    align: _Align = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Tuple[_F, _F]: ...
@overload
def scaled_dot_product_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., return_weights: Literal[False] = ...,
    out: Optional[NDArray[Any]] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _Precision = ..., return_lse: Literal[True],
    align: _Align = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Tuple[_F, _F]: ...
@overload
def scaled_dot_product_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., return_weights: Literal[True],
    out: Optional[NDArray[Any]] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _Precision = ..., return_lse: Literal[True],
    align: _Align = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Tuple[_F, _F, _F]: ...
@overload
def scaled_dot_product_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., return_weights: bool = ...,
    out: Optional[NDArray[Any]] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _Precision = ..., return_lse: bool = ...,
    align: _Align = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Union[_F, Tuple[_F, _F], Tuple[_F, _F, _F]]: ...
def merge_attention(outputs: Union[ArrayLike, Sequence[ArrayLike]], lses: Union[ArrayLike, Sequence[ArrayLike]], /) -> Tuple[_F, _F]: ...
@overload
def attention_with_kvcache(
    query: ArrayLike, k_cache: NDArray[Any], v_cache: NDArray[Any], key: Optional[ArrayLike] = ...,
    value: Optional[ArrayLike] = ..., *, cache_seqlens: Union[int, ArrayLike], is_causal: bool = ...,
    scale: Optional[float] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _KVPrecision = ..., return_lse: Literal[False] = ...,
    out: Optional[NDArray[Any]] = ...,
    rotary_cos: Optional[ArrayLike] = ..., rotary_sin: Optional[ArrayLike] = ...,
    rotary_interleaved: bool = ..., cache_leftpad: Optional[ArrayLike] = ...,
    cache_batch_idx: Optional[ArrayLike] = ...,
    block_table: Optional[ArrayLike] = ..., cu_seqlens_q: Optional[ArrayLike] = ...,
    tree_mask: Optional[ArrayLike] = ...,
    k_scale: Optional[NDArray[np.float32]] = ..., v_scale: Optional[NDArray[np.float32]] = ...,
    block_mask: Optional[BlockMask] = ...,
) -> _F: ...
@overload
def attention_with_kvcache(
    query: ArrayLike, k_cache: NDArray[Any], v_cache: NDArray[Any], key: Optional[ArrayLike] = ...,
    value: Optional[ArrayLike] = ..., *, cache_seqlens: Union[int, ArrayLike], is_causal: bool = ...,
    scale: Optional[float] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _KVPrecision = ..., return_lse: Literal[True],
    out: Optional[NDArray[Any]] = ...,
    rotary_cos: Optional[ArrayLike] = ..., rotary_sin: Optional[ArrayLike] = ...,
    rotary_interleaved: bool = ..., cache_leftpad: Optional[ArrayLike] = ...,
    cache_batch_idx: Optional[ArrayLike] = ...,
    block_table: Optional[ArrayLike] = ..., cu_seqlens_q: Optional[ArrayLike] = ...,
    tree_mask: Optional[ArrayLike] = ...,
    k_scale: Optional[NDArray[np.float32]] = ..., v_scale: Optional[NDArray[np.float32]] = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Tuple[_F, _F]: ...
@overload
def attention_with_kvcache(
    query: ArrayLike, k_cache: NDArray[Any], v_cache: NDArray[Any], key: Optional[ArrayLike] = ...,
    value: Optional[ArrayLike] = ..., *, cache_seqlens: Union[int, ArrayLike], is_causal: bool = ...,
    scale: Optional[float] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., precision: _KVPrecision = ..., return_lse: bool,
    out: Optional[NDArray[Any]] = ...,
    rotary_cos: Optional[ArrayLike] = ..., rotary_sin: Optional[ArrayLike] = ...,
    rotary_interleaved: bool = ..., cache_leftpad: Optional[ArrayLike] = ...,
    cache_batch_idx: Optional[ArrayLike] = ...,
    block_table: Optional[ArrayLike] = ..., cu_seqlens_q: Optional[ArrayLike] = ...,
    tree_mask: Optional[ArrayLike] = ...,
    k_scale: Optional[NDArray[np.float32]] = ..., v_scale: Optional[NDArray[np.float32]] = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Union[_F, Tuple[_F, _F]]: ...

class KVCache:
    k: NDArray[Any]
    v: NDArray[Any]
    k_scale: Optional[NDArray[np.float32]]
    v_scale: Optional[NDArray[np.float32]]
    lengths: NDArray[np.int64]
    def __init__(self, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 value_dim: Optional[int] = ..., dtype: DTypeLike = ..., group_size: int = ...) -> None: ...
    @property
    def max_len(self) -> int: ...
    @overload
    def attend(self, query: ArrayLike, key: ArrayLike, value: ArrayLike, *, is_causal: bool = ...,
               scale: Optional[float] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
               softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., return_lse: Literal[False] = ...,
               out: Optional[NDArray[Any]] = ..., precision: _KVPrecision = ...) -> _F: ...
    @overload
    def attend(self, query: ArrayLike, key: ArrayLike, value: ArrayLike, *, is_causal: bool = ...,
               scale: Optional[float] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
               softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., return_lse: Literal[True],
               out: Optional[NDArray[Any]] = ..., precision: _KVPrecision = ...) -> Tuple[_F, _F]: ...
    @overload
    def attend(self, query: ArrayLike, key: ArrayLike, value: ArrayLike, *, is_causal: bool = ...,
               scale: Optional[float] = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
               softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., return_lse: bool,
               out: Optional[NDArray[Any]] = ..., precision: _KVPrecision = ...) -> Union[_F, Tuple[_F, _F]]: ...
    def reset(self) -> None: ...

class CacheFullError(MemoryError): ...

class PagedKVCache:
    k: NDArray[Any]
    v: NDArray[Any]
    k_scale: Optional[NDArray[np.float32]]
    v_scale: Optional[NDArray[np.float32]]
    group_size: int
    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 value_dim: Optional[int] = ..., dtype: DTypeLike = ..., group_size: int = ...) -> None: ...
    @property
    def block_size(self) -> int: ...
    @property
    def blocks_free(self) -> int: ...
    def add_sequence(self) -> int: ...
    def fork(self, seq: int) -> int: ...
    def free(self, seq: int) -> None: ...
    def length(self, seq: int) -> int: ...
    def plan(self, seqs: Sequence[int], new_tokens: Optional[int] = ..., *,
             cu_seqlens_q: Optional[ArrayLike] = ...) -> PagedPlan: ...
    def attend(self, seqs: Sequence[int], query: ArrayLike, key: ArrayLike, value: ArrayLike, *,
               cu_seqlens_q: Optional[ArrayLike] = ..., plan: Optional[PagedPlan] = ..., **kw: Any) -> Any: ...

class PagedPlan:
    seqs: Tuple[int, ...]
    new_tokens: Optional[int]
    cu_seqlens_q: Optional[NDArray[np.int64]]
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    @property
    def block_table(self) -> NDArray[np.int64]: ...
    @property
    def cache_seqlens(self) -> NDArray[np.int64]: ...

def multi_head_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, num_heads: int,
    w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike, w_o: Optional[ArrayLike] = ...,
    b_q: Optional[ArrayLike] = ..., b_k: Optional[ArrayLike] = ..., b_v: Optional[ArrayLike] = ...,
    b_o: Optional[ArrayLike] = ..., *, attn_mask: Optional[ArrayLike] = ..., is_causal: _Causal = ...,
    dropout_p: float = ..., scale: Optional[float] = ..., rng: _Rng = ..., return_weights: bool = ...,
) -> Union[NDArray[np.floating[Any]], Tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]]: ...
def scaled_dot_product_attention_backward(
    grad_out: ArrayLike, query: ArrayLike, key: ArrayLike, value: ArrayLike, out: ArrayLike,
    lse: NDArray[np.floating[Any]], attn_mask: Optional[ArrayLike] = ..., dropout_p: float = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ..., enable_gqa: bool = ..., *,
    rng: _Rng = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., align: _Align = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Tuple[_F, ...]: ...
def scaled_dot_product_attention_vjp(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., window: _Window = ...,
    alibi_slopes: Optional[ArrayLike] = ..., softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ...,
    align: _Align = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Tuple[_F, Callable[[ArrayLike], Tuple[_F, ...]]]: ...
def softmax_backward(grad_y: ArrayLike, y: ArrayLike, /, axis: int = ..., *,
                     scale: Optional[float] = ...) -> _F: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def show_config() -> None: ...
@overload
def scaled_dot_product_attention_varlen(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
    is_causal: _Causal = ..., scale: Optional[float] = ..., enable_gqa: bool = ..., dropout_p: float = ...,
    rng: _Rng = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., return_lse: Literal[False] = ...,
    precision: _Precision = ..., out: Optional[NDArray[Any]] = ..., block_mask: Optional[BlockMask] = ...,
    align: _Align = ...,
) -> _F: ...
@overload
def scaled_dot_product_attention_varlen(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
    is_causal: _Causal = ..., scale: Optional[float] = ..., enable_gqa: bool = ..., dropout_p: float = ...,
    rng: _Rng = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., return_lse: Literal[True],
    precision: _Precision = ..., out: Optional[NDArray[Any]] = ..., block_mask: Optional[BlockMask] = ...,
    align: _Align = ...,
) -> Tuple[_F, _F]: ...
def scaled_dot_product_attention_varlen_backward(
    grad_out: ArrayLike, query: ArrayLike, key: ArrayLike, value: ArrayLike, out: ArrayLike, lse: ArrayLike,
    cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *, is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., dropout_p: float = ..., rng: _Rng = ..., window: _Window = ...,
    alibi_slopes: Optional[ArrayLike] = ..., softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ...,
    block_mask: Optional[BlockMask] = ...,
    align: _Align = ...,
) -> Tuple[_F, ...]: ...
def scaled_dot_product_attention_varlen_vjp(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *,
    is_causal: _Causal = ..., scale: Optional[float] = ..., enable_gqa: bool = ..., dropout_p: float = ...,
    rng: _Rng = ..., window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ...,
    softcap: Optional[float] = ..., sinks: Optional[ArrayLike] = ..., block_mask: Optional[BlockMask] = ...,
    align: _Align = ...,
) -> Tuple[_F, Callable[[ArrayLike], Tuple[_F, ...]]]: ...

_QDtype = Literal["int8", "int4", "fp8_e4m3", "fp8_e5m2"]
def quantize(x: ArrayLike, /, dtype: _QDtype = ..., *, group_size: int = ...,
             axis: int = ...) -> Tuple[NDArray[Any], NDArray[np.float32]]: ...
def dequantize(q: ArrayLike, scale: ArrayLike, /, *, dtype: Optional[_QDtype] = ...,
               group_size: Optional[int] = ...,
               axis: int = ..., out_dtype: DTypeLike = ...) -> NDArray[Any]: ...
