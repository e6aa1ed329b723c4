"""A connection's per-tuple fast paths, next to their differential test
(tests/unit/test_fast_paths.py).

Each short-cuts a general path of :class:`~multilang.connection.Connection`
for the common shape of a frame or a call, and checks exactly what that path
would check (§3.1, §3.5, §3.6, §9.5): the first frame or element of any
other shape stops the pass and goes the general way, so the same bytes mean
the same whichever path reads them. The differential test drives both paths
with the same input in every mode and compares bytes, events, state and
errors.
"""

from __future__ import annotations

from functools import partial
from operator import itemgetter
from typing import Any, Callable

import orjson

from ._state import Ledger, Role, State
from ._writers import ACK_FORMAT, EMIT_FORMAT
from .codec import _new_tuple, check_finite
from .errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from .messages import DEFAULT_STREAM, HEARTBEAT_STREAM, TICK_STREAM, Batch, Tuple, anchor_ids

__all__ = ["FastPaths"]

_SYSTEM_STREAMS = frozenset((HEARTBEAT_STREAM, TICK_STREAM))
_JUST_LIST, _JUST_FIVE, _JUST_STR, _JUST_INT = {list}, {5}, {str}, {int}
_make_tuple = partial(_new_tuple, Tuple)  # a Tuple from a [id, comp, stream, task, values] row
_JUST_TUPLE = {Tuple}
_first = itemgetter(0)  # a Tuple's id


class FastPaths:
    """The per-tuple paths of :class:`~multilang.connection.Connection` (a
    mixin: the attributes below are the connection's)."""

    role: Role
    batching: bool
    msgpack: bool
    ledger: Ledger
    pending: set[str]
    _state: State
    _ready: bool
    _bolt_component: bool
    _component_side: bool
    _bodies: list[Any]
    _pos: int
    _stash: Any
    _loads: Callable[[Any], Any]
    last_frames: Any

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
                    emits.append([values, anchors or None, DEFAULT_STREAM if stream is None else stream])
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
                        append(EMIT_FORMAT % (enc_values, enc))
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
                append(ACK_FORMAT % last_enc)
                return
            if tup.__class__ is Tuple and conn._ready:
                tid = tup[0]
                try:
                    remove(tid)
                except (KeyError, TypeError):
                    return ack(tup)  # not pending: the general path names the mistake
                if plain:
                    append(ACK_FORMAT % (last_enc if tid is last_id else dumps(tid)))
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
