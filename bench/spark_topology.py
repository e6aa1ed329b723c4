#!/usr/bin/env python
"""The README's word count on Spark against the embedded engine (issue target: within 2x).

    python bench/spark_topology.py [--copies N] [--repeat R] [--master URL]

examples/wordcount.toml (Python sentence spout -> Ruby split x2 -> Node
count x2, the count a StatefulBolt) over N copies (30) of its corpus, run as
``multilang run`` subprocesses, the two engines interleaved (embedded, spark,
embedded, spark, ...), best of R (1) each. Wall time of the whole command, so
the Spark figure includes the JVM's start and stop, as a user waits for them.
Both must print the same counts. Reported: each time, and the ratio
spark / embedded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def wordcount_copy(work: Path, copies: int) -> Path:
    """examples/wordcount.toml in ``work`` over ``copies`` copies of its
    corpus (the example components linked in); returns the file's path."""
    (work / "data").mkdir()
    corpus = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8")
    (work / "data" / "alice.txt").write_text(corpus * copies, encoding="utf-8")
    for lang in ("python", "ruby", "node"):
        os.symlink(EXAMPLES / lang, work / lang)
    toml = work / "wordcount.toml"
    toml.write_text((EXAMPLES / "wordcount.toml").read_text(encoding="utf-8"), encoding="utf-8")
    return toml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-spark-topology-") as d:
        work = Path(d)
        toml = wordcount_copy(work, args.copies)
        cli = [sys.executable, "-c", "from multilang._cli.main import main; main()", "run", "--no-progress", str(toml)]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        best: dict[str, float] = {}
        outputs: dict[str, bytes] = {}
        for r in range(args.repeat):
            for engine in ("embedded", "spark"):
                extra = ["--engine", "spark", "--master", args.master, "--checkpoint", str(work / f"ck{r}")] \
                    if engine == "spark" else []
                t = time.perf_counter()
                proc = subprocess.run(cli + extra, capture_output=True, env=env, cwd=work)
                took = time.perf_counter() - t
                if proc.returncode != 0:
                    sys.exit(f"{engine} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")
                outputs[engine] = proc.stdout
                best[engine] = min(best.get(engine, took), took)
                print(f"run {r + 1}: {engine:8s} {took:6.1f} s", flush=True)
        if outputs["embedded"] != outputs["spark"]:
            sys.exit("the two engines printed different counts")
        lines = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").count("\n") * args.copies
        print(f"\nword count, {args.copies} copies ({lines:,} lines), best of {args.repeat}:")
        print(f"  embedded {best['embedded']:6.1f} s")
        print(f"  spark    {best['spark']:6.1f} s  ({args.master})")
        print(f"  ratio spark/embedded {best['spark'] / best['embedded']:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
