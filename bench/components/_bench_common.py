"""Shared by the benchmark components: optional cProfile wrapping.

If ``BENCH_PROFILE`` names a file, the component's ``main`` runs under
cProfile and the stats are dumped there when it returns (or raises
SystemExit). Nothing else about the component changes.
"""

import os


def run(main):
    path = os.environ.get("BENCH_PROFILE")
    if not path:
        main()
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        main()
    finally:
        prof.disable()
        prof.dump_stats(path)
