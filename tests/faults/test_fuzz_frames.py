"""Bad input for the frame reader and the codec (Hypothesis).

Whatever bytes a peer writes, in whatever chunks, a connection either returns
events or raises ``RemoteProtocolError`` (spec/PROTOCOL.md §8.1): never a
``KeyError``, ``TypeError``, ``UnicodeDecodeError``, recursion error or a
``LocalProtocolError``. After the first error the connection stays dead
(every later call raises ``RemoteProtocolError`` too). And the reader never
holds more than ``max_frame_size`` plus one chunk (§1.3).

Inputs: arbitrary bytes; valid streams mutated (bytes flipped, inserted,
deleted, spans duplicated, truncated); big runs that take the reader's
incremental path; all of it cut into arbitrary chunks. Both sides, both roles.
"""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multilang.connection import NEED_DATA, Connection
from multilang.errors import RemoteProtocolError
from multilang.framing import TERMINATOR, FrameReader
from multilang.messages import Activate, ConnectionClosed, Handshake, Heartbeat, Next, Pid, Tuple
from multilang._state import Role, Side

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL_LIMIT = 300

# --- streams ---------------------------------------------------------------------

_ids = st.sampled_from(["1", "2", "3", "-9", "hb", "x", 1, None, [], {}])
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=8,
)

component_frames = st.one_of(
    st.builds(lambda p: {"pid": p}, st.one_of(st.integers(-5, 2**40), _json)),
    st.builds(lambda t, a, s, task, need: {k: v for k, v in
                                           {"command": "emit", "tuple": t, "anchors": a, "stream": s,
                                            "task": task, "need_task_ids": need}.items() if v is not ...},
              st.one_of(st.lists(_json, max_size=3), _json),
              st.one_of(st.just(...), st.lists(_ids, max_size=2), _ids),
              st.one_of(st.just(...), st.sampled_from(["default", "s", None, 3])),
              st.one_of(st.just(...), st.integers(-2, 5), _json),
              st.one_of(st.just(...), st.booleans(), _json)),
    st.builds(lambda c, i: {"command": c, "id": i}, st.sampled_from(["ack", "fail"]), _ids),
    st.builds(lambda c: {"command": c}, st.sampled_from(["sync", "next", "zzz", "batch", "log", "error", "metrics"])),
    st.builds(lambda m, lv: {"command": "log", "msg": m, "level": lv}, _json, _json),
    st.builds(lambda n, p: {"command": "metrics", "name": n, "params": p}, _json, _json),
    st.builds(lambda e, a, f: {"command": "batch", "emits": e, "acks": a, "fails": f}, _json, _json, _json),
    st.lists(st.one_of(st.integers(-3, 9), _json), max_size=3),
    _json,
)

host_frames = st.one_of(
    st.builds(lambda d, c, x: {"pidDir": d, "conf": c, "context": x}, st.one_of(st.just("/tmp/p"), _json), _json, _json),
    st.builds(lambda i, c, s, t, v: {"id": i, "comp": c, "stream": s, "task": t, "tuple": v},
              _ids, st.one_of(st.just("src"), _json), st.sampled_from(["default", "__heartbeat", "__tick", 5]),
              st.one_of(st.integers(-1, 9), _json), st.one_of(st.lists(_json, max_size=3), _json)),
    st.builds(lambda c, i: {"command": c, "id": i},
              st.sampled_from(["next", "ack", "fail", "activate", "deactivate", "weird", 7]), _ids),
    st.builds(lambda t: {"tuples": t}, _json),
    st.lists(st.one_of(st.integers(-3, 9), _json), max_size=3),
)


def _encode(obj) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # integers beyond 64 bits
        import json

        return json.dumps(obj).encode()


@st.composite
def framed(draw, frames):
    out = bytearray()
    for obj in draw(st.lists(frames, max_size=6)):
        out += draw(st.sampled_from([b"", b"\n", b"\r\n", b" \r"]))
        out += _encode(obj)
        out += draw(st.sampled_from([TERMINATOR, b"\r\nend\r\n", b"\rend\r", b"\nend", b"\nend \n", b"\n"]))
    return bytes(out)


@st.composite
def mutated(draw, data: bytes):
    buf = bytearray(data)
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "dup", "truncate", "special"]))
        pos = draw(st.integers(0, len(buf)))
        if op == "flip" and buf:
            i = min(pos, len(buf) - 1)
            buf[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
        elif op == "dup":
            end = min(len(buf), pos + draw(st.integers(1, 40)))
            buf[end:end] = buf[pos:end]
        elif op == "truncate":
            del buf[pos:]
        else:
            buf[pos:pos] = draw(st.sampled_from([b"end", b"\nend\n", b"\r", b"\x00", b"\xff\xfe", b'"', b"\\",
                                                 b"[" * 50, b"{" * 50, b"1e999999", b"-", b"\xed\xa0\x80"]))
    return bytes(buf)


@st.composite
def chunked(draw, data: bytes):
    if not data:
        return [b""] if draw(st.booleans()) else []
    cuts = draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=min(20, len(data)), unique=True))
    cuts = sorted(set(cuts) | {0, len(data)})
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


def _bytes_for(frames):
    return st.one_of(
        st.binary(max_size=600),
        framed(frames),
        framed(frames).flatmap(mutated),
        st.tuples(framed(frames), st.binary(max_size=60), framed(frames)).map(b"".join).flatmap(mutated),
    )


big_runs = st.tuples(
    st.sampled_from([b"x", b"ab", b"{\"command\":", b"\n", b"end\n", b"\r", b" ", b"[1,"]),
    st.integers(1, 40_000),
    st.binary(max_size=20),
).map(lambda t: t[0] * t[1] + t[2])


# --- the connections under test ------------------------------------------------------------


def host_conn(role: Role, limit: int, pid_first: bool) -> tuple[Connection, bytes]:
    """A host that has sent the handshake; optionally the component already
    replied with its pid and the host sent it some work (so acks, syncs and
    anchors can be legal)."""
    conn = Connection(role, Side.HOST, max_frame_size=limit)
    conn.send(Handshake(pid_dir="/tmp/p", conf={}, context={}))
    prefix = b""
    if pid_first:
        conn.receive_data(b'{"pid":42}\nend\n')
        assert isinstance(conn.next_event(), Pid)
        if role is Role.BOLT:
            for tid in ("1", "2", "3"):
                conn.send(Tuple(id=tid, component="src", stream="default", task=1, values=["v"]))
            conn.send(Heartbeat(id="hb"))
        else:
            conn.send(Activate())
    return conn, prefix


def component_conn(role: Role, limit: int, handshaken: bool) -> Connection:
    conn = Connection(role, Side.COMPONENT, max_frame_size=limit)
    if handshaken:
        conn.receive_data(b'{"pidDir":"/tmp/p","conf":{},"context":{}}\nend\n')
        assert isinstance(conn.next_event(), Handshake)
        conn.send(Pid(pid=42))
        if role is Role.BOLT:
            conn.send_emit(["x"], need_task_ids=True)  # one task-id list is owed
    return conn


def feed_all(conn: Connection, chunks: list[bytes], limit: int, *, eof: bool, task_ids: bool = False) -> list:
    """Feed chunks, draining events after each; return the events. Only
    RemoteProtocolError may escape, and then the connection stays dead."""
    events = []
    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            assert conn._reader.buffered <= limit + len(chunk), (conn._reader.buffered, limit, len(chunk))
            while True:
                ev = conn.next_task_ids() if task_ids and not events else conn.next_event()
                if ev is NEED_DATA:
                    break
                events.append(ev)
                if isinstance(ev, ConnectionClosed):
                    return events
        if eof:
            conn.receive_data(b"")
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA:
                    break
                events.append(ev)
                if isinstance(ev, ConnectionClosed):
                    break
    except RemoteProtocolError:
        # Dead for good: the next call raises the same kind of error, or
        # reports the end of the stream (EOF while waiting for task ids is
        # raised to the waiter, then seen as the close, §5.4).
        # Events that arrived before the bad frame and were set aside while
        # waiting for task ids (§6.2) are still handed out first.
        for _ in range(len(conn._stash) + 1):
            try:
                ev = conn.next_event()
            except RemoteProtocolError:
                break
            if isinstance(ev, ConnectionClosed):
                break
            assert ev is not NEED_DATA, "a dead connection asked for more data"
        else:
            raise AssertionError("the connection went on after a protocol error")
    return events


# --- properties -----------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), role=st.sampled_from([Role.BOLT, Role.SPOUT]), pid_first=st.booleans(),
       limit=st.sampled_from([SMALL_LIMIT, 64 << 20]), eof=st.booleans())
def test_host_side_never_raises_anything_but_remote_protocol_error(data, role, pid_first, limit, eof):
    conn, _ = host_conn(role, limit, pid_first)
    raw = data.draw(_bytes_for(component_frames))
    feed_all(conn, data.draw(chunked(raw)), limit, eof=eof)


@SETTINGS
@given(data=st.data(), role=st.sampled_from([Role.BOLT, Role.SPOUT]), handshaken=st.booleans(),
       limit=st.sampled_from([SMALL_LIMIT, 64 << 20]), eof=st.booleans(), task_ids=st.booleans())
def test_component_side_never_raises_anything_but_remote_protocol_error(data, role, handshaken, limit, eof,
                                                                        task_ids):
    conn = component_conn(role, limit, handshaken)
    raw = data.draw(_bytes_for(host_frames))
    feed_all(conn, data.draw(chunked(raw)), limit, eof=eof, task_ids=task_ids and handshaken and role is Role.BOLT)


@settings(max_examples=60, deadline=None)
@given(run=big_runs, data=st.data(), limit=st.sampled_from([1000, 70_000]),
       side=st.sampled_from([Side.HOST, Side.COMPONENT]))
def test_big_unterminated_runs_are_cut_off_at_the_limit(run, data, limit, side):
    # Big inputs take the reader's incremental path (past 64 KiB); the
    # buffer must still stay within the limit plus one chunk.
    if side is Side.HOST:
        conn, _ = host_conn(Role.BOLT, limit, True)
    else:
        conn = component_conn(Role.BOLT, limit, True)
    chunks = data.draw(chunked(run))
    feed_all(conn, chunks, limit, eof=data.draw(st.booleans()))


@SETTINGS
@given(data=st.data(), limit=st.integers(1, 400))
def test_frame_reader_alone_is_bounded_and_raises_only_remote_protocol_errors(data, limit):
    reader = FrameReader(limit)
    raw = data.draw(st.one_of(st.binary(max_size=2000), big_runs, framed(component_frames).flatmap(mutated)))
    try:
        for chunk in data.draw(chunked(raw)):
            frames = reader.feed(chunk)
            assert all(len(f) <= limit for f in frames), "a frame over the limit was returned"
            assert reader.buffered <= limit + len(chunk)
        reader.close()
    except RemoteProtocolError:
        pass


def test_a_spout_host_in_a_command_takes_a_sync_and_nothing_unasked():
    # A sanity anchor for the fuzzers above: the fixtures build live connections.
    conn, _ = host_conn(Role.SPOUT, 1000, True)
    conn.receive_data(b'{"command":"sync"}\nend\n')
    assert type(conn.next_event()).__name__ == "Sync"
    conn.send(Next())
    conn.receive_data(b'{"command":"sync"}\nend\n{"command":"sync"}\nend\n')
    conn.next_event()
    try:
        conn.next_event()
    except RemoteProtocolError as exc:
        assert "Sync is not legal" in str(exc)
    else:
        raise AssertionError("a second sync was accepted")
