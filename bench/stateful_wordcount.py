#!/usr/bin/env python
"""What checkpointing stateful bolts costs (spec/PROTOCOL.md §9.7, docs/STATE.md).

    python bench/stateful_wordcount.py [--copies N] [--repeat R] [--interval-ms MS] [--count node|ruby|python]

The README's word count (examples/wordcount.toml: Python sentence spout ->
Ruby split x2 -> count x2, the count bolt a StatefulBolt) over N copies of its
corpus, in this process on ``multilang.shellbolt.Runtime``, two variants
interleaved round-robin (off, on, off, on, ...), best of R each:

* ``off``: ``multilang.extensions = ["batch"]``: the host does not offer
  ``state``, so the count bolt keeps its counts in memory (Storm's default);
* ``on``: the default offer: checkpoints every ``--interval-ms`` (1000, Storm's
  default) into a SQLite file in a temporary directory, acks held until then.

Both runs must print the same counts. Reported: sentences per second of each,
the ratio on/off (the target is >= 0.8 at the default interval), checkpoints
committed, and the keys written per checkpoint against the keys in the state
(only changed keys travel and are written).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
COUNT = {
    "node": '["node", "node/count_bolt.js"]',
    "ruby": '["ruby", "ruby/count_bolt.rb"]',
    "python": '["python", "python/count_bolt.py"]',
}


def topology_file(corpus: Path, count: str, interval_ms: int) -> Path:
    text = (EXAMPLES / "wordcount.toml").read_text()
    text = text.replace('"data/alice.txt"', f'"{corpus}"')
    text = text.replace('command = ["node", "node/count_bolt.js"]', f"command = {COUNT[count]}")
    text = text.replace('"topology.message.timeout.secs" = 30',
                        f'"topology.message.timeout.secs" = 30\n"topology.state.checkpoint.interval.ms" = {interval_ms}')
    path = EXAMPLES / f".bench-stateful-{os.getpid()}.toml"  # commands resolve against the file's directory
    path.write_text(text)
    return path


def run_once(path: Path, extensions: list[str] | None) -> tuple[float, dict, object]:
    from multilang.shellbolt import Runtime
    from multilang.shellbolt import load_topology

    topo = load_topology(path, {"multilang.extensions": extensions} if extensions is not None else None)
    rt = Runtime(topo)

    async def main():
        start = trio.current_time()
        result = await rt.run(until_done=True)
        return trio.current_time() - start, result

    elapsed, result = trio.run(main)
    counts = {r["word"]: r["count"] for r in result.outputs}
    return elapsed, counts, (result, rt.checkpoints)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--count", choices=sorted(COUNT), default="node")
    args = ap.parse_args()
    text = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(text * args.copies, encoding="utf-8")
        sentences = sum(1 for ln in (text * args.copies).split("\n") if ln.strip(" \t\n\r\f\v"))
        path = topology_file(corpus, args.count, args.interval_ms)
        try:
            variants = {"off": ["batch"], "on": None}
            best: dict[str, float] = {}
            reference = None
            stats = None
            for i in range(args.repeat + 1):  # the first round is a warm-up, checked, not timed
                for name, ext in variants.items():
                    elapsed, counts, (result, cp) = run_once(path, ext)
                    if reference is None:
                        reference = counts
                    if counts != reference or result.completed != sentences:
                        print(f"FAILED: {name} run {i}: counts differ or {result.completed} != {sentences} trees",
                              file=sys.stderr)
                        return 1
                    if name == "on":
                        if not result.stateful:
                            print("FAILED: the count bolt did not accept state", file=sys.stderr)
                            return 1
                        stats = (result.checkpoints, cp.keys_written)
                    if i:
                        best[name] = min(best.get(name, float("inf")), elapsed)
        finally:
            path.unlink()
    assert stats is not None and reference is not None
    off, on = sentences / best["off"], sentences / best["on"]
    checkpoints, keys = stats
    print(f"word count, {args.copies}x corpus ({sentences} sentences, {sum(reference.values())} words, "
          f"{len(reference)} distinct), count bolt: {args.count}, best of {args.repeat}")
    print(f"  checkpointing off : {off:9.0f} sentences/s ({best['off']:.2f} s)")
    print(f"  checkpointing on  : {on:9.0f} sentences/s ({best['on']:.2f} s), interval {args.interval_ms} ms")
    print(f"  ratio on/off      : {on / off:.2f}x (target >= 0.8x)")
    print(f"  checkpoints       : {checkpoints} in the last run, {keys / max(checkpoints, 1):.0f} keys written per "
          f"checkpoint on average (state: {len(reference)} keys; only changed keys are written)")
    return 0


if __name__ == "__main__":
    t0 = time.monotonic()
    rc = main()
    print(f"  ({time.monotonic() - t0:.0f} s in all)")
    raise SystemExit(rc)
