"""The Python component library: write a bolt or a spout in one file.

    from multilang import BasicBolt

    class Split(BasicBolt):
        def process(self, tup):
            for word in tup.values[0].split():
                self.emit([word])

    Split().run()

The loop is blocking and built on the sans-IO :class:`~multilang.connection.Connection`:
it reads stdin in large chunks, handles every frame that arrived, and writes
everything produced in one ``write`` before it blocks again (one write per
burst, DESIGN.md "Performance habits"). A bolt also writes what it has once
100 ms have passed, after the tuple at hand; a daemon thread that raises a
flag every 100 ms tells the loop when (:class:`_FlushClock`), which is
cheaper than reading the clock after every tuple.

stdout is the protocol channel, so :meth:`Component.run` guards it: the
protocol gets a private duplicate of fd 1, fd 1 itself is pointed at stderr
(so output of C code or child processes cannot corrupt the protocol), and
``sys.stdout`` becomes a writer whose lines are sent as ``log`` frames. A
stray ``print()`` therefore shows up in the host's log instead of killing the
component. The guard starts in :meth:`Component.run` (importing ``multilang``
must not take over a host's stdout); what a component script prints after
``import multilang`` and before ``run()`` is held and logged after the pid
reply (``_early_output``), as the Ruby and Node libraries do.
"""

from __future__ import annotations

import io
import os

try:
    import fcntl
except ImportError:  # not on Linux/Unix
    fcntl = None  # type: ignore[assignment]
import sys
import threading
import traceback
from functools import partial
from typing import Any, Iterable

from . import _early_output
from ._kv_state import CHUNK_BYTES, KeyValueState
from ._state import Role, Side
from ._fast_paths import _JUST_STR, _JUST_TUPLE, _first
from .connection import NEED_DATA, Connection
from .errors import LocalProtocolError, RemoteProtocolError
from .messages import (
    DEFAULT_STREAM, Ack, Activate, ConnectionClosed, Deactivate, Error, Fail, Handshake, Heartbeat, Log, Metrics, Next,
    Pid, StateCommit, StateInit, StatePrepare, StatePrepared, StateRollback, Sync, Tick, TopologyContext, Tuple,
    Tuples, UnknownCommand,
)

_early_output.hold()  # a component script's prints before run() must not precede the pid reply (§2.3)


def release_stdout() -> None:
    """For hosts and tools that import ``multilang``: stop holding what
    ``print`` writes (the component library holds a component script's
    prints until its ``run()``, to log them after the pid reply). The CLI,
    ``multilang.shellbolt``, ``multilang.adapters`` and ``multilang.testing``
    call it when imported; what was held goes to stdout."""
    _early_output.release()


__all__ = ["Component", "Bolt", "BasicBolt", "StatefulBolt", "Spout", "TRACE", "DEBUG", "INFO", "WARN", "ERROR",
           "release_stdout"]

TRACE, DEBUG, INFO, WARN, ERROR = 0, 1, 2, 3, 4

_READ_SIZE = 1 << 16
_PIPE_SIZE = 1 << 20
_LOG_BUFFER = 1 << 16
_FLUSH_INTERVAL = 0.1  # a bolt's output waits at most this long (plus the tuple at hand), §5.2
_HALFWAY_FLUSH_MIN = 16  # a burst of at least this many tuples is also flushed halfway
_TAKE_MAX = 64  # tuples taken and handled per part of a burst (Connection.take_tuples)
_CLOSE_PART_MIN = 32  # under batch, the output batch of a part this long is closed after it
_SYNC = Sync()


def _ids(tuples: Any) -> Any:
    if type(tuples) is Tuples:
        return tuples.ids
    if type(tuples) is list or type(tuples) is tuple:
        kinds = set(map(type, tuples))
        if kinds == _JUST_STR:  # ids already, such as ``Tuples.ids``
            return tuples
        if kinds == _JUST_TUPLE:
            return list(map(_first, tuples))
    return [t if type(t) is str else t[0] for t in tuples]


class _Closed(Exception):
    """stdin reached EOF: the host is gone or shutting us down (§5.4)."""


class _Told(Exception):
    """Ends the loop after the host was sent an error saying why: no second report."""


class _LogWriter(io.TextIOBase):
    """``sys.stdout`` while a component runs: complete lines become log frames."""

    def __init__(self, component: "Component") -> None:
        self._component = component
        self._buf = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        # print("a", "b\nc") writes "a", " ", "b\nc", "\n": one log frame
        # per write that ends a line, so a print's text stays one message.
        self._buf += s
        if s.endswith("\n") or len(self._buf) > _LOG_BUFFER:
            text, self._buf = self._buf, ""
            self._component.log(text[:-1] if text.endswith("\n") else text, INFO)
        return len(s)

    def flush(self) -> None:
        if self._buf:
            text, self._buf = self._buf, ""
            self._component.log(text, INFO)


class _FlushClock:
    """Raises ``due`` every ``interval`` seconds, from a daemon thread.

    A bolt's loop tests this flag after each tuple instead of reading the
    clock: once ``due``, the output so far is written (and ``due``
    cleared) before the next tuple. A quick bolt thus writes once per
    burst, a slow one after every tuple, so the host hears from it well
    within its subprocess timeout (§5.2). A flag test costs a few
    bytecodes; ``time.monotonic()`` after every tuple cost 40 ns, about 2%
    of a light bolt's time (bench/). The thread only waits and sets the
    flag; it shares nothing else with the loop.
    """

    def __init__(self, interval: float) -> None:
        self.due = False
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(interval,), name="multilang-flush-clock", daemon=True).start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.due = True

    def stop(self) -> None:
        self._stop.set()


class Component:
    """Common base: the handshake, the I/O loop, logging and metrics.

    After the handshake ``self.conf`` holds the topology configuration and
    ``self.context`` a :class:`~multilang.messages.TopologyContext`.
    """

    _role = Role.BOLT
    #: Extensions this component accepts when the host offers them (spec §9).
    #: Set to ``()`` to speak the standard protocol only. ``state`` (§9.7) is
    #: accepted by a :class:`StatefulBolt` only, whatever a subclass lists.
    extensions: tuple[str, ...] = ("batch", "msgpack")
    _stateful = False  # a StatefulBolt: may accept "state"
    _early = ""  # printed before run() (_early_output), logged after the pid reply

    def __init__(self) -> None:
        self.conf: dict[str, Any] = {}
        self.context: TopologyContext | None = None
        self.pid_dir: str | None = None
        self._conn = Connection(self._role, Side.COMPONENT)
        self._out: list[bytes] = []
        self._clock: _FlushClock | None = None  # bolts, while they run
        self._in_fd = 0
        self._out_fd = 1

    # -- hooks ------------------------------------------------------------

    def initialize(self, conf: dict[str, Any], context: TopologyContext) -> None:
        """Called once after the handshake. Spouts may emit from here (§4.4)."""

    # -- API common to bolts and spouts -----------------------------------

    def log(self, msg: str, level: int = INFO) -> None:
        """Send ``msg`` to the host's log at ``level`` (TRACE=0 .. ERROR=4)."""
        self._out.append(self._conn.send(Log(msg=str(msg), level=level)))

    def report_error(self, msg: str) -> None:
        """Report an error to the host (the ``error`` command). Not fatal."""
        self._out.append(self._conn.send(Error(msg=str(msg))))

    def metrics(self, name: str, params: Any = None) -> None:
        """Send a metric to the host."""
        self._out.append(self._conn.send(Metrics(name=name, params=params)))

    # -- the loop -----------------------------------------------------------

    def run(self, stdin_fd: int | None = None, stdout_fd: int | None = None) -> None:
        """Handshake, then serve the host until stdin closes; exit status 0."""
        if stdin_fd is None and stdout_fd is None:
            stdin_fd, stdout_fd = 0, self._guard_stdout()
        self._in_fd = 0 if stdin_fd is None else stdin_fd
        self._out_fd = 1 if stdout_fd is None else stdout_fd
        self._widen_pipes(self._in_fd, self._out_fd)
        try:
            self._handshake()
            self._serve()
        except _Closed:
            pass
        finally:
            if isinstance(sys.stdout, _LogWriter):
                try:
                    sys.stdout.flush()
                    self._flush()
                except OSError:
                    pass

    @staticmethod
    def _widen_pipes(*fds: int) -> None:
        """Ask for 1 MiB pipe buffers on our stdin/stdout (Linux): fewer, larger
        reads and writes, fewer wake-ups of both ends. Best effort."""
        setsz = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl else None
        if setsz is None:
            return
        for fd in fds:
            try:
                fcntl.fcntl(fd, setsz, _PIPE_SIZE)
            except OSError:
                pass  # not a pipe, or above /proc/sys/fs/pipe-max-size

    def _guard_stdout(self) -> int:
        self._early = _early_output.take()  # printed before run(): logged after the pid reply
        sys.stdout.flush()
        proto = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = _LogWriter(self)
        return proto

    def _flush(self) -> None:
        if self._clock is not None:
            self._clock.due = False
        if self._conn.batching:
            self._close_batch()
        self._write_out()

    def _close_batch(self) -> None:
        """The open output batch (§9.5) to the output."""
        try:
            batch = self._conn.close_batch()
        except LocalProtocolError as exc:  # an emit no frame can carry: the host hears why, then we end
            self._out.append(self._conn.send(Error(msg=f"{type(self).__name__}: {exc}")))
            self._write_out()
            raise _Told(str(exc)) from exc
        if batch:
            self._out.append(batch)

    def _write_out(self) -> None:
        if not self._out:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        view = memoryview(data)
        while view:
            n = os.write(self._out_fd, view)
            view = view[n:]

    def _read_more(self) -> None:
        self._flush()
        data = os.read(self._in_fd, _READ_SIZE)
        self._conn.receive_data(data)

    def _next_event(self) -> Any:
        conn = self._conn
        while True:
            ev = conn.next_event()
            if ev is not NEED_DATA:
                if type(ev) is ConnectionClosed:
                    raise _Closed()
                return ev
            self._read_more()

    def _wait_task_ids(self) -> list[int]:
        conn = self._conn
        while True:
            try:
                ev = conn.next_task_ids()
            except RemoteProtocolError:
                if conn._reader.closed:
                    raise _Closed() from None
                raise
            if ev is not NEED_DATA:
                return ev.task_ids
            self._read_more()

    def _handshake(self) -> None:
        ev = self._next_event()
        if type(ev) is not Handshake:
            raise RemoteProtocolError("expected the handshake first", frame=repr(ev))
        self.pid_dir = ev.pid_dir
        self.conf = ev.conf
        self.context = ev.topology_context
        pid = os.getpid()
        # §2.3: an empty file named after our pid tells the host which
        # process to signal; then the pid reply, before anything else.
        with open(os.path.join(ev.pid_dir, str(pid)), "w"):
            pass
        offered = ev.extensions  # §9.1: the handshake's own key; a conf key is not an offer
        accept = tuple(e for e in self.extensions if e in offered and (e != "state" or self._stateful))
        self._out.append(self._conn.send(Pid(pid=pid, extensions=accept)))
        if self._early and isinstance(sys.stdout, _LogWriter):
            for line in self._early.splitlines():  # a log frame a line, as print() after run() gives
                sys.stdout.write(line + "\n")
            self._early = ""
        self._flush()
        self.initialize(self.conf, self.context)

    def _serve(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class Bolt(Component):
    """A bolt with explicit acking: call :meth:`ack` or :meth:`fail` for every
    input. Override :meth:`process` (and :meth:`process_tick` for ticks)."""

    _role = Role.BOLT
    # The burst read last (planned by _read_more, see _handle_tuples).
    _flush_at = -1  # frames still queued when half of it is answered (-1: none)
    _split_one = False  # one tuple batch: split its tuples instead
    _answered = 0  # tuples handled since the read

    def process(self, tup: Tuple) -> None:
        """Handle one input tuple."""
        raise NotImplementedError(f"{type(self).__name__} must define process(self, tup)")

    def process_tick(self, tup: Tick) -> None:
        """Handle a tick tuple (``topology.tick.tuple.freq.secs``). Never
        passed to :meth:`process`. The default acks it."""
        self.ack(tup)

    def process_batch(self, tuples: Tuples) -> None:
        """Handle input tuples that arrived together, in order: a tuple batch
        under extension ``batch``, or up to 64 standard frames of a burst
        (a longer burst comes in several calls).

        Optional: by default each goes to :meth:`process`. Override it to
        work on many tuples per call, with :meth:`emit_many`,
        :meth:`ack_many` and :meth:`fail_many`; every tuple must still be
        acked or failed. Ticks never come here (:meth:`process_tick`).
        ``tuples`` is a :class:`~multilang.messages.Tuples`: a sequence of
        :class:`Tuple` with the fields also as columns (``tuples.ids``,
        ``tuples.values``, ...), which are cheaper than the objects.
        Output is flushed when it returns, so one call must finish well
        within ``topology.subprocess.timeout.secs`` (§5.2)."""
        process = self.process
        for tup in tuples:
            process(tup)

    def emit_many(self, values_list: list[list[Any]], anchors: list[Any] | None = None) -> None:
        """Emit each of ``values_list`` on the default stream. ``anchors``, if
        given, is a list as long: entry i (a tuple, an id, a list of them, or
        None) anchors emit i. ``emit_many(vals, anchors=tuples)`` anchors each
        output to its input. Under ``batch`` this is one step for all."""
        data = self._conn.send_emits(values_list, anchors)
        if data:
            self._out.append(data)

    def ack_many(self, tuples: Iterable[Tuple | str] | Tuples) -> None:
        """Ack many inputs (tuples or their ids)."""
        data = self._conn.send_acks(_ids(tuples))
        if data:
            self._out.append(data)

    def fail_many(self, tuples: Iterable[Tuple | str]) -> None:
        """Fail many inputs (tuples or their ids)."""
        data = self._conn.send_acks(_ids(tuples), fail=True)
        if data:
            self._out.append(data)

    def emit(
        self,
        values: list[Any],
        stream: str | None = None,
        anchors: Iterable[Tuple | str] | None = None,
        direct_task: int | None = None,
        need_task_ids: bool = False,
    ) -> list[int] | None:
        """Emit ``values`` anchored to ``anchors`` (tuples or their ids).

        Without ``anchors`` (None) the emit is anchored to the bolt's
        implicit anchors: none for a :class:`Bolt`, the current input for a
        :class:`BasicBolt` (``anchors=[]`` emits unanchored in both).
        With ``need_task_ids=True`` this returns the ids of the tasks the tuple
        went to, at the cost of a round trip to the host; the default does not
        wait (as in pystorm).
        """
        if anchors is None:
            anchors = self._implicit_anchors()
        wants = need_task_ids and direct_task is None
        data = self._conn.send_emit(
            values if type(values) is list else list(values),
            stream=DEFAULT_STREAM if stream is None else stream,
            anchors=(
                [a[0] if type(a) is not str else a for a in anchors] if anchors else ()
            ),
            task=direct_task,
            need_task_ids=wants,
        )
        if data:  # b"" while a batch fills (§9.5)
            self._out.append(data)
        if wants:
            return self._wait_task_ids()
        return None

    def _implicit_anchors(self) -> list[Tuple] | None:
        """The anchors of an emit that names none (:meth:`emit` with
        ``anchors=None``): none here, a :class:`Bolt` anchors explicitly."""
        return None

    def emit_direct(
        self, task: int, values: list[Any], stream: str | None = None, anchors: Iterable[Tuple | str] | None = None
    ) -> None:
        """Emit ``values`` to one task (the stream must use a direct grouping)."""
        self.emit(values, stream=stream, anchors=anchors, direct_task=task)

    def ack(self, tup: Tuple | str) -> None:
        """Ack an input (a tuple or its id)."""
        data = self._conn.send_ack(tup[0] if type(tup) is not str else tup)
        if data:
            self._out.append(data)

    def fail(self, tup: Tuple | str) -> None:
        """Fail an input (a tuple or its id): its tree fails and the spout may replay it."""
        data = self._conn.send_fail(tup[0] if type(tup) is not str else tup)
        if data:
            self._out.append(data)

    def _bind_fast_paths(self) -> None:
        """Make ``self.emit`` / ``self.ack`` the connection's hot-path closures
        (unless a subclass overrides them): the common emit and ack then cost
        one Python call each instead of two. Behaviour is unchanged; every
        other case goes to :meth:`Bolt.emit` / :meth:`Bolt.ack`. A subclass
        with implicit anchors (:class:`BasicBolt`) hands its hook over, so
        that its emits without anchors take the fast path too."""
        cls = type(self)
        implicit = None if cls._implicit_anchors is Bolt._implicit_anchors else self._implicit_anchors
        emit, ack = self._conn.bolt_fast_paths(self._out, partial(Bolt.emit, self), partial(Bolt.ack, self), implicit)
        if cls.emit is Bolt.emit:
            self.emit = emit  # type: ignore[method-assign]
        if cls.ack is Bolt.ack:
            self.ack = ack  # type: ignore[method-assign]

    def _read_more(self) -> None:
        super()._read_more()
        # Answer the burst's first half before working on the rest (see
        # _handle_tuples). Under ``batch`` each frame holds many tuples.
        conn = self._conn
        n = conn.queued
        self._flush_at = n - n // 2 if n >= (2 if conn.batching else _HALFWAY_FLUSH_MIN) else -1
        self._split_one = conn.batching and n == 1
        self._answered = 0

    def _serve(self) -> None:
        self._clock = _FlushClock(_FLUSH_INTERVAL)
        try:
            self._serve_tuples()
        finally:
            self._clock.stop()

    def _serve_tuples(self) -> None:
        conn = self._conn
        out = self._out
        sync = conn.send  # heartbeats: §5.1
        take = conn.take_tuples
        self._bind_fast_paths()
        handle = self._tuple_handler()
        batch = self.process_batch if type(self).process_batch is not Bolt.process_batch else None
        rows = batch is not None
        while True:
            # In parts of at most _TAKE_MAX, the first ending halfway (see _handle_tuples).
            limit = conn.queued - self._flush_at if self._flush_at >= 0 else _TAKE_MAX
            tups = take(rows, limit if 0 < limit < _TAKE_MAX else _TAKE_MAX)
            if not tups:
                ev = conn.next_event()
                if ev is NEED_DATA:
                    self._read_more()
                    continue
                t = type(ev)
                if t is Heartbeat:
                    out.append(sync(_SYNC))
                    continue
                if t is Tick:
                    self._on_tick(ev)
                    continue
                if t is ConnectionClosed:
                    return
                if t is not Tuple:
                    self._on_event(ev)  # a state frame (§9.7), between the tuples around it
                    continue
                tups = [ev]  # set aside while an emit waited for task ids, or from a batch holding a tick
            self._handle_tuples(tups, handle, batch)

    def _handle_tuples(self, tups: list[Any], handle: Any, batch: Any) -> None:
        """A part of a burst, already read: to ``process_batch`` at once or to
        the per-tuple handler one by one. Output is otherwise flushed only
        before a read, and once the flush clock is due (every 100 ms), so
        acks and heartbeat syncs of a slow bolt reach the host before its
        subprocess timeout (§5.2).

        A burst is also flushed halfway (the loop takes its first part up to
        there). A host keeps at most ``topology.shellbolt.max.pending``
        tuples unacked (§5.3; 100 by default, in Storm too): with the first
        half's acks in hand it sends more while we work on the second half,
        instead of host and bolt taking turns. One more write per burst;
        twice the throughput of a light bolt in a Spark partition (bench/).

        Under ``batch`` the output batch of a long part (a tuple batch of
        32 or more) is closed here, encoded while its lists are young: one
        output frame per such input batch."""
        tup = tups[0]
        n = len(tups)
        try:
            if batch is not None:
                batch(Tuples(tups))
            else:
                # One tuple batch that is the whole burst: flush halfway through it.
                parts = (tups[: n // 2], tups[n // 2 :]) if self._split_one and n >= _HALFWAY_FLUSH_MIN else (tups,)
                self._split_one = False
                clock = self._clock
                for part in parts:
                    for tup in part:
                        handle(tup)
                        if clock.due:
                            self._flush()
                    if part is not tups:
                        self._flush()
        except (_Closed, _Told):  # stdin EOF while process() waited for task ids, or the host told already
            raise
        except Exception:
            self._process_failed(tup[0], n if batch is not None else 0)
            raise
        conn = self._conn
        if n >= _CLOSE_PART_MIN and conn.batching:
            self._close_batch()
        self._answered += n
        if 0 <= conn.queued <= self._flush_at:
            self._flush_at = -1
            if self._answered >= _HALFWAY_FLUSH_MIN // 2:  # tuple batches: a burst worth answering in halves
                self._flush()
                return
        if self._clock.due:
            self._flush()

    def _tuple_handler(self) -> Any:
        """What the loop calls per input tuple; an exception ends the bolt."""
        return self.process

    def _process_failed(self, tid: str, batch: int = 0) -> None:
        where = f"process_batch failed on {batch} tuples from {tid}" if batch else f"process failed on tuple {tid}"
        self.report_error(f"{type(self).__name__}.{where}:\n{traceback.format_exc()}")
        self._flush()

    def _on_tick(self, tup: Tick) -> None:
        self.process_tick(tup)

    def _on_event(self, ev: Any) -> None:
        """Any other event the loop reads; a plain bolt expects none (the
        connection refuses state frames it did not negotiate, §9.7)."""
        raise RemoteProtocolError(f"unexpected {type(ev).__name__} from the host", frame=repr(ev))


class BasicBolt(Bolt):
    """A bolt that anchors every emit to the current input, acks the input
    after :meth:`process` returns, and on an exception reports the error,
    fails the input and keeps running (Storm's ``BaseBasicBolt``)."""

    _current: Tuple | None = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "process_batch" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: a BasicBolt acks each tuple after process(); "
                            "process_batch is for Bolt, which acks explicitly")

    def _implicit_anchors(self) -> list[Tuple] | None:
        """An emit without anchors is anchored to the input being processed
        (none outside :meth:`process` and :meth:`process_tick`)."""
        current = self._current
        return None if current is None else [current]

    def process_tick(self, tup: Tick) -> None:
        """Handle a tick tuple; it is acked afterwards. The default does nothing."""

    def _tuple_handler(self) -> Any:
        return self._on_tuple

    def _on_tuple(self, tup: Tuple) -> None:
        self._run_basic(self.process, tup)

    def _on_tick(self, tup: Tick) -> None:
        self._run_basic(self.process_tick, tup)

    def _run_basic(self, hook: Any, tup: Tuple) -> None:
        self._current = tup
        try:
            hook(tup)
        except _Closed:
            raise
        except Exception:
            self.report_error(f"{type(self).__name__} failed on tuple {tup.id}:\n{traceback.format_exc()}")
            if tup.id in self._conn.pending:
                self.fail(tup)
        else:
            if tup.id in self._conn.pending:  # unless the user acked or failed it
                self.ack(tup)
        finally:
            self._current = None


class StatefulBolt(BasicBolt):
    """A :class:`BasicBolt` with a key-value state (Storm's ``IStatefulBolt``
    over a ``KeyValueState``; spec §9.7)::

        class Count(StatefulBolt):
            def process(self, tup):
                word = tup.values[0]
                count = self.state.get(word, 0) + 1
                self.state.put(word, count)
                self.emit([word, count])

    ``self.state`` is a :class:`~multilang._kv_state.KeyValueState`: string keys,
    JSON values, changed with ``put`` and ``delete`` while a tuple is
    processed (before the library acks it, as §9.7 requires). Under a host
    that offers extension ``state`` (ours) the host keeps the state durable:
    it gives the committed state back when the process starts, collects the
    changes at each checkpoint (``prepare``), then commits them or rolls the
    state back to the last commit (after a failure; the trees concerned are
    replayed). Under a host that offers nothing (Storm's) the state lives in
    this process's memory, starting empty, as with Storm's default
    ``InMemoryKeyValueStateProvider``.

    Hooks (no-ops by default), Storm's names: :meth:`init_state` once per
    process start, before the first tuple; :meth:`pre_prepare`,
    :meth:`pre_commit` and :meth:`pre_rollback` before each checkpoint
    step. An exception in a hook is reported and ends the process (the host
    restarts it with the committed state).
    """

    extensions = ("batch", "msgpack", "state")
    _stateful = True

    def __init__(self) -> None:
        super().__init__()
        #: The bolt's state (§9.7); whole once :meth:`init_state` is called.
        self.state = KeyValueState()
        self._init_so_far: dict[str, Any] | None = None  # the chunks of an init so far
        self._chunk_bytes = CHUNK_BYTES

    # -- hooks ------------------------------------------------------------

    def init_state(self, state: KeyValueState) -> None:
        """The state is whole (``state`` is ``self.state``): the host's
        committed state, or an empty one under a host without the extension.
        Called once per process start, after :meth:`initialize` and before
        the first tuple."""

    def pre_prepare(self, txid: int) -> None:
        """Checkpoint ``txid`` starts: the changes made so far are about to be sent to the host."""

    def pre_commit(self, txid: int) -> None:
        """The changes prepared under ``txid`` are about to become the committed state."""

    def pre_rollback(self) -> None:
        """The state is about to go back to the last committed one (every change since is dropped)."""

    # -- the loop -----------------------------------------------------------

    def _serve(self) -> None:
        limit = self.conf.get("multilang.max.frame.bytes")
        if type(limit) is int and limit > 0:  # §1.3: a prepared chunk stays far below the host's limit
            self._chunk_bytes = max(1, min(CHUNK_BYTES, limit // 4))
        if "state" not in self._conn.extensions:
            self._hook(self.init_state, self.state)  # Storm's host: in memory, starting empty
        super()._serve()

    def _on_event(self, ev: Any) -> None:
        t = type(ev)
        state = self.state
        if t is StateInit:
            so_far = self._init_so_far
            if so_far is None:
                so_far = dict(ev.state)
            else:
                so_far.update(ev.state)  # the core refuses a key in two chunks
            if ev.more:
                self._init_so_far = so_far
                return
            self._init_so_far = None
            state._init(so_far)
            self._hook(self.init_state, state)
        elif t is StatePrepare:
            self._hook(self.pre_prepare, ev.txid)
            chunks = state._prepare(max_bytes=self._chunk_bytes)
            last = len(chunks) - 1
            send, out = self._conn.send, self._out
            for i, (put, delete) in enumerate(chunks):
                # a standard frame: send closes the output batch first (§9.5, §9.7)
                out.append(send(StatePrepared(txid=ev.txid, put=put, delete=delete, more=i < last)))
            self._flush()  # the host waits for it
        elif t is StateCommit:
            self._hook(self.pre_commit, ev.txid)
            state._commit()
        elif t is StateRollback:
            self._hook(self.pre_rollback)
            state._rollback()
        else:
            super()._on_event(ev)

    def _hook(self, hook: Any, *args: Any) -> None:
        try:
            hook(*args)
        except _Closed:
            raise
        except Exception:
            self.report_error(f"{type(self).__name__}.{hook.__name__} failed:\n{traceback.format_exc()}")
            self._flush()
            raise


class Spout(Component):
    """A spout. Override :meth:`next_tuple`, and :meth:`ack` / :meth:`fail`
    to learn the fate of reliable emits (replay on fail is up to you)."""

    _role = Role.SPOUT

    def activate(self) -> None:
        """The topology was activated (always the first command, §4.1)."""

    def deactivate(self) -> None:
        """The topology was deactivated: stop emitting until activated."""

    def next_tuple(self) -> None:
        """Emit zero or more tuples. Called only when the host wants more."""

    def ack(self, msg_id: Any) -> None:
        """The tuple tree of ``msg_id`` completed."""

    def fail(self, msg_id: Any) -> None:
        """The tuple tree of ``msg_id`` failed or timed out; re-emit to replay."""

    def emit(
        self,
        values: list[Any],
        stream: str | None = None,
        msg_id: Any = None,
        direct_task: int | None = None,
        need_task_ids: bool = False,
    ) -> list[int] | None:
        """Emit ``values``. A ``msg_id`` (any JSON value, 0 included) makes the
        emit reliable: the spout is later told ``ack(msg_id)`` or ``fail(msg_id)``."""
        wants = need_task_ids and direct_task is None
        data = self._conn.send_emit(
            values if type(values) is list else list(values),
            stream=DEFAULT_STREAM if stream is None else stream,
            id=msg_id,
            task=direct_task,
            need_task_ids=wants,
        )
        if data:
            self._out.append(data)
        if wants:
            return self._wait_task_ids()
        return None

    def emit_direct(self, task: int, values: list[Any], stream: str | None = None, msg_id: Any = None) -> None:
        self.emit(values, stream=stream, msg_id=msg_id, direct_task=task)

    def _serve(self) -> None:
        while True:
            ev = self._next_event()
            t = type(ev)
            try:
                if t is Next:
                    self.next_tuple()
                elif t is Ack:
                    self.ack(ev.id)
                elif t is Fail:
                    self.fail(ev.id)
                elif t is Activate:
                    self.activate()
                elif t is Deactivate:
                    self.deactivate()
                elif t is UnknownCommand:
                    self.log(f"ignoring unknown spout command {ev.command!r}", WARN)
                else:
                    raise RemoteProtocolError(f"unexpected {t.__name__} from the host", frame=repr(ev))
            except (_Closed, RemoteProtocolError):
                raise
            except Exception:
                self.report_error(f"{type(self).__name__} failed in {t.__name__.lower()}:\n{traceback.format_exc()}")
                self._out.append(self._conn.send(_SYNC))
                self._flush()
                raise
            # §4.2: exactly one sync per command.
            self._out.append(self._conn.send(_SYNC))

