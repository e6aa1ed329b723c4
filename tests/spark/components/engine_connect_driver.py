"""Under Spark Connect (a local server: SparkSession.builder.remote("local[2]")),
run the README word count topology with run_topology and a Ruby split bolt with
multilang_bolts; print both results as one JSON object on stdout."""

import json
import sys

from pyspark.sql import SparkSession

from multilang.adapters.spark import multilang_bolts, run_topology
from multilang.shellbolt import load_topology

toml, text = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.remote("local[2]").getOrCreate()
try:
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    result = run_topology(load_topology(toml), spark=spark)
    lines = spark.createDataFrame([(line,) for line in open(text, encoding="utf-8").read().splitlines()], "line string")
    words = lines.transform(multilang_bolts(["ruby", "examples/ruby/split_bolt.rb"], output_schema="word string"))
    counts = {r["word"]: r["count"] for r in words.groupBy("word").count().collect()}
    print(json.dumps({"topology": result.outputs, "bolts": counts, "batches": result.batches}))
finally:
    spark.stop()
