"""Spout tasks: a shell spout process (commands out, one sync back per
command, §4) and an in-process Python spout (reliable, replays failures up to
``multilang.max.replays``, then a dead letter)."""

from __future__ import annotations

import logging
import operator
from collections import deque
from itertools import islice
from typing import Any

import trio

from multilang.connection import Role
from multilang.messages import DEFAULT_STREAM, Ack, Activate, Batch, Deactivate, Emit, Fail, Next

from .._host.process import ShellProcess
from .._host.spout_driver import SpoutDriver
from .._model.conf import SCHEMA
from .._model.results import brief, id_key, short_repr
from .._model.topology import ComponentDef, PythonSpout
from .shell_task import ShellTask
from .tasks import RuntimeSeam, SpoutTask, Task, cannot_cross, log


__all__ = ["ShellSpoutTask", "PythonSpoutTask"]

_MAX_FAIL_IDS = 10_000
_OWED_WARNING = 100_000
_FAIL_WARNING = 10  # a shell spout's id failed this often: warn while the run goes on
_CRASHES_ALONE = 2


class ShellSpoutTask(ShellTask, SpoutTask):
    """A spout process: commands out, one sync back per command (§4)."""

    role = Role.SPOUT

    def __init__(self, runtime: RuntimeSeam, comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self._notices_out = 0  # of the commands out, how many were self.notices (dequeued as each is answered)
        self._empty_nexts = 0
        #: False; "asked" while its `deactivate` is out; True once it synced (§5.4)
        self._deactivated: bool | str = False
        #: msg id key -> [times failed, last cause, msg id]: the spout decides about
        #: replays (Storm semantics); the host only names the ids that keep
        #: failing. Forgotten on ack; at most _MAX_FAIL_IDS ids are tracked.
        self.fail_counts: dict[Any, list[Any]] = {}
        #: msg id key -> (msg id, when it failed): failed ids the spout has not emitted again yet
        #: (at most _MAX_FAIL_IDS): a spout that never replays loses them (docs/STATE.md)
        self._awaiting_replay: dict[Any, tuple[Any, float]] = {}
        self._warned_not_replaying = False
        self.held_past_limit = 0  # emits not delivered: --max-tuples reached, and not replays (_past_limit)
        #: how long a run to the end waits for the task's first emit (_dry)
        start = self.conf.get("multilang.spout.start.secs")
        self.start_secs = float(SCHEMA["multilang.spout.start.secs"].default if start is None else start)
        self._activated_at: float | None = None  # its first process's activation
        self._brought = False  # a `next` brought something in this run (to any of its processes)

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        self.notices.append((kind, msg_id))
        self.kick()
        if len(self.notices) == _OWED_WARNING:
            # Acks and fails reach a spout only between its commands (§4):
            # the one queue the host cannot bound is the one owed to a spout
            # that emits without returning from `next`.
            log.warning("%s owes %d acks/fails to a spout that has not returned from its current command; they are "
                        "queued (about 100 bytes each) until it does. Keep each `next` short, as Storm requires.",
                        self.where(), _OWED_WARNING)
        counts = self.fail_counts
        if kind == "fail" and len(self._awaiting_replay) < _MAX_FAIL_IDS:
            self._awaiting_replay[id_key(msg_id)] = (msg_id, trio.current_time())
        if kind == "fail" or counts:
            key = id_key(msg_id)
            if kind == "fail":
                entry = counts.get(key)
                if entry is not None:
                    entry[0] += 1
                    entry[1] = cause
                    if entry[0] % _FAIL_WARNING == 0:
                        self.runtime.errlog.log(
                            self.where(), logging.WARNING, trio.current_time(),
                            "%s: message id %s has failed %d times (last cause: %s); this spout replays it "
                            "(a shell spout decides, as in Storm)", self.where(), brief(repr(msg_id), 100),
                            entry[0], cause)
                elif len(counts) < _MAX_FAIL_IDS:
                    counts[key] = [1, cause, msg_id]
            else:
                counts.pop(key, None)

    def deactivated(self) -> bool:
        return self._deactivated is True or self.proc is None

    def finished(self, limit_reached: bool) -> bool:
        # Past max_tuples a shell spout with failed ids outstanding may still replay them.
        return not self.notices and (self.idle or (limit_reached and self.pending_roots == 0 and not self.fail_counts))

    def session_lost(self, cause: str) -> None:
        # A fail the lost process synced but had not acted on yet (a replay it
        # kept in memory) would be lost with it: its successor is told again
        # of every failed id not emitted since (§8.2: a spout tolerates a fail
        # of an id it does not know), after the fails still owed.
        owed = {id_key(m) for kind, m in self.notices if kind == "fail"}
        self.notices.extend(("fail", m) for key, (m, _at) in self._awaiting_replay.items() if key not in owed)
        # With stateful bolts what the next process emits again must not count twice (§9.7).
        if self.runtime.checkpoints is not None:
            self.runtime.checkpoints.spout_lost(self)

    def refused(self, msg_id: Any, values: list[Any], cause: str) -> None:
        # A shell spout decides about replays (Storm semantics), but one that
        # replays an emit the host refuses would do so for ever: past
        # multilang.max.replays the host gives up on it (a dead letter) and
        # acks it, so that the spout forgets it.
        entry = self.fail_counts.get(id_key(msg_id))
        attempts = (entry[0] if entry is not None else 0) + 1
        if attempts <= self.max_replays:
            self.stats.failed += 1  # (a fail it is told of, as of a tree's; no tree was begun)
            self.notify("fail", msg_id, cause)
            return
        self.runtime.dead_letter(self, msg_id, values, cause, attempts)
        self.notify("ack", msg_id)

    def took_replays(self, msg_ids: list[Any]) -> int:
        awaiting = self._awaiting_replay
        if not awaiting:
            return 0
        return sum(awaiting.pop(id_key(m), None) is not None for m in msg_ids if m is not None)

    def not_replayed(self) -> list[Any]:
        return [msg_id for msg_id, _ in self._awaiting_replay.values()]

    def check_replays(self, now: float, within: float) -> None:
        """One warning for a spout that has run dry (two empty ``next`` commands in
        a row) with an id that failed ``within`` seconds ago or more still
        not emitted again: Storm leaves replays to the spout, and one that
        does not replay loses that input (with stateful bolts, the trees a
        rollback failed). A spout that is still emitting may replay later (at
        the end of its queue, as the example spouts do): it is not warned, and
        the summary names what it never emitted again."""
        if self._warned_not_replaying or not self._awaiting_replay or self._empty_nexts < 2:
            return
        late = [(m, now - at) for m, at in self._awaiting_replay.values() if now - at >= within]
        if late:
            self._warned_not_replaying = True
            msg_id, ago = late[0]
            log.warning("%s: message id %s failed %.0fs ago, and the spout has nothing more to emit but has not "
                        "emitted it again (%d such id(s)); a spout must replay what fails, or that input is lost: "
                        "exactly-once with stateful bolts, and at-least-once anywhere, need a spout that replays "
                        "(docs/STATE.md)", self.where(), brief(repr(msg_id), 100), ago, len(late))

    def at_rest(self) -> str | None:
        # A shell spout's input never ends as far as the host knows (Storm's neither).
        return "dry" if not self.notices and self._empty_nexts >= 2 else None

    def repeated_failures(self) -> list[tuple[str, Any, int, str | None]]:
        worst = sorted(self.fail_counts.values(), key=lambda e: -e[0])[:5]
        return [(self.where(), e[2], e[0], e[1]) for e in worst if e[0] > 1]  # (its task: ids are per task)

    def replayed_past_max(self) -> list[tuple[str, Any, int, str | None]]:
        return [(self.name, e[2], e[0], e[1]) for e in self.fail_counts.values() if e[0] > self.max_replays]

    async def _serve(self, proc: ShellProcess, nursery: trio.Nursery) -> None:
        self._notices_out = 0
        self._deactivated = False
        driver = SpoutDriver(proc, lambda events: self._handle(proc, events))
        nursery.start_soon(self._watchdog, proc, driver.due)
        nursery.start_soon(self._drive, driver)
        await driver.serve()

    async def _command(self, driver: SpoutDriver, *cmds: Any, notices: int = 0) -> None:
        """Send ``cmds`` in one write and wait for their syncs (the driver's
        command). The first ``notices`` of them are ``self.notices[:notices]``,
        each dequeued when its sync comes: if the process dies first, its
        successor gets the rest (§8.2); a lost fail would be a lost tuple."""
        self._notices_out = notices
        await driver.command(*cmds, on_sync=self._answered if notices else None)
        self._worked = driver.worked  # a next, ack or fail answered (RestartPolicy)

    def _answered(self, n: int) -> None:
        """``n`` more commands of the last write synced: as many notices among them dequeued."""
        done = min(n, self._notices_out)
        for _ in range(done):
            self.notices.popleft()
        self._notices_out -= done

    async def _drive(self, driver: SpoutDriver) -> None:
        rt = self.runtime
        proc = driver.proc
        await self._command(driver, Activate())  # §4.1: always first
        if self._activated_at is None:
            self._activated_at = trio.current_time()
        idle_sleep = 0.001
        # `next` commands per write: 1, or, to a spout that takes pipelined
        # commands (§9.5), twice as many (up to topology.producer.batch.size
        # and the room under max spout pending and --max-tuples) after a
        # write whose nexts each brought at most one emit and together at
        # least one (or only inputs a checkpoint committed, skipped: a
        # resume, §9.7). A busy spout then costs a round trip per batch of
        # inputs, not one per input, and its room is respected as with one
        # next per write. Acks and fails owed go the same way.
        burst, most = 1, self.batch_size
        pipelined = proc.conn.batching
        while True:
            if self.notices:
                # A spout told of an ack or fail may emit again (a replay): it is
                # idle again only after two more empty nexts. (A stale idle read
                # between this fail's sync and the next `next` ended runs as done.)
                self.idle = False
                self._empty_nexts = 0
                n = min(len(self.notices), most) if pipelined else 1
                await self._command(driver, *[Ack(id=m) if kind == "ack" else Fail(id=m)
                                              for kind, m in islice(self.notices, n)], notices=n)
                continue
            if rt.spouts_stopped:
                if not self._deactivated:
                    self._deactivated = "asked"
                    await self._command(driver, Deactivate())
                    self._deactivated = True
                self.idle = True  # (an ack owed that came meanwhile kicked: rest() returns at once, Task.kick)
                await self.rest()
                continue
            # Past --max-tuples a spout that has failed ids outstanding still
            # gets `next`: that is where a shell spout replays them.
            replaying = bool(self.fail_counts)
            room = rt.emit_room(self, replay=replaying)
            awaiting = len(self._awaiting_replay)
            if replaying and rt.max_tuples is not None and not self.held_past_limit and awaiting < _MAX_FAIL_IDS:
                # As many as the replays owed and the fresh room: past the limit a `next` more could only
                # bring a fresh emit that is not delivered, which the spout would keep as pending. (A spout
                # that emits its fresh inputs before its replays, once one was not delivered, gets its
                # bursts again: it goes through its input to its replays a burst at a time, not one by one.)
                room = min(room, awaiting + max(0, rt.max_tuples - rt.fresh_by_spouts - rt.nexts_out))
            if room:
                # an emit the host refused (an error) was not nothing: no back-off for it
                stats = self.stats
                emitted, skipped, errors = stats.emitted, stats.skipped, stats.errors
                skipped += self.held_past_limit  # (what --max-tuples held back was not nothing: _past_limit)
                n = min(burst, room)
                out = 0 if replaying or rt.max_tuples is None else n  # (the room these nexts may fill)
                self.asking = True  # a `next` out: its emits may start trees (a checkpoint's cut waits, workers)
                rt.nexts_out += out
                try:
                    await self._command(driver, *[Next()] * n)
                finally:
                    self.asking = False
                    if out:
                        rt.nexts_out -= out
                        if rt.fresh_capped:  # (the room these nexts did not fill is not asked for again)
                            rt.cap_fresh()
                        rt.kick_spouts(but=self)  # (room they did not fill: another spout may take it)
                brought = stats.emitted - emitted
                now_skipped = stats.skipped + self.held_past_limit
                if pipelined and stats.errors == errors and brought <= n and brought + now_skipped > skipped:
                    burst = min(burst * 2, most)
                else:
                    burst = 1
                if stats.emitted + now_skipped + stats.errors == emitted + skipped + errors:
                    self._empty_nexts += 1
                    if self._empty_nexts == 2:
                        self.dry_since = trio.current_time()
                    self.idle = self._dry()
                    # Storm's spout wait strategy: back off while there is nothing to emit.
                    await self.rest(idle_sleep)
                    idle_sleep = min(idle_sleep * 2, 0.05)
                else:
                    self._empty_nexts = 0
                    self._brought = True
                    self.idle = False
                    idle_sleep = 0.001
            else:
                self.idle = self._dry()
                left = (self._activated_at or 0.0) + self.start_secs - trio.current_time()
                await self.rest(left if not self.idle and not self._brought and left > 0 else None)

    def _dry(self) -> bool:
        """Nothing more to emit, as far as a run to the end can tell (a shell
        spout's input never ends, as in Storm): two empty `next`s in a row
        and none of its trees in flight; and, before the task's first emit
        in this run, ``multilang.spout.start.secs`` since its first process
        was activated: a spout still connecting to its source answers `next`
        with nothing too (a trial's run ended at once with nothing done, and
        exit 0). A process restarted after the task's first emit is not
        waited for: one with nothing more to emit would cost every run that
        time."""
        return (self._empty_nexts >= 2 and self.pending_roots == 0
                and (self._brought or trio.current_time() - (self._activated_at or 0.0) >= self.start_secs))

    def _past_limit(self, msg_id: Any, emitted: int) -> bool:
        """``--max-tuples`` reached: an emit that is not the replay of a
        failed input is not delivered (nor counted, acked or failed: the
        run ends without it, and a resumed run emits it again). Past the
        limit the spout still gets `next` while failed inputs are owed, and
        a spout that queues its replays behind its fresh inputs (the
        README's sentence spout) emits those first: after a rollback they
        went through to the end of the input. With more failed ids
        outstanding than are tracked, every emit goes through (no replay is
        taken for a fresh input)."""
        rt = self.runtime
        if emitted < rt.max_tuples:  # type: ignore[operator]  (the callers ask only with a limit)
            return False
        awaiting = self._awaiting_replay
        if len(awaiting) >= _MAX_FAIL_IDS or msg_id is not None and id_key(msg_id) in awaiting:
            return False
        self.held_past_limit += 1
        if self.held_past_limit == 1:
            log.info("%s: --max-tuples reached; what it emits from now on other than replays of failed inputs is "
                     "not delivered", self.where())
        return True

    async def _handle(self, proc: ShellProcess, events: list[Any]) -> None:
        rt = self.runtime
        touched: set[Task] = set()
        replies: list[bytes] = []
        for ev in events:
            t = type(ev)
            if t is Emit:
                if rt.max_tuples is not None and self._past_limit(ev.id, rt.fresh_by_spouts):
                    if ev.wants_task_ids and (reply := proc.task_ids_reply([])):
                        replies.append(reply)
                    continue
                ids = rt.route(self, ev, None, touched)  # (a replay it forgets as failed: took_replays)
                if ev.wants_task_ids and (reply := proc.task_ids_reply(ids)):
                    replies.append(reply)  # §4.3: answered before the spout's next frame is read
            elif t is Batch:  # §9.5: a spout's emits carry message ids; routed as one burst where they can be
                emits = ev.emits
                if rt.max_tuples is not None:
                    fresh, kept, awaiting = rt.fresh_by_spouts, [], self._awaiting_replay
                    for e in emits:
                        if not self._past_limit(e[1], fresh):
                            kept.append(e)
                            # (as routing it counts it: a replay of a failed input not)
                            fresh += not (awaiting and e[1] is not None and id_key(e[1]) in awaiting)
                    if not kept:
                        continue
                    emits = kept
                now = trio.current_time()
                if all(e[2] == DEFAULT_STREAM and e[1] is not None for e in emits):
                    rt.route_spout_burst(self, [e[0] for e in emits], [e[1] for e in emits], touched, now)
                else:
                    for values, msg_id, stream in emits:
                        rt.route_plain(self, values, stream, None, touched, msg_id, now)
            else:
                self._common(ev, proc)
        if replies:
            await proc.write(b"".join(replies))
        # The driver counts the syncs after this returns: what the commands
        # brought is handed on first (a drain that sees no notice left ends the run).
        await self._after_batch(touched)


class PythonSpoutTask(SpoutTask):
    """An in-process spout (``PythonSpout``): reliable, replays failures.

    An open-ended source (``multilang pipe``'s stdin, the asyncio feed) is an
    iterator whose ``StopIteration`` means "nothing now": while its ``open``
    attribute is true the run does not count the spout as finished, and the
    source calls :meth:`resume` when it has more. Such a source may also
    offer ``take(n)``: up to ``n`` value lists in order, fewer meaning
    "that is all for now", each a list the spout may keep (a burst in one
    call instead of a ``next`` per item; ``multilang pipe``'s stdin feed).
    Any source may offer Storm's ``ack(msg_ids)`` and ``fail(msg_id)``: told
    the message ids (item numbers from 0, in the order the source gave the
    items) whose trees completed, or that failed (to be replayed, or given
    up on as a dead letter)."""

    def __init__(self, runtime: RuntimeSeam, comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        impl = comp.impl
        assert isinstance(impl, PythonSpout)
        src = impl.source
        for_task = getattr(src, "for_task", None)
        if for_task is not None:  # this task's own items, by its index in the component (PythonSpout)
            src = for_task(self.index)
        elif callable(src):
            src = src()
        self._items = iter(src)
        self._take = getattr(self._items, "take", None) if getattr(self._items, "open", None) is not None else None
        self._on_ack = getattr(self._items, "ack", None)
        self._on_fail = getattr(self._items, "fail", None)
        self._values: dict[int, list[Any]] = {}
        self._replay: deque[int] = deque()
        self._seq = 0
        self._exhausted = False
        #: msg id -> times failed so far; an input failed more than
        #: multilang.max.replays times is a dead letter, not replayed again
        self._fails: dict[int, int] = {}
        self._crashes: dict[int, int] = {}  # msg id -> times its tuple was alone in a process that died
        self._replaying: set[int] = set()  # the replays of the burst being routed (took_replays)

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        self.notices.append((kind, msg_id, cause))
        self.kick()

    @property
    def read_once(self) -> bool:
        """Its source is open-ended (``multilang pipe``'s stdin, the asyncio
        feed): what it gave cannot be had again, by a replay after the run
        or by a resumed run."""
        return getattr(self._items, "open", None) is not None

    def give_up_inputs(self, cause: str) -> None:
        """The run gave up (a component past its restart budget) with this
        read-once spout's inputs not done: each one it gave and was not told
        is done (in flight, failed and waiting for its replay, or its
        failure not heard yet), and each its source has read and not given
        yet, is a dead letter with ``cause`` now, instead of being lost
        without a word. Done here, not by the task's loop: that may be
        waiting for room in the inbox of the bolt that gave up."""
        rt = self.runtime
        last_try = {m: c for kind, m, c in self.notices if kind == "fail" and c and c != cause}  # (moot now)
        self.notices.clear()
        waiting = set(self._replay)
        self._replay.clear()
        for msg_id in sorted(self._values):
            why = f"{cause} (its last try: {last_try[msg_id]})" if msg_id in last_try else cause
            if self._on_fail is not None:
                self._on_fail(msg_id)
            attempts = self._fails.pop(msg_id, 0) + (msg_id not in waiting)
            rt.dead_letter(self, msg_id, self._values.pop(msg_id), why, attempts)
        self._crashes.clear()
        got = self._take(1 << 30) if self._take is not None else []
        for values in got:  # (numbered as the source numbers them: multilang pipe's stdin line)
            rt.dead_letter(self, self._seq, values, cause, 0)
            self._seq += 1
        self._exhausted = True

    def took_replays(self, msg_ids: list[Any]) -> int:
        replaying = self._replaying
        if not replaying:
            return 0
        n = len(replaying.intersection(msg_ids))
        replaying.difference_update(msg_ids)
        return n

    def acked(self, msg_ids: list[Any]) -> None:
        # Done with these inputs at once: an ack needs no decision, so it
        # does not wait in the notices (a fail for the same id cannot be
        # queued: an input has one tree at a time, and its replay waits for
        # the fail to be handled).
        pop = self._values.pop
        for msg_id in msg_ids:
            pop(msg_id, None)
        if self._on_ack is not None:
            self._on_ack(msg_ids)
        for d in (self._fails, self._crashes):
            if d:
                for msg_id in msg_ids:
                    d.pop(msg_id, None)
        self.kick()

    def finished(self, limit_reached: bool) -> bool:
        return not self._replay and super().finished(limit_reached)

    def at_rest(self) -> str | None:
        if self.notices or self._replay or not self._exhausted:
            return None
        return "dry" if getattr(self._items, "open", False) else "done"

    def remaining(self) -> int | None:
        """Inputs still to emit (replays included) if the source can say
        (a list, a range: ``len``-like), else None (a generator, an open feed)."""
        if getattr(self._items, "open", False):
            return None
        if self._exhausted:
            return len(self._replay)
        hint = operator.length_hint(self._items, -1)
        return None if hint < 0 else hint + len(self._replay)

    def resume(self) -> None:
        """The source ran dry (``StopIteration``) but may have more now: ask
        it again. For open-ended sources such as the asyncio feed."""
        self._exhausted = False
        self.kick()

    async def run(self) -> None:
        rt = self.runtime
        while True:
            while self.notices:
                kind, msg_id, cause = self.notices.popleft()
                if kind == "ack":
                    self._values.pop(msg_id, None)
                    self._fails.pop(msg_id, None)
                    self._crashes.pop(msg_id, None)
                    if self._on_ack is not None:
                        self._on_ack([msg_id])
                elif msg_id in self._values:
                    if self._on_fail is not None:
                        self._on_fail(msg_id)
                    if not getattr(cause, "blamed", True):  # §8.4: it only shared a crashed process
                        self._replay.append(msg_id)
                        continue
                    fails = self._fails.get(msg_id, 0) + 1
                    if getattr(cause, "crashed_alone", False):
                        crashes = self._crashes[msg_id] = self._crashes.get(msg_id, 0) + 1
                    else:
                        crashes = 0
                    if fails > self.max_replays or crashes >= _CRASHES_ALONE or getattr(cause, "final", False):
                        self._crashes.pop(msg_id, None)
                        self._fails.pop(msg_id, None)
                        rt.dead_letter(self, msg_id, self._values.pop(msg_id), cause, fails)
                    else:
                        self._fails[msg_id] = fails
                        self._replay.append(msg_id)
            if rt.spouts_stopped or not rt.may_emit(self, replay=bool(self._replay)) or (
                    self._exhausted and not self._replay):
                self.idle = (self._exhausted and not self._replay and self.pending_roots == 0
                             and not getattr(self._items, "open", False))
                await self.rest()
                continue
            self.idle = False
            touched: set[Task] = set()
            # A burst of at most 64 emits, within max spout pending; replays
            # first, and they may go past max_tuples (the limit counts the
            # fresh inputs; a failed tree of those is still replayed).
            room = 64
            if rt.max_spout_pending is not None:
                room = min(room, rt.max_spout_pending - self.pending_roots)
            ids: list[int] = []
            replay = self._replay
            while replay and len(ids) < room:
                ids.append(replay.popleft())
            self._replaying.update(ids)
            fresh = room - len(ids)
            if rt.max_tuples is not None:
                fresh = min(fresh, rt.max_tuples - rt.fresh_by_spouts)
            items, values_of = self._items, self._values
            if self._take is not None:  # the burst in one call; fewer than asked: nothing more now
                got = self._take(fresh) if fresh > 0 else []
            else:
                got = []
                for _ in range(fresh):
                    try:
                        got.append(list(next(items)))
                    except StopIteration:
                        break
            if len(got) < fresh:
                self._exhausted = True
                self.dry_since = trio.current_time()
            seq = self._seq
            for values in got:
                why = cannot_cross(values) if rt.placement is not None else None
                if why is not None:  # (host workers: it may go to another; given up on, as its repr)
                    rt.dead_letter(self, seq, [short_repr(values)], f"{self.where()}: {why}", 0)
                else:
                    values_of[seq] = values
                    ids.append(seq)
                seq += 1
            self._seq = seq
            if ids:
                rt.route_spout_burst(self, [values_of[i] for i in ids], ids, touched, trio.current_time())
            rt.settle()
            for t in touched:
                await t.wait_for_space()
            await trio.lowlevel.checkpoint()
