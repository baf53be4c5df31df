"""Count the valgrind memcheck reports whose stack passes through pyattn's
own code (its extension module), in a log written with --log-file.

    python .ci/valgrind_summary.py valgrind.log     # exit 1 if any

Reports entirely inside CPython or NumPy (CPython's small-int cache and
os.urandom seeding show up as uninitialised reads under valgrind) are
counted separately and do not fail the check.
"""
import re
import sys

MINE = re.compile(r"_C\.cpython|pyattn|pa_[a-z_]+\s*\(")
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
