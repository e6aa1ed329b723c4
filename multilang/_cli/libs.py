"""``multilang lib``: where the Ruby and Node component libraries are
(``multilang.library_path``), and a copy of one."""

from __future__ import annotations

import os
import pathlib

import click

from .common import EXIT_FAILED, EXIT_USAGE

#: how a component loads the library once it sits beside it
USAGE = {
    "ruby": "require_relative 'multilang'",
    "node": "const { BasicBolt } = require('./multilang');",
    "python": "from multilang import BasicBolt",
}


@click.command("lib", short_help="Print or copy the Ruby, Node or Python component library.")
@click.argument("lang", type=click.Choice(["ruby", "node", "python"]))
@click.option("--copy", "copy_to", metavar="DIR", type=click.Path(file_okay=False),
              help="Copy the library into DIR (made if missing), beside your components, and print the copy's path.")
def lib(lang: str, copy_to: str | None) -> None:
    """Print where the component library for LANG is (a file for ruby and
    node, the directory to put on PYTHONPATH for python), or copy it."""
    import shutil

    from .._libraries import library_path

    try:
        path = library_path(lang)
    except FileNotFoundError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    if copy_to is not None:
        if lang == "python":
            raise click.UsageError("--copy applies to ruby and node; the Python library is installed with pip")
        try:
            os.makedirs(copy_to, exist_ok=True)
            path = pathlib.Path(shutil.copy(path, copy_to)).resolve()
        except OSError as exc:
            click.echo(f"error: --copy {copy_to}: {exc.strerror or exc}", err=True)
            raise SystemExit(EXIT_USAGE) from None
        click.echo(f"copied; a component beside it loads it with: {USAGE[lang]}", err=True)
    click.echo(str(path))
