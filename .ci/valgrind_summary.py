"""Count the valgrind memcheck reports whose stack passes through pyattn's
own code (its extension module), in a log written with --log-file.

    python .ci/valgrind_summary.py valgrind.log     # exit 1 if any

Reports entirely inside CPython or NumPy (CPython's small-int cache and
os.urandom seeding show up as uninitialised reads under valgrind) are
counted separately and do not fail the check.
"""
import os
import re
import sys

# A frame is pyattn's when it names pyattn's own code: a function of the
# extension (pa_*, pyattn_*), one of csrc/'s source files (frames of a build with
# debug lines read "fn (file.c:123)"), or the extension's shared object itself
# ("(in .../pyattn/_C.cpython-311-x86_64-linux-gnu.so)"). Never a bare "pyattn"
# anywhere in a path: a clone named pyattn puts that in every frame of NumPy
# and CPython's import machinery run from its .venv-ci/.
_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csrc")
_FILES = sorted({f for _, _, fs in os.walk(_CSRC) for f in fs if f.endswith((".c", ".h", ".inc"))})
MINE = re.compile(r"(?<![A-Za-z0-9_])(?:pa|pyattn)_[A-Za-z0-9_]+\s*\("
                  r"|[/ ]pyattn/_C\.[A-Za-z0-9_.-]+\.(?:so|pyd)\)"
                  + "".join(r"|\(" + re.escape(f) + r":\d+\)" for f in _FILES))
ERROR = re.compile(r"^(Invalid|Conditional jump|Use of uninitialised|Syscall param|Mismatched|"
                   r"Source and destination|Argument|Jump to)")
LEAK = re.compile(r"are definitely lost")


def blocks(lines):
    cur = []
    for line in lines:
        body = re.sub(r"^==\d+== ?", "", line.rstrip("\n"))
        if body.strip() == "":
            if cur:
                yield cur
            cur = []
        else:
            cur.append(body)
    if cur:
        yield cur


def main(path):
    with open(path) as f:
        bs = list(blocks(f))
    errors = [b for b in bs if ERROR.match(b[0])]
    leaks = [b for b in bs if LEAK.search(b[0])]
    mine_e = [b for b in errors if any(MINE.search(l) for l in b)]
    mine_l = [b for b in leaks if any(MINE.search(l) for l in b)]
    summary = next((l for b in bs for l in b if l.startswith("ERROR SUMMARY")), "no ERROR SUMMARY line")
    print(f"valgrind: {summary}")
    print(f"valgrind: {len(errors)} error contexts in all, {len(mine_e)} through pyattn's code; "
          f"{len(leaks)} definite-leak records in all, {len(mine_l)} through pyattn's code")
    for b in mine_e + mine_l:
        print("\n".join(b))
        print("---")
    return 1 if (mine_e or mine_l) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
