"""The collector for a run (shellbolt/_runtime/collector.py): what start-up
made is frozen out of its scans, and the youngest generation's threshold is
raised, as ``multilang run``, ``multilang pipe`` and each host worker do
before a run. In a fresh interpreter each: the settings are per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHECK = ("import gc; from multilang.shellbolt import prepare_gc; {before}; f0 = gc.get_freeze_count(); "
          "prepare_gc(); print(f0, gc.get_freeze_count(), *gc.get_threshold())")


@pytest.mark.parametrize("before, young", [("pass", 10_000), ("gc.set_threshold(50_000, 7, 9)", 50_000),
                                           ("gc.set_threshold(100, 7, 9)", 10_000)])
def test_a_run_freezes_start_up_and_collects_the_young_less_often(before, young):
    out = subprocess.run([sys.executable, "-c", _CHECK.format(before=before)], capture_output=True, text=True,
                         check=True).stdout.split()
    frozen_before, frozen, *threshold = map(int, out)
    assert frozen_before == 0 and frozen > 1000  # (the modules, their classes and functions)
    assert threshold[0] == young  # a higher threshold set before is kept
    if before != "pass":
        assert threshold[1:] == [7, 9]  # the older generations' are left as they were
