"""The spout process host of the multilang streaming source: one spout
subprocess driven by a blocking host over the sans-IO connection
(``_SpoutProcess``), restarted within the restart budget (``_SupervisedSpout``),
and every open source reaped at interpreter exit (``_close_all``).

Used by :mod:`multilang.adapters.spark_source` (docs/SPARK.md, "How it runs").
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from multilang._state import Role, Side, State
from multilang.codec import dumps
from multilang.connection import NEED_DATA, Connection
from multilang.errors import ComponentCrashed, ComponentError, HeartbeatTimeout, ProtocolError
from multilang.messages import (
    Ack,
    Activate,
    ConnectionClosed,
    Deactivate,
    Emit,
    Fail,
    Handshake,
    Message,
    Pid,
    Sync,
    TaskIds,
    TopologyContext,
)

if TYPE_CHECKING:
    from .spark_source import _Options

log = logging.getLogger("multilang.spark.source")

_SPOUT_TASK = 1
_CONSUMER = "spark"
_CONSUMER_TASK = 2
_READ_SIZE = 1 << 16
_STDERR_TAIL = 20

#: Storm's defaults for the keys this source honours (same values as the
#: embedded runtime's ``DEFAULT_CONF``; not imported, to keep trio out of
#: Spark's driver worker).
_DEFAULT_CONF: dict[str, Any] = {
    "topology.message.timeout.secs": 30,
    "topology.max.spout.pending": None,
    "topology.subprocess.timeout.secs": None,
    "supervisor.worker.timeout.secs": 30,
    "multilang.max.frame.bytes": 64 * 1024 * 1024,
    "multilang.handshake.timeout.secs": 30,
    "multilang.restart.budget": 5,
    "multilang.restart.window.secs": 60,
    "multilang.kill.grace.secs": 2,
}


#: The source states open in this process (``_SourceState`` adds itself), closed at exit.
_live_states: "weakref.WeakSet[Any]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # Spark does not always call stop(); reap our children anyway
    for st in list(_live_states):
        try:
            st.close()
        except Exception:  # pragma: no cover
            pass


# --- the spout process: a blocking host over the sans-IO connection ---------------------------


class _Crash(Exception):
    """The spout process is gone or unusable; ``err`` says why, ``events`` are
    the good frames read before it happened."""

    def __init__(self, err: ComponentError, events: list[Message]) -> None:
        super().__init__(str(err))
        self.err = err
        self.events = events


class _SpoutProcess:
    """One spout subprocess: spawn, handshake (§2), one command at a time (§4.2),
    stderr drained by a thread (§8.3), reaped on close (§5.4)."""

    def __init__(
        self, opts: _Options, fields: list[str], argv: list[str], cwd: str | None, env: dict[str, str], conf: dict[str, Any]
    ) -> None:
        self.opts = opts
        self.fields = fields
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.conf = conf
        self.timeout = float(conf.get("topology.subprocess.timeout.secs") or conf.get("supervisor.worker.timeout.secs") or 30)
        self.kill_grace = float(conf.get("multilang.kill.grace.secs", 2))  # 0 is valid: no grace
        self.conn = Connection(Role.SPOUT, Side.HOST, max_frame_size=int(conf.get("multilang.max.frame.bytes") or 64 << 20))
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.pid_dir: str | None = None
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self._stderr_thread: threading.Thread | None = None
        self._backlog: deque[Message] = deque()

    def error(self, cls: type, msg: str) -> ComponentError:
        status = self.proc.poll() if self.proc is not None else None
        if status is not None:
            msg += f" (exit status {status})" if status >= 0 else f" (killed by signal {-status})"
        return cls(
            msg,
            component=self.opts.component,
            task=_SPOUT_TASK,
            pid=self.pid or (self.proc.pid if self.proc else None),
            stderr_tail="\n".join(self.stderr_tail),
            last_frames=tuple(self.conn.last_frames),
        )

    def start(self) -> list[Message]:
        """Spawn and handshake; returns frames written during open (§4.4)."""
        self.pid_dir = tempfile.mkdtemp(prefix=f"multilang-{self.opts.component}-")
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=self.cwd, env=self.env, bufsize=0, start_new_session=True,
            )
        except OSError as exc:
            raise _Crash(self.error(ComponentCrashed, f"could not start {self.argv!r}: {exc}"), []) from None
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True, name="multilang-spout-stderr")
        self._stderr_thread.start()
        self._write(self.conn.send(Handshake(pid_dir=self.pid_dir, conf=self.conf, context=self._context())))
        limit = float(self.conf.get("multilang.handshake.timeout.secs") or 30)
        deadline = time.monotonic() + limit
        while True:
            evs = self._read(deadline - time.monotonic())
            if evs and type(evs[0]) is Pid:
                self.pid = evs[0].pid
                self._backlog.extend(evs[1:])
                break
            if time.monotonic() >= deadline:
                raise _Crash(self.error(HeartbeatTimeout, f"no pid reply within the {limit:g}s handshake timeout (§2.4)"), [])
        out = list(self._backlog)
        self._backlog.clear()
        return out

    def _context(self) -> dict[str, Any]:
        fields = self.fields
        return TopologyContext(
            task_id=_SPOUT_TASK,
            component_id=self.opts.component,
            task_to_component={_SPOUT_TASK: self.opts.component, _CONSUMER_TASK: _CONSUMER},
            streams=[self.opts.stream],
            stream_to_output_fields={self.opts.stream: list(fields)},
            stream_to_target_to_grouping={self.opts.stream: {_CONSUMER: {"type": "SHUFFLE"}}},
        ).to_json()

    def command(self, cmd: Message) -> list[Message]:
        """Send one command; return the frames before its sync (§4.2)."""
        if self.conn.state is not State.IDLE:
            raise _Crash(self.error(ComponentCrashed, "connection is not usable"), [])
        try:
            data = self.conn.send(cmd)
        except ProtocolError as exc:  # our bug, or a message id that is not JSON
            raise _Crash(self.error(ComponentCrashed, f"cannot send {cmd!r}: {exc}"), []) from None
        self._write(data)
        out: list[Message] = []
        last = time.monotonic()
        while True:
            if self._backlog:
                evs = list(self._backlog)
                self._backlog.clear()
            else:
                try:
                    evs = self._read(min(1.0, last + self.timeout - time.monotonic()))
                except _Crash as crash:
                    crash.events[:0] = out
                    raise
                if evs:
                    last = time.monotonic()
                elif time.monotonic() - last > self.timeout:
                    self.kill()
                    raise _Crash(self.error(
                        HeartbeatTimeout, f"sent nothing for {self.timeout:g}s after {type(cmd).__name__.lower()} "
                        "(subprocess timeout, §5.2); killed"), out)
            for i, ev in enumerate(evs):
                if type(ev) is Sync:
                    self._backlog.extend(evs[i + 1 :])  # frames after the sync: emits while idle (§4.4)
                    return out
                out.append(ev)

    def _read(self, timeout: float) -> list[Message]:
        """One read (up to ``timeout``); every complete event in it. Emits that
        want task ids are answered at once (§4.3)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not ready:
            return []
        try:
            data = os.read(fd, _READ_SIZE)
        except OSError:
            data = b""
        self.conn.receive_data(data)
        events: list[Message] = []
        replies: list[bytes] = []
        try:
            while True:
                ev = self.conn.next_event()
                if ev is NEED_DATA:
                    break
                if type(ev) is ConnectionClosed:
                    self._settle()
                    raise _Crash(self.error(ComponentCrashed, "closed its stdout (the process exited or crashed)"), events)
                if type(ev) is Emit and ev.wants_task_ids:
                    replies.append(self.conn.send(TaskIds(task_ids=[_CONSUMER_TASK])))
                events.append(ev)
        except ProtocolError as perr:
            raise _Crash(self.error(ComponentCrashed, f"protocol error: {perr}"), events) from None
        finally:
            if replies and self.conn.state not in (State.CLOSED, State.ERROR):
                self._write(b"".join(replies))
        return events

    def _write(self, data: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            view = memoryview(data)
            while view:
                n = os.write(self.proc.stdin.fileno(), view)
                view = view[n:]
        except (BrokenPipeError, OSError):
            self._settle()
            raise _Crash(self.error(ComponentCrashed, "stdin closed (the process exited or crashed)"), []) from None

    def _drain_stderr(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stderr is not None
        prefix = f"[{self.opts.component}:{_SPOUT_TASK} pid {proc.pid}] "
        fd = proc.stderr.fileno()
        buf = b""
        while True:
            try:
                chunk = os.read(fd, _READ_SIZE)
            except OSError:
                chunk = b""
            if not chunk:
                lines, buf = ([buf] if buf else []), b""
            else:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if len(buf) > _READ_SIZE:  # a line that never ends: log it in pieces
                    lines.append(buf)
                    buf = b""
            for line in lines:
                text = line.decode("utf-8", "replace").rstrip("\r")
                self.stderr_tail.append(text)
                log.info("%s%s", prefix, text)
            if not chunk:
                return

    def _settle(self) -> None:
        """Give an exiting child a moment so its status and stderr make the error message."""
        if self.proc is not None:
            try:
                self.proc.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
            if self._stderr_thread is not None:
                self._stderr_thread.join(0.2)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)  # its own session: wrapper scripts' children too
            except ProcessLookupError:
                pass
            except PermissionError:
                self.proc.send_signal(sig)

    def close(self, deactivate: bool = True) -> None:
        """§5.4: deactivate, close stdin, SIGTERM, SIGKILL; always reap."""
        proc = self.proc
        if proc is None:
            return
        try:
            if deactivate and proc.poll() is None and self.conn.state is State.IDLE:
                saved, self.timeout = self.timeout, min(self.timeout, self.kill_grace)
                try:
                    self.command(Deactivate())
                except _Crash:
                    pass
                finally:
                    self.timeout = saved
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    self._signal(sig)
                try:
                    proc.wait(self.kill_grace if sig != signal.SIGKILL else None)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if self._stderr_thread is not None:
                self._stderr_thread.join(1.0)
            for stream in (proc.stdout, proc.stderr):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
        finally:
            self.proc = None
            if self.pid_dir is not None:
                shutil.rmtree(self.pid_dir, ignore_errors=True)
                self.pid_dir = None


class _SupervisedSpout:
    """Restarts the spout process on crash within the restart budget (§8.2).

    ``on_events`` receives every frame other than ``sync``, in order, also the
    good frames a process wrote before it died."""

    def __init__(self, opts: _Options, fields: list[str], on_events: Any) -> None:
        self.opts = opts
        self.on_events = on_events
        argv = list(opts.argv)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # a spout importing multilang runs with this installation
        self.argv = argv
        self.env = {**os.environ, **opts.env}
        conf = {**_DEFAULT_CONF, "topology.name": f"spark-{opts.component}", **opts.conf}
        if opts.max_pending is not None:
            conf["topology.max.spout.pending"] = opts.max_pending
        self.conf = {k: v for k, v in conf.items() if _jsonable(v)}
        self.budget = int(self.conf.get("multilang.restart.budget", 5))
        self.window = float(self.conf.get("multilang.restart.window.secs", 60))
        self._fields = fields
        self.proc: _SpoutProcess | None = None
        self._restarts: deque[float] = deque()
        self._backoff = 0.1
        self._started_at = 0.0
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def ensure_started(self) -> None:
        while self.proc is None:
            proc = _SpoutProcess(self.opts, self._fields, self.argv, self.opts.cwd, self.env, self.conf)
            self._started_at = time.monotonic()
            try:
                self.on_events(proc.start())
                self.proc = proc
                self.on_events(proc.command(Activate()))  # §4.1: always first
            except _Crash as crash:
                self._lost(proc, crash)

    def command(self, cmd: Message) -> None:
        """Run one command to its sync. A crash restarts the process; the
        command is then *not* retried (the caller decides: an unacked id stays
        queued by the caller and goes to the new process)."""
        self.ensure_started()
        assert self.proc is not None
        try:
            self.on_events(self.proc.command(cmd))
        except _Crash as crash:
            self._lost(self.proc, crash)
            self.ensure_started()
            if type(cmd) in (Ack, Fail):
                self.command(cmd)  # its fate must reach the replacement (§8.2)

    def _lost(self, proc: _SpoutProcess, crash: _Crash) -> None:
        self.proc = None
        try:
            self.on_events(crash.events)  # good emits before the crash are kept
        finally:
            proc.close(deactivate=False)
        now = time.monotonic()
        if now - self._started_at > 10:
            self._backoff = 0.1
        self._restarts.append(now)
        while self._restarts and self._restarts[0] < now - self.window:
            self._restarts.popleft()
        if len(self._restarts) > self.budget:
            log.error("multilang source: giving up after %d restarts in %gs: %s", len(self._restarts) - 1, self.window, crash.err)
            raise crash.err
        self.restarts += 1
        log.error("multilang source: spout crashed; restarting in %.1fs (restart %d of %d allowed per %gs): %s",
                  self._backoff, len(self._restarts), self.budget, self.window, crash.err)
        time.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, 5.0)

    def close(self) -> None:
        if self.proc is not None:
            proc, self.proc = self.proc, None
            proc.close()


def _jsonable(v: Any) -> bool:
    try:
        dumps(v)
        return True
    except Exception:
        return False
