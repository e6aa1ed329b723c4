"""The host runtime (trio): supervised ShellBolt/ShellSpout processes,
topologies and the acker. Imported as ``multilang.shellbolt``.

Names load on first use (PEP 562), so the pure modules (``acker``,
``grouping``, ``topology``, ``conf``) import without trio: the Spark
source's driver-side code reads the conf schema without starting an
event-loop library.
"""

from __future__ import annotations

import importlib
from typing import Any

from multilang.component import release_stdout

release_stdout()  # a host: its stdout is its own

__all__ = [
    "TopologyBuilder",
    "Topology",
    "ShellBolt",
    "ShellSpout",
    "PythonBolt",
    "PythonSpout",
    "OutputSpec",
    "load_topology",
    "Runtime",
    "RunResult",
    "ComponentStats",
    "Acker",
    "fields_task_index",
    "DEFAULT_CONF",
]

_HOME = {
    "Acker": "acker",
    "fields_task_index": "grouping",
    "Runtime": "runtime",
    "RunResult": "results",
    "ComponentStats": "results",
    **{name: "topology" for name in ("DEFAULT_CONF", "OutputSpec", "PythonBolt", "PythonSpout", "ShellBolt",
                                     "ShellSpout", "Topology", "TopologyBuilder", "load_topology")},
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'multilang.shellbolt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
