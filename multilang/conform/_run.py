"""One vector against one component process: ``_Run`` executes the steps,
checks every frame the component writes, and keeps the transcript a report shows.

The host side of the conversation is the sans-IO core: every frame sent goes
through ``Connection(role, Side.HOST).send`` (so a vector cannot break the
protocol unnoticed) and every frame received through ``receive_data`` /
``next_event`` (so every rule the core knows is enforced on the component).
A failed check reports the rule id the core's ``ProtocolError`` carries
(``ids.string-echo``, ``anchors.known``, ...), so a failure says which rule of
spec/PROTOCOL.md was broken. The runner checks by itself only what the core
does not name (``spout.emit-anchors``, ``_spout_rules``) and what it sees
before the core does (the pid reply comes first, frames are JSON or msgpack).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .._state import Role, Side
from ..codec import decode_component_frame, decode_host_frame, loads, msgpack_frame, msgpack_loads
from ..connection import Connection
from ..errors import ProtocolError
from ..framing import TERMINATOR, FirstFrameCut, FrameReader, LengthPrefixedReader
from ..messages import Ack, Batch, Emit, Fail, Pid, TaskIds, Tick, Tuple, TupleBatch
from ._errors import VectorBug, _Failure, _NotApplicable
from ._process import _EOF, _TIMEOUT, _Process
from ._vectors import _STEP_KINDS, DEFAULT_CONF, DEFAULT_CONTEXT, DEFAULT_IGNORE, Vector, _instantiate, _Matcher, _short

# The fixed waits below are for the default --timeout (2 s); a longer --timeout
# stretches every one of them in proportion (_scale), so a slow component (a
# JVM, storm-starter's asyncSplitsentence.js: about 6 s per tuple) is given
# time everywhere, not only for expected frames. A shorter one never shrinks them.
_DEFAULT_TIMEOUT = 2.0
# How long to wait, after the pid reply, for the ready line of a scripted
# conformance component. It is written right after the pid, so this is only
# slack for a loaded machine.
_READY_WAIT = 1.5
# The pid reply may come after a slow start (a JVM, a cold cache).
_MIN_HANDSHAKE_WAIT = 5.0
# storm.py and storm.rb create the pid file just after their pid reply (Storm
# never looks at it): the file is awaited this long before a check fails.
_PID_FILE_GRACE = 1.0
# Reading what a component wrote before it exited.
_EXIT_DRAIN = 0.5


def _scale(timeout: float) -> float:
    """The factor --timeout applies to every fixed wait (never below 1)."""
    return max(1.0, timeout / _DEFAULT_TIMEOUT)


_SHOW = 240  # bytes of a frame shown in a report
_SHOW_FRAMES = 12  # frames of the transcript shown for a failure
_LATE = 0.02  # seconds after the last step (and after each later frame) that late frames are still checked
_LATE_MAX = 0.2  # ... at most


#: control characters shown as escapes: a report stays text (grep, a terminal)
#: even for binary frames (msgpack, garbage)
_ESCAPES = {**{c: f"\\x{c:02x}" for c in (*range(32), 127)}, 9: "\\t", 10: "\\n", 13: "\\r"}


def _show(data: bytes) -> str:
    text = data[:_SHOW].decode("utf-8", "backslashreplace").translate(_ESCAPES)
    if len(data) > _SHOW:
        text += f"... ({len(data)} bytes)"
    return text


_LINE_ENDINGS = ("\n", "\r\n", "\r")


def _encode_frame(value: Any, opts: dict[str, Any]) -> bytes:
    """One frame for ``value`` with the encoding options of a send step."""
    le = opts.get("line_ending", "\n")
    if le not in _LINE_ENDINGS:
        raise VectorBug(f"line_ending must be one of {_LINE_ENDINGS!r}")
    indent = opts.get("indent")
    text = json.dumps(value, ensure_ascii=bool(opts.get("ascii", False)), separators=(",", ":"), indent=indent)
    if indent is not None:
        text = text.replace("\n", le)
    if opts.get("escape_slashes"):
        text = text.replace("/", "\\/")  # "/" occurs only inside JSON strings
    return (le * int(opts.get("blank_lines", 0)) + text + le + "end" + le).encode("utf-8")


class _Run:
    """Executes one vector's steps against one process."""

    def __init__(self, vector: Vector, proc: _Process, role: Role, timeout: float, handshake_timeout: float) -> None:
        self.v = vector
        self.proc = proc
        self.role = role
        self.timeout = timeout
        self.scale = _scale(timeout)
        self.handshake_timeout = handshake_timeout
        self.conn = Connection(role, Side.HOST)
        self.reader: FrameReader | LengthPrefixedReader = FrameReader()  # component -> us
        self.sent_reader: FrameReader | LengthPrefixedReader = FrameReader()  # us -> component (bookkeeping)
        # Until the pid reply is read, only the first frame goes to the JSON
        # reader: what follows may be msgpack (§9.6).
        self.first: FirstFrameCut | None = FirstFrameCut()
        self.msgpack = False
        self.bodies: list[bytes] = []
        self.unread: list[Any] = []  # frames read (and checked) ahead, given back to the next step
        self.eof = False
        self.transcript: list[tuple[str, bytes, str]] = []  # (direction, bytes, note)
        self.sent_ids: list[str] = []  # tuple ids we sent, for messages
        self.settled: dict[str, str] = {}  # tuple id -> "acked" / "failed" by the component, for messages
        self.received: list[Any] = []
        self.ids: dict[str, str] = {}
        self.last_tuple_id: list[str | None] = [None]
        self.got_pid = False
        self.pid: int | None = None
        self.closed_at: float | None = None
        self.pid_at: float | None = None  # when the pid reply was read
        self.m = _Matcher(self.ids, self.last_tuple_id)

    # -- sending ------------------------------------------------------------

    def _write(self, data: bytes, chunk_size: int | None = None, delay_ms: float = 0) -> None:
        if self.closed_at is not None:
            raise VectorBug("a step writes to the component after close_stdin")
        deadline = time.monotonic() + max(self.timeout, _MIN_HANDSHAKE_WAIT * self.scale)
        if not chunk_size:
            self.proc.write(data, deadline)
            return
        for i in range(0, len(data), chunk_size):
            if i and delay_ms:
                time.sleep(delay_ms / 1000)
            self.proc.write(data[i : i + chunk_size], deadline + i / chunk_size * delay_ms / 1000)

    def _book(self, data: bytes) -> None:
        """Run what we are about to send through the host-side Connection."""
        for body in self.sent_reader.feed(data):
            try:
                msg = decode_host_frame(body, spout=self.role is Role.SPOUT,
                                        loads=msgpack_loads if self.msgpack else loads)
                self.conn.send(msg)
            except ProtocolError as exc:
                raise VectorBug(f"the vector sends a frame a host may not send: {exc}") from None
            if type(msg) in (Tuple, Tick):
                self.last_tuple_id[0] = msg.id
                self.sent_ids.append(msg.id)
            elif type(msg) is TupleBatch:
                self.last_tuple_id[0] = msg.tuples[-1].id
                self.sent_ids.extend(u.id for u in msg.tuples)

    def send_bytes(self, data: bytes, chunks: list[bytes] | None = None, chunk_size=None, delay_ms=0) -> None:
        self._book(data)
        # The transcript shows the bytes exactly as written (terminators too).
        pieces = len(chunks) if chunks is not None else (-(-len(data) // chunk_size) if chunk_size else 1)
        self.transcript.append(("->", data, f" [written in {pieces} pieces]" if pieces > 1 else ""))
        if chunks is None:
            self._write(data, chunk_size, delay_ms)
        else:
            for i, c in enumerate(chunks):
                if i and delay_ms:
                    time.sleep(delay_ms / 1000)
                self._write(c)

    # -- receiving ----------------------------------------------------------

    def next_frame(self, deadline: float) -> Any:
        """The next frame from the component (checked), ``_TIMEOUT`` or ``_EOF``."""
        if self.unread:
            return self.unread.pop()
        chunk_read = False
        while not self.bodies:
            if self.eof:
                return _EOF
            if time.monotonic() > deadline and chunk_read:
                return _TIMEOUT  # bytes keep coming, and no frame of them (a chatty component): time is up
            chunk = self.proc.read(deadline)
            chunk_read = True
            if chunk is _TIMEOUT:
                return _TIMEOUT
            if not chunk:
                self.eof = True
                try:
                    if self.first is not None:  # bytes before the pid reply that never made a frame
                        self.bodies.extend(self.reader.feed(self.first.release()))
                        self.first = None
                    self.reader.close()
                except ProtocolError as exc:
                    raise _Failure("frame.truncated", f"stdout ended in the middle of a frame (§1.2): {exc}") from None
                continue
            if self.first is not None:
                chunk = self.first.feed(chunk)  # memory stays bounded by the frame limit
                if not chunk:
                    continue
            try:
                self.bodies.extend(self.reader.feed(chunk))
            except ProtocolError as exc:  # frame.too-large, or a msgpack frame of length 0
                raise _Failure(exc.rule, str(exc)) from None
        return self._accept(self.bodies.pop(0))

    def _after_pid(self) -> None:
        """The pid reply is read: switch to msgpack if it was accepted (§9.6)
        and hand the bytes that followed it to the reader now in force."""
        ext = self.v.extension
        if ext is not None and ext not in self.conn.extensions:
            raise _NotApplicable(f"the component does not accept extension {ext!r} (offered; it chose standard mode, §9.3)")
        if self.conn.msgpack:
            self.msgpack = True
            self.reader = LengthPrefixedReader()
            self.sent_reader = LengthPrefixedReader()
        held = self.first.release() if self.first is not None else b""
        self.first = None
        if held:
            try:
                self.bodies.extend(self.reader.feed(held))
            except ProtocolError as exc:  # frame.too-large, or a msgpack frame of length 0
                raise _Failure(exc.rule, str(exc)) from None

    def _accept(self, body: bytes) -> Any:
        self.transcript.append(("<-", body, ""))
        if not self.got_pid:
            return self._accept_pid(body)
        if self.msgpack:
            try:
                obj = msgpack_loads(body)
            except ProtocolError as exc:
                raise _Failure("frame.msgpack", f"the component wrote a frame that is not one msgpack object of "
                                                f"JSON's data model (§9.6): {exc}") from None
        else:
            try:
                obj = loads(body)
            except ProtocolError:
                raise _Failure("frame.json", f"the component wrote a frame that is not JSON (§1.1, §1.2): {_show(body)}") from None
        self.received.append(obj)
        if self.role is Role.SPOUT and type(obj) is dict:
            self._spout_rules(obj)
        ev = self._feed(len(body).to_bytes(4, "big") + body if self.msgpack else body + TERMINATOR)
        if type(ev) in (Emit,) and ev.wants_task_ids and self.v.auto_task_ids:
            data = self.conn.send(TaskIds(task_ids=list(self.v.task_ids)))
            if self.closed_at is not None:
                # Its stdin is closed: a host writes nothing more (an emit
                # answering the EOF is the component's business, not a fault).
                self.transcript.append(("->", b"", "[automatic task-id reply not sent: stdin is closed]"))
            else:
                self.transcript.append(("->", data, " [automatic task-id reply]"))
                self._write(data)
        return obj

    def _accept_pid(self, body: bytes) -> Any:
        try:
            msg = decode_component_frame(body)
        except ProtocolError:
            msg = None
        if type(msg) is not Pid:
            raise _Failure(
                "handshake.pid-first",
                "the first thing a component writes must be its pid reply {\"pid\": N} (§2.3); "
                f"it wrote: {_show(body)}",
            )
        self._feed(body + TERMINATOR)  # §9.2 (handshake.extensions) is the core's
        self.got_pid = True
        self.pid = msg.pid
        self.pid_at = time.monotonic()
        obj = loads(body)
        self.received.append(obj)
        self._after_pid()
        return obj

    def _feed(self, data: bytes) -> Any:
        """One frame into the host-side Connection: its next event, or the
        failure of the rule it broke, with the core's rule id (spec/vectors/README.md "Rules")."""
        try:
            self.conn.receive_data(data)
            ev = self.conn.next_event()
        except ProtocolError as exc:
            raise _Failure(exc.rule, str(exc) + self._which_ids(exc)) from None
        # For the messages only (the core checks): what the component settled.
        t = type(ev)
        if t is Ack or t is Fail:
            self.settled[ev.id] = "acked" if t is Ack else "failed"
        elif t is Batch:
            self.settled.update(dict.fromkeys(ev.acks, "acked"))
            self.settled.update(dict.fromkeys(ev.fails, "failed"))
        return ev

    def _which_ids(self, exc: ProtocolError) -> str:
        """What the runner's transcript adds to an unknown id: that the
        component already settled it, or which ids it was sent."""
        tid = exc.subject
        if exc.rule not in ("ids.known", "anchors.known") or type(tid) is not str:
            return ""
        if tid in self.settled:
            return f"; it {self.settled[tid]} that tuple already"
        sent = ", ".join(repr(i) for i in self.sent_ids[:6]) or "none"
        return f"; ids must be echoed byte for byte (§3.5, §3.6); ids sent: {sent}"

    def _spout_rules(self, obj: dict[str, Any]) -> None:
        """§4.3, which the core does not name: it lets a spout emit with
        ``"anchors": []`` pass and reports a non-empty one as ``anchors.known``."""
        if obj.get("command") == "emit" and obj.get("anchors") not in (None,):
            raise _Failure("spout.emit-anchors", "a spout emit must not carry 'anchors' (§4.3)")

    def _ignored(self, obj: Any, ignore: Any) -> bool:
        if ignore == "*":
            return True
        return type(obj) is dict and obj.get("command") in ignore

    # -- steps --------------------------------------------------------------

    def run(self) -> None:
        steps = list(self.v.steps)
        if self.v.handshake != "manual":
            steps.insert(0, {"handshake": self.v.handshake or {}})
            self.step_offset = 1
        else:
            self.step_offset = 0
        steps = _instantiate(steps, self.ids)
        for i, step in enumerate(steps):
            n = i + 1 - self.step_offset
            self.where = f"step {n}" if n else "handshake"
            kind = next(k for k in _STEP_KINDS if k in step)
            getattr(self, "step_" + kind)(step)
        # Frames that already arrived are checked too, and those that follow
        # within _LATE of each other (at most _LATE_MAX in all): a second ack
        # written right after the first (a double ack) comes a moment later.
        self.where = "after the last step"
        now = time.monotonic()
        end = now + _LATE_MAX * self.scale
        deadline = min(now + _LATE * self.scale, end)
        while True:
            r = self.next_frame(deadline)
            if r is _TIMEOUT or r is _EOF:
                break
            deadline = min(time.monotonic() + _LATE * self.scale, end)

    def _deadline(self, step: dict[str, Any]) -> tuple[float, float]:
        t = max(self.timeout, step.get("timeout_ms", 0) / 1000 * self.scale)
        return time.monotonic() + t, t

    def _frame_or_fail(self, deadline: float, waiting_for: str, waited: float) -> Any:
        obj = self.next_frame(deadline)
        if obj is _TIMEOUT:
            raise _Failure("expect.timeout", f"nothing {waiting_for} within {waited:.1f} s")
        if obj is _EOF:
            raise _Failure("process.exited", f"the component closed its stdout{self.proc.exit_note()} while the runner waited for {waiting_for}")
        return obj

    def step_handshake(self, step: dict[str, Any]) -> None:
        opts = step["handshake"] or {}
        if not isinstance(opts, dict):
            raise VectorBug("handshake options must be an object")
        conf = dict(DEFAULT_CONF)
        conf.update(opts.get("conf", {}))
        context = opts.get("context", DEFAULT_CONTEXT[self.role])
        frame = {"pidDir": self.proc.pid_dir, "conf": conf, "context": context}
        if "extensions" in opts:  # the host's offer (§9.1)
            frame["extensions"] = opts["extensions"]
        data = _encode_frame(frame, opts)
        self.send_bytes(data, chunk_size=opts.get("chunk_size"), delay_ms=opts.get("delay_ms", 0))
        obj = self.next_frame(time.monotonic() + self.handshake_timeout)
        if obj is _TIMEOUT:
            raise _Failure("handshake.timeout", f"no pid reply within {self.handshake_timeout:.1f} s of the handshake (§2.3, §2.4)")
        if obj is _EOF:
            raise _Failure("process.exited", f"the component closed its stdout{self.proc.exit_note()} before its pid reply (§2.3)")

    def _encode(self, value: Any, opts: dict[str, Any]) -> bytes:
        # Under msgpack the JSON text options (line endings, indent, ...) do not apply.
        return msgpack_frame(value) if self.msgpack else _encode_frame(value, opts)

    def step_send(self, step: dict[str, Any]) -> None:
        data = self._encode(step["send"], step)
        self.send_bytes(data, chunk_size=step.get("chunk_size"), delay_ms=step.get("delay_ms", 0))

    def step_send_many(self, step: dict[str, Any]) -> None:
        data = b"".join(self._encode(v, step) for v in step["send_many"])
        self.send_bytes(data, chunk_size=step.get("chunk_size"), delay_ms=step.get("delay_ms", 0))

    def step_send_raw(self, step: dict[str, Any]) -> None:
        raw = step["send_raw"]
        chunks = [raw] if isinstance(raw, str) else raw
        if not all(isinstance(c, str) for c in chunks):
            raise VectorBug("send_raw takes a string or a list of strings")
        bchunks = [c.encode("utf-8") for c in chunks]
        self.send_bytes(b"".join(bchunks), chunks=bchunks, delay_ms=step.get("delay_ms", 0))

    def step_expect(self, step: dict[str, Any]) -> None:
        pattern = step["expect"]
        ignore = step.get("ignore", DEFAULT_IGNORE)
        deadline, waited = self._deadline(step)
        while True:
            obj = self._frame_or_fail(deadline, f"matching {_short(pattern)}", waited)
            why = self.m.match(pattern, obj)
            if why is None or _is_batch(pattern) and _is_batch(obj) and self._batch_in_parts(pattern, obj, deadline):
                return
            if self._ignored(obj, ignore):
                continue
            raise _Failure("expect.mismatch", f"expected {_short(pattern)}; got {_short(obj)} ({why})")

    def _batch_in_parts(self, pattern: dict[str, Any], first: dict[str, Any], deadline: float) -> bool:
        """§9.5: a writer may close a batch at any point (a flush clock, the
        size limit), so an expected output batch may come as several batch
        frames in a row. Their elements, in order, must match it as one
        batch; at most one frame per element the pattern lists. A frame
        read ahead that is not part of it is given back to the next step."""
        parts = ("emits", "acks", "fails")
        most = sum(len(v) for k in parts if isinstance(v := pattern.get(k), list))
        merged = {**first, **{k: list(first.get(k) or ()) for k in parts}}
        frames = 1
        while frames < most:
            obj = self.next_frame(deadline)
            if not _is_batch(obj):
                if obj is not _TIMEOUT and obj is not _EOF:
                    self.unread.append(obj)
                return False
            frames += 1
            for k in parts:
                merged[k] += obj.get(k) or ()
            if self.m.match(pattern, {k: v for k, v in merged.items() if v != [] or k in first}) is None:
                return True
        return False

    def step_expect_unordered(self, step: dict[str, Any]) -> None:
        left = list(step["expect_unordered"])
        ignore = step.get("ignore", DEFAULT_IGNORE)
        deadline, waited = self._deadline(step)
        while left:
            obj = self._frame_or_fail(deadline, f"matching {len(left)} more of {_short(left)}", waited)
            for i, p in enumerate(left):
                if self.m.match(p, obj) is None:
                    del left[i]
                    break
            else:
                if not self._ignored(obj, ignore):
                    raise _Failure("expect.mismatch", f"got {_short(obj)}, which matches none of the frames still expected: {_short(left)}")

    def step_expect_none(self, step: dict[str, Any]) -> None:
        ms = step["expect_none"]
        ignore = step.get("ignore", DEFAULT_IGNORE)
        deadline = time.monotonic() + ms / 1000
        while True:
            obj = self.next_frame(deadline)
            if obj is _TIMEOUT:
                return
            if obj is _EOF:
                raise _Failure("process.exited", f"the component closed its stdout{self.proc.exit_note()} (expected it to stay quiet and alive for {ms} ms)")
            if not self._ignored(obj, ignore):
                raise _Failure("expect.unexpected-frame", f"expected no frame within {ms} ms, got {_short(obj)}")

    def step_expect_count(self, step: dict[str, Any]) -> None:
        pattern = step["expect_count"]
        want = step.get("count", 1)
        deadline, _ = self._deadline(step)

        def count() -> int:
            return sum(self.m.match(pattern, o) is None for o in self.received)

        n = count()
        while n < want:
            obj = self.next_frame(deadline)
            if obj is _TIMEOUT or obj is _EOF:
                raise _Failure("expect.count", f"expected {want} frame(s) matching {_short(pattern)} in this conversation, got {n}")
            n = count()
        if n > want:
            raise _Failure("expect.count", f"expected {want} frame(s) matching {_short(pattern)} in this conversation, got {n}")

    def step_close_stdin(self, step: dict[str, Any]) -> None:
        self.cpu_at_close = self.proc.cpu_seconds()
        self.closed_at = time.monotonic()
        self.proc.close_stdin()
        self.transcript.append(("->", b"", "[stdin closed]"))

    def step_sleep(self, step: dict[str, Any]) -> None:
        time.sleep(step["sleep"] / 1000)

    def step_expect_exit(self, step: dict[str, Any]) -> None:
        code = step["expect_exit"]
        within = step.get("within_ms", 2000) / 1000 * self.scale
        start = self.closed_at if self.closed_at is not None else time.monotonic()
        cpu0 = getattr(self, "cpu_at_close", None) if self.closed_at is not None else self.proc.cpu_seconds()
        deadline = start + within
        while not self.proc.poll():
            now = time.monotonic()
            if now >= deadline:
                cpu = self.proc.cpu_seconds()
                spin = ""
                if cpu is not None and cpu0 is not None:
                    spin = f"; it used {cpu - cpu0:.2f} s of CPU meanwhile"
                after = " of stdin EOF (§5.4)" if self.closed_at is not None else ""
                raise _Failure("process.exit", f"the component did not exit within {within * 1000:.0f} ms{after}{spin}")
            # Frames written before exit are read (and checked), never awaited.
            r = self.next_frame(min(deadline, now + 0.02))
            if r is _EOF:
                time.sleep(0.01)
        elapsed = time.monotonic() - start
        cpu1 = self.proc.cpu_at_exit
        if cpu0 is not None and cpu1 is not None:
            used = cpu1 - cpu0
            if used > 0.3 and used > 0.5 * elapsed:
                raise _Failure("process.spin", f"the component used {used:.2f} s of CPU in the {elapsed:.2f} s before it exited after stdin EOF (§5.4: exit promptly, do not spin)")
        # Drain what it wrote (EOF follows promptly unless a child holds the pipe).
        drain = time.monotonic() + _EXIT_DRAIN * self.scale
        while self.next_frame(drain) not in (_TIMEOUT, _EOF):
            pass
        if code is not None and self.proc.returncode != code:
            raise _Failure("process.exit-code", f"the component exited with status {self.proc.returncode}, expected {code}")

    def _check_pid_file(self, if_written: bool) -> None:
        """§2.3: an empty regular file ``<pidDir>/<pid>``. storm.py and storm.rb
        create it just *after* their pid reply, so it is awaited for a grace
        (--timeout stretches it) from the pid reply on. ``if_written``: a pidDir
        left empty passes (only handshake.pid-file requires the file: neither
        Storm nor our host reads it); whatever was written must be right."""
        path = os.path.join(self.proc.pid_dir, str(self.pid))
        grace = _PID_FILE_GRACE * self.scale
        deadline = (self.pid_at if self.pid_at is not None else time.monotonic()) + grace

        def entries() -> list[str]:
            try:
                return sorted(os.listdir(self.proc.pid_dir))
            except OSError:
                return []

        while not os.path.lexists(path) and time.monotonic() < deadline:
            if if_written and entries():
                break  # something else was written: judged below
            time.sleep(0.02)
        if not os.path.lexists(path):
            found = entries()
            if if_written and not found:
                return
            raise _Failure("handshake.pid-file", f"no pid file {str(self.pid)!r} in pidDir within {grace:.1f} s of the pid reply (§2.3); "
                                                 f"pidDir holds {found or 'nothing'}")
        if not os.path.isfile(path) or os.path.islink(path):
            raise _Failure("handshake.pid-file", f"the pid file {str(self.pid)!r} is not a regular file (§2.3)")
        size = os.path.getsize(path)
        if size:
            raise _Failure("handshake.pid-file", f"the pid file {str(self.pid)!r} must be empty, it holds {size} bytes (§2.3)")

    def step_check(self, step: dict[str, Any]) -> None:
        what = step["check"]
        if not self.got_pid:
            raise VectorBug(f"check {what!r} before the handshake")
        if what in ("pid-file", "pid-file-if-written"):
            self._check_pid_file(if_written=what == "pid-file-if-written")
        elif what == "pid-alive":
            if type(self.pid) is not int or self.pid <= 0:
                raise _Failure("handshake.pid-alive", f"pid {self.pid!r} is not a positive integer")
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                raise _Failure("handshake.pid-alive", f"the pid reply names {self.pid}, but no such process exists (§2.3)") from None
            except PermissionError:
                pass
        else:
            raise VectorBug(f"unknown check {what!r}")


def _is_batch(obj: Any) -> bool:
    return type(obj) is dict and obj.get("command") == "batch"
