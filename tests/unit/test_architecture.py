"""The layers of DESIGN.md, checked on the source: who may import what.

* no private name is imported across the three packages (``multilang``,
  ``multilang.shellbolt``, ``multilang.adapters``): each uses the others
  only through their public surface;
* ``click`` is imported by the CLI (``multilang._cli``) and nothing else;
* the adapters use a runtime only through its documented seam
  (``RuntimeSeam``) and its run control;
* (the sans-IO core loads no trio, subprocess or click, and the runtime's
  model no trio: tests/integration/test_layers.py, in a fresh interpreter);
* no import circle among the modules, counting every import (at module
  level, under TYPE_CHECKING and in functions): the layers point one way;
* one job per file: every module opens with a docstring saying its job,
  and docs/ARCHITECTURE.md's tree names it, so that a new file is placed in
  a layer, with its job, where a reviewer reads it (this replaces a limit on
  lines, which invited wrapping lines instead of splitting jobs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import multilang
import multilang.adapters
import multilang.shellbolt

#: package name -> its folder (an editable install maps them apart)
FOLDERS = {
    "multilang": Path(multilang.__file__).parent,
    "multilang.shellbolt": Path(multilang.shellbolt.__file__).parent,
    "multilang.adapters": Path(multilang.adapters.__file__).parent,
}


def _module_name(pkg: str, folder: Path, path: Path) -> str:
    parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
    return ".".join([pkg, *parts])


#: (package, file, module name) of every source file, subpackages included
SOURCES = sorted((pkg, path, _module_name(pkg, folder, path))
                 for pkg, folder in FOLDERS.items() for path in folder.rglob("*.py"))
MODULES = {name: path for _pkg, path, name in SOURCES}


def _imports(module: str, path: Path):
    """(line, imported module, names) of every import in a file, with
    relative imports resolved against the file's own module."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []


def _package_of(module: str) -> str | None:
    for pkg in ("multilang.shellbolt", "multilang.adapters", "multilang"):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def test_the_three_packages_have_sources():
    assert {pkg for pkg, _, _ in SOURCES} == set(FOLDERS)


def test_no_private_name_is_imported_across_packages():
    crossings = []
    for pkg, path, name in SOURCES:
        for line, module, names in _imports(name, path):
            target = _package_of(module)
            if target is None or target == pkg:
                continue
            private_module = any(part.startswith("_") and not part.startswith("__") for part in module.split("."))
            private_names = [n for n in names if n.startswith("_")]
            if private_module or private_names:
                crossings.append(f"{name}:{line}: from {module} import {', '.join(names)}")
    assert not crossings, "private names imported across packages:\n" + "\n".join(crossings)


def test_click_only_in_the_cli():
    users = [name for _pkg, path, name in SOURCES
             for _, module, _names in _imports(name, path) if module.split(".")[0] == "click"]
    assert all(name.startswith("multilang._cli.") for name in users), users


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of the distribution it imports (``from P import
    m`` counts as importing P.m when m is a module)."""
    graph: dict[str, set[str]] = {}
    for _pkg, path, name in SOURCES:
        out = graph.setdefault(name, set())
        for _line, module, names in _imports(name, path):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES] or [module]
            for t in targets:
                if t in MODULES and t != name:
                    out.add(t)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    circles = _circles(_import_graph())
    assert not circles, "modules that import each other, directly or around a circle:\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _runtime_uses(path: Path) -> set[str]:
    """The attributes read or written on a runtime in a file: on a name
    ``rt`` or ``runtime``, or on an attribute ``.runtime``."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("rt", "runtime") or isinstance(v, ast.Attribute) and v.attr == "runtime":
                used.add(node.attr)
    return used


def test_the_adapters_use_a_runtime_through_its_seam():
    from multilang.shellbolt._runtime.tasks import RuntimeSeam

    seam = set(RuntimeSeam.__annotations__) | {n for n, v in vars(RuntimeSeam).items()
                                              if callable(v) and not n.startswith("_")}
    allowed = seam | {"run", "done", "request_stop"}  # the run control of multilang.shellbolt.Runtime
    beyond = {name: sorted(uses - allowed) for _pkg, path, name in SOURCES
              if name.startswith("multilang.adapters") and (uses := _runtime_uses(path)) - allowed}
    assert not beyond, f"adapters reach past RuntimeSeam (shellbolt/_runtime/tasks.py): {beyond}"
    assert _runtime_uses(FOLDERS["multilang.adapters"] / "spark" / "_engine" / "engine.py") & seam  # the check sees uses


ARCHITECTURE = Path(__file__).parents[2] / "docs" / "ARCHITECTURE.md"


def test_every_module_says_its_job_and_the_tree_names_it():
    tree = ARCHITECTURE.read_text().split("```")[1]  # the first code block: the layout
    named = set(re.findall(r"[A-Za-z_]\w*", tree))
    silent = [name for _pkg, path, name in SOURCES if not ast.get_docstring(ast.parse(path.read_text()))]
    unplaced = [name for _pkg, path, name in SOURCES if path.stem != "__init__" and path.stem not in named]
    assert not silent, f"a module opens with a docstring that says its job: {silent}"
    assert not unplaced, f"docs/ARCHITECTURE.md's tree names every module, in its layer: {unplaced}"
