"""What the user asks for, and the vocabulary of the answer: the public
names, errors and dead-letter records of :mod:`multilang.adapters.spark`, the
options (``_Options``) and the picklable ``_Spec`` of what runs in each
partition, built from a command, bolt, chain or ``TopologyBuilder``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Sequence

import orjson

from multilang.errors import ComponentCrashed, MultilangError, TopologyError
from multilang.messages import DEFAULT_STREAM
from multilang.shellbolt import (ANY_FIELDS, Input, PythonBolt, PythonSpout, ShellBolt, Topology, TopologyBuilder)

from .ship import executor_name, ship, unpacked, with_libraries


#: The source the bolts of a spec subscribe to: one tuple per input row.
INPUT = "input"
#: Columns added by ``dead_letter="column"``.
DEAD_LETTER_COLUMNS = ("_status", "_input", "_error")


# --- errors -----------------------------------------------------------------------------


class RowFailed(MultilangError):
    """An input row's tree failed more than ``max_retries`` times."""


class OutputSchemaError(MultilangError):
    """A bolt emitted a tuple that does not fit the declared output schema."""


class StatefulBoltCrashed(ComponentCrashed):
    """A process of a ``stateful`` spec died mid-partition: its state is lost,
    so the Spark task fails and Spark reruns the partition."""


class DeadLetter(NamedTuple):
    """A row given up on (``dead_letter="record"``): its values, why, and
    how many of its attempts failed for its own cause (a try in flight
    beside a crash it did not cause is not one: docs/SPARK.md)."""

    input: list[Any]
    error: str
    attempts: int
    source: str = INPUT
    stream: str = DEFAULT_STREAM


# --- what runs in a partition -----------------------------------------------------------


@dataclass
class _Options:
    max_retries: int = 3
    dead_letter: str | None = None  # None | "column" | "record"
    ordered: bool = False
    warm: bool = True
    stateful: bool = False
    max_in_flight: int = 1000
    batch_size: int = 512
    idle_timeout: float = 60.0
    #: items are (values, key): outputs and dead letters carry the key (``keep`` columns)
    keyed: bool = False
    #: ship ``resource_dir`` to the executors (ship.py); False: it is at the same path there already
    ship: bool = True


@dataclass
class _Spec:
    """A picklable description of the mini topology run in each partition."""

    sources: dict[str, dict[str, list[str]]]  # spout name -> stream -> fields (fed by rows)
    bolts: list[tuple[str, Any, int, list[Input], dict[str, Any]]]
    conf: dict[str, Any]
    resource_dir: str
    outputs: list[tuple[str, str]]  # (component, stream) released as output
    key: str = ""
    #: the archive ``resource_dir`` was shipped as (ship.py): commands run in its unpacked copy on the
    #: executors; None: in ``resource_dir`` itself (``ship=False``: the folder is there already)
    shipped: str | None = None

    @property
    def single_source(self) -> tuple[str, str] | None:
        if len(self.sources) == 1:
            (name, streams), = self.sources.items()
            if len(streams) == 1:
                return name, next(iter(streams))
        return None

    def ship(self, spark: Any, exclude: Sequence[str] = ()) -> None:
        """Hand ``resource_dir`` to ``spark``'s executors (ship.py): commands run in the shipped copy."""
        self.use_archive(ship(spark, self.resource_dir, exclude))

    def use_archive(self, name: str) -> None:
        """Commands run in the unpacked copy of the shipped archive ``name`` (a warm process of
        another copy is not reused: the key changes)."""
        self.shipped = name
        self.key = _spec_key(self)

    def topology(self, *, on_worker: bool = False) -> Topology:
        """The partition's topology; ``on_worker``: as an executor runs it,
        in the shipped copy of ``resource_dir``, every command checked (a
        missing script or interpreter names this executor)."""
        resource_dir = unpacked(self.shipped) if on_worker and self.shipped else self.resource_dir
        b = TopologyBuilder()
        for name, streams in self.sources.items():
            b.set_spout(name, PythonSpout([], streams=streams))
        for name, impl, par, inputs, conf in self.bolts:
            if on_worker and isinstance(impl, ShellBolt):
                env = with_libraries(resource_dir, impl.env) if self.shipped else impl.env
                if not _has_locale(env):
                    env = {**(env or {}), "LANG": "C.UTF-8"}
                impl = replace(impl, env=env)
            d = b.set_bolt(name, impl, par, conf)
            for i in inputs:
                d.grouping(i.source, i.grouping, i.stream, i.fields)
        topo = b.create_topology(self.conf, name="spark-partition", resource_dir=resource_dir)
        if on_worker:
            for c in topo.components.values():
                if c.is_shell:
                    try:
                        topo.resolve_command(c)
                    except TopologyError as exc:
                        raise TopologyError(f"on executor {executor_name()}: {exc}") from None
        return topo

    def fields_of(self, component: str, stream: str) -> list[str]:
        for name, impl, *_ in self.bolts:
            if name == component:
                return impl.outputs[stream]
        return self.sources[component][stream]


def _has_locale(extra: dict[str, str] | None) -> bool:
    keys = ("LANG", "LC_ALL", "LC_CTYPE")
    return any(os.environ.get(k) for k in keys) or any((extra or {}).get(k) for k in keys)


_INTERPRETERS = {"python", "python3", "ruby", "node", "nodejs", "perl", "bash", "sh", "php", "Rscript", "deno",
                 "bun", "java"}


def _stem(command: list[str]) -> str:
    """A component name from a command: the script after an interpreter
    (``ruby split_bolt.rb`` -> ``split_bolt``), else the program."""
    base = os.path.basename(command[0])
    if base in _INTERPRETERS or base.startswith("python"):
        for arg in command[1:]:
            if not arg.startswith("-"):
                base = os.path.splitext(os.path.basename(arg))[0]
                break
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", base).lstrip("_") or "bolt"
    return base


def _as_bolt(item: Any, fields: Sequence[str] | None, cwd: str | None, env: dict[str, str] | None) -> Any:
    if isinstance(item, (ShellBolt, PythonBolt)):
        if item.fields is None and not item.streams:
            return replace(item, fields=list(ANY_FIELDS))
        return item
    if isinstance(item, str):
        item = shlex.split(item)
    if isinstance(item, (list, tuple)) and item and all(isinstance(a, str) for a in item):
        return ShellBolt(list(item), fields=list(fields) if fields else list(ANY_FIELDS), cwd=cwd, env=env)
    raise TopologyError(
        f"cannot run {item!r} as a bolt: give a command (argv list or string), a ShellBolt or PythonBolt, "
        "a list of those (a chain), or a TopologyBuilder whose bolts subscribe to 'input'"
    )


def _is_single(spec: Any) -> bool:
    return isinstance(spec, (str, ShellBolt, PythonBolt)) or (
        isinstance(spec, (list, tuple)) and bool(spec) and all(isinstance(a, str) for a in spec)
    )


def _spec_key(spec: _Spec) -> str:
    def impl_doc(impl: Any) -> Any:
        if isinstance(impl, ShellBolt):
            return {"command": impl.command, "outputs": impl.outputs, "cwd": impl.cwd, "env": impl.env}
        from pyspark import cloudpickle

        return {"fn": hashlib.sha256(cloudpickle.dumps(impl.fn)).hexdigest(), "outputs": impl.outputs}

    doc = {
        "sources": spec.sources,
        "bolts": [[n, impl_doc(i), p, [[x.source, x.stream, x.grouping, x.fields] for x in ins], c]
                  for n, i, p, ins, c in spec.bolts],
        "conf": spec.conf,
        "dir": spec.resource_dir,
        "shipped": spec.shipped,
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS, default=repr).decode()


def _partition_conf(conf: dict[str, Any] | None, max_in_flight: int) -> dict[str, Any]:
    """The conf of a partition's runtime: ``conf``, where a bolt process may
    hold as many tuples as the partition has rows in flight (docs/SPARK.md,
    "The sync/trio seam"), not Storm's 100, unless it says else."""
    full = dict(conf or {})
    full.setdefault("topology.shellbolt.max.pending", max_in_flight)
    return full


def _make_spec(
    spec: Any, *, fields: Sequence[str] | None, input_fields: Sequence[str] | None, output: Any,
    conf: dict[str, Any] | None, resource_dir: str | os.PathLike[str] | None, cwd: str | None,
    env: dict[str, str] | None, max_in_flight: int,
) -> _Spec:
    in_fields = list(input_fields) if input_fields else list(ANY_FIELDS)
    if isinstance(fields, str):
        if "," in fields:
            raise ValueError(f"fields must be a list of names, e.g. {[f.strip() for f in fields.split(',')]!r}, "
                             f"got the string {fields!r}")
        fields = [fields]
    if fields is not None and (not isinstance(fields, (list, tuple))
                               or not all(isinstance(f, str) and f for f in fields)):
        raise TypeError(f"fields must be a list of non-empty field names, e.g. ['word', 'count'], got {fields!r}")
    bolts: list[tuple[str, Any, int, list[Input], dict[str, Any]]] = []
    if isinstance(spec, TopologyBuilder):
        for c in spec._components.values():  # noqa: SLF001 - same project
            if c.kind == "spout":
                raise TopologyError(
                    f"spout {c.name!r}: a Spark bolt spec has no spouts; its bolts subscribe to {INPUT!r}, "
                    "the rows of the partition"
                )
            for i in c.inputs:
                if i.source == INPUT and i.stream != DEFAULT_STREAM:
                    raise TopologyError(f"bolt {c.name!r}: the rows arrive on stream 'default' of {INPUT!r}")
            bolts.append((c.name, _as_bolt(c.impl, None, cwd, env), c.parallelism, list(c.inputs), dict(c.conf)))
        if not any(i.source == INPUT for _, _, _, ins, _ in bolts for i in ins):
            raise TopologyError(f"no bolt subscribes to {INPUT!r}, the rows of the partition; declare e.g. "
                                f".shuffle_grouping({INPUT!r}) on the first bolt")
    else:
        items = [spec] if _is_single(spec) else list(spec)
        if not items:
            raise TopologyError("no bolts given")
        taken: set[str] = {INPUT}
        prev = INPUT
        for n, item in enumerate(items):
            name = None
            if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and not isinstance(item[1], str)):
                name, item = item
            last = n == len(items) - 1
            bolt = _as_bolt(item, fields if last else None, cwd, env)
            if name is None:
                base = _stem(bolt.command) if isinstance(bolt, ShellBolt) else getattr(bolt.fn, "__name__", "bolt")
                name, k = base, 2
                while name in taken:
                    name, k = f"{base}_{k}", k + 1
            taken.add(name)
            bolts.append((name, bolt, 1, [Input(prev, DEFAULT_STREAM, "local_or_shuffle")], {}))
            prev = name
    full_conf = _partition_conf(conf, max_in_flight)
    full_conf.setdefault("topology.max.spout.pending", max_in_flight)
    s = _Spec({INPUT: {DEFAULT_STREAM: in_fields}}, bolts, full_conf,
              str(os.fspath(resource_dir) if resource_dir is not None else os.getcwd()), [])
    topo = s.topology()  # validates (TopologyError names the component)
    s.outputs = _select_outputs(topo, output)
    s.key = _spec_key(s)
    return s


def _select_outputs(topo: Topology, output: Any) -> list[tuple[str, str]]:
    """The (component, stream) pairs nobody subscribes to, filtered by ``output``
    (a component name or a (component, stream) pair)."""
    want_comp, want_stream = (output, None) if isinstance(output, str) or output is None else tuple(output)
    found = []
    for c in topo.components.values():
        if c.kind == "spout":
            continue
        for stream in c.outputs:
            if topo.subscribers(c.name, stream):
                continue
            if want_comp is not None and c.name != want_comp:
                continue
            if want_stream is not None and stream != want_stream:
                continue
            found.append((c.name, stream))
    if not found:
        raise TopologyError(f"no output stream selected (output={output!r}): every stream of every bolt is consumed "
                            "by another bolt, or the named component/stream does not exist")
    return found


def _options(max_retries: int, dead_letter: str | None, ordered: bool, warm: bool, stateful: bool,
             max_in_flight: int, batch_size: int, idle_timeout: float, allowed: tuple[str, ...],
             ship: bool = True) -> _Options:
    if dead_letter in ("raise",):
        dead_letter = None
    if dead_letter is not None and dead_letter not in allowed:
        raise ValueError(f"dead_letter must be None (raise) or {' or '.join(map(repr, allowed))}, got {dead_letter!r}")
    if max_retries < 0 or max_in_flight < 1 or batch_size < 1:
        raise ValueError("max_retries must be >= 0, max_in_flight and batch_size >= 1")
    return _Options(max_retries, dead_letter, ordered, warm, stateful, max_in_flight, batch_size, idle_timeout,
                    ship=bool(ship))


def _short(values: Any, limit: int = 200) -> str:
    text = orjson.dumps(values, default=repr).decode()
    return text if len(text) <= limit else text[:limit] + "..."
