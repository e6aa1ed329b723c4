#!/usr/bin/env python
"""Host CPU per word of the all-Python word count against host CPU per tuple
of `multilang pipe`, in one run (issue "tuples move through the runtime in
batches").

    python bench/topology_host.py [--copies K] [--parallelism P] [--tuples N] [--repeat R]
                                  [--no-shipped] [--before REF]

* word count: examples/wordcount.toml's topology with the Python components
  of examples/python/ (sentence spout -> split, hold mode on -> stateful
  count, as in the README), over K copies of examples/data/alice.txt, run to
  the end by ``multilang run`` as a user runs it;
* pipe: ``multilang pipe --json-input`` with bench/components/ours_echo.py
  over N ``["word", n]`` lines (the lean path);
* the README word count as shipped (Python spout, Ruby split, Node count) over
  the same corpus: sentences per second, unless ``--no-shipped``;
* with ``--before REF`` (a git commit, e.g. the one before a change), the
  word counts again with the host of REF's source tree (a git worktree,
  imported ahead of the installed package; the components run the installed
  library, as both hosts' components do), each run of REF next to a run of
  the current tree, so both sides of a before/after share one run.

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
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples"
ML = [sys.executable, "-c", "from multilang._cli.main import main; main()"]
TICK = os.sysconf("SC_CLK_TCK")


def ml_at(root: Path) -> list[str]:
    """The ``multilang`` command of the source tree at ``root``: its three
    folders imported as the package's three parts (pyproject's
    package-dir), ahead of the installed package."""
    boot = "\n".join([
        "import importlib.util, sys",
        f"R = {str(root)!r}",
        "PARTS = {'multilang': R + '/multilang', 'multilang.shellbolt': R + '/shellbolt',",
        "         'multilang.adapters': R + '/adapters'}",
        "class Tree:",
        "    @staticmethod",
        "    def find_spec(name, path=None, target=None):",
        "        d = PARTS.get(name)",
        "        return None if d is None else importlib.util.spec_from_file_location(",
        "            name, d + '/__init__.py', submodule_search_locations=[d])",
        "sys.meta_path.insert(0, Tree)",
        "from multilang._cli.main import main",
        "main()",
    ])
    return [sys.executable, "-c", boot]


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
    """examples/wordcount.toml over ``corpus`` with the Python split and
    count of examples/python/ and ``parallelism`` tasks of each."""
    text = shipped_toml(tmp, corpus).read_text()
    for lang, ext in (("ruby", "rb"), ("node", "js")):
        for bolt in ("split_bolt", "count_bolt"):
            text = text.replace(f'["{lang}", "{EXAMPLES / lang / f"{bolt}.{ext}"}"]',
                                f'["python", "{EXAMPLES / "python" / f"{bolt}.py"}"]')
    text = text.replace('name = "wordcount"', 'name = "wordcount-python"').replace("parallelism = 2",
                                                                                 f"parallelism = {parallelism}")
    if '"ruby"' in text or '"node"' in text:
        raise SystemExit(f"examples/wordcount.toml's bolt commands are not the ones this bench replaces:\n{text}")
    path = tmp / "wordcount.toml"
    path.write_text(text)
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
    ap.add_argument("--before", metavar="REF", help="also run the word counts with the host of git commit REF")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-topology-host-") as d:
        tmp = Path(d)
        corpus = tmp / "corpus.txt"
        text = (EXAMPLES / "data" / "alice.txt").read_text()
        corpus.write_text(text * args.copies)
        toml = wordcount_toml(tmp, corpus, args.parallelism)
        hosts = {"now": ML}
        if args.before:
            tree = tmp / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.before], check=True,
                           capture_output=True)
            hosts["before"] = ml_at(tree)
        try:
            measured = _wordcounts(hosts, toml, shipped_toml(tmp, corpus), args)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "before")],
                               check=False, capture_output=True)
        cpu, cpu0, wall, words, sentences = measured["now"][0]
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
    print(f"word count (Python components, parallelism {args.parallelism}, {args.copies}x alice.txt): "
          f"{sentences:,} sentences, {words:,} words in {wall:.1f} s ({sentences / wall:,.0f} sentences/s); "
          f"host CPU {cpu:.2f} s ({cpu0:.2f} s start-up): {per_word * 1e6:.1f} us/word")
    if "before" in measured:
        bcpu, bcpu0, bwall, bwords, bsentences = measured["before"][0]
        print(f"  the same with the host of {args.before}: {bsentences / bwall:,.0f} sentences/s; host CPU "
              f"{(bcpu - bcpu0) / bwords * 1e6:.1f} us/word")
    print(f"multilang pipe + python echo: {args.tuples:,} tuples in {pwall:.1f} s; host CPU {pcpu:.2f} s "
          f"({pcpu0:.2f} s start-up): {per_tuple * 1e6:.1f} us/tuple")
    shipped = measured["now"][1]
    if shipped is not None:
        n, w = shipped
        print(f"the README word count as shipped (Ruby split, Node count), same corpus: {n:,} sentences in {w:.1f} s "
              f"({n / w:,.0f} sentences/s, start-up included)")
        if "before" in measured:
            bn, bw = measured["before"][1]
            print(f"  the same with the host of {args.before}: {bn / bw:,.0f} sentences/s; now / before: "
                  f"{(n / w) / (bn / bw):.2f}x (target >= 2x: {'MET' if (n / w) / (bn / bw) >= 2 else 'NOT MET'})")
    ratio = per_word / per_tuple
    print(f"host CPU per word / per pipe tuple: {ratio:.2f}x (target <= 2x: {'MET' if ratio <= 2 else 'NOT MET'})")


def _wordcounts(hosts: dict[str, list[str]], toml: Path, shipped: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Per host: ((least host CPU, start-up CPU, its wall, words, sentences)
    of the Python word count, (sentences, least wall) of the shipped one or
    None), the hosts' runs interleaved."""
    start = {name: run_measured([*ml, "run", str(toml), "--no-progress", "--max-tuples", "1"])[0]
             for name, ml in hosts.items()}
    best: dict[str, Any] = {}
    fastest: dict[str, Any] = {}
    for _ in range(args.repeat):
        for name, ml in hosts.items():
            run = run_measured([*ml, "run", str(toml), "--no-progress"])
            if name not in best or run[0] < best[name][0]:
                best[name] = run
            if not args.no_shipped:
                srun = run_measured([*ml, "run", str(shipped), "--no-progress"])
                if name not in fastest or srun[1] < fastest[name][1]:
                    fastest[name] = srun
    out = {}
    for name in hosts:
        cpu, wall, text, _ = best[name]
        py = (cpu, start[name], wall, _summary(text, "count", "executed"), _summary(text, "sentences", "acked"))
        shipped_run = None
        if name in fastest:
            shipped_run = (_summary(fastest[name][2], "sentences", "acked"), fastest[name][1])
        out[name] = (py, shipped_run)
    return out


if __name__ == "__main__":
    main()
