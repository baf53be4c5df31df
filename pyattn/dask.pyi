from typing import Literal, Optional, Tuple, Union, overload

from dask.array import Array
from numpy.typing import ArrayLike

from ._blockmask import BlockMask

__all__ = ["scaled_dot_product_attention", "multi_head_attention", "set_task_threads"]

_Causal = Union[bool, Literal["top_left", "bottom_right"]]
_Window = Optional[Tuple[Optional[int], Optional[int]]]
_In = Union[Array, ArrayLike]

def set_task_threads(n: Optional[int] = ...) -> None: ...
@overload
def scaled_dot_product_attention(
    query: _In, key: _In, value: _In, attn_mask: Optional[_In] = ..., dropout_p: float = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ..., enable_gqa: bool = ..., *,
    window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ..., softcap: Optional[float] = ...,
    sinks: Optional[ArrayLike] = ..., return_lse: Literal[False] = ...,
    block_mask: Optional[BlockMask] = ...,
) -> Array: ...
@overload
def scaled_dot_product_attention(
    query: _In, key: _In, value: _In, attn_mask: Optional[_In] = ..., dropout_p: float = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ..., enable_gqa: bool = ..., *,
    window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ..., softcap: Optional[float] = ...,
    sinks: Optional[ArrayLike] = ..., return_lse: Literal[True],
    block_mask: Optional[BlockMask] = ...,
) -> Tuple[Array, Array]: ...
@overload
def scaled_dot_product_attention(
    query: _In, key: _In, value: _In, attn_mask: Optional[_In] = ..., dropout_p: float = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ..., enable_gqa: bool = ..., *,
    window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ..., softcap: Optional[float] = ...,
    sinks: Optional[ArrayLike] = ..., return_lse: bool,
    block_mask: Optional[BlockMask] = ...,
) -> Union[Array, Tuple[Array, Array]]: ...
def multi_head_attention(
    query: _In, key: _In, value: _In, num_heads: int, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike,
    w_o: Optional[ArrayLike] = ..., b_q: Optional[ArrayLike] = ..., b_k: Optional[ArrayLike] = ...,
    b_v: Optional[ArrayLike] = ..., b_o: Optional[ArrayLike] = ..., *, attn_mask: Optional[_In] = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ...,
) -> Array: ...
