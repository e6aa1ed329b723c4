"""Fault-injection suite (DESIGN.md "Tests": kill -9, SIGSTOP, garbage on
stdout, oversized frames, slow consumers). Helpers live in faults_support.py.

Every test here starts real processes and kills them for real. The fixture
below checks after each test that no process this test started is left
behind, whatever the test itself asserted.
"""

from __future__ import annotations

import pytest

from multilang.testing import assert_no_orphans


@pytest.fixture(autouse=True)
def _no_children_left():
    yield
    # The CLI tests wait for their child; runtime tests reap in the runtime.
    assert_no_orphans(timeout=3)  # a fault test left no child processes behind


@pytest.fixture
def marker(tmp_path):
    """A once-only marker file path for a component fault (see components/_raw.py)."""
    return tmp_path / "fault.once"
