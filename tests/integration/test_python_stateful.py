"""Extension state (spec/PROTOCOL.md §9.7) in the Python component library:
multilang.StatefulBolt, through real processes.

examples/python/count_bolt.py, the scripted conformance component in mode
stateful (spec/CONFORMANCE.md) and small bolts written to tmp_path are driven
by multilang.testing.ComponentProcess, a host that writes and reads bytes
only. Every test synchronises on frames (each read has a deadline); none
sleeps. Under msgpack (§9.6) the frames are packed and parsed here with the
``msgpack`` package.
"""

from __future__ import annotations

import struct
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from multilang.testing import (
    ComponentProcess,
    ComponentProcesses,
    encode_frame,
    heartbeat_frame,
    tick_frame,
    tuple_frame,
)

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
COUNT = [PY, str(ROOT / "examples/python/count_bolt.py")]
STATEFUL = [PY, str(ROOT / "examples/python/conformance_component.py"), "stateful"]
READY = {"command": "log", "msg": "multilang-conformance ready mode=stateful lang=python", "level": 2}
SYNC = {"command": "sync"}


def init(state, txid=None, more=False):
    f = {"command": "state", "action": "init", "txid": txid, "state": state}
    if more:
        f["more"] = True
    return f


def prepare(txid):
    return {"command": "state", "action": "prepare", "txid": txid}


def commit(txid):
    return {"command": "state", "action": "commit", "txid": txid}


def rollback(txid=None):
    return {"command": "state", "action": "rollback", "txid": txid}


def prepared(txid, put=None, delete=()):
    return {"command": "state", "action": "prepared", "txid": txid, "put": put or {}, "delete": list(delete)}


def tup(tid, *values):
    return tuple_frame(tid, list(values))


def emit(values, anchor):
    return {"command": "emit", "tuple": values, "anchors": [anchor], "need_task_ids": False}


def ack(tid):
    return {"command": "ack", "id": tid}


def norm(frame):
    """A prepared frame with its delete list sorted (its order is free)."""
    if isinstance(frame, dict) and frame.get("action") == "prepared":
        return {**frame, "delete": sorted(frame["delete"])}
    return frame


class MsgpackComponent(ComponentProcess):
    """A ComponentProcess whose frames after the JSON pid reply are msgpack (§9.6)."""

    def handshake(self, *args: Any, **kw: Any) -> dict[str, Any]:
        reply = super().handshake(*args, **kw)  # JSON both ways
        self.msgpack = True
        return reply

    def send(self, obj: Any, timeout: float | None = None) -> None:
        if not getattr(self, "msgpack", False):
            return super().send(obj, timeout)
        body = msgpack.packb(obj, use_bin_type=True)
        self.write(struct.pack(">I", len(body)) + body, timeout)

    def read(self, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                buf, pos = self.stdout, self._pos
                if len(buf) - pos >= 4:
                    (n,) = struct.unpack_from(">I", buf, pos)
                    if len(buf) - pos - 4 >= n:
                        self._pos = self._scan = pos + 4 + n
                        return msgpack.unpackb(bytes(buf[pos + 4 : pos + 4 + n]), raw=False, strict_map_key=True)
                assert not self._eof, f"the component closed its stdout; {self._context()}"
                left = deadline - time.monotonic()
                assert left > 0, f"no msgpack frame within {timeout:g}s; {self._context()}"
                self._cond.wait(left)


@pytest.fixture
def start(tmp_path):
    """start(argv, offer=None, accept=(), cls=ComponentProcess) -> a process past its pid reply."""
    with ComponentProcesses(cwd=ROOT, pid_dir=tmp_path / "pids") as procs:
        def run(argv, offer=None, accept=(), cls=ComponentProcess):
            proc = cls(argv, cwd=ROOT, pid_dir=tmp_path / "pids")
            procs.processes.append(proc)
            proc.handshake(offer=offer, accept=accept)
            return proc

        yield run


def stateful(start, offer=("state",), accept=("state",), cls=ComponentProcess, state=None, txid=None):
    """The scripted component in mode stateful, ready, given its init (if offered)."""
    c = start(STATEFUL, offer=list(offer), accept=list(accept), cls=cls)
    assert c.read() == READY
    if "state" in accept:
        c.send(init(state or {}, txid))
    return c


def get(c, tid, key):
    """The value of ``key`` in the component's state (op get)."""
    c.send(tup(tid, "get", key))
    out = c.read()
    assert out == emit([key, out["tuple"][1]], tid), out
    assert c.read() == ack(tid)
    return out["tuple"][1]


def op(c, tid, *values):
    c.send(tup(tid, *values))
    assert c.read() == ack(tid)


# -- negotiation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,offer,accept",
    [
        (STATEFUL, ["state"], ["state"]),
        (STATEFUL, ["batch", "state", "msgpack", "other"], ["batch", "msgpack", "state"]),
        (STATEFUL, ["batch"], ["batch"]),
        (STATEFUL, None, []),
        (COUNT, ["state"], ["state"]),
        # a plain bolt, a BasicBolt and a spout never accept state
        ([PY, str(ROOT / "examples/python/conformance_component.py"), "bolt"], ["state", "batch"], ["batch"]),
        ([PY, str(ROOT / "examples/python/conformance_component.py"), "basic"], ["state"], []),
        ([PY, str(ROOT / "examples/python/conformance_component.py"), "spout"], ["state"], []),
    ],
)
def test_only_a_stateful_bolt_accepts_state(start, argv, offer, accept):
    start(argv, offer=offer, accept=accept)  # handshake() checks the reply is exactly that


def test_a_state_subclass_listing_state_in_a_plain_bolt_still_declines(start, tmp_path):
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent("""
        from multilang import BasicBolt

        class B(BasicBolt):
            extensions = ("state", "batch")

            def process(self, tup):
                pass

        B().run()
    """))
    start([PY, str(path)], offer=["state", "batch"], accept=["batch"])


# -- init, tuples, prepare, commit, rollback --------------------------------------------


def test_init_then_get_returns_the_init_values(start):
    c = stateful(start, state={"a": 1, "b": [1, {"c": None}], "u": "\u00fcber"}, txid=7)
    assert get(c, "1", "a") == 1
    assert get(c, "2", "b") == [1, {"c": None}]
    assert get(c, "3", "u") == "\u00fcber"
    assert get(c, "4", "missing") is None


def test_prepare_carries_exactly_the_changes_and_echoes_the_txid(start):
    c = stateful(start, state={"a": 1, "b": 2, "c": 3}, txid=4)
    op(c, "1", "put", "a", 10)
    op(c, "2", "delete", "b")
    op(c, "3", "put", "n", {"x": [1.5, True]})
    op(c, "4", "delete", "never-there")
    c.send(prepare(5))
    assert c.read() == prepared(5, {"a": 10, "n": {"x": [1.5, True]}}, ["b"])
    c.send(commit(5))
    op(c, "5", "put", "c", 4)
    c.send(prepare(6))
    assert c.read() == prepared(6, {"c": 4})  # only what changed since prepared 5
    c.send(commit(6))
    c.send(prepare(7))
    assert c.read() == prepared(7)  # nothing changed: empty put and delete
    c.expect_silence(0.1)  # a commit is not answered


def test_rollback_after_prepare_restores_the_committed_values(start):
    c = stateful(start, state={"a": 1}, txid=1)
    op(c, "1", "put", "a", 2)
    c.send(prepare(2))
    assert c.read() == prepared(2, {"a": 2})
    c.send(commit(2))
    op(c, "2", "put", "a", 3)
    op(c, "3", "put", "b", 3)
    c.send(prepare(3))
    assert c.read() == prepared(3, {"a": 3, "b": 3})
    c.send(rollback(2))  # prepared 3 is never committed
    assert get(c, "4", "a") == 2
    assert get(c, "5", "b") is None
    c.send(prepare(3))
    assert c.read() == prepared(3)  # nothing dirty after a rollback


def test_rollback_before_any_commit_restores_the_init_state(start):
    c = stateful(start, state={"a": "x", "b": "y"}, txid=None)
    op(c, "1", "put", "a", "changed")
    op(c, "2", "delete", "b")
    c.send(rollback(None))
    assert get(c, "3", "a") == "x"
    assert get(c, "4", "b") == "y"


def test_state_frames_between_tuples_are_handled_in_order(start):
    c = stateful(start, txid=None)
    # One write: the tuples before a prepare are in it, those after it are not.
    c.write(b"".join(encode_frame(f) for f in [
        tup("1", "put", "a", 1), tup("2", "put", "b", 1), prepare(1), tup("3", "put", "a", 2), commit(1),
        tup("4", "delete", "b"), heartbeat_frame("hb"), prepare(2), rollback(1), tup("5", "get", "b"),
        tup("6", "get", "a"),
    ]))
    assert c.read_n(10) == [
        ack("1"), ack("2"), prepared(1, {"a": 1, "b": 1}), ack("3"), ack("4"), SYNC, prepared(2, {"a": 2}, ["b"]),
        emit(["b", 1], "5"), ack("5"), emit(["a", 1], "6"),
    ]
    assert c.read() == ack("6")


def test_chunked_init_is_the_union_of_its_chunks(start):
    c = start(STATEFUL, offer=["state"], accept=["state"])
    assert c.read() == READY
    c.send(init({"a": 1, "b": 2}, txid=3, more=True))
    c.send(init({}, txid=3, more=True))
    c.send(init({"c": 3}, txid=3))
    assert [get(c, str(i), k) for i, k in enumerate("abc")] == [1, 2, 3]
    c.send(prepare(4))
    assert c.read() == prepared(4)


def test_a_big_prepared_is_chunked(start):
    n = 2500
    c = stateful(start, state={f"old{i}": i for i in range(5)}, txid=1)
    # one put op per key would take long; a bolt written for it puts many per tuple
    for i in range(5):
        op(c, f"d{i}", "delete", f"old{i}")
    big = "x" * 700_000
    op(c, "big1", "put", "big1", big)
    op(c, "big2", "put", "big2", big)
    c.write(b"".join(encode_frame(tup(f"t{i}", "put", f"k{i}", i)) for i in range(n)))
    for i in range(n):
        assert c.read() == ack(f"t{i}")
    c.send(prepare(2))
    chunks = []
    while True:
        f = c.read()
        assert f["command"] == "state" and f["action"] == "prepared" and f["txid"] == 2, f
        chunks.append(f)
        if not f.get("more"):
            break
    assert all(f.get("more") is True for f in chunks[:-1]) and "more" not in chunks[-1]
    assert all(len(f["put"]) + len(f["delete"]) <= 1000 for f in chunks)
    keys = [k for f in chunks for k in list(f["put"]) + f["delete"]]
    assert len(keys) == len(set(keys)) == n + 7  # each key in one chunk only
    put = {k: v for f in chunks for k, v in f["put"].items()}
    assert put == {**{f"k{i}": i for i in range(n)}, "big1": big, "big2": big}
    assert sorted(k for f in chunks for k in f["delete"]) == [f"old{i}" for i in range(5)]
    assert not any("big1" in f["put"] and "big2" in f["put"] for f in chunks)  # about 1 MiB a chunk
    c.send(commit(2))
    c.send(prepare(3))
    assert c.read() == prepared(3)


def test_with_batch_the_prepared_frame_follows_the_output_batch(start):
    c = stateful(start, offer=("batch", "state"), accept=("batch", "state"), state={"a": 1}, txid=1)
    c.write(b"".join(encode_frame(f) for f in [
        {"tuples": [["1", "s", "default", 1, ["put", "a", 2]], ["2", "s", "default", 1, ["get", "a"]]]},
        prepare(2),
        {"tuples": [["3", "s", "default", 1, ["put", "b", 1]]]},
        commit(2),
        rollback(2),
        {"tuples": [["4", "s", "default", 1, ["get", "b"]]]},
    ]))
    # commit and rollback are not answered: the acks after the prepared share a batch
    assert c.read_n(3) == [
        {"command": "batch", "emits": [[["a", 2], ["2"]]], "acks": ["1", "2"]},
        prepared(2, {"a": 2}),
        {"command": "batch", "emits": [[["b", None], ["4"]]], "acks": ["3", "4"]},
    ]


def test_under_msgpack_and_batch(start):
    c = stateful(start, offer=("batch", "msgpack", "state"), accept=("batch", "msgpack", "state"),
                 cls=MsgpackComponent, state={"a": 1, "gone": True}, txid=9)
    c.send({"tuples": [["1", "s", "default", 1, ["put", "a", 2.5]], ["2", "s", "default", 1, ["delete", "gone"]]]})
    assert c.read() == {"command": "batch", "acks": ["1", "2"]}
    c.send(prepare(10))
    assert c.read() == prepared(10, {"a": 2.5}, ["gone"])
    c.send(commit(10))
    c.send({"tuples": [["3", "s", "default", 1, ["put", "a", 3]]]})
    assert c.read() == {"command": "batch", "acks": ["3"]}
    c.send(rollback(10))
    c.send({"tuples": [["4", "s", "default", 1, ["get", "a"]]]})
    assert c.read() == {"command": "batch", "emits": [[["a", 2.5], ["4"]]], "acks": ["4"]}


def test_with_nothing_offered_the_state_is_in_memory(start):
    c = stateful(start, offer=(), accept=())
    op(c, "1", "put", "a", [1])
    assert get(c, "2", "a") == [1]
    op(c, "3", "delete", "a")
    assert get(c, "4", "a") is None
    c.send(tup("5", "unknown-op"))
    assert c.read() == {"command": "fail", "id": "5"}


# -- the count bolt -----------------------------------------------------------------------


def test_count_bolt_starts_from_the_committed_counts(start):
    c = start(COUNT, offer=["batch", "state"], accept=["batch", "state"])
    c.send(init({"alice": 3, "rabbit": 1}, txid=7))
    c.send(tup("-4001", "alice"))
    assert c.read() == {"command": "batch", "emits": [[["alice", 4], ["-4001"]]], "acks": ["-4001"]}
    c.send(prepare(8))
    assert c.read() == prepared(8, {"alice": 4})
    c.send(commit(8))
    c.send({"tuples": [["1", "split", "default", 1, ["rabbit"]], ["2", "split", "default", 1, ["hole"]]]})
    assert c.read() == {"command": "batch", "emits": [[["rabbit", 2], ["1"]], [["hole", 1], ["2"]]],
                        "acks": ["1", "2"]}
    c.send(rollback(8))  # the tree failed: the counts since commit 8 go, and the spout replays
    c.send({"tuples": [["3", "split", "default", 1, ["rabbit"]], ["4", "split", "default", 1, ["hole"]]]})
    assert c.read() == {"command": "batch", "emits": [[["rabbit", 2], ["3"]], [["hole", 1], ["4"]]],
                        "acks": ["3", "4"]}
    c.send(prepare(9))
    assert c.read() == prepared(9, {"rabbit": 2, "hole": 1})


def test_count_bolt_under_a_host_that_offers_nothing(start):
    c = start(COUNT)  # Storm's host: no extensions, counts in memory
    c.send(tup("1", "a"))
    c.send(tup("2", "a"))
    assert c.read_n(4) == [emit(["a", 1], "1"), ack("1"), emit(["a", 2], "2"), ack("2")]


# -- hooks, and what is refused -----------------------------------------------------------

HOOKS = """
    from multilang import StatefulBolt

    class B(StatefulBolt):
        def initialize(self, conf, context):
            self.log("initialize " + repr(len(self.state)))

        def init_state(self, state):
            self.log("init_state " + repr(sorted(state.items())) + " " + repr(state is self.state))

        def pre_prepare(self, txid):
            self.state.put("prepared-at", txid)  # still in this prepare
            self.log("pre_prepare %d" % txid)

        def pre_commit(self, txid):
            self.log("pre_commit %d" % txid)

        def pre_rollback(self):
            self.log("pre_rollback " + repr(self.state.get("k")))

        def process(self, tup):
            if tup.values[0] == "bad":
                self.state.put("k", float("nan"))
            self.state.put("k", tup.values[0])

    B().run()
"""


def log(msg):
    return {"command": "log", "msg": msg, "level": 2}


def test_hooks_in_order_init_state_once_after_the_whole_init(start, tmp_path):
    path = tmp_path / "hooks.py"
    path.write_text(textwrap.dedent(HOOKS))
    c = start([PY, str(path)], offer=["state"], accept=["state"])
    assert c.read() == log("initialize 0")
    c.send(init({"a": 1}, txid=2, more=True))
    c.send(init({"b": 2}, txid=2))
    assert c.read() == log("init_state [('a', 1), ('b', 2)] True")
    c.send(tup("1", "v"))
    assert c.read() == ack("1")
    c.send(prepare(3))
    assert c.read_n(2) == [log("pre_prepare 3"), prepared(3, {"k": "v", "prepared-at": 3})]
    c.send(commit(3))
    assert c.read() == log("pre_commit 3")
    c.send(tup("2", "w"))
    assert c.read() == ack("2")
    c.send(rollback(3))
    assert c.read() == log("pre_rollback 'w'")
    c.send(heartbeat_frame("hb"))
    assert c.read() == SYNC
    c.send(tick_frame("t"))
    assert c.read() == ack("t")


def test_init_state_at_start_under_a_host_without_state(start, tmp_path):
    path = tmp_path / "hooks.py"
    path.write_text(textwrap.dedent(HOOKS))
    c = start([PY, str(path)], offer=["batch"], accept=["batch"])
    assert c.read_n(2) == [log("initialize 0"), log("init_state [] True")]
    c.send(tup("1", "v"))
    assert c.read() == {"command": "batch", "acks": ["1"]}


def test_a_value_that_is_not_json_fails_the_tuple_naming_the_key(start, tmp_path):
    path = tmp_path / "hooks.py"
    path.write_text(textwrap.dedent(HOOKS))
    c = start([PY, str(path)], offer=["state"], accept=["state"])
    assert c.read() == log("initialize 0")
    c.send(init({}))
    assert c.read()["msg"].startswith("init_state")
    c.send(tup("1", "bad"))
    err = c.read()
    assert err["command"] == "error" and "state value of key 'k'" in err["msg"] and "not a JSON number" in err["msg"]
    assert c.read() == {"command": "fail", "id": "1"}
    c.send(prepare(1))
    assert c.read_n(2) == [log("pre_prepare 1"), prepared(1, {"prepared-at": 1})]


def test_a_tuple_before_the_init_is_a_protocol_error(start):
    c = start(STATEFUL, offer=["state"], accept=["state"])
    assert c.read() == READY
    c.send(tup("1", "get", "a"))
    c.read_eof()
    assert c.wait() != 0
    c.wait_closed(5)  # stderr fully drained: the exit can come before the last stderr bytes are read
    assert "before the whole state init" in c.stderr_text()


def test_prepared_chunks_stay_far_below_the_frame_limit_of_the_conf(tmp_path):
    with ComponentProcess(STATEFUL, cwd=ROOT, pid_dir=tmp_path / "pids",
                          conf={"multilang.max.frame.bytes": 4000}) as c:
        c.handshake(offer=["state"], accept=["state"])
        assert c.read() == READY
        c.send(init({}))
        c.write(b"".join(encode_frame(tup(str(i), "put", f"k{i}", "v" * 100)) for i in range(40)))
        assert c.read_n(40) == [ack(str(i)) for i in range(40)]
        c.send(prepare(1))
        chunks = [c.read_raw()]
        while b'"more":true' in chunks[-1]:
            chunks.append(c.read_raw())
        assert len(chunks) >= 4 and all(len(f) < 4000 // 4 + 200 for f in chunks), [len(f) for f in chunks]
