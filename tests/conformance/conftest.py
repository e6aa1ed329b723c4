"""Conformance tests: each suite runs once per session and is cached.

Running the vectors against one component takes seconds (one process per
vector), so every test reads a cached report.
"""

import pytest

from conform_support import ROOT
from multilang.conform import run_conformance


@pytest.fixture(scope="session")
def conform():
    """conform(argv, role=None, **kw) -> Report, cached per arguments."""
    cache = {}

    def run(argv, role=None, **kw):
        # The default runs a check that timed out again with a 30 s wait (a slow
        # component); these suites test what the checks find, at the plain 2 s
        # (test_slow.py tests the second run).
        kw.setdefault("timeout", 2.0)
        key = (tuple(argv), role, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = run_conformance(argv, role, cwd=ROOT, **kw)
        return cache[key]

    return run
