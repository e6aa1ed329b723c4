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
"""

from __future__ import annotations

from collections import deque
from functools import partial
from operator import itemgetter

import orjson
from typing import Any, Callable, Collection, Iterable

from ._state import ALLOWED, PIPELINED, SENDER, SPOUT_COUNTED, STATE_RULES, Ledger, Role, Side, State
from .codec import _new_tuple, check_finite, decode_component_frame, decode_host_frame, dumps
from .codec import encode_json, loads as json_loads, msgpack_frame, msgpack_loads, name_unencodable
from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from .framing import DEFAULT_MAX_FRAME_SIZE, TERMINATOR, FirstFrameCut, FrameReader, LengthPrefixedReader
from .messages import (
    DEFAULT_STREAM,
    HEARTBEAT_STREAM,
    TICK_STREAM,
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
    anchor_ids,
)

_STATE_TYPES = frozenset(STATE_MESSAGES.values())  # §9.7

__all__ = ["Connection", "NEED_DATA", "Role", "Side", "State"]


_NOTHING: dict[type, State] = {}
# Elements per output batch before it is closed: keeps a frame far below the
# size limit for ordinary tuples (§9.5).
_BATCH_MAX = 1024


def _json_frame(obj: Any) -> bytes:
    return dumps(obj) + TERMINATOR


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`Connection.next_event` when more bytes are needed.
NEED_DATA = _NeedData()

_SYSTEM_STREAMS = frozenset((HEARTBEAT_STREAM, TICK_STREAM))
_JUST_LIST, _JUST_FIVE, _JUST_STR, _JUST_INT = {list}, {5}, {str}, {int}
_make_tuple = partial(_new_tuple, Tuple)  # a Tuple from a [id, comp, stream, task, values] row
_JUST_TUPLE = {Tuple}
_first = itemgetter(0)  # a Tuple's id
# The per-tuple frames around their variable parts, which alone go through
# orjson (same bytes as encoding the whole dict). One formatting step (bytes
# %): one allocation, and fewer instructions than a join or concatenations
# (bench/instructions.py).
_EMIT_FORMAT = b'{"command":"emit","tuple":%b,"anchors":[%b],"need_task_ids":false}' + TERMINATOR
_ACK_FORMAT = b'{"command":"ack","id":%b}' + TERMINATOR

class _Failed:
    """A queued error: raised when the reader reaches it, after the frames
    that arrived before it have been delivered."""

    __slots__ = ("exc",)

    def __init__(self, exc: ProtocolError) -> None:
        self.exc = exc


class Connection:
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

    def take_tuples(self, rows: bool = False, limit: int | None = None) -> list[Any]:
        """Component side of a bolt: every ordinary input tuple at the head of
        the received stream, decoded in one pass (the per-tuple fast path).

        Each is checked exactly as :func:`decode_host_frame` and :meth:`_check`
        would check it (§3.1, §3.6) and its id becomes pending. The first
        frame that is anything else (heartbeat, tick, task ids, a batch, a
        duplicate id, bad JSON) stops the pass; :meth:`next_event` then takes
        it the general way, after the caller has handled the tuples before it.
        Returns ``[]`` while events set aside by :meth:`next_task_ids` wait.
        With ``rows=True`` the result holds each tuple's fields as a row
        (``[id, comp, stream, task, values]``) instead of a :class:`Tuple`,
        for :class:`~multilang.messages.Tuples`.

        ``limit`` caps the tuples taken in one call (a tuple batch is taken
        whole, and ends the call once there are ``limit``). A caller that
        handles each part before it takes the next keeps few objects alive
        at once: CPython's cyclic collector, which starts after 700 new
        container objects, then seldom finds a burst of young tuples to
        walk (bench/).
        """
        if self._stash or not self._bolt_component or self._state is not State.READY or (
                self.ledger.state is not None and self.ledger.state.initializing):  # §9.7: the general path refuses
            return []
        bodies = self._bodies
        pos = self._pos
        if len(bodies) <= pos:
            return []
        pending = self.pending
        add = pending.add
        loads = self._loads
        system = _SYSTEM_STREAMS
        new = _new_tuple
        kind = tuple if rows else Tuple  # tuple.__new__(tuple, row) is the row itself
        batching = self.batching
        items = bodies[pos:] if limit is None else bodies[pos : pos + limit]
        out: list[Any] = []
        append = out.append
        for item in items:
            try:
                obj = loads(item)  # a queued error or close is not bytes: TypeError
                if batching and "tuples" in obj:
                    # (another key beside it, "pidDir" say, the decoder decides: §2.2 before §9.5)
                    if len(obj) == 1 and self._take_batch(obj["tuples"], out, rows):
                        if limit is None or len(out) < limit:
                            continue
                        self._consume(items, item, through=True)
                        return out
                    break
                tid = obj["id"]
                stream = obj["stream"]
                values = obj["tuple"]
                task = obj["task"]
                comp = obj["comp"]
            except Exception:  # not a dict with these keys: the general path says what is wrong
                break
            # x.__class__ rather than type(x) here and in the fast paths below:
            # the same for the builtins orjson returns, and no call in CPython
            # 3.11's interpreter (measured with callgrind on bench/'s echo bolt).
            # stream != "default" first: a fresh string's equality test is
            # cheaper than hashing it for the set lookup. A key beyond a
            # tuple's five ("pidDir", "tuples", ...) may make the decoder read
            # the frame as something else (a handshake, §2.2; a tuple batch,
            # refused without the extension, §9.5): it decides such a frame,
            # so the same bytes mean the same whichever path reads them.
            if (
                tid.__class__ is not str or values.__class__ is not list or task.__class__ is not int
                or stream.__class__ is not str or stream != DEFAULT_STREAM and stream in system or tid in pending
                or len(obj) != 5
            ):
                break
            add(tid)
            append(new(kind, (tid, comp, stream, task, values)))
        else:
            self._consume(items)
            return out
        self._consume(items, item)  # ``item`` and what follows stay, for the general path
        return out

    def _consume(self, items: list[Any], stop: Any = None, through: bool = False) -> int:
        """Move the read position past the frames of ``items`` (a snapshot
        of the queue) that a fast path took: those before ``stop`` (and
        ``stop`` itself if ``through``), found by identity because equal
        frames may come before it, or all of them. Returns how many."""
        n = len(items) if stop is None else next(i for i, x in enumerate(items) if x is stop) + through
        self._pos += n  # (receive_data drops them)
        if n:
            self.last_frames.append(items[n - 1])
        return n

    def _take_batch(self, items: Any, out: list[Any], rows: bool) -> bool:
        """A tuple batch (§9.5) of ordinary tuples onto ``out``; False (and
        nothing taken) if any element is anything else: a tick, a bad or
        duplicate element. The general path then delivers or refuses it."""
        if type(items) is not list or not items:
            return False
        # Column-wise checks: each a loop in C, not per element in Python.
        if set(map(type, items)) != _JUST_LIST or set(map(len, items)) != _JUST_FIVE:
            return False
        ids, _comps, streams, tasks, valuess = zip(*items)
        if (set(map(type, ids)) != _JUST_STR or set(map(type, streams)) != _JUST_STR
                or set(map(type, tasks)) != _JUST_INT or set(map(type, valuess)) != _JUST_LIST
                or not _SYSTEM_STREAMS.isdisjoint(streams)):
            return False
        try:
            self.ledger.admit(ids, RemoteProtocolError, None)
        except ProtocolError:  # a repeated id: the general path refuses the frame with its own bytes
            return False
        out.extend(items if rows else map(_make_tuple, items))
        return True

    def take_outputs(self) -> Batch | None:
        """Host side of a bolt: the plain emits, acks and fails at the head of
        the received stream, decoded in one pass (the host's per-tuple fast
        path), as one :class:`Batch`, or None if the next frame is not one.

        Plain: an emit on any stream that wants no task ids, is not direct,
        and anchors only to pending tuples; an ack or fail of a pending
        tuple. Each frame is checked as :func:`decode_component_frame` and
        :meth:`_check` would check it, in wire order (§3.5, §3.6). The
        result has the order of a §9.5 batch: its emits, then its acks,
        then its fails. That is the wire order as far as the acker and the
        receiving tasks can tell (§6.1): an emit's anchors were pending when
        it was read, so it comes before their ack in either order, and XOR
        commutes (§7.1). The first frame that is anything else (a log, an
        emit that wants task ids, a batch, bad JSON, an unknown id) stops
        the pass; :meth:`next_event` then takes it the general way.
        """
        if self._component_side or self.role is not Role.BOLT or self._state is not State.READY:
            return None
        bodies = self._bodies
        if len(bodies) <= self._pos or self.batching:
            return None
        pending = self.pending
        remove = pending.remove
        loads = self._loads
        emits: list[list[Any]] = []
        acks: list[str] = []
        fails: list[str] = []
        items = bodies[self._pos :]
        for item in items:
            try:
                obj = loads(item)  # a queued error or close is not bytes: TypeError
                cmd = obj["command"]
                if cmd == "emit":
                    values = obj["tuple"]
                    if obj["need_task_ids"] is not False or "task" in obj or values.__class__ is not list:
                        break  # wants task ids (§3.4), may be direct, or is malformed
                    anchors = obj.get("anchors")
                    if anchors.__class__ is str:
                        anchors = [anchors]  # §3.5: one anchor may be sent bare
                    elif anchors is not None and anchors.__class__ is not list:
                        break
                    # pending holds id strings: anything else is missing (or unhashable: TypeError)
                    if anchors and not pending.issuperset(anchors):
                        break
                    stream = obj.get("stream")
                    if stream is not None and stream.__class__ is not str:
                        break
                    emits.append([values, anchors or None, stream])
                    continue
                if cmd != "ack" and cmd != "fail":
                    break
                tid = obj["id"]
                remove(tid)  # not a pending id string: KeyError or TypeError, and the general path names it
                (acks if cmd == "ack" else fails).append(tid)
            except Exception:  # not a dict with these keys: the general path says what is wrong
                break
        else:
            self._consume(items)
            return Batch(emits=emits, acks=acks, fails=fails)
        if not self._consume(items, item):
            return None
        return Batch(emits=emits, acks=acks, fails=fails)

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
        single tuple, standard frames (the caller checks their size, §1.3).
        All or none: if one tuple is refused, none is recorded as sent."""
        if self._state is not State.READY:
            return self._send_each(tuples)  # the general path refuses them
        return self._write_tuples(tuples, max_size)

    def close_batch(self) -> bytes:
        """Component: the output batch filled so far as one frame (or b"")."""
        if not self._open_n:
            return b""
        self._open_n = 0
        obj: dict[str, Any] = {"command": "batch"}
        if self._open_emits:
            obj["emits"] = self._open_emits
            self._open_emits = []
        if self._open_acks:
            obj["acks"] = self._open_acks
            self._open_acks = []
        if self._open_fails:
            obj["fails"] = self._open_fails
            self._open_fails = []
        try:
            return self._frame(obj)
        except LocalProtocolError as exc:  # the batch is dropped; say which emit broke it
            raise name_unencodable(obj.get("emits", ()), exc, self._frame) from None

    def _batch_full(self, n: int = 1) -> bytes:
        """``n`` elements joined the open batch: close it if it is full (§9.5)."""
        self._open_n += n
        if self._open_n >= _BATCH_MAX:
            return self.close_batch()
        return b""

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

    # -- the writer, chosen once at the pid reply (§9.2) ----------------------
    #
    # The pid reply fixes the wire for the rest of the connection: JSON or
    # msgpack frames (§9.6), output batches or not (§9.5). _choose_writer
    # binds the _write_* methods then; the send paths check a message and
    # hand it to them, testing no mode per call.

    def _choose_writer(self) -> None:
        batch = self.batching
        #: An emit that wants no task ids: (values, anchors or None, stream, id) -> bytes.
        self._write_emit = self._emit_to_batch if batch else self._emit_frame
        #: Emits on the default stream, as [values(, anchors)] elements: (elements, count) -> bytes.
        self._write_emits = self._batch_full_of_emits if batch else self._emit_frames
        #: Acks or fails of ids already retired: (ids, fail) -> bytes.
        self._write_ids = self._batch_full_of_ids if batch else self._id_frames if self.msgpack else self._json_id_frames
        #: Host: tuples to a bolt, all or none: (tuples, max_size) -> [(frame, tuples)].
        self._write_tuples = (
            self._send_each if self._component_side  # a component sends no tuples: refused there
            else self._send_batches if batch else self._send_each if self.msgpack else self._send_plain_tuples
        )

    @staticmethod
    def _emit_obj(values: list[Any], anchors: list[str] | None, stream: str, id: Any, task: int | None = None,
                  need_task_ids: bool = False) -> dict[str, Any]:
        """The wire dict of an emit (§3.5, §4.3)."""
        obj: dict[str, Any] = {"command": "emit", "tuple": values}
        if stream != DEFAULT_STREAM:
            obj["stream"] = stream
        if anchors:
            obj["anchors"] = anchors
        if id is not None:
            obj["id"] = id
        if task is not None:
            obj["task"] = task
        if not need_task_ids:
            obj["need_task_ids"] = False
        return obj

    def _emit_frame(self, values: list[Any], anchors: list[str] | None, stream: str, id: Any) -> bytes:
        return self._frame(self._emit_obj(values, anchors, stream, id))

    def _emit_to_batch(self, values: list[Any], anchors: list[str] | None, stream: str, id: Any) -> bytes:
        # §9.5: [tuple, anchors_or_id, stream], the last elements optional
        second = anchors or id
        if stream != DEFAULT_STREAM:
            self._open_emits.append([values, second, stream])
        elif second is not None:
            self._open_emits.append([values, second])
        else:
            self._open_emits.append([values])
        return self._batch_full()

    def _emit_frames(self, elems: Iterable[Any], n: int) -> bytes:
        frame, obj = self._frame, self._emit_obj
        return b"".join([frame(obj(e[0], e[1] if len(e) > 1 else None, DEFAULT_STREAM, None)) for e in elems])

    def _batch_full_of_emits(self, elems: Iterable[Any], n: int) -> bytes:
        self._open_emits.extend(elems)
        return self._batch_full(n)

    def _id_frames(self, ids: Iterable[str], fail: bool) -> bytes:
        frame, command = self._frame, "fail" if fail else "ack"
        return b"".join([frame({"command": command, "id": i}) for i in ids])

    def _json_id_frames(self, ids: Iterable[str], fail: bool) -> bytes:
        if fail:
            return self._id_frames(ids, fail)
        dumps = orjson.dumps  # the ids are pending, so strings: orjson encodes them
        return b"".join([_ACK_FORMAT % dumps(i) for i in ids])

    def _batch_full_of_ids(self, ids: Collection[str], fail: bool) -> bytes:
        (self._open_fails if fail else self._open_acks).extend(ids)
        return self._batch_full(len(ids))

    def _send_each(self, tuples: list[Tuple], max_size: int | None = None) -> list[tuple[bytes, list[Tuple]]]:
        """Standard frames, one :meth:`send` per tuple; all or none."""
        out = []
        try:
            for t in tuples:
                out.append((self.send(t), [t]))
        except BaseException:
            self._unsend(out)
            raise
        return out

    def _unsend(self, sent: list[tuple[bytes, list[Tuple]]]) -> None:
        """Undo what sending these frames recorded: their ids were admitted
        by this call, so were not pending before it (§3.6 ``ids.unique``)."""
        self.pending.difference_update([t[0] for _, ts in sent for t in ts])

    def _send_plain_tuples(self, tuples: list[Tuple], max_size: int | None = None) -> list[tuple[bytes, list[Tuple]]]:
        """Standard JSON frames without a call per tuple: encoded first, then
        admitted in one ledger call, all or none (§3.1, §3.6). Anything
        irregular (a tick, an id that is not a string or is pending, values
        orjson cannot encode) goes to the general path, which names it."""
        dumps = orjson.dumps
        out = []
        append = out.append
        try:
            for t in tuples:
                if t.__class__ is not Tuple or t[0].__class__ is not str:
                    raise TypeError
                append((dumps({"id": t[0], "comp": t[1], "stream": t[2], "task": t[3], "tuple": t[4]}) + TERMINATOR,
                        [t]))
            self.ledger.admit([t[0] for t in tuples], LocalProtocolError, tuples)
        except (TypeError, ProtocolError):  # integers beyond 64 bits, or a clear error: the general path
            return self._send_each(tuples)
        return out

    def _send_batches(self, tuples: list[Tuple], max_size: int | None = None) -> list[tuple[bytes, list[Tuple]]]:
        """Tuple batch frames (§9.5), halved while one exceeds ``max_size``; all or none."""
        if len(tuples) <= 1:
            return self._send_each(tuples)
        batch = TupleBatch(tuples=tuples)
        frame = self._frame(encode_json(batch))
        if max_size is not None and len(frame) > max_size:
            mid = len(tuples) // 2
            first = self._send_batches(tuples[:mid], max_size)
            try:
                return first + self._send_batches(tuples[mid:], max_size)
            except BaseException:
                self._unsend(first)
                raise
        self._may_send(TupleBatch, batch)
        self._check(batch, remote=False, frame=batch)
        return [(frame, tuples)]

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

    def bolt_fast_paths(self, out: list[bytes], emit: Callable[..., Any], ack: Callable[[Any], None],
                        implicit: Callable[[], Any] | None = None) -> tuple[Callable[..., Any], Callable[[Any], None]]:
        """Component bolt: ``(emit, ack)`` functions for the per-tuple hot path.

        They take the arguments of :meth:`multilang.Bolt.emit` and
        :meth:`multilang.Bolt.ack` and append frames to ``out``; an emit with
        ``anchors=None`` takes ``implicit()``'s (a BasicBolt's current input). The common
        case (ready, default stream, one anchor given as a pending
        :class:`Tuple` or id, no task ids wanted) is checked here as
        :meth:`send_emit` / :meth:`send_ack` would (§3.5, §3.6), and encoded
        in line as a JSON frame or handed to the writer the pid reply chose;
        anything else is passed to the ``emit`` / ``ack`` given, the general
        path. Closures, so that a bolt can bind them as its own methods: a
        Python call layer per emit and per ack is a tenth of the
        component's time (bench/). Built for the wire the pid reply chose
        (§9.2): before it, ``emit`` and ``ack`` come back as given.
        """
        if self._state is not State.READY or not self._bolt_component:
            return emit, ack
        pending = self.pending
        remove = pending.remove
        dumps = orjson.dumps
        append = out.append
        conn = self
        # Standard JSON: frames from pre-encoded pieces, in line. The
        # last tuple emitted to, its id and the id's JSON: the ack that
        # usually follows reuses them instead of indexing and encoding again.
        plain = not self.batching and not self.msgpack
        write_emit, write_ids = self._write_emit, self._write_ids
        last_tup: Any = None
        last_id: Any = None
        last_enc = b""

        def fast_emit(values: Any, stream: Any = None, anchors: Any = None, direct_task: Any = None,
                      need_task_ids: bool = False) -> Any:
            nonlocal last_tup, last_id, last_enc
            if anchors is None and implicit is not None:
                anchors = implicit()
            if stream is not None or direct_task is not None or need_task_ids or anchors.__class__ is not list:
                return emit(values, stream, anchors, direct_task, need_task_ids)
            try:  # not exactly one anchor: ValueError; pending holds id strings, an unhashable anchor raises
                (t,) = anchors
                a = t[0] if t.__class__ is Tuple else t
                if a in pending and values.__class__ is list and conn._ready:
                    if plain:  # the frame from pre-encoded pieces: no dict
                        enc_values = dumps(values)
                        if 117 in enc_values and enc_values.partition(b"null")[1]:  # _has_null, inlined
                            check_finite(values)  # orjson writes a NaN as null
                        last_enc = enc = dumps(a)
                        last_id = a
                        last_tup = t
                        append(_EMIT_FORMAT % (enc_values, enc))
                        return None
                    data = write_emit(values, [a], DEFAULT_STREAM, None)
                    if data:
                        append(data)
                    return None
            except (TypeError, ValueError):
                pass  # integers beyond 64 bits, or a clear error: the general path
            return emit(values, stream, anchors, direct_task, need_task_ids)

        def fast_ack(tup: Any) -> None:
            if tup is last_tup and conn._ready:  # the tuple just emitted to (standard JSON)
                try:
                    remove(last_id)
                except KeyError:
                    return ack(tup)  # acked twice: the general path names the mistake
                append(_ACK_FORMAT % last_enc)
                return
            if tup.__class__ is Tuple and conn._ready:
                tid = tup[0]
                try:
                    remove(tid)
                except (KeyError, TypeError):
                    return ack(tup)  # not pending: the general path names the mistake
                if plain:
                    append(_ACK_FORMAT % (last_enc if tid is last_id else dumps(tid)))
                else:
                    data = write_ids((tid,), False)
                    if data:
                        append(data)
                return
            ack(tup)

        return fast_emit, fast_ack

    def send_emits(self, values_list: list[Any], anchors_list: list[Any] | None = None) -> bytes:
        """Component bolt: many emits on the default stream, none wanting task
        ids. ``anchors_list[i]`` anchors ``values_list[i]``: a :class:`Tuple`,
        an id, a list of them, or None. Checked all first (§3.5), then one
        step into the output batch under ``batch`` (§9.5), else standard
        frames: all or none."""
        if anchors_list is None:
            anchors_list = [None] * len(values_list)
        elif len(anchors_list) != len(values_list):
            raise ValueError(f"{len(values_list)} emits but {len(anchors_list)} anchor entries")
        if not self._ready:  # the general path refuses the first
            return b"".join([self.send_emit(v if type(v) is list else list(v), anchors=anchor_ids(a),
                                            need_task_ids=False) for v, a in zip(values_list, anchors_list)])
        pending = self.pending
        kinds = set(map(type, anchors_list))
        if (kinds == _JUST_TUPLE or kinds == _JUST_STR) and set(map(type, values_list)) == _JUST_LIST:
            # one input tuple (or id) per emit: the common shape
            ids = list(map(_first, anchors_list)) if kinds == _JUST_TUPLE else anchors_list
            try:
                ok = pending.issuperset(ids)
            except TypeError:  # a Tuple whose id is unhashable: the loop below names it
                ok = False
            if ok:  # [values, [id]] elements, built in C: tuples encode as arrays
                return self._write_emits(zip(values_list, zip(ids)), len(ids))
        elems: list[list[Any]] = []
        append = elems.append
        # Standard frames: an element is encoded before the next one's anchors
        # are checked, so a refusal names what one call per element would.
        frames: list[bytes] | None = None if self.batching else []
        done = 0
        for values, a in zip(values_list, anchors_list):
            if type(values) is not list:
                values = list(values)
            if a is None:
                append([values])
                continue
            t = a[0] if type(a) is Tuple else a
            if type(t) is str and t in pending:
                append([values, [t]])
                continue
            ids = anchor_ids(a)  # as send_emit gets them: a Tuple is one anchor, whatever its id
            if frames is not None:
                frames.append(self._emit_frames(elems[done:], len(elems) - done))
                done = len(elems)
            self._check_anchors(ids, values)
            append([values, ids])
        if frames is None:
            return self._write_emits(elems, len(elems))
        frames.append(self._emit_frames(elems[done:], len(elems) - done))
        return b"".join(frames)

    def send_acks(self, tuple_ids: list[str], fail: bool = False) -> bytes:
        """Component bolt: ack (or fail) many pending tuples (§3.6), all or
        none; one step into the output batch under ``batch``, else standard
        frames."""
        if not self._ready:  # the general path refuses the first
            send = self.send_fail if fail else self.send_ack
            return b"".join([send(t) for t in tuple_ids])
        self.ledger.retire(tuple_ids, "fails" if fail else "acks", LocalProtocolError, tuple_ids)
        return self._write_ids(tuple_ids, fail)

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
            for e in msg.emits:
                anchors = e[1] if len(e) > 1 else None
                if anchors is None:
                    continue
                if type(anchors) is not list:
                    raise err("a batched bolt emit's anchors must be a list of tuple ids", frame=frame,
                              rule="frame.invalid")
                ledger.check_anchors(anchors, err, frame)
            if msg.acks:
                ledger.retire(msg.acks, "acks", err, frame)
            if msg.fails:
                ledger.retire(msg.fails, "fails", err, frame)
        elif msg.acks or msg.fails:
            raise err("a spout's batch carries no acks or fails (is a bolt program declared as a spout?)", frame=frame,
                      rule="frame.invalid")

