"""Shared by the library tests of the three languages (imported by name: tests/ has no packages)."""

import json

# The gate of a bolt under test: the tuple whose value is 16 waits (up to
# GATE_SECS) until this file exists in the test's tmp_path. A bolt that held the
# first half back until the second half is done could only answer it after
# that: the first half read before the file exists (reads wait up to
# READ_SECS each) is the pass condition, not how long it took.
GATE_VALUE = 16
GATE_SECS = 120
READ_SECS = 60


def check_burst_answered_halfway(proc, go) -> None:
    """Write 32 tuples in one write (one burst, under PIPE_BUF) to a bolt
    whose tuple 16 waits for the file ``go``. The bolt must answer the first
    half (16 emits and 16 acks) before it works on the second half: a host
    that keeps at most max.pending tuples unacked (spec §5.3) can then
    refill its window while the bolt works."""
    proc.write(b"".join(
        json.dumps({"id": str(i), "comp": "src", "stream": "default", "task": 7, "tuple": [i]}).encode() + b"\nend\n"
        for i in range(2 * GATE_VALUE)
    ))
    first = proc.read_n(2 * GATE_VALUE, timeout=READ_SECS)
    go.touch()
    assert [f["id"] for f in first if f["command"] == "ack"] == [str(i) for i in range(GATE_VALUE)]
    rest = proc.read_n(2 * GATE_VALUE, timeout=READ_SECS)
    assert [f["id"] for f in rest if f["command"] == "ack"] == [str(i) for i in range(GATE_VALUE, 2 * GATE_VALUE)]
