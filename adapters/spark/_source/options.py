"""What the user configures for the multilang streaming source: its options
(``_Options.parse``) and the schema, i.e. how a spout tuple becomes a row and
whether it fits (``_RowConverter``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, overload

from pyspark.sql.types import StringType, StructField, StructType

from multilang.codec import dumps

#: the component id the spout's context gives the Spark query that consumes its stream
CONSUMER_COMPONENT = "spark"


#: The format name: ``spark.readStream.format(FORMAT)``.
FORMAT = "multilang"
#: The optional column holding the message id as JSON text.
MSG_ID_COLUMN = "_msg_id"
#: With ``valuesFormat=json``: the column holding a tuple's values as one JSON array text.
VALUES_COLUMN = "_values"
#: ``valuesFormat``: one string column per declared field, or one JSON array column.
VALUES_FORMATS = ("columns", "json")
#: ``dedupe``: drop an id logged ever before (the default), only one still in flight, or nothing.
DEDUPE_MODES = ("all", "inflight", "none")
#: The most tasks one spout component may have (as the embedded engine allows).
MAX_PARALLELISM = 4096


class _OptionError(ValueError):
    pass


def _json_option(options: Any, key: str, kind: type, default: Any) -> Any:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise _OptionError(f"option {key!r} must be JSON ({kind.__name__}): {exc}; got {raw!r}") from None
    if not isinstance(value, kind):
        raise _OptionError(f"option {key!r} must be a JSON {kind.__name__}, got {raw!r}")
    return value


@overload
def _int_option(options: Any, key: str, default: int, minimum: int = 1) -> int: ...


@overload
def _int_option(options: Any, key: str, default: None, minimum: int = 1) -> int | None: ...


def _int_option(options: Any, key: str, default: int | None, minimum: int = 1) -> int | None:
    raw = options.get(key)
    if raw is None or str(raw).strip().lower() in ("", "none", "null"):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _OptionError(f"option {key!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise _OptionError(f"option {key!r} must be >= {minimum}, got {value}")
    return value


def _bool_option(options: Any, key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise _OptionError(f"option {key!r} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class _Options:
    argv: list[str]
    fields: list[str] | None
    cwd: str | None
    #: an archive shipped with the job (SparkContext.addArchive): ``cwd`` is relative to its unpacked copy
    archive: str | None
    env: dict[str, str]
    conf: dict[str, Any]
    max_batch_size: int
    max_pending: int | None
    #: the most tuples one run of the query reads (from its start or restart); None: no limit
    max_tuples: int | None
    max_batch_duration: float
    replay_log: str | None
    dedupe: str
    include_msg_id: bool
    stream: str
    component: str
    available_now_idle: float
    task_index: int = 0
    parallelism: int = 1
    values_format: str = "columns"
    dedupe_cache_mb: int = 16

    # Task ids, as the embedded engine numbers a component with ``parallelism``
    # tasks (shellbolt/_model/topology.py): consecutive ids from the component's first,
    # task index i being the (i+1)-th. The source's topology is this spout
    # (ids 1..parallelism) and its consumer "spark" (the next id).

    @property
    def task_ids(self) -> list[int]:
        """The ids of the spout component's tasks, by task index."""
        return list(range(1, self.parallelism + 1))

    @property
    def task_id(self) -> int:
        """This spout process's task id (its context's ``taskid``)."""
        return self.task_index + 1

    @property
    def consumer_task(self) -> int:
        """The task id of the consumer, the answer to ``need_task_ids`` emits."""
        return self.parallelism + 1

    @classmethod
    def parse(cls, options: Any) -> "_Options":
        if options.get("command") is None:
            raise _OptionError('option "command" is required: a JSON array of argv, e.g. \'["python", "spout.py"]\'')
        argv = _json_option(options, "command", list, None)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise _OptionError(f'option "command" must be a non-empty JSON array of strings, got {options.get("command")!r}')
        raw_fields = options.get("fields")
        fields = [f.strip() for f in raw_fields.split(",") if f.strip()] if raw_fields is not None else None
        if fields is not None and (not fields or len(set(fields)) != len(fields)):
            raise _OptionError(f'option "fields" must name distinct fields, comma-separated; got {raw_fields!r}')
        env = _json_option(options, "env", dict, {})
        dedupe = (options.get("dedupe") or "all").strip().lower()
        if dedupe not in DEDUPE_MODES:
            raise _OptionError(f'option "dedupe" must be all (the default), inflight or none; got {options.get("dedupe")!r}')
        component = options.get("component") or "spout"
        if component == CONSUMER_COMPONENT:
            raise _OptionError(
                f'option "component" must not be {CONSUMER_COMPONENT!r}: the spout\'s context names the Spark '
                f"query (its consumer) {CONSUMER_COMPONENT!r}; choose another component id"
            )
        parallelism = _int_option(options, "parallelism", 1)
        if parallelism > MAX_PARALLELISM:
            raise _OptionError(f'option "parallelism" must be at most {MAX_PARALLELISM}, got {parallelism}')
        task_index = _int_option(options, "taskIndex", 0, minimum=0)
        if task_index >= parallelism:
            raise _OptionError(
                f'option "taskIndex" must be below option "parallelism" ({parallelism}): task indexes '
                f"run 0..{parallelism - 1}; got {task_index}"
            )
        values_format = (options.get("valuesFormat") or "columns").strip().lower()
        if values_format not in VALUES_FORMATS:
            raise _OptionError(f'option "valuesFormat" must be columns or json; got {options.get("valuesFormat")!r}')
        if values_format == "json" and fields is None:
            raise _OptionError(
                'option "fields" is required with valuesFormat=json: the spout stream\'s declared field '
                "names, comma-separated (they fix the tuples' arity)"
            )
        return cls(
            argv=argv,
            fields=fields,
            cwd=options.get("cwd") or None,
            archive=options.get("archive") or None,
            env={str(k): str(v) for k, v in env.items()},
            conf=_json_option(options, "conf", dict, {}),
            max_batch_size=_int_option(options, "maxBatchSize", 1000),
            max_pending=_int_option(options, "maxPending", None),
            max_tuples=_int_option(options, "maxTuples", None, minimum=0),
            max_batch_duration=_int_option(options, "maxBatchDurationMs", 500) / 1000.0,
            replay_log=options.get("replayLog"),
            dedupe=dedupe,
            include_msg_id=_bool_option(options, "includeMsgId", False),
            stream=options.get("stream") or "default",
            component=component,
            available_now_idle=_int_option(options, "availableNowIdleMs", 200, minimum=0) / 1000.0,
            task_index=task_index,
            parallelism=parallelism,
            values_format=values_format,
            dedupe_cache_mb=_int_option(options, "dedupeCacheMb", 16),
        )

    def json_schema(self) -> StructType:
        """The schema with ``valuesFormat=json``: the values as one JSON array text, and the message id if asked."""
        cols = [StructField(VALUES_COLUMN, StringType(), True)]
        if self.include_msg_id:
            cols.append(StructField(MSG_ID_COLUMN, StringType(), True))
        return StructType(cols)


def _json_text(value: Any) -> str:
    return dumps(value).decode("utf-8")


class _RowConverter:
    """Spout values -> a row of the output schema; and a fit check done on the
    driver when a tuple arrives, so a bad tuple is failed to the spout instead
    of poisoning a logged batch."""

    def __init__(self, schema: StructType, fields: list[str], values_format: str = "columns",
                 include_msg_id: bool = False) -> None:
        self.arity = len(fields)
        self._json = values_format == "json"
        self._verify = None
        if self._json:
            self._check_json_schema(schema, include_msg_id)
            self._with_id = include_msg_id
            return
        index = {f: i for i, f in enumerate(fields)}
        self._plan: list[tuple[int, bool]] = []  # (-1 = msg id | field index, as string?)
        for col in schema.fields:
            if col.name == MSG_ID_COLUMN and col.name not in index:
                if not isinstance(col.dataType, StringType):
                    raise _OptionError(f"column {MSG_ID_COLUMN!r} holds the message id as JSON text: make it a string")
                self._plan.append((-1, True))
            elif col.name in index:
                self._plan.append((index[col.name], isinstance(col.dataType, StringType)))
            else:
                raise _OptionError(
                    f"schema column {col.name!r} is neither a declared field {fields} nor {MSG_ID_COLUMN!r}"
                )
        try:  # a private helper of pyspark; without it, bad values surface in Spark instead
            from pyspark.sql.types import _make_type_verifier

            self._verify = _make_type_verifier(schema)
        except Exception:  # pragma: no cover
            pass

    @staticmethod
    def _check_json_schema(schema: StructType, include_msg_id: bool) -> None:
        want = [VALUES_COLUMN] + ([MSG_ID_COLUMN] if include_msg_id else [])
        got = [(c.name, c.dataType.simpleString()) for c in schema.fields]
        if got != [(name, "string") for name in want]:
            shape = ", ".join(f"{name} string" for name in want)
            raise _OptionError(
                f"with valuesFormat=json the schema must be exactly ({shape})"
                f"{' (includeMsgId=true adds ' + MSG_ID_COLUMN + ')' if not include_msg_id else ''}; "
                f"got ({', '.join(f'{n} {t}' for n, t in got)}). Leave out .schema(...) to get it, "
                "or use valuesFormat=columns for a column per field"
            )

    def row(self, msg_id: Any, values: list[Any]) -> tuple:
        if self._json:
            text = _json_text(values)
            if self._with_id:
                return (text, None if msg_id is None else _json_text(msg_id))
            return (text,)
        out = []
        for i, as_string in self._plan:
            if i < 0:
                out.append(None if msg_id is None else _json_text(msg_id))
            else:
                v = values[i]
                out.append(_json_text(v) if as_string and v is not None and not isinstance(v, str) else v)
        return tuple(out)

    def problem(self, msg_id: Any, values: list[Any]) -> str | None:
        """Why a tuple cannot become a row, or None."""
        if len(values) != self.arity:
            return f"tuple has {len(values)} values, the declared fields have {self.arity}"
        if self._verify is not None:
            try:
                self._verify(self.row(msg_id, values))
            except (TypeError, ValueError) as exc:
                return f"tuple does not fit the schema: {exc}"
        return None
