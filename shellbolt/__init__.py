"""The host runtime (trio): supervised ShellBolt/ShellSpout processes,
topologies and the acker. Imported as ``multilang.shellbolt``."""

from .acker import Acker
from .executor import ComponentStats, Runtime, RunResult
from .grouping import fields_task_index
from .topology import (
    DEFAULT_CONF,
    OutputSpec,
    PythonBolt,
    PythonSpout,
    ShellBolt,
    ShellSpout,
    Topology,
    TopologyBuilder,
    load_topology,
)

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
