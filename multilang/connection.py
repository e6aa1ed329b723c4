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
from typing import Any, Iterable

from ._state import SENDER, TRANSITIONS, Role, Side, State
from .codec import decode_component_frame, decode_host_frame, encode
from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from .framing import DEFAULT_MAX_FRAME_SIZE, FrameReader
from .messages import (
    Ack,
    Activate,
    ConnectionClosed,
    Emit,
    Fail,
    Handshake,
    Heartbeat,
    Message,
    Next,
    Pid,
    SpoutCommand,
    TaskIds,
    Tick,
    Tuple,
    UnknownCommand,
)

__all__ = ["Connection", "NEED_DATA", "Role", "Side", "State"]


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`Connection.next_event` when more bytes are needed.
NEED_DATA = _NeedData()

# How many recent heartbeat ids to remember, to name the mistake when a
# component acks one (its id is otherwise just "unknown").
_HEARTBEAT_MEMORY = 64


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
        self.state = State.HANDSHAKE
        self._table = TRANSITIONS[role]
        self._sender = SENDER[role]
        self._peer = Side.COMPONENT if side is Side.HOST else Side.HOST
        self._reader = FrameReader(max_frame_size)
        self._decode = (
            decode_component_frame
            if side is Side.HOST
            else (lambda body: decode_host_frame(body, spout=role is Role.SPOUT))
        )
        self._bodies: deque[bytes | _Failed | Message] = deque()
        self._stash: deque[Message] = deque()  # component side: events set aside by next_task_ids
        #: Emits that wanted task ids and have not had them (FIFO, §3.5).
        self.owed_task_ids = 0
        #: Bolt: ids of tuples sent (host) or received (component), not yet acked or failed.
        self.pending: set[str] = set()
        self._heartbeats: deque[str] = deque(maxlen=_HEARTBEAT_MEMORY)
        self._activated = False
        #: Extensions the component accepted in its pid reply (§9).
        self.extensions: tuple[str, ...] = ()
        #: The last frames received, for error messages.
        self.last_frames: deque[bytes] = deque(maxlen=3)

    # -- receiving -----------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer. ``b""`` means end of stream."""
        if data:
            try:
                self._bodies.extend(self._reader.feed(data))
            except ProtocolError as exc:
                # Frames completed before the bad one are still delivered first.
                self._bodies.extend(getattr(exc, "frames_before", ()))
                self._bodies.append(_Failed(exc))
        else:
            try:
                self._reader.close()
            except ProtocolError as exc:
                self._bodies.append(_Failed(exc))
            self._bodies.append(ConnectionClosed())

    def next_event(self) -> Message | _NeedData:
        """The next event from the peer, or :data:`NEED_DATA`."""
        if self._stash:
            return self._stash.popleft()
        return self._next_from_wire()

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
            self._stash.append(ev)

    def _next_from_wire(self) -> Message | _NeedData:
        if self.state is State.ERROR:
            raise RemoteProtocolError("connection is in an error state")
        if not self._bodies:
            return NEED_DATA
        item = self._bodies.popleft()
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
        new = self._table.get((self.state, t))
        if new is None:
            raise RemoteProtocolError(f"{t.__name__} is not legal in state {self.state.value}", frame=body)
        self._check(msg, remote=True, frame=body)
        self.state = new

    # -- sending ---------------------------------------------------------------

    def send(self, msg: Message) -> bytes:
        """Check that we may send ``msg`` now, and return its bytes."""
        t = type(msg)
        if self._sender.get(t) is not self.side:
            raise LocalProtocolError(f"{self.side.value} may not send {t.__name__} to a {self.role.value}", frame=msg)
        new = self._table.get((self.state, t))
        if new is None:
            raise LocalProtocolError(f"{t.__name__} is not legal in state {self.state.value}", frame=msg)
        self._check(msg, remote=False, frame=msg)
        self.state = new
        return encode(msg)

    def send_many(self, msgs: Iterable[Message]) -> bytes:
        """Several frames as one write."""
        return b"".join([self.send(m) for m in msgs])

    # -- the rules that need memory -----------------------------------------

    def _check(self, msg: Message, *, remote: bool, frame: Any) -> None:
        err = RemoteProtocolError if remote else LocalProtocolError
        t = type(msg)
        # Who "sent" the message relative to the bookkeeping: the component
        # side of a bolt tracks tuples it received, the host those it sent.
        if t is Tuple or t is Tick:
            if msg.id in self.pending:
                raise err(f"tuple id {msg.id!r} is already pending", frame=frame)
            self.pending.add(msg.id)
        elif t is Heartbeat:
            self._heartbeats.append(msg.id)
        elif t is Emit:
            for a in msg.anchors:
                if a not in self.pending:
                    raise err(self._unknown_id("anchors to", a), frame=frame)
            if msg.task is None and msg.need_task_ids:
                self.owed_task_ids += 1
        elif t is TaskIds:
            if self.owed_task_ids <= 0:
                raise err("task ids sent, but no emit is waiting for them", frame=frame)
            self.owed_task_ids -= 1
        elif t is Ack or t is Fail:
            if self.role is Role.BOLT:
                if type(msg.id) is not str:
                    raise err(f"{t.__name__.lower()} id must be the tuple id string, got {type(msg.id).__name__}", frame=frame)
                try:
                    self.pending.remove(msg.id)
                except KeyError:
                    raise err(self._unknown_id(t.__name__.lower() + "s", msg.id), frame=frame) from None
        elif t is Handshake:
            pass
        elif t is Pid:
            self.extensions = msg.extensions
        if isinstance(msg, SpoutCommand) and self.role is Role.SPOUT:
            if t is Activate:
                self._activated = True
            elif not self._activated and not remote:
                raise err("the first command to a spout must be activate (§4.1)", frame=frame)

    def _unknown_id(self, verb: str, tid: str) -> str:
        if tid in self._heartbeats:
            return f"component {verb} heartbeat id {tid!r}; heartbeats are answered with sync, never acked (§5.1)"
        return f"component {verb} id {tid!r}, which is not a pending tuple (unknown or already acked/failed)"

