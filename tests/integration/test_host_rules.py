"""Host rules of spec/PROTOCOL.md not covered elsewhere, with real processes."""

import logging
from pathlib import Path

import trio

from multilang.shellbolt import PythonSpout, Runtime, ShellBolt, TopologyBuilder

BOLT = str(Path(__file__).parent / "components" / "rules_bolt.py")


def _run(mode, values, conf=None, **run):
    builder = TopologyBuilder()
    builder.set_spout("s", PythonSpout(lambda: ([v] for v in values), fields=["v"]))
    builder.set_bolt("b", ShellBolt(["python", BOLT, mode], fields=["a", "b"])).shuffle_grouping("s")
    out = []
    rt = Runtime(builder.create_topology(conf or {}), on_output=out.append)
    result = trio.run(lambda: rt.run(**run))
    return out, result


def test_pid_directory_is_private_and_holds_the_pid_file():
    """§2.1 / §2.3: the pid directory is mode 0700 and the component's pid file is in it."""
    out, result = _run("pidmode", ["x"], until_done=True)
    assert result.ok
    assert out == [{"component": "b", "stream": "default", "a": "0o700", "b": True}]


def test_unknown_bolt_command_is_ignored_and_logged(caplog):
    """§3.7: a bolt host ignores an unknown command (counting it as liveness) and says so."""
    with caplog.at_level(logging.WARNING, logger="multilang"):
        out, result = _run("unknown", ["p", "q"], until_done=True)
    assert result.ok and result.stats["b"].restarts == 0
    assert sorted(r["a"] for r in out) == ["p", "q"]
    assert any("unknown command 'shrug'" in r.getMessage() and "b:" in r.getMessage() for r in caplog.records)


def test_a_bolt_that_never_acks_still_gets_tuples_beyond_max_pending():
    """§5.3: topology.shellbolt.max.pending bounds the tuples not yet written
    (Storm's pendingWrites), not the unacked ones: with max pending 2, a bolt
    that never acks still gets every tuple (its trees time out)."""
    conf = {"topology.shellbolt.max.pending": 2, "topology.message.timeout.secs": 1}
    out, result = _run("neverack", list(range(6)), conf, duration=6)
    seen = {r["a"] for r in out}
    assert len(seen) > 2, f"only {sorted(seen)} reached the bolt: it stalled at max pending"
    assert result.timed_out >= 2
