"""Topologies: a builder Storm users recognise, a TOML file format, validation.

    builder = TopologyBuilder()
    builder.set_spout("sentences", ShellSpout(["python", "sentence_spout.py", "text.txt"], fields=["sentence"]))
    builder.set_bolt("split", ShellBolt(["ruby", "split_bolt.rb"], fields=["word"]), parallelism=2) \\
        .shuffle_grouping("sentences")
    builder.set_bolt("count", ShellBolt(["node", "count_bolt.js"], fields=["word", "count"]), parallelism=2) \\
        .fields_grouping("split", ["word"])
    topology = builder.create_topology(conf={"topology.max.spout.pending": 200})

Everything is checked when the topology is built; problems raise
``TopologyError`` naming the component and what to change. Task ids are
assigned as Storm does: components sorted by id, tasks numbered from 1.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from multilang.errors import TopologyError
from multilang.messages import DEFAULT_STREAM, TopologyContext

from .grouping import GROUPINGS

__all__ = [
    "ShellBolt",
    "ShellSpout",
    "PythonBolt",
    "PythonSpout",
    "TopologyBuilder",
    "BoltDeclarer",
    "Topology",
    "ComponentDef",
    "Input",
    "OutputSpec",
    "load_topology",
    "DEFAULT_CONF",
    "ANY_FIELDS",
]

#: Declared output fields that accept tuples of any length (``multilang pipe``).
ANY_FIELDS = ["*"]

#: Storm's defaults for the keys this runtime honours, plus our own (spec §1.3, §2.4, §5, §8.2).
DEFAULT_CONF: dict[str, Any] = {
    "topology.message.timeout.secs": 30,
    "topology.max.spout.pending": None,  # None: unbounded, as in Storm
    "topology.acker.executors": None,  # None: acking on; 0: reliability off (§7.5)
    "topology.shellbolt.max.pending": 100,
    "topology.subprocess.timeout.secs": None,
    "supervisor.worker.timeout.secs": 30,
    "topology.tick.tuple.freq.secs": None,
    "multilang.max.frame.bytes": 64 * 1024 * 1024,
    "multilang.handshake.timeout.secs": 30,
    "multilang.heartbeat.interval.secs": 1.0,
    "multilang.restart.budget": 5,
    "multilang.restart.window.secs": 60,
    "multilang.shutdown.grace.secs": 5,
    "multilang.kill.grace.secs": 2,
    "multilang.hold.emits.until.ack": False,
    "multilang.extensions": ["batch"],  # offered at the handshake (§9.1); [] = standard protocol only
}


# --- components ----------------------------------------------------------------


def _streams(fields: Iterable[str] | None, streams: Mapping[str, Iterable[str]] | None) -> dict[str, list[str]]:
    out = {k: list(v) for k, v in (streams or {}).items()}
    if fields is not None:
        out.setdefault(DEFAULT_STREAM, list(fields))
    return out


@dataclass
class ShellBolt:
    """A bolt run as a subprocess speaking multilang (Storm's ``ShellBolt``).

    ``command`` is an argv list (no shell). ``fields`` declares the default
    stream's output fields; ``streams`` declares named streams."""

    command: list[str]
    fields: list[str] | None = None
    streams: dict[str, list[str]] | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None

    @property
    def outputs(self) -> dict[str, list[str]]:
        return _streams(self.fields, self.streams)


@dataclass
class ShellSpout(ShellBolt):
    """A spout run as a subprocess speaking multilang (Storm's ``ShellSpout``)."""


@dataclass
class PythonBolt:
    """An in-process bolt: ``fn(values) -> iterable of output value lists``.

    Outputs are anchored to the input, which is acked when ``fn`` returns and
    failed if it raises (the ``BasicBolt`` contract)."""

    fn: Callable[[list[Any]], Iterable[list[Any]] | None]
    fields: list[str] | None = None
    streams: dict[str, list[str]] | None = None

    @property
    def outputs(self) -> dict[str, list[str]]:
        return _streams(self.fields, self.streams)


@dataclass
class PythonSpout:
    """An in-process spout over an iterable of value lists. Each item is a
    reliable emit; failed items are replayed."""

    source: Iterable[list[Any]] | Callable[[], Iterable[list[Any]]]
    fields: list[str] | None = None
    streams: dict[str, list[str]] | None = None

    @property
    def outputs(self) -> dict[str, list[str]]:
        return _streams(self.fields, self.streams)


@dataclass
class Input:
    source: str
    stream: str
    grouping: str
    fields: list[str] = field(default_factory=list)


@dataclass
class ComponentDef:
    name: str
    kind: str  # "spout" | "bolt"
    impl: ShellBolt | PythonBolt | PythonSpout
    parallelism: int = 1
    inputs: list[Input] = field(default_factory=list)
    conf: dict[str, Any] = field(default_factory=dict)
    tasks: list[int] = field(default_factory=list)

    @property
    def is_shell(self) -> bool:
        return isinstance(self.impl, ShellBolt)

    @cached_property
    def outputs(self) -> dict[str, list[str]]:
        """Declared output streams -> fields (computed once: read per emit)."""
        return self.impl.outputs


@dataclass
class OutputSpec:
    """Where a run's results come from: tuples no component subscribes to.

    ``component``/``stream`` restrict which (default: all unsubscribed
    streams); ``key`` keeps only the last tuple per key and prints those when
    the run ends (a running word count's final counts)."""

    component: str | None = None
    stream: str | None = None
    key: list[str] | None = None


class BoltDeclarer:
    """Returned by :meth:`TopologyBuilder.set_bolt`; declares its inputs."""

    def __init__(self, comp: ComponentDef) -> None:
        self._comp = comp

    def _add(self, source: str, stream: str, grouping: str, fields: Iterable[str] = ()) -> "BoltDeclarer":
        self._comp.inputs.append(Input(source, stream, grouping, list(fields)))
        return self

    def shuffle_grouping(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self._add(source, stream, "shuffle")

    def local_or_shuffle_grouping(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self._add(source, stream, "local_or_shuffle")

    def fields_grouping(self, source: str, fields: Iterable[str], stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self._add(source, stream, "fields", fields)

    def all_grouping(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self._add(source, stream, "all")

    def global_grouping(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self._add(source, stream, "global")

    def none_grouping(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self._add(source, stream, "none")

    def direct_grouping(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self._add(source, stream, "direct")

    def grouping(self, source: str, kind: str, stream: str = DEFAULT_STREAM, fields: Iterable[str] = ()) -> "BoltDeclarer":
        """Any grouping by name (``shuffle``, ``fields``, ``all``, ``global``, ...)."""
        return self._add(source, stream, kind, fields)

    def add_configuration(self, key: str, value: Any) -> "BoltDeclarer":
        self._comp.conf[key] = value
        return self


class TopologyBuilder:
    """Build a topology the way Storm's ``TopologyBuilder`` does."""

    def __init__(self) -> None:
        self._components: dict[str, ComponentDef] = {}

    def _set(self, name: str, kind: str, impl: Any, parallelism: int, conf: Mapping[str, Any] | None) -> ComponentDef:
        if name in self._components:
            raise TopologyError(f"component {name!r} is defined twice")
        comp = ComponentDef(name, kind, impl, parallelism, conf=dict(conf or {}))
        self._components[name] = comp
        return comp

    def set_spout(
        self, name: str, spout: ShellSpout | PythonSpout, parallelism: int = 1, conf: Mapping[str, Any] | None = None
    ) -> BoltDeclarer:
        return BoltDeclarer(self._set(name, "spout", spout, parallelism, conf))

    def set_bolt(
        self, name: str, bolt: ShellBolt | PythonBolt, parallelism: int = 1, conf: Mapping[str, Any] | None = None
    ) -> BoltDeclarer:
        return BoltDeclarer(self._set(name, "bolt", bolt, parallelism, conf))

    def create_topology(
        self, conf: Mapping[str, Any] | None = None, *, name: str = "topology", output: OutputSpec | None = None,
        resource_dir: str | os.PathLike[str] | None = None,
    ) -> "Topology":
        topo = Topology(name, dict(self._components), {**DEFAULT_CONF, **(conf or {})}, output or OutputSpec(),
                        Path(resource_dir or os.getcwd()))
        topo.validate()
        return topo


# --- the built topology -----------------------------------------------------------


@dataclass
class Topology:
    name: str
    components: dict[str, ComponentDef]
    conf: dict[str, Any]
    output: OutputSpec
    resource_dir: Path

    def validate(self) -> None:
        """Check everything a run would trip over; assign task ids."""
        if not self.components:
            raise TopologyError("the topology has no components")
        if not any(c.kind == "spout" for c in self.components.values()):
            raise TopologyError("the topology has no spout")
        for c in self.components.values():
            self._validate_component(c)
        # Task ids as Storm assigns them: components sorted by id, from 1.
        next_task = 1
        for name in sorted(self.components):
            c = self.components[name]
            c.tasks = list(range(next_task, next_task + c.parallelism))
            next_task += c.parallelism
        out = self.output
        if out.component is not None:
            comp = self.components.get(out.component)
            if comp is None:
                raise TopologyError(f"output component {out.component!r} is not in the topology")
            stream = out.stream or DEFAULT_STREAM
            if stream not in comp.outputs:
                raise TopologyError(f"output: component {out.component!r} declares no stream {stream!r}")
            missing = [f for f in out.key or [] if f not in comp.outputs[stream]]
            if missing:
                raise TopologyError(
                    f"output key {missing} not among the fields {comp.outputs[stream]} of {out.component!r}/{stream}"
                )

    def _validate_component(self, c: ComponentDef) -> None:
        where = f"{c.kind} {c.name!r}"
        if not c.name or c.name.startswith("__"):
            raise TopologyError(f"{where}: component ids must be non-empty and not start with '__' (reserved by Storm)")
        if type(c.parallelism) is not int or c.parallelism < 1:
            raise TopologyError(f"{where}: parallelism must be a positive integer, got {c.parallelism!r}")
        if isinstance(c.impl, ShellBolt):
            cmd = c.impl.command
            if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
                raise TopologyError(f"{where}: command must be a non-empty list of strings (an argv, no shell)")
        if c.kind == "spout" and c.inputs:
            raise TopologyError(f"{where}: spouts take no inputs")
        if c.kind == "spout" and isinstance(c.impl, PythonBolt):
            raise TopologyError(f"{where}: a PythonBolt cannot be a spout")
        if c.kind == "bolt" and isinstance(c.impl, PythonSpout):
            raise TopologyError(f"{where}: a PythonSpout cannot be a bolt")
        if c.kind == "bolt" and not c.inputs:
            raise TopologyError(f"{where}: has no inputs; declare e.g. .shuffle_grouping('<source>')")
        for stream, fields in c.outputs.items():
            if len(set(fields)) != len(fields):
                raise TopologyError(f"{where}: stream {stream!r} declares duplicate fields {fields}")
        for inp in c.inputs:
            src = self.components.get(inp.source)
            if src is None:
                raise TopologyError(f"{where}: input from unknown component {inp.source!r}")
            if inp.stream not in src.outputs:
                raise TopologyError(
                    f"{where}: subscribes to stream {inp.stream!r} of {inp.source!r}, which declares only "
                    f"{sorted(src.outputs) or 'no streams'}"
                )
            if inp.grouping not in GROUPINGS:
                raise TopologyError(f"{where}: unknown grouping {inp.grouping!r}; use one of {sorted(GROUPINGS)}")
            if inp.grouping == "fields":
                if not inp.fields:
                    raise TopologyError(f"{where}: fields grouping on {inp.source!r} needs at least one field")
                bad = [f for f in inp.fields if f not in src.outputs[inp.stream]]
                if bad:
                    raise TopologyError(
                        f"{where}: fields grouping on {bad}, but {inp.source!r}/{inp.stream} has fields "
                        f"{src.outputs[inp.stream]}"
                    )

    # -- derived views -------------------------------------------------------------

    def conf_for(self, name: str) -> dict[str, Any]:
        return {**self.conf, **self.components[name].conf}

    def task_to_component(self) -> dict[int, str]:
        return {t: c.name for c in self.components.values() for t in c.tasks}

    def subscribers(self, source: str, stream: str) -> list[tuple[ComponentDef, Input]]:
        return [
            (c, i) for c in self.components.values() for i in c.inputs if i.source == source and i.stream == stream
        ]

    def context_for(self, name: str, task: int) -> TopologyContext:
        """The handshake context of one task (spec §2.2)."""
        comp = self.components[name]

        def grouping_json(inp: Input) -> dict[str, Any]:
            fields = [] if inp.grouping == "global" else list(inp.fields)
            g: dict[str, Any] = {"type": GROUPINGS[inp.grouping]}
            if GROUPINGS[inp.grouping] == "FIELDS":
                g["fields"] = fields
            return g

        targets: dict[str, dict[str, dict[str, Any]]] = {}
        for stream in comp.outputs:
            for sub, inp in self.subscribers(name, stream):
                targets.setdefault(stream, {})[sub.name] = grouping_json(inp)
        sources: dict[str, dict[str, dict[str, Any]]] = {}
        source_fields: dict[str, dict[str, list[str]]] = {}
        for inp in comp.inputs:
            sources.setdefault(inp.source, {})[inp.stream] = grouping_json(inp)
            source_fields.setdefault(inp.source, {})[inp.stream] = self.components[inp.source].outputs[inp.stream]
        return TopologyContext(
            task_id=task,
            component_id=name,
            task_to_component=self.task_to_component(),
            streams=list(comp.outputs),
            stream_to_output_fields=comp.outputs,
            stream_to_target_to_grouping=targets,
            source_to_stream_to_grouping=sources,
            source_to_stream_to_fields=source_fields,
        )

    def resolve_command(self, comp: ComponentDef) -> tuple[list[str], str, dict[str, str]]:
        """argv, cwd and environment of a shell component.

        A leading ``python`` or ``python3`` means this interpreter
        (``sys.executable``), so a component that imports ``multilang`` runs
        with the same installation as the host. Extra env vars are added to
        the inherited environment, never replace it (§2.1)."""
        impl = comp.impl
        assert isinstance(impl, ShellBolt)
        argv = list(impl.command)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        cwd = str((self.resource_dir / impl.cwd) if impl.cwd else self.resource_dir)
        env = dict(os.environ)
        env.update(impl.env or {})
        if shutil.which(argv[0], path=env.get("PATH")) is None and not os.path.exists(os.path.join(cwd, argv[0])):
            raise TopologyError(f"{comp.kind} {comp.name!r}: command {argv[0]!r} not found on PATH")
        return argv, cwd, env


# --- TOML ---------------------------------------------------------------------------


def load_topology(path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None) -> Topology:
    """Load a topology file (TOML). Commands run in the file's directory.

    Format (see examples/wordcount.toml)::

        [topology]
        name = "wordcount"
        [topology.conf]
        "topology.max.spout.pending" = 200

        [spouts.sentences]
        command = ["python", "python/sentence_spout.py", "data/text.txt"]
        fields = ["sentence"]

        [bolts.split]
        command = ["ruby", "ruby/split_bolt.rb"]
        fields = ["word"]
        parallelism = 2
        inputs = [{ source = "sentences", grouping = "shuffle" }]

        [output]
        component = "count"
        key = ["word"]
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise TopologyError(f"topology file {str(path)!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{path}: not valid TOML: {exc}") from None
    known = {"topology", "spouts", "bolts", "output"}
    unknown = set(doc) - known
    if unknown:
        raise TopologyError(f"{path}: unknown top-level table(s) {sorted(unknown)}; expected {sorted(known)}")
    top = doc.get("topology", {})
    builder = TopologyBuilder()
    for kind in ("spouts", "bolts"):
        for name, spec in doc.get(kind, {}).items():
            where = f"{path}: {kind[:-1]} {name!r}"
            if not isinstance(spec, dict):
                raise TopologyError(f"{where}: must be a table")
            allowed = {"command", "fields", "streams", "parallelism", "inputs", "conf", "cwd", "env"}
            extra = set(spec) - allowed
            if extra:
                raise TopologyError(f"{where}: unknown key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
            if "command" not in spec:
                raise TopologyError(f"{where}: needs a 'command' (an argv list)")
            cls = ShellSpout if kind == "spouts" else ShellBolt
            impl = cls(spec["command"], spec.get("fields"), spec.get("streams"), spec.get("cwd"), spec.get("env"))
            if impl.fields is None and not impl.streams:
                raise TopologyError(f"{where}: declare its output with 'fields' (default stream) or 'streams'")
            setter = builder.set_spout if kind == "spouts" else builder.set_bolt
            decl = setter(name, impl, spec.get("parallelism", 1), spec.get("conf"))
            for inp in spec.get("inputs", []):
                if not isinstance(inp, dict) or "source" not in inp:
                    raise TopologyError(f"{where}: each input needs a 'source'")
                decl.grouping(inp["source"], inp.get("grouping", "shuffle"), inp.get("stream", DEFAULT_STREAM),
                              inp.get("fields", ()))
    out = doc.get("output", {})
    output = OutputSpec(out.get("component"), out.get("stream"), out.get("key"))
    conf = dict(top.get("conf", {}))
    conf.update(overrides or {})
    return builder.create_topology(conf, name=top.get("name", path.stem), output=output, resource_dir=path.parent.resolve())
