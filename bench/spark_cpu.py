#!/usr/bin/env python
"""Where a Spark job's CPU goes: the JVM, Python workers, bolt processes, pipe scripts.

    python bench/spark_cpu.py [--workload line|split] [--lines N] [--repeat R]

Runs the variants of bench/spark_pipe.py (``pipe``: ``RDD.pipe`` with a
line-oriented script; ``bolt+batch``: the same words through a multilang
bolt in ``mapInArrow`` with acking and the batch extension; for ``line``
also ``chain``, two bolts in one partition) on the same cached data, and for each job reads the CPU time (user + system, from
/proc) that every process on the machine used during it, summed by kind:

  jvm        Spark's JVM (driver and executors: local mode)
  workers    PySpark's Python workers (host, Arrow conversion, RDD.pipe's threads)
  bolt       the bolt processes (long-lived: warm between jobs)
  reaped     children that exited during the job: the pipe scripts

On a machine whose cores are all busy, wall time is about total CPU /
cores, so this shows which process a ratio is lost in. The first run of
each variant is a warm-up and is not printed. Linux only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import spark_pipe as sp  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def _cpu() -> dict[int, tuple[str, float, float]]:
    """pid -> (command line, own CPU s, reaped children's CPU s)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2:].split()  # fields from the 3rd (state) on
        out[int(pid)] = (cmd, (int(f[11]) + int(f[12])) / HZ, (int(f[13]) + int(f[14])) / HZ)
    return out


def _kind(cmd: str, bolt_scripts: list[str]) -> str:
    if "java" in cmd.split(" ", 1)[0]:
        return "jvm"
    if any(s in cmd for s in bolt_scripts):
        return "bolt"
    if "pyspark" in cmd and ("daemon" in cmd or "worker" in cmd):
        return "workers"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["split", "line"], default="line")
    ap.add_argument("--lines", type=int, default=None, help="default: 100,000 for line, 20,000 for split")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    n_lines = args.lines or (100_000 if args.workload == "line" else 20_000)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from multilang.adapters.spark import multilang_bolts

    spark = (SparkSession.builder.master("local[2]").appName("bench-spark-cpu")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    lines, rdd, df = sp.cached_data(spark, n_lines, 2)
    wl = args.workload
    tmp = tempfile.mkdtemp(prefix="bench-spark-cpu-")
    pipe_cmd, bolt_script = sp.programs(wl, tmp)
    upper_script = os.path.join(tmp, "bolt_upper.py")
    Path(upper_script).write_text(sp._PRELUDE + sp.UPPER_BOLT)
    col = "word" if wl == "split" else "line"
    variants = {
        "pipe": lambda: rdd.pipe(pipe_cmd, env=dict(os.environ)).count(),
        "bolt+batch": lambda: df.transform(multilang_bolts(["python", bolt_script],
                                                           output_schema=f"{col} string")).count(),
    }
    if wl == "line":  # bench/spark_pipe.py's chain: [normalize, upper]
        variants["chain"] = lambda: df.transform(multilang_bolts([["python", bolt_script], ["python", upper_script]],
                                                                 output_schema=f"{col} string")).count()
    print(f"{wl}: {len(lines)} lines, 2 partitions, local[2]; CPU seconds per job by process kind")
    kinds = ["jvm", "workers", "bolt", "reaped", "other"]
    print(f"  {'variant':11s} {'wall':>6s} " + " ".join(f"{k:>8s}" for k in kinds) + f" {'total':>8s}")
    for rep in range(args.repeat + 1):
        for name, fn in variants.items():
            before = _cpu()
            t = time.perf_counter()
            n = fn()
            wall = time.perf_counter() - t
            after = _cpu()
            if rep == 0:
                continue
            use = dict.fromkeys(kinds, 0.0)
            for pid, (cmd, own, reaped) in after.items():
                _, own0, reaped0 = before.get(pid, (cmd, 0.0, 0.0))
                use[_kind(cmd, [bolt_script, upper_script])] += own - own0
                use["reaped"] += reaped - reaped0
            print(f"  {name:11s} {wall:6.2f} " + " ".join(f"{use[k]:8.2f}" for k in kinds)
                  + f" {sum(use.values()):8.2f}   ({n} records)")
    spark.stop()


if __name__ == "__main__":
    main()
