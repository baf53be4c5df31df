"""bench.py's "hfgen" section (issue 38 item 4): Hugging Face generation.

``model.generate`` (greedy) with attn_implementation "pyattn", "sdpa" and
"eager", on transformers' default cache (DynamicCache) and on its static cache
(``cache_implementation="static"``), models built from configs (random
weights, nothing downloaded), float32:

- (a) one sequence, prompt 1024, 4 layers, hidden 1024, vocabulary 32000:
  Llama-shaped (16 query heads / 4 KV heads), Qwen2-shaped (8 / 2, head dim
  128, qkv bias) and Mistral-shaped (16 / 4, sliding window 512: the window
  is shorter than the prompt);
- (b) 4 sequences of 2048, 4 layers, hidden 512, 8 / 2 heads: Llama-shaped.

32 generated tokens each (``--quick``: prompt 512 and 4 x 1024, 16 tokens,
2 rounds). The implementations run interleaved (one generate call each per
round, 3 rounds after a short warm-up call) and the rows give the medians
over the rounds of:

- prefill ms: the first forward of the generate call (the model's forward,
  timed by hooks on it);
- decode ms / token: the mean of the other forwards (the decode steps);
- attention share: the time inside the attention function (every layer's
  call, timed by a wrapper registered as its own attn_implementation, as
  the "hf" section does) over the forward's time, prefill and decode apart;
- backend own us / call (pyattn only): time in
  ``pyattn.transformers.attention_forward`` minus the time in the pyattn C
  calls it makes (every function of ``pyattn._C`` wrapped by a timer), per
  attention call: the prefill's, and the median over the decode steps.

The wrappers cost well under a microsecond per call (against milliseconds
per step). Skipped, with a message, without PyTorch or transformers. Runs
only when named: ``python benchmarks/bench.py --only hfgen``.
"""
from __future__ import annotations

import statistics
import sys
import time

IMPLS = ("pyattn", "sdpa", "eager")


def _cases(quick):
    P1, P2, G = (512, 1024, 16) if quick else (1024, 2048, 32)
    a = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4)
    b = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2)
    return G, [
        ("Llama", "LlamaConfig", "LlamaForCausalLM", dict(a, num_attention_heads=16, num_key_value_heads=4),
         1, P1, f"(a) B=1 P={P1} d=1024 Hq=16 Hkv=4"),
        ("Qwen2", "Qwen2Config", "Qwen2ForCausalLM", dict(a, num_attention_heads=8, num_key_value_heads=2),
         1, P1, f"(a) B=1 P={P1} d=1024 Hq=8 Hkv=2"),
        ("Mistral", "MistralConfig", "MistralForCausalLM",
         dict(a, num_attention_heads=16, num_key_value_heads=4, sliding_window=P1 // 2),
         1, P1, f"(a) B=1 P={P1} d=1024 Hq=16 Hkv=4 window={P1 // 2}"),
        ("Llama", "LlamaConfig", "LlamaForCausalLM", b, 4, P2, f"(b) B=4 P={P2} d=512 Hq=8 Hkv=2"),
    ]


def hfgen(args, emit, torch):
    if torch is None:
        print("bench: hfgen rows skipped: PyTorch is not installed", file=sys.stderr, flush=True)
        return
    try:
        import transformers
        import pyattn.transformers as pht
    except ImportError as exc:
        print(f"bench: hfgen rows skipped: {exc} (pip install \"pyattn[transformers]\")", file=sys.stderr,
              flush=True)
        return
    from pyattn import _C

    clock = {"attn": 0.0, "c": 0.0, "calls": 0}

    def timed(fn):
        def f(*a, **kw):
            t = time.perf_counter()
            r = fn(*a, **kw)
            clock["attn"] += time.perf_counter() - t
            clock["calls"] += 1
            return r
        return f

    def c_timed(fn):
        def f(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                clock["c"] += time.perf_counter() - t
        return f

    # every C entry of pyattn, timed (pyattn's Python layers look them up on the module at call
    # time), put back after the section
    real = {name: getattr(_C, name) for name in dir(_C)
            if not name.startswith("_") and type(getattr(_C, name)).__name__ == "builtin_function_or_method"}
    for name, fn in real.items():
        setattr(_C, name, c_timed(fn))
    try:
        _run(args, emit, torch, transformers, pht, clock, timed)
    finally:
        for name, fn in real.items():
            setattr(_C, name, fn)


def _run(args, emit, torch, transformers, pht, clock, timed):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
    eager_fns = {}

    def eager_timed(module, *a, **kw):       # the model's own eager function (each model file has one)
        fn = eager_fns.get(type(module))
        if fn is None:
            fn = eager_fns[type(module)] = sys.modules[type(module).__module__].eager_attention_forward
        return fn(module, *a, **kw)

    for name, fn, mask in (("pyattn", pht.attention_forward, sdpa_mask), ("sdpa", sdpa_attention_forward, sdpa_mask),
                           ("eager", eager_timed, eager_mask)):
        AttentionInterface.register(f"{name}_hfgen", timed(fn))
        AttentionMaskInterface.register(f"{name}_hfgen", mask)

    G, cases = _cases(args.quick)
    rounds = 2 if args.quick else 3
    for model_name, cfg_name, cls_name, kw, B, P, shape in cases:
        cfg = getattr(transformers, cfg_name)(max_position_embeddings=P + G + 8, **kw)
        torch.manual_seed(0)
        model = getattr(transformers, cls_name)(cfg).eval()
        ids = torch.randint(3, cfg.vocab_size, (B, P))
        steps = []                               # the forwards of one generate call

        def pre(mod, a, kwa):
            clock["attn"] = clock["c"] = 0.0
            clock["calls"] = 0
            steps.append(time.perf_counter())

        def post(mod, a, kwa, out):
            steps[-1] = (time.perf_counter() - steps[-1], clock["attn"], clock["c"], clock["calls"])

        h1 = model.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = model.register_forward_hook(post, with_kwargs=True)

        def generate(impl, cache, x, n):
            model.set_attn_implementation(f"{impl}_hfgen")
            steps.clear()
            kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            if cache == "static":
                kw["cache_implementation"] = "static"
            t = time.perf_counter()
            with torch.no_grad():
                out = model.generate(x, attention_mask=torch.ones_like(x), **kw)
            total = time.perf_counter() - t
            assert out.shape == (x.shape[0], x.shape[1] + n) and len(steps) == n
            return total, list(steps), out[:, x.shape[1]:]

        for cache in ("dynamic", "static"):
            for impl in IMPLS:                   # warm-up: a short prompt, 2 tokens
                generate(impl, cache, ids[:, :64], 2)
            res = {k: [] for k in IMPLS}
            toks = {}
            for _ in range(rounds):
                for impl in IMPLS:               # interleaved
                    time.sleep(args.settle)
                    total, st, toks[impl] = generate(impl, cache, ids, G)
                    res[impl].append((total, st))
            for impl, runs in res.items():
                def med(f):
                    return statistics.median(f(st) for _, st in runs)
                dec = lambda st: st[1:]          # noqa: E731
                r = dict(kind="hfgen", model=model_name, shape=shape, cache=cache, impl=impl,
                         threads=args.threads, tokens=G, rounds=rounds,
                         same_tokens_as_sdpa=bool(torch.equal(toks[impl], toks["sdpa"])),
                         prefill_ms=1e3 * med(lambda st: st[0][0]),
                         prefill_min_ms=1e3 * min(st[0][0] for _, st in runs),
                         prefill_attn_ms=1e3 * med(lambda st: st[0][1]),
                         decode_ms=1e3 * med(lambda st: statistics.fmean(s[0] for s in dec(st))),
                         decode_min_ms=1e3 * min(statistics.fmean(s[0] for s in dec(st)) for _, st in runs),
                         decode_attn_ms=1e3 * med(lambda st: statistics.fmean(s[1] for s in dec(st))),
                         generate_ms=1e3 * statistics.median(t for t, _ in runs))
                if impl == "pyattn":
                    r["own_prefill_us"] = 1e6 * med(lambda st: (st[0][1] - st[0][2]) / st[0][3])
                    r["own_decode_us"] = 1e6 * med(lambda st: statistics.median(
                        (s[1] - s[2]) / s[3] for s in dec(st)))
                    r["own_decode_max_us"] = 1e6 * max(max((s[1] - s[2]) / s[3] for s in dec(st)) for _, st in runs)
                emit(r)
        h1.remove()
        h2.remove()
        del model


def hfgen_tables(rows):
    """The generation table (one row per model, shape, cache and thread
    count; the implementations side by side)"""
    rs = [r for r in rows if r.get("kind") == "hfgen"]
    if not rs:
        return ""
    out = ["## Hugging Face generation (issue 38 item 4)", "",
           "model.generate, greedy, float32, models built from configs; prefill = the generate call's first "
           "forward, decode = its other forwards (ms per token); x = sdpa's (eager's) time / pyattn's "
           "(above 1: pyattn is faster); attn % = the share of the forward spent in the attention function "
           "(pyattn / sdpa / eager); attn x sdpa = sdpa's attention time / pyattn's (the attention alone); "
           "own us = pyattn.transformers' time per attention call outside pyattn's C calls (prefill; decode "
           "median). Medians over the rounds.", "",
           "| model | shape | cache | thr | prefill ms pyattn / sdpa / eager | x sdpa | x eager | attn % | "
           "attn x sdpa | decode ms/tok pyattn / sdpa / eager | x sdpa | x eager | attn % | attn x sdpa | "
           "own us/call | tokens = sdpa's |",
           "|" + "---|" * 16]
    groups = {}
    for r in rs:
        groups.setdefault((r["model"], r["shape"], r["cache"], r["threads"]), {})[r["impl"]] = r
    for (model, shape, cache, thr), g in groups.items():
        if not all(k in g for k in IMPLS):
            continue
        p, s, e = (g[k] for k in IMPLS)

        def part(key, akey):
            return (f"{p[key]:.1f} / {s[key]:.1f} / {e[key]:.1f}" if key == "prefill_ms" else
                    f"{p[key]:.2f} / {s[key]:.2f} / {e[key]:.2f}",
                    f"{s[key] / p[key]:.2f}x", f"{e[key] / p[key]:.2f}x",
                    " / ".join(f"{100 * x[akey] / x[key]:.0f}" for x in (p, s, e)),
                    f"{s[akey] / p[akey]:.2f}x")
        pre, dec = part("prefill_ms", "prefill_attn_ms"), part("decode_ms", "decode_attn_ms")
        same = "yes" if p["same_tokens_as_sdpa"] else "no"
        out.append(f"| {model} | {shape} | {cache} | {thr} | " + " | ".join(pre) + " | " + " | ".join(dec) +
                   f" | {p['own_prefill_us']:.0f}; {p['own_decode_us']:.0f} | {same} |")
    return "\n".join(out)


def hfgen_targets(rows, line):
    """Issue 38's generation targets: never slower than sdpa in prefill or
    decode (Llama-shaped: both shapes; the Qwen2- and Mistral-shaped rows
    beside them), the backend's own time per call <= 50 us"""
    rs = [r for r in rows if r.get("kind") == "hfgen"]
    groups = {}
    for r in rs:
        groups.setdefault((r["model"], r["shape"], r["cache"], r["threads"]), {})[r["impl"]] = r
    for (model, shape, cache, thr), g in groups.items():
        p, s = g.get("pyattn"), g.get("sdpa")
        if not p or not s:
            continue
        a, b = s["prefill_ms"] / p["prefill_ms"], s["decode_ms"] / p["decode_ms"]
        share = (f"attention {100 * p['prefill_attn_ms'] / p['prefill_ms']:.0f} % / "
                 f"{100 * p['decode_attn_ms'] / p['decode_ms']:.0f} % of pyattn's prefill / decode step, "
                 f"attention alone {s['prefill_attn_ms'] / p['prefill_attn_ms']:.2f}x / "
                 f"{s['decode_attn_ms'] / p['decode_attn_ms']:.2f}x sdpa's")
        line(f"issue 38: HF generate {model} {shape}, {cache} cache, {thr} thr, prefill and decode vs sdpa ({share})",
             f"{a:.2f}x, {b:.2f}x", ">= 1.0x both", a >= 1.0 and b >= 1.0)
        own = max(p["own_prefill_us"], p["own_decode_us"])
        line(f"issue 38: HF generate {model} {shape}, {cache} cache, {thr} thr, backend's own time per attention "
             "call (prefill; decode median)", f"{p['own_prefill_us']:.0f}; {p['own_decode_us']:.0f} us",
             "<= 50 us", own <= 50)
