"""Shared by the library tests of the three languages (imported by name: tests/ has no packages)."""

import json
import time

# The gate of a bolt under test: the tuple whose value is 16 waits (up to 10 s)
# until this file exists in the test's tmp_path.
GATE_VALUE = 16


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
    t0 = time.monotonic()
    first = proc.read_n(2 * GATE_VALUE, timeout=5)
    waited = time.monotonic() - t0
    go.touch()
    assert [f["id"] for f in first if f["command"] == "ack"] == [str(i) for i in range(GATE_VALUE)]
    assert waited < 5, f"the first half's acks came after {waited:.1f}s"
    rest = proc.read_n(2 * GATE_VALUE, timeout=5)
    assert [f["id"] for f in rest if f["command"] == "ack"] == [str(i) for i in range(GATE_VALUE, 2 * GATE_VALUE)]
