"""The warm pool: engines kept alive between Spark tasks in each Python worker
(``_Pool``), the once-per-worker heap freeze, and the sync side of one
partition (``_run_partition``) that leases an engine and pumps rows through it.
"""

from __future__ import annotations

import gc
import os
from typing import Any, Callable, Iterable, Iterator

import trio

from ..._sync import TrioHost, pump
from .engine import _Engine
from .lease import _Lease
from .spec import _Options, _Spec


class _Pool:
    """Warm engines of this worker, keyed by spec."""

    def __init__(self, host: TrioHost) -> None:
        self.host = host
        self.idle: dict[str, list[_Engine]] = {}
        self.engines: set[_Engine] = set()
        self.max_idle = 4
        host.on_shutdown(self.shutdown)
        host.nursery.start_soon(self._reaper)

    @staticmethod
    def of(host: TrioHost) -> "_Pool":
        pool = getattr(host, "_multilang_pool", None)
        if pool is None:
            pool = _Pool(host)
            host._multilang_pool = pool  # type: ignore[attr-defined]
        return pool

    async def lease(self, spec: _Spec, opts: _Options) -> _Lease:
        engine = None
        if opts.warm and not opts.stateful:
            idle = self.idle.get(spec.key, [])
            while idle:
                e = idle.pop()
                if e.healthy():
                    engine = e
                    break
                self.host.nursery.start_soon(self._stop, e)
        if engine is None:
            engine = _Engine(spec, self)
            engine.idle_timeout = opts.idle_timeout  # type: ignore[attr-defined]
            self.engines.add(engine)
            await self.host.nursery.start(engine.serve)
        lease = _Lease(engine, opts)
        engine.lease = lease
        return lease

    def give_back(self, engine: _Engine, reusable: bool) -> None:
        idle = self.idle.setdefault(engine.spec.key, [])
        if reusable and len(idle) < self.max_idle:
            engine.idle_since = trio.current_time()
            idle.append(engine)
        else:
            self.host.nursery.start_soon(self._stop, engine)

    async def _stop(self, engine: _Engine) -> None:
        try:
            await engine.stop()
        finally:
            self.engines.discard(engine)

    async def _reaper(self) -> None:
        while True:
            await trio.sleep(2.0)
            now = trio.current_time()
            for key, idle in list(self.idle.items()):
                keep = []
                for e in idle:
                    if now - e.idle_since > getattr(e, "idle_timeout", 60.0) or not e.healthy():
                        self.host.nursery.start_soon(self._stop, e)
                    else:
                        keep.append(e)
                self.idle[key] = keep

    async def shutdown(self) -> None:
        self.idle.clear()
        with trio.move_on_after(20):
            async with trio.open_nursery() as n:
                for e in list(self.engines):
                    n.start_soon(self._stop, e)


async def _open_lease(host: TrioHost, spec: _Spec, opts: _Options) -> _Lease:
    return await _Pool.of(host).lease(spec, opts)


_heap_frozen = False


def _freeze_worker_heap() -> None:
    """Once per Python worker: collect, then move every object alive now
    (PySpark, pyarrow, trio, this module, the warm runtime) out of the
    collector's sight with :func:`gc.freeze` (docs/SPARK.md, "Garbage
    collection"). Off with ``MULTILANG_SPARK_GC_FREEZE=0`` in the workers'
    environment."""
    global _heap_frozen
    if _heap_frozen:
        return
    _heap_frozen = True
    if os.environ.get("MULTILANG_SPARK_GC_FREEZE", "1").strip() != "0":
        gc.collect()
        gc.freeze()


def _run_partition(spec: _Spec, opts: _Options, items: Iterable[Any],
                   report: Callable[[dict[str, Any]], None] | None) -> Iterator[list[Any]]:
    """The sync side of one partition: yields lists of released records
    ((component, stream, values) tuples and ``_Dead`` records)."""
    host = TrioHost.get()
    lease = host.run(_open_lease, host, spec, opts)
    _freeze_worker_heap()
    yield from pump(host, lease, items, chunk=opts.batch_size, on_close=report)
