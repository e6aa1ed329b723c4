"""A worker's part of checkpoints across host workers (docs/WORKERS.md):
the main process drives every checkpoint (pause, cut, prepare, write,
commit) and every rollback; a worker holds its stateful tasks' acks as the
single-process checkpointer does, tells the owners of other workers' roots
what it holds of them (so that an owner knows when its trees wait only for
held acks), answers the phases, and reads the store the main process
writes (a restarted process's init, the skip of committed ids)."""

from __future__ import annotations

import os
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
        self._asked: int | None = None  # the epoch a rollback was asked for in
        self._covered: set[int] = set()  # the trees of this worker at the cut of the checkpoint being taken
        #: trees the last checkpoint committed whose last acks other workers still hold (they release them
        #: as acks): if such a worker dies they are complete, not failed (their replay would count twice)
        self.committed_pending: set[int] = set()
        self._answered_by: dict[int, Any] = {}  # task id -> the process that answered the prepare
        self._n_held = 0  # the acks held when the prepare went out: what its commit releases
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
        acker = self.rt.acker
        me, n = acker.worker, acker.workers
        for e in edges:
            if type(e) is int:
                if e % n != me:
                    self.link.held(e % n, e, e)
                continue
            for r, tid in e.ids.items():
                if r % n != me:
                    self.link.held(r % n, r, tid ^ e.ack_val)

    def quiescent(self) -> bool:
        hx, rh = self._held_xor, self.remote_held
        for r, root in self.rt.acker.roots.items():
            if root.value != hx.get(r, 0) ^ rh.get(r, 0):
                return False
        return True

    async def run(self) -> None:
        await trio.sleep_forever()  # the main process says when

    async def final(self) -> None:
        return None  # the main process takes the last one

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
        self.epoch = epoch - 1  # (+ 1 in rollback)
        super().rollback(cause)
        why = f"rolled back to the last checkpoint: {cause}"
        for r in list(acker.roots):
            if r not in self.committed_pending:
                acker.fail_root(r, why)
        self.rt.settle()
        self.remote_held = {}
        self._asked = None
        self.paused = False
        self._kick_spouts()

    def failed_elsewhere(self, roots: list[int], worker: int) -> None:
        """Trees another worker owns failed: one a stateful task here took rolls everything back."""
        if not self.touched.isdisjoint(roots):
            self.rollback(f"a tree that a stateful task took failed (owned by host worker {worker})")

    # -- the phases ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        spouts = [t for t in self.rt.tasks.values() if isinstance(t, SpoutTask)]
        # (a rollback asked for and not yet here: the acks held of a lost process must not be released)
        cut = (self.paused and self._asked is None and not any(getattr(t, "asking", False) for t in spouts)
               and not (self._owed & self.ready) and self.quiescent())
        # nothing frees room but a checkpoint: every spout held back (max spout pending) or dry
        blocked = self.paused or all(t.idle or self.rt.emit_room(t) == 0 for t in spouts)
        out = {"activity": bool(self.activity or self.held or self.view), "cut": cut, "epoch": self.epoch,
               "blocked": blocked}
        if os.environ.get("ML_DEBUG_CP"):
            hx, rh = self._held_xor, self.remote_held
            bad = [r for r, root in self.rt.acker.roots.items() if root.value != hx.get(r, 0) ^ rh.get(r, 0)]
            out["why"] = (self.paused, [getattr(t, "asking", False) for t in spouts], sorted(self._owed & self.ready),
                          len(bad), len(self.held), len(rh), sorted(self.ready), len(self.touched))
        return out

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._waiting = set()
        self._kick_spouts()

    async def prepare(self, txid: int) -> dict[str, Any] | None:
        rt, epoch = self.rt, self.epoch
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
        outputs = {orjson.dumps([record.get(k) for k in key_fields]).decode(): record for record, _ in self.view.values()}
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
        held = self.held
        released, self.held, self._held_xor = held[:self._n_held], [], {}
        super().hold(held[self._n_held:])  # (their XOR went to their owners when they were held)
        for r in list(self.hashes):
            if r in rt.acker.roots:
                del self.hashes[r]
        self.remote_held = {}  # every tree was at the cut: the holders' releases come as acks
        self.touched.clear()
        self.activity = False
        rt.acker.ack_many(released)
        roots = rt.acker.roots
        self.committed_pending = {r for r in self._covered if r in roots}
        rt.settle()
        self.paused = False
        self._waiting = set()
        self._kick_spouts()

    def _kick_spouts(self) -> None:
        for t in self.rt.tasks.values():
            if isinstance(t, SpoutTask):
                t.kick()

