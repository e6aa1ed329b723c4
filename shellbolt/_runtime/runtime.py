"""The runtime: builds a topology's tasks, routes emits by grouping, runs the
acker and the spouts' reliability, and decides when a run ends (§5.4).

Every task is one trio task under the runtime's nursery (``tasks.py``,
``shell_task.py``, ``bolts.py``, ``spouts.py``).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections import deque
from itertools import repeat
from typing import Any, Callable

import trio

from multilang.errors import ComponentError, ComponentReportedError, TopologyError
from multilang.messages import DEFAULT_STREAM, SYSTEM_COMPONENT, SYSTEM_TASK, TICK_STREAM, Emit

from .._host import scratch
from .._model.acker import Acker, TupleEdges, roots_of
from .._model.grouping import Grouping, Router, grouping_class, new_grouping
from .._model.results import DEAD_LETTER_SAMPLE, ComponentStats, DeadLetter, RunResult, brief, hashable, short_repr, sort_key
from .._model.topology import ANY_FIELDS, ComponentDef, Topology
from .._observe.observe import RunObs, snapshot
from .._observe.ratelog import RateLimitedLog
from .bolts import PythonBoltTask, ShellBoltTask
from .checkpoint import Checkpointer
from .replay_watch import Forever, ReplayWatch
from .spouts import PythonSpoutTask, ShellSpoutTask
from .tasks import TICK_EDGES, Delivery, EmitPlan, SpoutTask, Task, log, plain_emit

__all__ = ["Runtime"]

_new_tuple = tuple.__new__
#: the anchor of an unanchored emit in a run (route_batch): no roots, so the acker adds no edge
_UNANCHORED = TupleEdges()
#: seconds done() must stay true before a run that waits until done ends
_CONFIRM_DONE = 0.05
#: the longest wait between two looks at done() / drained
_BACKSTOP = 1.0
#: seconds late the expiry tick may be before the host counts itself absent (stopped or starved): _excuse_silence
_ABSENT_SECS = 5.0


class Runtime:
    """Runs a :class:`~multilang.shellbolt._model.topology.Topology` on trio.

    ``on_output(record)`` receives each output tuple (a dict with
    ``component``, ``stream`` and the fields) unless the topology's output has
    a ``key``, in which case the last tuple per key is kept and returned in
    :class:`RunResult` when the run ends.

    ``on_tracked_output(component, stream, values, roots)``, if given, gets
    every output tuple instead (no record building, no ``key``), with the
    acker root ids it belongs to (empty if unanchored): the Spark adapter
    holds a root's outputs until its tree completes.

    ``checkpointing``: stateful bolts (§9.7) get their state from, and
    checkpoint it to, the store ``topology.state.provider`` names; False: no
    process is offered ``state`` (an engine that keeps state its own way)."""

    def __init__(
        self, topology: Topology, *, on_output: Callable[[dict[str, Any]], None] | None = None,
        on_tracked_output: Callable[[str, str, list[Any], list[int]], None] | None = None,
        checkpointing: bool = True, placement: Any = None,
    ) -> None:
        self.topology = topology
        #: host workers (``topology.workers``, shellbolt/_workers): this process's ``worker`` of
        #: ``workers``, ``where`` (task id -> worker) and ``remote(runtime, comp, task_id)``, the
        #: stand-in of a task another worker runs; None: every task runs here
        self.placement = placement
        self.on_tracked_output = on_tracked_output
        conf = topology.conf
        self.acking = conf.get("topology.acker.executors") != 0
        timeout = float(conf.get("topology.message.timeout.secs") or 30)
        self.acker = Acker(timeout) if placement is None else \
            Acker(timeout, worker=placement.worker, workers=placement.workers)
        self.max_spout_pending = conf.get("topology.max.spout.pending")
        self.stats = {name: ComponentStats() for name in topology.components}
        #: run-wide observations for observe.snapshot (the live view, metrics)
        self.observer = RunObs()
        self.on_output = on_output
        out = topology.output
        if (out.component is not None or out.stream is not None) and not out.key and on_output is None \
                and on_tracked_output is None:
            log.warning("the output (%s) has no key and this Runtime has no on_output: its tuples are not kept "
                        "(RunResult.outputs holds the last tuple per key of an output with a key); pass "
                        "on_output= to get each one", out.component or out.stream)
        self.outputs_by_key: dict[Any, dict[str, Any]] = {}
        #: on host workers: key -> when (the system's monotonic clock, the same in every worker) its record in
        #: the view came; the main process keeps each key's latest over the workers (a key's records may come
        #: from tasks of several workers: a shuffle into the output component)
        self.output_stamps: dict[Any, int] | None = None if placement is None else {}
        #: on host workers: key -> (stamp, record) of a view without state, since the link last sent them to the
        #: main process (a worker killed with kill -9 would take them with it)
        self.view_changes: dict[Any, tuple[int, dict[str, Any]]] = {}
        #: on host workers (set by the link): the output batch that a tree completing now waits for (the
        #: outputs not yet sent to the main process may be its), or None where none is on its way
        self.outputs_unsent: Callable[[], int | None] | None = None
        #: (that batch, the (spout task, msg id) of the trees that completed): their spouts are told once the
        #: batch is sent (release_completions). A spout told first may make its ack durable (a committed
        #: offset) and never emit the tree again, and a worker killed before the send takes the outputs with it.
        self.held_completions: list[tuple[int, list[tuple[int, Any]]]] = []
        self.router = Router()
        self.tasks: dict[int, Task] = {}
        self.gave_up: list[ComponentError] = []
        #: the latest `error` commands (at most 100: a bolt may report one per tuple)
        self.reported_errors: deque[ComponentReportedError] = deque(maxlen=100)
        self.spouts_stopped = False
        self.stopping = False
        self.emitted_by_spouts = 0  # tuples emitted by spouts, any stream, replays included
        #: of those, replays of failed inputs (SpoutTask.took_replays): max_tuples counts the rest, so that
        #: a failure (a kill, a rollback) takes no fresh input's place (fresh_by_spouts)
        self.replays_by_spouts = 0
        #: `next`s sent to shell spouts and not yet answered, within max_tuples: the room they may fill (each
        #: spout task asks for the room left, and two asking at once must not both be given all of it)
        self.nexts_out = 0
        self.max_tuples: int | None = None
        #: max_tuples held at the fresh inputs taken and the `next`s out, and lowered as those come back
        #: (cap_fresh)
        self.fresh_capped = False
        self.pid_dir = ""
        self._stop: trio.Event | None = None  # made by run(), inside trio
        #: set by nudge() when something changed that may end a wait of run()
        #: (a tree finished, a spout came to rest, a stop was asked for)
        self._changed: trio.Event | None = None
        self._stop_requested = False
        self._stopped_by: str | None = None
        #: set by abort(): every process is closed without its kill grace
        self.hurry: trio.Event | None = None
        #: errors that may repeat per tuple: logged once per kind per 10 s, with a count
        self.errlog = RateLimitedLog(log)
        self.last_emit_error: str | None = None
        self._restart_times: dict[str, deque[float]] = {}
        #: receives each DeadLetter (``multilang run --dead-letter FILE``)
        self.on_dead_letter: Callable[[DeadLetter], None] | None = None
        self.dead_letters = 0
        #: ``multilang run --record DIR``: a record.Recorder; each shell task's processes are then spawned with
        #: their stdin and stdout recorded (record.py). None: spawned as they are
        self.recorder: Any = None
        self._dead_letter_sample: list[DeadLetter] = []
        self._build()
        #: stateful bolts' checkpoints (§9.7); opens a named state store now
        try:
            self.checkpoints = (None if not checkpointing else Checkpointer(self) if placement is None
                                else placement.checkpointer(self))
        except TopologyError as exc:  # (a named state store refused)
            raise topology.named(exc) from None
        #: a resumed run, or a spout process restarted: (spout, msg id) -> whether a checkpoint committed it
        self._skip = self.checkpoints.skip if self.checkpoints is not None and self.checkpoints.resuming else None
        cp = self.checkpoints
        for t in self.tasks.values():
            if isinstance(t, SpoutTask):
                # Whose inputs may be skipped one day as "already committed" (a shell spout's process may die
                # and start its input again; any spout's, on a resume): their values' hash goes with the id.
                t.hash_inputs = cp is not None and (t.comp.is_shell or cp.named)
        if self.checkpoints is not None and self._key_index is not None:
            for record in self.checkpoints.resumed_outputs():  # a resumed run prints the whole run's view
                self.outputs_by_key[self._view_key(record)] = record

    def _build(self) -> None:
        topo = self.topology
        topo.check_commands()  # a missing program is a TopologyError now, not a crash loop
        placement = self.placement
        for comp in topo.components.values():
            for t in comp.tasks:
                if placement is not None and placement.where[t] != placement.worker:
                    self.tasks[t] = placement.remote(self, comp, t)
                    continue
                if comp.kind == "spout":
                    cls = ShellSpoutTask if comp.is_shell else PythonSpoutTask
                else:
                    cls = ShellBoltTask if comp.is_shell else PythonBoltTask
                self.tasks[t] = cls(self, comp, t)
        for comp in topo.components.values():
            for inp in comp.inputs:
                src_fields = topo.components[inp.source].outputs[inp.stream]
                tasks = list(comp.tasks)
                if placement is not None and grouping_class(inp.grouping).prefers_local:  # (this worker's, if any)
                    tasks = [t for t in tasks if placement.where[t] == placement.worker] or tasks
                self.router.add(inp.source, inp.stream, new_grouping(
                    inp.grouping, comp.name, tasks, [src_fields.index(f) for f in inp.fields]))
        out = topo.output
        self._key_index: list[int] | None = None
        if out.component and out.key:
            fields = topo.components[out.component].outputs[out.stream or "default"]
            self._key_index = [fields.index(k) for k in out.key]

    # -- routing -----------------------------------------------------------------

    def subscribers(self, component: str, stream: str) -> list[Grouping]:
        """The subscriptions to a component's stream: one grouping object
        per subscribing bolt, in the order they subscribed."""
        return self.router.subscribers(component, stream)

    def emit_plan(self, src: Task, stream: str) -> EmitPlan:
        """The emit plan of a task's stream (:class:`EmitPlan`), compiled on
        its first emit and kept in ``src.plans``."""
        plan = src.plans.get(stream)
        if plan is None:
            fields = src.comp.outputs.get(stream)
            subs = self.router.subscribers(src.name, stream)
            one = False if fields is None or len(subs) > 1 or any(g.direct for g in subs) else subs[0] if subs else None
            n = 0 if fields is None else -1 if fields == ANY_FIELDS else len(fields)
            plan = src.plans[stream] = EmitPlan(fields, n, subs, self.router.direct_targets(src.name, stream), one)
        return plan

    def targets(self, src: Task, emit: Emit) -> list[int] | None:
        """Destination tasks of an emit, or None if it is invalid (reported)."""
        fields, _n, subs, direct, _one = self.emit_plan(src, emit.stream)
        if fields is None:
            return self._emit_error(src, emit, f"emitted to undeclared stream {emit.stream!r}; "
                                               f"declared: {sorted(src.comp.outputs)}")
        if len(emit.values) != len(fields) and fields != ANY_FIELDS:
            return self._emit_error(src, emit, f"emitted {len(emit.values)} values on stream {emit.stream!r}, "
                                               f"which declares {len(fields)} fields {fields}")
        if emit.task is not None:
            if emit.task not in direct:
                return self._emit_error(src, emit, f"direct emit to task {emit.task}, which does not subscribe to "
                                                   f"{src.name}/{emit.stream} with a direct grouping")
            return [emit.task]
        if len(subs) == 1 and not subs[0].direct:
            return subs[0].choose(emit.values)
        out: list[int] = []
        for g in subs:
            if g.direct:
                return self._emit_error(src, emit, f"normal emit on stream {emit.stream!r}, which {g.target!r} "
                                                   "subscribes to with a direct grouping; use emit_direct")
            out.extend(g.choose(emit.values))
        return out

    def route(
        self, src: Task, emit: Emit, anchors: list[TupleEdges] | None, touched: set[Task],
        targets: list[int] | None = None, invalid: bool = False,
    ) -> list[int]:
        """Deliver an emit: acker bookkeeping, then one Delivery per task.
        Returns the task ids (the reply to an emit that wants them).
        ``invalid``: :meth:`targets` already found and reported it bad."""
        if targets is None and not invalid:
            targets = self.targets(src, emit)
        if targets is None:  # invalid emit: already reported; fail what it belonged to
            cause = self.last_emit_error
            if anchors:
                for a in anchors:
                    self.acker.fail(a, cause)
            elif emit.id is not None and isinstance(src, SpoutTask):
                src.refused(emit.id, emit.values, cause or "")
            return []
        self._deliver(src, emit.values, emit.stream, targets, anchors, emit.id, touched)
        return targets

    def route_plain(self, src: Task, values: list[Any], stream: str, anchors: list[TupleEdges] | None,
                    touched: set[Task], msg_id: Any = None, now: float | None = None) -> None:
        """:meth:`route` for an emit that is not direct and wants no task
        ids (a bolt's from a batch, §9.5, or an in-process spout's), without
        building an emit object: the stream's checks are worked out once per
        task and stream. Anything unusual (an undeclared stream, a wrong
        number of values, direct or several subscriptions) goes through
        :meth:`route`. ``now``: a spout's clock reading for its burst."""
        plan = src.plans.get(stream) or self.emit_plan(src, stream)
        if not plan.takes(values):
            self.route(src, plain_emit(values, stream, msg_id=msg_id), anchors, touched)
            return
        grouping = plan.one
        self._deliver(src, values, stream, [] if grouping is None else grouping.choose(values), anchors, msg_id, touched,
                      now)

    def route_spout_burst(self, src: Task, values_list: list[list[Any]], msg_ids: list[Any], touched: set[Task],
                          now: float) -> None:
        """A spout's burst of reliable emits on the default stream (an
        in-process spout's, or a shell spout's §9.5 batch), as
        :meth:`route_plain` would route each, in one call when
        each goes to one task (shuffle, fields, global): the acker registers
        the trees in one step and each inbox is filled in one step."""
        _f, n_fields, _s, _d, grouping = self.emit_plan(src, DEFAULT_STREAM)
        if (not self.acking or grouping is None or grouping is False or not grouping.one_task
                or n_fields >= 0 and any(len(v) != n_fields for v in values_list)
                or self._skip is not None or src.hash_inputs):  # type: ignore[attr-defined]
            for values, msg_id in zip(values_list, msg_ids):
                self.route_plain(src, values, DEFAULT_STREAM, None, touched, msg_id, now)
            return
        n = len(msg_ids)
        src.stats.emitted += n
        self.emitted_by_spouts += n
        self.replays_by_spouts += src.took_replays(msg_ids)  # type: ignore[attr-defined]
        src.pending_roots += n  # type: ignore[attr-defined]  (a spout: route_spout_burst)
        tokens = self.acker.spout_emits(src.task_id, msg_ids, now)
        targets = grouping.choose_each(values_list)
        tasks, name, src_task = self.tasks, src.name, src.task_id
        if len(grouping.tasks) == 1:  # one bolt task: its inbox takes the burst in one step
            t = tasks[targets[0]]
            t.inbox.extend([_new_tuple(Delivery, (values, name, DEFAULT_STREAM, src_task, e, False))
                            for values, e in zip(values_list, tokens)])
            touched.add(t)
        else:
            for values, e, target in zip(values_list, tokens, targets):
                t = tasks[target]
                t.inbox.append(_new_tuple(Delivery, (values, name, DEFAULT_STREAM, src_task, e, False)))
                touched.add(t)
        for t in touched:
            t.kick()

    def route_emits(self, src: Task, emits: list[list[Any]], touched: set[Task]) -> None:
        """A bolt's batch of emits (§9.5, or a run from ``take_outputs``), each
        ``[values, anchor ids or None, stream]``, anchored to tuples
        in ``src.in_flight`` (the connection checked they are pending): each as
        :meth:`route_plain` would, the runs on one stream with at most one
        anchor each as one :meth:`route_batch` (of at most
        ``topology.producer.batch.size`` emits)."""
        i, n, most = 0, len(emits), src.batch_size
        while i < n:
            values, ids, stream = emits[i]
            if ids is not None and len(ids) > 1:  # several anchors: the general route
                self.route_plain(src, values, stream, [src.edges(a) for a in ids], touched)
                i += 1
                continue
            j = i + 1
            while j < n and j - i < most and (e := emits[j])[2] == stream and (e[1] is None or len(e[1]) <= 1):
                j += 1
            run = emits[i:j] if i or j < n else emits
            self.route_batch(src, stream, [e[0] for e in run], [e[1][0] if e[1] else None for e in run], touched)
            i = j

    def route_batch(self, src: Task, stream: str, values_list: list[list[Any]], anchor_ids: list[str | None],
                    touched: set[Task]) -> None:
        """A run of a bolt's plain emits on one stream, the i-th anchored to
        the tuple ``anchor_ids[i]`` of ``src.in_flight`` (None: unanchored),
        routed as one: targets chosen for the run, one new edge per emit from
        the acker in one call, each target's inbox extended once and woken
        once, outputs kept in one step. Delivers, acks and counts exactly
        what :meth:`route_plain` would for each emit in turn (per target,
        in order). A run the plain lane does not take (an undeclared
        stream, a wrong number of values, several subscriptions or a direct
        one, an ``all`` grouping) goes emit by emit."""
        plan = src.plans.get(stream) or self.emit_plan(src, stream)
        grouping = plan.one
        if not all(map(plan.takes, values_list)) or grouping is not None and not grouping.one_task:
            for values, a in zip(values_list, anchor_ids):
                self.route_plain(src, values, stream, [] if a is None else [src.edges(a)], touched)
            return
        src.stats.emitted += len(values_list)
        if grouping is None:  # nobody subscribes: topology outputs (no new edges, §7.1)
            in_flight = src.in_flight
            self._outputs(src.name, stream, values_list, [None if a is None else tok if type(tok := in_flight[a]) is int
                                                          else tok.ids for a in anchor_ids])
            return
        edges = src.edges
        new_edges = self.acker.anchor_each([_UNANCHORED if a is None else edges(a) for a in anchor_ids])
        name, src_task, tasks = src.name, src.task_id, self.tasks
        if len(grouping.tasks) == 1:
            t = tasks[grouping.tasks[0]]
            t.deliver_many([_new_tuple(Delivery, (values, name, stream, src_task, e, False))
                            for values, e in zip(values_list, new_edges)])
            touched.add(t)
            return
        by_task: dict[int, list[Delivery]] = {}
        for values, e, target in zip(values_list, new_edges, grouping.choose_each(values_list)):
            run = by_task.get(target)
            d = _new_tuple(Delivery, (values, name, stream, src_task, e, False))
            if run is None:
                by_task[target] = [d]
            else:
                run.append(d)
        for target, run in by_task.items():
            t = tasks[target]
            t.deliver_many(run)
            touched.add(t)

    def _deliver(self, src: Task, values: list[Any], stream: str, targets: list[int],
                 anchors: list[TupleEdges] | None, msg_id: Any, touched: set[Task], now: float | None = None) -> None:
        """A valid emit to ``targets``: acker bookkeeping, then one Delivery
        per task, or the topology's output if nobody subscribes."""
        replay = anchors is None and msg_id is not None and src.took_replays([msg_id])  # type: ignore[attr-defined]
        if self._skip is not None and anchors is None and msg_id is not None:
            skip = self._skip(src, msg_id, values)
            if skip is not False:  # §9.7: committed already (acked now), or its tree is in flight (it answers)
                src.stats.skipped += 1
                if skip:
                    src.notify("ack", msg_id)  # type: ignore[attr-defined]
                return
        src.stats.emitted += 1
        n = len(targets)
        if anchors is None:  # a spout emit
            self.emitted_by_spouts += 1
            self.replays_by_spouts += replay
            if msg_id is not None and self.acking:
                now = trio.current_time() if now is None else now
                if n == 1:  # a one-hop token (acker.py)
                    root = self.acker.spout_root(src.task_id, msg_id, now)
                    edges = [root]
                else:
                    root, edges = self.acker.spout_emit(src.task_id, msg_id, n, now)
                src.pending_roots += 1  # type: ignore[attr-defined]
                if src.hash_inputs:  # type: ignore[attr-defined]  (a spout: the hash goes with the id, §9.7)
                    self.checkpoints.remember(root, values)  # type: ignore[union-attr]
                if self._skip is not None:
                    self.checkpoints.registered(src, msg_id, root)  # type: ignore[union-attr]
            else:
                if msg_id is not None:  # §4.7: acking off, acked after this command's sync
                    src.stats.acked += 1  # (as Storm's spout counts the ack it gets at once)
                    src.notify("ack", msg_id)  # type: ignore[attr-defined]
                edges = [TupleEdges() for _ in range(n)]
        elif n:
            edges = self.acker.anchor(anchors, n) if anchors else [TupleEdges() for _ in range(n)]
        if not n:  # an output (a bolt's: no new edges, §7.1)
            self._emit_output(src, stream, values, anchors)
            return
        tasks = self.tasks
        name, src_task = src.name, src.task_id
        for task_id, e in zip(targets, edges):
            t = tasks[task_id]
            t.deliver(_new_tuple(Delivery, (values, name, stream, src_task, e, False)))
            touched.add(t)

    def _emit_output(self, src: Task, stream: str, values: list[Any], anchors: list[TupleEdges] | None) -> None:
        """An emit nobody subscribes to: a topology output."""
        self._outputs(src.name, stream, [values], [{r for a in anchors for r in roots_of(a)} if anchors else None])

    def _emit_error(self, src: Task, emit: Emit, msg: str) -> None:
        src.stats.errors += 1
        pid = getattr(getattr(src, "proc", None), "pid", None)
        who = src.where() if pid is None else f"{src.where()} (pid {pid})"
        self.last_emit_error = f"{who}: {msg}"
        src.stats.error(msg)
        self.errlog.log(src.where(), logging.ERROR, trio.current_time(),
                        "%s: %s; the tuple %r is dropped and its tree failed", who, msg, brief(repr(emit.values)))
        return None

    def _outputs(self, component: str, stream: str, values_list: list[list[Any]], roots: list[Any]) -> None:
        """Topology outputs: a run of emits of one component on one stream,
        the i-th belonging to the trees ``roots[i]``: a root id, a
        collection of root ids, or None (an unanchored emit, a tick's).
        Tracked outputs get each with its roots; a keyed output keeps the
        last record per key (until the checkpoint that covers it commits,
        with state); otherwise ``on_output`` gets each record."""
        if self.on_tracked_output is not None:
            on_tracked = self.on_tracked_output
            for values, r in zip(values_list, roots):
                on_tracked(component, stream, values, [] if r is None else [r] if type(r) is int else list(r))
            return
        out = self.topology.output
        if out.component is not None and (component != out.component or stream != (out.stream or "default")):
            return
        fields = self.topology.components[component].outputs[stream]
        # Records carry their origin unless the output names it already.
        if out.component is not None:
            records = ([{"values": values} for values in values_list] if fields == ANY_FIELDS else
                       [dict(zip(fields, values)) for values in values_list])
        elif fields == ANY_FIELDS:
            records = [{"component": component, "stream": stream, "values": values} for values in values_list]
        else:
            records = [{"component": component, "stream": stream, **dict(zip(fields, values))} for values in values_list]
        key_index = self._key_index
        if key_index is not None:
            if len(key_index) == 1:
                k = key_index[0]
                keys = [(v[k] if type(v[k]) is str else hashable(v[k]),) for v in values_list]
            else:
                keys = [tuple(hashable(v[i]) for i in key_index) for v in values_list]
            cp = self.checkpoints
            stamps = self.output_stamps
            if stamps is not None:
                now = time.monotonic_ns()
                stamps.update(dict.fromkeys(keys, now))
            if cp is not None and cp.tasks:  # durable with the state: kept until its checkpoint commits
                cp.outputs(keys, records, roots)
            else:
                self.outputs_by_key.update(zip(keys, records))
                if stamps is not None:
                    self.view_changes.update(zip(keys, zip(repeat(now), records)))
                    self.on_view_change()
        elif self.on_output is not None:
            for record in records:
                self.on_output(record)

    def on_view_change(self) -> None:
        """The keyed view of a component without state changed (on host workers: the link sends it)."""

    def _view_key(self, record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(hashable(record.get(k)) for k in self.topology.output.key or [])

    def commit_view(self, updates: dict[Any, dict[str, Any]]) -> None:
        """The output view's changes that a checkpoint just committed (§9.7)."""
        self.outputs_by_key.update(updates)

    def view_so_far(self) -> dict[Any, dict[str, Any]]:
        """The keyed output view as a run that ends now shows it: the last
        record per key, committed or not (one a checkpoint has not covered
        yet is shown, and marked nowhere)."""
        view = self.outputs_by_key
        if self.checkpoints is not None and self.checkpoints.view:
            view = {**view, **{k: r for k, (r, _) in self.checkpoints.view.items()}}
        return view

    # -- acker results -------------------------------------------------------------

    def nudge(self) -> None:
        """Something changed that may end a wait of :meth:`run` (done,
        drained, a checkpoint's cut): wakes every :meth:`wait_for_change`."""
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    async def wait_for_change(self) -> None:
        """Wait for the next :meth:`nudge`, or a second at most: a backstop,
        so that a state change no nudge announces (none is known) costs a
        second, not a run that never ends."""
        changed = self._changed
        if changed is None:
            changed = self._changed = trio.Event()
        with trio.move_on_after(_BACKSTOP):
            await changed.wait()

    def settle(self) -> None:
        """Tell spouts about trees that completed or failed."""
        if self.acker.watch_failed is not None:  # a tree that touched a stateful bolt failed: §9.7 rollback
            self.checkpoints.rollback(self.acker.watch_failed)  # type: ignore[union-attr]
        acked, failed, causes = self.acker.drain_with_causes()
        if acked and self.outputs_unsent is not None:
            batch = self.outputs_unsent()
            if batch is not None:
                self.held_completions.append((batch, acked))
                acked = []
        if not acked and not failed:
            return
        self.nudge()
        if acked:
            self._tell_acked(acked)
        # (the live view's stall counts from the first failure since the last completion too)
        if failed and self.observer.failing_since is None:
            self.observer.failing_since = trio.current_time()
        tasks = self.tasks
        for (task_id, msg_id), cause in zip(failed, causes):
            t = tasks[task_id]
            t.pending_roots -= 1  # type: ignore[attr-defined]
            t.stats.failed += 1
            t.notify("fail", msg_id, cause)  # type: ignore[attr-defined]

    def release_completions(self, sent: int) -> None:
        """The outputs up to batch ``sent`` are with the main process: tell
        the spouts of the trees that waited for them (:attr:`held_completions`)."""
        held = self.held_completions
        n = 0
        while n < len(held) and held[n][0] <= sent:
            n += 1
        if n:
            acked = [a for _, batch in held[:n] for a in batch]
            del held[:n]
            self.nudge()
            self._tell_acked(acked)

    def _tell_acked(self, acked: list[tuple[int, Any]]) -> None:
        """Tell spouts about trees that completed: ``(spout task, msg id)``."""
        tasks = self.tasks
        now = trio.current_time()
        self.observer.last_completion = now
        self.observer.failing_since = None
        done = self.acker.last_done  # its age stands for the trees completed with it (observe.py)
        by_spout: dict[int, list[Any]] = {}
        for task_id, msg_id in acked:
            ids = by_spout.get(task_id)
            if ids is None:
                ids = by_spout[task_id] = []
            ids.append(msg_id)
        for task_id, ids in by_spout.items():
            t = tasks[task_id]
            t.pending_roots -= len(ids)  # type: ignore[attr-defined]
            t.stats.acked += len(ids)
            if done is not None and done.spout_task == task_id:
                t.obs.completed(now, now - done.deadline + self.acker.timeout, len(ids))
            t.acked(ids)  # type: ignore[attr-defined]

    @property
    def fresh_by_spouts(self) -> int:
        """What ``max_tuples`` counts: the spouts' emits less their replays
        of failed inputs. A replay counted took a fresh input's place: a
        shell spout restarted after a rollback emits its failed inputs again
        with the rest of its source, and --max-tuples 5600 with such kills
        committed 5,400 or 5,200 inputs, not 5,600."""
        return self.emitted_by_spouts - self.replays_by_spouts

    def cap_fresh(self) -> None:
        """No fresh input beyond those taken and what the `next`s out may
        still bring, now and as those come back (``max_tuples`` follows them
        down). Host workers: a worker whose spouts ran dry leaves the rest of
        its share of --max-tuples to the others (coordinator.py, share_out);
        capped at the `next`s out only once, the room a dry spout's `next`
        did not fill was asked for again, and never handed on."""
        self.fresh_capped = True
        if self.max_tuples is not None:
            self.max_tuples = min(self.max_tuples, self.fresh_by_spouts + self.nexts_out)

    def may_emit(self, spout: Task, replay: bool = False) -> bool:
        """Whether a spout may emit now. A replay may go past ``max_tuples``
        (the limit counts the spouts' fresh inputs; a failed tree of those
        must still be replayed), not past max spout pending."""
        return self.emit_room(spout, replay) > 0

    def emit_room(self, spout: Task, replay: bool = False) -> int:
        """How many more inputs a spout may emit now (``may_emit``), counted
        as ``max_tuples`` and max spout pending count them; a large number
        for no limit."""
        room = 1 << 30
        if not replay and self.max_tuples is not None:
            room = self.max_tuples - self.fresh_by_spouts - self.nexts_out
        if self.checkpoints is not None and self.checkpoints.paused:  # a checkpoint waits for its cut (§9.7)
            return 0
        msp = self.max_spout_pending
        if msp is not None:
            room = min(room, msp - spout.pending_roots)  # type: ignore[attr-defined]
        return max(room, 0)

    def restart_times(self, component: str) -> deque[float]:
        """The recent restart times of a component, shared by its tasks."""
        return self._restart_times.setdefault(component, deque())

    def skip_committed(self) -> None:
        """From now on a spout emit whose message id a checkpoint committed is
        acked at once, not delivered (a restarted spout process, §9.7)."""
        if self.checkpoints is not None:
            self._skip = self.checkpoints.skip

    def dead_letter(self, spout: Task, msg_id: Any, values: list[Any], cause: str | None, attempts: int,
                    line: int | None = None) -> None:
        """A spout of the host gives up on an input after multilang.max.replays
        (``line``: its line in the spout's input, multilang pipe's stdin)."""
        letter = DeadLetter(spout.name, spout.task_id, msg_id, values, cause or "failed (cause unknown)", attempts)
        letter.line = line
        self.dead_letters += 1
        spout.stats.dead_letters += 1
        if len(self._dead_letter_sample) < DEAD_LETTER_SAMPLE:
            self._dead_letter_sample.append(letter)
        if self.on_dead_letter is not None:
            self.on_dead_letter(letter)  # (multilang pipe's sets the input's line number first)
        # "stdin line 3", not the task "stdin:2" that reads like a line number (nor in "stdin: 5 more like this")
        where = spout.where() if letter.line is None else f"{spout.name} line {letter.line}"
        kind = spout.where() if letter.line is None else spout.name
        if attempts:
            self.errlog.log(kind, logging.ERROR, trio.current_time(),
                            "%s: gave up on input %s after %d attempt(s); last cause: %s",
                            where, brief(short_repr(values)), attempts, letter.cause)
        else:
            self.errlog.log(kind, logging.ERROR, trio.current_time(), "%s: input %s not sent: %s",
                            where, brief(short_repr(values)), letter.cause)

    def abort(self) -> None:
        """Stop at once: the caller cancels the run; this makes the processes
        go without their grace periods (a second Ctrl-C)."""
        self._stopped_by = self._stopped_by or "signal"
        if self.hurry is not None:
            self.hurry.set()

    def give_up(self, err: ComponentError) -> None:
        self.gave_up.append(err)
        self.request_stop("gave_up")

    def request_stop(self, reason: str = "request") -> None:
        """Stop the run: spouts are deactivated and in-flight trees get up to
        ``multilang.shutdown.grace.secs`` to finish (§5.4); then it returns
        its result. A signal handler calls this with ``reason="signal"``."""
        self._stop_requested = True
        if self._stopped_by is None:
            self._stopped_by = reason
        if self._stop is not None:
            self._stop.set()
        self.nudge()

    # -- running -------------------------------------------------------------------

    def done(self) -> bool:
        """Every spout is idle (exhausted, or stopped by ``max_tuples``) and
        nothing is queued or in flight anywhere."""
        limit_reached = self.max_tuples is not None and self.fresh_by_spouts >= self.max_tuples
        for t in self.tasks.values():
            if isinstance(t, SpoutTask):
                if not t.finished(limit_reached):
                    return False
            elif t.busy:
                return False
        return self.acker.pending == 0 and not self.held_completions

    async def run(
        self, *, duration: float | None = None, max_tuples: int | None = None, until_done: bool = False,
        progress: Callable[["Runtime"], None] | None = None, progress_interval: float = 2.0,
        metrics: Any = None,
    ) -> RunResult:
        """Run until ``duration`` passes, ``max_tuples`` spout tuples are
        emitted and their trees finish, every spout is exhausted
        (``until_done``), a component gives up, :meth:`request_stop` is
        called, or the caller cancels. Every way but cancellation drains the
        trees in flight for up to the shutdown grace (§5.4) and returns the
        result; what is still in flight then is abandoned at stop.
        ``metrics``: a :class:`~multilang.shellbolt._observe.metrics.MetricsReporter`
        served while the run runs, closed (a last line) when it ends."""
        self._stop = trio.Event()
        self.hurry = trio.Event()
        if self._stop_requested:
            self._stop.set()
        self.max_tuples = max_tuples
        self.pid_dir = scratch.make("multilang-pids-")  # mode 0700 (§2.1)
        self.observer.begin(trio.current_time(), self.tasks.values())
        try:
            async with trio.open_nursery() as nursery:
                for t in self.tasks.values():
                    nursery.start_soon(t.run)
                nursery.start_soon(self._expire_loop)
                if self.checkpoints is not None:
                    nursery.start_soon(self.checkpoints.run)
                for comp in self.topology.components.values():
                    freq = self.topology.conf_for(comp.name).get("topology.tick.tuple.freq.secs")
                    if freq and comp.kind == "bolt":
                        nursery.start_soon(self._ticks, comp, float(freq))
                if progress is not None:
                    nursery.start_soon(self._progress, progress, progress_interval)
                if metrics is not None:
                    nursery.start_soon(metrics.run, self)
                with trio.move_on_after(math.inf if duration is None else duration) as timer:
                    # (a host worker's runtime runs until the main process says stop: it decides when a run
                    # is done, from every worker's counts; a worker's max_tuples only stops its spouts)
                    await self._wait_for_stop((until_done or max_tuples is not None) and self.placement is None)
                if self._stopped_by is None:
                    # ("max_tuples" where the limit was reached; "done" where the spouts were done first, as on Spark)
                    self._stopped_by = ("duration" if timer.cancelled_caught else "max_tuples"
                                        if max_tuples is not None and self.fresh_by_spouts >= max_tuples else "done")
                await self._drain()
                self.stopping = True
                nursery.cancel_scope.cancel()
        finally:
            self.stopping = True
            self.observer.finish(trio.current_time())
            if progress is not None and hasattr(progress, "finish"):
                progress.finish(self)  # the last frame: the final counters, before the caller's summary
            self.errlog.flush(trio.current_time())
            if metrics is not None:
                metrics.close(self)  # the last line: the run's final counts
            shutil.rmtree(self.pid_dir, ignore_errors=True)
            if self.checkpoints is not None:
                self.checkpoints.close()
        return self.result()

    async def _wait_for_stop(self, until_done: bool) -> None:
        assert self._stop is not None
        if not until_done:
            await self._stop.wait()
            return
        # Past --max-tuples the trees get their replays, not for ever: a bolt that never
        # acks, or a shell spout replaying a tuple that fails every time, would never end.
        # Nor without a limit: a run that only replays its poison stops (replay_watch.py).
        stats = self.acker.stats
        watch = ReplayWatch(self.topology, self.acker.timeout, trio.current_time(), stats["completed"], stats["failed"])
        while not self._stop.is_set():
            if self.done():
                # Confirm over a short quiet period: a shell spout between two
                # empty nexts looks finished (it backs off up to 50 ms between
                # them, Storm's spout wait strategy) and may still emit.
                with trio.move_on_after(_CONFIRM_DONE):
                    await self._stop.wait()
                if self._stop.is_set() or self.done():
                    return
                continue
            now = trio.current_time()
            if self.max_tuples is not None and watch.past_limit(now, self.fresh_by_spouts, self.max_tuples,
                                                                stats["failed"], self.acker.pending):
                return
            # (with --max-tuples, past_limit ends such a run: no id is replayed for ever then)
            if watch.check(now, stats["completed"], stats["failed"],
                           self.replayed_past_max if self.max_tuples is None else list):
                self._stopped_by = "replays"
                return
            with trio.move_on_at(watch.due_at):
                await self.wait_for_change()  # a tree finished, a spout came to rest, or a stop was asked for

    def replayed_past_max(self) -> list[Forever]:
        """The ids this runtime's shell spouts replay past multilang.max.replays (replay_watch.py)."""
        return [r for t in self.tasks.values() if isinstance(t, SpoutTask) for r in t.replayed_past_max()]

    def kick_spouts(self, but: Task | None = None) -> None:
        """Every spout task (``but`` one) looks again at whether it may emit
        (a checkpoint ended, room under --max-tuples came back)."""
        for t in self.tasks.values():
            if t is not but and isinstance(t, SpoutTask):
                t.kick()

    def stop_spouts(self) -> None:
        """§5.4 step 1: every spout is deactivated (it emits nothing more)."""
        self.spouts_stopped = True
        for t in self.tasks.values():
            t.kick()

    def drained(self) -> bool:
        """The spouts are stopped and deactivated, and nothing is queued or in
        flight anywhere: what :meth:`done` is once spouts were stopped."""
        for t in self.tasks.values():
            if isinstance(t, SpoutTask):
                if not self.spouts_stopped or not t.deactivated() or t.notices:
                    return False
            elif t.busy:
                return False
        return self.acker.pending == 0 and not self.held_completions

    async def _drain(self) -> None:
        """Deactivate spouts, let in-flight trees finish and hand the spouts
        the acks and fails owed to them, within the shutdown grace (§5.4).
        A component that gave up cuts this short (on host workers, one of
        another worker's: the main process stops the run for "gave_up");
        nothing else does."""
        self.stop_spouts()
        gave_up = bool(self.gave_up) or self._stopped_by == "gave_up"
        grace = float(self.topology.conf.get("multilang.shutdown.grace.secs") or 0)
        if self.placement is not None:
            # A host worker: the main process gave the trees their grace across every worker before it
            # said finish (shellbolt/_workers). Waiting for them again here stopped a run in twice the grace.
            grace = 0.0
        spouts = [t for t in self.tasks.values() if isinstance(t, SpoutTask)]
        with trio.move_on_after(grace):
            # A spout answering a `next` may still emit: its trees get the grace too.
            while (self.acker.pending or not all(t.deactivated() for t in spouts)) and not gave_up:
                await self.wait_for_change()
            if self.checkpoints is not None and not gave_up:
                await self.checkpoints.final()
        # The acks and fails owed to spouts, also after the grace ran out: a
        # spout told "ack" commits its position; one left untold replays.
        self.settle()
        if gave_up:
            self._give_up_read_once(spouts)
        with trio.move_on_after(max(grace, 1.0)):
            while any(t.notices for t in spouts) and not gave_up:
                await self.wait_for_change()

    def _give_up_read_once(self, spouts: list[SpoutTask]) -> None:
        """A component gave up: the spouts whose inputs cannot be read again
        (``PythonSpoutTask.read_once``: multilang pipe's stdin) give up on
        every input not done, each a dead letter naming why, so that each
        input is either output or a dead letter (a trial: 970 of 1,000
        stdin lines gone without a word). Their trees in flight are failed
        (not "abandoned at stop")."""
        lost = [t for t in spouts if isinstance(t, PythonSpoutTask) and t.read_once]
        if not lost:
            return
        why = str(self.gave_up[0]).splitlines()[0] if self.gave_up else "a component gave up"
        cause = f"not done when the run gave up: {why}"
        ids = {t.task_id for t in lost}
        for r, root in list(self.acker.roots.items()):
            if root.spout_task in ids:
                self.acker.fail_root(r, cause)
        self.settle()
        for t in lost:
            t.give_up_inputs(cause)

    async def _expire_loop(self) -> None:
        spouts = [t for t in self.tasks.values() if isinstance(t, SpoutTask)]
        replay_within = 3 * self.acker.timeout  # a spout that has not re-emitted a failed id by then: warned once
        self.acker.expire(trio.current_time())  # (from the start: the acker's clock dates what it keeps aside)
        last = trio.current_time()
        while True:
            await trio.sleep(1.0)
            now = trio.current_time()
            if now - last > 1.0 + _ABSENT_SECS:  # this process was stopped (Ctrl-Z, SIGSTOP) or starved
                self._excuse_silence(now - last - 1.0)
            last = now
            for t in spouts:
                t.check_replays(trio.current_time(), replay_within)
            if self.acker.expire(trio.current_time()):
                self.settle()

    def _excuse_silence(self, absent: float) -> None:
        """The host did not run for ``absent`` seconds (stopped at a terminal
        with Ctrl-Z and its processes with it, or starved): it read nothing
        meanwhile, so its processes' silence then is not theirs. Each gets a
        whole subprocess timeout (§5.2) from now, as after a frame."""
        log.warning("the host did not run for %.1fs (stopped, or starved of CPU): its processes' silence is "
                    "counted afresh from now", absent)
        now = trio.current_time()
        for t in self.tasks.values():
            proc = getattr(t, "proc", None)
            if proc is not None:
                proc.last_inbound = max(proc.last_inbound, now)

    async def _ticks(self, comp: ComponentDef, freq: float) -> None:
        while True:
            await trio.sleep(freq)
            for task_id in comp.tasks:
                if getattr(self.tasks[task_id], "remote", False):
                    continue  # its own worker ticks it
                self.tasks[task_id].deliver(Delivery([int(freq) if freq == int(freq) else freq], SYSTEM_COMPONENT,
                                                     TICK_STREAM, SYSTEM_TASK, TICK_EDGES, tick=True))

    async def _progress(self, report: Callable[["Runtime"], None], interval: float) -> None:
        # A reporter may set its own pace (the live view on a terminal redraws every second).
        interval = float(getattr(report, "interval", interval))
        while True:
            await trio.sleep(interval)
            report(self)

    def _not_replayed(self) -> list[tuple[str, int, list[Any]]]:
        """A run to the end: the spouts had every chance to replay what failed."""
        if self._stopped_by != "done":
            return []
        return [(t.where(), len(ids), ids[:5]) for t in self.tasks.values()
                if isinstance(t, SpoutTask) and (ids := t.not_replayed())]

    def result(self) -> RunResult:
        outputs = list(self.view_so_far().values())
        if self._key_index is not None:
            outputs.sort(key=lambda r: [sort_key(r[k]) for k in self.topology.output.key or []])
        repeated = [r for t in self.tasks.values() if isinstance(t, SpoutTask) for r in t.repeated_failures()]
        rows = snapshot(self)["components"]
        extensions = {name: rows[name]["extensions"] for name, c in self.topology.components.items() if c.is_shell}
        return RunResult(
            stats=self.stats,
            completed=self.acker.stats["completed"],
            failed=self.acker.stats["failed"],
            timed_out=self.acker.stats["timed_out"],
            pending=self.acker.pending,
            gave_up=list(self.gave_up),
            outputs=outputs,
            dead_letters=self.dead_letters,
            dead_letter_sample=list(self._dead_letter_sample),
            repeated_failures=repeated,
            stopped_by=self._stopped_by or "request",
            extensions=extensions,
            spouts=[n for n, c in self.topology.components.items() if c.kind == "spout"],
            not_replayed=self._not_replayed(),
            **(self.checkpoints.summary() if self.checkpoints is not None else {}),
        )
