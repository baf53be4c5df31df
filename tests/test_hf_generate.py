"""model.generate with attn_implementation="pyattn" against "sdpa" and "eager"
(issue 38 item 4): greedy decoding of tiny float64 models built from configs
(Llama-, Qwen2- and Mistral-shaped; nothing is downloaded), on transformers'
default cache and on its static cache, one prompt and a left-padded batch of
prompts of different lengths. The generated tokens and every step's logits
equal sdpa's bit for bit, and the step plan of pyattn.transformers is in use:
the first layer of each step works the call out (_derive), every other layer
only runs it, and the decode steps reach pyattn's decode call.
"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pyattn.transformers as pht  # noqa: E402

# CI (.ci/run): does not depend on the kernel family, and runs outside the sanitizers
pytestmark = [pytest.mark.nofamily, pytest.mark.nosan]

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              attention_dropout=0.0)
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", COMMON),                          # GQA 4 / 2
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(COMMON, num_key_value_heads=1)),   # GQA 4 / 1, qkv bias
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(COMMON, sliding_window=7)),  # window < sequence
}
NEW = 10                                    # generated tokens (prompt 12: 22 > the window of 7)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)        # tiny ops: a thread pool only costs (and CI machines are shared)
    yield
    torch.set_num_threads(n)


def _model(name):
    cfg_name, cls_name, kw = CONFIGS[name]
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**kw)).to(torch.float64).eval()


def _prompts(batch):
    torch.manual_seed(1)
    ids = torch.randint(1, 97, (batch, 12))
    if batch == 1:
        return ids, None
    am = torch.ones(batch, 12, dtype=torch.long)
    for b, pad in enumerate((0, 4, 7)[:batch]):     # left padding, as generation pads
        am[b, :pad] = 0
        ids[b, :pad] = 0
    return ids, am


def _generate(m, impl, ids, am, cache):
    """(tokens, every step's float64 logits of the last position): generate's own
    logits (output_logits) are cast to float32, so the lm_head's outputs are kept."""
    m.set_attn_implementation(impl)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)
    if cache is not None:
        kw["cache_implementation"] = cache
    seen = []
    hook = m.lm_head.register_forward_hook(lambda mod, args, out: seen.append(out[:, -1].clone()))
    try:
        out = m.generate(ids, attention_mask=am, **kw)
    finally:
        hook.remove()
    logits = torch.stack(seen)
    assert logits.dtype == torch.float64
    assert torch.equal(logits.float(), torch.stack(out.logits))     # the same steps' logits
    return out.sequences, logits


class _PlanSpy:
    """Counts pyattn.transformers' step plans: derived (_derive), run
    (_Step.run; direct: by the NumPy call itself), and the rows of the NumPy
    calls they make."""

    def __init__(self, monkeypatch):
        self.derived = self.runs = self.direct = 0
        self.rows = []
        derive, run, call = pht._derive, pht._Step.run, pht._api.scaled_dot_product_attention

        def spy_derive(*a, **kw):
            self.derived += 1
            return derive(*a, **kw)

        def spy_run(plan, *a, **kw):
            self.runs += 1
            self.direct += bool(plan.direct)
            return run(plan, *a, **kw)

        def spy_call(q, *a, **kw):
            self.rows.append(q.shape[-2])
            return call(q, *a, **kw)
        monkeypatch.setattr(pht, "_derive", spy_derive)
        monkeypatch.setattr(pht._Step, "run", spy_run)
        monkeypatch.setattr(pht._api, "scaled_dot_product_attention", spy_call)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("cache", [None, "static"], ids=["dynamic", "static"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generate_equals_sdpa(name, cache, batch, monkeypatch):
    m = _model(name)
    ids, am = _prompts(batch)
    toks, logits = _generate(m, "sdpa", ids, am, cache)
    spy = _PlanSpy(monkeypatch)
    got_toks, got_logits = _generate(m, "pyattn", ids, am, cache)
    assert got_toks.shape == (batch, 12 + NEW)
    assert torch.equal(got_toks, toks)
    assert got_logits.dtype == torch.float64 and got_logits.shape == logits.shape
    err = float((got_logits - logits).abs().max())
    assert torch.equal(got_logits, logits), f"logits differ from sdpa's by up to {err:.3g}"
    # the plan: worked out once per step (the prefill and NEW - 1 decode steps) by the first
    # layer, run by every layer; the decode steps run pyattn's decode call (a key/value head's
    # query heads as the rows of one query: Hq / Hkv rows), never the prompt again
    layers = m.config.num_hidden_layers
    group = m.config.num_attention_heads // m.config.num_key_value_heads
    assert spy.derived == NEW
    assert spy.runs == NEW * layers
    assert spy.rows.count(12) == layers
    assert spy.rows.count(group) == (NEW - 1) * layers
    assert len(spy.rows) == NEW * layers
    # no gradient wanted: every layer's call is the plan's direct NumPy call (no custom op dispatch)
    assert spy.direct == spy.runs


@pytest.mark.parametrize("cache", [None, "static"], ids=["dynamic", "static"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generate_equals_eager(name, cache):
    # transformers' eager takes the softmax in float32 (so float32-accurate in a float64
    # model) and gives NaN for left-padded rows: one unpadded prompt
    m = _model(name)
    ids, am = _prompts(1)
    toks, logits = _generate(m, "eager", ids, am, cache)
    got_toks, got_logits = _generate(m, "pyattn", ids, am, cache)
    assert torch.equal(got_toks, toks)
    tol = 64 * float(torch.finfo(torch.float32).eps) * max(1.0, float(logits.abs().max()))
    assert float((got_logits - logits).abs().max()) <= tol


def test_static_cache_prefill_then_decode_plans():
    # a static cache's steps: the prefill (a mask wider than the filled rows, or none) and
    # the decode steps (a key-padding row over the unfilled rows) are different plans, and
    # the plans stay few (_steps keeps the last 4)
    m = _model("llama")
    ids, am = _prompts(3)
    _generate(m, "pyattn", ids, am, "static")
    assert 1 <= len(pht._steps) <= 4
    assert all(isinstance(e[2], pht._Step) for e in pht._steps)


@pytest.mark.parametrize("torch_threads, small", [(1, True), (2, True), (2, False)])
def test_decode_calls_on_one_thread_beside_torchs_threads(torch_threads, small, monkeypatch):
    # with PyTorch's intra-op threads above 1, a decode call (one query row) runs on the
    # calling thread alone (nthreads=1 reaches _C.sdpa), prefill calls on the pool; the cap
    # is lifted after every call, an error's too; the tokens and logits are those of the
    # uncapped run (the bits do not depend on the thread count); a cache of more bytes than
    # _ONE_THREAD_BYTES is read by the pool
    if not small:
        monkeypatch.setattr(pht, "_ONE_THREAD_BYTES", 0)
    m = _model("llama")
    ids, am = _prompts(1)
    want_toks, want_logits = _generate(m, "pyattn", ids, am, "dynamic")
    seen = []
    real = pht._api._C.sdpa

    def spy(q, k, v, *a, **kw):
        seen.append((q.shape[-2], kw.get("nthreads", 0)))
        return real(q, k, v, *a, **kw)
    monkeypatch.setattr(pht._api._C, "sdpa", spy)
    torch.set_num_threads(torch_threads)
    try:
        toks, logits = _generate(m, "pyattn", ids, am, "dynamic")
    finally:
        torch.set_num_threads(1)
    assert torch.equal(toks, want_toks) and torch.equal(logits, want_logits)
    rows1 = {n for L, n in seen if L == 1 or L == 2}   # decode: one row per query head (GQA 4/2 stacked: 2)
    prefill = {n for L, n in seen if L == 12}
    assert rows1 == ({1} if torch_threads > 1 and small else {0}) and prefill == {0}
    assert pht._kvfast.call_threads == 0
    monkeypatch.setattr(pht._api._C, "sdpa", lambda *a, **kw: (_ for _ in ()).throw(ValueError("boom")))
    torch.set_num_threads(2)
    try:
        q = torch.randn(1, 4, 1, 16, dtype=torch.float64)
        k = v = torch.randn(1, 2, 5, 16, dtype=torch.float64)
        with pytest.raises(ValueError):
            pht.attention_forward(torch.nn.Module(), q, k, v, None)
    finally:
        torch.set_num_threads(1)
    assert pht._kvfast.call_threads == 0
