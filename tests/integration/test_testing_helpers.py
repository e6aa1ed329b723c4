"""multilang.testing itself: the byte-level host against tiny stdlib-only components."""

import itertools
import os
import sys
import textwrap

import pytest

from multilang.shellbolt import PythonBolt, PythonSpout, TopologyBuilder
from multilang.testing import (
    ComponentProcess,
    ComponentProcesses,
    TopologyRun,
    alive,
    assert_no_orphans,
    child_pids,
    encode_frame,
    gone,
    run_topology,
    same_json,
    tuple_batch,
    tuple_frame,
)

PY = sys.executable

# Answers the handshake like a component should, then echoes every frame's raw
# text back (framed with the line ending given as argv[1]) until stdin ends.
ECHO = textwrap.dedent("""
    import json, os, sys
    nl = sys.argv[1].encode().decode("unicode_escape").encode()
    out = sys.stdout.buffer
    lines = []
    first = True
    for line in sys.stdin.buffer:
        line = line.rstrip(b"\\n")
        if line != b"end":
            lines.append(line)
            continue
        text, lines = b"\\n".join(lines), []
        if first:
            first = False
            msg = json.loads(text)
            open(os.path.join(msg["pidDir"], str(os.getpid())), "w").close()
            reply = {"pid": os.getpid()}
            if msg.get("extensions"):
                reply["extensions"] = msg["extensions"]
            text = json.dumps(reply, separators=(",", ":")).encode()
        out.write(text + nl + b"end" + nl)
        out.flush()
""")


@pytest.fixture
def procs(tmp_path):
    with ComponentProcesses(pid_dir=tmp_path / "pids", timeout=2) as p:
        yield p


def echo(procs, nl="\\n", **kw):
    return procs.start([PY, "-c", ECHO, nl], **kw)


def test_handshake_frames_and_clean_exit(procs):
    c = echo(procs, handshake=True)
    c.send(tuple_frame("1", ["a", "\u00fc"]))
    assert c.read_raw() == '{"id":"1","comp":"spout","stream":"default","task":1,"tuple":["a","\u00fc"]}'.encode()
    c.write(b'{"x":\n1}\nend\n' + encode_frame({"y": 2}))
    assert c.read_n(2) == [{"x": 1}, {"y": 2}]
    c.expect_silence(0.05)
    c.close_stdin()
    c.read_eof()
    assert c.wait() == 0
    assert c.wait_closed()


def test_handshake_offer_and_accept(procs):
    c = echo(procs)
    assert c.handshake(offer=["batch"], accept=["batch"]) == {"pid": c.pid, "extensions": ["batch"]}
    c.send(tuple_batch(tuple_frame("1", [1]), tuple_frame("2", [2], comp="c", task=3)))
    assert c.read() == {"tuples": [["1", "spout", "default", 1, [1]], ["2", "c", "default", 3, [2]]]}


def test_crlf_only_when_accepted(procs):
    c = echo(procs, "\\r\\n", accept_crlf=True)
    c.handshake()
    c.send({"a": 1})
    assert c.read() == {"a": 1}
    strict = echo(procs, "\\r\\n")
    strict.send({"pidDir": str(strict.pid_dir), "conf": {}, "context": {}})
    with pytest.raises(AssertionError, match="no frame within"):
        strict.read_raw(timeout=0.3)


def test_output_before_the_pid_reply_fails_the_handshake(procs):
    c = procs.start([PY, "-c", "import sys; print('hello', flush=True); exec(sys.argv[2])", "\\n", ECHO])
    with pytest.raises(AssertionError, match="does not start with the pid reply"):
        c.handshake()


def test_failures_carry_stderr_and_unread_output(procs):
    c = procs.start([PY, "-c", "import sys; sys.stderr.write('bad news\\n'); sys.stdout.write('partial'); "
                     "sys.stdout.flush(); sys.stdin.read()"])
    c.wait_stderr(b"bad news")
    with pytest.raises(AssertionError, match=r"(?s)no frame within.*partial.*bad news"):
        c.read_raw(timeout=0.2)
    with pytest.raises(AssertionError, match="unexpected output: b'partial'"):
        c.expect_silence(0.05)
    c.close_stdin()
    with pytest.raises(AssertionError, match="closed its stdout"):
        c.read()
    assert c.wait() == 0


def test_wait_fails_on_a_process_that_keeps_running(procs):
    c = procs.start([PY, "-c", "import time; time.sleep(30)"])
    with pytest.raises(AssertionError, match="still running"):
        c.wait(0.2)
    c.close()
    assert gone(c.pid)


def test_close_kills_reaps_and_removes_a_private_pid_dir():
    c = ComponentProcess([PY, "-c", "import time; time.sleep(30)"])
    pid_dir = c.pid_dir
    assert pid_dir.is_dir() and alive(c.pid) and c.pid in child_pids()
    c.close()
    assert gone(c.pid) and not pid_dir.exists()
    assert_no_orphans([c.pid])


def test_assert_no_orphans_names_what_is_left():
    c = ComponentProcess([PY, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(AssertionError, match=rf"still has children: (.*, )?{c.pid} \("):
            assert_no_orphans(parent=os.getpid())
    finally:
        c.close()
    assert_no_orphans(timeout=1)


def test_same_json_insists_on_json_types():
    assert same_json({"a": [1, "x", None]}, {"a": [1, "x", None]})
    assert not same_json(1, 1.0) and not same_json(True, 1) and not same_json("0", 0)
    assert not same_json({"a": 1}, {"a": 1, "b": 2}) and not same_json([1], [1, 1])


def test_run_topology_stops_once_stop_when_sees_what_was_delivered():
    # An endless spout: only stop_when ends the run before its hour.
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout(([i] for i in itertools.count()), fields=["n"]))
    b.set_bolt("sink", PythonBolt(lambda v: [v], fields=["n"])).shuffle_grouping("spout")
    seen: list[int] = []

    def enough(run: TopologyRun) -> bool:
        seen.append(len(run.records("sink")))
        return seen[-1] >= 50

    run = run_topology(b.create_topology({}), duration=3600, limit=120, stop_when=enough)
    assert run.result.stopped_by == "stop_when"
    assert seen[-1] >= 50 and seen.count(seen[-1]) == 1, "asked until true, then no more"
    assert len(run.records("sink")) >= 50
