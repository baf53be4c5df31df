from typing import Any, Optional, Tuple

from torch import Tensor
from torch.nn import Module

__all__ = ["register", "attention_forward"]

NAME: str

def register() -> None: ...
def attention_forward(
    module: Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
    dropout: float = ..., scaling: Optional[float] = ..., is_causal: Optional[bool] = ...,
    sliding_window: Optional[int] = ..., softcap: Optional[float] = ..., s_aux: Optional[Tensor] = ...,
    position_bias: Optional[Tensor] = ..., **kwargs: Any,
) -> Tuple[Tensor, None]: ...
