#!/usr/bin/env python
"""Host workers (issue 35, docs/WORKERS.md): what they cost and what they buy.

    python bench/workers.py [--copies N] [--repeat R] [--workers 1,2,4] [--python]
                            [--parallelism P] [--max-spout-pending N] [--json]

The README's word count (examples/wordcount.toml: Python sentence spout ->
Ruby split x2 -> Node count x2, the count bolt stateful, checkpoints every
second) over N copies of its corpus (30: 32,400 sentences, 763,200 words),
or with ``--python`` the all-Python word count (the split and count of
examples/python/, as bench/topology_host.py runs it, ``--parallelism`` tasks
of each; the issue's 8-core target is ``--python --parallelism 8``),
run from this process with each number of workers, round-robin (1, 2, 1,
2, ...), R rounds:

* 1 worker: the embedded engine in this process (``Runtime``), what
  ``multilang run`` does by default;
* N > 1: ``run_workers``: N host worker processes, forked from a fork
  server as ``multilang run`` forks them, and this process as the main one
  (it drives the checkpoints and writes the state store).

Reported per number of workers, as the median of the rounds: wall seconds,
sentences per second, and the host's CPU per word: this process's CPU plus
the workers' own (the components' processes are not counted, they are the
same in every variant) and the fork server's, with the workers' start-up
(the fork server's CPU and each worker's until its hello: a few ms each; a
worker started as a new interpreter would pay about 0.13 s for its imports)
and without it ("running"; the embedded engine's imports were paid before, in
this process), this process's own CPU ("main s": with workers, the main
process's, which writes every checkpoint to the store; with 1, the whole
engine's), the checkpoints taken ("cps"), and the busiest worker's share
of the workers' CPU (1/N when they share the work evenly; the spouts'
worker also runs the spout and acks every tree its spouts began). Then the
host CPU per word's ratio round by round (each round's run to the same
round's run of the fewest workers: a drift of the machine's speed over the
rounds cancels), its median and range. Every run must print the same counts
as a plain count of the corpus.

Targets (issue 35): on 2 cores, host CPU per word with 2 workers at most
1.25x that of 1 worker, and 2 workers at least as fast as 1; on 8 cores or
more, 4 workers at least 3.5x the sentences per second of 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES / "python"))
sys.path.insert(0, str(ROOT / "bench"))
from split_bolt import words  # noqa: E402
from topology_host import wordcount_toml  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def topology_file(corpus: Path, parallelism: int | None) -> Path:
    text = (EXAMPLES / "wordcount.toml").read_text().replace('"data/alice.txt"', f'"{corpus}"')
    if parallelism is not None:
        text = text.replace("parallelism = 2", f"parallelism = {parallelism}")
    path = EXAMPLES / f".bench-workers-{os.getpid()}.toml"  # commands resolve against the file's directory
    path.write_text(text)
    return path


def with_pending(path: Path, pending: int | None) -> None:
    if pending is not None:
        text = path.read_text()
        new, n = re.subn(r'^"topology\.max\.spout\.pending" = \d+$', f'"topology.max.spout.pending" = {pending}', text,
                         flags=re.M)
        if n != 1:
            raise SystemExit(f"{path}: no topology.max.spout.pending line for --max-spout-pending to replace")
        path.write_text(new)


def run_once(path: Path, workers: int) -> dict:
    from multilang.shellbolt import ForkServer, Runtime, load_topology, prepare_gc, run_workers

    topo = load_topology(path)
    outputs: dict[str, int] = {}

    def keep(record: dict) -> None:
        outputs[record["word"]] = record["count"]

    prepare_gc()  # (as multilang run does before it runs a topology: multilang/_cli/common.py, run_trio)
    c0, t0 = _cpu(), time.perf_counter()
    if workers == 1:
        result = trio.run(lambda: Runtime(topo, on_output=keep).run(until_done=True))
        host = main = _cpu() - c0
        start = 0.0
        busiest = 1.0
    else:
        with ForkServer.start() as server:  # (as multilang run does: multilang/_cli/run.py)
            result = trio.run(lambda: run_workers(topo, workers, on_output=keep, fork_server=server))
        main = _cpu() - c0
        host = main + result.workers_cpu + result.fork_server_cpu  # type: ignore[attr-defined]
        start = result.workers_start_cpu + result.fork_server_cpu  # type: ignore[attr-defined]
        busiest = max(result.worker_cpus) / result.workers_cpu  # type: ignore[attr-defined]
    wall = time.perf_counter() - t0
    for record in result.outputs:
        keep(record)
    return {"wall": wall, "host_cpu": host, "main_cpu": main, "start_cpu": start, "words": result.stats["split"].emitted,
            "sentences": result.completed, "checkpoints": result.checkpoints,
            "busiest": busiest, "ok": result.ok, "counts": outputs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--copies", type=int, default=30)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", default="1,2", help="comma-separated numbers of workers (1: the embedded engine)")
    p.add_argument("--python", action="store_true", help="the all-Python word count (Python split and count)")
    p.add_argument("--parallelism", type=int, help="tasks of split and of count (default: as the topology says, 2)")
    p.add_argument("--max-spout-pending", type=int, help="topology.max.spout.pending (default: the topology's, 200)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line on stdout")
    args = p.parse_args()
    counts = sorted({int(n) for n in args.workers.split(",")})
    text = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8") * args.copies
    expected = dict(Counter(w for line in text.splitlines() for w in words(line.strip())))
    errors: list[str] = []
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(text, encoding="utf-8")
        if args.python:
            path = wordcount_toml(Path(tmp), corpus, args.parallelism or 2)
        else:
            path = topology_file(corpus, args.parallelism)
        try:
            with_pending(path, args.max_spout_pending)
            for _ in range(args.repeat):
                for n in counts:
                    r = run_once(path, n)
                    if not r["ok"] or r.pop("counts") != expected:
                        errors.append(f"{n} worker(s): the counts differ from a plain count of the corpus")
                    runs[n].append(r)
                    if not args.json:
                        print(f"  {n} worker(s): {r['wall']:.2f} s, host CPU {r['host_cpu']:.2f} s", file=sys.stderr)
        finally:
            path.unlink()
    report: dict = {"copies": args.copies, "repeat": args.repeat, "python": args.python,
                    "parallelism": args.parallelism or 2, "max_spout_pending": args.max_spout_pending or 200,
                    "cores": os.cpu_count(), "errors": errors, "by": {}}
    for n in counts:
        wall = statistics.median(r["wall"] for r in runs[n])
        per_word = statistics.median(r["host_cpu"] / r["words"] for r in runs[n])
        running = statistics.median((r["host_cpu"] - r["start_cpu"]) / r["words"] for r in runs[n])
        report["by"][n] = {"wall_s": round(wall, 2), "sentences_per_s": round(runs[n][0]["sentences"] / wall),
                           "host_cpu_us_per_word": round(per_word * 1e6, 2),
                           "running_cpu_us_per_word": round(running * 1e6, 2),
                           "start_cpu_s": round(statistics.median(r["start_cpu"] for r in runs[n]), 2),
                           "main_cpu_s": round(statistics.median(r["main_cpu"] for r in runs[n]), 2),
                           "checkpoints": runs[n][0]["checkpoints"],
                           "busiest_worker_share": round(statistics.median(r["busiest"] for r in runs[n]), 3)}
    base = report["by"][counts[0]]
    for n in counts[1:]:
        row = report["by"][n]
        row["cpu_per_word_ratio"] = round(row["host_cpu_us_per_word"] / base["host_cpu_us_per_word"], 3)
        row["running_cpu_ratio"] = round(row["running_cpu_us_per_word"] / base["running_cpu_us_per_word"], 3)
        row["speedup"] = round(base["wall_s"] / row["wall_s"], 3)
        # (each round's ratio to the base's run of the same round: a machine's drift over the rounds cancels)
        paired = sorted((r["host_cpu"] / r["words"]) / (b["host_cpu"] / b["words"])
                        for r, b in zip(runs[n], runs[counts[0]]))
        row["cpu_per_word_ratio_by_round"] = [round(x, 3) for x in paired]
    if args.json:
        print(json.dumps(report))
    else:
        what = "all-Python word count" if args.python else "README word count"
        print(f"{what}, parallelism {args.parallelism or 2}, max spout pending {args.max_spout_pending or 200}, "
              f"{args.copies}x corpus, median of {args.repeat}, {os.cpu_count()} cores")
        print(f"{'workers':>8} {'wall s':>8} {'sent/s':>8} {'host CPU us/word':>17} {'ratio':>6} "
              f"{'running us/word':>16} {'ratio':>6} {'start s':>8} {'main s':>7} {'cps':>5} {'speedup':>8} "
              f"{'busiest':>8}")
        for n in counts:
            r = report["by"][n]
            print(f"{n:>8} {r['wall_s']:>8.2f} {r['sentences_per_s']:>8} {r['host_cpu_us_per_word']:>17.2f} "
                  f"{r.get('cpu_per_word_ratio', 1.0):>6.3f} {r['running_cpu_us_per_word']:>16.2f} "
                  f"{r.get('running_cpu_ratio', 1.0):>6.3f} {r['start_cpu_s']:>8.2f} {r['main_cpu_s']:>7.2f} "
                  f"{r['checkpoints']:>5} {r.get('speedup', 1.0):>8.3f} {r['busiest_worker_share']:>8.3f}")
        for n in counts[1:]:
            by_round = report["by"][n]["cpu_per_word_ratio_by_round"]
            print(f"host CPU per word, {n} workers / {counts[0]}, round by round: median "
                  f"{statistics.median(by_round):.3f}x, from {by_round[0]:.3f}x to {by_round[-1]:.3f}x")
        for e in errors:
            print("error:", e)
    raise SystemExit(1 if errors else 0)


if __name__ == "__main__":
    main()
