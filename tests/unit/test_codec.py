"""The JSON codec: messages <-> frames, both directions (spec §1, §3, §4)."""

import gc
import json
import threading

import msgpack
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilang import Connection, LocalProtocolError, RemoteProtocolError, Role, Side, codec
from multilang.codec import decode_component_frame, decode_host_frame, dumps, encode, encode_json, loads
from multilang.framing import FrameReader
from multilang.messages import (
    Ack,
    Activate,
    Batch,
    Deactivate,
    Emit,
    Error,
    Fail,
    Handshake,
    Heartbeat,
    Log,
    Metrics,
    Next,
    Pid,
    StateCommit,
    StateInit,
    StatePrepare,
    StatePrepared,
    StateRollback,
    Sync,
    TaskIds,
    Tick,
    Tuple,
    TupleBatch,
    UnknownCommand,
)

# --- strategies ------------------------------------------------------------------

text = st.text(
    alphabet=st.one_of(
        st.characters(exclude_categories=("Cs",)),
        st.sampled_from(["\U0001F600", "/", "\\", '"', "\n", "\u2028", "\x00", "\u00fc"]),
    ),
    max_size=10,
)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3),
    max_leaves=8,
)
tuple_ids = st.one_of(ints.map(str), text)
streams = text.filter(lambda s: s not in ("__heartbeat", "__tick"))
task_ids = st.lists(ints, max_size=5)


def body(frame: bytes) -> bytes:
    """The frame body as a reader delivers it (checks the frame is whole)."""
    frames = FrameReader().feed(frame)
    assert len(frames) == 1
    return frames[0]


def from_component(msg):
    return decode_component_frame(body(encode(msg)))


def from_host(msg, spout):
    return decode_host_frame(body(encode(msg)), spout=spout)


# --- round trips: component -> host --------------------------------------------------

component_msgs = st.one_of(
    st.builds(
        Emit,
        values=st.lists(json_values, max_size=4),
        stream=text,
        anchors=st.lists(tuple_ids, max_size=3).map(tuple),
        id=json_values,
        task=st.one_of(st.none(), ints.filter(bool)),
        need_task_ids=st.booleans(),
    ),
    st.builds(Ack, id=tuple_ids),
    st.builds(Fail, id=tuple_ids),
    st.builds(Log, msg=text, level=st.integers(0, 4)),
    st.builds(Error, msg=text),
    st.builds(Metrics, name=text, params=json_values),
    st.just(Sync()),
    st.builds(Pid, pid=st.integers(1, 2**31), extensions=st.lists(text, max_size=3).map(tuple)),
    # §9.5 output batches: emits [tuple, anchors_or_id, stream] with trailing parts optional
    st.builds(
        Batch,
        emits=st.lists(st.one_of(
            st.tuples(st.lists(json_values, max_size=3)).map(list),
            st.tuples(st.lists(json_values, max_size=3), st.lists(tuple_ids, max_size=2)).map(list),
            st.tuples(st.lists(json_values, max_size=3), st.one_of(st.none(), json_values), streams).map(list),
        ), max_size=4),
        acks=st.lists(tuple_ids, max_size=4),
        fails=st.lists(tuple_ids, max_size=4),
    ),
    # §9.7 the component's one state frame: put and delete never share a key
    st.builds(
        lambda txid, put, delete, more: StatePrepared(txid=txid, put=put, delete=[k for k in delete if k not in put],
                                                      more=more),
        st.integers(1, 2**62), st.dictionaries(text, json_values, max_size=3), st.lists(text, max_size=3),
        st.booleans(),
    ),
    st.builds(
        lambda cmd, extra: UnknownCommand(command=cmd, frame={**extra, "command": cmd}),
        text.filter(lambda c: c not in ("emit", "ack", "fail", "sync", "log", "error", "metrics", "batch", "state")),
        st.dictionaries(text, json_values, max_size=3),
    ),
)


@settings(max_examples=200, deadline=None)
@given(component_msgs)
def test_component_messages_round_trip(msg):
    assert from_component(msg) == _completed(msg)


def _completed(msg):
    """What the decoder makes of a message: a batched emit gets the elements
    the wire may leave out (§9.5: no anchors or id, the default stream)."""
    if type(msg) is not Batch:
        return msg
    full = [[*e, None, "default"][:2] + [e[2] if len(e) > 2 and e[2] is not None else "default"] for e in msg.emits]
    return Batch(emits=full, acks=msg.acks, fails=msg.fails)


# --- round trips: host -> bolt / spout ----------------------------------------------------

bolt_host_msgs = st.one_of(
    st.builds(Handshake, pid_dir=text, conf=st.dictionaries(text, json_values, max_size=3),
              context=st.dictionaries(text, json_values, max_size=3)),
    st.builds(Tuple, id=tuple_ids, component=st.one_of(st.none(), text), stream=streams, task=ints,
              values=st.lists(json_values, max_size=4)),
    st.builds(Tick, id=tuple_ids, component=st.just("__system"), stream=st.just("__tick"), task=st.just(-1),
              values=st.lists(json_values, max_size=2)),
    st.builds(Heartbeat, id=tuple_ids),
    st.builds(TaskIds, task_ids=task_ids),
    # §9.5 tuple batches
    st.builds(TupleBatch, tuples=st.lists(
        st.builds(Tuple, id=tuple_ids, component=st.one_of(st.none(), text), stream=streams, task=ints,
                  values=st.lists(json_values, max_size=3)),
        min_size=1, max_size=4)),
    # §9.7 the host's state frames
    st.builds(StateInit, txid=st.one_of(st.none(), st.integers(1, 2**62)),
              state=st.dictionaries(text, json_values, max_size=3), more=st.booleans()),
    st.builds(StatePrepare, txid=st.integers(1, 2**62)),
    st.builds(StateCommit, txid=st.integers(1, 2**62)),
    st.builds(StateRollback, txid=st.one_of(st.none(), st.integers(1, 2**62))),
)  # fmt: skip

spout_host_msgs = st.one_of(
    st.just(Next()),
    st.just(Activate()),
    st.just(Deactivate()),
    st.builds(Ack, id=json_values),
    st.builds(Fail, id=json_values),
    st.builds(TaskIds, task_ids=task_ids),
    st.builds(
        lambda cmd: UnknownCommand(command=cmd, frame={"command": cmd, "id": ""}),
        text.filter(lambda c: c not in ("next", "activate", "deactivate", "ack", "fail")),
    ),
)


@settings(max_examples=100, deadline=None)
@given(bolt_host_msgs)
def test_bolt_host_messages_round_trip(msg):
    assert from_host(msg, spout=False) == msg


@settings(max_examples=200, deadline=None)
@given(spout_host_msgs)
def test_spout_host_messages_round_trip(msg):
    assert from_host(msg, spout=True) == msg


def test_every_message_type_is_covered():
    covered = {Emit, Ack, Fail, Log, Error, Metrics, Sync, Pid, UnknownCommand, Handshake, Tuple, Tick,
               Heartbeat, TaskIds, Next, Activate, Deactivate, Batch, TupleBatch,
               StateInit, StatePrepare, StatePrepared, StateCommit, StateRollback}  # fmt: skip
    import multilang.messages as m

    sent = {getattr(m, n) for n in m.__all__ if isinstance(getattr(m, n), type) and issubclass(getattr(m, n), m.Message)}
    # abstract bases and the EOF pseudo-event never go on the wire
    assert sent - covered == {m.Message, m.SpoutCommand, m.ConnectionClosed}


# --- spout ids keep their JSON type ----------------------------------------------------

SPOUT_IDS = [0, "1", -2, 4.5, {"k": [5]}, "0012", True, [1, "a"], 2**63 - 1]


@pytest.mark.parametrize("mid", SPOUT_IDS, ids=repr)
def test_spout_ids_keep_their_type(mid):
    emit = from_component(Emit(values=["x"], id=mid))
    assert emit.id == mid and type(emit.id) is type(mid)
    for cls in (Ack, Fail):
        got = from_host(cls(id=mid), spout=True)
        assert type(got) is cls and got.id == mid and type(got.id) is type(mid)


def test_spout_emit_id_none_means_absent():
    frame = encode(Emit(values=["x"], id=None))
    assert b'"id"' not in frame
    assert decode_component_frame(b'{"command":"emit","tuple":[1]}').id is None
    assert decode_component_frame(b'{"command":"emit","tuple":[1],"id":null}').id is None
    # 0 is a reliable id, not "absent"
    assert encode(Emit(values=["x"], id=0)) == b'{"command":"emit","tuple":["x"],"id":0}\nend\n'


def test_tuple_ids_stay_strings():
    for tid in ["-9223372036854775808", "0012", "1e3", ""]:
        tup = decode_host_frame(b'{"id":"%s","comp":"s","stream":"default","task":1,"tuple":[]}' % tid.encode(), spout=False)
        assert tup.id == tid
        assert encode(Ack(id=tid)) == b'{"command":"ack","id":"%s"}\nend\n' % tid.encode()


# --- emit details --------------------------------------------------------------------------


def test_anchors_as_a_bare_string():
    e = decode_component_frame(b'{"command":"emit","tuple":[1],"anchors":"-5"}')
    assert e.anchors == ("-5",)


@pytest.mark.parametrize("anchors", [b"[]", b"null"])
def test_no_anchors(anchors):
    assert decode_component_frame(b'{"command":"emit","tuple":[1],"anchors":%s}' % anchors).anchors == ()


@pytest.mark.parametrize("anchors", [b"[1]", b'["a", 2]', b"5", b"{}", b"true"])
def test_bad_anchors_rejected(anchors):
    with pytest.raises(RemoteProtocolError):
        decode_component_frame(b'{"command":"emit","tuple":[1],"anchors":%s}' % anchors)


def test_task_zero_is_a_normal_emit():
    e = decode_component_frame(b'{"command":"emit","tuple":[1],"task":0}')
    assert e.task is None and not e.is_direct and e.wants_task_ids
    d = decode_component_frame(b'{"command":"emit","tuple":[1],"task":7}')
    assert d.task == 7 and d.is_direct and not d.wants_task_ids
    n = decode_component_frame(b'{"command":"emit","tuple":[1],"task":-1}')
    assert n.task == -1 and n.is_direct


@pytest.mark.parametrize("task", [b'"3"', b"3.0", b"true", b"[3]"])
def test_task_must_be_an_integer(task):
    with pytest.raises(RemoteProtocolError):
        decode_component_frame(b'{"command":"emit","tuple":[1],"task":%s}' % task)


@pytest.mark.parametrize("value, expected", [(b"true", True), (b"false", False)])
def test_need_task_ids_boolean(value, expected):
    assert decode_component_frame(b'{"command":"emit","tuple":[1],"need_task_ids":%s}' % value).need_task_ids is expected


def test_need_task_ids_default_true():
    assert decode_component_frame(b'{"command":"emit","tuple":[1]}').need_task_ids is True


@pytest.mark.parametrize("value", [b"0", b"1", b'"false"', b'"true"', b"null", b"[]"])
def test_need_task_ids_must_be_a_json_boolean(value):
    with pytest.raises(RemoteProtocolError) as info:
        decode_component_frame(b'{"command":"emit","tuple":[1],"need_task_ids":%s}' % value)
    assert "need_task_ids" in str(info.value)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"command":"emit"}',
        b'{"command":"emit","tuple":"abc"}',
        b'{"command":"emit","tuple":{}}',
        b'{"command":"emit","tuple":[],"stream":5}',
    ],
)
def test_bad_emits_rejected(frame):
    with pytest.raises(RemoteProtocolError) as info:
        decode_component_frame(frame)
    assert info.value.frame == frame


def test_emit_stream_null_is_default():
    assert decode_component_frame(b'{"command":"emit","tuple":[],"stream":null}').stream == "default"


# --- acks, commands -----------------------------------------------------------------------------


@pytest.mark.parametrize("ack_id", [b"5", b"-9223372036854775808", b"5.0", b"null", b"[\"5\"]"])
@pytest.mark.parametrize("cmd", [b"ack", b"fail"])
def test_non_string_bolt_ack_ids_rejected(cmd, ack_id):
    # The codec hands the id over as sent; the bolt host connection rejects
    # anything but the id string it sent (a number would lose precision).
    conn = Connection(Role.BOLT, Side.HOST)
    conn.send(Handshake(pid_dir="/p"))
    conn.receive_data(b'{"pid":1}\nend\n')
    conn.next_event()
    conn.send(Tuple(id="5", component="c", stream="default", task=1, values=[]))
    conn.receive_data(b'{"command":"%s","id":%s}\nend\n' % (cmd, ack_id))
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert "string" in str(info.value)
    assert conn.pending == {"5"}


@pytest.mark.parametrize(
    "frame",
    [b'{"id":"1"}', b"{}", b'{"msg":"x","level":2}', b'{"tuple":[1]}'],
)
def test_component_frames_without_command_rejected(frame):
    with pytest.raises(RemoteProtocolError) as info:
        decode_component_frame(frame)
    assert "command" in str(info.value)
    assert info.value.frame == frame


@pytest.mark.parametrize("frame", [b'{"id":""}', b"{}", b'{"command":5,"id":""}'])
def test_spout_host_frames_without_command_rejected(frame):
    with pytest.raises(RemoteProtocolError):
        decode_host_frame(frame, spout=True)


@pytest.mark.parametrize("frame", [b'{"command":5}', b'{"command":null,"x":1}', b'{"command":["emit"]}'])
def test_non_string_command_rejected(frame):
    with pytest.raises(RemoteProtocolError):
        decode_component_frame(frame)


def test_unknown_commands_decode_as_unknown():
    msg = decode_component_frame(b'{"command":"frobnicate","x":[1]}')
    assert msg == UnknownCommand(command="frobnicate", frame={"command": "frobnicate", "x": [1]})
    msg = decode_host_frame(b'{"command":"rewind","id":""}', spout=True)
    assert msg == UnknownCommand(command="rewind", frame={"command": "rewind", "id": ""})


@pytest.mark.parametrize(
    "frame",
    [b"[1]", b'"sync"', b"null", b"5", b"not json", b'{"command":"sync"', b"", b'{"command":"sync"} x'],
)
def test_non_objects_and_garbage_rejected_from_components(frame):
    with pytest.raises(RemoteProtocolError) as info:
        decode_component_frame(frame)
    assert info.value.frame == frame


@pytest.mark.parametrize("frame", [b"[1, 2.5]", b'[1, "2"]', b"[true]", b"[[1]]"])
def test_task_id_lists_must_hold_integers(frame):
    with pytest.raises(RemoteProtocolError):
        decode_host_frame(frame, spout=False)


def test_empty_task_id_list():
    assert decode_host_frame(b"[]", spout=False) == TaskIds(task_ids=[])
    assert decode_host_frame(b"[]", spout=True) == TaskIds(task_ids=[])


@pytest.mark.parametrize(
    "frame",
    [
        b'{"id":1,"comp":"c","stream":"s","task":1,"tuple":[]}',
        b'{"id":"1","comp":"c","task":1,"tuple":[]}',
        b'{"id":"1","comp":"c","stream":"s","task":"1","tuple":[]}',
        b'{"id":"1","comp":"c","stream":"s","task":1,"tuple":{}}',
        b'{"id":"1","comp":"c","stream":"s","tuple":[]}',
        b'{"pidDir":5}',
        b'"x"',
    ],
)
def test_bad_host_frames_rejected(frame):
    with pytest.raises(RemoteProtocolError):
        decode_host_frame(frame, spout=False)


def test_heartbeat_and_tick_recognised():
    hb = decode_host_frame(b'{"id":"-3","comp":null,"stream":"__heartbeat","task":-1,"tuple":[]}', spout=False)
    assert hb == Heartbeat(id="-3")
    tick = decode_host_frame(b'{"id":"7","comp":"__system","stream":"__tick","task":-1,"tuple":[30]}', spout=False)
    assert type(tick) is Tick and tick.values == [30]
    # __tick from another component is an ordinary tuple
    t = decode_host_frame(b'{"id":"8","comp":"other","stream":"__tick","task":3,"tuple":[30]}', spout=False)
    assert type(t) is Tuple


def test_handshake_context():
    frame = (
        b'{"pidDir":"\\/tmp\\/pids","conf":{"topology.name":"t"},"context":{"task->component":{"1":"spout","2":"split"},'
        b'"taskid":2,"componentid":"split","streams":["default"],"stream->outputfields":{"default":["word"]},'
        b'"stream->target->grouping":{},"source->stream->grouping":{},"source->stream->fields":{}}}'
    )
    hs = decode_host_frame(frame, spout=False)
    assert hs.pid_dir == "/tmp/pids"
    ctx = hs.topology_context
    assert ctx.task_id == 2 and ctx.component_id == "split"
    assert ctx.task_to_component == {1: "spout", 2: "split"}
    assert ctx.component_tasks("split") == [2]
    assert ctx.to_json() == orjson.loads(frame)["context"]


# --- logs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [b"5", b"-1", b'"3"', b"2.0", b"null", b"true"])
def test_odd_log_levels_become_info(level):
    assert decode_component_frame(b'{"command":"log","msg":"m","level":%s}' % level) == Log(msg="m", level=2)


def test_log_without_level_is_info():
    assert decode_component_frame(b'{"command":"log","msg":"m"}') == Log(msg="m", level=2)


def test_non_string_log_msg_is_kept_as_json():
    assert decode_component_frame(b'{"command":"log","msg":[1,"a"]}').msg == '[1,"a"]'


def test_metrics_need_a_string_name():
    with pytest.raises(RemoteProtocolError):
        decode_component_frame(b'{"command":"metrics","name":5,"params":1}')


@pytest.mark.parametrize("frame", [b'{"pid":"12"}', b'{"pid":1.5}', b'{"pid":12,"extensions":"x"}', b'{"pid":12,"extensions":[1]}'])
def test_bad_pid_replies_rejected(frame):
    with pytest.raises(RemoteProtocolError):
        decode_component_frame(frame)


def test_plain_pid_reply():
    assert decode_component_frame(b'{"pid": 1234}') == Pid(pid=1234)
    assert decode_component_frame(b'{"pid": 1234, "extensions": []}') == Pid(pid=1234)


# --- escapes, unicode, big integers ------------------------------------------------------------------


def test_escaped_slash_decoded():
    msg = decode_component_frame(b'{"command":"log","msg":"a\\/b\\/\\u00fc\\ud83d\\ude00"}')
    assert msg.msg == "a/b/\u00fc\U0001F600"
    tup = decode_host_frame(b'{"id":"1","comp":"c\\/d","stream":"s","task":1,"tuple":["\\/"]}', spout=False)
    assert tup.component == "c/d" and tup.values == ["/"]


def test_utf8_written_raw():
    assert encode(Log(msg="\u00fc\U0001F600/")) == '{"command":"log","msg":"\u00fc\U0001F600/","level":2}\nend\n'.encode()


def test_storm_py_style_frames_accepted():
    # storm.py writes ASCII with \u escapes and ", " separators.
    frame = json.dumps({"command": "emit", "anchors": ["1"], "tuple": ["\u00fc\U0001F600"]}).encode()
    assert b"\\u" in frame and b", " in frame
    assert decode_component_frame(frame) == Emit(values=["\u00fc\U0001F600"], anchors=("1",))


@pytest.mark.parametrize("big", [2**64, -(2**63) - 1, 10**30, -(10**40)])
def test_integers_beyond_64_bits_encoded_via_fallback(big):
    frame = encode(Emit(values=[big, "\u00fc"], need_task_ids=False))
    assert frame == b'{"command":"emit","tuple":[%d,"\xc3\xbc"],"need_task_ids":false}\nend\n' % big
    assert json.loads(body(frame))["tuple"][0] == big


def test_64_bit_extremes_round_trip():
    for v in (2**63 - 1, -(2**63), 2**64 - 1):
        assert loads(dumps([v])) == [v]


def test_unserialisable_values_are_local_errors():
    with pytest.raises(LocalProtocolError):
        dumps({"x": object()})
    with pytest.raises(LocalProtocolError):
        encode(Emit(values=[object()]))
    with pytest.raises(LocalProtocolError):
        encode(Log(msg="\ud800"))  # a lone surrogate cannot be UTF-8


maybe_non_finite = st.recursive(
    st.none() | ints | st.floats() | st.sampled_from(["null", "u", "nul", "n\u00fcll", "NaN"]) | text,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3),
    max_leaves=8,
)


@given(maybe_non_finite)
@settings(max_examples=300)
def test_dumps_refuses_exactly_the_values_holding_a_nan_or_infinity(value):
    """orjson writes NaN and the infinities as null; dumps looks for null
    (after a cheap test for its letter u) and only then walks the value. So
    strings holding "null" or "u" and real Nones must pass, and every
    non-finite float, however deep, must be refused."""

    def has_non_finite(v):
        if isinstance(v, float):
            return v != v or v in (float("inf"), float("-inf"))
        if isinstance(v, list):
            return any(map(has_non_finite, v))
        if isinstance(v, dict):
            return any(map(has_non_finite, v.values()))
        return False

    if has_non_finite(value):
        with pytest.raises(LocalProtocolError, match="not a JSON number"):
            dumps(value)
    else:
        assert orjson.loads(dumps(value)) == orjson.loads(orjson.dumps(value))


@pytest.mark.parametrize("value", [[float("nan")], ["u", {"k": [float("-inf")]}], [None, "null", float("inf")]])
def test_non_finite_floats_are_refused_beside_nulls_and_text(value):
    with pytest.raises(LocalProtocolError, match="not a JSON number"):
        dumps(value)


def test_loads_error_carries_the_bytes():
    with pytest.raises(RemoteProtocolError) as info:
        loads(b"{bad")
    assert info.value.frame == b"{bad"
    assert "b'{bad'" in str(info.value)


# --- exact bytes of standard frames --------------------------------------------------------------------


@pytest.mark.parametrize(
    "msg, frame",
    [
        (Sync(), b'{"command":"sync"}\nend\n'),
        (Next(), b'{"command":"next","id":""}\nend\n'),
        (Activate(), b'{"command":"activate","id":""}\nend\n'),
        (Deactivate(), b'{"command":"deactivate","id":""}\nend\n'),
        (Ack(id="-5"), b'{"command":"ack","id":"-5"}\nend\n'),
        (Fail(id="7"), b'{"command":"fail","id":"7"}\nend\n'),
        (Ack(id=3), b'{"command":"ack","id":3}\nend\n'),
        (Fail(id={"k": [5]}), b'{"command":"fail","id":{"k":[5]}}\nend\n'),
        (Pid(pid=1234), b'{"pid":1234}\nend\n'),
        (TaskIds(task_ids=[1, 2]), b"[1,2]\nend\n"),
        (TaskIds(task_ids=[]), b"[]\nend\n"),
        (Heartbeat(id="-1"), b'{"id":"-1","comp":null,"stream":"__heartbeat","task":-1,"tuple":[]}\nend\n'),
        (
            Tuple(id="5", component="spout", stream="default", task=3, values=["a", 1]),
            b'{"id":"5","comp":"spout","stream":"default","task":3,"tuple":["a",1]}\nend\n',
        ),
        (
            Tick(id="9", component="__system", stream="__tick", task=-1, values=[5]),
            b'{"id":"9","comp":"__system","stream":"__tick","task":-1,"tuple":[5]}\nend\n',
        ),
        (Log(msg="hi", level=3), b'{"command":"log","msg":"hi","level":3}\nend\n'),
        (Error(msg="bad"), b'{"command":"error","msg":"bad"}\nend\n'),
        (Metrics(name="m", params={"a": 1}), b'{"command":"metrics","name":"m","params":{"a":1}}\nend\n'),
        (Emit(values=["w"]), b'{"command":"emit","tuple":["w"]}\nend\n'),
        (
            Emit(values=["w"], stream="s", anchors=("1", "2"), task=4, need_task_ids=False),
            b'{"command":"emit","tuple":["w"],"stream":"s","anchors":["1","2"],"task":4,"need_task_ids":false}\nend\n',
        ),
        (Emit(values=[], id="m1"), b'{"command":"emit","tuple":[],"id":"m1"}\nend\n'),
        (
            Handshake(pid_dir="/p", conf={}, context={}),
            b'{"pidDir":"/p","conf":{},"context":{}}\nend\n',
        ),
    ],
)
def test_exact_bytes(msg, frame):
    assert encode(msg) == frame
    assert encode_json(msg) == orjson.loads(frame[: -len(b"\nend\n")])


def test_unknown_command_encodes_its_frame():
    msg = UnknownCommand(command="x", frame={"command": "x", "id": ""})
    assert encode(msg) == b'{"command":"x","id":""}\nend\n'


# --- large frames are parsed with the cyclic GC paused ----------------------------------


def _big_batch(n: int = 5000) -> bytes:
    emits = [[[f"w{i}"], [str(i)]] for i in range(n)]
    return orjson.dumps({"command": "batch", "emits": emits, "acks": [str(i) for i in range(n)]})


def _collections_during(parse, body: bytes) -> tuple[int, object]:
    """How many collections started in this thread while ``parse(body)`` ran
    (a callback runs in the thread that collects: another thread's explicit
    ``gc.collect()``, a leftover of an earlier test in this worker, is not
    the parse's doing)."""
    starts = []
    me = threading.get_ident()

    def cb(phase: str, info: dict) -> None:
        if phase == "start" and threading.get_ident() == me:
            starts.append(info["generation"])

    gc.collect()
    gc.callbacks.append(cb)
    try:
        obj = parse(body)
        n = len(starts)  # read before anything else allocates and may collect
    finally:
        gc.callbacks.remove(cb)
    return n, obj


def test_a_large_frame_is_parsed_without_collections():
    body = _big_batch()
    assert len(body) > codec.PAUSE_GC_BYTES
    # The same parse, collector running: CPython collects many times over the
    # 15,000 new containers (so this test can tell the two apart).
    during_plain, _ = _collections_during(orjson.loads, body)
    assert during_plain >= 5
    during, obj = _collections_during(loads, body)
    assert during == 0
    assert gc.isenabled()
    assert len(obj["emits"]) == 5000 and obj["emits"][4999] == [["w4999"], ["4999"]]
    msg = decode_component_frame(body)
    assert len(msg.emits) == 5000 and gc.isenabled()


def test_a_large_msgpack_frame_is_parsed_without_collections():
    body = msgpack.packb(orjson.loads(_big_batch()))
    during, obj = _collections_during(codec.msgpack_loads, body)
    assert during == 0 and gc.isenabled()
    assert obj["acks"][-1] == "4999"


def test_the_collector_is_restored_after_a_bad_large_frame():
    bad = _big_batch()[:-1]  # truncated JSON
    with pytest.raises(RemoteProtocolError, match="not valid JSON"):
        loads(bad)
    assert gc.isenabled()
    with pytest.raises(RemoteProtocolError, match="msgpack"):
        codec.msgpack_loads(msgpack.packb(orjson.loads(_big_batch()))[:-1])
    assert gc.isenabled()


def test_a_collector_the_program_paused_stays_paused():
    gc.disable()
    try:
        assert loads(_big_batch())["acks"][0] == "0"
        assert not gc.isenabled()
    finally:
        gc.enable()
