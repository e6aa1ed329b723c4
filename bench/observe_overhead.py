#!/usr/bin/env python
"""What watching a run costs: the live view and the metrics consumers against
a run that shows nothing (issue "See what a topology is doing": under 5%).

    python bench/observe_overhead.py [--copies N] [--repeat R] [--baseline-python PY]

examples/wordcount.toml (Python sentence spout -> Ruby split x2 -> Node
count x2, the count a StatefulBolt) over N copies (10) of its corpus, run as
``multilang run`` subprocesses, the variants interleaved, one warm-up round
and then R rounds (3), best of R each:

  quiet      ``--no-progress``: the baseline (the tasks' instrumentation,
             which is always on, is fed but nobody reads it)
  live       the live view on a terminal (a pseudo-terminal of 120x40,
             drained by a thread), ``--progress-tasks``: redrawn every second
  lines      the plain ``[progress]`` lines (stderr is a pipe)
  metrics    ``--metrics-port 0`` scraped over HTTP every 0.5 s, and
             ``--metrics-file`` with a line every second
             (``topology.builtin.metrics.bucket.size.secs = 1``)
  before     (with ``--baseline-python PY``) ``--no-progress`` run by another
             interpreter that has an older multilang installed, e.g. a venv
             with an editable install of the commit before the live view:
             what the always-on instrumentation costs

Throughput is the run's trees completed per second of its own ``[summary]``
time (spawning the processes included, the interpreter's start not); CPU is
the user + system seconds of the whole run (``multilang run`` and every
component process it reaped, from ``wait4``), which a busy machine disturbs
less than wall time. Every variant must complete every tree. Reported: each
variant's best of both, and its overhead against ``quiet`` (target: under 5%).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from spark_topology import wordcount_copy  # noqa: E402  (the same word count, the same corpus)

_CLI = ["-c", "from multilang._cli.main import main; main()", "run"]
_SUMMARY = re.compile(r"\[summary\] ([\d.]+)s; trees completed (\d+), failed (\d+)")
_SERVING = re.compile(r"\[metrics\] serving (http://\S+)")


def _drain(fd: int, sink: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        sink.append(chunk)


def _scrape(url_box: list[str], stop: threading.Event, count: list[int]) -> None:
    while not stop.is_set():
        if url_box:
            try:
                with urllib.request.urlopen(url_box[0] + "", timeout=5) as r:
                    r.read()
                count[0] += 1
            except OSError:
                pass
        stop.wait(0.5)


def _wait(p: subprocess.Popen) -> float:
    """Reap ``p``; the CPU seconds of its whole process tree."""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


def run(variant: str, toml: Path, work: Path, baseline: str | None = None) -> tuple[float, float, int, str]:
    """One run: (summary seconds, CPU seconds, trees completed, a note)."""
    args = [baseline if variant == "before" and baseline else sys.executable] + _CLI + [str(toml)]
    note = ""
    if variant in ("quiet", "before"):
        args.append("--no-progress")
    elif variant == "live":
        args.append("--progress-tasks")
    elif variant == "metrics":
        args += ["--no-progress", "--metrics-port", "0", "--metrics-file", str(work / "metrics.jsonl"),
                 "-c", "topology.builtin.metrics.bucket.size.secs=1"]
    if variant == "live":
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        screen: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(master, screen), daemon=True)
        reader.start()
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=slave, env={**os.environ, "TERM": "xterm"},
                             cwd=work)
        cpu = _wait(p)
        os.close(slave)
        reader.join(10)
        os.close(master)
        err = b"".join(screen).decode(errors="replace")
        note = f"{err.count(chr(27) + '[')} escape sequences"
    else:
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=work)
        url: list[str] = []
        stop = threading.Event()
        scrapes = [0]
        scraper = threading.Thread(target=_scrape, args=(url, stop, scrapes), daemon=True)
        scraper.start()
        lines = []
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line)
            m = _SERVING.search(line)
            if m and variant == "metrics":
                url.append(m.group(1))
        cpu = _wait(p)
        stop.set()
        scraper.join(10)
        err = "".join(lines)
        if variant == "metrics":
            n = sum(1 for _ in open(work / "metrics.jsonl", encoding="utf-8"))
            note = f"{scrapes[0]} scrapes, {n} JSON lines"
        elif variant == "lines":
            note = f"{err.count('[progress]')} progress lines"
    if p.returncode != 0:
        raise SystemExit(f"{variant}: exit {p.returncode}\n{err[-3000:]}")
    m = _SUMMARY.search(err)
    if m is None or m.group(3) != "0":
        raise SystemExit(f"{variant}: no clean summary\n{err[-3000:]}")
    return float(m.group(1)), cpu, int(m.group(2)), note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline-python", metavar="PY",
                    help="an interpreter with an older multilang installed (run from a neutral directory)")
    args = ap.parse_args()
    variants = ["quiet", "live", "lines", "metrics"] + (["before"] if args.baseline_python else [])
    with tempfile.TemporaryDirectory(prefix="bench-observe-") as d:
        work = Path(d)
        toml = wordcount_copy(work, args.copies)
        best: dict[str, float] = {}
        best_cpu: dict[str, float] = {}
        notes: dict[str, str] = {}
        trees = None
        print(f"word count, {args.copies}x corpus, best of {args.repeat} after a warm-up round "
              f"(load avg {os.getloadavg()[0]:.1f})")
        for r in range(args.repeat + 1):
            for v in variants:
                secs, cpu, done, note = run(v, toml, work, args.baseline_python)
                if trees is None:
                    trees = done
                elif done != trees:
                    raise SystemExit(f"{v}: {done} trees completed, expected {trees}")
                if r:
                    best[v] = min(best.get(v, float("inf")), secs)
                    best_cpu[v] = min(best_cpu.get(v, float("inf")), cpu)
                    notes[v] = note
                    print(f"  round {r} {v:8s} {secs:6.2f}s  cpu {cpu:6.2f}s  {note}", flush=True)
        base = trees / best["quiet"]
        print(f"{trees} trees per run")
        for v in variants:
            rate = trees / best[v]
            print(f"  {v:8s} {best[v]:6.2f}s {rate:8.0f} trees/s  overhead {100 * (1 - rate / base):+5.1f}%   "
                  f"cpu {best_cpu[v]:6.2f}s  {1e6 * best_cpu[v] / trees:6.0f} us/tree  "
                  f"overhead {100 * (best_cpu[v] / best_cpu['quiet'] - 1):+5.1f}%"
                  + ("" if v == "quiet" else "  (target < 5%)"))


if __name__ == "__main__":
    main()
