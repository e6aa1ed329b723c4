"""The multilang Structured Streaming source (multilang.adapters.spark._source.source).

Real spout subprocesses (Python, Node) read through ``spark.readStream``; the
shared session-scoped ``spark`` fixture (tests/spark/conftest.py) runs them.
One test drives the stream reader directly, without Spark, to check crash
supervision, rejected tuples and replay byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import CaseInsensitiveDict  # noqa: E402
from pyspark.sql.streaming.datasource import ReadMaxRows  # noqa: E402

from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: E402

from multilang.adapters.spark._source.options import _OptionError
from multilang.adapters.spark._source.source import MultilangDataSource, register

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
PY_SENTENCES = ROOT / "examples" / "python" / "sentence_spout.py"
NODE_SENTENCES = ROOT / "examples" / "node" / "sentence_spout.js"
COMPONENTS = Path(__file__).resolve().parent / "components"
ACK_SPOUT = COMPONENTS / "ack_spout.py"
CONTEXT_SPOUT = COMPONENTS / "source_context_spout.py"
VALUES_SPOUT = COMPONENTS / "source_values_spout.py"
WAIT = 120  # seconds; a healthy query here takes a few


def write_lines(path: Path, n: int) -> list[tuple[int, str]]:
    """n distinct sentences with a blank line every 5th line; returns (line index, text)."""
    lines, out = [], []
    for i in range(n):
        if i % 5 == 4:
            lines.append("")
        else:
            text = f"sentence {i} the quick brown fox {i * 7919 % 101}"
            lines.append(text)
            out.append((i, text))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def multilang_stream(spark, argv, **options):
    register(spark)
    reader = spark.readStream.format("multilang").option("command", json.dumps([str(a) for a in argv]))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def finish(query) -> None:
    """Wait for an availableNow query; a hang fails the test instead of the suite."""
    try:
        assert query.awaitTermination(WAIT), f"query {query.name} did not finish within {WAIT}s"
    finally:
        if query.isActive:
            query.stop()


def batches_with_rows(query) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_python_sentence_spout_every_line_exactly_once(spark, tmp_path):
    expected = write_lines(tmp_path / "lines.txt", 15)
    df = multilang_stream(
        spark, ["python", PY_SENTENCES, tmp_path / "lines.txt"],
        fields="sentence", maxBatchSize=5, includeMsgId="true", replayLog=tmp_path / "replay",
    )
    assert df.columns == ["sentence", "_msg_id"]
    query = (df.writeStream.format("memory").queryName("ml_python_sentences")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    finish(query)
    rows = spark.sql("select sentence, _msg_id from ml_python_sentences").collect()
    # Every non-empty line once, with its message id (the line number, a JSON int).
    assert sorted((r["_msg_id"], r["sentence"]) for r in rows) == sorted((json.dumps(i), t) for i, t in expected)
    sizes = batches_with_rows(query)
    assert sum(sizes) == len(expected) and max(sizes) <= 5 and len(sizes) >= 3


def test_acks_reach_the_spout_only_after_the_batch_committed(spark, tmp_path):
    events = tmp_path / "events.jsonl"
    seen: list[tuple[int, list[str], set[str]]] = []

    def sink(batch_df, batch_id):
        ids = [r["_msg_id"] for r in batch_df.collect()]
        acked = {json.dumps(e["id"]) for e in read_events(events) if e["ev"] == "ack"}
        seen.append((batch_id, ids, acked))

    df = multilang_stream(
        spark, ["python", ACK_SPOUT, events, 12],
        fields="sentence", maxBatchSize=5, maxPending=5, includeMsgId="true", replayLog=tmp_path / "replay",
    )
    # The default trigger this time: Spark polls latestOffset until the spout has nothing.
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        query.processAllAvailable()  # the first plan waits for the spout to start, however long it takes
    finally:
        query.stop()

    delivered: list[str] = []
    for batch_id, ids, acked_then in seen:
        assert not set(ids) & acked_then, f"batch {batch_id}: ids acked before the batch was processed"
        assert set(delivered) <= acked_then, f"batch {batch_id} ran before the earlier batches were acked"
        delivered += ids
    assert len(seen) >= 3 and all(len(ids) <= 5 for _, ids, _ in seen)

    evs = read_events(events)
    emitted = [json.dumps(e["id"]) for e in evs if e["ev"] == "emit"]
    acked = [json.dumps(e["id"]) for e in evs if e["ev"] == "ack"]
    assert not [e for e in evs if e["ev"] == "fail"]
    assert len(emitted) == 12 and sorted(delivered) == sorted(emitted)
    # Exactly one ack per emit, with the id's JSON type kept (0 and "m-1", never "0" or 1).
    assert Counter(acked) == Counter(emitted)
    assert '0' in acked and '"m-1"' in acked


def test_restarted_query_replays_the_failed_batch_and_ends_with_every_line_once(spark, tmp_path):
    from pyspark.sql.functions import udf

    expected = [t for _, t in write_lines(tmp_path / "lines.txt", 15)]  # 12 lines, 3 batches
    poison, flag, ck, out, replay = expected[6], tmp_path / "boom", tmp_path / "ck", tmp_path / "out", tmp_path / "replay"
    flag.touch()
    flag_path = str(flag)

    @udf("string")
    def guard(s):  # fails the batch holding `poison` while the flag file exists
        if s == poison and os.path.exists(flag_path):
            raise RuntimeError("injected batch failure")
        return s

    def start():
        df = multilang_stream(
            spark, ["python", PY_SENTENCES, tmp_path / "lines.txt"],
            fields="sentence", maxBatchSize=4, dedupe="all", replayLog=replay,
        )
        return (df.select(guard("sentence").alias("sentence")).writeStream.format("parquet")
                .option("path", str(out)).option("checkpointLocation", str(ck))
                .trigger(availableNow=True).start())

    query = start()
    with pytest.raises(Exception, match="injected batch failure"):
        query.awaitTermination(WAIT)
    # The failed batch is in Spark's offset log but not its commit log; our log holds its rows.
    planned = sorted(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit())
    done = {int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit()}
    failed = planned[-1]
    assert failed not in done and failed - 1 in done
    offset_of = lambda b: json.loads((ck / "offsets" / str(b)).read_text().splitlines()[-1])["pos"]  # noqa: E731
    lo, hi = offset_of(failed - 1), offset_of(failed)
    logged = [json.loads(line) for f in sorted(replay.glob("batch-*.jsonl")) for line in f.read_text().splitlines()]
    committed = json.loads((replay / "committed.json").read_text())["pos"]
    first_run_batch = [rec["values"][0] for rec in logged[lo - committed : hi - committed]]
    assert poison in first_run_batch
    before = {r["sentence"] for r in spark.read.parquet(str(out)).collect()}
    assert before and poison not in before and len(before) < len(expected)

    flag.unlink()
    finish(start())  # same checkpoint, same replay log, a new spout process
    rows = [r["sentence"] for r in spark.read.parquet(str(out)).collect()]
    assert sorted(rows) == sorted(expected)  # every line exactly once

    # The re-run batch has the rows the first run planned, in the same order.
    meta = (out / "_spark_metadata" / str(failed)).read_text().splitlines()[1:]
    files = [json.loads(line)["path"] for line in meta]
    import pyarrow.parquet as pq

    rerun = [s for f in files for s in pq.read_table(f.removeprefix("file:")).column("sentence").to_pylist()]
    assert rerun == first_run_batch


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_sentence_spout(spark, tmp_path):
    expected = write_lines(tmp_path / "lines.txt", 10)
    df = multilang_stream(
        spark, ["node", NODE_SENTENCES, tmp_path / "lines.txt"],
        fields="sentence", includeMsgId="true", maxBatchSize=5, replayLog=tmp_path / "replay",
    )
    query = (df.writeStream.format("memory").queryName("ml_node_sentences")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    finish(query)
    rows = spark.sql("select sentence, _msg_id from ml_node_sentences").collect()
    assert sorted((r["_msg_id"], r["sentence"]) for r in rows) == sorted((json.dumps(i), t) for i, t in expected)


def test_reader_supervises_the_spout_fails_rejected_tuples_and_replays_identically(tmp_path):
    """Without Spark: the reader's planning calls, as Spark's driver makes them."""
    events, marker, replay = tmp_path / "events.jsonl", tmp_path / "crashed", tmp_path / "replay"
    options = CaseInsensitiveDict({
        "command": json.dumps(["python", str(ACK_SPOUT), str(events), "12", "--crash-after", "5", str(marker), "--bad-first"]),
        "fields": "sentence", "includeMsgId": "true", "replayLog": str(replay), "maxBatchSize": "4", "dedupe": "all",
    })
    source = MultilangDataSource(options)
    reader = source.streamReader(source.schema())
    batches = []
    start = reader.initialOffset()
    for _ in range(1000):
        end = reader.latestOffset(start, ReadMaxRows(4))  # also commits everything below `start`
        if end != start:
            rows = [row for p in reader.partitions(start, end) for row in reader.read(p)]
            batches.append((start, end, rows))
            start = end
            if sum(len(rows) for _, _, rows in batches) >= 13:
                break
    else:
        pytest.fail(f"the spout's 13 tuples never arrived: {batches}")
    reader.stop()  # the last batch is planned, never committed: the "query" died

    sentences = [s for _, _, rows in batches for s, _ in rows]
    assert sorted(sentences) == sorted(["fixed"] + [f"s-{i}" for i in range(12)])  # each once
    assert marker.exists()  # the spout did crash once and was replaced

    evs = read_events(events)
    pids = list(dict.fromkeys(e["pid"] for e in evs))
    assert len(pids) == 2
    # The bad tuple (wrong arity) was failed to the spout, never delivered; nothing else failed.
    assert [e["id"] for e in evs if e["ev"] == "fail"] == ["bad", "bad"]
    # Each emit of the replacement process got exactly one answer after it (fail for
    # its rejected tuple, ack for the rest; the unacked last batch aside). Acks it got
    # for ids it had not emitted are its predecessor's in-flight tuples (§8.2).
    first = [e for e in evs if e["pid"] == pids[0]]
    predecessor_unacked = Counter(json.dumps(e["id"]) for e in first if e["ev"] == "emit")
    predecessor_unacked.subtract(json.dumps(e["id"]) for e in first if e["ev"] in ("ack", "fail"))
    last_ids = {mid for _, mid in batches[-1][2]}
    waiting: Counter = Counter()
    early = []
    for e in evs:
        if e["pid"] != pids[1]:
            continue
        key = json.dumps(e["id"])
        if e["ev"] == "emit":
            waiting[key] += 1
        elif waiting[key] > 0:
            waiting[key] -= 1
        else:
            early.append(key)
    assert {k for k, n in waiting.items() if n} <= last_ids
    assert set(early) <= {k for k, n in predecessor_unacked.items() if n > 0}
    # The predecessor's tuples (committed: not in the last batch) were acked to
    # its replacement (§8.2): before or after the replacement emitted them again,
    # depending on how far the pump had prefetched from the replacement.
    acked_by_replacement = {json.dumps(e["id"]) for e in evs if e["pid"] == pids[1] and e["ev"] == "ack"}
    logged_by_predecessor = {mid for _, _, rows in batches for _, mid in rows} & set(predecessor_unacked)
    assert logged_by_predecessor - last_ids and logged_by_predecessor - last_ids <= acked_by_replacement

    # A new reader on the same log (a restarted query) re-reads the uncommitted batch identically.
    reader2 = source.streamReader(source.schema())
    lo, hi, rows = batches[-1]
    assert reader2.initialOffset() == lo
    assert [row for p in reader2.partitions(lo, hi) for row in reader2.read(p)] == rows
    reader2.commit(hi)  # acks go to the process that now runs the spout
    reader2.stop()
    acked = [json.dumps(e["id"]) for e in read_events(events) if e["ev"] == "ack"]
    assert {mid for _, mid in rows} <= set(acked)


def reader_for(**options):
    """The stream reader Spark's driver would make for these options (no Spark)."""
    source = MultilangDataSource(CaseInsensitiveDict({k: str(v) for k, v in options.items()}))
    return source.streamReader(source.schema())


def plan_rows(reader, want: int, max_rows: int = 100) -> list[tuple]:
    """Plan batches as Spark's driver does until ``want`` rows came (or fail)."""
    rows: list[tuple] = []
    start = reader.initialOffset()
    for _ in range(1000):
        end = reader.latestOffset(start, ReadMaxRows(max_rows))
        if end != start:
            rows += [row for p in reader.partitions(start, end) for row in reader.read(p)]
            start = end
            if len(rows) >= want:
                reader.commit(end)
                return rows
    pytest.fail(f"only {len(rows)} of {want} rows arrived: {rows}")


@pytest.mark.parametrize("task_index, parallelism", [(None, None), (0, 1), (2, 3)])
def test_spout_context_says_which_task_of_the_component_it_is(tmp_path, task_index, parallelism):
    options = {"command": json.dumps(["python", str(CONTEXT_SPOUT)]), "fields": "taskid,component,tasks,map,consumers",
               "component": "sentences", "valuesFormat": "json", "replayLog": tmp_path / "replay"}
    if task_index is not None:
        options.update(taskIndex=task_index, parallelism=parallelism)
    reader = reader_for(**options)
    try:
        rows = plan_rows(reader, 2)
    finally:
        reader.stop()
    assert len(rows) == 2 and rows[0][0].startswith('[0,"probe"')
    taskid, component, tasks, mapping, consumers = json.loads(rows[1][0])
    i, n = task_index or 0, parallelism or 1
    # As the embedded engine numbers a component's tasks: consecutive ids, task
    # index i the (i+1)-th; the consumer "spark" gets an id of its own.
    assert component == "sentences"
    assert tasks == list(range(1, n + 1)) and taskid == tasks[i]
    assert mapping == {**{str(t): "sentences" for t in tasks}, str(n + 1): "spark"}
    assert consumers == [n + 1]  # the answer to need_task_ids


@pytest.mark.parametrize("options, message", [
    ({"taskIndex": "3", "parallelism": "3"}, 'option "taskIndex" must be below option "parallelism" \\(3\\)'),
    ({"taskIndex": "1"}, 'option "taskIndex" must be below option "parallelism" \\(1\\)'),
    ({"taskIndex": "-1", "parallelism": "2"}, 'option \'taskIndex\' must be >= 0, got -1'),
    ({"taskIndex": "first"}, "option 'taskIndex' must be an integer, got 'first'"),
    ({"parallelism": "0"}, "option 'parallelism' must be >= 1, got 0"),
    ({"parallelism": "5000"}, 'option "parallelism" must be at most 4096'),
    ({"component": "spark"}, 'option "component" must not be \'spark\''),
    ({"valuesFormat": "avro"}, 'option "valuesFormat" must be columns or json; got \'avro\''),
    ({"valuesFormat": "json", "fields": None}, 'option "fields" is required with valuesFormat=json'),
    ({"dedupe": "sometimes"}, 'option "dedupe" must be all \\(the default\\), inflight or none; got \'sometimes\''),
    ({"dedupeCacheMb": "0"}, "option 'dedupeCacheMb' must be >= 1, got 0"),
])
def test_bad_options_are_refused_naming_the_option(options, message):
    opts = {"command": json.dumps(["python", "spout.py"]), "fields": "a,b", **options}
    with pytest.raises(_OptionError, match=message):
        MultilangDataSource(CaseInsensitiveDict({k: v for k, v in opts.items() if v is not None}))


def test_json_values_format_has_one_values_column_and_refuses_another_schema():
    def source(**extra):
        return MultilangDataSource(CaseInsensitiveDict({
            "command": json.dumps(["python", "spout.py"]), "fields": "a,b", "valuesFormat": "JSON", **extra}))

    assert [(f.name, f.dataType) for f in source().schema().fields] == [("_values", StringType())]
    with_id = source(includeMsgId="true")
    assert with_id.schema().fieldNames() == ["_values", "_msg_id"]
    with_id.streamReader(StructType([StructField("_values", StringType()), StructField("_msg_id", StringType())]))
    wrong_shapes = [
        [("a", StringType()), ("b", StringType())],  # the columns format's shape
        [("_values", StringType()), ("_msg_id", StringType())],  # _msg_id without includeMsgId
        [("_values", LongType())],
        [("_values", StringType()), ("extra", StringType())],
    ]
    for shape in wrong_shapes:
        with pytest.raises(_OptionError, match=r"with valuesFormat=json the schema must be exactly \(_values string\)"):
            source().streamReader(StructType([StructField(n, t) for n, t in shape]))
    swapped = StructType([StructField("_msg_id", StringType()), StructField("_values", StringType())])
    with pytest.raises(_OptionError, match=r"exactly \(_values string, _msg_id string\)"):
        with_id.streamReader(swapped)


# Values whose JSON types must survive: ints (64-bit bounds), floats (1.0 stays
# a float, -0.0 keeps its sign), nested lists and objects, null, booleans,
# unicode beyond ASCII and the line separators JSON allows raw.
TRICKY_TUPLES = [
    [0, 1.0],
    [-(2**63), 2**64 - 1],
    [0.1, -0.0],
    [1e300, -2.5e-300],
    [[1, [2.0, [[]]], {"k": [None, True, False]}], {}],
    ["h\u00e9llo \u65e5\u672c\u8a9e \U0001F600", "\u2028\u2029 \\ \" \n\t"],
    [None, ""],
    ["1", 1],
]


def strictly_equal(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(strictly_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def test_json_values_format_round_trips_the_values_exactly(spark, tmp_path):
    tuples_file = tmp_path / "tuples.json"
    tuples_file.write_text(json.dumps(TRICKY_TUPLES, ensure_ascii=False), encoding="utf-8")
    df = multilang_stream(
        spark, ["python", VALUES_SPOUT, tuples_file],
        fields="a,b", valuesFormat="json", includeMsgId="true", maxBatchSize=3, replayLog=tmp_path / "replay",
    )
    assert [(f.name, f.dataType) for f in df.schema.fields] == [("_values", StringType()), ("_msg_id", StringType())]
    query = (df.writeStream.format("memory").queryName("ml_json_values")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    finish(query)
    rows = {int(r["_msg_id"]): r["_values"] for r in spark.sql("select * from ml_json_values").collect()}
    assert sorted(rows) == list(range(len(TRICKY_TUPLES)))
    for i, values in enumerate(TRICKY_TUPLES):
        assert strictly_equal(json.loads(rows[i]), values), (i, rows[i], values)


# -- message ids: dedupe=all (the default) across spout processes and restarts ------------------

ACK_SPOUT_IDS = [0, "m-1", 2, "m-3", 4, "m-5"]  # ack_spout.py's ids for N=6


def test_the_first_plan_waits_for_a_spout_slower_to_start_than_max_batch_duration(tmp_path):
    # A fresh query's first plan found nothing when the spout's process took
    # longer than maxBatchDurationMs to start (on a loaded machine, or an
    # interpreter slow to start), and processAllAvailable returned having
    # processed nothing. As Kafka's source waits for its first fetch, the
    # duration counts once the spout has answered.
    events = tmp_path / "events.jsonl"
    late = ("import runpy, sys, time; time.sleep(3); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    reader = reader_for(command=json.dumps(["python", "-c", late, str(ACK_SPOUT), str(events), "6"]), fields="sentence",
                        includeMsgId="true", replayLog=tmp_path / "replay", maxBatchDurationMs=2000)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(100))
        assert end["pos"] > start["pos"], "the first plan returned no batch while the spout was starting"
        # The duration counts from the first answer: the plan takes all 6 (it ends when the spout has
        # nothing), not just what the first `next` brought.
        assert end["pos"] == 6, end
        rows = [row for p in reader.partitions(start, end) for row in reader.read(p)]
        assert [json.loads(r[1]) for r in rows] == [e["id"] for e in read_events(events) if e["ev"] == "emit"]
        reader.commit(end)
        assert reader.latestOffset(end, ReadMaxRows(100)) == end  # nothing left: an empty plan, not a wait
    finally:
        reader.stop()


def ack_spout_reader(events: Path, replay: Path, **options):
    return reader_for(command=json.dumps(["python", str(ACK_SPOUT), str(events), "6"]), fields="sentence",
                      includeMsgId="true", replayLog=replay, **options)


def plan_until_spout_answered(reader, events: Path, pid_index: int, answers: int) -> tuple[dict, dict, list[tuple]]:
    """Drive the reader (as Spark's driver: plan, read) until the spout process
    number ``pid_index`` (in order of appearance) emitted its 6 tuples and got
    ``answers`` acks or fails, and a planning call found nothing new; returns
    (start, end, rows planned)."""
    start = end = reader.initialOffset()
    rows: list[tuple] = []
    for _ in range(200):
        new_end = reader.latestOffset(end, ReadMaxRows(100))
        if new_end != end:
            rows += [row for p in reader.partitions(end, new_end) for row in reader.read(p)]
            end = new_end
            continue
        evs = read_events(events)
        pids = list(dict.fromkeys(e["pid"] for e in evs))
        if len(pids) > pid_index:
            mine = [e["ev"] for e in evs if e["pid"] == pids[pid_index]]
            if mine.count("emit") >= 6 and mine.count("ack") + mine.count("fail") >= answers:
                return start, end, rows
    pytest.fail(f"spout process {pid_index} did not emit 6 tuples and get {answers} answers: {read_events(events)}")


def planned_to(reader, start: dict, pos: int, max_rows: int = 4) -> dict:
    """Plan from ``start`` (at most ``max_rows`` rows), as Spark's driver does
    at each trigger, until the spout's log reaches ``pos``: the event, however
    long its process takes to start (on a loaded machine a first plan found
    the spout not yet answering, and the test took the empty offset as the
    batch)."""
    for _ in range(200):
        end = reader.latestOffset(start, ReadMaxRows(max_rows))
        if end["pos"] >= pos:
            return end
    pytest.fail(f"the spout's log did not reach position {pos} from {start}: {end}")


def ids_recorded(replay: Path) -> dict:
    db = sqlite3.connect(replay / "msg-ids.sqlite")
    try:
        return {json.loads(k): pos for k, pos in db.execute("SELECT id, pos FROM msg_ids")}
    finally:
        db.close()


@pytest.mark.parametrize("dedupe", [None, "inflight"])
def test_a_restarted_spouts_repeats_of_committed_ids_are_dropped_and_acked_by_default(tmp_path, dedupe):
    events, replay = tmp_path / "events.jsonl", tmp_path / "replay"
    extra = {} if dedupe is None else {"dedupe": dedupe}
    first = ack_spout_reader(events, replay, **extra)
    try:
        rows = plan_rows(first, 6)  # planned, read and committed
        assert first._state.wait_acked()  # the acks go out in the background: the spout has its 6
        # Only uncommitted tuples are held in memory; the ids are on disk.
        assert not first._state.inflight and not first._state.unacked
    finally:
        first.stop()
    assert sorted(json.loads(mid) for _, mid in rows if mid.isdigit()) == [0, 2, 4]

    # A restarted query: same replay log, a new spout process that emits the same six ids again.
    second = ack_spout_reader(events, replay, **extra)
    try:
        start, end, again = plan_until_spout_answered(second, events, 1, 6 if dedupe is None else 0)
        if again:
            second.commit(end)
    finally:
        second.stop()
    evs = [e for e in read_events(events) if e["pid"] != read_events(events)[0]["pid"]]
    if dedupe is None:
        # Recognised as committed: dropped, and each acked once, after its emit
        # (the acks of a burst of pipelined nexts follow the burst, §9.5).
        assert again == [] and end == start
        got = [(e["ev"], e["id"]) for e in evs]
        assert [i for ev, i in got if ev == "emit"] == ACK_SPOUT_IDS
        assert [i for ev, i in got if ev == "ack"] == ACK_SPOUT_IDS
        assert all(got.index(("emit", i)) < got.index(("ack", i)) for i in ACK_SPOUT_IDS), got
        assert ids_recorded(replay) == {i: pos for pos, i in enumerate(ACK_SPOUT_IDS)}
    else:  # the opt-out: every emit of a new process is a new row (at-least-once)
        assert sorted(again) == sorted(rows)
        assert not (replay / "msg-ids.sqlite").exists() or ids_recorded(replay) == {}


def test_a_restarted_spouts_repeats_cost_a_write_per_burst_not_two_round_trips_each(tmp_path):
    # Issue 36 item 6: a query restarted from its checkpoint spent 134 s on a
    # batch of 1 tuple, while the new spout process re-emitted every committed
    # id: a `next` and an `ack` round trip each. To a spout that accepted
    # batch (ours) the source pipelines both (§9.5), as the runtime does.
    # Pass condition: every repeat acked once, most commands pipelined.
    n = 400
    events, replay = tmp_path / "events.jsonl", tmp_path / "replay"
    command = json.dumps(["python", str(ACK_SPOUT), str(events), str(n)])
    first = reader_for(command=command, fields="sentence", includeMsgId="true", replayLog=replay)
    try:
        plan_rows(first, n, max_rows=n)
        assert first._state.wait_acked()
    finally:
        first.stop()

    second = reader_for(command=command, fields="sentence", includeMsgId="true", replayLog=replay)
    start = second.initialOffset()  # (opens the state; the spout is asked nothing before a planning call)
    host = second._state.spout.host
    writes: list[int] = []
    command_of = host.command

    async def counted(*cmds):
        writes.append(len(cmds))
        await command_of(*cmds)

    host.command = counted
    try:
        for _ in range(2000):
            assert second.latestOffset(start, ReadMaxRows(100)) == start, "a repeat of a committed id became a row"
            evs = [e for e in read_events(events) if e["pid"] != read_events(events)[0]["pid"]]
            if sum(1 for e in evs if e["ev"] == "ack") >= n:
                break
        else:
            pytest.fail(f"the restarted spout's {n} repeats were not all acked: {len(evs)} events")
    finally:
        second.stop()
    assert sorted(str(e["id"]) for e in evs if e["ev"] == "ack") == sorted(str(e["id"]) for e in evs if e["ev"] == "emit")
    assert len([e for e in evs if e["ev"] == "emit"]) == n
    # Of the 2n commands (n nexts, n acks), at least n went several to a write;
    # one to a write: the empty nexts once the spout has nothing left, say.
    assert sum(k for k in writes if k > 1) >= n, f"{len(writes)} writes for {n} repeats: {writes[:40]}"


def test_ids_of_a_batch_file_lost_in_a_crash_are_forgotten_not_dropped(tmp_path):
    events, replay = tmp_path / "events.jsonl", tmp_path / "replay"
    first = ack_spout_reader(events, replay)
    try:
        start = first.initialOffset()
        mid = planned_to(first, start, 4)
        first.commit(mid)
        end = planned_to(first, mid, 6)  # logged (ids recorded), never committed
    finally:
        first.stop()
    assert (mid["pos"], end["pos"]) == (4, 6) and len(ids_recorded(replay)) == 6
    # The crash: the id record's transaction made it to disk, the batch file did not.
    (batch_file,) = replay.glob("batch-*.jsonl")
    batch_file.unlink()

    second = ack_spout_reader(events, replay)
    try:
        start, end, rows = plan_until_spout_answered(second, events, 1, 4)
        assert [mid for _, mid in rows] == ["4", '"m-5"']  # taken again, not dropped as seen
        second.commit(end)
    finally:
        second.stop()
    assert ids_recorded(replay) == {i: pos for pos, i in enumerate(ACK_SPOUT_IDS)}


def write_v1_log(replay: Path, acked: list | None) -> None:
    """A replay log as multilang wrote it before the id record (version 1):
    positions 0..3 committed, 4..5 logged and not committed."""
    replay.mkdir()
    (replay / "meta.json").write_text(json.dumps({"version": 1, "log": str(uuid.uuid4())}))
    (replay / "committed.json").write_text(json.dumps({"pos": 4}))
    (replay / "batch-000000000004-000000000006.jsonl").write_text(
        '{"id":4,"values":["s-4"]}\n{"id":"m-5","values":["s-5"]}\n')
    if acked is not None:  # what dedupe=all kept: one JSON array of acked ids per commit
        (replay / "acked-ids.jsonl").write_text(json.dumps(acked[:2]) + "\n" + json.dumps(acked[2:]) + "\n")


def test_a_version_1_replay_log_of_dedupe_all_is_migrated_to_the_id_record(tmp_path):
    events, replay = tmp_path / "events.jsonl", tmp_path / "replay"
    write_v1_log(replay, acked=[0, "m-1", 2, "m-3"])
    reader = ack_spout_reader(events, replay)
    try:
        start, end, rows = plan_until_spout_answered(reader, events, 0, 4)
        # The logged batch, once; every re-emit was a repeat: 4 committed (acked at once), 2 logged.
        assert (start["pos"], end["pos"]) == (4, 6) and rows == [("s-4", "4"), ("s-5", '"m-5"')]
        reader.commit(end)
    finally:
        reader.stop()
    assert json.loads((replay / "meta.json").read_text())["version"] == 2
    assert not (replay / "acked-ids.jsonl").exists()
    assert ids_recorded(replay) == {0: -1, "m-1": -1, 2: -1, "m-3": -1, 4: 4, "m-5": 5}
    acks = [e["id"] for e in read_events(events) if e["ev"] == "ack"]
    assert sorted(map(json.dumps, acks)) == sorted(map(json.dumps, ACK_SPOUT_IDS))


def test_a_replay_log_without_the_ids_of_its_committed_tuples_is_refused_by_dedupe_all(tmp_path):
    events, replay = tmp_path / "events.jsonl", tmp_path / "replay"
    write_v1_log(replay, acked=None)  # the old default, dedupe=inflight, kept no ids
    refused = 'option "dedupe" is all \\(the default\\), but the message ids of committed positions 0..4 were not recorded'
    with pytest.raises(RuntimeError, match=refused):
        ack_spout_reader(events, replay).initialOffset()
    assert not events.exists()  # refused before a spout started, and the log left as it was
    assert json.loads((replay / "meta.json").read_text())["version"] == 1

    reader = ack_spout_reader(events, replay, dedupe="inflight")  # goes on as before
    try:
        start, end, rows = plan_until_spout_answered(reader, events, 0, 0)
        # The logged batch, and the committed tuples again (at-least-once across spout processes).
        assert sorted(r[0] for r in rows) == ["s-0", "s-1", "s-2", "s-3", "s-4", "s-5"]
        reader.commit(end)
    finally:
        reader.stop()
    assert json.loads((replay / "meta.json").read_text())["version"] == 2
    with pytest.raises(RuntimeError, match="positions 0..10 were not recorded"):  # still refused
        ack_spout_reader(events, replay).initialOffset()


def test_an_id_coming_back_with_other_values_is_dropped_acked_and_warned_about(tmp_path, caplog):
    replay, tuples = tmp_path / "replay", tmp_path / "tuples.json"

    def reader_over(values):
        tuples.write_text(json.dumps(values))
        return reader_for(command=json.dumps(["python", str(VALUES_SPOUT), str(tuples)]), fields="a,b",
                          valuesFormat="json", replayLog=replay)

    first = reader_over([["a", 1], ["b", 2]])
    try:
        assert plan_rows(first, 2) == [('["a",1]',), ('["b",2]',)]
    finally:
        first.stop()
    second = reader_over([["a", 1], ["B", 20]])  # id 1 now names other data: dedupe=all keeps the first
    try:
        start = second.initialOffset()
        for _ in range(100):
            assert second.latestOffset(start, ReadMaxRows(10)) == start
            if second._state.duplicates == 2:
                break
        assert second._state.duplicates == 2
    finally:
        second.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "other values" in r.getMessage()]
    assert len(warnings) == 1 and "message id 1 again" in warnings[0] and "dedupe=inflight" in warnings[0]


# -- the conf option and extensions ---------------------------------------------------------------

def test_a_conf_offering_extensions_is_not_offered_to_the_spout(tmp_path):
    """A topology conf passed through as ``conf`` may say ``multilang.extensions``;
    a conf key is no offer (§9.1), and this host offers nothing: had our Python
    spout accepted ``batch``, which this host does not speak, no row would come."""
    from multilang.adapters.spark._source.options import _Options
    from multilang.adapters.spark._source.spout_host import spout_conf

    conf = {"multilang.extensions": ["batch", "state"], "sentences.note": "kept"}
    opts = _Options.parse(CaseInsensitiveDict({"command": '["python", "s.py"]', "fields": "s", "conf": json.dumps(conf)}))
    handshake = spout_conf(opts)
    assert handshake["multilang.extensions"] == ["batch", "state"] and handshake["sentences.note"] == "kept"

    expected = write_lines(tmp_path / "lines.txt", 10)
    reader = reader_for(command=json.dumps(["python", str(PY_SENTENCES), str(tmp_path / "lines.txt")]),
                        fields="sentence", includeMsgId="true", conf=json.dumps(conf), replayLog=tmp_path / "replay")
    try:
        rows = plan_rows(reader, len(expected))
    finally:
        reader.stop()
    assert sorted((json.loads(mid), s) for s, mid in rows) == expected


# -- prefetch: the pump takes tuples between planning calls ---------------------------------------

def test_a_prefetched_tuple_not_logged_when_the_query_stops_is_neither_acked_nor_lost(tmp_path):
    """Between planning calls the pump fills a buffer of at most maxBatchSize
    tuples. Those are not in the replay log: when the query stops they are
    abandoned (not acked, not failed), and the spout process that emitted them
    goes; a restarted query's new spout process emits them again and they are
    delivered, once."""
    events, replay = tmp_path / "events.jsonl", tmp_path / "replay"

    def reader():
        return reader_for(command=json.dumps(["python", str(ACK_SPOUT), str(events), "10"]), fields="sentence",
                          includeMsgId="true", replayLog=replay, maxBatchSize=2)

    def rows_of(r, lo, hi):
        return [row for p in r.partitions(lo, hi) for row in r.read(p)]

    first = reader()
    try:
        start = first.initialOffset()
        mid = planned_to(first, start, 2, max_rows=2)
        batch0 = rows_of(first, start, mid)
        end = planned_to(first, mid, 4, max_rows=2)  # batch 0 committed (acked in the background), batch 1 logged
        batch1 = rows_of(first, mid, end)
        st = first._state
        assert st.wait_buffered(2) and st.wait_acked()  # no planning call runs now
        prefetched = st.spout.run_sync(lambda: [json.dumps(i) for i, _ in st.buffer])
    finally:
        first.stop()  # the query stops: batch 1 logged and not committed, two tuples prefetched
    assert [mid for _, mid in batch0 + batch1] == ["0", '"m-1"', "2", '"m-3"']
    assert prefetched == ["4", '"m-5"']
    evs = read_events(events)
    pid1 = evs[0]["pid"]
    # The buffer is bounded: nothing was taken beyond the two batches and the prefetched two.
    assert [e["id"] for e in evs if e["ev"] == "emit"] == [0, "m-1", 2, "m-3", 4, "m-5"]
    # Only the committed batch was acked; nothing failed.
    assert [(e["ev"], e["id"]) for e in evs if e["ev"] != "emit"] == [("ack", 0), ("ack", "m-1")]

    second = reader()  # a restarted query: a new spout process, from sentence 0
    try:
        again = plan_rows(second, 4, max_rows=2)  # the logged batch 1, then what was only prefetched
        assert second._state.wait_acked()
    finally:
        second.stop()
    assert [mid for _, mid in again] == ["2", '"m-3"', "4", '"m-5"']
    evs = read_events(events)
    acked2 = {json.dumps(e["id"]) for e in evs if e["pid"] != pid1 and e["ev"] == "ack"}
    # The new process got the acks of batch 1 (its predecessor's, §8.2) and of the
    # formerly prefetched tuples after their commit; its repeats of committed
    # tuples were acked at once. What it had only prefetched itself was not.
    assert acked2 == {json.dumps(i) for i in [0, "m-1", 2, "m-3", 4, "m-5"]}
    assert not [e for e in evs if e["pid"] == pid1 and e["ev"] == "ack" and e["id"] in (2, "m-3", 4, "m-5")]
