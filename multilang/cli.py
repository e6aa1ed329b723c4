"""The ``multilang`` command line (click). Thin: parsing and exit codes only."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="multilang-bridge")
def main() -> None:
    """Run Apache Storm multilang spouts and bolts, in any language."""
