"""The legal transitions of a multilang connection, in one table (h11 ``_state``).

A connection has one state, shared by both parties. Each message has exactly
one legal sender per role; a message from the wrong side, or in a state with
no row for it, is a protocol error (Local if we tried to send it, Remote if
we received it). The table is the spec: spec/PROTOCOL.md §2-§4 cite it.
"""

from __future__ import annotations

import enum

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
    Sync,
    TaskIds,
    Tick,
    Tuple,
    TupleBatch,
    UnknownCommand,
)

__all__ = ["Role", "Side", "State", "SENDER", "TRANSITIONS"]


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
    },
    Role.SPOUT: {
        Handshake: H, Activate: H, Deactivate: H, Next: H, Ack: H, Fail: H, TaskIds: H,
        UnknownCommand: H,  # a component answers it with sync (§4.5); a host never sends one
        Pid: C, Emit: C, Log: C, Error: C, Metrics: C, Sync: C, Batch: C,
    },
}  # fmt: skip

_BOLT_READY = (Tuple, Tick, Heartbeat, TaskIds, Emit, Ack, Fail, Log, Error, Metrics, Sync, UnknownCommand,
               TupleBatch, Batch)
_SPOUT_COMMANDS = (Activate, Deactivate, Next, Ack, Fail, UnknownCommand)
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
