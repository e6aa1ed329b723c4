"""A Spark driver for tests/spark/test_cluster.py, on a standalone cluster:
``python cluster_bolts_driver.py MASTER COMPONENTS INPUT OUT CHECKPOINT``.

A streaming job as a PySpark user writes one: JSON lines ``{"id", "sentence"}``
from the files in INPUT (one file per micro-batch), through the Ruby split
bolt with ``multilang_bolts`` (its commands run in COMPONENTS, shipped to the
executors: the workers cannot see it), into parquet files in OUT, with its
checkpoint in CHECKPOINT. Prints ``batch N`` as each micro-batch commits,
then ``done``, then the (id, word) rows of OUT as Spark reads them back (a
JSON array on one line).
"""

import json
import os
import sys


def main():
    master, components, inputs, out, checkpoint = sys.argv[1:6]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from multilang.adapters.spark import multilang_bolts

    spark = (SparkSession.builder.master(master).appName("multilang-cluster-bolts")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.executor.memory", "512m")
             .config("spark.task.maxFailures", "8").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    lines = (spark.readStream.schema("id long, sentence string").option("maxFilesPerTrigger", 1).json(inputs)
             .repartition(2))
    split = multilang_bolts(["ruby", "split_bolt.rb"], input_cols=["sentence"], keep=["id"], fields=["word"],
                            resource_dir=components)
    q = (lines.transform(split).writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    seen = -1
    while True:
        ended = q.awaitTermination(0.3)
        progress = q.lastProgress
        if progress is not None and progress["batchId"] > seen:
            seen = progress["batchId"]
            print(f"batch {seen}", flush=True)
        if ended:
            break
    if q.exception() is not None:
        raise q.exception()
    print("done", flush=True)
    rows = [[r.id, r.word] for r in spark.read.parquet(out).select("id", "word").collect()]
    print(json.dumps(rows), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
