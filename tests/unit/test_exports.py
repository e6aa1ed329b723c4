"""The public surface is explicit (DESIGN.md style rule 5; modelled on trio's test_exports)."""

import importlib
import pkgutil
import types

import pytest

import multilang

CORE_MODULES = [
    "multilang",
    "multilang.errors",
    "multilang.framing",
    "multilang.messages",
    "multilang.codec",
    "multilang.connection",
    "multilang.testing",
]

#: Every public module of the distribution (issue "The house in order": at
#: most 12, each a documented API). Everything else is an implementation
#: module: its name, or a folder above it, starts with an underscore.
DOCUMENTED = CORE_MODULES + [
    "multilang.conform",
    "multilang.shellbolt",
    "multilang.adapters",
    "multilang.adapters.spark",
    "multilang.adapters.aio",
]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


#: The three packages of the distribution. An editable install maps
#: multilang.shellbolt and multilang.adapters to their own folders, so each
#: is walked from its own path: walking multilang/ alone never sees them.
PACKAGES = ["multilang", "multilang.shellbolt", "multilang.adapters"]


def _public_modules():
    names = set(PACKAGES)
    for pkg in PACKAGES:
        path = importlib.import_module(pkg).__path__
        for info in pkgutil.walk_packages(path, pkg + ".", onerror=lambda name: None):
            if not any(_is_private(part) for part in info.name.split(".")):
                names.add(info.name)
    return sorted(names)


PUBLIC_MODULES = _public_modules()


def _import(modname):
    try:
        return importlib.import_module(modname)
    except ImportError as exc:  # an optional dependency (pyspark, ...) is missing
        if modname in CORE_MODULES:
            raise
        pytest.skip(f"{modname} cannot be imported here: {exc}")


def test_the_public_modules_are_the_documented_ones_and_at_most_12():
    assert PUBLIC_MODULES == sorted(DOCUMENTED), (
        "a public module that is not documented, or a documented one gone: "
        f"{sorted(set(PUBLIC_MODULES) ^ set(DOCUMENTED))}; name implementation modules with a leading underscore")
    assert len(PUBLIC_MODULES) <= 12


def test_core_modules_found():
    assert set(CORE_MODULES) <= set(PUBLIC_MODULES)


def test_every_name_in_top_level_all_exists():
    for name in multilang.__all__:
        assert hasattr(multilang, name), name


@pytest.mark.parametrize("modname", CORE_MODULES)
def test_core_modules_define_all(modname):
    assert isinstance(getattr(importlib.import_module(modname), "__all__", None), list), modname


@pytest.mark.parametrize("modname", PUBLIC_MODULES)
def test_all_entries_exist_are_unique_and_public(modname):
    mod = _import(modname)
    exported = getattr(mod, "__all__", None)
    assert isinstance(exported, list), f"{modname} has no __all__ list: its public surface must be explicit"
    assert all(type(n) is str for n in exported)
    assert len(exported) == len(set(exported)), f"duplicates in {modname}.__all__"
    missing = [n for n in exported if not hasattr(mod, n)]
    assert not missing, f"{modname}.__all__ names missing attributes: {missing}"
    private = [n for n in exported if _is_private(n)]
    assert not private, f"{modname}.__all__ exports private names: {private}"
    modules = [n for n in exported if isinstance(getattr(mod, n), types.ModuleType)]
    assert not modules, f"{modname}.__all__ exports modules: {modules}"


def test_top_level_namespace_has_nothing_unlisted():
    # Anything public in `multilang` is either listed in __all__ or a submodule.
    extra = {
        n
        for n in dir(multilang)
        if not n.startswith("_") and n not in multilang.__all__ and not isinstance(getattr(multilang, n), types.ModuleType)
    }
    assert not extra, f"public names in multilang not in __all__: {sorted(extra)}"


def test_star_import_matches_all():
    ns: dict = {}
    exec("from multilang import *", ns)
    ns.pop("__builtins__")
    assert set(ns) == set(multilang.__all__)


@pytest.mark.parametrize("modname", CORE_MODULES[1:])
def test_top_level_reexports_are_the_same_objects(modname):
    mod = importlib.import_module(modname)
    for name in mod.__all__:
        if name in multilang.__all__:
            assert getattr(multilang, name) is getattr(mod, name), f"multilang.{name} is not {modname}.{name}"


def test_exported_classes_keep_their_names():
    for name in multilang.__all__:
        obj = getattr(multilang, name)
        if isinstance(obj, type):
            assert obj.__name__ == name, f"multilang.{name} is class {obj.__name__}"
