from typing import Any, Optional, Tuple

_T = Any   # a CPU torch.Tensor or a NumPy array in, the same kind out

__all__ = ["unpad_input", "pad_input", "index_first_axis"]

def unpad_input(hidden_states: _T, attention_mask: _T,
                unused_mask: Optional[_T] = ...) -> Tuple[_T, _T, _T, int, _T]: ...
def pad_input(hidden_states: _T, indices: _T, batch: int, seqlen: int) -> _T: ...
def index_first_axis(x: _T, indices: _T) -> _T: ...
