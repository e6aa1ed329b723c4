"""The msgpack extension (spec §9.6) in the Node.js library (examples/node/multilang.js).

Real `node` processes are started with multilang.testing.ComponentProcess,
which does the JSON handshake and checks the JSON pid reply; after that the
tests write length-prefixed MessagePack frames built with Python's `msgpack`
package and decode the replies with a small reader of their own (4-byte
big-endian length, then one object). Every read has a deadline, so a broken
component fails a test instead of hanging it; the fixture kills whatever is
still running.
"""

import json
import shutil
import struct
import time
from functools import partial
from pathlib import Path

import msgpack
import pytest

from multilang.testing import (
    ComponentProcesses,
    command_frame as cmd,
    heartbeat_frame as heartbeat,
    same_json,
    tick_frame as tick,
    tuple_batch as tuples,
    tuple_frame as tup,
)

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "examples" / "node"
LIB = NODE_DIR / "multilang.js"
CONFORMANCE = NODE_DIR / "conformance_component.js"
NODE_ECHO = ROOT / "bench" / "components" / "node_echo.js"
NODE = shutil.which("node")
CONF = {"topology.name": "t"}
MP = ["msgpack"]  # offers (the handshake's "extensions", spec §9.1)
BOTH = ["batch", "msgpack"]
TIMEOUT = 5.0

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def pack(obj, **kw):
    return msgpack.packb(obj, use_bin_type=True, **kw)


def frame(body):
    """A msgpack frame: 4-byte big-endian length, then the body (bytes or an object)."""
    if not isinstance(body, (bytes, bytearray)):
        body = pack(body)
    return struct.pack(">I", len(body)) + bytes(body)


class MsgpackHost:
    """The host side after a msgpack switch-over, on top of a ComponentProcess
    (which owns the process, its pipes and the JSON handshake)."""

    def __init__(self, proc):
        self.c = proc
        self.proc = proc.proc
        self.pos = None  # where the next msgpack frame starts in c.stdout

    # -- handshake ------------------------------------------------------------

    def handshake(self, offer, accept, conf=None):
        self.c.handshake({**CONF, **(conf or {})}, offer=offer, accept=accept)
        self.pos = bytes(self.c.stdout).index(b"\nend\n") + 5  # just past the JSON pid reply
        return self

    # -- writing --------------------------------------------------------------

    def write(self, data):
        self.c.write(data)

    def send(self, obj):
        self.c.write(frame(obj))

    # -- reading --------------------------------------------------------------

    def _wait_for(self, n, timeout):
        """Wait until stdout holds n bytes past self.pos; False at EOF."""
        deadline = time.monotonic() + (TIMEOUT if timeout is None else timeout)
        while len(self.c.stdout) - self.pos < n:
            if self.proc.poll() is not None and self.c.wait_closed(0) and len(self.c.stdout) - self.pos < n:
                return False  # exited and every byte of its stdout is in
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no complete msgpack frame within the deadline; unread "
                    f"{bytes(self.c.stdout[self.pos:self.pos + 200])!r}; stderr:\n{self.c.stderr_text(2000)}")
            time.sleep(0.002)
        return True

    def read_raw(self, timeout=None):
        """The next frame's body (bytes)."""
        assert self._wait_for(4, timeout), f"stdout closed; stderr:\n{self.c.stderr_text(2000)}"
        (n,) = struct.unpack(">I", self.c.stdout[self.pos:self.pos + 4])
        assert 0 < n < 64 << 20, f"bad frame length {n}"
        assert self._wait_for(4 + n, timeout), "stdout closed inside a frame"
        body = bytes(self.c.stdout[self.pos + 4:self.pos + 4 + n])
        self.pos += 4 + n
        return body

    def read(self, timeout=None):
        body = self.read_raw(timeout)
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)  # exactly one object, str keys
        assert isinstance(obj, (dict, list)), obj
        return obj

    def read_n(self, n, timeout=None):
        return [self.read(timeout) for _ in range(n)]

    def expect_silence(self, seconds=0.2):
        time.sleep(seconds)
        assert len(self.c.stdout) == self.pos, f"unexpected output {bytes(self.c.stdout[self.pos:])[:200]!r}"
        assert self.proc.poll() is None, f"exited {self.proc.returncode}; stderr:\n{self.c.stderr_text(2000)}"

    def wait(self, timeout=TIMEOUT):
        return self.c.wait(timeout)


@pytest.fixture
def start(tmp_path):
    """start(argv, offer=MP, accept=("msgpack",), conf=None, cwd=ROOT) -> MsgpackHost after the handshake."""
    with ComponentProcesses(cwd=ROOT, pid_dir=tmp_path / "pids", conf=CONF) as procs:
        def _start(argv, offer=MP, accept=("msgpack",), handshake=True, conf=None, **kw):
            h = MsgpackHost(procs.start([str(a) for a in argv], **kw))
            return h.handshake(offer, accept, conf) if handshake else h
        yield _start


def conformance(start, mode="bolt", offer=MP, accept=("msgpack",)):
    h = start([NODE, CONFORMANCE, mode], offer=offer, accept=accept)
    assert h.read() == {"command": "log", "msg": f"multilang-conformance ready mode={mode} lang=node", "level": 2}
    return h


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(f"const ml = require({json.dumps(str(LIB))});\n{body}\n")
    return path


def handshake_bytes(tmp_path, offer, terminator=b"\nend\n"):
    pid_dir = tmp_path / "raw-pids"
    pid_dir.mkdir(exist_ok=True)
    hs = {"pidDir": str(pid_dir), "conf": CONF, "context": {"taskid": 2}, "extensions": offer}
    return json.dumps(hs).encode() + terminator


def wait_pid_reply(h, accept):
    """For raw-written handshakes: wait for the JSON pid reply, check it, set h.pos."""
    deadline = time.monotonic() + TIMEOUT
    while b"\nend\n" not in h.c.stdout:
        assert time.monotonic() < deadline, f"no pid reply; stderr:\n{h.c.stderr_text(2000)}"
        time.sleep(0.002)
    first, _ = bytes(h.c.stdout).split(b"\nend\n", 1)
    assert same_json(json.loads(first), {"pid": h.proc.pid, "extensions": list(accept)})
    h.pos = len(first) + 5


# ---------------------------------------------------------------------------
# Negotiation
# ---------------------------------------------------------------------------


def test_spec_example_bytes_and_switch_over(start):
    h = conformance(start)
    h.send(tup("17", ["ack"]))
    at = h.pos
    h.read_raw()
    # spec §9.6 example: {"command":"ack","id":"17"} is these 23 bytes
    assert bytes(h.c.stdout[at:h.pos]) == bytes.fromhex("00000013") + b'\x82\xa7command\xa3ack\xa2id\xa217'
    h.expect_silence()


@pytest.mark.parametrize("offer, accept", [
    (None, ()),
    ([], ()),
    (["batch"], ("batch",)),
])
def test_not_offered_stays_json(start, offer, accept):
    h = start([NODE, CONFORMANCE, "bolt"], offer=offer, accept=accept)
    c = h.c
    assert c.read() == {"command": "log", "msg": "multilang-conformance ready mode=bolt lang=node", "level": 2}
    c.send(tup("1", ["echo", "\u00e9"]))
    c.send(heartbeat())
    if accept:
        assert c.read_n(2) == [{"command": "batch", "emits": [[["echo", "\u00e9"], ["1"]]], "acks": ["1"]},
                               {"command": "sync"}]
    else:
        assert c.read_raw() == '{"command":"emit","tuple":["echo","\u00e9"],"anchors":["1"],"need_task_ids":false}'.encode()
        assert c.read_n(2) == [{"command": "ack", "id": "1"}, {"command": "sync"}]
    c.expect_silence(0.2)


@pytest.mark.parametrize("how", ["static", "instance"])
def test_opt_out_keeps_batch_only(start, tmp_path, how):
    body = {
        "static": "class B extends ml.BasicBolt { static extensions = ['batch']; process(t) { this.emit([t.values[0]]); } }\n"
                  "new B().run();",
        "instance": "class B extends ml.BasicBolt { process(t) { this.emit([t.values[0]]); } }\n"
                    "const b = new B(); b.extensions = ['batch']; b.run();",
    }[how]
    path = script(tmp_path, f"optout_{how}.js", body)
    h = start([NODE, path], offer=BOTH, accept=("batch",))
    h.c.send(tup("1", ["a"]))
    assert h.c.read() == {"command": "batch", "emits": [[["a"], ["1"]]], "acks": ["1"]}
    # and with nothing accepted, the standard protocol
    path2 = script(tmp_path, "none.js", "class B extends ml.Bolt { static extensions = []; process(t) { this.ack(t); } }\n"
                                        "new B().run();")
    h2 = start([NODE, path2], offer=BOTH, accept=())
    h2.c.send(tup("1", ["a"]))
    assert h2.c.read_raw() == b'{"command":"ack","id":"1"}'


def test_early_frames_reencoded_after_pid_reply(start, tmp_path):
    # Printed at require time and in initialize: kept until the pid reply,
    # which stays JSON; then they come out as msgpack frames.
    path = script(
        tmp_path,
        "noisy.js",
        "console.log('top level \\u00e9');\n"
        "class B extends ml.Bolt { initialize(conf, ctx) {"
        " console.log(JSON.stringify([conf['topology.name'], Object.keys(conf).length])); } }\n"
        "new B().run();",
    )
    h = start([NODE, path])
    assert bytes(h.c.stdout).startswith(b'{"pid":')
    assert h.read_n(2) == [{"command": "log", "msg": "top level \u00e9"},
                           {"command": "log", "msg": '["t",1]'}]


# ---------------------------------------------------------------------------
# Bolts
# ---------------------------------------------------------------------------


def test_bolt_echo_ids_exact(start):
    h = conformance(start)
    for tid in ["-9223372036854775808", "0012", "42", "9223372036854775807", "1e3", "\u00e9\U0001F600"]:
        h.send(tup(tid, ["echo", tid]))
        assert h.read_n(2) == [
            {"command": "emit", "tuple": ["echo", tid], "anchors": [tid], "need_task_ids": False},
            {"command": "ack", "id": tid},
        ]
        h.send(tup(tid, ["fail"]))
        assert h.read() == {"command": "fail", "id": tid}
    h.expect_silence()


def test_node_echo_bench_component(start):
    h = start([NODE, NODE_ECHO])
    n = 1000
    h.write(b"".join(frame(tup(str(i), ["word", i])) for i in range(n)))  # one write
    frames = h.read_n(2 * n)
    assert frames[0::2] == [{"command": "emit", "tuple": ["word", i], "anchors": [str(i)], "need_task_ids": False}
                            for i in range(n)]
    assert frames[1::2] == [{"command": "ack", "id": str(i)} for i in range(n)]
    h.c.close_stdin()
    assert h.wait() == 0


def test_heartbeat_sync_and_ticks(start):
    h = conformance(start)
    h.send(heartbeat("-1"))
    assert h.read() == {"command": "sync"}
    h.send(tick("-3", 10))
    assert h.read_n(2) == [
        {"command": "emit", "tuple": ["tick", 10], "anchors": ["-3"], "need_task_ids": False},
        {"command": "ack", "id": "-3"},
    ]
    b = conformance(start, "basic")
    b.send(tick("t"))
    assert b.read_n(2) == [
        {"command": "emit", "tuple": ["tick", 5], "anchors": ["t"], "need_task_ids": False},
        {"command": "ack", "id": "t"},
    ]
    b.send(heartbeat())
    assert b.read() == {"command": "sync"}
    h.expect_silence()


def test_task_ids_list_and_queueing(start):
    h = conformance(start)
    h.send(tup("-7", ["emit", ["x"], "s2"]))
    assert h.read() == {"command": "emit", "tuple": ["x"], "stream": "s2", "anchors": ["-7"]}
    h.send(heartbeat())
    h.send(tup("8", ["echo", "y"]))
    h.expect_silence(0.2)
    h.send([4, 5])  # a task-id list: a msgpack array
    assert h.read_n(5) == [
        {"command": "emit", "tuple": ["task_ids", [4, 5]], "anchors": ["-7"], "need_task_ids": False},
        {"command": "ack", "id": "-7"},
        {"command": "sync"},
        {"command": "emit", "tuple": ["echo", "y"], "anchors": ["8"], "need_task_ids": False},
        {"command": "ack", "id": "8"},
    ]
    # task ids in a non-shortest int form are still ints
    h.send(tup("9", ["emit", ["z"], None]))
    h.read()
    h.write(frame(b"\x92\xcf" + (3).to_bytes(8, "big") + b"\xd3" + (-1).to_bytes(8, "big", signed=True)))
    assert h.read_n(2) == [
        {"command": "emit", "tuple": ["task_ids", [3, -1]], "anchors": ["9"], "need_task_ids": False},
        {"command": "ack", "id": "9"},
    ]


def test_other_commands(start):
    h = conformance(start)
    h.send(tup("7", ["log", "hello", 3]))
    assert h.read_n(2) == [{"command": "log", "msg": "hello", "level": 3}, {"command": "ack", "id": "7"}]
    h.send(tup("8", ["error", "oops"]))
    assert h.read_n(2) == [{"command": "error", "msg": "oops"}, {"command": "ack", "id": "8"}]
    h.send(tup("9", ["metrics", "m", {"a": [1, 2.5, None]}]))
    assert h.read_n(2) == [{"command": "metrics", "name": "m", "params": {"a": [1, 2.5, None]}},
                           {"command": "ack", "id": "9"}]
    h.send(tup("10", ["print", "printed %s"]))
    assert h.read_n(2) == [{"command": "log", "msg": "printed %s"}, {"command": "ack", "id": "10"}]
    h.send(tup("11", ["emit_direct", 7, ["d"]]))
    assert h.read_n(2) == [{"command": "emit", "tuple": ["d"], "anchors": ["11"], "task": 7, "need_task_ids": False},
                           {"command": "ack", "id": "11"}]
    b = conformance(start, "basic")
    b.send(tup("2", ["raise", "kaboom-42"]))
    err = b.read()
    assert err["command"] == "error" and "kaboom-42" in err["msg"]
    assert b.read() == {"command": "fail", "id": "2"}
    h.send(tup("12", ["exit", 3]))
    assert h.wait() == 3


def test_values_round_trip(start):
    h = conformance(start)
    text = "a/b \u00e9 \U0001F600 \u4e2d \u2028 end \x00"
    values = [
        "echo", text, "x" * 31, "y" * 32, "z" * 300, "\u00e9" * 40000,
        1.5, -0.25, 1e300, 5e-324, 0.1, True, False, None,
        0, 127, 128, -32, -33, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
        2**53 - 1, -(2**53 - 1), 2**53, -(2**63), 2**63, 2**64 - 2048,
        [], {}, {"k": [1, {"x": None, "": "empty key"}], "__proto__": 1, "\u00e9": [[]]},
    ]
    h.send(tup("1", values))
    emit = h.read()
    assert same_json(emit["tuple"], values), emit["tuple"]
    assert h.read() == {"command": "ack", "id": "1"}


def test_int_forms_and_floats_in(start):
    h = conformance(start)
    # a uint64-encoded 5, an int32-encoded -1, a float32 1.5, a str32 "s" and
    # an array16 / map32 holding them: read as the same values ...
    body = (b"\x85\xa2id\xa11\xa4comp\xa1s\xa6stream\xa7default\xa4task\x01\xa5tuple"
            b"\xdc\x00\x06\xa4echo\xcf" + (5).to_bytes(8, "big") + b"\xd2\xff\xff\xff\xff"
            b"\xca" + struct.pack(">f", 1.5) + b"\xdb\x00\x00\x00\x01s"
            b"\xdf\x00\x00\x00\x01\xa1k\xd0\x80")
    h.write(frame(body))
    raw = h.read_raw()
    # ... and written back in the shortest forms, 1.5 as float 64
    assert raw == (b"\x84\xa7command\xa4emit\xa5tuple\x96\xa4echo\x05\xff\xcb" + struct.pack(">d", 1.5) +
                   b"\xa1s\x81\xa1k\xd0\x80\xa7anchors\x91\xa11\xadneed_task_ids\xc2")
    assert h.read() == {"command": "ack", "id": "1"}


def test_integers_beyond_2_53_as_json_parse(start):
    # Documented: like JSON.parse, a 64-bit integer becomes the nearest double.
    h = conformance(start)
    h.send(tup("1", ["echo", 2**63 - 1, -(2**63) + 1, 2**53 + 1]))
    assert h.read()["tuple"] == ["echo", 2**63, -(2**63), 2**53]
    h.read()


# ---------------------------------------------------------------------------
# batch + msgpack
# ---------------------------------------------------------------------------


def test_batch_and_msgpack(start):
    h = conformance(start, offer=BOTH, accept=("batch", "msgpack"))
    h.send(tuples(tup("1", ["echo", "a"]), tup("2", ["fail"]), tick("3"), tup("-4", ["hold"]),
                  tup("0005", ["release", ["r"]]), tup("6", ["emit_unanchored", ["u", None, 2.5]])))
    assert h.read() == {
        "command": "batch",
        "emits": [[["echo", "a"], ["1"]], [["tick", 5], ["3"]], [["r"], ["-4", "0005"]], [["u", None, 2.5]]],
        "acks": ["1", "3", "-4", "0005", "6"], "fails": ["2"],
    }
    # a standard frame closes the batch first; heartbeats stay standard frames
    h.send(tuples(tup("7", ["echo", "b"]), tup("8", ["emit", ["x"], "words"])))
    assert h.read_n(2) == [
        {"command": "batch", "emits": [[["echo", "b"], ["7"]]], "acks": ["7"]},
        {"command": "emit", "tuple": ["x"], "stream": "words", "anchors": ["8"]},
    ]
    h.send(heartbeat())
    h.send(tuples(tup("9", ["echo", "q"])))
    h.expect_silence(0.2)
    h.send([4, 5])
    assert h.read_n(3) == [
        {"command": "batch", "emits": [[["task_ids", [4, 5]], ["8"]]], "acks": ["8"]},
        {"command": "sync"},
        {"command": "batch", "emits": [[["echo", "q"], ["9"]]], "acks": ["9"]},
    ]
    h.send(tup("10", ["emit_many", 1100]))
    first, second = h.read_n(2)
    assert first == {"command": "batch", "emits": [[["n", i], ["10"]] for i in range(1024)]}
    assert second == {"command": "batch", "emits": [[["n", i], ["10"]] for i in range(1024, 1100)], "acks": ["10"]}
    h.expect_silence()


def test_split_bolt_batch_msgpack(start):
    h = start([NODE, NODE_DIR / "split_bolt.js"], offer=BOTH, accept=("batch", "msgpack"))
    h.send(tuples(tup("1", ["  Hello, World!  \u00c9t\u00e9 (don't)"]), tick("t"), tup("2", [""])))
    assert h.read() == {
        "command": "batch",
        "emits": [[["hello"], ["1"]], [["world"], ["1"]], [["\u00c9t\u00e9"], ["1"]], [["don't"], ["1"]]],
        "acks": ["1", "t", "2"],
    }
    h.expect_silence()


def test_split_bolt_msgpack_only(start):
    h = start([NODE, NODE_DIR / "split_bolt.js"])
    h.send(tup("1", ["the cow \u00e9"]))
    assert h.read_n(4) == [
        {"command": "emit", "tuple": [w], "anchors": ["1"], "need_task_ids": False} for w in ("the", "cow", "\u00e9")
    ] + [{"command": "ack", "id": "1"}]


# ---------------------------------------------------------------------------
# Spouts
# ---------------------------------------------------------------------------


def test_sentence_spout_one_sync_per_command(start, tmp_path):
    (tmp_path / "s.txt").write_text("  first line \n\n s\u00e9cond\t\nthird\n")
    h = start([NODE, NODE_DIR / "sentence_spout.js", "s.txt"], cwd=tmp_path)
    h.send(cmd("activate"))
    assert h.read() == {"command": "sync"}
    emitted = []
    for _ in range(3):
        h.send(cmd("next"))
        emit = h.read()
        assert emit["command"] == "emit" and emit["need_task_ids"] is False
        emitted.append((emit["tuple"], emit["id"]))
        assert h.read() == {"command": "sync"}
    assert emitted == [(["first line"], 0), (["s\u00e9cond"], 2), (["third"], 3)]
    for command, mid in [("next", ""), ("fail", 2), ("ack", 0), ("deactivate", "")]:
        h.send(cmd(command, mid))
        assert h.read() == {"command": "sync"}
    h.send(cmd("next"))
    emit = h.read()
    assert (emit["tuple"], emit["id"]) == (["s\u00e9cond"], 2)
    assert h.read() == {"command": "sync"}
    # several commands in one write: exactly one sync each
    h.write(b"".join(frame(cmd(x)) for x in ["next", "next", "activate", "ack"]))
    assert h.read_n(4) == [{"command": "sync"}] * 4
    h.expect_silence()


def test_conformance_spout(start):
    h = conformance(start, "spout")
    assert h.read() == {"command": "emit", "tuple": ["open"], "id": "open", "need_task_ids": False}
    h.send(cmd("activate"))
    assert h.read_n(2) == [{"command": "emit", "tuple": ["activated"], "need_task_ids": False}, {"command": "sync"}]
    ids = [0, "1", -2, "-3", 4.5, {"k": [5]}, None]
    for k, mid in enumerate(ids):
        h.send(cmd("next"))
        emit = h.read()
        assert emit["tuple"] == ["next", k] and emit.get("need_task_ids", True) is True
        if mid is None:
            assert "id" not in emit
        else:
            assert same_json(emit["id"], mid)
        h.send([k, 100])
        assert h.read_n(2) == [{"command": "emit", "tuple": ["task_ids", [k, 100]], "need_task_ids": False},
                               {"command": "sync"}]
    for mid in ids[:-1]:
        h.send(cmd("ack", mid))
        assert h.read_n(2) == [{"command": "emit", "tuple": ["acked", mid], "need_task_ids": False}, {"command": "sync"}]
        h.send(cmd("fail", mid))
        assert h.read_n(2) == [{"command": "emit", "tuple": ["failed", mid], "need_task_ids": False}, {"command": "sync"}]
    h.send(cmd("frobnicate"))
    frames = h.read_n(2)
    assert frames[0]["command"] == "log" and "frobnicate" in frames[0]["msg"] and frames[1] == {"command": "sync"}
    h.expect_silence()


def test_spout_batch_msgpack(start, tmp_path):
    path = script(
        tmp_path,
        "spout_batch.js",
        "class S extends ml.Spout {\n"
        "  nextTuple() { this.emit(['n', 1], {msgId: 0}); this.emit(['m'], {msgId: 'x', stream: 's'}); this.emit(['u']); }\n"
        "}\nnew S().run();",
    )
    h = start([NODE, path], offer=BOTH, accept=("batch", "msgpack"))
    h.send(cmd("next"))
    assert h.read_n(2) == [{"command": "batch", "emits": [[["n", 1], 0], [["m"], "x", "s"], [["u"]]]},
                           {"command": "sync"}]
    for c in ("ack", "fail", "activate", "deactivate"):
        h.send(cmd(c, 0))
        assert h.read() == {"command": "sync"}
    h.expect_silence()


# ---------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("terminator", [b"\nend\n", b"\r\nend\r\n"])
def test_one_byte_at_a_time_including_handshake(start, tmp_path, terminator):
    h = start([NODE, CONFORMANCE, "bolt"], handshake=False)
    data = handshake_bytes(tmp_path, BOTH, terminator) + b"".join([
        frame(tup("1", ["echo", "\u00e9\U0001F600"])),
        frame(heartbeat()),
        frame(tuples(tup("2", ["echo", 2**40]), tup("3", ["fail"]))),
        frame(tup("4", ["ack"])),
    ])
    for i in range(len(data)):
        h.write(data[i:i + 1])
    wait_pid_reply(h, ("batch", "msgpack"))
    assert h.read_n(3) == [
        {"command": "log", "msg": "multilang-conformance ready mode=bolt lang=node", "level": 2},
        {"command": "batch", "emits": [[["echo", "\u00e9\U0001F600"], ["1"]]], "acks": ["1"]},
        {"command": "sync"},
    ]
    # the rest: batch frames (how many depends on timing), in order
    emits, acks, fails = [], [], []
    while "4" not in acks:
        f = h.read()
        assert f["command"] == "batch", f
        emits += f.get("emits", [])
        acks += f.get("acks", [])
        fails += f.get("fails", [])
    assert (emits, acks, fails) == ([[["echo", 2**40], ["2"]]], ["2", "4"], ["3"])
    h.c.close_stdin()
    assert h.wait() == 0


def test_handshake_and_frames_in_one_write(start, tmp_path):
    # The switch-over happens in the middle of a read: the bytes after the
    # handshake's "end" line are msgpack.
    h = start([NODE, NODE_ECHO], handshake=False)
    n = 300
    h.write(handshake_bytes(tmp_path, MP) + b"".join(frame(tup(str(i), [i, "v" * i])) for i in range(n)))
    wait_pid_reply(h, ("msgpack",))
    frames = h.read_n(2 * n)
    assert [f["tuple"] for f in frames[0::2]] == [[i, "v" * i] for i in range(n)]
    assert [f["id"] for f in frames[1::2]] == [str(i) for i in range(n)]
    h.c.close_stdin()
    assert h.wait() == 0


def test_chunking_at_every_offset_and_big_frame(start):
    h = conformance(start)
    data = b"".join(frame(tup(str(i), ["echo", "x" * i])) for i in range(20))
    for i in range(0, len(data), 7):
        h.write(data[i:i + 7])
        time.sleep(0.001)
    frames = h.read_n(40)
    assert [f["tuple"][1] for f in frames[0::2]] == ["x" * i for i in range(20)]
    big = "x\u00e9" * (512 * 1024)  # > 1.5 MB of UTF-8
    data = frame(tup("big", ["echo", big]))
    for i in range(0, len(data), 100_000):
        h.write(data[i:i + 100_000])
    assert h.read(timeout=10)["tuple"] == ["echo", big]
    assert h.read() == {"command": "ack", "id": "big"}


# ---------------------------------------------------------------------------
# Protocol errors
# ---------------------------------------------------------------------------

GOOD = pack(tup("ok", ["ack"]))


@pytest.mark.parametrize("body, cause", [
    (pack(tup("1", ["echo", b"\x00\x01"])), "bin value (type byte 0xc4)"),
    (pack(tup("1", ["echo", msgpack.ExtType(5, b"x")])), "ext value"),
    (pack(tup("1", ["echo", msgpack.Timestamp(1)])), "ext value"),
    (b"\x81\x01\xa1x", "map key at body offset 1 is not a string"),
    (b"\x81\xa1k\xa2\xc3\x28", "invalid UTF-8"),
    (GOOD + b"\xc0", "1 trailing bytes after the object"),
    (GOOD[:-3], "truncated object"),
    (b"", "empty frame (length 0)"),
    (b"\x05", "not a map or an array"),
    (b"\xa3abc", "not a map or an array"),
    (b"\x91\xc1", "invalid type byte 0xc1"),
])
def test_bad_frame_is_a_protocol_error(start, body, cause):
    """§8.1: the connection is unusable after a protocol error; the component
    reports it and exits, as the Python and Ruby libraries do."""
    h = conformance(start)
    h.write(frame(body) + frame(GOOD))
    fatal(h, "cannot decode msgpack frame from host")
    h.c.wait_stderr(cause.encode())


def fatal(h, cause, status=1):
    assert h.wait() == status
    h.c.wait_stderr(b"multilang: protocol error: " + cause.encode())
    err = h.read()
    assert err["command"] == "error" and cause in err["msg"], err


def test_oversize_length_fails_at_once(start):
    h = conformance(start)
    h.write(b"\xff\xff\xff\xff")  # no body follows: the length alone is the error
    fatal(h, "FrameTooLarge: frame length 4294967295 exceeds the 67108864-byte limit")  # not waiting for one


def test_oversize_against_conf_limit(start):
    h = start([NODE, CONFORMANCE, "bolt"], conf={"multilang.max.frame.bytes": 100})
    h.read()
    h.send(tup("1", ["echo", "x" * 30]))  # under the limit
    assert h.read_n(2)[1] == {"command": "ack", "id": "1"}
    h.write(struct.pack(">I", 101) + b"\x85")  # over it, body not even sent
    fatal(h, "FrameTooLarge: frame length 101 exceeds the 100-byte limit")


def test_json_frame_after_switch_is_an_error(start):
    h = conformance(start)
    h.write(json.dumps(tup("1", ["ack"])).encode() + b"\nend\n")
    fatal(h, "FrameTooLarge")  # '{"id' read as a length


@pytest.mark.parametrize("cut", [2, 4, 10])
def test_eof_inside_frame(start, cut):
    h = conformance(start)
    h.write(frame(tup("1", ["ack"])) + frame(tup("2", ["ack"]))[:cut])
    assert h.read() == {"command": "ack", "id": "1"}
    h.c.close_stdin()
    fatal(h, "stream ended in the middle of a frame")


def test_eof_at_frame_boundary_exits_zero(start):
    h = conformance(start)
    h.write(frame(tup("1", ["echo", "last"])))
    h.c.close_stdin()
    assert h.wait(2) == 0
    assert h.read_n(2) == [
        {"command": "emit", "tuple": ["echo", "last"], "anchors": ["1"], "need_task_ids": False},
        {"command": "ack", "id": "1"},
    ]
    assert h.c.stderr_text() == ""


def test_deeply_nested_frame_is_an_error_not_a_crash(start):
    """A protocol error named as such (§8.1), not a stack overflow."""
    h = conformance(start)
    h.write(frame(b"\x91" * 200_000 + b"\xc0") + frame(GOOD))
    fatal(h, "cannot decode msgpack frame from host")
    h.c.wait_stderr(b"nesting too deep")


def test_random_values_random_chunks(start):
    import random

    rnd = random.Random(96)

    def text():
        alphabet = "ab/\\\"\n\x00\u00e9\u4e2d\u2028\U0001F600\U00010000"
        return "".join(rnd.choice(alphabet) for _ in range(rnd.choice([0, 1, 5, 31, 32, 100])))

    def value(depth=0):
        kind = rnd.randrange(9 if depth < 3 else 6)
        if kind == 0:
            return text()
        if kind == 1:
            return rnd.choice([0, 1, -1, 127, 128, -32, -33, 255, 256, 65535, 65536, 2**31, -(2**31) - 1,
                               2**32, 2**53 - 1, -(2**53 - 1)]) + rnd.choice([0, 0, 1])
        if kind == 2:
            f = rnd.uniform(-1e6, 1e6) * rnd.choice([1, 1e-300, 1e300])
            return f + 0.5 if f.is_integer() else f
        if kind == 3:
            return rnd.choice([True, False, None])
        if kind in (4, 5):
            return rnd.randrange(-(2**53) + 1, 2**53)
        if kind in (6, 7):
            return [value(depth + 1) for _ in range(rnd.choice([0, 1, 3, 16, 20]))]
        return {text(): value(depth + 1) for _ in range(rnd.choice([0, 1, 15, 16]))}

    h = conformance(start)
    sent = [["echo", value(), value()] for _ in range(200)]
    data = b"".join(frame(tup(str(i), v)) for i, v in enumerate(sent))
    i = 0
    while i < len(data):
        n = rnd.choice([1, 2, 3, 4, 5, 100, 4096, 65536])
        h.write(data[i:i + n])
        i += n
    for i, v in enumerate(sent):
        emit = h.read()
        assert same_json(emit["tuple"], v), (i, v, emit["tuple"])
        assert h.read() == {"command": "ack", "id": str(i)}



@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinite_floats_are_not_json_numbers(value):
    """§9.6: the library's decoder refuses a float JSON cannot carry."""
    import subprocess

    body = msgpack.packb({"tuple": [value]})
    js = ("const m = require(process.argv[1]);"
          "const b = Buffer.from(process.argv[2], 'hex');"
          "let r; try { m.decodeMsgpack(b, 0, b.length); r = 'accepted'; } catch (e) { r = e.message; }"
          "require('fs').writeSync(2, r + '\\n');")  # the library guards stdout from load on
    out = subprocess.run(["node", "-e", js, str(ROOT / "examples/node/multilang.js"), body.hex()],
                         capture_output=True, text=True, timeout=20)
    assert "is not a JSON number" in out.stderr, out.stdout + out.stderr
