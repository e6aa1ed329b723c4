"""Checkpoints of stateful bolts (spec/PROTOCOL.md §9.7), after Storm's
stateful-bolt semantics, in the embedded runtime.

A shell bolt whose process accepts ``state`` is a *stateful task*. Its acks
are held (:class:`StatefulSink`): a tuple it acked keeps its tree pending
until a checkpoint covering it commits. Every
``topology.state.checkpoint.interval.ms`` (or sooner, when nothing else can
move) the :class:`Checkpointer`

1. stops asking spouts for tuples and waits until every tree in flight waits
   only for held acks (a cut through whole trees: no tree is half in it);
2. asks every stateful task to ``prepare`` and collects its changed keys;
3. writes them, the message ids of the covered trees and the topology output's
   changed keys in one transaction of the state store (``state_store.py``);
4. sends ``commit`` and releases the held acks: the trees complete.

When a tree that touched a stateful task since the last commit fails (a
process died, a bolt failed it, it timed out), every stateful task is rolled
back to the last commit and every tree that touched one since is failed, so
its spout replays it; tuples of those trees still queued are dropped (§5.3).
A restarted process gets the committed state in its ``init``.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
from typing import Any

import orjson
import trio

from multilang.messages import StateCommit, StateInit, StatePrepare, StatePrepared, StateRollback

from .._host import scratch
from .._model.acker import TupleEdges, roots_of
from .._model.results import Cause, brief
from .sinks import AckerSink
from .state_store import Checkpoint, StateStore, msg_key, open_store, provider_config, values_hash
from .tasks import PlainComponentError, RuntimeSeam, SpoutTask, Task, log


__all__ = ["Checkpointer", "StatefulSink", "StateStoreFailed", "init_frames", "rolled_back_to"]

#: when every tree waits only for held acks and no spout may emit (the end of
#: the input, or spouts held back by topology.max.spout.pending or
#: --max-tuples) for this long, the checkpoint is taken at once: waiting for
#: the interval would only idle (_quiet_needed)
_QUIET = 0.002
#: keys per init chunk (§9.7 chunks; each frame also stays under the frame limit)
_CHUNK_KEYS = 1000
_NO_ROOTS: frozenset[int] = frozenset()


def rolled_back_to(txid: int | None) -> str:
    """Where a rollback takes the state: the last committed checkpoint."""
    return "the start (no checkpoint committed yet)" if txid is None else f"checkpoint {txid}"


class Checkpointer:
    """The runtime's side of §9.7: held acks, checkpoints, rollbacks, the store."""

    def __init__(self, runtime: RuntimeSeam) -> None:
        self.rt = runtime
        conf = runtime.topology.conf
        self.interval = float(conf.get("topology.state.checkpoint.interval.ms") or 1000) / 1000
        self.provider = str(conf.get("topology.state.provider") or "sqlite")
        self.provider_config = provider_config(conf)
        self.store: StateStore | None = None
        self._tmpdir: str | None = None
        self.tasks: dict[int, Task] = {}  # every stateful task seen
        self.ready: set[int] = set()  # stateful tasks whose current process has its init
        self.held: list[int | TupleEdges] = []  # acks (tokens) held until the next commit
        self._held_xor: dict[int, int] = {}  # root -> XOR the held acks would apply
        #: roots of tuples written to a stateful task since the last commit (the acker watches them)
        self.touched: set[int] = runtime.acker.watch
        self.activity = False  # a tuple reached a stateful task since the last checkpoint
        self.epoch = 0  # + 1 per rollback: a checkpoint in progress is abandoned
        self.paused = False  # spouts get no `next` while a checkpoint waits for its cut
        self._answers: dict[int, tuple[dict[str, Any], list[str]]] = {}
        self._waiting: set[int] = set()
        #: tasks whose process owes the answer to a prepare (also one a
        #: rollback abandoned: §9.7, it is answered all the same); no new
        #: prepare goes to them until it arrives
        self._owed: set[int] = set()
        self._first_ready: trio.Event | None = None  # run() waits on it while no stateful process runs
        self._txid_asked = 0  # txids are never reused in a run: a late answer names an old one
        self._one_at_a_time = trio.Lock()
        #: the topology output's changes since the last commit: key -> (record, roots)
        self.view: dict[Any, tuple[dict[str, Any], frozenset[int]]] = {}
        self.committed = 0
        self.rollbacks = 0
        self.keys_written = 0  # keys put or deleted by the checkpoints of this run (bench/stateful_wordcount.py)
        self._skip_spouts: dict[str, bool] = {}
        #: spout task -> message id (msg_key) -> its tree, for spouts whose process died (spout_lost)
        self._in_flight_ids: dict[int, dict[str, int]] = {}
        #: root -> values_hash of its spout tuple, while stateful tasks run: committed with the id, so that
        #: an id reused for another input is not taken for the input a checkpoint covers (docs/STATE.md)
        self.hashes: dict[int, int | None] = {}
        #: spout name -> emits whose message id a checkpoint (or a tree in flight) holds for other values:
        #: delivered as new inputs, and reported
        self.reused: dict[str, int] = {}
        self.resuming = False  # the store holds a checkpoint of an earlier run
        #: a store that outlives the run: a later run may resume from it (and skip what it covers)
        self.named = self.provider != "sqlite" or bool(self.provider_config.get("dir"))
        if self.named:
            self._open()  # a named store: resume from it, or refuse it now (a TopologyError)

    # -- the store ------------------------------------------------------------------

    def _open(self) -> StateStore:
        if self.store is None:
            topo = self.rt.topology
            default_dir = ""
            if self.provider == "sqlite" and not self.provider_config.get("dir"):
                default_dir = self._tmpdir = scratch.make("multilang-state-")
            store = open_store(self.provider, self.provider_config, topo.name or "topology", default_dir)
            try:
                store.check(topo.name or "topology", {c.name: len(c.tasks) for c in topo.components.values()})
            except BaseException:
                store.close()
                raise
            self.store = store
            self.resuming = store.txid is not None
            if store.txid is not None:
                log.info("resuming from checkpoint %d of the state store", store.txid)
        return self.store

    def resumed_outputs(self) -> list[dict[str, Any]]:
        """The committed output view of an earlier run (a resumed run prints it all)."""
        return list(self.store.outputs().values()) if self.store is not None and self.store.txid else []

    def skip(self, spout: Task, msg_id: Any, values: list[Any]) -> bool | None:
        """§9.7 step 4: True if the message id is already reflected in
        committed state (ack the emit), None if a tree of it is still in
        flight from a process of the spout that died (that tree answers this
        emit too), False to deliver it. An id is only taken for the input it
        was given with: the same id with other values (a spout that numbers
        its inputs from 0 again, as storm-starter's randomsentence.js does)
        is a new input, delivered, and reported (:attr:`reused`)."""
        key = msg_key(msg_id)
        if key is None:
            return False  # no JSON form: never skipped (at least once)
        index = self._in_flight_ids.get(spout.task_id)
        if index is not None and (r := index.get(key)) is not None:
            if r in self.rt.acker.roots:
                held = self.hashes.get(r)
                if held is not None and held != values_hash(values):
                    return self._reused_id(spout, msg_id, "a tree still in flight")
                return None
            del index[key]
        store = self.store
        if store is None:
            return False
        has = self._skip_spouts.get(spout.name)
        if has is None:
            has = self._skip_spouts[spout.name] = store.has_completed(spout.name)
        if not has:
            return False
        done, held = store.completed_entry(spout.name, spout.index, key)
        if not done:
            return False
        if held is not None and held != values_hash(values):
            return self._reused_id(spout, msg_id, f"checkpoint {store.txid}")
        return True

    def _reused_id(self, spout: Task, msg_id: Any, where: str) -> bool:
        n = self.reused[spout.name] = self.reused.get(spout.name, 0) + 1
        if n == 1:
            log.warning("%s emitted message id %s with other values than the input %s holds under that id: it is "
                        "delivered as a new input. For exactly-once state a spout must give each input one id for "
                        "good (docs/STATE.md); one that numbers its inputs afresh after a restart gets at-least-once "
                        "at best. The summary counts such emits.", spout.where(), brief(repr(msg_id), 100), where)
        return False

    def remember(self, root: int, values: list[Any]) -> None:
        """A spout tuple became tree ``root``: the hash of its values goes
        with its id into the checkpoint that covers it."""
        hashes = self.hashes
        hashes[root] = values_hash(values)
        if len(hashes) > 2 * len(self.rt.acker.roots) + 1024:  # trees that failed: memory stays bounded
            roots = self.rt.acker.roots
            for r in [r for r in hashes if r not in roots]:
                del hashes[r]

    def summary(self) -> dict[str, Any]:
        """The :class:`~multilang.shellbolt._model.results.RunResult` fields of the state."""
        store = self.store
        path = getattr(store, "path", None) if self._tmpdir is None else None
        return {"stateful": sorted({t.name for t in self.tasks.values()}), "state_txid": store.txid if store else None,
                "checkpoints": self.committed, "rollbacks": self.rollbacks, "state_path": path,
                "reused_ids": dict(self.reused)}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    # -- stateful tasks -----------------------------------------------------------------

    def attach(self, task: Task) -> tuple[int | None, dict[str, Any]]:
        """A process of ``task`` accepted ``state``: its sink holds acks from
        now on; returns the committed (txid, state) for its ``init``."""
        if task.task_id not in self.tasks:
            self.tasks[task.task_id] = task
            if type(task.sink) is AckerSink:
                task.sink = StatefulSink(self.rt, self, hold=task.sink.hold)
        store = self._open()
        return store.txid, store.load(task.name, task.index)

    def started(self, task: Task) -> None:
        """The task's process has its init: it takes part in checkpoints."""
        self.ready.add(task.task_id)
        if self._first_ready is not None:
            self._first_ready.set()

    def detach(self, task: Task) -> None:
        """The task's process died or hung: it gets no more state frames."""
        self.ready.discard(task.task_id)
        self._waiting.discard(task.task_id)
        self._owed.discard(task.task_id)

    def hold(self, edges: list[TupleEdges]) -> None:
        held, hx = self.held, self._held_xor
        for e in edges:
            if type(e) is int:  # a one-hop token (acker.py): its root's one edge
                held.append(e)
                hx[e] = hx.get(e, 0) ^ e
                continue
            ids = e.ids
            if not ids:
                continue  # a tick or an unanchored tuple: no tree waits for it
            held.append(e)
            for r, tid in ids.items():
                hx[r] = hx.get(r, 0) ^ tid ^ e.ack_val

    def prepared(self, task: Task, msg: StatePrepared) -> None:
        if not msg.more:
            self._owed.discard(task.task_id)
            self.rt.nudge()
        if msg.txid != self._txid_asked or task.task_id not in self._waiting:
            return  # the answer to a prepare of a checkpoint abandoned by a rollback
        put, delete = self._answers.setdefault(task.task_id, ({}, []))
        put.update(msg.put)
        delete.extend(msg.delete)
        if not msg.more:
            self._waiting.discard(task.task_id)  # (the nudge above wakes the checkpoint)

    # -- checkpoints ---------------------------------------------------------------------

    def quiescent(self, parked: bool = False) -> bool:
        """Every tree in flight waits only for held acks; with ``parked``,
        or has touched no stateful task yet (see :meth:`_checkpoint`)."""
        hx, touched = self._held_xor, self.touched
        for r, root in self.rt.acker.roots.items():
            if root.value != hx.get(r, 0) and (not parked or r in touched):
                return False
        return True

    def _held_trees(self) -> set[int]:
        """The trees in flight that wait only for held acks."""
        hx = self._held_xor
        return {r for r, root in self.rt.acker.roots.items() if root.value == hx.get(r, 0)}

    async def run(self) -> None:
        rt = self.rt
        while True:
            deadline = trio.current_time() + self.interval
            why = "the interval passed"
            while trio.current_time() < deadline:
                if not self.ready:  # no stateful process (yet): nothing to watch until one starts
                    self._first_ready = trio.Event()
                    with trio.move_on_at(deadline):
                        await self._first_ready.wait()
                    continue
                # (trees parked in a bolt that waits for more input do not keep the spouts waiting: _checkpoint)
                quiet = (self._quiet_needed(trio.current_time()) if self.held and self.quiescent(parked=True)
                         else None)
                if quiet is not None:
                    seen = rt.emitted_by_spouts
                    await trio.sleep(quiet)
                    if rt.emitted_by_spouts == seen and self.quiescent(parked=True):
                        why = f"the spouts were quiet {quiet:g} s and trees wait for it"
                        break
                    continue
                with trio.move_on_at(deadline):
                    await rt.wait_for_change()
            log.debug("a checkpoint begins: %s", why)
            await self.checkpoint()

    def _quiet_needed(self, since: float) -> float | None:
        """How long from ``since`` the spouts must stay quiet for a
        checkpoint before the interval ends, or None (one may still emit:
        wait for the interval, as Storm's checkpoint spout does). A spout
        that may not emit now (stopped, max spout pending, --max-tuples) or
        whose input ended frees nothing by waiting: _QUIET. One that only
        found nothing to emit lately (a shell spout's empty ``next``, an
        open feed) may emit again at any time: a tenth of the interval from
        when it went dry, so that a spout emitting now and then does not
        get a checkpoint per tuple. (From when it went dry, not from any
        spout's last emit: a shell spout whose input ended is dry for
        good, and a trial's other spout, held back by max spout pending,
        waited a tenth of the interval for every checkpoint: 950 trees/s
        at pending 100.)"""
        rt = self.rt
        quiet = _QUIET
        for sp in rt.tasks.values():
            if not isinstance(sp, SpoutTask) or rt.spouts_stopped or not rt.may_emit(sp):
                continue
            rest = sp.at_rest()
            if rest is None:
                return None
            if rest == "dry":
                quiet = max(quiet, sp.dry_since + self.interval / 10 - since)
        return quiet

    async def final(self) -> None:
        """At the end of a run: commit what the last interval changed (also
        what no tree waits for: unanchored tuples, ticks, acking off)."""
        await self.checkpoint()

    def _something_to_commit(self) -> bool:
        return bool(self.ready) and bool(self.activity or self.held or self.view)

    async def checkpoint(self) -> bool:
        """Take one checkpoint (steps 1-4 above) if something changed since
        the last; False if a rollback or a lost process abandoned it. One
        at a time: a stop's final checkpoint waits for the running one
        (two would each send a prepare, and commit the other's answers)."""
        async with self._one_at_a_time:
            if not self._something_to_commit():
                return True
            return await self._checkpoint()

    async def _checkpoint(self) -> bool:
        rt = self.rt
        epoch = self.epoch
        self.paused = True
        try:
            # Late answers to a prepare a rollback abandoned come first (§9.7:
            # one prepare unanswered at a time), then the cut. A tree that has
            # touched no stateful task may be parked in a bolt that holds its
            # input until more comes (a batching bolt, Storm's common pattern):
            # with the spouts paused it never comes, and a cut that waited for
            # it waited for a tick or the message timeout, rolled back and
            # replayed, for ever (a trial). Past a short patience such trees
            # are left out of the cut, as if begun after it: none of their
            # tuples was written to a stateful task, so their changes and
            # acks are the next checkpoint's.
            patient_until = trio.current_time() + max(0.02, self.interval / 10)
            while self._owed & self.ready or not self.quiescent(parked=trio.current_time() >= patient_until):
                if self.epoch != epoch:
                    return False
                with trio.move_on_at(patient_until if trio.current_time() < patient_until else math.inf):
                    await rt.wait_for_change()
            # The cut: every tree pending now that touched a stateful task
            # waits only for held acks, and the prepares go out in this same
            # step, ahead of any tuple not yet written (send_state): so each
            # stateful task answers with the changes of exactly these trees. A
            # tree a spout emits after the cut (a `next` that was outstanding)
            # is processed after the prepare: its changes and its held acks
            # wait for the next checkpoint, as do a parked tree's.
            covered = self._held_trees()
            n_held = len(self.held)
            store = self._open()
            txid = self._txid_asked = max(store.txid or 0, self._txid_asked) + 1
            self._answers = {}
            self.activity = False  # what reaches a stateful task from now on is the next checkpoint's
            self._waiting = set(self.ready)
            self._owed |= self._waiting
            for task_id in self._waiting:
                self.tasks[task_id].send_state(StatePrepare(txid=txid))
            while self._waiting:
                if self.epoch != epoch:
                    return False
                await rt.wait_for_change()
            if self.epoch != epoch:
                return False
            # Answered: commit them now, whatever began since (the components
            # have handed over these changes; dropping them would lose them).
            self._commit(store, txid, covered, n_held)
            return True
        finally:
            self.paused = False
            self._waiting = set()
            rt.kick_spouts()

    def _commit(self, store: StateStore, txid: int, covered: set[int], n_held: int) -> None:
        """Steps 3 and 4 for the trees of the cut (``covered``, whose acks are
        the first ``n_held`` held), without a pause: no tree can fail between
        the write and the release."""
        rt = self.rt
        cp = Checkpoint(txid)
        for task_id, answer in self._answers.items():
            t = self.tasks[task_id]
            cp.changes[(t.name, t.index)] = answer
        roots = rt.acker.roots
        hashes = self.hashes
        for r in covered:
            root = roots.get(r)
            if root is None:  # cannot be: a failure of a covered tree rolls back (epoch) first
                continue
            key = msg_key(root.msg_id)
            spout = rt.tasks[root.spout_task]
            if key is not None:
                cp.completed.append((spout.name, spout.index, key))
                h = hashes.pop(r, None)
                if h is not None:
                    cp.values[(spout.name, spout.index, key)] = h
        key_fields = rt.topology.output.key or []
        view = {k: v for k, v in self.view.items() if v[1] <= covered}  # outputs of the cut's trees (or of none)
        for record, _roots in view.values():
            cp.outputs[orjson.dumps([record.get(k) for k in key_fields]).decode()] = record
        parallelism = {self.tasks[t].name: len(self.tasks[t].comp.tasks) for t in self._answers}
        try:
            store.commit(cp, parallelism)
        except (sqlite3.Error, OSError, TypeError, ValueError) as exc:
            # Nothing was committed: every stateful task goes back to the last
            # checkpoint, and the run stops (a store that cannot be written
            # would roll back for ever); a rerun resumes from that checkpoint.
            self.rollback(f"the state store could not write checkpoint {txid}: {exc}")
            rt.give_up(StateStoreFailed(f"the state store could not write checkpoint {txid}: {exc}; the run stops "
                                        f"at checkpoint {store.txid} (run again to resume from it)"))
            return
        self.committed += 1
        self.keys_written += sum(len(put) + len(delete) for put, delete in cp.changes.values())
        for task_id in self._answers:
            self.tasks[task_id].send_state(StateCommit(txid=txid))
        rt.commit_view({k: r for k, (r, _) in view.items()})
        for k in view:
            del self.view[k]
        held = self.held
        released = held[:n_held]
        self.held, self._held_xor = [], {}
        self.hold(held[n_held:])  # acks of trees begun after the cut: the next checkpoint's
        self.touched.difference_update(covered)
        self.activity = self.activity or bool(self.held or self.touched)
        rt.acker.ack_many(released)
        rt.settle()

    def spout_lost(self, spout: SpoutTask) -> None:
        """A shell spout's process died. The next one may re-emit from its
        source (a file read again from its start) message ids that a
        checkpoint committed, or whose trees are still in flight. From now
        on :meth:`skip` answers those emits: a committed one is acked at
        once, one still in flight is folded into its tree (whose ack or
        fail reaches the new process, §8.2). So each input counts once."""
        index = self._in_flight_ids[spout.task_id] = {}
        for r, root in self.rt.acker.roots.items():
            if root.spout_task == spout.task_id and (key := msg_key(root.msg_id)) is not None:
                index[key] = r
        self._skip_spouts[spout.name] = True
        self.rt.skip_committed()

    def registered(self, spout: Task, msg_id: Any, root: int) -> None:
        """A spout emit became tree ``root``: remembered while its spout is
        watched for repeats (:meth:`spout_lost`), within what is in flight."""
        index = self._in_flight_ids.get(spout.task_id)
        if index is None or (key := msg_key(msg_id)) is None:
            return
        index[key] = root
        if len(index) > 2 * spout.pending_roots + 64:  # forget finished trees: memory stays bounded
            roots = self.rt.acker.roots
            for k in [k for k, r in index.items() if r not in roots]:
                del index[k]

    def rollback(self, cause: str, *, quiet: bool = False) -> None:
        """Back to the last commit: every stateful process restores it, and
        every tree that touched one since is failed (and replayed). ``quiet``:
        not logged (a host worker's: the main process says it once for
        every worker)."""
        rt = self.rt
        self.epoch += 1
        self.rollbacks += 1
        txid = self.store.txid if self.store is not None else None
        for task_id in list(self.ready):
            self.tasks[task_id].send_state(StateRollback(txid=txid))
        roots = set(self.touched)
        for e in self.held:
            roots.update(roots_of(e))
        self.held, self._held_xor = [], {}
        self.touched.clear()
        self.activity = False
        self._waiting = set()
        if self.view:
            self.view = {k: v for k, v in self.view.items() if roots.isdisjoint(v[1])}
        where = rolled_back_to(txid)
        why = Cause.make(f"rolled back to {where}: {cause}", blamed=False)
        fail_root = rt.acker.fail_root
        for r in roots:
            fail_root(r, why)
        rt.acker.watch_failed = None
        if not quiet:
            log.warning("state rolled back to %s (%d tree(s) to replay): %s", where, len(roots), cause)
        rt.nudge()

    def outputs(self, keys: list[Any], records: list[dict[str, Any]], roots: list[Any]) -> None:
        """Topology outputs with a key (the i-th record's key ``keys[i]``,
        its trees ``roots[i]``: a root id, a collection of them, or None),
        each kept until the commit that covers it. One whose every tree has
        failed already (a tuple written before a rollback, emitted after
        it) is dropped: the replay outputs it again."""
        is_live, view = self.rt.acker.is_live, self.view
        for key, record, r in zip(keys, records, roots):
            if r is None:
                r = _NO_ROOTS
            elif type(r) is int:
                if not is_live(r):
                    continue
                r = frozenset((r,))
            elif not r:  # a tuple of no tree (acking off, an unanchored emit upstream)
                r = _NO_ROOTS
            else:
                if not any(map(is_live, r)):
                    continue
                r = frozenset(r)
            view[key] = (record, r)


def init_frames(conn: Any, txid: int | None, state: dict[str, Any], max_frame: int) -> list[bytes]:
    """The ``init`` of §9.7 as frames, in chunks of at most ``_CHUNK_KEYS``
    keys, each under ``max_frame`` (a chunk too big is halved)."""
    items = list(state.items())
    if not items:
        return [conn.send(StateInit(txid=txid, state={}))]
    frames: list[bytes] = []
    todo = [items[i:i + _CHUNK_KEYS] for i in range(0, len(items), _CHUNK_KEYS)]
    while todo:
        part = todo.pop(0)
        body = orjson.dumps(dict(part))
        if len(body) > max_frame - 200 and len(part) > 1:
            todo[:0] = [part[: len(part) // 2], part[len(part) // 2:]]
            continue
        frames.append(conn.send(StateInit(txid=txid, state=dict(part), more=bool(todo))))
    return frames


class StateStoreFailed(PlainComponentError):
    """The state store could not write a checkpoint: the run stops (it gives up)."""


class StatefulSink(AckerSink):
    """The general lane for a stateful task: acks are held until the
    checkpoint that covers them commits; the roots of every tuple written
    are recorded (a failure of one of them rolls the state back)."""

    def __init__(self, runtime: RuntimeSeam, checkpointer: Checkpointer, hold: bool = False) -> None:
        super().__init__(runtime, hold=hold)
        self.cp = checkpointer
        is_live, touched = runtime.acker.is_live, checkpointer.touched

        def live(token: Any) -> bool:  # the writer asks per tuple, just before writing it
            ids = roots_of(token)
            if ids:
                if not is_live(token):  # (another worker's tree: live, its acker decides)
                    return False
                touched.update(ids)
            checkpointer.activity = True
            return True

        self.live = live

    def acked(self, task: Task, tids: list[str], touched: set[Task]) -> None:
        self._settle(task, tids, touched, self.cp.hold)  # hold mode too: release the emits, hold the acks

    def lost(self, task: Task, cause: str) -> None:
        """Its uncommitted state is gone with the process: fail what was in
        flight (which may roll back already), then roll back."""
        cp = self.cp
        cp.detach(task)
        epoch = cp.epoch
        super().lost(task, cause)
        if cp.epoch == epoch:
            cp.rollback(cause)

