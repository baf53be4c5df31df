from typing import Any, Optional, Sequence, Tuple, Union

from numpy.typing import ArrayLike

from . import _bert_padding as bert_padding
from ._bert_padding import pad_input as pad_input, unpad_input as unpad_input

_T = Any   # a CPU torch.Tensor or a NumPy array in, the same kind out
_Window = Union[Tuple[int, int], Sequence[int], Any]

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "unpad_input", "pad_input"]

def _get_block_size_n(device: Any = ..., head_dim: Any = ..., is_dropout: Any = ...,
                      is_causal: Any = ...) -> int: ...
def flash_attn_func(q: _T, k: _T, v: _T, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                    causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                    alibi_slopes: Optional[_T] = ..., deterministic: bool = ...,
                    return_attn_probs: bool = ...) -> Any: ...
def flash_attn_qkvpacked_func(qkv: _T, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                              causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                              alibi_slopes: Optional[_T] = ..., deterministic: bool = ...,
                              return_attn_probs: bool = ...) -> Any: ...
def flash_attn_kvpacked_func(q: _T, kv: _T, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                             causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                             alibi_slopes: Optional[_T] = ..., deterministic: bool = ...,
                             return_attn_probs: bool = ...) -> Any: ...
def flash_attn_varlen_func(q: _T, k: _T, v: _T, cu_seqlens_q: _T, cu_seqlens_k: _T, max_seqlen_q: int,
                           max_seqlen_k: int, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                           causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                           alibi_slopes: Optional[_T] = ..., deterministic: bool = ...,
                           return_attn_probs: bool = ..., block_table: Optional[_T] = ...) -> Any: ...
def flash_attn_varlen_qkvpacked_func(qkv: _T, cu_seqlens: _T, max_seqlen: int, dropout_p: float = ...,
                                     softmax_scale: Optional[float] = ..., causal: bool = ...,
                                     window_size: _Window = ..., softcap: float = ...,
                                     alibi_slopes: Optional[_T] = ..., deterministic: bool = ...,
                                     return_attn_probs: bool = ...) -> Any: ...
def flash_attn_varlen_kvpacked_func(q: _T, kv: _T, cu_seqlens_q: _T, cu_seqlens_k: _T, max_seqlen_q: int,
                                    max_seqlen_k: int, dropout_p: float = ...,
                                    softmax_scale: Optional[float] = ..., causal: bool = ...,
                                    window_size: _Window = ..., softcap: float = ...,
                                    alibi_slopes: Optional[_T] = ..., deterministic: bool = ...,
                                    return_attn_probs: bool = ...) -> Any: ...
def flash_attn_with_kvcache(q: _T, k_cache: _T, v_cache: _T, k: Optional[_T] = ..., v: Optional[_T] = ...,
                            rotary_cos: Optional[_T] = ..., rotary_sin: Optional[_T] = ...,
                            cache_seqlens: Union[int, _T, None] = ..., cache_batch_idx: Optional[_T] = ...,
                            cache_leftpad: Optional[_T] = ..., block_table: Optional[_T] = ...,
                            softmax_scale: Optional[float] = ..., causal: bool = ...,
                            window_size: _Window = ..., softcap: float = ..., rotary_interleaved: bool = ...,
                            alibi_slopes: Optional[_T] = ..., num_splits: int = ...,
                            return_softmax_lse: bool = ...) -> Any: ...
