"""The layers of DESIGN.md, checked on the source: who may import what.

* no private name is imported across the three packages (``multilang``,
  ``multilang.shellbolt``, ``multilang.adapters``): each uses the others
  only through their public surface;
* ``click`` is imported by the CLI (``multilang/cli.py``) and nothing else;
* the sans-IO core loads no trio, subprocess or click, and the pure parts of
  the runtime (acker, grouping, topology, conf) load without trio;
* no source file holds more than 1,000 lines (one job per module).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import multilang
import multilang.adapters
import multilang.shellbolt

#: package name -> its folder (an editable install maps them apart)
FOLDERS = {
    "multilang": Path(multilang.__file__).parent,
    "multilang.shellbolt": Path(multilang.shellbolt.__file__).parent,
    "multilang.adapters": Path(multilang.adapters.__file__).parent,
}
SOURCES = sorted((pkg, path) for pkg, folder in FOLDERS.items() for path in folder.glob("*.py"))


def _imports(pkg: str, path: Path):
    """(imported module, names) of every ``from X import names`` in a file,
    with relative imports resolved against ``pkg``."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield node.lineno, module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []


def _package_of(module: str) -> str | None:
    for pkg in ("multilang.shellbolt", "multilang.adapters", "multilang"):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def test_the_three_packages_have_sources():
    assert {pkg for pkg, _ in SOURCES} == set(FOLDERS)


def test_no_private_name_is_imported_across_packages():
    crossings = []
    for pkg, path in SOURCES:
        for line, module, names in _imports(pkg, path):
            target = _package_of(module)
            if target is None or target == pkg:
                continue
            private_module = any(part.startswith("_") and not part.startswith("__") for part in module.split("."))
            private_names = [n for n in names if n.startswith("_")]
            if private_module or private_names:
                crossings.append(f"{path.name}:{line}: from {module} import {', '.join(names)}")
    assert not crossings, "private names imported across packages:\n" + "\n".join(crossings)


def test_click_only_in_the_cli():
    users = [f"{pkg}/{path.name}" for pkg, path in SOURCES
             for _, module, _names in _imports(pkg, path) if module.split(".")[0] == "click"]
    assert set(users) <= {"multilang/cli.py"}, users


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        (["multilang"], ["trio", "subprocess", "click"]),
        (["multilang.shellbolt.acker", "multilang.shellbolt.grouping", "multilang.shellbolt.topology",
          "multilang.shellbolt.conf", "multilang.shellbolt.results"], ["trio", "click"]),
    ],
)
def test_pure_layers_load_without_io_libraries(modules, forbidden):
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in {forbidden!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"importing {modules} loaded {out.strip()}"


def test_no_source_file_over_1000_lines():
    long = {f"{pkg}/{path.name}": n for pkg, path in SOURCES if (n := len(path.read_text().splitlines())) > 1000}
    assert not long, f"one job per module: split {long}"
