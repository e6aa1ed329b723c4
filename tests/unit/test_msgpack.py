"""Extension msgpack (spec §9.6): framing, the data model, and the switch-over
of a connection after the pid reply, on both sides."""

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from multilang import NEED_DATA, Connection, LocalProtocolError, RemoteProtocolError, Role, Side
from multilang.codec import msgpack_frame, msgpack_loads
from multilang.errors import FrameTooLarge
from multilang.framing import LengthPrefixedReader
from multilang.messages import Ack, Batch, Emit, Handshake, Heartbeat, Log, Pid, TaskIds, Tuple


def frame(obj, **kw):
    body = msgpack.packb(obj, use_bin_type=True, **kw)
    return len(body).to_bytes(4, "big") + body


def events(conn):
    out = []
    while (ev := conn.next_event()) is not NEED_DATA:
        out.append(ev)
    return out


def test_spec_example_bytes():
    """The example of §9.6, byte for byte."""
    assert msgpack_frame({"command": "ack", "id": "17"}).hex() == "0000001382a7636f6d6d616e64a361636ba26964a23137"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
    max_leaves=20,
)


@given(st.lists(st.dictionaries(st.text(max_size=5), json_values, min_size=1, max_size=4), min_size=1, max_size=6),
       st.data())
def test_any_chunking_yields_the_same_frames(objs, data):
    stream = b"".join(msgpack_frame(o) for o in objs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    reader, bodies, last = LengthPrefixedReader(), [], 0
    for c in cuts + [len(stream)]:
        bodies += reader.feed(stream[last:c])
        last = c
    assert reader.close() == []
    assert [msgpack_loads(b) for b in bodies] == objs


def test_reader_limits_and_errors():
    r = LengthPrefixedReader(max_frame_size=10)
    with pytest.raises(FrameTooLarge, match="11 bytes exceeds the 10-byte limit"):
        r.feed(frame({"a": "x"}) + (11).to_bytes(4, "big"))  # refused on the prefix, before any body
    with pytest.raises(FrameTooLarge):
        r.feed(b"more")
    r = LengthPrefixedReader()
    assert r.feed(frame({"a": 1})) == [msgpack.packb({"a": 1})]
    with pytest.raises(RemoteProtocolError, match="length 0"):
        r.feed(b"\x00\x00\x00\x00")
    r = LengthPrefixedReader()
    r.feed(frame({"a": 1})[:-1])
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        r.close()


@pytest.mark.parametrize("body, why", [
    (msgpack.packb({"tuple": [b"\x00"]}, use_bin_type=True), "bytes value"),
    (msgpack.packb({"a": msgpack.ExtType(5, b"x")}), "ext type 5"),
    (msgpack.packb({"a": [{1: 2}]}), "map key"),
    (msgpack.packb({b"k": 1}, use_bin_type=True), "map key"),
    (msgpack.packb({"a": 1}) + b"\xc0", "ExtraData"),
    (msgpack.packb({"a": "long string"})[:-3], "not one valid msgpack object"),
    (b"\xa2\xff\xfe", "UnicodeDecodeError"),
    (msgpack.packb({"tuple": [float("nan")]}), "not a JSON number"),
    (msgpack.packb({"tuple": [float("-inf")]}), "not a JSON number"),
])
def test_outside_the_json_data_model_is_a_protocol_error(body, why):
    with pytest.raises(RemoteProtocolError, match=why):
        msgpack_loads(body)


def test_writer_refuses_what_json_cannot_carry():
    with pytest.raises(LocalProtocolError, match="bytes value"):
        msgpack_frame({"tuple": [b"raw"]})
    with pytest.raises(LocalProtocolError, match="beyond 64 bits"):
        msgpack_frame({"tuple": [2 ** 64]})
    with pytest.raises(LocalProtocolError, match="not a JSON number"):
        msgpack_frame({"tuple": [float("inf")]})
    for value in ({1: "a"}, [{"ok": {(1, 2): 3}}], {None: 1}):  # JSON refuses these keys too
        with pytest.raises(LocalProtocolError, match="is not a string"):
            msgpack_frame({"tuple": [value]})
    nested = {"tuple": [{"a": {"b": [1, "é"]}}, "ü" * 40, 130]}  # string keys, non-ASCII: fine
    assert msgpack_loads(msgpack_frame(nested)[4:]) == nested
    assert msgpack_loads(msgpack_frame({"tuple": ["Ĉ", 2 ** 64 - 1, -(2 ** 63), 1.5]})[4:]) == \
        {"tuple": ["Ĉ", 2 ** 64 - 1, -(2 ** 63), 1.5]}


def test_many_emits_under_msgpack_and_batch_whatever_bytes_their_values_hold():
    """emit_many builds batch elements as tuples, which msgpack writes as
    arrays. The data-model check that a marker-like byte sets off (here
    50372 = 0xc4c4, the bin 8 marker twice) must take them as arrays too."""
    host, comp, _ = negotiated(["batch", "msgpack"], ["batch", "msgpack"])
    tuples = [Tuple(id=str(i), component="s", stream="default", task=1, values=[i]) for i in range(3)]
    [(wire, _)] = host.send_tuples(tuples)
    comp.receive_data(wire)
    assert events(comp) == tuples
    values = [["w", 0xC4C4], ["ü", 0xC7C8], ["x", 3]]
    data = comp.send_emits(values, tuples) + comp.send_acks([u.id for u in tuples]) + comp.close_batch()
    host.receive_data(data)
    assert events(host) == [Batch(emits=[[v, [u.id], "default"] for v, u in zip(values, tuples)], acks=["0", "1", "2"])]
    assert msgpack_frame({"tuple": [("a", (1, "b"))]}) == msgpack_frame({"tuple": [["a", [1, "b"]]]})


def negotiated(offer, accept, role=Role.BOLT, split=False):
    host, comp = Connection(role, Side.HOST), Connection(role, Side.COMPONENT)
    comp.receive_data(host.send(Handshake(pid_dir="/tmp", context={}, extensions=tuple(offer))))
    events(comp)
    # the pid reply and the first msgpack frames in one write (or byte by byte)
    data = comp.send(Pid(pid=5, extensions=tuple(accept))) + comp.send(Log(msg="up\nend\n", level=2))
    if split:
        for i in range(len(data)):
            host.receive_data(data[i : i + 1])
    else:
        host.receive_data(data)
    assert events(host) == [Pid(pid=5, extensions=tuple(accept)), Log(msg="up\nend\n", level=2)]
    return host, comp, data


@pytest.mark.parametrize("split", [False, True])
def test_pid_reply_is_json_and_everything_after_is_msgpack(split):
    host, comp, data = negotiated(["batch", "msgpack"], ["msgpack"], split=split)
    assert host.msgpack and comp.msgpack and not host.batching
    assert data.startswith(b'{"pid":5,"extensions":["msgpack"]}\nend\n')
    assert data.endswith(msgpack_frame({"command": "log", "msg": "up\nend\n", "level": 2}))
    t = Tuple(id="1", component="s", stream="default", task=1, values=["a\nend\n", 1.5, 2 ** 63])
    wire = host.send(t) + host.send(Heartbeat(id="h"))
    assert wire.startswith(msgpack_frame({"id": "1", "comp": "s", "stream": "default", "task": 1,
                                          "tuple": ["a\nend\n", 1.5, 2 ** 63]}))
    comp.receive_data(wire)
    assert events(comp) == [t, Heartbeat(id="h")]
    out = comp.send_emit(["x"], anchors=["1"], need_task_ids=True) + comp.send_ack("1")
    host.receive_data(out)
    assert events(host) == [Emit(values=["x"], anchors=("1",)), Ack(id="1")]
    comp.receive_data(host.send(TaskIds(task_ids=[3])))
    assert comp.next_task_ids() == TaskIds(task_ids=[3])


def test_batch_frames_go_as_msgpack_when_both_are_accepted():
    host, comp, _ = negotiated(["batch", "msgpack"], ["batch", "msgpack"])
    tuples = [Tuple(id=str(i), component="s", stream="default", task=1, values=[i]) for i in range(3)]
    [(wire, _)] = host.send_tuples(tuples)
    assert wire == msgpack_frame({"tuples": [[u.id, u.component, u.stream, u.task, u.values] for u in tuples]})
    comp.receive_data(wire)
    assert events(comp) == tuples
    for u in tuples:
        comp.send_ack(u.id)
    host.receive_data(comp.close_batch())
    assert events(host) == [Batch(acks=["0", "1", "2"])]


def test_not_accepted_stays_json_byte_for_byte():
    host, comp, data = negotiated(["msgpack"], [])
    assert not host.msgpack and not comp.msgpack
    assert data == b'{"pid":5}\nend\n{"command":"log","msg":"up\\nend\\n","level":2}\nend\n'


def test_a_json_frame_after_the_switch_is_a_protocol_error():
    host, comp, _ = negotiated(["msgpack"], ["msgpack"])
    host.receive_data(b'{"command":"sync"}\nend\n')
    with pytest.raises(RemoteProtocolError):
        events(host)
