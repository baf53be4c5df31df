from typing import Any, Dict, Literal, Mapping, NoReturn, Optional, Sequence, Tuple, Type, TypeVar, Union, overload

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from pyattn import KVCache, PagedKVCache, PagedPlan

_L = TypeVar("_L", bound="_Attention")
_Out = Union[NDArray[np.floating[Any]], Tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]]

__all__ = ["SelfAttention", "CausalAttention", "MultiHeadAttention"]

class _Attention:
    def __init__(self, d_in: int, d_out: int, num_heads: int, context_length: Optional[int],
                 dropout: float, *, qkv_bias: bool, causal: bool, out_proj: bool, out_bias: bool,
                 rng: Union[None, int, np.random.Generator]) -> None: ...
    d_in: int
    d_out: int
    num_heads: int
    context_length: Optional[int]
    dropout: float
    qkv_bias: bool
    causal: bool
    batch_first: bool
    training: bool
    W_query: NDArray[np.floating[Any]]
    W_key: NDArray[np.floating[Any]]
    W_value: NDArray[np.floating[Any]]
    b_query: Optional[NDArray[np.floating[Any]]]
    b_key: Optional[NDArray[np.floating[Any]]]
    b_value: Optional[NDArray[np.floating[Any]]]
    out_proj_weight: Optional[NDArray[np.floating[Any]]]
    out_proj_bias: Optional[NDArray[np.floating[Any]]]
    grads: Dict[str, NDArray[np.floating[Any]]]
    def parameters(self) -> Dict[str, NDArray[np.floating[Any]]]: ...
    def zero_grad(self) -> None: ...
    def backward(self, grad_y: ArrayLike) -> Any: ...   # grad_x, or (grad_x, grad_context) after context=
    def train(self: _L, mode: bool = ...) -> _L: ...
    def eval(self: _L) -> _L: ...
    def state_dict(self) -> Dict[str, NDArray[np.floating[Any]]]: ...
    def load_state_dict(self: _L, state_dict: Mapping[str, Any]) -> _L: ...
    def new_cache(self, batch: int, max_len: int, dtype: DTypeLike = ..., group_size: int = ...) -> KVCache: ...
    @classmethod
    def from_torch(cls: Type[_L], module: Any, *, rng: Union[None, int, np.random.Generator] = ...) -> _L: ...
    @overload
    def __call__(self, x: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
                 return_weights: Literal[False] = ..., *args: NoReturn, context: Optional[ArrayLike] = ..., cache: Union[KVCache, PagedKVCache, None] = ...,
                 seqs: Optional[Sequence[int]] = ..., cu_seqlens_q: Optional[ArrayLike] = ..., plan: Optional[PagedPlan] = ...,
                 precision: Optional[Literal["highest", "bf16", "int8"]] = ...) -> NDArray[np.floating[Any]]: ...
    @overload
    def __call__(self, x: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
                 *args: NoReturn, return_weights: Literal[True], context: Optional[ArrayLike] = ..., cache: None = ..., seqs: None = ..., cu_seqlens_q: None = ..., plan: None = ..., precision: None = ...) -> Tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]: ...
    @overload
    def __call__(self, x: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
                 *args: NoReturn, return_weights: bool, context: Optional[ArrayLike] = ..., cache: Union[KVCache, PagedKVCache, None] = ...,
                 seqs: Optional[Sequence[int]] = ..., cu_seqlens_q: Optional[ArrayLike] = ..., plan: Optional[PagedPlan] = ...,
                 precision: Optional[Literal["highest", "bf16", "int8"]] = ...) -> _Out: ...
    @overload
    def forward(self, x: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
                 return_weights: Literal[False] = ..., *args: NoReturn, context: Optional[ArrayLike] = ..., cache: Union[KVCache, PagedKVCache, None] = ...,
                 seqs: Optional[Sequence[int]] = ..., cu_seqlens_q: Optional[ArrayLike] = ..., plan: Optional[PagedPlan] = ...,
                 precision: Optional[Literal["highest", "bf16", "int8"]] = ...) -> NDArray[np.floating[Any]]: ...
    @overload
    def forward(self, x: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
                 *args: NoReturn, return_weights: Literal[True], context: Optional[ArrayLike] = ..., cache: None = ..., seqs: None = ..., cu_seqlens_q: None = ..., plan: None = ..., precision: None = ...) -> Tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]: ...
    @overload
    def forward(self, x: ArrayLike, attn_mask: Optional[ArrayLike] = ...,
                 *args: NoReturn, return_weights: bool, context: Optional[ArrayLike] = ..., cache: Union[KVCache, PagedKVCache, None] = ...,
                 seqs: Optional[Sequence[int]] = ..., cu_seqlens_q: Optional[ArrayLike] = ..., plan: Optional[PagedPlan] = ...,
                 precision: Optional[Literal["highest", "bf16", "int8"]] = ...) -> _Out: ...

class SelfAttention(_Attention):
    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = ..., *, rng: Any = ...) -> None: ...

class CausalAttention(_Attention):
    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float = ...,
                 qkv_bias: bool = ..., *, rng: Any = ...) -> None: ...

class MultiHeadAttention(_Attention):
    def __init__(self, d_in: int, d_out: int, num_heads: int, context_length: Optional[int] = ...,
                 dropout: float = ..., qkv_bias: bool = ..., *, causal: bool = ...,
                 out_bias: bool = ..., batch_first: bool = ..., rng: Any = ...) -> None: ...
