"""Integration tests for the Node.js multilang library (examples/node/).

Real `node` subprocesses are driven by multilang.testing.ComponentProcess, a
host that only writes and reads bytes (nothing else from the `multilang`
package is used). Every read has a timeout, so a broken component fails a
test instead of hanging it.
"""

import json
import shutil
import time
from functools import partial
from pathlib import Path

import pytest

from burst_support import GATE_SECS, READ_SECS, check_burst_answered_halfway
from multilang.testing import (
    ComponentProcesses,
    command_frame as cmd,
    heartbeat_frame as heartbeat,
    tick_frame as tick,
    tuple_batch as tuples,
    tuple_frame as tup,
)

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "examples" / "node"
LIB = NODE_DIR / "multilang.js"
CONFORMANCE = NODE_DIR / "conformance_component.js"
NODE = shutil.which("node")
CONF = {"topology.name": "t", "unknown.key": [1]}

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


@pytest.fixture
def started(tmp_path):
    """started(argv, handshake=True, cwd=ROOT) -> multilang.testing.ComponentProcess
    (ASCII-escaped input; "\r\n" line endings accepted on output)."""
    with ComponentProcesses(cwd=ROOT, pid_dir=tmp_path / "pids", conf=CONF, ensure_ascii=True,
                            accept_crlf=True) as procs:
        yield partial(procs.start, handshake=True)


def conformance(started, mode="bolt"):
    c = started([NODE, str(CONFORMANCE), mode])
    assert c.read() == {
        "command": "log",
        "msg": f"multilang-conformance ready mode={mode} lang=node",
        "level": 2,
    }
    return c


def script(tmp_path, name, body):
    """Write a throw-away component that requires the library by absolute path."""
    path = tmp_path / name
    path.write_text(f"const ml = require({json.dumps(str(LIB))});\n{body}\n")
    return path


# ---------------------------------------------------------------------------
# Handshake, heartbeats, ids
# ---------------------------------------------------------------------------


def test_handshake_pid_file_and_pid_first(started, tmp_path):
    # A component that prints at require time and in initialize: the pid reply
    # must still come first, the prints become log frames after it.
    path = script(
        tmp_path,
        "noisy.js",
        "console.log('top level');\n"
        "class B extends ml.Bolt { initialize(conf, ctx) {"
        " console.log(JSON.stringify([conf['topology.name'], ctx.taskid])); } }\n"
        "new B().run();",
    )
    c = started([NODE, str(path)])
    assert c.stdout.startswith(b'{"pid":'), bytes(c.stdout[:80])
    assert c.read() == {"command": "log", "msg": "top level"}
    assert c.read() == {"command": "log", "msg": '["t",2]'}


def test_heartbeat_sync_never_acked(started):
    c = conformance(started)
    c.send(heartbeat("-1"))
    assert c.read() == {"command": "sync"}
    c.send(tup("5", ["ack"]))
    assert c.read() == {"command": "ack", "id": "5"}
    c.expect_silence(0.2)


def test_ids_echoed_byte_for_byte(started):
    c = conformance(started)
    for tid in ["-9223372036854775808", "0012", "42", "9223372036854775807", "1e3"]:
        c.send(tup(tid, ["ack"]))
        assert c.read_raw() == b'{"command":"ack","id":"%s"}' % tid.encode()
        c.send(tup(tid, ["fail"]))
        assert c.read_raw() == b'{"command":"fail","id":"%s"}' % tid.encode()


def test_heartbeats_and_tuples_queued_while_awaiting_task_ids(started):
    c = conformance(started)
    c.send(tup("-7", ["emit", ["x"], "s2"]))
    emit = c.read()
    assert emit == {"command": "emit", "tuple": ["x"], "stream": "s2", "anchors": ["-7"]}
    # While the bolt awaits the task ids, a heartbeat and a tuple arrive first.
    c.send(heartbeat())
    c.send(tup("8", ["echo", "y"]))
    c.expect_silence(0.3)
    c.send([4, 5])
    assert c.read_n(5) == [
        {"command": "emit", "tuple": ["task_ids", [4, 5]], "anchors": ["-7"], "need_task_ids": False},
        {"command": "ack", "id": "-7"},
        {"command": "sync"},
        {"command": "emit", "tuple": ["echo", "y"], "anchors": ["8"], "need_task_ids": False},
        {"command": "ack", "id": "8"},
    ]


def test_pipelined_emits_task_ids_fifo(started, tmp_path):
    path = script(
        tmp_path,
        "pipeline.js",
        "class B extends ml.Bolt { async process(t) {\n"
        "  const ps = [1, 2, 3].map((i) => this.emit([i], {anchors: [t], needTaskIds: true}));\n"
        "  const ids = await Promise.all(ps);\n"
        "  this.emit(['ids', ids], {anchors: t});\n"
        "  this.ack(t);\n"
        "} }\nnew B().run();",
    )
    c = started([NODE, str(path)])
    c.send(tup("1", ["go"]))
    frames = c.read_n(3)  # all three emits before any task ids
    assert [f["tuple"] for f in frames] == [[1], [2], [3]]
    assert all("need_task_ids" not in f or f["need_task_ids"] is True for f in frames)
    c.send(heartbeat())
    c.write(b"[1]\nend\n[2, 3]\nend\n[]\nend\n")
    assert c.read_n(3) == [
        {"command": "emit", "tuple": ["ids", [[1], [2, 3], []]], "anchors": ["1"], "need_task_ids": False},
        {"command": "ack", "id": "1"},
        {"command": "sync"},
    ]


# ---------------------------------------------------------------------------
# Bolt API via the conformance component
# ---------------------------------------------------------------------------


def test_conformance_bolt_actions(started):
    c = conformance(started)
    c.send(tup("1", ["echo", 1, None]))
    assert c.read_n(2) == [
        {"command": "emit", "tuple": ["echo", 1, None], "anchors": ["1"], "need_task_ids": False},
        {"command": "ack", "id": "1"},
    ]
    c.send(tup("2", ["emit_unanchored", ["u"]]))
    assert c.read_n(2) == [
        {"command": "emit", "tuple": ["u"], "anchors": [], "need_task_ids": False},
        {"command": "ack", "id": "2"},
    ]
    c.send(tup("3", ["emit_direct", 7, ["d"]]))
    assert c.read() == {"command": "emit", "tuple": ["d"], "anchors": ["3"], "task": 7, "need_task_ids": False}
    # no task ids are sent for a direct emit: the ack follows directly
    assert c.read() == {"command": "ack", "id": "3"}
    c.send(tup("4", ["emit", ["v"], None]))
    assert c.read() == {"command": "emit", "tuple": ["v"], "anchors": ["4"]}
    c.send([9])
    assert c.read_n(2) == [
        {"command": "emit", "tuple": ["task_ids", [9]], "anchors": ["4"], "need_task_ids": False},
        {"command": "ack", "id": "4"},
    ]
    c.send(tup("5", ["emit_many", 3]))
    assert [f.get("tuple") for f in c.read_n(4)] == [["n", 0], ["n", 1], ["n", 2], None]
    c.send(tup("h1", ["hold"]))
    c.send(tup("h2", ["hold"]))
    c.send(tup("6", ["release", ["r"]]))
    assert c.read_n(4) == [
        {"command": "emit", "tuple": ["r"], "anchors": ["h1", "h2", "6"], "need_task_ids": False},
        {"command": "ack", "id": "h1"},
        {"command": "ack", "id": "h2"},
        {"command": "ack", "id": "6"},
    ]
    c.send(tup("7", ["log", "hello", 3]))
    assert c.read_n(2) == [{"command": "log", "msg": "hello", "level": 3}, {"command": "ack", "id": "7"}]
    c.send(tup("8", ["error", "oops"]))
    assert c.read_n(2) == [{"command": "error", "msg": "oops"}, {"command": "ack", "id": "8"}]
    c.send(tup("9", ["metrics", "m", {"a": [1]}]))
    assert c.read_n(2) == [
        {"command": "metrics", "name": "m", "params": {"a": [1]}},
        {"command": "ack", "id": "9"},
    ]
    c.send(tup("10", ["print", "printed %s"]))
    assert c.read_n(2) == [{"command": "log", "msg": "printed %s"}, {"command": "ack", "id": "10"}]
    c.send(tup("11", ["bogus"]))
    assert c.read_n(2) == [{"command": "error", "msg": "unknown action: bogus"}, {"command": "fail", "id": "11"}]
    c.send(tup("12", ["exit", 3]))
    assert c.wait() == 3


def test_ticks_go_to_tick_hook_only(started):
    c = conformance(started)
    c.send(tick("-3", 10))
    assert c.read_n(2) == [
        {"command": "emit", "tuple": ["tick", 10], "anchors": ["-3"], "need_task_ids": False},
        {"command": "ack", "id": "-3"},
    ]
    # BasicBolt: the tick hook's emit is auto-anchored, the library acks
    b = conformance(started, "basic")
    b.send(tick("t"))
    assert b.read_n(2) == [
        {"command": "emit", "tuple": ["tick", 5], "anchors": ["t"], "need_task_ids": False},
        {"command": "ack", "id": "t"},
    ]


def test_default_tick_hook_acks(started, tmp_path):
    path = script(
        tmp_path,
        "ticks.js",
        "class B extends ml.Bolt { process(t) { this.reportError('process ' + t.id); this.ack(t); } }\n"
        "new B().run();",
    )
    c = started([NODE, str(path)])
    c.send(tick("t1"))
    assert c.read() == {"command": "ack", "id": "t1"}
    c.expect_silence(0.2)


def test_basic_bolt_auto_anchor_ack_and_exception(started):
    c = conformance(started, "basic")
    c.send(tup("1", ["echo", "a"]))
    assert c.read_n(2) == [
        {"command": "emit", "tuple": ["echo", "a"], "anchors": ["1"], "need_task_ids": False},
        {"command": "ack", "id": "1"},
    ]
    c.send(tup("2", ["raise", "kaboom-42"]))
    err = c.read()
    assert err["command"] == "error" and "kaboom-42" in err["msg"] and "at " in err["msg"]
    assert c.read() == {"command": "fail", "id": "2"}
    c.send(tup("3", ["other"]))
    assert c.read() == {"command": "ack", "id": "3"}
    assert c.proc.poll() is None


# ---------------------------------------------------------------------------
# Framing and encoding
# ---------------------------------------------------------------------------


def test_unicode_escapes_and_split_codepoints(started):
    c = conformance(started)
    text = "a/b \u00e9 \U0001F600 \u4e2d \u2028 end"
    frame = json.dumps(tup("1", ["echo", text]), ensure_ascii=False, separators=(",", ":"))
    frame = frame.replace("/", "\\/").encode() + b"\nend\n"
    emoji_at = frame.index("\U0001F600".encode())
    # split in the middle of the emoji, and mid "\nend\n", across writes
    for part in (frame[: emoji_at + 2], frame[emoji_at + 2 : -3], frame[-3:]):
        c.write(part)
        time.sleep(0.05)
    raw = c.read_raw()
    assert raw == ('{"command":"emit","tuple":["echo","%s"],"anchors":["1"],"need_task_ids":false}' % text).encode()
    assert c.read() == {"command": "ack", "id": "1"}
    # ASCII-escaped input (as storm.py's writer would produce) is fine too
    c.write(json.dumps(tup("2", ["echo", "\U0001F600"]), ensure_ascii=True).encode() + b"\nend\n")
    assert c.read_raw() == '{"command":"emit","tuple":["echo","\U0001F600"],"anchors":["2"],"need_task_ids":false}'.encode()
    assert c.read() == {"command": "ack", "id": "2"}


def test_framing_variants(started):
    c = conformance(started)
    multi = b'{\n  "id": "1",\n  "comp": "s",\n\n  "stream": "default",\n  "task": 1,\n  "tuple": ["ack"]\n}\nend\n'
    crlf = b'{"id":"2","comp":"s","stream":"default","task":1,"tuple":["ack"]}\r\nend\r\n'
    blank = b'\n\n{"id":"3","comp":"s","stream":"default","task":1,"tuple":["ack"]}\nend\n\n'
    c.write(multi + crlf + blank)  # coalesced into one write
    assert c.read_n(3) == [{"command": "ack", "id": i} for i in ("1", "2", "3")]
    # byte-by-byte chunks
    data = b'{"id":"4","comp":"s","stream":"default","task":1,"tuple":["ack"]}\nend\n'
    for i in range(0, len(data), 7):
        c.write(data[i : i + 7])
    assert c.read() == {"command": "ack", "id": "4"}
    # many frames coalesced into one large write
    c.write(b"".join(json.dumps(tup(str(i), ["ack"])).encode() + b"\nend\n" for i in range(200)))
    assert [f["id"] for f in c.read_n(200)] == [str(i) for i in range(200)]


def test_one_megabyte_tuple(started):
    c = conformance(started)
    big = "x\u00e9" * (512 * 1024)  # > 1 MB of UTF-8
    c.send(tup("1", ["echo", big]))
    frame = c.read(timeout=10)
    assert frame["tuple"] == ["echo", big]
    assert c.read() == {"command": "ack", "id": "1"}


def test_console_log_becomes_log_frame_console_error_stays(started, tmp_path):
    path = script(
        tmp_path,
        "printer.js",
        "class B extends ml.Bolt { process(t) {\n"
        "  console.log('x'); console.info('info', 2); process.stdout.write('raw\\n');\n"
        "  console.error('to stderr'); this.ack(t);\n"
        "} }\nnew B().run();",
    )
    c = started([NODE, str(path)])
    c.send(tup("1", []))
    assert c.read_n(4) == [
        {"command": "log", "msg": "x"},
        {"command": "log", "msg": "info 2"},
        {"command": "log", "msg": "raw"},
        {"command": "ack", "id": "1"},
    ]
    c.wait_stderr(b"to stderr")


def test_stdin_eof_exits_zero_promptly(started):
    c = conformance(started)
    c.send(tup("1", ["echo", "last"]))
    c.close_stdin()
    assert c.proc.wait(timeout=60) == 0  # exits on EOF (a deadline against a hang, not a pace)
    assert c.read_n(2) == [
        {"command": "emit", "tuple": ["echo", "last"], "anchors": ["1"], "need_task_ids": False},
        {"command": "ack", "id": "1"},
    ]


def test_stdin_eof_after_burst_delivers_all_output(started):
    c = conformance(started)
    n = 3000
    c.write(b"".join(json.dumps(tup(str(i), ["echo", "v" * 100])).encode() + b"\nend\n" for i in range(n)))
    c.close_stdin()
    assert c.proc.wait(timeout=2) == 0
    frames = c.read_n(2 * n)
    assert [f["id"] for f in frames[1::2]] == [str(i) for i in range(n)]


def test_stdin_eof_while_awaiting_task_ids(started):
    c = conformance(started)
    c.send(tup("1", ["emit", ["v"], None]))
    c.read()
    c.close_stdin()
    assert c.proc.wait(timeout=2) == 0


# ---------------------------------------------------------------------------
# Spouts
# ---------------------------------------------------------------------------


def test_conformance_spout(started):
    c = conformance(started, "spout")
    assert c.read() == {"command": "emit", "tuple": ["open"], "id": "open", "need_task_ids": False}
    c.send(cmd("activate"))
    assert c.read_n(2) == [
        {"command": "emit", "tuple": ["activated"], "need_task_ids": False},
        {"command": "sync"},
    ]
    ids = [0, "1", -2, "-3", 4.5, {"k": [5]}, None]
    for k, mid in enumerate(ids):
        c.send(cmd("next"))
        emit = c.read()
        assert emit["tuple"] == ["next", k]
        assert emit.get("need_task_ids", True) is True
        if mid is None:
            assert emit.get("id") is None
        else:
            assert "id" in emit and emit["id"] == mid and type(emit["id"]) is type(mid)
        c.send([k, 100])
        assert c.read_n(2) == [
            {"command": "emit", "tuple": ["task_ids", [k, 100]], "need_task_ids": False},
            {"command": "sync"},
        ]
    c.send(cmd("next"))
    assert c.read() == {"command": "sync"}
    for mid in ids[:-1]:
        c.send(cmd("ack", mid))
        assert c.read_n(2) == [{"command": "emit", "tuple": ["acked", mid], "need_task_ids": False}, {"command": "sync"}]
        c.send(cmd("fail", mid))
        assert c.read_n(2) == [{"command": "emit", "tuple": ["failed", mid], "need_task_ids": False}, {"command": "sync"}]
    c.write(b'{"command":"ack","id":0}\nend\n')
    raw = c.read_raw()
    assert raw == b'{"command":"emit","tuple":["acked",0],"need_task_ids":false}'
    assert c.read() == {"command": "sync"}
    c.send(cmd("deactivate"))
    assert c.read_n(2) == [{"command": "emit", "tuple": ["deactivated"], "need_task_ids": False}, {"command": "sync"}]
    c.send(cmd("frobnicate"))
    frames = c.read_n(2)
    assert frames[0]["command"] == "log" and "frobnicate" in frames[0]["msg"]
    assert frames[1] == {"command": "sync"}
    c.expect_silence(0.2)


def test_spout_defaults_one_sync_per_command(started, tmp_path):
    path = script(tmp_path, "bare_spout.js", "new ml.Spout().run();")
    c = started([NODE, str(path)])
    for command, mid in [("activate", ""), ("next", ""), ("ack", 3), ("fail", "x"), ("deactivate", "")]:
        c.send(cmd(command, mid))
        assert c.read() == {"command": "sync"}
    c.send(cmd("unknown"))
    frames = c.read_n(2)
    assert frames[0]["command"] == "log" and frames[0]["level"] == 3
    assert frames[1] == {"command": "sync"}
    # several commands coalesced into one write: still exactly one sync each
    c.write(b"".join(json.dumps(cmd(x)).encode() + b"\nend\n" for x in ["next", "next", "activate", "what"]))
    frames = c.read_n(5)
    assert [f["command"] for f in frames].count("sync") == 4
    c.expect_silence(0.3)


def test_spout_hook_error_reported_then_sync(started, tmp_path):
    path = script(
        tmp_path,
        "bad_spout.js",
        "class S extends ml.Spout { async nextTuple() { throw new Error('spout-broke'); } }\nnew S().run();",
    )
    c = started([NODE, str(path)])
    c.send(cmd("next"))
    err = c.read()
    assert err["command"] == "error" and "spout-broke" in err["msg"]
    assert c.read() == {"command": "sync"}
    c.send(cmd("next"))
    assert c.read()["command"] == "error"
    assert c.read() == {"command": "sync"}


# ---------------------------------------------------------------------------
# Word-count examples
# ---------------------------------------------------------------------------


def test_split_bolt(started):
    c = started([NODE, str(NODE_DIR / "split_bolt.js")])
    c.send(tup("1", ["  Hello, World!  \u00c9t\u00e9 (don't) --- x_y\tTAB\nline\u00a0nbsp  "]))
    words = []
    while True:
        f = c.read()
        if f["command"] == "ack":
            assert f["id"] == "1"
            break
        assert f["command"] == "emit" and f["anchors"] == ["1"] and f["need_task_ids"] is False
        words.append(f["tuple"][0])
    assert words == ["hello", "world", "\u00c9t\u00e9", "don't", "x_y", "tab", "line\u00a0nbsp"]
    c.send(tick("t"))
    assert c.read() == {"command": "ack", "id": "t"}
    c.send(tup("2", [""]))
    assert c.read() == {"command": "ack", "id": "2"}


def test_count_bolt(started):
    c = started([NODE, str(NODE_DIR / "count_bolt.js")])
    out = []
    for i, w in enumerate(["the", "cat", "the", "the", "cat"]):
        c.send(tup(str(i), [w]))
        emit, ack = c.read_n(2)
        assert emit["anchors"] == [str(i)] and ack == {"command": "ack", "id": str(i)}
        out.append(emit["tuple"])
    assert out == [["the", 1], ["cat", 1], ["the", 2], ["the", 3], ["cat", 2]]
    c.send(tick("t"))
    assert c.read() == {"command": "ack", "id": "t"}


def test_sentence_spout(started, tmp_path):
    (tmp_path / "s.txt").write_text("  first line \n\n second\t\nthird\n   \n")
    c = started([NODE, str(NODE_DIR / "sentence_spout.js"), "s.txt"], cwd=tmp_path)
    c.send(cmd("activate"))
    assert c.read() == {"command": "sync"}
    emitted = []
    for _ in range(3):
        c.send(cmd("next"))
        emit = c.read()
        assert emit["need_task_ids"] is False
        emitted.append((emit["tuple"], emit["id"]))
        assert c.read() == {"command": "sync"}
    assert emitted == [(["first line"], 0), (["second"], 2), (["third"], 3)]
    c.send(cmd("next"))
    assert c.read() == {"command": "sync"}
    c.send(cmd("fail", 2))
    assert c.read() == {"command": "sync"}
    c.send(cmd("ack", 0))
    assert c.read() == {"command": "sync"}
    c.send(cmd("next"))
    emit = c.read()
    assert (emit["tuple"], emit["id"]) == (["second"], 2)
    assert c.read() == {"command": "sync"}
    c.send(cmd("next"))
    assert c.read() == {"command": "sync"}


# ---------------------------------------------------------------------------
# Extension batch (spec §9.5)
# ---------------------------------------------------------------------------

OFFER = ("batch",)


def batch_start(started, argv, offer=OFFER, accepted=("batch",)):
    c = started(argv, handshake=False)
    c.handshake(offer=offer, accept=accepted)
    return c


def batch_conformance(started, mode="bolt"):
    c = batch_start(started, [NODE, str(CONFORMANCE), mode])
    assert c.read() == {"command": "log", "msg": f"multilang-conformance ready mode={mode} lang=node", "level": 2}
    return c


def test_batch_accepted_tuple_batches_in_order(started):
    c = batch_conformance(started)
    c.send(tuples(tup("1", ["echo", "a"]), tup("2", ["fail"]), tick("3"), tup("-4", ["hold"]),
                  tup("0005", ["release", ["r"]]), tup("6", ["emit_unanchored", ["u", None]])))
    assert c.read_raw() == (
        b'{"command":"batch","emits":[[["echo","a"],["1"]],[["tick",5],["3"]],[["r"],["-4","0005"]],[["u",null]]],'
        b'"acks":["1","3","-4","0005","6"],"fails":["2"]}'
    )
    c.expect_silence(0.2)


def test_batch_standard_frames_close_the_batch_first(started):
    c = batch_conformance(started)
    c.send(tuples(tup("1", ["echo", "a"]), tup("2", ["print", "p"]), tup("3", ["emit_direct", 4, ["d"]]),
                  tup("4", ["emit", ["x"], "words"])))
    assert c.read_n(6) == [
        {"command": "batch", "emits": [[["echo", "a"], ["1"]]], "acks": ["1"]},
        {"command": "log", "msg": "p"},
        {"command": "batch", "acks": ["2"]},
        {"command": "emit", "tuple": ["d"], "anchors": ["3"], "task": 4, "need_task_ids": False},
        {"command": "batch", "acks": ["3"]},
        {"command": "emit", "tuple": ["x"], "stream": "words", "anchors": ["4"]},
    ]
    # Arriving while the bolt awaits task ids: queued, then handled in order.
    c.send(heartbeat())
    c.send(tuples(tup("5", ["echo", "q"])))
    c.expect_silence(0.2)
    c.send([4, 5])
    assert c.read_n(3) == [
        {"command": "batch", "emits": [[["task_ids", [4, 5]], ["4"]]], "acks": ["4"]},
        {"command": "sync"},
        {"command": "batch", "emits": [[["echo", "q"], ["5"]]], "acks": ["5"]},
    ]
    c.expect_silence(0.2)


def test_batch_closed_at_1024_elements(started):
    c = batch_conformance(started)
    c.send(tup("1", ["emit_many", 1100]))
    first, second = c.read_n(2)
    assert first == {"command": "batch", "emits": [[["n", i], ["1"]] for i in range(1024)]}
    assert second == {"command": "batch", "emits": [[["n", i], ["1"]] for i in range(1024, 1100)], "acks": ["1"]}
    c.expect_silence(0.2)


def test_batch_basic_bolt_streams_and_errors(started, tmp_path):
    path = script(
        tmp_path,
        "basic_batch.js",
        "class B extends ml.BasicBolt { process(t) {\n"
        "  const v = t.values[0];\n"
        "  if (v === 'raise') throw new Error('boom');\n"
        "  if (v === 'stream') this.emit(['s'], {stream: 'words'});\n"
        "  else if (v === 'unanchored') this.emit(['u'], {anchors: [], stream: 'default'});\n"
        "  else this.emit([v.toUpperCase()]);\n"
        "} }\nnew B().run();",
    )
    c = batch_start(started, [NODE, str(path)])
    c.send(tuples(tup("1", ["hi"]), tup("2", ["stream"]), tup("3", ["unanchored"]), tup("4", ["raise"]),
                  tup("5", ["ok"]), tick("6")))
    frames = c.read_n(3)
    assert frames[0] == {"command": "batch", "emits": [[["HI"], ["1"]], [["s"], ["2"], "words"], [["u"]]],
                         "acks": ["1", "2", "3"]}
    assert frames[1]["command"] == "error" and "boom" in frames[1]["msg"]
    assert frames[2] == {"command": "batch", "emits": [[["OK"], ["5"]]], "acks": ["5", "6"], "fails": ["4"]}
    c.expect_silence(0.2)


def test_batch_spout_message_ids_then_one_sync(started, tmp_path):
    path = script(
        tmp_path,
        "spout_batch.js",
        "const IDS = [0, '1', -2, '-3', 4.5, {k: [5]}, false, '', null, undefined];\n"
        "class S extends ml.Spout {\n"
        "  open() { this.emit(['open'], {msgId: 'o'}); }\n"
        "  nextTuple() {\n"
        "    IDS.forEach((id, i) => this.emit(['n', i], {msgId: id}));\n"
        "    this.emit(['s'], {msgId: 7, stream: 'words'});\n"
        "    this.emit(['t'], {stream: 'words'});\n"
        "  }\n"
        "  async ack(id) { await null; this.emit(['acked', id]); }\n"
        "}\nnew S().run();",
    )
    c = batch_start(started, [NODE, str(path)])
    assert c.read() == {"command": "batch", "emits": [[["open"], "o"]]}
    c.send(cmd("activate"))
    assert c.read() == {"command": "sync"}
    c.send(cmd("next"))
    assert c.read_raw() == (
        b'{"command":"batch","emits":[[["n",0],0],[["n",1],"1"],[["n",2],-2],[["n",3],"-3"],[["n",4],4.5],'
        b'[["n",5],{"k":[5]}],[["n",6],false],[["n",7],""],[["n",8]],[["n",9]],[["s"],7,"words"],[["t"],null,"words"]]}'
    )
    assert c.read() == {"command": "sync"}
    c.send(cmd("ack", {"k": [5]}))
    assert c.read_n(2) == [{"command": "batch", "emits": [[["acked", {"k": [5]}]]]}, {"command": "sync"}]
    c.expect_silence(0.2)


@pytest.mark.parametrize("how", ["static", "instance"])
def test_batch_declined_is_byte_for_byte_standard(started, tmp_path, how):
    body = {
        "static": "class B extends ml.BasicBolt { static extensions = []; process(t) { this.emit([t.values[0]]); } }\n"
                  "new B().run();",
        "instance": "class B extends ml.BasicBolt { process(t) { this.emit([t.values[0]]); } }\n"
                    "const b = new B(); b.extensions = []; b.run();",
    }[how]
    path = script(tmp_path, f"declined_{how}.js", body)
    outputs = []
    for offer in ((), OFFER):
        c = batch_start(started, [NODE, str(path)], offer=offer, accepted=())
        c.send(tup("1", ["a"]))
        c.send(heartbeat())
        c.send(tick("2"))
        c.read_n(4)
        outputs.append(bytes(c.stdout).split(b"\nend\n", 1)[1])
    assert outputs[0] == outputs[1]
    assert outputs[0] == (
        b'{"command":"emit","tuple":["a"],"anchors":["1"],"need_task_ids":false}\nend\n'
        b'{"command":"ack","id":"1"}\nend\n{"command":"sync"}\nend\n{"command":"ack","id":"2"}\nend\n'
    )


def test_batch_subclass_inherits_static_setting(started, tmp_path):
    path = script(
        tmp_path,
        "inherit.js",
        "class Base extends ml.Bolt { static extensions = []; }\n"
        "class B extends Base { process(t) { this.ack(t); } }\n"
        "if (ml.Bolt.extensions[0] !== 'batch') throw new Error('default');\n"
        "new B().run();",
    )
    c = batch_start(started, [NODE, str(path)], accepted=())
    c.send(tup("1", ["a"]))
    assert c.read() == {"command": "ack", "id": "1"}


def test_a_burst_is_answered_halfway_so_a_windowed_host_can_refill(started, tmp_path):
    """As in the Python library: the first half of a burst is flushed before
    the second half is handled; here the second half's first tuple waits
    until the host has seen the first half's acks (spec §5.3)."""
    go = tmp_path / "go"
    path = script(
        tmp_path,
        "gate.js",
        "const fs = require('fs');\n"
        "const nap = new Int32Array(new SharedArrayBuffer(4));\n"
        "class Gate extends ml.BasicBolt {\n"
        "  process(t) {\n"
        "    if (t.values[0] === 16) {\n"
        f"      const end = Date.now() + {GATE_SECS * 1000};\n"
        f"      while (!fs.existsSync({json.dumps(str(go))}) && Date.now() < end) Atomics.wait(nap, 0, 0, 10);\n"
        "    }\n"
        "    this.emit([t.values[0]]);\n"
        "  }\n"
        "}\n"
        "new Gate().run();",
    )
    c = started([NODE, str(path)])
    check_burst_answered_halfway(c, go)


@pytest.mark.parametrize("case", ["frame", "unterminated", "multi-line", "multi-byte"])
def test_json_input_over_the_frame_limit_is_refused(started, case):
    """Spec §1.3: the reader never buffers more than multilang.max.frame.bytes
    waiting for a terminator; it reports the error and exits 1."""
    c = started([NODE, str(CONFORMANCE), "bolt"], handshake=False)
    c.handshake(conf={**CONF, "multilang.max.frame.bytes": 4096})
    assert c.read()["command"] == "log"  # ready
    big = json.dumps(tup("1", ["x" * 5000])).encode()
    c.write({"frame": big + b"\nend\n", "unterminated": big,
             "multi-line": b'{"id":"1",\n' + b'"comp":"src",\n' * 400,
             "multi-byte": "é".encode() * 2100}[case])  # 2100 characters, 4200 bytes
    error = c.read(timeout=3)
    assert error["command"] == "error" and "exceeds the 4096-byte limit" in error["msg"], error
    assert c.wait(3.0) == 1
    c.wait_closed(2)
    assert "exceeds the 4096-byte limit" in c.stderr_text()


def test_a_frame_that_is_not_json_is_a_protocol_error(started):
    """§8.1: the connection is unusable after a protocol error; the component
    reports it and exits 1, as the Python and Ruby libraries do."""
    c = conformance(started)
    c.write(b'{"id":"1","comp":\nend\n' + json.dumps(tup("2", ["ack"])).encode() + b"\nend\n")
    error = c.read(timeout=3)
    assert error["command"] == "error" and "cannot parse frame from host" in error["msg"], error
    assert c.wait(3.0) == 1
    c.wait_closed(2)
    assert "multilang: protocol error: cannot parse frame from host" in c.stderr_text()
