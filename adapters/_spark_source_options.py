"""What the user configures for the multilang streaming source: its options
(``_Options.parse``) and the schema, i.e. how a spout tuple becomes a row and
whether it fits (``_RowConverter``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StringType, StructType

from multilang.codec import dumps

#: The format name: ``spark.readStream.format(FORMAT)``.
FORMAT = "multilang"
#: The optional column holding the message id as JSON text.
MSG_ID_COLUMN = "_msg_id"


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
    env: dict[str, str]
    conf: dict[str, Any]
    max_batch_size: int
    max_pending: int | None
    max_batch_duration: float
    replay_log: str | None
    dedupe: str
    include_msg_id: bool
    stream: str
    component: str
    available_now_idle: float

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
        dedupe = (options.get("dedupe") or "inflight").strip().lower()
        if dedupe not in ("inflight", "all", "none"):
            raise _OptionError(f'option "dedupe" must be inflight, all or none; got {options.get("dedupe")!r}')
        return cls(
            argv=argv,
            fields=fields,
            cwd=options.get("cwd"),
            env={str(k): str(v) for k, v in env.items()},
            conf=_json_option(options, "conf", dict, {}),
            max_batch_size=_int_option(options, "maxBatchSize", 1000) or 1000,
            max_pending=_int_option(options, "maxPending", None),
            max_batch_duration=(_int_option(options, "maxBatchDurationMs", 500) or 500) / 1000.0,
            replay_log=options.get("replayLog"),
            dedupe=dedupe,
            include_msg_id=_bool_option(options, "includeMsgId", False),
            stream=options.get("stream") or "default",
            component=options.get("component") or "spout",
            available_now_idle=(_int_option(options, "availableNowIdleMs", 200, minimum=0) or 0) / 1000.0,
        )


def _json_text(value: Any) -> str:
    return dumps(value).decode("utf-8")


class _RowConverter:
    """Spout values -> a row of the output schema; and a fit check done on the
    driver when a tuple arrives, so a bad tuple is failed to the spout instead
    of poisoning a logged batch."""

    def __init__(self, schema: StructType, fields: list[str]) -> None:
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
        self.arity = len(fields)
        try:  # a private helper of pyspark; without it, bad values surface in Spark instead
            from pyspark.sql.types import _make_type_verifier

            self._verify = _make_type_verifier(schema)
        except Exception:  # pragma: no cover
            self._verify = None

    def row(self, msg_id: Any, values: list[Any]) -> tuple:
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
