"""multilang_bolts on DataFrames as a Spark user writes it: input columns by
name, key columns carried through (``keep``), the output schema inferred
from the declared fields, clear errors for what the user wrote wrong (before
any job runs), dead letters that carry only their own row's error, the
bolts' logs in the executor log (rate-limited errors, tagged with the Spark
task), and counters under Spark Connect. Real Python, Ruby and Node bolt
processes (tests/spark/components/bolts_*, examples/).

The log and Spark Connect checks need the driver's stderr and a session of
their own, so they run tests/spark/components/bolts_driver.py as a separate
process, started by the test that reads it: under pytest-xdist that test runs
beside the others anyway, and a start with the module's first test started
one driver per worker (three Spark Connect drivers on two cores, two of them
for nothing).
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from multilang.adapters.spark import DEAD_LETTER_COLUMNS, apply_bolts, multilang_bolts  # noqa: E402
from multilang.errors import TopologyError  # noqa: E402

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
COMPONENTS = HERE / "components"
EXAMPLES = HERE.parents[1] / "examples"
ROWS = ["python", str(COMPONENTS / "bolts_rows.py")]
ECHO = ROWS + ["echo"]
ECHO_FIELDS = ["values", "n", "none", "x"]
FAIL_RB = ["ruby", str(COMPONENTS / "bolts_fail.rb")]
RUBY_SPLIT = ["ruby", "ruby/split_bolt.rb"]
NODE_SPLIT = ["node", "node/split_bolt.js"]
DRIVER_WAIT = 300  # seconds: a bound on the driver process, which normally takes well under a minute


@pytest.fixture
def driver(tmp_path_factory):
    """bolts_driver.py under Spark Connect (see the module docstring); the
    test that reads it waits for it."""
    work = tmp_path_factory.mktemp("bolts-driver")
    # SPARK_TESTING: the local Connect server takes a free port, not 15002 (another driver may hold that one)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_TESTING": "1"}
    proc = subprocess.Popen([sys.executable, str(COMPONENTS / "bolts_driver.py"), "connect", str(work)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


# --- input_cols and keep ----------------------------------------------------------------------


def test_input_cols_feed_the_bolt_and_keep_carries_the_id_through(spark):
    """(id, text, other): the Ruby split gets only the text, and every word
    comes out with the id of the row it came from, in the id's type."""
    data = [(10, "the quick fox", "zzz"), (11, "jumps over", "yyy"), (12, "", "x"), (13, "the end", "w")]
    df = spark.createDataFrame(data, "id bigint, text string, other string").repartition(2)
    out = df.transform(multilang_bolts(RUBY_SPLIT, input_cols=["text"], keep=["id"], fields=["word"],
                                       resource_dir=EXAMPLES))
    assert [(f.name, f.dataType.simpleString()) for f in out.schema] == [("id", "bigint"), ("word", "string")]
    assert _rows(out) == sorted((i, w) for i, text, _ in data for w in text.split())


def test_keep_columns_keep_their_types_and_values_and_input_cols_their_order(spark):
    """Keep columns of any type (binary, decimal, timestamp, array, map,
    struct) come out as they went in, first and in keep's order; a column may
    be both fed and kept; input_cols are the tuple's values in their order
    (a decimal as a JSON number); the inferred output fields are strings,
    other values their JSON text."""
    ts = datetime.datetime(2026, 11, 25, 12, 30, 15, 250000)
    data = [(1, "a", decimal.Decimal("1.50"), bytearray(b"\x00\xff"), ts, ["p", "q"], {"k": 1}, (7, "s")),
            (2, "b", None, None, None, None, None, None)]
    schema = ("id bigint, text string, amount decimal(10,2), blob binary, ts timestamp, tags array<string>, "
              "m map<string,int>, st struct<a:int,b:string>")
    df = spark.createDataFrame(data, schema)
    keep = ["st", "m", "tags", "ts", "blob", "amount", "id"]
    out = df.transform(multilang_bolts(ECHO, input_cols=["text", "amount"], keep=keep, fields=ECHO_FIELDS))
    kinds = {f.name: f.dataType for f in df.schema}
    assert [(f.name, f.dataType) for f in out.schema] == [(k, kinds[k]) for k in keep] + [
        (n, kinds["text"]) for n in ECHO_FIELDS]
    want = {r["id"]: r for r in df.collect()}
    got = {r["id"]: r for r in out.collect()}
    assert set(got) == {1, 2}
    for i, row in got.items():
        assert [row[k] for k in keep] == [want[i][k] for k in keep]
    assert json.loads(got[1]["values"]) == ["a", 1.5] and json.loads(got[2]["values"]) == ["b", None]
    assert (got[1]["n"], got[1]["none"], got[1]["x"]) == ("2", None, "x")


def test_without_input_cols_every_column_goes_in_with_a_warning(spark):
    df = spark.createDataFrame([(7, "a")], "id int, Value string")
    with pytest.warns(UserWarning, match=r"no input_cols given, so every column \['id', 'Value'\] goes to the bolt"
                      ) as caught:
        out = df.transform(multilang_bolts(ECHO, fields=ECHO_FIELDS))
    assert caught[0].filename == __file__  # it points at the user's line, not into pyspark
    assert json.loads(out.collect()[0]["values"]) == [7, "a"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # keep takes the id: the one column left goes in, no warning
        row = df.transform(multilang_bolts(ECHO, keep=["id"], fields=ECHO_FIELDS)).collect()[0]
        assert (row["id"], json.loads(row["values"])) == (7, ["a"])
        # input_cols choose and order, finding names as Spark does (case-insensitively by default)
        row = apply_bolts(df, ECHO, input_cols=["value", "ID"], fields=ECHO_FIELDS).collect()[0]
        assert json.loads(row["values"]) == ["a", 7]


# --- dead letters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("lane", ["direct", "general"])
def test_a_dead_letter_names_only_its_own_rows_error(spark, lane):
    """200 rows; every third fails with an error naming its own value. Each
    dead letter's _error names that value and no other: the direct lane
    (one Python bolt) and the general one (the Python bolt, then Ruby)."""
    df = spark.createDataFrame([(i, f"v{i:03d}") for i in range(200)], "id int, value string").repartition(2)
    spec = ROWS + ["fail3"] if lane == "direct" else [ROWS + ["fail3"], FAIL_RB]
    t = multilang_bolts(spec, input_cols=["value"], keep=["id"], fields=["out"], dead_letter="column",
                        max_retries=1)
    rows = df.transform(t).collect()
    dead = {r["id"]: r for r in rows if r["_status"] == "dead_letter"}
    ok = sorted((r["id"], r["out"]) for r in rows if r["_status"] == "ok")
    assert set(dead) == {i for i in range(200) if i % 3 == 0}
    upper = str.upper if lane == "general" else str
    assert ok == [(i, upper(f"v{i:03d}")) for i in range(200) if i % 3]
    for i, r in dead.items():
        own = f"v{i:03d}"
        assert r["_input"] == json.dumps({"value": own}, separators=(",", ":")) and r["out"] is None
        assert f"ValueError: cannot take {own}" in r["_error"], r["_error"]
        assert re.findall(r"\bv\d{3}\b", r["_error"]) == [own], r["_error"]
        assert re.match(r"failed: failed by bolts_rows:\d+ \(pid \d+\): ", r["_error"]), r["_error"]
    c = t.counters.value
    assert (c["dead_letter"], c["acked"]) == (67, 133)


@pytest.mark.parametrize("lane", ["direct", "general"])
def test_a_crashed_rows_dead_letter_holds_its_process_stderr(spark, lane):
    """A row that kills its process every time, with rows in flight beside
    it: it is the one dead letter (the rows beside it, failed with it, are
    tried alone before anything is charged: a trial's 300 rows made 251 dead
    letters); its dead letter says that the process was lost, how it ended,
    and what it wrote to stderr; every other row comes out once."""
    values = [f"v{i:03d}" for i in range(200)]
    values.insert(60, "poison")
    df = spark.createDataFrame(list(enumerate(values)), "id int, value string").coalesce(1)
    spec = ROWS + ["crash"] if lane == "direct" else [ROWS + ["crash"], FAIL_RB]
    rows = df.transform(multilang_bolts(spec, input_cols=["value"], keep=["id"], fields=["out"],
                                        dead_letter="column", max_retries=1)).collect()
    upper = str.upper if lane == "general" else str
    assert sorted((r["id"], r["out"]) for r in rows if r["_status"] == "ok") == [
        (i, upper(v)) for i, v in enumerate(values) if v != "poison"]
    dead = [r for r in rows if r["_status"] == "dead_letter"]
    assert [r["id"] for r in dead] == [60]
    err = dead[0]["_error"]
    assert re.match(r"failed: bolts_rows:\d+'s process was lost: component 'bolts_rows' task \d+ \(pid \d+\): ",
                    err), err
    assert "(exit status 3)" in err and err.endswith("its stderr ended: dying on poison"), err


# --- what the user wrote, checked before any job runs ---------------------------------------------


def _clear(exc: BaseException) -> str:
    """The message of an error a user meets: ours, short, no JVM in it."""
    text = str(exc)
    assert isinstance(exc, (TypeError, ValueError, TopologyError)), repr(exc)
    assert "py4j" not in text.lower() and "org.apache" not in text and "Traceback" not in text, text
    assert len(text) < 800, text
    return text


@pytest.fixture(scope="module")
def small_df(spark):
    return spark.createDataFrame([(1, "a b", b"\x00")], "id int, value string, raw binary")


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(input_cols=["vlaue"]), TopologyError,
     r"input_cols names column\(s\) \['vlaue'\] that the DataFrame does not have; its columns are "
     r"\['id', 'value', 'raw'\]"),
    (dict(input_cols="id, value"), TopologyError, r"input_cols takes a list of names"),
    (dict(input_cols=["value"], keep=["ident"]), TopologyError, r"keep names column\(s\) \['ident'\]"),
    (dict(input_cols=["value.x"]), TopologyError, r"select nested fields first"),
    (dict(input_cols=[]), ValueError, r"input_cols=\[\] names no column"),
    (dict(input_cols=[1]), TypeError, r"input_cols must hold column names .* got 1"),
    (dict(input_cols=["value", "value"]), ValueError, r"input_cols names \['value'\] more than once"),
    (dict(keep={"id": 1}), TypeError, r"keep must be a list of column names"),
    (dict(input_cols=["raw"]), TopologyError, r"column 'raw' is binary.* or carry it through with keep"),
    (dict(input_cols=["value"], keep=["id"], fields=["id"]), TopologyError,
     r"keep column 'id' and output field 'id' would share a name"),
    (dict(input_cols=["value"], keep=["ID"], output_schema="Id int"), TopologyError,
     r"keep column 'id' and output field 'Id' would share a name"),
    (dict(input_cols=["value"], fields=["_error"], dead_letter="column"), TopologyError,
     r"output field '_error' has the name of the column '_error' that multilang_bolts adds"),
    (dict(input_cols=["value"], fields=None), TopologyError,
     r"cannot infer output_schema: component 'split_bolt' declares no fields .* pass fields=\['word', \.\.\.\]"),
    (dict(input_cols=["value"], output_schema="word strin"), ValueError,
     r"output_schema 'word strin' is not a DDL schema"),
    (dict(input_cols=["value"], output_schema=5), TypeError, r"output_schema must be a StructType or a DDL string"),
    (dict(input_cols=["value"], output_schema="int"), TypeError, r"output_schema must be a StructType"),
    (dict(input_cols=["value"], fields="a,b"), ValueError, r"fields must be a list of names, e.g. \['a', 'b'\]"),
    (dict(input_cols=["value"], fields=["a", 2]), TypeError, r"fields must be a list of non-empty field names"),
    (dict(input_cols=["value"], fields=["a", "A"]), TopologyError, r"repeat \['A', 'a'\]"),
])
def test_what_the_user_wrote_wrong_is_a_clear_error_before_any_job(small_df, kwargs, error, words):
    kwargs.setdefault("fields", ["word"])
    with pytest.raises(error) as info:
        small_df.transform(multilang_bolts(RUBY_SPLIT, resource_dir=EXAMPLES, **kwargs))
    assert re.search(words, _clear(info.value)), str(info.value)


_NAMES = st.one_of(st.sampled_from(["id", "value", "raw", "ID", "Value", "a.b", "`id`", "", " "]),
                   st.text(max_size=6))
_LISTS = st.one_of(st.none(), _NAMES, st.lists(_NAMES, max_size=3),
                   st.lists(st.one_of(st.integers(), st.none(), _NAMES), max_size=2), st.integers(),
                   st.dictionaries(_NAMES, st.integers(), max_size=1))
_SCHEMAS = st.one_of(st.none(), st.sampled_from(["word string", "word int", "id string", "a string, b string",
                                                 "int", "word strin", "_status string", "x array<string>"]),
                     st.text(max_size=12), st.integers())
_FIELDS = st.one_of(st.none(), st.lists(st.sampled_from(["word", "id", "w", "_input", "WORD"]), max_size=2),
                    st.sampled_from(["word", "a,b"]))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(input_cols=_LISTS, keep=_LISTS, output_schema=_SCHEMAS, fields=_FIELDS,
       dead_letter=st.sampled_from([None, "column"]))
def test_any_arguments_give_a_dataframe_or_a_clear_error(small_df, input_cols, keep, output_schema, fields,
                                                         dead_letter):
    """Whatever is passed for input_cols, keep, output_schema and fields,
    the transform either makes a DataFrame of the keep columns, the output
    fields and the dead-letter columns, or raises one of our errors with a
    short message, on the driver, before any job."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = small_df.transform(multilang_bolts(
                ["ruby", "split_bolt.rb"], input_cols=input_cols, keep=keep, output_schema=output_schema,
                fields=fields, dead_letter=dead_letter, resource_dir=EXAMPLES))
    except Exception as exc:  # noqa: BLE001 - what matters is which, and what it says
        _clear(exc)
        return
    kept = [keep] if isinstance(keep, str) else list(keep or [])
    dead = list(DEAD_LETTER_COLUMNS) if dead_letter else []
    assert [c.lower() for c in out.columns[:len(kept)]] == [k.lower() for k in kept]
    assert out.columns[len(out.columns) - len(dead):] == dead


# --- logs and Spark Connect: a driver process of its own ----------------------------------------

#: a line of the executor log: "26/11/25 22:19:27 INFO multilang.spark.split: ..." (found anywhere in a
#: line of stderr: another process may have left a partial line before it)
_HEADER = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (\w+) (\S+): (.*)$")


def _records(stderr: str) -> list[tuple[str, str, list[str]]]:
    """(level, logger, lines) of each record: a header line and the lines
    that follow it up to the next header (a traceback)."""
    out: list[tuple[str, str, list[str]]] = []
    for line in stderr.splitlines():
        m = _HEADER.search(line)
        if m:
            out.append((m.group(1), m.group(2), [m.group(3)]))
        elif out:
            out[-1][2].append(line)
    return out


@pytest.mark.xdist_group("spark")  # its Connect driver, after or before the shared session's tests (conftest.py)
def test_logs_land_in_the_executor_log_tagged_and_errors_rate_limited_and_counters_under_connect(driver):
    """Under Spark Connect, local[2] (bolts_driver.py):

    * a bolt's log() text, its stray print and its stderr lines are in the
      executor log (the worker's stderr) as INFO records of
      ``multilang.spark.<component>``, tagged with the Spark stage,
      partition, attempt and TID and with the component task and pid;
    * 2,000 rows failing with 2,000 different errors (the value is in the
      text) cost a bounded number of lines, with a count of the rest;
    * each dead letter names its own row's error;
    * a streaming DataFrame takes input_cols and keep too;
    * the counters come back through DataFrame.observe: batch in
      ``counters.value``; streaming from the query's progress, and
      ``counters.value`` says where they are."""
    out, err = driver.communicate(timeout=DRIVER_WAIT)
    assert driver.returncode == 0, err[-3000:]
    res = json.loads(out.strip().splitlines()[-1])
    assert res["session"].startswith("pyspark.sql.connect")
    records = _records(err)

    log = res["log"]
    assert log["columns"] == ["id", "value"] and log["rows"] == [[i, f"v{i:03d}"] for i in range(20)]
    mine = [" ".join(lines) for level, name, lines in records if name == "multilang.spark.bolts_rows"]
    tag = r"\[stage \d+ partition (\d) attempt 0 TID \d+\] \[bolts_rows:\d+ pid \d+\]"
    for i in range(20):
        for text in (f"took v{i:03d}", f"stray print v{i:03d}", f"stderr: stderr line v{i:03d}"):
            assert any(re.fullmatch(f"{tag} {text}", m) for m in mine), (text, mine[:5])
    assert {re.match(tag, m).group(1) for m in mine} == {"0", "1"}
    c = log["counters"]
    assert (c["rows_in"], c["acked"], c["tuples_out"]) == (20, 20, 20)

    fail = res["fail"]
    assert (fail["rows"], fail["dead"], fail["own_error"]) == (2000, 2000, 2000), fail["sample"]
    assert fail["counters"]["failed"] == 2000 and fail["counters"]["dead_letter"] == 2000
    errors = [(level, lines) for level, name, lines in records if name == "multilang.spark.bolts_fail"]
    assert errors and all(level == "ERROR" for level, _ in errors)
    assert len(errors) <= 40, [lines[0] for _, lines in errors]  # 2 tasks x (5 kinds + others + counts), per 10 s
    assert sum(len(lines) for _, lines in errors) <= 600  # was more than one line per row
    counts = [lines[0] for _, lines in errors if re.search(r"bolts_fail:1: \d+ more like this", lines[0])]
    # (each quotes the last line of its kind as it read, not the kind's mask: "the last: # crashed; ...", a trial)
    assert counts and all("the last: cannot take row bad" in c and "#" not in c for c in counts), counts

    stream = res["stream"]
    assert stream["rows"] == [[i, json.dumps([f"t{i}"])] for i in range(6)]
    assert "counters.from_progress(query.lastProgress)" in stream["value_error"]
    assert (stream["progress"]["rows_in"], stream["progress"]["acked"]) == (6, 6)
