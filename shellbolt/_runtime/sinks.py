"""Where a shell bolt's results go: the one emit route, with pluggable sinks.

A :class:`~multilang.shellbolt._runtime.bolts.ShellBoltTask` runs the process (the
writer, the reader, heartbeats, max pending, supervision) and keeps the
tuples it wrote in ``in_flight``: tuple id -> the *token* its sender gave it.
What a token means, and what becomes of the bolt's emits, acks and fails, is
the sink's business:

* :class:`AckerSink`, the general lane: tokens are acker edges
  (:class:`~multilang.shellbolt._model.acker.TupleEdges`, or a one-hop token:
  an ``int``, acker.py); emits go to the router
  (groupings, other tasks' inboxes, topology outputs) with new edges; acks
  and fails go to the XOR acker (§7); a crash is blamed as §8.4 says;
  ``multilang.hold.emits.until.ack`` holds emits until their input is acked.
* an engine's own sink, such as the Spark adapter's lease, where a token is a
  row's attempt and a tuple's tree is the one tuple sent to the bolt.

A sink is called from the task's reader with whole runs of events (a batch
of emits, of acks), never once per frame where a run exists. The base class
documents the contract and gives the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multilang.messages import Emit

from .._model.acker import roots_of
from .._model.results import Cause, id_key
from .tasks import TICK_EDGES, RuntimeSeam, Task, plain_emit


__all__ = ["BoltSink", "AckerSink"]

_MAX_SUSPECTS = 10_000


class BoltSink:
    """The contract between a shell bolt task and where its results go.

    ``task.in_flight`` maps the tuple ids the process holds to their tokens.
    :meth:`acked`, :meth:`failed` and :meth:`lost` take the tuples they
    settle out of it (the connection checked that the ids are in it)."""

    def live(self, token: Any) -> bool:
        """Whether a queued tuple is still wanted: False once its tree has
        failed, timed out or completed (writing it would process an input
        whose replay is on its way: a duplicate; §5.3)."""
        return True

    def waited_for(self, token: Any) -> bool | None:
        """Whether something waits for the tuple's ack: True (a live tree),
        False (a tick, a finished tree), None (no tree: acking off or an
        unanchored emit upstream; the task waits while the bolt still settles)."""
        return self.live(token)

    def waited_for_here(self, token: Any) -> bool | None:
        """:meth:`waited_for`, where a tree another host worker owns is not
        waited for here: its owner's run waits for it (the run's end)."""
        return self.waited_for(token)

    def alone(self, token: Any) -> bool:
        """Whether the tuple must be written when the process holds nothing
        else (a suspect after a crash, §8.4). If so, the task writes it alone
        and calls :meth:`cleared` once it is on its way."""
        return False

    def cleared(self, token: Any) -> None:
        """The tuple of :meth:`alone` is written alone."""

    def isolating(self) -> bool:
        """Whether :meth:`alone` may be true of any tuple now (the writer
        asks once per batch, and :meth:`alone` per tuple only if so)."""
        return False

    def emits(self, task: Task, emits: list[list[Any]], touched: set[Task]) -> None:
        """A run of plain emits (a §9.5 batch, or a run of standard emits
        read in one pass), each ``[values, anchor ids or None, stream]``:
        not direct, wanting no task ids, anchored to tuples in
        ``task.in_flight`` (the connection checked that they are pending)."""
        raise NotImplementedError

    def emit(self, task: Task, ev: Emit, touched: set[Task]) -> list[int]:
        """Any other emit (direct, or wanting task ids, §3.4-§3.5). Returns
        the task ids it went to (the reply to one that wants them)."""
        raise NotImplementedError

    def acked(self, task: Task, tids: list[str], touched: set[Task]) -> None:
        """The process acked these tuples, in this order."""
        raise NotImplementedError

    def failed(self, task: Task, tid: str, cause: str) -> None:
        """The process failed a tuple."""
        raise NotImplementedError

    def unsent(self, task: Task, token: Any, cause: str) -> None:
        """A tuple could not be written (too large for the reader, §1.3)."""
        raise NotImplementedError

    def lost(self, task: Task, cause: str) -> None:
        """The process died or hung with ``task.in_flight`` in it (§8.2):
        fail those tuples (and clear ``in_flight``) so they are replayed."""
        raise NotImplementedError


def _waited(token: Any, live: Any) -> bool | None:
    """A tick's token is waited for by nobody, a tuple without a tree by
    nobody known (None), one with trees as ``live`` says."""
    if token is TICK_EDGES:
        return False
    if type(token) is not int and not token.ids:
        return None
    return live(token)


@dataclass(slots=True)
class _Held:
    emit: Emit
    targets: list[int] | None
    anchors: set[str]
    done: bool = False


class AckerSink(BoltSink):
    """The general lane of a topology: the router and the XOR acker."""

    def __init__(self, runtime: RuntimeSeam, hold: bool = False) -> None:
        self.runtime = runtime
        self.acker = runtime.acker
        self.live = runtime.acker.is_live  # the writer asks per tuple: no call layer of ours
        #: multilang.hold.emits.until.ack: input id -> emits waiting for it to be acked
        self.hold = hold
        self._held: dict[str, list[_Held | list[Any]]] = {}
        #: (spout task, msg id) of the inputs in flight when a process died
        #: with several tuples: each is retried alone (§8.4)
        self._suspects: set[Any] = set()

    # -- queued tuples -----------------------------------------------------------------

    def waited_for(self, token: Any) -> bool | None:
        return _waited(token, self.acker.is_live)

    def waited_for_here(self, token: Any) -> bool | None:
        return _waited(token, self.acker.pending_here)

    def isolating(self) -> bool:
        return bool(self._suspects)

    def alone(self, token: Any) -> bool:
        roots, suspects = self.acker.roots, self._suspects
        for r in roots_of(token):
            root = roots.get(r)
            if root is not None and (root.spout_task, id_key(root.msg_id)) in suspects:
                return True
        return False

    def cleared(self, token: Any) -> None:
        roots = self.acker.roots
        for r in roots_of(token):
            root = roots.get(r)
            if root is not None:
                self._suspects.discard((root.spout_task, id_key(root.msg_id)))

    # -- results ------------------------------------------------------------------------

    def emits(self, task: Task, emits: list[list[Any]], touched: set[Task]) -> None:
        if not self.hold:
            self.runtime.route_emits(task, emits, touched)
            return
        # Hold mode: an emit the plain lane takes, anchored to one tuple, is
        # held as it came (its element) under that tuple's id, and routed
        # with the others of its run when the tuple is acked (_release);
        # anything else is worked out now, as emit() does.
        held, plans, plan_of = self._held, task.plans, self.runtime.emit_plan
        for e in emits:
            values, ids, stream = e
            if ids and len(ids) == 1:
                if (plans.get(stream) or plan_of(task, stream)).takes(values):
                    run = held.get(ids[0])
                    if run is None:
                        held[ids[0]] = [e]
                    else:
                        run.append(e)
                    continue
            self.emit(task, plain_emit(values, stream, tuple(ids) if ids else ()), touched)

    def emit(self, task: Task, ev: Emit, touched: set[Task]) -> list[int]:
        rt = self.runtime
        anchors = [task.edges(a) for a in ev.anchors]  # the connection checked they are pending
        if not (self.hold and ev.anchors):
            return rt.route(task, ev, anchors, touched)
        targets = rt.targets(task, ev)
        if targets is None:  # an emit error (reported once): fail the tree now, hold nothing
            return rt.route(task, ev, anchors, touched, targets=None, invalid=True)
        held = _Held(ev, targets, set(ev.anchors))
        for a in ev.anchors:
            self._held.setdefault(a, []).append(held)
        return targets

    def acked(self, task: Task, tids: list[str], touched: set[Task]) -> None:
        self._settle(task, tids, touched, self.acker.ack_many)

    def _settle(self, task: Task, tids: list[str], touched: set[Task], ack: Any) -> None:
        """Acked tuples out of ``in_flight``, their tokens to ``ack`` in one
        call; in hold mode each one's held emits are released first, while
        it (and every other anchor of theirs not yet acked) is in flight."""
        pop = task.in_flight.pop
        held = self._held
        if not held:
            ack([pop(tid) for tid in tids])
            return
        tokens, stale = [], []
        for tid in tids:
            if tid in held and not self._release(task, tid, touched):
                stale.append(pop(tid))
                continue
            tokens.append(pop(tid))
        ack(tokens)
        if stale:
            # Its emits were dropped (its trees are over): its ack would say the tree is done without
            # them. On one engine the tree is gone and the fail is nothing. On host workers it is another
            # worker's tree of an epoch this one has rolled back past, and its owner may not have yet: an
            # ack there would complete the tree with its words lost; failed, it is replayed (§5.3).
            cause = f"{task.where()} acked it after its tree failed or was rolled back: its held emits were dropped"
            fail = self.acker.fail
            for token in stale:
                fail(token, cause)

    def failed(self, task: Task, tid: str, cause: str) -> None:
        edges = task.in_flight.pop(tid)
        if self._held:
            for held in self._held.pop(tid, ()):
                if type(held) is _Held:  # (an element held as it came has this one anchor: dropped)
                    held.anchors.discard(tid)
                    if not held.anchors:
                        held.done = True
        self.acker.fail(edges, cause)

    def unsent(self, task: Task, token: Any, cause: str) -> None:
        self.acker.fail(token, cause)
        self.runtime.settle()

    def lost(self, task: Task, cause: str) -> None:
        """Who is to blame (§8.4): a tuple alone in the process is; tuples
        that were in flight together are not (the failure does not count
        against their inputs' replays) and become suspects, each tried alone
        when it comes back."""
        in_flight = task.in_flight
        self._held = {}
        if not in_flight:
            return
        live = [e for e in in_flight.values() if e is not TICK_EDGES]
        # Every input in flight is (still) a suspect: its next try goes alone.
        roots, suspects = self.acker.roots, self._suspects
        for e in live:
            if len(suspects) < _MAX_SUSPECTS:
                for r in roots_of(e):
                    root = roots.get(r)
                    if root is not None:
                        suspects.add((root.spout_task, id_key(root.msg_id)))
        if len(live) == 1:
            cause = Cause.make(f"{cause} (the only tuple in that process)", crashed_alone=True)
        elif live:
            cause = Cause.make(f"{cause} (with {len(live) - 1} other tuples in flight; retried alone, "
                               "not counted against multilang.max.replays)", blamed=False)
        fail = self.acker.fail
        for edges in in_flight.values():
            fail(edges, cause)
        in_flight.clear()
        self.runtime.settle()

    def _release(self, task: Task, tid: str, touched: set[Task]) -> bool:
        """Hold mode: the input ``tid`` (still in flight) was acked, so the
        emits anchored to it go out now, before the ack reaches the acker
        (the tree must not complete in between), in the order they were
        emitted; the runs of elements held as they came each as one
        :meth:`Runtime.route_batch`. An emit whose every tree has meanwhile
        failed or timed out is dropped: the replay will emit it again, and
        releasing it too would be a duplicate (§5.3, no delivery after expiry).
        Returns whether the input's trees were live (its emits went out)."""
        rt, is_live, in_flight = self.runtime, self.acker.is_live, task.in_flight
        live = is_live(in_flight[tid])
        run: list[list[Any]] = []
        for held in self._held.pop(tid):
            if type(held) is not _Held:  # an element [values, [tid], stream], anchored to tid alone
                if run and (held[2] != run[0][2] or len(run) >= task.batch_size):
                    self._release_run(task, tid, run, live, touched)
                    run = []
                run.append(held)
                continue
            if run:
                self._release_run(task, tid, run, live, touched)
                run = []
            if held.done:
                continue
            held.done = True
            anchors = [task.edges(a) for a in held.anchors if a in in_flight]
            if not any(is_live(a) for a in anchors):
                task.stats.expired += 1
                continue
            rt.route(task, held.emit, anchors, touched, targets=held.targets)
        if run:
            self._release_run(task, tid, run, live, touched)
        return live

    def _release_run(self, task: Task, tid: str, run: list[list[Any]], live: bool, touched: set[Task]) -> None:
        """One run of held elements on one stream, anchored to ``tid`` alone:
        routed as one, or dropped as expired if ``tid``'s trees are over."""
        if not live:
            task.stats.expired += len(run)
            return
        self.runtime.route_batch(task, run[0][2], [e[0] for e in run], [tid] * len(run), touched)
