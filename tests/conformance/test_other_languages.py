"""The same vectors against the Ruby and Node component libraries.

These run once examples/ruby/conformance_component.rb and
examples/node/conformance_component.js exist and the interpreter is installed.
"""

import shutil
from dataclasses import replace

import pytest

from conform_support import ROOT, applicable, failures
from multilang.conform import NOT_APPLICABLE, load_vectors

LANGS = {
    "ruby": ("ruby", ROOT / "examples/ruby", "conformance_component.rb", "split_bolt.rb"),
    "node": ("node", ROOT / "examples/node", "conformance_component.js", "split_bolt.js"),
}
VECTORS = load_vectors()


def _argv(lang, script):
    exe, folder, _, _ = LANGS[lang]
    path = folder / script
    if shutil.which(exe) is None:
        pytest.skip(f"{exe} is not installed")
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} does not exist yet")
    return [exe, str(path)]


@pytest.mark.parametrize("mode", ["bolt", "basic", "spout"])
@pytest.mark.parametrize("lang", sorted(LANGS))
def test_scripted_component_passes(conform, lang, mode):
    report = conform(_argv(lang, LANGS[lang][2]) + [mode])
    assert (report.mode, report.lang) == (mode, lang), report.describe_component()
    role = "spout" if mode == "spout" else "bolt"
    assert {r.id for r in report.results if r.status != NOT_APPLICABLE} == applicable(VECTORS, role, mode)
    failed, text = failures(report)
    assert not failed, text
    # every level, recommended included: the run passes with --strict
    assert not report.warning_ids() and replace(report, strict=True).ok


@pytest.mark.parametrize("lang", sorted(LANGS))
def test_split_bolt_passes_protocol_checks(conform, lang):
    report = conform(_argv(lang, LANGS[lang][3]))
    assert report.mode is None
    failed, text = failures(report)
    assert not failed, text
