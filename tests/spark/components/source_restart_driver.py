"""Driver for tests/spark/test_source_restart.py: runs README.md's streaming
source snippet as a user's script would, with its own SparkSession, in the
current directory (which holds, or links to, the repo's ``examples``).

Usage: python source_restart_driver.py README MAX_BATCH_SIZE [--graceful]

The snippet is the README's ``<!-- snippet: spark -->`` block that uses
``register_source`` (it defines ``sentences``), and the sink is the inline code
``sentences.writeStream...start()`` in the paragraph after it. The only changes
made to them: ``maxBatchSize`` is set, so the stream takes enough micro-batches
for a restart to land midway, and ``includeMsgId``, so the sink says which
line each row is (the text alone is not a key: the file repeats sentences).

Without ``--graceful``: one query, run to its end (the test kills it midway).
With ``--graceful``: start the query, wait until Spark's commit log holds two
more batches than it did at the start, ``query.stop()``, then define and start
it again on the same directories and run it to its end. Exit status 0 once the last query ended
without an error; one JSON line per ended query on stdout.
"""

import json
import os
import re
import sys
import time
from pathlib import Path

WAIT = 300  # seconds: a bound on a query that normally takes a few


def readme_snippet(readme: str, max_batch_size: int) -> tuple[str, str]:
    text = Path(readme).read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"<!-- snippet: spark -->\n```python\n(.*?)```", text, re.S) if "register_source" in b]
    if len(blocks) != 1 or blocks[0].count(".load()") != 1:
        sys.exit(f"{readme}: expected one spark snippet using register_source, with one .load(); found {len(blocks)}")
    source = blocks[0].replace(
        ".load()", f'.option("maxBatchSize", "{max_batch_size}").option("includeMsgId", "true").load()')
    sinks = re.findall(r"`(sentences\.writeStream[^`]*\.start\(\))`", text)
    if len(sinks) != 1:
        sys.exit(f"{readme}: expected one inline `sentences.writeStream....start()` after the snippet; found {sinks}")
    return source, sinks[0]


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def main() -> None:
    readme, max_batch_size = sys.argv[1], int(sys.argv[2])
    graceful = "--graceful" in sys.argv[3:]
    source, sink = readme_snippet(readme, max_batch_size)

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("multilang-source-restart")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             # A JVM that lives for seconds: the quick JIT tier only, one GC thread (a few seconds less).
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def start():
        namespace = {"__name__": "__main__", "spark": spark}
        exec(compile(source, f"{readme} (register_source snippet)", "exec"), namespace)
        return eval(compile(sink, f"{readme} (sink)", "eval"), namespace)

    def report(n, query):
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        print(json.dumps({"query": n, "batches": len(query.recentProgress), "rows": rows}), flush=True)

    checkpoint = Path(re.search(r'"checkpointLocation",\s*"([^"]+)"', sink).group(1))
    before = committed_batches(checkpoint)
    query = start()
    if graceful:
        deadline = time.monotonic() + WAIT
        while committed_batches(checkpoint) < before + 2:  # the event: two more batches committed
            if not query.isActive or time.monotonic() > deadline:
                sys.exit(f"the first query ended (or hung) before committing two batches: {query.exception()}")
            time.sleep(0.05)
        query.stop()
        report(1, query)
        query = start()
    ended = query.awaitTermination(WAIT)
    if query.exception() is not None or not ended:
        sys.exit(f"the query failed or did not end within {WAIT}s: {query.exception()}")
    report(2 if graceful else 1, query)
    spark.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    main()
