"""DataFrames over Arrow: ``multilang_bolts``/``apply_bolts``, a transform
running the bolts with ``mapInArrow``, and the record batches built from
their outputs against the output schema.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Sequence

import orjson

from multilang.errors import TopologyError
from multilang.shellbolt.topology import ANY_FIELDS

from ._spark_counters import BoltCounters, _default_counters
from ._spark_lease import _Dead
from ._spark_pool import _run_partition
from ._spark_spec import DEAD_LETTER_COLUMNS, OutputSchemaError, _make_spec, _Options, _options, _short, _Spec


class _ArrowFn:
    """The ``mapInArrow`` function: record batches in, record batches out."""

    def __init__(self, spec: _Spec, opts: _Options, counters: BoltCounters | None, schema_json: str,
                 n_out: int, input_fields: list[str], decimal_cols: list[int]) -> None:
        self.spec = spec
        self.opts = opts
        self.counters = counters
        self.schema_json = schema_json
        self.n_out = n_out
        self.input_fields = input_fields
        self.decimal_cols = decimal_cols

    def _report(self, c: dict[str, Any]) -> None:
        if self.counters is not None:
            self.counters.add(c)

    def _rows(self, batches: Iterable[Any]) -> Iterator[list[Any]]:
        dec = self.decimal_cols
        for b in batches:
            cols = [c.to_pylist() for c in b.columns]
            for j in dec:
                cols[j] = [None if v is None else float(v) for v in cols[j]]
            yield from map(list, zip(*cols))

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        schema = to_arrow_schema(StructType.fromJson(orjson.loads(self.schema_json)), timezone="UTC")
        builder = _BatchBuilder(pa, schema, self.n_out, self.opts.dead_letter == "column", self.input_fields)
        limit = max(self.opts.batch_size, 1024)
        for out in _run_partition(self.spec, self.opts, self._rows(batches), self._report):
            for rec in out:
                builder.add(rec)
            if builder.size >= limit:
                yield builder.flush()
        if builder.size:
            yield builder.flush()


class _BatchBuilder:
    def __init__(self, pa: Any, schema: Any, n_out: int, dead: bool, input_fields: list[str]) -> None:
        self.pa = pa
        self.schema = schema
        self.n_out = n_out
        self.dead = dead
        self.input_fields = input_fields
        self.recs: list[Any] = []

    @property
    def size(self) -> int:
        return len(self.recs)

    def add(self, rec: Any) -> None:
        if type(rec) is _Dead:
            if self.dead:
                self.recs.append(rec)
            return
        if len(rec[2]) != self.n_out:
            names = [f.name for f in self.schema][: self.n_out]
            raise OutputSchemaError(
                f"component {rec[0]!r} emitted a tuple of {len(rec[2])} values on stream {rec[1]!r}, but the output "
                f"schema has {self.n_out} fields {names}: {_short(rec[2])}. Emit exactly the schema's fields, in "
                "order, or change output_schema"
            )
        self.recs.append(rec)

    def flush(self) -> Any:
        pa = self.pa
        recs, self.recs = self.recs, []
        arrays = []
        for j in range(self.n_out):
            f = self.schema.field(j)
            col = [None if type(r) is _Dead else r[2][j] for r in recs]
            try:
                arrays.append(pa.array(col, type=f.type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                self._explain(recs, j, f)
                raise
        if self.dead:
            status = ["dead_letter" if type(r) is _Dead else "ok" for r in recs]
            inputs = [orjson.dumps(dict(zip(self.input_fields, r.values)) if len(self.input_fields) == len(r.values)
                                   else r.values, default=str).decode() if type(r) is _Dead else None for r in recs]
            errors = [r.error if type(r) is _Dead else None for r in recs]
            arrays += [pa.array(status, pa.string()), pa.array(inputs, pa.string()), pa.array(errors, pa.string())]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _explain(self, recs: list[Any], j: int, f: Any) -> None:
        pa = self.pa
        for r in recs:
            if type(r) is _Dead:
                continue
            v = r[2][j]
            try:
                pa.array([v], type=f.type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise OutputSchemaError(
                    f"component {r[0]!r} emitted {_short(r[2])} on stream {r[1]!r}: value {v!r} "
                    f"({type(v).__name__}) does not fit field {f.name!r} of type {f.type} in the output schema "
                    f"({exc}). Emit that type or change output_schema"
                ) from None


def _as_struct(schema: Any) -> Any:
    from pyspark.sql.types import DataType, StructType

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        parsed = DataType.fromDDL(schema)
        if isinstance(parsed, StructType):
            return parsed
    raise TypeError(f"output_schema must be a StructType or a DDL string like 'word string, count bigint', got {schema!r}")


class _DataFrameTransform:
    """``df.transform(t)``: runs the bolts over ``df`` with ``mapInArrow``."""

    def __init__(self, spec: Any, output_schema: Any, kw: dict[str, Any], opts: _Options,
                 counters: BoltCounters | None) -> None:
        self.spec = spec
        self.output_schema = output_schema
        self.kw = kw
        self.opts = opts
        self.counters = counters

    def __call__(self, df: Any) -> Any:
        from pyspark.sql.types import BinaryType, DecimalType, StringType, StructField, StructType

        schema = _as_struct(self.output_schema)
        n_out = len(schema.fields)
        cols = list(df.columns)
        if len(set(cols)) != len(cols):
            raise TopologyError(f"the input DataFrame has duplicate column names {cols}; rename them first")
        decimal_cols = []
        for j, f in enumerate(df.schema.fields):
            if isinstance(f.dataType, BinaryType):
                raise TopologyError(f"column {f.name!r} is binary, which has no JSON form; cast it (e.g. base64) first")
            if isinstance(f.dataType, DecimalType):
                decimal_cols.append(j)
        s = _make_spec(self.spec, input_fields=cols, **self.kw)
        for comp, stream in s.outputs:
            declared = s.fields_of(comp, stream)
            if declared != ANY_FIELDS and len(declared) != n_out:
                raise TopologyError(
                    f"component {comp!r} declares {len(declared)} fields {declared} on stream {stream!r}, but the "
                    f"output schema has {n_out} fields {schema.fieldNames()}"
                )
        if self.opts.dead_letter == "column":
            clash = [c for c in DEAD_LETTER_COLUMNS if c in schema.fieldNames()]
            if clash:
                raise TopologyError(f"output_schema already has dead-letter column(s) {clash}")
            schema = StructType([StructField(f.name, f.dataType, True) for f in schema.fields]
                                + [StructField(c, StringType(), c != "_status") for c in DEAD_LETTER_COLUMNS])
        fn = _ArrowFn(s, self.opts, self.counters, schema.json(), n_out, cols, decimal_cols)
        return df.mapInArrow(fn, schema)


def multilang_bolts(
    spec: Any,
    *,
    output_schema: Any,
    fields: Sequence[str] | None = None,
    output: str | tuple[str, str] | None = None,
    conf: dict[str, Any] | None = None,
    resource_dir: str | os.PathLike[str] | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    max_retries: int = 3,
    dead_letter: str | None = None,
    ordered: bool = False,
    warm: bool = True,
    stateful: bool = False,
    max_in_flight: int = 1000,
    batch_size: int = 512,
    idle_timeout: float = 60.0,
    counters: BoltCounters | bool | None = None,
) -> _DataFrameTransform:
    """A DataFrame transform running ``spec``'s bolts over ``mapInArrow``:
    ``df.transform(multilang_bolts(spec, output_schema="word string"))``.

    Each row is one input tuple (its columns, in order, are the tuple's values
    and fields). Each released output tuple becomes one row of
    ``output_schema`` (a StructType or DDL string), by position; a tuple of
    the wrong length or with a value of the wrong type fails the task with
    :class:`OutputSchemaError` naming the component, the stream and the tuple.
    ``dead_letter="column"`` adds :data:`DEAD_LETTER_COLUMNS`. Works on batch
    and streaming DataFrames. ``t.counters`` is the :class:`BoltCounters`.
    """
    opts = _options(max_retries, dead_letter, ordered, warm, stateful, max_in_flight, batch_size, idle_timeout,
                    ("column",))
    kw = dict(fields=fields, output=output, conf=conf, resource_dir=resource_dir, cwd=cwd, env=env,
              max_in_flight=max_in_flight)
    return _DataFrameTransform(spec, output_schema, kw, opts, _default_counters(counters))


def apply_bolts(df: Any, spec: Any, *, output_schema: Any, **options: Any) -> Any:
    """``multilang_bolts(spec, output_schema=..., **options)(df)``."""
    return multilang_bolts(spec, output_schema=output_schema, **options)(df)
