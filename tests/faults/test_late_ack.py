"""Bolts that ack late (issue 18): ``topology.shellbolt.max.pending`` bounds
the tuples taken from the queue and not yet written, as in Storm's ShellBolt
(its ``pendingWrites``), not the tuples a bolt holds unacked. So a bolt that
acks in groups (on ticks) keeps getting tuples, ticks keep flowing, and a bolt
that never acks gets one clear warning."""

from __future__ import annotations

import logging
import subprocess

import trio

from faults_support import COMPONENTS, EXAMPLES, ML, ROOT
from multilang.shellbolt import PythonSpout, Runtime, ShellBolt, TopologyBuilder

TICK_ACK_BOLT = ["python", str(COMPONENTS / "tick_ack_bolt.py")]


def test_2000_lines_through_a_bolt_that_acks_only_on_ticks_all_complete():
    # With the old meaning (max pending = unacked), 100 tuples went through,
    # then nothing until they timed out: the run took minutes. The timeout
    # below only guards against that stall; nothing here is timed.
    proc = subprocess.run(ML + ["pipe", "-c", "topology.tick.tuple.freq.secs=1", "--", *TICK_ACK_BOLT],
                          input="".join(f"{i}\n" for i in range(2000)), capture_output=True, text=True,
                          cwd=ROOT, timeout=20)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(int(x.strip('[]"')) for x in proc.stdout.split()) == list(range(2000))


def test_a_bolt_that_never_acks_gets_one_clear_warning(caplog):
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[i] for i in range(40)], fields=["n"]))
    b.set_bolt("sink", ShellBolt(TICK_ACK_BOLT + ["--never"], fields=["n"])).shuffle_grouping("spout")
    topo = b.create_topology({"topology.message.timeout.secs": 1, "topology.shellbolt.max.pending": 5,
                              "multilang.max.replays": 100, "multilang.shutdown.grace.secs": 0.5},
                             resource_dir=EXAMPLES)
    with caplog.at_level(logging.WARNING, logger="multilang"):
        result = trio.run(lambda: Runtime(topo).run(duration=4))
    warnings = [r.getMessage() for r in caplog.records if "has acked or failed none" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "sink:1 (pid " in warnings[0] and "A bolt must ack or fail every tuple" in warnings[0]
    assert result.timed_out > 0 and result.stats["sink"].executed >= 40, "it kept getting tuples (and replays)"
