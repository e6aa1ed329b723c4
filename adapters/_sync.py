"""The one seam between synchronous callers (Spark's partition iterators) and trio.

Design: **one trio event loop per Python process, in a daemon thread**
(:class:`TrioHost`). Everything asynchronous -- the shell-bolt runtimes, their
subprocesses, the pool that keeps them warm between Spark tasks -- lives in
that loop. A synchronous caller never runs trio itself; it hands work to the
loop with :meth:`TrioHost.run` (``trio.from_thread.run``: block until the
coroutine finishes there) and gets plain Python values back.

Why a long-lived loop rather than ``trio.run`` per partition: trio processes
belong to the loop that spawned them, so only a loop that outlives a Spark
task can keep a bolt's subprocess warm for the next task in the same Python
worker.

:func:`pump` is the bridge a partition uses: it reads the synchronous input
iterator in chunks of ``chunk`` items and passes each chunk to the session's
``exchange`` coroutine, which accepts it (waiting while the session already
holds its bound of unfinished items) and returns whatever outputs are ready;
after the input ends it calls ``drain`` until the session is done. Memory is
bounded by the session: at most ``bound + chunk`` input items are held on the
trio side, plus the outputs of those items (outputs are handed over at every
exchange, never accumulated beyond what those items produced). One
``from_thread.run`` round trip per chunk, never per item.

Shutdown: :meth:`TrioHost.shutdown` runs the registered async shutdown hooks
(stop runtimes, reap processes) and ends the loop; it is registered with
``atexit``. A process that exits with ``os._exit`` (PySpark's forked workers
do) skips it; the children then see EOF on stdin when the process dies and
exit on their own (spec/PROTOCOL.md §5.4).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any, Awaitable, Callable, Iterable, Iterator, Protocol, TypeVar

import trio

__all__ = ["TrioHost", "Session", "pump"]

T = TypeVar("T")


class TrioHost:
    """A trio loop in a daemon thread; one per process (see :meth:`get`)."""

    _instance: "TrioHost | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._hooks: list[Callable[[], Awaitable[None]]] = []
        self._error: BaseException | None = None
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self._thread_main, name="multilang-trio", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError("the multilang trio thread failed to start") from self._error

    @classmethod
    def get(cls) -> "TrioHost":
        """This process's host, started on first use (and again after a fork:
        a forked child has the object but not the thread)."""
        with cls._lock:
            inst = cls._instance
            if inst is None or inst.pid != os.getpid() or not inst.alive:
                inst = cls._instance = TrioHost()
                atexit.register(inst.shutdown)
            return inst

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._token is not None

    # -- the loop -----------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits
            self._error = exc
        finally:
            self._token = None
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            for hook in reversed(self._hooks):
                try:
                    await hook()
                except Exception:  # noqa: BLE001 - shutting down: keep going
                    pass
            nursery.cancel_scope.cancel()

    # -- used from other threads --------------------------------------------------

    def run(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await afn(*args)`` in the loop; block until it returns (or raise
        what it raised)."""
        if self._token is None:
            raise RuntimeError("the multilang trio thread is not running")
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the loop's thread (no await)."""
        if self._token is None:
            raise RuntimeError("the multilang trio thread is not running")
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    # -- used from inside the loop ------------------------------------------------

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None
        return self._nursery

    def on_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Register an async hook run (last registered first) at shutdown."""
        self._hooks.append(hook)

    def off_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Forget a hook (its owner closed early); unknown hooks are ignored."""
        try:
            self._hooks.remove(hook)
        except ValueError:
            pass

    def shutdown(self, timeout: float = 15.0) -> None:
        """Run the shutdown hooks and stop the loop (idempotent; atexit)."""
        if self._token is None or self.pid != os.getpid() or threading.current_thread() is self._thread:
            return
        try:
            self.run_sync(self._stop.set)  # type: ignore[union-attr]
        except (RuntimeError, trio.RunFinishedError):
            return
        self._thread.join(timeout)


class Session(Protocol):
    """What :func:`pump` drives (lives in the trio loop)."""

    async def exchange(self, items: list[Any]) -> list[Any]: ...

    async def drain(self) -> tuple[list[Any], bool]: ...

    async def close(self, ok: bool) -> Any: ...


def pump(
    host: TrioHost, session: Session, items: Iterable[Any], *, chunk: int = 512,
    on_close: Callable[[Any], None] | None = None,
) -> Iterator[list[Any]]:
    """Feed a synchronous iterator through a trio session; yield output lists.

    The session is closed (``ok`` = the input was consumed and drained without
    error) when the generator finishes, raises, or is closed early;
    ``on_close`` gets what ``close`` returned (e.g. counters)."""
    ok = False
    try:
        it = iter(items)
        while True:
            batch = []
            for item in it:
                batch.append(item)
                if len(batch) >= chunk:
                    break
            if not batch:
                break
            out = host.run(session.exchange, batch)
            if out:
                yield out
        while True:
            out, done = host.run(session.drain)
            if out:
                yield out
            if done:
                break
        ok = True
    finally:
        result = host.run(session.close, ok)
        if on_close is not None:
            on_close(result)
