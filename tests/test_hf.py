"""attn_implementation="pyattn" in Hugging Face transformers (pyattn.transformers).

Tiny models built from configs (random weights; nothing is downloaded):
logits, greedy generation and a training step's gradients with "pyattn"
against transformers' "eager" attention and against "exact", a float64-safe
eager written here (transformers' eager takes the softmax in float32 even
for float64 models, so in float64 it is only float32-accurate, and it gives
NaN for the padded rows there). Each file-level case runs in well under a
second per model.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pyattn.transformers as pht  # noqa: E402
from pyattn import torch as pt  # noqa: E402

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

EPS = {torch.float32: np.finfo(np.float32).eps, torch.float64: np.finfo(np.float64).eps}


def _exact(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
           sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """Eager attention with the softmax in the model's dtype; fully masked rows give 0."""
    n = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(n, 1)
    v = value.repeat_interleave(n, 1)
    E, L, S = query.shape[-1], query.shape[-2], k.shape[-2]
    s = (query @ k.transpose(-1, -2)) * (scaling if scaling is not None else 1 / math.sqrt(E))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if attention_mask is None:
        i = torch.arange(L)[:, None] + S - L
        allowed = torch.arange(S)[None] <= i if getattr(module, "is_causal", True) else torch.ones(L, S, dtype=torch.bool)
    else:
        m = attention_mask[..., :S]
        if m.dtype == torch.bool:
            allowed = m
        else:
            s = s + m
            allowed = m > torch.finfo(m.dtype).min / 2
    s = s.masked_fill(~allowed, -math.inf)
    if s_aux is not None:
        s = torch.cat([s, s_aux.reshape(1, -1, 1, 1).expand(s.shape[0], -1, L, 1).to(s.dtype)], -1)
    mx = s.amax(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).min).detach()
    e = torch.exp(s - mx)
    w = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    if s_aux is not None:
        w = w[..., :-1]
    return (w @ v).transpose(1, 2).contiguous(), None


def _full_mask(*args, **kwargs):
    from transformers.masking_utils import sdpa_mask
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def _exact_registered():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register("exact", _exact)
    AttentionMaskInterface.register("exact", _full_mask)
    n = torch.get_num_threads()
    torch.set_num_threads(1)        # tiny ops: a thread pool only costs (and CI machines are shared)
    yield
    torch.set_num_threads(n)


def _configs():
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  attention_dropout=0.0)
    out = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", common),
        "mistral": ("MistralConfig", "MistralForCausalLM", dict(common, sliding_window=7)),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
                   dict(common, head_dim=16, sliding_window=7, attn_logit_softcapping=3.0,
                        final_logit_softcapping=30.0, query_pre_attn_scalar=16, num_hidden_layers=3)),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", common),
        "gpt2": ("GPT2Config", "GPT2LMHeadModel",
                 dict(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                      attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)),
        "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                    dict(common, head_dim=16, sliding_window=7, num_local_experts=4,
                         num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"])),
    }
    return {k: v for k, v in out.items() if hasattr(transformers, v[0]) and hasattr(transformers, v[1])}


CONFIGS = _configs()


def _model(name, dtype, seed=0):
    cfg_name, cls_name, kw = CONFIGS[name]
    cfg = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed(seed)
    m = getattr(transformers, cls_name)(cfg).to(dtype).eval()
    if name == "gpt_oss":                       # sinks start at 0: make them matter
        m.set_experts_implementation("eager")   # grouped_mm has no float64
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.sinks.normal_()
    return m


def _logits(m, impl, ids, am=None):
    m.set_attn_implementation(impl)
    with torch.no_grad():
        return m(ids, attention_mask=am).logits


def _close(a, b, dtype, valid=None, factor=256):
    tol = factor * EPS[dtype] * max(1.0, float(b.abs().max()))
    if valid is not None:
        a, b = a[valid], b[valid]
    err = float((a - b).abs().max())
    assert err <= tol, f"max error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match(name, dtype):
    m = _model(name, dtype)
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (3, 19))
    am = torch.ones(3, 19, dtype=torch.long)
    am[1, :6] = 0                               # left padding
    am[2, 13:] = 0                              # right padding
    valid = am.bool()
    got = _logits(m, "pyattn", ids, am)
    _close(got, _logits(m, "exact", ids, am), dtype, valid)
    if dtype == torch.float32:                  # transformers' own eager (float32 softmax)
        _close(got, _logits(m, "eager", ids, am), dtype, valid)
    else:
        _close(got[0], _logits(m, "eager", ids[:1]).to(dtype)[0], torch.float32)
    # unpadded: the masks become is_causal (+ window)
    _close(_logits(m, "pyattn", ids), _logits(m, "exact", ids), dtype)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generate_same_tokens(name, monkeypatch):
    m = _model(name, torch.float64)
    torch.manual_seed(2)
    ids = torch.randint(0, 97, (2, 9))
    am = torch.ones(2, 9, dtype=torch.long)
    am[1, :3] = 0                               # left padding, as generation pads
    calls = []
    real = pht._api.scaled_dot_product_attention

    def spy(q, k, v, mask=None, *a, **kw):
        calls.append((q.shape[-2], mask is None))
        return real(q, k, v, mask, *a, **kw)

    # the NumPy call every path reaches (pyattn.torch's, and a step plan's decode call without a mask)
    monkeypatch.setattr(pht._api, "scaled_dot_product_attention", spy)
    toks = {}
    for impl in ("exact", "pyattn"):
        m.set_attn_implementation(impl)
        toks[impl] = m.generate(ids, attention_mask=am, max_new_tokens=32, min_new_tokens=32,
                                do_sample=False, pad_token_id=0)
    assert toks["pyattn"].shape == (2, 41)
    assert torch.equal(toks["pyattn"], toks["exact"])
    m.set_attn_implementation("eager")
    assert torch.equal(toks["pyattn"][:1], m.generate(ids[:1], max_new_tokens=32, min_new_tokens=32,
                                                      do_sample=False, pad_token_id=0))
    # decode steps: one query (or, with grouped heads, a group's query heads as the rows of
    # one query per key/value head: at most 2 rows here), never the 9-token prompt again
    assert calls and sum(1 for L, _ in calls if L <= 2) >= 31 * m.config.num_hidden_layers
    calls.clear()
    m.set_attn_implementation("pyattn")
    m.generate(ids[:1], max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    assert all(no_mask for L, no_mask in calls if L <= 2)   # unpadded decode: no mask at all


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_training_step_gradients(name):
    grads = {}
    for impl in ("exact", "pyattn"):
        m = _model(name, torch.float64).train()
        m.set_attn_implementation(impl)
        torch.manual_seed(3)
        ids = torch.randint(0, 97, (2, 17))
        am = torch.ones(2, 17, dtype=torch.long)
        am[1, 12:] = 0
        out = m(ids, attention_mask=am, labels=ids.masked_fill(am == 0, -100))
        out.loss.backward()
        grads[impl] = {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
    assert grads["pyattn"].keys() == grads["exact"].keys()
    for k in grads["exact"]:
        _close(grads["pyattn"][k], grads["exact"][k], torch.float64, factor=4096)


def test_dropout_in_training_only():
    m = _model("llama", torch.float32)
    m.config.attention_dropout = 0.5
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = 0.5
    m.set_attn_implementation("pyattn")
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        a, b = m(ids).logits, m(ids).logits
        assert torch.equal(a, b)                # eval: no dropout
        m.train()
        torch.manual_seed(5)
        c = m(ids).logits
        torch.manual_seed(5)
        d = m(ids).logits
    assert torch.equal(c, d) and not torch.allclose(a, c)   # train: dropout, from torch's seed


def _causal(L, S):
    return torch.arange(S)[None] <= torch.arange(L)[:, None] + S - L


def test_mask_structure_detection():
    B, L, S = 2, 6, 10
    c = _causal(L, S)
    pad = torch.ones(B, S, dtype=torch.bool)
    pad[0, :3] = False
    assert pht._analyse(c.expand(B, 1, L, S), L, S, None) == (True, None, None)
    causal, left, kp = pht._analyse((c & pad[:, None]).unsqueeze(1), L, S, None)
    assert causal and left is None and torch.equal(kp, pad[:, None, None, :])
    win = c & (torch.arange(S)[None] > torch.arange(L)[:, None] + S - L - 4)
    assert pht._analyse(win.expand(B, 1, L, S), L, S, 4)[:2] == (True, 3)
    assert pht._analyse(win.expand(B, 1, L, S), L, S, None) is None     # no window offered: dense
    add = torch.zeros(B, 1, L, S).masked_fill(~c, torch.finfo(torch.float32).min)
    assert pht._analyse(add, L, S, None) == (True, None, None)
    assert pht._analyse(add + 0.5, L, S, None) is None                  # a real additive mask
    assert pht._analyse(pad[:, None, None, :].expand(B, 1, L, S), L, S, None)[0] is False
    r = torch.rand(B, 1, L, S) > 0.3
    assert pht._analyse(r, L, S, None) is None


def test_register_is_idempotent():
    from transformers import AttentionInterface
    pht.register()
    pht.register()
    assert AttentionInterface._global_mapping["pyattn"] is pht.attention_forward
