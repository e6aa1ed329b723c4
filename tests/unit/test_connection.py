"""The sans-IO connection state machines: bolt and spout, host and component side."""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from multilang import NEED_DATA, Connection, LocalProtocolError, RemoteProtocolError, Role, Side, State
from multilang._state import SENDER, TRANSITIONS
from multilang.codec import encode, encode_json
from multilang.messages import (
    Ack,
    Activate,
    Batch,
    ConnectionClosed,
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
    Sync,
    TaskIds,
    Tick,
    Tuple,
    UnknownCommand,
)

BOLT, SPOUT = Role.BOLT, Role.SPOUT
HOST, COMP = Side.HOST, Side.COMPONENT
HS = Handshake(pid_dir="/tmp/pids", conf={"a": 1}, context={"taskid": 3})


def tup(tid, values=("x",)):
    return Tuple(id=tid, component="src", stream="default", task=1, values=list(values))


def tick(tid):
    return Tick(id=tid, component="__system", stream="__tick", task=-1, values=[5])


def assert_local_frame(exc, msg):
    """A LocalProtocolError names the frame we tried to send: the message,
    its JSON value or its bytes."""
    assert exc.frame is not None
    assert exc.frame == msg or exc.frame == encode_json(msg) or exc.frame == encode(msg), exc.frame


def events(conn):
    out = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA:
            return out
        out.append(ev)


def deliver(conn, data):
    conn.receive_data(data)
    return events(conn)


def pair(role):
    """A host and a component connection, past the handshake."""
    host, comp = Connection(role, HOST), Connection(role, COMP)
    assert deliver(comp, host.send(HS)) == [HS]
    assert comp.state is State.AWAIT_PID and host.state is State.AWAIT_PID
    assert deliver(host, comp.send(Pid(pid=99))) == [Pid(pid=99)]
    ready = State.READY if role is BOLT else State.IDLE
    assert host.state is ready and comp.state is ready
    return host, comp


def activated_spout():
    host, comp = pair(SPOUT)
    assert deliver(comp, host.send(Activate())) == [Activate()]
    assert deliver(host, comp.send(Sync())) == [Sync()]
    return host, comp


# --- the table ------------------------------------------------------------------------


@pytest.mark.parametrize("role", [BOLT, SPOUT])
def test_every_transition_has_a_sender(role):
    for (_state, msg_type), _new in TRANSITIONS[role].items():
        assert msg_type in SENDER[role]


# --- handshake and pid --------------------------------------------------------------------


@pytest.mark.parametrize("role", [BOLT, SPOUT])
def test_handshake_then_pid(role):
    host, comp = pair(role)
    assert host.extensions == () and comp.extensions == ()


def test_pid_extensions_recorded():
    host, comp = Connection(BOLT, HOST), Connection(BOLT, COMP)
    deliver(comp, host.send(Handshake(pid_dir="/tmp", context={}, extensions=("batch",))))
    deliver(host, comp.send(Pid(pid=5, extensions=("batch",))))
    assert host.extensions == comp.extensions == ("batch",)
    assert host.batching and comp.batching


def test_accepting_an_extension_not_offered_is_an_error():
    """§9.2: only offered names may be accepted; silence is standard mode."""
    host, comp = Connection(BOLT, HOST), Connection(BOLT, COMP)
    deliver(comp, host.send(HS))
    with pytest.raises(LocalProtocolError, match="not offered"):
        comp.send(Pid(pid=5, extensions=("batch",)))
    with pytest.raises(RemoteProtocolError, match="not offered"):
        deliver(host, b'{"pid":5,"extensions":["batch"]}\nend\n')
        host.next_event()


@pytest.mark.parametrize("role", [BOLT, SPOUT])
@pytest.mark.parametrize("msg", [Log(msg="early"), Sync(), Emit(values=[1]), Error(msg="e"), Metrics(name="m")])
def test_anything_before_pid_is_an_error(role, msg):
    host, comp = Connection(role, HOST), Connection(role, COMP)
    # component side: before the handshake, and between handshake and pid
    with pytest.raises(LocalProtocolError):
        comp.send(msg)
    deliver(comp, host.send(HS))
    with pytest.raises(LocalProtocolError) as info:
        comp.send(msg)
    assert_local_frame(info.value, msg)
    assert comp.state is State.AWAIT_PID  # a refused send changes nothing
    # host side: a log (etc.) before the pid is the component's fault
    frame = encode(msg)
    host.receive_data(frame + encode(Pid(pid=1)))
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert info.value.frame.strip() == frame[: -len(b"\nend\n")]
    assert host.state is State.ERROR
    with pytest.raises(RemoteProtocolError):
        host.next_event()


@pytest.mark.parametrize("role", [BOLT, SPOUT])
def test_pid_before_handshake(role):
    host, comp = Connection(role, HOST), Connection(role, COMP)
    with pytest.raises(LocalProtocolError):
        comp.send(Pid(pid=1))
    host.receive_data(encode(Pid(pid=1)))
    with pytest.raises(RemoteProtocolError):
        host.next_event()


@pytest.mark.parametrize("role", [BOLT, SPOUT])
def test_host_must_handshake_first(role):
    host, comp = Connection(role, HOST), Connection(role, COMP)
    first = tup("1") if role is BOLT else Activate()
    with pytest.raises(LocalProtocolError):
        host.send(first)
    assert host.state is State.HANDSHAKE
    comp.receive_data(encode(first))
    with pytest.raises(RemoteProtocolError):
        comp.next_event()


@pytest.mark.parametrize("role", [BOLT, SPOUT])
def test_only_one_handshake_and_one_pid(role):
    host, comp = pair(role)
    with pytest.raises(LocalProtocolError):
        host.send(HS)
    with pytest.raises(LocalProtocolError):
        comp.send(Pid(pid=1))
    host.receive_data(encode(Pid(pid=1)))
    with pytest.raises(RemoteProtocolError):
        host.next_event()
    comp.receive_data(encode(HS))
    with pytest.raises(RemoteProtocolError):
        comp.next_event()


@pytest.mark.parametrize("role", [BOLT, SPOUT])
def test_messages_in_the_wrong_direction(role):
    host, comp = pair(role)
    with pytest.raises(LocalProtocolError):
        host.send(Emit(values=[1]))
    with pytest.raises(LocalProtocolError):
        host.send(Log(msg="x"))
    with pytest.raises(LocalProtocolError):
        host.send(Pid(pid=3))
    with pytest.raises(LocalProtocolError):
        comp.send(TaskIds(task_ids=[1]))
    with pytest.raises(LocalProtocolError):
        comp.send(HS)
    with pytest.raises(LocalProtocolError):
        comp.send(tup("1") if role is BOLT else Next())


# --- bolt: tuples, acks, anchors ---------------------------------------------------------------


def test_bolt_pending_tracked_on_both_sides():
    host, comp = pair(BOLT)
    assert deliver(comp, host.send_many([tup("1"), tick("2"), tup("-3")])) == [tup("1"), tick("2"), tup("-3")]
    assert host.pending == comp.pending == {"1", "2", "-3"}
    assert deliver(host, comp.send_many([Ack(id="1"), Fail(id="-3")])) == [Ack(id="1"), Fail(id="-3")]
    assert host.pending == comp.pending == {"2"}


def test_duplicate_pending_tuple_id():
    host, comp = pair(BOLT)
    deliver(comp, host.send(tup("1")))
    with pytest.raises(LocalProtocolError):
        host.send(tup("1"))
    comp.receive_data(encode(tup("1")))
    with pytest.raises(RemoteProtocolError):
        comp.next_event()


@pytest.mark.parametrize("cls", [Ack, Fail])
def test_ack_unknown_id(cls):
    host, comp = pair(BOLT)
    deliver(comp, host.send(tup("1")))
    with pytest.raises(LocalProtocolError) as info:
        comp.send(cls(id="2"))
    assert "'2'" in str(info.value) and "not a pending tuple" in str(info.value)
    assert comp.pending == {"1"}
    host.receive_data(encode(cls(id="2")))
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert "not a pending tuple" in str(info.value)
    assert info.value.frame.strip() == b'{"command":"%s","id":"2"}' % cls.__name__.lower().encode()


@pytest.mark.parametrize("first", [Ack, Fail])
@pytest.mark.parametrize("second", [Ack, Fail])
def test_ack_finished_id(first, second):
    host, comp = pair(BOLT)
    deliver(comp, host.send(tup("1")))
    deliver(host, comp.send(first(id="1")))
    with pytest.raises(LocalProtocolError):
        comp.send(second(id="1"))
    host.receive_data(encode(second(id="1")))
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert "already acked/failed" in str(info.value)


@pytest.mark.parametrize("cls", [Ack, Fail])
def test_ack_heartbeat_id(cls):
    host, comp = pair(BOLT)
    assert deliver(comp, host.send(Heartbeat(id="-77"))) == [Heartbeat(id="-77")]
    assert host.pending == comp.pending == set()  # never registered
    with pytest.raises(LocalProtocolError) as info:
        comp.send(cls(id="-77"))
    assert "heartbeat" in str(info.value)
    host.receive_data(encode(cls(id="-77")))
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert "heartbeat" in str(info.value)


def test_heartbeat_answered_with_sync():
    host, comp = pair(BOLT)
    deliver(comp, host.send(Heartbeat(id="1")))
    assert deliver(host, comp.send(Sync())) == [Sync()]
    assert host.state is State.READY


def test_anchoring_to_finished_unknown_or_heartbeat_ids():
    host, comp = pair(BOLT)
    deliver(comp, host.send_many([tup("1"), tup("2"), Heartbeat(id="hb")]))
    deliver(host, comp.send(Ack(id="1")))
    for anchors, word in [(("1",), "not a pending"), (("2", "9"), "not a pending"), (("hb",), "heartbeat")]:
        with pytest.raises(LocalProtocolError) as info:
            comp.send(Emit(values=["x"], anchors=anchors))
        assert word in str(info.value)
    assert comp.owed_task_ids == 0  # refused emits owe nothing
    ok = Emit(values=["x"], anchors=("2",), need_task_ids=False)
    assert deliver(host, comp.send(ok)) == [ok]
    # the host side rejects the same mistakes from a component
    for anchors in (["1"], ["2", "9"], "hb"):
        h, _ = pair(BOLT)
        h.send_many([tup("1"), tup("2"), Heartbeat(id="hb")])
        deliver(h, encode(Ack(id="1")))
        body = encode(Emit(values=["x"], anchors=tuple(anchors) if type(anchors) is list else (anchors,)))
        h.receive_data(body)
        with pytest.raises(RemoteProtocolError) as info:
            h.next_event()
        assert info.value.frame.strip() == body[: -len(b"\nend\n")]


def test_unknown_command_from_bolt_is_ignored_not_fatal():
    host, comp = pair(BOLT)
    msg = UnknownCommand(command="frob", frame={"command": "frob", "x": 1})
    assert deliver(host, comp.send(msg)) == [msg]
    assert host.state is State.READY


# --- task ids -------------------------------------------------------------------------------


@pytest.mark.parametrize("role", [BOLT, SPOUT])
def test_task_ids_fifo_and_owed(role):
    host, comp = pair(role)
    if role is SPOUT:
        host.send(Activate())
        deliver(comp, encode(Activate()))
    emits = [Emit(values=[i]) for i in range(3)]
    for i, e in enumerate(emits):
        comp.send(e)
        assert comp.owed_task_ids == i + 1
    assert deliver(host, b"".join(encode(e) for e in emits)) == emits
    assert host.owed_task_ids == 3
    replies = [TaskIds(task_ids=[1]), TaskIds(task_ids=[]), TaskIds(task_ids=[2, 3])]
    data = host.send_many(replies)
    assert host.owed_task_ids == 0
    with pytest.raises(LocalProtocolError) as info:
        host.send(TaskIds(task_ids=[4]))  # nobody asked
    assert "no emit is waiting" in str(info.value)
    comp.receive_data(data)
    got = [comp.next_task_ids() for _ in range(3)]
    assert got == replies
    assert comp.owed_task_ids == 0
    assert comp.next_task_ids() is NEED_DATA
    # an unsolicited list from the host is the host's fault
    comp.receive_data(encode(TaskIds(task_ids=[4])))
    with pytest.raises(RemoteProtocolError) as info:
        comp.next_event()
    assert "no emit is waiting" in str(info.value)
    assert info.value.frame.strip() == b"[4]"


@pytest.mark.parametrize("role", [BOLT, SPOUT])
@pytest.mark.parametrize(
    "emit",
    [Emit(values=[1], task=5), Emit(values=[1], need_task_ids=False), Emit(values=[1], task=5, need_task_ids=False)],
    ids=["direct", "no-ids", "direct-no-ids"],
)
def test_direct_emits_and_need_task_ids_false_owe_nothing(role, emit):
    host, comp = pair(role)
    comp.send(emit)
    assert comp.owed_task_ids == 0
    assert deliver(host, encode(emit)) == [emit]
    assert host.owed_task_ids == 0
    with pytest.raises(LocalProtocolError):
        host.send(TaskIds(task_ids=[5]))
    comp.receive_data(encode(TaskIds(task_ids=[5])))
    with pytest.raises(RemoteProtocolError):
        comp.next_event()


def test_task_zero_from_the_wire_owes_task_ids():
    host, _ = pair(BOLT)
    deliver(host, b'{"command":"emit","tuple":[1],"task":0}\nend\n')
    assert host.owed_task_ids == 1


def test_next_task_ids_keeps_tuples_and_heartbeats_in_order():
    host, comp = pair(BOLT)
    deliver(comp, host.send(tup("1")))
    comp.send(Emit(values=["a"], anchors=("1",)))
    deliver(host, encode(Emit(values=["a"], anchors=("1",))))
    before = [tup("2"), Heartbeat(id="h1"), tick("3"), tup("4")]
    after = [Heartbeat(id="h2"), tup("5")]
    data = host.send_many(before) + host.send(TaskIds(task_ids=[7, 8])) + host.send_many(after)
    # arrive in pieces: nothing yet, then only some tuples
    cut = len(encode(tup("2"))) + 3
    comp.receive_data(data[:cut])
    assert comp.next_task_ids() is NEED_DATA
    comp.receive_data(data[cut:])
    assert comp.next_task_ids() == TaskIds(task_ids=[7, 8])
    assert comp.owed_task_ids == 0
    assert events(comp) == before + after
    assert comp.pending == {"1", "2", "3", "4", "5"}


def test_next_task_ids_twice_with_tuples_between():
    host, comp = pair(BOLT)
    for v in ("a", "b"):
        comp.send(Emit(values=[v]))
        deliver(host, encode(Emit(values=[v])))
    data = host.send_many([tup("1"), TaskIds(task_ids=[1]), tup("2"), TaskIds(task_ids=[2]), tup("3")])
    comp.receive_data(data)
    assert comp.next_task_ids() == TaskIds(task_ids=[1])
    assert comp.next_task_ids() == TaskIds(task_ids=[2])
    assert events(comp) == [tup("1"), tup("2"), tup("3")]


def test_next_task_ids_at_eof():
    host, comp = pair(BOLT)
    comp.send(Emit(values=["a"]))
    comp.receive_data(host.send(tup("1")))
    comp.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        comp.next_task_ids()
    # what arrived before EOF is still delivered, then the close
    assert comp.next_event() == tup("1")
    assert comp.next_event() == ConnectionClosed()
    assert comp.state is State.CLOSED


def test_task_ids_may_come_through_next_event_too():
    host, comp = pair(BOLT)
    comp.send(Emit(values=["a"]))
    deliver(host, encode(Emit(values=["a"])))
    assert deliver(comp, host.send(TaskIds(task_ids=[3]))) == [TaskIds(task_ids=[3])]
    assert comp.owed_task_ids == 0


# --- spouts -------------------------------------------------------------------------------------


def test_spout_one_sync_per_command():
    host, comp = pair(SPOUT)
    for cmd in (Activate(), Next(), Ack(id=0), Fail(id={"k": [5]}), Next(), Deactivate()):
        assert deliver(comp, host.send(cmd)) == [cmd]
        assert host.state is State.BUSY and comp.state is State.BUSY
        # a command while busy: our fault at the host, the host's at the component
        with pytest.raises(LocalProtocolError):
            host.send(Next())
        assert host.state is State.BUSY
        stray = Connection(SPOUT, COMP)
        deliver(stray, encode(HS))
        stray.send(Pid(pid=1))
        deliver(stray, encode(Activate()))
        stray.receive_data(encode(Next()))
        with pytest.raises(RemoteProtocolError):
            stray.next_event()
        emit = Emit(values=["x"], id=1, need_task_ids=False)
        assert deliver(host, comp.send_many([emit, Log(msg="l"), Sync()])) == [emit, Log(msg="l"), Sync()]
        assert host.state is State.IDLE and comp.state is State.IDLE


def test_spout_sync_while_idle():
    host, comp = activated_spout()
    with pytest.raises(LocalProtocolError):
        comp.send(Sync())
    host.receive_data(encode(Sync()))
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert info.value.frame.strip() == b'{"command":"sync"}'
    # ... also before the first command
    host, comp = pair(SPOUT)
    with pytest.raises(LocalProtocolError):
        comp.send(Sync())


def test_spout_commands_pipelined_under_batch():
    # §9.5: a spout that accepted batch may be sent commands while others are
    # outstanding; each sync answers one, and the last leads back to idle.
    host, comp = Connection(SPOUT, HOST), Connection(SPOUT, COMP)
    hs = Handshake(pid_dir="/tmp/pids", conf={}, context={}, extensions=("batch",))
    deliver(comp, host.send(hs))
    deliver(host, comp.send(Pid(pid=99, extensions=("batch",))))
    cmds = [Activate(), Next(), Next(), Ack(id=3), Fail(id="x")]
    assert deliver(comp, host.send_many(cmds)) == cmds
    for left in range(len(cmds) - 1, -1, -1):
        assert host.state is State.BUSY and comp.state is State.BUSY
        assert deliver(host, comp.send(Sync())) == [Sync()]
        assert host.ledger.commands_out == comp.ledger.commands_out == left
    assert host.state is State.IDLE and comp.state is State.IDLE
    # one sync too many is still refused, on both sides
    with pytest.raises(LocalProtocolError):
        comp.send(Sync())
    host.receive_data(encode(Sync()))
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert info.value.rule == "spout.one-sync"


@pytest.mark.parametrize("first", [Next(), Deactivate(), Ack(id=1), Fail(id="x")], ids=repr)
def test_spout_activate_must_come_first(first):
    host, _ = pair(SPOUT)
    with pytest.raises(LocalProtocolError) as info:
        host.send(first)
    assert "activate" in str(info.value)
    assert host.state is State.IDLE
    host.send(Activate())
    assert host.state is State.BUSY


def test_spout_emits_during_open_and_task_ids_while_idle():
    host, comp = pair(SPOUT)
    e = Emit(values=["open"], id="open")
    assert deliver(host, comp.send(e)) == [e]
    assert host.owed_task_ids == 1 and host.state is State.IDLE
    comp.receive_data(host.send(TaskIds(task_ids=[2])))
    assert comp.next_task_ids() == TaskIds(task_ids=[2])
    assert host.state is State.IDLE and comp.state is State.IDLE


def test_spout_ids_any_json_and_no_pending_tracking():
    host, comp = activated_spout()
    for mid in (0, "1", -2, 4.5, {"k": [5]}, None, [1]):
        assert deliver(comp, host.send(Ack(id=mid))) == [Ack(id=mid)]
        deliver(host, comp.send(Sync()))
    assert host.pending == comp.pending == set()


def test_unknown_spout_command_from_host_is_answered():
    host, comp = activated_spout()
    cmd = UnknownCommand(command="rewind", frame={"command": "rewind", "id": ""})
    data = host.send(cmd)
    assert host.state is State.BUSY
    assert deliver(comp, data) == [cmd]
    assert comp.state is State.BUSY
    assert deliver(host, comp.send(Sync())) == [Sync()]
    assert host.state is comp.state is State.IDLE


def test_unknown_command_from_spout_component_is_fatal_at_host():
    host, comp = activated_spout()
    host.send(Next())
    comp.receive_data(encode(Next()))
    comp.next_event()
    frame = b'{"command":"frob","x":1}\nend\n'
    host.receive_data(frame)
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert "unknown spout command 'frob'" in str(info.value)
    assert info.value.frame.strip() == b'{"command":"frob","x":1}'
    assert host.state is State.ERROR


@pytest.mark.parametrize("cmd", [b"ack", b"fail", b"next"])
def test_spout_component_may_not_send_host_commands(cmd):
    host, comp = activated_spout()
    with pytest.raises(LocalProtocolError):
        comp.send(Ack(id=1))
    host.send(Next())
    host.receive_data(b'{"command":"%s","id":1}\nend\n' % cmd)
    with pytest.raises(RemoteProtocolError):
        host.next_event()


# --- error classes and state ------------------------------------------------------------------------


def test_local_and_remote_errors_are_protocol_errors_of_different_fault():
    from multilang import ProtocolError

    assert issubclass(LocalProtocolError, ProtocolError) and issubclass(RemoteProtocolError, ProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)


def test_remote_error_carries_frame_and_poisons_connection():
    host, comp = pair(BOLT)
    host.receive_data(b'{"command":"emit","tuple":"nope"}\nend\n{"command":"sync"}\nend\n')
    with pytest.raises(RemoteProtocolError) as info:
        host.next_event()
    assert info.value.frame.strip() == b'{"command":"emit","tuple":"nope"}'
    assert "nope" in str(info.value)
    assert host.state is State.ERROR
    with pytest.raises(RemoteProtocolError):
        host.next_event()
    with pytest.raises(LocalProtocolError):
        host.send(tup("1"))
    assert host.last_frames[-1].strip() == b'{"command":"emit","tuple":"nope"}'


def test_local_error_leaves_connection_usable():
    host, comp = pair(BOLT)
    with pytest.raises(LocalProtocolError) as info:
        comp.send(Ack(id="nope"))
    assert_local_frame(info.value, Ack(id="nope"))
    assert comp.state is State.READY
    deliver(comp, host.send(tup("1")))
    deliver(host, comp.send(Ack(id="1")))


def test_eof_closes():
    host, comp = pair(BOLT)
    assert deliver(host, b"") == [ConnectionClosed()]
    assert host.state is State.CLOSED


# --- a host and a component talking, at random ------------------------------------------------------------


class BoltConversation(RuleBasedStateMachine):
    """A bolt host and a bolt component connection exchange random legal
    traffic; bytes cross in random chunks. Both must agree on what is pending
    and how many task-id lists are owed."""

    @initialize()
    def setup(self):
        self.host, self.comp = pair(BOLT)
        self.to_comp = bytearray()
        self.to_host = bytearray()
        self.n = 0
        self.sent_by_host = []  # non-TaskIds events the host sent, in order
        self.got_by_comp = []
        self.task_lists_sent = []
        self.task_lists_got = []
        self.emits_seen_by_host = []
        self.emits_sent = []

    def _fresh(self):
        self.n += 1
        return str(-self.n if self.n % 2 else self.n * 1000)

    # host -> component
    @rule(kinds=st.lists(st.sampled_from(["tuple", "tuple", "tick", "heartbeat"]), min_size=1, max_size=4))
    def host_sends_input(self, kinds):
        for kind in kinds:
            tid = self._fresh()
            msg = {"tuple": tup(tid, [tid, "\U0001F600/"]), "tick": tick(tid), "heartbeat": Heartbeat(id=tid)}[kind]
            self.to_comp += self.host.send(msg)
            self.sent_by_host.append(msg)

    @precondition(lambda self: self.host.owed_task_ids > 0)
    @rule(ids=st.lists(st.integers(0, 9), max_size=3))
    def host_answers_task_ids(self, ids):
        msg = TaskIds(task_ids=[len(self.task_lists_sent)] + ids)
        self.to_comp += self.host.send(msg)
        self.task_lists_sent.append(msg)

    @rule(n=st.one_of(st.integers(1, 40), st.integers(41, 400)), k=st.integers(0, 6), wait=st.booleans())
    def pump_to_comp(self, n, k, wait):
        """Move up to n bytes to the component, which then (maybe) waits for
        its task ids, as a blocked emit does, and handles up to k events."""
        chunk, self.to_comp[:] = bytes(self.to_comp[:n]), self.to_comp[n:]
        if chunk:
            self.comp.receive_data(chunk)
        if wait and self.comp.owed_task_ids:
            self.comp_waits_for_task_ids()
        for _ in range(k):
            ev = self.comp.next_event()
            if ev is NEED_DATA:
                return
            if type(ev) is TaskIds:
                self.task_lists_got.append(ev)
                continue
            self.got_by_comp.append(ev)
            if type(ev) is Heartbeat:
                self.to_host += self.comp.send(Sync())

    @rule(n=st.one_of(st.integers(1, 40), st.integers(41, 400)), answer=st.booleans())
    def pump_to_host(self, n, answer):
        """Move up to n bytes to the host, which handles them (and maybe answers task ids at once)."""
        chunk, self.to_host[:] = bytes(self.to_host[:n]), self.to_host[n:]
        if chunk:
            self.host.receive_data(chunk)
        self.host_reads()
        while answer and self.host.owed_task_ids:
            self.host_answers_task_ids([])

    def host_reads(self):
        for ev in events(self.host):
            assert type(ev) in (Emit, Ack, Fail, Sync, Log)
            if type(ev) is Emit:
                self.emits_seen_by_host.append(ev)

    # component side
    @precondition(lambda self: self.comp.owed_task_ids > 0)
    @rule()
    def comp_waits_for_task_ids(self):
        ev = self.comp.next_task_ids()
        if ev is not NEED_DATA:
            self.task_lists_got.append(ev)

    @rule(data=st.data(), mode=st.sampled_from(["normal", "direct", "no-ids"]))
    def comp_emits(self, data, mode):
        pending = sorted(self.comp.pending)
        anchors = tuple(data.draw(st.lists(st.sampled_from(pending), max_size=3, unique=True))) if pending else ()
        emit = Emit(
            values=[len(self.emits_sent)],
            anchors=anchors,
            task=7 if mode == "direct" else None,
            need_task_ids=mode != "no-ids",
        )
        self.to_host += self.comp.send(emit)
        self.emits_sent.append(emit)

    @precondition(lambda self: self.comp.pending)
    @rule(data=st.data(), cls=st.sampled_from([Ack, Fail]))
    def comp_finishes(self, data, cls):
        tid = data.draw(st.sampled_from(sorted(self.comp.pending)))
        self.to_host += self.comp.send_many([Log(msg="\u00fc\r\nend\n" + tid), cls(id=tid)])


    # what must hold at every step
    @invariant()
    def views_are_consistent(self):
        if not hasattr(self, "host"):
            return
        # what the component holds pending, the host has sent and not yet seen finished
        assert self.comp.pending <= self.host.pending
        # emits and task-id lists in flight only make the component owe more
        assert self.comp.owed_task_ids >= self.host.owed_task_ids >= 0
        assert self.task_lists_got == self.task_lists_sent[: len(self.task_lists_got)]
        assert self.got_by_comp == self.sent_by_host[: len(self.got_by_comp)]
        assert self.emits_seen_by_host == self.emits_sent[: len(self.emits_seen_by_host)]

    def teardown(self):
        if not hasattr(self, "host"):
            return
        # drain both ways (the host answers what is still owed) and compare
        for _ in range(100):
            if self.to_host:
                self.host.receive_data(bytes(self.to_host))
                self.to_host.clear()
            self.host_reads()
            while self.host.owed_task_ids:
                self.host_answers_task_ids([])
            if self.to_comp:
                self.comp.receive_data(bytes(self.to_comp))
                self.to_comp.clear()
            while True:
                ev = self.comp.next_event()
                if ev is NEED_DATA:
                    break
                if type(ev) is TaskIds:
                    self.task_lists_got.append(ev)
                else:
                    self.got_by_comp.append(ev)
                    if type(ev) is Heartbeat:
                        self.to_host += self.comp.send(Sync())
            if not (self.to_comp or self.to_host or self.host.owed_task_ids):
                break
        assert self.host.pending == self.comp.pending
        assert self.host.owed_task_ids == self.comp.owed_task_ids == 0
        assert self.got_by_comp == self.sent_by_host
        assert self.task_lists_got == self.task_lists_sent
        assert self.emits_seen_by_host == self.emits_sent
        wanted = sum(1 for e in self.emits_sent if e.wants_task_ids)
        assert len(self.task_lists_sent) == wanted
        assert self.host.state is self.comp.state is State.READY


BoltConversation.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestBoltConversation = BoltConversation.TestCase


# --- the component bolt's per-tuple fast paths --------------------------------------------


def test_take_tuples_takes_the_ordinary_tuples_and_stops_at_anything_else():
    """A burst is decoded in one pass up to the first frame that is not an
    ordinary tuple; that frame and those after it come through next_event."""
    host, comp = pair(BOLT)
    data = host.send(tup("1")) + host.send(tup("2")) + host.send(Heartbeat(id="h")) + host.send(tup("3"))
    comp.receive_data(data)
    assert [t.id for t in comp.take_tuples()] == ["1", "2"]
    assert comp.take_tuples() == []
    assert comp.next_event() == Heartbeat(id="h")
    assert comp.take_tuples() == [tup("3")]
    assert comp.pending == {"1", "2", "3"}


def test_take_tuples_leaves_a_duplicate_id_to_the_general_path():
    host, comp = pair(BOLT)
    frame = b'{"id":"7","comp":"s","stream":"default","task":1,"tuple":[1]}\nend\n'
    comp.receive_data(frame + frame)
    assert [t.id for t in comp.take_tuples()] == ["7"]
    with pytest.raises(RemoteProtocolError, match="already pending"):
        comp.next_event()


@pytest.mark.parametrize("frame", [
    b'{"id":7,"comp":"s","stream":"default","task":1,"tuple":[1]}',  # id not a string
    b'{"id":"7","comp":"s","stream":"default","task":"1","tuple":[1]}',  # task not an int
    b'{"id":"7","comp":"s","stream":"default","task":1,"tuple":{}}',  # values not a list
    b'{"id":"7","comp":"s","task":1,"tuple":[1]}',  # no stream
    b'[1,2]',
    b'{"id":"7",',
])
def test_take_tuples_never_accepts_a_bad_tuple(frame):
    host, comp = pair(BOLT)
    comp.receive_data(frame + b"\nend\n")
    assert comp.take_tuples() == []
    with pytest.raises(RemoteProtocolError):
        comp.next_event()


def fast_paths(comp):
    out, slow = [], []

    def emit(values, stream, anchors, task, need):
        slow.append("emit")
        out.append(comp.send_emit(values, stream=stream or "default", task=task, need_task_ids=need,
                                  anchors=[a if isinstance(a, str) else a.id for a in anchors or ()]))

    def ack(t):
        slow.append("ack")
        out.append(comp.send_ack(t if isinstance(t, str) else t.id))

    return out, slow, *comp.bolt_fast_paths(out, emit, ack)


def test_bolt_fast_paths_write_the_same_bytes_as_the_general_path():
    host, comp = pair(BOLT)
    deliver(comp, host.send(tup("1")) + host.send(tup("2")))
    out, slow, emit, ack = fast_paths(comp)
    emit(["a", 1, {"k": None}], anchors=[tup("1")])
    emit([2 ** 70], anchors=["1"])  # beyond orjson: the general path encodes it
    ack(tup("1"))
    assert slow == ["emit"]
    assert out[0] == encode(Emit(values=["a", 1, {"k": None}], anchors=("1",), need_task_ids=False))
    assert deliver(host, b"".join(out)) == [
        Emit(values=["a", 1, {"k": None}], anchors=("1",), need_task_ids=False),
        Emit(values=[2 ** 70], anchors=("1",), need_task_ids=False),
        Ack(id="1"),
    ]
    assert comp.pending == {"2"}


def test_bolt_fast_paths_refuse_what_the_general_path_refuses():
    host, comp = pair(BOLT)
    deliver(comp, host.send(tup("1")))
    out, slow, emit, ack = fast_paths(comp)
    with pytest.raises(LocalProtocolError, match="not a pending tuple"):
        emit(["x"], anchors=[tup("9")])
    ack(tup("1"))
    with pytest.raises(LocalProtocolError, match="not a pending tuple"):
        ack(tup("1"))  # twice
    with pytest.raises(LocalProtocolError, match="not a pending tuple"):
        emit(["x"], anchors=["1"])  # anchored to an acked tuple
    with pytest.raises(LocalProtocolError, match="exact string received") as info:
        ack(Tuple(id=["x"], component="s", stream="default", task=1, values=[]))  # built by hand, bad id
    assert info.value.rule == "ids.string-echo"
    with pytest.raises(LocalProtocolError, match="not a pending tuple"):
        emit(["x"], anchors=[Tuple(id="1", component="s", stream="default", task=1, values=[])])
    assert slow == ["emit", "ack", "emit", "ack", "emit"]


def batched_pair():
    host, comp = Connection(BOLT, HOST), Connection(BOLT, COMP)
    deliver(comp, host.send(Handshake(pid_dir="/tmp", context={}, extensions=("batch",))))
    deliver(host, comp.send(Pid(pid=5, extensions=("batch",))))
    return host, comp


def test_take_tuples_takes_a_tuple_batch_whole_or_not_at_all():
    from multilang.messages import TupleBatch
    host, comp = batched_pair()
    ok = [tup(str(i)) for i in range(3)]
    with_tick = [tup("a"), tick("t"), tup("b")]
    [(f1, _)] = host.send_tuples(ok)
    [(f2, _)] = host.send_tuples(with_tick)
    comp.receive_data(f1 + f2)
    assert comp.take_tuples() == ok
    assert comp.take_tuples() == []  # a tick inside: the general path, nothing half-taken
    assert comp.pending == {"0", "1", "2"}
    assert events(comp) == with_tick
    assert comp.pending == {"0", "1", "2", "a", "t", "b"}
    assert TupleBatch  # (the frame type the general path decodes)


def test_take_tuples_with_a_limit_takes_a_burst_in_parts():
    """A caller may take a long burst in parts, each handled before the next
    is decoded; what is left stays queued, and only what was taken is
    pending. A tuple batch is never split: it is taken whole and ends the
    part once the limit is reached."""
    host, comp = pair(BOLT)
    comp.receive_data(b"".join(host.send(tup(str(i))) for i in range(5)))
    assert comp.queued == 5
    assert [t.id for t in comp.take_tuples(limit=2)] == ["0", "1"]
    assert comp.pending == {"0", "1"} and comp.queued == 3
    assert [t.id for t in comp.take_tuples(limit=2)] == ["2", "3"]
    assert [t.id for t in comp.take_tuples(limit=2)] == ["4"]
    assert comp.take_tuples(limit=2) == [] and comp.queued == 0

    host, comp = batched_pair()
    [(f1, _)] = host.send_tuples([tup("a"), tup("b"), tup("c")])
    [(f2, _)] = host.send_tuples([tup("d"), tup("e")])
    comp.receive_data(f1 + f2 + host.send(tup("f")))
    assert [t.id for t in comp.take_tuples(limit=2)] == ["a", "b", "c"]
    assert comp.pending == {"a", "b", "c"} and comp.queued == 2
    assert [t.id for t in comp.take_tuples(limit=3)] == ["d", "e", "f"]
    assert comp.queued == 0 and comp.pending == {"a", "b", "c", "d", "e", "f"}


def test_a_tuple_batch_with_an_id_twice_is_refused_and_nothing_becomes_pending():
    host, comp = batched_pair()
    deliver(comp, host.send(tup("0")))
    comp.receive_data(b'{"tuples":[["1","s","default",1,[1]],["2","s","default",1,[2]],["1","s","default",1,[3]]]}'
                      b"\nend\n")
    assert comp.take_tuples() == []
    assert comp.pending == {"0"}  # the fast path took nothing, and left no trace
    with pytest.raises(RemoteProtocolError, match="already pending"):
        events(comp)


def test_take_tuples_as_rows_and_the_tuples_view():
    from multilang.messages import Tuples
    host, comp = batched_pair()
    ts = [tup(str(i), values=[i]) for i in range(3)]
    [(frame, _)] = host.send_tuples(ts)
    comp.receive_data(frame + host.send(tup("x")))
    view = Tuples(comp.take_tuples(rows=True))
    assert list(view) == ts + [tup("x")] and view[1] == ts[1] and len(view) == 4
    assert view.ids == ("0", "1", "2", "x") and view.values == ([0], [1], [2], ["x"])
    assert Tuples([]).ids == ()


@pytest.mark.parametrize("batched", [False, True])
def test_send_emits_and_acks_many_at_once(batched):
    host, comp = batched_pair() if batched else pair(BOLT)
    ts = [tup(str(i), values=[i]) for i in range(3)]
    for t in ts:
        deliver(comp, host.send(t))
    data = comp.send_emits([[0], [1]], [ts[0], "1"]) + comp.send_emits([[9]], [[ts[0], ts[2]]])
    data += comp.send_acks(["0", "1"]) + comp.send_acks(["2"], fail=True)
    if batched:
        data += comp.close_batch()
    got = deliver(host, data)
    if batched:
        assert got == [Batch(emits=[[[0], ["0"], "default"], [[1], ["1"], "default"], [[9], ["0", "2"], "default"]],
                             acks=["0", "1"], fails=["2"])]
    else:
        assert got == [Emit(values=[0], anchors=("0",), need_task_ids=False),
                       Emit(values=[1], anchors=("1",), need_task_ids=False),
                       Emit(values=[9], anchors=("0", "2"), need_task_ids=False), Ack(id="0"), Ack(id="1"), Fail(id="2")]
    assert comp.pending == set() == host.pending


def test_send_emits_and_acks_refuse_unknown_or_repeated_ids():
    host, comp = batched_pair()
    deliver(comp, host.send(tup("1")))
    with pytest.raises(LocalProtocolError, match="not a pending tuple"):
        comp.send_emits([["x"]], ["9"])
    with pytest.raises(ValueError, match="1 emits but 2 anchor entries"):
        comp.send_emits([["x"]], ["1", "1"])
    with pytest.raises(LocalProtocolError, match="same tuple twice"):
        comp.send_acks(["1", "1"])
    with pytest.raises(LocalProtocolError, match="not a pending tuple"):
        comp.send_acks(["2"])
    assert comp.pending == {"1"}


# --- the host's fast read path (take_outputs) ----------------------------------------------

_IDS = st.sampled_from(["1", "2", "3", "9", 7, None, "h"])
_ANCHORS = st.one_of(st.none(), _IDS, st.lists(_IDS, max_size=3), st.just({}))
_PLAIN_FRAME = st.one_of(  # mostly what the fast path takes, and a few of its near misses
    st.fixed_dictionaries(
        {"command": st.just("emit"), "tuple": st.just(["w", 1]), "need_task_ids": st.just(False),
         "anchors": st.one_of(st.lists(st.sampled_from(["1", "2", "3", "9"]), max_size=2), _ANCHORS)},
        optional={"stream": st.sampled_from(["default", "other", 5, None])},
    ),
    st.fixed_dictionaries({"command": st.sampled_from(["ack", "fail"]), "id": st.sampled_from(["1", "2", "3", "9"])}),
    st.fixed_dictionaries({"command": st.just("emit"), "tuple": st.just(["w", 1]),
                           "need_task_ids": st.sampled_from([False, True, 0])},
                          optional={"task": st.sampled_from([0, 2, "2", None])}),
)
_ANY_FRAME = st.one_of(
    st.fixed_dictionaries(  # anything an emit may hold
        {"command": st.just("emit"), "tuple": st.one_of(st.just(["w", 1]), st.just({}), st.just("x"))},
        optional={"anchors": _ANCHORS, "need_task_ids": st.sampled_from([False, True, 0, None]),
                  "stream": st.sampled_from(["default", "other", 5, None]), "task": st.sampled_from([0, 2, None, "2"]),
                  "id": _IDS},
    ),
    st.fixed_dictionaries({"command": st.sampled_from(["ack", "fail"])}, optional={"id": _IDS}),
    st.sampled_from([{"command": "log", "msg": "hi"}, {"command": "sync"}, {"command": "what"}, [1], "x", {}]),
)
_OUTPUT_STREAM = st.builds(
    lambda good, odd, at: [orjson.dumps(f) + b"\nend\n" for f in good[:at] + odd + good[at:]],
    st.lists(_PLAIN_FRAME, max_size=10), st.lists(_ANY_FRAME, max_size=2), st.integers(0, 10),
)


def _host_with_pending():
    host, comp = pair(BOLT)
    for tid in ("1", "2", "3"):
        comp.receive_data(host.send(tup(tid)))
    host.send(Heartbeat(id="h"))
    return host


def _read_all(host, fast):
    """(emits, acks, fails, other events, error) as a host would see them."""
    emits, acks, fails, other = [], [], [], []
    while True:
        try:
            batch = host.take_outputs() if fast else None
            if batch is not None:
                emits += [(e[0], e[2] or "default", tuple(e[1] or ())) for e in batch.emits]
                acks += batch.acks
                fails += batch.fails
            ev = host.next_event()
        except RemoteProtocolError as exc:
            return emits, acks, fails, other, str(exc)
        if ev is NEED_DATA:
            return emits, acks, fails, other, None
        if type(ev) is Emit and not ev.wants_task_ids and ev.task is None:
            emits.append((ev.values, ev.stream, ev.anchors))
        elif type(ev) is Ack:
            acks.append(ev.id)
        elif type(ev) is Fail:
            fails.append(ev.id)
        else:
            other.append(ev)


@settings(max_examples=300, deadline=None)
@given(frames=_OUTPUT_STREAM)
def test_take_outputs_agrees_with_the_general_path(frames):
    """Whatever a component writes, the host's bulk read path accepts and
    refuses exactly what frame-by-frame decoding does, with the same error."""
    fast, slow = _host_with_pending(), _host_with_pending()
    data = b"".join(frames)
    fast.receive_data(data)
    slow.receive_data(data)
    assert _read_all(fast, True) == _read_all(slow, False)
    assert fast.pending == slow.pending and fast.owed_task_ids == slow.owed_task_ids


def test_take_outputs_takes_plain_emits_and_acks_as_one_batch():
    host = _host_with_pending()
    host.receive_data(
        b'{"command":"emit","tuple":["a"],"anchors":["1"],"need_task_ids":false}\nend\n'
        b'{"command":"ack","id":"1"}\nend\n'
        b'{"command":"emit","tuple":["b"],"anchors":"2","stream":"s","need_task_ids":false}\nend\n'
        b'{"command":"fail","id":"2"}\nend\n'
        b'{"command":"emit","tuple":["c"]}\nend\n'  # wants task ids: the general path
        b'{"command":"ack","id":"3"}\nend\n'
    )
    batch = host.take_outputs()
    assert batch == Batch(emits=[[["a"], ["1"], "default"], [["b"], ["2"], "s"]], acks=["1"], fails=["2"])
    assert host.take_outputs() is None
    assert host.next_event() == Emit(values=["c"])
    assert host.owed_task_ids == 1
    assert host.take_outputs() == Batch(acks=["3"])
    assert host.pending == set()
    assert host.take_outputs() is None and host.next_event() is NEED_DATA


# --- bytes-like input -----------------------------------------------------------------


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_receive_data_takes_any_bytes_like_object(kind):
    """A reader that fills a bytearray (readinto) feeds it as is: the frames
    come out as messages, exactly as from bytes, on both sides."""
    host, comp = Connection(BOLT, HOST), Connection(BOLT, COMP)
    assert deliver(comp, kind(host.send(HS))) == [HS]
    assert deliver(host, kind(comp.send(Pid(pid=99)))) == [Pid(pid=99)]
    data = host.send(tup("1")) + host.send(Heartbeat(id="h"))
    got = [ev for i in range(0, len(data), 7) for ev in deliver(comp, kind(data[i : i + 7]))]
    assert got == [tup("1"), Heartbeat(id="h")]
    assert deliver(host, kind(comp.send_ack("1"))) == [Ack(id="1")]
    assert deliver(comp, kind(b"")) == [ConnectionClosed()]


# --- a refused call changes nothing -----------------------------------------------------


def test_a_refused_split_tuple_batch_records_no_tuple():
    """send_tuples halves a batch that is too large (§9.5, §1.3); when a
    later half is refused, the halves before it are not recorded as sent."""
    host, comp = batched_pair()
    host.send_tuples([tup("1"), tup("2")])
    with pytest.raises(LocalProtocolError) as info:
        host.send_tuples([tup("3"), tup("4"), tup("5"), tup("1")], max_size=80)
    assert info.value.rule == "ids.unique"
    assert host.pending == {"1", "2"}
    assert host.send_tuples([]) == []  # no batch frame without tuples: 'tuples' is non-empty (§9.5)
