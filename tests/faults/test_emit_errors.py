"""Emit errors (spec/PROTOCOL.md §3.5 "Emit errors", §4.3).

An emit on an undeclared stream, with the wrong number of values, or a direct
emit to a task that does not subscribe with a direct grouping: the frame is
well-formed, so the process keeps running (no restart). The host logs the
error naming the component, task and pid, drops that one tuple and fails its
tree (a spout's message id is failed back to it), so the spout replays it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio

from faults_support import (
    assert_nothing_lost,
    build,
    error_logs,
    faulty_bolt,
    names,
    numbered_spout,
    run_topology,
    task_ids,
)
from multilang.shellbolt import TopologyBuilder, run_workers
from multilang.shellbolt._workers.worker import placement
from multilang.testing import assert_no_orphans

# Task ids are assigned in component-name order: "bolt" is task 1, "spout" 2.
CASES = {
    "undeclared": "emitted to undeclared stream 'nope'",
    "wrong_arity": "emitted 2 values on stream 'default', which declares 1 fields",
    "direct:1": "direct emit to task 1, which does not subscribe to bolt/default with a direct grouping",
}


def _refusing_bolt(n: int, fault: str, hold: bool, marker):
    """A spout of 0..n-1 into a bolt whose 21st tuple's emit the host refuses (``fault``, once)."""
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=5))
    b.set_bolt("bolt", faulty_bolt(fault=fault, after=20, once=marker),
               conf={"multilang.hold.emits.until.ack": hold}).shuffle_grouping("spout")
    return build(b, **{"topology.max.spout.pending": 50})


@pytest.mark.parametrize("hold", [False, True], ids=["at-least-once", "hold-emits"])
@pytest.mark.parametrize("fault", list(CASES))
def test_bolt_emit_error_drops_the_tuple_fails_its_tree_and_keeps_the_process(fault, hold, marker, caplog):
    n = 200
    topo = _refusing_bolt(n, fault, hold, marker)
    assert task_ids(topo, "bolt") == [1]
    run = run_topology(topo)
    res = run.result
    # (a) no restart: the process kept running
    assert res.ok, res
    assert res.stats["bolt"].restarts == 0
    (pid,) = run.task_pids[1]
    # the tuple's tree failed once and was replayed
    assert len(run.failed_ids()) == 1, run.failed_ids()
    assert res.failed == 1
    # (b) the dropped tuple came back through the replay: exact output
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    # (c) one error, naming component, task, pid and the cause
    assert res.stats["bolt"].errors == 1, "the emit error is counted once"
    logs = error_logs(caplog, "dropped")
    assert len(logs) == 1, logs
    names(logs[0], "bolt", 1, pid)
    assert CASES[fault] in logs[0]
    assert "tree failed" in logs[0]
    assert_no_orphans(run)


@pytest.mark.parametrize("hold", [False, True], ids=["at-least-once", "hold-emits"])
@pytest.mark.parametrize("fault", list(CASES))
def test_on_two_workers_a_refused_emit_fails_its_tree_at_the_spouts_worker_and_the_input_comes_back(fault, hold,
                                                                                                   marker):
    """The same on 2 host workers, the bolt (task 1) on worker 0 and the
    spout (task 2) on worker 1: the refused emit's fail and the bolt's ack
    of its input reach the tree's owner in one batch, and the tree fails
    there, as on one worker. A trial's run acked it, and the input was
    lost, exit 0 (6 runs of 6, every kind of refused emit)."""
    n = 200
    topo = _refusing_bolt(n, fault, hold, marker)
    assert placement(topo, 2) == {1: 0, 2: 1}
    out: list = []
    res = trio.run(lambda: run_workers(topo, 2, on_output=out.append))
    assert res.ok and res.failed == 1 and res.completed == n, res
    events = [(r["event"], r["msg_id"]) for r in out if r["component"] == "spout" and r["stream"] == "events"]
    failed = [m for e, m in events if e == "failed"]
    assert len(failed) == 1 and {m for e, m in events if e == "acked"} == set(range(n)), events[-20:]
    assert Counter(r["n"] for r in out if r["component"] == "bolt") == Counter(range(n))
    assert res.stats["bolt"].errors == 1 and res.stats["bolt"].restarts == 0


def test_spout_emit_to_an_undeclared_stream_is_failed_back_to_the_spout_and_replayed(marker, caplog):
    n = 200
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=5, fault="undeclared", after=50, once=marker))
    b.set_bolt("bolt", faulty_bolt()).shuffle_grouping("spout")
    run = run_topology(build(b, **{"topology.max.spout.pending": 50}))
    res = run.result
    assert res.ok, res
    assert res.stats["spout"].restarts == 0
    assert run.failed_ids() == [50], "the spout got a fail for the dropped message id"
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    (tid,) = task_ids(run.runtime, "spout")
    (pid,) = run.task_pids[tid]
    logs = error_logs(caplog, "undeclared stream")
    assert len(logs) == 1, logs
    names(logs[0], "spout", tid, pid)
    assert "emitted to undeclared stream 'nope'" in logs[0]
    assert res.stats["spout"].errors == 1
    assert_no_orphans(run)
