"""`pip install multilang-bridge` from a wheel, then `multilang conform -- CMD`
in any directory: the wheel must carry the vectors (multilang/vectors/)."""

import shutil
import subprocess
import sys
import zipfile

import pytest

from conform_support import ROOT

# One worker builds the wheel for all of them (pytest-xdist shares no module fixture between workers:
# two or three builds of about 10 s of CPU each, on CI's 2 cores).
pytestmark = pytest.mark.xdist_group("wheel")

VECTOR_FILES = sorted(p.name for p in (ROOT / "spec/vectors").iterdir() if p.suffix in (".json", ".md"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # Build from a copy: a build writes build/ and *.egg-info next to the sources.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("multilang", "shellbolt", "adapters", "spec/vectors", "examples/ruby", "examples/node"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode and "No matching distribution" in proc.stderr:
        pytest.skip(f"cannot get the build backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (whl,) = out.glob("multilang_bridge-*.whl")
    return whl


def test_wheel_carries_the_vectors(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in VECTOR_FILES if f"multilang/vectors/{f}" not in names]
    assert not missing, missing
    assert "multilang/vectors/schema.json" in names and "multilang/conform/__init__.py" in names
    assert len(VECTOR_FILES) > 5


def test_wheel_carries_the_ruby_and_node_libraries_and_multilang_lib_finds_them(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(site)
    for lang, name in (("ruby", "multilang.rb"), ("node", "multilang.js")):
        assert f"multilang/{lang}/{name}" in names
        assert (site / "multilang" / lang / name).read_bytes() == (ROOT / "examples" / lang / name).read_bytes()
    assert not [n for n in names if "split_bolt" in n or "sentence_spout" in n], "the examples stay out of the wheel"
    # The installed package (not this checkout) answers `multilang lib`.
    code = "from multilang import library_path as p; print(p('ruby')); print(p('node'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(site / "multilang/ruby/multilang.rb"), str(site / "multilang/node/multilang.js")]


def test_wheel_carries_every_module_of_the_three_folders(wheel):
    # pyproject.toml lists the packages one by one (three folders, one namespace): a package
    # added to a folder and not to that list installs from a checkout (editable) and is missing
    # from a wheel, e.g. `multilang run --workers 2` failing with "No module named
    # 'multilang.shellbolt._workers'" after `pip install multilang-bridge`.
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {"multilang": "multilang", "shellbolt": "multilang/shellbolt", "adapters": "multilang/adapters"}
    expected = {f"{prefix}/{p.relative_to(ROOT / folder).as_posix()}"
                for folder, prefix in sources.items() for p in (ROOT / folder).rglob("*.py")
                if "__pycache__" not in p.parts}
    assert len(expected) > 50
    assert sorted(expected - names) == []
