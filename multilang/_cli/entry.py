"""The ``multilang`` console script: signals are noted (``_signals``) before
the command line is even imported, so that no moment of a run is without a
handler."""

from __future__ import annotations


def main() -> None:
    import signal

    from . import signals as _signals

    _signals.install()
    try:
        from .main import main as cli

        cli()
    finally:
        # The interpreter's shutdown gives a signal handled in Python its
        # default action back: one that came then would end the process by
        # the raw signal after its output and summary. Ignored (for the whole
        # process, whatever thread the kernel picks), it changes nothing.
        for s in _signals.SIGNALS:
            signal.signal(s, signal.SIG_IGN)
