"""asyncio embedding: run shell bolts and topologies inside an asyncio program.

    from multilang.adapters.aio import open_bolt, open_topology

    async with open_bolt(["ruby", "examples/ruby/split_bolt.rb"], fields=["word"]) as bolt:
        await bolt.send(["a sentence"])           # or: await bolt.send_many(rows)
        bolt.close_input()
        async for values in bolt:                 # ["a"], ["sentence"]; ends when all is done
            ...

    builder = TopologyBuilder()
    builder.set_spout("input", FeedSpout(fields=["sentence"]))    # fed from asyncio
    builder.set_bolt("split", ShellBolt(["ruby", "split_bolt.rb"], fields=["word"])).shuffle_grouping("input")
    async with open_topology(builder.create_topology()) as run:
        await run.send(["a sentence"])
        run.close_input()
        async for record in run.outputs():        # {"component": "split", "stream": "default", "word": "a"}
            ...

The seam (the only code where asyncio and trio meet)
----------------------------------------------------
**Trio runs as a guest of the asyncio loop** (``trio.lowlevel.start_guest_run``):
one guest run per asyncio loop (:class:`_Guest`), started when the first
session opens and ended when the last one closes; every session is one trio
task in the guest's nursery, running an ordinary
:class:`~multilang.shellbolt.Runtime`. Trio's scheduler ticks run as
asyncio callbacks on the loop's thread (only trio's blocking I/O wait runs in
a helper thread), so asyncio code and trio code never run at the same time
and share plain Python objects without locks. The rules:

* **asyncio -> trio**: asyncio code only writes to the session's plain
  buffers and flags, and wakes trio with ``TrioToken.run_sync_soon``
  (coalesced: one call per burst of ``send``, not one per tuple). It never
  awaits trio and never calls trio functions directly.
* **trio -> asyncio**: trio code (the output callback, the feed iterator, the
  end of the run) appends to buffers and resolves asyncio futures directly;
  that is safe because it runs on the loop's thread, inside a guest tick.
* **Input** (:class:`FeedSpout`): an in-process ``PythonSpout`` whose iterator
  (:class:`_Feed`) pops a deque that ``send`` fills. ``send`` waits while the
  deque holds ``capacity`` tuples. Items are reliable spout emits, so a
  crashed bolt's tuples are replayed. An empty feed raises ``StopIteration``
  ("nothing now"); when more input arrives the spout task is resumed (see
  *hook* below).
* **Output**: the runtime's output callback appends to a deque that ``async
  for`` drains. While more than ``max_buffered_outputs`` outputs wait
  unread, the feeds hand the spout nothing, so memory stays bounded (softly:
  tuples already in flight still finish). Consequence: a program that sends
  everything before it reads anything can wait forever once that many outputs
  are unread; read in another task, or raise the limit.
* **End**: once every feed is closed and empty and the runtime is idle (no
  tuple queued or in flight), the session asks the runtime to stop; the run
  returns and ``async for`` ends. If a component gave up (restart budget
  spent) the iteration raises its ``ComponentError`` after the last output.
  An input that fails every time is replayed ``multilang.max.replays`` times
  (3), then given up on: logged, and counted in ``result.dead_letters``
  (the first ten in ``result.dead_letter_sample``, with their causes).
* **Cleanup**: leaving the ``async with`` normally stops the run gracefully
  (spouts deactivated, in-flight trees drained up to
  ``multilang.shutdown.grace.secs``, stdin closed, processes reaped).
  Leaving it by an exception or a cancellation cancels the trio task, whose
  cleanup (shielded in ``ShellProcess.aclose``) closes stdin, then sends
  SIGTERM and SIGKILL after ``multilang.kill.grace.secs`` and reaps every
  child. ``__aexit__`` waits for that to finish even if it is cancelled
  again, then re-raises the cancellation: when the ``async with`` is left,
  no child process of the session is alive.

*Open-ended source*: ``PythonSpoutTask`` (shellbolt/_runtime/spouts.py) treats
``StopIteration`` as the end of its source until told otherwise. A feed is
only empty *for now*, so :meth:`_Feed._resume` calls the task's public
``resume()`` when new input arrives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

import outcome
import trio

from multilang.errors import ComponentError, MultilangError, TopologyError
from multilang.shellbolt import RunResult, Runtime, load_flux
from multilang.shellbolt import (
    ANY_FIELDS, PythonBolt, PythonSpout, ShellBolt, ShellSpout, Topology, TopologyBuilder, load_topology,
)

__all__ = [
    "open_bolt",
    "open_topology",
    "FeedSpout",
    "BoltSession",
    "TopologySession",
    # re-exported, so an asyncio program needs one import
    "TopologyBuilder",
    "Topology",
    "ShellBolt",
    "ShellSpout",
    "PythonBolt",
    "PythonSpout",
    "Runtime",
    "RunResult",
    "load_topology",
    "load_flux",
    "MultilangError",
    "TopologyError",
    "ComponentError",
]

_POLL = 0.02  # how often the session checks whether the run is finished


@dataclass(kw_only=True)
class FeedSpout(PythonSpout):
    """A spout fed from asyncio by :meth:`TopologySession.send`.

    Declare it in a topology like any spout; :func:`open_topology` connects it
    to the session. Outside a session it emits nothing."""

    source: Any = field(default=())


# --- the guest run: one per asyncio loop ----------------------------------------------------


class _Guest:
    """A trio guest run on one asyncio loop, shared by that loop's sessions."""

    _by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Guest]" = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        self.closing = False
        self.sessions: set[_Session] = set()
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
        self._close: trio.Event | None = None

    @classmethod
    async def acquire(cls) -> "_Guest":
        loop = asyncio.get_running_loop()
        guest = cls._by_loop.get(loop)
        if guest is not None and guest.closing:
            await asyncio.shield(guest.done)
            guest = None
        if guest is None:
            guest = cls(loop)
            cls._by_loop[loop] = guest
            trio.lowlevel.start_guest_run(
                guest._main,
                run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                run_sync_soon_not_threadsafe=loop.call_soon,
                done_callback=guest._on_done,
                # asyncio owns signal.set_wakeup_fd; trio must leave it alone.
                host_uses_signal_set_wakeup_fd=True,
            )
        guest.users += 1
        try:
            await asyncio.shield(guest.ready)
        except BaseException:
            await guest.release()
            raise
        return guest

    async def _main(self) -> None:
        self._close = trio.Event()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self.token = trio.lowlevel.current_trio_token()
            self.ready.set_result(None)
            await self._close.wait()
            nursery.cancel_scope.cancel()  # every session has finished by now

    def _on_done(self, result: outcome.Outcome[None]) -> None:
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("the trio guest run ended before it started"))
        if not self.done.done():
            self.done.set_result(result)
        if isinstance(result, outcome.Error):
            # The guest died under its sessions (an internal error or a
            # KeyboardInterrupt delivered inside trio): they end with it.
            for s in list(self.sessions):
                s._finish(error=result.error)

    def spawn(self, session: "_Session") -> None:
        assert self.token is not None and self.nursery is not None
        self.sessions.add(session)
        self.token.run_sync_soon(self.nursery.start_soon, session._trio_main)

    def call_soon(self, fn: Any, *args: Any) -> bool:
        """Run ``fn(*args)`` inside trio soon; False if trio has ended."""
        if self.token is None or self.done.done():
            return False
        try:
            self.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            return False
        return True

    async def release(self) -> None:
        self.users -= 1
        if self.users > 0 or self.closing:
            return
        self.closing = True
        if self._close is not None:
            self.call_soon(self._close.set)
        if self.ready.done():
            await _wait_uncancellable(self.done)
        if self._by_loop.get(self.loop) is self:
            del self._by_loop[self.loop]


async def _wait_uncancellable(fut: "asyncio.Future[Any]", on_cancel: Any = None) -> None:
    """Wait for ``fut`` even if this task is cancelled meanwhile (cleanup
    must not be cut short); call ``on_cancel()`` then, and re-raise the
    cancellation once ``fut`` is done."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.done():
                break
            cancelled = True
            if on_cancel is not None:
                on_cancel()
    if cancelled:
        raise asyncio.CancelledError


# --- input -----------------------------------------------------------------------------------


class _Feed:
    """The source of one FeedSpout: a deque filled by asyncio, popped by trio."""

    def __init__(self, session: "_Session", name: str, capacity: int) -> None:
        self.session = session
        self.name = name
        self.capacity = capacity
        self.buf: deque[list[Any]] = deque()
        self.closed = False
        self.tasks: list[Any] = []  # the component's PythonSpoutTasks, once the Runtime exists
        self._wake_scheduled = False
        self._space: list[asyncio.Future[None]] = []

    # trio side (runs on the loop thread, inside a guest tick)

    def __iter__(self) -> "_Feed":
        return self

    def __next__(self) -> list[Any]:
        if not self.buf or self.session._outputs_full():
            raise StopIteration  # nothing *now*: resumed by _resume (see the module docstring)
        item = self.buf.popleft()
        if self._space and len(self.buf) < self.capacity:
            self._wake_senders()
        return item

    def _resume(self) -> None:
        self._wake_scheduled = False
        if not self.buf or self.session._paused:
            return
        for t in self.tasks:
            t.resume()

    def _wake_senders(self) -> None:
        waiters, self._space = self._space, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # asyncio side

    def wake(self) -> None:
        if not self._wake_scheduled and self.buf:
            self._wake_scheduled = self.session._guest_call(self._resume)

    async def wait_for_space(self) -> None:
        fut = self.session._loop.create_future()
        self._space.append(fut)
        await fut


# --- sessions -----------------------------------------------------------------------------------


class _Session:
    """One run of a topology inside the asyncio loop (see the module docstring)."""

    def __init__(self, topology: Topology, *, capacity: int, max_buffered_outputs: int,
                 duration: float | None, raw_values: bool) -> None:
        if capacity < 1 or max_buffered_outputs < 1:
            raise ValueError("capacity and max_buffered_outputs must be positive")
        self._capacity = capacity
        self._out_high = max_buffered_outputs
        self._duration = duration
        self._raw = raw_values
        self._feeds: dict[str, _Feed] = {}
        comps = {}
        for name, c in topology.components.items():
            if isinstance(c.impl, FeedSpout):
                feed = self._feeds[name] = _Feed(self, name, capacity)
                c = dataclasses.replace(c, impl=PythonSpout(feed, fields=c.impl.fields, streams=c.impl.streams))
            comps[name] = c
        self._topology = dataclasses.replace(topology, components=comps)
        self._topology.check_commands()  # a missing command: TopologyError now, not later
        self._out: deque[Any] = deque()
        self._out_waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._guest: _Guest | None = None
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._finished: asyncio.Future[None] | None = None
        self._scope: trio.CancelScope | None = None
        self._cancel_requested = False
        self._stop_requested = False
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._raised = False
        self._entered = False

    # -- context manager ----------------------------------------------------------------

    async def __aenter__(self) -> Any:
        if self._entered:
            raise RuntimeError("a session can be entered once")
        self._entered = True
        self._loop = asyncio.get_running_loop()
        self._finished = self._loop.create_future()
        self._guest = await _Guest.acquire()
        self._guest.spawn(self)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._guest is not None and self._finished is not None
        try:
            if not self._finished.done():
                if exc_type is None:
                    self.stop()  # graceful: drain, close stdin, reap
                else:
                    self._cancel()  # cancelled or failed: kill and reap now
                # Cancelled while stopping gracefully: stop hard instead.
                await _wait_uncancellable(self._finished, on_cancel=self._cancel)
        finally:
            self._guest.sessions.discard(self)
            await self._guest.release()
        if exc_type is None and not self._raised:
            err = self._failure()
            if err is not None:
                self._raised = True
                raise err

    # -- control (asyncio side) ----------------------------------------------------------

    def close_input(self, spout: str | None = None) -> None:
        """No more input (to ``spout``, or to every FeedSpout)."""
        for feed in self._select(spout):
            feed.closed = True

    def stop(self) -> None:
        """Stop gracefully soon: no more input, drain, reap (§5.4)."""
        self._stop_requested = True
        for feed in self._feeds.values():
            feed.closed = True

    @property
    def result(self) -> RunResult | None:
        """The run's :class:`RunResult`, once it has ended (None before)."""
        return self._result

    @property
    def finished(self) -> bool:
        return self._finished is not None and self._finished.done()

    async def send(self, values: Sequence[Any], spout: str | None = None) -> None:
        """Feed one tuple (a list of values); waits while the feed is full."""
        await self.send_many((values,), spout)

    async def send_many(self, rows: Iterable[Sequence[Any]], spout: str | None = None) -> None:
        """Feed many tuples; waits whenever the feed holds ``capacity`` of them."""
        (feed,) = self._select(spout, one=True)
        if feed.closed:
            raise RuntimeError(f"input to {feed.name!r} was closed")
        buf = feed.buf
        for row in rows:
            if not isinstance(row, (list, tuple)):
                raise TypeError(f"a tuple is a list of values, got {type(row).__name__}: {row!r}")
            while len(buf) >= feed.capacity:
                self._check_running()
                feed.wake()
                await feed.wait_for_space()
            self._check_running()
            buf.append(list(row))
        feed.wake()

    # -- output (asyncio side) ---------------------------------------------------------------

    async def _next_output(self) -> Any:
        out = self._out
        while True:
            if out:
                item = out.popleft()
                if self._paused and len(out) <= self._out_high // 2:
                    self._paused = False
                    for feed in self._feeds.values():
                        feed.wake()
                return item
            assert self._finished is not None
            if self._finished.done():
                err = self._failure()
                if err is not None and not self._raised:
                    self._raised = True
                    raise err
                raise StopAsyncIteration
            self._out_waiter = self._loop.create_future()
            await self._out_waiter

    # -- trio side ------------------------------------------------------------------------------

    def _guest_call(self, fn: Any, *args: Any) -> bool:
        return self._guest is not None and self._guest.call_soon(fn, *args)

    def _outputs_full(self) -> bool:
        if len(self._out) >= self._out_high:
            self._paused = True
        return self._paused

    def _push(self, item: Any) -> None:
        self._out.append(item)
        w = self._out_waiter
        if w is not None:
            self._out_waiter = None
            if not w.done():
                w.set_result(None)

    def _on_tracked(self, component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        self._push(values)

    async def _trio_main(self) -> None:
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                if self._cancel_requested:
                    scope.cancel()
                if self._raw:
                    rt = Runtime(self._topology, on_tracked_output=self._on_tracked)
                else:
                    rt = Runtime(self._topology, on_output=self._push)
                for name, feed in self._feeds.items():
                    feed.tasks = [rt.tasks[t] for t in self._topology.components[name].tasks]
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._stopper, rt)
                    result = await rt.run()
                    nursery.cancel_scope.cancel()
                for record in result.outputs:  # keyed outputs come at the end
                    self._push(record)
                self._finish(result=result)
                return
            self._finish(error=asyncio.CancelledError("the session was cancelled"))
        except BaseException as exc:
            self._finish(error=_unwrap(exc))
            if not isinstance(exc, Exception):
                raise

    async def _stopper(self, rt: Runtime) -> None:
        """Ask the runtime to stop once all input is in and everything is done."""
        deadline = trio.current_time() + self._duration if self._duration is not None else None
        feeds = list(self._feeds.values())
        while True:
            if self._stop_requested or (deadline is not None and trio.current_time() >= deadline):
                break
            if all(f.closed and not f.buf for f in feeds) and rt.done():
                await trio.sleep(0.05)  # confirm: a spout may be between two emits
                if all(f.closed and not f.buf for f in feeds) and rt.done():
                    break
            await trio.sleep(_POLL)
        rt.request_stop()

    def _finish(self, *, result: RunResult | None = None, error: BaseException | None = None) -> None:
        self._result = result if result is not None else self._result
        if error is not None and self._error is None:
            self._error = error
        if self._guest is not None:
            self._guest.sessions.discard(self)
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)
        w, self._out_waiter = self._out_waiter, None
        if w is not None and not w.done():
            w.set_result(None)
        for feed in self._feeds.values():
            feed._wake_senders()

    def _cancel(self) -> None:
        self._cancel_requested = True
        if self._scope is not None:
            self._guest_call(self._scope.cancel)

    # -- helpers ------------------------------------------------------------------------------

    def _failure(self) -> BaseException | None:
        if self._error is not None and not isinstance(self._error, asyncio.CancelledError):
            return self._error
        if self._result is not None and self._result.gave_up:
            return self._result.gave_up[0]
        return None

    def _check_running(self) -> None:
        if self._finished is None:
            raise RuntimeError("use the session inside 'async with'")
        if self._finished.done():
            err = self._failure()
            if err is not None:
                raise err
            if isinstance(self._error, asyncio.CancelledError):
                raise RuntimeError("the session was cancelled; it takes no more input")
            raise RuntimeError("the run has ended; it takes no more input")

    def _select(self, spout: str | None, one: bool = False) -> list[_Feed]:
        if spout is not None:
            if spout not in self._feeds:
                raise KeyError(f"{spout!r} is not a FeedSpout of this topology (feeds: {sorted(self._feeds)})")
            return [self._feeds[spout]]
        if one and len(self._feeds) != 1:
            raise ValueError(f"name the spout to send to: the topology has feeds {sorted(self._feeds)}"
                             if self._feeds else "the topology has no FeedSpout to send to")
        return list(self._feeds.values())


class BoltSession(_Session):
    """One shell bolt fed from asyncio; ``async for values in session``."""

    def __aiter__(self) -> "BoltSession":
        return self

    async def __anext__(self) -> list[Any]:
        return await self._next_output()


class TopologySession(_Session):
    """A topology running inside the asyncio loop; ``async for r in session.outputs()``."""

    async def outputs(self) -> AsyncIterator[dict[str, Any]]:
        """Output records, as ``multilang run`` prints them: a dict of the
        fields, plus ``component`` and ``stream`` unless the topology's output
        names them; a keyed output yields its final records at the end."""
        while True:
            try:
                yield await self._next_output()
            except StopAsyncIteration:
                return


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


# --- public constructors -------------------------------------------------------------------------


def open_bolt(
    command: Sequence[str],
    fields: Sequence[str] | None = None,
    *,
    input_fields: Sequence[str] | None = None,
    streams: Mapping[str, Sequence[str]] | None = None,
    parallelism: int = 1,
    group_by: Sequence[str] | None = None,
    conf: Mapping[str, Any] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    resource_dir: str | None = None,
    capacity: int = 1024,
    max_buffered_outputs: int = 65536,
) -> BoltSession:
    """Open one shell bolt (``parallelism`` processes) fed from asyncio.

    ``fields``/``streams``: what the bolt emits (default: tuples of any
    length). ``input_fields``: the fields of the tuples you send (default:
    any length). ``group_by``: fields grouping on these input fields instead
    of shuffle (needs ``input_fields``). ``conf``: topology conf (README).
    Iterating yields each emitted tuple's values, from every stream."""
    builder = TopologyBuilder()
    builder.set_spout("input", FeedSpout(fields=list(input_fields) if input_fields else list(ANY_FIELDS)))
    out_fields = list(fields) if fields is not None else (None if streams else list(ANY_FIELDS))
    bolt = ShellBolt(list(command), out_fields, {k: list(v) for k, v in (streams or {}).items()} or None,
                     cwd, dict(env) if env else None)
    decl = builder.set_bolt("bolt", bolt, parallelism)
    if group_by:
        decl.fields_grouping("input", list(group_by))
    else:
        decl.shuffle_grouping("input")
    topology = builder.create_topology(dict(conf or {}), name="aio-bolt", resource_dir=resource_dir)
    return BoltSession(topology, capacity=capacity, max_buffered_outputs=max_buffered_outputs, duration=None,
                       raw_values=True)


def open_topology(
    topology: Topology,
    *,
    duration: float | None = None,
    capacity: int = 1024,
    max_buffered_outputs: int = 65536,
) -> TopologySession:
    """Run ``topology`` inside the asyncio loop.

    Its :class:`FeedSpout` components take ``send``/``send_many``; the run
    ends when every feed is closed (``close_input``) and all work is done, or
    after ``duration`` seconds, or at ``stop()``."""
    return TopologySession(topology, capacity=capacity, max_buffered_outputs=max_buffered_outputs,
                           duration=duration, raw_values=False)
