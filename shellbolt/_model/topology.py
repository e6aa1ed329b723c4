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

import json
import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from multilang.errors import TopologyError
from multilang.messages import DEFAULT_STREAM, TopologyContext

from .conf import SCHEMA, check_conf, unknown_key_message
from .grouping import grouping_class

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
    "command_problem",
]

#: Declared output fields that accept tuples of any length (``multilang pipe``).
ANY_FIELDS = ["*"]

#: Storm's defaults for the keys this runtime honours, plus our own (spec §1.3,
#: §2.4, §5, §8.2): the schema's (conf.py), written there once. Not here: the
#: topology's name and the keys only the Flux loader reads.
DEFAULT_CONF: dict[str, Any] = {
    k.name: list(k.default) if isinstance(k.default, list) else k.default
    for k in SCHEMA.values() if not k.flux and k.name != "topology.name"
}

#: The most tasks one component may have (each shell task is a process).
MAX_PARALLELISM = 4096


# --- components ----------------------------------------------------------------


class _Declares:
    """The ``outputs`` of a component class below, from the ``fields`` and
    ``streams`` it declares. Not a dataclass: each component keeps its own
    first field first, so ``ShellBolt(command, fields)``,
    ``PythonBolt(fn, fields)`` and ``PythonSpout(source, fields)`` stay
    positional."""

    fields: list[str] | None
    streams: dict[str, list[str]] | None

    @property
    def outputs(self) -> dict[str, list[str]]:
        """Stream name -> output fields: ``streams``, and ``fields`` as the default stream's."""
        out = {k: list(v) for k, v in (self.streams or {}).items()}
        if self.fields is not None:
            out.setdefault(DEFAULT_STREAM, list(self.fields))
        return out


@dataclass
class ShellBolt(_Declares):
    """A bolt run as a subprocess speaking multilang (Storm's ``ShellBolt``).

    ``command`` is an argv list (no shell). ``fields`` declares the default
    stream's output fields; ``streams`` declares named streams."""

    command: list[str]
    fields: list[str] | None = None
    streams: dict[str, list[str]] | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None


@dataclass
class ShellSpout(ShellBolt):
    """A spout run as a subprocess speaking multilang (Storm's ``ShellSpout``)."""


@dataclass
class PythonBolt(_Declares):
    """An in-process bolt: ``fn(values) -> iterable of output value lists``.

    Outputs are anchored to the input, which is acked when ``fn`` returns and
    failed if it raises (the ``BasicBolt`` contract)."""

    fn: Callable[[list[Any]], Iterable[list[Any]] | None]
    fields: list[str] | None = None
    streams: dict[str, list[str]] | None = None


@dataclass
class PythonSpout(_Declares):
    """An in-process spout over an iterable of value lists. Each item is a
    reliable emit; failed items are replayed.

    ``source``: the iterable; or a callable that returns one, called once
    per task; or an object with a ``for_task(index)`` method, called with
    each task's index in its component (0-based), which gives a task the
    same items whichever host worker runs it. An iterator is shared: the
    tasks take turns at it (refused where they would run on several host
    workers, each with a copy). With ``--workers N`` the source goes to the
    workers by pickle: a class or a module-level function, not a lambda or
    a closure."""

    source: Iterable[list[Any]] | Callable[[], Iterable[list[Any]]]
    fields: list[str] | None = None
    streams: dict[str, list[str]] | None = None


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
        # A string is kept as is (not split into characters) for validate() to reject.
        if isinstance(fields, (list, tuple)):
            fields = list(fields)
        self._comp.inputs.append(Input(source, stream, grouping, fields))  # type: ignore[arg-type]
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
            first = self._components[name].kind
            how = f"as two {kind}s" if first == kind else f"as a {first} and as a {kind}"
            raise TopologyError(f"component {name!r} is defined twice: {how}; ids must be unique across spouts "
                                "and bolts")
        if not isinstance(name, str):
            raise TopologyError(f"component ids must be strings, got {name!r}")
        # A conf that is not a mapping is kept for validate() to report.
        comp = ComponentDef(name, kind, impl, parallelism,
                            conf=dict(conf) if isinstance(conf, Mapping) else ({} if conf is None else conf))
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
        resource_dir: str | os.PathLike[str] | None = None, source: str | None = None,
    ) -> "Topology":
        """The validated topology. ``source`` (a file name) prefixes every
        error message."""
        if conf is not None and not isinstance(conf, Mapping):
            raise TopologyError(f"{source + ': ' if source else ''}the topology conf must be a mapping of "
                                f"key -> value, got {conf!r}")
        topo = Topology(name, dict(self._components), {**DEFAULT_CONF, **(conf or {})}, output or OutputSpec(),
                        Path(resource_dir or os.getcwd()), source)
        topo.validate()
        return topo


# --- the built topology -----------------------------------------------------------


def _is_str_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)


def _check_field_names(fields: Iterable[str], where: str) -> None:
    """No empty field name: a tuple's values are read by name (fields
    groupings, ``[output] key``, ``tuple["word"]`` in a component)."""
    if any(f == "" for f in fields):
        raise TopologyError(f"{where}: field names must be non-empty strings, got {list(fields)!r}")


def _check_impl(impl: Any, where: str) -> None:
    """Types of a component's implementation (what a TOML table or a
    builder call may get wrong); a string is never taken as a list."""
    if not isinstance(impl, (ShellBolt, PythonBolt, PythonSpout)):
        raise TopologyError(f"{where}: expected a ShellSpout, ShellBolt, PythonSpout or PythonBolt, got {impl!r}")
    if impl.fields is not None and not _is_str_list(impl.fields):
        raise TopologyError(f"{where}: fields must be a list of field names (strings), got {impl.fields!r}")
    if impl.fields is not None:
        _check_field_names(impl.fields, f"{where}: fields")
    streams = impl.streams
    if streams is not None:
        if not isinstance(streams, Mapping):
            raise TopologyError(f"{where}: streams must be a table of stream name -> list of field names, "
                                f"got {streams!r}")
        for name, fields in streams.items():
            if not isinstance(name, str) or not name:
                raise TopologyError(f"{where}: stream names must be non-empty strings, got {name!r}")
            if not _is_str_list(fields):
                raise TopologyError(f"{where}: stream {name!r}: fields must be a list of field names (strings), "
                                    f"got {fields!r}")
            _check_field_names(fields, f"{where}: stream {name!r}: fields")
        if impl.fields is not None and DEFAULT_STREAM in streams and list(streams[DEFAULT_STREAM]) != list(impl.fields):
            raise TopologyError(f"{where}: the default stream is declared twice, by fields {list(impl.fields)} and by "
                                f"streams.{DEFAULT_STREAM} {list(streams[DEFAULT_STREAM])}; declare it once")
    if isinstance(impl, ShellBolt):
        cmd = impl.command
        if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd) or not cmd[0]:
            raise TopologyError(f"{where}: command must be a non-empty list of strings (an argv, no shell), "
                                f"got {cmd!r}")
        if impl.cwd is not None and not isinstance(impl.cwd, (str, os.PathLike)):
            raise TopologyError(f"{where}: cwd must be a string (a directory), got {impl.cwd!r}")
        env = impl.env
        if env is not None and (not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise TopologyError(f"{where}: env must be a table of NAME = \"value\" strings, got {env!r}")
        if env and any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
            raise TopologyError(f"{where}: env names must be non-empty without '=' and values without NUL")
    elif isinstance(impl, PythonBolt):
        if not callable(impl.fn):
            raise TopologyError(f"{where}: a PythonBolt needs a function, got {impl.fn!r}")
    elif not (callable(impl.source) or isinstance(impl.source, Iterable)
              or callable(getattr(impl.source, "for_task", None))):
        raise TopologyError(f"{where}: a PythonSpout needs an iterable, a function returning one or an object "
                            f"with a for_task(index) method returning one, got {impl.source!r}")


@dataclass
class Topology:
    name: str
    components: dict[str, ComponentDef]
    conf: dict[str, Any]
    output: OutputSpec
    resource_dir: Path
    #: The file the topology was loaded from, if any: errors name it.
    source: str | None = None

    def _at(self, where: str = "") -> str:
        """``where`` prefixed with the file name (if any)."""
        if not self.source:
            return where
        return f"{self.source}: {where}" if where else self.source

    def named(self, exc: TopologyError) -> TopologyError:
        """``exc`` named with the file the topology came from (if any and
        not named yet), as every topology error is."""
        if self.source and not str(exc).startswith(f"{self.source}:"):
            return TopologyError(f"{self.source}: {exc}")
        return exc

    def validate(self) -> None:
        """Check everything a run would trip over (names, types, the conf of
        the topology and of each component, wiring); assign task ids."""
        try:
            self._validate()
        except TopologyError as exc:
            raise self.named(exc) from None

    def _validate(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TopologyError(f"the topology name must be a non-empty string, got {self.name!r}")
        check_conf(self.conf, self._at() or "topology conf")
        if not self.components:
            raise TopologyError("the topology has no components")
        if not any(c.kind == "spout" for c in self.components.values()):
            raise TopologyError("the topology has no spout")
        for c in self.components.values():
            self._validate_component(c)
        self._check_reachable()
        # Task ids as Storm assigns them: components sorted by id, from 1.
        next_task = 1
        for name in sorted(self.components):
            c = self.components[name]
            c.tasks = list(range(next_task, next_task + c.parallelism))
            next_task += c.parallelism
        out = self.output
        for attr in ("component", "stream"):
            v = getattr(out, attr)
            if v is not None and not isinstance(v, str):
                raise TopologyError(f"output: {attr} must be a string, got {v!r}")
        if out.key is not None and not _is_str_list(out.key):
            raise TopologyError(f"output: key must be a list of field names, got {out.key!r}")
        if out.key is not None:
            _check_field_names(out.key, "output: key")
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
            takers = sorted({c.name for c in self.components.values()
                             for i in c.inputs if i.source == out.component and i.stream == stream})
            if takers:  # (a run would print nothing, and say nothing: a trial's keyed count did)
                raise TopologyError(
                    f"output: {out.component!r}/{stream} is subscribed by {', '.join(map(repr, takers))}: a run's "
                    "output is the tuples no component subscribes to; name a component whose emits nothing takes "
                    "(the last bolt)")

    def _validate_component(self, c: ComponentDef) -> None:
        where = f"{c.kind} {c.name!r}"
        if not c.name or c.name.startswith("__"):
            raise TopologyError(f"{where}: component ids must be non-empty and not start with '__' (reserved by Storm)")
        if type(c.parallelism) is not int or c.parallelism < 1:
            raise TopologyError(f"{where}: parallelism must be a positive integer, got {c.parallelism!r}")
        if c.parallelism > MAX_PARALLELISM:
            raise TopologyError(f"{where}: parallelism must be at most {MAX_PARALLELISM} (each task is a "
                                f"process), got {c.parallelism}")
        _check_impl(c.impl, where)
        check_conf(c.conf, self._at(where), component=True)
        for inp in c.inputs:
            for attr in ("source", "stream", "grouping"):
                v = getattr(inp, attr)
                if not isinstance(v, str):
                    raise TopologyError(f"{where}: input {attr} must be a string, got {v!r}")
            if not _is_str_list(inp.fields):
                raise TopologyError(f"{where}: input from {inp.source!r}: fields must be a list of field names, "
                                    f"got {inp.fields!r}")
            _check_field_names(inp.fields, f"{where}: input from {inp.source!r}: fields")
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
        seen: dict[tuple[str, str], str] = {}
        for inp in c.inputs:
            first = seen.get((inp.source, inp.stream))
            seen[(inp.source, inp.stream)] = inp.grouping
            if first is not None:
                raise TopologyError(f"{where}: subscribes to {inp.source!r}/{inp.stream} twice ({first} and "
                                    f"{inp.grouping} grouping): each tuple would arrive twice; Storm keeps one grouping "
                                    "per source stream, so remove one")
            src = self.components.get(inp.source)
            if src is None:
                raise TopologyError(f"{where}: input from unknown component {inp.source!r}")
            if inp.stream not in src.outputs:
                raise TopologyError(
                    f"{where}: subscribes to stream {inp.stream!r} of {inp.source!r}, which declares only "
                    f"{sorted(src.outputs) or 'no streams'}"
                )
            try:
                kind = grouping_class(inp.grouping)
            except TopologyError as e:
                raise TopologyError(f"{where}: {e}") from None
            if not kind.takes_fields and inp.fields:
                raise TopologyError(f"{where}: input from {inp.source!r}: fields {inp.fields} apply to the fields "
                                    f"grouping only, not {inp.grouping!r}")
            if kind.takes_fields:
                if not inp.fields:
                    raise TopologyError(f"{where}: {inp.grouping} grouping on {inp.source!r} needs at least one field")
                bad = [f for f in inp.fields if f not in src.outputs[inp.stream]]
                if bad:
                    raise TopologyError(
                        f"{where}: fields grouping on {bad}, but {inp.source!r}/{inp.stream} has fields "
                        f"{src.outputs[inp.stream]}"
                    )

    def cycle(self) -> list[str] | None:
        """A cycle of the topology's wiring as component names, the first
        repeated at the end (``["a", "b", "a"]``), or None. Storm allows
        cycles; a run names one, since a tuple that goes round it for ever
        keeps its tree from ever completing."""
        feeds: dict[str, list[str]] = {}
        for c in sorted(self.components.values(), key=lambda c: c.name):
            for inp in c.inputs:
                feeds.setdefault(inp.source, []).append(c.name)
        state: dict[str, int] = {}  # 1: on the path, 2: done
        path: list[str] = []

        def visit(name: str) -> list[str] | None:
            state[name] = 1
            path.append(name)
            for sub in feeds.get(name, ()):
                if state.get(sub) == 1:
                    return path[path.index(sub):] + [sub]
                if sub not in state and (found := visit(sub)) is not None:
                    return found
            path.pop()
            state[name] = 2
            return None

        for name in sorted(self.components):
            if name not in state and (found := visit(name)) is not None:
                return found
        return None

    def _check_reachable(self) -> None:
        """Every bolt must be reachable from a spout over inputs. Cycles are
        allowed (as in Storm), but a bolt fed only by itself, or by bolts that
        no spout feeds, would never receive a tuple: the run would end with
        no output and no error."""
        feeds: dict[str, set[str]] = {}
        for c in self.components.values():
            for inp in c.inputs:
                feeds.setdefault(inp.source, set()).add(c.name)
        reached = {n for n, c in self.components.items() if c.kind == "spout"}
        todo = list(reached)
        while todo:
            for sub in feeds.get(todo.pop(), ()):
                if sub not in reached:
                    reached.add(sub)
                    todo.append(sub)
        unreached = [c for c in self.components.values() if c.name not in reached]
        if not unreached:
            return
        c = unreached[0]
        sources = list(dict.fromkeys(inp.source for inp in c.inputs))
        msg = f"bolt {c.name!r} gets no input from any spout: its only inputs are {sources}"
        if sources != [c.name]:
            msg += ", which no spout reaches either"
        others = [o.name for o in unreached[1:]]
        if others:
            msg += f" (also unreachable: {others})"
        raise TopologyError(msg + "; subscribe it to a spout, or to a bolt that a spout feeds")

    # -- derived views -------------------------------------------------------------

    def conf_for(self, name: str) -> dict[str, Any]:
        """The conf a component's tasks get (its handshake's ``conf``, §2.2):
        the topology's, its own over it, and ``topology.name`` set as Storm's
        submitter sets it."""
        return {**self.conf, **self.components[name].conf, "topology.name": self.name}

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
            return grouping_class(inp.grouping).context_json(inp.fields)

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

    def check_commands(self) -> None:
        """Every shell component's command can run here (:meth:`resolve_command`):
        else a TopologyError naming each one that cannot, a line each (a
        trial fixed one missing command, ran again, and only then heard of
        the next)."""
        problems = []
        for comp in self.components.values():
            if comp.is_shell:
                try:
                    self.resolve_command(comp)
                except TopologyError as exc:
                    problems.append(str(exc))
        if problems:
            raise TopologyError("\n".join(problems))

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
        if not os.path.isdir(cwd):  # else every start fails with "No such file or directory": a crash loop
            what = "is not a directory" if os.path.exists(cwd) else "does not exist"
            if impl.cwd:
                msg = f"cwd {str(impl.cwd)!r} {what} ({cwd}; a cwd is relative to {self.resource_dir})"
            else:
                msg = f"the directory commands run in, {cwd}, {what}"
            raise TopologyError(self._at(f"{comp.kind} {comp.name!r}: {msg}"))
        env = dict(os.environ)
        env.update(impl.env or {})
        problem = command_problem(argv, cwd, env.get("PATH"))
        if problem is not None:
            raise TopologyError(self._at(f"{comp.kind} {comp.name!r}: {problem}"))
        return argv, cwd, env


def command_problem(argv: Sequence[str], cwd: str, path: str | None = None) -> str | None:
    """Why ``argv`` cannot run in ``cwd`` (a program not on ``path``, a
    directory, a file that is not executable, an interpreter's script that
    does not exist), or None. Checked before a process starts: else every
    start fails at once, a crash loop."""
    if shutil.which(argv[0], path=path) is None:
        where = os.path.join(cwd, argv[0])
        if not os.path.exists(where):
            return f"command {argv[0]!r} not found on PATH"
        if os.path.isdir(where) or not os.access(where, os.X_OK):
            what = "is a directory" if os.path.isdir(where) else "is not executable (chmod +x it, or name its " \
                "interpreter first, e.g. python script.py)"
            return f"command {argv[0]!r} {what}"
    script = _script_argument(list(argv))
    if script is not None and not os.path.exists(os.path.join(cwd, script)):
        return f"script {script!r} not found (commands run in {cwd})"
    return None


#: interpreters whose first plain argument is the script they run
_INTERPRETERS = ("python", "ruby", "node", "nodejs", "perl", "php", "bash", "sh", "Rscript", "deno", "bun")
_SCRIPT_SUFFIXES = (".py", ".rb", ".js", ".mjs", ".cjs", ".ts", ".pl", ".php", ".sh", ".r", ".R")


def _script_argument(argv: list[str]) -> str | None:
    """The script file an interpreter command names (``ruby split.rb``), or
    None (options first, ``-m``, ``-e``, or no script-like argument)."""
    name = os.path.basename(argv[0])
    if len(argv) < 2 or not (name.startswith(_INTERPRETERS) or argv[0] == sys.executable):
        return None
    first = argv[1]
    return first if first.endswith(_SCRIPT_SUFFIXES) and not first.startswith("-") else None


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
    except IsADirectoryError:
        raise TopologyError(f"{path} is a directory, not a topology file") from None
    except UnicodeDecodeError as exc:
        raise TopologyError(f"{path}: not valid TOML: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{path}: not valid TOML: {exc}") from None
    _check_keys(doc, _TOP_KEYS, f"{path}", "top-level table")
    top = _table(doc, "topology", f"{path}: [topology]")
    _check_keys(top, _TOPOLOGY_KEYS, f"{path}: [topology]", "key")
    name = top.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{path}: [topology] name must be a non-empty string, got {name!r}")
    conf = _table(top, "conf", f"{path}: [topology.conf]")
    if overrides:
        check_conf(overrides, f"{path}: conf overrides", warn=False)  # warned once, in the whole conf
    # Each part is checked under its own name: a -c override is not in the file.
    _no_flux_keys(conf, f"{path}: [topology.conf]")
    _no_flux_keys(overrides or {}, f"{path}: conf overrides")
    conf = {**conf, **(overrides or {})}

    builder = TopologyBuilder()
    spouts = _table(doc, "spouts", f"{path}: [spouts]")
    for kind in ("spouts", "bolts"):
        for cname, spec in _table(doc, kind, f"{path}: [{kind}]").items():
            where = f"{path}: {kind[:-1]} {cname!r}"
            if kind == "bolts" and cname in spouts:
                raise TopologyError(f"{path}: component {cname!r} is defined twice: as a spout "
                                    f"([spouts.{cname}]) and as a bolt ([bolts.{cname}]); ids must be unique "
                                    f"across spouts and bolts")
            if not isinstance(spec, dict):
                raise TopologyError(f"{where}: must be a table ([{kind}.{cname}] with command, fields, ...), "
                                    f"got {spec!r}")
            _check_keys(spec, _COMPONENT_KEYS, where, "key")
            if "command" not in spec:
                raise TopologyError(f"{where}: needs a 'command' (an argv list)")
            for key, check, what in _COMPONENT_TYPES:
                if key in spec and not check(spec[key]):
                    raise TopologyError(f"{where}: {key} must be {what}, got {spec[key]!r}")
            comp_conf = spec.get("conf", {})
            _no_flux_keys(comp_conf, where)
            cls = ShellSpout if kind == "spouts" else ShellBolt
            impl = cls(spec["command"], spec.get("fields"), spec.get("streams"), spec.get("cwd"), spec.get("env"))
            if impl.fields is None and not impl.streams:
                raise TopologyError(f"{where}: declare its output with 'fields' (default stream) or 'streams'")
            setter = builder.set_spout if kind == "spouts" else builder.set_bolt
            decl = setter(cname, impl, spec.get("parallelism", 1), comp_conf)
            inputs = spec.get("inputs", [])
            if kind == "bolts" and not inputs:  # said here in TOML's words; validate() says it in the builder's
                first = next(iter(spouts), "<spout>")
                raise TopologyError(f"{where}: has no inputs; add e.g. "
                                    f"inputs = [{{ source = {json.dumps(first)}, grouping = \"shuffle\" }}]")
            if not isinstance(inputs, list):
                raise TopologyError(f"{where}: inputs must be a list of {{ source = ..., grouping = ... }}, "
                                    f"got {inputs!r}")
            for n, inp in enumerate(inputs, 1):
                iwhere = f"{where}: input #{n}"
                if not isinstance(inp, dict):
                    raise TopologyError(f"{iwhere}: must be a table {{ source = ..., grouping = ... }}, got {inp!r}")
                _check_keys(inp, _INPUT_KEYS, iwhere, "key")
                if "source" not in inp:
                    raise TopologyError(f"{iwhere}: needs a 'source' (the id of a spout or bolt)")
                for key in ("source", "stream", "grouping"):
                    if key in inp and not isinstance(inp[key], str):
                        raise TopologyError(f"{iwhere}: {key} must be a string, got {inp[key]!r}")
                if "fields" in inp and not _is_str_list(inp["fields"]):
                    raise TopologyError(f"{iwhere}: fields must be a list of field names, e.g. [\"word\"], "
                                        f"got {inp['fields']!r}")
                decl.grouping(inp["source"], inp.get("grouping", "shuffle"), inp.get("stream", DEFAULT_STREAM),
                              inp.get("fields", ()))
    out = _table(doc, "output", f"{path}: [output]")
    _check_keys(out, _OUTPUT_KEYS, f"{path}: [output]", "key")
    for key in ("component", "stream"):
        if key in out and not isinstance(out[key], str):
            raise TopologyError(f"{path}: [output] {key} must be a string, got {out[key]!r}")
    if "key" in out and not _is_str_list(out["key"]):
        raise TopologyError(f"{path}: [output] key must be a list of field names, e.g. [\"word\"], "
                            f"got {out['key']!r}")
    output = OutputSpec(out.get("component"), out.get("stream"), out.get("key"))
    return builder.create_topology(conf, name=name, output=output, resource_dir=path.parent.resolve(),
                                   source=str(path))


_TOP_KEYS = {"topology", "spouts", "bolts", "output"}
_TOPOLOGY_KEYS = {"name", "conf"}
_COMPONENT_KEYS = {"command", "fields", "streams", "parallelism", "inputs", "conf", "cwd", "env"}
_INPUT_KEYS = {"source", "stream", "grouping", "fields"}
_OUTPUT_KEYS = {"component", "stream", "key"}


def _is_streams(v: Any) -> bool:
    return isinstance(v, dict) and all(_is_str_list(f) for f in v.values())


def _is_env(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


#: TOML component keys: check, what it must be (inputs and conf are checked on their own).
_COMPONENT_TYPES: list[tuple[str, Callable[[Any], bool], str]] = [
    ("command", lambda v: _is_str_list(v) and bool(v), "a non-empty list of strings (an argv, no shell)"),
    ("fields", _is_str_list, 'a list of field names, e.g. ["word"]'),
    ("streams", _is_streams, 'a table of stream name = list of field names, e.g. { errors = ["line"] }'),
    ("parallelism", lambda v: type(v) is int and v >= 1, "a positive integer"),
    ("conf", lambda v: isinstance(v, dict), "a table of conf key = value"),
    ("cwd", lambda v: isinstance(v, str), "a string (a directory, relative to the topology file)"),
    ("env", _is_env, 'a table of NAME = "value" strings'),
]


def _check_keys(table: Mapping[str, Any], known: set[str], where: str, what: str) -> None:
    extra = set(table) - known
    if extra:
        raise TopologyError(f"{where}: {unknown_key_message(extra, known, what)}")


def _table(parent: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    v = parent.get(key, {})
    if not isinstance(v, dict):
        raise TopologyError(f"{where}: must be a table, got {v!r}")
    return v


def _no_flux_keys(conf: Mapping[str, Any], where: str) -> None:
    hints = {
        "multilang.output.component": "use the [output] table",
        "multilang.output.stream": "use the [output] table",
        "multilang.output.key": "use the [output] table",
        "multilang.resource.dir": "commands run in the topology file's directory; give a component 'cwd'",
        "multilang.testwordspout.count": "TestWordSpout exists in Flux YAML files only",
        "multilang.testwordspout.seed": "TestWordSpout exists in Flux YAML files only",
    }
    for key in conf:
        if key in hints:
            raise TopologyError(f"{where}: conf key {key!r} applies to Flux YAML files only and would be "
                                f"ignored here; {hints[key]}")
