"""No delivery after expiry (issue 18): a queued tuple whose tree has failed or
timed out is dropped, never written, because its replay is already on its
way. With ``multilang.hold.emits.until.ack`` that makes a hung or killed
bolt cost no duplicates: before, the stale copies queued behind a hung
process were processed by its successor *and* replayed (950 duplicates in
30,000 items with a SIGSTOP, 96 under repeated kill -9)."""

from __future__ import annotations

import os
import signal
from collections import Counter

import trio

from faults_support import assert_nothing_lost, build, faulty_bolt, kill_mid_stream, numbered_spout, run_topology, \
    task_ids
from multilang.shellbolt import TopologyBuilder
from multilang.testing import assert_no_orphans, wait_until

HOLD = {"multilang.hold.emits.until.ack": True}


def _chain(n: int, *, sleep: float = 0.0, **conf):
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=10))
    b.set_bolt("mid", faulty_bolt(sleep=sleep), conf=HOLD).shuffle_grouping("spout")
    b.set_bolt("sink", faulty_bolt(), conf=HOLD).shuffle_grouping("mid")
    return build(b, **conf)


def test_hung_bolt_in_hold_mode_gives_no_duplicates():
    n = 2000
    # The tuples queued behind the hung process time out (1.5 s) well before
    # the process is killed (3 s): they are replayed, and their stale copies
    # must not reach the process that replaces it.
    topo = _chain(n, **{"topology.message.timeout.secs": 1.5, "topology.subprocess.timeout.secs": 3})
    stopped = {}

    async def hang(rt):
        (tid,) = task_ids(rt, "mid")
        task = rt.tasks[tid]
        await wait_until(lambda: rt.stats["mid"].acked > 100 and task.in_flight and task.proc is not None)
        pid = task.proc.pid
        os.kill(pid, signal.SIGSTOP)  # never continued: the subprocess timeout kills it
        await wait_until(lambda: len(task.inbox) > 0 or task.proc is None or task.proc.pid != pid)
        stopped.update(pid=pid, queued=len(task.inbox))
        await wait_until(lambda: rt.stats["mid"].restarts == 1, timeout=60)

    run = run_topology(topo, during=hang, limit=120)
    res = run.result
    assert stopped["queued"] > 0, "tuples were queued behind the hung process"
    assert res.stats["mid"].restarts == 1
    assert res.timed_out > 0, "the queued tuples' trees timed out while it hung"
    assert res.stats["mid"].expired > 0, "their stale copies were dropped, not written"
    assert_nothing_lost(run, n, "sink", Counter(range(n)))  # exact: no duplicates
    assert_no_orphans(run)


def test_repeated_kill_9_in_hold_mode_gives_no_duplicates():
    n = 3000
    topo = _chain(n, sleep=0.001, **{"topology.message.timeout.secs": 1})
    kills = []

    async def killer(rt):
        for at in (100, 400, 700):
            await wait_until(lambda: rt.stats["mid"].acked > at, timeout=60)
            kills.append(await kill_mid_stream(rt, "mid"))
            await trio.sleep(1.2)  # past the message timeout: queued trees expire meanwhile

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert len(kills) == 3 and res.stats["mid"].restarts == 3
    assert_nothing_lost(run, n, "sink", Counter(range(n)))
    assert_no_orphans(run)
