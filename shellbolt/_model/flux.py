"""Apache Storm Flux YAML topologies on the embedded runtime: ``load_flux(path)``
makes the same :class:`~multilang.shellbolt._model.topology.Topology` a
``TopologyBuilder`` makes. What is supported and what each Flux construct
becomes is the user manual in docs/FLUX.md (and docs/MIGRATION.md)."""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import yaml

from multilang.errors import TopologyError
from multilang.messages import DEFAULT_STREAM

from .conf import SCHEMA, check_value, did_you_mean, one_of, suggest, unknown_key_message
from .grouping import GROUPINGS
from .topology import OutputSpec, PythonBolt, PythonSpout, ShellBolt, ShellSpout, Topology, TopologyBuilder

__all__ = [
    "load_flux",
    "parse_properties",
    "substitute",
    "TEST_WORDS",
    "OUTPUT_TAP",
]

log = logging.getLogger("multilang.flux")

#: The words of Storm's ``org.apache.storm.testing.TestWordSpout``.
TEST_WORDS = ("nathan", "mike", "jackson", "golda", "bertels")

#: Name of the in-process component added to read a subscribed output stream.
OUTPUT_TAP = "multilang-output"

_FLUX_SHELL_SPOUT = "org.apache.storm.flux.wrappers.spouts.FluxShellSpout"
_FLUX_SHELL_BOLT = "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"
_STORM_SHELL_SPOUT = "org.apache.storm.spout.ShellSpout"
_STORM_SHELL_BOLT = "org.apache.storm.task.ShellBolt"
_LOG_INFO_BOLT = "org.apache.storm.flux.wrappers.bolts.LogInfoBolt"
_TEST_WORD_SPOUT = "org.apache.storm.testing.TestWordSpout"
_TEST_WORD_COUNTER = "org.apache.storm.testing.TestWordCounter"


_TOP_LEVEL = {"name", "includes", "config", "components", "spouts", "bolts", "streams", "topologySource",
              "workerHooks"}
_VERTEX_KEYS = {"id", "className", "constructorArgs", "configMethods", "properties", "parallelism", "numTasks",
                "config", "onHeapMemoryLoad", "offHeapMemoryLoad", "cpuLoad", "factory", "factoryArgs"}
# Storm resource hints: meaningless here, accepted so that files run unchanged.
_IGNORED_VERTEX_KEYS = {"onHeapMemoryLoad", "offHeapMemoryLoad", "cpuLoad"}
_INCLUDE_KEYS = {"resource", "file", "override"}
_STREAM_KEYS = {"name", "from", "to", "grouping"}
_GROUPING_KEYS = {"type", "args", "streamId", "customClass"}
_METHOD_KEYS = {"name", "args"}


def _check_keys(d: Mapping[Any, Any], known: set[str], where: str) -> None:
    extra = set(d) - known
    if extra:
        raise TopologyError(f"{where}: {unknown_key_message(extra, known)}")


def _ident(v: Any) -> str | None:
    """An id as Flux reads it (YAML may make ``1`` an int); None if it is no id."""
    if isinstance(v, str) and v:
        return v
    if type(v) is int:
        return str(v)
    return None


def _mapping(v: Any, where: str, what: str) -> dict[Any, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise TopologyError(f"{where}: {what} must be a mapping, got {v!r}")
    return v


def _list(v: Any, where: str, what: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise TopologyError(f"{where}: {what} must be a list, got {v!r}")
    return v


# --- substitution ---------------------------------------------------------------------------


def parse_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a Java ``.properties`` file (what ``flux --filter`` takes).

    ``key=value``, ``key: value`` and ``key value``; ``#`` and ``!`` comments;
    a trailing backslash continues a line; ``\\t``, ``\\n``, ``\\r``, ``\\f``,
    ``\\uXXXX`` and escaped separators are unescaped. The text is UTF-8, or
    else ISO-8859-1, as Java reads a ``.properties`` file (a Storm user's
    file with an accented letter in Latin-1)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TopologyError(f"properties file {str(path)!r} not found") from None
    except IsADirectoryError:
        raise TopologyError(f"properties file {str(path)!r} is a directory") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # what Java's Properties.load reads (Flux's --filter): ISO-8859-1, every byte a char
        text = data.decode("latin-1")
    props: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        # An odd number of trailing backslashes continues the logical line.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        key, value = _split_property(line)
        props[_unescape(key)] = _unescape(value)
    return props


def _split_property(line: str) -> tuple[str, str]:
    # The key ends at the first unescaped '=', ':' or blank; then blanks, one
    # optional separator and blanks again.
    i = 0
    while i < len(line) and line[i] not in "=: \t\f":
        i += 2 if line[i] == "\\" else 1
    key, j = line[:i], i
    while j < len(line) and line[j] in " \t\f":
        j += 1
    if j < len(line) and line[j] in "=:":
        j += 1
    while j < len(line) and line[j] in " \t\f":
        j += 1
    return key, line[j:]


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\" or i + 1 >= len(s):
            out.append(c)
            i += 1
            continue
        n = s[i + 1]
        if n == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", s[i + 2:i + 6] or ""):
            out.append(chr(int(s[i + 2:i + 6], 16)))
            i += 6
            continue
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(n, n))
        i += 2
    return "".join(out)


_PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")
_LIST_ITEM = re.compile(r"(.+)\[(\d+)\]")


def substitute(
    text: str, properties: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None, *,
    source: str = "<yaml>",
) -> str:
    """Replace ``${name}``, ``${name[i]}`` and ``${ENV-NAME}`` in ``text``, as
    Flux does before it parses the YAML. An unresolved placeholder raises
    :class:`TopologyError`; comment lines are left alone."""
    props = dict(properties or {})
    lines = text.split("\n")
    for lineno, line in enumerate(lines, 1):
        if "${" not in line or line.lstrip().startswith("#"):
            continue

        def repl(m: re.Match[str], lineno: int = lineno) -> str:
            name = m.group(1).strip()
            where = f"{source}:{lineno}"
            if name.startswith("ENV-"):
                var = name[4:]
                if env is None:
                    raise TopologyError(f"{where}: ${{{name}}} needs environment substitution; "
                                        f"run with -e/--env-filter (as with flux)")
                if var not in env:
                    raise TopologyError(f"{where}: ${{{name}}}: environment variable {var!r} is not set")
                return str(env[var])
            if name in props:
                return str(props[name])
            item = _LIST_ITEM.fullmatch(name)
            if item and item.group(1) in props:
                return _list_item(props[item.group(1)], int(item.group(2)), where, name)
            hint = "pass --filter PROPERTIES_FILE defining it" if not props else "the properties do not define it"
            raise TopologyError(f"{where}: cannot substitute ${{{name}}}: {hint}")

        lines[lineno - 1] = _PLACEHOLDER.sub(repl, line)
    return "\n".join(lines)


def _list_item(value: str, index: int, where: str, name: str) -> str:
    """``${prop[i]}``: Flux reads the property as ``["a", "b"]`` and takes an item."""
    try:
        items = yaml.safe_load(value)
    except (yaml.YAMLError, ValueError, LookupError, TypeError):  # (a constructor's: "!!int two")
        items = None
    if not isinstance(items, list):
        raise TopologyError(f"{where}: ${{{name}}}: property value {value!r} is not a list like [\"a\", \"b\"]")
    if index >= len(items):
        raise TopologyError(f"{where}: ${{{name}}}: the list has only {len(items)} items")
    return str(items[index])


# --- loading -----------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping: YAML loaders
    (Flux's SnakeYAML too) keep the last, so ``parallelism: 2`` then
    ``parallelism: 1`` would run with 1 without a word. Keys that a merge
    (``<<: *defaults``) brings in may be overridden, as YAML says."""


def _unique_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    if not isinstance(node, yaml.MappingNode):  # ("!!map x": the constructor says it is not a mapping)
        return loader.construct_mapping(node, deep=deep)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor below says so
            continue
        if first is not None:
            raise _DuplicateKey(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice (first on line "
                                f"{first + 1}); YAML would keep only the last, so remove one")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


class _DuplicateKey(yaml.YAMLError):
    pass


def _construct_object(loader: _Loader, node: yaml.Node, deep: bool = False) -> Any:
    """A node's value; a tagged scalar its tag's constructor cannot take
    (``!!int two``, ``!!bool maybe``, ``!!timestamp 2020-13-45``) is a YAML
    error at its line, not a ValueError, KeyError or IndexError of
    PyYAML's with a traceback."""
    try:
        return yaml.SafeLoader.construct_object(loader, node, deep)
    except yaml.YAMLError:
        raise
    except (ValueError, LookupError, TypeError, OverflowError) as exc:
        value = node.value if isinstance(node, yaml.ScalarNode) else "..."
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        why = f" ({exc})" if type(exc) is ValueError and str(exc) else ""  # (a KeyError's text is the value again)
        raise yaml.constructor.ConstructorError(
            None, None, f"{tag} {value!r} is not a valid {tag[2:] if tag.startswith('!!') else tag}{why}",
            node.start_mark) from None


_Loader.construct_object = _construct_object  # type: ignore[method-assign]


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_flux(
    path: str | os.PathLike[str],
    properties: Mapping[str, str] | str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = os.environ,
    *,
    overrides: Mapping[str, Any] | None = None,
) -> Topology:
    """Load a Storm Flux YAML topology (see the module docstring).

    ``properties``: a mapping or the path of a ``.properties`` file for
    ``${name}``. ``env``: the environment for ``${ENV-NAME}``, or None to
    refuse such placeholders (``multilang run`` passes None unless
    ``-e/--env-filter`` is given, as Flux does). ``overrides``: conf that
    replaces the file's ``config`` (``multilang run -c``)."""
    path = Path(path)
    if properties is not None and not isinstance(properties, Mapping):
        properties = parse_properties(properties)
    doc = _read(path, properties, env)
    doc = _includes(doc, path, properties, env)
    return _build(doc, path, dict(overrides or {}))


def _yaml_problem(exc: Exception) -> str:
    """A YAML parser's error on one line, placed in the user's file ("line 2,
    column 3: expected ',' or ']', but got ':' (while parsing a flow
    sequence)"), not in PyYAML's "<unicode string>"."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")


def _read(path: Path, properties: Mapping[str, str] | None, env: Mapping[str, str] | None) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyError(f"topology file {str(path)!r} not found") from None
    except IsADirectoryError:
        raise TopologyError(f"{path} is a directory, not a Flux YAML file") from None
    except UnicodeDecodeError as exc:  # (YAML is Unicode: SnakeYAML refuses such a file too)
        line = exc.object[:exc.start].count(b"\n") + 1
        raise TopologyError(f"{path}: not valid YAML: line {line}: byte 0x{exc.object[exc.start]:02x} is not UTF-8 "
                            "(save the file as UTF-8)") from None
    text = substitute(text, properties, env, source=str(path))
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except _DuplicateKey as exc:
        raise TopologyError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise TopologyError(f"{path}: a Flux file is a mapping with name, config, spouts, bolts and streams")
    _check_keys(doc, _TOP_LEVEL, str(path))
    return doc


def _includes(doc: dict[str, Any], path: Path, properties: Mapping[str, str] | None,
              env: Mapping[str, str] | None) -> dict[str, Any]:
    """Flux ``includes``: merge other files; ``override`` decides who wins.
    Includes in included files are ignored, as in Flux."""
    includes = doc.get("includes") or []
    if not isinstance(includes, list):
        raise TopologyError(f"{path}: includes must be a list of {{file: ..., override: ...}}")
    for inc in includes:
        if not isinstance(inc, dict) or not isinstance(inc.get("file"), str) or not inc["file"]:
            raise TopologyError(f"{path}: each include needs a 'file' (a path), got {inc!r}")
        _check_keys(inc, _INCLUDE_KEYS, f"{path}: include {inc['file']!r}")
        for flag in ("override", "resource"):
            if type(inc.get(flag, False)) is not bool:
                raise TopologyError(f"{path}: include {inc['file']!r}: {flag} must be true or false, "
                                    f"got {inc[flag]!r}")
        override = inc.get("override", False)
        target = _include_path(path, inc["file"], inc.get("resource", False))
        other = _read(target, properties, env)
        for section in ("config",):
            _mapping(other.get(section), str(target), section)
        for section in ("components", "spouts", "bolts", "streams"):
            _list(other.get(section), str(target), section)
        if other.get("includes"):
            log.warning("%s: includes inside an included file are ignored (as in Flux)", target)
        if other.get("name") is not None and (doc.get("name") is None or override):
            doc["name"] = other["name"]
        if other.get("config"):
            conf = dict(doc.get("config") or {})
            for k, v in other["config"].items():
                if override or k not in conf:
                    conf[k] = v
            doc["config"] = conf
        for section in ("components", "spouts", "bolts"):
            mine = list(doc.get(section) or [])
            ids = {_ident(d.get("id")): i for i, d in enumerate(mine) if isinstance(d, dict)}
            for d in other.get(section) or []:
                key = _ident(d.get("id")) if isinstance(d, dict) else None
                if key in ids:
                    if override:
                        mine[ids[key]] = d
                else:
                    ids[key] = len(mine)
                    mine.append(d)
            if mine:
                doc[section] = mine
        if other.get("streams"):
            doc["streams"] = list(doc.get("streams") or []) + list(other["streams"])
    return doc


def _include_path(path: Path, file: str, resource: bool) -> Path:
    # No classpath here: a "resource" include is a file under the including
    # file's directory; a plain relative path is tried there, then in the cwd.
    if resource:
        candidates = [path.parent / file.lstrip("/")]
    elif os.path.isabs(file):
        candidates = [Path(file)]
    else:
        candidates = [path.parent / file, Path(file)]
    for c in candidates:
        if c.is_file():
            return c
    raise TopologyError(f"{path}: included file {file!r} not found (looked at {[str(c) for c in candidates]})")


def _build(doc: dict[str, Any], path: Path, overrides: dict[str, Any]) -> Topology:
    for section in ("components", "workerHooks", "spouts", "bolts", "streams"):
        _list(doc.get(section), str(path), section)
    if doc.get("topologySource"):
        src = doc["topologySource"]
        cls = src.get("className", "?") if isinstance(src, dict) else src
        raise TopologyError(f"{path}: topologySource {cls} builds the topology in Java, which multilang-bridge "
                            f"cannot run; describe it with spouts, bolts and streams instead")
    for section in ("components", "workerHooks"):
        for d in doc.get(section) or []:
            cls = d.get("className", "?") if isinstance(d, dict) else "?"
            ident = d.get("id", "?") if isinstance(d, dict) else "?"
            raise TopologyError(f"{path}: {section[:-1]} {ident!r} is the Java class {cls}; multilang-bridge runs "
                                f"no JVM. Remove it, and give shell components their settings with "
                                f"configMethods addComponentConfig or the component's config")
    conf = dict(_mapping(doc.get("config"), str(path), "config (a mapping of topology conf keys)"))
    # -c overrides are not in the file: a bad value is reported as theirs.
    for key, value in overrides.items():
        cause = check_value(key, value) if isinstance(key, str) else None
        if cause is not None:
            raise TopologyError(f"{path}: conf overrides: {cause}")
    conf.update(overrides)
    # The keys this loader reads itself are checked before it uses them (the
    # rest by Topology.validate()).
    _check_flux_conf(conf, str(path))
    topo_name = doc.get("name")
    # As in TOML: a number is not a name (quote it: name: "5").
    if topo_name is not None and (not isinstance(topo_name, str) or not topo_name):
        raise TopologyError(f"{path}: name must be a non-empty string, got {topo_name!r}")

    builder = TopologyBuilder()
    kinds: dict[str, str] = {}
    impls: dict[str, Any] = {}
    declarers: dict[str, Any] = {}
    for section, kind in (("spouts", "spout"), ("bolts", "bolt")):
        defs = doc.get(section) or []
        if not isinstance(defs, list):
            raise TopologyError(f"{path}: {section} must be a list of definitions with id and className")
        for d in defs:
            name, impl, parallelism, comp_conf = _vertex(d, kind, path, conf)
            if name in kinds:
                how = f"as two {kind}s" if kinds[name] == kind else f"as a {kinds[name]} and as a {kind}"
                raise TopologyError(f"{path}: id {name!r} is defined twice: {how}; ids must be unique across "
                                    "spouts and bolts")
            kinds[name] = kind
            impls[name] = impl
            setter = builder.set_spout if kind == "spout" else builder.set_bolt
            declarers[name] = setter(name, impl, parallelism, comp_conf)

    streams = doc.get("streams") or []
    if not isinstance(streams, list):
        raise TopologyError(f"{path}: streams must be a list of {{from, to, grouping}}")
    subscribed: set[tuple[str, str]] = set()
    for i, s in enumerate(streams):
        subscribed.add(_stream(s, i, path, kinds, declarers))
    fed = {s["to"] for s in streams}  # each checked by _stream
    for name, kind in kinds.items():  # said here in Flux's words; validate() says it in the builder's
        if kind == "bolt" and name not in fed:
            first = next((n for n, k in kinds.items() if k == "spout"), "<spout>")
            raise TopologyError(f"{path}: bolt {name!r}: has no inputs; add one under streams:, e.g. "
                                f"- {{from: {first!r}, to: {name!r}, grouping: {{type: SHUFFLE}}}}")

    output = _output(conf, path, builder, impls, subscribed)
    return builder.create_topology(conf, name=topo_name or path.stem, output=output,
                                   resource_dir=_resource_dir(path, conf), source=str(path))


def _check_flux_conf(conf: Mapping[Any, Any], where: str) -> None:
    for key, value in conf.items():
        if isinstance(key, str) and key in SCHEMA and SCHEMA[key].flux:
            cause = check_value(key, value)
            if cause is not None:
                raise TopologyError(f"{where}: {cause}")


def _resource_dir(path: Path, conf: Mapping[str, Any]) -> Path:
    base = path.parent.resolve()
    configured = conf.get("multilang.resource.dir")
    if configured:
        d = (base / str(configured)).resolve()
        if not d.is_dir():
            raise TopologyError(f"{path}: multilang.resource.dir {configured!r} is not a directory ({d})")
        return d
    if (base / "resources").is_dir():
        return base / "resources"
    return base


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _vertex(d: Any, kind: str, path: Path, conf: Mapping[str, Any]) -> tuple[str, Any, int, dict[str, Any]]:
    if not isinstance(d, dict) or _ident(d.get("id")) is None:
        raise TopologyError(f"{path}: each {kind} needs an 'id' (a string) and a 'className', got {d!r}")
    name = _ident(d["id"])
    assert name is not None
    where = f"{path}: {kind} {name!r}"
    _check_keys(d, _VERTEX_KEYS, where)
    cls = d.get("className")
    if not cls or not isinstance(cls, str):
        raise TopologyError(f"{where}: needs a 'className' (a string), got {cls!r}")
    if d.get("factory"):
        raise TopologyError(f"{where}: a static factory ({cls}.{d['factory']}) is Java; use a shell component")
    args = d.get("constructorArgs") or []
    if not isinstance(args, list):
        raise TopologyError(f"{where}: constructorArgs must be a list")
    if any(isinstance(a, dict) and ("ref" in a or "reflist" in a) for a in args):
        raise TopologyError(f"{where}: constructorArgs refer to components (ref/reflist), which are Java objects; "
                            f"not supported")
    comp_conf = dict(_mapping(d.get("config"), where, "config"))
    _check_flux_conf(comp_conf, where)
    parallelism = d.get("parallelism", 1)
    num_tasks = d.get("numTasks")
    # Storm gives every task of a ShellBolt its own process; here a task is
    # a process too, so numTasks (when set) is the number of tasks.
    if num_tasks is not None:
        if type(num_tasks) is not int or num_tasks < 1:
            raise TopologyError(f"{where}: numTasks must be a positive integer, got {num_tasks!r}")
        parallelism = num_tasks
    # Types are checked, never coerced (as in TOML): "2" is a string; write
    # parallelism: 2, or ${par} unquoted (substitution happens before parsing).
    if type(parallelism) is not int or parallelism < 1:
        hint = " (a string: drop the quotes)" if isinstance(parallelism, str) else ""
        raise TopologyError(f"{where}: parallelism must be a positive integer, got {parallelism!r}{hint}")
    methods = d.get("configMethods") or []
    if not isinstance(methods, list):
        raise TopologyError(f"{where}: configMethods must be a list of {{name, args}}")

    _check_class_name(cls, where)
    builtin = _BUILTINS.get(cls)
    if builtin is not None:
        want, make = builtin
        if want != kind:
            raise TopologyError(f"{where}: {cls} is a {want}, not a {kind}; move it under {want}s")
        if methods or d.get("properties"):
            raise TopologyError(f"{where}: {cls} takes no configMethods or properties here")
        impl, parallelism = make(name, args, parallelism, {**conf, **comp_conf}, where)
        return name, impl, parallelism, comp_conf

    shell_classes = {_FLUX_SHELL_SPOUT: "spout", _FLUX_SHELL_BOLT: "bolt",
                     _STORM_SHELL_SPOUT: "spout", _STORM_SHELL_BOLT: "bolt"}
    is_flux = cls in (_FLUX_SHELL_SPOUT, _FLUX_SHELL_BOLT)
    shaped = len(args) == 2 and _str_list(args[0]) and _str_list(args[1]) and bool(args[0])
    if cls in shell_classes or shaped:
        if cls in shell_classes and shell_classes[cls] != kind:
            raise TopologyError(f"{where}: {cls} is a {shell_classes[cls]}, not a {kind}; "
                                f"use {_FLUX_SHELL_SPOUT if kind == 'spout' else _FLUX_SHELL_BOLT}")
        if not (len(args) in (1, 2) and _str_list(args[0]) and args[0] and (len(args) == 1 or _str_list(args[1]))):
            raise TopologyError(f"{where}: {cls} takes constructorArgs [[command, args...], [output fields...]], "
                                f"got {args!r}")
        if d.get("properties"):
            raise TopologyError(f"{where}: properties are not supported on shell components; "
                                f"use configMethods addComponentConfig")
        if cls not in shell_classes:
            log.info("%s: %s taken as a ShellBolt/ShellSpout subclass (constructorArgs [command], [fields])",
                     where, cls)
        streams: dict[str, list[str]] = {}
        if len(args) == 2:
            streams[DEFAULT_STREAM] = list(args[1])
        for m in methods:
            _shell_method(m, where, cls, is_flux, streams, comp_conf)
        fields = streams.pop(DEFAULT_STREAM, None)
        impl_cls = ShellSpout if kind == "spout" else ShellBolt
        return name, impl_cls(list(args[0]), fields, streams or None), parallelism, comp_conf

    shell = _FLUX_SHELL_SPOUT if kind == "spout" else _FLUX_SHELL_BOLT
    raise TopologyError(
        f"{where}: {cls} is a Java class, and multilang-bridge runs no JVM. Write it as a multilang component "
        f"(Python, Ruby, Node, ...) and declare it as className: {shell} with constructorArgs: "
        f"[[command, args...], [output fields...]]. The Java classes provided in-process are "
        f"{', '.join(sorted(_BUILTINS))}."
    )


#: Every Java class name this loader knows (shell wrappers and built-ins).
_KNOWN_CLASSES = (_FLUX_SHELL_SPOUT, _FLUX_SHELL_BOLT, _STORM_SHELL_SPOUT, _STORM_SHELL_BOLT, _LOG_INFO_BOLT,
                  _TEST_WORD_SPOUT, _TEST_WORD_COUNTER)


def _check_class_name(cls: str, where: str) -> None:
    """A className one edit away from a known one (or a known class's simple
    name without its package) is a typo: Storm's Flux would fail to load it
    (ClassNotFoundException), whereas here, with constructorArgs
    [[command], [fields]], it would run silently as a ShellBolt subclass."""
    if cls in _KNOWN_CLASSES:
        return
    hit = suggest(cls, _KNOWN_CLASSES)
    if hit is None and "." not in cls:
        simple = {k.rsplit(".", 1)[1]: k for k in _KNOWN_CLASSES}
        near = cls if cls in simple else suggest(cls, simple)
        hit = simple[near] if near is not None else None
    if hit is not None:
        raise TopologyError(f"{where}: unknown className {cls!r}; did you mean {hit!r}? (Storm's Flux would not "
                            f"find this class either)")


def _shell_method(m: Any, where: str, cls: str, is_flux: bool, streams: dict[str, list[str]],
                  comp_conf: dict[str, Any]) -> None:
    if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
        raise TopologyError(f"{where}: each configMethod needs a 'name' (a string), got {m!r}")
    _check_keys(m, _METHOD_KEYS, f"{where}: configMethod {m['name']!r}")
    mname = m["name"]
    margs = m.get("args") or []
    if not isinstance(margs, list):
        margs = [margs]
    if is_flux and mname == "addComponentConfig" and len(margs) == 2 and isinstance(margs[0], str):
        comp_conf[margs[0]] = margs[1]
    elif is_flux and mname == "setDefaultStream" and len(margs) == 1 and _str_list(margs[0]):
        streams[DEFAULT_STREAM] = list(margs[0])
    elif is_flux and mname == "setNamedStream" and len(margs) == 2 and isinstance(margs[0], str) \
            and _str_list(margs[1]):
        streams[margs[0]] = list(margs[1])
    else:
        raise TopologyError(
            f"{where}: configMethod {mname}({', '.join(json.dumps(a) for a in margs)}) is not supported on {cls}; "
            f"FluxShellSpout/FluxShellBolt support addComponentConfig(key, value), setDefaultStream([fields]) "
            f"and setNamedStream(name, [fields])"
        )


def _stream(s: Any, i: int, path: Path, kinds: Mapping[str, str],
            declarers: Mapping[str, Any]) -> tuple[str, str]:
    if not isinstance(s, dict):
        raise TopologyError(f"{path}: stream #{i + 1} must be a mapping with from, to and grouping")
    label = f"stream {s.get('name')!r}" if s.get("name") else f"stream #{i + 1}"
    where = f"{path}: {label}"
    _check_keys(s, _STREAM_KEYS, where)
    ends = []
    for role in ("from", "to"):
        raw = s.get(role)
        if raw is None:
            raise TopologyError(f"{where}: needs '{role}'")
        ident = _ident(raw)
        if ident is None or ident not in kinds:
            raise TopologyError(f"{where}: '{role}: {raw}' is not the id of a spout or bolt in the file "
                                f"(ids: {sorted(kinds)}){did_you_mean(str(raw), kinds)}")
        ends.append(ident)
    src, dst = ends
    if kinds[dst] == "spout":
        raise TopologyError(f"{where}: 'to: {dst}' is a spout; spouts take no input")
    flux_types = {cls.flux_type: kind for kind, cls in GROUPINGS.items() if cls.flux_type}
    g = s.get("grouping")
    if not isinstance(g, dict) or not isinstance(g.get("type"), str) or not g["type"]:
        raise TopologyError(f"{where}: needs a grouping with a type ({', '.join(flux_types)})")
    _check_keys(g, _GROUPING_KEYS, f"{where}: grouping")
    gtype = g["type"].upper()
    if gtype == "CUSTOM":
        cc = g.get("customClass") if isinstance(g.get("customClass"), dict) else {}
        cls = cc.get("className") or "(customClass names no className)"
        raise TopologyError(f"{where}: CUSTOM grouping {cls} is a Java class; use one of "
                            f"{', '.join(flux_types)}")
    if gtype not in flux_types:
        raise TopologyError(f"{where}: unknown grouping type {g['type']!r}"
                            f"{one_of(gtype, flux_types, ', '.join(flux_types))}")
    fields: list[str] = []
    kind = flux_types[gtype]
    if GROUPINGS[kind].takes_fields:
        fields = g.get("args") or []
        if not _str_list(fields) or not fields:
            raise TopologyError(f"{where}: {gtype} grouping needs args: [field, ...]")
    elif g.get("args"):  # Flux ignores them: a grouping meant as FIELDS would run as another without a word
        raise TopologyError(f"{where}: args {g['args']!r} apply to the FIELDS grouping only, not {gtype}")
    stream = g.get("streamId") or DEFAULT_STREAM
    if not isinstance(stream, str):
        raise TopologyError(f"{where}: streamId must be a string, got {stream!r}")
    declarers[dst].grouping(src, kind, stream, fields)
    return src, stream


def _output(conf: Mapping[str, Any], path: Path, builder: TopologyBuilder, impls: Mapping[str, Any],
            subscribed: set[tuple[str, str]]) -> OutputSpec:
    comp = conf.get("multilang.output.component")
    stream = conf.get("multilang.output.stream")
    key = conf.get("multilang.output.key")
    if comp is None:
        if stream is not None or key is not None:
            raise TopologyError(f"{path}: multilang.output.stream/key need multilang.output.component")
        return OutputSpec()
    comp = str(comp)
    if comp not in impls:
        raise TopologyError(f"{path}: multilang.output.component {comp!r} is not a spout or bolt in the file")
    if key is not None and not _str_list(key):
        raise TopologyError(f"{path}: multilang.output.key must be a list of field names")
    stream = str(stream or DEFAULT_STREAM)
    if (comp, stream) not in subscribed:
        return OutputSpec(comp, stream, key)
    # Runtime prints only streams nobody subscribes to; read this one through
    # an in-process tap that re-emits every tuple on an unsubscribed stream.
    fields = impls[comp].outputs.get(stream)
    if fields is None:
        raise TopologyError(f"{path}: multilang.output.component {comp!r} declares no stream {stream!r}")
    if OUTPUT_TAP in impls:
        raise TopologyError(f"{path}: the id {OUTPUT_TAP!r} is reserved for the output tap; rename that component")
    tap = PythonBolt(_pass_through, fields=list(fields))
    builder.set_bolt(OUTPUT_TAP, tap).global_grouping(comp, stream)
    return OutputSpec(OUTPUT_TAP, DEFAULT_STREAM, key)


# --- in-process equivalents of Storm's built-in Java components ----------------------------------
# Classes and module-level functions, not closures: a host worker is given its components by pickle
# (docs/WORKERS.md), so a Flux file runs on --workers N as on one.


def _pass_through(values: list[Any]) -> tuple[list[Any]]:
    """The output tap's function: each tuple as it came."""
    return (values,)


class _LogInfo:
    """LogInfoBolt's function: logs a tuple at INFO."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, values: list[Any]) -> None:
        logger = logging.getLogger(_LOG_INFO_BOLT)
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s: %s", self.name, json.dumps(values, default=repr))
        return None


class _WordCounter:
    """TestWordCounter's function: the running count of field 0. Each task
    counts with its own copy (PythonBoltTask), so the count is per task, as
    Storm's, on one worker or N, and starts afresh with each run."""

    def __init__(self) -> None:
        self.counts: Counter[Any] = Counter()

    def __call__(self, values: list[Any]) -> list[list[Any]]:
        word = values[0]
        self.counts[word] += 1
        return [[word, self.counts[word]]]


class _TestWords:
    """TestWordSpout's source: ``count`` random words per task; with a seed,
    task k of the component (``for_task(k)``: the same whichever worker runs
    it) draws from seed and k."""

    def __init__(self, count: int, seed: Any) -> None:
        self.count, self.seed = count, seed

    def for_task(self, index: int) -> Iterator[list[str]]:
        rng = random.Random(None if self.seed is None else f"{self.seed}:{index}")
        return ([rng.choice(TEST_WORDS)] for _ in range(self.count))


def _log_info_bolt(name: str, args: list[Any], parallelism: int, conf: Mapping[str, Any],
                   where: str) -> tuple[PythonBolt, int]:
    """``LogInfoBolt``: logs every tuple at INFO (logger named after the Java
    class), declares no output."""
    if args:
        raise TopologyError(f"{where}: LogInfoBolt takes no constructorArgs")
    return PythonBolt(_LogInfo(name), fields=None), parallelism


def _test_word_spout(name: str, args: list[Any], parallelism: int, conf: Mapping[str, Any],
                     where: str) -> tuple[PythonSpout, int]:
    """``TestWordSpout([isDistributed])``: random words from :data:`TEST_WORDS`,
    field ``word``; finite (``multilang.testwordspout.count`` per task)."""
    if len(args) > 1 or (args and not isinstance(args[0], bool)):
        raise TopologyError(f"{where}: TestWordSpout takes constructorArgs [] or [isDistributed (true/false)]")
    if args and args[0] is False:
        parallelism = 1  # Storm: topology.max.task.parallelism = 1
    count = conf.get("multilang.testwordspout.count", 1000)
    if type(count) is not int or count < 0:
        raise TopologyError(f"{where}: multilang.testwordspout.count must be a non-negative integer")
    return PythonSpout(_TestWords(count, conf.get("multilang.testwordspout.seed")), fields=["word"]), parallelism


def _test_word_counter(name: str, args: list[Any], parallelism: int, conf: Mapping[str, Any],
                       where: str) -> tuple[PythonBolt, int]:
    """``TestWordCounter``: running count of field 0, emits [word, count]."""
    if args:
        raise TopologyError(f"{where}: TestWordCounter takes no constructorArgs")
    return PythonBolt(_WordCounter(), fields=["word", "count"]), parallelism


_Maker = Callable[[str, list[Any], int, Mapping[str, Any], str], tuple[Any, int]]
_BUILTINS: dict[str, tuple[str, _Maker]] = {
    _LOG_INFO_BOLT: ("bolt", _log_info_bolt),
    _TEST_WORD_SPOUT: ("spout", _test_word_spout),
    _TEST_WORD_COUNTER: ("bolt", _test_word_counter),
}
