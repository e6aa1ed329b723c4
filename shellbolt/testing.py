"""Test helpers for topologies on the runtime: run one under a hard time
limit and watch its processes (:func:`run_topology`, :class:`TopologyRun`,
:func:`current_pid`). They drive ``multilang.shellbolt``'s runtime, so they
live here rather than in the core's ``multilang.testing``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

__all__ = ["TopologyRun", "run_topology", "current_pid"]


@dataclass
class TopologyRun:
    """What :func:`run_topology` saw."""

    #: the runtime's result (``RunResult``)
    result: Any = None
    #: the ``multilang.shellbolt.Runtime``
    runtime: Any = None
    #: every output record with the trio time it came at
    outputs: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: every component pid seen during the run
    pids: set[int] = field(default_factory=set)
    #: task id -> pids of its processes, in start order
    task_pids: dict[int, list[int]] = field(default_factory=dict)
    #: seconds (trio time) the run took
    elapsed: float = 0.0

    def records(self, component: str, stream: str = "default") -> list[dict[str, Any]]:
        """The output records of ``component`` on ``stream``, in order."""
        return [r for _, r in self.outputs if r.get("component") == component and r.get("stream") == stream]


R = TypeVar("R", bound=TopologyRun)


def current_pid(runtime: Any, task_id: int) -> int | None:
    """The pid of the process now running task ``task_id`` of a Runtime, if any."""
    proc = getattr(runtime.tasks[task_id], "proc", None)
    if proc is not None and proc.proc is not None:
        return proc.proc.pid
    return None


def run_topology(topology: Any, *, during: Callable[[Any], Awaitable[None]] | None = None, limit: float = 15,
                 sample_every: float = 0.003, run_type: type[R] = TopologyRun,  # type: ignore[assignment]
                 **run_kw: Any) -> R:
    """Run ``topology`` under a ``multilang.shellbolt.Runtime`` in ``trio.run``.

    ``run_kw`` go to ``Runtime.run`` (``until_done`` defaults to true unless
    a ``duration`` is given). ``during(runtime)``, if given, runs beside it
    and is cancelled when the run ends. The whole run fails (``TooSlowError``)
    after ``limit`` seconds. Every ``sample_every`` seconds the pids of the
    component processes are noted. Returns a ``run_type`` (a
    :class:`TopologyRun` or a subclass).
    """
    import trio

    from multilang.shellbolt import Runtime

    run_kw.setdefault("until_done", "duration" not in run_kw)

    async def main() -> R:
        run = run_type()
        run.runtime = rt = Runtime(topology, on_output=lambda rec: run.outputs.append((trio.current_time(), rec)))

        async def sample_pids() -> None:
            while True:
                for task_id in rt.tasks:
                    pid = current_pid(rt, task_id)
                    if pid is not None:
                        run.pids.add(pid)
                        seen = run.task_pids.setdefault(task_id, [])
                        if not seen or seen[-1] != pid:
                            seen.append(pid)
                await trio.sleep(sample_every)

        start = trio.current_time()
        with trio.fail_after(limit):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample_pids)
                if during is not None:
                    nursery.start_soon(during, rt)
                run.result = await rt.run(**run_kw)
                nursery.cancel_scope.cancel()
        run.elapsed = trio.current_time() - start
        return run

    return trio.run(main)
