"""Storm's acker, exactly (spec/PROTOCOL.md §7). Pure: no I/O, time passed in.

Every tuple edge gets a random 64-bit id. A tuple instance carries, per root
it belongs to, the XOR of the edge ids that created it (``ids``), and
accumulates the edge ids of the tuples later anchored to it (``ack_val``).

* a spout's reliable emit to n tasks registers root r with e1 ^ ... ^ en;
* a bolt emit anchored to tuples A1..Ak, for each destination task and each
  anchor, draws a fresh edge e, XORs it into that anchor's ``ack_val`` and
  into the new tuple's id for each of the anchor's roots (§7.1, §7.2);
* acking a tuple XORs ``ids[r] ^ ack_val`` into each of its roots r;
* a root whose value returns to 0 is complete (false completion ~2^-64);
* any fail fails the root once; a root not complete within the message
  timeout is failed; later acks and fails of it are ignored (§7.3, §7.4).

Order of init and updates does not matter (XOR commutes), which is what lets
the runtime register a root after its first edges are already on their way.

**Partitioned by worker** (``topology.workers`` > 1, Storm's acker executors
keyed by root id): each worker's acker owns the roots its spouts register,
drawn so that ``root % workers`` is that worker. An ack or fail of a root
another worker owns is not applied here but queued for its owner
(:meth:`Acker.take_remote`), which applies it with :meth:`Acker.apply_remote`;
XOR commuting is what makes the order and batching of those messages free.
So a tree completes, fails and times out where its spout is, as with one.

**One-hop tokens.** A reliable spout tuple sent to one task is most often
the whole of what its task does with it before acking (a bolt whose emits
are topology outputs, ``multilang pipe``). So :meth:`Acker.spout_emits` and
:meth:`Acker.spout_root` give such a tuple its root id ``r`` as its edge id
too, and hand out the bare ``int`` ``r`` as its token instead of a
``TupleEdges({r: r})``: the same tree (its value is ``r``; acking the token
XORs ``r`` back out), without an object per tuple. Every method that takes a
token takes either; :func:`edges_of` turns a one-hop token into its
``TupleEdges`` the first time something is anchored to it (the caller keeps
the result as the token from then on: anchoring adds to its ``ack_val``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .rng import getrandbits

__all__ = ["Acker", "Root", "TupleEdges", "new_edge_id", "edges_of", "roots_of"]

_MASK = (1 << 64) - 1
#: rollback epochs a root id tells apart (workers > 1): a tuple 256 rollbacks old would pass for live
_EPOCHS = 256


def new_edge_id(rand: Callable[[int], int] = getrandbits) -> int:
    """A random non-zero 64-bit edge id."""
    while True:
        e = rand(64)
        if e:
            return e


@dataclass(slots=True)
class TupleEdges:
    """The acker's view of one delivered tuple: its ids per root and its
    accumulated out-edges. An unanchored tuple has no roots."""

    ids: dict[int, int] = field(default_factory=dict)
    ack_val: int = 0


def edges_of(token: "int | TupleEdges") -> "TupleEdges":
    """A tuple's token as :class:`TupleEdges`: a one-hop token ``r`` is
    ``TupleEdges({r: r})``; anything else is returned as it is."""
    return TupleEdges({token: token}) if type(token) is int else token  # type: ignore[dict-item,return-value]


def roots_of(token: "int | TupleEdges") -> Any:
    """The root ids a tuple's token belongs to (none: a tick or an unanchored tuple)."""
    return (token,) if type(token) is int else token.ids  # type: ignore[union-attr]


@dataclass(slots=True)
class Root:
    """One spout tuple tree being tracked."""

    value: int
    spout_task: int
    msg_id: Any
    deadline: float


def _nothing() -> None:
    return None


class Acker:
    """Tracks tuple trees. Call :meth:`completed` / :meth:`failed_roots` after
    updates to learn what to tell the spouts."""

    def __init__(self, timeout: float = 30.0, *, rand: Callable[[int], int] = getrandbits,
                 worker: int = 0, workers: int = 1) -> None:
        self.timeout = timeout
        self._rand = rand
        #: this acker's worker, of ``workers``: it owns the roots r with r % workers == worker
        self.worker, self.workers = worker, workers
        #: owner -> the acks of its roots not sent yet, as root -> the XOR of them; and its fails (root, cause)
        self._remote_acks: dict[int, dict[int, int]] = {}
        self._remote_fails: dict[int, list[tuple[int, str | None]]] = {}
        #: called when a message for another worker is queued and none was (its link sends them)
        self.on_remote: Callable[[], None] = _nothing
        #: other workers' roots known to have failed (a tuple of one failed here, or its owner said so):
        #: their tuples here are stale, as those of a root this acker dropped -> when to forget it (two
        #: message timeouts on; a rollback's new epoch makes every one of them stale anyway)
        self._dead: dict[int, float] = {}
        self._now = 0.0  # the latest time seen by expire()
        #: the run's rollback epoch (workers > 1): a root carries it (bits above the worker's), and a tuple
        #: of another worker's tree of an earlier epoch is not live: every tree then in flight was failed
        self.epoch = 0  # (a property: it sets what is_live tells another worker's live trees by)
        #: (root, cause) of this acker's roots that failed since the last take (workers > 1): the other
        #: workers hear of them, as a worker that touched one with a stateful task must roll back (§9.7)
        self.failed_out: list[tuple[int, str | None]] = []
        self.roots: dict[int, Root] = {}
        # Acks of roots not (or no longer) registered: root -> [xor, drop-after].
        self._early: dict[int, list[Any]] = {}
        #: (spout_task, msg_id) of trees completed / failed since last drained.
        self._acked: list[tuple[int, Any]] = []
        self._failed: list[tuple[int, Any]] = []
        self._causes: list[str | None] = []  # why each of _failed failed, in the same order
        self.stats = {"completed": 0, "failed": 0, "timed_out": 0}
        #: roots whose failure the caller must hear of at once (the trees that
        #: touched a stateful bolt since its last checkpoint, §9.7): the cause
        #: of the first such failure since the caller last cleared it
        self.watch: set[int] = set()
        self.watch_failed: str | None = None
        #: no tree times out while set (a host worker from its checkpoint's cut to the commit or the
        #: rollback: a tree the checkpoint covers completes with it; shellbolt/_workers/checkpoints.py)
        self.hold_timeouts = False
        #: trees a checkpoint committed whose last acks, released by that commit, are on their way from
        #: other workers (host workers): one past its deadline completes, as the commit covered it (its
        #: failure would replay it, and count it twice)
        self.committed: set[int] = set()
        #: the root completed last: its age stands for the trees completed
        #: with it in the complete latency (observe.py; one store per tree)
        self.last_done: Root | None = None

    def new_id(self) -> int:
        return self._rand(64) or new_edge_id(self._rand)  # zero (p = 2^-64) draws again

    def new_root(self) -> int:
        """A fresh root id this acker owns."""
        r = self.new_id()
        n = self.workers
        if n > 1:
            m = n * _EPOCHS
            r = r - r % m + (self.epoch % _EPOCHS) * n + self.worker
            if r > _MASK:
                r -= m
            if r == 0:  # (worker 0, epoch 0: p = m * 2^-64)
                return self.new_root()
        return r

    def owner(self, r: int) -> int:
        """The worker whose acker owns root ``r``."""
        return r % self.workers

    def take_remote(self) -> dict[int, tuple[dict[int, int], list[tuple[int, str | None]]]]:
        """The acks and fails queued for other workers' roots since the last
        call, by owner: ``{owner: ({root: xor}, [(root, cause)])}`` (a root's
        acks folded into one XOR: a sentence's words cross as one ack)."""
        out = {w: (self._remote_acks.pop(w, {}), self._remote_fails.pop(w, []))
               for w in set(self._remote_acks) | set(self._remote_fails)}
        return out

    def apply_remote(self, acks: dict[int, int], fails: list[tuple[int, str | None]]) -> None:
        """Acks and fails of this acker's roots, from the other workers: the
        fails first. A batch folds a tree's acks and keeps no order between
        them and its fails, and a tree is failed before its last ack can
        come: a bolt's emit the host refuses fails the input's tree, and the
        bolt's ack of that input follows (the one engine fails the tree, and
        ignores the ack). Acks first, the tree completed, and its input was
        lost without a replay."""
        for r, cause in fails:
            self.fail_root(r, cause)
        ack_root = self._ack_root
        for r, x in acks.items():
            ack_root(r, x)

    # -- spout side ---------------------------------------------------------

    def init(self, root: int, value: int, spout_task: int, msg_id: Any, now: float) -> None:
        """Register a spout tuple's tree (``value`` = XOR of its first edges).

        Acks that arrived before the registration are folded in (§7.1)."""
        self._now = max(self._now, now)
        early = self._early.pop(root, None)
        if early is not None:
            value ^= early[0]
        self.roots[root] = Root(value, spout_task, msg_id, now + self.timeout)
        if value == 0:  # emitted to no task, or already fully acked: complete now
            self._complete(root)

    def spout_emit(self, spout_task: int, msg_id: Any, n_targets: int, now: float) -> tuple[int, list[TupleEdges]]:
        """A reliable spout emit to ``n_targets`` tasks: returns the root id and
        one :class:`TupleEdges` per target."""
        root = self.new_root()
        if n_targets == 1:  # the common case, without the loop
            e = self.new_id()
            self.init(root, e, spout_task, msg_id, now)
            return root, [TupleEdges({root: e})]
        edges = []
        value = 0
        for _ in range(n_targets):
            e = self.new_id()
            value ^= e
            edges.append(TupleEdges({root: e}))
        self.init(root, value, spout_task, msg_id, now)
        return root, edges

    def spout_root(self, spout_task: int, msg_id: Any, now: float) -> int:
        """A reliable spout emit to one task: its one-hop token (the root id)."""
        root = self.new_root()
        self.init(root, root, spout_task, msg_id, now)
        return root

    def spout_emits(self, spout_task: int, msg_ids: list[Any], now: float) -> list[int]:
        """:meth:`spout_root` for a run of reliable emits to one task each,
        in one call: one one-hop token per emit (bench/host_pipe.py)."""
        new_id = self.new_id if self.workers == 1 else self.new_root
        roots, early, deadline = self.roots, self._early, now + self.timeout
        self._now = max(self._now, now)
        out = []
        for msg_id in msg_ids:
            root = new_id()
            if early and root in early:  # acks before the registration (§7.1): the general path
                self.init(root, root, spout_task, msg_id, now)
            else:
                roots[root] = Root(root, spout_task, msg_id, deadline)
            out.append(root)
        return out

    # -- bolt side ----------------------------------------------------------

    def anchor(self, anchors: list[TupleEdges], n_targets: int) -> list[TupleEdges]:
        """A bolt emit anchored to ``anchors``: one new :class:`TupleEdges` per
        target task, with the anchors' ``ack_val`` updated (§7.1, §7.2). A
        one-hop token must be made a :class:`TupleEdges` (:func:`edges_of`),
        kept as the anchor's token, first."""
        if n_targets == 1 and len(anchors) == 1:  # the common case, without the loops
            a = anchors[0]
            if not a.ids:
                return [TupleEdges()]
            e = self.new_id()
            a.ack_val ^= e
            return [TupleEdges(dict.fromkeys(a.ids, e))]
        out = []
        for _ in range(n_targets):
            ids: dict[int, int] = {}
            for a in anchors:
                if not a.ids:
                    continue
                # A fresh edge per anchor (as Storm's output collector does):
                # one edge shared by two anchors of the same root would
                # cancel out in the new tuple's id and complete the tree early.
                e = self.new_id()
                a.ack_val ^= e
                for r in a.ids:
                    ids[r] = ids.get(r, 0) ^ e
            out.append(TupleEdges(ids))
        return out

    def anchor_each(self, anchors: list[TupleEdges]) -> list[TupleEdges]:
        """A run of bolt emits, the i-th anchored to the one tuple
        ``anchors[i]`` (the same tuple may be named many times) and sent to
        one task: :meth:`anchor` ``([anchors[i]], 1)`` for each, in one call."""
        new_id, out = self.new_id, []
        append = out.append
        for a in anchors:
            ids = a.ids
            if not ids:
                append(TupleEdges())
                continue
            e = new_id()
            a.ack_val ^= e
            append(TupleEdges(dict.fromkeys(ids, e)))
        return out

    def ack(self, t: "int | TupleEdges") -> None:
        """The tuple was acked by the task it was delivered to."""
        if type(t) is int:  # a one-hop token: its root's one edge
            self._ack_root(t, t)
            return
        for r, tid in t.ids.items():  # type: ignore[union-attr]
            self._ack_root(r, tid ^ t.ack_val)  # type: ignore[union-attr]

    def _ack_root(self, r: int, x: int) -> None:
        root = self.roots.get(r)
        if root is None:
            if self.workers > 1 and r % self.workers != self.worker:  # another worker's tree: its acker's
                out = self._remote_acks.get(r % self.workers)
                if out is None:
                    out = self._remote_acks[r % self.workers] = {}
                    self.on_remote()
                out[r] = out.get(r, 0) ^ x
                return
            # Not registered yet (XOR commutes, §7.1), or a late ack of a
            # finished tree (§7.4): kept aside, and dropped after the
            # message timeout if no registration claims it.
            early = self._early.get(r)
            if early is None:
                self._early[r] = [x, self._now + self.timeout]
            else:
                early[0] ^= x
            return
        root.value ^= x
        if root.value == 0:
            self._complete(r)

    def ack_xors(self, xors: dict[int, int]) -> None:
        """Acks given as root -> the XOR of its acked edges (held acks released at once)."""
        ack_root = self._ack_root
        for r, x in xors.items():
            if x:
                ack_root(r, x)

    def ack_many(self, ts: "list[int | TupleEdges]") -> None:
        """:meth:`ack` for a run of tuples, in one call."""
        roots, ack = self.roots, self.ack
        done, last, n = self._acked, None, 0
        for t in ts:
            if type(t) is int:  # a one-hop token, inline: its one edge completes its tree
                root = roots.get(t)
                if root is not None and root.value == t:
                    del roots[t]
                    done.append((root.spout_task, root.msg_id))
                    last = root
                    n += 1
                    continue
                ack(t)
                continue
            ids = t.ids  # type: ignore[union-attr]
            if len(ids) == 1:  # the common case, inline: one root, registered
                for r, tid in ids.items():
                    root = roots.get(r)
                    if root is not None:
                        root.value ^= tid ^ t.ack_val
                        if root.value == 0:
                            self._complete(r)
                        continue
                    ack(t)
            elif ids:
                ack(t)
        if n:  # what _complete does for each, once for the run
            self.last_done = last
            self.stats["completed"] += n

    def fail(self, t: "int | TupleEdges", cause: str | None = None) -> None:
        """The tuple was failed (explicitly, or its process died).
        ``cause``, if known, travels with the failure to the spout's host
        (a dead letter says why its input was given up on)."""
        for r in roots_of(t):
            self.fail_root(r, cause)

    def fail_root(self, r: int, cause: str | None = None) -> None:
        root = self.roots.pop(r, None)
        if root is None and self.workers > 1 and r % self.workers != self.worker:
            self._remote_fails.setdefault(r % self.workers, []).append((r, cause))
            self._dead[r] = self._now + 2 * self.timeout
            if r in self.watch and self.watch_failed is None:  # (touched here: rolls back, not waiting for its owner)
                self.watch_failed = cause or "failed"
            self.on_remote()
            return
        if root is not None:
            if self.workers > 1:
                self.failed_out.append((r, cause))
                self.on_remote()
            if r in self.watch and self.watch_failed is None:
                self.watch_failed = cause or "failed"
            self.stats["failed"] += 1
            self._failed.append((root.spout_task, root.msg_id))
            self._causes.append(cause)

    def failed_elsewhere(self, failed: list[tuple[int, str | None]]) -> None:
        """Trees of other workers that failed, (root, cause) as their owner
        says (``failed_out``): their tuples here are stale from now on. (Taken
        for live, a tuple of one that reached a stateful task after the word
        was counted twice, once more by the replay: no rollback was due.)"""
        forget = self._now + 2 * self.timeout
        dead, me, n = self._dead, self.worker, self.workers
        for r, _ in failed:
            if r % n != me:
                dead[r] = forget

    def complete_root(self, r: int) -> None:
        """Take tree ``r`` as complete whatever acks are still to come: a
        checkpoint committed it, and the worker holding its last acks died
        (shellbolt/_workers). Its later acks are ignored, as a finished tree's."""
        if r in self.roots:
            self._complete(r)

    @property
    def epoch(self) -> int:
        return self._epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch = epoch
        # A root's id modulo n * _EPOCHS is its epoch's slot and its owner's (new_root): the slots of
        # this epoch's trees of the other workers, which is_live takes as live (their owners decide).
        n = self.workers
        self._slot_mod = n * _EPOCHS
        self._remote_slots = frozenset((epoch % _EPOCHS) * n + w for w in range(n) if w != self.worker)
        self._dead = {}  # (every earlier epoch's tree is stale by its slot)

    def is_live(self, t: "int | TupleEdges") -> bool:
        """False if ``t`` belongs to trees that have all completed, failed or
        timed out: delivering it would only do work nobody waits for (and,
        once its tree is replayed, do it twice). An unanchored tuple (no
        roots) is always live; so is one of another worker's tree begun in
        this epoch (a rollback failed every earlier one), unless it is known
        to have failed (:meth:`failed_elsewhere`): its owner decides.
        (Asked per tuple, on every worker: no call but this one.)"""
        if type(t) is int:
            return t in self.roots or t % self._slot_mod in self._remote_slots and t not in self._dead
        roots, m, slots, dead = self.roots, self._slot_mod, self._remote_slots, self._dead
        ids = t.ids  # type: ignore[union-attr]
        for r in ids:  # (one, mostly)
            if r in roots or r % m in slots and r not in dead:
                return True
        return not ids

    def pending_here(self, t: "int | TupleEdges") -> bool:
        """Whether one of ``t``'s trees is one of this worker's, still
        pending (an anchored token). :meth:`is_live` without another
        worker's trees: those are their owner's to wait for (a run ends when
        no worker has a tree pending, shellbolt/_workers)."""
        if type(t) is int:
            return t in self.roots
        return not self.roots.keys().isdisjoint(t.ids)  # type: ignore[union-attr]

    def expire(self, now: float) -> int:
        """Fail every tree past its deadline (none while :attr:`hold_timeouts`;
        one of :attr:`committed` completes); returns how many ended."""
        self._now = now
        late = [] if self.hold_timeouts else [r for r, root in self.roots.items() if root.deadline <= now]
        cause = f"timed out: not completed within {self.timeout:g}s (topology.message.timeout.secs)"
        committed = self.committed
        for r in late:
            if r in committed:
                self.complete_root(r)
            else:
                self.fail_root(r, cause)
                self.stats["timed_out"] += 1
        if self._early:
            for r in [r for r, (_, deadline) in self._early.items() if deadline <= now]:
                del self._early[r]
        if self._dead:
            for r in [r for r, forget in self._dead.items() if forget <= now]:
                del self._dead[r]
        return len(late)

    def _complete(self, r: int) -> None:
        root = self.roots.pop(r)
        self.last_done = root
        self.stats["completed"] += 1
        self._acked.append((root.spout_task, root.msg_id))

    # -- results ----------------------------------------------------------------

    def drain(self) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
        """(acked, failed) since the last call, as (spout_task, msg_id) pairs."""
        acked, failed, _ = self.drain_with_causes()
        return acked, failed

    def drain_with_causes(self) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]], list[str | None]]:
        """:meth:`drain`, plus the cause of each failure (None if unknown)."""
        acked, failed, causes = self._acked, self._failed, self._causes
        self._acked, self._failed, self._causes = [], [], []
        return acked, failed, causes

    @property
    def pending(self) -> int:
        return len(self.roots)

    def pending_for(self, spout_task: int) -> int:
        return sum(1 for root in self.roots.values() if root.spout_task == spout_task)
