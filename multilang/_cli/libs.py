"""``multilang lib``: where the Ruby and Node component libraries are, and a copy of one.

A wheel carries them as ``multilang/ruby/multilang.rb`` and
``multilang/node/multilang.js`` (pyproject.toml maps examples/ruby and
examples/node there); a checkout (an editable install) has them in
``examples/``. The Python library is this package itself.
"""

from __future__ import annotations

import os
import pathlib
from pathlib import Path

import click

from .common import EXIT_FAILED, EXIT_USAGE

#: language -> the library's file name
FILES = {"ruby": "multilang.rb", "node": "multilang.js"}

#: how a component loads the library once it sits beside it
USAGE = {
    "ruby": "require_relative 'multilang'",
    "node": "const { BasicBolt } = require('./multilang');",
    "python": "from multilang import BasicBolt",
}


def library_path(lang: str) -> Path:
    """The file of the ``lang`` library (``ruby``, ``node``), or for
    ``python`` the directory to put on PYTHONPATH; FileNotFoundError if
    this installation lacks it."""
    here = Path(__file__).resolve().parent.parent  # the multilang package folder
    if lang == "python":
        return here.parent
    name = FILES[lang]
    for candidate in (here / lang / name, here.parent / "examples" / lang / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"the {lang} library ({name}) is not in this installation ({here})")


@click.command("lib", short_help="Print or copy the Ruby, Node or Python component library.")
@click.argument("lang", type=click.Choice(["ruby", "node", "python"]))
@click.option("--copy", "copy_to", metavar="DIR", type=click.Path(file_okay=False),
              help="Copy the library into DIR (made if missing), beside your components, and print the copy's path.")
def lib(lang: str, copy_to: str | None) -> None:
    """Print where the component library for LANG is (a file for ruby and
    node, the directory to put on PYTHONPATH for python), or copy it."""
    import shutil

    from .libs import USAGE, library_path

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
