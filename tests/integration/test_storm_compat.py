"""Our host runs pystorm components unchanged (pystorm from PyPI, real processes)."""

from collections import Counter
from pathlib import Path

import trio

from multilang.shellbolt import Runtime, ShellBolt, ShellSpout, TopologyBuilder

HERE = Path(__file__).parent / "pystorm_components"


def test_pystorm_spout_and_bolt_under_our_host(tmp_path):
    record = tmp_path / "spout-callbacks.txt"
    builder = TopologyBuilder()
    builder.set_spout("numbers", ShellSpout(["python", "numbered_spout.py", str(record)], fields=["sentence"]))
    builder.set_bolt("split", ShellBolt(["python", "split_bolt.py"], fields=["word"]), parallelism=2) \
        .shuffle_grouping("numbers")
    topology = builder.create_topology(resource_dir=HERE)
    out = []
    result = trio.run(lambda: Runtime(topology, on_output=out.append).run(until_done=True))

    assert result.ok and result.completed == 50 and result.failed == 0
    words = Counter(r["word"] for r in out)
    assert words["a"] == words["b"] == words["c"] == 50
    assert sorted(int(r["word"]) for r in out if r["word"].isdigit()) == list(range(50))
    # pystorm's spout got an ack for every id, as the int it emitted.
    lines = record.read_text().splitlines()
    assert sorted(lines) == sorted(f"ack {i}" for i in range(50))
