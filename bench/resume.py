#!/usr/bin/env python
"""What resuming a complete state costs against the fresh run that made it.

    python bench/resume.py [--copies N] [--spout python|ruby|node] [--standard-spout]

Issue 32, item 23: a resume must skip what a checkpoint covers cheaply, at
most a tenth of a fresh run's time. The README's word count
(examples/wordcount.toml) over N copies of its corpus (default 30), run as a
user runs it (``multilang run ... --state-dir DIR -o FILE``, wall time of the
whole command, process start included), once fresh into an empty state
directory, then again on the same directory: every sentence is then one a
checkpoint covers, emitted again by the spout and skipped (§9.7 step 4).
Both runs must print the same counts. Reported: the two times and their ratio
(target: <= 0.10). ``--standard-spout`` offers the spout no extension (as
Storm's own libraries, which accept none, run): every command then waits for
its sync, two round trips per input skipped.
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
SPOUTS = {
    "python": '["python", "python/sentence_spout.py", ',
    "ruby": '["ruby", "ruby/sentence_spout.rb", ',
    "node": '["node", "node/sentence_spout.js", ',
}
CLI = [sys.executable, "-c", "from multilang._cli.entry import main; main()"]


def topology_file(corpus: Path, spout: str, standard: bool) -> Path:
    text = (EXAMPLES / "wordcount.toml").read_text()
    text = text.replace('["python", "python/sentence_spout.py", "data/alice.txt"]', f'{SPOUTS[spout]}"{corpus}"]')
    if standard:
        spout_conf = 'fields = ["sentence"]\nconf = { "multilang.extensions" = [] }\n'
        text = text.replace('fields = ["sentence"]\n', spout_conf)
    path = EXAMPLES / f".bench-resume-{os.getpid()}.toml"  # commands resolve against the file's directory
    path.write_text(text)
    return path


def run(path: Path, state: Path, out: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([*CLI, "run", str(path), "--state-dir", str(state), "-o", str(out), "--log-level", "error"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=30)
    ap.add_argument("--spout", choices=sorted(SPOUTS), default="python")
    ap.add_argument("--standard-spout", action="store_true", help="offer the spout no extension (no pipelining)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        tmp_path = Path(tmp)
        corpus = tmp_path / "corpus.txt"
        corpus.write_text((EXAMPLES / "data" / "alice.txt").read_text() * args.copies)
        path = topology_file(corpus, args.spout, args.standard_spout)
        try:
            fresh = run(path, tmp_path / "state", tmp_path / "fresh.json")
            resumed = run(path, tmp_path / "state", tmp_path / "resumed.json")
        finally:
            path.unlink()
        if (tmp_path / "fresh.json").read_bytes() != (tmp_path / "resumed.json").read_bytes():
            sys.exit("the resumed run printed other counts than the fresh one")
    sentences = sum(1 for line in (EXAMPLES / "data" / "alice.txt").read_text().split("\n") if line.strip())
    kind = "standard (no extension)" if args.standard_spout else "batch"
    print(f"word count, {args.copies}x corpus ({sentences * args.copies} sentences), {args.spout} spout, {kind}")
    print(f"fresh run:  {fresh:.2f} s")
    print(f"resume of the complete state: {resumed:.2f} s")
    print(f"ratio resume/fresh: {resumed / fresh:.3f} (target <= 0.10)")


if __name__ == "__main__":
    main()
