"""Host workers forked from a fork server, not started as new interpreters.

A worker started as ``python -m multilang.shellbolt._workers.worker`` is a
new interpreter that imports trio and the runtime before it runs a task:
about 0.13 s of CPU (and as long a wait) at the start of a run and at each
restart after a kill. A :class:`ForkServer` is a copy of the main process
made with ``os.fork`` before its event loop starts, those modules imported;
each worker process is forked from it in a few milliseconds, and its pages
are shared with it until written.

The server is a session of its own (a Ctrl-C or a signal to the main
process's group does not reach it: the main process owns the signals, as it
does the workers'), keeps no file of the main process's open but its socket
to it, forks each worker into a session of its own as well, and reaps them:
it tells the main process each one's pid, then its exit status. It ends
when its socket closes: the main process closed it, or died (the workers
then stop by themselves, their own connections to it closed).

``ps`` shows a forked process with the main process's command line; its
name (``/proc/PID/comm``: ``top``, ``ps -o comm``, ``pgrep``) says what it
is: ``multilang-fork`` for the server, ``multilang-wN`` for worker N.

The main process knows of a worker's end by the worker's pidfd, and of its
exit status from the server's report. If the server is killed or stopped,
the workers it forked run on; a worker that ends has its status lost
(``returncode`` :data:`LOST`); a fork the server does not answer within 3
seconds has it killed; and new workers start as new interpreters."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

import trio

from . import worker
from .wire import Frames, encode
from .worker import _cpu, name_process

__all__ = ["ForkServer", "ForkedProcess", "LOST"]

#: a forked worker's exit status where its server did not report it (gone or stopped): it ended, how is not known
LOST = -(1 << 16)
#: how long a worker's exit status is waited for from its server once it has ended; how long the server is
#: waited for to end once closed
_STATUS_SECS = 3.0


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (its pid taken by another user's process: it is gone)
        return False
    return True


class ForkedProcess:
    """A worker process forked by the server, as the coordinator uses a
    ``trio.Process``: ``pid``, ``returncode`` (None while it runs; negative:
    the signal that killed it), ``wait()``, ``kill()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = trio.Event()

    def _end(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        # (not yet reaped while returncode is None: the pid is still this process's, a zombie at worst)
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """The main process's handle on its fork server. :meth:`start` it before
    ``trio.run``, in the main thread (it imports the worker's modules first;
    the copy has no other thread: trio's idle ones are forgotten there), give
    it to :func:`run_workers`, :meth:`close` it after::

        with ForkServer.start() as server:
            trio.run(lambda: run_workers(topology, 2, fork_server=server))
    """

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self._tsock: Any = None
        self._frames = Frames()
        self._procs: dict[int, ForkedProcess] = {}
        #: the answers to the forks asked for, in order (None: it could not fork)
        self._forked: list[ForkedProcess | None] = []
        self._lock: Any = None
        self._changed: Any = None
        #: the server's own CPU seconds, as of its last message (its start, its forks, its reaping)
        self.cpu = 0.0
        self.gone = False  # its socket closed: it died (or was closed)
        self._closed = self._serving = False
        self.error = ""  # why its last fork failed
        self.why = ""  # why the last spawn() gave no process

    @classmethod
    def start(cls) -> "ForkServer":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("a fork server is started by a process's main thread")
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass  # (not in a run: as it should be)
        else:
            raise RuntimeError("a fork server is started before trio.run, not inside it (its copy would carry "
                               "the run along, and no worker forked from it could run)")
        from .._runtime import runtime  # noqa: F401  (with worker, above: every module a worker runs)

        for stream in (sys.stdout, sys.stderr):  # (nothing buffered here is written again by a copy)
            if stream is not None:
                stream.flush()
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _serve(theirs)
        theirs.close()
        return cls(pid, ours)

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close its socket (it ends) and reap it; killed if it has not
        ended within _STATUS_SECS (stopped: the workers it has not reaped
        are then init's to reap)."""
        self._closed = True
        self._sock.close()
        if self._tsock is not None:
            self._tsock.close()
        deadline = time.monotonic() + _STATUS_SECS
        try:
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() >= deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    break
                time.sleep(0.01)
        except ChildProcessError:
            pass

    # -- in the run (trio) -------------------------------------------------------------------

    def check(self) -> None:
        """Raise RuntimeError if it cannot serve a run now (closed, or serving one)."""
        if self._closed:
            raise RuntimeError("this fork server was closed: start another")
        if self._serving:
            raise RuntimeError("a fork server serves one run at a time")

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve one run (:func:`run_workers` starts this with
        ``nursery.start``): read the server's messages (the pids of the
        workers it forked, their exit statuses) and watch each worker it
        forked by its pidfd. A worker's end is known from its pidfd, so a
        server that is stopped (SIGSTOP) or killed delays nothing; its
        status is the server's report, waited for up to _STATUS_SECS
        (:data:`LOST` without one)."""
        self.check()
        if self._tsock is None:
            self._tsock = trio.socket.from_stdlib_socket(self._sock)
        self._lock, self._changed = trio.Lock(), trio.Event()
        # (a fork asked for by a run cancelled before its answer came; an earlier run's workers)
        self._forked, self._procs = [], {}
        self._serving = True
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                await self._read(nursery)
        finally:
            self._serving = False

    async def _read(self, nursery: trio.Nursery) -> None:
        try:
            while True:
                data = await self._tsock.recv(1 << 16)
                if not data:
                    break
                for kind, pid, value, cpu in self._frames.feed(data):
                    self.cpu = cpu
                    if kind == "forked":
                        p = self._procs[pid] = ForkedProcess(pid)
                        self._forked.append(p)
                        nursery.start_soon(self._watch, p)
                    elif kind == "failed":
                        self.error = value
                        self._forked.append(None)
                    else:  # "exit"
                        proc = self._procs.pop(pid, None)
                        if proc is not None:
                            proc._end(value)
                    self._wake()
        except OSError:
            pass
        self.gone = True
        self._wake()

    async def _watch(self, proc: ForkedProcess) -> None:
        """Its end, by its pidfd (readable once it has exited, reaped or
        not); polled where the system has none (there a zombie that a
        stopped server does not reap counts as running)."""
        if hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(proc.pid)
            except ProcessLookupError:  # (gone already: reaped, its status on its way)
                fd = -1
            if fd >= 0:
                try:
                    await trio.lowlevel.wait_readable(fd)
                finally:
                    os.close(fd)
        else:
            while proc.returncode is None and _exists(proc.pid):
                await trio.sleep(0.1)
        with trio.move_on_after(_STATUS_SECS):
            while proc.returncode is None and not self.gone:
                await self._changed.wait()
        self._procs.pop(proc.pid, None)
        proc._end(LOST)  # (nothing if the server's report came)

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def spawn(self, args: list[str]) -> ForkedProcess | None:
        """Fork a worker that runs ``worker.main(args)``; None, with
        :attr:`why`, if the server is gone, could not fork, or did not
        answer within _STATUS_SECS (stopped: it is killed, so that it forks
        nothing later): the caller starts the worker as a new interpreter."""
        async with self._lock:
            if not self.gone:
                try:
                    data = encode(("fork", args))
                    while data:
                        data = data[await self._tsock.send(data):]
                except OSError:
                    self.gone = True
            with trio.move_on_after(_STATUS_SECS) as waited:
                while not self._forked and not self.gone:
                    await self._changed.wait()
            if self._forked:
                proc = self._forked.pop(0)
                if proc is None:
                    self.why = f"the fork server could not fork it ({self.error})"
                return proc
            if waited.cancelled_caught:
                os.kill(self.pid, signal.SIGKILL)  # (its socket closes: gone, as if killed by anyone)
                self.gone = True
                self.why = f"the fork server (pid {self.pid}) did not answer within {_STATUS_SECS:g}s: killed"
            else:
                self.why = f"the fork server (pid {self.pid}) is gone"
            return None


# -- the server (a forked copy of the main process; never returns) -----------------------------


def _serve(sock: socket.socket) -> NoReturn:
    try:
        os.setsid()
        name_process("multilang-fork")
        for signum in signal.valid_signals():  # (the main process's handlers: a worker's are Python's defaults)
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        keep = sock.fileno()
        os.closerange(3, keep)  # (the main process's files: an output pipe's reader must see its end)
        os.closerange(keep + 1, 1 << 20)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        closing = [keep, wake_r, wake_w, sel.fileno()]
        frames = Frames()
        while True:
            for key, _ in sel.select():
                if key.fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    _reap(sock)
                    continue
                data = sock.recv(1 << 16)
                if not data:  # the main process closed it, or died
                    os._exit(0)
                for _kind, args in frames.feed(data):
                    try:
                        pid = _fork_worker(args, closing)
                    except OSError as exc:  # (out of processes or memory: the main process tries a new interpreter)
                        sock.sendall(encode(("failed", 0, str(exc), _cpu())))
                    else:
                        sock.sendall(encode(("forked", pid, 0, _cpu())))
    except (BrokenPipeError, ConnectionResetError):  # the main process died: nothing to tell
        os._exit(0)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.sendall(encode(("exit", pid, os.waitstatus_to_exitcode(status), _cpu())))


def _fork_worker(args: list[str], closing: list[int]) -> int:
    server = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        os.setsid()
        name_process(f"multilang-w{args[1]}")
        if os.getppid() == server:  # (else the server was killed before it told the main process of this fork:
            worker.main(args)      # the main process started the worker as a new interpreter)
        code = 0
    except SystemExit as exc:  # (as the interpreter ends on one: None is 0, a message is printed and 1)
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
