"""bench.py's "hf" section: pyattn inside PyTorch and Hugging Face transformers.

A Llama-shaped model built from a config (random weights, nothing
downloaded: 12 layers, d=768, 12 query heads, 4 KV heads, vocabulary 32000;
--quick: 4 layers and shorter sequences), float32:
- prefill of 2048 tokens with attn_implementation="pyattn" and "sdpa": the
  whole forward, and the attention alone (the attention functions timed
  inside the model: every layer's call summed);
- greedy decoding of 256 tokens after a 2048-token prompt (the decode steps
  timed, the prefill not): tokens per second;
- pyattn.torch.scaled_dot_product_attention forward + backward against
  torch's F.scaled_dot_product_attention on the model's attention shape.
Skipped, with a message, without transformers.
"""
from __future__ import annotations

import json
import statistics
import sys
import time


def _emit(r):
    print("ROW " + json.dumps(r), flush=True)


def hf(args, rng, run, torch):
    if torch is None:
        print("bench: hf rows skipped: PyTorch is not installed", file=sys.stderr, flush=True)
        return
    try:
        import transformers
        import pyattn.transformers as pht
    except ImportError as exc:
        print(f"bench: hf rows skipped: {exc} (pip install \"pyattn[transformers]\")", file=sys.stderr, flush=True)
        return
    import pyattn.torch as pt
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    spent = {}

    def timed(name, fn):
        def f(*a, **kw):
            t = time.perf_counter()
            r = fn(*a, **kw)
            spent[name] += time.perf_counter() - t
            return r
        return f

    impls = {"pyattn": pht.attention_forward, "sdpa": sdpa_attention_forward}
    for name, fn in impls.items():
        AttentionInterface.register(f"{name}_timed", timed(name, fn))
        AttentionMaskInterface.register(f"{name}_timed", sdpa_mask)
        spent[name] = 0.0

    layers = 4 if args.quick else 12
    P = 1024 if args.quick else 2048          # prompt / prefill tokens
    G = 32 if args.quick else 256             # generated tokens
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                                   num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=4,
                                   max_position_embeddings=P + G + 8)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 32000, (1, P))
    shape = f"Llama {layers} layers d=768 Hq=12 Hkv=4 vocab=32000"

    # prefill: the whole forward (last position's logits, as generate() asks) and the attention in it
    attn = {k: [] for k in impls}

    def prefill(name):
        def f():
            model.set_attn_implementation(f"{name}_timed")
            spent[name] = 0.0
            with torch.no_grad():
                model(ids, logits_to_keep=1)
            attn[name].append(spent[name])
        return f
    rounds = 2 if not args.quick else None
    run({"op": "hf prefill", "shape": f"{shape}, {P} tokens"}, 0.0,
        {"pyattn": prefill("pyattn"), "sdpa": prefill("sdpa")}, rounds=rounds)
    for name, ts in attn.items():
        ts = ts[1:]                           # the warm-up call
        _emit({"op": "hf prefill attention", "shape": f"{shape}, {P} tokens", "impl": name,
               "threads": args.threads, "flops": 0.0, "median_ms": 1e3 * statistics.median(ts),
               "min_ms": 1e3 * min(ts)})

    # generation: G greedy decode steps after a P-token prompt, the steps timed
    import inspect
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def decode(name):
        model.set_attn_implementation(f"{name}_timed")
        with torch.no_grad():
            out = model(ids, use_cache=True, logits_to_keep=1)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            spent[name] = 0.0
            t = time.perf_counter()
            for _ in range(G):
                out = model(tok, **{cache_kw: past}, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            return time.perf_counter() - t, spent[name]

    times = {k: [] for k in impls}
    for _ in range(2 if args.quick else 3):
        for name in impls:
            time.sleep(args.settle)
            times[name].append(decode(name))
    for name, ts in times.items():
        for op, i in (("hf generate", 0), ("hf generate attention", 1)):
            tt = [x[i] for x in ts]
            _emit({"op": op, "shape": f"{shape}, {G} tokens after {P}", "impl": name,
                   "threads": args.threads, "flops": 0.0, "median_ms": 1e3 * statistics.median(tt),
                   "min_ms": 1e3 * min(tt), "tokens": G})
    del model

    # the attention op alone, forward + backward, on the model's attention shape (causal, GQA)
    L = P
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 12, L, 64, generator=g, requires_grad=True)
    k = torch.randn(1, 4, L, 64, generator=g, requires_grad=True)
    v = torch.randn(1, 4, L, 64, generator=g, requires_grad=True)
    go = torch.randn(1, 12, L, 64, generator=g)
    F = torch.nn.functional

    def fwd_bwd(fn):
        def f():
            q.grad = k.grad = v.grad = None
            fn(q, k, v, is_causal=True, enable_gqa=True).backward(go)
        return f
    flops = 4.0 * 12 * L * L * 64 * 0.5 * 3.5
    run({"op": "torch op fwd+bwd", "shape": f"B=1 Hq=12 Hkv=4 L=S={L} E=64 causal"}, flops,
        {"pyattn": fwd_bwd(pt.scaled_dot_product_attention), "torch": fwd_bwd(F.scaled_dot_product_attention)})


def hf_targets(data, get, line):
    """The targets of issue 27, from the rows hf() wrote."""
    for r in data:
        if r["impl"] != "pyattn" or not r["op"].startswith(("hf ", "torch op")):
            continue
        other = "torch" if r["op"] == "torch op fwd+bwd" else "sdpa"
        th = get(r["op"], r["shape"], other, r["threads"])
        if not th:
            continue
        ratio = th["median_ms"] / r["median_ms"]
        if r["op"] == "hf generate attention":   # no target of its own: shown in "hf generate"'s line
            continue
        goal = {"hf prefill": 1.0, "hf prefill attention": 1.3, "hf generate": 1.2,
                "torch op fwd+bwd": 1.3}[r["op"]]
        what = {"hf prefill": "whole forward vs sdpa", "hf prefill attention": "attention time vs sdpa",
                "hf generate": f"tokens/s vs sdpa ({r['tokens'] / (r['median_ms'] / 1e3):.1f} tok/s)"
                if r.get("tokens") else "vs sdpa", "torch op fwd+bwd": "vs torch SDPA fwd+bwd"}[r["op"]]
        if r["op"] == "hf generate":
            a, b = (get("hf generate attention", r["shape"], i, r["threads"]) for i in ("pyattn", "sdpa"))
            if a and b:
                what += (f"; attention alone {b['median_ms'] / a['median_ms']:.2f}x, "
                         f"{100 * a['median_ms'] / r['median_ms']:.0f} % of pyattn's decode time, "
                         f"{100 * b['median_ms'] / th['median_ms']:.0f} % of sdpa's")
        cmp = ">" if goal == 1.0 else ">="
        line(f"{r['op']} {r['shape']}, {r['threads']} thr, {what}", f"{ratio:.2f}x", f"{cmp} {goal}x",
             ratio > goal if goal == 1.0 else ratio >= goal)
