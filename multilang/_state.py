"""The legal transitions of a multilang connection, in one table (h11 ``_state``).

A connection has one state, shared by both parties. Each message has exactly
one legal sender per role; a message from the wrong side, or in a state with
no row for it, is a protocol error (Local if we tried to send it, Remote if
we received it). The table is the spec: spec/PROTOCOL.md §2-§4 cite it.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any, Collection, Iterable

from .messages import (
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

__all__ = ["Role", "Side", "State", "SENDER", "TRANSITIONS", "ALLOWED", "PIPELINED", "SPOUT_COUNTED", "Ledger",
           "StateLedger", "STATE_RULES",
           "HEARTBEAT_MEMORY"]


class Role(enum.Enum):
    BOLT = "bolt"
    SPOUT = "spout"


class Side(enum.Enum):
    HOST = "host"
    COMPONENT = "component"


class State(enum.Enum):
    HANDSHAKE = "handshake"  # nothing sent yet: the host must send the handshake
    AWAIT_PID = "await-pid"  # handshake sent: only the pid reply is legal (§2.3)
    READY = "ready"  # bolt: tuples, emits, acks, ... in any interleaving
    IDLE = "idle"  # spout: no command outstanding
    BUSY = "busy"  # spout: a command is outstanding until its one sync (§4.2)
    CLOSED = "closed"
    ERROR = "error"


H, C = Side.HOST, Side.COMPONENT

SENDER: dict[Role, dict[type, Side]] = {
    Role.BOLT: {
        Handshake: H, Tuple: H, Tick: H, Heartbeat: H, TaskIds: H, TupleBatch: H,
        Pid: C, Emit: C, Ack: C, Fail: C, Log: C, Error: C, Metrics: C, Sync: C, Batch: C,
        UnknownCommand: C,
        StateInit: H, StatePrepare: H, StateCommit: H, StateRollback: H, StatePrepared: C,  # §9.7
    },
    Role.SPOUT: {
        Handshake: H, Activate: H, Deactivate: H, Next: H, Ack: H, Fail: H, TaskIds: H,
        UnknownCommand: H,  # a component answers it with sync (§4.5); a host never sends one
        Pid: C, Emit: C, Log: C, Error: C, Metrics: C, Sync: C, Batch: C,
    },
}  # fmt: skip

_BOLT_READY = (Tuple, Tick, Heartbeat, TaskIds, Emit, Ack, Fail, Log, Error, Metrics, Sync, UnknownCommand,
               TupleBatch, Batch, StateInit, StatePrepare, StatePrepared, StateCommit, StateRollback)
_SPOUT_COMMANDS = (Activate, Deactivate, Next, Ack, Fail, UnknownCommand)
#: What the ledger counts on a spout's connection (``Ledger.command``)
SPOUT_COUNTED = frozenset((*_SPOUT_COMMANDS, Sync))
# Emits, logs, ... are legal at any time after the pid: during open (before
# the first command, §4.4) and while a command is outstanding.
_SPOUT_ANYTIME = (Emit, Log, Error, Metrics, TaskIds, Batch)

TRANSITIONS: dict[Role, dict[tuple[State, type], State]] = {
    Role.BOLT: {
        (State.HANDSHAKE, Handshake): State.AWAIT_PID,
        (State.AWAIT_PID, Pid): State.READY,
        **{(State.READY, m): State.READY for m in _BOLT_READY},
    },
    Role.SPOUT: {
        (State.HANDSHAKE, Handshake): State.AWAIT_PID,
        (State.AWAIT_PID, Pid): State.IDLE,
        **{(State.IDLE, m): State.BUSY for m in _SPOUT_COMMANDS},
        (State.BUSY, Sync): State.IDLE,
        **{(s, m): s for s in (State.IDLE, State.BUSY) for m in _SPOUT_ANYTIME},
    },
}

#: TRANSITIONS by role, then by state: each message legal there -> the state it leads to
ALLOWED: dict[Role, dict[State, dict[type, State]]] = {}
for _role, _table in TRANSITIONS.items():
    for (_state, _msg), _new in _table.items():
        ALLOWED.setdefault(_role, {}).setdefault(_state, {})[_msg] = _new

#: A spout that accepted ``batch`` (§9.5): the host may send a command while
#: others are outstanding (pipelined). The ledger counts them
#: (``commands_out``); a sync leads back to IDLE only when it answers the last.
PIPELINED: dict[State, dict[type, State]] = {
    **ALLOWED[Role.SPOUT],
    State.BUSY: {**ALLOWED[Role.SPOUT][State.BUSY], **{m: State.BUSY for m in _SPOUT_COMMANDS}},
}


# --- the rules that need memory (§3.4-§3.6, §4.1, §5.1) -----------------------------
#
# Each is written once, here, as a set operation that costs the same for one
# id or a thousand; every path of connection.py calls it. The per-tuple fast
# paths (_fast_paths.py) test the common case inline (``tid in pending``) and call the
# ledger for anything else, so an error always comes from here; each fast
# path has a differential property test against the general path
# (tests/unit/test_fast_paths.py).

#: How many recent heartbeat ids to remember, to name the mistake when a
#: component acks one (its id is otherwise just "unknown").
HEARTBEAT_MEMORY = 64


class Ledger:
    """What a connection must remember to enforce the protocol.

    ``pending``: a bolt's tuple ids sent (host) or received (component),
    not yet acked or failed. ``owed_task_ids``: emits that wanted task ids
    and have not had them (FIFO, §3.4). Every method takes the error class
    of the side that would break the rule (h11: Local if we tried to,
    Remote if the peer did) and the frame to show; each error carries its
    rule id (spec/vectors/README.md "Rules")."""

    __slots__ = ("pending", "owed_task_ids", "heartbeats", "activated", "commands_out", "state")

    def __init__(self) -> None:
        self.pending: set[str] = set()
        self.owed_task_ids = 0
        self.heartbeats: deque[str] = deque(maxlen=HEARTBEAT_MEMORY)
        self.activated = False
        #: spout commands sent (host) or received (component) whose sync has not come:
        #: at most 1, or more when pipelined (PIPELINED, §9.5)
        self.commands_out = 0
        #: §9.7, once ``state`` is accepted; None without the extension
        self.state: StateLedger | None = None

    def admit(self, ids: Collection[str], err: type, frame: Any) -> None:
        """§3.1, §3.6: the ids of tuples handed over become pending; each
        must be new and appear once (rule ``ids.unique``). All or none."""
        if self.state is not None and self.state.initializing:
            raise self.state.before_init(err, frame)
        pending = self.pending
        if pending.isdisjoint(ids):
            before = len(pending)
            pending.update(ids)
            if len(pending) == before + len(ids):
                return
            pending.difference_update(ids)  # an id twice in one batch: none of them was pending
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        else:
            dup = next(i for i in ids if i in pending)
        raise err(f"tuple id {dup!r} is already pending", frame=frame, rule="ids.unique")

    def retire(self, ids: Collection[Any], verb: str, err: type, frame: Any) -> None:
        """§3.6: ack or fail (``verb`` "acks" / "fails") only the exact id
        string of a pending tuple, once (rules ``ids.string-echo``,
        ``ids.known``, ``heartbeat.never-acked``). All or none."""
        pending = self.pending
        try:
            ok = pending.issuperset(ids)
        except TypeError:  # an unhashable id: certainly not one we sent
            ok = False
        if ok:
            before = len(pending)
            pending.difference_update(ids)
            if before - len(pending) == len(ids):
                return
            pending.update(ids)  # an id twice in one call: undo (each was pending)
        # Refused: name the first bad id in order, a repeat included, as the
        # ids acked one frame at a time would (§9.5: a batch's effect is
        # that of its elements as standard frames, in array order).
        seen: set[str] = set()
        for i in ids:
            if type(i) is not str or i not in pending:
                raise self.unknown(i, verb, err, frame)
            if i in seen:
                raise err(f"component {verb} the same tuple twice in one batch", frame=frame, rule="ids.known")
            seen.add(i)
        raise AssertionError("unreachable: ids not all pending, yet none bad")  # pragma: no cover

    def check_anchors(self, ids: Iterable[Any], err: type, frame: Any) -> None:
        """§3.5: an emit may anchor only to tuples still pending (rule ``anchors.known``)."""
        pending = self.pending
        for a in ids:
            if type(a) is not str or a not in pending:
                raise self.unknown(a, "anchors to", err, frame)

    def unknown(self, tid: Any, verb: str, err: type, frame: Any) -> Exception:
        """The error for an id that is not pending, naming the likely mistake."""
        if type(tid) is not str:
            return err(f"component {verb} id {tid!r} ({type(tid).__name__}): tuple ids must be echoed as the exact "
                       "string received (§3.6)", frame=frame, rule="ids.string-echo", subject=tid)
        if tid in self.heartbeats:
            return err(f"component {verb} heartbeat id {tid!r}; heartbeats are answered with sync, never acked, "
                       "failed or anchored to (§3.2, §5.1)", frame=frame, rule="heartbeat.never-acked", subject=tid)
        rule = "anchors.known" if verb == "anchors to" else "ids.known"
        return err(f"component {verb} id {tid!r}, which is not a pending tuple (unknown or already acked/failed)",
                   frame=frame, rule=rule, subject=tid)

    def owe(self, n: int = 1) -> None:
        """§3.4: ``n`` emits want task ids."""
        self.owed_task_ids += n

    def pay(self, err: type, frame: Any) -> None:
        """§3.4: a task-id list answers the oldest emit that wanted one (rule ``task-ids.owed``)."""
        if self.owed_task_ids <= 0:
            raise err("task ids sent, but no emit is waiting for them", frame=frame, rule="task-ids.owed")
        self.owed_task_ids -= 1

    def accept(self, accepted: tuple[str, ...], offered: tuple[str, ...], bolt: bool, err: type, frame: Any) -> None:
        """§9.2: a pid reply accepts only extensions offered, each once
        (rule ``handshake.extensions``); ``state`` only a bolt (§9.7)."""
        bad = [e for e in accepted if e not in offered]
        if bad or len(set(accepted)) != len(accepted):
            raise err(f"accepted extensions {list(accepted)} that were not offered ({list(offered)}) "
                      "or twice (§9.2)", frame=frame, rule="handshake.extensions")
        if "state" in accepted:
            if not bolt:
                raise err("a spout accepted the state extension, which is for bolts only (§9.7)", frame=frame,
                          rule="handshake.extensions")
            self.state = StateLedger()

    def state_frame(self, msg: Any, err: type, frame: Any) -> None:
        """§9.7: a state frame needs the extension (rule ``state.negotiated``), then its order."""
        if self.state is None:
            raise err("a state frame without the state extension (§9.7)", frame=frame, rule="state.negotiated")
        self.state.check(msg, err, frame)

    def command(self, t: type, host: bool, err: type, frame: Any) -> None:
        """A spout command (``host``: we are the host, sending it) or its
        sync: §4.1, the first command a host sends a spout is activate (rule
        ``spout.activate-first``); §4.2, each sync answers one outstanding
        command (the state table says when one may be sent)."""
        if t is Sync:
            self.commands_out -= 1
            return
        if host:
            if t is Activate:
                self.activated = True
            elif not self.activated:
                raise err("the first command to a spout must be activate (§4.1)", frame=frame,
                          rule="spout.activate-first")
        self.commands_out += 1


class StateLedger:
    """The order of the state extension's frames (§9.7, rule ``state.order``):
    the whole ``init`` before anything else, one ``prepare`` answered at a
    time, a ``commit`` naming the last answered one; chunks (``more``) never
    repeat a key."""

    __slots__ = ("initializing", "asked", "answered", "_chunk_keys")

    def __init__(self) -> None:
        self.initializing = True  # until the last chunk of init
        self.asked: int | None = None  # the unanswered prepare's txid
        self.answered: int | None = None  # the last answered prepare, until its commit or a rollback
        self._chunk_keys: set[str] = set()  # keys of the chunks so far of a chunked init / prepared

    def before_init(self, err: type, frame: Any) -> Exception:
        return err("a tuple or heartbeat before the whole state init (§9.7)", frame=frame, rule="state.order")

    def check(self, msg: Any, err: type, frame: Any) -> None:
        t = type(msg)
        if t is StateInit:
            if not self.initializing:
                raise err("a second state init (§9.7)", frame=frame, rule="state.order")
            self._chunk(msg.state, msg.more, err, frame)
            self.initializing = msg.more
            return
        if self.initializing:
            raise err(f"state {t.__name__} before the whole init (§9.7)", frame=frame, rule="state.order")
        if t is StatePrepare:
            if self.asked is not None:
                raise err(f"state prepare {msg.txid} while prepare {self.asked} is unanswered (§9.7)", frame=frame,
                          rule="state.order")
            self.asked = msg.txid
        elif t is StatePrepared:
            if self.asked != msg.txid:
                what = "no prepare is unanswered" if self.asked is None else f"prepare {self.asked} is unanswered"
                raise err(f"state prepared {msg.txid}, but {what} (§9.7)", frame=frame, rule="state.order")
            self._chunk(msg.put, msg.more, err, frame, msg.delete)
            if not msg.more:
                self.asked, self.answered = None, msg.txid
        elif t is StateCommit:
            if self.answered != msg.txid:
                raise err(f"state commit {msg.txid}, but the last answered prepare is {self.answered} (§9.7)",
                          frame=frame, rule="state.order")
            self.answered = None
        else:  # StateRollback: any time after init; an unanswered prepare is still answered
            self.answered = None

    def _chunk(self, keys: dict[str, Any], more: bool, err: type, frame: Any, deleted: list[str] = ()) -> None:
        seen = self._chunk_keys
        if seen or more:
            fresh = keys.keys() | set(deleted)
            if not seen.isdisjoint(fresh):
                raise err(f"state key(s) {sorted(seen & fresh)[:3]} in two chunks (§9.7)", frame=frame,
                          rule="state.invalid")
            seen |= fresh
        if not more:
            seen.clear()


#: The rule id of a message out of place, by (role, state, message type);
#: type None: any message in that state (§2.3, §4.2). Anything else is
#: ``protocol.state``.
STATE_RULES: dict[tuple[Role, State, type | None], str] = {
    (Role.BOLT, State.AWAIT_PID, None): "handshake.pid-first",
    (Role.SPOUT, State.AWAIT_PID, None): "handshake.pid-first",
    (Role.SPOUT, State.IDLE, Sync): "spout.one-sync",
}
