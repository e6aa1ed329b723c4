"""Sans-IO multilang connections: bytes in, events out, bytes back.

One class serves both sides and both roles: ``Connection(Role.BOLT,
Side.HOST)`` is what a ShellBolt host holds; ``Connection(Role.SPOUT,
Side.COMPONENT)`` is what a spout library holds. No I/O, no clock: the caller
feeds bytes with :meth:`receive_data`, pulls events with :meth:`next_event`
and writes whatever :meth:`send` returns (the h11 model).

Beyond the state table (``_state.py``) a connection enforces the rules that
need memory (§3.5, §3.6):

* task-id lists pair with emits that wanted them, in FIFO order; a list
  nobody asked for is an error;
* a bolt may only ack, fail or anchor to ids of tuples it was sent and has not
  finished; heartbeat ids are never ackable;
* a spout gets exactly one ``sync`` per command; the host sends ``activate``
  first.

On the component side, :meth:`next_task_ids` fetches the next task-id list
while keeping the tuples and heartbeats that arrived before it queued, in
order, for :meth:`next_event` (§6.2).

This module is the general path: every message, checked against the state
table and the ledger. Two mixins complete the class: ``_fast_paths.py``, the
per-tuple paths that short-cut it (and their differential test), and
``_writers.py``, the frames the pid reply's choice of wire writes (§9.2).
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any, Iterable

import orjson

from ._fast_paths import FastPaths
from ._state import ALLOWED, PIPELINED, SENDER, SPOUT_COUNTED, STATE_RULES, Ledger, Role, Side, State
from ._writers import Writers
from .codec import decode_component_frame, decode_host_frame, dumps
from .codec import encode_json, loads as json_loads, msgpack_frame, msgpack_loads
from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from .framing import DEFAULT_MAX_FRAME_SIZE, TERMINATOR, FirstFrameCut, FrameReader, LengthPrefixedReader
from .messages import (
    DEFAULT_STREAM,
    Ack,
    Batch,
    ConnectionClosed,
    Emit,
    Fail,
    Handshake,
    Heartbeat,
    Message,
    Pid,
    STATE_MESSAGES,
    TaskIds,
    Tick,
    Tuple,
    TupleBatch,
    UnknownCommand,
)

_STATE_TYPES = frozenset(STATE_MESSAGES.values())  # §9.7

__all__ = ["Connection", "NEED_DATA", "Role", "Side", "State"]


_NOTHING: dict[type, State] = {}


def _json_frame(obj: Any) -> bytes:
    return dumps(obj) + TERMINATOR


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`Connection.next_event` when more bytes are needed.
NEED_DATA = _NeedData()


class _Failed:
    """A queued error: raised when the reader reaches it, after the frames
    that arrived before it have been delivered."""

    __slots__ = ("exc",)

    def __init__(self, exc: ProtocolError) -> None:
        self.exc = exc


class Connection(FastPaths, Writers):
    """One end of one multilang connection.

    ``role`` is what the component is (bolt or spout); ``side`` is which end
    this object plays.
    """

    def __init__(self, role: Role, side: Side, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.role = role
        self.side = side
        self._by_state = ALLOWED[role]
        #: Extension ``batch`` is on (§9.5).
        self.batching = False
        #: Extension ``msgpack`` is on (§9.6): frames are length-prefixed msgpack.
        self.msgpack = False
        self.state = State.HANDSHAKE
        self._sender = SENDER[role]
        self._peer = Side.COMPONENT if side is Side.HOST else Side.HOST
        self._reader: FrameReader | LengthPrefixedReader = FrameReader(max_frame_size)
        self._max_frame_size = max_frame_size
        self._loads = orjson.loads  # the per-tuple fast path's parser
        self._set_codec(json_loads, _json_frame)
        # Host side, msgpack offered, pid reply not yet read: bytes after the
        # first JSON frame wait here until we know the framing (§9.6).
        self._first: FirstFrameCut | None = None
        self._bolt_component = role is Role.BOLT and side is Side.COMPONENT
        self._component_side = side is Side.COMPONENT
        # Received frames (bytes, or a queued error or close); the first
        # unread one is at _pos. A list and an index rather than a deque: a
        # fast path takes a run of frames as one slice and drops them by
        # moving _pos, with no per-frame pop (bench/).
        self._bodies: list[bytes | _Failed | Message] = []
        self._pos = 0
        self._stash: deque[Message] = deque()  # component side: events set aside by next_task_ids
        #: The rules that need memory (``_state.Ledger``).
        self.ledger = Ledger()
        #: Bolt: ids of tuples sent (host) or received (component), not yet
        #: acked or failed (the ledger's set; the fast paths test it inline).
        self.pending: set[str] = self.ledger.pending
        #: Extensions the host offered (§9.1) and the component accepted (§9.2).
        self.offered: tuple[str, ...] = ()
        self.extensions: tuple[str, ...] = ()
        # Component side, batching: the output batch being filled (§9.5).
        self._open_emits: list[Any] = []  # [values, anchors(, stream)], lists or tuples
        self._open_acks: list[str] = []
        self._open_fails: list[str] = []
        self._open_n = 0  # elements in the open batch (every append goes through _batch_full)
        self._choose_writer()  # standard JSON until the pid reply says otherwise (§9.2)
        #: The last frames received, for error messages.
        self.last_frames: deque[bytes] = deque(maxlen=3)

    def _set_codec(self, loads: Any, frame: Any) -> None:
        self._frame = frame  # a wire object -> one complete frame
        self._decode = (
            partial(decode_component_frame, loads=loads) if self.side is Side.HOST
            else partial(decode_host_frame, spout=self.role is Role.SPOUT, loads=loads)
        )

    def _switch_to_msgpack(self) -> None:
        """§9.6: every frame after the pid reply is length-prefixed msgpack."""
        self.msgpack = True  # (the writer follows: _choose_writer)
        self._loads = msgpack_loads
        self._set_codec(msgpack_loads, msgpack_frame)
        old, self._reader = self._reader, LengthPrefixedReader(self._max_frame_size)
        rest = bytes(old._buf) if isinstance(old, FrameReader) else b""
        if rest.strip():  # component side: bytes the host wrote before our pid reply
            self._bodies.extend(self._reader.feed(rest))

    def _release_held(self) -> None:
        """Host side, the pid reply read: what came after it, to the reader
        of the framing now in force."""
        held = self._first.release() if self._first is not None else b""
        self._first = None
        if held:
            self.receive_data(bytes(held))

    @property
    def owed_task_ids(self) -> int:
        """Emits that wanted task ids and have not had them (FIFO, §3.4)."""
        return self.ledger.owed_task_ids

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, new: State) -> None:
        self._state = new
        # The legal transitions out of this state, keyed by message type: one
        # dict lookup per message instead of hashing (state, type) pairs.
        self._allowed = self._by_state.get(new, _NOTHING)
        # A bolt component, ready: the per-tuple paths hand their frames to
        # the writer the pid reply chose (_choose_writer, before READY).
        self._ready = new is State.READY and self.side is Side.COMPONENT

    # -- receiving -----------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes from the peer (any bytes-like object). ``b""`` means end of stream."""
        if type(data) is not bytes:
            # The readers slice frames out of what they are fed, and a frame
            # is told from a queued error or close by being bytes.
            data = bytes(data)
        if self._first is not None:
            # Host, msgpack offered, the pid reply not yet decoded: the JSON
            # reader gets the first frame only; later bytes wait (§9.6).
            if not data:
                self._first = None  # closed before the pid reply was read
            else:
                data = self._first.feed(data)
                if not data:
                    return
        if self._pos:  # drop the frames already taken (all of them, usually)
            del self._bodies[: self._pos]
            self._pos = 0
        if data:
            try:
                self._bodies.extend(self._reader.feed(data))
            except ProtocolError as exc:
                # Frames completed before the bad one are still delivered first.
                self._bodies.extend(getattr(exc, "frames_before", ()))
                self._bodies.append(_Failed(exc))
        else:
            try:
                self._bodies.extend(self._reader.close())
            except ProtocolError as exc:
                self._bodies.append(_Failed(exc))
            self._bodies.append(ConnectionClosed())

    def next_event(self) -> Message | _NeedData:
        """The next event from the peer, or :data:`NEED_DATA`."""
        if self._stash:
            return self._stash.popleft()
        if self._bolt_component and len(self._bodies) > self._pos:
            tups = self.take_tuples()
            if tups:
                if len(tups) > 1:
                    self._stash.extend(tups[1:])
                return tups[0]
        ev = self._next_from_wire()
        if type(ev) is TupleBatch:
            # One event per tuple, in order (§9.5); the rest wait in the stash.
            self._stash.extend(ev.tuples)
            return self._stash.popleft()
        return ev

    @property
    def queued(self) -> int:
        """How many frames have been received and not yet taken: the size of
        a burst, for a caller that answers it in parts."""
        return len(self._bodies) - self._pos

    def next_task_ids(self) -> TaskIds | _NeedData:
        """Component side: the next task-id list, keeping earlier events queued.

        Tuples, heartbeats and commands that arrived before it stay, in order,
        for :meth:`next_event` (§6.2). Returns :data:`NEED_DATA` if the list
        has not arrived yet; a closed stream raises.
        """
        for i, ev in enumerate(self._stash):
            if type(ev) is TaskIds:
                del self._stash[i]
                return ev
        while True:
            ev = self._next_from_wire()
            if ev is NEED_DATA or type(ev) is TaskIds:
                return ev
            if type(ev) is ConnectionClosed:
                self._stash.append(ev)
                raise RemoteProtocolError("stream closed while waiting for task ids")
            if type(ev) is TupleBatch:
                self._stash.extend(ev.tuples)
            else:
                self._stash.append(ev)

    def _next_from_wire(self) -> Message | _NeedData:
        if self.state is State.ERROR:
            raise RemoteProtocolError("connection is in an error state")
        bodies = self._bodies
        pos = self._pos
        if len(bodies) <= pos:
            return NEED_DATA
        item = bodies[pos]
        self._pos = pos + 1
        if type(item) is bytes:
            self.last_frames.append(item)
            try:
                msg = self._decode(item)
                self._on_receive(msg, item)
            except ProtocolError:
                self.state = State.ERROR
                raise
            return msg
        if type(item) is _Failed:
            self.state = State.ERROR
            raise item.exc
        # ConnectionClosed
        self.state = State.CLOSED
        return item

    def _on_receive(self, msg: Message, body: bytes) -> None:
        t = type(msg)
        if self._sender.get(t) is not self._peer:
            if t is UnknownCommand and self.role is Role.SPOUT:
                raise RemoteProtocolError(f"unknown spout command {msg.command!r}", frame=body)
            raise RemoteProtocolError(f"{self._peer.value} may not send {t.__name__} to a {self.role.value}", frame=body)
        new = self._allowed.get(t)
        if new is None:
            rule = self._state_rule(t)
            why = (" (a sync with no command outstanding: more than one sync for a command, §4.2)"
                   if rule == "spout.one-sync" else "")
            raise RemoteProtocolError(f"{t.__name__} is not legal in state {self._state.value}{why}", frame=body,
                                      rule=rule)
        self._check(msg, remote=True, frame=body)
        if new is not self._state and (new is not State.IDLE or not self.ledger.commands_out):  # (PIPELINED)
            self.state = new

    # -- sending ---------------------------------------------------------------
    #
    # A refused call changes nothing and loses nothing: each path checks the
    # message against the state table and the ledger and encodes it before it
    # closes the batch being filled (§9.5) or records anything (§3.4-§3.6).

    def send(self, msg: Message) -> bytes:
        """Check that we may send ``msg`` now, and return its bytes."""
        t = type(msg)
        if t is Emit:
            return self.send_emit(msg.values, stream=msg.stream, anchors=msg.anchors, id=msg.id, task=msg.task,
                                  need_task_ids=msg.need_task_ids)
        self._may_send(t, msg)
        if t is Ack or t is Fail:
            # §3.6 before the codec, as send_ack: an id that is not a pending
            # string is named so (ids.string-echo), not as a value the codec
            # cannot hold; a pending id is a string, which always encodes.
            self._check(msg, remote=False, frame=msg)
            frame = self._frame(encode_json(msg))
        else:
            frame = self._frame(encode_json(msg))  # before _check: the pid reply is JSON even if it accepts msgpack
            self._check(msg, remote=False, frame=msg)
        new = self._allowed[t]
        if new is not self._state and (new is not State.IDLE or not self.ledger.commands_out):  # (PIPELINED)
            self.state = new
        # §9.5: a standard frame closes the batch being filled, keeping order.
        return self.close_batch() + frame if self._open_n else frame

    def send_tuples(self, tuples: list[Tuple], max_size: int | None = None) -> list[tuple[bytes, list[Tuple]]]:
        """Host: frames carrying ``tuples`` to a bolt, each with the tuples it
        holds. One batch frame if the component accepted ``batch`` (§9.5),
        split in halves while it would exceed ``max_size``; else, or for a
        single tuple, standard frames. All or none: if one tuple is refused
        (a value no frame can carry, or a tuple whose frame alone exceeds
        ``max_size``, §1.3), none is recorded as sent and
        :class:`LocalProtocolError` says why."""
        if self._state is not State.READY:
            return self._send_each(tuples)  # the general path refuses them
        return self._write_tuples(tuples, max_size)

    def _may_send(self, t: type, msg: Any) -> None:
        if self._sender.get(t) is not self.side:
            raise LocalProtocolError(f"{self.side.value} may not send {t.__name__} to a {self.role.value}", frame=msg)
        if t not in self._allowed:
            raise LocalProtocolError(f"{t.__name__} is not legal in state {self._state.value}", frame=msg,
                                     rule=self._state_rule(t))

    def _state_rule(self, t: type) -> str:
        rules = STATE_RULES
        key = (self.role, self._state)
        return rules.get((*key, t)) or rules.get((*key, None)) or "protocol.state"

    # The component's per-tuple messages get direct paths: same checks as
    # send(), no message object, the wire dict built once (bench/).

    def send_emit(
        self,
        values: list[Any],
        *,
        stream: str = DEFAULT_STREAM,
        anchors: tuple[str, ...] | list[str] = (),
        id: Any = None,
        task: int | None = None,
        need_task_ids: bool = True,
    ) -> bytes:
        """An ``emit`` frame (§3.5, §4.3): anchors must be pending tuples;
        a non-direct emit that wants task ids is owed a list (§3.4). Under
        ``batch`` one that wants none joins the output batch (§9.5)."""
        if Emit not in self._allowed or not self._component_side:
            self._may_send(Emit, {"command": "emit", "tuple": values})
        if anchors:
            self._check_anchors(anchors, values)
            if type(anchors) is not list:
                anchors = list(anchors)
        if task is None and not need_task_ids:
            return self._write_emit(values, anchors or None, stream, id)
        # §9.5: direct, or wanting task ids: a standard frame
        frame = self._frame(self._emit_obj(values, anchors, stream, id, task, need_task_ids))
        if task is None:
            self.ledger.owe()  # §3.4, once the frame exists: a refused emit is owed nothing
        return self.close_batch() + frame if self._open_n else frame

    def _check_anchors(self, anchors: Iterable[str], frame: Any) -> None:
        """§3.5: we may anchor only to tuples still pending."""
        self.ledger.check_anchors(anchors, LocalProtocolError, frame)

    def send_ack(self, tuple_id: Any) -> bytes:
        """Bolt: ack a pending tuple. Spout host: ack a message id."""
        if self._ready and type(tuple_id) is str and tuple_id in self.pending:
            self.pending.remove(tuple_id)  # §3.6: the exact id string of a pending tuple
            return self._write_ids((tuple_id,), False)
        return self._ack_or_fail(Ack, "ack", tuple_id)

    def send_fail(self, tuple_id: Any) -> bytes:
        return self._ack_or_fail(Fail, "fail", tuple_id)

    def _ack_or_fail(self, cls: type, command: str, tuple_id: Any) -> bytes:
        if self._ready:
            self.ledger.retire((tuple_id,), command + "s", LocalProtocolError, tuple_id)
            return self._write_ids((tuple_id,), cls is Fail)
        return self.send(cls(id=tuple_id))

    def send_many(self, msgs: Iterable[Message]) -> bytes:
        """Several frames as one write."""
        return b"".join([self.send(m) for m in msgs])

    # -- the rules that need memory -----------------------------------------

    def _check(self, msg: Message, *, remote: bool, frame: Any) -> None:
        """The rules that need memory, for one message; each is the ledger's (``_state.Ledger``)."""
        err = RemoteProtocolError if remote else LocalProtocolError
        ledger = self.ledger
        t = type(msg)
        # Who "sent" the message relative to the bookkeeping: the component
        # side of a bolt tracks tuples it received, the host those it sent.
        if t is Tuple or t is Tick:
            ledger.admit((msg.id,), err, frame)
        elif t is Heartbeat:
            if ledger.state is not None and ledger.state.initializing:
                raise ledger.state.before_init(err, frame)
            ledger.heartbeats.append(msg.id)
        elif t is Emit:
            if msg.anchors:
                ledger.check_anchors(msg.anchors, err, frame)
            if msg.task is None and msg.need_task_ids:
                ledger.owe()
        elif t is TaskIds:
            ledger.pay(err, frame)
        elif t is Ack or t is Fail:
            if self.role is Role.BOLT:
                ledger.retire((msg.id,), t.__name__.lower() + "s", err, frame)
        elif t is TupleBatch:
            if not self.batching:
                raise err("a tuple batch without the batch extension (§9.5)", frame=frame, rule="batch.negotiated")
            ledger.admit([u.id for u in msg.tuples], err, frame)
        elif t is Batch:
            self._check_batch(msg, err, frame)
        elif t in _STATE_TYPES:
            ledger.state_frame(msg, err, frame)
        elif t is Handshake:
            self.offered = msg.extensions  # §9.1: never a conf key (Storm's host copies the user's conf)
            if not remote and "msgpack" in self.offered:
                self._first = FirstFrameCut(self._max_frame_size)
        elif t is Pid:
            ledger.accept(msg.extensions, self.offered, self.role is Role.BOLT, err, frame)
            self.extensions = msg.extensions
            self.batching = "batch" in msg.extensions
            if self.batching and self.role is Role.SPOUT:  # §9.5: commands may be pipelined
                self._by_state = PIPELINED
            if "msgpack" in msg.extensions:
                self._switch_to_msgpack()
            self._choose_writer()
            if remote:
                self._release_held()
        if t in SPOUT_COUNTED and self.role is Role.SPOUT:
            ledger.command(t, not remote, err, frame)

    def _check_batch(self, msg: Batch, err: type, frame: Any) -> None:
        """§9.5: each element follows the rule of its standard frame; emits
        are checked before the acks and fails of the same batch."""
        if not self.batching:
            raise err("an output batch without the batch extension (§9.5)", frame=frame, rule="batch.negotiated")
        if self.role is Role.BOLT:
            ledger = self.ledger
            pending = ledger.pending
            for e in msg.emits:
                anchors = e[1] if len(e) > 1 else None
                if anchors is None:
                    continue
                if type(anchors) is not list:
                    raise err("a batched bolt emit's anchors must be a list of tuple ids", frame=frame,
                              rule="frame.invalid")
                try:
                    if pending.issuperset(anchors):  # (pending holds id strings only) the common case, in C
                        continue
                except TypeError:  # an unhashable anchor: check_anchors names it
                    pass
                ledger.check_anchors(anchors, err, frame)
            if msg.acks:
                ledger.retire(msg.acks, "acks", err, frame)
            if msg.fails:
                ledger.retire(msg.fails, "fails", err, frame)
        elif msg.acks or msg.fails:
            raise err("a spout's batch carries no acks or fails (is a bolt program declared as a spout?)", frame=frame,
                      rule="frame.invalid")

