"""The CPU attention a user could pick instead of pyattn, beside PyTorch in
bench.py: ONNX Runtime (the ONNX `Attention` op, opset 23, on the CPU
execution provider) and OpenVINO (`openvino.opset13.scaled_dot_product_attention`
on the CPU plugin, float32 inference forced: its default on a CPU with
AVX512_BF16 would be bfloat16). Each is optional: when it is not installed its
columns are left out with one message (pip install onnxruntime onnx openvino,
or pyattn's `bench` extra). Both run at the worker's thread count (ORT's
intra-op pool, OpenVINO's INFERENCE_NUM_THREADS) on (B, H, L, E) float32
arrays, the same q, k, v as pyattn's and torch's rows.

Target (issue 23, "No library faster"): pyattn >= 1.15x each of them on every
benchmark attention shape, at 1 and 2 threads (median times).
"""
from __future__ import annotations

import sys

PEERS = ("onnxruntime", "openvino")
GOAL = 1.15
_said = set()


def _say(msg):
    if msg not in _said:
        _said.add(msg)
        print("bench: " + msg, file=sys.stderr, flush=True)


def _ort(q, k, v, causal, threads):
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        _say("onnxruntime or onnx is not installed: no ONNX Runtime rows (pip install onnxruntime onnx)")
        return None
    shp = lambda x: list(x.shape)  # noqa: E731
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=int(bool(causal)))
    graph = helper.make_graph(
        [node], "sdpa",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shp(x)) for n, x in (("Q", q), ("K", k), ("V", v))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shp(q)[:-1] + [v.shape[-1]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = min(model.ir_version, 10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as exc:          # an ORT without the op: say so, leave the rows out
        _say(f"onnxruntime {ort.__version__} cannot run the ONNX Attention op ({type(exc).__name__}): "
             "no ONNX Runtime rows")
        return None
    feed = {"Q": q, "K": k, "V": v}
    return lambda: sess.run(None, feed)[0]


def _ov(q, k, v, causal, threads):
    try:
        import openvino as ov
        import openvino.opset13 as ops
    except ImportError:
        _say("openvino is not installed: no OpenVINO rows (pip install openvino)")
        return None
    ps = [ops.parameter(list(x.shape), ov.Type.f32, name=n) for n, x in (("q", q), ("k", k), ("v", v))]
    out = ops.scaled_dot_product_attention(*ps, causal=bool(causal))
    model = ov.Model([out], ps, "sdpa")
    core = ov.Core()
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                 "INFERENCE_PRECISION_HINT": "f32",
                                                 "PERFORMANCE_HINT": "LATENCY"})
    req = compiled.create_infer_request()
    feed = {0: q, 1: k, 2: v}
    return lambda: req.infer(feed)[0]


def attention_impls(q, k, v, causal, threads):
    """{"onnxruntime": fn, "openvino": fn}: whichever is installed; each fn
    computes softmax(q k^T / sqrt(E)) v (causal: top-left) on the arrays."""
    out = {}
    for name, make in (("onnxruntime", _ort), ("openvino", _ov)):
        fn = make(q, k, v, causal, threads)
        if fn is not None:
            out[name] = fn
    return out


def check(impls, want, atol=1e-3):
    """Drop (with a message) a peer whose result is not pyattn's within atol:
    a peer that computes something else is timed for nothing."""
    import numpy as np
    for name in [n for n in impls if n in PEERS]:
        got = np.asarray(impls[name]())
        if got.shape != want.shape or not np.allclose(got, want, atol=atol, rtol=1e-3):
            _say(f"{name}'s attention differs from pyattn's (max |diff| "
                 f"{np.max(np.abs(got - want)) if got.shape == want.shape else 'shape ' + str(got.shape)}): "
                 "its rows are left out")
            del impls[name]


def versions():
    """'ONNX Runtime x, OpenVINO y' (or 'not installed') for the report's head"""
    parts = []
    for mod, label in (("onnxruntime", "ONNX Runtime"), ("openvino", "OpenVINO")):
        try:
            m = __import__(mod)
            parts.append(f"{label} {getattr(m, '__version__', '?')}")
        except ImportError:
            parts.append(f"{label}: not installed (no rows, no targets against it)")
    return ", ".join(parts)


def target_lines(data, line):
    """The targets' rows against the peers: per attention shape and thread
    count, pyattn's speed over each peer's (median times), >= GOAL."""
    get = {(r["op"], r["shape"], r["impl"], r["threads"]): r for r in data}
    for (op, shape, impl, thr), r in sorted(get.items(), key=lambda kv: (kv[0][3], kv[0][1])):
        if op != "sdpa" or impl not in PEERS:
            continue
        me = get.get((op, shape, "pyattn", thr))
        if me:
            ratio = r["median_ms"] / me["median_ms"]
            line(f"SDPA {shape}, {thr} thr, vs {impl}", f"{ratio:.2f}x", f">= {GOAL}x", ratio >= GOAL)
