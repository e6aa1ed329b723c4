"""The ``multilang`` console script: signals are noted (``_signals``) before
the command line is even imported, so that no moment of a run is without a
handler."""

from __future__ import annotations


def main() -> None:
    import signal

    from . import signals as _signals

    _signals.install()
    code: object = 0
    try:
        from .main import main as cli

        cli()
    except SystemExit as exc:
        code = exc.code
    finally:
        # The interpreter's shutdown gives a signal handled in Python its
        # default action back: one that came then would end the process by
        # the raw signal after its output and summary. Ignored (for the whole
        # process, whatever thread the kernel picks), it changes nothing.
        for s in _signals.SIGNALS:
            signal.signal(s, signal.SIG_IGN)
    # A signal noted after the command chose its exit code (as it wrote its
    # last lines) still ends it as the first signal says: 130, 143 or 129. (One
    # during the interpreter's shutdown, from here on, is not seen.)
    if _signals.first is not None and code not in {_signals.exit_status(s) for s in _signals.SIGNALS}:
        code = _signals.exit_status(_signals.first)
    raise SystemExit(code)
