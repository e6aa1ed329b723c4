"""How a connection's checked messages become frames: its writers.

The pid reply fixes the wire for the rest of the connection (§9.2): JSON or
msgpack frames (§9.6), output batches or not (§9.5). ``_choose_writer`` binds
the ``_write_*`` methods then; the send paths of
:class:`~multilang.connection.Connection` check a message against the state
table and the ledger and hand it to them, testing no mode per call. A writer
records nothing a refusal would have to undo, except ``_send_*``, which undo
their own admissions (all or none).
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Iterable

import orjson

from ._state import Ledger, State
from .codec import encode_json, name_unencodable
from .errors import LocalProtocolError, ProtocolError
from .framing import TERMINATOR
from .messages import DEFAULT_STREAM, Tuple, TupleBatch

__all__ = ["Writers", "EMIT_FORMAT", "ACK_FORMAT"]

# Elements per output batch before it is closed: keeps a frame far below the
# size limit for ordinary tuples (§9.5).
_BATCH_MAX = 1024
# The per-tuple frames around their variable parts, which alone go through
# orjson (same bytes as encoding the whole dict). One formatting step (bytes
# %): one allocation, and fewer instructions than a join or concatenations
# (bench/instructions.py).
EMIT_FORMAT = b'{"command":"emit","tuple":%b,"anchors":[%b],"need_task_ids":false}' + TERMINATOR
ACK_FORMAT = b'{"command":"ack","id":%b}' + TERMINATOR


_NO_LIMIT = 1 << 62  # no max_size: an int, so the per-tuple size test compares two ints


def _too_large(frame: bytes, max_size: int, tup: Tuple) -> LocalProtocolError:
    """§1.3: a frame the reader would refuse is never written."""
    return LocalProtocolError(f"its frame of {len(frame)} bytes exceeds the reader's {max_size}-byte limit "
                              "(multilang.max.frame.bytes, §1.3)", subject=tup, rule="frame.too-large")


class Writers:
    """The writers of :class:`~multilang.connection.Connection` (a mixin:
    the attributes below are the connection's)."""

    batching: bool
    msgpack: bool
    ledger: Ledger
    pending: set[str]
    _state: State
    _component_side: bool
    _frame: Callable[[Any], bytes]
    _open_emits: list[Any]
    _open_acks: list[str]
    _open_fails: list[str]
    _open_n: int
    send: Callable[..., bytes]
    _may_send: Callable[[type, Any], None]
    _check: Callable[..., None]

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
        return b"".join([ACK_FORMAT % dumps(i) for i in ids])

    def _batch_full_of_ids(self, ids: Collection[str], fail: bool) -> bytes:
        (self._open_fails if fail else self._open_acks).extend(ids)
        return self._batch_full(len(ids))

    def _send_each(self, tuples: list[Tuple], max_size: int | None = None) -> list[tuple[bytes, list[Tuple]]]:
        """Standard frames, one :meth:`send` per tuple; all or none."""
        out = []
        try:
            for t in tuples:
                frame = self.send(t)
                out.append((frame, [t]))
                if max_size is not None and len(frame) > max_size:
                    raise _too_large(frame, max_size, t)
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
        limit = _NO_LIMIT if max_size is None else max_size
        out = []
        append = out.append
        try:
            for t in tuples:
                if t.__class__ is not Tuple or t[0].__class__ is not str:
                    raise TypeError
                frame = dumps({"id": t[0], "comp": t[1], "stream": t[2], "task": t[3], "tuple": t[4]}) + TERMINATOR
                if len(frame) > limit:
                    raise TypeError  # the general path refuses it, by name
                append((frame, [t]))
            self.ledger.admit([t[0] for t in tuples], LocalProtocolError, tuples)
        except (TypeError, ProtocolError):  # integers beyond 64 bits, or a clear error: the general path
            return self._send_each(tuples, max_size)
        return out

    def _send_batches(self, tuples: list[Tuple], max_size: int | None = None) -> list[tuple[bytes, list[Tuple]]]:
        """Tuple batch frames (§9.5), halved while one exceeds ``max_size``; all or none."""
        if len(tuples) <= 1:
            return self._send_each(tuples, max_size)
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
