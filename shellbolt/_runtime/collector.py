"""Python's cyclic collector for a run (docs/PERFORMANCE.md, "The collector
and what start-up made"): what start-up made goes out of its scans, and it
runs less often while the run makes and drops its tuples."""

from __future__ import annotations

import gc

__all__ = ["prepare_gc", "YOUNG_THRESHOLD"]

#: new container objects before a collection of the youngest generation
#: (Python's default: 700). A run makes and drops a few objects per tuple,
#: nearly all freed by reference counting; at 700 the collector ran about
#: 4,500 times in a 30x word count, and walked the older generations 440
#: times.
YOUNG_THRESHOLD = 10_000


def prepare_gc() -> None:
    """Just before a run, in a process that runs the host (``multilang
    run``, ``multilang pipe``, each host worker): collect, then freeze what
    is alive (the modules, their classes, the topology: they live as long
    as the run), and raise the youngest generation's threshold to
    :data:`YOUNG_THRESHOLD` (a higher one set before is kept)."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    if young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *older)
