"""The conformance vectors as data: what a vector sees by default, loading
and checking ``spec/vectors/*.json`` (``Vector``, ``load_vectors``, ``$repeat``),
and the patterns of its expect steps (spec/vectors/README.md "Patterns")."""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._state import Role
from ._errors import ConformError, VectorBug
from ._report import EXTENSION, LEVELS, REQUIRED


def _default_vectors_dir() -> Path:
    """The vectors shipped with the package (``multilang/vectors/`` in a wheel:
    pyproject.toml maps spec/vectors there), else this checkout's spec/vectors
    (an editable install runs from the repository)."""
    here = Path(__file__).resolve().parent.parent  # the multilang package folder
    packaged = here / "vectors"
    if packaged.is_dir():
        return packaged
    return here.parent / "spec" / "vectors"


DEFAULT_VECTORS_DIR = _default_vectors_dir()

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
_REQUIRES = ("protocol", "bolt", "basic", "spout", "stateful")


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

