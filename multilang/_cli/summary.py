"""The ``[summary]`` lines at the end of a run (stderr)."""

from __future__ import annotations

from typing import Any

import click
import orjson

from multilang.errors import last_stderr_line
from multilang.shellbolt import SCHEMA

from .common import clip, json_text


def _negotiated(extensions: list[str] | None) -> str:
    """A shell component's protocol, as the summary names it (§9.2)."""
    if extensions is None:
        return "no handshake"  # (no process of it got that far)
    return "+".join(extensions) if extensions else "standard"


_START = "multilang.spout.start.secs"


def emitted_nothing_line(name: str, topology: Any) -> str:
    """The summary's line for a shell spout that emitted nothing in a run that
    ended by itself: it may have been still starting (both engines). It says
    the value in effect and where it came from (a component's conf wins over
    the topology's and over ``-c``, so the advice follows it)."""
    own = topology.components[name].conf.get(_START)
    secs = own if own is not None else topology.conf.get(_START)
    where = " in its conf" if own is not None else " in the topology conf" if secs is not None else ", by default"
    secs = SCHEMA[_START].default if secs is None else secs
    advice = f"raise {_START} in its conf" if own is not None else f"-c {_START}={max(30, 6 * secs):g}"
    return (f"[summary] spout {name!r} emitted nothing: its `next`s brought nothing for {secs:g} s ({_START}"
            f"{where}), so the run took it for done; a spout slower to start needs more ({advice}), or --duration")


def print_summary(result: Any, elapsed: float, dead_letter_file: str | None = None, topology: Any = None) -> None:
    line = (f"[summary] {elapsed:.1f}s; trees completed {result.completed}, failed {result.failed} "
            f"(timed out {result.timed_out})")
    if result.pending:
        line += f", abandoned at stop {result.pending}"
    click.echo(line, err=True)
    spouts = set(getattr(result, "spouts", ()))
    for name, s in result.stats.items():
        skipped = "skipped (already committed, or in flight from a process that died)"
        extra = "".join(f", {label} {n}" for label, n in (("dropped stale", s.expired),
                                                            ("dead letters", s.dead_letters),
                                                            (skipped, s.skipped)) if n)
        executed = "" if name in spouts else f"executed {s.executed}, "  # a spout executes nothing
        click.echo(f"[summary]   {name}: emitted {s.emitted}, {executed}acked {s.acked}, "
                   f"failed {s.failed}, restarts {s.restarts}, errors {s.errors}{extra}", err=True)
        if s.metrics:  # the last `metrics` frame of each name (§3.7)
            shown = ", ".join(f"{k}={orjson.dumps(v, default=repr).decode()}" for k, v in sorted(s.metrics.items()))
            click.echo(f"[summary]     {name} metrics: {clip(shown)}", err=True)
    exts = getattr(result, "extensions", {})
    if exts:  # the shell components: what their processes negotiated (§9.2), one line for all
        click.echo("[summary] protocol: " + "; ".join(f"{n} {_negotiated(e)}" for n, e in exts.items()), err=True)
    if result.dead_letters:
        where = f" (written to {dead_letter_file})" if dead_letter_file else " (keep them with --dead-letter FILE)"
        click.echo(f"[summary] {result.dead_letters} input(s) failed for good and were given up on: after "
                   f"multilang.max.replays, or refused before they were sent (0 attempts){where}:", err=True)
        for d in result.dead_letter_sample:
            where = f"stdin line {d.line}" if getattr(d, "line", None) is not None else d.component
            click.echo(f"[summary]   {where}: {clip(json_text(d.input))} "
                       f"({d.attempts} attempts): {d.cause}", err=True)
        if result.dead_letters > len(result.dead_letter_sample):
            click.echo(f"[summary]   ... and {result.dead_letters - len(result.dead_letter_sample)} more", err=True)
    if result.stopped_by == "replays":
        click.echo("[summary] stopped: trees kept failing and none completed while a shell spout replayed message "
                   "ids failed past multilang.max.replays; it would have replayed them for ever", err=True)
    if result.stopped_by == "done" and topology is not None:  # (a shell spout that never emitted: still starting?)
        for name in sorted(spouts & set(exts)):
            s = result.stats.get(name)
            if s is not None and not (s.emitted or s.skipped or s.errors):
                click.echo(emitted_nothing_line(name, topology), err=True)
    for name, n in getattr(result, "reused_ids", {}).items():
        click.echo(f"[summary] spout {name!r} reused {n} message id(s) for inputs other than those a checkpoint "
                   "holds under them: delivered as new inputs (at least once); a spout must give each input one id "
                   "for exactly-once state (docs/STATE.md)", err=True)
    for where, n, sample in getattr(result, "not_replayed", ()):
        click.echo(f"[summary] spout {where} never emitted again {n} message id(s) that failed (e.g. "
                   f"{clip(', '.join(map(repr, sample)), 100)}): that input is lost. A spout must replay what fails "
                   "for at-least-once results, and for exactly-once state (docs/STATE.md)", err=True)
    for name, msg_id, times, cause in result.repeated_failures:
        click.echo(f"[summary] spout {name} saw message id {clip(repr(msg_id))} fail {times} times"
                   + (f"; last cause: {cause}" if cause else ""), err=True)
    if getattr(result, "state_path", None) and not result.stateful:
        # (a component none of whose processes got through its handshake could not say: a trial's stateful
        # count bolt, its worker killed each time before, read as one that is not stateful)
        silent = [n for n, e in exts.items() if e is None and n not in spouts]
        why = (f"{', '.join(silent)} never completed a handshake, and no other bolt" if silent else
               "no bolt of this topology")
        click.echo(f"[summary] state: {why} accepted the state extension (§9.7), so {result.state_path} holds "
                   "nothing from this run", err=True)
    if getattr(result, "stateful", None):
        where = (f"kept in {result.state_path}" if result.state_path else
                 "kept for this run only (resume a run with --state-dir DIR)")
        last = "no checkpoint" if result.state_txid is None else f"checkpoint {result.state_txid}"
        click.echo(f"[summary] state of {', '.join(result.stateful)}: {last} committed "
                   f"({result.checkpoints} in this run, {result.rollbacks} rolled back); {where}", err=True)
    for err in result.gave_up:
        click.echo(f"[summary] gave up: {err}", err=True)
    if result.gave_up:  # the one line that says why the run failed, last (its cause in the component's own words)
        lines = [ln.strip() for ln in str(result.gave_up[0]).splitlines() if ln.strip()]
        stderr = last_stderr_line(result.gave_up[0])  # (not its last frames: they are no words of its)
        said = f"; its stderr ended: {clip(stderr)}" if stderr is not None else ""
        click.echo(f"error: the run gave up: {lines[0] if lines else result.gave_up[0]}{said}", err=True)
