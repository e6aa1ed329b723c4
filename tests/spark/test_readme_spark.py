"""README.md's PySpark fragments (the blocks marked ``<!-- snippet: spark -->``).

Each fragment is exec'd as written, with the shared session-scoped ``spark``
(tests/spark/conftest.py: one SparkSession per test run) and a small batch
``lines_df`` in its namespace. The working directory is ``tmp_path``, holding a
link to the repo's ``examples``: what the driver resolves (the bolts'
commands, via ``multilang_bolts``'s default ``resource_dir``; the replay log,
made absolute by the fragment) is found or written there, never in the repo.
The spout's command is resolved by the stream reader's Python worker, in the
JVM's working directory: the repo root, where pytest runs. Then every
DataFrame the fragment defined is checked: the known names against what the
README says they hold, any other one by running it.

The README blocks are found by the same parser as the non-Spark half
(tests/integration/test_readme.py, on the test path), which also checks that
every python/sh block is run by one half or skipped with a reason.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame  # noqa: E402

from test_readme import ROOT, blocks_of_kind  # noqa: E402  (tests/integration is on the test path)

pytestmark = pytest.mark.spark

SPARK_BLOCKS = blocks_of_kind("spark")
LINES = ["the quick brown fox", "jumps over the lazy dog", "the end"]
ALICE = ROOT / "examples" / "data" / "alice.txt"
WAIT = 300  # seconds: a bound on a streaming query that normally takes a few


@pytest.fixture
def lines_df(spark):
    return spark.createDataFrame([(line,) for line in LINES], "line string")


def _rows(df: DataFrame) -> list[tuple]:
    return [tuple(r) for r in df.collect()]


def _run_stream(spark, df: DataFrame, name: str, tmp_path: Path) -> list[tuple]:
    """Run a streaming DataFrame to the end of its input (availableNow) into a memory sink."""
    table = f"readme_{name}_{os.getpid()}"
    query = (df.writeStream.format("memory").queryName(table)
             .option("checkpointLocation", str(tmp_path / f"chk-{name}"))
             .trigger(availableNow=True).start())
    try:
        finished = query.awaitTermination(WAIT)
        assert query.exception() is None, query.exception()
        assert finished, f"the streaming query over {name!r} did not finish within {WAIT} s"
        return _rows(spark.table(table))
    finally:
        query.stop()
        spark.catalog.dropTempView(table)


def check_words(spark, df, tmp_path):
    assert not df.isStreaming
    assert df.columns == ["word"]
    assert sorted(w for (w,) in _rows(df)) == sorted(w for line in LINES for w in line.split())


def check_counts(spark, df, tmp_path):
    assert not df.isStreaming
    assert dict(_rows(df)) == Counter(w for line in LINES for w in line.split())


def check_sentences(spark, df, tmp_path):
    assert df.isStreaming
    assert df.columns == ["sentence"]
    rows = _run_stream(spark, df, "sentences", tmp_path)
    expected = [s for s in (ln.strip(" \t\r\f\v") for ln in ALICE.read_text(encoding="utf-8").split("\n")) if s]
    assert Counter(s for (s,) in rows) == Counter(expected)
    # The replay log went where the README says: under the working directory.
    assert (tmp_path / "checkpoints" / "q1" / "multilang").is_dir()


CHECKS = {"words": check_words, "counts": check_counts, "sentences": check_sentences}


def check_any(spark, df, tmp_path, name):
    """A DataFrame of a fragment this file does not know yet: at least it runs."""
    if df.isStreaming:
        _run_stream(spark, df, name, tmp_path)
    else:
        df.collect()


@pytest.mark.parametrize("block", SPARK_BLOCKS, ids=[b.id for b in SPARK_BLOCKS])
def test_spark_fragment_runs_and_holds_what_the_readme_says(block, spark, lines_df, tmp_path, monkeypatch):
    jvm_cwd = Path(spark.sparkContext._jvm.System.getProperty("user.dir")).resolve()
    if jvm_cwd != ROOT:
        pytest.skip(f"the README's Spark fragments use paths relative to the repo root; Spark runs in {jvm_cwd}")
    # A user's directory holding the examples: the driver resolves the bolts' commands and the
    # replay log here; the spout's command is resolved by the Python worker, in the JVM's directory.
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__", "spark": spark, "lines_df": lines_df}
    exec(compile(block.text, f"README.md:{block.line}", "exec"), namespace)
    frames = {k: v for k, v in namespace.items() if isinstance(v, DataFrame) and v is not lines_df}
    assert frames, f"README.md:{block.line}: the fragment defines no DataFrame"
    for name, df in frames.items():
        if name in CHECKS:
            CHECKS[name](spark, df, tmp_path)
        else:
            check_any(spark, df, tmp_path, name)
