"""``multilang conform``: play the host against a component, run the vectors.

The vectors in ``spec/vectors/*.json`` are data (their format is documented in
``spec/vectors/README.md`` and ``spec/vectors/schema.json``); a wheel carries
them as package data in ``multilang/vectors/``. This module is
their runner: for each vector it starts a fresh process of the component
command (argv list, no shell) with a private pid directory, drives it through
the vector's steps and checks every frame it writes.

The host side of the conversation is the sans-IO core: every frame sent goes
through ``Connection(role, Side.HOST).send`` (so a vector cannot break the
protocol unnoticed) and every frame received through ``receive_data`` /
``next_event`` (so every rule the core knows is enforced on the component).
Before that, the runner applies the rules it reports by name (the ``rule`` of
a failed check, e.g. ``ids.string-echo``), so a failure says which rule of
spec/PROTOCOL.md was broken, not just "protocol error".

I/O: one thread reads the child's stdout into a queue, one drains its stderr
continuously (spec §8.3); stdin is written non-blocking with a deadline. Every
wait has a deadline, so a broken component fails a check instead of hanging
the run. Each process is killed (its whole process group) and reaped at the
end of its vector, and its pid directory removed.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
from xml.etree import ElementTree as ET

import click

from ._state import Role, Side, State
from .codec import decode_component_frame, decode_host_frame, loads, msgpack_frame, msgpack_loads
from .connection import Connection
from .errors import MultilangError, ProtocolError
from .framing import TERMINATOR, FrameReader, LengthPrefixedReader, first_frame_end
from .messages import Emit, Heartbeat, Pid, TaskIds, Tick, Tuple, TupleBatch

__all__ = [
    "run_conformance",
    "load_vectors",
    "Report",
    "CheckResult",
    "ConformError",
    "conform_command",
    "DEFAULT_VECTORS_DIR",
    "PASSED",
    "FAILED",
    "NOT_APPLICABLE",
    "REQUIRED",
    "RECOMMENDED",
    "EXTENSION",
]


def _default_vectors_dir() -> Path:
    """The vectors shipped with the package (``multilang/vectors/`` in a wheel:
    pyproject.toml maps spec/vectors there), else this checkout's spec/vectors
    (an editable install runs from the repository)."""
    here = Path(__file__).resolve().parent
    packaged = here / "vectors"
    if packaged.is_dir():
        return packaged
    return here.parent / "spec" / "vectors"


DEFAULT_VECTORS_DIR = _default_vectors_dir()

PASSED = "passed"
FAILED = "failed"
NOT_APPLICABLE = "not-applicable"

# Levels (spec/CONFORMANCE.md "Levels"): how a failed check counts.
REQUIRED = "required"  # what Storm's host and ours rely on: a failure fails the run
RECOMMENDED = "recommended"  # the liberal reading: a failure is a warning unless strict
EXTENSION = "extension"  # an extension the component accepted: a failure fails the run
LEVELS = (REQUIRED, RECOMMENDED, EXTENSION)

#: spec/CONFORMANCE.md "Announcing itself".
READY_RE = re.compile(r"^multilang-conformance ready mode=(bolt|basic|spout) lang=(\S+)$")

# What a vector sees if it does not say otherwise (spec/vectors/README.md).
DEFAULT_CONF: dict[str, Any] = {
    "topology.name": "conform",
    "topology.message.timeout.secs": 30,
    "topology.max.spout.pending": 1000,
    "topology.shellbolt.max.pending": 100,
    "multilang.heartbeat.interval.secs": 1,
    "topology.debug": False,
}
_TASKS = {"1": "source", "2": "conform", "3": "conform", "4": "sink", "5": "sink"}
DEFAULT_CONTEXT: dict[Role, dict[str, Any]] = {
    Role.BOLT: {
        "task->component": _TASKS,
        "taskid": 2,
        "componentid": "conform",
        "streams": ["default", "words"],
        "stream->outputfields": {"default": ["value"], "words": ["word"]},
        "stream->target->grouping": {
            "default": {"sink": {"type": "SHUFFLE"}},
            "words": {"sink": {"type": "FIELDS", "fields": ["word"]}},
        },
        "source->stream->grouping": {"source": {"default": {"type": "SHUFFLE"}}},
        "source->stream->fields": {"source": {"default": ["value"]}},
    },
    Role.SPOUT: {
        "task->component": _TASKS,
        "taskid": 1,
        "componentid": "source",
        "streams": ["default"],
        "stream->outputfields": {"default": ["value"]},
        "stream->target->grouping": {"default": {"conform": {"type": "SHUFFLE"}}},
        "source->stream->grouping": {},
        "source->stream->fields": {},
    },
}
DEFAULT_TASK_IDS = [4]
DEFAULT_IGNORE = ("log", "metrics")

# The fixed waits below are for the default --timeout (2 s); a longer --timeout
# stretches every one of them in proportion (_scale), so a slow component (a
# JVM, storm-starter's asyncSplitsentence.js: about 6 s per tuple) is given
# time everywhere, not only for expected frames. A shorter one never shrinks them.
_DEFAULT_TIMEOUT = 2.0
# How long to wait, after the pid reply, for the ready line of a scripted
# conformance component. It is written right after the pid, so this is only
# slack for a loaded machine.
_READY_WAIT = 1.5
# The pid reply may come after a slow start (a JVM, a cold cache).
_MIN_HANDSHAKE_WAIT = 5.0
# storm.py and storm.rb create the pid file just after their pid reply (Storm
# never looks at it): the file is awaited this long before a check fails.
_PID_FILE_GRACE = 1.0
# Reading what a component wrote before it exited.
_EXIT_DRAIN = 0.5


def _scale(timeout: float) -> float:
    """The factor --timeout applies to every fixed wait (never below 1)."""
    return max(1.0, timeout / _DEFAULT_TIMEOUT)
_STDERR_KEEP = 16 * 1024
_SHOW = 240  # bytes of a frame shown in a report
_SHOW_FRAMES = 12  # frames of the transcript shown for a failure

_STEP_KINDS = (
    "handshake",
    "send",
    "send_many",
    "send_raw",
    "expect",
    "expect_unordered",
    "expect_none",
    "expect_count",
    "expect_exit",
    "close_stdin",
    "sleep",
    "check",
)
_ROLES = ("bolt", "spout", "any")
_REQUIRES = ("protocol", "bolt", "basic", "spout")


class ConformError(MultilangError):
    """The run could not be set up: bad vectors, or a command that cannot start."""


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass
class CheckResult:
    """The outcome of one vector (one check) against one component."""

    id: str
    title: str
    spec: list[str]
    file: str
    status: str
    reason: str = ""
    #: required, recommended or extension (spec/CONFORMANCE.md "Levels").
    level: str = REQUIRED
    #: The rule that was broken (``ids.string-echo``, ``expect.timeout``, ...).
    rule: str = ""
    #: Where it failed: "handshake" (the automatic one), "step N" (1-based,
    #: as in the vector file), or "after the last step".
    step: str = ""
    #: The last frames of the conversation: ``"-> ..."`` sent, ``"<- ..."`` received.
    frames: list[str] = field(default_factory=list)
    stderr: str = ""
    duration: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "spec": self.spec,
            "file": self.file,
            "status": self.status,
            "level": self.level,
            "reason": self.reason,
            "rule": self.rule,
            "step": self.step,
            "frames": self.frames,
            "stderr": self.stderr,
            "duration": round(self.duration, 3),
        }


@dataclass
class Report:
    """Everything one run found out.

    A failed check of level ``recommended`` is a *warning* (it does not fail
    the run) unless ``strict``; required and extension failures always fail it.
    ``CheckResult.status`` stays ``"failed"`` either way: :meth:`is_warning`
    and the counts say how it counts.
    """

    argv: list[str]
    role: str
    mode: str | None  # the scripted component's mode, or None
    lang: str | None
    results: list[CheckResult] = field(default_factory=list)
    duration: float = 0.0
    #: Recommended failures fail the run too (``--strict``).
    strict: bool = False

    def is_warning(self, r: CheckResult) -> bool:
        """A failed check that is only reported (a recommended one, not strict)."""
        return r.status == FAILED and r.level == RECOMMENDED and not self.strict

    @property
    def passed(self) -> int:
        return sum(r.status == PASSED for r in self.results)

    @property
    def failed(self) -> int:
        """Failed checks that fail the run (warnings not counted)."""
        return sum(r.status == FAILED and not self.is_warning(r) for r in self.results)

    @property
    def warnings(self) -> int:
        """Failed recommended checks, when not strict."""
        return sum(self.is_warning(r) for r in self.results)

    @property
    def not_applicable(self) -> int:
        return sum(r.status == NOT_APPLICABLE for r in self.results)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def ids(self, status: str) -> list[str]:
        return [r.id for r in self.results if r.status == status]

    def warning_ids(self) -> list[str]:
        return [r.id for r in self.results if self.is_warning(r)]

    def __getitem__(self, check_id: str) -> CheckResult:
        for r in self.results:
            if r.id == check_id:
                return r
        raise KeyError(check_id)

    def __contains__(self, check_id: object) -> bool:
        return any(r.id == check_id for r in self.results)

    # -- diagnosis -----------------------------------------------------------

    def diagnosis(self) -> list[Any]:
        """What ``multilang.conform_diagnosis.diagnose`` makes of the results:
        a list of diagnoses (``title``, ``detail``, ``checks``: the ids of the
        checks that failed only as a consequence). Empty while that module is
        not installed."""
        try:
            from .conform_diagnosis import diagnose
        except ImportError:
            return []
        return list(diagnose(self.results))

    @staticmethod
    def _consequences(diagnoses: list[Any]) -> set[str]:
        return {c for d in diagnoses for c in getattr(d, "checks", ())}

    # -- output formats ------------------------------------------------------

    def describe_component(self) -> str:
        if self.mode:
            return f"scripted conformance component, mode {self.mode}, lang {self.lang} (role {self.role})"
        return f"no ready line: protocol checks only (role {self.role})"

    def summary(self) -> str:
        """The closing line: ``N passed, N failed`` (what CI parsers read),
        then ``, N warnings`` if some recommended check failed."""
        line = f"{self.passed} passed, {self.failed} failed"
        if self.warnings:
            line += f", {self.warnings} warning{'s' if self.warnings != 1 else ''}"
        return line

    def to_json(self) -> dict[str, Any]:
        diagnoses = self.diagnosis()
        consequences = self._consequences(diagnoses)
        results = []
        for r in self.results:
            doc = r.to_json()
            doc["warning"] = self.is_warning(r)
            doc["see_diagnosis"] = r.status == FAILED and r.id in consequences
            results.append(doc)
        return {
            "diagnosis": [
                {"title": d.title, "detail": d.detail, "checks": list(d.checks)} for d in diagnoses
            ],
            "argv": self.argv,
            "role": self.role,
            "mode": self.mode,
            "lang": self.lang,
            "strict": self.strict,
            "passed": self.passed,
            "failed": self.failed,
            "warnings": self.warnings,
            "not_applicable": self.not_applicable,
            "duration": round(self.duration, 3),
            "results": results,
        }

    def to_text(self) -> str:
        diagnoses = self.diagnosis()
        consequences = self._consequences(diagnoses)
        # The diagnosis comes first: it names the cause of a cascade of failures.
        lines = [f"diagnosis: {d.title}: {d.detail}" for d in diagnoses]
        lines += [f"multilang conform: {subprocess.list2cmdline(self.argv)}", f"component: {self.describe_component()}"]
        for r in self.results:
            sections = " ".join(f"§{s}" if s[:1].isdigit() else s for s in r.spec)
            if r.status == PASSED:
                lines.append(f"PASS {r.id}  [{sections}] {r.title}")
            elif r.status == NOT_APPLICABLE:
                lines.append(f"N/A  {r.id}  ({r.reason})")
            else:
                tag = "WARN" if self.is_warning(r) else "FAIL"
                see = " (see diagnosis)" if r.id in consequences else ""
                level = f" ({r.level})" if r.level != REQUIRED else ""
                lines.append(f"{tag} {r.id}  [{sections}] {r.title}{level}{see}")
                where = f"{r.step}, " if r.step else ""
                lines.append(f"     {where}rule {r.rule}: {r.reason}")
                lines.extend(f"     {f}" for f in r.frames)
                if r.stderr:
                    lines.append("     stderr tail:")
                    lines.extend(f"       {s}" for s in r.stderr.splitlines()[-8:])
        if self.not_applicable:
            lines.append(f"{self.not_applicable} not applicable")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_junit(self) -> str:
        suite = ET.Element(
            "testsuite",
            name="multilang-conform",
            tests=str(len(self.results)),
            failures=str(self.failed),
            errors="0",
            skipped=str(self.not_applicable),
            time=f"{self.duration:.3f}",
        )
        props = ET.SubElement(suite, "properties")
        for name, value in (("argv", subprocess.list2cmdline(self.argv)), ("role", self.role),
                            ("mode", self.mode or ""), ("lang", self.lang or ""),
                            ("strict", str(self.strict).lower()), ("warnings", str(self.warnings))):  # fmt: skip
            ET.SubElement(props, "property", name=name, value=value)
        for r in self.results:
            case = ET.SubElement(suite, "testcase", classname=f"conform.{r.file}", name=r.id, time=f"{r.duration:.3f}")
            cprops = ET.SubElement(case, "properties")
            ET.SubElement(cprops, "property", name="level", value=r.level)
            if r.status == FAILED:
                details = [r.title, f"level: {r.level}", f"spec: {', '.join(r.spec)}", f"{r.step}: [{r.rule}] {r.reason}", *r.frames]
                if r.stderr:
                    details += ["stderr tail:", r.stderr]
                if self.is_warning(r):
                    # JUnit has no warnings: a passing case with the finding in its output.
                    ET.SubElement(cprops, "property", name="warning", value=_xml_safe(f"[{r.rule}] {r.reason}"))
                    out = ET.SubElement(case, "system-out")
                    out.text = _xml_safe("WARN (recommended)\n" + "\n".join(details))
                else:
                    fail = ET.SubElement(case, "failure", message=_xml_safe(f"[{r.rule}] {r.reason}"), type=r.rule)
                    fail.text = _xml_safe("\n".join(details))
            elif r.status == NOT_APPLICABLE:
                ET.SubElement(case, "skipped", message=_xml_safe(r.reason))
        root = ET.Element("testsuites", name="multilang-conform", tests=str(len(self.results)),
                          failures=str(self.failed), skipped=str(self.not_applicable))  # fmt: skip
        root.append(suite)
        ET.indent(root)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    return _XML_BAD.sub("\ufffd", text)


# ---------------------------------------------------------------------------
# Vectors
# ---------------------------------------------------------------------------


@dataclass
class Vector:
    id: str
    title: str
    spec: list[str]
    role: str
    requires: str
    steps: list[dict[str, Any]]
    file: str
    handshake: Any = None  # options of the automatic handshake, or "manual"
    auto_task_ids: bool = True
    task_ids: list[int] = field(default_factory=lambda: list(DEFAULT_TASK_IDS))
    #: The extension (§9) this vector is about: not applicable to a component
    #: that does not accept it (standard mode is correct, §9.3).
    extension: str | None = None
    #: required, recommended or extension (spec/CONFORMANCE.md "Levels").
    level: str = REQUIRED


def _expand(obj: Any) -> Any:
    """Expand load-time generators (``$repeat``) everywhere in a vector."""
    if isinstance(obj, dict):
        if "$repeat" in obj:
            text, times = obj["$repeat"], obj.get("times")
            if not isinstance(text, str) or type(times) is not int or times < 0 or set(obj) != {"$repeat", "times"}:
                raise ConformError(f"bad $repeat generator: {obj!r:.200}")
            return text * times
        return {k: _expand(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_expand(v) for v in obj]
    return obj


def load_vectors(directory: str | os.PathLike[str] | None = None) -> list[Vector]:
    """Every vector of every ``*.json`` file in ``directory`` (but
    ``schema.json``), files in name order, vectors in file order."""
    d = Path(directory) if directory is not None else DEFAULT_VECTORS_DIR
    if not d.is_dir():
        raise ConformError(f"vector directory {str(d)!r} does not exist (pass --vectors DIR)")
    vectors: list[Vector] = []
    seen: set[str] = set()
    for path in sorted(d.glob("*.json")):
        if path.name == "schema.json":
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConformError(f"{path}: cannot read vectors: {exc}") from None
        items = doc.get("vectors") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise ConformError(f"{path}: a vector file is an object with a 'vectors' list")
        for n, raw in enumerate(items):
            where = f"{path.name} vector {n}"
            if not isinstance(raw, dict):
                raise ConformError(f"{where}: a vector is an object")
            for key in ("id", "title", "spec", "role", "requires", "steps"):
                if key not in raw:
                    raise ConformError(f"{where}: missing {key!r}")
            vid = raw["id"]
            if vid in seen:
                raise ConformError(f"{where}: duplicate id {vid!r}")
            seen.add(vid)
            if raw["role"] not in _ROLES or raw["requires"] not in _REQUIRES:
                raise ConformError(f"{vid}: role must be one of {_ROLES}, requires one of {_REQUIRES}")
            if raw["role"] == "any" and raw["requires"] != "protocol":
                raise ConformError(f"{vid}: role 'any' needs requires 'protocol'")
            steps = raw["steps"]
            if not isinstance(steps, list):
                raise ConformError(f"{vid}: steps must be a list")
            for i, step in enumerate(steps, 1):
                kinds = [k for k in _STEP_KINDS if isinstance(step, dict) and k in step]
                if len(kinds) != 1:
                    raise ConformError(f"{vid} step {i}: a step has exactly one of {', '.join(_STEP_KINDS)}")
            # The schema requires a level; an older vector directory without
            # levels still runs, every vector counted as required.
            level = raw.get("level", EXTENSION if raw.get("extension") is not None else REQUIRED)
            if level not in LEVELS:
                raise ConformError(f"{vid}: level must be one of {LEVELS}, not {level!r}")
            if (level == EXTENSION) != (raw.get("extension") is not None):
                raise ConformError(f"{vid}: level 'extension' goes with an 'extension' name, and only with it")
            spec = raw["spec"] if isinstance(raw["spec"], list) else [raw["spec"]]
            vectors.append(
                Vector(
                    id=vid,
                    title=raw["title"],
                    spec=[str(s) for s in spec],
                    role=raw["role"],
                    requires=raw["requires"],
                    steps=_expand(steps),
                    file=path.stem,
                    handshake=_expand(raw.get("handshake")),
                    auto_task_ids=raw.get("auto_task_ids", True),
                    task_ids=raw.get("task_ids", list(DEFAULT_TASK_IDS)),
                    extension=raw.get("extension"),
                    level=level,
                )
            )
    if not vectors:
        raise ConformError(f"no vectors in {str(d)!r}")
    return vectors


# ---------------------------------------------------------------------------
# Patterns (spec/vectors/README.md "Patterns")
# ---------------------------------------------------------------------------


class VectorBug(Exception):
    """The vector itself is wrong (unknown operator, breaks the protocol)."""


_MISSING = object()


def _jtype(v: Any) -> str:
    if v is None:
        return "null"
    if v is True or v is False:
        return "boolean"
    if type(v) is int:
        return "integer"
    if type(v) is float:
        return "float"
    if type(v) is str:
        return "string"
    if type(v) is list:
        return "array"
    if type(v) is dict:
        return "object"
    return type(v).__name__


def _short(v: Any, limit: int = 120) -> str:
    try:
        text = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


def _exact(a: Any, b: Any) -> bool:
    """Deep equality with JSON types kept apart (1 is not 1.0, true is not 1)."""
    ta, tb = _jtype(a), _jtype(b)
    if ta != tb:
        return False
    if ta == "array":
        return len(a) == len(b) and all(_exact(x, y) for x, y in zip(a, b))
    if ta == "object":
        return a.keys() == b.keys() and all(_exact(a[k], b[k]) for k in a)
    return a == b


def _operator(p: Any) -> str | None:
    if type(p) is dict and len(p) == 1:
        (k,) = p
        if k.startswith("$"):
            return k
    return None


class _Matcher:
    def __init__(self, ids: dict[str, str], last_tuple_id: list[str | None]) -> None:
        self.ids = ids
        self._last = last_tuple_id

    def sent_id(self, name: Any) -> str | None:
        if name is None or name is True:
            return self._last[0]
        if name not in self.ids:
            raise VectorBug(f"$same-as-sent-id names {name!r}, which no step sent as a $random-id")
        return self.ids[name]

    def match(self, p: Any, v: Any, path: str = "$") -> str | None:
        """None if ``v`` matches pattern ``p``, else why not."""
        if p == "$same-as-sent-id":
            p = {"$same-as-sent-id": None}
        op = _operator(p)
        if op is not None:
            return self._op(op, p[op], v, path)
        tp = _jtype(p)
        if tp == "object":
            if type(v) is not dict:
                return f"{path}: expected an object, got {_short(v)}"
            for k, pk in p.items():
                why = self.member(pk, v.get(k, _MISSING), f"{path}.{k}")
                if why:
                    return why
            return None
        if tp == "array":
            if type(v) is not list:
                return f"{path}: expected an array, got {_short(v)}"
            if len(v) != len(p):
                return f"{path}: expected {len(p)} items, got {len(v)}: {_short(v)}"
            for i, (pi, vi) in enumerate(zip(p, v)):
                why = self.match(pi, vi, f"{path}[{i}]")
                if why:
                    return why
            return None
        if not _exact(p, v):
            if _jtype(v) != tp:
                return f"{path}: expected {_short(p)} ({tp}), got {_short(v)} ({_jtype(v)})"
            return f"{path}: expected {_short(p)}, got {_short(v)}"
        return None

    def member(self, p: Any, v: Any, path: str) -> str | None:
        """Match an object member; ``v`` is ``_MISSING`` when the key is absent."""
        op = _operator(p)
        if op == "$absent":
            return None if v is _MISSING else f"{path}: must be absent, got {_short(v)}"
        if op == "$absent-or":
            if v is _MISSING:
                return None
            return self._op("$one-of", p[op], v, path)
        if op == "$one-of" and v is _MISSING:
            if any(_operator(a) == "$absent" for a in p[op]):
                return None
        if v is _MISSING:
            return f"{path}: missing (expected {_short(p)})"
        return self.match(p, v, path)

    def _op(self, op: str, arg: Any, v: Any, path: str) -> str | None:
        if op == "$any":
            return None
        if op == "$exact":
            return None if _exact(arg, v) else f"{path}: expected exactly {_short(arg)}, got {_short(v)}"
        if op == "$literal":
            return None if _exact(arg, v) else f"{path}: expected {_short(arg)}, got {_short(v)}"
        if op == "$type":
            names = arg if isinstance(arg, list) else [arg]
            t = _jtype(v)
            ok = t in names or ("number" in names and t in ("integer", "float"))
            return None if ok else f"{path}: expected type {'/'.join(names)}, got {t} {_short(v)}"
        if op in ("$one-of", "$absent-or"):
            if not isinstance(arg, list):
                raise VectorBug(f"{op} takes a list of patterns")
            for alt in arg:
                if _operator(alt) != "$absent" and self.match(alt, v, path) is None:
                    return None
            return f"{path}: {_short(v)} matches none of {_short(arg)}"
        if op == "$contains":
            if type(v) is not str:
                return f"{path}: expected a string containing {_short(arg)}, got {_short(v)}"
            return None if arg in v else f"{path}: {_short(v)} does not contain {_short(arg)}"
        if op == "$regex":
            if type(v) is not str:
                return f"{path}: expected a string matching /{arg}/, got {_short(v)}"
            return None if re.search(arg, v) else f"{path}: {_short(v)} does not match /{arg}/"
        if op == "$array-of":
            if type(v) is not list:
                return f"{path}: expected an array, got {_short(v)}"
            for i, item in enumerate(v):
                why = self.match(arg, item, f"{path}[{i}]")
                if why:
                    return why
            return None
        if op == "$same-as-sent-id":
            want = self.sent_id(arg)
            if type(v) is not str:
                return f"{path}: expected the sent id string {want!r}, got {_short(v)} ({_jtype(v)})"
            return None if v == want else f"{path}: expected the sent id {want!r}, got {v!r}"
        if op == "$absent":
            raise VectorBug(f"{path}: $absent is only meaningful as an object member")
        raise VectorBug(f"unknown pattern operator {op}")


def _instantiate(obj: Any, ids: dict[str, str]) -> Any:
    """Replace ``{"$random-id": NAME}`` by a fresh tuple id (the same for one NAME)."""
    if isinstance(obj, dict):
        if len(obj) == 1 and "$random-id" in obj:
            name = obj["$random-id"]
            if name not in ids:
                ids[name] = str(random.randint(-(2**63), 2**63 - 1))
            return ids[name]
        return {k: _instantiate(v, ids) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_instantiate(v, ids) for v in obj]
    return obj


# ---------------------------------------------------------------------------
# The process
# ---------------------------------------------------------------------------


class _NotApplicable(Exception):
    """The component declined the vector's extension at the handshake."""


class _Failure(Exception):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule = rule
        self.reason = reason


_TIMEOUT = object()
_EOF = object()
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _Process:
    """One component process: pipes, reader threads, deadline-bound I/O, reaping."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None, cwd: str | None) -> None:
        self.pid_dir = tempfile.mkdtemp(prefix="multilang-conform-")  # mode 0700
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                cwd=cwd,
                env=env,
                start_new_session=True,  # its own process group: we kill wrappers' children too
            )
        except OSError as exc:
            shutil.rmtree(self.pid_dir, ignore_errors=True)
            raise ConformError(f"cannot run {argv[0]!r}: {exc}") from None
        self.pid = self.proc.pid
        self.returncode: int | None = None
        self.exited = False  # exited (maybe not reaped yet)
        self.cpu_at_exit: float | None = None
        self._out: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._err = bytearray()
        self._err_lock = threading.Lock()
        self._stdin_fd = self.proc.stdin.fileno()
        os.set_blocking(self._stdin_fd, False)
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True, name=f"conform-stdout-{self.pid}"),
            threading.Thread(target=self._pump_stderr, daemon=True, name=f"conform-stderr-{self.pid}"),
        ]
        for t in self._threads:
            t.start()

    def _pump_stdout(self) -> None:
        fd = self.proc.stdout.fileno()
        try:
            while True:
                data = os.read(fd, 1 << 16)
                self._out.put(data)
                if not data:
                    return
        except OSError:
            self._out.put(b"")

    def _pump_stderr(self) -> None:
        fd = self.proc.stderr.fileno()
        try:
            while True:
                data = os.read(fd, 1 << 16)
                if not data:
                    return
                with self._err_lock:
                    self._err += data
                    if len(self._err) > _STDERR_KEEP:
                        del self._err[: len(self._err) - _STDERR_KEEP]
        except OSError:
            return

    def stderr_tail(self, limit: int = 1200) -> str:
        with self._err_lock:
            data = bytes(self._err[-limit:])
        return data.decode("utf-8", "replace").strip()

    def read(self, deadline: float) -> Any:
        """Bytes from stdout, ``b""`` at EOF, or ``_TIMEOUT``."""
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                return self._out.get_nowait()
            return self._out.get(timeout=remaining)
        except queue.Empty:
            return _TIMEOUT

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._stdin_fd, view)
            except BlockingIOError:
                n = 0
            except (BrokenPipeError, ValueError, OSError) as exc:
                self.poll()
                code = f" (exit status {self.returncode})" if self.exited else ""
                raise _Failure("process.exited", f"cannot write to the component's stdin{code}: {exc}") from None
            view = view[n:]
            if view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _Failure("process.stdin", f"the component stopped reading its stdin ({len(view)} bytes unwritten)")
                select.select([], [self._stdin_fd], [], min(remaining, 0.1))

    def close_stdin(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the (live or zombie) process, from /proc."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            return (int(fields[11]) + int(fields[12])) / _CLK_TCK
        except (OSError, IndexError, ValueError):
            return None

    def poll(self) -> bool:
        """Has the process exited? Does not reap it (its group id stays reserved)."""
        if self.exited:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
            self.exited = True
        if info is not None and info.si_pid:
            self.exited = True
            self.cpu_at_exit = self.cpu_seconds()
            self.returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        return self.exited

    def kill(self) -> None:
        """Kill the process group, reap the process, remove the pid dir."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            _, status = os.waitpid(self.pid, 0)
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        self.proc.returncode = self.returncode if self.returncode is not None else -9
        self.close_stdin()
        for t in self._threads:
            t.join(timeout=1.0)
        for pipe in (self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
        shutil.rmtree(self.pid_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# One vector against one process
# ---------------------------------------------------------------------------


def _show(data: bytes) -> str:
    text = data[:_SHOW].decode("utf-8", "replace")
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if len(data) > _SHOW:
        text += f"... ({len(data)} bytes)"
    return text


_LINE_ENDINGS = ("\n", "\r\n", "\r")


def _encode_frame(value: Any, opts: dict[str, Any]) -> bytes:
    """One frame for ``value`` with the encoding options of a send step."""
    le = opts.get("line_ending", "\n")
    if le not in _LINE_ENDINGS:
        raise VectorBug(f"line_ending must be one of {_LINE_ENDINGS!r}")
    indent = opts.get("indent")
    text = json.dumps(value, ensure_ascii=bool(opts.get("ascii", False)), separators=(",", ":"), indent=indent)
    if indent is not None:
        text = text.replace("\n", le)
    if opts.get("escape_slashes"):
        text = text.replace("/", "\\/")  # "/" occurs only inside JSON strings
    return (le * int(opts.get("blank_lines", 0)) + text + le + "end" + le).encode("utf-8")


class _Run:
    """Executes one vector's steps against one process."""

    def __init__(self, vector: Vector, proc: _Process, role: Role, timeout: float, handshake_timeout: float) -> None:
        self.v = vector
        self.proc = proc
        self.role = role
        self.timeout = timeout
        self.scale = _scale(timeout)
        self.handshake_timeout = handshake_timeout
        self.conn = Connection(role, Side.HOST)
        self.reader: FrameReader | LengthPrefixedReader = FrameReader()  # component -> us
        self.sent_reader: FrameReader | LengthPrefixedReader = FrameReader()  # us -> component (bookkeeping)
        # Until the pid reply is read, only the first frame goes to the JSON
        # reader: what follows may be msgpack (§9.6).
        self.held: bytearray | None = bytearray()
        self.msgpack = False
        self.bodies: list[bytes] = []
        self.eof = False
        self.transcript: list[tuple[str, bytes, str]] = []  # (direction, bytes, note)
        self.received: list[Any] = []
        self.ids: dict[str, str] = {}
        self.last_tuple_id: list[str | None] = [None]
        self.heartbeat_ids: set[str] = set()
        self.finished: dict[str, str] = {}  # tuple id -> "ack"/"fail"
        self.got_pid = False
        self.pid: int | None = None
        self.closed_at: float | None = None
        self.pid_at: float | None = None  # when the pid reply was read
        self.m = _Matcher(self.ids, self.last_tuple_id)

    # -- sending ------------------------------------------------------------

    def _write(self, data: bytes, chunk_size: int | None = None, delay_ms: float = 0) -> None:
        if self.closed_at is not None:
            raise VectorBug("a step writes to the component after close_stdin")
        deadline = time.monotonic() + max(self.timeout, _MIN_HANDSHAKE_WAIT * self.scale)
        if not chunk_size:
            self.proc.write(data, deadline)
            return
        for i in range(0, len(data), chunk_size):
            if i and delay_ms:
                time.sleep(delay_ms / 1000)
            self.proc.write(data[i : i + chunk_size], deadline + i / chunk_size * delay_ms / 1000)

    def _book(self, data: bytes) -> None:
        """Run what we are about to send through the host-side Connection."""
        for body in self.sent_reader.feed(data):
            try:
                msg = decode_host_frame(body, spout=self.role is Role.SPOUT,
                                        loads=msgpack_loads if self.msgpack else loads)
                self.conn.send(msg)
            except ProtocolError as exc:
                raise VectorBug(f"the vector sends a frame a host may not send: {exc}") from None
            if type(msg) is Heartbeat:
                self.heartbeat_ids.add(msg.id)
            elif type(msg) in (Tuple, Tick):
                self.last_tuple_id[0] = msg.id
            elif type(msg) is TupleBatch:
                self.last_tuple_id[0] = msg.tuples[-1].id

    def send_bytes(self, data: bytes, chunks: list[bytes] | None = None, chunk_size=None, delay_ms=0) -> None:
        self._book(data)
        # The transcript shows the bytes exactly as written (terminators too).
        pieces = len(chunks) if chunks is not None else (-(-len(data) // chunk_size) if chunk_size else 1)
        self.transcript.append(("->", data, f" [written in {pieces} pieces]" if pieces > 1 else ""))
        if chunks is None:
            self._write(data, chunk_size, delay_ms)
        else:
            for i, c in enumerate(chunks):
                if i and delay_ms:
                    time.sleep(delay_ms / 1000)
                self._write(c)

    # -- receiving ----------------------------------------------------------

    def next_frame(self, deadline: float) -> Any:
        """The next frame from the component (checked), ``_TIMEOUT`` or ``_EOF``."""
        while not self.bodies:
            if self.eof:
                return _EOF
            chunk = self.proc.read(deadline)
            if chunk is _TIMEOUT:
                return _TIMEOUT
            if not chunk:
                self.eof = True
                try:
                    if self.held:  # bytes before the pid reply that never made a frame
                        self.bodies.extend(self.reader.feed(bytes(self.held)))
                        self.held = None
                    self.reader.close()
                except ProtocolError as exc:
                    raise _Failure("frame.truncated", f"stdout ended in the middle of a frame (§1.2): {exc}") from None
                continue
            if self.held is not None:
                self.held += chunk
                cut = first_frame_end(self.held)
                if cut < 0:
                    continue
                chunk = bytes(self.held[:cut])
                del self.held[:cut]
            try:
                self.bodies.extend(self.reader.feed(chunk))
            except ProtocolError as exc:
                raise _Failure("frame.too-large", str(exc)) from None
        return self._accept(self.bodies.pop(0))

    def _after_pid(self) -> None:
        """The pid reply is read: switch to msgpack if it was accepted (§9.6)
        and hand the bytes that followed it to the reader now in force."""
        ext = self.v.extension
        if ext is not None and ext not in self.conn.extensions:
            raise _NotApplicable(f"the component does not accept extension {ext!r} (offered; it chose standard mode, §9.3)")
        if self.conn.msgpack:
            self.msgpack = True
            self.reader = LengthPrefixedReader()
            self.sent_reader = LengthPrefixedReader()
        held, self.held = self.held, None
        if held:
            try:
                self.bodies.extend(self.reader.feed(bytes(held)))
            except ProtocolError as exc:
                raise _Failure("frame.too-large", str(exc)) from None

    def _accept(self, body: bytes) -> Any:
        self.transcript.append(("<-", body, ""))
        if not self.got_pid:
            return self._accept_pid(body)
        if self.msgpack:
            try:
                obj = msgpack_loads(body)
            except ProtocolError as exc:
                raise _Failure("frame.msgpack", f"the component wrote a frame that is not one msgpack object of "
                                                f"JSON's data model (§9.6): {exc}") from None
        else:
            try:
                obj = loads(body)
            except ProtocolError:
                raise _Failure("frame.json", f"the component wrote a frame that is not JSON (§1.1, §1.2): {_show(body)}") from None
        self.received.append(obj)
        if type(obj) is not dict:
            raise _Failure("frame.invalid", f"a component frame must be a JSON object, got {_jtype(obj)}")
        cmd = obj.get("command")
        if type(cmd) is not str:
            if "pid" in obj and cmd is None:
                raise _Failure("protocol.state", "a second pid reply (§2.3)")
            raise _Failure("frame.invalid", "every component frame needs a string 'command' (§3, §4)")
        self._rules(cmd, obj)
        try:
            self.conn.receive_data(len(body).to_bytes(4, "big") + body if self.msgpack else body + TERMINATOR)
            ev = self.conn.next_event()
        except ProtocolError as exc:
            raise _Failure("protocol.state", str(exc)) from None
        if type(ev) in (Emit,) and ev.wants_task_ids and self.v.auto_task_ids:
            data = self.conn.send(TaskIds(task_ids=list(self.v.task_ids)))
            if self.closed_at is not None:
                # Its stdin is closed: a host writes nothing more (an emit
                # answering the EOF is the component's business, not a fault).
                self.transcript.append(("->", b"", "[automatic task-id reply not sent: stdin is closed]"))
            else:
                self.transcript.append(("->", data, " [automatic task-id reply]"))
                self._write(data)
        return obj

    def _accept_pid(self, body: bytes) -> Any:
        try:
            msg = decode_component_frame(body)
        except ProtocolError:
            msg = None
        if type(msg) is not Pid:
            raise _Failure(
                "handshake.pid-first",
                "the first thing a component writes must be its pid reply {\"pid\": N} (§2.3); "
                f"it wrote: {_show(body)}",
            )
        # §9.2: only extensions the handshake offered (conf multilang.extensions), each once.
        offered = self.conn.offered
        if any(e not in offered for e in msg.extensions) or len(set(msg.extensions)) != len(msg.extensions):
            raise _Failure(
                "handshake.extensions",
                f"pid reply accepts extensions that were not offered, or one twice (§9.2): {list(msg.extensions)}"
                f" (offered: {list(offered)})",
            )
        try:
            self.conn.receive_data(body + TERMINATOR)
            self.conn.next_event()
        except ProtocolError as exc:
            raise _Failure("protocol.state", str(exc)) from None
        self.got_pid = True
        self.pid = msg.pid
        self.pid_at = time.monotonic()
        obj = loads(body)
        self.received.append(obj)
        self._after_pid()
        return obj

    def _rules(self, cmd: str, obj: dict[str, Any]) -> None:
        """The rules reported by name (spec/vectors/README.md "Rules")."""
        if self.role is Role.BOLT:
            if cmd in ("ack", "fail"):
                self._check_id(obj.get("id", None), cmd)
            elif cmd == "emit":
                anchors = obj.get("anchors")
                if type(anchors) is str:
                    anchors = [anchors]
                if type(anchors) is list:
                    for a in anchors:
                        self._check_id(a, "anchor")
            elif cmd == "batch":
                self._batch_rules(obj)
        else:
            if cmd in ("ack", "fail"):
                raise _Failure("protocol.state", f"a spout may not send {cmd!r} (§4.2)")
            if cmd == "sync" and self.conn.state is State.IDLE:
                raise _Failure("spout.one-sync", "sync with no command outstanding: more than one sync for a command (§4.2)")
            if cmd == "emit" and obj.get("anchors") not in (None,):
                raise _Failure("spout.emit-anchors", "a spout emit must not carry 'anchors' (§4.3)")

    def _batch_rules(self, obj: dict[str, Any]) -> None:
        """§9.5: each element of a bolt's output batch follows the rules of its
        standard frame: the emits first, then the acks, then the fails."""
        emits = obj.get("emits")
        for e in emits if type(emits) is list else ():
            anchors = e[1] if type(e) is list and len(e) > 1 else None
            for a in anchors if type(anchors) is list else ():
                self._check_id(a, "anchor")
        done: set[str] = set()
        for what in ("ack", "fail"):
            ids = obj.get(what + "s")
            for tid in ids if type(ids) is list else ():
                if type(tid) is str and tid in done:
                    raise _Failure("ids.known", f"component {what}s id {tid!r} twice in one batch (§3.6, §9.5)")
                self._check_id(tid, what)
                done.add(tid)

    def _check_id(self, tid: Any, what: str) -> None:
        verb = {"ack": "acks", "fail": "fails", "anchor": "anchors to"}[what]
        if type(tid) is not str:
            raise _Failure(
                "ids.string-echo",
                f"component {verb} id {_short(tid)} ({_jtype(tid)}): tuple ids must be echoed as the exact string received (§3.6)",
            )
        if tid in self.heartbeat_ids:
            raise _Failure("heartbeat.never-acked", f"component {verb} heartbeat id {tid!r}: heartbeats are answered with sync, never acked, failed or anchored to (§3.2, §5.1)")
        if tid not in self.conn.pending:
            if tid in self.finished:
                why = f"which it already {self.finished[tid]}ed"
            else:
                sent = sorted(self.conn.pending | set(self.finished))
                why = f"which is not a tuple id it was sent (ids sent: {', '.join(repr(s) for s in sent[:6]) or 'none'})"
            rule = "anchors.known" if what == "anchor" else "ids.known"
            raise _Failure(rule, f"component {verb} id {tid!r}, {why}; ids must be echoed byte for byte (§3.5, §3.6)")
        if what != "anchor":
            self.finished[tid] = what

    def _ignored(self, obj: Any, ignore: Any) -> bool:
        if ignore == "*":
            return True
        return type(obj) is dict and obj.get("command") in ignore

    # -- steps --------------------------------------------------------------

    def run(self) -> None:
        steps = list(self.v.steps)
        if self.v.handshake != "manual":
            steps.insert(0, {"handshake": self.v.handshake or {}})
            self.step_offset = 1
        else:
            self.step_offset = 0
        steps = _instantiate(steps, self.ids)
        for i, step in enumerate(steps):
            n = i + 1 - self.step_offset
            self.where = f"step {n}" if n else "handshake"
            kind = next(k for k in _STEP_KINDS if k in step)
            getattr(self, "step_" + kind)(step)
        # Frames that already arrived are checked too (no waiting).
        self.where = "after the last step"
        while True:
            r = self.next_frame(time.monotonic())
            if r is _TIMEOUT or r is _EOF:
                break

    def _deadline(self, step: dict[str, Any]) -> tuple[float, float]:
        t = max(self.timeout, step.get("timeout_ms", 0) / 1000 * self.scale)
        return time.monotonic() + t, t

    def _frame_or_fail(self, deadline: float, waiting_for: str, waited: float) -> Any:
        obj = self.next_frame(deadline)
        if obj is _TIMEOUT:
            raise _Failure("expect.timeout", f"nothing {waiting_for} within {waited:.1f} s")
        if obj is _EOF:
            self.proc.poll()
            code = f" (exit status {self.proc.returncode})" if self.proc.exited else ""
            raise _Failure("process.exited", f"the component closed its stdout{code} while the runner waited for {waiting_for}")
        return obj

    def step_handshake(self, step: dict[str, Any]) -> None:
        opts = step["handshake"] or {}
        if not isinstance(opts, dict):
            raise VectorBug("handshake options must be an object")
        conf = dict(DEFAULT_CONF)
        conf.update(opts.get("conf", {}))
        context = opts.get("context", DEFAULT_CONTEXT[self.role])
        frame = {"pidDir": self.proc.pid_dir, "conf": conf, "context": context}
        data = _encode_frame(frame, opts)
        self.send_bytes(data, chunk_size=opts.get("chunk_size"), delay_ms=opts.get("delay_ms", 0))
        obj = self.next_frame(time.monotonic() + self.handshake_timeout)
        if obj is _TIMEOUT:
            raise _Failure("handshake.timeout", f"no pid reply within {self.handshake_timeout:.1f} s of the handshake (§2.3, §2.4)")
        if obj is _EOF:
            self.proc.poll()
            code = f" (exit status {self.proc.returncode})" if self.proc.exited else ""
            raise _Failure("process.exited", f"the component closed its stdout{code} before its pid reply (§2.3)")

    def _encode(self, value: Any, opts: dict[str, Any]) -> bytes:
        # Under msgpack the JSON text options (line endings, indent, ...) do not apply.
        return msgpack_frame(value) if self.msgpack else _encode_frame(value, opts)

    def step_send(self, step: dict[str, Any]) -> None:
        data = self._encode(step["send"], step)
        self.send_bytes(data, chunk_size=step.get("chunk_size"), delay_ms=step.get("delay_ms", 0))

    def step_send_many(self, step: dict[str, Any]) -> None:
        data = b"".join(self._encode(v, step) for v in step["send_many"])
        self.send_bytes(data, chunk_size=step.get("chunk_size"), delay_ms=step.get("delay_ms", 0))

    def step_send_raw(self, step: dict[str, Any]) -> None:
        raw = step["send_raw"]
        chunks = [raw] if isinstance(raw, str) else raw
        if not all(isinstance(c, str) for c in chunks):
            raise VectorBug("send_raw takes a string or a list of strings")
        bchunks = [c.encode("utf-8") for c in chunks]
        self.send_bytes(b"".join(bchunks), chunks=bchunks, delay_ms=step.get("delay_ms", 0))

    def step_expect(self, step: dict[str, Any]) -> None:
        pattern = step["expect"]
        ignore = step.get("ignore", DEFAULT_IGNORE)
        deadline, waited = self._deadline(step)
        while True:
            obj = self._frame_or_fail(deadline, f"matching {_short(pattern)}", waited)
            why = self.m.match(pattern, obj)
            if why is None:
                return
            if self._ignored(obj, ignore):
                continue
            raise _Failure("expect.mismatch", f"expected {_short(pattern)}; got {_short(obj)} ({why})")

    def step_expect_unordered(self, step: dict[str, Any]) -> None:
        left = list(step["expect_unordered"])
        ignore = step.get("ignore", DEFAULT_IGNORE)
        deadline, waited = self._deadline(step)
        while left:
            obj = self._frame_or_fail(deadline, f"matching {len(left)} more of {_short(left)}", waited)
            for i, p in enumerate(left):
                if self.m.match(p, obj) is None:
                    del left[i]
                    break
            else:
                if not self._ignored(obj, ignore):
                    raise _Failure("expect.mismatch", f"got {_short(obj)}, which matches none of the frames still expected: {_short(left)}")

    def step_expect_none(self, step: dict[str, Any]) -> None:
        ms = step["expect_none"]
        ignore = step.get("ignore", DEFAULT_IGNORE)
        deadline = time.monotonic() + ms / 1000
        while True:
            obj = self.next_frame(deadline)
            if obj is _TIMEOUT:
                return
            if obj is _EOF:
                self.proc.poll()
                code = f" (exit status {self.proc.returncode})" if self.proc.exited else ""
                raise _Failure("process.exited", f"the component closed its stdout{code} (expected it to stay quiet and alive for {ms} ms)")
            if not self._ignored(obj, ignore):
                raise _Failure("expect.unexpected-frame", f"expected no frame within {ms} ms, got {_short(obj)}")

    def step_expect_count(self, step: dict[str, Any]) -> None:
        pattern = step["expect_count"]
        want = step.get("count", 1)
        deadline, _ = self._deadline(step)

        def count() -> int:
            return sum(self.m.match(pattern, o) is None for o in self.received)

        n = count()
        while n < want:
            obj = self.next_frame(deadline)
            if obj is _TIMEOUT or obj is _EOF:
                raise _Failure("expect.count", f"expected {want} frame(s) matching {_short(pattern)} in this conversation, got {n}")
            n = count()
        if n > want:
            raise _Failure("expect.count", f"expected {want} frame(s) matching {_short(pattern)} in this conversation, got {n}")

    def step_close_stdin(self, step: dict[str, Any]) -> None:
        self.cpu_at_close = self.proc.cpu_seconds()
        self.closed_at = time.monotonic()
        self.proc.close_stdin()
        self.transcript.append(("->", b"", "[stdin closed]"))

    def step_sleep(self, step: dict[str, Any]) -> None:
        time.sleep(step["sleep"] / 1000)

    def step_expect_exit(self, step: dict[str, Any]) -> None:
        code = step["expect_exit"]
        within = step.get("within_ms", 2000) / 1000 * self.scale
        start = self.closed_at if self.closed_at is not None else time.monotonic()
        cpu0 = getattr(self, "cpu_at_close", None) if self.closed_at is not None else self.proc.cpu_seconds()
        deadline = start + within
        while not self.proc.poll():
            now = time.monotonic()
            if now >= deadline:
                cpu = self.proc.cpu_seconds()
                spin = ""
                if cpu is not None and cpu0 is not None:
                    spin = f"; it used {cpu - cpu0:.2f} s of CPU meanwhile"
                after = " of stdin EOF (§5.4)" if self.closed_at is not None else ""
                raise _Failure("process.exit", f"the component did not exit within {within * 1000:.0f} ms{after}{spin}")
            # Frames written before exit are read (and checked), never awaited.
            r = self.next_frame(min(deadline, now + 0.02))
            if r is _EOF:
                time.sleep(0.01)
        elapsed = time.monotonic() - start
        cpu1 = self.proc.cpu_at_exit
        if cpu0 is not None and cpu1 is not None:
            used = cpu1 - cpu0
            if used > 0.3 and used > 0.5 * elapsed:
                raise _Failure("process.spin", f"the component used {used:.2f} s of CPU in the {elapsed:.2f} s before it exited after stdin EOF (§5.4: exit promptly, do not spin)")
        # Drain what it wrote (EOF follows promptly unless a child holds the pipe).
        drain = time.monotonic() + _EXIT_DRAIN * self.scale
        while self.next_frame(drain) not in (_TIMEOUT, _EOF):
            pass
        if code is not None and self.proc.returncode != code:
            raise _Failure("process.exit-code", f"the component exited with status {self.proc.returncode}, expected {code}")

    def _check_pid_file(self, if_written: bool) -> None:
        """§2.3: an empty regular file ``<pidDir>/<pid>``. storm.py and storm.rb
        create it just *after* their pid reply, so it is awaited for a grace
        (--timeout stretches it) from the pid reply on. ``if_written``: a pidDir
        left empty passes (only handshake.pid-file requires the file: neither
        Storm nor our host reads it); whatever was written must be right."""
        path = os.path.join(self.proc.pid_dir, str(self.pid))
        grace = _PID_FILE_GRACE * self.scale
        deadline = (self.pid_at if self.pid_at is not None else time.monotonic()) + grace

        def entries() -> list[str]:
            try:
                return sorted(os.listdir(self.proc.pid_dir))
            except OSError:
                return []

        while not os.path.lexists(path) and time.monotonic() < deadline:
            if if_written and entries():
                break  # something else was written: judged below
            time.sleep(0.02)
        if not os.path.lexists(path):
            found = entries()
            if if_written and not found:
                return
            raise _Failure("handshake.pid-file", f"no pid file {str(self.pid)!r} in pidDir within {grace:.1f} s of the pid reply (§2.3); "
                                                 f"pidDir holds {found or 'nothing'}")
        if not os.path.isfile(path) or os.path.islink(path):
            raise _Failure("handshake.pid-file", f"the pid file {str(self.pid)!r} is not a regular file (§2.3)")
        size = os.path.getsize(path)
        if size:
            raise _Failure("handshake.pid-file", f"the pid file {str(self.pid)!r} must be empty, it holds {size} bytes (§2.3)")

    def step_check(self, step: dict[str, Any]) -> None:
        what = step["check"]
        if not self.got_pid:
            raise VectorBug(f"check {what!r} before the handshake")
        if what in ("pid-file", "pid-file-if-written"):
            self._check_pid_file(if_written=what == "pid-file-if-written")
        elif what == "pid-alive":
            if type(self.pid) is not int or self.pid <= 0:
                raise _Failure("handshake.pid-alive", f"pid {self.pid!r} is not a positive integer")
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                raise _Failure("handshake.pid-alive", f"the pid reply names {self.pid}, but no such process exists (§2.3)") from None
            except PermissionError:
                pass
        else:
            raise VectorBug(f"unknown check {what!r}")


# ---------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------


def _probe(argv: Sequence[str], timeout: float, env, cwd) -> tuple[str | None, str | None, bool]:
    """Start the component once: does it answer the handshake, and is it a
    scripted conformance component (its ready line)? -> (mode, lang, got_pid)."""
    proc = _Process(argv, env, cwd)
    try:
        reader = FrameReader()
        bodies: list[bytes] = []
        frame = {"pidDir": proc.pid_dir, "conf": DEFAULT_CONF, "context": DEFAULT_CONTEXT[Role.BOLT]}
        try:
            proc.write(_encode_frame(frame, {}), time.monotonic() + max(timeout, _MIN_HANDSHAKE_WAIT * _scale(timeout)))
        except _Failure:
            return None, None, False

        def frame_by(deadline: float) -> bytes | None:
            while not bodies:
                chunk = proc.read(deadline)
                if chunk is _TIMEOUT or not chunk:
                    return None
                try:
                    bodies.extend(reader.feed(chunk))
                except ProtocolError:
                    return None
            return bodies.pop(0)

        first = frame_by(time.monotonic() + max(timeout, _MIN_HANDSHAKE_WAIT * _scale(timeout)))
        if first is None:
            return None, None, False
        try:
            got_pid = type(decode_component_frame(first)) is Pid
        except ProtocolError:
            got_pid = False
        if not got_pid:
            return None, None, True  # it answered (wrongly): the vectors will say how
        second = frame_by(time.monotonic() + _READY_WAIT * _scale(timeout))
        if second is None:
            return None, None, True
        try:
            obj = loads(second)
        except ProtocolError:
            return None, None, True
        if type(obj) is dict and obj.get("command") == "log" and type(obj.get("msg")) is str:
            m = READY_RE.match(obj["msg"])
            if m:
                return m.group(1), m.group(2), True
        return None, None, True
    finally:
        proc.kill()


def _applicable(v: Vector, role: str, mode: str | None) -> str | None:
    """None if ``v`` runs against this component, else why not."""
    if v.role != "any" and v.role != role:
        return f"a {v.role} vector; the component runs as a {role}"
    if v.requires != "protocol" and v.requires != mode:
        return f"needs the scripted conformance component in mode {v.requires}"
    return None


def _run_vector(v: Vector, argv, role: Role, timeout: float, handshake_timeout: float, env, cwd) -> CheckResult:
    result = CheckResult(id=v.id, title=v.title, spec=v.spec, file=v.file, status=PASSED, level=v.level)
    t0 = time.monotonic()
    proc = _Process(argv, env, cwd)
    run = _Run(v, proc, role, timeout, handshake_timeout)
    run.where = ""
    try:
        run.run()
    except _Failure as f:
        result.status, result.rule, result.reason = FAILED, f.rule, f.reason
    except _NotApplicable as na:
        result.status, result.reason = NOT_APPLICABLE, str(na)
    except VectorBug as exc:
        result.status, result.rule, result.reason = FAILED, "vector.error", f"the vector is wrong: {exc}"
    finally:
        proc.kill()
        result.duration = time.monotonic() - t0
    if result.status == FAILED:
        result.step = run.where
        result.frames = [f"{d} {_show(b)}{note}" for d, b, note in run.transcript[-_SHOW_FRAMES:]]
        if len(run.transcript) > _SHOW_FRAMES:
            result.frames.insert(0, f"... {len(run.transcript) - _SHOW_FRAMES} earlier frames")
        result.stderr = proc.stderr_tail()
    return result


def run_conformance(
    argv: Sequence[str],
    role: str | None = None,
    *,
    vectors_dir: str | os.PathLike[str] | None = None,
    timeout: float = 2.0,
    select: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    strict: bool = False,
) -> Report:
    """Run the conformance vectors against the component command ``argv``.

    ``role`` is ``"bolt"`` or ``"spout"``; ``None`` means: a scripted
    conformance component's ready line decides, else ``"bolt"``. ``timeout``
    bounds each wait for a frame (seconds); above the default 2 s it also
    stretches every other wait in proportion (handshake, ready line, exit,
    pid file). ``select`` keeps only vectors whose id contains it. ``strict``
    makes failed recommended checks fail the run (``report.ok``). Raises :class:`ConformError` if the vectors cannot be
    loaded or the command cannot be started.
    """
    if not argv:
        raise ConformError("no component command given")
    if role not in (None, "bolt", "spout"):
        raise ConformError(f"role must be 'bolt' or 'spout', not {role!r}")
    t0 = time.monotonic()
    vectors = load_vectors(vectors_dir)
    if select:
        vectors = [v for v in vectors if select in v.id]
    cwd_s = os.fspath(cwd) if cwd is not None else None
    mode, lang, answered = _probe(argv, timeout, env, cwd_s)
    if role is None:
        role = "spout" if mode == "spout" else "bolt"
    report = Report(argv=list(argv), role=role, mode=mode, lang=lang, strict=strict)
    # A component that never answered the probe gets the short wait, so that a
    # silent command costs --timeout per vector, not the handshake allowance.
    handshake_timeout = max(timeout, _MIN_HANDSHAKE_WAIT * _scale(timeout)) if answered else timeout
    r = Role(role)
    for v in vectors:
        why = _applicable(v, role, mode)
        if why:
            report.results.append(CheckResult(id=v.id, title=v.title, spec=v.spec, file=v.file, status=NOT_APPLICABLE,
                                              reason=why, level=v.level))
            continue
        report.results.append(_run_vector(v, argv, r, timeout, handshake_timeout, env, cwd_s))
    report.duration = time.monotonic() - t0
    return report


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


@click.command(
    "conform",
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
)
@click.option("--role", type=click.Choice(["bolt", "spout"]), default=None,
              help="What the component is. Default: from a conformance component's ready line, else bolt.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "junit"]), default="text", show_default=True,
              help="Report format (written to stdout).")
@click.option("--vectors", "vectors_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory of vector files. Default: the vectors shipped with the package (spec/vectors).")
@click.option("--timeout", type=click.FloatRange(min=0.05, max=600), default=2.0, show_default=True,
              help="Seconds to wait for each expected frame; above 2 it also stretches every other wait "
                   "(handshake, ready line, exit, pid file) in proportion. A slow component: --timeout 10.")
@click.option("--strict", is_flag=True, default=False,
              help="Failed recommended checks fail the run too (reported as FAIL, not WARN).")
@click.option("-k", "select", metavar="SUBSTRING", default=None, help="Run only vectors whose id contains SUBSTRING.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def conform_command(role, fmt, vectors_dir, timeout, strict, select, cmd) -> None:  # fmt: skip
    """Check that a component speaks the multilang protocol.

    Plays the host against CMD (started once per vector, no shell) and runs
    the vectors of spec/vectors. Any component gets the protocol checks; a
    scripted conformance component (spec/CONFORMANCE.md) also gets the API
    checks of its mode.

        multilang conform -- python my_bolt.py

        multilang conform --role spout -- node my_spout.js

    Checks are required, recommended or extension (spec/CONFORMANCE.md): a
    failed recommended check is a warning (WARN) unless --strict.

    Exit status: 0 if no required or extension check failed (and, with
    --strict, no recommended one), 1 otherwise, 2 on usage errors.
    """
    try:
        report = run_conformance(list(cmd), role, vectors_dir=vectors_dir, timeout=timeout, select=select,
                                 strict=strict)
    except ConformError as exc:
        raise click.UsageError(str(exc)) from None
    if select and not report.results:
        raise click.UsageError(f"no vector id contains {select!r}")
    if fmt == "json":
        click.echo(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    elif fmt == "junit":
        click.echo(report.to_junit())
    else:
        click.echo(report.to_text())
    sys.exit(0 if report.ok else 1)
