"""Issue 39's limit on private Python functions: none over 10 parameters.

A private function of pyattn/ (measured with `ast`, no import): one whose
name starts with `_` (dunder methods aside), one nested in another, or one
defined in a private module (`pyattn/_*.py`) that is not a public entry
point -- a module-level function whose name a public module's `__all__`
lists (pyattn/__init__.py, flash.py, torch.py, ...; they mirror the
PyTorch / FlashAttention signatures, so they keep theirs), or a method of a
class such a list names. Exempt, and said so here:

  * the torch.library ops and their fakes (decorated `custom_op` /
    `.register_fake`, pyattn/torch.py's `_sdpa_op`, `_sdpa_backward_op`):
    torch.library takes the op's schema from the argument list, so every
    argument is listed there;
  * the oracle's entry points, `pyattn/_reference.py`'s `__all__`: the tests
    call them as the public functions they mirror, keyword for keyword;
  * `pyattn.flash._flash_attn_varlen_forward`: FlashAttention's own private
    `flash_attn_interface._flash_attn_varlen_forward` with its signature,
    which its ported tests (tests/flash_attn/) call (MIRRORS).

Over the limit and reported so (KNOWN_OVER, the count may not grow):
none (`_spec.attn_spec` takes scaled_dot_product_attention's positional
arguments and its further options as one mapping, `opts`).

Parameters: every positional, keyword-only, `*args` and `**kwargs` one,
`self` / `cls` of a method aside. The C side's limits (80 lines, 10
parameters) are measured by csrc/tools/layers.py --sizes and checked in
tests/test_csrc_docs.py."""
import ast
import os

import pytest

pytestmark = [pytest.mark.nofamily]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "pyattn")
MAX_PARAMS = 10
ORACLE = "_reference.py"
# private by name, but mirrors of another library's function with its signature
MIRRORS = {("flash.py", "_flash_attn_varlen_forward")}
# over the limit, reported as such (not hidden behind **kwargs): the one function that lists
# scaled_dot_product_attention's options and checks them into an AttnSpec; the count may not grow
KNOWN_OVER: dict = {}


def _tree(name):
    with open(os.path.join(PKG, name), encoding="utf-8") as fh:
        return ast.parse(fh.read(), filename=name)


def _all_of(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _modules():
    return sorted(f for f in os.listdir(PKG) if f.endswith(".py"))


def _is_private_module(name):
    return name.startswith("_") and not name.startswith("__")


def public_names():
    """Every name a public module's __all__ lists."""
    out = set()
    for name in _modules():
        if not _is_private_module(name):
            out |= _all_of(_tree(name))
    return out


def _torch_library(fn):
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr in ("custom_op", "register_fake"):
            return True
    return False


def _nparams(fn, method):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def private_functions():
    """[(module, qualified name, parameters)] of pyattn/'s private functions
    (as the module docstring defines them), exempt ones left out."""
    public = public_names()
    out = []
    for mod in _modules():
        tree = _tree(mod)
        exempt_names = _all_of(tree) if mod == ORACLE else set()
        private_mod = _is_private_module(mod)

        def visit(node, prefix, cls_public, in_class, in_function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    pub = (not in_function and not child.name.startswith("_")
                           and (child.name in public or not private_mod))
                    visit(child, prefix + child.name + ".", pub, True, in_function)
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = child.name
                    dunder = name.startswith("__") and name.endswith("__")
                    if in_class:
                        public_fn = cls_public and not name.startswith("_")
                    else:
                        public_fn = (not in_function and not name.startswith("_")
                                     and (not private_mod or name in public or name in exempt_names))
                    mirror = (mod, prefix + name) in MIRRORS
                    if not dunder and not public_fn and not mirror and not _torch_library(child):
                        out.append((mod, prefix + name, _nparams(child, in_class)))
                    visit(child, prefix + name + ".", False, False, True)
                else:
                    visit(child, prefix, cls_public, in_class, in_function)

        visit(tree, "", False, False, False)
    return out


def test_the_measure_sees_private_functions():
    """The measure finds what it should (so 'none over the limit' means something)."""
    found = {(m, n) for m, n, _ in private_functions()}
    assert ("_spec.py", "attn_spec") in found            # a private module's helper
    assert ("_reference.py", "_scores") in found          # a private name
    assert ("flash.py", "_flash_attn_varlen_forward") not in found  # FlashAttention's, mirrored
    assert ("_reference.py", "_block_hidden") in found
    assert ("flash.py", "flash_attn_varlen_func") not in found      # public: mirrors FlashAttention
    assert ("_api.py", "scaled_dot_product_attention") not in found  # re-exported by pyattn
    assert ("_kvcache.py", "KVCache.attend") not in found            # a public class's method
    assert ("torch.py", "_sdpa_op") not in found                     # a torch.library op


def test_no_private_python_function_over_the_parameter_limit():
    over = [(m, n, p) for m, n, p in private_functions() if p > KNOWN_OVER.get((m, n), MAX_PARAMS)]
    assert not over, (f"private functions of pyattn/ with more than {MAX_PARAMS} parameters "
                      f"(module, name, parameters): {over}; pass a spec or a small object instead")
