"""DataFrames over Arrow: ``multilang_bolts``/``apply_bolts``, a transform
running the bolts with ``mapInArrow``: the input columns chosen by name
(``input_cols``), key columns carried through (``keep``), the output schema
given or inferred from the declared fields, and the record batches built
from the released outputs against it.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Sequence

import orjson

from multilang.errors import TopologyError
from multilang.shellbolt import ANY_FIELDS

from .._engine.counters import COUNTERS_COLUMN, BoltCounters, _default_counters
from .._engine.lease import _Dead, _Row
from .._engine.pool import _run_partition
from .._engine.spec import DEAD_LETTER_COLUMNS, OutputSchemaError, _make_spec, _Options, _options, _short, _Spec


@dataclass
class _Layout:
    """Where things are in the batches in and out of ``mapInArrow``. In:
    the ``input_cols`` first (the tuple's values), then the ``keep``
    columns not among them. Out: the ``keep`` columns, the output fields,
    the dead-letter columns, the counters column (Spark Connect)."""

    input_fields: list[str]
    decimal_cols: list[int]  # input columns sent as floats (JSON has no decimals)
    keep_idx: list[int]  # positions of the keep columns in the batches in
    n_out: int
    json_text: bool  # the schema was inferred: every output field is a string, other values their JSON text
    dead: bool
    counters_row: bool

    @property
    def n_in(self) -> int:
        return len(self.input_fields)


class _ArrowFn:
    """The ``mapInArrow`` function: record batches in, record batches out."""

    def __init__(self, spec: _Spec, opts: _Options, counters: BoltCounters | None, schema_json: str,
                 layout: _Layout) -> None:
        self.spec = spec
        self.opts = opts
        self.counters = counters
        self.schema_json = schema_json
        self.layout = layout

    def _rows(self, batches: Iterable[Any]) -> Iterator[Any]:
        lay = self.layout
        n_in = lay.n_in
        for b in batches:
            cols = [c.to_pylist() for c in b.columns]
            ins = cols[:n_in]
            for j in lay.decimal_cols:  # the tuple's copy only: a kept decimal stays one
                ins[j] = [None if v is None else float(v) for v in ins[j]]
            values = map(list, zip(*ins))
            if lay.keep_idx:
                yield from zip(values, zip(*[cols[j] for j in lay.keep_idx]))
            else:
                yield from values

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        schema = to_arrow_schema(StructType.fromJson(orjson.loads(self.schema_json)), timezone="UTC")
        builder = _BatchBuilder(pa, schema, self.layout)
        limit = max(self.opts.batch_size, 1024)
        counters: dict[str, Any] = {}

        def report(c: dict[str, Any]) -> None:
            counters.update(c)
            if self.counters is not None:
                self.counters.add(c)

        add = builder.add if self.opts.keyed or self.layout.dead else None
        for out in _run_partition(self.spec, self.opts, self._rows(batches), report):
            if add is None:  # only (component, stream, values) records: no row marks, no dead letters
                builder.recs += out
            else:
                for rec in out:
                    add(rec)
            if builder.size >= limit:
                yield builder.flush()
        if builder.size:
            yield builder.flush()
        if self.layout.counters_row:  # Spark Connect: this partition's counters, for DataFrame.observe
            yield builder.counters_row(orjson.dumps(counters).decode())


def _json_text(v: Any) -> Any:
    """An output value for a string column of an inferred schema."""
    if v is None or type(v) is str:
        return v
    try:
        return orjson.dumps(v).decode()
    except TypeError:  # an integer past 64 bits
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


class _BatchBuilder:
    def __init__(self, pa: Any, schema: Any, layout: _Layout) -> None:
        self.pa = pa
        self.schema = schema
        self.lay = layout
        self.n_keep = len(layout.keep_idx)
        self.recs: list[Any] = []
        self.keys: list[Any] = []  # the keep values of each record (keyed)
        self.key: Any = None  # the keep values of the row whose outputs come now

    @property
    def size(self) -> int:
        return len(self.recs)

    def add(self, rec: Any) -> None:
        t = type(rec)
        if t is _Row:  # keyed: the row of the outputs that follow
            self.key = rec.key
            return
        if t is _Dead:
            if self.lay.dead:
                self.recs.append(rec)
                if self.n_keep:
                    self.keys.append(rec.key)
            return
        self._check_arity(rec)
        self.recs.append(rec)
        if self.n_keep:
            self.keys.append(self.key)

    def _check_arity(self, rec: Any) -> None:
        if len(rec[2]) != self.lay.n_out:
            names = [f.name for f in self.schema][self.n_keep: self.n_keep + self.lay.n_out]
            raise OutputSchemaError(
                f"component {rec[0]!r} emitted a tuple of {len(rec[2])} values on stream {rec[1]!r}, but the output "
                f"schema has {self.lay.n_out} fields {names}: {_short(rec[2])}. Emit exactly the schema's fields, "
                "in order, or change output_schema"
            )

    def flush(self) -> Any:
        pa = self.pa
        recs, self.recs = self.recs, []
        keys, self.keys = self.keys, []
        arrays = []
        for j in range(self.n_keep):
            f = self.schema.field(j)
            arrays.append(pa.array([None if k is None else k[j] for k in keys], type=f.type))
        n_out = self.lay.n_out
        if self.lay.dead:  # a dead letter is null in every output field
            rows = [None if type(r) is _Dead else r[2] for r in recs]
            if set(map(len, [v for v in rows if v is not None])) - {n_out}:
                for r in recs:
                    if type(r) is not _Dead:
                        self._check_arity(r)
            cols = [[None if v is None else v[j] for v in rows] for j in range(n_out)]
        else:
            rows = [r[2] for r in recs]
            if set(map(len, rows)) - {n_out}:
                for r in recs:
                    self._check_arity(r)
            cols = [[v[j] for v in rows] for j in range(n_out)]
        for j, col in enumerate(cols):
            f = self.schema.field(self.n_keep + j)
            if self.lay.json_text:
                col = [v if type(v) is str else _json_text(v) for v in col]
            try:
                arrays.append(pa.array(col, type=f.type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                self._explain(recs, j, f)
                raise
        if self.lay.dead:
            names = self.lay.input_fields
            status = ["dead_letter" if type(r) is _Dead else "ok" for r in recs]
            inputs = [orjson.dumps(dict(zip(names, r.values)) if len(names) == len(r.values)
                                   else r.values, default=str).decode() if type(r) is _Dead else None for r in recs]
            errors = [r.error if type(r) is _Dead else None for r in recs]
            arrays += [pa.array(status, pa.string()), pa.array(inputs, pa.string()), pa.array(errors, pa.string())]
        if self.lay.counters_row:
            arrays.append(pa.nulls(len(recs), pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def counters_row(self, text: str) -> Any:
        """One row: nulls, and the partition's counters in the counters column."""
        pa = self.pa
        arrays = [pa.nulls(1, f.type) for f in self.schema][:-1] + [pa.array([text], pa.string())]
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


# --- what the user wrote, checked --------------------------------------------------------


def _names(value: Any, what: str, *, empty_ok: bool) -> list[str] | None:
    """``input_cols``/``keep`` as a list of column names (a string is one name)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list of column names, e.g. {what}=['id'], got {value!r}")
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        raise TypeError(f"{what} must hold column names (non-empty strings), got {bad[0]!r} in {list(value)!r}; "
                        "select or rename expressions first (df.select(...), df.withColumn(...))")
    if not value and not empty_ok:
        raise ValueError(f"{what}=[] names no column: the bolt would get tuples without values; name at least one")
    dup = sorted({v for v in value if list(value).count(v) > 1})
    if dup:
        raise ValueError(f"{what} names {dup} more than once: {list(value)!r}")
    return list(value)


def _check_schema_arg(schema: Any) -> None:
    from pyspark.sql.types import StructType

    if schema is None or isinstance(schema, StructType):
        return
    if isinstance(schema, str) and schema.strip():
        return
    raise TypeError(f"output_schema must be a StructType or a DDL string like 'word string, count bigint' (or None "
                    f"to infer it from the bolt's fields), got {schema!r}")


def _as_struct(schema: Any) -> Any:
    from pyspark.sql.types import DataType, StructType

    if isinstance(schema, StructType):
        struct = schema
    elif isinstance(schema, str):
        try:
            struct = DataType.fromDDL(schema)
        except Exception as exc:  # noqa: BLE001 - Spark's parse error: long, with a stack
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            raise ValueError(f"output_schema {schema!r} is not a DDL schema ({first}); write it like "
                             "'word string, count bigint'") from None
        if not isinstance(struct, StructType):
            struct = None
    else:
        struct = None
    if struct is None:
        raise TypeError(f"output_schema must be a StructType or a DDL string like 'word string, count bigint', "
                        f"got {schema!r}")
    if not struct.fields:
        raise ValueError("output_schema has no fields")
    return struct


def _quote(name: str) -> str:
    """A column reference to exactly this top-level name (dots included)."""
    return "`" + name.replace("`", "``") + "`"


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel for the first frame outside multilang and pyspark."""
    level, f = 1, sys._getframe(1)
    while f is not None and f.f_globals.get("__name__", "").startswith(("multilang.", "pyspark.")):
        f, level = f.f_back, level + 1
    return level


class _DataFrameTransform:
    """``df.transform(t)``: runs the bolts over ``df`` with ``mapInArrow``."""

    def __init__(self, spec: Any, output_schema: Any, input_cols: list[str] | None, keep: list[str] | None,
                 kw: dict[str, Any], opts: _Options, counters: BoltCounters | None) -> None:
        self.spec = spec
        self.output_schema = output_schema
        self.input_cols = input_cols
        self.keep = keep or []
        self.kw = kw
        self.opts = opts
        self.counters = counters

    def _resolve(self, df: Any, cols: list[str]) -> tuple[list[str], list[str]]:
        """``input_cols`` and ``keep`` as the DataFrame's own column names
        (found as Spark finds them: ignoring case unless
        ``spark.sql.caseSensitive``), checked before any job runs."""
        sensitive: bool | None = None

        def find(names: list[str], what: str) -> list[str]:
            nonlocal sensitive
            found, unknown = [], []
            for n in names:
                hits = [c for c in cols if c == n]
                if not hits:
                    if sensitive is None:
                        sensitive = str(df.sparkSession.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
                    if not sensitive:
                        hits = [c for c in cols if c.lower() == n.lower()]
                if len(hits) > 1:
                    raise TopologyError(f"{what}: column name {n!r} is ambiguous in the DataFrame, which has columns "
                                        f"{cols}; rename the duplicates first")
                if hits:
                    found.append(hits[0])
                else:
                    unknown.append(n)
            if unknown:
                hint = ""
                if any("," in n for n in unknown):
                    hint = f" ({what} takes a list of names: {what}=['a', 'b'])"
                elif any("." in n for n in unknown):
                    hint = " (names are top-level columns: select nested fields first, e.g. df.select('a.b'))"
                raise TopologyError(f"{what} names column(s) {unknown} that the DataFrame does not have; its columns "
                                    f"are {cols}{hint}")
            return found

        keep = find(self.keep, "keep")
        if self.input_cols is not None:
            return find(self.input_cols, "input_cols"), keep
        if len(set(cols)) != len(cols):
            raise TopologyError(f"the input DataFrame has duplicate column names {cols}; rename them first, or "
                                "pass input_cols")
        inputs = [c for c in cols if c not in keep]
        if not inputs:
            raise TopologyError(f"no column left to feed the bolt: the DataFrame's columns are {cols} and keep "
                                f"takes {keep}; pass input_cols")
        if len(inputs) > 1:
            warnings.warn(
                f"multilang_bolts: no input_cols given, so every column {inputs} goes to the bolt, as the tuple's "
                "values in this order; pass input_cols=[...] to choose (and keep=[...] to carry columns such as "
                "an id through to the output)", UserWarning, stacklevel=_caller_stacklevel())
        return inputs, keep

    def _output_fields(self, s: _Spec) -> tuple[Any, bool]:
        """The output fields as a StructType, and whether they were inferred
        from the declared fields (every one a string)."""
        from pyspark.sql.types import StringType, StructField, StructType

        if self.output_schema is not None:
            schema = _as_struct(self.output_schema)
            n_out = len(schema.fields)
            for comp, stream in s.outputs:
                declared = s.fields_of(comp, stream)
                if declared != ANY_FIELDS and len(declared) != n_out:
                    raise TopologyError(
                        f"component {comp!r} declares {len(declared)} fields {declared} on stream {stream!r}, but "
                        f"the output schema has {n_out} fields {schema.fieldNames()}"
                    )
            return schema, False
        declared_by: dict[tuple[str, str], list[str]] = {}
        for comp, stream in s.outputs:
            declared = s.fields_of(comp, stream)
            if declared == ANY_FIELDS:
                raise TopologyError(
                    f"cannot infer output_schema: component {comp!r} declares no fields on stream {stream!r} (a "
                    "command's output fields are unknown until it runs); pass fields=['word', ...] (every field "
                    "becomes a string column) or output_schema='word string, ...'")
            declared_by[(comp, stream)] = list(declared)
        if len({tuple(v) for v in declared_by.values()}) > 1:
            found = {f"{c}/{st}": v for (c, st), v in declared_by.items()}
            raise TopologyError(f"cannot infer output_schema: the output streams declare different fields {found}; "
                                "pass output_schema, or output= to pick one component or stream")
        names = next(iter(declared_by.values()))
        return StructType([StructField(n, StringType(), True) for n in names]), True

    def __call__(self, df: Any) -> Any:
        from pyspark.sql import functions as F
        from pyspark.sql.types import BinaryType, DecimalType, StringType, StructField, StructType

        cols = list(df.columns)
        inputs, keep = self._resolve(df, cols)
        types = {f.name: f for f in df.schema.fields}
        decimal_cols = []
        for j, name in enumerate(inputs):
            t = types[name].dataType
            if isinstance(t, BinaryType):
                raise TopologyError(f"column {name!r} is binary, which has no JSON form; cast it (e.g. base64) "
                                    "first, or carry it through with keep")
            if isinstance(t, DecimalType):
                decimal_cols.append(j)
        s = _make_spec(self.spec, input_fields=inputs, **self.kw)
        out, inferred = self._output_fields(s)
        if self.opts.ship:
            s.ship(df.sparkSession)
        dead = self.opts.dead_letter == "column"
        out_names = out.fieldNames()
        dup = sorted({n for n in out_names if [m.lower() for m in out_names].count(n.lower()) > 1})
        if dup:
            raise TopologyError(f"the output fields {out_names} repeat {dup}; give every field its own name")
        reserved = {n.lower(): n for n in (*DEAD_LETTER_COLUMNS, COUNTERS_COLUMN)} if dead else \
            {COUNTERS_COLUMN.lower(): COUNTERS_COLUMN}
        for name in out_names:
            if name.lower() in reserved:
                raise TopologyError(f"output field {name!r} has the name of the column "
                                    f"{reserved[name.lower()]!r} that multilang_bolts adds; rename the field")
        taken = {n.lower(): n for n in out_names}
        for k in keep:
            if k.lower() in taken:
                raise TopologyError(
                    f"keep column {k!r} and output field {taken[k.lower()]!r} would share a name in the output; "
                    f"rename the column first (df.withColumnRenamed({k!r}, ...)) or the field (fields=/output_schema=)")
            if k.lower() in reserved:
                raise TopologyError(f"keep column {k!r} has the name of the column {reserved[k.lower()]!r} that "
                                    "multilang_bolts adds; rename it first")

        report_to_acc = self.counters._bind(df) if self.counters is not None else False
        counters_row = self.counters is not None and not report_to_acc
        every_null = dead or counters_row  # rows that are not outputs (dead letters, counters) hold nulls there
        fields = [StructField(k, types[k].dataType, True) for k in keep]
        fields += [StructField(f.name, f.dataType, True if every_null else f.nullable, f.metadata) for f in out.fields]
        if dead:
            fields += [StructField(c, StringType(), c != "_status" or counters_row) for c in DEAD_LETTER_COLUMNS]
        if counters_row:
            fields.append(StructField(COUNTERS_COLUMN, StringType(), True))
        schema = StructType(fields)

        selected = inputs + [k for k in keep if k not in inputs]
        if selected != cols:
            df = df.select(*[F.col(_quote(c)) for c in selected])
        layout = _Layout(input_fields=inputs, decimal_cols=decimal_cols, keep_idx=[selected.index(k) for k in keep],
                         n_out=len(out.fields), json_text=inferred, dead=dead, counters_row=counters_row)
        fn = _ArrowFn(s, replace(self.opts, keyed=bool(keep)), self.counters if report_to_acc else None,
                      schema.json(), layout)
        result = df.mapInArrow(fn, schema)
        if counters_row:
            result = self.counters._observe(result)  # type: ignore[union-attr]
        return result


def multilang_bolts(
    spec: Any,
    *,
    input_cols: Sequence[str] | str | None = None,
    keep: Sequence[str] | str | None = None,
    output_schema: Any = None,
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
    ship: bool = True,
) -> _DataFrameTransform:
    """A DataFrame transform running ``spec``'s bolts over ``mapInArrow``:
    ``df.transform(multilang_bolts(spec, input_cols=["text"], keep=["id"], fields=["word"]))``.

    Each row is one input tuple: its ``input_cols``, in that order, are the
    tuple's values and fields (default: every column not in ``keep``, with a
    warning when that is more than one). Each released output tuple becomes
    one row: the ``keep`` columns of the input row it came from (null for an
    unanchored emit), then the output fields. ``output_schema`` (a
    StructType or DDL string) types the output fields, by position; without
    it they are the last bolt's declared fields (``fields``), every one a
    string column holding a string value as is and any other value as its
    JSON text. A tuple of the wrong length or with a value of the wrong type
    fails the task with :class:`OutputSchemaError` naming the component, the
    stream and the tuple. ``dead_letter="column"`` adds
    :data:`DEAD_LETTER_COLUMNS`. Works on batch and streaming DataFrames,
    classic or Spark Connect. ``t.counters`` is the :class:`BoltCounters`.
    Commands run in ``resource_dir`` (default: the working directory),
    shipped to the executors when the transform is applied (``ship=False``:
    it is at the same path on every executor already; docs/DEPLOY.md).
    Unknown or clashing column names raise :class:`TopologyError` when the
    transform is applied, before any job runs.
    """
    opts = _options(max_retries, dead_letter, ordered, warm, stateful, max_in_flight, batch_size, idle_timeout,
                    ("column",), ship)
    in_names = _names(input_cols, "input_cols", empty_ok=False)
    keep_names = _names(keep, "keep", empty_ok=True)
    _check_schema_arg(output_schema)
    kw = dict(fields=fields, output=output, conf=conf, resource_dir=resource_dir, cwd=cwd, env=env,
              max_in_flight=max_in_flight)
    _make_spec(spec, input_fields=None, **kw)  # the spec and fields checked now, not first when applied
    return _DataFrameTransform(spec, output_schema, in_names, keep_names, kw, opts, _default_counters(counters))


def apply_bolts(df: Any, spec: Any, *, output_schema: Any = None, **options: Any) -> Any:
    """``multilang_bolts(spec, output_schema=..., **options)(df)``."""
    return multilang_bolts(spec, output_schema=output_schema, **options)(df)
