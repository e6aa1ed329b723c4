"""Helpers shared by the conformance tests (imported by name: tests/ has no packages)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROKEN = Path(__file__).resolve().parent / "broken"
PY = sys.executable


def failures(report, ignore=()):
    """The failed checks not in ``ignore``, and the text report for the assertion message."""
    failed = [r.id for r in report.results if r.status == "failed" and r.id not in ignore]
    return failed, report.to_text()


def applicable(vectors, role, mode):
    """Ids of the vectors that apply to a component of ``role`` in scripted ``mode`` (or None)."""
    return {v.id for v in vectors if v.role in ("any", role) and v.requires in ("protocol", mode)}
