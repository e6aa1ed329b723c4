#!/usr/bin/env python
"""Host CPU per word of the all-Python word count against host CPU per tuple
of `multilang pipe`, in one run (issue "tuples move through the runtime in
batches").

    python bench/topology_host.py [--copies K] [--parallelism P] [--tuples N] [--repeat R]

* word count: examples/wordcount.toml's topology with the Python components
  of examples/python/ (sentence spout -> split, hold mode on -> stateful
  count, as in the README), over K copies of examples/data/alice.txt, run to
  the end by ``multilang run`` as a user runs it;
* pipe: ``multilang pipe --json-input`` with bench/components/ours_echo.py
  over N ``["word", n]`` lines (the lean path);
* the README word count as shipped (Python spout, Ruby split, Node count) over
  the same corpus: sentences per second, unless ``--no-shipped``.

Host CPU is the ``multilang`` process's own user + system time (read from
/proc/PID/stat while it runs, the last reading before it exits), not its
components'. Start-up (interpreter, imports, handshakes, teardown) is taken
out: the word count's by a run of the same topology with ``--max-tuples 1``,
the pipe's by a run with one line. Each measured run is repeated R times and
the least CPU counts (CPU time still varies with a busy machine's caches and
frequency). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples"
ML = [sys.executable, "-c", "from multilang._cli.main import main; main()"]
TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def run_measured(cmd: list[str], *, stdin_path: str | None = None, cwd: Path = ROOT) -> tuple[float, float, str, int]:
    """(host CPU seconds, wall seconds, stderr, stdout lines) of one run."""
    with tempfile.TemporaryFile() as err, open(stdin_path or os.devnull, "rb") as stdin:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=err, cwd=str(cwd))
        last = [0.0]

        def sample() -> None:
            while p.poll() is None:
                c = _cpu(p.pid)
                if c is not None:
                    last[0] = c
                time.sleep(0.02)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        assert p.stdout is not None
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: p.stdout.read(1 << 20), b""))
        code = p.wait()
        wall = time.perf_counter() - t0
        th.join()
        err.seek(0)
        text = err.read().decode(errors="replace")
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[3:])}: exit {code}\n{text[-3000:]}")
    return last[0], wall, text, lines


def wordcount_toml(tmp: Path, corpus: Path, parallelism: int) -> Path:
    py = EXAMPLES / "python"
    toml = f'''
[topology]
name = "wordcount-python"
[topology.conf]
"topology.max.spout.pending" = 200
"topology.message.timeout.secs" = 30
[spouts.sentences]
command = ["python", "{py / 'sentence_spout.py'}", "{corpus}"]
fields = ["sentence"]
[bolts.split]
command = ["python", "{py / 'split_bolt.py'}"]
fields = ["word"]
parallelism = {parallelism}
inputs = [{{ source = "sentences", grouping = "shuffle" }}]
conf = {{ "multilang.hold.emits.until.ack" = true }}
[bolts.count]
command = ["python", "{py / 'count_bolt.py'}"]
fields = ["word", "count"]
parallelism = {parallelism}
inputs = [{{ source = "split", grouping = "fields", fields = ["word"] }}]
[output]
component = "count"
key = ["word"]
'''
    path = tmp / "wordcount.toml"
    path.write_text(toml)
    return path


def shipped_toml(tmp: Path, corpus: Path) -> Path:
    """examples/wordcount.toml as shipped, reading ``corpus``, with its paths made absolute."""
    text = (EXAMPLES / "wordcount.toml").read_text()
    for rel in ("python/sentence_spout.py", "ruby/split_bolt.rb", "node/count_bolt.js"):
        text = text.replace(f'"{rel}"', f'"{EXAMPLES / rel}"')
    text = text.replace('"data/alice.txt"', f'"{corpus}"')
    path = tmp / "shipped.toml"
    path.write_text(text)
    return path


def _summary(text: str, component: str, counter: str) -> int:
    m = re.search(rf"\[summary\]\s+{component}: .*?\b{counter} (\d+)", text)
    if m is None:
        raise SystemExit(f"no '{counter}' of {component} in the summary:\n{text[-3000:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=30, help="copies of alice.txt in the corpus (1,080 sentences each)")
    ap.add_argument("--parallelism", type=int, default=2, help="tasks of split and of count")
    ap.add_argument("--tuples", type=int, default=200_000, help="lines through multilang pipe")
    ap.add_argument("--no-shipped", action="store_true", help="skip the Ruby/Node word count")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the least CPU counts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-topology-host-") as d:
        tmp = Path(d)
        corpus = tmp / "corpus.txt"
        text = (EXAMPLES / "data" / "alice.txt").read_text()
        corpus.write_text(text * args.copies)
        toml = wordcount_toml(tmp, corpus, args.parallelism)
        cpu0, *_ = run_measured([*ML, "run", str(toml), "--no-progress", "--max-tuples", "1"])
        cpu, wall, out, _ = min((run_measured([*ML, "run", str(toml), "--no-progress"]) for _ in range(args.repeat)),
                                key=lambda r: r[0])
        words = _summary(out, "count", "executed")
        sentences = _summary(out, "sentences", "acked")
        per_word = (cpu - cpu0) / words

        one = tmp / "one.jsonl"
        one.write_bytes(b'["word", 0]\n')
        lines = tmp / "lines.jsonl"
        with open(lines, "wb") as f:
            f.writelines(orjson.dumps(["word", i]) + b"\n" for i in range(args.tuples))
        pipe = [*ML, "pipe", "--json-input", "--fields", "word,count", "--output-fields", "word,count", "--",
                sys.executable, str(HERE / "components" / "ours_echo.py")]
        pcpu0, _, _, _ = run_measured(pipe, stdin_path=str(one))
        pcpu, pwall, _, got = min((run_measured(pipe, stdin_path=str(lines)) for _ in range(args.repeat)),
                                  key=lambda r: r[0])
        if got != args.tuples:
            raise SystemExit(f"pipe: {got}/{args.tuples} lines out")
        per_tuple = (pcpu - pcpu0) / args.tuples
        shipped = None
        if not args.no_shipped:
            _scpu, swall, sout, _ = run_measured([*ML, "run", str(shipped_toml(tmp, corpus)), "--no-progress"])
            shipped = (_summary(sout, "sentences", "acked"), swall)
    print(f"word count (Python components, parallelism {args.parallelism}, {args.copies}x alice.txt): "
          f"{sentences:,} sentences, {words:,} words in {wall:.1f} s ({sentences / wall:,.0f} sentences/s); "
          f"host CPU {cpu:.2f} s ({cpu0:.2f} s start-up): {per_word * 1e6:.1f} us/word")
    print(f"multilang pipe + python echo: {args.tuples:,} tuples in {pwall:.1f} s; host CPU {pcpu:.2f} s "
          f"({pcpu0:.2f} s start-up): {per_tuple * 1e6:.1f} us/tuple")
    if shipped is not None:
        n, w = shipped
        print(f"the README word count as shipped (Ruby split, Node count), same corpus: {n:,} sentences in {w:.1f} s "
              f"({n / w:,.0f} sentences/s, start-up included)")
    ratio = per_word / per_tuple
    print(f"host CPU per word / per pipe tuple: {ratio:.2f}x (target <= 2x: {'MET' if ratio <= 2 else 'NOT MET'})")


if __name__ == "__main__":
    main()
