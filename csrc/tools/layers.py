#!/usr/bin/env python3
"""layers.py -- the arrows between pyattn's C files, measured from the sources.

    python csrc/tools/layers.py            (the report; exit status 0)
    python csrc/tools/layers.py --graph    (also every include and call arrow)
    python csrc/tools/layers.py --objects build   (calls from `nm` of a build's
                                           object files instead: a cross-check)
    python csrc/tools/layers.py --sizes    (only: the functions of csrc/*.c and
                                           ops/ over 80 lines or 10
                                           parameters, longest first)

Reads every file under csrc/ (stdlib only, no compiler, no build needed) and
prints:
  * the include graph: `#include "..."` between csrc files, resolved as the
    build does (the including file's folder first, then csrc/, which setup.py
    passes as -I); `#include PA_TEMPLATE` is an arrow from the file that
    #defines PA_TEMPLATE to the template it names (through dtypes.inc);
  * the call graph between translation units, by a regex over the sources
    (not from object files, unless --objects): each .c with the .inc files
    it includes is one unit; a unit's external symbols are its file-scope
    functions and data not declared static, named in the source, plus the
    kernels made by macros -- `#define PA_..._SYM name`, and pa_*_<isa>
    for a family file that #defines PA_ISA <isa> (pa_*_ref: ref.c); an
    arrow A -> B is a use in A (a call, a function pointer or table taken)
    of a symbol defined in B. Comments, strings and preprocessor lines are
    ignored. Not seen: uses inside headers' inline functions, tables made
    by X-macros (dispatch.c's family list), and a local that shadows a
    global of the same name would count as a use (the --graph listing names
    every arrow's symbols, to check);
  * cycles in both graphs (strongly connected components of more than one
    file, counted), and the arrows that go UP against the layer order of
    csrc/README.md's file map: its table rows, top to bottom, are the
    order; an arrow from a file to one listed above it is upward. An .inc
    counts as part of the .c that includes it (for calls), and an arrow
    between a .c and its own .h is neither up nor down.
The last lines are the counts csrc/README.md ("The layering rule, measured")
quotes; tests/test_csrc_docs.py checks that none of them grows.

--sizes measures issue 39's target "no binding or frame function over 80
lines or 10 parameters" instead: every function defined in csrc/*.c (the
binding -- module.c, bind_*.c -- and the dispatch and runtime files beside
it) and in ops/ (its .c and .inc files; a template's name as written,
PA_CAT(...)), from the line of its name to its closing brace, and its
parameters (top-level commas of the list; `void` is none), over either
limit, listed longest first with the counts. kernels/ (the kernel contract's
signatures, csrc/README.md) and check/ (test-only) are not measured.
Function-like macros are not functions here. tests/test_csrc_docs.py fails
when a count is not 0.
"""
import os
import re
import sys

CSRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_EXT = (".c", ".h", ".inc")


def csrc_files(root=CSRC):
    """Every file under csrc/ (relative, '/'-separated), README.md and
    caches left out."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
        for f in sorted(files):
            if f.endswith((".pyc", ".o", ".so", ".pyd")) or f.startswith("."):
                continue
            rel = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            if rel != "README.md":
                out.append(rel)
    return sorted(out)


def read(rel, root=CSRC):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
        return fh.read()


# ---- the file map of csrc/README.md -----------------------------------------------

ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|")


def file_map(root=CSRC):
    """[(file, layer)] in the order of README.md's file map table."""
    path = os.path.join(root, "README.md")
    if not os.path.exists(path):
        return []
    rows, on = [], False
    for line in read("README.md", root).splitlines():
        if line.startswith("## "):
            on = line.strip().lower().startswith("## file map")
            continue
        m = ROW.match(line) if on else None
        if m:
            rows.append((m.group(1), m.group(2)))
    return rows


# ---- the include graph ------------------------------------------------------------

INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|(PA_TEMPLATE))', re.M)
TEMPLATE = re.compile(r'^\s*#\s*define\s+PA_TEMPLATE\s+"([^"]+)"', re.M)


def resolve(rel, name, files):
    here = os.path.dirname(rel)
    for cand in (os.path.normpath(os.path.join(here, name)), os.path.normpath(name)):
        cand = cand.replace(os.sep, "/")
        if cand in files:
            return cand
    return None


def include_graph(files, root=CSRC):
    """{file: set of files it includes}: csrc files only; a template included
    through dtypes.inc counts as included by the file that names it."""
    fs = set(files)
    g = {f: set() for f in files if f.endswith(SOURCE_EXT)}
    for f in g:
        text = read(f, root)
        for m in INCLUDE.finditer(text):
            if m.group(1):
                t = resolve(f, m.group(1), fs)
                if t:
                    g[f].add(t)
        for m in TEMPLATE.finditer(text):
            t = resolve(f, m.group(1), fs)
            if t:
                g[f].add(t)
    return g


# ---- the call graph ------------------------------------------------------------------

def strip(text):
    """C text without comments, string / char literals and preprocessor lines."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\\n])*'", "''", text)
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", text, flags=re.M)
    return text


def units(files, inc):
    """{unit .c: [its files: itself and the .inc it includes, transitively]}."""
    out = {}
    for f in files:
        if not f.endswith(".c"):
            continue
        seen, todo = [f], [f]
        while todo:
            for t in sorted(inc.get(todo.pop(), ())):
                if t.endswith(".inc") and t not in seen:
                    seen.append(t)
                    todo.append(t)
        out[f] = seen
    return out


IDENT = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = set("""if for while switch return sizeof do else case default goto break continue
typedef struct union enum static extern const volatile inline register restrict
_Static_assert _Alignof _Alignas _Atomic _Generic _Noreturn _Thread_local""".split())


def top_level(text):
    """The file-scope statements of stripped C text, with the body of each
    function definition cut out: [(head, has_body)]."""
    out, depth, start, i, n = [], 0, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            if depth == 0:
                head = text[start:i]
                body = not head.rstrip().endswith("=") and ")" in head
                out.append((head, body))
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                start = i + 1
        elif c == ";" and depth == 0:
            out.append((text[start:i], False))
            start = i + 1
        i += 1
    return out


DEF_FN = re.compile(r"\b([A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*$", re.S)
DEF_DATA = re.compile(r"\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])*\s*=")


def definitions(text):
    """Names of the non-static functions and data a stripped unit defines."""
    names = set()
    for head, body in top_level(text):
        h = head.strip()
        if not h or re.match(r"(static|typedef|extern)\b", h) or "static " in h.split("(")[0]:
            continue
        if body:
            m = DEF_FN.search(h)
            if m and m.group(1) not in KEYWORDS and not m.group(1).isupper() and not re.search(r"\b[A-Z][A-Z0-9_]*\s*\(", h[:m.start(1)] + h[m.start(1):m.end(1)]):
                names.add(m.group(1))
        else:
            m = DEF_DATA.search(h)
            if m and "(" not in h[:m.start(1)]:
                names.add(m.group(1))
    return names


SYM_DEFINE = re.compile(r"^\s*#\s*define\s+PA_\w*SYM\s+(pa_\w+)\s*$", re.M)
ISA_DEFINE = re.compile(r"^\s*#\s*define\s+PA_ISA\s+(\w+)\s*$", re.M)
REF_DEFINE = re.compile(r"^\s*#\s*define\s+PA_REF\(", re.M)


def call_graph(files, inc, root=CSRC):
    """({unit: {unit it uses: sorted symbols}}, {symbol: defining unit})."""
    us = units(files, inc)
    texts = {u: strip("\n".join(read(f, root) for f in fs)) for u, fs in us.items()}
    raw = {u: "\n".join(read(f, root) for f in fs) for u, fs in us.items()}
    owner, isa = {}, {}
    for u, t in texts.items():
        for name in definitions(t):
            owner.setdefault(name, u)
        for name in SYM_DEFINE.findall(raw[u]):   # a kernel named by #define PA_..._SYM
            owner.setdefault(name, u)
        m = ISA_DEFINE.search(raw[u])             # a family file: its kernels' suffix
        if m and "kernels/vec/family_vec.inc" in us[u]:
            isa[m.group(1)] = u
        if REF_DEFINE.search(raw[u]):
            isa["ref"] = u
    kernel = re.compile(r"pa_\w+_(%s)$" % "|".join(sorted(isa))) if isa else None
    g = {u: {} for u in us}
    for u, t in texts.items():
        for name in set(IDENT.findall(t)):
            v = owner.get(name)
            if v is None and kernel is not None and name.startswith("pa_"):
                m = kernel.match(name)             # pa_<kind>_<sfx>_<isa>: made by macros
                v = isa[m.group(1)] if m else None
            if v and v != u:
                g[u].setdefault(v, []).append(name)
    for u in g:
        for v in g[u]:
            g[u][v].sort()
    return g, owner


def nm_graph(objdir, files):
    """The call graph from object files instead (`nm`, which must be on PATH):
    every x.o under objdir whose path ends in csrc/<unit>.o (setup.py's build
    tree, build/temp.*/csrc/...), an arrow A -> B per symbol A's object leaves
    undefined and B's defines. It sees what the regex cannot (symbols made by
    macros, uses inside inline functions of headers); units without an object
    (another architecture's kernels) are left out."""
    import subprocess
    defs, undef = {}, {}
    for d, _, fs in os.walk(objdir):
        for f in fs:
            path = os.path.join(d, f).replace(os.sep, "/")
            if not f.endswith(".o") or "csrc/" not in path:
                continue
            unit = path.rsplit("csrc/", 1)[1][:-2] + ".c"
            if unit not in files:
                continue
            out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                p = line.split()
                if len(p) == 3 and p[1] in "TDRBCVW":
                    defs.setdefault(p[2], unit)
                elif len(p) == 2 and p[0] == "U":
                    undef.setdefault(unit, set()).add(p[1])
    g = {u: {} for u in set(defs.values()) | set(undef)}
    for u, names in undef.items():
        for name in names:
            v = defs.get(name)
            if v and v != u:
                g[u].setdefault(v, []).append(name)
    for u in g:
        for v in g[u]:
            g[u][v].sort()
    return g


# ---- cycles and upward arrows ------------------------------------------------------------

def cycles(g):
    """Strongly connected components of more than one node (Tarjan), sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(g.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def stem(f):
    return f.rsplit(".", 1)[0]


def upward(g, rank):
    """Arrows a -> b with b listed above a in the file map (a .c and its own
    .h excepted; files the map does not name are reported apart)."""
    out = []
    for a in sorted(g):
        for b in sorted(g[a]):
            if a in rank and b in rank and rank[b] < rank[a] and stem(a) != stem(b):
                out.append((a, b))
    return out


# ---- function sizes (--sizes) ---------------------------------------------------------

MAX_LINES, MAX_PARAMS = 80, 10


def _blank_keep_lines(m):
    return "\n" * m.group(0).count("\n")


def strip_keep_lines(text):
    """strip(), but every removed line kept as an empty one (line numbers hold)."""
    text = re.sub(r"/\*.*?\*/", _blank_keep_lines, text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\\n])*'", "''", text)
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", _blank_keep_lines, text, flags=re.M)
    return text


def _split_top(params):
    depth, cur, out = 0, "", []
    for c in params:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    out.append(cur)
    out = [p.strip() for p in out]
    return [] if out == ["void"] or out == [""] else out


def functions(text):
    """[(name, first line, lines, parameters)] of the function definitions in C text."""
    t = strip_keep_lines(text)
    out, depth, start, i, n = [], 0, 0, 0, len(t)
    while i < n:
        c = t[i]
        if c == "{":
            if depth == 0:
                head = t[start:i].rstrip()
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if head.endswith(")") and not head.endswith("=") and not re.search(r"\b(struct|union|enum)\b[^()]*$", head):
                    d, j = 0, len(head) - 1
                    while j >= 0:                       # the parameter list's "("
                        d += head[j] == ")"
                        d -= head[j] == "("
                        if d == 0:
                            break
                        j -= 1
                    params = head[j + 1:-1]
                    pre = head[:j].rstrip()
                    m = re.search(r"(PA_CAT\s*\([^()]*\)|[A-Za-z_]\w*)\s*$", pre)
                    if m and m.group(1) not in KEYWORDS and not m.group(1).isupper():
                        name = re.sub(r"\s+", "", m.group(1))
                        first = t.count("\n", 0, start + m.start(1)) + 1
                        last = t.count("\n", 0, i) + 1
                        out.append((name, first, last - first + 1, len(_split_top(params))))
                start = i + 1
        elif c == ";" and depth == 0:
            start = i + 1
        i += 1
    return out


def size_report(root=CSRC, out=None, max_lines=MAX_LINES, max_params=MAX_PARAMS):
    """The functions of csrc/*.c and ops/ over the limits; returns them."""
    w = (out or sys.stdout).write
    rows = []
    for f in csrc_files(root):
        if not (("/" not in f and f.endswith(".c")) or
                (f.startswith("ops/") and f.endswith((".c", ".inc")))):
            continue
        for name, first, lines, params in functions(read(f, root)):
            if lines > max_lines or params > max_params:
                rows.append((lines, params, f, first, name))
    rows.sort(key=lambda r: (-r[0], -r[1], r[2], r[3]))
    w(f"functions of csrc/*.c and ops/ over {max_lines} lines or {max_params} parameters:\n")
    for lines, params, f, first, name in rows:
        w(f"  {lines:4d} lines {params:3d} params  {f}:{first}  {name}\n")
    w(f"\nover {max_lines} lines: {sum(r[0] > max_lines for r in rows)}\n")
    w(f"over {max_params} parameters: {sum(r[1] > max_params for r in rows)}\n")
    return rows


def report(root=CSRC, graph=False, out=None, objects=None):
    files = csrc_files(root)
    rows = file_map(root)
    rank = {f: i for i, (f, _) in enumerate(rows)}
    layer = dict(rows)
    unnamed = [f for f in files if f not in rank]
    inc = include_graph(files, root)
    calls = nm_graph(objects, set(files)) if objects else call_graph(files, inc, root)[0]
    w = (out or sys.stdout).write
    w(f"csrc/: {len(files)} files (README.md aside); the file map names {len(rows)}\n")
    w(f"calls from: {'nm of the objects under ' + objects if objects else 'a regex over the sources'}\n")
    for f in unnamed:
        w(f"  not in the file map: {f}\n")
    if graph:
        w("\ninclude graph (file -> files it includes):\n")
        for a in sorted(inc):
            if inc[a]:
                w(f"  {a} -> {', '.join(sorted(inc[a]))}\n")
        w("\ncall graph (unit -> unit: symbols used):\n")
        for a in sorted(calls):
            for b in sorted(calls[a]):
                w(f"  {a} -> {b}: {', '.join(calls[a][b])}\n")
    ic, cc = cycles(inc), cycles({a: set(b) for a, b in calls.items()})
    iu, cu = upward(inc, rank), upward(calls, rank)
    w("\ninclude cycles:\n")
    for c in ic:
        w(f"  {' <-> '.join(c)}\n")
    w("call cycles:\n")
    for c in cc:
        w(f"  {' <-> '.join(c)}\n")
    w("upward includes (file -> a file listed above it):\n")
    for a, b in iu:
        w(f"  {a} [{layer[a]}] -> {b} [{layer[b]}]\n")
    w("upward calls (unit -> a unit listed above it: symbols):\n")
    for a, b in cu:
        w(f"  {a} [{layer[a]}] -> {b} [{layer[b]}]: {', '.join(calls[a][b])}\n")
    counts = {"files not in the file map": len(unnamed), "include cycles": len(ic),
              "call cycles": len(cc), "upward includes": len(iu), "upward calls": len(cu)}
    w("\n")
    for k, v in counts.items():
        w(f"{k}: {v}\n")
    return counts


if __name__ == "__main__":
    args = sys.argv[1:]
    objs = args[args.index("--objects") + 1] if "--objects" in args[:-1] else None
    if "--sizes" in args:
        size_report()
    else:
        report(graph="--graph" in args, objects=objs)
