"""The `state` extension (spec §9.7) in the Ruby and Node component libraries.

Real `ruby` and `node` processes (the scripted conformance component in mode
`stateful`, the word-count count bolts, and small throw-away components) are
driven over pipes by a byte-level host: multilang.testing.ComponentProcess for
the JSON handshake, and here a reader that also speaks msgpack frames (§9.6)
and expands output batches (§9.5) into the frames they stand for. Nothing
else from the `multilang` package is used. Every read and wait has a
deadline; tests synchronise on frames only.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from multilang.testing import ComponentProcess, encode_frame

ROOT = Path(__file__).resolve().parents[2]
RUBY = shutil.which("ruby")
NODE = shutil.which("node")
RUBY_LIB = ROOT / "examples" / "ruby" / "multilang.rb"
NODE_LIB = ROOT / "examples" / "node" / "multilang.js"

COMMANDS = {
    "ruby": [RUBY, str(ROOT / "examples" / "ruby" / "conformance_component.rb"), "stateful"],
    "node": [NODE, str(ROOT / "examples" / "node" / "conformance_component.js"), "stateful"],
}
COUNT_BOLTS = {
    "ruby": [RUBY, str(ROOT / "examples" / "ruby" / "count_bolt.rb")],
    "node": [NODE, str(ROOT / "examples" / "node" / "count_bolt.js")],
}
LANGS = [
    pytest.param("ruby", marks=pytest.mark.skipif(RUBY is None, reason="ruby is not installed")),
    pytest.param("node", marks=pytest.mark.skipif(NODE is None, reason="node is not installed")),
]


# ---------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------


def tup(tid: str, values: list[Any]) -> dict[str, Any]:
    return {"id": tid, "comp": "split", "stream": "default", "task": 3, "tuple": values}


def heartbeat() -> dict[str, Any]:
    return {"id": "hb", "comp": None, "stream": "__heartbeat", "task": -1, "tuple": []}


def tuple_batch(*ts: dict[str, Any]) -> dict[str, Any]:
    return {"tuples": [[t["id"], t["comp"], t["stream"], t["task"], t["tuple"]] for t in ts]}


def init(txid: int | None, state: dict[str, Any], more: bool | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"command": "state", "action": "init", "txid": txid, "state": state}
    if more is not None:
        frame["more"] = more
    return frame


def prepare(txid: int) -> dict[str, Any]:
    return {"command": "state", "action": "prepare", "txid": txid}


def commit(txid: int) -> dict[str, Any]:
    return {"command": "state", "action": "commit", "txid": txid}


def rollback(txid: int | None) -> dict[str, Any]:
    return {"command": "state", "action": "rollback", "txid": txid}


def ack(tid: str) -> tuple:
    return ("ack", tid)


def fail(tid: str) -> tuple:
    return ("fail", tid)


def emit(values: list[Any], anchors: list[str]) -> tuple:
    return ("emit", values, anchors)


def unordered(events: list[tuple]) -> list[str]:
    """Events of one output batch, whose emits come before its acks (spec §9.5): compared as a multiset."""
    return sorted(map(repr, events))


def pack(obj: Any) -> bytes:
    import msgpack

    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


# ---------------------------------------------------------------------------
# The host
# ---------------------------------------------------------------------------


class StateHost(ComponentProcess):
    """A ComponentProcess that speaks JSON or (after the pid reply) msgpack
    frames, and reads the component's output as a stream of events: an output
    batch counts as the emits, acks and fails it stands for."""

    mp = False
    batching = False

    def start(self, offer: list[str] | None, accept: list[str], conf: dict[str, Any] | None = None) -> None:
        self.handshake(conf=conf or {}, offer=offer, accept=accept)
        self.mp = "msgpack" in accept
        self.batching = "batch" in accept
        self._events: deque[tuple] = deque()
        #: every frame read, as parsed (so a test can look at the state frames' shape)
        self.frames: list[Any] = []

    def send_all(self, *frames: Any) -> None:
        """Write the frames in one write (the component reads them coalesced)."""
        self.write(b"".join(pack(f) if self.mp else encode_frame(f) for f in frames), timeout=30)

    def read_frame(self, timeout: float | None = None) -> Any:
        if not self.mp:
            frame = self.read(timeout)
        else:
            import msgpack

            frame = msgpack.unpackb(self._read_mp(timeout), raw=False, strict_map_key=True)
        self.frames.append(frame)
        return frame

    def _read_mp(self, timeout: float | None) -> bytes:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                buf, pos = self.stdout, self._pos
                if len(buf) - pos >= 4:
                    (n,) = struct.unpack_from(">I", buf, pos)
                    if len(buf) - pos - 4 >= n:
                        self._pos = self._scan = pos + 4 + n
                        return bytes(buf[pos + 4:pos + 4 + n])
                if self._eof:
                    raise AssertionError(f"the component closed its stdout; {self._context()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no msgpack frame within {timeout:g}s; {self._context()}")
                self._cond.wait(left)

    def event(self, timeout: float | None = None) -> tuple:
        while not self._events:
            frame = self.read_frame(timeout)
            self._events.extend(self._expand(frame))
        return self._events.popleft()

    def events(self, n: int, timeout: float | None = None) -> list[tuple]:
        return [self.event(timeout) for _ in range(n)]

    def _expand(self, frame: Any) -> list[tuple]:
        assert isinstance(frame, dict), f"not a command frame: {frame!r}"
        command = frame.get("command")
        if command == "batch":
            assert self.batching, f"a batch frame without the batch extension: {frame!r}"
            assert set(frame) <= {"command", "emits", "acks", "fails"}, frame
            out: list[tuple] = []
            for e in frame.get("emits", []):
                assert len(e) <= 2 or e[2] in (None, "default"), e
                out.append(emit(e[0], e[1] if len(e) > 1 and e[1] is not None else []))
            out += [ack(i) for i in frame.get("acks", [])]
            out += [fail(i) for i in frame.get("fails", [])]
            return out
        if command == "emit":
            assert frame.get("need_task_ids") is False and "task" not in frame, frame
            return [emit(frame["tuple"], frame.get("anchors") or [])]
        if command in ("ack", "fail"):
            return [(command, frame["id"])]
        if command == "state":
            return [("state", frame)]
        if command in ("log", "error"):
            return [(command, frame["msg"])]
        if command == "sync":
            return [("sync",)]
        raise AssertionError(f"unexpected frame {frame!r}")

    def prepared(self, txid: int, timeout: float | None = None) -> tuple[dict[str, Any], list[str], int]:
        """Read a whole `prepared` answer (its chunks); check its shape; return
        (put, delete, number of chunks)."""
        put: dict[str, Any] = {}
        delete: list[str] = []
        chunks = 0
        while True:
            kind, frame = self.event(timeout)
            assert kind == "state", f"expected the prepared frame, got {(kind, frame)!r}"
            chunks += 1
            assert set(frame) <= {"command", "action", "txid", "put", "delete", "more"}, frame
            assert frame["action"] == "prepared" and frame["txid"] == txid and type(frame["txid"]) is int, frame
            assert isinstance(frame["put"], dict) and isinstance(frame["delete"], list), frame
            assert len(frame["put"]) + len(frame["delete"]) <= 1000, "a chunk of more than 1000 keys"
            for k in list(frame["put"]) + frame["delete"]:
                assert k not in put and k not in delete, f"key {k!r} in two chunks or in put and delete"
            put.update(frame["put"])
            delete += frame["delete"]
            more = frame.get("more", False)
            assert more in (True, False), frame
            if not more:
                return put, delete, chunks

    def get(self, tid: str, key: Any) -> Any:
        """Ask the conformance component for a key's value."""
        self.send_all(tup(tid, ["get", key]))
        got = self.events(2)
        assert got[0][0] == "emit" and got[0][2] == [tid] and got[0][1][0] == key, got
        assert got[1] == ack(tid), got
        return got[0][1][1]

    def protocol_error(self, *needles: str) -> str:
        """Expect an error frame naming a protocol error, then exit status 1."""
        while True:
            kind, msg = self.event()
            if kind == "error":
                break
        for needle in needles:
            assert needle in msg, f"{needle!r} not in the error {msg!r}"
        assert self.wait(10) == 1
        return msg


@pytest.fixture
def start(tmp_path):
    """start(argv, offer, accept, ready=MODE) -> a StateHost after its handshake
    (and its ready line, unless ready is None)."""
    procs: list[StateHost] = []

    def go(argv: list[str], offer: list[str] | None = ("state",), accept: list[str] = ("state",),
           ready: str | None = "stateful", lang: str | None = None, conf: dict[str, Any] | None = None,
           timeout: float = 10) -> StateHost:
        p = StateHost(argv, cwd=ROOT, pid_dir=tmp_path / "pids", timeout=timeout)
        procs.append(p)
        p.start(None if offer is None else list(offer), list(accept), conf)
        if ready is not None:
            assert p.event() == ("log", f"multilang-conformance ready mode={ready} lang={lang}")
        return p

    yield go
    for p in procs:
        p.close()


def stateful(start, lang: str, offer=("state",), accept=("state",), **kw) -> StateHost:
    return start(COMMANDS[lang], offer=offer, accept=accept, lang=lang, **kw)


# ---------------------------------------------------------------------------
# The conformance component, mode `stateful`
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
def test_init_prepare_commit_rollback(start, lang):
    c = stateful(start, lang)
    c.send_all(init(3, {"a": 1, "b": [1, 2], "c": "x", "u": "ü €"}))
    assert c.get("g1", "a") == 1
    assert c.get("g2", "b") == [1, 2]
    assert c.get("g3", "u") == "ü €"
    assert c.get("g4", "nope") is None
    c.send_all(
        tup("1", ["put", "a", 5]),
        tup("2", ["put", "d", {"k": [1, None, True, 2.5]}]),
        tup("3", ["delete", "b"]),
        tup("4", ["put", "e", 1]),
        tup("5", ["delete", "e"]),           # put, then deleted: a delete
        tup("6", ["delete", "absent"]),      # deleted since (it never existed): still a delete
        tup("7", ["put", "c", "y"]),
        tup("8", ["put", "c", "x"]),         # set back to its committed value: still put
    )
    assert c.events(8) == [ack(str(i)) for i in range(1, 9)]
    c.send_all(prepare(4))
    put, delete, chunks = c.prepared(4)
    assert put == {"a": 5, "d": {"k": [1, None, True, 2.5]}, "c": "x"} and chunks == 1
    assert type(put["a"]) is int and type(put["d"]["k"][3]) is float
    assert sorted(delete) == ["absent", "b", "e"]
    c.send_all(commit(4))
    # Nothing changed since: an empty prepared, both keys present.
    c.send_all(prepare(5))
    assert c.prepared(5) == ({}, [], 1)
    assert c.frames[-1] == {"command": "state", "action": "prepared", "txid": 5, "put": {}, "delete": []}
    c.send_all(commit(5))
    # Changes after the commit, then a rollback to it.
    c.send_all(tup("9", ["put", "a", 6]), tup("10", ["delete", "c"]), tup("11", ["put", "f", [1]]),
               tup("12", ["put", "a", 7]))
    assert c.events(4) == [ack("9"), ack("10"), ack("11"), ack("12")]
    c.send_all(rollback(5))
    assert c.get("g5", "a") == 5
    assert c.get("g6", "c") == "x"
    assert c.get("g7", "f") is None
    assert c.get("g8", "b") is None
    assert c.get("g9", "d") == {"k": [1, None, True, 2.5]}
    # The rollback forgot the changes: the next prepared is empty.
    c.send_all(prepare(6))
    assert c.prepared(6) == ({}, [], 1)
    c.send_all(commit(6), tup("13", ["put", "a", 8]), prepare(7))
    assert c.event() == ack("13")
    assert c.prepared(7) == ({"a": 8}, [], 1)
    c.close_stdin()
    assert c.wait() == 0


@pytest.mark.parametrize("lang", LANGS)
def test_rollback_of_a_prepared_checkpoint(start, lang):
    c = stateful(start, lang)
    c.send_all(init(None, {}), tup("1", ["put", "a", 1]), tup("2", ["put", "b", 2]), prepare(1))
    assert c.events(2) == [ack("1"), ack("2")]
    assert c.prepared(1) == ({"a": 1, "b": 2}, [], 1)
    c.send_all(commit(1), tup("3", ["put", "a", 10]), tup("4", ["delete", "b"]), tup("5", ["put", "c", 3]),
               prepare(2))
    assert c.events(3) == [ack("3"), ack("4"), ack("5")]
    assert c.prepared(2) == ({"a": 10, "c": 3}, ["b"], 1)
    # Prepared, not committed: a rollback discards it too.
    c.send_all(rollback(1))
    assert [c.get(f"g{k}", k) for k in "abc"] == [1, 2, None]
    c.send_all(prepare(2))
    assert c.prepared(2) == ({}, [], 1)


@pytest.mark.parametrize("lang", LANGS)
def test_changes_between_prepare_and_commit_survive_a_later_rollback_as_prepared(start, lang):
    # A tuple handled after `prepared` N and before `commit` N: after the
    # commit, a rollback goes back to the state committed under N, which has
    # the prepared value (and not the value of the commit before).
    c = stateful(start, lang)
    c.send_all(init(7, {"a": 0}), tup("1", ["put", "a", 1]), prepare(8))
    assert c.event() == ack("1")
    assert c.prepared(8) == ({"a": 1}, [], 1)
    c.send_all(tup("2", ["put", "a", 2]), tup("3", ["put", "n", "new"]), commit(8))
    assert c.events(2) == [ack("2"), ack("3")]
    c.send_all(rollback(8))
    assert c.get("g1", "a") == 1
    assert c.get("g2", "n") is None


@pytest.mark.parametrize("lang", LANGS)
def test_chunked_init(start, lang):
    c = stateful(start, lang)
    chunks = [{f"k{i}": i for i in range(j, j + 700)} for j in (0, 700, 1400)]
    c.send_all(init(12, chunks[0], more=True), init(12, chunks[1], more=True), init(12, chunks[2], more=False))
    for i in (0, 699, 700, 1399, 1400, 2099):
        assert c.get(f"g{i}", f"k{i}") == i
    assert c.get("g-none", "k2100") is None
    # Nothing changed by the init itself.
    c.send_all(prepare(13))
    assert c.prepared(13) == ({}, [], 1)


@pytest.mark.parametrize("lang", LANGS)
def test_a_large_prepared_comes_in_chunks(start, lang):
    c = stateful(start, lang, timeout=30)
    c.send_all(init(1, {f"old{i}": i for i in range(300)}))
    puts = [tup(f"p{i}", ["put", f"key{i}", i]) for i in range(2500)]
    deletes = [tup(f"d{i}", ["delete", f"old{i}"]) for i in range(300)]
    c.send_all(*puts, *deletes, prepare(2))
    assert c.events(2800) == [ack(f"p{i}") for i in range(2500)] + [ack(f"d{i}") for i in range(300)]
    put, delete, chunks = c.prepared(2)
    assert put == {f"key{i}": i for i in range(2500)}
    assert sorted(delete) == sorted(f"old{i}" for i in range(300))
    assert chunks == 3     # 2800 keys, at most 1000 per frame
    assert [f.get("more") for f in c.frames[-3:]] == [True, True, None]
    c.send_all(commit(2))
    assert c.get("g", "key2499") == 2499


@pytest.mark.parametrize("lang", LANGS)
def test_a_prepared_over_a_mebibyte_comes_in_chunks(start, lang):
    c = stateful(start, lang, timeout=30)
    big = {f"big{i}": chr(ord("a") + i) * 600_000 for i in range(3)}
    c.send_all(init(1, {}), *[tup(k, ["put", k, v]) for k, v in big.items()], prepare(2))
    assert c.events(3) == [ack(k) for k in big]
    put, delete, chunks = c.prepared(2)
    assert put == big and delete == []
    assert chunks == 3     # two of them would be over about 1 MiB


@pytest.mark.parametrize("lang", LANGS)
def test_non_string_keys_are_errors_naming_the_key(start, lang):
    c = stateful(start, lang)
    c.send_all(init(1, {"a": 1}))
    for tid, values, shown in [("1", ["put", 5, "x"], "5"), ("2", ["delete", None], "nil" if lang == "ruby" else "null"),
                               ("3", ["get", ["k"]], '["k"]')]:
        c.send_all(tup(tid, values))
        kind, msg = c.event()
        assert kind == "error", (kind, msg)
        assert "state keys must be strings" in msg.lower() and shown in msg
        assert ("TypeError" in msg), msg
        assert c.event() == fail(tid)
    # The bolt keeps running and nothing changed.
    c.send_all(prepare(2))
    assert c.prepared(2) == ({}, [], 1)
    assert c.get("g", "a") == 1


@pytest.mark.parametrize("lang", LANGS)
def test_unknown_op_fails_the_tuple(start, lang):
    c = stateful(start, lang)
    c.send_all(init(None, {}), tup("1", ["frobnicate", "a"]), tup("2", []), tup("3", ["put", "a", 1]))
    assert c.events(3) == [fail("1"), fail("2"), ack("3")]


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("offer", [None, ["batch"]])
def test_no_state_offered_keeps_the_state_in_memory(start, lang, offer):
    # Storm's host offers nothing: the state starts empty and lives in memory.
    accept = ["batch"] if offer else []
    c = stateful(start, lang, offer=offer, accept=accept)
    c.send_all(tup("1", ["put", "a", {"x": 1}]), tup("2", ["put", "b", 2]))
    assert c.events(2) == [ack("1"), ack("2")]
    assert c.get("g1", "a") == {"x": 1}
    c.send_all(tup("3", ["delete", "a"]))
    assert c.event() == ack("3")
    assert c.get("g2", "a") is None
    assert c.get("g3", "b") == 2
    # A state frame there is a protocol error (state.negotiated).
    c.send_all(prepare(1))
    c.protocol_error("state.negotiated")


@pytest.mark.parametrize("lang", LANGS)
def test_batch_closes_before_a_state_frame(start, lang):
    c = stateful(start, lang, offer=["state", "batch"], accept=["batch", "state"])
    c.send_all(init(4, {"n": 0}),
               tuple_batch(tup("1", ["put", "a", 1]), tup("2", ["get", "n"]), tup("3", ["put", "n", 1])),
               prepare(5),
               tuple_batch(tup("4", ["put", "b", 2])),
               commit(5), tup("5", ["get", "b"]), rollback(5),
               tuple_batch(tup("6", ["get", "b"]), tup("7", ["get", "a"])))
    assert unordered(c.events(4)) == unordered([ack("1"), emit(["n", 0], ["2"]), ack("2"), ack("3")])
    assert c.prepared(5) == ({"a": 1, "n": 1}, [], 1)
    # commit and rollback are not answered: what follows may share one batch.
    assert unordered(c.events(7)) == unordered([ack("4"), emit(["b", 2], ["5"]), ack("5"),
                                                emit(["b", None], ["6"]), ack("6"), emit(["a", 1], ["7"]), ack("7")])
    # The prepared frame is a standard frame, after the batch holding the acks before it.
    kinds = [f["command"] for f in c.frames]
    i = kinds.index("state")
    assert "batch" in kinds[:i] and "batch" in kinds[i + 1:]


@pytest.mark.parametrize("lang", LANGS)
def test_batch_msgpack_and_state(start, lang):
    pytest.importorskip("msgpack")
    c = stateful(start, lang, offer=["batch", "msgpack", "state"], accept=["batch", "msgpack", "state"])
    c.send_all(init(1, {"a": 1, "chunk1": True}, more=True), init(1, {"ü": [1.5, None, "é"]}),
               tuple_batch(tup("1", ["get", "ü"]), tup("2", ["put", "a", 2]), tup("3", ["delete", "chunk1"])),
               heartbeat(), prepare(2))
    assert unordered(c.events(5)) == unordered([emit(["ü", [1.5, None, "é"]], ["1"]), ack("1"), ack("2"), ack("3"),
                                                ("sync",)])
    assert c.prepared(2) == ({"a": 2}, ["chunk1"], 1)
    c.send_all(commit(2), tuple_batch(*[tup(f"p{i}", ["put", f"k{i}", i]) for i in range(1200)]),
               tup("x", ["put", "a", 3]), rollback(2), tup("g", ["get", "a"]))
    assert unordered(c.events(1203)) == unordered([ack(f"p{i}") for i in range(1200)] +
                                                  [ack("x"), emit(["a", 2], ["g"]), ack("g")])
    c.send_all(tuple_batch(*[tup(f"q{i}", ["put", f"k{i}", i]) for i in range(1200)]), prepare(3))
    assert c.events(1200) == [ack(f"q{i}") for i in range(1200)]
    put, delete, chunks = c.prepared(3)
    assert put == {f"k{i}": i for i in range(1200)} and delete == [] and chunks == 2
    c.send_all(commit(3))
    assert c.get("g2", "k1199") == 1199
    c.close_stdin()
    assert c.wait() == 0


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("mode", ["bolt", "basic"])
def test_plain_bolts_never_accept_state(start, lang, mode):
    argv = COMMANDS[lang][:-1] + [mode]
    c = start(argv, offer=["batch", "state"], accept=["batch"], ready=mode, lang=lang)
    c.send_all(init(1, {}))
    c.protocol_error("state.negotiated")


@pytest.mark.parametrize("lang", LANGS)
def test_spouts_never_accept_state(start, lang):
    argv = COMMANDS[lang][:-1] + ["spout"]
    c = start(argv, offer=["state"], accept=[], ready="spout", lang=lang)
    c.close_stdin()


# Host frames that break §9.7, each after the given valid start.
BAD = [
    ("tuple-before-init", [], [tup("1", ["get", "a"])], "state.order"),
    ("heartbeat-before-init", [], [heartbeat()], "state.order"),
    ("prepare-before-init", [], [prepare(1)], "state.order"),
    ("tuple-between-init-chunks", [init(1, {"a": 1}, more=True)], [tup("1", ["get", "a"])], "state.order"),
    ("second-init", [init(1, {})], [init(1, {})], "state.order"),
    ("commit-without-prepare", [init(1, {})], [commit(2)], "state.order"),
    ("commit-of-another-txid", [init(1, {}), prepare(2)], [commit(3)], "state.order"),
    ("commit-after-rollback", [init(1, {}), prepare(2), rollback(1)], [commit(2)], "state.order"),
    ("unknown-action", [init(1, {})], [{"command": "state", "action": "snapshot", "txid": 2}], "state.invalid"),
    ("txid-zero", [init(1, {})], [prepare(0)], "state.invalid"),
    ("txid-string", [init(1, {})], [{"command": "state", "action": "prepare", "txid": "2"}], "state.invalid"),
    ("prepare-txid-null", [init(1, {})], [{"command": "state", "action": "prepare", "txid": None}], "state.invalid"),
    ("init-state-array", [], [{"command": "state", "action": "init", "txid": 1, "state": []}], "state.invalid"),
    ("init-more-not-boolean", [], [init(1, {}, more=1)], "state.invalid"),
    ("key-in-two-init-chunks", [init(1, {"a": 1}, more=True)], [init(1, {"a": 2})], "state.invalid"),
    ("init-chunks-of-two-txids", [init(1, {"a": 1}, more=True)], [init(2, {"b": 2})], "state.invalid"),
]


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("before,bad,rule", [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_protocol_errors(start, lang, before, bad, rule):
    c = stateful(start, lang)
    c.send_all(*before, *bad)
    c.protocol_error("protocol error", rule)
    # Nothing but the answers of the valid frames before (one prepared) came first.
    assert [f for f in c.frames if f.get("command") not in ("error", "log")] == \
        [f for f in c.frames if f.get("action") == "prepared"]


# ---------------------------------------------------------------------------
# The count bolts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
def test_count_bolt_state_survives_a_restart(start, lang):
    words = ["the", "cat", "the", "hat"]
    b = start(COUNT_BOLTS[lang], ready=None)
    b.send_all(init(None, {}), *[tup(str(i), [w]) for i, w in enumerate(words)], prepare(1))
    assert b.events(8) == [emit(["the", 1], ["0"]), ack("0"), emit(["cat", 1], ["1"]), ack("1"),
                           emit(["the", 2], ["2"]), ack("2"), emit(["hat", 1], ["3"]), ack("3")]
    put, delete, _ = b.prepared(1)
    assert put == {"the": 2, "cat": 1, "hat": 1} and delete == []
    b.send_all(commit(1), tup("4", ["cat"]), tup("5", ["dog"]), rollback(1), tup("6", ["cat"]))
    assert b.events(6) == [emit(["cat", 2], ["4"]), ack("4"), emit(["dog", 1], ["5"]), ack("5"),
                           emit(["cat", 2], ["6"]), ack("6")]
    b.close_stdin()
    assert b.wait() == 0
    # A new process for the task gets the committed state back.
    b2 = start(COUNT_BOLTS[lang], offer=["batch", "state"], accept=["batch", "state"], ready=None)
    b2.send_all(init(1, put), tuple_batch(tup("7", ["the"]), tup("8", ["cow"])), prepare(2))
    assert unordered(b2.events(4)) == unordered([emit(["the", 3], ["7"]), ack("7"), emit(["cow", 1], ["8"]), ack("8")])
    assert b2.prepared(2)[:2] == ({"the": 3, "cow": 1}, [])


@pytest.mark.parametrize("lang", LANGS)
def test_count_bolt_under_storms_host(start, lang):
    # No extension offered (Storm's ShellBolt): counts in memory, from 1.
    b = start(COUNT_BOLTS[lang], offer=None, accept=[], ready=None)
    b.send_all(*[tup(str(i), [w]) for i, w in enumerate(["a", "b", "a"])])
    assert b.events(6) == [emit(["a", 1], ["0"]), ack("0"), emit(["b", 1], ["1"]), ack("1"),
                           emit(["a", 2], ["2"]), ack("2")]
    assert all(f.get("need_task_ids") is False for f in b.frames if f["command"] == "emit")


# ---------------------------------------------------------------------------
# Hooks and values, with throw-away components
# ---------------------------------------------------------------------------

RUBY_HOOKS = f"""
require {json.dumps(str(RUBY_LIB))}

class HookBolt < Multilang::StatefulBolt
  def prepare(_conf, _context)
    log("prepare size=#{{state.size}}")
  end

  def init_state(st)
    log("init_state same=#{{st.equal?(state)}} size=#{{st.size}} keys=#{{st.map {{ |k, _| k }}.sort.join(',')}}")
  end

  def pre_prepare(txid)
    log("pre_prepare #{{txid}}")
    state.put('last', txid)
  end

  def pre_commit(txid)
    log("pre_commit #{{txid}}")
  end

  def pre_rollback
    log("pre_rollback size=#{{state.size}}")
  end

  def process(tup)
    op, key, value = tup.values
    case op
    when 'mutate'
      begin
        state.get(key) << value
        emit(['mutated'])
      rescue FrozenError
        emit(['frozen'])
      end
    when 'put' then state.put(key, value)
    when 'put_symbol' then state.put(key, :sym)
    when 'put_nan' then state.put(key, Float::NAN)
    when 'put_symbol_key' then state.put(key, {{ a: 1 }})
    when 'dump' then emit([state.to_h, state.key?(key), state.size])
    when 'raise_in_pre_commit' then define_singleton_method(:pre_commit) {{ |_t| raise 'boom in pre_commit' }}
    end
  end
end

HookBolt.run
"""

NODE_HOOKS = f"""
const ml = require({json.dumps(str(NODE_LIB))});

class HookBolt extends ml.StatefulBolt {{
  initialize() {{ this.log(`prepare size=${{this.state.size}}`); }}

  async initState(st) {{
    await new Promise((r) => setTimeout(r, 5));
    const keys = [...st.entries()].map(([k]) => k).sort().join(',');
    this.log(`init_state same=${{st === this.state}} size=${{st.size}} keys=${{keys}}`);
  }}

  prePrepare(txid) {{
    this.log(`pre_prepare ${{txid}}`);
    this.state.put('last', txid);
  }}

  preCommit(txid) {{ this.log(`pre_commit ${{txid}}`); }}

  preRollback() {{ this.log(`pre_rollback size=${{this.state.size}}`); }}

  process(tup) {{
    const [op, key, value] = tup.values;
    switch (op) {{
      case 'mutate': {{
        const v = this.state.get(key);
        v.push(value);
        this.emit([this.state.get(key)]);
        break;
      }}
      case 'put': this.state.put(key, value); break;
      case 'put_symbol': this.state.put(key, Symbol('s')); break;
      case 'put_nan': this.state.put(key, NaN); break;
      case 'put_symbol_key': this.state.put(key, new Map([['a', 1]])); break;
      case 'dump': this.emit([Object.fromEntries(this.state.entries()), this.state.has(key), this.state.size]); break;
      case 'raise_in_pre_commit': this.preCommit = () => {{ throw new Error('boom in pre_commit'); }}; break;
      default: break;
    }}
  }}
}}

new HookBolt().run();
"""


@pytest.fixture
def hook_bolt(tmp_path):
    def argv(lang: str) -> list[str]:
        path = tmp_path / ("hooks.rb" if lang == "ruby" else "hooks.js")
        path.write_text(RUBY_HOOKS if lang == "ruby" else NODE_HOOKS)
        return [RUBY if lang == "ruby" else NODE, str(path)]
    return argv


@pytest.mark.parametrize("lang", LANGS)
def test_hooks_in_order(start, hook_bolt, lang):
    c = start(hook_bolt(lang), ready=None)
    c.send_all(init(5, {"x": [1]}, more=True), init(5, {"y": 2}))
    assert c.events(2) == [("log", "prepare size=0"), ("log", "init_state same=true size=2 keys=x,y")]
    c.send_all(prepare(6))
    assert c.event() == ("log", "pre_prepare 6")
    # pre_prepare's own change is in the prepared frame.
    assert c.prepared(6) == ({"last": 6}, [], 1)
    c.send_all(commit(6))
    assert c.event() == ("log", "pre_commit 6")
    c.send_all(tup("1", ["put", "z", 1]), rollback(6))
    assert c.events(2) == [ack("1"), ("log", "pre_rollback size=4")]
    c.send_all(tup("2", ["dump", "z"]))
    assert c.events(2) == [emit([{"x": [1], "y": 2, "last": 6}, False, 3], ["2"]), ack("2")]


@pytest.mark.parametrize("lang", LANGS)
def test_init_state_without_the_extension(start, hook_bolt, lang):
    c = start(hook_bolt(lang), offer=None, accept=[], ready=None)
    assert c.events(2) == [("log", "prepare size=0"), ("log", "init_state same=true size=0 keys=")]
    c.send_all(tup("1", ["put", "k", "v"]), tup("2", ["dump", "k"]))
    assert c.events(3) == [ack("1"), emit([{"k": "v"}, True, 1], ["2"]), ack("2")]


@pytest.mark.parametrize("lang", LANGS)
def test_values_from_get_cannot_change_the_state(start, hook_bolt, lang):
    c = start(hook_bolt(lang), ready=None)
    c.send_all(init(1, {"list": [1]}), tup("1", ["put", "l2", [1]]), tup("2", ["mutate", "list", 2]),
               tup("3", ["mutate", "l2", 2]), prepare(2))
    c.events(2)  # the hooks' logs
    want = emit(["frozen"], ["2"]) if lang == "ruby" else emit([[1]], ["2"])
    got = c.events(5)
    assert got[:2] == [ack("1"), want] and got[2] == ack("2"), got
    assert got[3][0] == "emit" and got[3][1] in (["frozen"], [[1]]) and got[4] == ack("3"), got
    c.event()  # pre_prepare's log
    assert c.prepared(2) == ({"l2": [1], "last": 2}, [], 1)


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("op", ["put_symbol", "put_nan", "put_symbol_key"])
def test_values_that_are_not_json_are_errors_naming_the_key(start, hook_bolt, lang, op):
    c = start(hook_bolt(lang), ready=None)
    c.send_all(init(1, {}), tup("1", [op, "the-key"]), prepare(2))
    c.events(2)
    kind, msg = c.event()
    assert kind == "error" and "TypeError" in msg and "the-key" in msg, msg
    assert c.event() == fail("1")
    c.event()  # pre_prepare's log
    assert c.prepared(2) == ({"last": 2}, [], 1)


@pytest.mark.parametrize("lang", LANGS)
def test_a_raising_state_hook_stops_the_process(start, hook_bolt, lang):
    c = start(hook_bolt(lang), ready=None)
    c.send_all(init(1, {}), tup("1", ["raise_in_pre_commit"]), prepare(2))
    c.events(3)
    c.event()
    assert c.prepared(2) == ({"last": 2}, [], 1)
    c.send_all(commit(2))
    kind, msg = c.event()
    assert kind == "error" and "boom in pre_commit" in msg, msg
    assert c.wait(10) == 1


@pytest.mark.parametrize("lang", LANGS)
def test_a_stateful_bolt_that_declines_state_keeps_it_in_memory(start, tmp_path, lang):
    if lang == "ruby":
        path = tmp_path / "decline.rb"
        path.write_text(f"require {json.dumps(str(RUBY_LIB))}\n"
                        "class B < Multilang::StatefulBolt\n  self.extensions = ['batch']\n"
                        "  def process(t) = emit([state.put('k', 1).inspect, state.get('k')])\nend\nB.run\n")
        argv = [RUBY, str(path)]
    else:
        path = tmp_path / "decline.js"
        path.write_text(f"const ml = require({json.dumps(str(NODE_LIB))});\n"
                        "class B extends ml.StatefulBolt { process() { this.emit([String(this.state.put('k', 1)), "
                        "this.state.get('k')]); } }\nB.extensions = ['batch'];\nnew B().run();\n")
        argv = [NODE, str(path)]
    c = start(argv, offer=["batch", "state"], accept=["batch"], ready=None)
    c.send_all(tuple_batch(tup("1", [])))
    ev = c.events(2)   # one output batch: the emit first
    assert ev[0][0] == "emit" and ev[0][1][1] == 1 and ev[1] == ack("1"), ev
    # the notice is on stderr, read by another thread: wait for it, not for luck
    c.wait_stderr(b"declined the offered state extension", timeout=10)
