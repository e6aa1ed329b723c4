"""A host worker process: ``python -m multilang.shellbolt._workers.worker DIR WORKER WORKERS [LIMIT]``
(LIMIT: the spout tuples this process may emit, ``--max-tuples`` less the
trees its predecessors' spouts completed), or the same forked by a fork
server (forkserver.py) and given those arguments.

It reads the topology the main process pickled in DIR, runs its share of
the tasks (Storm's even scheduler: :func:`placement`) with a runtime whose
other tasks are :class:`RemoteTask` stand-ins, and talks to the main
process over DIR/main: outputs and status out; ``stop`` in. It ends when
the main process says so, or when its connection to it closes (the main
process died: no orphan keeps running)."""

from __future__ import annotations

import os
import pickle
import signal
import sys
from dataclasses import dataclass
from typing import Any

import trio

from .._host import scratch
from .._model.results import COUNTERS
from .._model.topology import Topology
from .._runtime.collector import prepare_gc
from . import view
from .link import Link, RemoteTask, socket_path
from .wire import Frames

__all__ = ["Placement", "placement", "main", "name_process"]


def placement(topology: Topology, workers: int) -> dict[int, int]:
    """Task id -> worker: the tasks in id order, dealt round-robin (Storm's even scheduler)."""
    ids = sorted(t for c in topology.components.values() for t in c.tasks)
    return {t: i % workers for i, t in enumerate(ids)}


@dataclass
class Placement:
    worker: int
    workers: int
    where: dict[int, int]
    link: Link

    def remote(self, runtime: Any, comp: Any, task_id: int) -> RemoteTask:
        return RemoteTask(runtime, comp, task_id, self.link)

    def checkpointer(self, runtime: Any) -> Any:
        from .checkpoints import WorkerCheckpointer

        return WorkerCheckpointer(runtime, self.link)


def name_process(name: str) -> None:
    """This process's name (``/proc/self/comm``, at most 15 bytes), where the system has one."""
    try:
        with open("/proc/self/comm", "w", encoding="ascii") as f:
            f.write(name[:15])
    except OSError:
        pass


def _cpu() -> float:
    """This process's own CPU seconds (a worker's components' not counted)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _processes(rt: Any) -> dict[int, str]:
    """This worker's component processes: pid -> start time (Linux; none
    elsewhere). If this worker dies, the main process kills those still
    running: one that is hung or stopped reads no end of its input, and
    would outlive the run (a trial)."""
    spawned = (getattr(getattr(t, "proc", None), "spawned", None) for t in rt.tasks.values())
    return dict(s for s in spawned if s is not None)


def _status(rt: Any, link: Link, snapshot: bool) -> dict[str, Any]:
    cp = rt.checkpoints
    part = {"part": view.part(rt, link.worker, link.placement)} if snapshot else {}
    return {**part, "done": rt.drained() if rt.spouts_stopped else rt.done(), "sent": link.sent,
            "received": link.received, "pending": rt.acker.pending, "emitted": rt.emitted_by_spouts,
            "fresh": rt.fresh_by_spouts,  # (what --max-tuples counts)
            # (--max-tuples: its limit now, and whether its spouts stopped at it with more to emit)
            "limit": rt.max_tuples, "more": _more(rt, link),
            "completed": rt.acker.stats["completed"], "failed": rt.acker.stats["failed"],
            "forever": rt.replayed_past_max(),  # (the main process's ReplayWatch: its trees are counted here)
            "processes": _processes(rt),
            # (its tasks' counters: if this process dies, the run's counts keep what it did)
            "counters": {t: [getattr(s, k) for k in COUNTERS] for stats in rt.stats.values()
                         for t, s in stats.tasks.items() if link.placement[t] == link.worker},
            # (and what its shell tasks' processes negotiated: the summary's protocol line)
            "extensions": {t: None if task.obs.extensions is None else list(task.obs.extensions)
                           for t, task in rt.tasks.items()
                           if link.placement[t] == link.worker and task.comp.is_shell},
            # (and its stateful components, for the summary's state line if it dies before its result)
            **({**cp.status(), "stateful": sorted({t.name for t in cp.tasks.values()})} if cp is not None else {})}


def _more(rt: Any, link: Link) -> bool:
    """Whether this worker's spouts stopped at its share of --max-tuples
    with more to emit, and may be given more: one of its spout tasks is not
    idle (idle: a shell spout that answered `next` with nothing, a Python
    spout whose source ran out), and none dropped a fresh emit past the
    limit (a shell spout asked for its replays emits its fresh inputs
    first: ``ShellSpoutTask._past_limit``). Those it dropped it counts as
    pending and never emits again; given more, it would go on past them,
    and this run would have a gap where they were."""
    from .._runtime.spouts import SpoutTask

    if rt.max_tuples is None or rt.fresh_by_spouts < rt.max_tuples:
        return False
    spouts = [t for i, t in rt.tasks.items() if link.placement[i] == link.worker and isinstance(t, SpoutTask)]
    return any(not t.idle for t in spouts) and not any(getattr(t, "held_past_limit", 0) for t in spouts)


async def _run(directory: str, worker: int, workers: int, limit: int | None) -> None:
    from .._runtime.runtime import Runtime

    with open(os.path.join(directory, "topology.pickle"), "rb") as f:
        path = pickle.load(f)  # the main process's sys.path: its in-process components' modules import here too
        sys.path[:] = path + [p for p in sys.path if p not in path]
        topology, run_args = pickle.load(f)
    if run_args.get("log_level"):  # (as the main process logs: its lines and the components' look the same)
        from .._observe.logs import setup_logging

        setup_logging(run_args["log_level"])
    where = placement(topology, workers)
    link = Link(directory, worker, workers, where)
    # A keyed output view is kept here (the keys of a task are its own) and sent with the result;
    # other outputs go to the main process as they come.
    rt = Runtime(topology, on_output=link.output, placement=Placement(worker, workers, where, link))
    link.runtime = rt
    prepare_gc()  # (as the main process does: docs/PERFORMANCE.md)
    rt.on_dead_letter = lambda letter: link.to_main(("dead", letter))  # the main process writes --dead-letter's file
    if run_args.get("record"):  # --record: this worker's tasks, in the main process's recording
        from .._replay.record import Recorder

        rt.recorder = Recorder(run_args["record"])  # (its part: no recording.json)
    rt.acker.on_remote = link.wake
    rt.on_view_change = link.wake  # type: ignore[method-assign]
    rt.outputs_unsent = link.outputs_unsent
    try:
        main = await trio.open_unix_socket(socket_path(directory, "main"))
    except OSError:  # the main process is gone (killed while this one started): nothing to run for
        return
    link.main = main
    result: Any = None
    async with trio.open_nursery() as nursery:
        await link.serve(nursery)
        await link.send_main(("hello", worker, os.getpid(), _cpu()))  # (its start-up CPU: bench/workers.py)

        async def control() -> None:
            try:
                await _control()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            rt.abort()  # the main process is gone: stop now, no orphans
            nursery.cancel_scope.cancel()

        async def _control() -> None:
            frames = Frames()
            reason = "request"
            async for data in main:
                for msg in frames.feed(data):
                    if msg[0] == "status":
                        await link.send_main(("status", worker, _status(rt, link, msg[1])))
                    elif msg[0] == "stop":  # the spouts stop; the trees drain; the main process says when to end
                        rt.stop_spouts()
                        reason = msg[1]
                    elif msg[0] == "finish":
                        rt.request_stop(reason)
                    elif msg[0] == "abort":  # a second signal: at once, with what it has (as one engine)
                        rt.abort()
                        running.cancel()
                    elif msg[0] == "peer_lost":
                        link.peer_lost(msg[1], msg[2])
                        await link.send_main(("reset", worker, msg[1]))
                    elif msg[0] == "peer_up":
                        link.peer_up(msg[1])
                    elif msg[0] == "cap":  # --max-tuples: its spouts are dry; what they left goes to another worker
                        rt.cap_fresh()
                    elif msg[0] == "limit":  # --max-tuples: more of it, that a worker whose spouts ran dry left
                        rt.max_tuples, rt.fresh_capped = msg[1], False
                        rt.kick_spouts()
                    elif rt.checkpoints is not None:
                        await _checkpoint(msg)
                    if msg[0] == "epoch":
                        told.set()

        async def _checkpoint(msg: Any) -> None:
            cp = rt.checkpoints
            kind = msg[0]
            if kind == "cp_pause":
                cp.pause()

                async def cut(epoch: int) -> None:  # said as soon as it holds (the main process waits for all)
                    while cp.epoch == epoch and cp.paused:
                        if cp.status()["cut"]:
                            cp.at_cut()  # (from now on no tree of this worker's fails by its timeout)
                            # With what it has sent each peer, once sent: the failures of its trees among it
                            # (each peer takes them before it prepares: WorkerCheckpointer.prepare).
                            sent = await link.flushed()
                            if cp.epoch == epoch and cp.paused and cp.status()["cut"]:
                                await link.send_main(("cut", worker, epoch, sent))
                                return
                            continue
                        with trio.move_on_after(0.005):
                            await rt.wait_for_change()
                nursery.start_soon(cut, cp.epoch)
            elif kind == "cp_prepare":
                async def prepare(txid: int, sent: dict[int, dict[int, int]]) -> None:
                    await link.send_main(("prepared", worker, txid, await cp.prepare(txid, sent)))
                nursery.start_soon(prepare, msg[1], msg[2])
            elif kind == "cp_commit":
                cp.commit(msg[1])
            elif kind == "rollback":
                cp.rollback_now(msg[1], msg[2])
            elif kind == "epoch":
                cp.epoch = rt.acker.epoch = msg[1]
                cp.started_at(msg[2])

        running = trio.CancelScope()
        # The run's rollback epoch is the main process's first word, waited for: a tree that a worker
        # started again after a rollback began before it would be taken for stale by the others.
        told = trio.Event()
        nursery.start_soon(control)
        with running:
            await told.wait()
            result = await rt.run(max_tuples=limit)  # until the main process says stop
        if running.cancelled_caught:  # (every process closed without its graces, and reaped)
            result = rt.result()
        if rt.recorder is not None:
            rt.recorder.close()
        link.stopping = True
        await link.flush_main()  # (the last outputs and dead letters, ahead of the result)
        mine = {name: {t: s for t, s in stats.tasks.items() if where[t] == worker} for name, stats in rt.stats.items()}
        await link.send_main(("result", worker, {
            "stats": mine, "completed": result.completed, "failed": result.failed, "timed_out": result.timed_out,
            "pending": result.pending, "gave_up": [str(e) for e in result.gave_up],
            "dead_letters": result.dead_letters, "stopped_by": result.stopped_by, "cpu": _cpu(),
            "view": rt.view_so_far(), "stamps": rt.output_stamps, "extensions": result.extensions, "stateful": result.stateful,
            "repeated_failures": result.repeated_failures, "not_replayed": result.not_replayed,
            "reused_ids": result.reused_ids, "recorded": sorted(rt.recorder.tasks) if rt.recorder else [],
            "part": view.part(rt, worker, where)}))  # (the run's last snapshot, if it ended before the others)
        nursery.cancel_scope.cancel()


def main(args: list[str] | None = None) -> None:
    """``args``: DIR WORKER WORKERS [LIMIT] (default: the command line's; a
    fork server gives them: forkserver.py)."""
    args = sys.argv[1:] if args is None else args
    directory, worker, workers = args[0], int(args[1]), int(args[2])
    limit = int(args[3]) if len(args) > 3 else None
    name_process(f"multilang-w{worker}")  # (what top and pgrep show; ps shows the command line)
    scratch.leave_the_sweep_to_the_main_process()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process owns the signals and says stop
    trio.run(_run, directory, worker, workers, limit)


if __name__ == "__main__":
    main()
