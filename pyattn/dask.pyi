from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["scaled_dot_product_attention", "multi_head_attention", "set_task_threads"]

_Causal = Union[bool, str]
_Window = Optional[Tuple[Optional[int], Optional[int]]]

def set_task_threads(n: Optional[int] = ...) -> None: ...
def scaled_dot_product_attention(
    query: Any, key: Any, value: Any, attn_mask: Any = ..., is_causal: _Causal = ...,
    scale: Optional[float] = ..., enable_gqa: bool = ..., *, dropout_p: float = ...,
    window: _Window = ..., alibi_slopes: Optional[ArrayLike] = ..., softcap: Optional[float] = ...,
    sinks: Optional[ArrayLike] = ...,
) -> Any: ...
def multi_head_attention(
    query: Any, key: Any, value: Any, num_heads: int, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike,
    w_o: Optional[ArrayLike] = ..., b_q: Optional[ArrayLike] = ..., b_k: Optional[ArrayLike] = ...,
    b_v: Optional[ArrayLike] = ..., b_o: Optional[ArrayLike] = ..., *, attn_mask: Any = ...,
    is_causal: _Causal = ..., scale: Optional[float] = ...,
) -> Any: ...
