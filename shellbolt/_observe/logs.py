"""How the host's log lines look on stderr, at ``--log-level``: one setup
for the CLI's process and for each host worker (the main process hands the
workers its level, so that a worker's lines look and filter as its own)."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging"]


def setup_logging(level: str) -> None:
    """``level`` (debug, info, warning, error) is the host's own level. What
    components say (their ``log`` frames below WARN and their stderr lines,
    multilang.component.*, within a line budget per process) shows at info
    unless it is ``error``, as Storm's worker log shows a ShellBolt's logs."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    components = {"debug": logging.DEBUG, "error": logging.ERROR}.get(level, logging.INFO)
    logging.getLogger("multilang.component").setLevel(components)
