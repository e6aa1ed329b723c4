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

If the server dies (killed) the workers it forked run on: each is watched by
its pidfd, its exit status lost (``returncode`` :data:`LOST`), and new
workers start as new interpreters."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import threading
import traceback
from typing import Any, NoReturn

import trio

from . import worker
from .wire import Frames, encode
from .worker import _cpu, name_process

__all__ = ["ForkServer", "ForkedProcess", "LOST"]

#: a forked worker's exit status once its server is gone: it ended, how is not known
LOST = -(1 << 16)


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

    async def _watch_pidfd(self) -> None:
        """Its server is gone: wait for its end by its pidfd (no status; by
        polling where the system has no pidfds)."""
        if not hasattr(os, "pidfd_open"):
            while _exists(self.pid):
                await trio.sleep(0.1)
            self._end(LOST)
            return
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self._end(LOST)
            return
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            os.close(fd)
        self._end(LOST)


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
        self.error = ""  # why its last fork failed

    @classmethod
    def start(cls) -> "ForkServer":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("a fork server is started by a process's main thread")
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
        """Close its socket (it ends) and reap it."""
        self._sock.close()
        if self._tsock is not None:
            self._tsock.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass

    # -- in the run (trio) -------------------------------------------------------------------

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Read the server's messages for a run (:func:`run_workers` starts
        this with ``nursery.start``): the pids of the workers it forked, their
        exits. Once it is gone, the workers it forked are watched by their
        pidfds."""
        if self._tsock is None:
            self._tsock = trio.socket.from_stdlib_socket(self._sock)
        self._lock, self._changed = trio.Lock(), trio.Event()
        # (a fork asked for by a run cancelled before its answer came; an earlier run's workers)
        self._forked, self._procs = [], {}
        task_status.started()
        try:
            while not self.gone:
                data = await self._tsock.recv(1 << 16)
                if not data:
                    break
                for kind, pid, value, cpu in self._frames.feed(data):
                    self.cpu = cpu
                    if kind == "forked":
                        p = self._procs[pid] = ForkedProcess(pid)
                        self._forked.append(p)
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
        async with trio.open_nursery() as nursery:
            for proc in self._procs.values():
                nursery.start_soon(proc._watch_pidfd)

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def spawn(self, args: list[str]) -> ForkedProcess | None:
        """Fork a worker that runs ``worker.main(args)``; None if the server
        is gone (the caller starts the worker as a new interpreter)."""
        async with self._lock:
            if self.gone:
                return None
            try:
                data = encode(("fork", args))
                while data:
                    data = data[await self._tsock.send(data):]
            except OSError:
                return None
            while not self._forked and not self.gone:
                await self._changed.wait()
            return self._forked.pop(0) if self._forked else None


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
        import random

        random.seed()  # (Python reseeds it at a fork too; the acker's ids must differ between workers)
        worker.main(args)
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
