"""Batches through the runtime (issue 34): ``topology.producer.batch.size``
changes how many tuples move as one (nexts per write to a spout, tuples per
write to a bolt, emits per route), never what is delivered, acked, replayed
or checkpointed.

Real processes: examples/python's sentence spout, split bolt (hold mode) and
stateful count bolt, and tests/integration/components/tag_bolt.py on an
``all`` grouping (the emit-by-emit route beside the batched one).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from multilang.shellbolt import ShellBolt, ShellSpout, TopologyBuilder

from test_runtime import EXAMPLES, ROOT, TAG_BOLT, expected_wordcount, py, run_topology

LINES = 150


def _topology(tmp_path: Path, batch: int, corpus: Path):
    b = TopologyBuilder()
    b.set_spout("sentences", ShellSpout(py(EXAMPLES / "python" / "sentence_spout.py", str(corpus)),
                                        fields=["sentence"]))
    b.set_bolt("split", ShellBolt(py(EXAMPLES / "python" / "split_bolt.py"), fields=["word"]), parallelism=2,
               conf={"multilang.hold.emits.until.ack": True}).shuffle_grouping("sentences")
    b.set_bolt("count", ShellBolt(py(EXAMPLES / "python" / "count_bolt.py"), fields=["word", "count"]),
               parallelism=3).fields_grouping("split", ["word"])
    b.set_bolt("tag", ShellBolt(py(TAG_BOLT), fields=["task", "values"]), parallelism=2).all_grouping("split")
    conf = {"multilang.shutdown.grace.secs": 5, "multilang.kill.grace.secs": 1,
            "topology.max.spout.pending": 40, "topology.state.checkpoint.interval.ms": 50,
            "topology.state.provider.config": {"dir": str(tmp_path / f"state-{batch}")},
            "topology.producer.batch.size": batch}
    return b.create_topology(conf, resource_dir=ROOT)


def _what_was_done(tmp_path: Path, batch: int, corpus: Path) -> dict[str, Any]:
    run = run_topology(_topology(tmp_path, batch, corpus), limit=120)
    res = run.result
    assert res.ok and res.stopped_by == "done" and res.pending == 0, res
    records = [r for _, r in run.outputs]
    counts = [r for r in records if r["component"] == "count"]
    final: dict[str, int] = {}
    for r in counts:  # one task per word: its counts come in order
        final[r["word"]] = max(final.get(r["word"], 0), r["count"])
    return {
        "outputs": Counter(json.dumps(r, sort_keys=True) for r in records),
        "final": final,
        "stats": {name: (s.emitted, s.executed, s.acked, s.failed) for name, s in res.stats.items()},
        "trees": (res.completed, res.failed, res.timed_out),
    }


def test_the_batch_size_changes_nothing_that_is_delivered_acked_or_counted(tmp_path):
    # Pass condition: the same multiset of outputs (every running count of
    # every word, every tagged word on each tag task), the same per-component
    # counts and the same tree counts at batch sizes 1, 7 and 64, and the
    # word counts a user expects.
    corpus = tmp_path / "corpus.txt"
    lines = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()[:LINES]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = expected_wordcount(corpus)
    sentences = sum(1 for line in lines if line.strip())
    words = sum(expected.values())

    runs = {batch: _what_was_done(tmp_path, batch, corpus) for batch in (1, 7, 64)}
    one = runs[1]
    assert one["final"] == expected
    assert one["trees"] == (sentences, 0, 0)
    assert one["stats"]["count"] == (words, words, words, 0)
    assert one["stats"]["tag"] == (2 * words, 2 * words, 2 * words, 0)  # an all grouping: each word on both tasks
    for batch in (7, 64):
        assert runs[batch]["stats"] == one["stats"], batch
        assert runs[batch]["trees"] == one["trees"], batch
        assert runs[batch]["outputs"] == one["outputs"], batch

