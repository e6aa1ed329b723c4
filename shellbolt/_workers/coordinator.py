"""The main process of a run with host workers (``topology.workers`` > 1):
starts the workers, keeps the topology's output view from what they send,
decides when the run is done (every worker idle and every batch sent
between them received, twice in a row), says stop, and merges their
results into one :class:`RunResult`. A worker that dies is started again;
the trees it held time out and are replayed (at least once)."""

from __future__ import annotations

import math
import os
import pickle
import shutil
import sys
import tempfile
from typing import Any, Callable

import trio

from .._model.results import RunResult
from .._model.topology import Topology
from .link import socket_path
from .wire import Frames, encode

__all__ = ["run_workers"]

_POLL = 0.05


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: trio.Process | None = None
        self.conn: trio.SocketStream | None = None
        self.status: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.restarts = 0
        self.resets: set[int] = set()  # the workers whose loss it has taken in (peer_lost answered)


async def run_workers(topology: Topology, workers: int, *, on_output: Callable[[dict[str, Any]], None] | None = None,
                      duration: float | None = None, until_done: bool = True) -> RunResult:
    """Run ``topology`` on ``workers`` host worker processes (docs/WORKERS.md)."""
    from .._runtime.runtime import Runtime

    view = Runtime(topology, on_output=on_output, checkpointing=False)  # the output view and the summary's shape
    directory = tempfile.mkdtemp(prefix="multilang-workers-")  # 0700: only this user's processes connect
    with open(os.path.join(directory, "topology.pickle"), "wb") as f:
        pickle.dump((topology, {}), f)
    ws = [_Worker(i) for i in range(workers)]
    stopped_by = "done"
    try:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(socket_path(directory, "main"))
        sock.listen(workers * 2)
        listener = trio.SocketListener(sock)
        async with trio.open_nursery() as nursery:

            async def start(w: _Worker) -> None:
                w.proc = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "multilang.shellbolt._workers.worker", directory, str(w.index),
                     str(workers)], start_new_session=True)

            async def serve(conn: trio.SocketStream) -> None:
                try:
                    await _serve(conn)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # a worker died: watch() sees it

            async def _serve(conn: trio.SocketStream) -> None:
                frames = Frames()
                w: _Worker | None = None
                async for data in conn:
                    for msg in frames.feed(data):
                        kind = msg[0]
                        if kind == "hello":
                            w = ws[msg[1]]
                            w.conn = conn
                            if w.restarts:  # back: the others may send to it again
                                await broadcast(("peer_up", w.index), but=w)
                        elif kind == "out":
                            if on_output is not None:
                                for record in msg[1]:
                                    on_output(record)
                        elif kind == "status":
                            ws[msg[1]].status = msg[2]
                        elif kind == "result":
                            ws[msg[1]].result = msg[2]
                        elif kind == "reset":
                            ws[msg[1]].resets.add(msg[2])

            async def accept() -> None:
                while True:
                    conn = await listener.accept()
                    nursery.start_soon(serve, conn)

            async def broadcast(msg: Any, but: _Worker | None = None) -> list[_Worker]:
                sent = []
                for o in ws:
                    if o is not but and o.conn is not None:
                        try:
                            await o.conn.send_all(encode(msg))
                            sent.append(o)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            pass
                return sent

            async def watch(w: _Worker) -> None:
                while True:
                    assert w.proc is not None
                    code = await w.proc.wait()
                    if w.result is not None or stopping.is_set():
                        return
                    # Killed: the others stop sending to it and fail their trees (replayed, at least once),
                    # then it starts again and they may send to it once it is back (peer_up).
                    w.restarts += 1
                    w.conn, w.status = None, None
                    cause = f"host worker {w.index} (pid {w.proc.pid}) died ({code}); restarted"
                    told = await broadcast(("peer_lost", w.index, cause), but=w)
                    with trio.move_on_after(10):
                        while not all(w.index in o.resets or o.conn is None for o in told):
                            await trio.sleep(0.01)
                    for o in told:
                        o.resets.discard(w.index)
                    await start(w)

            stopping = trio.Event()
            nursery.start_soon(accept)
            for w in ws:
                await start(w)
                nursery.start_soon(watch, w)
            with trio.move_on_after(math.inf if duration is None else duration) as timer:
                seen: tuple[Any, ...] | None = None
                while True:
                    await trio.sleep(_POLL)
                    for w in ws:
                        w.status = None
                        if w.conn is not None:
                            try:
                                await w.conn.send_all(encode(("status",)))
                            except (trio.BrokenResourceError, trio.ClosedResourceError):
                                pass
                    await trio.sleep(_POLL)
                    st = [w.status for w in ws]
                    if not until_done or any(s is None for s in st):
                        continue
                    now = tuple((tuple(s["sent"].items()), tuple(s["received"].items()), s["emitted"])  # type: ignore[index]
                                for s in st)
                    quiet = all(s["done"] for s in st) and all(  # type: ignore[index]
                        st[a]["sent"][b] == st[b]["received"][a]  # type: ignore[index]
                        for a in range(workers) for b in range(workers) if a != b)
                    if quiet and now == seen:
                        break
                    seen = now if quiet else None
            if timer.cancelled_caught:
                stopped_by = "duration"
            stopping.set()
            for w in ws:
                if w.conn is not None:
                    await w.conn.send_all(encode(("stop", stopped_by)))
            while any(w.result is None for w in ws):
                await trio.sleep(_POLL)
            for w in ws:
                if w.proc is not None:
                    await w.proc.wait()
            nursery.cancel_scope.cancel()
    finally:
        for w in ws:
            if w.proc is not None and w.proc.returncode is None:
                w.proc.kill()
        shutil.rmtree(directory, ignore_errors=True)
    for w in ws:
        view.outputs_by_key.update((w.result or {}).get("view", {}))
    result = view.result()
    for w in ws:
        r = w.result or {}
        for name, tasks in r.get("stats", {}).items():
            result.stats[name].tasks.update(tasks)
        result.completed += r.get("completed", 0)
        result.failed += r.get("failed", 0)
        result.timed_out += r.get("timed_out", 0)
        result.pending += r.get("pending", 0)
        result.dead_letters += r.get("dead_letters", 0)
    result.stopped_by = stopped_by
    #: the workers' own CPU seconds (bench/workers.py)
    result.workers_cpu = sum((w.result or {}).get("cpu", 0.0) for w in ws)  # type: ignore[attr-defined]
    return result
