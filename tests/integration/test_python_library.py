"""Integration tests for the Python component library (multilang.Bolt, BasicBolt, Spout, ...).

Real `python` subprocesses (examples/python/*.py and small scripts written to
tmp_path) are driven by multilang.testing.ComponentProcess, a host that only
writes and reads bytes: nothing else from `multilang` is used on the host
side. Every read has a timeout, so a broken component fails a test instead of
hanging it. One test runs a bolt in-process, on pipes, to see what ``run()``
leaves behind.
"""

import json
import os
import sys
import textwrap
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from burst_support import GATE_SECS, READ_SECS, check_burst_answered_halfway
from multilang import Bolt
from multilang.testing import (
    ComponentProcesses,
    command_frame as cmd,
    encode_frame,
    heartbeat_frame as heartbeat,
    tick_frame as tick,
    tuple_batch,
    tuple_frame as tup,
)

ROOT = Path(__file__).resolve().parents[2]
PY_DIR = ROOT / "examples" / "python"
CONFORMANCE = PY_DIR / "conformance_component.py"
PY = sys.executable
CONF = {"topology.name": "t", "odd.key": [1]}


def emit(values, anchors=None, **extra):
    f = {"command": "emit", "tuple": values}
    if anchors:
        f["anchors"] = anchors
    f.update(extra)
    f.setdefault("need_task_ids", False)
    if f["need_task_ids"] is None:
        del f["need_task_ids"]
    return f


@pytest.fixture
def started(tmp_path):
    """started(argv, handshake=True, cwd=ROOT) -> multilang.testing.ComponentProcess (ASCII-escaped input)."""
    with ComponentProcesses(cwd=ROOT, pid_dir=tmp_path / "pids", conf=CONF, ensure_ascii=True) as procs:
        yield partial(procs.start, handshake=True)


def conformance(started, mode="bolt"):
    c = started([PY, str(CONFORMANCE), mode])
    assert c.read() == {"command": "log", "msg": f"multilang-conformance ready mode={mode} lang=python", "level": 2}
    return c


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


# ---------------------------------------------------------------------------
# Handshake, heartbeats, ids
# ---------------------------------------------------------------------------


def test_handshake_pid_file_pid_first_then_initialize(started, tmp_path):
    path = script(
        tmp_path,
        "init.py",
        """
        from multilang import Bolt

        class B(Bolt):
            def initialize(self, conf, context):
                print("init", conf["topology.name"], context.task_id, context.component_id)
                self.log(repr(context.component_tasks("count")), 3)

            def process(self, tup):
                self.ack(tup)

        B().run()
        """,
    )
    c = started([PY, str(path)])
    assert c.read_n(2) == [
        {"command": "log", "msg": "init t 2 split", "level": 2},
        {"command": "log", "msg": "[3]", "level": 3},
    ]


def test_heartbeat_answered_with_sync_never_acked(started):
    c = conformance(started)
    c.send(heartbeat("-1"))
    assert c.read_raw() == b'{"command":"sync"}'
    c.send(tup("5", ["ack"]))
    assert c.read() == {"command": "ack", "id": "5"}
    c.expect_silence(0.2)


def test_ack_ids_echoed_byte_for_byte(started):
    c = conformance(started)
    for tid in ["-9223372036854775808", "0012", "9223372036854775807", "1e3", "-0"]:
        c.send(tup(tid, ["ack"]))
        assert c.read_raw() == b'{"command":"ack","id":"%s"}' % tid.encode()
        c.send(tup(tid, ["fail"]))
        assert c.read_raw() == b'{"command":"fail","id":"%s"}' % tid.encode()


def test_task_ids_returned_and_earlier_input_processed_after_in_order(started):
    c = conformance(started)
    c.send(tup("-7", ["emit", ["x"], "s2"]))
    assert c.read() == emit(["x"], ["-7"], stream="s2", need_task_ids=None)
    # While the bolt waits for its task ids, a heartbeat, a tuple and a tick arrive first.
    c.send(heartbeat())
    c.send(tup("8", ["echo", "y"]))
    c.send(tick("9", 30))
    c.expect_silence(0.2)
    c.send([4, 5])
    assert c.read_n(7) == [
        emit(["task_ids", [4, 5]], ["-7"]),
        {"command": "ack", "id": "-7"},
        {"command": "sync"},
        emit(["echo", "y"], ["8"]),
        {"command": "ack", "id": "8"},
        emit(["tick", 30], ["9"]),
        {"command": "ack", "id": "9"},
    ]
    c.expect_silence(0.2)


def test_conformance_bolt_actions(started):
    c = conformance(started)
    c.send(tup("1", ["echo", 1, None, {"a": [True]}]))
    assert c.read_n(2) == [emit(["echo", 1, None, {"a": [True]}], ["1"]), {"command": "ack", "id": "1"}]
    c.send(tup("2", ["emit_unanchored", ["u"]]))
    assert c.read_n(2) == [emit(["u"]), {"command": "ack", "id": "2"}]
    c.send(tup("3", ["emit_direct", 7, ["d"]]))
    # a direct emit is never answered with task ids: the ack follows at once
    assert c.read_n(2) == [emit(["d"], ["3"], task=7), {"command": "ack", "id": "3"}]
    c.send(tup("4", ["emit", ["v"], None]))
    assert c.read() == emit(["v"], ["4"], need_task_ids=None)
    c.send([])
    assert c.read_n(2) == [emit(["task_ids", []], ["4"]), {"command": "ack", "id": "4"}]
    c.send(tup("5", ["emit_many", 3]))
    assert c.read_n(4) == [emit(["n", i], ["5"]) for i in range(3)] + [{"command": "ack", "id": "5"}]
    c.send(tup("h1", ["hold"]))
    c.send(tup("h2", ["hold"]))
    c.send(tup("6", ["release", ["r"]]))
    assert c.read_n(4) == [
        emit(["r"], ["h1", "h2", "6"]),
        {"command": "ack", "id": "h1"},
        {"command": "ack", "id": "h2"},
        {"command": "ack", "id": "6"},
    ]
    c.send(tup("7", ["log", "hello", 3]))
    assert c.read_n(2) == [{"command": "log", "msg": "hello", "level": 3}, {"command": "ack", "id": "7"}]
    c.send(tup("8", ["error", "oops"]))
    assert c.read_n(2) == [{"command": "error", "msg": "oops"}, {"command": "ack", "id": "8"}]
    c.send(tup("9", ["metrics", "m", {"a": [1]}]))
    assert c.read_n(2) == [{"command": "metrics", "name": "m", "params": {"a": [1]}}, {"command": "ack", "id": "9"}]
    c.send(tup("10", ["print", "printed %s"]))
    assert c.read_n(2) == [{"command": "log", "msg": "printed %s", "level": 2}, {"command": "ack", "id": "10"}]
    c.send(tup("11", ["bogus"]))
    assert c.read_n(2) == [{"command": "error", "msg": "unknown action: bogus"}, {"command": "fail", "id": "11"}]
    c.send(tup("12", ["exit", 3]))
    assert c.wait() == 3


# ---------------------------------------------------------------------------
# Ticks
# ---------------------------------------------------------------------------


def test_ticks_go_to_process_tick_not_process(started):
    c = conformance(started)
    c.send(tick("-3", 10))
    assert c.read_n(2) == [emit(["tick", 10], ["-3"]), {"command": "ack", "id": "-3"}]
    b = conformance(started, "basic")
    b.send(tick("t"))
    assert b.read_n(2) == [emit(["tick", 5], ["t"]), {"command": "ack", "id": "t"}]


def test_default_tick_hooks_ack(started, tmp_path):
    path = script(
        tmp_path,
        "ticks.py",
        """
        import sys
        from multilang import BasicBolt, Bolt

        class B(Bolt):
            def process(self, tup):
                self.report_error("process " + tup.id)
                self.ack(tup)

        class BB(BasicBolt):
            def process(self, tup):
                self.report_error("process " + tup.id)

        (B if sys.argv[1] == "bolt" else BB)().run()
        """,
    )
    for mode in ("bolt", "basic"):
        c = started([PY, str(path), mode])
        c.send(tick("t1"))
        assert c.read() == {"command": "ack", "id": "t1"}
        # a tuple on __tick from another component is an ordinary tuple
        c.send(tup("t2", [1], comp="other", stream="__tick"))
        assert c.read_n(2) == [{"command": "error", "msg": "process t2"}, {"command": "ack", "id": "t2"}]


# ---------------------------------------------------------------------------
# Framing and encoding
# ---------------------------------------------------------------------------


def test_unicode_emoji_and_escaped_slash(started):
    c = conformance(started)
    text = "a/b \u00e9 \U0001F600 \u4e2d \u2028 \\ \" end"
    frame = json.dumps(tup("1", ["echo", text]), ensure_ascii=False, separators=(",", ":"))
    frame = frame.replace("/", "\\/").encode() + b"\nend\n"
    emoji_at = frame.index("\U0001F600".encode())
    # split in the middle of the emoji and of "\nend\n", across writes
    for part in (frame[: emoji_at + 2], frame[emoji_at + 2 : -3], frame[-3:]):
        c.write(part)
        time.sleep(0.02)
    raw = c.read_raw()
    assert json.loads(raw) == emit(["echo", text], ["1"])
    assert "\U0001F600".encode() in raw  # raw UTF-8 out, compact
    assert c.read() == {"command": "ack", "id": "1"}
    # ASCII-escaped input, storm.py style (", " separators, \u escapes, \/)
    c.write(json.dumps(tup("2", ["echo", "\U0001F600/\u00fc"]), ensure_ascii=True).replace("/", "\\/").encode() + b"\nend\n")
    assert c.read_raw() == '{"command":"emit","tuple":["echo","\U0001F600/\u00fc"],"anchors":["2"],"need_task_ids":false}'.encode()
    assert c.read() == {"command": "ack", "id": "2"}


def test_crlf_multiline_and_blank_lines(started):
    c = conformance(started)
    multi = b'{\n  "id": "1",\n  "comp": "s",\n\n  "stream": "default",\n  "task": 1,\n  "tuple": ["ack"]\n}\nend\n'
    crlf = b'{"id":"2","comp":"s",\r\n"stream":"default","task":1,"tuple":["ack"]}\r\nend\r\n'
    cr = b'\r\r{"id":"3","comp":"s","stream":"default","task":1,"tuple":["ack"]}\rend\r'
    blank = b'\n\r\n{"id":"4","comp":"s","stream":"default","task":1,"tuple":["ack"]}\nend\n\n'
    c.write(multi + crlf + cr + blank)
    assert c.read_n(4) == [{"command": "ack", "id": i} for i in ("1", "2", "3", "4")]
    data = b'{"id":"5","comp":"s","stream":"default","task":1,"tuple":["ack"]}\r\nend\r\n'
    for i in range(0, len(data), 5):
        c.write(data[i : i + 5])
    assert c.read() == {"command": "ack", "id": "5"}
    # many frames in one write: one write back, every frame handled
    c.write(b"".join(json.dumps(tup(str(i), ["ack"])).encode() + b"\nend\n" for i in range(300)))
    assert [f["id"] for f in c.read_n(300)] == [str(i) for i in range(300)]


def test_near_terminator_is_not_a_terminator(started):
    c = conformance(started)
    # "end " (trailing space) is JSON whitespace + garbage, not a terminator:
    # the frame does not end there, so nothing happens until the real "end".
    c.write(b'{"id":"1","comp":"s","stream":"default","task":1,"tuple":["ack"]}\nend \n')
    c.expect_silence(0.2)
    c.write(b"end\n")
    # the frame "{...}\nend \n" is not JSON: a protocol error, not an ack
    c.read_eof()
    assert c.wait() != 0
    c.wait_closed(5)  # stderr fully drained: the exit can come before the last stderr bytes are read
    assert b"RemoteProtocolError" in c.stderr and b"end " in c.stderr


# ---------------------------------------------------------------------------
# stdout guard
# ---------------------------------------------------------------------------


def test_print_becomes_log_and_fd1_goes_to_stderr(started, tmp_path):
    path = script(
        tmp_path,
        "printer.py",
        """
        import os, subprocess, sys
        from multilang import Bolt

        class B(Bolt):
            def process(self, tup):
                print("x")
                print("a", "b\\nc")
                print("partial", end="")
                sys.stdout.flush()
                os.write(1, b"raw fd1 write\\n")
                subprocess.run([sys.executable, "-c", "print('child process output')"], check=True)
                print("to stderr", file=sys.stderr)
                self.ack(tup)

        B().run()
        """,
    )
    c = started([PY, str(path)])
    c.send(tup("1", []))
    assert c.read_n(4) == [
        {"command": "log", "msg": "x", "level": 2},
        # one print is one log frame, newlines inside it included
        # (spec/CONFORMANCE.md "print"); the final newline is dropped
        {"command": "log", "msg": "a b\nc", "level": 2},
        {"command": "log", "msg": "partial", "level": 2},
        {"command": "ack", "id": "1"},
    ]
    c.expect_silence(0.2)
    for text in (b"raw fd1 write", b"child process output", b"to stderr"):
        c.wait_stderr(text)
    assert b"raw fd1" not in c.stdout and b"child" not in c.stdout


def test_a_print_at_import_time_comes_after_the_pid_reply_as_log_frames(started, tmp_path):
    # Storm's host reads the pid reply first and gives up on anything else
    # (§2.3): what a script prints after `import multilang` and before run()
    # is held and logged after the reply, as the Ruby and Node libraries do.
    path = script(
        tmp_path,
        "early.py",
        """
        from multilang import BasicBolt
        print("loading the model")
        print("a", "b")

        class B(BasicBolt):
            def process(self, tup):
                self.emit(tup.values)

        print("ready", end="")
        B().run()
        """,
    )
    c = started([PY, str(path)])  # the handshake check: the pid reply is the very first line on stdout
    assert c.read_n(3) == [{"command": "log", "msg": "loading the model", "level": 2},
                           {"command": "log", "msg": "a b", "level": 2},
                           {"command": "log", "msg": "ready", "level": 2}]
    c.send(tup("1", ["x"]))
    assert c.read_n(2) == [emit(["x"], anchors=["1"]), {"command": "ack", "id": "1"}]


def test_stdin_eof_exits_zero_promptly(started):
    for mode in ("bolt", "basic", "spout"):
        c = conformance(started, mode)
        if mode == "spout":
            c.read()  # the open emit
            c.send(cmd("activate"))
            c.read_n(2)
        else:
            c.send(tup("1", ["echo", "last"]))
            assert c.read_n(2) == [emit(["echo", "last"], ["1"]), {"command": "ack", "id": "1"}]
        c.close_stdin()
        assert c.wait(timeout=30) == 0  # it exits at EOF; one that waits on hangs here
        c.read_eof()


def test_stdin_eof_before_handshake_and_while_awaiting_task_ids(started):
    c = started([PY, str(CONFORMANCE), "bolt"], handshake=False)
    c.close_stdin()
    assert c.wait(timeout=2) == 0
    assert c.stdout == b""
    c = conformance(started)
    c.send(tup("1", ["emit", ["v"], None]))
    c.read()
    c.close_stdin()
    assert c.wait(timeout=2) == 0


def test_stdin_eof_after_burst_delivers_all_output(started):
    c = conformance(started)
    n = 2000
    c.write(b"".join(json.dumps(tup(str(i), ["echo", "v" * 50])).encode() + b"\nend\n" for i in range(n)))
    c.close_stdin()
    assert c.wait(timeout=5) == 0
    frames = c.read_n(2 * n)
    assert [f["id"] for f in frames[1::2]] == [str(i) for i in range(n)]


_GATE_BOLT = f"""
import os, sys, time
from multilang import Bolt

class Gate(Bolt):
    # argv: the go file; which tuple waits for it (16: the second half's
    # first); how long tuple 0 takes (seconds, 0 by default)
    def process(self, tup):
        gate = int(sys.argv[2]) if len(sys.argv) > 2 else 16
        if tup.values[0] == 0 and len(sys.argv) > 3:
            time.sleep(float(sys.argv[3]))
        if tup.values[0] == gate:  # wait for the host (at most GATE_SECS)
            deadline = time.monotonic() + {GATE_SECS}
            while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
                time.sleep(0.01)
        self.emit([tup.values[0]], anchors=[tup])
        self.ack(tup)

Gate().run()
"""


def test_a_burst_is_answered_halfway_so_a_windowed_host_can_refill(started, tmp_path):
    """A host that keeps at most N tuples unacked (Storm's max pending, §5.3)
    writes N and waits. The bolt answers the first half of such a burst
    before it works on the second half: here the second half's first tuple
    waits until the host has seen the first half's acks."""
    go = tmp_path / "go"
    c = started([PY, str(script(tmp_path, "gate.py", _GATE_BOLT)), str(go)])
    check_burst_answered_halfway(c, go)


@pytest.mark.parametrize("frames", [1, 4])
def test_a_burst_of_tuple_batches_is_answered_halfway(started, tmp_path, frames):
    """The same under ``batch`` (§9.5): 32 tuples in one write, as one tuple
    batch or as four. The first 16 are answered (one output batch) before
    the bolt works on the 17th, which waits for the host."""
    go = tmp_path / "go"
    c = started([PY, str(script(tmp_path, "gate.py", _GATE_BOLT)), str(go)], handshake=False)
    c.handshake(offer=["batch"], accept=["batch"])
    ts = [tup(str(i), [i]) for i in range(32)]
    per = 32 // frames
    c.write(b"".join(json.dumps(tuple_batch(*ts[k:k + per])).encode() + b"\nend\n" for k in range(0, 32, per)))
    acked = []
    while len(acked) < 16:  # (before the gate opens: a bolt that held them back would answer after GATE_SECS)
        acked += c.read(timeout=READ_SECS)["acks"]
    go.touch()
    assert acked == [str(i) for i in range(16)], "the first reply holds the first half exactly"
    while len(acked) < 32:
        acked += c.read(timeout=READ_SECS)["acks"]
    assert acked == [str(i) for i in range(32)]


def test_a_slow_bolt_answers_each_tuple_within_the_flush_interval(started, tmp_path):
    """Output waits for the end of a burst only while the bolt is quick:
    once 100 ms have passed it is flushed after the tuple at hand, so the
    host hears from a slow bolt at least once per tuple (its subprocess
    timeout counts from the last frame read, §5.2). Four tuples arrive in
    one write; tuple 0 takes 300 ms and tuple 1 waits until the host has
    seen tuple 0's ack."""
    go = tmp_path / "go"
    c = started([PY, str(script(tmp_path, "gate.py", _GATE_BOLT)), str(go), "1", "0.3"])
    c.write(b"".join(json.dumps(tup(str(i), [i])).encode() + b"\nend\n" for i in range(4)))
    first = c.read_n(2, timeout=READ_SECS)  # (before the gate opens: held back, it would come after GATE_SECS)
    go.touch()
    assert first == [emit([0], ["0"]), {"command": "ack", "id": "0"}]
    rest = c.read_n(6, timeout=READ_SECS)
    assert [f["id"] for f in rest if f["command"] == "ack"] == ["1", "2", "3"]


def test_run_in_process_stops_its_flush_clock(tmp_path):
    """A bolt's flush clock is a daemon thread; ``run()`` stops it when the
    host closes stdin, so a bolt run in-process (with given fds) leaves no
    thread behind."""
    class Echo(Bolt):
        def process(self, t):
            self.emit(t.values, anchors=[t])
            self.ack(t)

    (tmp_path / "pids").mkdir()
    hs = {"pidDir": str(tmp_path / "pids"), "conf": {}, "context": {"taskid": 3, "task->component": {"3": "bolt"}}}
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(in_w, encode_frame(hs) + encode_frame(tup("1", ["a"])))
    os.close(in_w)
    before = set(threading.enumerate())
    try:
        Echo().run(stdin_fd=in_r, stdout_fd=out_w)
    finally:
        os.close(in_r)
        os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        out = f.read()
    assert out.count(b"\nend\n") == 3 and b'"ack","id":"1"' in out  # pid, emit, ack
    clocks = [t for t in set(threading.enumerate()) - before if t.name == "multilang-flush-clock"]
    for t in clocks:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in clocks), "the flush clock outlived run()"


_PARTS_BOLT = """
import gc, sys
from multilang import Bolt

class Parts(Bolt):
    def initialize(self, conf, context):
        self.sizes, self.collections = [], 0
        gc.callbacks.append(self.count)
        gc.collect()

    def count(self, phase, info):
        self.collections += phase == "start"

    def process_batch(self, tuples):
        if tuples.values[-1] == ["report"]:
            self.log(f"{len(self.sizes)} {max(self.sizes)} {sum(self.sizes)} {self.collections}")
            self.ack_many(tuples.ids)
            return
        self.sizes.append(len(tuples))
        if sys.argv[1] == "batch":
            self.emit_many(tuples.values, anchors=tuples.ids)
            self.ack_many(tuples.ids)
        else:
            for tup in tuples:
                self.process(tup)

    def process(self, tup):
        self.emit(tup.values, anchors=[tup])
        self.ack(tup)

Parts().run()
"""


@pytest.mark.parametrize("api", ["batch", "per-tuple"])
def test_a_long_burst_is_handled_in_parts_before_the_collector_runs(started, tmp_path, api):
    """A burst of 10,000 tuples read in one go is decoded and handled in
    parts of at most 64, so the tuples of a part are gone before the next
    is decoded. CPython's cyclic collector, which starts after 700 new
    container objects, then has nothing to do: before, it walked the young
    tuples of the burst over and over (a quarter of a batch-level bolt's
    time, bench/). Every tuple still comes out once, in order."""
    c = started([PY, str(script(tmp_path, "parts.py", _PARTS_BOLT)), api])
    n = 10_000
    c.write(b"".join(json.dumps(tup(str(i), [i, "v" * 20])).encode() + b"\nend\n" for i in range(n)))
    frames = c.read_n(2 * n, timeout=30)
    assert [f["id"] for f in frames if f["command"] == "ack"] == [str(i) for i in range(n)]
    assert [f["tuple"][0] for f in frames if f["command"] == "emit"] == list(range(n))
    c.send(tup("r", ["report"]))
    log, ack = c.read_n(2)
    assert ack == {"command": "ack", "id": "r"}
    calls, biggest, total, collections = map(int, log["msg"].split())
    assert total == n and biggest <= 64 and calls >= n // 64
    assert collections <= 1, f"the collector ran {collections} times during the burst"


# ---------------------------------------------------------------------------
# Exceptions
# ---------------------------------------------------------------------------


def test_basic_bolt_exception_error_fail_and_keeps_running(started):
    c = conformance(started, "basic")
    c.send(tup("1", ["echo", "a"]))
    assert c.read_n(2) == [emit(["echo", "a"], ["1"]), {"command": "ack", "id": "1"}]
    c.send(tup("2", ["raise", "kaboom-42"]))
    err = c.read()
    assert err["command"] == "error" and "kaboom-42" in err["msg"] and "Traceback" in err["msg"]
    assert c.read() == {"command": "fail", "id": "2"}
    c.send(tup("3", ["other"]))
    assert c.read() == {"command": "ack", "id": "3"}
    assert c.proc.poll() is None


@pytest.mark.parametrize("size", [3, 40])  # flushed before the next read / closed after a long part
def test_under_batch_an_emit_no_frame_can_carry_is_an_error_naming_its_tuple(started, tmp_path, size):
    """Under ``batch`` (§9.5) an emit is encoded when its output batch closes,
    after ``process`` returned: a value that is not JSON (a set) must still
    reach the host as an error naming the tuple it was anchored to, and end
    the bolt as a raising ``process`` does, not crash it with no word."""
    path = script(
        tmp_path,
        "unencodable.py",
        """
        from multilang import Bolt

        class B(Bolt):
            def process(self, tup):
                self.emit([{1, 2}] if tup.values == ["bad"] else tup.values, anchors=[tup])
                self.ack(tup)

        B().run()
        """,
    )
    c = started([PY, str(path)], handshake=False)
    c.handshake(offer=["batch"], accept=["batch"])
    ts = [tup(f"t{i}", ["bad" if i == 1 else i]) for i in range(size)]
    c.send(tuple_batch(*ts))
    err = c.read()
    assert err["command"] == "error", err
    assert "B: an emit anchored to tuple(s) t1 holds a value no frame can carry" in err["msg"], err
    assert "set" in err["msg"], err
    c.read_eof()
    assert c.wait() == 1


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("value", ["math.nan", "math.inf", "{'x': [-math.inf]}"])
def test_nan_and_infinity_are_refused_not_sent_as_null(started, tmp_path, batch, value):
    """orjson writes a float NaN or infinity as null: the emit would change
    meaning on the way. It is refused as a value no frame can carry: in
    process() (standard), or at the batch's flush naming the emit (batch)."""
    path = script(
        tmp_path,
        "nan.py",
        f"""
        import math
        from multilang import Bolt

        class B(Bolt):
            def process(self, tup):
                self.emit([{value}], anchors=[tup])
                self.ack(tup)

        B().run()
        """,
    )
    c = started([PY, str(path)], handshake=False)
    c.handshake(offer=["batch"] if batch else None, accept=["batch"] if batch else ())
    c.send(tuple_batch(tup("t1", [1])) if batch else tup("t1", [1]))
    err = c.read()
    assert err["command"] == "error" and "is not a JSON number (it would be written as null)" in err["msg"], err
    assert ("an emit anchored to tuple(s) t1" if batch else "B.process failed on tuple t1") in err["msg"], err
    c.read_eof()
    assert c.wait() == 1


def test_plain_bolt_exception_error_then_nonzero_exit(started, tmp_path):
    path = script(
        tmp_path,
        "crash.py",
        """
        from multilang import Bolt

        class B(Bolt):
            def process(self, tup):
                self.emit(["before"], anchors=[tup])
                raise ValueError("boom-7")

        B().run()
        """,
    )
    c = started([PY, str(path)])
    c.send(tup("1", []))
    assert c.read() == emit(["before"], ["1"])
    err = c.read()
    assert err["command"] == "error" and "boom-7" in err["msg"] and "ValueError" in err["msg"]
    c.read_eof()
    assert c.wait() != 0
    c.wait_closed(5)
    assert b"boom-7" in c.stderr


# ---------------------------------------------------------------------------
# Spouts
# ---------------------------------------------------------------------------

SPOUT_IDS = [0, "1", -2, "-3", 4.5, {"k": [5]}, None]


def test_conformance_spout(started):
    c = conformance(started, "spout")
    # emitted during open, before any command
    assert c.read_raw() == b'{"command":"emit","tuple":["open"],"id":"open","need_task_ids":false}'
    c.send(cmd("activate"))
    assert c.read_n(2) == [emit(["activated"]), {"command": "sync"}]
    for k, mid in enumerate(SPOUT_IDS):
        c.send(cmd("next"))
        e = c.read()
        assert e["tuple"] == ["next", k]
        assert e.get("need_task_ids", True) is True
        if mid is None:
            assert e.get("id") is None
        else:
            assert e["id"] == mid and type(e["id"]) is type(mid)
        c.send([k, 100])
        assert c.read_n(2) == [emit(["task_ids", [k, 100]]), {"command": "sync"}]
    c.send(cmd("next"))
    assert c.read() == {"command": "sync"}
    for mid in SPOUT_IDS[:-1]:
        for command, word in (("ack", "acked"), ("fail", "failed")):
            c.send(cmd(command, mid))
            e = c.read()
            assert e == emit([word, mid]) and type(e["tuple"][1]) is type(mid)
            assert c.read() == {"command": "sync"}
    # integer, float and string ids keep their exact JSON spelling
    c.write(b'{"command":"ack","id":0}\nend\n{"command":"fail","id":"0"}\nend\n{"command":"ack","id":4.5}\nend\n')
    assert [c.read_raw() for _ in range(6)] == [
        b'{"command":"emit","tuple":["acked",0],"need_task_ids":false}',
        b'{"command":"sync"}',
        b'{"command":"emit","tuple":["failed","0"],"need_task_ids":false}',
        b'{"command":"sync"}',
        b'{"command":"emit","tuple":["acked",4.5],"need_task_ids":false}',
        b'{"command":"sync"}',
    ]
    c.send(cmd("deactivate"))
    assert c.read_n(2) == [emit(["deactivated"]), {"command": "sync"}]
    c.send(cmd("frobnicate"))
    log = c.read()
    assert log["command"] == "log" and "frobnicate" in log["msg"]
    assert c.read() == {"command": "sync"}
    c.expect_silence(0.2)


def test_spout_defaults_one_sync_per_command(started, tmp_path):
    path = script(tmp_path, "bare_spout.py", "from multilang import Spout\nSpout().run()\n")
    c = started([PY, str(path)])
    for command, mid in [("activate", ""), ("next", ""), ("ack", 3), ("fail", "x"), ("deactivate", ""), ("rewind", "")]:
        c.send(cmd(command, mid))
        frames = [c.read()]
        while frames[-1] != {"command": "sync"}:
            frames.append(c.read())
        assert frames.count({"command": "sync"}) == 1
        assert all(f["command"] == "log" for f in frames[:-1])
    # commands coalesced into one write: still exactly one sync each
    c.write(b"".join(json.dumps(cmd(x)).encode() + b"\nend\n" for x in ["next", "next", "what", "next"]))
    frames = c.read_n(5)
    assert [f["command"] for f in frames].count("sync") == 4
    c.expect_silence(0.2)


def test_spout_hook_exception_error_sync_then_exit(started, tmp_path):
    path = script(
        tmp_path,
        "bad_spout.py",
        """
        from multilang import Spout

        class S(Spout):
            def next_tuple(self):
                raise RuntimeError("spout-broke")

        S().run()
        """,
    )
    c = started([PY, str(path)])
    c.send(cmd("activate"))
    assert c.read() == {"command": "sync"}
    c.send(cmd("next"))
    err = c.read()
    assert err["command"] == "error" and "spout-broke" in err["msg"]
    assert c.read() == {"command": "sync"}
    c.read_eof()
    assert c.wait() != 0


# ---------------------------------------------------------------------------
# Word-count examples
# ---------------------------------------------------------------------------


def test_sentence_spout_replays_failed_ids(started, tmp_path):
    (tmp_path / "sentences.txt").write_text("the cow\n\n  over the moon  \n\u00fcber \U0001F600\n", encoding="utf-8")
    c = started([PY, str(PY_DIR / "sentence_spout.py"), "sentences.txt"], cwd=tmp_path)
    c.send(cmd("activate"))
    assert c.read() == {"command": "sync"}

    def next_():
        c.send(cmd("next"))
        frames = c.read_n(1)
        while frames[-1] != {"command": "sync"}:
            frames.append(c.read())
        return frames[:-1]

    assert next_() == [emit(["the cow"], id=0)]
    assert next_() == [emit(["over the moon"], id=2)]  # blank line 1 skipped
    assert next_() == [emit(["\u00fcber \U0001F600"], id=3)]
    assert next_() == []
    c.send(cmd("fail", 0))
    assert c.read() == {"command": "sync"}
    c.send(cmd("fail", 99))  # unknown: ignored
    assert c.read() == {"command": "sync"}
    assert next_() == [emit(["the cow"], id=0)]  # replayed
    for mid in (2, 3, 0):
        c.send(cmd("ack", mid))
        assert c.read() == {"command": "sync"}
    c.send(cmd("fail", 2))  # already acked: not replayed
    assert c.read() == {"command": "sync"}
    assert next_() == []


def read_until_ack(c, tid):
    frames = []
    while True:
        f = c.read()
        if f == {"command": "ack", "id": tid}:
            return frames
        frames.append(f)


def test_split_bolt_exact_rule(started):
    # split on ASCII whitespace only; strip ASCII punctuation from both ends;
    # lowercase A-Z only; drop empty tokens.
    c = started([PY, str(PY_DIR / "split_bolt.py")])
    sentence = "Hello, WORLD!  it's--\u00fcber  'quoted' \u00dcBER\u00a0Stra\u00dfe --- \t(x)\n\u00c9t\u00c9 x_y "
    c.send(tup("1", [sentence]))
    frames = read_until_ack(c, "1")
    assert all(f == emit(f["tuple"], ["1"]) for f in frames)
    assert [f["tuple"] for f in frames] == [
        ["hello"],
        ["world"],
        ["it's--\u00fcber"],
        ["quoted"],
        ["\u00dcber\u00a0stra\u00dfe"],
        ["x"],
        ["\u00c9t\u00c9"],
        ["x_y"],
    ]
    c.send(tup("2", [" ... !? "]))
    assert read_until_ack(c, "2") == []
    c.send(tick("t"))
    assert c.read() == {"command": "ack", "id": "t"}


def test_count_bolt(started):
    c = started([PY, str(PY_DIR / "count_bolt.py")])
    for i, word in enumerate(["a", "b", "a", "\u00fcber", "a"]):
        c.send(tup(str(i), [word], comp="split"))
    assert c.read_n(10) == [
        emit(["a", 1], ["0"]),
        {"command": "ack", "id": "0"},
        emit(["b", 1], ["1"]),
        {"command": "ack", "id": "1"},
        emit(["a", 2], ["2"]),
        {"command": "ack", "id": "2"},
        emit(["\u00fcber", 1], ["3"]),
        {"command": "ack", "id": "3"},
        emit(["a", 3], ["4"]),
        {"command": "ack", "id": "4"},
    ]
