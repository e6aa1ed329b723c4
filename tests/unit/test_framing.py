"""Framing (spec §1): FrameReader, and how Connection surfaces framing errors.

The central property: the frames a reader yields do not depend on how the
byte stream was chunked.
"""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilang import Connection, FrameTooLarge, RemoteProtocolError, Role, Side
from multilang.framing import DEFAULT_MAX_FRAME_SIZE, TERMINATOR, FirstFrameCut, FrameReader, LengthPrefixedReader
from multilang.messages import ConnectionClosed, Emit, Handshake, Log, Pid, Sync

NEED_DATA_REPR = "NEED_DATA"

# --- strategies ---------------------------------------------------------------

_text = st.lists(
    st.one_of(
        st.characters(exclude_categories=("Cs",)),  # any code point but surrogates
        st.sampled_from(["\U0001F600", "\U0001F468\u200D\U0001F469", "\u00fc", "\u4e2d", "/", "\\", '"', "end", "\n", "\r"]),
    ),
    max_size=8,
).map("".join)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_text, children, max_size=3),
    max_leaves=10,
)

line_endings = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def frame_texts(draw, value):
    """One JSON text for ``value``: compact, or spread over lines with random line endings."""
    style = draw(st.sampled_from(["orjson", "ascii", "indent"]))
    if style == "orjson":
        return orjson.dumps(value)
    if style == "ascii":
        return json.dumps(value, ensure_ascii=True).replace("/", "\\/").encode()
    text = json.dumps(value, ensure_ascii=False, indent=draw(st.integers(0, 2)))
    lines = text.split("\n")
    out = lines[0]
    for line in lines[1:]:
        out += draw(line_endings) + line
    return out.encode()


@st.composite
def streams(draw, max_frames=5):
    """A valid component->host byte stream and the JSON values of its frames."""
    values = draw(st.lists(json_values, min_size=0, max_size=max_frames))
    out = bytearray()
    for v in values:
        for _ in range(draw(st.integers(0, 2))):  # blank lines between frames
            out += draw(st.sampled_from(["", " ", "\t", " \t "])).encode() + draw(line_endings).encode()
        out += draw(frame_texts(v))
        out += draw(line_endings).encode() + b"end" + draw(line_endings).encode()
    if draw(st.booleans()):  # blank lines before EOF
        out += draw(line_endings).encode() * draw(st.integers(1, 3))
    return bytes(out), values


@st.composite
def chunkings(draw, data: bytes):
    if not data:
        return []
    cuts = draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=min(30, len(data)), unique=True))
    cuts = sorted(set(cuts) | {0, len(data)})
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


def stripped(frames):
    """Frame bodies without surrounding whitespace (whether the line ending
    before "end" belongs to the body is the reader's business)."""
    return [f.strip() for f in frames]


def feed_all(chunks, reader=None):
    reader = reader or FrameReader()
    frames = []
    for c in chunks:
        frames += reader.feed(c)
    reader.close()
    return frames


# --- chunking independence -------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_any_chunking_yields_the_same_frames(data):
    stream, values = data.draw(streams())
    whole = feed_all([stream])
    chunked = feed_all(data.draw(chunkings(stream)))
    one_by_one = feed_all([stream[i : i + 1] for i in range(len(stream))])
    assert len(whole) == len(chunked) == len(one_by_one) == len(values)
    # Bodies may differ only in whitespace at their ends (a lone "\r" ending
    # the "end" line at a chunk boundary leaves the "\n" to the next frame).
    assert [f.strip() for f in chunked] == [f.strip() for f in whole] == [f.strip() for f in one_by_one]
    assert [orjson.loads(f) for f in chunked] == [orjson.loads(f) for f in whole] == values


def _ready_bolt_host():
    conn = Connection(Role.BOLT, Side.HOST)
    conn.send(Handshake(pid_dir="/tmp"))
    conn.receive_data(b'{"pid": 42}\nend\n')
    assert conn.next_event() == Pid(pid=42)
    return conn


def _drain(conn):
    events = []
    while True:
        ev = conn.next_event()
        if repr(ev) == NEED_DATA_REPR:
            return events
        events.append(ev)
        if type(ev) is ConnectionClosed:
            return events


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_chunking_yields_the_same_messages(data):
    values = data.draw(st.lists(st.lists(json_values, max_size=3), max_size=5))
    out = bytearray()
    for v in values:
        obj = {"command": "emit", "tuple": v, "need_task_ids": False}
        out += data.draw(frame_texts(obj)) + data.draw(line_endings).encode() + b"end" + data.draw(line_endings).encode()
    stream = bytes(out)
    results = []
    for chunks in ([stream], data.draw(chunkings(stream))):
        conn = _ready_bolt_host()
        events = []
        for c in chunks:
            if c:  # b"" would mean EOF
                conn.receive_data(c)
                events += _drain(conn)
        conn.receive_data(b"")
        events += _drain(conn)
        results.append(events)
    expected = [Emit(values=v, need_task_ids=False) for v in values] + [ConnectionClosed()]
    assert results[0] == results[1] == expected


# --- what is and is not a terminator ---------------------------------------------------


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_end_line_with_each_line_ending(ending):
    r = FrameReader()
    data = f'{{"a": 1}}{ending}end{ending}'.encode()
    assert [orjson.loads(f) for f in r.feed(data)] == [{"a": 1}]
    r.close()


@pytest.mark.parametrize("line", [b"end ", b" end", b"end\t", b"End", b"ends", b"xend", b"\"end\""])
def test_near_terminators_are_not_terminators(line):
    r = FrameReader()
    assert r.feed(b'{"a": 1}\n' + line + b"\n") == []
    assert r.buffered > 0
    # ... the real terminator still works, and the near one is part of the body
    frames = r.feed(b"end\n")
    assert len(frames) == 1 and line in frames[0]


def test_end_inside_a_json_string_is_not_a_terminator():
    r = FrameReader()
    assert stripped(r.feed(b'{"msg": "\\nend\\n"}\nend\n')) == [b'{"msg": "\\nend\\n"}']


def test_terminator_constant():
    assert TERMINATOR == b"\nend\n"


def test_blank_lines_between_frames():
    r = FrameReader()
    frames = r.feed(b"\n\r\n\r  \n[1]\nend\n\n\n[2]\r\nend\r\n\r\n")
    assert [orjson.loads(f) for f in frames] == [[1], [2]]
    r.close()  # only blank lines remain: a clean EOF


# --- EOF ------------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [b"{", b'{"a": 1}', b'{"a": 1}\n', b'{"a": 1}\nen', b"x"])
def test_eof_mid_frame_is_a_remote_error(tail):
    r = FrameReader()
    r.feed(b"[1]\nend\n" + tail)
    with pytest.raises(RemoteProtocolError) as info:
        r.close()
    assert info.value.frame == tail


@pytest.mark.parametrize("tail", [b"", b"\n", b"\r\n\r\n", b"  \t\n", b"\r"])
def test_eof_after_blank_lines_is_clean(tail):
    r = FrameReader()
    assert stripped(r.feed(b"[1]\nend\n" + tail)) == [b"[1]"]
    r.close()
    assert r.closed


def test_connection_eof_mid_frame_raises_after_complete_frames():
    conn = _ready_bolt_host()
    conn.receive_data(b'{"command":"sync"}\nend\n{"command":"lo')
    conn.receive_data(b"")
    assert conn.next_event() == Sync()
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.frame == b'{"command":"lo'


def test_connection_eof_after_blank_lines_is_clean():
    conn = _ready_bolt_host()
    conn.receive_data(b'{"command":"sync"}\nend\n\r\n\n')
    conn.receive_data(b"")
    assert _drain(conn) == [Sync(), ConnectionClosed()]


# --- maximum frame size -------------------------------------------------------------------


def test_default_limit_is_generous():
    assert DEFAULT_MAX_FRAME_SIZE >= 1 << 20
    assert issubclass(FrameTooLarge, RemoteProtocolError)


def test_frame_within_limit_is_accepted():
    limit = 100
    body = b'"' + b"x" * 90 + b'"'
    assert stripped(FrameReader(limit).feed(body + b"\nend\n")) == [body]


def test_over_limit_frame_in_one_chunk():
    limit = 100
    with pytest.raises(FrameTooLarge) as info:
        FrameReader(limit).feed(b'"' + b"x" * 200 + b'"\nend\n')
    assert isinstance(info.value, RemoteProtocolError)
    assert info.value.frame.startswith(b'"xxx')


@settings(max_examples=100, deadline=None)
@given(
    limit=st.integers(16, 300),
    chunk=st.integers(1, 64),
    terminated=st.booleans(),
    newlines=st.booleans(),
)
def test_over_limit_input_raises_and_buffer_stays_bounded(limit, chunk, terminated, newlines):
    # An over-limit frame (terminated or not, one long line or many lines)
    # raises FrameTooLarge, and the reader never holds more than limit + one
    # chunk, not even when the caller keeps feeding after the error.
    unit = b"[1,\n" if newlines else b"1111"
    body = unit * (limit // 4 + 8)
    data = body + (b"\nend\n" if terminated else b"")
    data += b"2" * (4 * chunk + limit)  # more garbage behind it
    r = FrameReader(limit)
    raised = 0
    for i in range(0, len(data), chunk):
        piece = data[i : i + chunk]
        try:
            frames = r.feed(piece)
        except FrameTooLarge:
            raised += 1
        else:
            assert frames == []
        assert r.buffered <= limit + len(piece)
    assert raised >= 1


def test_connection_delivers_frames_completed_before_an_error():
    # Frames that were complete before the oversized one are events; the error
    # comes after them, and then the connection is dead.
    limit = 64
    conn = Connection(Role.BOLT, Side.HOST, max_frame_size=limit)
    conn.send(Handshake(pid_dir="/tmp"))
    good = b'{"pid":7}\nend\n{"command":"log","msg":"hi","level":2}\nend\n'
    conn.receive_data(good + b'{"command":"log","msg":"' + b"x" * 200)
    assert conn.next_event() == Pid(pid=7)
    assert conn.next_event() == Log(msg="hi", level=2)
    with pytest.raises(FrameTooLarge):
        conn.next_event()
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


def test_connection_delivers_frames_before_a_terminated_oversized_frame():
    limit = 64
    conn = Connection(Role.BOLT, Side.HOST, max_frame_size=limit)
    conn.send(Handshake(pid_dir="/tmp"))
    conn.receive_data(b'{"pid":7}\nend\n{"command":"sync"}\nend\n[' + b"1," * 100 + b"1]\nend\n")
    assert conn.next_event() == Pid(pid=7)
    assert conn.next_event() == Sync()
    with pytest.raises(FrameTooLarge):
        conn.next_event()


def test_connection_delivers_frames_before_garbage():
    conn = _ready_bolt_host()
    conn.receive_data(b'{"command":"sync"}\nend\nnot json\nend\n{"command":"sync"}\nend\n')
    assert conn.next_event() == Sync()
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.frame.strip() == b"not json"
    assert b"not json" in str(info.value).encode()


# --- FirstFrameCut: the switch to a negotiated framing (§9.6) -----------------------------------


_PID = b'{"pid": 7, "extensions": ["msgpack"]}\nend\n'
_AFTER = len(b"\x81\xa3abc\x01").to_bytes(4, "big") + b"\x81\xa3abc\x01"  # a msgpack frame


@given(st.lists(st.integers(min_value=1, max_value=len(_PID + _AFTER)), max_size=8))
def test_the_first_frame_is_cut_where_it_ends_and_the_rest_held_in_any_chunking(cuts):
    data = _PID + _AFTER
    bounds = sorted({0, len(data), *[c for c in cuts if c < len(data)]})
    cut = FirstFrameCut()
    given_over = b"".join(cut.feed(data[a:b]) for a, b in zip(bounds, bounds[1:]))
    assert given_over == _PID and cut.cut
    assert FrameReader().feed(given_over) == [_PID[:-5]]
    assert LengthPrefixedReader().feed(cut.release()) == [b"\x81\xa3abc\x01"]
    assert cut.feed(b"later") == b"later"  # released: nothing is held after it


def test_a_first_frame_with_no_end_is_held_up_to_the_limit_then_handed_over_for_the_reader_to_name():
    cut = FirstFrameCut(max_frame_size=10)
    assert cut.feed(b"0123456789") == b""
    over = cut.feed(b"A")
    assert over == b"0123456789A" and not cut.cut
    with pytest.raises(FrameTooLarge):
        FrameReader(10).feed(over)
    assert cut.feed(b"more") == b"more"  # memory stays bounded: nothing held after that


def test_what_came_before_a_close_is_released_whole():
    cut = FirstFrameCut()
    assert cut.feed(b'{"pid": 1') == b""
    assert cut.release() == b'{"pid": 1'
