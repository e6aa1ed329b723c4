"""A task of a topology: one component instance with an inbox, and the
records that travel between tasks (:class:`Delivery`, :class:`PlainEmit`).

Every task of a topology is one trio task under the runtime's nursery
(``runtime.py``); shell tasks (``shell_task.py``) add a supervised process.
"""

from __future__ import annotations

import logging
import pickle
from collections import deque
from typing import Any, NamedTuple, Protocol

import trio

from multilang.errors import ComponentError

from .._model.acker import Acker, TupleEdges, edges_of
from .._model.conf import SCHEMA
from .._model.grouping import Grouping
from .._model.rng import getrandbits
from .._model.results import Cause
from .._model.topology import ComponentDef, Topology
from .._observe.observe import TaskObs


__all__ = ["Task", "SpoutTask", "Delivery", "PlainEmit", "plain_emit", "component_error", "new_tuple_id", "TICK_EDGES", "PY_LEVEL", "cannot_cross"]

log = logging.getLogger("multilang.shellbolt")
PY_LEVEL = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
INBOX_CAPACITY = 1024
#: the acker edges of every tick tuple: it belongs to no tree (§5.3), and
#: anchoring to it adds no edge (Acker.anchor skips anchors without roots)
TICK_EDGES = TupleEdges()
_new_tuple = tuple.__new__



class EmitPlan(NamedTuple):
    """What an emit on one stream of a task needs, compiled once per (task,
    stream) by :meth:`Runtime.emit_plan` and read for every emit there: by
    the runtime's routes and the Spark direct lane alike."""

    #: the stream's declared fields; None: the stream is not declared
    fields: list[str] | None
    #: how many values an emit carries: len(fields), -1 for any ("*"), 0 undeclared
    n_fields: int
    #: the subscriptions (groupings) to the stream
    subs: list[Grouping]
    #: tasks that may receive a direct emit on the stream
    direct: set[int]
    #: the plain lane: the one subscription, None if nobody subscribes (a
    #: topology output), False if an emit needs the general route (undeclared,
    #: several subscriptions, or a direct one)
    one: Grouping | None | bool

    def takes(self, values: list[Any]) -> bool:
        """Whether the plain lane takes an emit of these values: one
        subscription or none, not direct, the declared number of values."""
        return self.one is not False and (self.n_fields < 0 or len(values) == self.n_fields)


class RuntimeSeam(Protocol):
    """What a task, a sink, the checkpointer and the shell drivers use of the
    runtime that runs them (``runtime.Runtime`` is the one implementation),
    and what an engine (``multilang.adapters``) may use of a runtime beside
    its run control (``run``, ``done``, ``request_stop``). Written down here,
    so that none of them imports the runtime: the runtime imports them
    (tests/unit/test_architecture.py holds the adapters to it)."""

    #: the topology being run
    topology: Topology
    #: host workers: this process's worker and their number (``workers``); None: one engine, every task here
    placement: Any
    #: the XOR acker of every tuple tree
    acker: Acker
    #: task id -> task
    tasks: dict[int, Task]
    #: component name -> its statistics (``ComponentStats``)
    stats: dict[str, Any]
    #: the checkpointer (§9.7), or None when no bolt keeps state
    checkpoints: Any
    #: the rate-limited error log (``RateLimitedLog``)
    errlog: Any
    #: ``--record``: the recorder whose taps a process's pipes get, or None
    recorder: Any
    #: the private directory of the components' pid files (§2.1)
    pid_dir: str
    #: errors the components reported (the summary's)
    reported_errors: Any
    #: set when the spouts were told to stop emitting
    spouts_stopped: bool
    #: set when the run is stopping
    stopping: bool
    #: set (a trio.Event) when a stop wants the drains cut short
    hurry: Any
    #: tuples the spouts emitted, on any stream, replays included
    emitted_by_spouts: int
    #: what ``max_tuples`` counts: :attr:`emitted_by_spouts` less the replays of failed inputs
    fresh_by_spouts: int
    #: `next`s out to shell spouts within ``max_tuples`` (the room they may fill)
    nexts_out: int
    #: ``--max-tuples``, or None
    max_tuples: int | None
    #: ``topology.max.spout.pending``, or None
    max_spout_pending: int | None
    #: why the last emit :meth:`targets` refused was refused (it was reported then), or None
    last_emit_error: str | None
    #: false when ``topology.acker.executors`` is 0: a spout's emits are acked as they are routed
    acking: bool
    #: the errors of the components the run gave up on (a crash loop), in order
    gave_up: list[ComponentError]

    def emit_plan(self, src: Task, stream: str) -> EmitPlan: ...

    def subscribers(self, component: str, stream: str) -> list[Grouping]: ...

    def route(self, src: Task, emit: Any, anchors: list[TupleEdges] | None, touched: set[Task],
              targets: list[int] | None = None, invalid: bool = False) -> list[int]: ...

    def route_emits(self, src: Task, emits: list[list[Any]], touched: set[Task]) -> None: ...

    def route_plain(self, src: Task, values: list[Any], stream: str, anchors: list[TupleEdges] | None,
                    touched: set[Task], msg_id: Any = None, now: float | None = None) -> None: ...

    def route_batch(self, src: Task, stream: str, values_list: list[list[Any]], anchor_ids: list[str | None],
                    touched: set[Task]) -> None: ...

    def route_spout_burst(self, src: Task, values_list: list[list[Any]], msg_ids: list[Any], touched: set[Task],
                          now: float) -> None: ...

    def targets(self, src: Task, emit: Any) -> list[int] | None: ...

    def settle(self) -> None: ...

    def nudge(self) -> None: ...
    def kick_spouts(self, but: "Task | None" = None) -> None: ...

    async def wait_for_change(self) -> None: ...

    def may_emit(self, spout: Task, replay: bool = False) -> bool: ...

    def emit_room(self, spout: Task, replay: bool = False) -> int: ...

    def skip_committed(self) -> None: ...

    def commit_view(self, updates: dict[Any, dict[str, Any]]) -> None: ...

    def give_up(self, err: ComponentError) -> None: ...

    def dead_letter(self, spout: Task, msg_id: Any, values: list[Any], cause: str | None, attempts: int,
                    line: int | None = None) -> None: ...

    def restart_times(self, component: str) -> Any: ...


class PlainEmit(NamedTuple):
    """An emit read like an :class:`Emit` by :meth:`Runtime.route`, never
    direct, never wanting task ids: a batch's (§9.5, or a ``take_outputs``
    run) in hold mode, or one that :meth:`Runtime.route_plain` hands to
    ``route``. A named tuple built by :func:`_plain_emit` because a frozen
    dataclass costs about 1 µs per emit to build (bench/)."""

    values: list[Any]
    stream: str
    anchors: tuple[str, ...]
    id: Any = None
    task: int | None = None
    need_task_ids: bool = False
    is_direct: bool = False
    wants_task_ids: bool = False


def plain_emit(values: list[Any], stream: str, anchors: tuple[str, ...] = (), msg_id: Any = None) -> PlainEmit:
    """A :class:`PlainEmit` without the named tuple's keyword ``__new__``."""
    return _new_tuple(PlainEmit, (values, stream, anchors, msg_id, None, False, False, False))



#: the types whose values always pickle: an emit of only these is not pickled to find out
_PLAIN = frozenset((str, int, float, bool, bytes, type(None)))


def cannot_cross(values: list[Any]) -> str | None:
    """Why an in-process component's emit cannot go to another host worker
    (its values do not pickle: a class made inside a function, a lock), or
    None. A shell component's values are JSON, and always can."""
    for v in values:
        if type(v) not in _PLAIN:
            break
    else:  # (most emits: a word, a count; a pickle each to learn nothing cost 0.7 us)
        return None
    try:
        pickle.dumps(values, protocol=5)
    except Exception as exc:  # (pickle raises what the value's own __reduce__ raises)
        return f"its values do not pickle, and a tuple goes to another host worker by pickle ({type(exc).__name__}: {exc})"
    return None


class Delivery(NamedTuple):
    """A tuple on its way to one task. A named tuple: one is built per
    delivery, and ``_new_tuple(Delivery, (...))`` builds it without a
    Python-level call."""

    values: list[Any]
    source: str | None
    stream: str
    source_task: int
    edges: int | TupleEdges  # the token: acker edges, or a one-hop token (acker.py)
    tick: bool = False


class PlainComponentError(ComponentError):
    """A component error whose message is whole as given (no "component X
    task N" prefix): one the host words itself, or one a host worker wrote."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.args = (msg,)

    def __str__(self) -> str:
        return self.args[0]


def component_error(exc: BaseException) -> ComponentError | None:
    if isinstance(exc, ComponentError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            found = component_error(e)
            if found is not None:
                return found
    return None


def new_tuple_id() -> str:
    # §3.1: the decimal string of a random signed 64-bit number.
    return str(getrandbits(64) - (1 << 63))


class Task:
    """One task of one component: an inbox, stats, and a run loop."""

    def __init__(self, runtime: RuntimeSeam, comp: ComponentDef, task_id: int) -> None:
        self.runtime = runtime
        self.comp = comp
        self.name = comp.name
        self.task_id = task_id
        #: the task's position among its component's tasks, from 0 (Storm's task index)
        self.index = comp.tasks.index(task_id)
        self.conf = runtime.topology.conf_for(comp.name)
        # (the workers in force, as Storm's conf says to its components: --workers wins over the file's
        # key, and a run has at most one worker per task)
        self.conf["topology.workers"] = 1 if runtime.placement is None else runtime.placement.workers
        #: topology.producer.batch.size: the most tuples this task moves as one batch (its writes, its routes)
        self.batch_size = int(self.conf.get("topology.producer.batch.size") or SCHEMA["topology.producer.batch.size"].default)
        self.stats = runtime.stats[comp.name].task(task_id)  # the component's are their sums
        self.obs = TaskObs()  # latencies and busy time for the live view (observe.py)
        self.inbox: deque[Delivery] = deque()
        self.capacity = INBOX_CAPACITY
        self._space = trio.lowlevel.ParkingLot()
        self._work = trio.lowlevel.ParkingLot()
        self._kicked = False  # kick() since the last rest(): level-triggered, a kick is never lost
        self.in_flight: dict[str, int | TupleEdges] = {}  # tuple id -> its token
        #: stream -> its emit plan, compiled on the first emit (Runtime.emit_plan)
        self.plans: dict[str, EmitPlan] = {}
        self.idle = True  # spouts: the last `next` emitted nothing and nothing is owed

    def edges(self, tid: str) -> TupleEdges:
        """The token of tuple ``tid`` in flight, as an emit anchored to it
        needs it: a one-hop token becomes its :class:`TupleEdges` here and
        stays so in ``in_flight`` (anchoring adds to its ``ack_val``;
        acker.edges_of)."""
        tok = self.in_flight[tid]
        if type(tok) is int:
            tok = self.in_flight[tid] = edges_of(tok)
        return tok

    def deliver(self, d: Delivery) -> None:
        self.inbox.append(d)
        # Wake the consumer if it waits. It runs only after the producer
        # yields, so one wake serves a whole batch; later calls find the
        # lot empty and skip the unpark.
        if self._work:
            self._work.unpark_all()

    def deliver_many(self, ds: list[Delivery]) -> None:
        """:meth:`deliver` for a run of tuples: the inbox extended once, the consumer woken once."""
        self.inbox.extend(ds)
        if self._work:
            self._work.unpark_all()

    def full(self) -> bool:
        return len(self.inbox) >= self.capacity

    async def wait_for_space(self) -> None:
        while len(self.inbox) >= self.capacity:
            await self._space.park()

    def kick(self) -> None:
        self._kicked = True  # for a spout not parked yet: its next rest() returns at once (SpoutTask.rest)
        if self._work:  # an empty lot: nothing to wake (this runs per completed tree)
            self._work.unpark_all()

    @property
    def busy(self) -> bool:
        """Work queued or in flight."""
        return bool(self.inbox) or bool(self.in_flight)

    async def run(self) -> None:
        raise NotImplementedError

    def where(self) -> str:
        return f"{self.name}:{self.task_id}"


class SpoutTask(Task):
    """What the runtime asks of every spout task (shell, in-process, or an
    adapter's): the acks and fails owed to it (``notify``), its trees in
    flight (``pending_roots``, kept by the runtime), whether it has nothing
    more to emit (``idle``), and whether it is finished (``finished``)."""

    def __init__(self, runtime: RuntimeSeam, comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self.notices: deque[Any] = deque()  # acks and fails to deliver to the spout
        self.pending_roots = 0
        self.idle = False
        #: when ``at_rest()`` last became ``"dry"`` (trio time): its tenth of the checkpoint interval
        #: is counted from then (checkpoint.py, _quiet_needed)
        self.dry_since = 0.0
        #: its emits' values are hashed with their ids for the checkpoints (Runtime sets it, §9.7)
        self.hash_inputs = False
        #: replays of a failing input (host spouts), or of an emit the host refuses (shell spouts)
        self.max_replays = int(self.conf.get("multilang.max.replays", 3))

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        """A tree of this spout completed (``"ack"``) or failed (``"fail"``, with its cause)."""
        raise NotImplementedError

    def took_replays(self, msg_ids: list[Any]) -> int:
        """How many of these emits, routed now, replay an input of this
        spout that failed (by message id): ``--max-tuples`` does not count
        them. A spout that tracks failed ids forgets those answered."""
        return 0

    async def rest(self, timeout: float | None = None) -> None:
        """Wait for a kick (work, a notice, room under max spout pending), or
        ``timeout`` seconds; at once if one came since the last rest (a kick
        while the spout was busy is not lost). Tells the runtime first: a
        spout at rest may be finished, and the runtime waits for that on an
        event, not a poll."""
        self.runtime.nudge()
        if self._kicked:  # kicked while it was busy (awaiting a command's sync, say): look again now
            self._kicked = False
            await trio.lowlevel.checkpoint()
            return
        if timeout is None:
            await self._work.park()
        else:
            with trio.move_on_after(timeout):
                await self._work.park()
        self._kicked = False

    def refused(self, msg_id: Any, values: list[Any], cause: str) -> None:
        """The host refused an emit of this spout (an undeclared stream, a
        wrong number of values, a normal emit on a direct stream): it would
        be refused the same way on every replay. A spout whose replays the
        host decides (its in-process spouts) gives up on it at once."""
        self.notify("fail", msg_id, Cause.make(cause, final=True))

    def acked(self, msg_ids: list[Any]) -> None:
        """Trees of this spout completed (``notify("ack", ...)`` for each, in one call)."""
        for msg_id in msg_ids:
            self.notify("ack", msg_id)

    def deactivated(self) -> bool:
        """At a stop (§5.4 step 1): it will emit nothing more. An in-process
        spout stops at once; a shell spout once it synced its ``deactivate``
        (after the command it was answering, whose emits the drain delivers)."""
        return True

    def finished(self, limit_reached: bool) -> bool:
        """Nothing is owed to this spout and it will emit nothing more: it is
        idle (exhausted), or ``max_tuples`` was reached and its trees are done."""
        return not self.notices and (self.idle or (limit_reached and self.pending_roots == 0))

    def at_rest(self) -> str | None:
        """Why it emits nothing now, for an early checkpoint (checkpoint.py):
        ``"done"`` (its input ended: only replays may come), ``"dry"`` (its
        last asks gave nothing, but more may come), None (it may emit)."""
        return None

    def not_replayed(self) -> list[Any]:
        """The message ids failed to this spout that it has not emitted
        again; a spout of the host replays by itself (none)."""
        return []

    def check_replays(self, now: float, within: float) -> None:
        """Warn about failed ids not emitted again within ``within`` seconds
        (a shell spout decides about replays; the host's own spouts replay)."""

    def repeated_failures(self) -> list[tuple[str, Any, int, str | None]]:
        """(component, msg id, times failed, last cause) of the ids that kept failing, for the summary."""
        return []

    def replayed_past_max(self) -> list[tuple[str, Any, int, str | None]]:
        """Like :meth:`repeated_failures`, the ids failed more than
        ``multilang.max.replays`` times that this spout still replays (a
        shell spout decides about replays; the host's own spouts give up)."""
        return []
