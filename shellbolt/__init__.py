"""The host runtime (trio): supervised ShellBolt/ShellSpout processes,
topologies and the acker. Imported as ``multilang.shellbolt``.

This module is the package's whole public surface; the work is done in
private subpackages, one layer each (DESIGN.md "Layout"):

* ``_model``: topologies, their TOML and Flux loaders, groupings, the
  acker, the conf schema, run results. Pure: no trio.
* ``_host``: one supervised component process (spawn, handshake, reaping),
  the restart policy, the supervision loop of a task.
* ``_runtime``: the runtime (routing, stopping), tasks, bolt and spout
  drivers, sinks, checkpoints and the state store.
* ``_observe``: the live view, metrics, rate-limited logs.
* ``_replay``: recording a run's frames and replaying them.
* ``_workers``: host workers (``topology.workers``): the tasks of a run
  dealt to several processes, their links, the main process's side.

Names load on first use (PEP 562), so the pure names (``Topology``,
``Acker``, the conf schema) import without trio: the Spark source's
driver-side code reads the conf schema without starting an event-loop
library. The names below are grouped by who uses them: topologies and runs
(users); the seam for engines (``multilang.adapters``: a task, a sink, a
process host, the state store); the CLI's.
"""

from __future__ import annotations

import importlib
from typing import Any

from multilang import release_stdout

release_stdout()  # a host: its stdout is its own

#: public name -> (private module, its name there)
_HOME: dict[str, tuple[str, str]] = {
    # topologies and runs
    **{n: ("_model.topology", n) for n in ("DEFAULT_CONF", "OutputSpec", "PythonBolt", "PythonSpout", "ShellBolt",
                                           "ShellSpout", "Topology", "TopologyBuilder", "load_topology", "Input",
                                           "ComponentDef", "ANY_FIELDS", "command_problem")},
    "load_flux": ("_model.flux", "load_flux"),
    "Grouping": ("_model.grouping", "Grouping"),
    "register_grouping": ("_model.grouping", "register_grouping"),
    "grouping_class": ("_model.grouping", "grouping_class"),
    "new_grouping": ("_model.grouping", "new_grouping"),
    "fields_task_index": ("_model.grouping", "fields_task_index"),
    "Acker": ("_model.acker", "Acker"),
    "roots_of": ("_model.acker", "roots_of"),
    **{n: ("_model.results", n) for n in ("RunResult", "ComponentStats", "hashable", "sort_key", "short_repr")},
    **{n: ("_model.conf", n) for n in ("SCHEMA", "ProcessConf", "check_value")},
    "Runtime": ("_runtime.runtime", "Runtime"),
    **{n: ("_workers.coordinator", n) for n in ("run_workers", "WorkersControl", "max_tuples_shares", "workers_for")},
    "ForkServer": ("_workers.forkserver", "ForkServer"),
    # the seam for engines: what a task, a sink and a process host offer
    **{n: ("_runtime.tasks", n) for n in ("Task", "SpoutTask", "Delivery", "plain_emit", "component_error")},
    "ShellBoltTask": ("_runtime.bolts", "ShellBoltTask"),
    "BoltSink": ("_runtime.sinks", "BoltSink"),
    **{n: ("_host.process", n) for n in ("ShellProcess", "Spawn", "spawn_child")},
    **{n: ("_host.supervisor", n) for n in ("GiveUp", "RestartPolicy", "Supervision")},
    "SpoutDriver": ("_host.spout_driver", "SpoutDriver"),
    "scratch_folder": ("_host.scratch", "make"),
    "child_pids": ("_host.pids", "children"),
    "process_cmdline": ("_host.pids", "cmdline"),
    **{n: ("_runtime.state_store", n) for n in ("Checkpoint", "StateStore", "provider_config")},
    **{n: ("_observe.ratelog", n) for n in ("RateLimitedLog", "kind_of")},
    "setup_logging": ("_observe.logs", "setup_logging"),
    "prepare_gc": ("_runtime.collector", "prepare_gc"),
    **{n: ("_observe.observe", n) for n in ("snapshot", "blank_row")},
    # the CLI's
    **{n: ("_host.scratch", n) for n in ("owner_tag", "owner_gone")},
    **{n: ("_observe.metrics", n) for n in ("CONSUMER_KEY", "MetricsReporter")},
    **{n: ("_replay.record", n) for n in ("Recorder", "RecordingError", "RecordingDamaged", "read_task")},
    "ReplayUsageError": ("_replay.replay", "ReplayUsageError"),
    "replay": ("_replay.replay", "replay"),
    "replay_select": ("_replay.replay", "select"),
    "replay_resolve_argv": ("_replay.replay", "resolve_argv"),
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'multilang.shellbolt' has no attribute {name!r}")
    module, attr = home
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
