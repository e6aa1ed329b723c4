"""Hangs (SIGSTOP) and handshake faults (spec/PROTOCOL.md §2.3, §2.4, §5.2, §8.2).

* A process that sends nothing for ``topology.subprocess.timeout.secs``
  (bolts: always; spouts: while a command is outstanding) is killed
  (``HeartbeatTimeout``), restarted, and its in-flight tuples replayed.
* A process that exits during the handshake is handled like a crash.
* No pid reply within ``multilang.handshake.timeout.secs``: killed, handled
  like a crash (Storm waits forever).
* No pid file: a warning naming the component, task and pid; the run goes on.
"""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

import trio

from faults_support import (
    assert_nothing_lost,
    build,
    error_logs,
    faulty_bolt,
    names,
    needs_node,
    numbered_spout,
    restart_logs,
    run_topology,
    task_ids,
)
from multilang.shellbolt import ShellBolt, TopologyBuilder
from multilang.testing import current_pid
from multilang.testing import assert_no_orphans, gone, wait_until

HOLD = {"multilang.hold.emits.until.ack": True}
TIMEOUT = 1.5


@needs_node
def test_sigstopped_node_bolt_is_killed_after_the_subprocess_timeout_and_replayed(caplog):
    n = 600
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, fmt="w{i}", per_next=5, fields=["sentence"]))
    b.set_bolt("node", ShellBolt(["node", "node/split_bolt.js"], fields=["word"]), parallelism=2, conf=HOLD) \
        .shuffle_grouping("spout")
    topo = build(b, **{"topology.subprocess.timeout.secs": TIMEOUT, "topology.max.spout.pending": 50})
    stopped = {}

    async def stopper(rt):
        await wait_until(lambda: rt.stats["node"].acked > 100)
        with trio.fail_after(5):
            while True:
                for tid in task_ids(rt, "node"):
                    pid = current_pid(rt, tid)
                    if rt.tasks[tid].in_flight and pid is not None:
                        os.kill(pid, signal.SIGSTOP)  # never continued: only SIGKILL ends it
                        stopped.update(tid=tid, pid=pid, at=trio.current_time())
                        await wait_until(lambda: current_pid(rt, tid) not in (None, pid), timeout=TIMEOUT + 5)
                        stopped["replaced"] = trio.current_time()
                        return
                await trio.sleep(0.001)

    run = run_topology(topo, during=stopper)
    res = run.result
    tid, pid = stopped["tid"], stopped["pid"]
    # (a) killed after the timeout (not before), restarted, the run finished
    took = stopped["replaced"] - stopped["at"]
    assert took >= TIMEOUT, took  # not before; the exact deadline: tests/unit/test_supervisor.py
    assert res.ok, res
    assert res.stats["node"].restarts == 1 and res.stats["node"].failed >= 1
    assert res.timed_out == 0, "the stuck tuples were failed by the kill, not left to the message timeout"
    # (b)
    assert_nothing_lost(run, n, "node", Counter(f"w{i}" for i in range(n)), field_="word")
    # (c)
    (msg,) = restart_logs(caplog)
    names(msg, "node", tid, pid)
    assert f"sent nothing for {TIMEOUT:g}s (subprocess timeout" in msg
    assert gone(pid), "the stopped process was killed and reaped"
    assert_no_orphans(run)


def test_sigstopped_spout_is_killed_while_a_command_is_outstanding(tmp_path, caplog):
    n = 2000
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=5, state=tmp_path / "offset"))
    b.set_bolt("bolt", faulty_bolt(), conf=HOLD).shuffle_grouping("spout")
    topo = build(b, **{"topology.subprocess.timeout.secs": TIMEOUT, "topology.max.spout.pending": 100})
    stopped = {}

    async def stopper(rt):
        (tid,) = task_ids(rt, "spout")
        await wait_until(lambda: rt.stats["bolt"].acked > 300)
        pid = current_pid(rt, tid)
        os.kill(pid, signal.SIGSTOP)
        stopped.update(tid=tid, pid=pid, at=trio.current_time())
        await wait_until(lambda: current_pid(rt, tid) not in (None, pid), timeout=TIMEOUT + 5)
        stopped["replaced"] = trio.current_time()

    run = run_topology(topo, during=stopper)
    res = run.result
    took = stopped["replaced"] - stopped["at"]
    assert took >= TIMEOUT, took  # not before; the exact deadline: tests/unit/test_supervisor.py
    assert res.ok, res
    assert res.stats["spout"].restarts == 1 and res.stats["bolt"].restarts == 0
    assert_nothing_lost(run, n, "bolt", Counter(range(n)), exact=False)
    assert sum((run.values("bolt") - Counter(range(n))).values()) <= 5, "at most one uncommitted burst again"
    (msg,) = restart_logs(caplog)
    names(msg, "spout", stopped["tid"], stopped["pid"])
    assert "subprocess timeout" in msg
    assert gone(stopped["pid"])
    assert_no_orphans(run)


def _one_bolt(n, bolt, *, handshake_timeout=None, **conf):
    # A short handshake timeout is the bolt's alone: a spout slow to start on
    # a busy machine must not be killed for it.
    bolt_conf = HOLD if handshake_timeout is None else {**HOLD, "multilang.handshake.timeout.secs": handshake_timeout}
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=5))
    b.set_bolt("bolt", bolt, conf=bolt_conf).shuffle_grouping("spout")
    return build(b, **conf)


def test_exit_during_the_handshake_is_a_crash_and_the_next_process_serves(marker, caplog):
    n = 200
    run = run_topology(_one_bolt(n, faulty_bolt(startup="exit:7", once=marker)))
    res = run.result
    (tid,) = task_ids(run.runtime, "bolt")
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    (msg,) = restart_logs(caplog)
    pid = int(re.search(r"\(pid (\d+)\)", msg).group(1))
    names(msg, "bolt", tid, pid)
    assert pid in run.pids and pid != run.task_pids[tid][-1] and gone(pid)
    assert "exit status 7" in msg
    assert "exiting during the handshake with status 7" in msg, "stderr tail"
    assert_no_orphans(run)


def test_exit_during_every_handshake_gives_up_naming_the_cause(caplog):
    run = run_topology(_one_bolt(50, faulty_bolt(startup="exit:7"), **{"multilang.restart.budget": 1}))
    res = run.result
    assert not res.ok
    (err,) = res.gave_up
    (tid,) = task_ids(run.runtime, "bolt")
    assert (err.component, err.task) == ("bolt", tid)
    assert err.pid is not None and gone(err.pid)
    text = str(err)
    names(text, "bolt", tid, err.pid)
    assert "exit status 7" in text
    assert "exiting during the handshake with status 7" in text
    assert res.completed == 0 and not run.acked_ids()
    assert run.pids  # the runtime started processes, all reaped
    assert all(gone(p) for p in run.pids)


def test_no_pid_reply_within_the_handshake_timeout_kills_and_restarts(marker, caplog):
    n = 200
    topo = _one_bolt(n, faulty_bolt(startup="hang", once=marker), handshake_timeout=1)
    run = run_topology(topo)
    res = run.result
    (tid,) = task_ids(run.runtime, "bolt")
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    (msg,) = restart_logs(caplog)
    pid = run.task_pids[tid][0]
    names(msg, "bolt", tid, pid)
    assert "no pid reply within the 1s handshake timeout" in msg
    assert "never answering the handshake" in msg, "stderr tail"
    assert gone(pid)
    assert_no_orphans(run)


# Each process dies slower than the window is long, as with the defaults (a
# 30 s timeout, a 60 s window): the window never holds more than two crashes.
SLOW_DEATHS = {"multilang.restart.budget": 2, "multilang.restart.window.secs": 0.5}


def _gives_up_in_a_row(run, caplog, cause):
    res = run.result
    assert not res.ok
    (err,) = res.gave_up
    assert cause in str(err)
    (msg,) = error_logs(caplog, "giving up")
    assert "giving up after 2 restarts in a row of processes that did no work" in msg, msg
    assert res.stats["bolt"].restarts == 2
    assert all(gone(p) for p in run.pids)


def test_a_bolt_that_never_answers_the_handshake_gives_up_however_slowly_it_dies(caplog):
    topo = _one_bolt(20, faulty_bolt(startup="hang"), handshake_timeout=0.6, **SLOW_DEATHS)
    _gives_up_in_a_row(run_topology(topo), caplog, "no pid reply within the 0.6s handshake timeout")


def test_a_bolt_that_hangs_on_every_first_tuple_gives_up_however_slowly_it_dies(caplog):
    topo = _one_bolt(20, faulty_bolt(fault="hang"), **SLOW_DEATHS, **{"topology.subprocess.timeout.secs": 0.6})
    _gives_up_in_a_row(run_topology(topo), caplog, "sent nothing for 0.6s")


def test_a_spout_that_dies_on_every_next_gives_up_in_a_row_though_it_answers_activate(caplog):
    # A window no two deaths fit in: only the count in a row can give up. Answering
    # `activate` is not work; a spout that never gets through a `next` did none.
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(5, fault="exit:4"))
    b.set_bolt("bolt", faulty_bolt(), conf=HOLD).shuffle_grouping("spout")
    run = run_topology(build(b, **{"multilang.restart.budget": 2, "multilang.restart.window.secs": 0.01}))
    res = run.result
    assert not res.ok
    (err,) = res.gave_up
    assert err.component == "spout" and "exit status 4" in str(err)
    (msg,) = error_logs(caplog, "giving up")
    assert "giving up after 2 restarts in a row of processes that did no work" in msg, msg
    assert all(gone(p) for p in run.pids)


def test_no_pid_file_is_a_warning_and_the_run_goes_on(caplog):
    n = 200
    run = run_topology(_one_bolt(n, faulty_bolt(startup="no_pid_file")))
    res = run.result
    (tid,) = task_ids(run.runtime, "bolt")
    assert res.ok, res
    assert res.stats["bolt"].restarts == 0
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    (msg,) = error_logs(caplog, "pid file")
    (pid,) = run.task_pids[tid]
    names(msg, "bolt", tid, pid)
    assert "did not create its pid file" in msg and "continuing" in msg
    assert_no_orphans(run)
