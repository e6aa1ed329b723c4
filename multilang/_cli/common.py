"""What the commands share: exit codes, conf overrides, logging, the
dead-letter writer, the embedded runtime under trio with the signals, the
checks of a command line."""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
from typing import Any

import click

from ..errors import MultilangError, TopologyError
from . import signals as _signals
from .output import Output

#: exit codes (main.py's docstring says when each is used)
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE, as a shell reports `yes | head`

def owning_signals(fn: Any) -> Any:
    """run and pipe: a signal at any moment is noted, never a traceback or
    a raw death (_signals); while the topology runs, run_trio receives them."""
    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        with _signals.owned():
            return fn(*args, **kwargs)

    return command

def parse_conf(pairs: tuple[str, ...]) -> dict[str, Any]:
    from multilang.shellbolt import check_value

    conf: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--conf")
        try:
            conf[key] = json.loads(raw)
        except ValueError:
            conf[key] = raw  # a bare string
        wrong = check_value(key, conf[key])
        if wrong is not None and not isinstance(conf[key], str) and check_value(key, raw) is None:
            # a string key given digits, true or null: read as JSON, so not a string
            raise click.BadParameter(f"{wrong}: a value is read as JSON; for the string, quote it: "
                                     f"-c '{key}=\"{raw}\"'", param_hint="--conf")
    return conf

class IntRange(click.IntRange):
    """click's, saying what is wrong in a user's words: "'1.5' is not a
    valid integer", not "... is not a valid integer range" (a trial)."""

    name = "integer"


class FloatRange(click.FloatRange):
    """click's, saying "'abc' is not a valid number" (not "float range")."""

    name = "number"


def finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds")
    return value

def live_view(tasks: bool) -> Any:
    """The live view on stderr (multilang/_cli/live.py): rows updated in place on
    a terminal, plain ``[progress]`` lines elsewhere; ``tasks``
    (``--progress-tasks``): a row per task too."""
    from .live import LiveView

    return LiveView(sys.stderr, tasks=tasks)

def json_text(obj: Any) -> str:
    """JSON text for the summary and --dead-letter: integers beyond 64 bits
    exact (orjson refuses them); a value JSON cannot hold at all (a lone
    surrogate, nesting deeper than the encoders go) as the string of its
    bounded repr, rather than an error that loses the letter."""
    from ..codec import dumps
    from multilang.shellbolt import short_repr

    try:
        return dumps(obj).decode()
    except MultilangError:
        return json.dumps(short_repr(obj))

def clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."

def dead_letter_writer(path: str | None, line_of: Any = None) -> tuple[Any, Any]:
    """(on_dead_letter callback, file) for --dead-letter: JSON lines with the
    input, the cause, the component and the attempts, flushed per letter;
    ``line_of`` (``multilang pipe``'s stdin feed) adds the input's line."""
    f = None
    if path is not None:
        try:
            f = open(path, "w", encoding="utf-8")
        except OSError as exc:
            click.echo(f"error: --dead-letter {path}: {exc.strerror}", err=True)
            raise SystemExit(EXIT_USAGE) from None
    if f is None and line_of is None:
        return None, None

    def write(letter: Any) -> None:
        if line_of is not None and letter.msg_id is not None:
            letter.line = line_of.line_of(letter.msg_id)
            line_of.forget(letter.msg_id)
        if f is not None:
            f.write(json_text(letter.to_json()) + "\n")
            f.flush()

    return write, f

def embedded_runtime(topology: Any, out: "Output", dead_letter: str | None, line_of: Any = None,
             **outputs: Any) -> tuple[Any, Any]:
    """The embedded runtime for ``topology`` writing to ``out``, with
    --dead-letter's writer: (runtime, dead-letter file or None). A topology
    the runtime refuses is a usage error (exit 2)."""
    from multilang.shellbolt import Runtime

    try:
        runtime = Runtime(topology, **outputs)
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    runtime.on_dead_letter, dead_file = dead_letter_writer(dead_letter, line_of)
    out.runtime = runtime
    return runtime, dead_file

def exception_leaves(eg: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in eg.exceptions:
        out.extend(exception_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out

def run_trio(fn: Any, runtime: Any) -> tuple[Any, int | None]:
    """Run ``fn(nursery)`` under trio; return ``(its result, signal number or None)``.

    The first SIGINT (Ctrl-C) or SIGTERM asks ``runtime`` to stop: spouts
    are deactivated, the trees in flight get the shutdown grace, and the run
    returns its result. A second signal stops at once: the run is cancelled
    and every process is closed without its grace periods (still reaped);
    the result is then None and the caller asks the runtime for what it
    has. A runtime whose ``abort()`` returns True (host workers) stops at
    once by itself, within a bounded time (the workers that do not answer
    are killed), and returns its result: later signals do not cancel it,
    which would lose the output the workers hold. Signals are received here
    rather than left to trio's KeyboardInterrupt delivery, which could be
    lost while the run idled."""
    import trio

    first: int | None = None
    at_once = False  # a second signal that the runtime answers by itself (host workers)

    async def wrapper() -> Any:
        out = None
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                def handle(signum: int) -> bool:
                    """True: stop at once (a second signal)."""
                    nonlocal first, at_once
                    _signals.release_terminal(signum)
                    name = signal.Signals(signum).name
                    if first is None:
                        first = signum
                        click.echo(f"{name}: stopping (the summary and the output so far follow; signal "
                                   "again to stop at once)", err=True)
                        runtime.request_stop("signal")
                        return False
                    if at_once:  # (cancelled now, the workers' part of the output would be lost with them)
                        click.echo(f"{name}: stopping at once already; the output so far follows", err=True)
                        return False
                    click.echo(f"{name}: stopping at once", err=True)
                    if runtime.abort():  # it stops at once by itself, with what it has, in a bounded time
                        at_once = True
                        return False
                    nursery.cancel_scope.cancel()
                    return True

                with trio.open_signal_receiver(*_signals.handled()) as signals:
                    if _signals.first is not None and handle(_signals.first):  # one that came during start-up
                        return
                    async for signum in signals:
                        if handle(signum):
                            return

            nursery.start_soon(watch)
            out = await fn(nursery)
            await trio.sleep(0)  # (a signal the receiver holds already is taken, not dropped by the cancel)
            nursery.cancel_scope.cancel()
        return out

    # What start-up made (modules, classes, the topology) lives as long as the run: out of the cyclic
    # collector's scans, which run less often (docs/PERFORMANCE.md).
    from multilang.shellbolt import prepare_gc

    prepare_gc()
    try:
        result = trio.run(wrapper)
    except BaseExceptionGroup as eg:
        # trio wraps a Ctrl-C, or one error, in exception groups: unwrap.
        if eg.subgroup(KeyboardInterrupt) is not None:
            raise KeyboardInterrupt from None
        leaves = exception_leaves(eg)
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from None
        raise
    return result, first

def stopped_before_start() -> None:
    """A signal during start-up: nothing has run yet, so nothing is printed
    but a line saying so (FILE of -o is left as it was)."""
    if _signals.first is not None:
        click.echo(f"[summary] interrupted by {signal.Signals(_signals.first).name} before the topology started: "
                   "nothing ran", err=True)
        raise SystemExit(_signals.exit_status(_signals.first))

def interrupted(signum: int, keyed: bool) -> None:
    view = "the last tuple per key so far" if keyed else "what the run emitted before it stopped"
    click.echo(f"[summary] interrupted by {signal.Signals(signum).name}: the output is partial ({view}); "
               "all component processes were stopped", err=True)

def exit_code(result: Any, signum: int | None) -> int:
    if signum is not None:
        return _signals.exit_status(signum)
    return EXIT_OK if result.ok else EXIT_FAILED

def check_command(cmd: tuple[str, ...]) -> None:
    """Exit 2 naming why CMD cannot run (not on PATH, a directory, not
    executable, a missing script), before any vector starts."""
    from multilang.shellbolt import command_problem

    problem = command_problem(list(cmd), os.getcwd(), os.environ.get("PATH"))
    if problem is not None:
        click.echo(f"error: {problem}", err=True)
        raise SystemExit(EXIT_USAGE)

def distinct_files(*named: tuple[str, str | None]) -> None:
    """Exit 2 if two of the files a run reads or writes are one file: -o over
    the topology file would replace it with the output."""
    seen: dict[str, str] = {}
    for flag, path in named:
        if path is None or path == "-":
            continue
        real = os.path.realpath(path)
        if real in seen:
            click.echo(f"error: {flag} {path}: the same file as {seen[real]}; name another", err=True)
            raise SystemExit(EXIT_USAGE)
        seen[real] = f"{flag} {path}" if flag != "TOPOLOGY_FILE" else f"the topology file {path}"
