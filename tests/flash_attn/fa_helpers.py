"""What FlashAttention's test file imports from flash_attn besides the
interface (written for pyattn's port, tests/flash_attn/test_flash_attn.py):
``bert_padding.pad_input`` / ``unpad_input`` and ``layers.rotary.apply_rotary_emb``,
plain PyTorch with those functions' signatures and results.
"""
import os

import torch

# The port runs FlashAttention's own parameter lists with PYATTN_FA_FULL=1;
# otherwise (CI) the subset each parametrize names.
FULL = os.environ.get("PYATTN_FA_FULL") == "1"


def ci(full, subset):
    """FlashAttention's parameter list, or the CI subset of it."""
    return list(full) if FULL else list(subset)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (B, S, ...), attention_mask (B, S) bool -> (rows (total, ...),
    indices (total,), cu_seqlens (B + 1,) int32, max_seqlen, seqused (B,) int32)."""
    all_masks = attention_mask if unused_mask is None else (attention_mask | unused_mask)
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
    return flat[indices], indices, cu, max_seqlen, used


def pad_input(hidden_states, indices, batch, seqlen):
    """rows (total, ...) back to (batch, seqlen, ...), zeros elsewhere (differentiable)."""
    out = torch.zeros((batch * seqlen,) + tuple(hidden_states.shape[1:]), dtype=hidden_states.dtype,
                      device=hidden_states.device)
    out = out.index_put((indices,), hidden_states)
    return out.reshape((batch, seqlen) + tuple(hidden_states.shape[1:]))


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """x (B, S, H, D); cos, sin (seqlen_ro, rotary_dim / 2); row s of sequence b
    rotated at position s + seqlen_offsets[b]; the first rotary_dim features
    rotate (pairs 2i, 2i+1 when interleaved, else i, i + rotary_dim/2), in
    float32, rounded to x's dtype; the rest pass through."""
    assert cu_seqlens is None, "not needed by the ported tests"
    B, S = x.shape[0], x.shape[1]
    half = cos.shape[1]
    off = torch.as_tensor(seqlen_offsets, device=x.device).reshape(-1)
    pos = off[:, None].long() + torch.arange(S, device=x.device)[None, :]        # (B or 1, S)
    pos = pos.expand(B, S)
    c = cos.float()[pos][:, :, None, :]
    s = sin.float()[pos][:, :, None, :]
    y = x.float().clone()
    if interleaved:
        x1, x2 = y[..., 0:2 * half:2].clone(), y[..., 1:2 * half:2].clone()
        y[..., 0:2 * half:2] = x1 * c - x2 * s
        y[..., 1:2 * half:2] = x1 * s + x2 * c
    else:
        x1, x2 = y[..., :half].clone(), y[..., half:2 * half].clone()
        y[..., :half] = x1 * c - x2 * s
        y[..., half:2 * half] = x1 * s + x2 * c
    y = y.to(x.dtype)
    if inplace:
        x.copy_(y)
        return x
    return y
