"""dslide's import graph: every module imports, the graph has no cycle, and no import sits
inside a function to dodge one (issue 37).

The graph is read from the source (ast). An arrow a -> b for each `import b`,
`from b import x` and `from package import b` in module a; it is module-level when it
runs as a is imported (at the top, or in a module-level `if`, `try` or class body), and
function-level inside a def or lambda. Arrows to modules outside dslide are not part of
the graph.

- The module-level graph has no cycle.
- Neither has the whole graph, function-level arrows included, but for KNOWN_DODGES: a
  function-level import of a dslide module that closes a cycle is one that stands in for
  a module-level import only to dodge that cycle. Each known one names the move of issue
  37 that removes it; an entry that no longer closes a cycle fails the test, so the list
  only shrinks.
- A function-level import of anything outside dslide is of the standard library or of
  one of LAZY_OUTSIDE, each with the reason it is loaded late.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: (importer, imported): function-level imports that close a cycle today, and what removes them
KNOWN_DODGES = {}

#: modules outside dslide and the standard library that dslide imports inside functions, and why
LAZY_OUTSIDE = {
    "mpi4py": "MPI starts only when a communicator is made (dslide.comm, its only importer)",
    "matplotlib": "optional (the plot extra), for `dslide plot` only",
    "tqdm": "progress bars, made only when stderr is a terminal",
    "numpy": "`import dslide` and `dslide --help` load none of numpy, scipy or numba",
    "scipy": "as numpy",
    "numba": "as numpy; and dslide.cli checks NUMBA_NUM_THREADS before numba loads (it raises on import)",
    "tomli": "tomllib of Python 3.10",
}


def _modules() -> dict[str, Path]:
    """Every module of the packages setup.cfg installs (dslide and the ones mapped into it):
    {name: source file}, each imported on the way (but __main__, which runs the command)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    out = {}
    for package in cfg["options"]["packages"].split():
        pkg = importlib.import_module(package)
        out[package] = Path(pkg.__file__)
        for info in pkgutil.walk_packages(pkg.__path__, package + "."):
            if info.name.endswith(".__main__"):
                out[info.name] = Path(info.module_finder.path) / "__main__.py"
                continue
            out[info.name] = Path(importlib.import_module(info.name).__file__)
    return out


MODULES = _modules()


def _imports(name: str, path: Path):
    """(imported module, function-level?, line) of every import statement in module `name`."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def target(module: str, names) -> list[str]:
        # `from p import m` imports module p.m when there is one, else names of p
        subs = [f"{module}.{a.name}" for a in names if f"{module}.{a.name}" in MODULES]
        return subs if len(subs) == len(names) else [module, *subs]

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # never runs
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, in_function, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - child.level + 1] if child.level else []
                module = ".".join([*base, child.module] if child.module else base)
                found.extend((m, in_function, child.lineno) for m in target(module, child.names))
            visit(child, inside)

    visit(tree, False)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _ancestors(module: str) -> list[str]:
    """The packages whose __init__ runs before `module` (a.b.c: a, a.b)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _graph(function_level: bool, leave_out=(), imports=None) -> dict[str, set]:
    """Arrows importer -> imported, and to the imported module's packages: importing a.b.c runs
    a/__init__ and a/b/__init__ first (but the importer's own packages, already importing)."""
    imports = IMPORTS if imports is None else imports
    known = set(MODULES) | set(imports)
    graph = {name: set() for name in known}
    for name, found in imports.items():
        mine = set(_ancestors(name)) | {name}
        for module, in_function, _ in found:
            if module in known and module != name and (function_level or not in_function) \
                    and (name, module) not in leave_out:
                graph[name].add(module)
                graph[name].update(p for p in _ancestors(module) if p in known and p not in mine)
    return graph


def _cycle(graph: dict[str, set]) -> list[str] | None:
    """One cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    state, stack = {}, []

    def walk(v):
        state[v] = "open"
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == "open":
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = walk(w)
                if found:
                    return found
        state[v] = "done"
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state:
            found = walk(v)
            if found:
                return found
    return None


def _reaches(graph, a: str, b: str) -> bool:
    seen, todo = {a}, [a]
    while todo:
        v = todo.pop()
        if v == b:
            return True
        todo.extend(w for w in graph[v] if w not in seen and not seen.add(w))
    return False


def test_every_module_is_found_and_imports():
    assert {"dslide.api", "dslide.cli", "dslide.session", "dslide.hooks", "dslide.config", "dslide.model.candidates.base",
            "dslide.comm.collectives", "dslide.model.layers.lsh", "dslide.lsh.dwta", "dslide.datasets.suite"} <= set(MODULES)
    assert all(path.is_file() for path in MODULES.values())


def test_the_module_level_import_graph_has_no_cycle():
    cycle = _cycle(_graph(function_level=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_inside_a_function_dodges_a_cycle():
    graph = _graph(function_level=True, leave_out=KNOWN_DODGES)
    cycle = _cycle(graph)
    assert cycle is None, ("these imports form a cycle once the function-level ones count (move an import "
                           "inside a function only for its cost, never to dodge a cycle): " + " -> ".join(cycle))


@pytest.mark.parametrize("importer, imported", sorted(KNOWN_DODGES))
def test_each_known_dodge_still_closes_a_cycle(importer, imported):
    """Else it is fixed: take it out of KNOWN_DODGES."""
    lazy = [line for module, in_function, line in IMPORTS[importer] if module == imported and in_function]
    assert lazy, f"{importer} no longer imports {imported} inside a function: remove it from KNOWN_DODGES"
    graph = _graph(function_level=True)
    runs = [imported] + [p for p in _ancestors(imported) if p in MODULES and p not in _ancestors(importer)]
    assert any(_reaches(graph, m, importer) for m in runs), \
        f"{importer} -> {imported} no longer closes a cycle: remove it from KNOWN_DODGES"


def test_function_level_imports_from_outside_dslide_are_listed():
    outside = {(name, module, line) for name, found in IMPORTS.items() for module, in_function, line in found
               if in_function and module.split(".")[0] != "dslide"}
    unlisted = sorted(f"{name}:{line} imports {module}" for name, module, line in outside
                      if module.split(".")[0] not in sys.stdlib_module_names | set(LAZY_OUTSIDE))
    assert not unlisted, "import these at the top of the module, or add them to LAZY_OUTSIDE with the reason: " \
                         + "; ".join(unlisted)


def test_the_graph_reader_sees_a_cycle_and_a_dodge():
    """The reader itself, on a made-up graph: a -> b at module level, b -> a in a function."""
    graph = {"a": {"b"}, "b": set()}
    assert _cycle(graph) is None
    graph["b"].add("a")
    assert _cycle(graph) == ["a", "b", "a"]
    # a package's __init__ counts: c importing p.v runs p, whose p.loop imports c (the cycle
    # dslide.config -> dslide.train.validation closed through dslide.train/__init__)
    made_up = {"c": [("p.v", True, 1)], "p": [("p.loop", False, 1)], "p.loop": [("c", False, 1)], "p.v": []}
    assert _cycle(_graph(function_level=False, imports=made_up)) is None
    assert _cycle(_graph(function_level=True, imports=made_up)) == ["c", "p", "p.loop", "c"]
    # but not the importer's own package: p.loop importing p.v does not run p again
    assert "p" not in _graph(function_level=True, imports={"p": [], "p.loop": [("p.v", False, 1)], "p.v": []})["p.loop"]
    assert ("dslide.cli", False) in {(m, f) for m, f, _ in IMPORTS["dslide.__main__"]}
    assert any(m == "dslide.session" and not f for m, f, _ in IMPORTS["dslide.api"])
