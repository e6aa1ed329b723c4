"""Under Spark Connect (the local server `multilang run --engine spark --remote
local[2]` starts), run the README word count topology with run_topology and a
Ruby split bolt with multilang_bolts; print both results, and the addresses
this process's children listen on, as one JSON object on stdout."""

import json
import os
import sys

from pyspark.sql import SparkSession

from multilang.adapters.spark import multilang_bolts, run_topology
from multilang.adapters.spark._streaming.topology import _local_session
from multilang.shellbolt import load_topology


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out + [g for c in out for g in _children(c)]


def listening(pids: list[int]) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* write them) of the TCP
    sockets in LISTEN state that these processes hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    found.append(fields[1])
    return found


toml, text = sys.argv[1], sys.argv[2]
spark = _local_session(SparkSession, "local[2]", "connect-test", remote="local[2]")
try:
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    result = run_topology(load_topology(toml), spark=spark)
    lines = spark.createDataFrame([(line,) for line in open(text, encoding="utf-8").read().splitlines()], "line string")
    words = lines.transform(multilang_bolts(["ruby", "examples/ruby/split_bolt.rb"], output_schema="word string"))
    counts = {r["word"]: r["count"] for r in words.groupBy("word").count().collect()}
    print(json.dumps({"topology": result.outputs, "bolts": counts, "batches": result.batches,
                      "listening": listening([os.getpid(), *_children(os.getpid())])}))
finally:
    spark.stop()
