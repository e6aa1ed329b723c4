"""The multilang Structured Streaming source (multilang.adapters.spark_source).

Real spout subprocesses (Python, Node) read through ``spark.readStream``; the
shared session-scoped ``spark`` fixture (tests/spark/conftest.py) runs them.
One test drives the stream reader directly, without Spark, to check crash
supervision, rejected tuples and replay byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import CaseInsensitiveDict  # noqa: E402
from pyspark.sql.streaming.datasource import ReadMaxRows  # noqa: E402

from multilang.adapters.spark_source import MultilangDataSource, register  # noqa: E402

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
PY_SENTENCES = ROOT / "examples" / "python" / "sentence_spout.py"
NODE_SENTENCES = ROOT / "examples" / "node" / "sentence_spout.js"
ACK_SPOUT = Path(__file__).resolve().parent / "components" / "ack_spout.py"
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
        query.processAllAvailable()
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
    assert early and set(early) <= {k for k, n in predecessor_unacked.items() if n > 0}

    # A new reader on the same log (a restarted query) re-reads the uncommitted batch identically.
    reader2 = source.streamReader(source.schema())
    lo, hi, rows = batches[-1]
    assert reader2.initialOffset() == lo
    assert [row for p in reader2.partitions(lo, hi) for row in reader2.read(p)] == rows
    reader2.commit(hi)  # acks go to the process that now runs the spout
    reader2.stop()
    acked = [json.dumps(e["id"]) for e in read_events(events) if e["ev"] == "ack"]
    assert {mid for _, mid in rows} <= set(acked)
