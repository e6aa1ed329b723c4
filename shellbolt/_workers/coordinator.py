"""The main process of a run with host workers (``topology.workers`` > 1):
starts the workers, keeps the topology's output view from what they send,
decides when the run is done (every worker idle and every batch sent
between them received, twice in a row), says stop, and merges their
results into one :class:`RunResult`. A worker that dies is started again;
the trees it held time out and are replayed (at least once)."""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import pickle
import shutil
import signal
import sys
import types
from collections.abc import Iterator
from typing import Any, Callable

import trio

from .._host import scratch
from .._host.pids import signal_group
from .._model.results import COUNTERS, DEAD_LETTER_SAMPLE, DeadLetter, RunResult
from multilang.errors import MultilangError, TopologyError

from .._model.topology import PythonSpout, Topology
from .._observe.observe import merge_extensions
from .._runtime.checkpoint import rolled_back_to
from .._runtime.replay_watch import ReplayWatch
from .._runtime.tasks import PlainComponentError
from .forkserver import LOST, ForkedProcess, ForkServer
from .link import socket_path
from .view import gone, merge, next_due
from .wire import Frames, encode
from .worker import placement

__all__ = ["run_workers", "WorkersControl", "max_tuples_shares", "workers_for"]

log = logging.getLogger("multilang.shellbolt")

#: a worker that dies this many times in a row having got nothing done (_futile) ends the run
_DEATHS = 3
_RESTARTS = COUNTERS.index("restarts")
_UP_SECS = 2.0
#: a message a worker does not take in this long: the worker is hung, and its connection is closed
_SEND_SECS = 10.0
_POLL = 0.025  # (half the period of the status poll: the end of a run, and the interval)
#: how long the workers get to send what they have on a second signal (WorkersControl.abort)
_ABORT_SECS = 10.0
#: a worker silent this long once a second signal said to stop at once is killed then (it is hung: a healthy
#: one answers within milliseconds), not at _ABORT_SECS
_ABORT_SILENCE = 2.0


class WorkersControl:
    """What the owner of the signals holds of a run on workers, as of a
    :class:`Runtime`: :meth:`request_stop` (the workers drain their trees
    and the last checkpoint is taken, within the shutdown grace) and
    :meth:`abort` (a second signal: at once)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.aborted = False

    def request_stop(self, reason: str = "request") -> None:
        if self.reason is None:
            self.reason = reason

    def abort(self) -> bool:
        """Stop at once, as one engine does on a second signal: every worker
        closes its processes without their grace periods and sends what it
        has (its counters, its part of the output view), which the run
        returns, within _ABORT_SECS (then the workers are killed). True:
        the run stops by itself, the caller need not cancel it."""
        self.request_stop("signal")
        self.aborted = True
        return True


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: trio.Process | ForkedProcess | None = None
        self.conn: trio.SocketStream | None = None
        self.status: dict[str, Any] | None = None
        self.part: dict[str, Any] | None = None  # its part of the last snapshot it sent
        self.read_all = trio.Event()  # its process's connection read to its end
        self.result: dict[str, Any] | None = None
        self.restarts = 0
        self.completed = 0  # the trees of its spouts that completed, as of its process's last status
        #: the trees its dead processes' spouts completed: with --max-tuples the next process may emit the
        #: rest (a tree of theirs that did not complete was failed, and its spout replays it)
        self.completed_before = 0
        self.failed = 0  # the trees of its spouts that failed, as of its process's last status
        self.failed_before = 0  # ... and of its dead processes'
        self.pending = 0  # the trees of its spouts in flight, as of its process's last status
        self.start_cpu = 0.0  # the CPU its process had used when it said hello (its interpreter and imports)
        self.deaths = 0  # deaths in a row that got nothing done (a crash loop)
        self.committed_at_hello = 0  # the run's checkpoints committed when its process said hello
        self.hello_at = 0.0  # when its process said hello
        #: when it was first asked for a status it has not answered (supervisor.worker.timeout.secs counts
        #: from then: a wait of this process's own is no silence of the worker's)
        self.asked_at: float | None = None
        self.resets: set[int] = set()  # the workers whose loss it has taken in (peer_lost answered)
        self.lock = trio.Lock()  # one sender at a time on its connection
        self.counters: dict[int, list[int]] = {}  # task id -> its COUNTERS, as of its process's last status
        self.extensions: dict[int, list[str] | None] = {}  # shell task id -> what its process negotiated, as of then
        self.stateful: set[str] = set()  # the components its processes ran as stateful bolts (§9.7), as of then
        self.carried: dict[int, list[int]] = {}  # task id -> the COUNTERS of its dead processes, summed
        self.processes: dict[int, str] = {}  # its component processes (pid -> start time), as of its last status

    def carry(self, tasks: list[int], restarted: bool = True) -> None:
        """Its process died: what its tasks did and its spouts' trees that
        failed, as of its last status, are kept for the run's counters, and
        each task counts a restart if the worker starts again (the processes
        of its components start again with its next process)."""
        zeros = [0] * len(COUNTERS)
        for t in tasks:
            kept = self.carried.setdefault(t, zeros.copy())
            for i, n in enumerate(self.counters.get(t, zeros)):
                kept[i] += n
            kept[_RESTARTS] += restarted
        self.counters = {}
        self.failed_before += self.failed
        self.failed = 0

    def ending(self) -> bool:
        """Its process runs, or ended with what it sent not read yet (its
        result, sent just before it ended: the run's last frame is built
        from it)."""
        if self.result is not None or self.proc is None:
            return False
        return self.proc.returncode is None or self.conn is not None and not self.read_all.is_set()

    async def ask_status(self, snapshot: bool) -> None:
        """Ask for its status (with its part of the run's snapshot if ``snapshot``)."""
        if self.asked_at is None:
            self.asked_at = trio.current_time()
        await self.send(("status", snapshot))

    async def send(self, msg: Any) -> bool:
        """Send a message; False if its connection is gone (it died: watch() sees it).
        Not cancelled half-way (a stop at --duration): a frame cut short
        would garble the stream, and a checkpoint's message would reach
        some workers and not others."""
        conn = self.conn
        if conn is None:
            return False
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _SEND_SECS) as scope:
            async with self.lock:
                try:
                    await conn.send_all(encode(msg))
                    return True
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return False
        if scope.cancelled_caught:  # it reads nothing (hung): its connection closes, and so it stops
            conn.socket.close()
        return False


def _keep_latest(view: dict[Any, tuple[int, Any]], items: Any) -> None:
    """Into ``view`` (key -> (stamp, record)), each of ``items`` (key,
    (stamp, record)) that came no earlier than the record it has of the key:
    a key's records may come from tasks of several workers, each stamped with
    the system's monotonic clock as it came (Runtime.output_stamps)."""
    for key, entry in items:
        if entry[0] >= view.get(key, (-1,))[0]:
            view[key] = entry


async def run_workers(topology: Topology, workers: int, *, on_output: Callable[[dict[str, Any]], None] | None = None,
                      duration: float | None = None, until_done: bool = True,
                      control: WorkersControl | None = None,
                      on_snapshot: Callable[[dict[str, Any], bool], None] | None = None,
                      snapshot_every: float = 2.0,
                      on_dead_letter: Callable[[DeadLetter], None] | None = None,
                      recorder: Any = None, max_tuples: int | None = None, log_level: str | None = None,
                      fork_server: ForkServer | None = None) -> RunResult:
    """Run ``topology`` on ``workers`` host worker processes (docs/WORKERS.md).
    ``on_snapshot(snapshot, last)``: called with the run's snapshot (the live
    view's, the metrics'; view.py) every ``snapshot_every`` seconds from the
    start, as the embedded engine calls its progress reporter, and once at
    the end with ``last`` true; also once at the start, before any worker
    runs, with every counter zero and ``last`` false (a metrics endpoint has
    a snapshot from the start; a live view need not show it).
    ``on_dead_letter``: called with each input a spout's worker gave up on
    (``Runtime.on_dead_letter``'s, sent on by the worker). ``recorder``:
    ``--record``'s :class:`Recorder`; each worker records its own tasks in its
    directory, and they are added to its :meth:`~Recorder.task_ids`.
    ``max_tuples``: as ``Runtime.run``'s, each worker's spouts stopping at
    their share (:func:`max_tuples_shares`), and what dry spouts leave of
    theirs going on to the others. ``log_level``:
    the workers log at it as :func:`setup_logging` does (the caller's own
    setup; None: they leave logging as Python leaves it). ``fork_server``:
    the workers' processes are forked from it (:class:`ForkServer`, started
    before ``trio.run``); without one, each is a new interpreter."""
    # The run's own conf (_Checkpoints writes a temporary store's folder into it, for the workers): the
    # caller's topology is left as it was, and a second run of it does not resume from this one's store.
    if fork_server is not None:
        fork_server.check()
    topology = dataclasses.replace(topology, conf=dict(topology.conf))
    control = control or WorkersControl()
    until_done = until_done or max_tuples is not None  # (as Runtime.run: the trees of the limit are waited for)
    used = workers_for(topology, workers)
    if used < workers:
        log.warning("%d host workers for %d task(s): %d run, one per task", workers, used, used)
        workers = used
    _refuse_shared_iterators(topology, workers)
    shares = max_tuples_shares(topology, workers, max_tuples) if max_tuples is not None else {}
    began = trio.current_time()
    if on_snapshot is not None:  # (before anything waits: a metrics endpoint has a snapshot from the start)
        on_snapshot(merge(topology, [], 0.0), False)
    from .._runtime.runtime import Runtime

    view = Runtime(topology, on_output=on_output, checkpointing=False)  # the output view and the summary's shape
    live_view: dict[Any, tuple[int, dict[str, Any]]] = {}  # key -> (stamp, record): the workers' views without state
    try:
        ck = _Checkpoints(topology, view)  # the one writer of the state store; its folder goes to the workers
    except TopologyError as exc:  # (a named state store refused)
        raise topology.named(exc) from None
    try:
        # (with the store's folder in its conf)
        shipped = _shipped(topology, {"record": recorder.path if recorder is not None else None,
                                      "log_level": log_level})
        # 0700: only this user's processes connect; short enough a path for the sockets "wmain", "w0" ...
        directory = scratch.make("multilang-workers-",
                                 max(len(socket_path("", "main")), len(socket_path("", workers - 1))))
    except MultilangError:
        ck.close()
        raise
    with open(os.path.join(directory, "topology.pickle"), "wb") as f:
        f.write(shipped)
    ws = [_Worker(i) for i in range(workers)]
    where = placement(topology, workers)
    failures: list[str] = []  # why the run gave up, of the workers themselves
    dead_sample: list[DeadLetter] = []  # the first dead letters, for the summary
    #: what every worker is told once the run stops ("stop", then "finish"), said again to one that says
    #: hello after it (a stop during the workers' start-up: it would emit through the grace, and never end)
    said: list[Any] = []
    #: the component processes of the workers that died (pid -> start time): ended by end_orphans, or at the end
    orphans: list[dict[int, str]] = []
    stopped_by = "done"
    try:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(socket_path(directory, "main"))
        sock.listen(workers * 2)
        listener = trio.SocketListener(sock)
        async with trio.open_nursery() as nursery:

            async def start(w: _Worker) -> None:
                # (the trees its dead processes' spouts completed count towards its share)
                limit = [str(max(0, shares[w.index] - w.completed_before))] if w.index in shares else []
                w.read_all = trio.Event()
                args = [directory, str(w.index), str(workers), *limit]
                w.proc = await fork_server.spawn(args) if fork_server is not None else None
                if w.proc is None:
                    if fork_server is not None:
                        log.warning("host worker %d starts as a new interpreter: %s", w.index, fork_server.why)
                    w.proc = await trio.lowlevel.open_process(
                        [sys.executable, "-m", "multilang.shellbolt._workers.worker", *args], start_new_session=True)

            async def serve(conn: trio.SocketStream) -> None:
                try:
                    await _serve(conn)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # a worker died: watch() sees it
                finally:
                    for w in ws:
                        if w.conn is conn:
                            w.read_all.set()

            async def _serve(conn: trio.SocketStream) -> None:
                frames = Frames()
                w: _Worker | None = None
                async for data in conn:
                    if w is not None and w.conn is conn:
                        w.asked_at = None  # (it answers: not hung)
                    for msg in frames.feed(data):
                        kind = msg[0]
                        if kind == "hello":
                            w = ws[msg[1]]
                            w.conn, w.start_cpu, w.hello_at = conn, msg[3], trio.current_time()
                            w.asked_at = None
                            w.committed_at_hello = ck.committed
                            await w.send(("epoch", ck.epoch, ck.store.txid or 0))
                            for m in list(said):
                                await w.send(m)
                            if w.restarts:  # back: the others may send to it again
                                await broadcast(("peer_up", w.index), but=w)
                        elif kind == "out":
                            if on_output is not None:
                                for record in msg[1]:
                                    on_output(record)
                        elif kind == "view":  # (a keyed view without state, as it changes: a worker may die)
                            _keep_latest(live_view, msg[1].items())
                        elif kind == "dead":
                            if len(dead_sample) < DEAD_LETTER_SAMPLE:
                                dead_sample.append(msg[1])
                            if on_dead_letter is not None:
                                on_dead_letter(msg[1])
                        elif kind == "status":
                            if w is not None and w.conn is conn:  # (not a dead process's, read late)
                                w.status = msg[2]
                                w.part = msg[2].get("part", w.part)
                                w.completed, w.failed, w.counters = (msg[2]["completed"], msg[2]["failed"],
                                                                     msg[2]["counters"])
                                w.extensions = msg[2]["extensions"]
                                w.stateful.update(msg[2].get("stateful", ()))
                                w.pending = msg[2]["pending"]
                                w.processes = msg[2]["processes"]
                        elif kind == "cp_flags":
                            ck.flags[msg[1]] = msg[2]
                            await ck.step(broadcast, workers, rollback)
                        elif kind == "result":
                            ws[msg[1]].result = msg[2]
                        elif kind == "reset":
                            ws[msg[1]].resets.add(msg[2])
                        elif kind == "prepared":
                            if ck.state == "preparing" and msg[2] == ck.txid:  # (not a late answer of another)
                                ck.prepared[msg[1]] = msg[3]
                                await ck.step(broadcast, workers, rollback)
                        elif kind == "cut":
                            if msg[2] == ck.epoch:
                                ck.cuts[msg[1]] = msg[3]
                                await ck.step(broadcast, workers, rollback)
                        elif kind == "rollback":
                            if msg[1] == ck.epoch:  # (asked for once per epoch, by whoever saw it first)
                                await rollback(msg[2])

            async def accept() -> None:
                while True:
                    conn = await listener.accept()
                    nursery.start_soon(serve, conn)

            async def broadcast(msg: Any, but: _Worker | None = None) -> list[_Worker]:
                return [o for o in ws if o is not but and await o.send(msg)]

            async def rollback(cause: str) -> None:
                ck.rollbacks_asked += 1  # (at once: a death's watcher sees it while this waits for the lock)
                epoch = ck.epoch
                async with ck.lock:  # not between a checkpoint's write and its commit going out
                    if ck.epoch != epoch:  # one asked for beside it went out first, since this was: it covers this
                        return
                    ck.epoch += 1
                    ck.rollbacks += 1
                    ck.state = "idle"
                    await broadcast(("rollback", cause, ck.epoch))
                    if any(w.stateful for w in ws) or ck.store.txid is not None:  # (once: the workers are quiet)
                        log.warning("state rolled back to %s on every host worker: %s", rolled_back_to(ck.store.txid),
                                    cause)
                    else:  # (a topology without stateful bolts: a trial's warning spoke of state it does not have)
                        log.warning("the trees in flight failed on every host worker (their spouts replay them): %s",
                                    cause)

            async def end_orphans(w: _Worker, processes: dict[int, str]) -> None:
                """A worker died: its component processes (§5.4's end, their
                stdin closed by its death) get the kill grace, then SIGTERM, the
                grace again, then SIGKILL, each to its process group. One hung
                or stopped reads no end of its input, and outlived the run (a
                trial)."""
                grace = float(topology.conf.get("multilang.kill.grace.secs") or 0)
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    await trio.sleep(grace)
                    hit = [pid for pid, started in processes.items() if signal_group(pid, started, sig)]
                    if hit:
                        log.warning("host worker %d died: %d of its component processes (pid %s) still ran %s: %s",
                                    w.index, len(hit), ", ".join(map(str, hit)),
                                    f"{grace:g}s after" if sig == signal.SIGTERM else "after SIGTERM",
                                    signal.Signals(sig).name)

            async def watch(w: _Worker) -> None:
                while True:
                    assert w.proc is not None
                    code = await w.proc.wait()
                    if w.conn is not None:  # what it sent before it ended is read first: its result, if it sent one
                        with trio.move_on_after(_SEND_SECS):
                            await w.read_all.wait()
                    if w.result is not None:
                        return
                    orphans.append(w.processes)
                    nursery.start_soon(end_orphans, w, w.processes)
                    w.processes = {}
                    tasks = [t for t, at in where.items() if at == w.index]
                    if stopping.is_set():  # not started again: what it did counts, its trees in flight stay pending
                        log.warning("host worker %d (pid %d) died (%s) while the run stopped: not started again; "
                                    "the trees in flight on it are not completed", w.index, w.proc.pid, _how(code))
                        w.conn, w.status = None, None  # (nothing waits for its answers)
                        w.carry(tasks, restarted=False)
                        w.completed_before += w.completed
                        w.completed = 0
                        return
                    # Killed: the others stop sending to it and fail their trees (replayed, at least once),
                    # then it starts again and they may send to it once it is back (peer_up).
                    # Some deaths in a row that got nothing done are a crash loop: say so, not loop.
                    futile = _futile(w.conn is not None, trio.current_time() - w.hello_at, ck.committed,
                                     w.committed_at_hello)
                    w.deaths = w.deaths + 1 if futile else 0
                    w.restarts += 1
                    w.conn, w.status, w.pending = None, None, 0  # (its trees are failed: peer_lost)
                    w.carry(tasks)
                    if w.deaths >= _DEATHS:
                        failures.append(f"host worker {w.index} died {w.deaths} times in a row having got nothing "
                                        f"done (the last time: pid {w.proc.pid}, {_how(code)}); its error, if it "
                                        "printed one, is above")
                        return
                    cause = f"host worker {w.index} (pid {w.proc.pid}) died ({_how(code)}); restarted"
                    log.warning("%s; every tree in flight is failed and replayed", cause)
                    told, asked = await _lost(ck, w, cause, broadcast)
                    with trio.move_on_after(10):
                        while not all(w.index in o.resets or o.conn is None for o in told):
                            await trio.sleep(0.01)
                    for o in told:
                        o.resets.discard(w.index)
                    # Its stateful tasks' changes since the last checkpoint are gone: every worker rolls back,
                    # unless one asked for it since peer_lost went out (a tree it failed for it had touched a
                    # stateful task): that rollback reaches every worker after peer_lost, and covers this.
                    if ck.rollbacks_asked == asked:
                        await rollback(cause)
                    await start(w)

            stopping = trio.Event()
            nursery.start_soon(accept)
            if fork_server is not None:
                await nursery.start(fork_server.serve)
            for w in ws:
                await start(w)
                nursery.start_soon(watch, w)
            # The first as soon as every worker answers (a scrape had zeros until the first interval: 2 s, a trial),
            # then on the interval's grid from the start.
            next_snapshot = began

            silent_secs = float(topology.conf.get("supervisor.worker.timeout.secs") or 30)

            def kill_the_silent(ending: bool = False) -> None:
                """Storm's supervisor: a worker that has said nothing for
                supervisor.worker.timeout.secs since it was asked for its status
                (hung, stopped) is killed; watch() starts it again, as after a
                kill -9 (or not, once the run stops). ``ending``: the workers
                were told to end, and a healthy one answers at once while it
                closes its processes: silent for _ABORT_SECS, it is killed (a
                trial's first signal waited 30 s for a stopped worker), or for
                _ABORT_SILENCE once a second signal said to stop at once."""
                now = trio.current_time()
                limit, why = silent_secs, f"past supervisor.worker.timeout.secs ({silent_secs:g}s)"
                if ending and control.aborted and _ABORT_SILENCE < limit:
                    limit, why = _ABORT_SILENCE, f"past the {_ABORT_SILENCE:g}s allowed as the run stops at once"
                elif ending and _ABORT_SECS < limit:
                    limit, why = _ABORT_SECS, f"past the {_ABORT_SECS:g}s allowed while the run ends"
                for w in ws:
                    if (w.conn is not None and w.result is None and w.proc is not None and w.proc.returncode is None
                            and w.asked_at is not None and now - w.asked_at > limit):
                        log.warning("host worker %d (pid %d) has said nothing for %.1fs, %s: killed", w.index,
                                    w.proc.pid, now - w.asked_at, why)
                        w.asked_at = None  # (said and done once: watch() sees the death)
                        w.proc.kill()

            async def poll() -> list[dict[str, Any] | None]:
                """Every worker's status (None: no answer in time); with the
                parts of the run's snapshot when one is due (on_snapshot)."""
                nonlocal next_snapshot
                await trio.sleep(_POLL)
                want = on_snapshot is not None and trio.current_time() >= next_snapshot
                for w in ws:
                    w.status = None
                    await w.ask_status(want)
                await trio.sleep(_POLL)
                kill_the_silent()
                st = [w.status for w in ws]
                if want and all(s is not None and "part" in s for s in st):
                    snapshot([s["part"] for s in st], False)  # type: ignore[index]
                    next_snapshot = next_due(next_snapshot, snapshot_every, trio.current_time())
                return st

            def fresh_in_all(st: list[Any]) -> int:
                """The spouts' fresh inputs (what --max-tuples counts) on every
                worker, with those of the workers' earlier processes."""
                return sum(s["fresh"] for s in st) + sum(w.completed_before for w in ws)

            async def share_out(st: list[Any]) -> bool:
                """--max-tuples, every worker quiet: what the workers whose
                spouts ran dry left of their shares goes to those whose spouts
                stopped at theirs with more to emit, as one engine's other
                spout tasks emit what a dry one leaves. The dry ones are capped
                at what they emitted first (a capped worker's status is read
                after it: one socket, in order), so the limits never add up to
                more than ``max_tuples``. Whether a worker was given more."""
                assert max_tuples is not None
                more = [i for i in shares if st[i]["more"]]
                if not more or fresh_in_all(st) >= max_tuples:
                    return False
                for i in shares:
                    if i not in more:
                        await ws[i].send(("cap",))
                st = await poll()
                if any(st[i] is None for i in shares):  # (a worker that did not answer: at the next quiet)
                    return True
                for i in shares:
                    shares[i] = st[i]["limit"] + ws[i].completed_before  # (a worker started again gets it)
                left = max_tuples - sum(shares.values())
                if left <= 0:
                    return False
                for k, i in enumerate(more):
                    shares[i] += left // len(more) + (k < left % len(more))
                    await ws[i].send(("limit", shares[i] - ws[i].completed_before))
                log.debug("--max-tuples: %d that dry spouts left go to host worker(s) %s", left, more)
                return True

            def snapshot(parts: list[dict[str, Any]], last: bool) -> None:
                assert on_snapshot is not None
                on_snapshot(merge(topology, parts, trio.current_time() - began, carried(),
                                  {"completed": sum(w.completed_before for w in ws),
                                   "failed": sum(w.failed_before for w in ws)}), last)

            def carried() -> dict[int, list[int]]:
                return {t: c for w in ws for t, c in w.carried.items()}

            fresh = [0]  # the spouts' fresh inputs when the workers were last quiet (until_quiet's "done")

            async def until_quiet(stopping_run: bool) -> str:
                """Poll the workers; step the checkpoints. Return why the run
                stops: "done" once every worker is drained and idle and every
                batch sent between them was received, twice in a row, with the
                last checkpoint taken; or earlier, a stop asked for, or a worker
                whose run ended on its own. ``stopping_run``: the spouts are
                stopped and the trees drain; each checkpoint is taken at once."""
                seen: tuple[Any, ...] | None = None
                watch: ReplayWatch | None = None  # (a run to its end that only replays its poison stops)
                while True:
                    st = await poll()
                    if control.aborted:
                        return "signal"
                    ended = [w for w in ws if w.result is not None or stopping_run and w.proc is not None
                             and w.proc.returncode is not None]
                    if ended:  # a component gave up (or, stopping, a worker died): nothing more can commit
                        return (ended[0].result or {}).get("stopped_by", "gave_up")
                    if control.reason is not None and not stopping_run:
                        return control.reason
                    if failures:
                        return "gave_up"
                    if any(s is None for s in st):
                        continue
                    if until_done and not stopping_run:
                        now, done, failed = (trio.current_time(), sum(s["completed"] for s in st),  # type: ignore[index]
                                             sum(s["failed"] for s in st))  # type: ignore[index]
                        if watch is None:
                            watch = ReplayWatch(topology, view.acker.timeout, now, done, failed)
                        elif watch.check(now, done, failed, (lambda: [r for s in st for r in s["forever"]])  # type: ignore[index]
                                         if max_tuples is None else list):
                            return "replays"
                        pending = sum(s["pending"] for s in st)  # type: ignore[index]
                        if max_tuples is not None and watch.past_limit(now, fresh_in_all(st), max_tuples, failed, pending):
                            return "max_tuples"
                    if stopping_run:
                        ck.last = -math.inf
                    with trio.CancelScope(shield=True):  # (a phase goes to every worker or to none)
                        await ck.step(broadcast, workers, rollback)
                    if not (until_done or stopping_run) or ck.state != "idle":
                        continue
                    now = tuple((tuple(s["sent"].items()), tuple(s["received"].items()),  # type: ignore[index]
                                 s["emitted"]) for s in st)  # type: ignore[index]
                    quiet = all(s["done"] for s in st) and all(  # type: ignore[index]
                        st[a]["sent"][b] == st[b]["received"][a]  # type: ignore[index]
                        for a in range(workers) for b in range(workers) if a != b)
                    if quiet and now == seen:
                        if any(s.get("activity") for s in st):  # what no tree waits for: the last checkpoint
                            ck.last = -math.inf
                            with trio.CancelScope(shield=True):
                                await ck.step(broadcast, workers, rollback)
                            seen = None
                            continue
                        if max_tuples is not None and not stopping_run and await share_out(st):
                            seen = None
                            continue
                        fresh[0] = fresh_in_all(st)
                        return "done"
                    seen = now if quiet else None

            if duration is not None:  # (it counts from when every worker is up, as one engine's from its start)
                while any(w.conn is None for w in ws) and not failures and control.reason is None:
                    await trio.sleep(_POLL)
                log.debug("every host worker is up: --duration's %gs count from now", duration)
            with trio.move_on_after(math.inf if duration is None else duration):
                stopped_by = "duration"
                stopped_by = await until_quiet(False)
            # Stop: the spouts stop and the trees in flight drain, with the checkpoints they wait for, within
            # the shutdown grace; only then does a worker end (one that ended first would drop what the others
            # still send it, and a checkpoint is taken of every worker or of none).
            stopping.set()  # (a worker that dies from now on is not started again)
            # (done with --max-tuples: the spouts stopped at the limit, as the embedded engine says; or done
            # before it, every spout having nothing more)
            reason = ("max_tuples" if stopped_by == "done" and max_tuples is not None and fresh[0] >= max_tuples
                      else stopped_by)
            log.debug("the run stops (%s): every worker's spouts stop, and a worker that dies is not started "
                      "again", reason)
            said.append(("stop", reason))
            for w in ws:
                await w.send(said[-1])
            if stopped_by not in ("done", "gave_up"):  # (a component that gave up stops the run at once, as on one)
                grace = float(topology.conf.get("multilang.shutdown.grace.secs") or 0)
                with trio.move_on_after(grace):
                    await until_quiet(True)
            stopped_by = reason
            said.append(("abort",) if control.aborted else ("finish",))
            for w in ws:
                await w.send(said[-1])
            deadline, asked = math.inf, trio.current_time()
            while any(w.ending() for w in ws):
                if control.aborted and deadline == math.inf:  # what they have, within _ABORT_SECS
                    deadline = trio.current_time() + _ABORT_SECS
                    if said[-1] != ("abort",):  # (a second signal while they finish)
                        said.append(("abort",))
                        for w in ws:
                            await w.send(said[-1])
                if trio.current_time() >= deadline:
                    break
                if trio.current_time() - asked >= 1:  # (a worker that answers is alive: one that does not, hung)
                    asked = trio.current_time()
                    for w in ws:
                        if w.result is None:
                            await w.ask_status(False)
                kill_the_silent(ending=True)
                await trio.sleep(_POLL / 5)
            for w in ws:
                if w.proc is not None:
                    if w.result is None and control.aborted:  # (silent past the abort's deadline)
                        w.proc.kill()
                    await w.proc.wait()
            with trio.move_on_after(_SEND_SECS):  # (watch() carries what one that died without its result did)
                while any(w.result is None and w.conn is not None for w in ws):
                    await trio.sleep(_POLL / 5)
            if on_snapshot is not None:  # the last frame: the run's final counters, stopped at once or not
                # (each worker's part as it ended, from its result; one that died as the run stopped, its last)
                parts = [(w.result or {}).get("part") or (gone(w.part) if w.part is not None else None) for w in ws]
                if all(p is not None for p in parts):
                    snapshot(parts, True)  # type: ignore[arg-type]
            nursery.cancel_scope.cancel()
    finally:
        for w in ws:
            if w.proc is not None and w.proc.returncode is None:
                w.proc.kill()
            if w.result is None:  # (killed now, or dead unwatched as the run ended: what it ran goes too)
                orphans.append(w.processes)
        for processes in orphans:  # (and what the dead workers' left, at once: the run is over)
            for pid, started in processes.items():
                signal_group(pid, started)
        ck.committed_outputs = list(ck.store.outputs().values())
        ck.close()
        shutil.rmtree(directory, ignore_errors=True)
        scratch.sweep()  # (and a dead worker's own folders, pid folders: no finally of its removed them)
    if view._key_index is not None:  # the committed view (a resumed run's earlier part, a dead worker's keys) ...
        for record in ck.committed_outputs:
            view.outputs_by_key[view._view_key(record)] = record
    for w in ws:  # ... what the workers sent as it came, and what each emitted since: a key's latest over them
        r = w.result or {}
        got = r.get("stamps", {})
        _keep_latest(live_view, ((key, (got.get(key, 0), record)) for key, record in r.get("view", {}).items()))
    view.outputs_by_key.update((key, record) for key, (_, record) in live_view.items())
    result = view.result()
    component = {t: c.name for c in topology.components.values() for t in c.tasks}
    for w in ws:
        r = w.result or {}
        for name, tasks in r.get("stats", {}).items():
            result.stats[name].tasks.update(tasks)
        for t, kept in w.carried.items():  # (and what its dead processes' tasks did)
            stats = result.stats[component[t]].task(t)
            for k, n in zip(COUNTERS, kept):
                setattr(stats, k, getattr(stats, k) + n)
        result.completed += r.get("completed", 0) + w.completed_before  # (and its dead processes' spouts')
        result.failed += r.get("failed", 0) + w.failed_before
        result.timed_out += r.get("timed_out", 0)
        result.pending += r["pending"] if w.result else w.pending  # (one dead at the stop: its trees abandoned)
        result.dead_letters += r.get("dead_letters", 0)
        result.gave_up.extend(PlainComponentError(text) for text in r.get("gave_up", []))
    result.gave_up.extend(PlainComponentError(text) for text in failures)
    result.stopped_by = stopped_by
    result.dead_letter_sample = dead_sample
    for w in ws:  # what each component's processes negotiated, from the workers that ran them
        exts_of: dict[str, list[str] | None] = {}  # (one dead at the stop: as its last status says)
        for t, exts in w.extensions.items() if w.result is None else ():
            exts_of[component[t]] = merge_extensions(exts_of.get(component[t]), exts)
        for name, exts in (w.result or {}).get("extensions", exts_of).items():
            result.extensions[name] = merge_extensions(result.extensions.get(name), exts)
    # (a worker killed as the run stopped, every worker included: as its last status says)
    result.stateful = sorted({n for w in ws for n in (*(w.result or {}).get("stateful", ()), *w.stateful)})
    for w in ws:  # what the spouts' workers saw of their replays; the tasks they recorded
        r = w.result or {}
        if recorder is not None:
            recorder.elsewhere.update(r.get("recorded", []))
        result.repeated_failures.extend(r.get("repeated_failures", []))
        result.not_replayed.extend(r.get("not_replayed", []))
        for name, n in r.get("reused_ids", {}).items():
            result.reused_ids[name] = result.reused_ids.get(name, 0) + n
    result.checkpoints, result.rollbacks, result.state_txid = ck.committed, ck.rollbacks, ck.store.txid
    result.state_path = None if ck.temporary else ck.store.path
    #: the workers' own CPU seconds (bench/workers.py)
    result.worker_cpus = [(w.result or {}).get("cpu", 0.0) for w in ws]  # type: ignore[attr-defined]
    result.workers_cpu = sum(result.worker_cpus)  # type: ignore[attr-defined]
    result.workers_start_cpu = sum(w.start_cpu for w in ws if w.result)  # type: ignore[attr-defined]
    result.fork_server_cpu = fork_server.cpu if fork_server is not None else 0.0  # type: ignore[attr-defined]
    return result


def _futile(said_hello: bool, lived: float, committed: int, committed_at_hello: int) -> bool:
    """Whether a worker's process that died got nothing done: it died before
    its hello, or no checkpoint committed while it ran where the run takes
    them (``committed``: the run's so far), or, where it does not (yet), it
    died within _UP_SECS of its hello. A worker killed every second or two
    while checkpoints commit is restarted every time (the time alone called
    such lives futile: a trial's run gave up after three)."""
    if not said_hello:
        return True
    if committed > committed_at_hello:
        return False
    return committed > 0 or lived < _UP_SECS


def workers_for(topology: Topology, workers: int) -> int:
    """The host workers a run of ``topology`` asked for ``workers`` uses: at
    most one per task. Storm's even scheduler gives a slot beyond the
    executors nothing to run, and no worker starts there; here such a worker
    would only cost an interpreter, and slow every other one's start."""
    return max(1, min(workers, sum(len(c.tasks) for c in topology.components.values())))


async def _lost(ck: _Checkpoints, w: _Worker, cause: str, broadcast: Any) -> tuple[list[_Worker], int]:
    """A worker's process died: the checkpoint being taken is abandoned, and
    the others are told (``peer_lost``: each fails every tree it owns that no
    commit covered); the workers told are returned, with the rollbacks
    asked for until then (one asked for after, by a worker as it takes in
    the death, waits for the lock: it reaches every worker after peer_lost).

    ``w.completed_before`` takes in the trees of its spouts that this
    process completed, which a next process's ``--max-tuples`` share leaves
    out. They are counted once
    no commit can go out any more: a commit that held the lock when the
    death was seen covers some of them (its store write was under way), and
    the next process's spout skips those ids as committed; counted before,
    that process would emit as many fresh inputs too many."""
    completed, w.completed = w.completed, 0
    async with ck.lock:  # (a commit that went out reaches the others first)
        ck.abandon()  # (and none goes out after this: it would cover trees the others fail now)
        # (the checkpoints' count is exact, where they hold the acks; a status may be 50 ms old)
        w.completed_before = max(ck.trees.get(w.index, 0), w.completed_before + completed)
        asked = ck.rollbacks_asked
        return await broadcast(("peer_lost", w.index, cause), but=w), asked


def max_tuples_shares(topology: Topology, workers: int, max_tuples: int) -> dict[int, int]:
    """--max-tuples on workers: each worker that runs spout tasks gets a
    share of the limit in proportion to its spout tasks (the first ones one
    more, until the shares add up), and its spouts stop at it, as one
    engine's stop at the limit; worker -> share. What a worker whose spouts
    run dry leaves of its share goes to the others once every worker is
    quiet (``share_out`` in :func:`run_workers`): at most ``max_tuples`` in
    all, and that many unless every spout runs dry."""
    where = placement(topology, workers)
    tasks = [where[t] for c in topology.components.values() if c.kind == "spout" for t in c.tasks]
    per = {w: tasks.count(w) for w in sorted(set(tasks))}
    total = sum(per.values())
    shares = {w: max_tuples * n // total for w, n in per.items()}
    for w in list(shares)[:max_tuples - sum(shares.values())]:
        shares[w] += 1
    return shares


class _Shipping(pickle.Pickler):
    """Pickles what a worker gets. A function or class of the script being
    run (``__main__``) pickles by name, and a worker, itself run as
    ``__main__``, has no such name: refused here, by name, instead of each
    worker dying on it."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            raise pickle.PicklingError(f"{obj.__qualname__} is defined in the script being run (__main__), which "
                                       "a host worker does not run")
        return NotImplemented


def _pickled(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Shipping(buf).dump(obj)
    return buf.getvalue()


def _refuse_shared_iterators(topology: Topology, workers: int) -> None:
    """A TopologyError for a ``PythonSpout`` whose tasks share one iterator
    (each task of one engine takes the next item of it) but would run on
    several workers: each worker gets a copy, and every item would go out
    once per worker."""
    where = placement(topology, workers)
    for comp in topology.components.values():
        src = comp.impl.source if isinstance(comp.impl, PythonSpout) else None
        if src is None or getattr(src, "for_task", None) is not None or callable(src) or not isinstance(src, Iterator):
            continue
        spread = len({where[t] for t in comp.tasks})
        if spread > 1:
            raise topology.named(TopologyError(
                f"spout {comp.name!r} reads one iterator ({type(src).__name__}) that its {len(comp.tasks)} tasks "
                f"share, and they would run on {spread} host workers, each with a copy of it: every item would go "
                "out once per worker. Give a list (each task emits all of it), a function that makes each task its "
                "items, or an object with for_task(index); or run it with parallelism 1, or in one process"))


def _shipped(topology: Topology, run_args: dict[str, Any]) -> bytes:
    """What the workers get: this process's ``sys.path`` (the workers
    import an in-process component's module as this process did, the
    script's folder first), then the topology (pickled); or a TopologyError
    naming the in-process component that cannot be given to another process
    (a lambda, a function defined inside another one or in the script being
    run)."""
    try:
        return pickle.dumps(list(sys.path)) + _pickled((topology, run_args))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        for comp in topology.components.values():
            try:
                _pickled(comp.impl)
            except (pickle.PicklingError, AttributeError, TypeError) as why:
                where = f"{topology.source}: " if topology.source else ""
                raise TopologyError(
                    f"{where}{comp.kind} {comp.name!r} runs in the host's own process "
                    f"({type(comp.impl).__name__}), and a host worker cannot be given it ({why}); run this topology "
                    "in one process (the embedded engine: multilang run without --workers, or Runtime), or make it "
                    "a shell component, or a class or function of a module the workers can import") from None
        raise TopologyError(f"the topology cannot be given to a host worker: {exc}") from None


def _how(code: int) -> str:
    if code == LOST:
        return "its exit status not reported by its fork server"
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class _Checkpoints:
    """The main process's side of checkpoints across workers (docs/WORKERS.md):
    the state store's one writer, and the phases, advanced as the workers'
    statuses come in: pause, cut, prepare, write, commit."""

    def __init__(self, topology: Topology, view: Any) -> None:
        from .._runtime.state_store import SqliteStore, provider_config

        conf = topology.conf
        provider = str(conf.get("topology.state.provider") or "sqlite")
        if provider != "sqlite":
            raise TopologyError(f"topology.state.provider {provider!r} with host workers: only sqlite, for now")
        pconf = provider_config(conf)
        self.temporary = not pconf.get("dir")
        if self.temporary:
            pconf["dir"] = scratch.make("multilang-state-")
        conf["topology.state.provider.config"] = pconf  # (pickled for the workers after this)
        name = topology.name or "topology"
        self.store = SqliteStore(pconf["dir"], name, shared=True)
        self.store.check(name, {c.name: len(c.tasks) for c in topology.components.values()})
        self.dir = pconf["dir"]
        self.interval = float(conf.get("topology.state.checkpoint.interval.ms") or 1000) / 1000
        self.epoch = 0
        self.state = "idle"
        self.last = trio.current_time()
        self.txid = self.store.txid or 0
        self.prepared: dict[int, Any] = {}  # worker -> its answer to the prepare of txid (None: it could not)
        #: the workers that reached the cut of the checkpoint being taken -> what each had sent each peer then
        self.cuts: dict[int, dict[int, int]] = {}
        #: worker -> (its spouts quiet long enough for a checkpoint ahead of the interval, something waits
        #: for a checkpoint, its committed txid, its epoch): WorkerCheckpointer.run
        self.flags: dict[int, tuple[bool, bool, int, int]] = {}
        self.committed_outputs: list[dict[str, Any]] = []
        self.lock = trio.Lock()
        self.committed = self.rollbacks = 0
        self.rollbacks_asked = 0  # run_workers' rollback() calls, counted before each waits for the lock
        self._epoch_at = 0
        #: worker -> the trees of its spouts that this run's checkpoints covered (completed: --max-tuples)
        self.trees: dict[int, int] = {}

    async def step(self, broadcast: Any, workers: int, rollback: Any) -> None:
        """Advance the phases, on a message of the workers' (their flags, a
        cut reached, a prepare answered) or on the clock."""
        now = trio.current_time()
        if self.state != "idle" and self.epoch != self._epoch_at:  # a rollback abandoned it
            self.state = "idle"
        if self.state == "idle":
            txid = self.store.txid or 0
            flags = [f for f in self.flags.values() if f[2] == txid and f[3] == self.epoch]  # (this round's)
            # (every worker's word of this round: one still starting after a death would not hear the pause,
            # and the checkpoint would wait for its cut until a tree timed out)
            everyone = len(flags) == workers
            quiet = everyone and all(f[0] for f in flags)
            if everyone and (now - self.last >= self.interval or quiet) and any(f[1] for f in flags):
                log.debug("a checkpoint begins: %s", "the spouts were quiet on every worker and trees wait for it"
                          if quiet else "the interval passed")
                self._epoch_at = self.epoch
                self.state = "pausing"
                self.cuts = {}
                await broadcast(("cp_pause",))
            return
        if self.state == "pausing":
            if len(self.cuts) == workers:
                self.txid += 1
                self.prepared = {}
                self.state = "preparing"
                await broadcast(("cp_prepare", self.txid, self.cuts))
            return
        if self.state == "preparing" and len(self.prepared) == workers:
            answers = list(self.prepared.values())
            if any(a is None for a in answers):
                # A worker lost a stateful process (or rolled back): the others' processes answered a
                # prepare that will not be committed, and a component's next prepare holds only what
                # changed since this one (§9.7): every worker goes back to the last commit.
                self.state = "idle"
                await rollback("a checkpoint was abandoned: a stateful process was lost while it was taken")
                return
            # Written and committed once: a status and an answer that arrive together both get here, and
            # a second commit would release acks held since the cut (trees no checkpoint covers yet).
            self.state = "committing"
            async with self.lock:
                if self.state != "committing":  # a worker died since (abandon): the rollback after it ends this
                    return
                if self.epoch != self._epoch_at:
                    self.state = "idle"
                    return
                self._write(answers)
                for w, a in self.prepared.items():
                    self.trees[w] = self.trees.get(w, 0) + len(a["completed"])
                self.committed += 1
                self.state = "idle"
                self.last = now
                await broadcast(("cp_commit", self.txid))

    def abandon(self) -> None:
        """A worker died: the checkpoint being taken, if any, is not
        committed. Called under :attr:`lock`, before the others hear of the
        death (``peer_lost``), on which each fails every tree it owns but
        those the last commit covered. A commit after that would cover
        trees they failed, and their spouts replay them: counted twice. Its
        answers may all be in already (the dead worker's sent before it
        died, read after its death was seen): they are dropped, and none
        begins until the rollback that follows takes every worker back to
        the last commit (a component's next prepare would hold only what
        changed since this one's, §9.7)."""
        self.state, self._epoch_at = "lost", self.epoch

    def _write(self, answers: list[dict[str, Any]]) -> None:
        from .._runtime.state_store import Checkpoint

        cp = Checkpoint(self.txid)
        parallelism: dict[str, int] = {}
        outputs: dict[str, tuple[int, dict[str, Any]]] = {}
        for a in answers:
            cp.changes.update(a["changes"])
            cp.completed.extend(a["completed"])
            cp.values.update(a["values"])
            _keep_latest(outputs, a["outputs"].items())  # (a key's latest record over the workers)
            parallelism.update(a["parallelism"])
        cp.outputs.update((key, record) for key, (_, record) in outputs.items())
        self.store.commit(cp, parallelism)

    def close(self) -> None:
        self.store.close()
        if self.temporary:
            shutil.rmtree(self.dir, ignore_errors=True)
