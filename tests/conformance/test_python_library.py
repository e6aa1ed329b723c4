"""The vectors against the Python component library (multilang.Bolt, BasicBolt, Spout, ...)."""

from dataclasses import replace

import pytest

from conform_support import PY, ROOT, applicable, failures
from multilang.conform import FAILED, NOT_APPLICABLE, load_vectors

VECTORS = load_vectors()
CONFORMANCE = [PY, str(ROOT / "examples/python/conformance_component.py")]


@pytest.mark.parametrize("mode", ["bolt", "basic", "spout"])
def test_scripted_component_passes(conform, mode):
    report = conform(CONFORMANCE + [mode])
    assert (report.mode, report.lang) == (mode, "python"), report.describe_component()
    role = "spout" if mode == "spout" else "bolt"
    assert report.role == role
    ran = {r.id for r in report.results if r.status != NOT_APPLICABLE}
    assert ran == applicable(VECTORS, role, mode)
    failed, text = failures(report)
    assert not failed, text
    assert report.passed == len(ran)
    # every level, recommended included: the run passes with --strict
    assert not report.warning_ids() and replace(report, strict=True).ok


@pytest.mark.parametrize("script", ["split_bolt.py"])
def test_example_bolts_pass_protocol_checks(conform, script):
    report = conform([PY, str(ROOT / "examples/python" / script)])
    assert report.mode is None and report.role == "bolt"
    failed, text = failures(report)
    assert not failed, text
    # Only protocol-level vectors apply to an ordinary bolt.
    assert {r.id for r in report.results if r.status != NOT_APPLICABLE} == applicable(VECTORS, "bolt", None)
    assert report.passed > 20


def test_example_spout_passes_protocol_checks(conform, tmp_path):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("the cow jumped over the moon\n\nan apple a day\nkeeps the doctor away\n", encoding="utf-8")
    report = conform([PY, str(ROOT / "examples/python/sentence_spout.py"), str(sentences)], role="spout")
    assert report.role == "spout"
    failed, text = failures(report)
    assert not failed, text
    assert {r.id for r in report.results if r.status != NOT_APPLICABLE} == applicable(VECTORS, "spout", None)


def test_not_applicable_is_not_failed(conform):
    report = conform([PY, str(ROOT / "examples/python/split_bolt.py")])
    na = report.ids(NOT_APPLICABLE)
    assert "bolt-api.tick" in na and "spout.activate-sync" in na
    assert report["bolt-api.tick"].reason.startswith("needs the scripted conformance component")
    assert all(r.status != FAILED for r in report.results if r.id in na)
