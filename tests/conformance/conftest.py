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
        key = (tuple(argv), role, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = run_conformance(argv, role, cwd=ROOT, **kw)
        return cache[key]

    return run
