"""python -m pyattn: the seed example, "Your journey starts with one step".

Six 3-d word embeddings attend to each other: dot-product scores, softmax
weights and context vectors, all computed by pyattn; then show_config().
"""
import numpy as np

import pyattn

WORDS = ["Your", "journey", "starts", "with", "one", "step"]
INPUTS = np.array([
    [0.43, 0.15, 0.89],
    [0.55, 0.87, 0.66],
    [0.57, 0.85, 0.64],
    [0.22, 0.58, 0.33],
    [0.77, 0.25, 0.10],
    [0.05, 0.80, 0.55],
], dtype=np.float32)


def _table(m, rows, cols):
    w = max(max(len(c) for c in cols), 7) + 1
    out = [" " * 9 + "".join(f"{c:>{w}}" for c in cols)]
    for r, row in zip(rows, m):
        out.append(f"{r:>8} " + "".join(f"{x:>{w}.4f}" for x in row))
    return "\n".join(out)


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m pyattn",
        description="pyattn's demo: the seed example \"Your journey starts with one step\" (six "
                    "3-d word embeddings attend to each other: scores, softmax weights, context "
                    "vectors, computed by pyattn), then show_config(): the version, compiler, "
                    "kernel family and threads.",
        epilog="Environment: PYATTN_ISA=generic|avx2|avx512|avx512emu|neon caps the kernel "
               "family; PYATTN_NUM_THREADS sets the threads.")
    parser.add_argument("--config", action="store_true",
                        help="print only show_config(), not the demo")
    args = parser.parse_args(argv)
    if args.config:
        pyattn.show_config()
        return
    print('pyattn: "Your journey starts with one step"\n')
    print("Inputs (one 3-d embedding per word):")
    print(_table(INPUTS, WORDS, ["x1", "x2", "x3"]), "\n")
    scores = pyattn.matmul(INPUTS, INPUTS.T)
    print("Attention scores  (inputs @ inputs.T):")
    print(_table(scores, WORDS, WORDS), "\n")
    weights = pyattn.softmax(scores, axis=-1)
    print("Attention weights (softmax over each row; rows sum to 1):")
    print(_table(weights, WORDS, WORDS), "\n")
    context, w2 = pyattn.scaled_dot_product_attention(INPUTS, INPUTS, INPUTS, scale=1.0,
                                                      return_weights=True)
    print("Context vectors   (weights @ inputs, one fused kernel call):")
    print(_table(context, WORDS, ["z1", "z2", "z3"]))
    print(f"\nfused weights == softmax(scores): max difference {np.abs(w2 - weights).max():.1e}\n")
    pyattn.show_config()


def _run(argv=None):
    """main(), quiet when the reader goes away: `python -m pyattn --config |
    head -3` closes the pipe early, which is no error of pyattn's (Python's
    documented handling of EPIPE: stdout to devnull, exit status 1)."""
    import os
    import sys
    try:
        main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # the interpreter's final flush writes nowhere
        sys.exit(1)


if __name__ == "__main__":
    _run()
