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


def applicable(vectors, role, mode, accepts=None):
    """Ids of the vectors that apply to a component of ``role`` in scripted
    ``mode`` (or None) that accepts the extensions ``accepts`` when offered
    (default: what the components of our libraries accept: batch and
    msgpack, and state only in mode stateful, §9.7)."""
    if accepts is None:
        accepts = {"batch", "msgpack"} | ({"state"} if mode == "stateful" else set())
    return {v.id for v in vectors if v.role in ("any", role) and v.requires in ("protocol", mode)
            and (v.extension is None or v.extension in accepts)}
