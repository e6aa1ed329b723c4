"""A worker's part of checkpoints across host workers (docs/WORKERS.md):
the main process drives every checkpoint (pause, cut, prepare, write,
commit) and every rollback; a worker holds its stateful tasks' acks as the
single-process checkpointer does, tells the owners of other workers' roots
what it holds of them (so that an owner knows when its trees wait only for
held acks), answers the phases, and reads the store the main process
writes (a restarted process's init, the skip of committed ids)."""

from __future__ import annotations

import math
from typing import Any

import orjson
import trio

from multilang.messages import StateCommit, StatePrepare

from .._runtime.checkpoint import Checkpointer
from .._runtime.state_store import SqliteStore, msg_key
from .._runtime.tasks import SpoutTask

__all__ = ["WorkerCheckpointer"]


class WorkerCheckpointer(Checkpointer):
    def __init__(self, runtime: Any, link: Any) -> None:
        self.link = link
        self.remote_held: dict[int, int] = {}  # root (this worker's) -> XOR of the acks other workers hold of it
        self._told: dict[int, int] = {}  # root (another worker's) -> the XOR of its held acks told to its owner
        self._dirty: set[int] = set()  # roots whose held acks changed since the owners were told (paused)
        self._asked: int | None = None  # the epoch a rollback was asked for in
        self._covered: set[int] = set()  # the trees of this worker at the cut of the checkpoint being taken
        self._answered_by: dict[int, Any] = {}  # task id -> the process that answered the prepare
        self._n_held = 0  # the acks held when the prepare went out: what its commit releases
        self._committed_txid = 0
        super().__init__(runtime)

    def _open(self) -> Any:
        if self.store is None:  # the main process made it and writes it: read it
            topo = self.rt.topology
            self.store = SqliteStore(self.provider_config["dir"], topo.name or "topology", readonly=True)
            self.resuming = self.store.txid is not None
        return self.store

    # -- what the single-process checkpointer does, across workers -----------------------

    def resumed_outputs(self) -> list[dict[str, Any]]:
        return []  # the main process reads the committed view (this worker's keys are only part of it)

    def hold(self, edges: list[Any]) -> None:
        super().hold(edges)
        if self.paused:  # a cut is awaited: the owners hear of these roots (at the link's next flush)
            dirty = self._dirty
            for e in edges:
                if type(e) is int:
                    dirty.add(e)
                else:
                    dirty.update(e.ids)
            self.link.wake()

    def tell(self) -> None:
        """Tell the owners of other workers' roots the XOR of the acks held
        here of them, for the roots whose held acks changed since they were
        last told (the link calls this before each flush). Said again when
        they are released, in the batch that carries the acks: the owner's
        count (an XOR) goes back to what it was, in the order its link
        delivers, with no reset to race with."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        acker, told, hx, held = self.rt.acker, self._told, self._held_xor, self.link.held
        me, n = acker.worker, acker.workers
        for r in dirty:
            if r % n != me:
                x = hx.get(r, 0)
                d = x ^ told.get(r, 0)
                if d:
                    held(r % n, r, d)
                    if x:
                        told[r] = x
                    else:
                        told.pop(r, None)

    def _untell(self, edges: list[Any]) -> None:
        """Released while others stay held (the rare case): the owners take
        back these acks' XOR, edge by edge."""
        acker, told, held = self.rt.acker, self._told, self.link.held
        me, n = acker.worker, acker.workers
        for e in edges:
            if type(e) is int:
                pairs: Any = ((e, e),)
            else:
                av = e.ack_val
                pairs = ((r, tid ^ av) for r, tid in e.ids.items())
            for r, x in pairs:
                if r % n != me:
                    held(r % n, r, x)
                    x ^= told.pop(r, 0)
                    if x:
                        told[r] = x
        self.link.wake()

    def quiescent(self) -> bool:
        hx, rh = self._held_xor, self.remote_held
        for r, root in self.rt.acker.roots.items():
            if root.value != hx.get(r, 0) ^ rh.get(r, 0):
                return False
        return True

    async def run(self) -> None:
        """The main process says when a checkpoint is taken: at the interval,
        or sooner when every worker says its spouts have been quiet long
        enough for one, as a tree's acks wait for it. Quiet is the embedded
        engine's rule (``Checkpointer._quiet_needed``: 2 ms for spouts that
        may not emit, max spout pending or the end of their input; a tenth
        of the interval for a shell spout that found nothing to emit
        lately), timed here: this tells the main process, as it changes,
        whether it holds and whether anything waits for a checkpoint here;
        the committed txid and the epoch say which round the word is of (a
        word of an earlier one is not taken)."""
        rt, sent = self.rt, None
        since: float | None = None  # since when the spouts here have been quiet (no emit)
        seen = -1
        while True:
            now = trio.current_time()
            if since is None or rt.emitted_by_spouts != seen:
                since = now
            seen = rt.emitted_by_spouts
            quiet = self._quiet_for_checkpoint(since)
            if quiet is None:
                since = None
            due = None if since is None or quiet is None else since + quiet  # (quiet enough from then on)
            ready = due is not None and now >= due
            flags = (ready, bool(self.activity or self.held or self.view), self._committed_txid, self.epoch)
            if flags != sent:
                self.link.to_main(("cp_flags", self.link.worker, flags))
                sent = flags
            with trio.move_on_at(due if due is not None and not ready else math.inf):
                await rt.wait_for_change()

    async def final(self) -> None:
        return None  # the main process took the last one before it said finish (or could not: at least once)

    def _quiet_for_checkpoint(self, since: float) -> float | None:
        """How long the spouts here must stay quiet before a checkpoint (the
        embedded engine's rule), or None: wait for the interval. None too
        while a tree the last checkpoint committed still waits for its acks
        from another worker (each frees room: a checkpoint taken before
        would cover half as many)."""
        acker = self.rt.acker
        if acker.committed:
            acker.committed = {r for r in acker.committed if r in acker.roots}
            if acker.committed:
                return None
        return self._quiet_needed(since)

    def rollback(self, cause: str) -> None:
        """Asked for here (a stateful process lost, a watched tree failed):
        every worker rolls back, when the main process says so."""
        self.rt.acker.watch_failed = None
        if self._asked != self.epoch:
            self._asked = self.epoch
            self.link.to_main(("rollback", self.epoch, cause))

    def rollback_now(self, cause: str, epoch: int) -> None:
        """Every worker's: back to the last commit, the run's epoch ``epoch``.
        Every tree this worker owns is failed (a tree the last checkpoint
        committed excepted): the other workers drop the tuples of earlier
        epochs' trees, and what a stateful process took of them before this
        is undone by its rollback."""
        acker = self.rt.acker
        acker.epoch = epoch
        acker.hold_timeouts = False
        self.epoch = epoch - 1  # (+ 1 in rollback)
        super().rollback(cause, quiet=True)  # (the main process says it, once for every worker)
        why = f"rolled back to the last checkpoint: {cause}"
        for r in list(acker.roots):
            if r not in acker.committed:
                acker.fail_root(r, why)
        self.rt.settle()
        # (every root of the owners' is failed: a new epoch's are new)
        self.remote_held, self._told, self._dirty = {}, {}, set()
        self._asked = None
        self.paused = False
        self.rt.kick_spouts()

    def failed_elsewhere(self, failed: list[tuple[int, str | None]], worker: int) -> None:
        """Trees another worker owns failed (root, cause): one a stateful task
        here took rolls everything back, for its cause (a process lost, a
        timeout), as on one worker."""
        touched = self.touched
        for r, cause in failed:
            if r in touched:
                self.rollback(cause or f"a tree that a stateful task took failed (owned by host worker {worker})")
                return

    # -- the phases ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        spouts = [t for t in self.rt.tasks.values() if isinstance(t, SpoutTask)]
        # (a rollback asked for and not yet here: the acks held of a lost process must not be released)
        cut = (self.paused and self._asked is None and not any(getattr(t, "asking", False) for t in spouts)
               and not (self._owed & self.ready) and self.quiescent())
        return {"activity": bool(self.activity or self.held or self.view), "cut": cut, "epoch": self.epoch}

    def started_at(self, txid: int) -> None:
        """The store's last commit when this worker (re)started."""
        self._committed_txid = txid
        self.rt.nudge()

    def at_cut(self) -> None:
        """This worker reached the cut of the checkpoint being taken: until it
        commits or rolls back, no tree of this worker's times out. The other
        workers prepare with what they had been sent by the cut; a tree of
        this worker's that failed after it, having touched a stateful task
        elsewhere, would be left out of the checkpoint's completed trees
        while its effect was in, and its replay would count it again."""
        self.rt.acker.hold_timeouts = True

    def pause(self) -> None:
        self.paused = True
        self._dirty.update(self._held_xor)  # what the owners were not told yet of the acks held here
        self.link.wake()
        self.rt.nudge()

    async def prepare(self, txid: int, sent: dict[int, dict[int, int]]) -> dict[str, Any] | None:
        """Step 4 (docs/WORKERS.md). ``sent``: what each worker had sent each
        peer when it reached the cut. This one first takes everything its
        peers sent it by then: among it, the failures of their trees (a tree
        that failed at its owner, having touched a stateful task here, rolls
        back; prepared at once, its effect was committed, and its replay
        counted it again)."""
        rt, epoch, link = self.rt, self.epoch, self.link
        me = link.worker
        due = {peer: by[me] for peer, by in sent.items() if peer != me and me in by}
        while (any(link.received[peer] < n for peer, n in due.items()) and self.epoch == epoch
               and self._asked is None):
            await rt.wait_for_change()
        if self.epoch != epoch or self._asked is not None:  # (a failure among them rolls back)
            return None
        self._txid_asked = txid
        self._answers = {}
        self.activity = False
        # As the single-process checkpointer: the prepares go out now, ahead of any tuple not yet written,
        # and what is held from now on (the acks of a tree a spout began after this worker's cut) waits
        # for the next checkpoint.
        self._n_held = len(self.held)
        self._waiting = set(self.ready)
        self._owed |= self._waiting
        for task_id in self._waiting:
            self.tasks[task_id].send_state(StatePrepare(txid=txid))
        while self._waiting and self.epoch == epoch and self._asked is None:
            await rt.wait_for_change()
        if self.epoch != epoch or self._asked is not None:  # a stateful process was lost: all roll back
            return None
        roots = rt.acker.roots
        self._covered = set(roots)
        completed, values = [], {}
        for r, root in roots.items():
            key = msg_key(root.msg_id)
            if key is None:
                continue
            spout = rt.tasks[root.spout_task]
            completed.append((spout.name, spout.index, key))
            h = self.hashes.get(r)
            if h is not None:
                values[(spout.name, spout.index, key)] = h
        key_fields = rt.topology.output.key or []
        stamps = rt.output_stamps or {}
        outputs = {orjson.dumps([record.get(k) for k in key_fields]).decode(): (stamps.get(key, 0), record)
                   for key, (record, _) in self.view.items()}
        changes = {(self.tasks[t].name, self.tasks[t].index): answer for t, answer in self._answers.items()}
        parallelism = {self.tasks[t].name: len(self.tasks[t].comp.tasks) for t in self._answers}
        return {"changes": changes, "completed": completed, "values": values, "outputs": outputs,
                "parallelism": parallelism}

    def prepared(self, task: Any, msg: Any) -> None:
        if not msg.more and msg.txid == self._txid_asked and task.task_id in self._waiting:
            self._answered_by[task.task_id] = getattr(task, "proc", None)
        super().prepared(task, msg)

    def commit(self, txid: int) -> None:
        rt = self.rt
        if txid != self._txid_asked or txid == self._committed_txid:
            return  # (the main process commits a checkpoint once; a repeat would release the next one's acks)
        self._committed_txid = txid
        for task_id in self._answers:
            t = self.tasks[task_id]
            proc = getattr(t, "proc", None)
            if proc is not None and proc is self._answered_by.get(task_id) and task_id in self.ready:
                t.send_state(StateCommit(txid=txid))
            elif proc is not None:
                # The process that answered died, and this one took its init from the store before this
                # checkpoint was written: it starts again, from the store as it is now (the rollback its
                # predecessor's loss asked for fails the trees since).
                proc.kill()
        self._answered_by = {}
        self.committed += 1
        self.keys_written += sum(len(put) + len(delete) for put, delete in self._answers.values())
        if self.store is not None:
            self.store.txid = txid
        rt.commit_view({k: r for k, (r, _) in self.view.items()})
        self.view = {}
        self.tell()  # (what was held since the last flush: told is then what the owners hold)
        held, xors, n_held = self.held, self._held_xor, self._n_held
        self.held, self._held_xor = [], {}
        if n_held == len(held):  # the usual case, all released: per tree, the XOR of its held acks
            told, self._told, tell = self._told, {}, self.link.held
            n = rt.acker.workers
            for r, x in told.items():  # undone at the owners, in the batch that carries the acks
                tell(r % n, r, x)
            rt.acker.ack_xors(xors)
        else:
            super().hold(held[n_held:])  # (their XOR went to their owners when they were held: paused)
            self._untell(held[:n_held])
            rt.acker.ack_many(held[:n_held])
        for r in list(self.hashes):
            if r in rt.acker.roots:
                del self.hashes[r]
        roots = rt.acker.roots
        self.remote_held = {r: x for r, x in self.remote_held.items() if r in roots}
        self.touched.clear()
        self.activity = False
        rt.acker.committed = {r for r in self._covered if r in roots}  # (whose acks other workers release)
        rt.acker.hold_timeouts = False  # (a tree past its deadline and not released by this fails now)
        rt.settle()
        self.paused = False
        self._waiting = set()
        self.rt.kick_spouts()
        rt.nudge()

