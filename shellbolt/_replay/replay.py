"""Replay one task's recorded process session against a command, standalone,
and compare its output with the recording (``multilang replay``).

    sel = select(DIR, "split", task=None, session=None)     # ReplayUsageError: exit 2
    outcome = trio.run(replay, sel, ["ruby", "ruby/split_bolt.rb"], cwd, 10.0)
    print(outcome.text); exit(outcome.code)                  # 0 same, 1 different / crashed / hung

The recording (``record.py``) holds the pipe bytes both ways. :func:`plan`
re-frames them with the sans-IO core (``multilang.framing`` readers, the
``multilang.codec`` decoders; the pid reply decides JSON or msgpack, §9.6)
into the host's messages and the component's events, and notes, before
each host write, how far the component had got: which tuples it had acked
or failed, how many syncs and state ``prepared`` replies it had sent.

:func:`replay` then plays the host with a :class:`ShellProcess` (a host-side
:class:`~multilang.connection.Connection`: every rule and the frame size
limit of a real run apply): the recorded handshake (conf and context, a
fresh private pid directory), then each recorded write in order, each one
only once the command has got as far as the recorded component had when
the host wrote it. That paces the replay as the run was paced: a spout's
``next`` waits for the ``sync`` of the command before it, a heartbeat's
sync is awaited where the host saw it, a bolt gets tuples in the bursts and
the windows it got them in. An emit that wants task ids gets the recorded
reply (the k-th such emit the k-th list). Then stdin is closed and the
output read to its end.

Comparison (docs/OBSERVE.md "Record and replay"): the component's emits,
acks and fails become events keyed by the input they belong to. A bolt's
emit belongs to each tuple it anchors to (its anchors as a set), an ack or
fail to its tuple, an unanchored emit to one sequence of its own; a
spout's emits belong to the command they answer (counted by syncs). Per
key the events must be equal and in the same order; across keys order is
free (the acker cannot tell, §6.1), and so is framing (a §9.5 batch is its
events in order; JSON and msgpack values compare as values). Logs, errors,
metrics, syncs, pids and timing are not compared. A tuple the recorded
process never acked or failed (the session ended first) need only start
with what was recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

import orjson
import trio

from multilang.codec import decode_component_frame, decode_host_frame, msgpack_loads
from multilang.codec import loads as json_loads
from multilang.connection import Role, State
from multilang.errors import ComponentCrashed, LocalProtocolError, ProtocolError
from multilang.framing import DEFAULT_MAX_FRAME_SIZE, FirstFrameCut, FrameReader, LengthPrefixedReader
from multilang.messages import (
    Ack, Batch, Emit, Fail, Handshake, Heartbeat, Message, Pid, StatePrepared, Sync, TaskIds, Tick, Tuple, TupleBatch,
)

from .._host import scratch
from .._host.process import ShellProcess
from .._model.conf import ProcessConf
from .record import COMPONENT, HOST, RecordingDamaged, RecordingError, Session, TaskLog, load_recording, read_task

__all__ = ["ReplayUsageError", "Selection", "Plan", "Outcome", "select", "plan", "replay", "resolve_argv"]

_CLIP = 300
_EXIT_WAIT = 2.0  # seconds a command gets to finish its output and exit after its stdin closed
_QUIET = 1.0  # at the end of the input, silence that means a command holds what it has not answered


class ReplayUsageError(Exception):
    """The replay cannot start: no such recording, component, task or session (exit 2)."""


# --- choosing what to replay -------------------------------------------------------------------------


@dataclass
class Selection:
    """One recorded session of one task, chosen by :func:`select`."""

    path: str
    component: str
    task: int
    role: Role
    log: TaskLog
    session: Session
    notes: list[str]


def _task_dirs(comp_dir: str) -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        names = os.listdir(comp_dir)
    except OSError:
        return out
    for name in names:
        if name.startswith("task-") and name[5:].lstrip("-").isdigit():
            out[int(name[5:])] = os.path.join(comp_dir, name)
    return out


def select(path: str, component: str, task: int | None = None, session: int | None = None,
           partial: bool = False) -> Selection:
    """The session to replay: ``session`` of ``task`` of ``component``, by
    default the last complete session of the component's only task that
    took tuples. A damaged or truncated segment raises RecordingDamaged
    unless ``partial``."""
    try:
        meta = load_recording(path)
    except RecordingError as exc:
        raise ReplayUsageError(str(exc)) from None
    comps = meta.get("components") or {}
    shell = sorted(n for n, c in comps.items() if c.get("command"))
    if component not in comps:
        raise ReplayUsageError(f"component {component!r} is not in the recording {path}; recorded: {', '.join(shell)}")
    if not comps[component].get("command"):
        raise ReplayUsageError(f"component {component!r} runs inside the host (not a shell component): it has no "
                               f"frames to replay; recorded: {', '.join(shell)}")
    tasks = _task_dirs(os.path.join(path, component))
    if not tasks:
        raise ReplayUsageError(f"component {component!r}: no task of it was recorded in {path} (did the run start "
                               f"its processes?)")
    if task is None:
        if len(tasks) > 1:
            raise ReplayUsageError(f"component {component!r} ran {len(tasks)} tasks ({', '.join(map(str, sorted(tasks)))})"
                                   f": choose one with --task")
        task = next(iter(tasks))
    elif task not in tasks:
        raise ReplayUsageError(f"component {component!r} has no recorded task {task}; recorded tasks: "
                               f"{', '.join(map(str, sorted(tasks)))}")
    try:
        log = read_task(tasks[task], partial)
    except RecordingDamaged:
        raise
    except RecordingError as exc:
        raise ReplayUsageError(str(exc)) from None
    complete = log.complete
    if not complete:
        what = "every session's start was rotated away" if log.sessions else "no process session was recorded"
        raise ReplayUsageError(f"{component} task {task}: {what}; nothing to replay (a larger "
                               f"multilang.record.segment.bytes or multilang.record.segments keeps more)")
    numbers = [s.number for s in complete]
    role = Role.SPOUT if comps[component].get("kind") == "spout" else Role.BOLT
    notes = list(log.notes)
    if session is None:
        chosen = _last_with_tuples(complete, role)
        if chosen is not complete[-1]:
            idle = [s.number for s in complete if s.number > chosen.number]
            notes.append(f"{component} task {task}: session{'s' if len(idle) > 1 else ''} "
                         f"{', '.join(map(str, idle))} took no tuple; replaying the last one that did")
    elif session in numbers:
        chosen = log.sessions[session]
    else:
        why = "its start was rotated away" if session in log.sessions else "no such session"
        raise ReplayUsageError(f"{component} task {task}: session {session}: {why}; complete sessions: "
                               f"{', '.join(map(str, numbers))}")
    if len(log.sessions) > 1:
        notes.append(f"{component} task {task}: sessions {', '.join(map(str, numbers))} can be replayed "
                     f"(--session K); replaying session {chosen.number} (pid {chosen.pid})")
    return Selection(path=path, component=component, task=task, role=role, log=log, session=chosen, notes=notes)


def _last_with_tuples(complete: list[Session], role: Role) -> Session:
    """The default session: the last complete one, unless it is a bolt's
    that took no tuple (a process restarted near the end of the run, say),
    then the last that took one. A session that does not decode counts as
    one that did: replaying it says what is wrong with it."""
    if role is Role.SPOUT:
        return complete[-1]
    for s in reversed(complete):
        try:
            if plan(s, role).inputs:
                return s
        except ReplayUsageError:
            return s
    return complete[-1]


def resolve_argv(argv: list[str]) -> list[str]:
    """A leading ``python``/``python3`` is this interpreter, as in a topology file."""
    argv = list(argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


# --- reading a session: frames, then messages and events ------------------------------------------------


class _Stream:
    """One direction of a session, re-framed. The first frame (handshake or
    pid reply) is JSON; what follows is JSON or msgpack as the pid reply
    decides (§9.6), so it is held until :meth:`choose`."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._first: FirstFrameCut | None = FirstFrameCut(max_frame)
        self._reader: FrameReader | LengthPrefixedReader = FrameReader(max_frame)  # the first frame's

    def feed(self, data: bytes) -> list[bytes]:
        if self._first is None:
            return self._reader.feed(data) if data else self._reader.close()
        data = self._first.feed(data)
        return self._reader.feed(data) if data else []

    def choose(self, msgpack: bool) -> list[bytes]:
        self._reader = LengthPrefixedReader(self.max_frame) if msgpack else FrameReader(self.max_frame)
        rest = self._first.release() if self._first is not None else b""
        self._first = None
        return self._reader.feed(rest) if rest else []


def _canon(value: Any) -> str:
    """A value as canonical JSON text: compared as JSON values whatever the
    wire format (msgpack, JSON), object keys in any order; ``true`` is not
    ``1`` and ``1`` is not ``1.0`` (Python's ``==`` would say they are)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _anchor_list(a: Any) -> list[str]:
    if a is None:
        return []
    return [a] if isinstance(a, str) else list(a)


class _Tally:
    """A component's output as events keyed by the input they belong to
    (the comparison rules in the module docstring). The same code reads the
    recording and the live command."""

    def __init__(self, spout: bool) -> None:
        self.spout = spout
        self.by_key: dict[Any, list[tuple[Any, ...]]] = {}
        self.settles: list[str] = []
        self.settled: set[str] = set()
        self.syncs = 0
        self.prepared = 0
        self.emits = self.acks = self.fails = 0

    def _put(self, key: Any, event: tuple[Any, ...]) -> None:
        seq = self.by_key.get(key)
        if seq is None:
            seq = self.by_key[key] = []
        seq.append(event)

    def _emit(self, values: Any, stream: Any, second: Any, task: Any) -> None:
        self.emits += 1
        stream = stream or "default"
        if self.spout:
            self._put(("command", self.syncs), ("emit", stream, _canon(values), None if second is None else
                                                _canon(second), task))
            return
        anchors = sorted(set(_anchor_list(second)))
        event = ("emit", stream, _canon(values), tuple(anchors), task)
        for a in anchors:
            self._put(("tuple", a), event)
        if not anchors:
            self._put(("unanchored",), event)

    def _settle(self, tid: str, kind: str) -> None:
        if kind == "ack":
            self.acks += 1
        else:
            self.fails += 1
        self._put(("tuple", tid), (kind,))
        if tid not in self.settled:
            self.settled.add(tid)
            self.settles.append(tid)

    def add(self, ev: Any) -> int:
        """Take one event; returns 1 if it is an emit that wants task ids."""
        t = type(ev)
        if t is Batch:
            for values, second, stream in ev.emits:
                self._emit(values, stream, second, None)
            for tid in ev.acks:
                self._settle(tid, "ack")
            for tid in ev.fails:
                self._settle(tid, "fail")
        elif t is Emit:
            self._emit(ev.values, ev.stream, ev.id if self.spout else ev.anchors, ev.task)
            return 1 if ev.wants_task_ids else 0
        elif t is Ack:
            self._settle(ev.id, "ack")
        elif t is Fail:
            self._settle(ev.id, "fail")
        elif t is Sync:
            self.syncs += 1
        elif t is StatePrepared:
            self.prepared += 1
        return 0  # log, error, metrics, pid, unknown commands: not compared


@dataclass
class Step:
    """One recorded host write: its messages, and how far the component had
    got when it was written (acks/fails in recorded order, syncs, prepared)."""

    messages: list[Message]
    settled: int
    syncs: int
    prepared: int


@dataclass
class Plan:
    role: Role
    handshake: Handshake
    pid: Pid
    steps: list[Step]
    task_ids: list[list[int]]
    recorded: _Tally
    inputs: dict[str, Tuple] = field(default_factory=dict)  # bolt: tuple id -> the tuple, in sending order
    commands: list[str] = field(default_factory=list)  # spout: the commands sent, in order
    notes: list[str] = field(default_factory=list)
    broke: str | None = None  # the recorded process broke the protocol here
    ended: str = ""  # how the recorded session ended
    max_frame: int = DEFAULT_MAX_FRAME_SIZE  # the recorded conf's multilang.max.frame.bytes


def _ended(s: Session) -> str:
    if not s.ended:
        return "the recording ends while the process was running"
    st = s.status
    if st is None:
        return "the recorded process ended"
    return f"the recorded process exited with status {st}" if st >= 0 else f"the recorded process was killed by signal {-st}"


def plan(s: Session, role: Role) -> Plan:
    """Decode a recorded session into what to send and what to expect. The
    frame size limit is the recorded conf's (multilang.max.frame.bytes)."""
    spout = role is Role.SPOUT
    limit: Any = DEFAULT_MAX_FRAME_SIZE
    host, comp = _Stream(limit), _Stream(limit)
    host_loads: Any = json_loads
    comp_loads: Any = json_loads
    handshake: Handshake | None = None
    pid: Pid | None = None
    rec = _Tally(spout)
    steps: list[Step] = []
    task_ids: list[list[int]] = []
    inputs: dict[str, Tuple] = {}
    commands: list[str] = []
    broke: str | None = None
    for entry in s.entries:
        if entry.kind == HOST:
            try:
                bodies = host.feed(entry.data)
                msgs = [decode_host_frame(b, spout=spout, loads=host_loads) for b in bodies]
            except ProtocolError as exc:
                raise ReplayUsageError(f"session {s.number}: the recorded host frames do not decode: {exc}") from None
            out: list[Message] = []
            for m in msgs:
                t = type(m)
                if t is Handshake:
                    if handshake is None:
                        handshake = m
                        limit = m.conf.get("multilang.max.frame.bytes")
                        if type(limit) is not int or limit < 1:
                            limit = DEFAULT_MAX_FRAME_SIZE
                        host.max_frame = comp.max_frame = limit
                    continue
                if t is TaskIds:
                    task_ids.append(list(m.task_ids))  # answered when the command asks (FIFO, §3.4)
                    continue
                if t is TupleBatch:
                    for u in m.tuples:
                        inputs[u.id] = u
                elif t is Tuple or t is Tick:
                    inputs[m.id] = m
                elif spout:
                    commands.append(type(m).__name__.lower() + (f" {m.id!r}" if t in (Ack, Fail) else ""))
                out.append(m)
            if out:
                steps.append(Step(out, len(rec.settles), rec.syncs, rec.prepared))
        elif entry.kind == COMPONENT and broke is None:
            try:
                for body in comp.feed(entry.data):
                    ev = decode_component_frame(body, loads=comp_loads)
                    if type(ev) is Pid and pid is None:
                        pid = ev
                        offered = handshake.extensions if handshake else ()
                        msgpack = "msgpack" in ev.extensions and "msgpack" in offered
                        if msgpack:
                            host_loads = comp_loads = msgpack_loads
                        for body2 in comp.choose(msgpack):
                            rec.add(decode_component_frame(body2, loads=comp_loads))
                        for body2 in host.choose(msgpack):  # (the host writes nothing before the pid reply)
                            raise ReplayUsageError(f"session {s.number}: host bytes before the pid reply")
                        continue
                    rec.add(ev)
            except ProtocolError as exc:
                broke = f"the recorded process broke the protocol: {exc}"
    if handshake is None or pid is None:
        raise ReplayUsageError(f"session {s.number} (pid {s.pid}) has no complete handshake in the recording (the "
                               f"process never answered it?): nothing to replay")
    return Plan(role=role, handshake=handshake, pid=pid, steps=steps, task_ids=task_ids, recorded=rec, inputs=inputs,
                commands=commands, broke=broke, ended=_ended(s), max_frame=limit)


# --- the live replay ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a replay found: ``code`` 0 (no difference) or 1, and the text to print."""

    code: int
    text: str
    notes: list[str] = field(default_factory=list)


class _Stop(Exception):
    """The replay cannot go on: the command crashed, hung or refused a frame."""


def _clip(value: Any) -> str:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= _CLIP else text[:_CLIP] + "..."


def _show(ev: tuple[Any, ...], spout: bool) -> str:
    if ev[0] != "emit":
        return ev[0]
    _, stream, values, second, task = ev
    text = f"emit {values if len(values) <= _CLIP else values[:_CLIP] + '...'}"
    if stream != "default":
        text += f" on stream {stream!r}"
    if spout:
        text += f" id {second}" if second is not None else " (unreliable)"
    elif second:
        text += f" anchored to {', '.join(second)}"
    else:
        text += " unanchored"
    if task is not None:
        text += f" direct to task {task}"
    return text


class _Live:
    """The replay's state, shared by the stepping writer and the reader."""

    def __init__(self, p: Plan, proc: ShellProcess, timeout: float) -> None:
        self.plan = p
        self.proc = proc
        self.timeout = timeout
        self.tally = _Tally(p.role is Role.SPOUT)
        self.task_ids = list(p.task_ids)
        self.unpaired = 0
        self._settled_upto = 0
        self._changed = trio.Event()
        self.crash: Exception | None = None  # ComponentCrashed, as the reader or a write saw it
        self.closing = False
        self.eof = trio.Event()
        self.sent_tuples = 0
        self.sent_commands = 0
        self.last_sent: Message | None = None

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def read(self) -> None:
        proc = self.proc
        while True:
            try:
                events = await proc.read_events()
            except ComponentCrashed as exc:
                if not self.closing:
                    self.crash = exc
                self.eof.set()
                self._wake()
                return
            await self.take(events)

    async def take(self, events: list[Any]) -> None:
        replies: list[bytes] = []
        for ev in events:
            if self.tally.add(ev):
                if self.task_ids:
                    ids = self.task_ids.pop(0)
                else:
                    ids = []
                    self.unpaired += 1
                if reply := self.proc.task_ids_reply(ids):
                    replies.append(reply)
        if replies:
            await self.proc.write(b"".join(replies))
        self._wake()

    def _missing(self, settled: int, syncs: int, prepared: int) -> str | None:
        """What the command has not done yet that the recorded one had, or None."""
        p, t = self.plan, self.tally
        settles = p.recorded.settles
        while self._settled_upto < settled and settles[self._settled_upto] in t.settled:
            self._settled_upto += 1
        if self._settled_upto < settled:
            tid = settles[self._settled_upto]
            return f"its ack or fail of tuple {tid} {_clip(p.inputs[tid].values) if tid in p.inputs else ''}".rstrip()
        if t.syncs < syncs:
            return "a sync (the answer to " + ("a command" if t.spout else "a heartbeat") + f"; {syncs} recorded so far)"
        if t.prepared < prepared:
            return "its state 'prepared' reply (§9.7)"
        return None

    async def until(self, settled: int, syncs: int, prepared: int) -> None:
        since = trio.current_time()
        while True:
            if self.crash is not None:
                raise _Stop(self._crashed())
            missing = self._missing(settled, syncs, prepared)
            if missing is None:
                return
            deadline = max(since, self.proc.last_inbound) + self.timeout
            if trio.current_time() >= deadline:
                raise _Stop(f"the command sent nothing for {self.timeout:g}s while the replay waited for {missing}, "
                            f"which the recorded process had sent by then (hung? --timeout sets the wait){self._after()}")
            with trio.move_on_at(deadline):
                await self._changed.wait()

    async def settle(self, quiet: float) -> None:
        """At the end of the input: until the command has answered all of it
        (acked or failed every tuple, synced every command), or has been
        silent for ``quiet`` seconds (a bolt that holds tuples). A crash
        meanwhile is a crash during the replay, not the end of it."""
        t = self.tally
        if t.spout:
            def done() -> bool:
                return t.syncs >= self.sent_commands
        else:
            def done() -> bool:
                return t.settled.issuperset(self.plan.inputs)
        since = trio.current_time()
        while not done():
            if self.crash is not None:
                raise _Stop(self._crashed())
            deadline = max(since, self.proc.last_inbound) + quiet
            if trio.current_time() >= deadline:
                return
            with trio.move_on_at(deadline):
                await self._changed.wait()
        if self.crash is not None:
            raise _Stop(self._crashed())

    def _after(self) -> str:
        m = self.last_sent
        if m is None:
            return ""
        if isinstance(m, tuple):
            return f"; the last input sent: tuple {m[0]} {_clip(m[4])}"
        return f"; the last input sent: {type(m).__name__.lower()}"

    def _crashed(self) -> str:
        assert self.crash is not None
        return f"the command crashed during the replay{self._after()} ({self.plan.ended}): {self.crash}"

    def encode(self, msgs: list[Message], max_frame: int) -> bytes:
        conn = self.proc.conn
        parts: list[bytes] = []
        run: list[Tuple] = []

        def flush() -> None:
            if run:
                for frame, _ in conn.send_tuples(run, max_frame):
                    parts.append(frame)
                self.sent_tuples += len(run)
                self.last_sent = run[-1]
                run.clear()

        for m in msgs:
            t = type(m)
            if t is Tuple or t is Tick:
                run.append(m)  # type: ignore[arg-type]
                continue
            if t is TupleBatch:
                run.extend(m.tuples)  # type: ignore[attr-defined]
                continue
            flush()
            parts.append(conn.send(m))
            if t is not Heartbeat:
                self.sent_commands += 1
                self.last_sent = m
        flush()
        return b"".join(parts)


async def _play(p: Plan, live: _Live, proc: ShellProcess, max_frame: int) -> _Stop | None:
    """Play the host; the reason it had to stop early, or None."""
    stop: _Stop | None = None
    async with trio.open_nursery() as n:
        try:
            await _steps(p, live, proc, max_frame, n)
        except _Stop as exc:  # (caught here: raised out of the nursery it would come wrapped in a group)
            stop = exc
        n.cancel_scope.cancel()
    return stop


async def _crash_stop(live: _Live, exc: Exception) -> NoReturn:
    """The command died while the replay sent it input: stop, with the reader's account of it."""
    with trio.move_on_after(_EXIT_WAIT):
        await live.eof.wait()  # the reader's account names the exit status and stderr
    if live.crash is None:
        live.crash = exc
    raise _Stop(live._crashed()) from None


async def _steps(p: Plan, live: _Live, proc: ShellProcess, max_frame: int, n: trio.Nursery) -> None:
    hs = p.handshake
    try:
        early = await proc.start(n, hs.conf, hs.context, hs.extensions)  # (the recorded offer, §9.1)
    except ComponentCrashed as exc:
        raise _Stop(f"the command did not complete the handshake: {exc}") from None
    except Exception as exc:  # HeartbeatTimeout
        raise _Stop(f"the command did not answer the handshake: {exc}") from None
    if tuple(proc.conn.extensions) != tuple(p.pid.extensions):
        live_ext = list(proc.conn.extensions)
        p.notes.append(f"the recorded process accepted the extensions {list(p.pid.extensions)}, the command "
                       f"{live_ext}: compared as events all the same")
    await live.take(early)
    n.start_soon(live.read)
    for step in p.steps:
        await live.until(step.settled, step.syncs, step.prepared)
        try:
            data = live.encode(step.messages, max_frame)
        except LocalProtocolError as exc:
            if proc.conn.state is not State.CLOSED:
                raise _Stop(f"the recorded input cannot be sent to this command: {exc}") from None
            await _crash_stop(live, exc)  # its stdout closed between the wait and this step: a crash
        try:
            await proc.write(data)
        except ComponentCrashed as exc:
            await _crash_stop(live, exc)
    rec = p.recorded
    await live.until(len(rec.settles), rec.syncs, rec.prepared)
    await live.settle(min(live.timeout, _QUIET))
    live.closing = True  # the end of the input: what comes now is the command's last output
    try:
        await proc.proc.stdin.aclose()  # type: ignore[union-attr]
    except trio.BrokenResourceError:
        pass
    with trio.move_on_after(_EXIT_WAIT):
        await live.eof.wait()


def _compare(p: Plan, live: _Tally) -> str | None:
    """The first difference as text, or None."""
    rec = p.recorded
    spout = p.role is Role.SPOUT
    if spout:
        keys = [("command", i) for i in range(max(len(p.commands) + 1, rec.syncs + 1))]
    else:
        keys = [("tuple", tid) for tid in p.inputs] + [("unanchored",)]
    seen = set(keys)
    keys += [k for k in list(rec.by_key) + list(live.by_key) if k not in seen]
    for key in keys:
        exp = rec.by_key.get(key, [])
        got = live.by_key.get(key, [])
        if exp == got:
            continue
        open_ended = (key[0] == "tuple" and key[1] not in rec.settled) or (key[0] == "command" and key[1] >= rec.syncs)
        if open_ended and got[: len(exp)] == exp:
            continue  # the recorded session ended before this input was done
        i = next((j for j, (a, b) in enumerate(zip(exp, got)) if a != b), min(len(exp), len(got)))
        if key[0] == "tuple":
            u = p.inputs.get(key[1])
            head = (f"tuple {key[1]} from {u.component}:{u.task} stream {u.stream!r} values {_clip(u.values)}"
                    if u is not None else f"tuple id {key[1]} (never sent to it)")
        elif key[0] == "command":
            k = key[1]
            head = (f"command {k + 1} ({p.commands[k]})" if k < len(p.commands) else
                    "the output after the last command")
        else:
            head = "the unanchored emits"
        want = _show(exp[i], spout) if i < len(exp) else "nothing more"
        have = _show(got[i], spout) if i < len(got) else "nothing more"
        return (f"first difference: {head}\n"
                f"  its output event {i + 1}: expected {want}\n"
                f"                           got      {have}\n"
                f"  recorded: {'; '.join(_show(e, spout) for e in exp[:8]) or 'nothing'}{' ...' if len(exp) > 8 else ''}\n"
                f"  replayed: {'; '.join(_show(e, spout) for e in got[:8]) or 'nothing'}{' ...' if len(got) > 8 else ''}")
    return None


async def replay(sel: Selection, argv: list[str], cwd: str, timeout: float = 10.0) -> Outcome:
    """Replay ``sel`` against ``argv`` (no shell) run in ``cwd``."""
    p = plan(sel.session, sel.role)
    notes = list(sel.notes)
    if p.broke:
        notes.append(p.broke)
    pid_dir = scratch.make("multilang-replay-")  # 0700: private (§2.1)
    pconf = ProcessConf(subprocess_timeout=timeout, handshake_timeout=timeout, kill_grace=1.0, restart_budget=0,
                        restart_window=1.0, max_frame_bytes=p.max_frame)
    proc = ShellProcess(component=sel.component, task=sel.task, role=sel.role, argv=argv, cwd=cwd,
                        env=dict(os.environ), pid_dir=pid_dir, conf=pconf)
    live = _Live(p, proc, timeout)
    try:
        stop = await _play(p, live, proc, p.max_frame)
    finally:
        await proc.aclose()
        shutil.rmtree(pid_dir, ignore_errors=True)
    if stop is not None:
        return Outcome(1, f"replay stopped: {stop}", notes + p.notes)
    if live.unpaired:
        p.notes.append(f"the command wanted {live.unpaired} more task-id list(s) than the recording holds; it got []")
    diff = _compare(p, live.tally)
    t = live.tally
    if p.role is Role.SPOUT:
        counts = f"{live.sent_commands} commands, {t.emits} emits"
    else:
        counts = f"{live.sent_tuples} tuples, {t.emits} emits, {t.acks} acks, {t.fails} fails"
    if diff is None:
        return Outcome(0, f"no difference: {counts}", notes + p.notes)
    return Outcome(1, f"{diff}\n(replayed {counts}; recorded {p.recorded.emits} emits, {p.recorded.acks} acks, "
                      f"{p.recorded.fails} fails)", notes + p.notes)
