"""A component that breaks the protocol on stdout (spec/PROTOCOL.md §1.2, §1.3,
§3.6, §3.7, §8.1, §8.2).

Garbage or stray text on stdout, invalid JSON, a frame without ``command``, a
frame over ``multilang.max.frame.bytes``, a line that never ends, and the id
rules of §3.6 (unknown ids, numeric ids, double acks, acking a heartbeat,
anchoring to a finished tuple) are all protocol errors. Storm kills the
worker; we restart the one process and fail its in-flight tuples so they are
replayed, and the error names the component, task and pid and shows the
offending bytes (the first 200) and the stderr tail.

Each case fires once (a marker file), on the 31st tuple the process gets, so
the replacement process behaves and the run must end with every tuple
delivered exactly once (hold mode).
"""

from __future__ import annotations

from collections import Counter

import pytest

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
LIMIT = 8192

# fault -> fragments the restart log (the user's error) must contain
CASES = {
    "garbage": ["protocol error", "not valid JSON", r"\x00\x01GARBAGE\xff\xfe{not a frame"],
    "emit_then_garbage": ["protocol error", "not valid JSON", r"\x00\x01GARBAGE after an emit"],
    "stray": ["protocol error", "not valid JSON", "STRAY debug print: working on it"],
    "invalid_json": ["protocol error", "not valid JSON", '{"command":"emit","tuple":[INVALID'],
    "no_command": ["protocol error", "frame has no 'command'", '{"tuple":["NO-COMMAND"],"anchors":[]}'],
    "oversize": ["protocol error", f"exceeds the {LIMIT}-byte limit", "OVERSIZEyyyy"],
    "unterminated": ["protocol error", f"exceeds the {LIMIT}-byte limit without an 'end' line", "UNTERMINATEDzzzz"],
    "ack_unknown": ["protocol error", "acks id '4242424242', which is not a pending tuple",
                    '{"command":"ack","id":"4242424242"}'],
    "fail_unknown": ["protocol error", "fails id '4242424242', which is not a pending tuple",
                     '{"command":"fail","id":"4242424242"}'],
    "ack_numeric": ["protocol error", "(int): tuple ids must be echoed as the exact string received", '{"command":"ack","id":'],
    "double_ack": ["protocol error", "which is not a pending tuple (unknown or already acked/failed)"],
    "anchor_failed": ["protocol error", "anchors to id", "which is not a pending tuple"],
    "ack_heartbeat": ["protocol error", "acks heartbeat id", "never acked, failed or anchored to (§3.2, §5.1)"],
}


def _topology(n, fault, marker):
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=5))
    # ack_heartbeat waits for the next heartbeat (every 0.2 s): a slower
    # bolt keeps the run going until one comes.
    sleep = 0.01 if fault == "ack_heartbeat" else 0.0
    b.set_bolt("bolt", faulty_bolt(fault=fault, after=30, once=marker, sleep=sleep), parallelism=2, conf=HOLD) \
        .shuffle_grouping("spout")
    return build(b, **{
        "multilang.max.frame.bytes": LIMIT,
        "topology.max.spout.pending": 50,
        # A long subprocess timeout: every fault here must be caught from
        # the bytes themselves, at once, not by the watchdog.
        "topology.subprocess.timeout.secs": 30,
        "multilang.heartbeat.interval.secs": 0.2,
    })


@pytest.mark.parametrize("fault", list(CASES))
def test_protocol_breaking_output_restarts_the_process_and_loses_nothing(fault, marker, caplog):
    n = 300
    run = run_topology(_topology(n, fault, marker), limit=120)
    res = run.result
    # (a) one restart, the run finished
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1, res.stats["bolt"]
    assert res.stats["spout"].restarts == 0
    # (b) nothing lost or doubled
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    # (c) the error: component, task, pid, cause, offending bytes, stderr tail
    (msg,) = restart_logs(caplog)
    tid = next(t for t in task_ids(run.runtime, "bolt") if len(run.task_pids[t]) == 2)
    pid = run.task_pids[tid][0]
    names(msg, "bolt", tid, pid)
    # detected from the bytes, at once, not by the (30 s) watchdog: said by the cause, not by a clock
    assert "subprocess timeout" not in msg and "HeartbeatTimeout" not in msg
    for fragment in CASES[fault]:
        assert fragment in msg, f"{fragment!r} not in the error:\n{msg[:3000]}"
    assert f"faulty_bolt pid {pid} ready" in msg, "stderr tail"
    assert len(msg) < 20_000, f"the error is {len(msg)} characters long"
    assert_no_orphans(run)


def test_an_unterminated_line_at_the_default_64_mib_limit_is_cut_off_with_bounded_memory(marker, caplog):
    # The real default limit (64 MiB): a runaway component writing a line
    # that never ends is stopped once it passes the limit; the host does not
    # buffer it all (§1.3: no more than the limit plus one read).
    import resource

    n = 100
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=5))
    b.set_bolt("bolt", faulty_bolt(fault="unterminated", after=10, once=marker), conf=HOLD).shuffle_grouping("spout")
    topo = build(b, **{"topology.subprocess.timeout.secs": 30})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run = run_topology(topo, limit=120)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = run.result
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    (msg,) = restart_logs(caplog)
    assert "exceeds the 67108864-byte limit without an 'end' line" in msg
    assert "UNTERMINATEDzzzz" in msg and len(msg) < 20_000
    # peak RSS grows by at most ~3x the limit (the buffer, one copy, slack)
    assert (after - before) * 1024 < 3 * 64 * 2**20, f"peak RSS grew by {(after - before) // 1024} MiB"
    assert_no_orphans(run)


def test_anchoring_to_a_tuple_the_bolt_already_acked_loses_only_that_tuples_output(marker, caplog):
    # The bolt acks tuple T and then emits anchored to T. The ack completed
    # T's tree (the spout was told), so the late emit cannot be tracked: it
    # is a protocol error (§3.6), the process is restarted and every tuple
    # in flight replayed, but T itself is finished by the bolt's own word.
    # Storm does the same (its ShellBolt throws "Anchored onto ... after
    # ack/fail" and the worker dies). Documented in docs/FAULTS.md.
    n = 300
    run = run_topology(_topology(n, "anchor_finished", marker), limit=120)
    res = run.result
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1
    got = run.values("bolt")
    lost = Counter(range(n)) - got
    assert len(lost) == 1 and not (got - Counter(range(n))), (lost, got - Counter(range(n)))
    (t,) = lost
    assert t in run.acked_ids(), "the one missing output belongs to the tuple the bolt acked itself"
    assert run.acked_ids() == set(range(n))
    (msg,) = restart_logs(caplog)
    tid = next(t for t in task_ids(run.runtime, "bolt") if len(run.task_pids[t]) == 2)
    names(msg, "bolt", tid, run.task_pids[tid][0])
    assert "anchors to id" in msg and "which is not a pending tuple" in msg
    assert_no_orphans(run)
