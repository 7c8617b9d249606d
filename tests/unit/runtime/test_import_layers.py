"""The node runtime's imports run one way: contract -> engines -> script -> examples, and never in a circle.

Every module of ``runtime/dynatrain_runtime`` is parsed with ``ast`` (no import runs), every ``import``
and ``from ... import`` in it is read -- function-local ones too: a lazy import is still a dependency --
and resolved to the runtime module it names.  A part of the package (a sub-package, or the top level)
may import its own modules and the parts of lower layers only; peers on one layer do not import each
other (``engines`` and ``daemons``; ``script`` and ``launcher``).  The import graph has no cycle.
"""
from __future__ import annotations

import ast
import os
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PACKAGE = "dynatrain_runtime"
PACKAGE_DIR = os.path.join(ROOT, "runtime", PACKAGE)
# runtime/build.py copies the collection's shared_volume.py into contract/ (not in the source tree)
COPIED = {f"{PACKAGE}.contract.shared_volume": os.path.join(ROOT, "plugins", "module_utils", "shared_volume.py")}
GENERATED = (f"{PACKAGE}._version",)         # written by runtime/build.py: imports nothing
# lowest first; "__init__" is the top level (the script API's re-exports, ``_version``'s version)
LAYERS = (("_version", "contract"), ("engines", "daemons"), ("script", "launcher"), ("__init__",), ("examples",))


def find_modules(package_dir, package=PACKAGE, copied=None):
    """``{module name: (path, is_package)}`` of every ``.py`` under ``package_dir`` (and the ``copied`` ones)."""
    found = {}
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, package_dir)
        prefix = package if rel == "." else ".".join([package] + rel.split(os.sep))
        for name in sorted(files):
            if name.endswith(".py"):
                is_package = name == "__init__.py"
                module = prefix if is_package else f"{prefix}.{name[:-3]}"
                found[module] = (os.path.join(folder, name), is_package)
    for module, path in (copied or {}).items():
        found.setdefault(module, (path, False))
    for module in GENERATED:
        found.setdefault(module, (None, False))
    return found


def _resolve(name, known):
    """The module ``name`` is, or its nearest enclosing known module (a name imported from a module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def imports_of(module, path, is_package, known, package=PACKAGE):
    """``[(line, imported module)]``: every import of the runtime in ``path``, at any depth of its code."""
    if path is None:
        return []
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), filename=path)
    here = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            if name == package or name.startswith(package + "."):
                found.append((node.lineno, _resolve(name, known)))
    return found


def import_graph(package_dir, package=PACKAGE, copied=None):
    """``{module: [(line, imported module)]}`` of the package's modules."""
    known = find_modules(package_dir, package, copied)
    return {module: imports_of(module, path, is_package, known, package)
            for module, (path, is_package) in known.items()}, known


def part_of(module, package=PACKAGE):
    rest = module[len(package) + 1:] if module != package else ""
    return rest.split(".")[0] if rest else "__init__"


def layer_of(part):
    for rank, parts in enumerate(LAYERS):
        if part in parts:
            return rank
    raise AssertionError(f"{part} is in no layer of LAYERS: say where it sits")


def upward_imports(graph, known, package=PACKAGE):
    """``["file:line: a imports b"]`` for every import of a part on the same or a higher layer."""
    bad = []
    for module, edges in graph.items():
        mine = part_of(module, package)
        for line, target in edges:
            theirs = part_of(target, package)
            if theirs != mine and layer_of(theirs) >= layer_of(mine):
                bad.append(f"{os.path.relpath(known[module][0], ROOT)}:{line}: {module} ({mine}, layer "
                           f"{layer_of(mine)}) imports {target} ({theirs}, layer {layer_of(theirs)})")
    return bad


def cycles(graph):
    """The import cycles: strongly connected components of more than one module, or a module importing itself."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):          # Tarjan's algorithm (a few dozen modules: recursion is fine)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for _line, target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or any(t == node for _line, t in graph.get(node, ())):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_runtime_imports_run_one_way():
    graph, known = import_graph(PACKAGE_DIR, copied=COPIED)
    assert upward_imports(graph, known) == []


def test_the_runtime_has_no_import_cycle():
    graph, _modules = import_graph(PACKAGE_DIR, copied=COPIED)
    assert cycles(graph) == []


def test_the_scan_sees_the_whole_runtime_and_its_lazy_imports():
    """Not vacuous: every part is scanned, and a function-local import is an edge (engines' dispatch)."""
    graph, _modules = import_graph(PACKAGE_DIR, copied=COPIED)
    assert {part_of(m) for m in graph} == {p for parts in LAYERS for p in parts}
    edges = {(m, t) for m, found in graph.items() for _line, t in found}
    assert (f"{PACKAGE}.engines", f"{PACKAGE}.engines.torch") in edges             # inside create_engine
    assert (f"{PACKAGE}.engines.mxnet", f"{PACKAGE}.engines.snapshot") in edges
    assert (f"{PACKAGE}.launcher.torchenv", f"{PACKAGE}.engines.devices") in edges
    assert (f"{PACKAGE}.examples.train_digits", f"{PACKAGE}.examples.torch_digits") in edges


def _package(tmp_path, files):
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(root)


def test_a_lazy_upward_import_and_a_cycle_are_caught(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "contract/__init__.py": "",
        "engines/__init__.py": "",
        "script/__init__.py": "",
        "script/recovery.py": "from ..engines import mxnet\n",
        "engines/mxnet.py": "def f():\n    from ..script.recovery import X\n",       # lazy and upward
        "examples/__init__.py": "",
        "examples/a.py": "from dynatrain_runtime.examples.b import y\n",
        "examples/b.py": "def g():\n    from dynatrain_runtime.examples import a\n",
    })
    graph, known = import_graph(pkg)
    bad = upward_imports(graph, known)
    assert len(bad) == 1 and "dynatrain_runtime.engines.mxnet (engines, layer 1) imports " \
                             "dynatrain_runtime.script.recovery (script, layer 2)" in bad[0]
    assert bad[0].endswith("(script, layer 2)") and ":2:" in bad[0]
    assert sorted(cycles(graph)) == [["dynatrain_runtime.engines.mxnet", "dynatrain_runtime.script.recovery"],
                                     ["dynatrain_runtime.examples.a", "dynatrain_runtime.examples.b"]]
