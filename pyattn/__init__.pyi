from typing import Any, Literal, Optional, Tuple, Union, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import nn as nn

__version__: str
__all__ = [
    "matmul", "softmax", "scaled_dot_product_attention", "multi_head_attention",
    "set_num_threads", "get_num_threads", "show_config", "nn", "__version__",
]

_Causal = Union[bool, Literal["top_left", "bottom_right"]]
_Rng = Union[None, int, np.random.Generator]

def matmul(a: ArrayLike, b: ArrayLike, /, *, out: Optional[NDArray[Any]] = ...) -> NDArray[np.floating[Any]]: ...
def softmax(
    x: ArrayLike, /, axis: int = ..., *, dim: Optional[int] = ..., attn_mask: Optional[ArrayLike] = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ..., out: Optional[NDArray[Any]] = ...,
) -> NDArray[np.floating[Any]]: ...
@overload
def scaled_dot_product_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., return_weights: Literal[False] = ...,
    out: Optional[NDArray[Any]] = ...,
) -> NDArray[np.floating[Any]]: ...
@overload
def scaled_dot_product_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
    dropout_p: float = ..., is_causal: _Causal = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, rng: _Rng = ..., return_weights: Literal[True],
    out: Optional[NDArray[Any]] = ...,
) -> Tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]: ...
def multi_head_attention(
    query: ArrayLike, key: ArrayLike, value: ArrayLike, num_heads: int,
    w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike, w_o: Optional[ArrayLike] = ...,
    b_q: Optional[ArrayLike] = ..., b_k: Optional[ArrayLike] = ..., b_v: Optional[ArrayLike] = ...,
    b_o: Optional[ArrayLike] = ..., *, attn_mask: Optional[ArrayLike] = ..., is_causal: _Causal = ...,
    dropout_p: float = ..., scale: Optional[float] = ..., rng: _Rng = ..., return_weights: bool = ...,
) -> Union[NDArray[np.floating[Any]], Tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]]: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def show_config() -> None: ...
