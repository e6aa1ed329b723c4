"""The pure layers load without I/O libraries, checked in a fresh
interpreter (a subprocess: what this test process has imported does not
count). The other rules of the layout are read from the source in
tests/unit/test_architecture.py."""

from __future__ import annotations

import importlib.util
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import multilang.shellbolt._model as model

MODEL = sorted(f"{model.__name__}.{m.name}" for m in pkgutil.iter_modules(model.__path__))


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        (["multilang"], ["trio", "subprocess", "click"]),
        (MODEL, ["trio", "click"]),
    ],
)
def test_pure_layers_load_without_io_libraries(modules, forbidden):
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in {forbidden!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"importing {modules} loaded {out.strip()}"


def test_conf_module_imports_no_trio():
    spec = importlib.util.find_spec("multilang.shellbolt._model.conf")
    assert spec is not None and spec.origin
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("_conf_probe", {spec.origin!r})
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_conf_probe"] = mod
        spec.loader.exec_module(mod)
        assert mod.SCHEMA
        print("trio" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
