"""Integration tests for the Ruby component library (examples/ruby/multilang.rb).

Real `ruby` subprocesses are driven by multilang.testing.ComponentProcess, a
byte-level host: it only writes and reads bytes (nothing else from the
`multilang` package is used). Every read and write has a deadline, so a
broken component fails a test instead of hanging it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from burst_support import GATE_SECS, READ_SECS, check_burst_answered_halfway
from multilang.testing import (
    DEFAULT_CONTEXT,
    ComponentProcess,
    ComponentProcesses,
    encode_frame,
    same_json,
    tick_frame,
    tuple_batch as tuples,
    tuple_frame,
)

ROOT = Path(__file__).resolve().parents[2]
RUBY_DIR = ROOT / "examples" / "ruby"
LIB = RUBY_DIR / "multilang.rb"
CONFORMANCE = RUBY_DIR / "conformance_component.rb"
RUBY = shutil.which("ruby")

pytestmark = pytest.mark.skipif(RUBY is None, reason="ruby is not installed")

# split runs as tasks 2 and 3 here
CONTEXT = {**DEFAULT_CONTEXT, "task->component": {"1": "spout", "2": "split", "3": "split", "4": "count"}}

HEARTBEAT = {"id": "-6437389063516893232", "comp": None, "stream": "__heartbeat", "task": -1, "tuple": []}


def tup(tid: str, values, comp: str = "src", stream: str = "default", task: int = 7) -> dict:
    return tuple_frame(tid, values, comp=comp, stream=stream, task=task)


def tick(tid: str, secs: int = 30) -> dict:
    return tick_frame(tid, secs)


@pytest.fixture
def spawn(tmp_path):
    """spawn(script, *args, cwd=tmp_path) -> a multilang.testing.ComponentProcess running ruby."""
    with ComponentProcesses(pid_dir=tmp_path / "pids", context=CONTEXT) as procs:

        def _spawn(*args, cwd=None) -> ComponentProcess:
            return procs.start([RUBY, *args], cwd=cwd or tmp_path)

        yield _spawn


@pytest.fixture
def script(tmp_path):
    """Write a Ruby component script that loads the library; return its path."""

    def _script(body: str, name: str = "component.rb") -> Path:
        path = tmp_path / name
        path.write_text(f"require {json.dumps(str(LIB))}\n{body}\n")
        return path

    return _script


def conformance(spawn, mode: str) -> ComponentProcess:
    host = spawn(CONFORMANCE, mode)
    host.handshake()
    assert host.read() == {
        "command": "log",
        "msg": f"multilang-conformance ready mode={mode} lang=ruby",
        "level": 2,
    }
    return host


def emit_frame(values, anchors=(), stream=None, need_task_ids=False, task=None) -> dict:
    frame = {"command": "emit", "anchors": list(anchors), "tuple": values, "need_task_ids": need_task_ids}
    if stream is not None:
        frame["stream"] = stream
    if task is not None:
        frame["task"] = task
    return frame


# ---------------------------------------------------------------------------
# Handshake and the stdout guard
# ---------------------------------------------------------------------------


def test_handshake_pid_file_and_pid_reply_first(spawn, script):
    path = script(
        'puts "printed at load time"\n'
        'class B < Multilang::Bolt\n'
        '  def prepare(conf, context)\n'
        '    log("conf=#{conf["topology.name"]} task=#{task_id} comp=#{component_id}")\n'
        '  end\n'
        '  def process(tup); ack(tup); end\n'
        'end\n'
        'B.run\n'
    )
    host = spawn(path)
    time.sleep(0.3)  # give a broken guard time to write early
    host.send(
        {
            "pidDir": str(host.pid_dir),
            "conf": {"topology.name": "wc", "multilang.unknown.key": [1, {"x": None}]},
            "context": CONTEXT,
        }
    )
    first = host.read_raw()
    assert host.stdout.startswith(b'{"pid":'), bytes(host.stdout[:100])
    assert json.loads(first) == {"pid": host.proc.pid}
    pid_file = host.pid_dir / str(host.proc.pid)
    assert pid_file.is_file() and pid_file.stat().st_size == 0
    assert host.read() == {"command": "log", "msg": "printed at load time"}
    assert host.read() == {"command": "log", "msg": "conf=wc task=2 comp=split", "level": 2}


def test_print_puts_and_fd1_become_log_frames_or_stderr(spawn, script):
    path = script(
        'Multilang::Bolt.run do |tup, bolt|\n'
        '  print "partial"\n'
        '  bolt.emit(["after print"])\n'
        '  puts "line one\\nline two"\n'
        '  $stdout.write("w1", "w2\\n")\n'
        '  p [1, "x"]\n'
        '  STDOUT.puts "to fd1"\n'
        '  STDOUT.flush\n'
        '  system("echo from-child")\n'
        '  bolt.ack(tup)\n'
        'end\n'
    )
    host = spawn(path)
    host.handshake()
    host.send(tup("1", ["go"]))
    assert host.read_n(6) == [
        {"command": "log", "msg": "partial"},
        emit_frame(["after print"]),
        {"command": "log", "msg": "line one\nline two"},
        {"command": "log", "msg": "w1w2"},
        {"command": "log", "msg": '[1, "x"]'},
        {"command": "ack", "id": "1"},
    ]
    host.close_stdin()
    assert host.wait(2.0) == 0
    host.wait_closed(2)
    err = host.stderr_text()
    assert "to fd1" in err and "from-child" in err
    assert b"to fd1" not in host.stdout and b"from-child" not in host.stdout


def test_conformance_print_action(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("1", ["print", "hello"]))
    host.send(tup("2", ["print", "two\nlines\n"]))
    assert host.read_n(4) == [
        {"command": "log", "msg": "hello"},
        {"command": "ack", "id": "1"},
        {"command": "log", "msg": "two\nlines"},
        {"command": "ack", "id": "2"},
    ]


# ---------------------------------------------------------------------------
# Bolt protocol
# ---------------------------------------------------------------------------


def test_heartbeat_answered_with_sync_never_acked(spawn):
    host = conformance(spawn, "bolt")
    host.send(HEARTBEAT)
    assert host.read() == {"command": "sync"}
    host.send(HEARTBEAT)
    host.send(tup("5", ["ack"]))
    assert host.read_n(2) == [{"command": "sync"}, {"command": "ack", "id": "5"}]
    host.expect_silence()


def test_tuples_and_heartbeats_queued_while_waiting_for_task_ids(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("10", ["emit", ["x", 1], "words"]))
    frame = host.read()
    assert frame.pop("need_task_ids", True) is True
    assert frame == {"command": "emit", "anchors": ["10"], "stream": "words", "tuple": ["x", 1]}
    # Written before the task ids: must be queued, not answered or processed yet.
    host.send(HEARTBEAT)
    host.send(tup("11", ["echo", "q"]))
    host.send(HEARTBEAT)
    host.expect_silence(0.2)
    host.send([7, 8])
    assert host.read_n(6) == [
        emit_frame(["task_ids", [7, 8]], anchors=["10"]),
        {"command": "ack", "id": "10"},
        {"command": "sync"},
        emit_frame(["echo", "q"], anchors=["11"]),
        {"command": "ack", "id": "11"},
        {"command": "sync"},
    ]
    # default stream: no "stream" key; an empty task-id list is a valid reply
    host.send(tup("12", ["emit", ["y"], None]))
    frame = host.read()
    assert "stream" not in frame and frame["tuple"] == ["y"]
    host.send([])
    assert host.read_n(2) == [emit_frame(["task_ids", []], anchors=["12"]), {"command": "ack", "id": "12"}]
    host.expect_silence()


def test_ack_fail_ids_echoed_byte_for_byte(spawn):
    host = conformance(spawn, "bolt")
    ids = ["-9223372036854775808", "0012", "42", "9223372036854775807"]
    data = b"".join(
        b'{"id":"%s","comp":"src","stream":"default","task":7,"tuple":["%s"]}\nend\n'
        % (i.encode(), b"ack" if n % 2 == 0 else b"fail")
        for n, i in enumerate(ids)
    )
    host.write(data)
    raws = [host.read_raw() for _ in ids]
    assert raws == [
        b'{"command":"ack","id":"-9223372036854775808"}',
        b'{"command":"fail","id":"0012"}',
        b'{"command":"ack","id":"42"}',
        b'{"command":"fail","id":"9223372036854775807"}',
    ]


def test_anchors_are_lists_of_id_strings_hold_release(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("1", ["hold"]))
    host.send(tup("-2", ["hold"]))
    host.send(tup("0003", ["release", ["r"]]))
    assert host.read_n(4) == [
        emit_frame(["r"], anchors=["1", "-2", "0003"]),
        {"command": "ack", "id": "1"},
        {"command": "ack", "id": "-2"},
        {"command": "ack", "id": "0003"},
    ]


def test_need_task_ids_false_awaits_no_reply(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("1", ["echo", 1, None, {"a": [True]}]))
    host.send(tup("2", ["emit_many", 3]))
    host.send(tup("3", ["emit_unanchored", ["u"]]))
    assert host.read_n(8) == [
        emit_frame(["echo", 1, None, {"a": [True]}], anchors=["1"]),
        {"command": "ack", "id": "1"},
        emit_frame(["n", 0], anchors=["2"]),
        emit_frame(["n", 1], anchors=["2"]),
        emit_frame(["n", 2], anchors=["2"]),
        {"command": "ack", "id": "2"},
        emit_frame(["u"]),
        {"command": "ack", "id": "3"},
    ]
    assert b'"need_task_ids":false' in host.stdout


def test_direct_emit_sends_task_and_awaits_nothing(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("9", ["emit_direct", 4, ["d", 2]]))
    frame = host.read()
    assert frame.pop("need_task_ids", False) is False
    assert frame == {"command": "emit", "anchors": ["9"], "task": 4, "tuple": ["d", 2]}
    assert host.read() == {"command": "ack", "id": "9"}


def test_log_error_metrics_and_unknown_action(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("1", ["log", "careful", 3]))
    host.send(tup("2", ["error", "bad thing"]))
    host.send(tup("3", ["metrics", "latency", {"p99": 1.5, "n": [1, 2]}]))
    host.send(tup("4", ["nope"]))
    host.send(tup("5", ["fail"]))
    assert host.read_n(9) == [
        {"command": "log", "msg": "careful", "level": 3},
        {"command": "ack", "id": "1"},
        {"command": "error", "msg": "bad thing"},
        {"command": "ack", "id": "2"},
        {"command": "metrics", "name": "latency", "params": {"p99": 1.5, "n": [1, 2]}},
        {"command": "ack", "id": "3"},
        {"command": "error", "msg": "unknown action: nope"},
        {"command": "fail", "id": "4"},
        {"command": "fail", "id": "5"},
    ]


def test_ticks_go_to_the_tick_hook_only(spawn):
    host = conformance(spawn, "bolt")
    host.send(tick("77", 30))
    assert host.read_n(2) == [emit_frame(["tick", 30], anchors=["77"]), {"command": "ack", "id": "77"}]
    basic = conformance(spawn, "basic")
    basic.send(tick("78", 5))
    assert basic.read_n(2) == [emit_frame(["tick", 5], anchors=["78"]), {"command": "ack", "id": "78"}]
    basic.expect_silence(0.1)
    split = spawn(RUBY_DIR / "split_bolt.rb")
    split.handshake()
    split.send(tick("79"))
    assert split.read() == {"command": "ack", "id": "79"}
    split.expect_silence()


def test_unicode_emoji_and_escaped_slashes(spawn):
    host = conformance(spawn, "bolt")
    host.write(
        '{"id":"1","comp":"src","stream":"default","task":7,'
        '"tuple":["echo","a\\/b","\\ud83d\\ude00 \\u00e9","naïve 😀 日本","\\u2028"]}\nend\n'.encode()
    )
    raw = host.read_raw()
    assert raw == '{"command":"emit","anchors":["1"],"tuple":["echo","a/b","😀 é","naïve 😀 日本","\u2028"],"need_task_ids":false}'.encode()
    assert host.read() == {"command": "ack", "id": "1"}


def test_framing_multiline_blank_lines_crlf_and_chunks(spawn):
    host = conformance(spawn, "bolt")
    pretty = json.dumps(tup("1", ["echo", "pretty"]), indent=2).encode() + b"\nend\n"
    crlf = json.dumps(tup("2", ["echo", "crlf"])).encode() + b"\r\nend\r\n"
    blank = b"\n\n" + encode_frame(tup("3", ["echo", "blank"])) + b"\n\r\n"
    host.write(pretty + crlf + blank)
    chunked = encode_frame(tup("4", ["echo", "chunked ünïcode"])) + encode_frame(HEARTBEAT)
    for i in range(0, len(chunked), 7):  # split everywhere, also inside UTF-8 sequences
        host.write(chunked[i : i + 7])
        time.sleep(0.001)
    expected = []
    for i, word in enumerate(["pretty", "crlf", "blank", "chunked ünïcode"], 1):
        expected += [emit_frame(["echo", word], anchors=[str(i)]), {"command": "ack", "id": str(i)}]
    assert host.read_n(9) == expected + [{"command": "sync"}]


def test_large_tuple_one_megabyte(spawn):
    host = conformance(spawn, "bolt")
    big = ("x" * 1023 + "é") * 1024  # > 1 MB of UTF-8
    host.send(tup("1", ["echo", big, list(range(1000))]))
    assert host.read(timeout=10) == emit_frame(["echo", big, list(range(1000))], anchors=["1"])
    assert host.read() == {"command": "ack", "id": "1"}


def test_task_ids_returned_to_user_code_fifo(spawn, script):
    path = script(
        'Multilang::Bolt.run do |tup, bolt|\n'
        '  a = bolt.emit(["a"], anchors: tup, need_task_ids: true)\n'
        '  b = bolt.emit(["b"], stream: "s", anchors: [tup.id], need_task_ids: true)\n'
        '  none = bolt.emit(["c"], anchors: tup)\n'
        '  direct = bolt.emit_direct(5, ["d"], anchors: tup)\n'
        '  bolt.emit(["got", a, b, none, direct], need_task_ids: false)\n'
        '  bolt.ack(tup)\n'
        'end\n'
    )
    host = spawn(path)
    host.handshake()
    host.send(tup("1", ["go"]))
    assert host.read() == emit_frame(["a"], anchors=["1"], need_task_ids=True)
    host.send([3])
    assert host.read() == emit_frame(["b"], anchors=["1"], stream="s", need_task_ids=True)
    host.send([4, 2])
    assert host.read_n(4) == [
        emit_frame(["c"], anchors=["1"]),
        emit_frame(["d"], anchors=["1"], task=5),
        emit_frame(["got", [3], [4, 2], None, None]),
        {"command": "ack", "id": "1"},
    ]


def test_exit_action_exits_with_code(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("1", ["ack"]))
    assert host.read() == {"command": "ack", "id": "1"}
    host.send(tup("2", ["exit", 3]))
    assert host.wait(2.0) == 3


def test_plain_bolt_exception_and_bad_frame_exit_nonzero(spawn, script):
    path = script('Multilang::Bolt.run { |tup, bolt| raise IOError, "disk gone" }')
    host = spawn(path)
    host.handshake()
    host.send(tup("1", ["x"]))
    error = host.read()
    assert error["command"] == "error" and "disk gone (IOError)" in error["msg"]
    assert host.wait(2.0) == 1
    bad = conformance(spawn, "bolt")
    bad.write(b"{not json\nend\n")
    error = bad.read()
    assert error["command"] == "error" and "{not json" in error["msg"]
    assert bad.wait(2.0) == 1


# ---------------------------------------------------------------------------
# BasicBolt
# ---------------------------------------------------------------------------


def test_basic_bolt_exception_sends_error_then_fail_and_keeps_running(spawn):
    host = conformance(spawn, "basic")
    host.send(tup("1", ["raise", "boom 💥"]))
    error = host.read()
    assert error["command"] == "error"
    assert "boom 💥" in error["msg"] and "RuntimeError" in error["msg"]
    assert "conformance_component.rb" in error["msg"]  # backtrace
    assert host.read() == {"command": "fail", "id": "1"}
    host.send(tup("2", ["echo", "still alive"]))
    host.send(tup("3", ["other"]))
    assert host.read_n(3) == [
        emit_frame(["echo", "still alive"], anchors=["2"]),
        {"command": "ack", "id": "2"},
        {"command": "ack", "id": "3"},
    ]
    host.expect_silence()


def test_basic_bolt_block_style_and_explicit_finish(spawn, script):
    path = script(
        'Multilang::BasicBolt.run(prepare: ->(conf, ctx, bolt) { bolt.log("ready") }) do |tup, bolt|\n'
        '  case tup.values[0]\n'
        '  when "fail" then bolt.fail(tup)\n'
        '  when "unanchored" then bolt.emit(["u"], anchors: [])\n'
        '  when "raise_after_ack" then bolt.ack(tup); raise ArgumentError, "late"\n'
        '  else bolt.emit([tup.values[0].upcase])\n'
        '  end\n'
        'end\n'
    )
    host = spawn(path)
    host.handshake()
    assert host.read() == {"command": "log", "msg": "ready", "level": 2}
    host.send(tup("1", ["hi"]))
    host.send(tup("2", ["fail"]))
    host.send(tup("3", ["unanchored"]))
    host.send(tup("4", ["raise_after_ack"]))
    host.send(tup("5", ["ok"]))
    frames = host.read_n(8)
    assert frames[:6] == [
        emit_frame(["HI"], anchors=["1"]),
        {"command": "ack", "id": "1"},
        {"command": "fail", "id": "2"},
        emit_frame(["u"]),
        {"command": "ack", "id": "3"},
        {"command": "ack", "id": "4"},
    ]
    assert frames[6]["command"] == "error" and "late (ArgumentError)" in frames[6]["msg"]
    assert frames[7] == emit_frame(["OK"], anchors=["5"])  # no fail for the already acked 4
    assert host.read() == {"command": "ack", "id": "5"}


# ---------------------------------------------------------------------------
# Spouts
# ---------------------------------------------------------------------------


def test_spout_conformance_sync_per_command_and_id_types(spawn):
    host = conformance(spawn, "spout")
    # emitted while opening, before any command
    assert host.read() == {"command": "emit", "id": "open", "tuple": ["open"], "need_task_ids": False}
    host.send({"command": "activate", "id": ""})
    assert host.read_n(2) == [{"command": "emit", "tuple": ["activated"], "need_task_ids": False}, {"command": "sync"}]
    expected_ids = [0, "1", -2, "-3", 4.5, {"k": [5]}, None]
    for k, msg_id in enumerate(expected_ids):
        host.send({"command": "next", "id": ""})
        frame = host.read()
        assert frame.pop("need_task_ids", True) is True
        assert same_json(frame.pop("id", None), msg_id), (k, frame)
        assert frame == {"command": "emit", "tuple": ["next", k]}
        host.send([k, 100])
        assert host.read_n(2) == [
            {"command": "emit", "tuple": ["task_ids", [k, 100]], "need_task_ids": False},
            {"command": "sync"},
        ]
    host.send({"command": "next", "id": ""})
    assert host.read() == {"command": "sync"}
    for cmd, word in (("ack", "acked"), ("fail", "failed")):
        for msg_id in (0, "1", -2, 4.5, {"k": [5]}):
            host.send({"command": cmd, "id": msg_id})
            emitted, sync = host.read_n(2)
            assert sync == {"command": "sync"}
            assert emitted["tuple"][0] == word and same_json(emitted["tuple"][1], msg_id), emitted
    host.send({"command": "bogus", "id": ""})
    warning, sync = host.read_n(2)
    assert warning["command"] == "log" and warning["level"] == 3 and "bogus" in warning["msg"]
    assert sync == {"command": "sync"}
    host.send({"command": "deactivate", "id": ""})
    assert host.read_n(2) == [{"command": "emit", "tuple": ["deactivated"], "need_task_ids": False}, {"command": "sync"}]
    host.expect_silence()
    assert b'"id":4.5' in host.stdout and b'"id":0,' in host.stdout


def test_spout_defaults_sync_once_and_queue_commands_during_task_id_wait(spawn, script):
    path = script(
        'class S < Multilang::Spout\n'
        '  def open(conf, context)\n'
        '    @ids = emit(["opening"], msg_id: 0, need_task_ids: true)\n'
        '  end\n'
        '  def next_tuple\n'
        '    emit(["ids", @ids]) if @ids\n'
        '    @ids = nil\n'
        '  end\n'
        'end\n'
        'S.run\n'
    )
    host = spawn(path)
    host.handshake()
    assert host.read() == {"command": "emit", "id": 0, "tuple": ["opening"], "need_task_ids": True}
    # A host reads open-time emits only once it has sent the first command.
    host.send({"command": "activate", "id": ""})
    host.send([9])
    assert host.read() == {"command": "sync"}
    for cmd in ({"command": "next", "id": ""}, {"command": "ack", "id": 1}, {"command": "fail", "id": "x"},
                {"command": "deactivate", "id": ""}, {"command": "next", "id": ""}):
        host.send(cmd)
    frames = host.read_n(6)
    assert frames == [
        {"command": "emit", "tuple": ["ids", [9]], "need_task_ids": False},
        {"command": "sync"},
        {"command": "sync"},
        {"command": "sync"},
        {"command": "sync"},
        {"command": "sync"},
    ]
    host.send({"command": "mystery", "id": ""})
    assert host.read()["command"] == "log"
    assert host.read() == {"command": "sync"}
    host.expect_silence()


# ---------------------------------------------------------------------------
# stdin EOF
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bolt", "basic", "spout"])
def test_stdin_eof_exits_promptly_with_status_zero(spawn, mode):
    host = conformance(spawn, mode)
    host.close_stdin()
    assert host.wait(2.0) == 0
    host.wait_closed(2)
    assert "Error" not in host.stderr_text() and "from " not in host.stderr_text()


def test_stdin_eof_while_waiting_for_task_ids_and_before_handshake(spawn):
    host = conformance(spawn, "bolt")
    host.send(tup("1", ["emit", ["x"], None]))
    host.read()
    host.close_stdin()
    assert host.wait(2.0) == 0
    early = spawn(CONFORMANCE, "bolt")
    early.close_stdin()
    assert early.wait(2.0) == 0
    assert early.stdout == b""


# ---------------------------------------------------------------------------
# Word-count examples
# ---------------------------------------------------------------------------


def test_split_bolt_words(spawn):
    host = spawn(RUBY_DIR / "split_bolt.rb")
    host.handshake()
    host.send(tup("1", ["  Hello, World! \"Quoted\"\tTABS\nnew-line ... (x) ÉCOLE Über_ "]))
    words = ["hello", "world", "quoted", "tabs", "new-line", "x", "École", "Über"]  # only A-Z lowered
    frames = host.read_n(len(words) + 1)
    assert frames[:-1] == [emit_frame([w], anchors=["1"]) for w in words]
    assert frames[-1] == {"command": "ack", "id": "1"}
    host.send(tup("2", ["--- !!! ..."]))
    assert host.read() == {"command": "ack", "id": "2"}
    host.send(tup("3", ["It's the CAT's\x0bpajamas\x0cyes\rno"]))
    frames = host.read_n(7)
    assert [f["tuple"][0] for f in frames[:-1]] == ["it's", "the", "cat's", "pajamas", "yes", "no"]
    assert frames[-1] == {"command": "ack", "id": "3"}


def test_count_bolt_counts(spawn):
    host = spawn(RUBY_DIR / "count_bolt.rb")
    host.handshake()
    words = ["the", "cat", "the", "hat", "the", "cat"]
    for i, w in enumerate(words):
        host.send(tup(str(i), [w]))
    frames = host.read_n(2 * len(words))
    assert frames[0::2] == [
        emit_frame(["the", 1], anchors=["0"]),
        emit_frame(["cat", 1], anchors=["1"]),
        emit_frame(["the", 2], anchors=["2"]),
        emit_frame(["hat", 1], anchors=["3"]),
        emit_frame(["the", 3], anchors=["4"]),
        emit_frame(["cat", 2], anchors=["5"]),
    ]
    assert frames[1::2] == [{"command": "ack", "id": str(i)} for i in range(len(words))]


def test_sentence_spout_ids_replay_and_exhaustion(spawn, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "text.txt").write_text("  The cat  \n\n\t\nsat on\r\nthe mat.\n")
    host = spawn(RUBY_DIR / "sentence_spout.rb", "data/text.txt")
    host.handshake()
    host.send({"command": "activate", "id": ""})
    assert host.read() == {"command": "sync"}

    def next_():
        host.send({"command": "next", "id": ""})
        frames = []
        while True:
            f = host.read()
            if f == {"command": "sync"}:
                return frames
            frames.append(f)

    emitted = [next_() for _ in range(3)]
    assert emitted == [
        [{"command": "emit", "id": 0, "tuple": ["The cat"], "need_task_ids": False}],
        [{"command": "emit", "id": 3, "tuple": ["sat on"], "need_task_ids": False}],
        [{"command": "emit", "id": 4, "tuple": ["the mat."], "need_task_ids": False}],
    ]
    assert next_() == []
    host.send({"command": "ack", "id": 0})
    host.send({"command": "fail", "id": 3})
    assert host.read_n(2) == [{"command": "sync"}, {"command": "sync"}]
    assert next_() == [{"command": "emit", "id": 3, "tuple": ["sat on"], "need_task_ids": False}]
    assert next_() == []
    host.send({"command": "ack", "id": 3})
    host.send({"command": "ack", "id": 4})
    assert host.read_n(2) == [{"command": "sync"}, {"command": "sync"}]
    assert next_() == []


# ---------------------------------------------------------------------------
# Extension batch (spec §9.5)
# ---------------------------------------------------------------------------

OFFER = ("batch",)


def batch_handshake(host, offer=OFFER, accepted=("batch",)) -> dict:
    return host.handshake(offer=offer, accept=accepted)


def batch_conformance(spawn, mode: str) -> ComponentProcess:
    host = spawn(CONFORMANCE, mode)
    batch_handshake(host)
    assert host.read() == {"command": "log", "msg": f"multilang-conformance ready mode={mode} lang=ruby", "level": 2}
    return host


def test_batch_accepted_tuple_batches_in_order(spawn):
    host = batch_conformance(spawn, "bolt")
    host.send(tuples(tup("1", ["echo", "a"]), tup("2", ["fail"]), tick("3", 5), tup("-4", ["hold"]),
                     tup("0005", ["release", ["r"]]), tup("6", ["emit_unanchored", ["u", None]])))
    assert host.read_raw() == (
        b'{"command":"batch","emits":[[["echo","a"],["1"]],[["tick",5],["3"]],[["r"],["-4","0005"]],[["u",null]]],'
        b'"acks":["1","3","-4","0005","6"],"fails":["2"]}'
    )
    host.expect_silence()


def test_batch_standard_frames_close_the_batch_first(spawn):
    host = batch_conformance(spawn, "bolt")
    host.send(tuples(tup("1", ["echo", "a"]), tup("2", ["print", "p"]), tup("3", ["emit_direct", 4, ["d"]]),
                     tup("4", ["emit", ["x"], "words"])))
    assert host.read_n(6) == [
        {"command": "batch", "emits": [[["echo", "a"], ["1"]]], "acks": ["1"]},
        {"command": "log", "msg": "p"},
        {"command": "batch", "acks": ["2"]},
        {"command": "emit", "anchors": ["3"], "task": 4, "tuple": ["d"], "need_task_ids": False},
        {"command": "batch", "acks": ["3"]},
        {"command": "emit", "anchors": ["4"], "stream": "words", "tuple": ["x"], "need_task_ids": True},
    ]
    # Arriving while the bolt waits for task ids: queued, then handled in order.
    host.send(HEARTBEAT)
    host.send(tuples(tup("5", ["echo", "q"])))
    host.expect_silence(0.2)
    host.send([4, 5])
    assert host.read_n(3) == [
        {"command": "batch", "emits": [[["task_ids", [4, 5]], ["4"]]], "acks": ["4"]},
        {"command": "sync"},
        {"command": "batch", "emits": [[["echo", "q"], ["5"]]], "acks": ["5"]},
    ]
    host.expect_silence()


def test_batch_closed_at_1024_elements(spawn):
    host = batch_conformance(spawn, "bolt")
    host.send(tup("1", ["emit_many", 1100]))
    first, second = host.read_n(2)
    assert first == {"command": "batch", "emits": [[["n", i], ["1"]] for i in range(1024)]}
    assert second == {"command": "batch", "emits": [[["n", i], ["1"]] for i in range(1024, 1100)], "acks": ["1"]}
    host.expect_silence()


def test_batch_basic_bolt_streams_and_errors(spawn, script):
    path = script(
        'Multilang::BasicBolt.run do |tup, bolt|\n'
        '  case tup.values[0]\n'
        '  when "raise" then raise ArgumentError, "boom"\n'
        '  when "stream" then bolt.emit(["s"], stream: "words")\n'
        '  when "unanchored" then bolt.emit(["u"], anchors: [], stream: "default")\n'
        '  else bolt.emit([tup.values[0].upcase])\n'
        '  end\n'
        'end\n'
    )
    host = spawn(path)
    batch_handshake(host)
    host.send(tuples(tup("1", ["hi"]), tup("2", ["stream"]), tup("3", ["unanchored"]), tup("4", ["raise"]),
                     tup("5", ["ok"]), tick("6")))
    frames = host.read_n(3)
    assert frames[0] == {"command": "batch", "emits": [[["HI"], ["1"]], [["s"], ["2"], "words"], [["u"]]],
                         "acks": ["1", "2", "3"]}
    assert frames[1]["command"] == "error" and "boom (ArgumentError)" in frames[1]["msg"]
    assert frames[2] == {"command": "batch", "emits": [[["OK"], ["5"]]], "acks": ["5", "6"], "fails": ["4"]}
    host.expect_silence()


def test_batch_spout_message_ids_then_one_sync(spawn, script):
    path = script(
        'class S < Multilang::Spout\n'
        '  IDS = [0, "1", -2, "-3", 4.5, { "k" => [5] }, false, "", nil].freeze\n'
        '  def open(conf, context); emit(["open"], msg_id: "o"); end\n'
        '  def next_tuple\n'
        '    IDS.each_with_index { |id, i| emit(["n", i], msg_id: id) }\n'
        '    emit(["s"], msg_id: 7, stream: "words")\n'
        '    emit(["t"], stream: "words")\n'
        '  end\n'
        '  def ack(id); emit(["acked", id]); end\n'
        'end\n'
        'S.run\n'
    )
    host = spawn(path)
    batch_handshake(host)
    assert host.read() == {"command": "batch", "emits": [[["open"], "o"]]}
    host.send({"command": "activate", "id": ""})
    assert host.read() == {"command": "sync"}
    host.send({"command": "next", "id": ""})
    raw = host.read_raw()
    assert raw == (
        b'{"command":"batch","emits":[[["n",0],0],[["n",1],"1"],[["n",2],-2],[["n",3],"-3"],[["n",4],4.5],'
        b'[["n",5],{"k":[5]}],[["n",6],false],[["n",7],""],[["n",8]],[["s"],7,"words"],[["t"],null,"words"]]}'
    )
    assert host.read() == {"command": "sync"}
    host.send({"command": "ack", "id": {"k": [5]}})
    assert host.read_n(2) == [{"command": "batch", "emits": [[["acked", {"k": [5]}]]]}, {"command": "sync"}]
    host.expect_silence()


@pytest.mark.parametrize("how", ["class", "run-keyword", "instance"])
def test_batch_declined_is_byte_for_byte_standard(spawn, script, how):
    body = {
        "class": 'class B < Multilang::BasicBolt\n  self.extensions = []\n  def process(t); emit([t.values[0]]); end\nend\nB.run\n',
        "run-keyword": 'Multilang::BasicBolt.run(extensions: []) { |t, b| b.emit([t.values[0]]) }\n',
        "instance": 'class B < Multilang::BasicBolt\n  def process(t); emit([t.values[0]]); end\nend\n'
                    'b = B.new\nb.extensions = []\nb.run\n',
    }[how]
    outputs = []
    for offer in ((), OFFER):
        host = spawn(script(body, name=f"declined_{how}.rb"))
        batch_handshake(host, offer=offer, accepted=())
        host.send(tup("1", ["a"]))
        host.send(HEARTBEAT)
        host.send(tick("2"))
        host.read_n(4)
        outputs.append(bytes(host.stdout).split(b"\nend\n", 1)[1])
    assert outputs[0] == outputs[1]
    assert outputs[0] == (
        b'{"command":"emit","anchors":["1"],"tuple":["a"],"need_task_ids":false}\nend\n'
        b'{"command":"ack","id":"1"}\nend\n{"command":"sync"}\nend\n{"command":"ack","id":"2"}\nend\n'
    )


def test_batch_subclass_inherits_class_setting(spawn, script):
    path = script(
        'class Base < Multilang::Bolt\n  self.extensions = []\nend\n'
        'class B < Base\n  def process(t); ack(t); end\nend\n'
        'raise "inherit" unless B.extensions == [] && Multilang::Bolt.extensions == ["batch", "msgpack"]\n'
        'B.run\n'
    )
    host = spawn(path)
    batch_handshake(host, accepted=())
    host.send(tup("1", ["a"]))
    assert host.read() == {"command": "ack", "id": "1"}


def test_tuple_batch_without_negotiation_is_a_protocol_error(spawn):
    host = conformance(spawn, "bolt")
    host.send(tuples(tup("1", ["ack"])))
    frame = host.read()
    assert frame["command"] == "error" and "batch extension" in frame["msg"]
    assert host.wait(2.0) == 1


def test_a_burst_is_answered_halfway_so_a_windowed_host_can_refill(spawn, script, tmp_path):
    """As in the Python library: the first half of a burst is flushed before
    the second half is handled; here the second half's first tuple waits
    until the host has seen the first half's acks (spec §5.3)."""
    go = tmp_path / "go"
    path = script(
        "Multilang::BasicBolt.run do |tup, bolt|\n"
        "  if tup.values[0] == 16\n"
        f"    deadline = Time.now + {GATE_SECS}\n"
        f"    sleep 0.01 until File.exist?({json.dumps(str(go))}) || Time.now > deadline\n"
        "  end\n"
        "  bolt.emit([tup.values[0]])\n"
        "end\n"
    )
    host = spawn(path)
    host.handshake()
    check_burst_answered_halfway(host, go)


@pytest.mark.parametrize("case", ["frame", "unterminated", "multi-line"])
def test_json_input_over_the_frame_limit_is_refused(spawn, case):
    """Spec §1.3: the reader never buffers more than multilang.max.frame.bytes
    waiting for a terminator; it reports the error and exits 1."""
    host = spawn(CONFORMANCE, "bolt")
    host.handshake(conf={"multilang.max.frame.bytes": 4096})
    assert host.read()["command"] == "log"  # ready
    big = json.dumps(tup("1", ["x" * 5000])).encode()
    host.write({"frame": big + b"\nend\n", "unterminated": big,
                "multi-line": b'{"id":"1",\n' + b'"comp":"src",\n' * 400}[case])
    error = host.read(timeout=3)
    assert error["command"] == "error" and "exceeds the 4096-byte limit" in error["msg"], error
    assert host.wait(3.0) == 1
    host.wait_closed(2)
    assert "exceeds the 4096-byte limit" in host.stderr_text()
