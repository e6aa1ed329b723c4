"""stderr floods (spec/PROTOCOL.md §8.3): the host drains stderr
continuously, so a chatty child never blocks on a full stderr pipe and the
protocol never stalls; the last lines are kept for error reports.
"""

from __future__ import annotations

from collections import Counter

from faults_support import (
    assert_nothing_lost,
    build,
    faulty_bolt,
    names,
    numbered_spout,
    restart_logs,
    run_topology,
    task_ids,
)
from multilang.shellbolt import TopologyBuilder
from multilang.testing import assert_no_orphans

HOLD = {"multilang.hold.emits.until.ack": True}
MB = 1 << 20


def _topology(n, bolt, **conf):
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=5))
    b.set_bolt("bolt", bolt, conf=HOLD).shuffle_grouping("spout")
    return build(b, **{"topology.max.spout.pending": 50, **conf})


def test_megabytes_of_stderr_do_not_block_the_protocol(caplog):
    # 16 MiB of stderr in the middle of the stream (256 x the pipe buffer),
    # with a subprocess timeout of 5 s: a host that stopped draining stderr
    # would see the bolt block on write(2) for good and kill it as hung
    # (5 s, not less: on a busy machine a healthy bolt may be slow to answer).
    n = 300
    topo = _topology(n, faulty_bolt(fault=f"flood:{16 * MB}", after=100), **{"topology.subprocess.timeout.secs": 5})
    run = run_topology(topo)
    res = run.result
    assert res.ok, res
    assert res.stats["bolt"].restarts == 0 and not restart_logs(caplog)
    assert res.timed_out == 0 and res.failed == 0
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    assert_no_orphans(run)


def test_a_flood_of_huge_lines_then_a_crash_shows_a_bounded_stderr_tail(marker, caplog):
    # 8 MiB in 1 MiB lines, a last short line, then exit 3. The error must
    # show the last line and the exit status, and stay readable.
    n = 200
    topo = _topology(n, faulty_bolt(fault=f"flood_exit:{8 * MB}", after=50, once=marker, flood_line=MB))
    run = run_topology(topo)
    res = run.result
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    (msg,) = restart_logs(caplog)
    (tid,) = task_ids(run.runtime, "bolt")
    names(msg, "bolt", tid, run.task_pids[tid][0])
    assert "exit status 3" in msg
    assert "LAST-WORDS before exit 3" in msg, "the stderr tail ends with the last line written"
    assert len(msg) < 64 * 1024, f"the error message is {len(msg) // 1024} KiB: the stderr tail is not bounded"
    assert_no_orphans(run)


def test_a_flood_of_short_lines_then_a_crash_shows_the_last_lines(marker, caplog):
    n = 200
    topo = _topology(n, faulty_bolt(fault=f"flood_exit:{4 * MB}", after=50, once=marker, flood_line=100))
    run = run_topology(topo)
    res = run.result
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    (msg,) = restart_logs(caplog)
    assert "exit status 3" in msg and "LAST-WORDS before exit 3" in msg
    tail = msg[msg.index("stderr tail:"):].splitlines()[1:]
    assert 1 < len(tail) <= 50, f"{len(tail)} stderr lines in the error"
    assert len(msg) < 64 * 1024
    assert_no_orphans(run)
