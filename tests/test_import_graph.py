"""No circles among pyattn's modules (issue 39, item 3).

The import graph is read from the source with ``ast``: every ``from . import
x``, ``from .x import y``, ``from pyattn.x import y`` and ``import pyattn.x``,
at module level AND inside functions (a function-level import only hides a
circle from the interpreter; the modules still depend on each other). The
package's ``__init__`` (which imports every module to re-export it) and
``__main__`` are left out: an edge into them is a module reading a name the
package re-exports, not a layer."""
import ast
import os

import pytest

import pyattn

pytestmark = [pytest.mark.nofamily]

PKG = os.path.dirname(os.path.abspath(pyattn.__file__))
LEFT_OUT = {"__init__", "__main__"}


def import_graph(folder, package="pyattn"):
    """{module: {modules it imports}} over the folder's .py files."""
    mods = {f[:-3] for f in os.listdir(folder) if f.endswith(".py")} - LEFT_OUT
    graph = {}
    for m in sorted(mods):
        with open(os.path.join(folder, m + ".py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), m + ".py")
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 or (node.level == 0 and node.module and
                                       node.module.split(".")[0] == package):
                    base = (node.module or "") if node.level == 1 else node.module.partition(".")[2]
                    if base:                            # from .x import y / from pyattn.x import y
                        deps.add(base.split(".")[0])
                    else:                               # from . import x, y
                        deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == package and len(parts) > 1:
                        deps.add(parts[1])
        graph[m] = sorted(d for d in deps if d in mods and d != m)
    return graph


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in graph.get(m, ()):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            c = visit(m)
            if c:
                return c
    return None


def test_pyattn_has_no_import_cycle():
    graph = import_graph(PKG)
    assert "_api" in graph and "_paged" in graph          # the graph was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in pyattn/: " + " -> ".join(cycle)


def test_check_finds_a_function_level_cycle(tmp_path):
    """The check fails on what it is for: a circle hidden by a function-level import."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .c import g\n    return g\n")
    (tmp_path / "c.py").write_text("import pyattn.a\n")
    (tmp_path / "d.py").write_text("from . import a, c\nfrom .b import f\n")
    graph = import_graph(str(tmp_path))
    assert graph == {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a", "b", "c"]}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    (tmp_path / "c.py").write_text("import numpy\n")
    assert find_cycle(import_graph(str(tmp_path))) is None
