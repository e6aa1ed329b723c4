"""Differential property tests: each per-tuple fast path of the connection
(multilang/_fast_paths.py) against the general path it short-cuts
(multilang/connection.py, and multilang/_state.py's "rules that need
memory").

The usual shape: two connections fed identically, one driven through the fast
path and one through the general path; they must agree on the bytes or events
produced, in order, on the state after (pending ids, owed task ids, ``state``)
and, when the general path refuses something, on the error's class and rule.
Every mode: standard JSON, ``batch`` (§9.5), ``msgpack`` (§9.6) and both.

The last part checks that each rule id is raised by the scenario that breaks it.
"""

from functools import partial
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilang import NEED_DATA, Connection, LocalProtocolError, ProtocolError, RemoteProtocolError, Role, Side, State
from multilang.codec import dumps, encode_json, msgpack_frame
from multilang._component import Bolt
from multilang.errors import FrameTooLarge
from multilang.messages import (
    Ack,
    Batch,
    Emit,
    Fail,
    Handshake,
    Heartbeat,
    Next,
    Pid,
    Sync,
    TaskIds,
    Tick,
    Tuple,
    TupleBatch,
)

BOLT, SPOUT = Role.BOLT, Role.SPOUT
HOST, COMP = Side.HOST, Side.COMPONENT
MODES = {"json": (), "batch": ("batch",), "msgpack": ("msgpack",), "batch+msgpack": ("batch", "msgpack")}
ALL_MODES = st.sampled_from(sorted(MODES))
FAST = settings(max_examples=120, deadline=None)


# --- helpers ----------------------------------------------------------------------------------


def pair(role=BOLT, mode="json", **kw):
    """A host and a component connection past the pid reply, in ``mode``."""
    exts = MODES[mode]
    host, comp = Connection(role, HOST, **kw), Connection(role, COMP, **kw)
    comp.receive_data(host.send(Handshake(pid_dir="/tmp/pids", context={"taskid": 3}, extensions=tuple(exts))))
    assert type(comp.next_event()) is Handshake
    host.receive_data(comp.send(Pid(pid=99, extensions=exts)))
    assert type(host.next_event()) is Pid
    assert host.state is comp.state is (State.READY if role is BOLT else State.IDLE)
    return host, comp


def tup(tid, values=("x",), cls=Tuple, stream="default"):
    return cls(id=tid, component="__system" if cls is Tick else "src", stream="__tick" if cls is Tick else stream,
               task=-1 if cls is Tick else 1, values=list(values))


class Raw(bytes):
    """A frame body sent as is (bad JSON, bad msgpack)."""


def wire(mode, obj):
    """One frame of ``obj`` as the peer would write it in ``mode``, or None
    if this mode cannot carry it (an integer beyond 64 bits in msgpack)."""
    if "msgpack" in mode:
        if isinstance(obj, Raw):
            return len(obj).to_bytes(4, "big") + obj
        try:
            return msgpack_frame(obj)
        except LocalProtocolError:
            return None
    return (obj if isinstance(obj, Raw) else dumps(obj)) + b"\nend\n"


def state_of(conn):
    return set(conn.pending), conn.owed_task_ids, conn.state


def err_of(exc, text=False):
    """What must agree about an error: its class and rule; with ``text``, its
    message too (which shows the frame: the same only when both paths read
    the same frame)."""
    if isinstance(exc, ProtocolError):
        return (type(exc), exc.rule, str(exc)) if text else (type(exc), exc.rule)
    return type(exc), None


def attempt(fn, *args, **kw):
    """(result, None) or (None, the error)."""
    try:
        return fn(*args, **kw), None
    except Exception as exc:  # noqa: BLE001 - any exception must agree, not only protocol errors
        return None, err_of(exc)


def feed_component(host, comp, msgs):
    """The host sends ``msgs`` to the component, which reads them the ordinary way."""
    for m in msgs:
        comp.receive_data(host.send(m))
    while comp.next_event() is not NEED_DATA:
        pass


def plain_groups(events):
    """Events as the acker and the receiving tasks can tell them apart (§6.1,
    §9.5): runs of plain emits, acks and fails, each as (emits, acks, fails)
    in order, between the other events. A :class:`Batch` (take_outputs', or
    a batch frame's) is its emits, then its acks, then its fails."""
    out, run = [], None

    def plain():
        nonlocal run
        if run is None:
            run = ([], [], [])
            out.append(("plain", run))
        return run

    for ev in events:
        if type(ev) is Batch:
            for e in ev.emits:
                stream = e[2] if len(e) > 2 and e[2] is not None else "default"
                anchors = e[1] if len(e) > 1 else None
                plain()[0].append((list(e[0]), stream, tuple(anchors or ())))
            plain()[1].extend(ev.acks)
            plain()[2].extend(ev.fails)
        elif type(ev) is Emit and ev.task is None and not ev.need_task_ids:
            plain()[0].append((ev.values, ev.stream, tuple(ev.anchors)))
        elif type(ev) is Ack:
            plain()[1].append(ev.id)
        elif type(ev) is Fail:
            plain()[2].append(ev.id)
        else:
            run = None
            out.append(("other", ev))
    return out


# Ids: a small pool, so that repeats, acked ids and unknown ids are common.
STR_IDS = ["1", "2", "3", "4"]
HB_ID = "h"
BIG = st.sampled_from([2 ** 63, 2 ** 64 - 1, 2 ** 70, -(2 ** 63) - 1])
WIRE_ID = st.one_of(st.sampled_from(STR_IDS + ["9", HB_ID]), st.sampled_from([7, None, ["1"], 1.5]), BIG)
WIRE_VALUES = st.one_of(st.just(["w", 1]), st.builds(lambda b: ["w", b], BIG), st.sampled_from([[], {}, "x", None]))
BAD_BODY = st.sampled_from([Raw(b'{"id":'), Raw(b"[1,2"), Raw(b"\xc1"), Raw(b'{"a":1} x')])


# --- take_tuples (component side) against the decoder ------------------------------------------

_TUPLE_FRAME = st.fixed_dictionaries(
    {"id": WIRE_ID, "comp": st.sampled_from(["s", None, "__system"]),
     "stream": st.sampled_from(["default", "default", "other", "__tick", "__heartbeat", 5]),
     "task": st.sampled_from([1, 1, -1, "1", 1.5, True]), "tuple": WIRE_VALUES},
    optional={"pidDir": st.just("/x"), "command": st.just("next"), "tuples": st.just([["6", "s", "default", 1, [2]]])},
)
_ROW = st.tuples(WIRE_ID, st.sampled_from(["s", "__system"]), st.sampled_from(["default", "other", "__tick", "__heartbeat"]),
                 st.sampled_from([1, -1, "1"]), WIRE_VALUES).map(list)
_GOOD_ROW = st.one_of(  # well-formed rows: ordinary tuples, mostly, and ticks
    st.tuples(st.sampled_from(STR_IDS + ["5", "6"]), st.just("s"), st.sampled_from(["default", "other"]),
              st.just(1), st.just(["w"])).map(list),
    st.tuples(st.sampled_from(["7", "8"]), st.sampled_from(["__system", "s"]), st.just("__tick"), st.just(-1),
              st.just([5])).map(list),
)
_HOST_FRAME = st.one_of(
    _TUPLE_FRAME,
    _TUPLE_FRAME,
    st.fixed_dictionaries({"id": WIRE_ID, "comp": st.none(), "stream": st.just("__heartbeat"), "task": st.just(-1),
                           "tuple": st.just([])}),
    st.sampled_from([[], [1, 2], ["1"], [1.5]]),  # task-id lists
    st.fixed_dictionaries({"tuples": st.one_of(st.lists(_GOOD_ROW, max_size=4), st.lists(_ROW, max_size=3),
                                               st.sampled_from([{}, "x", None]))}),
    st.just({"pidDir": "/tmp", "conf": {}, "context": {}}),
    BAD_BODY,
)


def _comp_ready(mode):
    """A component holding tuple "1" pending, having seen heartbeat "h", and
    owing one task-id list."""
    host, comp = pair(BOLT, mode)
    feed_component(host, comp, [tup("1"), Heartbeat(id=HB_ID)])
    comp.send_emit(["x"], need_task_ids=True)
    return comp


def _read_fast(comp, limit, rows):
    """The component library's way: take_tuples, then next_event for the rest."""
    out = []
    while True:
        try:
            tups = comp.take_tuples(rows=rows, limit=limit)
            if tups:
                out += [("Tuple", tuple(t)) for t in tups]
                if limit is not None:
                    assert len(tups) <= limit or comp.batching  # a tuple batch is taken whole
                continue
            ev = comp.next_event()
        except ProtocolError as exc:
            return out, err_of(exc, text=True)
        if ev is NEED_DATA:
            return out, None
        out.append((type(ev).__name__, tuple(ev)) if isinstance(ev, Tuple) else ev)


def _read_general(comp):
    """The decoder and the ledger, frame by frame: next_event without its fast
    path (next_event calls take_tuples first, so it cannot be the reference)."""
    out = []
    while True:
        try:
            ev = comp._next_from_wire()
        except ProtocolError as exc:
            return out, err_of(exc, text=True)
        if ev is NEED_DATA:
            return out, None
        for e in ev.tuples if type(ev) is TupleBatch else [ev]:
            out.append((type(e).__name__, tuple(e)) if isinstance(e, Tuple) else e)


@FAST
@given(mode=ALL_MODES, frames=st.lists(_HOST_FRAME, max_size=10), cuts=st.lists(st.integers(0, 10), max_size=3),
       limit=st.sampled_from([None, None, 1, 2, 5]), rows=st.booleans(), eof=st.booleans())
def test_take_tuples_agrees_with_the_general_path(mode, frames, cuts, limit, rows, eof):
    """The same bytes, in the same chunks: the same events in order, the same
    error (class, rule, message), the same pending ids, owed lists and state."""
    fast, slow = _comp_ready(mode), _comp_ready(mode)
    data = [w for w in (wire(mode, f) for f in frames) if w is not None]
    chunks = [b"".join(data[a:b]) for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)])]
    if eof:
        chunks.append(b"")
    got_fast, got_slow = [], []
    for chunk in chunks:
        fast.receive_data(chunk)
        slow.receive_data(chunk)
        ev_f, err_f = _read_fast(fast, limit, rows)
        ev_s, err_s = _read_general(slow)
        got_fast += ev_f
        got_slow += ev_s
        assert (got_fast, err_f) == (got_slow, err_s)
        assert state_of(fast) == state_of(slow)
        if err_s:
            break


# --- take_outputs (host side) against next_event ------------------------------------------------

_ANCHORS = st.one_of(st.none(), WIRE_ID, st.lists(WIRE_ID, max_size=3), st.lists(st.sampled_from(STR_IDS), max_size=2),
                     st.just({}))
_COMP_FRAME = st.one_of(
    st.fixed_dictionaries(  # mostly what the fast path takes
        {"command": st.just("emit"), "tuple": st.just(["w", 1]), "need_task_ids": st.just(False),
         "anchors": st.one_of(st.lists(st.sampled_from(STR_IDS), max_size=2), st.sampled_from(STR_IDS))},
        optional={"stream": st.sampled_from(["default", "other", "__heartbeat", None])},
    ),
    st.fixed_dictionaries({"command": st.sampled_from(["ack", "fail"]), "id": st.sampled_from(STR_IDS)}),
    st.fixed_dictionaries(  # anything an emit may hold
        {"command": st.just("emit"), "tuple": WIRE_VALUES},
        optional={"anchors": _ANCHORS, "need_task_ids": st.sampled_from([False, True, 0, None]),
                  "stream": st.sampled_from(["default", "other", 5, None]), "task": st.sampled_from([0, 2, None, "2"]),
                  "id": WIRE_ID},
    ),
    st.fixed_dictionaries({"command": st.sampled_from(["ack", "fail"])}, optional={"id": WIRE_ID}),
    st.fixed_dictionaries({"command": st.just("batch")},
                          optional={"emits": st.lists(st.tuples(st.just(["b"]), _ANCHORS).map(list), max_size=2),
                                    "acks": st.lists(WIRE_ID, max_size=2), "fails": st.lists(WIRE_ID, max_size=2)}),
    st.sampled_from([{"command": "log", "msg": "hi"}, {"command": "sync"}, {"command": "what"}, {"command": 5},
                     {"command": "metrics", "name": "m", "params": 1}, {"pid": 5}, [1], "x", {}]),
    BAD_BODY,
)
_HOST_STEP = st.one_of(
    st.tuples(st.just("frames"), st.lists(_COMP_FRAME, max_size=8)),
    st.tuples(st.just("frames"), st.lists(_COMP_FRAME, max_size=8)),
    st.tuples(st.just("tuple"), st.sampled_from(STR_IDS)),
    st.tuples(st.just("heartbeat"), st.sampled_from([HB_ID, "5"])),
    st.tuples(st.just("task ids"), st.just(None)),
    st.tuples(st.just("eof"), st.just(None)),
)


def _host_ready(mode):
    host, comp = pair(BOLT, mode)
    for tid in STR_IDS[:3]:
        host.send(tup(tid))
    host.send(Heartbeat(id=HB_ID))
    return host


def _read_host(host, fast):
    events = []
    while True:
        try:
            batch = host.take_outputs() if fast else None
            if batch is not None:
                assert batch.emits or batch.acks or batch.fails
                events.append(batch)
            ev = host.next_event()
        except ProtocolError as exc:
            return events, err_of(exc, text=True)
        if ev is NEED_DATA:
            return events, None
        events.append(ev)


@FAST
@given(mode=ALL_MODES, steps=st.lists(_HOST_STEP, max_size=8))
def test_take_outputs_agrees_with_next_event(mode, steps):
    """Whatever a component writes, interleaved with what the host sends, the
    host's bulk read accepts and refuses what frame-by-frame reading does."""
    fast, slow = _host_ready(mode), _host_ready(mode)
    seen_fast, seen_slow = [], []
    for kind, arg in steps:
        if kind == "frames" or kind == "eof":
            data = b"".join(w for w in (wire(mode, f) for f in arg or ()) if w is not None)
            fast.receive_data(data)
            slow.receive_data(data)
            ev_f, err_f = _read_host(fast, True)
            ev_s, err_s = _read_host(slow, False)
            seen_fast += ev_f
            seen_slow += ev_s
            assert plain_groups(seen_fast) == plain_groups(seen_slow)
            assert err_f == err_s
        else:
            msg = {"tuple": lambda: tup(arg), "heartbeat": lambda: Heartbeat(id=arg),
                   "task ids": lambda: TaskIds(task_ids=[2])}[kind]()
            assert attempt(fast.send, msg) == attempt(slow.send, msg)
        assert state_of(fast) == state_of(slow)
        if fast.state in (State.ERROR, State.CLOSED):
            break


# --- send_ack's fast branch against send(Ack) -------------------------------------------------

_ACK_ID = st.one_of(st.sampled_from(STR_IDS + ["9", HB_ID]), st.sampled_from([7, None, ["1"], 1.5]), BIG)
_ACK_STEP = st.one_of(
    st.tuples(st.sampled_from(["ack", "ack", "fail"]), _ACK_ID),
    st.tuples(st.just("deliver"), st.sampled_from(STR_IDS)),
    st.tuples(st.just("emit"), st.sampled_from(STR_IDS)),
)


@FAST
@given(mode=ALL_MODES, steps=st.lists(_ACK_STEP, max_size=12))
def test_send_ack_agrees_with_send(mode, steps):
    """send_ack (its fast branch in standard JSON) and send_fail against
    send(Ack(...)) / send(Fail(...)): the same bytes (the same effect at the
    host under batch, which send() does not use), the same errors, the same
    pending ids."""
    (h_fast, fast), (h_slow, slow) = pair(BOLT, mode), pair(BOLT, mode)
    out_fast, out_slow = [], []
    for h, c in ((h_fast, fast), (h_slow, slow)):
        feed_component(h, c, [tup("1"), tup("2"), Heartbeat(id=HB_ID)])
    for kind, arg in steps:
        if kind == "deliver":
            r = attempt(feed_component, h_fast, fast, [tup(arg)]), attempt(feed_component, h_slow, slow, [tup(arg)])
            assert r[0] == r[1]
            continue
        if kind == "emit":
            a = attempt(fast.send_emit, ["e"], anchors=[arg], need_task_ids=False)
            b = attempt(slow.send_emit, ["e"], anchors=[arg], need_task_ids=False)
        else:
            a = attempt(fast.send_ack if kind == "ack" else fast.send_fail, arg)
            b = attempt(slow.send, (Ack if kind == "ack" else Fail)(id=arg))
        assert a[1] == b[1], (kind, arg)
        out_fast.append(a[0] or b"")
        out_slow.append(b[0] or b"")
        if not fast.batching:
            assert out_fast[-1] == out_slow[-1]
        assert state_of(fast) == state_of(slow)
    out_fast.append(fast.close_batch())
    out_slow.append(slow.close_batch())
    h_fast.receive_data(b"".join(out_fast))
    h_slow.receive_data(b"".join(out_slow))
    got_fast, got_slow = _read_host(h_fast, False), _read_host(h_slow, False)
    assert got_fast[1] is None and got_slow[1] is None
    assert plain_groups(got_fast[0]) == plain_groups(got_slow[0])
    assert h_fast.pending == fast.pending == slow.pending == h_slow.pending


@pytest.mark.parametrize("mode, tid", [("json", object()), ("json", {1}), ("msgpack", 2 ** 70)])
def test_send_ack_and_send_name_the_same_rule_for_an_unencodable_id(mode, tid):
    _, fast = pair(BOLT, mode)
    _, slow = pair(BOLT, mode)
    assert attempt(fast.send_ack, tid)[1][:2] == attempt(slow.send, Ack(id=tid))[1][:2]


# --- _send_plain_tuples (send_tuples) against send(Tuple) ------------------------------------

_TUPLE_SPEC = st.builds(
    lambda tid, cls, stream, values: Tuple(id=tid, component="s", stream=stream, task=1, values=values) if cls is Tuple
    else Tick(id=tid, component="__system", stream="__tick", task=-1, values=values),
    st.one_of(st.sampled_from(STR_IDS + ["5", "6", HB_ID]), st.sampled_from([5, None])),
    st.sampled_from([Tuple, Tuple, Tuple, Tick]),
    st.sampled_from(["default", "other", "__tick", "__heartbeat"]),
    st.one_of(st.just(["w", 1]), st.builds(lambda b: [b], BIG), st.sampled_from([("t",), {"k": 1}, "x", [{1: 2}]])),
)
_SEND_STEP = st.one_of(
    st.tuples(st.just("send"), st.lists(_TUPLE_SPEC, max_size=6)),
    st.tuples(st.just("send"), st.lists(_TUPLE_SPEC, max_size=6)),
    st.tuples(st.sampled_from(["ack", "fail"]), st.sampled_from(STR_IDS + ["5"])),
)


@FAST
@given(mode=st.sampled_from(["json", "msgpack"]), steps=st.lists(_SEND_STEP, max_size=6))
def test_send_tuples_agrees_with_send(mode, steps):
    """The host's send_tuples (its plain-JSON fast path) against send(t) for
    each tuple: the same frames, the same errors, the same pending ids (a
    refused call: none recorded).
    (Under batch, send_tuples writes one batch frame, all or none.)"""
    fast, slow = _host_ready(mode), _host_ready(mode)
    for kind, arg in steps:
        if kind == "send":
            before = state_of(fast)
            got_fast, err_fast = attempt(fast.send_tuples, arg)
            got_slow, err_slow = [], None
            for t in arg:
                frame, err_slow = attempt(slow.send, t)
                if err_slow:
                    break
                got_slow.append((frame, [t]))
            assert err_fast == err_slow
            if err_slow:
                assert state_of(fast) == before  # all or none; send() per tuple went part of the way
                return
            assert got_fast == got_slow
        else:
            data = wire(mode, {"command": kind, "id": arg})
            fast.receive_data(data)
            slow.receive_data(data)
            assert _read_host(fast, False) == _read_host(slow, False)
        assert state_of(fast) == state_of(slow)
        if fast.state is State.ERROR:
            break


# --- bolt_fast_paths: fast_emit / fast_ack against Bolt.emit / Bolt.ack ----------------------

_REF = st.one_of(  # how user code names an input: the tuple it got, its id, or something else
    st.tuples(st.just("got"), st.integers(0, 5)),
    st.tuples(st.just("id"), st.sampled_from(STR_IDS + ["9", HB_ID])),
    st.tuples(st.just("made"), st.sampled_from(["1", "9", 5, ["x"]])),
    st.tuples(st.just("tick"), st.just("t")),
)
_EMIT_ANCHORS = st.one_of(
    st.lists(_REF, min_size=1, max_size=1), st.lists(_REF, min_size=1, max_size=1), st.lists(_REF, max_size=2),
    st.just(None), _REF.map(lambda r: ("tuple", r)), _REF.map(lambda r: ("bare", r)),
)
_BOLT_STEP = st.one_of(
    st.tuples(st.just("emit"), st.fixed_dictionaries(
        {"values": st.one_of(st.just(["a", 1, {"k": None}]), st.builds(lambda b: [b], BIG), st.just(("t",))),
         "anchors": _EMIT_ANCHORS},
        optional={"stream": st.sampled_from([None, "default", "other"]), "direct_task": st.sampled_from([None, 2]),
                  "need_task_ids": st.booleans()})),
    st.tuples(st.just("emit"), st.fixed_dictionaries({"values": st.just(["a"]), "anchors": _EMIT_ANCHORS})),
    st.tuples(st.just("ack"), _REF),
    st.tuples(st.just("ack"), st.just(("last", None))),
    st.tuples(st.just("deliver"), st.sampled_from(STR_IDS + ["t", HB_ID])),
)


class _Side:
    """One component connection with what user code holds: the tuples it got."""

    def __init__(self, mode, fast, implicit=False):
        self.host, self.conn = pair(BOLT, mode)
        self.got = []
        self.out = []
        self.last = None
        self.deliver("1")
        self.deliver("2")
        self.deliver(HB_ID)
        # the anchors of an emit that names none: a Bolt's (none), or as a
        # BasicBolt's, the input being processed (here the last one delivered)
        hook = (lambda: [self.got[-1]]) if implicit else (lambda: None)
        me = SimpleNamespace(_conn=self.conn, _out=self.out, _wait_task_ids=lambda: None, _implicit_anchors=hook)
        emit, ack = partial(Bolt.emit, me), partial(Bolt.ack, me)  # the general path, as Bolt binds it
        if fast:
            emit, ack = self.conn.bolt_fast_paths(self.out, emit, ack, hook if implicit else None)
        self.emit, self.ack = emit, ack

    def deliver(self, tid):
        msg = Heartbeat(id=tid) if tid == HB_ID else tup(tid, cls=Tick if tid == "t" else Tuple)
        self.conn.receive_data(self.host.send(msg))
        while (ev := self.conn.next_event()) is not NEED_DATA:
            if isinstance(ev, Tuple):
                self.got.append(ev)

    def ref(self, r):
        kind, x = r
        if kind == "got":
            return self.got[x % len(self.got)]
        if kind == "made":
            return Tuple(id=x, component="s", stream="default", task=1, values=[])
        if kind == "tick":
            return Tick(id=x, component="__system", stream="__tick", task=-1, values=[5])
        if kind == "last":
            return self.last if self.last is not None else self.got[0]
        return x

    def anchors(self, spec):
        if spec is None:
            return None
        if type(spec) is tuple:  # ("tuple", ref): a tuple of anchors; ("bare", ref): one anchor, not in a list
            a = self.ref(spec[1])
            return (a,) if spec[0] == "tuple" else a
        return [self.ref(r) for r in spec]


@FAST
@given(mode=ALL_MODES, steps=st.lists(_BOLT_STEP, max_size=12), implicit=st.booleans())
def test_bolt_fast_paths_agree_with_bolt_emit_and_ack(mode, steps, implicit):
    """fast_emit / fast_ack (bound as a Bolt's or a BasicBolt's emit and ack)
    against the Bolt.emit / Bolt.ack they fall back to: the same frames in
    ``out`` after every call, the same errors, the same pending ids and owed
    lists. ``implicit``: emits without anchors take the hook's, as a BasicBolt's."""
    fast, slow = _Side(mode, True, implicit), _Side(mode, False, implicit)
    for kind, arg in steps:
        if kind == "deliver":
            assert attempt(fast.deliver, arg) == attempt(slow.deliver, arg)
        elif kind == "emit":
            kw = {k: v for k, v in arg.items() if k != "anchors"}
            a = attempt(fast.emit, anchors=fast.anchors(arg["anchors"]), **kw)
            b = attempt(slow.emit, anchors=slow.anchors(arg["anchors"]), **kw)
            assert a == b, (kind, arg)
            if isinstance(arg["anchors"], list) and len(arg["anchors"]) == 1:
                fast.last, slow.last = fast.ref(arg["anchors"][0]), slow.ref(arg["anchors"][0])
        else:
            assert attempt(fast.ack, fast.ref(arg)) == attempt(slow.ack, slow.ref(arg)), (kind, arg)
        assert b"".join(fast.out) == b"".join(slow.out)
        assert state_of(fast.conn) == state_of(slow.conn)
    assert attempt(fast.conn.close_batch) == attempt(slow.conn.close_batch)


# --- send_emits / send_acks against one send_emit / send_ack per element ------------------------

_MANY_ANCHOR = st.one_of(st.none(), _REF, st.lists(_REF, max_size=2), st.just(("int", 5)))
_MANY_STEP = st.one_of(
    st.tuples(st.just("emits"), st.lists(st.tuples(
        st.one_of(st.just(["v", 1]), st.just(("t",)), st.builds(lambda b: [b], BIG)), _MANY_ANCHOR), max_size=5)),
    st.tuples(st.just("emits-same"), st.one_of(  # one anchor per emit, all ids or all tuples: send_emits' fast shape
        st.lists(st.tuples(st.just(["v"]), st.tuples(st.just("id"), st.sampled_from(STR_IDS + ["9", HB_ID]))),
                 min_size=1, max_size=4),
        st.lists(st.tuples(st.just(["v"]), st.one_of(st.tuples(st.just("got"), st.integers(0, 5)),
                                                     st.tuples(st.just("made"), st.sampled_from(["1", "9"])))),
                 min_size=1, max_size=4))),
    st.tuples(st.sampled_from(["acks", "fails"]), st.lists(st.one_of(st.sampled_from(STR_IDS + ["9", HB_ID]),
                                                                    st.sampled_from([5, None])), max_size=4)),
    st.tuples(st.just("deliver"), st.sampled_from(STR_IDS)),
)


def _anchor_ids(a):
    """§ send_emits: an anchors entry (a Tuple, an id, a list of them, or None) as ids."""
    if a is None:
        return []
    if isinstance(a, (str, Tuple)):
        return [a if type(a) is str else a[0]]
    return [x if type(x) is str else x[0] for x in a]


def _frames(mode, data):
    """Frames as objects, a batched emit's empty anchor list read as none (§3.5:
    ``[]`` is unanchored; send_emits writes ``[values, []]`` where send_emit
    writes ``[values]``, the same emit)."""
    from multilang.codec import msgpack_loads
    from multilang.framing import FrameReader, LengthPrefixedReader

    if data is None:
        return None
    reader, loads = (LengthPrefixedReader(), msgpack_loads) if "msgpack" in mode else (FrameReader(), orjson.loads)
    out = [loads(b) for b in reader.feed(data)]
    for obj in out:
        if type(obj) is dict and "emits" in obj:
            obj["emits"] = [[e[0]] if len(e) == 2 and e[1] == [] else e for e in obj["emits"]]
    return out


def _per_element_emits(conn, values_list, anchors_list):
    return b"".join([conn.send_emit(v if type(v) is list else list(v), anchors=_anchor_ids(a), need_task_ids=False)
                     for v, a in zip(values_list, anchors_list)])


def _per_element_acks(conn, ids, fail):
    out = b""
    for t in ids:
        out += (conn.send_fail if fail else conn.send_ack)(t)
    return out


@FAST
@given(mode=ALL_MODES, steps=st.lists(_MANY_STEP, max_size=8))
def test_send_emits_and_acks_agree_with_one_call_per_element(mode, steps):
    """send_emits / send_acks against send_emit / send_ack per element: the
    same bytes and pending ids; a refused call raises the same error as the
    first refused element and changes nothing (all or none)."""
    fast, slow = _Side(mode, True), _Side(mode, False)
    for kind, arg in steps:
        if kind == "deliver":
            assert attempt(fast.deliver, arg) == attempt(slow.deliver, arg)
            continue
        before = state_of(fast.conn)
        if kind.startswith("emits"):
            def entry(side, a):
                return 5 if a == ("int", 5) else side.ref(a) if type(a) is tuple else (
                    None if a is None else [side.ref(r) for r in a])
            values = [v for v, _ in arg]
            a = attempt(fast.conn.send_emits, values, [entry(fast, x) for _, x in arg])
            b = attempt(_per_element_emits, slow.conn, values, [entry(slow, x) for _, x in arg])
        else:
            a = attempt(fast.conn.send_acks, arg, fail=kind == "fails")
            b = attempt(_per_element_acks, slow.conn, arg, kind == "fails")
        assert a[1] == b[1], (kind, arg)
        if b[1] is not None:
            assert state_of(fast.conn) == before  # all or none, in every mode
            return  # the per-element path went part of the way: the two differ from here by design
        assert _frames(mode, a[0]) == _frames(mode, b[0])
        assert state_of(fast.conn) == state_of(slow.conn)
    a, b = attempt(fast.conn.close_batch), attempt(slow.conn.close_batch)
    assert (_frames(mode, a[0]), a[1]) == (_frames(mode, b[0]), b[1])


@pytest.mark.parametrize("bad", [5, HB_ID])
def test_send_acks_names_the_rule_of_the_first_bad_element(bad):
    """§9.5: a batch's acks mean what they would as standard frames in array
    order, so a repeat before a bad id is the error (ids.known), on both sides."""
    fast, slow = _Side("batch", False), _Side("batch", False)
    assert attempt(fast.conn.send_acks, ["1", "1", bad]) == attempt(_per_element_acks, slow.conn, ["1", "1", bad], False)
    if bad == HB_ID:  # (a non-string id the host's decoder refuses first, by the frame's shape)
        with pytest.raises(RemoteProtocolError) as info:
            _host_reads(wire("batch", {"command": "batch", "acks": ["1", "1", bad]}), mode="batch")
        assert info.value.rule == "ids.known"


@pytest.mark.parametrize("tid", [5, ["1"]])
def test_send_emits_refuses_a_tuple_with_a_non_string_id_as_send_emit_does(tid):
    bad = Tuple(id=tid, component="s", stream="default", task=1, values=[])
    fast, slow = _Side("batch", True), _Side("batch", False)
    assert attempt(fast.conn.send_emits, [["v"]], [bad]) == attempt(_per_element_emits, slow.conn, [["v"]], [bad])


@pytest.mark.parametrize("refused", [
    lambda c: c.send(Ack(id="9")),
    lambda c: c.send(Fail(id="9")),
    lambda c: c.send_emit(["f"], anchors=["9"]),  # wants task ids: a standard frame
], ids=["send-Ack", "send-Fail", "send_emit-standard"])
def test_a_refused_standard_frame_keeps_the_open_batch(refused):
    comp = _comp_with(tup("1"), mode="batch")
    assert comp.send_emit(["e"], anchors=["1"], need_task_ids=False) == b""
    with pytest.raises(LocalProtocolError):
        refused(comp)
    assert comp.close_batch() == wire("batch", {"command": "batch", "emits": [[["e"], ["1"]]]})


@pytest.mark.parametrize("mode", ["json", "msgpack"])
def test_a_refused_send_acks_leaves_no_trace_in_every_mode(mode):
    side = _Side(mode, False)
    with pytest.raises(LocalProtocolError):
        side.conn.send_acks(["1", "9"])
    assert side.conn.pending == {"1", "2"}


@pytest.mark.parametrize("mode", ["json", "msgpack"])
def test_a_refused_send_tuples_leaves_no_trace_in_every_mode(mode):
    host = _host_ready(mode)
    with pytest.raises(LocalProtocolError):
        host.send_tuples([tup("7"), tup("1")])  # "1" is already pending
    assert "7" not in host.pending


@pytest.mark.parametrize("mode", sorted(MODES))
def test_send_tuples_never_returns_a_frame_over_max_size_and_refuses_a_tuple_that_alone_needs_one(mode):
    """§1.3 where frames are built: a tuple whose own frame exceeds the
    reader's limit is refused by name, and nothing of the call is recorded."""
    host = _host_ready(mode)
    small = [tup(str(i), values=["x" * 10]) for i in range(10, 16)]
    big = tup("20", values=["y" * 400])
    limit = len(host._frame(encode_json(big))) - 1  # one byte short of the big tuple's own frame
    written = host.send_tuples(small, max_size=limit)
    assert [t for _, ts in written for t in ts] == small and all(len(f) <= limit for f, _ in written)
    with pytest.raises(LocalProtocolError) as info:
        host.send_tuples([tup("30"), big, tup("31")], max_size=limit)
    assert info.value.rule == "frame.too-large" and f"{limit}-byte limit" in str(info.value)
    assert not {"30", "20", "31"} & host.pending
    assert [t for _, ts in host.send_tuples([tup("30"), tup("31")], max_size=limit) for t in ts] == [
        tup("30"), tup("31")]


@pytest.mark.parametrize("mode", ["json", "msgpack"])
def test_take_tuples_and_the_decoder_agree_on_a_tuple_with_a_tuples_key(mode):
    """Without batch, the decoder reads a 'tuples' key first and refuses the
    frame (batch.negotiated, §9.5), whether or not the component waits for
    task ids."""
    frame = wire(mode, {"id": "5", "comp": "s", "stream": "default", "task": 1, "tuple": [1],
                        "tuples": [["6", "s", "default", 1, [2]]]})
    fast, slow = _comp_ready(mode), _comp_ready(mode)
    fast.receive_data(frame)
    slow.receive_data(frame)
    assert _read_fast(fast, None, False) == _read_general(slow)


# --- each rule id, raised by the scenario that breaks it ----------------------------------------


def _host_reads(data, mode="json", eof=False, host=None, **kw):
    """A bolt host (tuple "1" and heartbeat "h" sent) reads ``data`` from its component."""
    if host is None:
        host, _ = pair(BOLT, mode, **kw)
        host.send(tup("1"))
        host.send(Heartbeat(id=HB_ID))
    host.receive_data(data)
    if eof:
        host.receive_data(b"")
    while host.next_event() is not NEED_DATA:
        pass


def _comp_reads(data, mode="json", eof=False, **kw):
    """A bolt component reads ``data`` from its host."""
    _, comp = pair(BOLT, mode, **kw)
    comp.receive_data(data)
    if eof:
        comp.receive_data(b"")
    while comp.next_event() is not NEED_DATA:
        pass


def _comp_with(*msgs, mode="json"):
    """A bolt component that has read ``msgs`` from its host."""
    host, comp = pair(BOLT, mode)
    feed_component(host, comp, msgs)
    return comp


def _awaiting_pid(role, side, **kw):
    host, comp = Connection(role, HOST, **kw), Connection(role, COMP, **kw)
    comp.receive_data(host.send(Handshake(pid_dir="/tmp", conf={}, context={})))
    assert type(comp.next_event()) is Handshake
    return host if side is HOST else comp


_ROW_1 = b'{"id":"1","comp":"s","stream":"default","task":1,"tuple":[1]}\nend\n'
_BATCH_TWICE = b'{"tuples":[["2","s","default",1,[1]],["2","s","default",1,[2]]]}\nend\n'

RULE_CASES = [
    # rule, error class, side whose rule-breaking is detected, the scenario
    ("ids.known", RemoteProtocolError, "host", lambda: _host_reads(b'{"command":"ack","id":"9"}\nend\n')),
    ("ids.known", LocalProtocolError, "component", lambda: _comp_with(tup("1")).send_ack("9")),
    ("ids.known", RemoteProtocolError, "host batch",
     lambda: _host_reads(b'{"command":"batch","acks":["1","1"]}\nend\n', mode="batch")),
    ("ids.unique", LocalProtocolError, "host", lambda: _host_ready("json").send(tup("1"))),
    ("ids.unique", RemoteProtocolError, "component", lambda: _comp_reads(_ROW_1 + _ROW_1)),
    ("ids.unique", RemoteProtocolError, "component batch", lambda: _comp_reads(_BATCH_TWICE, mode="batch")),
    ("ids.string-echo", RemoteProtocolError, "host", lambda: _host_reads(b'{"command":"ack","id":1}\nend\n')),
    ("ids.string-echo", LocalProtocolError, "component", lambda: _comp_with(tup("1")).send_ack(1)),
    ("heartbeat.never-acked", RemoteProtocolError, "host",
     lambda: _host_reads(b'{"command":"fail","id":"h"}\nend\n')),
    ("heartbeat.never-acked", LocalProtocolError, "component", lambda: _comp_with(Heartbeat(id="h")).send_ack("h")),
    ("anchors.known", RemoteProtocolError, "host",
     lambda: _host_reads(b'{"command":"emit","tuple":[1],"anchors":["9"]}\nend\n')),
    ("anchors.known", LocalProtocolError, "component", lambda: _comp_with(tup("1")).send_emit(["x"], anchors=["9"])),
    ("task-ids.owed", LocalProtocolError, "host", lambda: _host_ready("json").send(TaskIds(task_ids=[1]))),
    ("task-ids.owed", RemoteProtocolError, "component", lambda: _comp_reads(b"[1]\nend\n")),
    ("spout.activate-first", LocalProtocolError, "host", lambda: pair(SPOUT)[0].send(Next())),
    ("spout.one-sync", RemoteProtocolError, "host",
     lambda: _host_reads(b'{"command":"sync"}\nend\n', host=pair(SPOUT)[0])),
    ("spout.one-sync", LocalProtocolError, "component", lambda: pair(SPOUT)[1].send(Sync())),
    ("handshake.pid-first", RemoteProtocolError, "host",
     lambda: _host_reads(b'{"command":"sync"}\nend\n', host=_awaiting_pid(BOLT, HOST))),
    ("handshake.pid-first", LocalProtocolError, "component", lambda: _awaiting_pid(SPOUT, COMP).send(Sync())),
    ("handshake.extensions", RemoteProtocolError, "host",
     lambda: _host_reads(b'{"pid":5,"extensions":["batch"]}\nend\n', host=_awaiting_pid(BOLT, HOST))),
    ("handshake.extensions", LocalProtocolError, "component",
     lambda: _awaiting_pid(BOLT, COMP).send(Pid(pid=5, extensions=("batch",)))),
    ("frame.json", RemoteProtocolError, "host", lambda: _host_reads(b'{"command":\nend\n')),
    ("frame.json", RemoteProtocolError, "component", lambda: _comp_reads(b'{"id":\nend\n')),
    ("frame.invalid", RemoteProtocolError, "host", lambda: _host_reads(b"[1]\nend\n")),
    ("frame.invalid", RemoteProtocolError, "component",
     lambda: _comp_reads(b'{"id":"1","comp":"s","stream":"default","task":1}\nend\n')),
    ("batch.negotiated", RemoteProtocolError, "host", lambda: _host_reads(b'{"command":"batch"}\nend\n')),
    ("batch.negotiated", RemoteProtocolError, "component",
     lambda: _comp_reads(b'{"tuples":[["1","s","default",1,[]]]}\nend\n')),
    ("values.json", LocalProtocolError, "host", lambda: _host_ready("json").send(tup("7", values=[object()]))),
    ("values.json", LocalProtocolError, "component",
     lambda: _comp_with(tup("1"), mode="msgpack").send_emit([2 ** 70], anchors=["1"], need_task_ids=False)),
    ("frame.msgpack", RemoteProtocolError, "host", lambda: _host_reads(b"\x00\x00\x00\x01\xc1", mode="msgpack")),
    ("frame.msgpack", RemoteProtocolError, "component", lambda: _comp_reads(b"\x00\x00\x00\x01\xc1", mode="msgpack")),
    ("frame.truncated", RemoteProtocolError, "host", lambda: _host_reads(b'{"command":"sync"}', eof=True)),
    ("frame.truncated", RemoteProtocolError, "component", lambda: _comp_reads(b'{"id":"1"}', eof=True)),
    ("frame.too-large", FrameTooLarge, "host",
     lambda: _host_reads(b'{"command":"log","msg":"' + b"y" * 100 + b'"}\nend\n', max_frame_size=64)),
    ("frame.too-large", FrameTooLarge, "component",
     lambda: _comp_reads(_ROW_1.replace(b"[1]", b'["' + b"y" * 100 + b'"]'), max_frame_size=64)),
    ("protocol.state", RemoteProtocolError, "host", lambda: _host_reads(b'{"pid":5}\nend\n')),
    ("protocol.state", LocalProtocolError, "component", lambda: _comp_with().send(Pid(pid=5))),
]


@pytest.mark.parametrize("rule, cls, side, scenario", RULE_CASES,
                         ids=[f"{c[0]}-{c[2].replace(' ', '-')}" for c in RULE_CASES])
def test_each_rule_is_raised_by_the_scenario_that_breaks_it(rule, cls, side, scenario):
    with pytest.raises(ProtocolError) as info:
        scenario()
    assert type(info.value) is cls, info.value
    assert info.value.rule == rule, info.value
