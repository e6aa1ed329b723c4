#!/usr/bin/env python
"""Spark: a multilang shell bolt in mapInArrow vs RDD.pipe, same data, same work.

    python bench/spark_pipe.py [--lines N] [--partitions P] [--repeat R] [--master URL]
                               [--workload split|line|both]

Data: the lines of examples/data/alice.txt repeated to N lines, in P
partitions, cached in Spark before timing. Per-record work, the same function
on both sides (examples/python/split_bolt.py ``words``):

  split   one output record per word (the example split bolt; ~24 per line)
  line    one output record per line: its words joined by single spaces

Variants (every run ends with ``count()`` and is checked against the number
of records computed here):

  pipe        ``rdd.pipe("python script.py")``: a line-oriented Python script
              (lines in, records out as lines): Spark's baseline for running
              an external program per partition.
  bolt        ``df.transform(multilang_bolts(["python", bolt.py], ...))``: a
              multilang BasicBolt (one anchored emit per record, then an ack),
              **standard protocol** (conf multilang.extensions = []), every row
              a root of the acker, outputs released when the row's tree
              completes, through mapInArrow, warm processes.
  bolt+batch  the same with the ``batch`` extension (spec §9.5), which the
              host offers and our libraries accept by default.
  chain       (``line`` only) a chain of two bolts, ``[normalize, upper]``:
              the ``line`` bolt, then a second Python bolt that emits its
              input upper-cased, one output per tuple; both with ``batch``.
              The chain takes the general path (router and XOR acker) where
              one bolt takes the direct lane. Target: >= 0.7x ``bolt+batch``.

Each variant runs once to warm up (Python workers, warm bolt processes), then
R times interleaved; the best run is reported as input lines/s and output
records/s, with the ratios against ``pipe`` (targets: split ``bolt`` >= 0.5x,
line ``bolt`` >= 1.0x) and, for ``line``, of the chain against one bolt.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES / "python"))
from split_bolt import words  # noqa: E402

_PRELUDE = f"""\
import sys
sys.path.insert(0, {str(EXAMPLES / "python")!r})
from split_bolt import words
"""

PIPE_SCRIPTS = {
    "split": _PRELUDE + """\
out = sys.stdout
for line in sys.stdin:
    out.write("".join(w + "\\n" for w in words(line.rstrip("\\n"))))
""",
    "line": _PRELUDE + """\
out = sys.stdout
for line in sys.stdin:
    out.write(" ".join(words(line.rstrip("\\n"))) + "\\n")
""",
}

BOLTS = {
    "split": None,  # examples/python/split_bolt.py itself
    "line": _PRELUDE + """\
from multilang import BasicBolt

class Normalize(BasicBolt):
    def process(self, tup):
        self.emit([" ".join(words(tup.values[0]))])

Normalize().run()
""",
}

#: the second bolt of the ``chain`` variant: its input, upper-cased
UPPER_BOLT = """\
from multilang import BasicBolt

class Upper(BasicBolt):
    def process(self, tup):
        self.emit([tup.values[0].upper()])

Upper().run()
"""


def cached_data(spark, n_lines: int, partitions: int) -> tuple[list[str], Any, Any]:
    """The lines of alice.txt repeated to ``n_lines``, as a cached RDD and a
    cached one-column DataFrame (``sentence``) of ``partitions`` partitions."""
    base = [ln.strip() for ln in (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()
            if ln.strip()]
    lines = (base * (n_lines // len(base) + 1))[:n_lines]
    rdd = spark.sparkContext.parallelize(lines, partitions).cache()
    df = spark.createDataFrame([(ln,) for ln in lines], "sentence string").repartition(partitions).cache()
    assert rdd.count() == df.count() == len(lines)
    return lines, rdd, df


def programs(wl: str, tmp: str) -> tuple[str, str]:
    """(the pipe command, the bolt script) of a workload, written under ``tmp``."""
    script = os.path.join(tmp, f"pipe_{wl}.py")
    Path(script).write_text(PIPE_SCRIPTS[wl])
    if BOLTS[wl] is None:
        bolt_script = str(EXAMPLES / "python" / "split_bolt.py")
    else:
        bolt_script = os.path.join(tmp, f"bolt_{wl}.py")
        Path(bolt_script).write_text(BOLTS[wl])
    return f"{shlex.quote(sys.executable)} {shlex.quote(script)}", bolt_script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=40_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--workload", choices=["split", "line", "both"], default="both")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from multilang.adapters.spark import multilang_bolts

    spark = (SparkSession.builder.master(args.master).appName("bench-spark-pipe")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    lines, rdd, df = cached_data(spark, args.lines, args.partitions)
    tmp = tempfile.mkdtemp(prefix="bench-spark-pipe-")
    upper_script = os.path.join(tmp, "bolt_upper.py")
    Path(upper_script).write_text(_PRELUDE + UPPER_BOLT)

    workloads = ["split", "line"] if args.workload == "both" else [args.workload]
    print(f"{len(lines)} lines, {args.partitions} partitions, master {args.master}, best of {args.repeat} "
          f"(load avg {os.getloadavg()[0]:.1f})")
    for wl in workloads:
        expected = sum(1 for ln in lines for _ in words(ln)) if wl == "split" else len(lines)
        pipe_cmd, bolt_script = programs(wl, tmp)
        col = "word" if wl == "split" else "line"

        def run_bolt(extensions: list[str], counters: dict, chain: bool = False) -> int:
            spec = [["python", bolt_script], ["python", upper_script]] if chain else ["python", bolt_script]
            t = multilang_bolts(spec, output_schema=f"{col} string", conf={"multilang.extensions": extensions})
            n = df.transform(t).count()
            counters.update(t.counters.value if t.counters else {})
            return n

        variants = {
            "pipe": lambda c: rdd.pipe(pipe_cmd, env=dict(os.environ)).count(),
            "bolt": lambda c: run_bolt([], c),
            "bolt+batch": lambda c: run_bolt(["batch"], c),
        }
        if wl == "line":
            variants["chain"] = lambda c: run_bolt(["batch"], c, chain=True)
        best: dict[str, float] = {}
        for rep in range(args.repeat + 1):  # rep 0: warm-up
            for name, fn in variants.items():
                counters: dict = {}
                t = time.perf_counter()
                got = fn(counters)
                dt = time.perf_counter() - t
                if got != expected:
                    raise SystemExit(f"{wl}/{name}: {got} records, expected {expected}; counters {counters}")
                if rep:
                    best[name] = min(best.get(name, float("inf")), dt)
        print(f"[{wl}] {expected} output records")
        for name, dt in best.items():
            print(f"  {name:11s} {dt:7.3f}s  {len(lines) / dt:9.0f} lines/s  {expected / dt:10.0f} records/s"
                  f"  {best['pipe'] / dt:5.2f}x pipe")
        print(f"  ratio bolt/pipe (standard protocol, acked, mapInArrow) = {best['pipe'] / best['bolt']:.2f}x "
              f"(target >= {0.5 if wl == 'split' else 1.0}x)")
        if "chain" in best:
            print(f"  ratio chain/bolt+batch (two bolts against one) = {best['bolt+batch'] / best['chain']:.2f}x "
                  "(target >= 0.7x)")
    spark.stop()


if __name__ == "__main__":
    main()
