"""``multilang replay``: a recorded task's frames against a component again."""

from __future__ import annotations

import logging
import os

import click

from multilang.shellbolt import setup_logging

from .common import EXIT_FAILED, EXIT_USAGE, FloatRange, IntRange


@click.command("replay")
@click.argument("recording", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--component", required=True, metavar="C", help="The recorded component to replay.")
@click.option("--task", type=int, metavar="N", help="Its task (needed when it ran more than one).")
@click.option("--session", type=IntRange(min=1), metavar="K",
              help="The task's process session (1, 2, ... a restart starts a new one). Default: the last complete one.")
@click.option("--cwd", type=click.Path(file_okay=False, exists=True),
              help="Where CMD runs. Default: where the recorded process ran (the topology's resource directory).")
@click.option("--timeout", type=FloatRange(min=0.05, max=3600), default=10.0, show_default=True,
              help="Seconds CMD may send nothing while the replay waits for it (handshake, an ack, a sync): "
                   "longer is a hang (exit 1).")
@click.option("--partial", is_flag=True,
              help="Replay a recording with a truncated or damaged segment: what is whole before the damage. Without "
                   "it such a recording is an error (exit 1), naming the segment and what was lost.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning",
              show_default=True)
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def replay(recording: str, component: str, task: int | None, session: int | None, cwd: str | None, timeout: float,
           log_level: str, cmd: tuple[str, ...], partial: bool = False) -> None:
    """Feed a recorded task's input to CMD and compare its output.

    Plays the host against CMD (no shell) as the run played it for one task
    of COMPONENT recorded with multilang run --record DIR: the handshake,
    then every tuple, heartbeat and command in order, paced as recorded.
    Then compares CMD's emits, acks and fails with the recorded ones, per
    input tuple (docs/OBSERVE.md):

        multilang replay rec/ --component split --task 3 -- ruby ruby/split_bolt.rb

    Prints "no difference: ..." and exits 0, or the first difference (the
    input tuple, expected and got) and exits 1; 1 too if CMD crashes or
    hangs (--timeout); 2 on usage errors. CMD's stderr is shown.
    """
    import trio

    from multilang.shellbolt import (
        RecordingDamaged, ReplayUsageError, command_problem, replay as run_replay, replay_resolve_argv as resolve_argv,
        replay_select as select,
    )

    setup_logging(log_level)
    # CMD's stderr, logged per line by the host (multilang.component.*): the user's debug output
    logging.getLogger("multilang.component").setLevel(min(logging.INFO, getattr(logging, log_level.upper())))
    if not cmd:
        raise click.UsageError("no command to replay into: give it after --, e.g. -- ruby ruby/split_bolt.rb")
    try:
        sel = select(recording, component, task, session, partial)
        workdir = cwd or (sel.session.start or {}).get("cwd") or os.getcwd()
        if not os.path.isdir(workdir):
            raise ReplayUsageError(f"the recorded process ran in {workdir}, which does not exist here: give --cwd")
        argv = resolve_argv(list(cmd))
        problem = command_problem(argv, workdir, os.environ.get("PATH"))
        if problem is not None:
            raise ReplayUsageError(f"{problem} (the command runs in {workdir})" if "commands run in" not in problem
                                   else problem)
        for note in sel.notes:
            click.echo(f"[replay] {note}", err=True)
        outcome = trio.run(run_replay, sel, argv, workdir, timeout)
    except ReplayUsageError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    except RecordingDamaged as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    for note in outcome.notes[len(sel.notes):]:
        click.echo(f"[replay] {note}", err=True)
    click.echo(outcome.text)
    raise SystemExit(outcome.code)
