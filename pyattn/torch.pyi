from typing import Any, Literal, Optional, Tuple, Union, overload

from torch import Tensor

__all__ = ["scaled_dot_product_attention"]

_Causal = Union[bool, Literal["top_left", "bottom_right"]]
_Window = Optional[Tuple[Optional[int], Optional[int]]]
_Precision = Optional[Literal["highest", "bf16"]]

@overload
def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, window: _Window = ..., alibi_slopes: Optional[Tensor] = ...,
    softcap: Optional[float] = ..., sinks: Optional[Tensor] = ..., precision: _Precision = ...,
    block_mask: Any = ..., return_lse: Literal[False] = ...,
) -> Tensor: ...
@overload
def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, window: _Window = ..., alibi_slopes: Optional[Tensor] = ...,
    softcap: Optional[float] = ..., sinks: Optional[Tensor] = ..., precision: _Precision = ...,
    block_mask: Any = ..., return_lse: Literal[True],
) -> Tuple[Tensor, Tensor]: ...
