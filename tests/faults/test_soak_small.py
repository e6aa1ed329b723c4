"""A small run of bench/soak.py: Python spout -> Ruby bolt -> Node bolt, 12k
tuples, random SIGKILLs of spout, Ruby and Node processes. Nothing lost;
duplicates only from spout kills (at most one uncommitted burst each), none
from bolt kills (hold mode); every kill answered by exactly one restart.
"""

from __future__ import annotations

import json
import subprocess
import sys

from faults_support import ROOT, needs_node, needs_ruby

PER_NEXT = 50


@needs_ruby
@needs_node
def test_soak_small_loses_nothing_under_random_sigkills():
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--tuples", "12000", "--kill-every", "0.3,0.7",
         "--seed", "11", "--per-next", str(PER_NEXT), "--json", "--quiet", "--limit", "150"],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
    )  # --limit guards a hang only: on a busy machine (the suite on two workers) 12k tuples may take long
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    r = json.loads(lines[-1])
    kills = sum(r["kills"].values())
    assert kills >= 3, r
    assert r["lost"] == 0, r
    assert r["bad_outputs"] == 0 and not r["gave_up"]
    assert r["distinct_out"] == r["tuples_in"] == 12000
    assert r["duplicates"] <= r["kills"]["spout"] * PER_NEXT, r
    # each kill is answered by one restart (a kill that lands while the run
    # is already stopping is not)
    assert all(r["restarts"][c] <= r["kills"][c] for c in r["kills"]), r
    assert sum(r["restarts"].values()) >= kills - 1, r
    assert r["trees_incomplete"] == 0 and r["trees_timed_out"] == 0
    assert r["ok"] and p.returncode == 0, (p.returncode, r)
    # the supervisor's log names each killed process
    assert kills - 1 <= p.stderr.count("(killed by signal 9)") <= kills
