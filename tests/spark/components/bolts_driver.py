"""A Spark driver for tests/spark/test_bolts_dataframe.py, run as its own
process so the test can read what reaches the driver's stderr (in local
mode, the Python workers' stderr): ``python bolts_driver.py CONNECT WORK_DIR``.

CONNECT is ``connect`` (a Spark Connect session on a local[2] server, where
counters come from ``DataFrame.observe``) or ``classic`` (local[2]). Runs:

* ``log``: 20 rows through bolts_rows.py in mode ``log`` (log(), print()
  and a stderr line per row), 2 partitions;
* ``fail``: 2,000 rows "bad<letters>" through bolts_fail.rb, every one
  failing with its own text, ``max_retries=0``, dead letters in columns;
* ``stream`` (Connect only): 6 rows of a JSON file stream through
  bolts_rows.py in mode ``echo``, availableNow, into a memory sink.

Prints one JSON object on stdout: rows, dead letters and counters of each.
"""

import json
import os
import string
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = ["python", str(HERE / "bolts_rows.py")]
FAIL_RB = ["ruby", str(HERE / "bolts_fail.rb")]


def letters(i, n=4):
    out = ""
    for _ in range(n):
        i, r = divmod(i, 26)
        out = string.ascii_lowercase[r] + out
    return out


def main():
    mode, work = sys.argv[1], Path(sys.argv[2])
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from multilang.adapters.spark import multilang_bolts

    # No console progress bar: it would break the log lines the test reads. (A
    # local Connect server takes these at its start; the client then warns
    # that it cannot set them at runtime.)
    b = (SparkSession.builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spark = (b.remote("local[2]") if mode == "connect" else b.master("local[2]")).getOrCreate()
    result = {"session": type(spark).__module__}

    df = spark.createDataFrame([(i, f"v{i:03d}") for i in range(20)], "id int, value string").repartition(2)
    t = multilang_bolts(ROWS + ["log"], input_cols=["value"], keep=["id"], fields=["value"])
    out = df.transform(t)
    rows = out.collect()
    result["log"] = {"columns": out.columns, "rows": sorted([r["id"], r["value"]] for r in rows),
                     "counters": t.counters.value}

    df = spark.createDataFrame([(i, "bad" + letters(i)) for i in range(2000)], "id int, value string").repartition(2)
    t = multilang_bolts(FAIL_RB, input_cols=["value"], keep=["id"], fields=["upper"], dead_letter="column",
                        max_retries=0)
    rows = df.transform(t).collect()
    dead = [r for r in rows if r["_status"] == "dead_letter"]
    result["fail"] = {"rows": len(rows), "dead": len(dead),
                      "own_error": sum(1 for r in dead if f"cannot take row bad{letters(r['id'])} " in r["_error"]),
                      "sample": dead[0]["_error"] if dead else None, "counters": t.counters.value}

    if mode == "connect":
        src = work / "in"
        src.mkdir()
        (src / "a.json").write_text("".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(6)))
        stream = spark.readStream.schema("id int, text string").json(str(src))
        t = multilang_bolts(ROWS + ["echo"], input_cols=["text"], keep=["id"], fields=["values", "n", "none", "x"])
        q = (stream.transform(t).writeStream.format("memory").queryName("bolts_stream")
             .option("checkpointLocation", str(work / "chk")).trigger(availableNow=True).start())
        q.awaitTermination(120)
        try:
            t.counters.value
            value_error = None
        except RuntimeError as exc:
            value_error = str(exc)
        result["stream"] = {"rows": sorted([r["id"], r["values"]] for r in spark.table("bolts_stream").collect()),
                            "value_error": value_error,
                            "progress": t.counters.from_progress(q.lastProgress)}
    print(json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    main()
