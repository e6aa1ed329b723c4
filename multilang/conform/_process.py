"""The conformance runner's own process host: one component process with
pipes, reader threads, deadline-bound I/O and reaping.

It is an independent oracle on purpose (DESIGN.md "Where the code departs"):
it shares nothing with ``multilang.shellbolt``'s process host, so a bug there
cannot hide the same bug in a component.

I/O: one thread reads the child's stdout into a queue, one drains its stderr
continuously (spec §8.3); stdin is written non-blocking with a deadline. Every
wait has a deadline, so a broken component fails a check instead of hanging
the run. Each process is killed (its whole process group) and reaped at the
end of its vector, and its pid directory removed.
"""

from __future__ import annotations

import os
import queue
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any, Sequence

from ._errors import ConformError, _Failure

_STDERR_KEEP = 16 * 1024  # bytes of stderr kept (its tail goes in a report)
_QUEUED_CHUNKS = 64  # stdout chunks (of up to 64 KiB) read ahead of the runner
_TIMEOUT = object()
_EOF = object()
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _Process:
    """One component process: pipes, reader threads, deadline-bound I/O, reaping."""

    #: every process not killed yet (vectors run in threads: Ctrl-C kills them all)
    _live: "set[_Process]" = set()
    _live_lock = threading.Lock()

    @classmethod
    def kill_all(cls) -> None:
        with cls._live_lock:
            live = list(cls._live)
        for p in live:
            p.kill()

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None, cwd: str | None) -> None:
        self.pid_dir = tempfile.mkdtemp(prefix="multilang-conform-")  # mode 0700
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                cwd=cwd,
                env=env,
                start_new_session=True,  # its own process group: we kill wrappers' children too
            )
        except OSError as exc:
            shutil.rmtree(self.pid_dir, ignore_errors=True)
            raise ConformError(f"cannot run {argv[0]!r}: {exc}") from None
        self.pid = self.proc.pid
        self.returncode: int | None = None
        self.exited = False  # exited (maybe not reaped yet)
        self.cpu_at_exit: float | None = None
        #: stdout chunks not read yet; bounded, so a component that writes
        #: without end waits for the runner (memory stays bounded)
        self._out: queue.Queue[bytes] = queue.Queue(maxsize=_QUEUED_CHUNKS)
        self._closing = False
        self._err = bytearray()
        self._err_lock = threading.Lock()
        self._stdin_fd = self.proc.stdin.fileno()
        os.set_blocking(self._stdin_fd, False)
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True, name=f"conform-stdout-{self.pid}"),
            threading.Thread(target=self._pump_stderr, daemon=True, name=f"conform-stderr-{self.pid}"),
        ]
        for t in self._threads:
            t.start()
        with self._live_lock:
            self._live.add(self)

    def _pump_stdout(self) -> None:
        fd = self.proc.stdout.fileno()
        try:
            while True:
                data = os.read(fd, 1 << 16)
                while True:
                    try:
                        self._out.put(data, timeout=0.1)
                        break
                    except queue.Full:
                        if self._closing:  # kill(): nobody reads any more
                            return
                if not data:
                    return
        except OSError:
            try:
                self._out.put_nowait(b"")
            except queue.Full:
                pass

    def _pump_stderr(self) -> None:
        fd = self.proc.stderr.fileno()
        try:
            while True:
                data = os.read(fd, 1 << 16)
                if not data:
                    return
                with self._err_lock:
                    self._err += data
                    if len(self._err) > _STDERR_KEEP:
                        del self._err[: len(self._err) - _STDERR_KEEP]
        except OSError:
            return

    def stderr_tail(self, limit: int = 1200) -> str:
        with self._err_lock:
            data = bytes(self._err[-limit:])
        return data.decode("utf-8", "replace").strip()

    def read(self, deadline: float) -> Any:
        """Bytes from stdout, ``b""`` at EOF, or ``_TIMEOUT``."""
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                return self._out.get_nowait()
            return self._out.get(timeout=remaining)
        except queue.Empty:
            return _TIMEOUT

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._stdin_fd, view)
            except BlockingIOError:
                n = 0
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise _Failure("process.exited", f"cannot write to the component's stdin{self.exit_note()}: {exc}") from None
            view = view[n:]
            if view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _Failure("process.stdin", f"the component stopped reading its stdin ({len(view)} bytes unwritten)")
                select.select([], [self._stdin_fd], [], min(remaining, 0.1))

    def close_stdin(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the (live or zombie) process, from /proc."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            return (int(fields[11]) + int(fields[12])) / _CLK_TCK
        except (OSError, IndexError, ValueError):
            return None

    def exit_note(self, wait: float = 1.0) -> str:
        """For a failure message: ' (exit status N)' once the process has
        exited, else ''. Called when its stdout or stdin has closed: a
        process that is exiting closes them before the kernel reports its
        exit, so this waits up to ``wait`` seconds for that report (on a
        pidfd: woken by the exit itself), or the status would depend on
        which came first."""
        if not self.poll() and wait > 0:
            try:
                fd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):  # not Linux 5.3+: the status is told if it is there now
                pass
            else:
                try:
                    select.select([fd], [], [], wait)
                finally:
                    os.close(fd)
                self.poll()
        return f" (exit status {self.returncode})" if self.exited else ""

    def poll(self) -> bool:
        """Has the process exited? Does not reap it (its group id stays reserved)."""
        if self.exited:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
            self.exited = True
        if info is not None and info.si_pid:
            self.exited = True
            self.cpu_at_exit = self.cpu_seconds()
            self.returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        return self.exited

    def kill(self) -> None:
        """Kill the process group, reap the process, remove the pid dir."""
        with self._live_lock:
            if self._closing:
                return
            self._closing = True
            self._live.discard(self)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            _, status = os.waitpid(self.pid, 0)
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        self.proc.returncode = self.returncode if self.returncode is not None else -9
        self.close_stdin()
        for t in self._threads:
            t.join(timeout=1.0)
        for pipe in (self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
        shutil.rmtree(self.pid_dir, ignore_errors=True)
