"""pystorm bolts under `multilang conform` (issue 19): a correct plain bolt is
a pass (warnings only, for the liberal readings pystorm does not offer), and
one that acks twice fails on the first double ack."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from multilang.conform import run_conformance

pytest.importorskip("pystorm")
HERE = Path(__file__).resolve().parent / "pystorm_bolts"


def test_a_plain_pystorm_bolt_passes_the_gate_and_strict_names_only_recommended_checks():
    report = run_conformance([sys.executable, str(HERE / "explicit_bolt.py")], role="bolt")
    assert report.ok, [(r.id, r.reason) for r in report.results if r.status == "failed"]
    assert report.passed > 30
    warned = report.warning_ids()
    assert warned and all(report[c].level == "recommended" for c in warned)


def test_a_pystorm_bolt_that_acks_twice_fails_on_the_first_double_ack():
    # Each bolt.* check ends once its ack arrived; the second ack (written
    # right after the first) is caught in the moment the runner still reads
    # after the last step, in every check that applies.
    report = run_conformance([sys.executable, str(HERE / "double_ack_bolt.py")], role="bolt", select="bolt.")
    failed = [r for r in report.results if r.status == "failed"]
    assert failed and not report.ok
    assert all(r.status in ("failed", "not-applicable") for r in report.results), \
        [(r.id, r.status) for r in report.results]
    # The rule is the core's; the runner's transcript says which mistake it was.
    assert all(r.rule == "ids.known" and "it acked that tuple already" in r.reason for r in failed), \
        [(r.id, r.rule, r.reason) for r in failed]
