"""The `msgpack` extension (spec §9.6) in the Ruby component library (examples/ruby/multilang.rb).

Real `ruby` processes are driven over pipes by a byte-level host: the
handshake and the pid reply are JSON (multilang.testing.ComponentProcess),
every later frame is a 4-byte big-endian length + one MessagePack object,
built and parsed here with the `msgpack` package (nothing else from the
`multilang` package is used). Every read, write and wait has a deadline; the
processes are killed in teardown.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from multilang.testing import DEFAULT_CONTEXT, ComponentProcess, same_json

msgpack = pytest.importorskip("msgpack")

ROOT = Path(__file__).resolve().parents[2]
RUBY_DIR = ROOT / "examples" / "ruby"
LIB = RUBY_DIR / "multilang.rb"
CONFORMANCE = RUBY_DIR / "conformance_component.rb"
ECHO = ROOT / "bench" / "components" / "ruby_echo.rb"
RUBY = shutil.which("ruby")

pytestmark = pytest.mark.skipif(RUBY is None, reason="ruby is not installed")

CONTEXT = {**DEFAULT_CONTEXT, "task->component": {"1": "spout", "2": "split", "3": "split", "4": "count"}}
HEARTBEAT = {"id": "-6437389063516893232", "comp": None, "stream": "__heartbeat", "task": -1, "tuple": []}
SYNC = {"command": "sync"}
MP = ("msgpack",)
BATCH_MP = ("batch", "msgpack")


def pack(obj: Any) -> bytes:
    """obj as one msgpack frame: 4-byte big-endian length, then the body."""
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def tup(tid: str, values, comp: str = "src", stream: str = "default", task: int = 7) -> dict:
    return {"id": tid, "comp": comp, "stream": stream, "task": task, "tuple": values}


def tick(tid: str, secs: int = 30) -> dict:
    return {"id": tid, "comp": "__system", "stream": "__tick", "task": -1, "tuple": [secs]}


def tuples(*ts: dict) -> dict:
    return {"tuples": [[t["id"], t["comp"], t["stream"], t["task"], t["tuple"]] for t in ts]}


def emit_frame(values, anchors=(), stream=None, need_task_ids=False, task=None) -> dict:
    frame: dict[str, Any] = {"command": "emit", "anchors": list(anchors)}
    if stream is not None:
        frame["stream"] = stream
    if task is not None:
        frame["task"] = task
    frame["tuple"] = values
    frame["need_task_ids"] = need_task_ids
    return frame


def _json_only(obj: Any, where: str = "frame") -> None:
    """Fail on values outside JSON's data model (bin decodes to bytes, ext to ExtType)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, str), f"non-string map key {k!r} in {where}"
            _json_only(v, where)
    elif isinstance(obj, list):
        for v in obj:
            _json_only(v, where)
    else:
        assert obj is None or isinstance(obj, (str, int, float, bool)), f"{obj!r} in {where} is not a JSON value"


class MsgpackComponent(ComponentProcess):
    """A ComponentProcess whose frames after the JSON pid reply are msgpack."""

    def send_mp(self, obj: Any, timeout: float | None = None) -> None:
        self.write(pack(obj), timeout)

    def _next_mp(self) -> bytes | None:  # lock held
        buf, pos = self.stdout, self._pos
        if len(buf) - pos < 4:
            return None
        (n,) = struct.unpack_from(">I", buf, pos)
        if len(buf) - pos - 4 < n:
            return None
        body = bytes(buf[pos + 4 : pos + 4 + n])
        self._pos = self._scan = pos + 4 + n
        return body

    def _mp_or_eof(self, timeout: float | None) -> bytes | None:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                body = self._next_mp()
                if body is not None or self._eof:
                    return body
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no msgpack frame within {timeout:g}s; {self._context()}")
                self._cond.wait(left)

    def read_mp_raw(self, timeout: float | None = None) -> bytes:
        """The body of the next frame (length prefix stripped)."""
        body = self._mp_or_eof(timeout)
        if body is None:
            raise AssertionError(f"the component closed its stdout; {self._context()}")
        assert body, "a frame with length 0"
        return body

    def read_mp(self, timeout: float | None = None) -> Any:
        body = self.read_mp_raw(timeout)
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)  # raises on trailing bytes
        assert isinstance(obj, (dict, list)), f"frame object {obj!r} is not a map or an array"
        _json_only(obj)
        return obj

    def read_mp_n(self, n: int, timeout: float | None = None) -> list[Any]:
        return [self.read_mp(timeout) for _ in range(n)]

    def read_mp_eof(self, timeout: float | None = None) -> None:
        body = self._mp_or_eof(timeout)
        assert body is None, f"unexpected frame {body[:200]!r} instead of the end of stdout"


@pytest.fixture
def spawn(tmp_path):
    """spawn(script, *args) -> a MsgpackComponent running ruby (killed in teardown)."""
    procs: list[MsgpackComponent] = []

    def _spawn(*args, cwd=None, timeout: float = 5.0) -> MsgpackComponent:
        proc = MsgpackComponent([RUBY, *args], cwd=cwd or tmp_path, pid_dir=tmp_path / "pids", context=CONTEXT,
                                timeout=timeout)
        procs.append(proc)
        return proc

    yield _spawn
    for proc in procs:
        proc.close()


@pytest.fixture
def script(tmp_path):
    """Write a Ruby component script that loads the library; return its path."""

    def _script(body: str, name: str = "component.rb") -> Path:
        path = tmp_path / name
        path.write_text(f"require {json.dumps(str(LIB))}\n{body}\n")
        return path

    return _script


def mp_handshake(host: MsgpackComponent, offer=MP, accept=None, conf=None) -> dict:
    conf = dict(conf or {})
    return host.handshake(conf, offer=list(offer), accept=list(offer if accept is None else accept))


def conformance(spawn, mode: str, offer=MP) -> MsgpackComponent:
    host = spawn(CONFORMANCE, mode)
    mp_handshake(host, offer)
    assert host.read_mp() == {"command": "log", "msg": f"multilang-conformance ready mode={mode} lang=ruby",
                              "level": 2}
    return host


# ---------------------------------------------------------------------------
# Negotiation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("offer, accepted", [
    (["msgpack"], ["msgpack"]),
    (["batch", "msgpack"], ["batch", "msgpack"]),
    (["msgpack", "batch", "zstd"], ["batch", "msgpack"]),
])
def test_pid_reply_accepts_msgpack_when_offered(spawn, offer, accepted):
    host = spawn(ECHO)
    host.handshake({}, offer=offer, accept=accepted)
    host.send_mp(tup("17", ["x"]))
    if "batch" in accepted:
        assert host.read_mp() == {"command": "batch", "emits": [[["x"], ["17"]]], "acks": ["17"]}
    else:
        assert host.read_mp_n(2) == [emit_frame(["x"], anchors=["17"]), {"command": "ack", "id": "17"}]


@pytest.mark.parametrize("offer", [None, [], ["batch"]])
def test_msgpack_not_offered_stays_json_byte_for_byte(spawn, offer):
    host = spawn(ECHO)
    accept = ["batch"] if offer == ["batch"] else []
    host.handshake({}, offer=offer, accept=accept)
    host.send(tup("1", ["a", 1.5]))
    host.send(HEARTBEAT)
    out = host.read_raw()
    if offer == ["batch"]:
        assert out == b'{"command":"batch","emits":[[["a",1.5],["1"]]],"acks":["1"]}'
    else:
        assert out == b'{"command":"emit","anchors":["1"],"tuple":["a",1.5],"need_task_ids":false}'
        assert host.read_raw() == b'{"command":"ack","id":"1"}'
    assert host.read_raw() == b'{"command":"sync"}'
    host.expect_silence()


@pytest.mark.parametrize("how", ["class", "run-keyword", "instance"])
def test_component_can_decline_msgpack(spawn, script, how):
    body = {
        "class": 'class B < Multilang::Bolt\n  self.extensions = ["batch"]\n  def process(t); ack(t); end\nend\n'
                 'raise "default" unless Multilang::Bolt.extensions == ["batch", "msgpack"]\nB.run\n',
        "run-keyword": 'Multilang::Bolt.run(extensions: ["batch"]) { |t, b| b.ack(t) }\n',
        "instance": 'class B < Multilang::Bolt\n  def process(t); ack(t); end\nend\n'
                    'b = B.new\nb.extensions = %w[batch]\nb.run\n',
    }[how]
    host = spawn(script(body, name=f"decline_{how}.rb"))
    host.handshake({}, offer=["batch", "msgpack"], accept=["batch"])
    host.send(tup("1", ["a"]))
    assert host.read_raw() == b'{"command":"batch","acks":["1"]}'
    none = spawn(script('Multilang::Bolt.run(extensions: []) { |t, b| b.ack(t) }\n', name="none.rb"))
    none.handshake({}, offer=["batch", "msgpack"], accept=[])
    none.send(tup("2", ["a"]))
    assert none.read_raw() == b'{"command":"ack","id":"2"}'


def test_output_printed_before_the_handshake_is_sent_as_msgpack(spawn, script):
    path = script(
        'puts "printed at load time"\n'
        'class B < Multilang::Bolt\n'
        '  def prepare(conf, context); log("prepared #{task_id}"); end\n'
        '  def process(tup)\n'
        '    puts "printing #{tup.values[0]}"\n'
        '    ack(tup)\n'
        '  end\n'
        'end\n'
        'B.run\n'
    )
    host = spawn(path)
    time.sleep(0.2)
    mp_handshake(host)
    assert host.read_mp_n(2) == [
        {"command": "log", "msg": "printed at load time"},
        {"command": "log", "msg": "prepared 2", "level": 2},
    ]
    host.send_mp(tup("1", ["ü"]))
    assert host.read_mp_n(2) == [{"command": "log", "msg": "printing ü"}, {"command": "ack", "id": "1"}]
    # after the JSON pid reply, nothing on stdout is JSON text
    assert b"\nend\n" not in bytes(host.stdout).split(b"\nend\n", 1)[1]


# ---------------------------------------------------------------------------
# Bolts
# ---------------------------------------------------------------------------


def test_echo_bolt_emits_anchored_and_acks_ids_exactly(spawn):
    host = spawn(ECHO)
    mp_handshake(host)
    ids = ["17", "-9223372036854775808", "0012", "9223372036854775807", "", "ünï"]
    for i in ids:
        host.send_mp(tup(i, ["w", i]))
    for i in ids:
        emit = host.read_mp_raw()
        ack = host.read_mp_raw()
        # byte for byte what a msgpack writer using the shortest forms writes
        assert emit == msgpack.packb(emit_frame(["w", i], anchors=[i]))
        assert ack == msgpack.packb({"command": "ack", "id": i})
    # spec §9.6's example: {"command":"ack","id":"17"} is these 23 bytes
    assert bytes(host.stdout).find(bytes.fromhex("00000013 82 a7") + b"command" + b"\xa3ack\xa2id\xa217") > 0
    host.expect_silence()


def test_heartbeat_answered_with_sync(spawn):
    host = conformance(spawn, "bolt")
    host.send_mp(HEARTBEAT)
    assert host.read_mp_raw() == b"\x81\xa7command\xa4sync"
    assert bytes(host.stdout).endswith(b"\x00\x00\x00\x0e\x81\xa7command\xa4sync")
    host.send_mp(HEARTBEAT)
    host.send_mp(tup("5", ["ack"]))
    assert host.read_mp_n(2) == [SYNC, {"command": "ack", "id": "5"}]
    host.expect_silence()


def test_ticks_go_to_the_tick_hook(spawn):
    host = conformance(spawn, "bolt")
    host.send_mp(tick("77", 30))
    assert host.read_mp_n(2) == [emit_frame(["tick", 30], anchors=["77"]), {"command": "ack", "id": "77"}]
    split = spawn(RUBY_DIR / "split_bolt.rb")
    mp_handshake(split)
    split.send_mp(tick("79"))
    assert split.read_mp() == {"command": "ack", "id": "79"}
    split.send_mp(tup("80", ["The CAT, sat."]))
    assert split.read_mp_n(4) == [emit_frame([w], anchors=["80"]) for w in ("the", "cat", "sat")] + [
        {"command": "ack", "id": "80"}]
    split.expect_silence()


def test_unicode_floats_and_64_bit_ints_round_trip(spawn):
    host = conformance(spawn, "bolt")
    values = ["echo", "naïve 😀 日本", "\u2028", "", "x" * 40, "é" * 300, 1.5, -0.0, 1e300, 5e-324, 0.1,
              0, 127, 128, -32, -33, 255, 65536, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -2**63, -2**31 - 1,
              None, True, False, [], {}, {"k": [1, {"x": None}], "ü": "ö"}, list(range(20))]
    host.send_mp(tup("1", values))
    emit = host.read_mp_raw()
    assert emit == msgpack.packb(emit_frame(values, anchors=["1"]))  # shortest int forms, float 64
    assert same_json(msgpack.unpackb(emit)["tuple"], values)
    assert host.read_mp() == {"command": "ack", "id": "1"}
    # A reader accepts any int form within 64 bits and float 32.
    body = (b"\x85\xa2id\xa12\xa4comp\xa3src\xa6stream\xa7default\xa4task\xcf" + struct.pack(">Q", 7)
            + b"\xa5tuple\x95\xa4echo\xca" + struct.pack(">f", 2.5) + b"\xd3" + struct.pack(">q", -1)
            + b"\xcd\x00\x05" + b"\xda\x00\x02ok")
    host.write(struct.pack(">I", len(body)) + body)
    emit = host.read_mp()
    assert same_json(emit["tuple"], ["echo", 2.5, -1, 5, "ok"])
    assert host.read_mp() == {"command": "ack", "id": "2"}


def test_metrics_log_error_and_task_ids(spawn):
    host = conformance(spawn, "bolt")
    host.send_mp(tup("1", ["log", "careful", 3]))
    host.send_mp(tup("2", ["error", "bad thing"]))
    host.send_mp(tup("3", ["metrics", "latency", {"p99": 1.5, "n": [1, 2]}]))
    assert host.read_mp_n(6) == [
        {"command": "log", "msg": "careful", "level": 3},
        {"command": "ack", "id": "1"},
        {"command": "error", "msg": "bad thing"},
        {"command": "ack", "id": "2"},
        {"command": "metrics", "name": "latency", "params": {"p99": 1.5, "n": [1, 2]}},
        {"command": "ack", "id": "3"},
    ]
    host.send_mp(tup("10", ["emit", ["x", 1], "words"]))
    assert host.read_mp() == emit_frame(["x", 1], anchors=["10"], stream="words", need_task_ids=True)
    host.send_mp(HEARTBEAT)  # queued while waiting for the task-id list
    host.expect_silence(0.2)
    host.send_mp([7, 2**40])
    assert host.read_mp_n(3) == [emit_frame(["task_ids", [7, 2**40]], anchors=["10"]),
                                 {"command": "ack", "id": "10"}, SYNC]
    host.send_mp(tup("11", ["emit_direct", 4, ["d"]]))
    assert host.read_mp_n(2) == [emit_frame(["d"], anchors=["11"], task=4), {"command": "ack", "id": "11"}]


def test_large_tuple_and_many_frames_in_one_write(spawn):
    host = conformance(spawn, "bolt")
    big = ("x" * 1023 + "é") * 1024  # > 1 MB of UTF-8, read in many chunks
    host.send_mp(tup("1", ["echo", big, list(range(1000))]), timeout=10)
    assert host.read_mp(timeout=10) == emit_frame(["echo", big, list(range(1000))], anchors=["1"])
    assert host.read_mp() == {"command": "ack", "id": "1"}
    host.write(b"".join(pack(tup(str(i), ["echo", i])) for i in range(2, 500)))
    frames = host.read_mp_n(2 * 498)
    assert frames[0::2] == [emit_frame(["echo", i], anchors=[str(i)]) for i in range(2, 500)]
    assert frames[1::2] == [{"command": "ack", "id": str(i)} for i in range(2, 500)]


def test_frames_written_one_byte_at_a_time(spawn):
    host = conformance(spawn, "bolt")
    stream = (pack(tup("1", ["echo", "chunked ünïcode"])) + pack(HEARTBEAT) + pack(tick("2", 5))
              + pack(tup("3", ["echo", 2**63, 0.25])))
    for i in range(len(stream)):  # splits the length prefixes and UTF-8 sequences too
        host.write(stream[i : i + 1])
        if i % 16 == 0:
            time.sleep(0.001)
    assert host.read_mp_n(7) == [
        emit_frame(["echo", "chunked ünïcode"], anchors=["1"]),
        {"command": "ack", "id": "1"},
        SYNC,
        emit_frame(["tick", 5], anchors=["2"]),
        {"command": "ack", "id": "2"},
        emit_frame(["echo", 2**63, 0.25], anchors=["3"]),
        {"command": "ack", "id": "3"},
    ]
    host.expect_silence()


def test_basic_bolt_encode_error_is_reported_and_the_bolt_keeps_running(spawn, script):
    path = script(
        'Multilang::BasicBolt.run do |tup, bolt|\n'
        '  case tup.values[0]\n'
        '  when "huge" then bolt.emit([2**64])\n'
        '  when "nan" then bolt.emit([Float::NAN])\n'
        '  else bolt.emit([tup.values[0], { 1 => :sym }])\n'
        '  end\n'
        'end\n'
    )
    for offer in (MP, BATCH_MP):
        host = spawn(path)
        mp_handshake(host, offer)
        # one write: under batch, which output batch tuple 3's answer joins
        # depends on the bolt reading all three at once
        host.write(pack(tup("1", ["huge"])) + pack(tup("2", ["nan"])) + pack(tup("3", ["ok"])))
        if offer == MP:
            frames = host.read_mp_n(6)
            assert frames[1] == {"command": "fail", "id": "1"} and frames[3] == {"command": "fail", "id": "2"}
            assert frames[4:] == [emit_frame(["ok", {"1": "sym"}], anchors=["3"]), {"command": "ack", "id": "3"}]
        else:  # an error frame is a standard frame: it closes the open batch first
            frames = host.read_mp_n(4)
            assert frames[1] == {"command": "batch", "fails": ["1"]}
            assert frames[3] == {"command": "batch", "emits": [[["ok", {"1": "sym"}], ["3"]]], "acks": ["3"],
                                 "fails": ["2"]}
        assert frames[0]["command"] == "error" and "does not fit in 64 bits" in frames[0]["msg"]
        assert frames[2]["command"] == "error" and "NaN" in frames[2]["msg"]
        host.expect_silence()


# ---------------------------------------------------------------------------
# batch + msgpack
# ---------------------------------------------------------------------------


def test_batch_and_msgpack_tuple_batch_in_batch_frame_out(spawn):
    host = spawn(ECHO)
    mp_handshake(host, BATCH_MP)
    host.send_mp(tuples(tup("1", ["a"]), tup("-2", ["b", 2.5]), tick("3", 5), tup("0004", ["ü", 2**64 - 1])))
    raw = host.read_mp_raw()
    expected = {"command": "batch",
                "emits": [[["a"], ["1"]], [["b", 2.5], ["-2"]], [["ü", 2**64 - 1], ["0004"]]],  # a tick is only acked
                "acks": ["1", "-2", "3", "0004"]}
    assert raw == msgpack.packb(expected)
    host.send_mp(HEARTBEAT)
    assert host.read_mp() == SYNC
    host.expect_silence()


def test_batch_and_msgpack_ordering_with_standard_frames(spawn):
    host = conformance(spawn, "bolt", BATCH_MP)
    host.send_mp(tuples(tup("1", ["echo", "a"]), tup("2", ["print", "p"]), tup("3", ["emit_direct", 4, ["d"]]),
                        tup("4", ["fail"]), tup("5", ["emit", ["x"], "words"])))
    assert host.read_mp_n(6) == [
        {"command": "batch", "emits": [[["echo", "a"], ["1"]]], "acks": ["1"]},
        {"command": "log", "msg": "p"},
        {"command": "batch", "acks": ["2"]},
        emit_frame(["d"], anchors=["3"], task=4),
        {"command": "batch", "acks": ["3"], "fails": ["4"]},
        emit_frame(["x"], anchors=["5"], stream="words", need_task_ids=True),
    ]
    host.send_mp(HEARTBEAT)
    host.send_mp(tuples(tup("6", ["echo", "q"])))
    host.expect_silence(0.2)
    host.send_mp([4, 5])
    assert host.read_mp_n(3) == [
        {"command": "batch", "emits": [[["task_ids", [4, 5]], ["5"]]], "acks": ["5"]},
        SYNC,
        {"command": "batch", "emits": [[["echo", "q"], ["6"]]], "acks": ["6"]},
    ]
    host.expect_silence()


def test_batch_and_msgpack_batches_stay_under_the_frame_limit(spawn):
    host = spawn(CONFORMANCE, "bolt")
    mp_handshake(host, BATCH_MP, conf={"multilang.max.frame.bytes": 2000})
    host.read_mp()  # ready log
    host.send_mp(tup("1", ["emit_many", 1100]))
    emits, acks = [], []
    while not acks:
        body = host.read_mp_raw()
        assert len(body) <= 2000
        frame = msgpack.unpackb(body)
        assert frame["command"] == "batch"
        emits += frame.get("emits", [])
        acks += frame.get("acks", [])
    assert emits == [[["n", i], ["1"]] for i in range(1100)] and acks == ["1"]
    host.expect_silence()


# ---------------------------------------------------------------------------
# Spouts
# ---------------------------------------------------------------------------


def test_spout_one_sync_per_command_and_message_ids(spawn, tmp_path):
    (tmp_path / "text.txt").write_text("  The cat  \n\nsat on\r\nthe mat.\n")
    host = spawn(RUBY_DIR / "sentence_spout.rb", "text.txt")
    mp_handshake(host)

    def command(name, msg_id=""):
        host.send_mp({"command": name, "id": msg_id})
        frames = []
        while (f := host.read_mp()) != SYNC:
            frames.append(f)
        return frames

    assert command("activate") == []
    assert [command("next") for _ in range(4)] == [
        [{"command": "emit", "id": 0, "tuple": ["The cat"], "need_task_ids": False}],
        [{"command": "emit", "id": 2, "tuple": ["sat on"], "need_task_ids": False}],
        [{"command": "emit", "id": 3, "tuple": ["the mat."], "need_task_ids": False}],
        [],
    ]
    assert command("ack", 0) == []
    assert command("fail", 2) == []
    assert command("next") == [{"command": "emit", "id": 2, "tuple": ["sat on"], "need_task_ids": False}]
    assert command("deactivate") == []
    assert command("mystery")[0]["command"] == "log"
    host.expect_silence()


@pytest.mark.parametrize("offer", [MP, BATCH_MP])
def test_conformance_spout_id_types_and_task_ids(spawn, offer):
    host = conformance(spawn, "spout", offer)
    batched = "batch" in offer

    def emits(frames):
        out = []
        for f in frames:
            if f["command"] == "batch":
                out += [{"tuple": e[0], **({"id": e[1]} if len(e) > 1 and e[1] is not None else {})}
                        for e in f["emits"]]
            else:
                assert f.pop("need_task_ids") is False
                assert f.pop("command") == "emit"
                out.append(f)
        return out

    assert emits([host.read_mp()]) == [{"id": "open", "tuple": ["open"]}]  # emitted while opening
    host.send_mp({"command": "activate", "id": ""})
    assert emits([host.read_mp()]) == [{"tuple": ["activated"]}]
    assert host.read_mp() == SYNC
    for k, msg_id in enumerate([0, "1", -2, "-3", 4.5, {"k": [5]}, None]):
        host.send_mp({"command": "next", "id": ""})
        frame = host.read_mp()
        assert frame.pop("need_task_ids") is True and frame.pop("command") == "emit"
        assert same_json(frame.pop("id", None), msg_id) and frame == {"tuple": ["next", k]}
        host.send_mp([k, 100])
        assert emits([host.read_mp()]) == [{"tuple": ["task_ids", [k, 100]]}]
        assert host.read_mp() == SYNC
    for cmd, word in (("ack", "acked"), ("fail", "failed")):
        for msg_id in (0, "1", -2, 4.5, {"k": [5]}, 2**63):
            host.send_mp({"command": cmd, "id": msg_id})
            (emitted,) = emits([host.read_mp()])
            assert host.read_mp() == SYNC
            assert emitted["tuple"][0] == word and same_json(emitted["tuple"][1], msg_id)
    host.expect_silence()
    assert batched == (b"\xa5batch" in bytes(host.stdout))


# ---------------------------------------------------------------------------
# End of stream and protocol errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bolt", "spout"])
def test_eof_at_a_frame_boundary_exits_zero(spawn, mode):
    host = conformance(spawn, mode)
    if mode == "bolt":
        host.send_mp(tup("1", ["ack"]))
        assert host.read_mp() == {"command": "ack", "id": "1"}
    host.close_stdin()
    assert host.wait(3.0) == 0
    host.wait_closed(2)
    assert "error" not in host.stderr_text().lower()


BAD_BODIES = {
    "bin": (msgpack.packb({"id": "1", "comp": "src", "stream": "default", "task": 7, "tuple": [b"\x00\x01"]},
                          use_bin_type=True), "bin (type 0xc4)"),
    "ext": (msgpack.packb({"id": "1", "tuple": [msgpack.ExtType(1, b"ab")]}), "ext (type 0xd5)"),
    "timestamp": (b"\x81\xa1t\xd6\xff" + struct.pack(">I", 1), "ext (type 0xd6)"),
    "int-key": (b"\x81\x01\xa1x", "map key that is not a str"),
    "bad-utf8": (b"\x81\xa2id\xa2\xc3\x28", "not valid UTF-8"),
    "trailing": (msgpack.packb(tup("1", ["ack"])) + b"\xc0", "trailing byte"),
    "truncated-body": (msgpack.packb(tup("1", ["ack"]))[:-1], "cut short"),
    "scalar": (msgpack.packb("hello"), "not a map or an array"),
    "nan": (msgpack.packb({"tuple": [float("nan")]}), "NaN"),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_frame_is_a_protocol_error_reported_as_error_frame(spawn, case):
    body, needle = BAD_BODIES[case]
    host = conformance(spawn, "bolt")
    host.send_mp(tup("0", ["ack"]))
    assert host.read_mp() == {"command": "ack", "id": "0"}
    host.write(struct.pack(">I", len(body)) + body)
    error = host.read_mp()
    assert error["command"] == "error" and "protocol error" in error["msg"] and needle in error["msg"], error
    assert host.wait(3.0) == 1
    host.wait_closed(2)
    assert needle in host.stderr_text()


@pytest.mark.parametrize("case", ["length-0", "oversize-conf", "oversize-default", "json-after-switch"])
def test_bad_length_prefix_is_an_error_at_once(spawn, case):
    data, needle, conf = {
        "length-0": (b"\x00\x00\x00\x00", "length 0", None),
        # only the prefix is written: the component must not wait for the body
        "oversize-conf": (struct.pack(">I", 5000), "frame of 5000 bytes exceeds the 4096-byte limit",
                          {"multilang.max.frame.bytes": 4096}),
        "oversize-default": (b"\xff\xff\xff\xff", "exceeds the 67108864-byte limit", None),
        "json-after-switch": (b'{"id":"1","comp":"src","stream":"default","task":7,"tuple":["ack"]}\nend\n',
                              "a JSON frame after msgpack was accepted?", None),
    }[case]
    host = spawn(CONFORMANCE, "bolt")
    mp_handshake(host, conf=conf)
    host.read_mp()  # ready log
    host.write(data)
    error = host.read_mp(timeout=3)
    assert error["command"] == "error" and needle in error["msg"], error
    assert host.wait(3.0) == 1
    host.wait_closed(2)
    assert needle in host.stderr_text()


@pytest.mark.parametrize("cut", [1, 3, 4, 10])
def test_eof_inside_a_frame_is_a_protocol_error(spawn, cut):
    host = conformance(spawn, "bolt")
    host.write(pack(tup("1", ["ack"]))[:cut])
    host.expect_silence(0.2)  # a partial frame is not processed
    host.close_stdin()
    error = host.read_mp()
    assert error["command"] == "error" and "stream ended in the middle of a frame" in error["msg"], error
    assert host.wait(3.0) == 1
    host.wait_closed(2)
    assert "stream ended in the middle of a frame" in host.stderr_text()


def test_spout_bad_frame_is_reported(spawn):
    host = conformance(spawn, "spout")
    assert host.read_mp()["tuple"] == ["open"]
    body = msgpack.packb({"command": "next", "id": b"raw"}, use_bin_type=True)
    host.write(struct.pack(">I", len(body)) + body)
    error = host.read_mp()
    assert error["command"] == "error" and "bin (type 0xc4)" in error["msg"]
    assert host.wait(3.0) == 1
