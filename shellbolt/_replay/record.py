"""Recordings of the frames shell tasks exchange with their processes
(``multilang run --record DIR``; read back by ``multilang replay``, ``replay.py``).

Where the bytes are taken: at the :class:`~multilang.shellbolt._host.process.Transport`
seam. A recording task hands its :class:`~multilang.shellbolt._host.process.ShellProcess`
a spawn function (:meth:`TaskRecorder.spawn`) that wraps the child's stdin
and stdout; every ``send_all`` to stdin and every ``receive_some`` from
stdout is appended to the task's recording, as the bytes went over the pipe.
That is the one rule, written once (:class:`_TapSend`, :class:`_TapReceive`).
A run without ``--record`` spawns children unwrapped: recording off costs
nothing at all on the frame paths, not even a test.

The write is recorded *before* ``send_all`` and the read *after*
``receive_some``: so in a recording a component's answer always comes after
the host bytes it answers, which is what a replay needs to pace itself.

Format, version 1 (docs/OBSERVE.md "Record and replay")::

    DIR/recording.json                          the run: topology, components, tasks, commands
    DIR/<component>/task-<id>/seg-00000001.mlrec ...   one task's segments, oldest first

A segment is ``MAGIC`` then entries. An entry is a 21-byte header, struct
``>cIIqI``: kind (``S`` session start, ``H`` host->component bytes, ``C``
component->host bytes, ``E`` session end), session number (the task's
process incarnation: 1, 2, ... across restarts), process pid, monotonic
time in nanoseconds, payload length; then the payload. ``H``/``C`` payloads
are raw pipe bytes: any framing, JSON or msgpack (§9.6), a chunk may hold
several frames or part of one (the reader re-frames the stream); a ``C``
entry of length 0 is the end of the component's stdout. ``S`` and ``E``
payloads are JSON: ``{"argv", "cwd", "wall"}`` and ``{"status"}``.

Bounded: a segment holds at most ``multilang.record.segment.bytes`` (larger
chunks are split over entries); a task keeps ``multilang.record.segments``
segments, deleting the oldest when a new one starts. A session whose start
was deleted cannot be replayed (its handshake is gone): a replay uses the
sessions whose ``S`` entry survives.

Entries are buffered and written in bulk: when 64 KiB are waiting, when a
second has passed since the last write, when a session ends and at the end
of the run (:meth:`Recorder.close`). A host killed with SIGKILL loses at
most the unwritten buffer.
"""

from __future__ import annotations

import datetime
import json
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import trio

from .._host.process import Transport, spawn_child
from .._model.conf import SCHEMA

__all__ = [
    "FORMAT",
    "VERSION",
    "MAGIC",
    "Recorder",
    "TaskRecorder",
    "RecordingError",
    "RecordingDamaged",
    "Entry",
    "Session",
    "TaskLog",
    "load_recording",
    "read_task",
    "check_record_dir",
]

FORMAT = "multilang-recording"
VERSION = 1
MAGIC = b"MLREC1\r\n"  # 8 bytes; the \r\n catches a text-mode copy
_HEAD = struct.Struct(">cIIqI")
SESSION, HOST, COMPONENT, END = b"S", b"H", b"C", b"E"
_KINDS = frozenset((SESSION, HOST, COMPONENT, END))
_FLUSH_BYTES = 1 << 16
_FLUSH_NS = 1_000_000_000
SEGMENT_BYTES_KEY = "multilang.record.segment.bytes"
SEGMENTS_KEY = "multilang.record.segments"


class RecordingError(Exception):
    """A directory that cannot be recorded into, or is not a recording."""


class RecordingDamaged(RecordingError):
    """A segment is cut short or damaged: replaying it would compare only
    part of what was recorded (``multilang replay`` exits 1 unless --partial)."""


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _conf_value(conf: Mapping[str, Any], key: str) -> int:
    value = conf.get(key)
    return int(SCHEMA[key].default if value is None else value)


def check_record_dir(path: str) -> None:
    """RecordingError unless ``path`` can take a new recording: it does not
    exist (its parent is writable), or it is an empty writable directory.
    A directory holding anything is refused: recordings are never mixed."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise RecordingError(f"--record {path}: exists and is not a directory")
        if os.listdir(path):
            raise RecordingError(f"--record {path}: the directory is not empty; recordings are not mixed: "
                                 "give a new or empty directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise RecordingError(f"--record {path}: the directory is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise RecordingError(f"--record {path}: cannot create it ({parent} is not a writable directory)")


class Recorder:
    """One recording directory for one run: ``recording.json`` and a
    :class:`TaskRecorder` per shell task, made on first use. With host
    workers the main process makes it (``recording.json``) and each worker
    records its own tasks in it (``topology`` None: a worker's part); a
    task's folder is written by the one worker that runs it."""

    def __init__(self, path: str, topology: Any = None) -> None:
        self.path = path
        self.tasks: dict[int, TaskRecorder] = {}
        #: tasks other processes (host workers) recorded in this directory
        self.elsewhere: set[int] = set()
        self.meta: dict[str, Any] = {}  # (a worker's part: none, the main process writes it)
        if topology is None:
            return
        check_record_dir(path)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)  # tuples of production data: private
        except OSError as exc:
            raise RecordingError(f"--record {path}: {exc.strerror}") from None
        components: dict[str, Any] = {}
        for comp in topology.components.values():
            entry: dict[str, Any] = {"kind": comp.kind, "tasks": list(comp.tasks)}
            if comp.is_shell:
                argv, cwd, _env = topology.resolve_command(comp)  # never the environment: it may hold secrets
                entry.update(command=argv, cwd=cwd)
            components[comp.name] = entry
        self.meta = {
            "format": FORMAT, "version": VERSION, "topology": topology.name,
            "source": str(topology.source) if getattr(topology, "source", None) else None,
            "started": _now_iso(), "ended": None, "components": components,
        }
        self._write_meta()

    def task_ids(self) -> list[int]:
        """The tasks recorded, here and by the host workers."""
        return sorted(set(self.tasks) | self.elsewhere)

    def _write_meta(self) -> None:
        tmp = os.path.join(self.path, ".recording.json.tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            json.dump(self.meta, f, indent=1)
            f.write("\n")
        os.replace(tmp, os.path.join(self.path, "recording.json"))

    def task(self, component: str, task: int, conf: Mapping[str, Any]) -> "TaskRecorder":
        rec = self.tasks.get(task)
        if rec is None:
            rec = self.tasks[task] = TaskRecorder(
                os.path.join(self.path, component, f"task-{task}"),
                segment_bytes=_conf_value(conf, SEGMENT_BYTES_KEY), segments=_conf_value(conf, SEGMENTS_KEY))
        return rec

    def close(self) -> None:
        """Write what is buffered and close every segment (end of the run)."""
        for rec in self.tasks.values():
            rec.close()
        if self.meta:  # (a host worker's part: the main process writes it)
            self.meta["ended"] = _now_iso()
            self._write_meta()


class TaskRecorder:
    """The segments of one task: entries appended in bulk, rotated by size."""

    def __init__(self, path: str, *, segment_bytes: int, segments: int) -> None:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)  # (the mode applies to the last part only)
        os.makedirs(path, mode=0o700, exist_ok=True)
        self.path = path
        self.segment_bytes = segment_bytes
        self.segments = segments
        self.sessions = 0
        self._seq = 0  # number of the current segment
        self._fd = -1
        self._used = 0  # bytes of the current segment, written or buffered
        self._buf = bytearray()
        self._flushed = time.monotonic_ns()
        # the largest H/C payload of one entry (longer chunks are split)
        self._piece = max(1, segment_bytes - len(MAGIC) - _HEAD.size)
        self._resume()

    def _resume(self) -> None:
        """A host worker started again goes on with its tasks' recordings: new
        segments after the last one, sessions numbered on from the last."""
        seqs = sorted(int(n[4:-6]) for n in os.listdir(self.path)
                      if n.startswith("seg-") and n.endswith(".mlrec") and n[4:-6].isdigit())
        for seq in reversed(seqs):
            try:
                sessions = [e[1] for e in _entries(self._segment_path(seq), [], partial=True)]
            except RecordingError:  # (not a segment: left alone, and a replay says so)
                continue
            if sessions:
                self.sessions = max(sessions)
                break
        if seqs:
            self._seq = seqs[-1]

    # -- the spawn that taps -------------------------------------------------

    async def spawn(self, argv: list[str], cwd: str | None, env: dict[str, str]) -> Transport:
        """A :data:`~multilang.shellbolt._host.process.Spawn`: the real child,
        with its stdin and stdout recorded; each call is a new session."""
        child = await spawn_child(argv, cwd, env)
        self.sessions += 1
        session = _Session(self, self.sessions, child.pid)
        session.add(SESSION, json.dumps({"argv": argv, "cwd": cwd, "wall": _now_iso()}).encode())
        return _TapTransport(child, session)

    # -- writing -------------------------------------------------------------

    def add(self, kind: bytes, session: int, pid: int, data: bytes) -> None:
        """Append one entry (split if it would not fit in a segment)."""
        t = time.monotonic_ns()
        piece = self._piece
        if len(data) > piece and kind in (HOST, COMPONENT):
            for i in range(0, len(data), piece):
                self._add(kind, session, pid, t, data[i : i + piece])
        else:
            self._add(kind, session, pid, t, data)
        if len(self._buf) >= _FLUSH_BYTES or t - self._flushed >= _FLUSH_NS:
            self.flush()

    def _add(self, kind: bytes, session: int, pid: int, t: int, data: bytes) -> None:
        n = _HEAD.size + len(data)
        if self._fd < 0 or (self._used + n > self.segment_bytes and self._used > len(MAGIC)):
            self._next_segment()
        buf = self._buf
        buf += _HEAD.pack(kind, session, pid & 0xFFFFFFFF, t, len(data))
        buf += data
        self._used += n

    def _segment_path(self, seq: int) -> str:
        return os.path.join(self.path, f"seg-{seq:08d}.mlrec")

    def _next_segment(self) -> None:
        self.flush()
        if self._fd >= 0:
            os.close(self._fd)
        self._seq += 1
        self._fd = os.open(self._segment_path(self._seq), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(self._fd, MAGIC)  # (now, not buffered: a host killed before its next write leaves a readable segment)
        self._used = len(MAGIC)
        old = self._seq - self.segments
        if old >= 1:
            try:
                os.unlink(self._segment_path(old))
            except FileNotFoundError:
                pass

    def flush(self) -> None:
        self._flushed = time.monotonic_ns()
        if self._buf and self._fd >= 0:
            data, self._buf = self._buf, bytearray()
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        self.flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _Session:
    """One process of a task: the entries it adds carry its number and pid."""

    __slots__ = ("rec", "number", "pid", "ended")

    def __init__(self, rec: TaskRecorder, number: int, pid: int) -> None:
        self.rec = rec
        self.number = number
        self.pid = pid
        self.ended = False

    def add(self, kind: bytes, data: bytes) -> None:
        self.rec.add(kind, self.number, self.pid, data)

    def end(self, status: int | None) -> None:
        if not self.ended:
            self.ended = True
            self.add(END, json.dumps({"status": status}).encode())
            self.rec.flush()


class _TapSend(trio.abc.SendStream):
    """The child's stdin: each write is recorded, then sent."""

    def __init__(self, inner: trio.abc.SendStream, session: _Session) -> None:
        self._inner = inner
        self._session = session

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._session.add(HOST, bytes(data))
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._inner.aclose()


class _TapReceive(trio.abc.ReceiveStream):
    """The child's stdout: each read is recorded as it came (b"": the end)."""

    def __init__(self, inner: trio.abc.ReceiveStream, session: _Session) -> None:
        self._inner = inner
        self._session = session

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._inner.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._session.add(COMPONENT, b"")
            raise
        self._session.add(COMPONENT, bytes(data))
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


class _TapTransport:
    """A :class:`~multilang.shellbolt._host.process.Transport` whose stdin and
    stdout are recorded; the exit status ends the session."""

    def __init__(self, inner: Transport, session: _Session) -> None:
        self._inner = inner
        self._session = session
        self.pid = inner.pid
        self.stdin = _TapSend(inner.stdin, session)
        self.stdout = _TapReceive(inner.stdout, session)
        self.stderr = inner.stderr

    @property
    def returncode(self) -> int | None:
        return self._inner.returncode

    async def wait(self) -> int:
        status = await self._inner.wait()
        self._session.end(status)
        return status

    def signal(self, sig: int) -> None:
        self._inner.signal(sig)


# --- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    kind: bytes
    t_ns: int
    data: bytes


@dataclass
class Session:
    """One process of a task as recorded. ``complete``: its start (and so
    its handshake) is in the recording."""

    number: int
    pid: int
    entries: list[Entry] = field(default_factory=list)
    start: dict[str, Any] | None = None
    status: int | None = None
    ended: bool = False

    @property
    def complete(self) -> bool:
        return self.start is not None


@dataclass
class TaskLog:
    """What a task's recording holds: its sessions in order, and notes about
    what is missing (rotated away, cut short)."""

    path: str
    sessions: dict[int, Session]
    notes: list[str]

    @property
    def complete(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.complete]


_KIND_NAMES = {SESSION: "session start", HOST: "host bytes", COMPONENT: "component bytes", END: "session end"}


def _entries(path: str, notes: list[str], partial: bool) -> Iterator[tuple[bytes, int, int, int, bytes]]:
    """The entries of one segment. One cut short (a truncated file; entries
    are written whole, so not a host that stopped) or damaged raises
    :class:`RecordingDamaged` naming it and what is lost; with ``partial``
    the entries before it are read and the loss is a note."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    if not data.startswith(MAGIC):
        raise RecordingError(f"{path}: not a recording segment of format version {VERSION}")
    pos, end, size = len(MAGIC), len(data), _HEAD.size
    count = 0
    while pos < end:
        lost = None
        if end - pos < size:
            lost = f"ends {end - pos} bytes into the header of entry {count + 1}"
        else:
            kind, session, pid, t, n = _HEAD.unpack_from(data, pos)
            if kind not in _KINDS:
                lost = f"has no entry at byte {pos} (kind {kind!r}): it is damaged there"
            elif pos + size + n > end:
                lost = (f"ends inside entry {count + 1} ({_KIND_NAMES[kind]} of session {session}): "
                        f"{pos + size + n - end} of its {n} bytes are missing")
        if lost is not None:
            what = (f"{path}: {lost}; {count} entries ({pos} of {end} bytes) before it are whole, and whatever was "
                    f"recorded after it in this segment is lost")
            if not partial:
                raise RecordingDamaged(f"{what}. The recording is truncated or damaged: a replay of it would compare "
                                       "only part of what was recorded (--partial replays what is there)")
            notes.append(f"{name}: {lost}; replaying the {count} whole entries before it (--partial)")
            return
        yield kind, session, pid, t, data[pos + size : pos + size + n]
        pos += size + n
        count += 1


def read_task(path: str, partial: bool = False) -> TaskLog:
    """Read one task's segments (``DIR/<component>/task-<id>``); a segment cut
    short or damaged raises :class:`RecordingDamaged` unless ``partial``."""
    try:
        names = sorted(n for n in os.listdir(path) if n.startswith("seg-") and n.endswith(".mlrec"))
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror}") from None
    notes: list[str] = []
    sessions: dict[int, Session] = {}
    if names and names[0] != "seg-00000001.mlrec":
        notes.append(f"the oldest segments were rotated away (multilang.record.segments); the recording starts "
                     f"at {names[0]}")
    for name in names:
        for kind, number, pid, t, data in _entries(os.path.join(path, name), notes, partial):
            s = sessions.get(number)
            if s is None:
                s = sessions[number] = Session(number=number, pid=pid)
            if kind == SESSION:
                s.start = json.loads(data)
            elif kind == END:
                s.ended = True
                s.status = json.loads(data).get("status")
            else:
                s.entries.append(Entry(kind, t, data))
    partial = [n for n, s in sessions.items() if not s.complete]
    if partial:
        notes.append(f"session {partial[0]}'s start was rotated away: it cannot be replayed; a replay starts at "
                     f"the first complete session")
    return TaskLog(path=path, sessions=sessions, notes=notes)


def load_recording(path: str) -> dict[str, Any]:
    """``DIR/recording.json``, checked: RecordingError if ``path`` is not a
    recording of a format version this code reads."""
    meta_path = os.path.join(path, "recording.json")
    if not os.path.isdir(path):
        raise RecordingError(f"{path}: no such directory")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise RecordingError(f"{path}: not a recording (no recording.json; make one with multilang run --record "
                             f"{path})") from None
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{meta_path}: unreadable: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RecordingError(f"{meta_path}: not a multilang recording")
    if meta.get("version") != VERSION:
        raise RecordingError(f"{meta_path}: format version {meta.get('version')!r}; this multilang reads "
                             f"version {VERSION}")
    return meta
