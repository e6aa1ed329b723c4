"""What can go wrong in a conformance run, by whose fault.

``ConformError``: the run cannot be set up (bad vectors, a command that cannot
start). ``VectorBug``: a vector is wrong. ``_Failure``: the component broke a
check, named by its rule id. ``_NotApplicable``: it declined the vector's extension.
"""

from __future__ import annotations

from ..errors import MultilangError


class ConformError(MultilangError):
    """The run could not be set up: bad vectors, or a command that cannot start."""


class VectorBug(Exception):
    """The vector itself is wrong (unknown operator, breaks the protocol)."""


class _NotApplicable(Exception):
    """The component declined the vector's extension at the handshake."""


class _Failure(Exception):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule = rule
        self.reason = reason
