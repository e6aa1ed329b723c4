"""The ``multilang`` console script: signals are noted (``_signals``) before
the command line is even imported, so that no moment of a run is without a
handler."""

from __future__ import annotations


def main() -> None:
    import atexit
    import contextlib
    import logging
    import os
    import signal
    import sys

    from . import signals as _signals

    _signals.install()
    code: object = 0
    try:
        from .main import main as cli

        cli()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        # The interpreter's shutdown (after a traceback) gives a signal
        # handled in Python its default action back: one that came then would
        # end the process by the raw signal. Ignored (for the whole process,
        # whatever thread the kernel picks), it changes nothing.
        for s in _signals.SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise
    if code is None:
        code = 0
    elif not isinstance(code, int):  # (SystemExit("message"): as Python would, the message and 1)
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()  # (what the interpreter's shutdown would run: temporary folders, Spark's JVM)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # (a closed pipe: nothing more can reach it)
            stream.flush()
    # A signal noted after the command chose its exit code (as it wrote its
    # last lines) still ends it as the first signal says: 130 or 143. Then the
    # process ends at once, its exit hooks run: the rest of the interpreter's
    # shutdown (tens of ms, signals ignored) was a window in which a signal
    # went unseen and the exit was 0.
    if _signals.first is not None and code not in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        code = 128 + _signals.first
    os._exit(code)
