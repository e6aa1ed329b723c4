#!/usr/bin/env python
"""`multilang pipe` against the plain-bytes driver, through the same bolt.

    python bench/host_pipe.py [--tuples N] [--repeat R]

Issue "One protocol engine" asks for ``multilang pipe`` with our Python echo
bolt (bench/components/ours_echo.py) at >= 0.5x the plain-bytes driver with
the same bolt, best of R, same run. Both move the same N tuples
(``["word", n]`` -> one anchored emit + ack) through the same bolt program:

* driver: bench/bolt_throughput.py's ``drive`` (pre-encoded frames written by
  a thread, replies counted from the raw bytes; no host work at all), timed
  from the first tuple written to the last ack read;
* pipe: ``multilang pipe --json-input --fields word,count -- BOLT`` as a user
  runs it, reading N JSON lines from a file on stdin and writing N JSON lines
  to a pipe that this script reads and counts; timed from the first output
  line to the last (interpreter start, imports and the handshake excluded,
  as the driver excludes them), with every tree tracked by the acker.

Variants are interleaved (driver, pipe, driver, pipe, ...) and the best run
of each counts. The first run of each is an untimed, checked warm-up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bolt_throughput as bt  # noqa: E402

BOLT = [sys.executable, str(HERE / "components" / "ours_echo.py")]


def pipe_run(wl: bt.Workload, input_path: str, check: bool) -> float:
    """Tuples/s of `multilang pipe` from its first output line to its last."""
    cmd = [sys.executable, "-c", "from multilang._cli.main import main; main()", "pipe", "--json-input", "--fields", "word,count",
           "--output-fields", "word,count", "--", *BOLT]
    with open(input_path, "rb") as stdin, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=err, cwd=str(HERE))
        assert p.stdout is not None
        fd = p.stdout.fileno()
        lines = 0
        first = last = 0.0
        chunks: list[bytes] = []
        while True:
            data = os.read(fd, 1 << 20)
            if not data:
                break
            now = time.perf_counter()
            if not lines:
                first = now
            lines += data.count(b"\n")
            last = now
            if check:
                chunks.append(data)
        code = p.wait()
        if code != 0 or lines != wl.n:
            err.seek(0)
            raise bt.BenchError(f"pipe: exit {code}, {lines}/{wl.n} lines out; stderr:\n{err.read().decode()[-2000:]}")
    if check:
        got = [orjson.loads(ln) for ln in b"".join(chunks).splitlines()]
        if got != wl.values:
            raise bt.BenchError("pipe: the output lines differ from the input tuples")
    return (wl.n - 1) / (last - first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuples", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pipe-") as tmp:
        wl = bt.Workload("echo", args.tuples, tmp)
        input_path = os.path.join(tmp, "input.jsonl")
        with open(input_path, "wb") as f:
            f.writelines(orjson.dumps(v) + b"\n" for v in wl.values)
        best = {"driver": 0.0, "pipe": 0.0}
        for i in range(args.repeat + 1):
            check = i == 0  # the warm-up is checked in full and not timed
            d = bt.drive(BOLT, wl, verify=check).rate
            p = pipe_run(wl, input_path, check)
            if not check:
                best["driver"] = max(best["driver"], d)
                best["pipe"] = max(best["pipe"], p)
            print(f"  run {i}{' (warm-up)' if check else ''}: driver {d:,.0f}/s, pipe {p:,.0f}/s", file=sys.stderr)
    ratio = best["pipe"] / best["driver"]
    print(f"multilang pipe + python echo: {best['pipe']:,.0f} tuples/s; driver + same bolt: {best['driver']:,.0f} "
          f"tuples/s; ratio {ratio:.2f}x (target >= 0.5x: {'MET' if ratio >= 0.5 else 'NOT MET'}); "
          f"N = {args.tuples}, best of {args.repeat}")


if __name__ == "__main__":
    main()
