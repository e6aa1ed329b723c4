"""The live view of ``multilang run --engine spark`` (docs/OBSERVE.md): the
driver's ``_Progress`` turns committed micro-batches (their batch directories
and Spark's commit log) into the snapshot the live view draws. No Spark
session: the batch directories are written here as the engine writes them."""

from __future__ import annotations

import io
import os
from pathlib import Path

import orjson
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from multilang._cli.live import LiveView
from multilang.adapters.spark._streaming.stages import COLUMNS, DEAD, STATS
from multilang.adapters.spark._engine.storage import Location
from multilang.adapters.spark._streaming.topology import _Progress, batch_dir
from multilang.shellbolt._model.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


def _batch(directory: Path, b: int, rows: list[tuple[str, str, dict]]) -> None:
    path = directory.joinpath(*batch_dir(b))
    path.mkdir(parents=True)
    cols = {c: [] for c in COLUMNS}
    for kind, comp, v in rows:
        for c, x in zip(COLUMNS, (kind, 0, comp, "default", orjson.dumps(v).decode(), 0, None)):
            cols[c].append(x)
    table = pa.table({c: pa.array(cols[c], pa.int32() if c == "_p" else pa.int64() if c == "_o" else pa.string())
                      for c in COLUMNS})
    pq.write_table(table, path / "part-0.parquet")
    commits = directory / "query" / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    (commits / str(b)).write_text("v1\n")


def test_the_spark_progress_becomes_the_live_views_rows(tmp_path):
    topo = load_topology(str(ROOT / "examples" / "wordcount.toml"))
    _batch(tmp_path, 0, [(STATS, "sentences", {"emitted": 100}),
                         (STATS, "split", {"rows_in": 100, "emitted": 2000, "acked": 100, "failed": 0}),
                         (STATS, "count", {"rows_in": 2000, "emitted": 2000, "acked": 2000, "failed": 0,
                                           "restarts": 1})])
    _batch(tmp_path, 1, [(STATS, "sentences", {"emitted": 50}),
                         (STATS, "split", {"rows_in": 50, "emitted": 900, "acked": 49, "failed": 1}),
                         (STATS, "count", {"rows_in": 900, "emitted": 900, "acked": 900, "failed": 0}),
                         (DEAD, "split", {"input": ["bad"], "error": "failed"})])
    progress = _Progress(Location(str(tmp_path)), None)
    progress.poll([{"batchId": 0, "durationMs": {"triggerExecution": 1500}},
                   {"batchId": 1, "durationMs": {"triggerExecution": 500}}])
    snap = progress.snapshot(topo)
    assert snap["trees"]["completed"] == 150 and snap["trees"]["failed"] == 1
    assert snap["trees"]["in_flight"] is None  # not known on Spark
    assert snap["trees"]["complete_latency_ms"] == {"p50": 1500.0, "p99": 1500.0, "count": 2}
    comps = snap["components"]
    assert list(comps) == ["sentences", "split", "count"]
    assert (comps["sentences"]["emitted"], comps["sentences"]["acked"]) == (150, 150)
    assert (comps["split"]["executed"], comps["split"]["emitted"], comps["split"]["failed"]) == (150, 2900, 1)
    assert comps["count"]["restarts"] == 1

    screen = io.StringIO()
    view = LiveView(screen, tty=True, width=120, height=30)
    view.show(snap)
    text = screen.getvalue()
    assert "wordcount" in text and "150 completed, 1 failed" in text and "in flight" not in text
    rows = {ln.split()[0]: ln.split() for ln in text.replace("\x1b[2K", "\n").splitlines() if ln.strip()
            and ln.split()[0] in comps}
    assert rows["sentences"][4] == "150" and rows["split"][5] == "1" and rows["count"][-1] == "1"

    plain = io.StringIO()
    LiveView(plain, tty=False).show(snap)
    lines = plain.getvalue().splitlines()
    assert lines[0].startswith("[progress] ") and "150 completed, 1 failed" in lines[0]
    assert any("split: emitted 2900" in ln and "in flight" not in ln for ln in lines)
    assert all(len(ln) <= 100 for ln in lines)
