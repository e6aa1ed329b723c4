"""A slow bolt behind a fast spout (spec/PROTOCOL.md §4.6, §5.3, §7.6).

Memory must stay bounded while the spout could produce far faster than the
bolt consumes: ``topology.max.spout.pending`` bounds the trees in flight per
spout task, and the per-task input queue (backpressure: no ``next`` while a
consumer's queue is full) plus what the pipe to the bolt buffers bound the
rest when max spout pending is unset. ``topology.shellbolt.max.pending``
bounds only the tuples taken from the queue and not yet written, as in
Storm (tests/faults/test_late_ack.py). Nothing may time out needlessly.
"""

from __future__ import annotations

from collections import Counter

import trio

from faults_support import assert_nothing_lost, build, faulty_bolt, numbered_spout, run_topology, task_ids
from multilang.shellbolt import TopologyBuilder
from multilang.testing import assert_no_orphans

PER_NEXT = 10


def _sampled_run(n, sleep, gate=None, **conf):
    """Run n tuples through a bolt that sleeps ``sleep`` per tuple, sampling
    the acker's pending trees and the bolt task's queues. With ``gate`` (a
    path), the bolt holds its first tuple until the file exists, and the
    sampler creates it once the bolt task's input queue is full."""
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=PER_NEXT))
    b.set_bolt("bolt", faulty_bolt(sleep=sleep, gate=gate)).shuffle_grouping("spout")
    topo = build(b, **{"topology.message.timeout.secs": 10, **conf})
    samples = {"pending": [], "inbox": [], "in_flight": []}

    async def sample(rt):
        (bolt,) = [rt.tasks[t] for t in task_ids(rt, "bolt")]
        while True:
            samples["pending"].append(rt.acker.pending)
            samples["inbox"].append(len(bolt.inbox))
            samples["in_flight"].append(len(bolt.in_flight))
            if gate is not None and len(bolt.inbox) >= bolt.capacity and not gate.exists():
                gate.touch()  # the queue is full: let the bolt work
            await trio.sleep(0.002)

    run = run_topology(topo, during=sample)
    return run, samples


def test_max_spout_pending_and_shellbolt_max_pending_bound_a_slow_bolt():
    n, msp, mp = 1200, 100, 10
    run, s = _sampled_run(n, 0.001, **{"topology.max.spout.pending": msp, "topology.shellbolt.max.pending": mp})
    res = run.result
    assert res.ok, res
    assert len(s["pending"]) > 200, "sampled throughout the run"
    # A `next` is only sent below the bound, and one `next` emits up to
    # PER_NEXT tuples: the bound can be passed by one next's worth.
    assert max(s["pending"]) <= msp + PER_NEXT - 1, max(s["pending"])
    assert max(s["pending"]) >= msp * 0.9, "the spout did run ahead of the bolt up to the bound"
    assert max(s["in_flight"]) <= msp + PER_NEXT, max(s["in_flight"])
    assert max(s["inbox"]) <= msp + PER_NEXT
    assert res.timed_out == 0 and res.failed == 0, "nothing timed out or failed needlessly"
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    assert_no_orphans(run)


def test_without_max_spout_pending_the_input_queue_backpressures_the_spout(tmp_path):
    # No max spout pending: only the bolt task's input queue (1024 tuples)
    # stands between a spout and the host's memory. The bolt holds its first
    # tuple until that queue is full, so the spout meets the full queue
    # however fast or slow this machine is.
    n, mp = 2500, 10
    run, s = _sampled_run(n, 0.001, gate=tmp_path / "gate",
                          **{"topology.shellbolt.max.pending": mp, "topology.message.timeout.secs": 120})
    res = run.result
    assert res.ok, res
    capacity = run.runtime.tasks[task_ids(run.runtime, "bolt")[0]].capacity
    assert max(s["inbox"]) <= capacity + PER_NEXT, (max(s["inbox"]), capacity)
    # Written and not yet acked: what the 64 KiB pipe and the bolt's read
    # buffer hold, a bound that does not grow with n (2,500 here).
    assert max(s["in_flight"]) <= 2000, max(s["in_flight"])
    assert max(s["pending"]) <= capacity + max(s["in_flight"]) + 2 * PER_NEXT, max(s["pending"])
    assert max(s["inbox"]) >= capacity, "the queue did fill: the spout was held back"
    assert res.timed_out == 0 and res.failed == 0
    assert_nothing_lost(run, n, "bolt", Counter(range(n)))
    assert_no_orphans(run)
